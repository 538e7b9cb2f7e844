//! Collectives, groups and communicators as real jobs through oxrun: the
//! checks of the `collectives` and `communicators` programs over the
//! default transports (shared memory between the ranks of this host),
//! every collective with 1 to 8 ranks (oversubscribed on small machines),
//! and a subset over TCP alone.

use oxmpi::ErrorClass;
use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_collectives"))
}

/// Runs `program check` on `ranks` ranks with `env` set, within `bound`;
/// it must succeed and leave nothing behind. Returns its standard
/// output.
fn job(program: &str, check: &str, ranks: usize, env: &[(&str, &str)], bound: u64) -> String {
    let mut c = Command::new(bins().oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins().bin(program))
        .arg(check)
        .envs(env.iter().copied());
    let out = run(c, Duration::from_secs(bound));
    out.assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
    out.stdout
}

const TCP: [(&str, &str); 1] = [("OXMPI_TRANSPORTS", "tcp")];
const TCP_CHECKING_COUNTS: [(&str, &str); 2] =
    [("OXMPI_TRANSPORTS", "tcp"), ("OXMPI_CHECK_COUNTS", "1")];

/// Environment variables of a job.
type Env<'a> = &'a [(&'a str, &'a str)];

#[test]
fn every_collective_with_1_to_8_ranks() {
    for ranks in 1..=8 {
        job("collectives", "data", ranks, &[], 120);
    }
}

#[test]
fn every_collective_by_messages_alone() {
    // The shared-memory collectives off: the message algorithms at every
    // size, on one host.
    for ranks in [2, 3, 5, 8] {
        job(
            "collectives",
            "data",
            ranks,
            &[("OXMPI_COLL_SHM", "0")],
            120,
        );
    }
}

#[test]
fn every_collective_through_shared_staging_without_single_copies() {
    // Cross-memory attach off: long broadcasts and all-to-alls stream
    // through the shared staging areas instead of single copies.
    for ranks in [2, 3, 5] {
        job("collectives", "data", ranks, &[("OXMPI_SHM_CMA", "0")], 120);
    }
}

#[test]
fn every_collective_with_most_messages_by_rendezvous() {
    // Eager limits of 1000 bytes: nearly every step of the algorithms
    // waits for its receiver, which must never wait for it in turn.
    let small_eager = [
        ("OXMPI_SHM_EAGER_LIMIT", "1000"),
        ("OXMPI_TCP_EAGER_LIMIT", "1000"),
    ];
    job("collectives", "data", 5, &small_eager, 120);
}

#[test]
fn derived_datatypes_and_structs_in_collectives() {
    for ranks in [1, 2, 3] {
        job("collectives", "datatypes", ranks, &[], 60);
    }
    job("collectives", "datatypes", 3, &TCP, 60);
}

#[test]
fn collectives_of_large_strided_datatypes() {
    // Over shared memory, with and without single copies, and over TCP.
    for ranks in [2, 3, 5] {
        let out = job("collectives", "large_datatypes", ranks, &[], 120);
        assert!(
            out.contains(&format!("large_datatypes: {ranks} ranks")),
            "{out}"
        );
    }
    job(
        "collectives",
        "large_datatypes",
        3,
        &[("OXMPI_SHM_CMA", "0")],
        120,
    );
    for ranks in [2, 4] {
        job("collectives", "large_datatypes", ranks, &TCP, 120);
    }
}

#[test]
fn long_strided_collectives_move_in_pieces() {
    // A 32 MiB strided broadcast and all-to-all grow no process's peak
    // memory by a packed copy: through shared memory with single copies
    // (a buffer that is not contiguous streams through the staging areas,
    // or takes its single copies a piece at a time), streamed through the
    // shared staging areas (single copies off), and by messages, which
    // the point-to-point layer packs and unpacks piece by piece, over
    // shared memory and over TCP; nor do gather, scatter, all-gather(v)
    // and all-to-allv, which go by messages in every case; nor the
    // in-place all-to-alls (pairwise, in pieces), all-reduces, reduces,
    // scans and reduce-scatters (a segment at a time).
    let ways: [&[(&str, &str)]; 4] = [
        &[],
        &[("OXMPI_SHM_CMA", "0")],
        &[("OXMPI_COLL_SHM", "0")],
        &TCP,
    ];
    for env in ways {
        for ranks in [2, 3] {
            let out = job("collectives", "pieces_memory", ranks, env, 300);
            for measured in [
                "all-to-all-v: +",
                "in-place all-to-all-w: +",
                "in-place reduce: +",
                "in-place exclusive scan: +",
                "in-place reduce-scatter: +",
            ] {
                assert!(out.contains(measured), "{env:?}: {out}");
            }
            eprint!("{env:?}: {out}");
        }
    }
}

#[test]
fn short_strided_all_gathers_by_bruck_hold_no_copy_of_the_whole() {
    // Many at once, so that a copy of each one's whole would show in the
    // peak memory; eager limits below a block keep early messages at
    // their senders.
    let eager = [
        ("OXMPI_SHM_EAGER_LIMIT", "4096"),
        ("OXMPI_TCP_EAGER_LIMIT", "4096"),
    ];
    let tcp = [eager[0], eager[1], TCP[0]];
    for env in [&eager[..], &tcp[..]] {
        let out = job("collectives", "bruck_pieces_memory", 3, env, 120);
        assert!(
            out.contains("all-gathers by Bruck's algorithm at once: +"),
            "{env:?}: {out}"
        );
        eprint!("{env:?}: {out}");
    }
}

#[test]
fn collectives_of_blocks_with_8_mib() {
    // The size is what this checks: 2 and 3 ranks keep it short.
    for ranks in [2, 3] {
        job("collectives", "large", ranks, &[], 120);
    }
}

#[test]
fn every_predefined_operation_on_every_type() {
    for ranks in [1, 3, 4] {
        job("collectives", "operations", ranks, &[], 60);
    }
}

#[test]
fn processes_that_pass_different_counts_fail_alone() {
    for ranks in [2, 5] {
        job("collectives", "mismatch", ranks, &[], 60);
        // Long broadcasts stream through shared memory here, where the
        // one process whose count differs fails alone too.
        job("collectives", "mismatch_long", ranks, &[], 60);
    }
    // By messages, on one host and over TCP: the root's length follows
    // the chunks of a long broadcast's scatter, so the one whose count
    // differs still receives and passes on the root's data.
    for ranks in [3, 5] {
        job(
            "collectives",
            "mismatch_long",
            ranks,
            &[("OXMPI_COLL_SHM", "0")],
            60,
        );
        job("collectives", "mismatch_long", ranks, &TCP, 60);
    }
    // Chunks by rendezvous: a chunk's offer, not its data, comes ahead
    // of the length.
    let small_eager = [
        ("OXMPI_COLL_SHM", "0"),
        ("OXMPI_SHM_EAGER_LIMIT", "1000"),
        ("OXMPI_TCP_EAGER_LIMIT", "1000"),
    ];
    job("collectives", "mismatch_long", 5, &small_eager, 60);
    job(
        "collectives",
        "mismatch_long",
        5,
        &[&small_eager[..], &TCP[..]].concat(),
        60,
    );
}

/// Runs a reduction (`collective`, named `name` in messages) where rank
/// `odd` passes `odd_count` elements and the others `count`, on `ranks`
/// ranks with `env`, under the fatal error handler: the job must end
/// within the bound with the code of `MPI_ERR_COUNT` or
/// `MPI_ERR_TRUNCATE` and a message that names the collective, and leave
/// nothing behind.
fn mismatched_reduction(
    (collective, name): (&str, &str),
    (count, odd_count, odd): (usize, usize, &str),
    ranks: usize,
    env: &[(&str, &str)],
) {
    let mut c = Command::new(bins().oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins().bin("collectives"))
        .args(["mismatched_reduction", collective])
        .args([count.to_string(), odd_count.to_string(), odd.to_owned()])
        .envs(env.iter().copied());
    let out = run(c, Duration::from_secs(30));
    let what = format!(
        "{collective} of {count} elements, {odd_count} at rank {odd}, {ranks} ranks, {env:?}"
    );
    let codes = [ErrorClass::Count.code(), ErrorClass::Truncate.code()];
    assert!(
        out.status.code().is_some_and(|code| codes.contains(&code)),
        "{what}: ended with {}\n{}",
        out.status,
        out.stderr
    );
    assert!(
        out.stderr.contains("fatal error (ErrorHandler::Fatal)")
            && out.stderr.contains(&format!("{name}: ")),
        "{what}: {}",
        out.stderr
    );
    assert!(
        shm_leftovers().is_empty(),
        "{what}: shared segments left: {:?}",
        shm_leftovers()
    );
}

#[test]
fn reductions_whose_counts_differ_end_the_job_with_the_error() {
    // Under 2 KiB both (the same algorithm); across the switch to
    // Rabenseifner's algorithm, where the short data is exactly as long as
    // the long one's first halving step; across the shared slots' length
    // (a reduce's root on the shared path, another rank by messages); one
    // and two segments of 1 MiB; a count of 0. Before the lengths were
    // agreed on, several of these hung at every rank.
    let cases = [
        (10, 11),
        (150, 300),
        (300, 150),
        (1000, 2000),
        (131_072, 262_144),
        (262_144, 131_072),
        (0, 4),
    ];
    let collectives = [
        ("all_reduce", "all-reduce"),
        ("reduce", "reduce"),
        ("reduce_scatter", "reduce-scatter"),
        ("scan", "scan"),
    ];
    // The odd rank is the reduce's root, or a leaf. Over shared memory the
    // stamps in the region tell the lengths apart at no cost; by messages
    // the processes agree on their length only when asked to
    // (`OXMPI_CHECK_COUNTS=1`: without it several of these hang).
    let ways: [(Env, usize, &[&str]); 4] = [
        (&[], 2, &["last"]),
        (&[], 3, &["0", "last"]),
        (
            &[("OXMPI_COLL_SHM", "0"), ("OXMPI_CHECK_COUNTS", "1")],
            3,
            &["0", "last"],
        ),
        (&TCP_CHECKING_COUNTS, 3, &["0", "last"]),
    ];
    for collective in collectives {
        for (count, odd_count) in cases {
            for (env, ranks, odds) in ways {
                for &odd in odds {
                    mismatched_reduction(collective, (count, odd_count, odd), ranks, env);
                }
            }
        }
    }
}

#[test]
fn a_count_checking_setting_other_than_0_or_1_fails_initialize() {
    let mut c = Command::new(bins().oxrun());
    c.args(["-n", "2"])
        .arg(bins().bin("collectives"))
        .arg("data")
        .env("OXMPI_CHECK_COUNTS", "yes");
    let out = run(c, Duration::from_secs(30));
    assert!(!out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("MPI_ERR_ARG: OXMPI_CHECK_COUNTS=\"yes\": set it to 1"),
        "{}",
        out.stderr
    );
}

#[test]
fn bad_arguments_have_their_error_classes() {
    for ranks in [1, 2, 3, 4] {
        job("collectives", "errors", ranks, &[], 60);
    }
}

#[test]
fn communicators_are_made_compared_and_freed() {
    for ranks in [1, 2, 4, 7] {
        job("communicators", "manage", ranks, &[], 60);
    }
}

#[test]
fn ten_thousand_communicators_made_and_freed() {
    let out = job("communicators", "many", 4, &[], 90);
    assert!(out.contains("10000 communicators made and freed"), "{out}");
}

#[test]
fn threads_make_communicators_at_once() {
    job("communicators", "threads", 3, &[], 60);
}

#[test]
fn collectives_and_communicators_over_tcp() {
    for ranks in [3, 4] {
        job("collectives", "data", ranks, &TCP, 120);
    }
    job("collectives", "mismatch", 3, &TCP, 60);
    job("communicators", "manage", 4, &TCP, 60);
}
