//! `oxbench compare`: oxmpi's own yardstick, the same benchmarks run over
//! oxmpi, MPICH and Open MPI on this machine, in the same run, all over
//! TCP.
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
//!   all the sizes (2 ranks, or `--ranks` for `mbw_mr` and `multi_lat`):
//!   oxbench under `oxrun` with `OXMPI_TRANSPORTS=tcp`; the peer benchmark
//!   under `mpiexec.mpich` with `MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self`
//!   (MPICH's ch4:ucx over TCP even between local ranks), and under
//!   `mpiexec.openmpi` with the ob1 PML and the TCP BTL on the loopback
//!   interface (plus the run-as-root switches when root). With `--rounds
//!   N`, each round runs every implementation once, the order rotated from
//!   round to round, and each figure is the median of the rounds.
//! - **The result.** Per benchmark, a table (size, oxmpi, MPICH, Open MPI,
//!   and oxmpi's figure divided by the better peer's; for `mbw_mr` the
//!   MB/s) or one JSON object. An implementation whose jobs all failed is
//!   shown as unavailable, the reasons on standard error, and the exit
//!   status is then 1.

use crate::cli::{Benchmark, CompareOptions, Options};
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

/// An MPI implementation in the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// This one, through oxrun.
    Oxmpi,
    /// MPICH (Debian: ch4:ucx), through its hydra launcher.
    Mpich,
    /// Open MPI, through its mpiexec.
    OpenMpi,
}

/// The implementations in the order of the table's columns.
pub const IMPLEMENTATIONS: [Implementation; 3] = [
    Implementation::Oxmpi,
    Implementation::Mpich,
    Implementation::OpenMpi,
];

impl Implementation {
    /// The name shown in the table.
    pub fn name(self) -> &'static str {
        match self {
            Implementation::Oxmpi => "oxmpi",
            Implementation::Mpich => "MPICH",
            Implementation::OpenMpi => "Open MPI",
        }
    }

    /// The name in JSON and in the cache directory.
    pub fn key(self) -> &'static str {
        match self {
            Implementation::Oxmpi => "oxmpi",
            Implementation::Mpich => "mpich",
            Implementation::OpenMpi => "openmpi",
        }
    }

    /// A peer's compiler and launcher; `None` for oxmpi.
    fn peer_tools(self) -> Option<(&'static str, &'static str)> {
        match self {
            Implementation::Oxmpi => None,
            Implementation::Mpich => Some(("mpicc.mpich", "mpiexec.mpich")),
            Implementation::OpenMpi => Some(("mpicc.openmpi", "mpiexec.openmpi")),
        }
    }
}

/// Runs `oxbench compare`: prints a table (or JSON object) per benchmark
/// on standard output, progress and failures on standard error. Exits
/// with 0 when every implementation produced figures, 1 otherwise (or
/// when the peers are missing and cannot be installed, or oxrun is
/// missing).
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

/// How one implementation's jobs are started, or why they cannot be.
struct Contender {
    implementation: Implementation,
    /// oxmpi: oxrun and oxbench; a peer: its launcher and its benchmark.
    tools: Result<(PathBuf, PathBuf), String>,
}

impl Contender {
    /// The job of `benchmark`.
    fn job(&self, compare: &CompareOptions, benchmark: Benchmark, root: bool) -> Option<JobSpec> {
        let (launcher, program) = self.tools.as_ref().ok()?;
        let ranks = ranks_of(compare, benchmark);
        Some(match self.implementation {
            Implementation::Oxmpi => {
                runner::oxmpi_job(launcher, program, benchmark, &compare.options, ranks, "tcp")
            }
            peer => peer_job(
                peer,
                launcher,
                program,
                benchmark,
                &compare.options,
                ranks,
                root,
            ),
        })
    }
}

/// Ranks of `benchmark`'s jobs.
fn ranks_of(compare: &CompareOptions, benchmark: Benchmark) -> usize {
    if benchmark.is_multi_pair() {
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
        .map(|&implementation| {
            let tools = match implementation.peer_tools() {
                None => Ok((oxrun.clone(), oxbench.clone())),
                Some((_, launcher)) => build_peer(implementation, &cache)
                    .map(|binary| (PathBuf::from(launcher), binary)),
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
        let columns = compare_one(compare, benchmark, &contenders, root);
        all_ran &= columns.iter().all(|c| c.figures.is_ok());
        let ratios = ratios(benchmark, &columns);
        let sizes = compare.options.sizes();
        let text = if compare.options.json {
            json_report(benchmark, compare, &columns, &sizes, &ratios)
        } else {
            table(benchmark, compare, &columns, &sizes, &ratios)
        };
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing the result: {e}"))?;
    }
    Ok(all_ran)
}

/// Runs `benchmark` over every contender for every round; returns their
/// columns in [`IMPLEMENTATIONS`] order.
fn compare_one(
    compare: &CompareOptions,
    benchmark: Benchmark,
    contenders: &[Contender],
    root: bool,
) -> Vec<Column> {
    let rounds = compare.rounds;
    let sizes = compare.options.sizes();
    let mut outcomes: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for k in 0..contenders.len() {
            let index = (round + k) % contenders.len();
            let contender = &contenders[index];
            let Some(spec) = contender.job(compare, benchmark, root) else {
                continue;
            };
            let name = contender.implementation.name();
            eprintln!(
                "oxbench compare: {} round {} of {rounds}: {name} ({} sizes)",
                benchmark.name(),
                round + 1,
                sizes.len()
            );
            let what = format!("{name}'s {} job", benchmark.name());
            let ranks = ranks_of(compare, benchmark);
            let outcome = runner::run_job(&spec, &what, benchmark, &compare.options, ranks, |_| {});
            if let Err(e) = &outcome {
                eprintln!("oxbench compare: {name} failed in round {}: {e}", round + 1);
            }
            outcomes[index].push(outcome);
        }
    }
    contenders
        .iter()
        .zip(outcomes)
        .map(|(contender, rounds)| Column::of(contender, compare, benchmark, root, &rounds))
        .collect()
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

/// A peer's job of `benchmark`: the peer benchmark under the peer's
/// launcher, restricted to TCP.
fn peer_job(
    peer: Implementation,
    launcher: &Path,
    binary: &Path,
    benchmark: Benchmark,
    options: &Options,
    ranks: usize,
    root: bool,
) -> JobSpec {
    let ranks = ranks.to_string();
    let mut launch: Vec<&str> = vec!["-n", &ranks];
    let mut env = Vec::new();
    match peer {
        Implementation::Mpich => {
            env.extend([("MPIR_CVAR_NOLOCAL", "1"), ("UCX_TLS", "tcp,self")]);
        }
        Implementation::OpenMpi => {
            launch.extend([
                "--oversubscribe",
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                "tcp,self",
                // Open MPI leaves the loopback interface out by default;
                // oxmpi and MPICH use it, and it may be the only one.
                "--mca",
                "btl_tcp_if_include",
                "lo",
            ]);
            if root {
                launch.push("--allow-run-as-root");
                env.extend([
                    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
                    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                ]);
            }
        }
        Implementation::Oxmpi => unreachable!("oxmpi is no peer"),
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

/// One implementation's column: the median figures, or why it has none.
struct Column {
    implementation: Implementation,
    /// The library and launch command, for the header.
    description: String,
    /// Rounds that produced figures, of those run.
    good_rounds: usize,
    /// The median (first) figure of each size, or why there are none.
    figures: Result<Vec<f64>, String>,
}

impl Column {
    fn of(
        contender: &Contender,
        compare: &CompareOptions,
        benchmark: Benchmark,
        root: bool,
        rounds: &[Result<Measured, String>],
    ) -> Column {
        let good: Vec<Vec<(usize, f64)>> = rounds
            .iter()
            .filter_map(|r| r.as_ref().ok().map(Measured::first_figures))
            .collect();
        let library = rounds
            .iter()
            .find_map(|r| r.as_ref().ok().and_then(|m| m.library.clone()));
        let description = match (contender.job(compare, benchmark, root), library) {
            (Some(spec), Some(library)) => format!("{library}; {}", spec.description),
            (Some(spec), None) => spec.description,
            (None, _) => String::new(),
        };
        let figures = match &contender.tools {
            Err(e) => Err(e.clone()),
            Ok(_) if good.is_empty() => Err(rounds
                .iter()
                .rev()
                .find_map(|r| r.as_ref().err().cloned())
                .unwrap_or_else(|| "it did not run".to_owned())),
            Ok(_) => Ok((0..good[0].len())
                .map(|i| median(&mut good.iter().map(|m| m[i].1).collect::<Vec<_>>()))
                .collect()),
        };
        Column {
            implementation: contender.implementation,
            description,
            good_rounds: good.len(),
            figures,
        }
    }
}

/// oxmpi's figure over the better peer's, for each size: the lower latency
/// or the higher bandwidth. `None` where oxmpi or both peers have none.
fn ratios(benchmark: Benchmark, columns: &[Column]) -> Vec<Option<f64>> {
    let figures = |implementation: Implementation| {
        columns
            .iter()
            .find(|c| c.implementation == implementation)
            .and_then(|c| c.figures.as_ref().ok())
    };
    let Some(ours) = figures(Implementation::Oxmpi) else {
        let count = columns
            .iter()
            .find_map(|c| c.figures.as_ref().ok().map(Vec::len))
            .unwrap_or(0);
        return vec![None; count];
    };
    ours.iter()
        .enumerate()
        .map(|(i, &ours)| {
            let peers = [Implementation::Mpich, Implementation::OpenMpi]
                .into_iter()
                .filter_map(|p| figures(p).map(|f| f[i]));
            let best = if benchmark.is_latency() {
                peers.min_by(f64::total_cmp)
            } else {
                peers.max_by(f64::total_cmp)
            }?;
            Some(ours / best)
        })
        .collect()
}

/// The header lines shared by the table and the JSON object's notes.
fn notes(benchmark: Benchmark, compare: &CompareOptions) -> Vec<String> {
    let ranks = ranks_of(compare, benchmark);
    let mut notes = vec![
        format!("{ranks} ranks on this machine, every implementation over TCP"),
        compare.options.describe_iterations(),
    ];
    if benchmark.is_windowed() {
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
            "rounds: {rounds}, implementations alternating; each figure the median of the rounds"
        )
    });
    notes.push(if benchmark.is_latency() {
        "oxmpi/best: oxmpi's latency over the lower peer's (below 1: oxmpi is faster)".to_owned()
    } else {
        "oxmpi/best: oxmpi's bandwidth over the higher peer's (above 1: oxmpi is faster)".to_owned()
    });
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

/// The comparison of one benchmark as a table.
fn table(
    benchmark: Benchmark,
    compare: &CompareOptions,
    columns: &[Column],
    sizes: &[usize],
    ratios: &[Option<f64>],
) -> String {
    let mut s = format!(
        "# oxmpi compared with MPICH and Open MPI: {} ({})\n",
        benchmark.description(),
        benchmark.unit()
    );
    for note in notes(benchmark, compare)
        .into_iter()
        .chain(columns.iter().map(|c| column_note(c, compare.rounds)))
    {
        s.push_str(&format!("# {note}\n"));
    }
    s.push_str(&format!("{:<SIZE_WIDTH$}", "# Size"));
    for column in columns {
        s.push_str(&format!("{:>COLUMN_WIDTH$}", column.implementation.name()));
    }
    s.push_str(&format!("{:>COLUMN_WIDTH$}\n", "oxmpi/best"));
    for (i, size) in sizes.iter().enumerate() {
        s.push_str(&format!("{size:<SIZE_WIDTH$}"));
        for column in columns {
            match &column.figures {
                Ok(figures) => s.push_str(&format!("{:>COLUMN_WIDTH$.2}", figures[i])),
                Err(_) => s.push_str(&format!("{:>COLUMN_WIDTH$}", "unavailable")),
            }
        }
        match ratios.get(i).copied().flatten() {
            Some(ratio) => s.push_str(&format!("{ratio:>COLUMN_WIDTH$.2}\n")),
            None => s.push_str(&format!("{:>COLUMN_WIDTH$}\n", "-")),
        }
    }
    s
}

/// The comparison of one benchmark as one JSON object on one line:
/// `benchmark`, `unit`, `rounds`, `notes`, `implementations` (one object
/// each, as `oxbench --json` prints it, the median figures as `results`;
/// an unavailable one has no results and a note `unavailable: REASON`),
/// and `ratios` (`[{"size", "value"}]`, `null` where there is none).
fn json_report(
    benchmark: Benchmark,
    compare: &CompareOptions,
    columns: &[Column],
    sizes: &[usize],
    ratios: &[Option<f64>],
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
                        .map(|(&size, &figure)| (size, vec![figure]))
                        .collect(),
                ),
                Err(e) => (vec![format!("unavailable: {e}")], Vec::new()),
            };
            report::json(as_one_column, key, &notes, &results).replacen(
                as_one_column.name(),
                benchmark.name(),
                1,
            )
        })
        .collect();
    let ratios: Vec<String> = sizes
        .iter()
        .zip(ratios)
        .map(|(size, ratio)| {
            let value = ratio.map_or_else(|| "null".to_owned(), json_number);
            format!("{{\"size\":{size},\"value\":{value}}}")
        })
        .collect();
    format!(
        "{{\"benchmark\":{},\"unit\":{},\"rounds\":{},\"notes\":{},\"implementations\":[{}],\
         \"ratios\":[{}]}}\n",
        json_string(benchmark.name()),
        json_string(benchmark.unit()),
        compare.rounds,
        json_strings(&notes(benchmark, compare)),
        implementations.join(","),
        ratios.join(",")
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
        }
    }

    fn column(implementation: Implementation, figures: Result<Vec<f64>, String>) -> Column {
        Column {
            implementation,
            description: "d".to_owned(),
            good_rounds: 1,
            figures,
        }
    }

    #[test]
    fn ratios_take_the_better_peer() {
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0, 10.0])),
            column(Implementation::Mpich, Ok(vec![3.0, 20.0])),
            column(Implementation::OpenMpi, Ok(vec![4.0, 5.0])),
        ];
        assert_eq!(
            ratios(Benchmark::Latency, &columns),
            vec![Some(2.0), Some(2.0)]
        );
        assert_eq!(
            ratios(Benchmark::Bandwidth, &columns),
            vec![Some(1.5), Some(0.5)]
        );
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0])),
            column(Implementation::Mpich, Err("gone".to_owned())),
            column(Implementation::OpenMpi, Ok(vec![4.0])),
        ];
        assert_eq!(ratios(Benchmark::Latency, &columns), vec![Some(1.5)]);
        let columns = [
            column(Implementation::Oxmpi, Err("gone".to_owned())),
            column(Implementation::Mpich, Ok(vec![4.0])),
        ];
        assert_eq!(ratios(Benchmark::Latency, &columns), vec![None]);
    }

    #[test]
    fn table_and_json_shapes() {
        let columns = [
            column(Implementation::Oxmpi, Ok(vec![6.0])),
            column(Implementation::Mpich, Ok(vec![3.0])),
            column(Implementation::OpenMpi, Err("no \"mpiexec\"".to_owned())),
        ];
        let c = compare(vec![Benchmark::Latency]);
        let ratios = ratios(Benchmark::Latency, &columns);
        let t = table(Benchmark::Latency, &c, &columns, &[8], &ratios);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "# oxmpi compared with MPICH and Open MPI: latency (us)"
        );
        assert_eq!(
            lines[lines.len() - 2],
            "# Size             oxmpi         MPICH      Open MPI    oxmpi/best"
        );
        assert_eq!(
            lines[lines.len() - 1],
            "8                   6.00          3.00   unavailable          2.00"
        );
        assert!(t.contains("# Open MPI: unavailable"), "{t}");
        let j = json_report(Benchmark::Latency, &c, &columns, &[8], &ratios);
        assert!(
            j.starts_with(
                "{\"benchmark\":\"latency\",\"unit\":\"us\",\"rounds\":1,\"notes\":[\"2 ranks"
            ),
            "{j}"
        );
        assert!(j.contains("\"implementation\":\"openmpi\",\"unit\":\"us\",\"notes\":[\"unavailable: no \\\"mpiexec\\\"\"],\"results\":[]}"), "{j}");
        assert!(j.contains("\"results\":[{\"size\":8,\"value\":6}]"), "{j}");
        assert!(
            j.ends_with(",\"ratios\":[{\"size\":8,\"value\":2}]}\n"),
            "{j}"
        );
        let j = json_report(Benchmark::MultiBandwidth, &c, &columns, &[8], &ratios);
        assert!(
            j.contains("{\"benchmark\":\"mbw_mr\",\"implementation\":\"oxmpi\""),
            "{j}"
        );
    }

    #[test]
    fn peer_jobs_are_restricted_to_tcp() {
        let options = Options::defaults(Benchmark::MultiBandwidth);
        let mpich = peer_job(
            Implementation::Mpich,
            Path::new("mpiexec.mpich"),
            Path::new("/x/peer_bench"),
            Benchmark::MultiBandwidth,
            &options,
            4,
            false,
        );
        assert_eq!(&mpich.args[..3], &["-n", "4", "/x/peer_bench"]);
        assert_eq!(mpich.args[3], "mbw_mr");
        assert!(mpich.env.contains(&("UCX_TLS", "tcp,self")));
        let ompi = peer_job(
            Implementation::OpenMpi,
            Path::new("mpiexec.openmpi"),
            Path::new("/x/peer_bench"),
            Benchmark::Latency,
            &options,
            2,
            true,
        );
        let args = ompi.args.join(" ");
        assert!(args.contains("--mca btl tcp,self"), "{args}");
        assert!(args.contains("--allow-run-as-root"), "{args}");
        assert!(ompi.description.contains("OMPI_ALLOW_RUN_AS_ROOT=1"));
    }
}
