//! One-sided communication (RMA) as real jobs through oxrun: the checks
//! of the `rma_suite` program over the default transports (shared memory
//! between the ranks of this host: allocated windows take the direct
//! path) and over TCP alone (active messages), on 1 to 8 ranks
//! (oversubscribed on small machines).

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::Duration;

/// The oxrun command of `rma_suite check args` on `ranks` ranks with
/// `env` set.
fn command(check: &str, args: &[&str], ranks: usize, env: &[(&str, &str)]) -> Command {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_rma_suite"));
    let mut c = Command::new(bins.oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins.bin("rma_suite"))
        .arg(check)
        .args(args)
        .envs(env.iter().copied());
    c
}

/// Fails the test if a job left anything behind ([`shm_leftovers`]).
fn assert_no_leftovers() {
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

/// Runs `rma_suite check args` on `ranks` ranks with `env` set, within
/// `bound` seconds; it must succeed and leave nothing behind.
fn job(check: &str, args: &[&str], ranks: usize, env: &[(&str, &str)], bound: u64) {
    run(command(check, args, ranks, env), Duration::from_secs(bound)).assert_success();
    assert_no_leftovers();
}

const TCP: [(&str, &str); 1] = [("OXMPI_TRANSPORTS", "tcp")];

#[test]
fn every_operation_under_every_synchronization() {
    for ranks in [1, 2, 3, 5, 8] {
        job("ops", &[], ranks, &[], 120);
    }
}

/// Over TCP alone (active messages) from 2 to 8 ranks, as over shared
/// memory: the ring gives every target one origin, and at 8 ranks every
/// rank has 7 connections.
#[test]
fn every_operation_under_every_synchronization_over_tcp() {
    for ranks in [2, 3, 4, 8] {
        job("ops", &[], ranks, &TCP, 120);
    }
}

#[test]
fn accumulate_with_every_operation_and_type() {
    job("operations", &[], 3, &[], 120);
    job("operations", &[], 2, &TCP, 120);
}

/// `MPI_MINLOC` and `MPI_MAXLOC` on value-index pairs: on the direct path
/// (allocated windows, and created ones by cross-memory attach) and by
/// active messages over TCP, under shared locks and fence, with ties
/// and fetches, against a reference; MINLOC on a non-pair refused.
#[test]
fn minloc_and_maxloc_accumulate_value_index_pairs() {
    job("locations", &[], 3, &[], 60);
    job("locations", &[], 3, &TCP, 60);
}

/// Over shared memory (the direct path: region mutexes under shared
/// locks) at the count, 100,000 of each per rank on 8 ranks (a
/// few seconds), on an allocated window and on a created one (reached by
/// cross-memory attach: 8 s in a debug build on the loaded development
/// VM); over TCP (active messages) on 8 ranks too, 30,000 each: 100,000
/// took about 110 s in a debug build there (20,000 took 23 s at a load
/// of 12), too long for CI's 2 cores, so 30,000 (about 35 s).
#[test]
fn fetch_and_op_and_accumulate_are_atomic() {
    job("atomic", &["100000"], 8, &[], 180);
    job("atomic", &["100000", "create"], 8, &[], 180);
    job("atomic", &["30000"], 8, &TCP, 180);
}

#[test]
fn windows_are_direct_on_shared_memory_and_messages_over_tcp() {
    for ranks in [1, 4] {
        job("path", &["direct"], ranks, &[], 60);
    }
    job("path", &["messages"], 3, &TCP, 60);
    // A created window needs cross-memory attach; an allocated one not.
    job(
        "path",
        &["direct", "messages"],
        3,
        &[("OXMPI_SHM_CMA", "0")],
        60,
    );
}

/// A window on user memory dropped without `free`: cross-memory attach
/// stops before the memory goes back to the program.
#[test]
fn a_window_dropped_without_free_is_not_written_by_cross_memory_attach() {
    job("dropped", &[], 2, &[], 60);
}

/// The direct path (allocated and created windows) completes
/// passive-target operations while the target sleeps outside MPI with no
/// progress thread.
#[test]
fn operations_complete_while_the_target_sleeps_outside_mpi() {
    job("sleeping", &[], 4, &[], 60);
    job("sleeping", &["create"], 3, &[], 60);
}

#[test]
fn shared_windows_are_loads_and_stores_for_every_rank() {
    for ranks in [1, 3] {
        job("shared", &[], ranks, &[], 60);
    }
    // Shared memory needs one host, not the shared-memory transport.
    job("shared", &[], 2, &TCP, 60);
}

/// flush_all, flush_local, flush_local_all, sync and test, each where
/// doing nothing would show, fence assertions, and a window's user error
/// handler; over
/// shared memory and TCP.
#[test]
fn flushes_test_sync_and_window_error_handlers_do_their_part() {
    job("synchronization", &[], 3, &[], 60);
    job("synchronization", &[], 3, &TCP, 60);
}

/// A put its target refuses, followed directly by fence, unlock_all and
/// free: the origin's call reports it, every rank still synchronizes
/// (before, the origin left the barrier or the locks behind and the job
/// hung until its bound).
#[test]
fn fence_unlock_all_and_free_synchronize_after_a_refused_put() {
    job("refused_sync", &[], 3, &[], 60);
    job("refused_sync", &[], 2, &TCP, 60);
}

/// A new window's handler, fatal (MPI 4.1 §12.6.1) though world's is
/// Return, ends the job on an out-of-range put, with
/// the error's message and class.
#[test]
fn a_window_fatal_handler_ends_the_job_with_the_message() {
    let out = run(
        command("fatal_handler", &[], 2, &[]),
        Duration::from_secs(30),
    );
    // MPI_ERR_RMA_RANGE is 55, as in MPICH's mpi.h.
    assert_eq!(out.status.code(), Some(55), "{}", out.stderr);
    assert!(
        out.stderr.contains("fatal error (ErrorHandler::Fatal)")
            && out.stderr.contains("MPI_ERR_RMA_RANGE"),
        "{}",
        out.stderr
    );
    assert_no_leftovers();
}

/// Target datatypes: block by block on the direct path (shared memory),
/// one message with the target layout over TCP (several for the large
/// layouts).
#[test]
fn operations_with_a_target_datatype_match_a_sequential_reference() {
    for ranks in [1, 3] {
        job("typed", &[], ranks, &[], 60);
    }
    for ranks in [3, 8] {
        job("typed", &[], ranks, &TCP, 60);
    }
}

/// Reductions that no hardware atomic does, from a derived datatype, on
/// overlapping spans under shared locks: atomic per element (region
/// mutexes on shared memory, allocated or created and reached by
/// cross-memory attach; the target's handler over TCP).
#[test]
fn reductions_under_shared_locks_are_atomic_per_element() {
    job("regions", &["3000"], 4, &[], 180);
    job("regions", &["3000", "create"], 4, &[], 180);
    job("regions", &["300"], 8, &[], 180);
    job("regions", &["200"], 3, &TCP, 120);
}

/// On allocated and created windows, and over TCP.
#[test]
fn compare_and_swap_makes_a_spin_lock() {
    job("spinlock", &["30"], 4, &[], 120);
    job("spinlock", &["30", "create"], 4, &[], 120);
    job("spinlock", &["20"], 3, &TCP, 120);
}

/// Threads of one process (`MPI_THREAD_MULTIPLE`) that lock one target
/// at once: exactly one gets the lock each round, the others
/// `MPI_ERR_RMA_SYNC` (on shared memory, and by active messages over TCP);
/// then locks that land inside another thread's unlock (over TCP they
/// hung the job about one run in two before the unlock kept its record
/// until the release had left).
#[test]
fn racing_threads_lock_a_target_once() {
    job("lock_race", &["300"], 2, &[], 60);
    job("lock_race", &["50"], 2, &TCP, 60);
}

/// Exclusive locks exclude each other, and accumulates that are no
/// hardware atomic (4-byte integers, doubles) lose nothing under shared
/// locks; on allocated and created windows.
#[test]
fn locks_and_accumulates_exclude_each_other() {
    job("exclusion", &["100"], 4, &[], 120);
    job("exclusion", &["100", "create"], 4, &[], 120);
    job("exclusion", &["30"], 3, &TCP, 120);
    job("exclusion", &["20"], 5, &TCP, 120);
}

#[test]
fn large_puts_and_gets() {
    job("large", &[], 3, &[], 60);
    job("large", &[], 2, &TCP, 60);
}

/// Puts, gets and accumulates whose data travels as point-to-point
/// messages (over active messages: TCP), across the sizes where that
/// starts, where the TCP rendezvous starts and where its data lanes
/// start.
#[test]
fn large_puts_and_gets_by_message_over_tcp() {
    job("by_message", &[], 2, &TCP, 120);
    job("by_message", &[], 3, &TCP, 120);
}

/// Over TCP the operations between flushes travel in batches; over
/// shared memory the same program takes the direct path.
#[test]
fn operations_between_flushes_travel_in_batches_in_order() {
    job("batches", &["20"], 2, &TCP, 120);
    job("batches", &["20"], 3, &TCP, 120);
    job("batches", &["5"], 2, &[], 60);
}

/// Dynamic windows take active messages on every transport: typed
/// operations across a region's end are refused whole by the target, over
/// shared memory and over TCP.
#[test]
fn dynamic_windows_attach_and_detach() {
    for ranks in [1, 3] {
        job("dynamic", &[], ranks, &[], 60);
    }
    job("dynamic", &[], 2, &TCP, 60);
}

/// Errors of detach and attach, of epochs opened twice, of groups
/// outside the window or operations outside the start group, of a free
/// with an epoch open (the others still leave it); lock_all against an
/// exclusive lock, lock_all(MODE_NOCHECK); every operation on PROC_NULL;
/// over shared memory and TCP.
#[test]
fn epoch_errors_modes_and_proc_null() {
    job("epochs", &[], 3, &[], 60);
    job("epochs", &[], 2, &[], 60);
    job("epochs", &[], 3, &TCP, 60);
}

#[test]
fn attributes_hints_and_names() {
    job("attributes", &[], 3, &[], 60);
}

#[test]
fn bad_calls_fail_with_their_classes() {
    job("errors", &[], 3, &[], 60);
    job("errors", &[], 2, &TCP, 60);
}

/// By active messages over shared memory (a created window without
/// cross-memory attach; an allocated one would be reached directly, with
/// no progress thread needed, and a dynamic one) and over TCP.
#[test]
fn a_progress_thread_completes_operations_while_the_target_computes() {
    let progress = ("OXMPI_ASYNC_PROGRESS", "1");
    job(
        "passive",
        &["0", "create"],
        3,
        &[progress, ("OXMPI_SHM_CMA", "0")],
        60,
    );
    job("passive", &[], 3, &[progress, TCP[0]], 60);
    job("passive_dynamic", &[], 3, &[progress], 60);
}

/// A target lost in the middle of a put over TCP: the put and the flush
/// after it fail with MPI_ERR_PROC_FAILED within seconds (the job's bound
/// catches a flush that waits forever for the lost put's answers).
#[test]
fn a_put_to_a_target_lost_midway_fails_and_its_flush_returns() {
    job("lost_peer", &[], 2, &TCP, 60);
}

/// An origin lost while it holds a target's exclusive lock over TCP: the
/// target forgets its hold, and the next origin's lock is granted within
/// seconds (the job's bound catches a lock that waits forever).
#[test]
fn the_lock_a_lost_origin_held_passes_on() {
    job("lost_holder", &[], 3, &TCP, 60);
}

/// A process lost in the middle of general active-target epochs over
/// TCP: the complete, wait and start that involve it fail with
/// MPI_ERR_PROC_FAILED within seconds, and the other target's epoch ends
/// (the job's bound catches a wait that waits forever).
#[test]
fn general_active_target_epochs_end_when_a_process_is_lost() {
    job("lost_pscw", &[], 3, &TCP, 60);
}

/// Over TCP a lock request leaves with the epoch's operations, not
/// waiting for its grant: the target applies them only once it grants
/// the lock (over shared memory the direct path's lock waits). Large
/// puts into a dynamic window (active messages over shared memory too),
/// whose data arrives placed, do not wait for the grant either, and land
/// only once it is given; also with a progress thread, which places
/// their data while the target's main thread is in a call or not.
#[test]
fn operations_behind_a_lock_request_wait_for_its_grant() {
    job("deferred", &[], 3, &TCP, 60);
    job("deferred", &[], 3, &[], 60);
    job(
        "deferred",
        &[],
        3,
        &[("OXMPI_ASYNC_PROGRESS", "1"), TCP[0]],
        60,
    );
}
