//! Real jobs through oxrun over the verbs transport alone, on the soft
//! provider (`OXMPI_TRANSPORTS=verbs OXMPI_VERBS_PROVIDER=soft`): the
//! checks of `p2p_suite`, `completion` and `p2p_modes`, and some of the
//! collectives suite, with 2 to 4 ranks and messages past the eager
//! limit; long messages by RDMA READ with the registration cache, and a
//! refused read; the RMA suite on the RDMA path (up to 8 ranks); the
//! progress thread completing active messages (a dynamic window) while
//! their target computes outside MPI; a flood
//! of unexpected messages into one rank; connections made only between
//! the ranks that talk, in jobs of 4 and 66 ranks; the
//! default selection on this machine, which has no RDMA device, not
//! choosing verbs; and verbs named without a provider, or a provider that
//! does not exist, failing the job with a clear error.

use oxmpi_jobs::{run, shm_leftovers, vc_bindings, Binaries};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"))
}

/// Verbs alone, on the soft provider; the programs take their eager
/// threshold from `OXMPI_TCP_EAGER_LIMIT`: the verbs transport's 32 KiB.
const VERBS: [(&str, &str); 3] = [
    ("OXMPI_TRANSPORTS", "verbs"),
    ("OXMPI_VERBS_PROVIDER", "soft"),
    ("OXMPI_TCP_EAGER_LIMIT", "32768"),
];

/// Runs `program check` on `ranks` ranks over verbs within `bound`
/// seconds; it must succeed and leave nothing behind.
fn job(program: &str, check: &str, ranks: usize, bound: u64) -> String {
    job_with(program, &[check], ranks, &[], bound)
}

/// [`job`] with more arguments after the check and more variables.
fn job_with(
    program: &str,
    check_and_args: &[&str],
    ranks: usize,
    env: &[(&str, &str)],
    bound: u64,
) -> String {
    let mut c = bins().check(program, check_and_args[0], ranks, &VERBS);
    c.args(&check_and_args[1..]).envs(env.iter().copied());
    let out = run(c, Duration::from_secs(bound));
    out.assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
    out.stdout
}

#[test]
fn point_to_point_suite_over_verbs() {
    for check in [
        "ordered",
        "sizes",
        "many-irecv",
        "truncation",
        "probe",
        "modes",
        "proc-null",
        "cancel-send",
        "long",
    ] {
        job("p2p_suite", check, 2, 240);
    }
    job("p2p_suite", "all-pairs", 4, 120);
    job("p2p_suite", "mprobe", 3, 120);
    job("p2p_suite", "threads", 2, 120);
}

/// Runs `rendezvous check` on `ranks` ranks over verbs under
/// `OXMPI_VERBOSE=1`; it must succeed. Returns how many registrations and
/// invalidations of the rendezvous's registration cache the ranks report,
/// and whether it caches (a kernel without `PROCMAP_QUERY` cannot
/// validate hits, and then each message registers its buffers).
fn rendezvous_cache(check: &str, ranks: usize) -> (usize, usize, bool) {
    let mut c = bins().check("rendezvous", check, ranks, &VERBS);
    c.env("OXMPI_VERBOSE", "1");
    let out = run(c, Duration::from_secs(120));
    out.assert_success();
    let count = |what: &str| {
        out.stderr
            .lines()
            .filter(|l| l.contains("verbs registration cache: ") && l.contains(what))
            .count()
    };
    let registered = count(": registered");
    let uncached = count("not cached");
    assert!(
        uncached == 0 || uncached == registered,
        "some registrations cached, some not:\n{}",
        out.stderr
    );
    (registered, count(": invalidated"), uncached == 0)
}

/// Long messages move by RDMA READ straight into the receive buffer: a
/// buffer sent 20 times is registered once by the sender and once by
/// the receiver; a mapping freed and mapped again at the same addresses
/// (other bounds) is registered again, and its new data arrives; many
/// long messages at once, of 32 KiB to 3 MiB, between 4 ranks into
/// any-source receives. Where the kernel cannot validate cached
/// registrations, every message registers its two buffers instead.
#[test]
fn long_messages_by_rdma_read_with_a_registration_cache() {
    match rendezvous_cache("repeat", 2) {
        (registered, invalidated, true) => assert_eq!((registered, invalidated), (2, 0)),
        (registered, _, false) => assert_eq!(registered, 2 * 20),
    }
    match rendezvous_cache("remap", 2) {
        (registered, invalidated, true) => assert_eq!((registered, invalidated), (3, 1)),
        (registered, _, false) => assert_eq!(registered, 2 * 3),
    }
    job("rendezvous", "many", 4, 240);
    job("rendezvous", "many", 2, 120);
}

/// A long send whose buffer the sender makes inaccessible before the
/// receiver reads it: the RDMA READ is refused (REM_ACCESS_ERR), the
/// receive and the send fail with MPI_ERR_PROC_FAILED saying so, the pair
/// stays broken, and both ranks still exchange long messages with a
/// third.
#[test]
fn a_refused_rendezvous_read_fails_the_message_and_the_job_goes_on() {
    job("rendezvous", "refused", 3, 60);
}

/// Non-contiguous long messages (vector, indexed and struct datatypes,
/// 64 MiB) move in pieces over verbs, whichever side is not contiguous.
#[test]
fn large_noncontiguous_messages_over_verbs() {
    let out = job("stream_suite", "large", 2, 300);
    assert!(out.contains("every message landed"), "{out}");
}

#[test]
fn completion_and_modes_over_verbs() {
    for check in ["order", "bulk", "get-status"] {
        job("completion", check, 3, 120);
    }
    for check in ["buffered", "persistent", "persistent-ring", "elements"] {
        job("p2p_modes", check, 3, 120);
    }
}

/// Queue pairs are connected on first use: in jobs where only ranks 0
/// and 1 talk, `OXMPI_VERBOSE=1` names exactly two queue pairs connected,
/// rank 0's to rank 1 and rank 1's to rank 0. One of the jobs has 66
/// ranks, more than a card listing a queue pair per rank served (64).
#[test]
fn only_the_ranks_that_talk_connect_and_jobs_past_64_ranks_start() {
    for ranks in [4, 66] {
        let mut c = bins().check("p2p_suite", "ordered", ranks, &VERBS);
        c.env("OXMPI_VERBOSE", "1");
        let out = run(c, Duration::from_secs(120));
        out.assert_success();
        // "rank R: verbs queue pair 0x.. connected to rank P's 0x..".
        let mut connected: Vec<(String, String)> = out
            .stderr
            .lines()
            .filter(|l| l.contains(": verbs queue pair ") && l.contains(" connected to rank "))
            .map(|l| {
                let rank = l.split("rank ").nth(1).and_then(|r| r.split(':').next());
                let peer = l
                    .rsplit("to rank ")
                    .next()
                    .and_then(|r| r.split('\'').next());
                (
                    rank.unwrap_or("?").to_owned(),
                    peer.unwrap_or("?").to_owned(),
                )
            })
            .collect();
        connected.sort();
        assert_eq!(
            connected,
            [
                ("0".to_owned(), "1".to_owned()),
                ("1".to_owned(), "0".to_owned())
            ],
            "{ranks} ranks: connections other than 0 <-> 1:\n{}",
            out.stderr
        );
        assert!(
            shm_leftovers().is_empty(),
            "shared segments left: {:?}",
            shm_leftovers()
        );
    }
}

#[test]
fn a_flood_of_unexpected_messages_into_one_rank() {
    job("p2p_suite", "flood", 2, 120);
    job("p2p_suite", "flood", 4, 180);
}

#[test]
fn collectives_and_rma_over_verbs() {
    job("collectives", "data", 3, 180);
    job("collectives", "mismatch", 2, 60);
    // Dynamic windows stay active messages over verbs (in `batches`, a
    // refused put amid a batch; its allocated windows take RDMA).
    job("rma_suite", "dynamic", 3, 60);
    job_with("rma_suite", &["batches", "5"], 3, &[], 60);
    // No `passive` here: its windows (allocated or created) take RDMA
    // over verbs, which needs no progress at the target, so it would
    // prove nothing of the progress thread (it refuses such a window);
    // tests/tests/rma.rs runs it over shared memory and TCP. The progress
    // thread over verbs is `passive_dynamic`, below.
}

/// The progress thread (`OXMPI_ASYNC_PROGRESS=1`) over verbs: it sleeps
/// on the transport's completion channel and wakes for the frames of
/// active messages, so passive-target operations on a dynamic window
/// (active messages over verbs too) complete while their target
/// computes outside MPI. Without the thread the job fails at its 30 s
/// bound.
#[test]
fn a_progress_thread_completes_active_messages_over_verbs() {
    let progress = ("OXMPI_ASYNC_PROGRESS", "1");
    job_with("rma_suite", &["passive_dynamic"], 3, &[progress], 90);
}

/// Windows on user memory and allocated ones take the RDMA path over
/// verbs (every rank agrees), and the RMA matrix passes on it: every
/// operation under fence, PSCW, locks, lock_all and flushes; accumulate
/// with every operation and type; MINLOC and MAXLOC on value-index pairs
/// (under the accumulate mutex); operations with a target datatype (an
/// accumulate one hold of the accumulate mutex, its segments' READs and
/// WRITEs posted together); exact totals of 8 ranks' NIC atomics;
/// locks and the accumulate mutex excluding each other; a target that
/// sleeps outside MPI (the soft NIC's threads do the work); the error
/// classes of bad calls; puts and gets longer than one RDMA operation.
#[test]
fn rma_over_verbs_takes_the_rdma_path() {
    let mut c = bins().check("rma_suite", "path", 3, &VERBS);
    c.arg("rdma").env("OXMPI_VERBOSE", "1");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    assert!(
        out.stderr
            .contains("RDMA to the registered memory of its 3 ranks"),
        "OXMPI_VERBOSE does not name the RDMA path:\n{}",
        out.stderr
    );
    job("rma_suite", "large", 3, 60);
    for ranks in [2, 3, 5] {
        job("rma_suite", "ops", ranks, 180);
    }
    job("rma_suite", "operations", 3, 120);
    job("rma_suite", "locations", 3, 60);
    job("rma_suite", "typed", 3, 60);
    job_with("rma_suite", &["atomic", "2000"], 8, &[], 180);
    job_with("rma_suite", &["spinlock", "20"], 4, &[], 120);
    job_with("rma_suite", &["exclusion", "100"], 4, &[], 120);
    job("rma_suite", "sleeping", 4, 60);
    job_with("rma_suite", &["sleeping", "create"], 3, &[], 60);
    job("rma_suite", "errors", 3, 60);
    job("rma_suite", "attributes", 3, 60);
}

/// A put to a window whose keys were revoked (dropped without free) fails
/// at the flush with MPI_ERR_RMA_RANGE naming the NIC's remote access
/// error; the memory is not touched and the other ranks go on.
#[test]
fn a_remote_access_error_fails_the_operation() {
    job("rma_suite", "revoked", 3, 60);
}

#[test]
fn default_selection_without_a_provider_leaves_verbs_out() {
    let mut c = Command::new(bins().oxrun());
    c.args(["--tag-output", "-n", "2"])
        .arg(bins().bin("p2p_suite"))
        .arg("all-pairs")
        .env("OXMPI_VERBOSE", "1")
        .env_remove("OXMPI_VERBS_PROVIDER")
        .env_remove("OXMPI_TRANSPORTS");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let bindings = vc_bindings(&out.stderr);
    assert!(!bindings.is_empty(), "{}", out.stderr);
    assert!(
        bindings.iter().all(|b| b.method != "verbs"),
        "{:?}",
        bindings.iter().map(|b| &b.method).collect::<Vec<_>>()
    );
    assert!(
        out.stderr
            .contains("the verbs transport does not start here"),
        "{}",
        out.stderr
    );
}

#[test]
fn verbs_named_without_a_provider_and_a_bad_provider_are_errors() {
    let job = |env: &[(&str, &str)]| {
        let mut c = bins().check("p2p_suite", "all-pairs", 2, &[]);
        c.env_remove("OXMPI_VERBS_PROVIDER")
            .env_remove("OXMPI_TRANSPORTS")
            .envs(env.iter().copied());
        run(c, Duration::from_secs(60))
    };
    let out = job(&[("OXMPI_TRANSPORTS", "verbs")]);
    assert!(!out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("names verbs, which cannot start")
            && out.stderr.contains("no RDMA device"),
        "{}",
        out.stderr
    );
    let out = job(&[("OXMPI_VERBS_PROVIDER", "rxe")]);
    assert!(!out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("MPI_ERR_ARG") && out.stderr.contains("use soft or rdma-core"),
        "{}",
        out.stderr
    );
}
