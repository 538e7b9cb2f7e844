//! `oxbench compare`: oxmpi's own yardstick, the same benchmarks run over
//! oxmpi, MPICH and Open MPI on this machine, in the same run, over one
//! transport (`--transport tcp`, the default, or `shm`), beside the floor
//! of that transport where oxbench has one.
//!
//! This module owns what the comparison needs beyond oxbench's own
//! benchmarks and [`crate::runner`]'s jobs:
//!
//! - **The peers.** MPICH and Open MPI as Debian packages them
//!   ([`PACKAGES`]): their compilers `mpicc.mpich` and `mpicc.openmpi` and
//!   launchers `mpiexec.mpich` and `mpiexec.openmpi`, looked up on `PATH`.
//!   When one is missing and oxbench runs as root, it installs the packages
//!   with `apt-get` (saying so); otherwise it stops with a message naming
//!   them.
//! - **The peer benchmark.** `benches/c/peer_bench.c`, embedded in oxbench,
//!   is [`crate::mpi_bench`] written against the standard MPI C API, with
//!   the same command line, counts, patterns, checks and output. It is
//!   built with each peer's `mpicc` into `compare-peers/<peer>/` beside
//!   the oxbench executable (the target directory), next to a copy of the
//!   source it was built from, and rebuilt when the embedded source
//!   differs from that copy.
//! - **The jobs.** Each implementation runs each benchmark as one job over
//!   all the sizes (2 ranks, or `--ranks` for `mbw_mr` and `multi_lat`),
//!   restricted to the transport: over TCP, oxbench under
//!   `oxrun` with `OXMPI_TRANSPORTS=tcp`, MPICH's ch4:ucx with
//!   `MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self` (TCP even between local ranks),
//!   Open MPI with the ob1 PML and the TCP BTL on the loopback interface;
//!   over shared memory, `OXMPI_TRANSPORTS=shm`, MPICH as it comes (UCX's
//!   shared-memory transports between local ranks), Open MPI with ob1 and
//!   the vader BTL (its shared memory, with CMA); where the ranks
//!   outnumber the CPUs this process may use, Open MPI unbound and
//!   yielding when idle (see `peer_job`). The floor is `oxbench
//!   raw-tcp` or `oxbench raw-shm` (latency and bw only; the shared-memory
//!   latency floor up to 56 bytes; its two processes bound to a core each
//!   as oxrun binds oxmpi's two ranks, see [`crate::pinning`]). With
//!   `--rounds N`, each round runs every contender once, the order rotated
//!   from round to round, oxmpi and the floor always back to back (which
//!   of the two first alternates), so that a noisy spell of the shared
//!   machine falls on both (`round_order`); each figure is the median of
//!   the rounds, and each of oxmpi's ratios the median of the rounds'
//!   ratios (oxmpi's figure over the floor's, or the better peer's, of
//!   the same round), not the ratio of two medians that may come from
//!   different spells. `--without mpich|openmpi` leaves
//!   a peer out, for quick checks where it takes minutes (MPICH's
//!   one-sided operations over TCP); the header says so. With `--tail`,
//!   oxmpi's one-sided latency jobs time each operation too, and each
//!   round's median, 99th percentile, longest operation and count over
//!   1 ms follow the table (a mean far above its median is a few stalls).
//!   `--sync lock` (one-sided benchmarks) goes to every implementation's
//!   jobs alike, through the options' arguments, and the header says
//!   which synchronisation ran.
//! - **The result.** Per benchmark, a table (size, oxmpi, MPICH, Open MPI,
//!   oxmpi's figure over the better peer's, and where there is one the
//!   floor and oxmpi's figure over it; for `mbw_mr` the MB/s) or one JSON
//!   object. A contender whose jobs all failed is shown as unavailable,
//!   the reasons on standard error, and the exit status is then 1.

use crate::cli::{Benchmark, CompareOptions, CompareTransport, Options, Peer};
use crate::raw_shm::LINE_PAYLOAD;
use crate::report::{self, json_number, json_string, json_strings};
use crate::runner::{self, median, JobSpec, Measured};
use oxmpi_jobs::Job;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// The peer benchmark's source, built with each peer's compiler.
pub const PEER_SOURCE: &str = include_str!("../c/peer_bench.c");

/// The Debian packages that bring the peers' compilers and launchers.
pub const PACKAGES: [&str; 4] = ["mpich", "libmpich-dev", "openmpi-bin", "libopenmpi-dev"];

/// Time a peer's compiler has to build the benchmark.
const BUILD_BOUND: Duration = Duration::from_secs(120);
/// Time `apt-get` has to install the peers (or update its lists).
const APT_BOUND: Duration = Duration::from_secs(900);

/// Width of the size column (as the benchmarks' tables).
const SIZE_WIDTH: usize = 10;
/// Width of the other columns.
const COLUMN_WIDTH: usize = 14;

/// What runs in the comparison: an MPI implementation, or the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// This one, through oxrun.
    Oxmpi,
    /// MPICH (Debian: ch4:ucx), through its hydra launcher.
    Mpich,
    /// Open MPI, through its mpiexec.
    OpenMpi,
    /// No MPI at all: `oxbench raw-tcp` or `oxbench raw-shm`.
    Floor,
}

/// The contenders, in the order of the table's columns.
pub const IMPLEMENTATIONS: [Implementation; 4] = [
    Implementation::Oxmpi,
    Implementation::Mpich,
    Implementation::OpenMpi,
    Implementation::Floor,
];

/// The MPI implementations oxmpi is measured against.
const PEERS: [Implementation; 2] = [Implementation::Mpich, Implementation::OpenMpi];

impl Implementation {
    /// The peer this is, if it is one.
    fn peer(self) -> Option<Peer> {
        match self {
            Implementation::Mpich => Some(Peer::Mpich),
            Implementation::OpenMpi => Some(Peer::OpenMpi),
            Implementation::Oxmpi | Implementation::Floor => None,
        }
    }

    /// Whether `compare` leaves this one out (`--without`).
    fn left_out(self, compare: &CompareOptions) -> bool {
        self.peer().is_some_and(|p| compare.without.contains(&p))
    }

    /// The name shown in the table.
    pub fn name(self) -> &'static str {
        match self {
            Implementation::Oxmpi => "oxmpi",
            Implementation::Mpich => "MPICH",
            Implementation::OpenMpi => "Open MPI",
            Implementation::Floor => "floor",
        }
    }

    /// The name in JSON and in the cache directory.
    pub fn key(self) -> &'static str {
        match self {
            Implementation::Oxmpi => "oxmpi",
            Implementation::Mpich => "mpich",
            Implementation::OpenMpi => "openmpi",
            Implementation::Floor => "floor",
        }
    }

    /// A peer's compiler and launcher; `None` for oxmpi and the floor.
    fn peer_tools(self) -> Option<(&'static str, &'static str)> {
        match self {
            Implementation::Oxmpi | Implementation::Floor => None,
            Implementation::Mpich => Some(("mpicc.mpich", "mpiexec.mpich")),
            Implementation::OpenMpi => Some(("mpicc.openmpi", "mpiexec.openmpi")),
        }
    }
}

/// Runs `oxbench compare`: prints a table (or JSON object) per benchmark
/// on standard output, progress and failures on standard error. Exits
/// with 0 when every contender produced figures, 1 otherwise (or when the
/// peers are missing and cannot be installed, or oxrun is missing).
pub fn main(compare: &CompareOptions) -> ExitCode {
    match run(compare) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("oxbench compare: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How one contender's jobs are started, or why they cannot be.
struct Contender {
    implementation: Implementation,
    /// oxmpi: oxrun and oxbench; a peer: its launcher and its benchmark;
    /// the floor: oxbench twice.
    tools: Result<(PathBuf, PathBuf), String>,
}

impl Contender {
    /// The job of `benchmark` and the options it runs with (the floor's
    /// may cover fewer sizes); `None` when there is none (the floor of
    /// some benchmarks) or the contender is unavailable.
    fn job(
        &self,
        compare: &CompareOptions,
        benchmark: Benchmark,
        root: bool,
    ) -> Option<(JobSpec, Options)> {
        let (launcher, program) = self.tools.as_ref().ok()?;
        let ranks = ranks_of(compare, benchmark);
        let options = &compare.options.for_benchmark(benchmark);
        let transport = compare.transport;
        match self.implementation {
            Implementation::Oxmpi => Some((
                runner::oxmpi_job(
                    launcher,
                    program,
                    benchmark,
                    options,
                    ranks,
                    transport.name(),
                ),
                options.clone(),
            )),
            Implementation::Floor => {
                runner::floor_job(program, transport.name(), benchmark, options)
            }
            peer => {
                // The C peers time the loop only: no tail.
                let options = Options {
                    tail: false,
                    ..options.clone()
                };
                Some((
                    peer_job(
                        peer,
                        launcher,
                        program,
                        transport,
                        benchmark,
                        &options,
                        ranks,
                        allowed_cpus(),
                        root,
                    ),
                    options,
                ))
            }
        }
    }
}

/// Ranks of `benchmark`'s jobs.
fn ranks_of(compare: &CompareOptions, benchmark: Benchmark) -> usize {
    if benchmark.is_multi_pair() || benchmark.is_any_ranks() {
        compare.ranks
    } else {
        2
    }
}

fn run(compare: &CompareOptions) -> Result<bool, String> {
    let (oxbench, oxrun) = runner::oxbench_and_oxrun()?;
    let root = effective_uid_is_root();
    ensure_peers(root)?;
    let cache = oxbench
        .parent()
        .expect("oxbench_and_oxrun checked the parent")
        .join("compare-peers");
    let contenders: Vec<Contender> = IMPLEMENTATIONS
        .iter()
        .filter(|i| !i.left_out(compare))
        .map(|&implementation| {
            let tools = match implementation {
                Implementation::Oxmpi => Ok((oxrun.clone(), oxbench.clone())),
                Implementation::Floor => Ok((oxbench.clone(), oxbench.clone())),
                peer => {
                    let (_, launcher) = peer.peer_tools().expect("a peer has tools");
                    build_peer(peer, &cache).map(|binary| (PathBuf::from(launcher), binary))
                }
            };
            if let Err(e) = &tools {
                eprintln!(
                    "oxbench compare: {} is unavailable: {e}",
                    implementation.name()
                );
            }
            Contender {
                implementation,
                tools,
            }
        })
        .collect();

    let mut all_ran = true;
    let mut out = std::io::stdout().lock();
    for &benchmark in &compare.benchmarks {
        let sizes = compare.options.for_benchmark(benchmark).sizes();
        let columns = compare_one(compare, benchmark, &contenders, root);
        all_ran &= columns.iter().all(|c| c.figures.is_ok());
        let text = if compare.options.json {
            json_report(benchmark, compare, &columns, &sizes)
        } else {
            table(benchmark, compare, &columns, &sizes)
        };
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing the result: {e}"))?;
    }
    Ok(all_ran)
}

/// Runs `benchmark` over every contender that has a job for it, every
/// round; returns their columns in [`IMPLEMENTATIONS`] order (only those
/// with a job).
fn compare_one(
    compare: &CompareOptions,
    benchmark: Benchmark,
    contenders: &[Contender],
    root: bool,
) -> Vec<Column> {
    let rounds = compare.rounds;
    let sizes = compare.options.for_benchmark(benchmark).sizes();
    let mut outcomes: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); contenders.len()];
    let implementations: Vec<Implementation> =
        contenders.iter().map(|c| c.implementation).collect();
    for round in 0..rounds {
        for index in round_order(&implementations, round) {
            let contender = &contenders[index];
            let Some((spec, options)) = contender.job(compare, benchmark, root) else {
                continue;
            };
            let name = contender.implementation.name();
            eprintln!(
                "oxbench compare: {} over {} round {} of {rounds}: {name} ({} sizes)",
                benchmark.name(),
                compare.transport.name(),
                round + 1,
                options.sizes().len()
            );
            let what = format!("{name}'s {} job", benchmark.name());
            let ranks = ranks_of(compare, benchmark);
            let outcome = runner::run_job(&spec, &what, benchmark, &options, ranks, |_| {});
            if let Err(e) = &outcome {
                eprintln!("oxbench compare: {name} failed in round {}: {e}", round + 1);
            }
            outcomes[index].push(outcome);
        }
    }
    contenders
        .iter()
        .zip(outcomes)
        .filter(|(contender, _)| {
            contender.tools.is_err() || contender.job(compare, benchmark, root).is_some()
        })
        .map(|(contender, rounds)| Column::of(contender, compare, benchmark, root, &rounds, &sizes))
        .collect()
}

/// The order in which `implementations` (the contenders, as indices into
/// it) run in round `round`: oxmpi and the floor as one unit, oxmpi first
/// in even rounds and the floor first in odd ones, each peer a unit of
/// its own, the units rotated by one from round to round. oxmpi and its
/// floor are thus measured back to back in every round, under the same
/// load, and every contender in turn runs first.
fn round_order(implementations: &[Implementation], round: usize) -> Vec<usize> {
    let paired = |i: &Implementation| matches!(i, Implementation::Oxmpi | Implementation::Floor);
    let mut pair: Vec<usize> = (0..implementations.len())
        .filter(|&k| paired(&implementations[k]))
        .collect();
    if round % 2 == 1 {
        pair.reverse();
    }
    let mut units: Vec<Vec<usize>> = std::iter::once(pair)
        .chain(
            (0..implementations.len())
                .filter(|&k| !paired(&implementations[k]))
                .map(|k| vec![k]),
        )
        .filter(|unit| !unit.is_empty())
        .collect();
    if !units.is_empty() {
        let n = units.len();
        units.rotate_left(round % n);
    }
    units.concat()
}

/// Runs `command` to its end within `bound`; an error names `what` and
/// quotes the end of its output.
fn run_to_end(command: Command, what: &str, bound: Duration) -> Result<(), String> {
    let short = |f: oxmpi_jobs::JobFailure| f.summary(runner::QUOTED_LINES);
    let job = Job::spawn(command, bound).map_err(short)?.named(what);
    let out = job.try_finish().map_err(short)?;
    if out.status.success() {
        Ok(())
    } else {
        let failure = oxmpi_jobs::JobFailure {
            what: what.to_owned(),
            why: format!("failed ({})", out.status),
            stdout: out.stdout,
            stderr: out.stderr,
        };
        Err(short(failure))
    }
}

/// Whether this process runs as root (its effective user id is 0), from
/// /proc/self/status.
fn effective_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            // Uid: real effective saved filesystem
            line.split_whitespace().nth(2).map(|uid| uid == "0")
        })
        .unwrap_or(false)
}

/// The path of the executable `name` on `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The peers' compilers and launchers that are not on `PATH`.
fn missing_tools() -> Vec<&'static str> {
    IMPLEMENTATIONS
        .iter()
        .filter_map(|i| i.peer_tools())
        .flat_map(|(compiler, launcher)| [compiler, launcher])
        .filter(|tool| on_path(tool).is_none())
        .collect()
}

/// Makes sure the peers' compilers and launchers are present: installs
/// [`PACKAGES`] with apt-get when some are missing and this is root.
fn ensure_peers(root: bool) -> Result<(), String> {
    let missing = missing_tools();
    if missing.is_empty() {
        return Ok(());
    }
    let packages = PACKAGES.join(" ");
    if !root {
        return Err(format!(
            "{} not found on PATH: oxbench compare needs MPICH and Open MPI; install the Debian \
             packages {packages} (apt-get install {packages}, as root; or run ci/install-deps.sh), \
             or run oxbench compare as root to have it install them",
            missing.join(", ")
        ));
    }
    let install = || {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "--no-install-recommends"])
            .args(PACKAGES)
            .env("DEBIAN_FRONTEND", "noninteractive");
        eprintln!("oxbench compare: running apt-get install -y --no-install-recommends {packages}");
        run_to_end(c, "apt-get install", APT_BOUND)
    };
    eprintln!(
        "oxbench compare: {} not found on PATH; installing MPICH and Open MPI",
        missing.join(", ")
    );
    if let Err(first) = install() {
        eprintln!("oxbench compare: {first}");
        eprintln!("oxbench compare: running apt-get update, then trying again");
        let mut update = Command::new("apt-get");
        update
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive");
        run_to_end(update, "apt-get update", APT_BOUND)
            .and_then(|_| install())
            .map_err(|e| format!("installing the Debian packages {packages} failed: {e}"))?;
    }
    let missing = missing_tools();
    if missing.is_empty() {
        eprintln!("oxbench compare: installed {packages}");
        Ok(())
    } else {
        Err(format!(
            "{} still not found on PATH after installing {packages}",
            missing.join(", ")
        ))
    }
}

/// Builds the peer benchmark with `peer`'s compiler into
/// `cache/<peer>/`, unless the binary there was built from the same
/// source; returns the binary's path.
fn build_peer(peer: Implementation, cache: &Path) -> Result<PathBuf, String> {
    let (compiler, _) = peer
        .peer_tools()
        .expect("only peers have a benchmark to build");
    let dir = cache.join(peer.key());
    let source = dir.join("peer_bench.c");
    let binary = dir.join("peer_bench");
    let built_from = std::fs::read_to_string(&source).ok();
    if binary.is_file() && built_from.as_deref() == Some(PEER_SOURCE) {
        return Ok(binary);
    }
    eprintln!(
        "oxbench compare: building the {} benchmark with {compiler} in {}",
        peer.name(),
        dir.display()
    );
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Build under names of this process's own, then rename: concurrent
    // runs never see a half-written binary, and the source copy (the
    // stamp) is renamed last.
    let pid = std::process::id();
    let temp_source = dir.join(format!("peer_bench.{pid}.c"));
    let temp_binary = dir.join(format!("peer_bench.{pid}"));
    let result = (|| {
        std::fs::write(&temp_source, PEER_SOURCE)
            .map_err(|e| format!("writing {}: {e}", temp_source.display()))?;
        let mut c = Command::new(compiler);
        c.args(["-O2", "-Wall", "-Wextra", "-o"])
            .arg(&temp_binary)
            .arg(&temp_source);
        run_to_end(c, compiler, BUILD_BOUND)?;
        std::fs::rename(&temp_binary, &binary)
            .map_err(|e| format!("renaming into {}: {e}", binary.display()))?;
        std::fs::rename(&temp_source, &source)
            .map_err(|e| format!("renaming into {}: {e}", source.display()))
    })();
    let _ = std::fs::remove_file(&temp_source);
    let _ = std::fs::remove_file(&temp_binary);
    result
        .map(|()| binary)
        .map_err(|e| format!("building its benchmark failed: {e}"))
}

/// The CPUs this process may run on (its affinity mask, which `taskset`
/// narrows), as its jobs inherit them.
fn allowed_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A peer's job of `benchmark`: the peer benchmark under the peer's
/// launcher, restricted to `transport`, its `ranks` on the `cpus` this
/// process may use.
#[allow(clippy::too_many_arguments)]
fn peer_job(
    peer: Implementation,
    launcher: &Path,
    binary: &Path,
    transport: CompareTransport,
    benchmark: Benchmark,
    options: &Options,
    ranks: usize,
    cpus: usize,
    root: bool,
) -> JobSpec {
    let crowded = ranks > cpus;
    let ranks = ranks.to_string();
    let mut launch: Vec<&str> = vec!["-n", &ranks];
    let mut env = Vec::new();
    match (peer, transport) {
        (Implementation::Mpich, CompareTransport::Tcp) => {
            env.extend([("MPIR_CVAR_NOLOCAL", "1"), ("UCX_TLS", "tcp,self")]);
        }
        // As it comes: UCX's shared-memory transports between local ranks.
        (Implementation::Mpich, CompareTransport::Shm) => {}
        (Implementation::OpenMpi, _) => {
            let btl = match transport {
                CompareTransport::Tcp => "tcp,self",
                CompareTransport::Shm => "vader,self",
            };
            launch.extend([
                "--oversubscribe",
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                btl,
            ]);
            if crowded {
                // The ranks outnumber the CPUs left to compare (`taskset`):
                // Open MPI counts the machine's cores instead, so it would
                // bind each rank to a core of its own outside the mask
                // (2 ranks "on one CPU" on two) and never yield. Unbound,
                // and yielding when idle as it does where it sees itself
                // oversubscribed, it runs as oxmpi's ranks do.
                launch.extend(["--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]);
            }
            if transport == CompareTransport::Tcp {
                // Open MPI leaves the loopback interface out by default;
                // oxmpi and MPICH use it, and it may be the only one.
                launch.extend(["--mca", "btl_tcp_if_include", "lo"]);
                // Its one-sided component would otherwise be osc sm,
                // which maps the windows of ranks on one host whatever
                // the btl: pt2pt carries RMA over the TCP btl, as oxmpi's
                // active messages and MPICH's UCX tcp do.
                launch.extend(["--mca", "osc", "pt2pt"]);
            }
            if transport == CompareTransport::Shm && benchmark == Benchmark::CasLatency {
                // Open MPI 4.1's vader emulates compare-and-swap with a
                // fragment whose target address is wrong under its CMA
                // single-copy mechanism, and rank 1 dies in the next
                // barrier (open-mpi/ompi#11349, also osu_cas_latency).
                // Without single copy its osc rdma works on the window's
                // shared memory, as for the other operations.
                launch.extend(["--mca", "btl_vader_single_copy_mechanism", "none"]);
            }
            if root {
                launch.push("--allow-run-as-root");
                env.extend([
                    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
                    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                ]);
            }
        }
        (Implementation::Oxmpi | Implementation::Floor, _) => {
            unreachable!("only MPICH and Open MPI are peers")
        }
    }
    let env_text: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    let description = format!(
        "{env_text}{} {} peer_bench",
        launcher.display(),
        launch.join(" ")
    );
    let mut args: Vec<String> = launch.into_iter().map(str::to_owned).collect();
    args.push(binary.display().to_string());
    args.extend(runner::benchmark_args(benchmark, options));
    JobSpec {
        program: launcher.to_path_buf(),
        args,
        env,
        description,
    }
}

/// One contender's column: the median figures, or why it has none.
struct Column {
    implementation: Implementation,
    /// The library and launch command, for the header.
    description: String,
    /// Rounds that produced figures, of those run.
    good_rounds: usize,
    /// The median (first) figure of each compared size (`None` for a size
    /// the contender does not measure: the floor's), or why there are
    /// none.
    figures: Result<Vec<Option<f64>>, String>,
    /// Each round's (first) figure of each compared size, in the order
    /// the rounds ran; all `None` in a round whose job failed. Empty when
    /// the contender has no job.
    per_round: Vec<Vec<Option<f64>>>,
    /// With `--tail`, each good round's [`report::TAIL_COLUMNS`] figures
    /// of each size (oxmpi's one-sided latencies); else empty.
    tails: Vec<Vec<(usize, Vec<f64>)>>,
}

impl Column {
    fn of(
        contender: &Contender,
        compare: &CompareOptions,
        benchmark: Benchmark,
        root: bool,
        rounds: &[Result<Measured, String>],
        sizes: &[usize],
    ) -> Column {
        let per_round: Vec<Vec<Option<f64>>> = rounds
            .iter()
            .map(|round| {
                let measured = round.as_ref().ok().map(Measured::first_figures);
                sizes
                    .iter()
                    .map(|size| {
                        measured
                            .as_ref()
                            .and_then(|m| m.iter().find(|(s, _)| s == size).map(|(_, f)| *f))
                    })
                    .collect()
            })
            .collect();
        let good_rounds = rounds.iter().filter(|r| r.is_ok()).count();
        let library = rounds
            .iter()
            .find_map(|r| r.as_ref().ok().and_then(|m| m.library.clone()));
        let description = match (contender.job(compare, benchmark, root), library) {
            (Some((spec, _)), Some(library)) => format!("{library}; {}", spec.description),
            (Some((spec, _)), None) => spec.description,
            (None, _) => String::new(),
        };
        let figures = match &contender.tools {
            Err(e) => Err(e.clone()),
            Ok(_) if good_rounds == 0 => Err(rounds
                .iter()
                .rev()
                .find_map(|r| r.as_ref().err().cloned())
                .unwrap_or_else(|| "it did not run".to_owned())),
            Ok(_) => Ok((0..sizes.len())
                .map(|i| median_of(per_round.iter().filter_map(|round| round[i])))
                .collect()),
        };
        // What follows the benchmark's own figures is the tail's.
        let own = benchmark.columns().len();
        let tails = rounds
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|m| {
                m.rows
                    .iter()
                    .map(|(size, figures)| (*size, figures[own.min(figures.len())..].to_vec()))
                    .collect::<Vec<_>>()
            })
            .filter(|rows| rows.iter().any(|(_, tail)| !tail.is_empty()))
            .collect();
        Column {
            implementation: contender.implementation,
            description,
            good_rounds,
            figures,
            per_round,
            tails,
        }
    }
}

/// oxmpi's figure over others', for one size: the median over the
/// rounds of each round's ratio; `None` where no round has figures of
/// both sides.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ratios {
    /// Over the better peer's of the same round: the lower latency or the
    /// higher bandwidth.
    best: Option<f64>,
    /// Over the floor's of the same round.
    floor: Option<f64>,
}

/// The median of `values`; `None` when there are none.
fn median_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.collect();
    (!values.is_empty()).then(|| median(&mut values))
}

/// oxmpi's ratios for the `i`-th size, round by round (see [`Ratios`]):
/// a ratio of two medians could set oxmpi's figure of a quiet spell
/// against the floor's of a noisy one.
fn ratios(benchmark: Benchmark, columns: &[Column], i: usize) -> Ratios {
    let in_round = |implementation: Implementation, round: usize| {
        columns
            .iter()
            .find(|c| c.implementation == implementation)
            .and_then(|c| c.per_round.get(round))
            .and_then(|figures| figures[i])
    };
    let rounds = columns.iter().map(|c| c.per_round.len()).max().unwrap_or(0);
    let mut best = Vec::new();
    let mut floor = Vec::new();
    for round in 0..rounds {
        let Some(ours) = in_round(Implementation::Oxmpi, round) else {
            continue;
        };
        let peers = PEERS.into_iter().filter_map(|p| in_round(p, round));
        let better = if benchmark.is_latency() {
            peers.min_by(f64::total_cmp)
        } else {
            peers.max_by(f64::total_cmp)
        };
        // A figure printed as 0.00 (a rate too small for two decimals on
        // a loaded machine) makes no ratio.
        let over = |other: f64| (other > 0.0).then(|| ours / other);
        best.extend(better.and_then(over));
        floor.extend(in_round(Implementation::Floor, round).and_then(over));
    }
    Ratios {
        best: median_of(best.into_iter()),
        floor: median_of(floor.into_iter()),
    }
}

/// Whether the floor has a column in `benchmark`'s table.
fn has_floor(columns: &[Column]) -> bool {
    columns
        .iter()
        .any(|c| c.implementation == Implementation::Floor)
}

/// The header lines shared by the table and the JSON object's notes.
fn notes(benchmark: Benchmark, compare: &CompareOptions, columns: &[Column]) -> Vec<String> {
    let ranks = ranks_of(compare, benchmark);
    let transport = match compare.transport {
        CompareTransport::Tcp => "TCP",
        CompareTransport::Shm => "shared memory",
    };
    let mut notes = vec![
        format!("{ranks} ranks on this machine, every implementation over {transport}"),
        compare
            .options
            .for_benchmark(benchmark)
            .describe_iterations(),
    ];
    if benchmark == Benchmark::WinCreate {
        notes.push(compare.options.flavor.describe());
    } else if benchmark.is_rma() {
        notes.push(format!(
            "window: allocated; {}",
            compare.options.sync.describe(benchmark)
        ));
    } else if benchmark.is_windowed() {
        notes.push(format!(
            "window: {} immediate sends{}",
            crate::cli::WINDOW,
            if benchmark == Benchmark::BiBandwidth {
                " each way at once"
            } else {
                ", then a 4-byte acknowledgement"
            }
        ));
    }
    if benchmark == Benchmark::MultiBandwidth {
        notes.push("figures: the pairs' total MB/s (the messages/s column is left out)".to_owned());
    }
    let rounds = compare.rounds;
    notes.push(if rounds == 1 {
        "rounds: 1".to_owned()
    } else {
        format!(
            "rounds: {rounds}, contenders alternating, oxmpi and the floor back to back; each \
             figure the median of the rounds, each ratio the median of the rounds' ratios"
        )
    });
    notes.push(if benchmark.is_latency() {
        "oxmpi/best: oxmpi's latency over the lower peer's (below 1: oxmpi is faster)".to_owned()
    } else {
        "oxmpi/best: oxmpi's bandwidth over the higher peer's (above 1: oxmpi is faster)".to_owned()
    });
    notes.extend(left_out_notes(compare));
    if has_floor(columns) {
        notes.push(match (compare.transport, benchmark.is_latency()) {
            (CompareTransport::Tcp, _) => {
                "floor: the same pattern between two plain processes over loopback TCP".to_owned()
            }
            (CompareTransport::Shm, true) => format!(
                "floor: two processes spinning on a shared cache line (sizes up to {LINE_PAYLOAD} B)"
            ),
            (CompareTransport::Shm, false) => {
                "floor: one thread's memcpy of each message into the window".to_owned()
            }
        });
    }
    notes
}

/// Describes a column for the header: what ran, how many rounds gave
/// figures, or that it is unavailable.
fn column_note(column: &Column, rounds: usize) -> String {
    let name = column.implementation.name();
    match &column.figures {
        Err(_) => format!("{name}: unavailable (the reason is on standard error)"),
        Ok(_) if column.good_rounds < rounds => format!(
            "{name}: {} (figures from {} of {rounds} rounds; see standard error)",
            column.description, column.good_rounds
        ),
        Ok(_) => format!("{name}: {}", column.description),
    }
}

/// A header line for each peer `--without` left out.
fn left_out_notes(compare: &CompareOptions) -> impl Iterator<Item = String> + '_ {
    PEERS.into_iter().filter(|p| p.left_out(compare)).map(|p| {
        let option = p.peer().expect("a peer").option_name();
        format!("{}: left out (--without {option})", p.name())
    })
}

/// A cell of the table: the figure, `-` where there is none, or
/// `unavailable`.
fn cell(figures: &Result<Vec<Option<f64>>, String>, i: usize) -> String {
    match figures {
        Ok(f) => match f[i] {
            Some(v) => format!("{v:>COLUMN_WIDTH$.2}"),
            None => format!("{:>COLUMN_WIDTH$}", "-"),
        },
        Err(_) => format!("{:>COLUMN_WIDTH$}", "unavailable"),
    }
}

/// The comparison of one benchmark as a table.
fn table(
    benchmark: Benchmark,
    compare: &CompareOptions,
    columns: &[Column],
    sizes: &[usize],
) -> String {
    // The one-sided benchmarks' title names their synchronisation too,
    // win_create's its flavour: the same benchmark's tables differ by it.
    let variant = if benchmark.is_rma() {
        format!(", sync: {}", compare.options.sync.name())
    } else if benchmark == Benchmark::WinCreate {
        format!(", flavor: {}", compare.options.flavor.name())
    } else {
        String::new()
    };
    let mut s = format!(
        "# oxmpi compared with MPICH and Open MPI: {} ({}) over {}{variant}\n",
        benchmark.description(),
        benchmark.unit(),
        compare.transport.name()
    );
    for note in notes(benchmark, compare, columns)
        .into_iter()
        .chain(columns.iter().map(|c| column_note(c, compare.rounds)))
    {
        s.push_str(&format!("# {note}\n"));
    }
    let mpi: Vec<&Column> = columns
        .iter()
        .filter(|c| c.implementation != Implementation::Floor)
        .collect();
    let floor = columns
        .iter()
        .find(|c| c.implementation == Implementation::Floor);
    s.push_str(&format!("{:<SIZE_WIDTH$}", "# Size"));
    for column in &mpi {
        s.push_str(&format!("{:>COLUMN_WIDTH$}", column.implementation.name()));
    }
    s.push_str(&format!("{:>COLUMN_WIDTH$}", "oxmpi/best"));
    if floor.is_some() {
        s.push_str(&format!(
            "{:>COLUMN_WIDTH$}{:>COLUMN_WIDTH$}",
            "floor", "oxmpi/floor"
        ));
    }
    s.push('\n');
    let ratio = |r: Option<f64>| match r {
        // Two significant digits below 0.1, so that a far smaller figure
        // (a floor measured on a loaded machine) is not shown as 0.
        Some(r) if r > 0.0 && r < 0.1 => {
            let decimals = (1.0 - r.log10().floor()) as usize;
            format!("{r:>COLUMN_WIDTH$.decimals$}")
        }
        Some(r) => format!("{r:>COLUMN_WIDTH$.2}"),
        None => format!("{:>COLUMN_WIDTH$}", "-"),
    };
    for (i, size) in sizes.iter().enumerate() {
        s.push_str(&format!("{size:<SIZE_WIDTH$}"));
        for column in &mpi {
            s.push_str(&cell(&column.figures, i));
        }
        let ratios = ratios(benchmark, columns, i);
        s.push_str(&ratio(ratios.best));
        if let Some(floor) = floor {
            s.push_str(&cell(&floor.figures, i));
            s.push_str(&ratio(ratios.floor));
        }
        s.push('\n');
    }
    for column in columns.iter().filter(|c| !c.tails.is_empty()) {
        s.push_str(&tail_table(column));
    }
    s
}

/// A column's tail figures (`--tail`), each round's beside the others':
/// whether a size's high median came from every round's stalls, and
/// whether each round's mean above its median is a few stalls.
fn tail_table(column: &Column) -> String {
    let mut s = format!(
        "# {} per round: {} / {} / {} / {}\n",
        column.implementation.name(),
        report::TAIL_COLUMNS[0],
        report::TAIL_COLUMNS[1],
        report::TAIL_COLUMNS[2],
        report::TAIL_COLUMNS[3]
    );
    let Some(first) = column.tails.first() else {
        return s;
    };
    for (i, (size, _)) in first.iter().enumerate() {
        s.push_str(&format!("{size:<SIZE_WIDTH$}"));
        for round in &column.tails {
            match round.get(i).map(|(_, tail)| tail.as_slice()) {
                Some([p50, p99, max, stalls]) => {
                    s.push_str(&format!("  {p50:.2}/{p99:.2}/{max:.2}/{stalls}"))
                }
                _ => s.push_str("  -"),
            }
        }
        s.push('\n');
    }
    s
}

/// The comparison of one benchmark as one JSON object on one line:
/// `benchmark`, `transport`, `unit`, `rounds`, `notes`, `implementations`
/// (one object each, the floor included, as `oxbench --json` prints it,
/// the median figures as `results`; an unavailable one has no results
/// and a note `unavailable: REASON`), `ratios` (oxmpi over the better
/// peer) and `floor_ratios` (oxmpi over the floor), each `[{"size",
/// "value"}]` with `null` where there is none.
fn json_report(
    benchmark: Benchmark,
    compare: &CompareOptions,
    columns: &[Column],
    sizes: &[usize],
) -> String {
    // The medians are of the first figure only: a one-column benchmark
    // as far as the JSON shape goes.
    let as_one_column = if benchmark == Benchmark::MultiBandwidth {
        Benchmark::Bandwidth
    } else {
        benchmark
    };
    let implementations: Vec<String> = columns
        .iter()
        .map(|column| {
            let key = column.implementation.key();
            let (notes, results) = match &column.figures {
                Ok(figures) => (
                    vec![
                        column.description.clone(),
                        format!(
                            "rounds with figures: {} of {}",
                            column.good_rounds, compare.rounds
                        ),
                    ],
                    sizes
                        .iter()
                        .zip(figures)
                        .filter_map(|(&size, figure)| figure.map(|f| (size, vec![f])))
                        .collect(),
                ),
                Err(e) => (vec![format!("unavailable: {e}")], Vec::new()),
            };
            report::json(
                &report::figure_keys(as_one_column, false),
                as_one_column,
                key,
                &notes,
                &results,
            )
            .replacen(as_one_column.name(), benchmark.name(), 1)
        })
        .collect();
    let ratio_list = |pick: fn(Ratios) -> Option<f64>| -> String {
        let items: Vec<String> = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let value = pick(ratios(benchmark, columns, i))
                    .map_or_else(|| "null".to_owned(), json_number);
                format!("{{\"size\":{size},\"value\":{value}}}")
            })
            .collect();
        items.join(",")
    };
    format!(
        "{{\"benchmark\":{},\"transport\":{},\"unit\":{},\"rounds\":{},\"notes\":{},\
         \"implementations\":[{}],\"ratios\":[{}],\"floor_ratios\":[{}]}}\n",
        json_string(benchmark.name()),
        json_string(compare.transport.name()),
        json_string(benchmark.unit()),
        compare.rounds,
        json_strings(&notes(benchmark, compare, columns)),
        implementations.join(","),
        ratio_list(|r| r.best),
        ratio_list(|r| r.floor),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compare(benchmarks: Vec<Benchmark>) -> CompareOptions {
        CompareOptions {
            benchmarks,
            options: Options {
                min_size: 8,
                max_size: 8,
                ..Options::defaults(Benchmark::Latency)
            },
            rounds: 1,
            ranks: 2,
            transport: CompareTransport::Tcp,
            without: Vec::new(),
        }
    }

    fn column(implementation: Implementation, figures: Result<Vec<f64>, String>) -> Column {
        Column {
            implementation,
            description: "d".to_owned(),
            good_rounds: 1,
            per_round: figures
                .iter()
                .map(|f| f.iter().copied().map(Some).collect())
                .collect(),
            figures: figures.map(|f| f.into_iter().map(Some).collect()),
            tails: Vec::new(),
        }
    }

    #[test]
    fn tails_follow_the_table_round_by_round() {
        let mut oxmpi = column(Implementation::Oxmpi, Ok(vec![134.2, 40.0]));
        oxmpi.tails = vec![
            vec![
                (131072, vec![30.5, 4100.0, 8112.25, 17.0]),
                (262144, vec![39.0, 45.0, 50.0, 0.0]),
            ],
            vec![(131072, vec![31.0, 40.0, 41.0, 0.0])],
        ];
        let text = tail_table(&oxmpi);
        assert_eq!(
            text,
            "# oxmpi per round: P50 (us) / P99 (us) / Max (us) / Over 1 ms\n\
             131072      30.50/4100.00/8112.25/17  31.00/40.00/41.00/0\n\
             262144      39.00/45.00/50.00/0  -\n"
        );
        let c = compare(vec![Benchmark::GetLatency]);
        let columns = [oxmpi, column(Implementation::OpenMpi, Ok(vec![56.5, 45.0]))];
        let whole = table(Benchmark::GetLatency, &c, &columns, &[131072, 262144]);
        assert!(whole.ends_with(&text), "{whole}");
    }

    fn r(best: Option<f64>, floor: Option<f64>) -> Ratios {
        Ratios { best, floor }
    }

    #[test]
    fn ratios_take_the_better_peer_and_the_floor() {
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0, 10.0])),
            column(Implementation::Mpich, Ok(vec![3.0, 20.0])),
            column(Implementation::OpenMpi, Ok(vec![4.0, 5.0])),
            column(Implementation::Floor, Ok(vec![2.0, 40.0])),
        ];
        assert_eq!(
            ratios(Benchmark::Latency, &columns, 0),
            r(Some(2.0), Some(3.0))
        );
        assert_eq!(
            ratios(Benchmark::Latency, &columns, 1),
            r(Some(2.0), Some(0.25))
        );
        assert_eq!(
            ratios(Benchmark::Bandwidth, &columns, 0),
            r(Some(1.5), Some(3.0))
        );
        assert_eq!(
            ratios(Benchmark::Bandwidth, &columns, 1),
            r(Some(0.5), Some(0.25))
        );
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0])),
            column(Implementation::Mpich, Err("gone".to_owned())),
            column(Implementation::OpenMpi, Ok(vec![4.0])),
        ];
        assert_eq!(ratios(Benchmark::Latency, &columns, 0), r(Some(1.5), None));
        let columns = [
            column(Implementation::Oxmpi, Err("gone".to_owned())),
            column(Implementation::Mpich, Ok(vec![4.0])),
        ];
        assert_eq!(ratios(Benchmark::Latency, &columns, 0), r(None, None));
    }

    #[test]
    fn ratios_are_medians_of_each_rounds_ratio() {
        let rounds = |implementation, per_round: Vec<Vec<Option<f64>>>| Column {
            per_round,
            ..column(implementation, Ok(vec![0.0]))
        };
        let columns = [
            rounds(
                Implementation::Oxmpi,
                vec![vec![Some(0.20)], vec![Some(0.40)], vec![Some(0.30)]],
            ),
            rounds(
                Implementation::OpenMpi,
                vec![vec![Some(0.40)], vec![None], vec![Some(0.20)]],
            ),
            rounds(
                Implementation::Floor,
                vec![vec![Some(0.10)], vec![Some(0.40)], vec![Some(0.15)]],
            ),
        ];
        // Round by round: 2, 1 and 2 times the floor (the medians' ratio
        // would be 0.30 / 0.15 = 2), and 0.5 and 1.5 times the peer in
        // the rounds it ran (the medians', 0.30 / 0.30 = 1).
        let r = ratios(Benchmark::Latency, &columns, 0);
        assert_eq!(r.floor, Some(2.0));
        assert!((r.best.unwrap() - 1.0).abs() < 1e-12, "{r:?}");
        let columns = [
            rounds(Implementation::Oxmpi, vec![vec![Some(0.3)], vec![None]]),
            rounds(Implementation::Floor, vec![vec![None], vec![Some(0.1)]]),
        ];
        assert_eq!(ratios(Benchmark::Latency, &columns, 0).floor, None);
    }

    #[test]
    fn oxmpi_and_the_floor_run_back_to_back_in_every_round() {
        use Implementation::*;
        let all = [Oxmpi, Mpich, OpenMpi, Floor];
        let orders: Vec<Vec<usize>> = (0..4).map(|r| round_order(&all, r)).collect();
        assert_eq!(orders[0], [0, 3, 1, 2]);
        assert_eq!(orders[1], [1, 2, 3, 0]);
        assert_eq!(orders[2], [2, 0, 3, 1]);
        assert_eq!(orders[3], [3, 0, 1, 2]);
        for (round, order) in orders.iter().enumerate() {
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, [0, 1, 2, 3], "round {round}");
            let at = |k| order.iter().position(|&x| x == k).unwrap();
            assert_eq!(at(0).abs_diff(at(3)), 1, "round {round}: {order:?}");
        }
        assert_eq!(round_order(&[Oxmpi, OpenMpi], 1), [1, 0]);
        assert_eq!(round_order(&[Mpich, OpenMpi], 1), [1, 0]);
        assert!(round_order(&[], 3).is_empty());
    }

    #[test]
    fn table_and_json_shapes() {
        let mut floor = column(Implementation::Floor, Ok(vec![]));
        floor.figures = Ok(vec![None, Some(2.0)]);
        floor.per_round = vec![vec![None, Some(2.0)]];
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0, 7.0])),
            column(Implementation::Mpich, Ok(vec![3.0, 3.5])),
            column(Implementation::OpenMpi, Err("no \"mpiexec\"".to_owned())),
            floor,
        ];
        let c = compare(vec![Benchmark::Latency]);
        let t = table(Benchmark::Latency, &c, &columns, &[0, 8]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "# oxmpi compared with MPICH and Open MPI: latency (us) over tcp"
        );
        assert_eq!(
            lines[lines.len() - 3],
            "# Size             oxmpi         MPICH      Open MPI    oxmpi/best         floor   oxmpi/floor"
        );
        assert_eq!(
            lines[lines.len() - 2],
            "0                   6.00          3.00   unavailable          2.00             -             -"
        );
        assert_eq!(
            lines[lines.len() - 1],
            "8                   7.00          3.50   unavailable          2.00          2.00          3.50"
        );
        assert!(t.contains("# Open MPI: unavailable"), "{t}");
        assert!(
            t.contains("# floor: the same pattern between two plain processes"),
            "{t}"
        );
        let j = json_report(Benchmark::Latency, &c, &columns, &[0, 8]);
        assert!(
            j.starts_with(
                "{\"benchmark\":\"latency\",\"transport\":\"tcp\",\"unit\":\"us\",\"rounds\":1,\"notes\":[\"2 ranks"
            ),
            "{j}"
        );
        assert!(j.contains("\"implementation\":\"openmpi\",\"unit\":\"us\",\"notes\":[\"unavailable: no \\\"mpiexec\\\"\"],\"results\":[]}"), "{j}");
        assert!(
            j.contains("\"results\":[{\"size\":0,\"value\":6},{\"size\":8,\"value\":7}]"),
            "{j}"
        );
        assert!(j.contains("\"implementation\":\"floor\""), "{j}");
        assert!(j.contains("\"results\":[{\"size\":8,\"value\":2}]"), "{j}");
        assert!(
            j.ends_with(
                ",\"ratios\":[{\"size\":0,\"value\":2},{\"size\":8,\"value\":2}],\
             \"floor_ratios\":[{\"size\":0,\"value\":null},{\"size\":8,\"value\":3.5}]}\n"
            ),
            "{j}"
        );
        let j = json_report(Benchmark::MultiBandwidth, &c, &columns[..3], &[0, 8]);
        assert!(
            j.contains("{\"benchmark\":\"mbw_mr\",\"implementation\":\"oxmpi\""),
            "{j}"
        );
    }

    #[test]
    fn peer_jobs_are_restricted_to_the_transport() {
        let options = Options::defaults(Benchmark::MultiBandwidth);
        let job = |peer, transport, benchmark, ranks| {
            peer_job(
                peer,
                Path::new("mpiexec"),
                Path::new("/x/peer_bench"),
                transport,
                benchmark,
                &options,
                ranks,
                4,
                true,
            )
        };
        let mpich = job(
            Implementation::Mpich,
            CompareTransport::Tcp,
            Benchmark::MultiBandwidth,
            4,
        );
        assert_eq!(&mpich.args[..3], &["-n", "4", "/x/peer_bench"]);
        assert_eq!(mpich.args[3], "mbw_mr");
        assert!(mpich.env.contains(&("UCX_TLS", "tcp,self")));
        let mpich = job(
            Implementation::Mpich,
            CompareTransport::Shm,
            Benchmark::Latency,
            2,
        );
        assert!(mpich.env.is_empty());
        let ompi = job(
            Implementation::OpenMpi,
            CompareTransport::Tcp,
            Benchmark::Latency,
            2,
        );
        let args = ompi.args.join(" ");
        assert!(
            args.contains("--mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt"),
            "{args}"
        );
        assert!(args.contains("--allow-run-as-root"), "{args}");
        assert!(ompi.description.contains("OMPI_ALLOW_RUN_AS_ROOT=1"));
        let ompi = job(
            Implementation::OpenMpi,
            CompareTransport::Shm,
            Benchmark::Latency,
            2,
        );
        assert!(ompi.args.join(" ").contains("--mca btl vader,self"));
        assert!(!ompi.args.join(" ").contains("single_copy"));
        let ompi = job(
            Implementation::OpenMpi,
            CompareTransport::Shm,
            Benchmark::CasLatency,
            2,
        );
        let args = ompi.args.join(" ");
        assert!(
            args.contains("--mca btl_vader_single_copy_mechanism none"),
            "{args}"
        );
        assert!(!args.contains("--bind-to"), "{args}");
    }

    #[test]
    fn open_mpi_ranks_that_outnumber_the_cpus_stay_unbound_and_yield() {
        let options = Options::defaults(Benchmark::Latency);
        let args = |peer, ranks, cpus| {
            peer_job(
                peer,
                Path::new("mpiexec"),
                Path::new("/x/peer_bench"),
                CompareTransport::Shm,
                Benchmark::Latency,
                &options,
                ranks,
                cpus,
                false,
            )
            .args
            .join(" ")
        };
        let crowded = "--bind-to none --mca mpi_yield_when_idle 1";
        assert!(args(Implementation::OpenMpi, 2, 1).contains(crowded));
        assert!(args(Implementation::OpenMpi, 4, 2).contains(crowded));
        assert!(!args(Implementation::OpenMpi, 2, 2).contains("--bind-to"));
        assert!(!args(Implementation::Mpich, 2, 1).contains("--bind-to"));
    }

    #[test]
    fn a_left_out_peer_is_named_in_the_notes() {
        let mut c = compare(vec![Benchmark::Latency]);
        c.without = vec![Peer::Mpich];
        assert!(Implementation::Mpich.left_out(&c));
        assert!(!Implementation::OpenMpi.left_out(&c));
        assert!(!Implementation::Oxmpi.left_out(&c));
        let notes = notes(Benchmark::Latency, &c, &[]);
        assert!(
            notes.contains(&"MPICH: left out (--without mpich)".to_owned()),
            "{notes:?}"
        );
    }

    #[test]
    fn floors_cover_what_they_can_measure() {
        let exe = Path::new("oxbench");
        let options = Options::defaults(Benchmark::Latency);
        let (spec, o) = runner::floor_job(exe, "shm", Benchmark::Latency, &options).unwrap();
        assert_eq!(spec.args[..2], ["raw-shm", "latency"]);
        assert_eq!((o.min_size, o.max_size), (1, LINE_PAYLOAD));
        let (spec, o) = runner::floor_job(exe, "tcp", Benchmark::Bandwidth, &options).unwrap();
        assert_eq!(spec.args[..2], ["raw-tcp", "bw"]);
        assert_eq!(o.max_size, options.max_size);
        assert!(runner::floor_job(exe, "tcp", Benchmark::BiBandwidth, &options).is_none());
        let big = Options {
            min_size: 1024,
            ..options
        };
        assert!(runner::floor_job(exe, "shm", Benchmark::Latency, &big).is_none());
    }
}
