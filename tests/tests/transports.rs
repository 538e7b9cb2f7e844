//! Which transports a job uses, checked at initialize through real jobs:
//! a restriction (`OXMPI_TRANSPORTS`) that leaves a peer unreachable, or
//! that names a transport this build lacks, fails initialize with a message
//! that names the ranks and what to set; and a transport that cannot start
//! on a machine is skipped by the default list but fails a list that names
//! it. Shared memory is made unable to start for real: the job runs under
//! a seccomp filter (installed by the test in oxrun's process, inherited by
//! every rank) that refuses `memfd_create`, as some container runtimes do.

use oxmpi_jobs::{run, shm_leftovers, vc_bindings, Binaries, Outcome};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"))
}

/// Runs `command` (an oxrun job) and checks it left nothing behind.
fn finished(command: Command) -> Outcome {
    let out = run(command, Duration::from_secs(60));
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
    out
}

/// Asserts that the job failed and that its standard error holds each of
/// `parts`.
fn failed_saying(out: &Outcome, parts: &[&str]) {
    assert!(!out.status.success(), "the job succeeded:\n{}", out.stderr);
    for part in parts {
        assert!(
            out.stderr.contains(part),
            "{part:?} not on standard error:\n{}",
            out.stderr
        );
    }
}

/// `oxrun -n 2 p2p_suite all-pairs` with `OXMPI_TRANSPORTS` set to
/// `transports` (unset when `None`) and bindings logged.
fn all_pairs(transports: Option<&str>) -> Command {
    let mut c = Command::new(bins().oxrun());
    c.args(["--tag-output", "-n", "2"])
        .arg(bins().bin("p2p_suite"))
        .arg("all-pairs")
        .env("OXMPI_VERBOSE", "1");
    match transports {
        Some(t) => c.env("OXMPI_TRANSPORTS", t),
        None => c.env_remove("OXMPI_TRANSPORTS"),
    };
    c
}

/// Makes `memfd_create` fail with `EPERM` in the command's process and
/// everything it starts: a seccomp filter, installed between fork and exec.
/// The filter does not look at the architecture: the programs under it
/// are this build's, and a foreign-architecture system call that shares
/// the number is one they never make.
fn forbid_memfd(c: &mut Command) {
    const fn op(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }
    const NR: u32 = std::mem::offset_of!(libc::seccomp_data, nr) as u32;
    static FILTER: [libc::sock_filter; 4] = [
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, NR, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            libc::SYS_memfd_create as u32,
            0,
            1,
        ),
        op(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            0,
            0,
        ),
        op(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    ];
    // SAFETY: between fork and exec the hook makes two prctl calls, which
    // are async-signal-safe, and builds a plain struct on the stack that
    // points at the static filter.
    unsafe {
        c.pre_exec(|| {
            let program = libc::sock_fprog {
                len: FILTER.len() as u16,
                filter: FILTER.as_ptr().cast_mut(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &raw const program,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn a_restriction_that_leaves_peers_unreachable_fails_initialize() {
    // Rank 0 may use TCP only, ranks 1 and 2 shared memory only: no pair
    // with rank 0 has a transport in common.
    let p2p_suite = bins().bin("p2p_suite");
    let mut c = Command::new(bins().oxrun());
    c.args(["-n", "1", "-x", "OXMPI_TRANSPORTS=tcp"])
        .arg(&p2p_suite)
        .arg("all-pairs")
        .args([":", "-n", "2", "-x", "OXMPI_TRANSPORTS=shm"])
        .arg(&p2p_suite)
        .arg("all-pairs");
    // Whichever rank fails first ends the job: rank 0 names both
    // others, each of them rank 0.
    let out = finished(c);
    failed_saying(
        &out,
        &[
            "MPI_ERR_OTHER: rank ",
            "as no transport both ends offer connects them: rank ",
            "(the same host) offers ",
            "Set OXMPI_TRANSPORTS on every rank",
        ],
    );
    let rank0 =
        ") offers tcp; rank 1 (the same host) offers shm; rank 2 (the same host) offers shm";
    let others = ") offers shm; rank 0 (the same host) offers tcp";
    assert!(
        (out.stderr.contains("rank 0 cannot reach ranks 1, 2") && out.stderr.contains(rank0))
            || (out.stderr.contains("cannot reach rank 0,") && out.stderr.contains(others)),
        "{}",
        out.stderr
    );
}

#[test]
fn unknown_and_repeated_transports_are_refused() {
    for (setting, says) in [
        ("shm,ib", "MPI_ERR_ARG: OXMPI_TRANSPORTS=\"shm,ib\" names unknown transport \"ib\"; this build has: shm, verbs, tcp"),
        ("tcp,tcp", "MPI_ERR_ARG: OXMPI_TRANSPORTS=\"tcp,tcp\" names tcp twice"),
    ] {
        failed_saying(&finished(all_pairs(Some(setting))), &[says]);
    }
}

#[test]
fn without_shared_memory_the_default_list_runs_over_tcp() {
    let mut c = all_pairs(None);
    forbid_memfd(&mut c);
    let out = finished(c);
    out.assert_success();
    assert!(
        out.stderr
            .contains("the shm transport does not start here, so this rank does not offer it"),
        "no reason given for skipping shm:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("creating a memory file"),
        "{}",
        out.stderr
    );
    let bindings = vc_bindings(&out.stderr);
    assert!(
        !bindings.is_empty() && bindings.iter().all(|b| b.method == "tcp"),
        "{bindings:?}"
    );
}

#[test]
fn a_named_transport_that_cannot_start_fails_initialize() {
    let mut c = all_pairs(Some("shm,tcp"));
    forbid_memfd(&mut c);
    failed_saying(
        &finished(c),
        &[
            "MPI_ERR_OTHER: OXMPI_TRANSPORTS=\"shm,tcp\" names shm, which cannot start on rank",
            "creating a memory file: Operation not permitted",
            "Take it out of OXMPI_TRANSPORTS",
        ],
    );
}
