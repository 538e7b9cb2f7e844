//! oxmpi's tests on real RDMA hardware: the job-test matrix and oxbench
//! over the verbs transport on the rdma-core provider
//! (`OXMPI_TRANSPORTS=verbs OXMPI_VERBS_PROVIDER=rdma-core`), on an
//! InfiniBand or RoCE device, or on soft-RoCE (`ci/soft-roce.sh`).
//!
//! The `hw` test (`tests/hw.rs`, a program rather than a libtest harness,
//! so its lines always show) asks [`Presence::detect`] whether there is a
//! device to run on. Where there is none, as on every machine the project
//! runs on, it prints that it skipped and why, and passes; where the kernel
//! lists a device but this build cannot open it, it prints the command that
//! can ([`COMMAND`]) and passes. Otherwise it runs every check of
//! [`MATRIX`] and every benchmark of [`BENCHMARKS`], printing oxbench's
//! OSU-style tables, and fails if any of them does.
//!
//! # How the programs are reused
//! The job programs (`p2p_suite`, `collectives`, `rma_suite`, ...) belong
//! to the `oxmpi-jobs` crate and `oxbench` to `oxmpi-benches`; this crate
//! has no copy of them. Its manifest builds their own source files again
//! as binaries of this crate, named `hw_<program>` (`hw_oxbench`), with
//! those crates as libraries. That is how they link oxmpi-verbs with the
//! `rdma-core` feature this crate's own `rdma-core` feature turns on, and
//! only then: the binaries require that feature, so the workspace's build
//! (`cargo test --workspace`, which needs neither libibverbs nor bindgen)
//! builds none of them. The binaries of `oxmpi-jobs` and `oxmpi-benches`
//! themselves are left as they are, built without it. `oxrun` is the
//! workspace's own, found beside them in the target directory.
//!
//! # What it owns, and what it must not know
//! It owns the list of what runs on hardware ([`MATRIX`], [`BENCHMARKS`]
//! and the environment of every job, [`REAL_PROVIDER`]) and the decision
//! to run or skip ([`Presence`]). Jobs are started, bounded in time and
//! reaped by the `oxmpi-jobs` harness; which device, port and GID to use is
//! `oxmpi_verbs::rdma_core::discover`'s choice (and `OXMPI_VERBS_DEVICE`,
//! `OXMPI_VERBS_PORT`, `OXMPI_VERBS_GID_INDEX`, passed on to every job).
//! It must not know what a check does or how the transport works: a check
//! passes when its job exits with 0 within its bound, leaving nothing
//! behind.

use oxmpi_jobs::{Binaries, Job};
use oxmpi_verbs::provider::PortInfo;
use oxmpi_verbs::rdma_core::{discover, Discovery, Selection};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Where the kernel lists its RDMA devices, one directory each.
pub const SYSFS_DEVICES: &str = "/sys/class/infiniband";

/// The command that runs these tests on a device: it builds `oxrun` and
/// the programs with the `rdma-core` feature, optimized (oxbench's
/// figures from a debug build of oxmpi measure the debug build).
pub const COMMAND: &str = "cargo build --release -p oxmpi-launcher && \
     cargo test --release -p oxmpi-hw-tests --features rdma-core";

/// The environment of every job: the verbs transport alone, on the
/// rdma-core provider; the programs take their eager threshold from
/// `OXMPI_TCP_EAGER_LIMIT`: the verbs transport's 32 KiB (as in the
/// soft-provider jobs of `tests/tests/verbs_jobs.rs`).
pub const REAL_PROVIDER: [(&str, &str); 3] = [
    ("OXMPI_TRANSPORTS", "verbs"),
    ("OXMPI_VERBS_PROVIDER", "rdma-core"),
    ("OXMPI_TCP_EAGER_LIMIT", "32768"),
];

/// One check of a job program, run as a job of its own.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// The `oxmpi-jobs` program (its binary here is `hw_<program>`).
    pub program: &'static str,
    /// Its arguments: the check's name, then the check's own.
    pub args: &'static [&'static str],
    /// How many ranks the job has.
    pub ranks: usize,
    /// Variables set for this check, after [`REAL_PROVIDER`].
    pub env: &'static [(&'static str, &'static str)],
    /// How long the job may take, in seconds.
    pub bound_s: u64,
}

/// A check with no variables of its own.
const fn check(
    program: &'static str,
    args: &'static [&'static str],
    ranks: usize,
    bound_s: u64,
) -> Check {
    Check {
        program,
        args,
        ranks,
        env: &[],
        bound_s,
    }
}

/// What runs on the device: the point-to-point, collective and RMA checks
/// the soft-provider jobs run (`tests/tests/verbs_jobs.rs`), and the
/// collective, non-blocking collective and RMA operation checks of the
/// other drivers, with 2 to 4 ranks (one of 66) and messages past the
/// eager limit.
pub const MATRIX: &[Check] = &[
    check("p2p_suite", &["ordered"], 2, 240),
    check("p2p_suite", &["sizes"], 2, 240),
    check("p2p_suite", &["many-irecv"], 2, 240),
    check("p2p_suite", &["truncation"], 2, 240),
    check("p2p_suite", &["probe"], 2, 240),
    check("p2p_suite", &["modes"], 2, 240),
    check("p2p_suite", &["proc-null"], 2, 240),
    check("p2p_suite", &["cancel-send"], 2, 240),
    check("p2p_suite", &["long"], 2, 240),
    check("p2p_suite", &["all-pairs"], 4, 120),
    check("p2p_suite", &["mprobe"], 3, 120),
    check("p2p_suite", &["threads"], 2, 120),
    check("p2p_suite", &["flood"], 2, 120),
    check("p2p_suite", &["flood"], 4, 180),
    // Queue pairs connected on first use through the UD channel, in a
    // job past the 64 ranks a card listing a queue pair per rank served.
    check("p2p_suite", &["ordered"], 66, 240),
    check("completion", &["order"], 3, 120),
    check("completion", &["bulk"], 3, 120),
    check("completion", &["get-status"], 3, 120),
    check("p2p_modes", &["buffered"], 3, 120),
    check("p2p_modes", &["persistent"], 3, 120),
    check("p2p_modes", &["persistent-ring"], 3, 120),
    check("p2p_modes", &["elements"], 3, 120),
    check("collectives", &["data"], 3, 180),
    check("collectives", &["operations"], 3, 120),
    check("collectives", &["mismatch"], 2, 60),
    check("nonblocking_collectives", &["data"], 3, 180),
    check("nonblocking_collectives", &["progress"], 3, 120),
    check("rma_suite", &["ops"], 2, 180),
    check("rma_suite", &["operations"], 3, 120),
    check("rma_suite", &["dynamic"], 3, 60),
    check("rma_suite", &["atomic", "500"], 4, 120),
    // Windows take the RDMA path on the NIC: its atomics, the lock words
    // and the accumulate mutex, a target asleep outside MPI, operations
    // longer than one RDMA transfer, and the error classes of bad calls.
    check("rma_suite", &["path", "rdma"], 3, 60),
    check("rma_suite", &["spinlock", "20"], 4, 120),
    check("rma_suite", &["exclusion", "100"], 4, 120),
    check("rma_suite", &["sleeping"], 4, 60),
    check("rma_suite", &["large"], 3, 60),
    check("rma_suite", &["errors"], 3, 60),
    Check {
        program: "rma_suite",
        args: &["passive"],
        ranks: 3,
        env: &[("OXMPI_ASYNC_PROGRESS", "1")],
        bound_s: 60,
    },
];

/// The oxbench benchmarks measured on the device, each a 2-rank job with
/// [`BENCHMARK_OPTIONS`] (sizes up to oxbench's default 4 MiB): latency and bandwidth as
/// `osu_latency`, `osu_bw` and `osu_bibw`, and one-sided put and get as
/// `osu_put_latency`, `osu_get_latency`, `osu_put_bw` and `osu_get_bw`.
pub const BENCHMARKS: &[&str] = &[
    "latency",
    "bw",
    "bibw",
    "put_latency",
    "get_latency",
    "put_bw",
    "get_bw",
];

/// oxbench's options for every benchmark: the counts of `oxbench suite`
/// (2000 timed iterations per size, 100 above 8 KiB), which keep the
/// bandwidth runs to 4 MiB within a minute or two on soft-RoCE.
pub const BENCHMARK_OPTIONS: &[&str] = &["--iterations", "2000", "--iterations-large", "100"];

/// How long one benchmark may take.
pub const BENCHMARK_BOUND: Duration = Duration::from_secs(600);

impl Check {
    /// The check as it is named in reports: `p2p_suite flood (4 ranks)`.
    pub fn name(&self) -> String {
        format!(
            "{} {} ({} ranks)",
            self.program,
            self.args.join(" "),
            self.ranks
        )
    }

    /// Runs the check as a job of `bins` (this crate's `hw_` binaries and
    /// `oxrun`) within its bound; `Err` says how it failed, with the end
    /// of its output.
    pub fn run(&self, bins: &Binaries) -> Result<Duration, String> {
        let mut c = bins.check(
            &binary(self.program),
            self.args[0],
            self.ranks,
            &REAL_PROVIDER,
        );
        c.args(&self.args[1..]).envs(self.env.iter().copied());
        finish(c, Duration::from_secs(self.bound_s), self.name()).map(|out| out.1)
    }
}

/// Runs oxbench's `benchmark` between 2 ranks on the device within
/// [`BENCHMARK_BOUND`]; returns its table.
pub fn run_benchmark(bins: &Binaries, benchmark: &str) -> Result<String, String> {
    let mut c = Command::new(bins.oxrun());
    c.args(["-n", "2"])
        .arg(bins.bin(&binary("oxbench")))
        .arg(benchmark)
        .args(BENCHMARK_OPTIONS)
        .envs(REAL_PROVIDER);
    finish(c, BENCHMARK_BOUND, format!("oxbench {benchmark}")).map(|out| out.0)
}

/// This crate's binary of `program`.
pub fn binary(program: &str) -> String {
    format!("hw_{program}")
}

/// Runs `command` as a job named `what` within `bound`: its standard
/// output and how long it took, or why it failed.
fn finish(command: Command, bound: Duration, what: String) -> Result<(String, Duration), String> {
    let out = Job::spawn(command, bound)
        .and_then(|job| job.named(what.clone()).try_finish())
        .map_err(|f| f.summary(20))?;
    if out.status.success() {
        Ok((out.stdout, out.elapsed))
    } else {
        let tail: Vec<&str> = out.stderr.lines().rev().take(20).collect();
        Err(format!(
            "{what} failed with {}:\n    {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n    ")
        ))
    }
}

/// Whether the tests can run here, and on what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    /// The real provider can use this device and port: run.
    Found {
        /// The device's name.
        device: String,
        /// Its port, with the GID chosen.
        port: PortInfo,
    },
    /// No device to run on; why, for a person.
    Absent(String),
    /// The kernel lists these devices, but this build has no rdma-core
    /// support: [`COMMAND`] runs the tests on them.
    Unbuilt(Vec<String>),
}

impl Presence {
    /// Looks for a device as the verbs transport will
    /// (`oxmpi_verbs::rdma_core::discover`, with the `OXMPI_VERBS_*`
    /// choices). `Err` is an invalid choice, or (in a build with rdma-core
    /// support) a device named in `OXMPI_VERBS_DEVICE` that cannot be
    /// used: a failure, not a skip.
    pub fn detect() -> Result<Presence, String> {
        let found = Selection::from_env()
            .and_then(|s| discover(&s))
            .map_err(|e| e.to_string())?;
        let built = cfg!(feature = "rdma-core");
        Ok(Presence::decide(found, built, || {
            kernel_devices(SYSFS_DEVICES)
        }))
    }

    /// What discovery's outcome `found` means for a build with or without
    /// rdma-core support (`built`). Without it, discovery can only say so,
    /// and the kernel's list (`listed`) tells whether there was a device
    /// to find.
    pub fn decide(found: Discovery, built: bool, listed: impl FnOnce() -> Vec<String>) -> Presence {
        match found {
            Discovery::Found { device, port } => Presence::Found { device, port },
            Discovery::NoDevice(why) if built => Presence::Absent(why),
            Discovery::NoDevice(_) => {
                let listed = listed();
                if listed.is_empty() {
                    Presence::Absent(format!(
                        "no RDMA device: the kernel lists none in {SYSFS_DEVICES}"
                    ))
                } else {
                    Presence::Unbuilt(listed)
                }
            }
        }
    }

    /// Why the tests are skipped, in one line; `None` when they run.
    pub fn skip_reason(&self) -> Option<String> {
        match self {
            Presence::Found { .. } => None,
            Presence::Absent(why) => Some(why.clone()),
            Presence::Unbuilt(devices) => Some(format!(
                "the kernel lists RDMA device {}, but this build has no rdma-core support \
                 (cargo feature rdma-core): run `{COMMAND}`",
                devices.join(", ")
            )),
        }
    }
}

/// The names of the devices listed in `dir` (none when it is missing).
fn kernel_devices(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(Path::new(dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxmpi_verbs::provider::{Gid, GidEntry, GidType, LinkLayer, Mtu};

    fn port() -> PortInfo {
        PortInfo {
            port: 1,
            lid: 0,
            active_mtu: Mtu::Mtu1024,
            link_layer: LinkLayer::Ethernet,
            gid: GidEntry {
                index: 1,
                gid: Gid::default(),
                kind: GidType::RoceV2,
            },
        }
    }

    fn no_list() -> Vec<String> {
        panic!("the kernel's list was read where discovery decides")
    }

    #[test]
    fn a_device_found_runs() {
        let found = Discovery::Found {
            device: "rxe0".into(),
            port: port(),
        };
        let p = Presence::decide(found, true, no_list);
        assert_eq!(
            p,
            Presence::Found {
                device: "rxe0".into(),
                port: port()
            }
        );
        assert_eq!(p.skip_reason(), None);
    }

    #[test]
    fn with_rdma_core_discovery_says_why_none() {
        let why = "no RDMA device has an active port (devices: mlx5_0)";
        let p = Presence::decide(Discovery::NoDevice(why.into()), true, no_list);
        assert_eq!(p.skip_reason().as_deref(), Some(why));
    }

    #[test]
    fn without_rdma_core_the_kernel_list_decides() {
        let unbuilt = || Discovery::NoDevice("this build has no rdma-core support".into());
        let p = Presence::decide(unbuilt(), false, Vec::new);
        assert!(
            matches!(&p, Presence::Absent(why) if why.contains(SYSFS_DEVICES)),
            "{p:?}"
        );
        let p = Presence::decide(unbuilt(), false, || vec!["mlx5_0".into(), "rxe0".into()]);
        assert_eq!(p, Presence::Unbuilt(vec!["mlx5_0".into(), "rxe0".into()]));
        let why = p.skip_reason().unwrap();
        assert!(
            why.contains("mlx5_0, rxe0") && why.contains(COMMAND),
            "{why}"
        );
    }

    #[test]
    fn kernel_devices_lists_a_directory_sorted_and_nothing_when_missing() {
        let dir = std::env::temp_dir().join(format!("oxmpi-hw-tests-{}", std::process::id()));
        for name in ["rxe1", "mlx5_0"] {
            std::fs::create_dir_all(dir.join(name)).unwrap();
        }
        let listed = kernel_devices(dir.to_str().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(listed, ["mlx5_0", "rxe1"]);
        assert!(kernel_devices(dir.to_str().unwrap()).is_empty());
    }

    /// Every program of the matrix, and oxbench, has its `hw_` binary in
    /// the manifest, built from the program's own source.
    #[test]
    fn every_program_has_its_binary() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let mut programs: Vec<(&str, String)> = MATRIX
            .iter()
            .map(|c| (c.program, format!("../tests/src/bin/{}.rs", c.program)))
            .collect();
        programs.push(("oxbench", "../benches/src/main.rs".into()));
        for (program, path) in programs {
            let entry = format!(
                "[[bin]]\nname = \"{}\"\npath = \"{path}\"\nrequired-features = [\"rdma-core\"]\ntest = false",
                binary(program)
            );
            assert!(
                manifest.contains(&entry),
                "no entry\n{entry}\nin Cargo.toml"
            );
            assert!(root.join(&path).is_file(), "{path} is missing");
        }
    }
}
