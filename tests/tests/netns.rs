//! One job across two network namespaces, as if on two hosts: the test
//! creates namespaces A and B joined by a veth pair, each end with an
//! address of its own (10.231.0.1/30 in A, 10.231.0.2/30 in B), and starts
//! one job through oxrun's MPMD form,
//!
//! ```text
//! oxrun -n 2 -x OXMPI_TCP_ADDR=10.231.0.1 ip netns exec A p2p_suite CHECK :
//!       -n 2 -x OXMPI_TCP_ADDR=10.231.0.2 ip netns exec B p2p_suite CHECK
//! ```
//!
//! with the default transports (and the same with the `collectives` and
//! `communicators` programs). Ranks 0 and 1 (in A) and ranks 2 and 3 (in
//! B) must talk through shared memory, the others over TCP across the veth
//! (the shared-memory card carries the network namespace): every VC bound
//! in the job is checked from `OXMPI_VERBOSE` output. The checks of
//! `p2p_suite` made for two ranks run with one rank in each namespace, so
//! the whole suite that the shm-only and TCP-only tests run also runs in
//! this mixed job.
//!
//! A second job puts rank 0 in a PID namespace of its own (`unshare
//! --pid`), as a container that shares the host's network namespace (a
//! pod's) would: it must reach ranks 1 and 2 over TCP, since it cannot
//! name their processes for single copies, while those two use shared
//! memory.
//!
//! `ip netns` and `unshare --pid` need root. As root the test runs; with
//! passwordless sudo it runs itself again under `sudo -n`; with neither it
//! says why and passes without doing anything, or fails where
//! `OXMPI_REQUIRE_PRIVILEGED_TESTS=1` (`oxmpi_jobs::privilege`). The namespaces (and with them the veth pair)
//! are removed at the end, also when the test fails; only addresses inside
//! them are used.

use oxmpi_jobs::privilege::as_root;
use oxmpi_jobs::{run, shm_leftovers, vc_bindings, Binaries, Job};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"))
}

/// What the tests need root for.
const NEEDS: &str = "create network namespaces";

/// The address of each namespace's end of the veth pair.
const ADDRS: [&str; 2] = ["10.231.0.1", "10.231.0.2"];

/// Two network namespaces joined by a veth pair, removed on drop.
struct Namespaces {
    /// Names of the namespaces, unique to this test run.
    names: [String; 2],
    /// Names of the veth ends, one in each namespace.
    veths: [String; 2],
}

/// Runs `ip ARGS`, bounded in time; panics with its output if it fails.
fn ip(args: &[&str]) {
    let mut c = Command::new("ip");
    c.args(args);
    let out = run(c, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "ip {} failed with {}: {}",
        args.join(" "),
        out.status,
        out.stderr
    );
}

impl Namespaces {
    /// Creates both namespaces, the veth pair between them and their
    /// addresses. The guard exists before the first command, so whatever
    /// was made is removed when a later command fails.
    fn create() -> Namespaces {
        let pid = std::process::id();
        let ns = Namespaces {
            names: [format!("oxmpi-{pid}-a"), format!("oxmpi-{pid}-b")],
            // Interface names have at most 15 characters.
            veths: [format!("oxv{pid}a"), format!("oxv{pid}b")],
        };
        let [a, b] = &ns.names;
        let [va, vb] = &ns.veths;
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        // Both ends are created inside their namespaces: nothing of the
        // test is ever in the machine's own network namespace.
        ip(&[
            "link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b,
        ]);
        for ((name, veth), addr) in ns.names.iter().zip(&ns.veths).zip(ADDRS) {
            ip(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{addr}/30"),
                "dev",
                veth,
            ]);
            ip(&["-n", name, "link", "set", veth, "up"]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Removing a namespace removes its end of the veth pair, and so
        // the pair. Errors are ignored: the namespace may not have been
        // made (a failed creation), and a drop must not panic.
        for name in &self.names {
            let mut c = Command::new("ip");
            c.args(["netns", "del", name]);
            if let Ok(job) = Job::spawn(c, Duration::from_secs(30)) {
                let _ = job.try_finish();
            }
        }
    }
}

/// The MPMD job of `program args`: ranks 0 and 1 in namespace A, 2 and 3
/// in B, each part with its namespace's address for TCP, default
/// transports, and VC bindings logged.
fn job(ns: &Namespaces, program: &str, args: &[&str], per_part: usize) -> Command {
    let mut c = Command::new(bins().oxrun());
    c.arg("--tag-output");
    for (part, (name, addr)) in ns.names.iter().zip(ADDRS).enumerate() {
        if part > 0 {
            c.arg(":");
        }
        c.args(["-n", &per_part.to_string()])
            .args(["-x", &format!("OXMPI_TCP_ADDR={addr}")])
            .args(["ip", "netns", "exec", name])
            .arg(bins().bin(program))
            .args(args);
    }
    c.env_remove("OXMPI_TRANSPORTS").env("OXMPI_VERBOSE", "1");
    c
}

/// Runs `program check args` in the job and checks every VC binding it
/// logged: shared memory within a namespace, TCP to the peer's own
/// address across, and for each pair of ranks that talked, at least one
/// end's binding.
fn check_in_job(ns: &Namespaces, program: &str, check: &[&str], per_part: usize) {
    let out = run(job(ns, program, check, per_part), Duration::from_secs(120));
    out.assert_success();
    let ranks = 2 * per_part;
    let namespace = |rank: usize| rank / per_part;
    let mut bound = vec![vec![false; ranks]; ranks];
    for b in vc_bindings(&out.stderr) {
        if namespace(b.rank) == namespace(b.peer) {
            assert_eq!(b.method, "shm", "{b:?}");
        } else {
            assert_eq!(b.method, "tcp", "{b:?}");
            let addr = ADDRS[namespace(b.peer)];
            assert!(b.card.starts_with(&format!("{addr}:")), "{b:?}");
        }
        bound[b.rank][b.peer] = true;
    }
    let talked: Vec<(usize, usize)> = match check[0] {
        // Every rank to every other.
        "all-pairs" | "data" => (0..ranks)
            .flat_map(|r| (r + 1..ranks).map(move |p| (r, p)))
            .collect(),
        // Every rank to rank 0.
        "mprobe" => (1..ranks).map(|p| (0, p)).collect(),
        // Checks of what a rank does alone: sends to itself, to
        // PROC_NULL, and calls that are refused.
        "self" | "proc-null" | "errors" => Vec::new(),
        // Rank 0 and rank 1.
        _ => vec![(0, 1)],
    };
    assert_talked_and_left_nothing(&bound, &talked, &out.stderr);
}

/// Checks that each pair of ranks in `talked` has at least one end's VC
/// binding in `bound` (by rank, then peer), and that the job left no
/// shared segment.
fn assert_talked_and_left_nothing(bound: &[Vec<bool>], talked: &[(usize, usize)], stderr: &str) {
    for &(r, p) in talked {
        assert!(
            bound[r][p] || bound[p][r],
            "no binding logged between ranks {r} and {p}:\n{stderr}"
        );
    }
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

/// Whether `ip ARGS`, which lists network namespaces or links, lists
/// `name`.
fn listed(args: &[&str], name: &str) -> bool {
    let mut c = Command::new("ip");
    c.args(args);
    let out = run(c, Duration::from_secs(30));
    out.assert_success();
    out.stdout
        .split_whitespace()
        .any(|w| w.trim_end_matches(':') == name)
}

/// The checks of `p2p_suite` written for two ranks, which the shm-only
/// and TCP-only suites run too (`shm.rs`, `jobs.rs`).
const PAIR_CHECKS: [&str; 14] = [
    "ordered",
    "sizes",
    "many-irecv",
    "direct",
    "truncation",
    "probe",
    "threads",
    "single-thread",
    "modes",
    "proc-null",
    "cancel-send",
    "huge",
    "self",
    "errors",
];

#[test]
fn one_job_over_shm_within_and_tcp_across_two_network_namespaces() {
    if !as_root(
        "one_job_over_shm_within_and_tcp_across_two_network_namespaces",
        NEEDS,
    ) {
        return;
    }
    let ns = Namespaces::create();
    // Two ranks in each namespace: all pairs with receives from any
    // source, then matched probes racing from any source on rank 0.
    check_in_job(&ns, "p2p_suite", &["all-pairs"], 2);
    check_in_job(&ns, "p2p_suite", &["mprobe"], 2);
    // Every collective over both transports at once (every rank talks to
    // every other in the all-to-alls); a split by host gives one
    // communicator per namespace.
    check_in_job(&ns, "collectives", &["data"], 2);
    check_in_job(&ns, "communicators", &["hosts", "2"], 2);
    // One rank in each: the rest of the point-to-point suite, the checks
    // made for a pair of ranks, with rank 0 and rank 1 over TCP through
    // the veth pair (messages across the eager threshold up to 64 MiB
    // among them).
    for check in PAIR_CHECKS {
        check_in_job(&ns, "p2p_suite", &[check], 1);
    }
    let names = ns.names.clone();
    let veths = ns.veths.clone();
    drop(ns);
    for name in &names {
        assert!(
            !listed(&["netns", "list"], name),
            "namespace {name} is left"
        );
    }
    for veth in &veths {
        assert!(
            !listed(&["-o", "link", "show"], veth),
            "link {veth} is left"
        );
    }
}

#[test]
fn a_rank_in_its_own_pid_namespace_talks_over_tcp() {
    if !as_root("a_rank_in_its_own_pid_namespace_talks_over_tcp", NEEDS) {
        return;
    }
    let p2p_suite = bins().bin("p2p_suite");
    let mut c = Command::new(bins().oxrun());
    c.args(["--tag-output", "-n", "1"])
        .args(["unshare", "--pid", "--fork", "--kill-child"])
        .arg(&p2p_suite)
        .arg("all-pairs")
        .args([":", "-n", "2"])
        .arg(&p2p_suite)
        .arg("all-pairs")
        .env_remove("OXMPI_TRANSPORTS")
        .env("OXMPI_VERBOSE", "1");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let mut bound = vec![vec![false; 3]; 3];
    for b in vc_bindings(&out.stderr) {
        let expected = if b.rank.min(b.peer) == 0 {
            "tcp"
        } else {
            "shm"
        };
        assert_eq!(b.method, expected, "{b:?}");
        bound[b.rank][b.peer] = true;
    }
    assert_talked_and_left_nothing(&bound, &[(0, 1), (0, 2), (1, 2)], &out.stderr);
}
