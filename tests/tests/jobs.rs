//! Real jobs through oxrun over TCP (`OXMPI_TRANSPORTS=tcp`; `shm.rs`
//! runs the same programs over shared memory): the point-to-point suite
//! with 2 to 8 ranks (oversubscribed on small machines), strangers at the
//! ranks' ports, a rank killed mid-job, the ring under MPICH's mpiexec
//! (with the default transports), and one MPMD job whose parts are given
//! transports of their own.

use oxmpi_jobs::{
    descendants, listening_ports, rank_of, run, shm_leftovers, vc_bindings, Binaries, Job,
};
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"))
}

fn oxrun(ranks: usize, program: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(bins().oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(program)
        .args(args)
        .env("OXMPI_TRANSPORTS", "tcp");
    c
}

fn suite(check: &str, ranks: usize) {
    let out = run(
        oxrun(ranks, &bins().bin("p2p_suite"), &[check]),
        Duration::from_secs(120),
    );
    out.assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

/// Six ranks, so each has five TCP connections and polls them by epoll:
/// the clear-to-sends that one poll answers several requests with leave
/// without another packet to push them.
#[test]
fn replies_to_a_burst_of_long_sends_leave_on_their_own() {
    suite("reply-burst", 6);
}

#[test]
fn ring_with_2_to_8_ranks() {
    for ranks in [2, 3, 4, 8] {
        let out = run(
            oxrun(ranks, &bins().example("ring"), &["20"]),
            Duration::from_secs(60),
        );
        out.assert_success();
        assert!(
            out.stdout
                .contains(&format!("ring of {ranks} ranks: 20 laps")),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn hello_and_pingpong_examples() {
    let out = run(
        oxrun(3, &bins().example("hello"), &[]),
        Duration::from_secs(60),
    );
    out.assert_success();
    assert!(
        out.stdout.contains("all 3 ranks said hello"),
        "{}",
        out.stdout
    );
    let out = run(
        oxrun(2, &bins().example("pingpong"), &[]),
        Duration::from_secs(120),
    );
    out.assert_success();
    assert_eq!(out.stdout.lines().count(), 7, "{}", out.stdout);
}

#[test]
fn singleton_without_a_launcher() {
    let mut c = Command::new(bins().bin("p2p_suite"));
    c.arg("self");
    run(c, Duration::from_secs(30)).assert_success();
}

#[test]
fn all_pairs_with_any_source() {
    suite("all-pairs", 4);
}

#[test]
fn mpmd_parts_with_their_own_transports_form_one_job() {
    // Rank 0 may use TCP only; ranks 1 and 2 (the second part) prefer
    // shared memory: they talk through it, and to rank 0 over TCP.
    let p2p_suite = bins().bin("p2p_suite");
    let mut c = Command::new(bins().oxrun());
    c.args(["--tag-output", "-n", "1", "-x", "OXMPI_TRANSPORTS=tcp"])
        .arg(&p2p_suite)
        .arg("all-pairs")
        .args([":", "-n", "2", "-x", "OXMPI_TRANSPORTS=shm,tcp"])
        .arg(&p2p_suite)
        .arg("all-pairs")
        .env("OXMPI_VERBOSE", "1");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let bindings = vc_bindings(&out.stderr);
    for b in &bindings {
        let expected = if b.rank.min(b.peer) == 0 {
            "tcp"
        } else {
            "shm"
        };
        assert_eq!(b.method, expected, "{b:?}");
    }
    for (r, p) in [(0, 1), (0, 2), (1, 2)] {
        assert!(
            bindings
                .iter()
                .any(|b| (b.rank, b.peer) == (r, p) || (b.rank, b.peer) == (p, r)),
            "no binding logged between ranks {r} and {p}:\n{}",
            out.stderr
        );
    }
}

#[test]
fn all_pairs_oversubscribed() {
    suite("all-pairs", 8);
}

#[test]
fn ten_thousand_messages_in_order() {
    suite("ordered", 2);
}

#[test]
fn sizes_across_the_threshold_up_to_64_mib() {
    suite("sizes", 2);
}

#[test]
fn sizes_with_a_small_threshold() {
    let mut c = oxrun(2, &bins().bin("p2p_suite"), &["sizes"]);
    c.env("OXMPI_TCP_EAGER_LIMIT", "1000");
    run(c, Duration::from_secs(120)).assert_success();
}

#[test]
fn ten_thousand_outstanding_receives() {
    suite("many-irecv", 2);
}

#[test]
fn blocking_receives_without_a_request_keep_order_and_truncate() {
    // Over TCP every payload arrives in parts: the direct receive becomes
    // a request for each message but the empty one.
    suite("direct", 2);
}

#[test]
fn truncation_is_an_error_and_the_job_goes_on() {
    suite("truncation", 2);
}

#[test]
fn probe_then_receive_unknown_size() {
    suite("probe", 2);
}

#[test]
fn four_threads_per_rank_at_the_multiple_level() {
    suite("threads", 2);
}

#[test]
fn other_threads_fail_at_the_single_level() {
    suite("single-thread", 2);
}

#[test]
fn synchronous_and_ready_sends() {
    suite("modes", 2);
}

#[test]
fn proc_null_operations_complete_at_once() {
    suite("proc-null", 2);
}

#[test]
fn unmatched_sends_can_be_cancelled() {
    suite("cancel-send", 2);
}

#[test]
fn matched_probes_race_from_any_source() {
    suite("mprobe", 4);
}

#[test]
fn a_three_gib_message() {
    suite("huge", 2);
}

#[test]
fn messages_to_self() {
    suite("self", 2);
}

#[test]
fn argument_errors_and_cancel() {
    suite("errors", 2);
}

/// The ranks of a job started by the launcher `launcher_pid`, by rank,
/// once all of them listen for connections.
fn wait_for_listening_ranks(
    launcher_pid: u32,
    ranks: usize,
    bound: Duration,
) -> Vec<(usize, u32, Vec<u16>)> {
    let start = Instant::now();
    loop {
        let found: Vec<(usize, u32, Vec<u16>)> = descendants(launcher_pid)
            .into_iter()
            .filter_map(|pid| Some((rank_of(pid)?, pid, listening_ports(pid))))
            .filter(|(_, _, ports)| !ports.is_empty())
            .collect();
        if found.len() == ranks {
            return found;
        }
        assert!(
            start.elapsed() < bound,
            "ranks did not start listening within {bound:?}: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn strangers_at_every_port_do_not_stop_the_ring() {
    let job = Job::start(
        oxrun(4, &bins().example("ring"), &["3000"]),
        Duration::from_secs(120),
    );
    let ranks = wait_for_listening_ranks(job.pid(), 4, Duration::from_secs(30));
    let mut silent = Vec::new();
    for (_, _, ports) in &ranks {
        for &port in ports {
            let addr = ("127.0.0.1", port);
            // One that stays connected and says nothing...
            if let Ok(s) = TcpStream::connect(addr) {
                silent.push(s);
            }
            // ...one that sends garbage...
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\nthis is not an oxmpi handshake\n");
            }
            // ...one that sends a lot of zeros and hangs up.
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(&[0u8; 4096]);
            }
        }
    }
    let out = job.finish();
    drop(silent);
    out.assert_success();
    assert!(out.stdout.contains("3000 laps"), "{}", out.stdout);
}

#[test]
fn killing_a_rank_ends_the_job_naming_it() {
    let job = Job::start(
        oxrun(4, &bins().example("ring"), &["100000000"]),
        Duration::from_secs(60),
    );
    let ranks = wait_for_listening_ranks(job.pid(), 4, Duration::from_secs(30));
    let (rank, pid, _) = ranks
        .iter()
        .find(|(r, _, _)| *r == 2)
        .cloned()
        .expect("rank 2 runs");
    // Let the ring run for a moment first.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed_at = job.elapsed();
    let out = job.finish();
    assert!(
        !out.status.success(),
        "the job succeeded after a rank was killed"
    );
    let after_kill = out.elapsed - killed_at;
    assert!(
        after_kill < Duration::from_secs(4),
        "the job took {after_kill:?} to end after the kill"
    );
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains(&format!("rank {rank}")) && l.contains(&pid.to_string()))
        .unwrap_or_else(|| panic!("no line names rank {rank} (pid {pid}):\n{}", out.stderr));
    assert!(
        line.contains("signal 9") || line.contains("SIGKILL"),
        "{line}"
    );
}

fn mpiexec() -> Option<String> {
    ["mpiexec.hydra", "mpiexec.mpich"]
        .into_iter()
        .find_map(|name| {
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {name}"))
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|_| name.to_owned())
        })
}

#[test]
fn ring_under_mpich_mpiexec() {
    let Some(mpiexec) = mpiexec() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "MPICH's mpiexec is missing in CI: .ci/run must install the mpich package"
        );
        eprintln!("skipped: MPICH's mpiexec.hydra is not installed (apt-get install mpich)");
        return;
    };
    let mut c = Command::new(mpiexec);
    c.args(["-n", "4"]).arg(bins().example("ring")).arg("50");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    assert!(
        out.stdout.contains("ring of 4 ranks: 50 laps"),
        "{}",
        out.stdout
    );
}

fn assert_failure_names_rank(check: &str, expected_code: i32, what: &str) {
    let out = run(
        oxrun(3, &bins().bin("p2p_suite"), &[check]),
        Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(expected_code),
        "{check}: {}",
        out.stderr
    );
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("oxrun: rank"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line naming the failed rank:\n{}",
        out.stderr
    );
    assert!(
        lines[0].contains("rank 1 (pid ") && lines[0].contains(what),
        "{}",
        lines[0]
    );
    assert!(
        out.elapsed < Duration::from_secs(10),
        "the job took {:?} to end",
        out.elapsed
    );
}

#[test]
fn abort_ends_the_job_with_its_code() {
    assert_failure_names_rank("abort", 7, "called abort with code 7");
}

#[test]
fn exit_without_finalize_is_a_failure() {
    assert_failure_names_rank("exit-early", 1, "exited without finalizing");
}
