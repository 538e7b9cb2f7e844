//! Benchmark jobs started by oxbench itself, for `oxbench compare` and
//! `oxbench suite`: how a job is described ([`JobSpec`]), run within time
//! bounds that follow its work ([`run_job`]), and read back
//! ([`parse_table`]).
//!
//! Each job runs through [`oxmpi_jobs::Job`]: in a process group of its
//! own, killed with every process it started when it outlives a bound. A
//! job has [`START_ALLOWANCE`] to start, then for each size a bound that
//! grows with the work at that size ([`size_bounds`]), then
//! [`END_ALLOWANCE`] to exit. The figures come from the benchmark's own
//! table; nothing here measures anything itself.

use crate::cli::{Benchmark, Options, Synchronization, WINDOW};
use crate::raw_shm::LINE_PAYLOAD;
use oxmpi_jobs::Job;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Time a job has to start, on top of the time for its first size.
pub const START_ALLOWANCE: Duration = Duration::from_secs(60);
/// Time a job has to exit after its last result.
pub const END_ALLOWANCE: Duration = Duration::from_secs(15);
/// Time allowed to each size on top of its estimated work.
const SIZE_SLACK: Duration = Duration::from_secs(30);
/// The per-message time of a slow but working run, for the bounds.
const SLOW_MESSAGE: Duration = Duration::from_micros(200);
/// The bytes per second of a slow but working run, for the bounds.
const SLOW_RATE: f64 = 500e6;
/// Lines of a failed job's error output quoted in a message.
pub const QUOTED_LINES: usize = 15;

/// How to start one benchmark job.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The launcher.
    pub program: PathBuf,
    /// Its arguments, the benchmark program's included.
    pub args: Vec<String>,
    /// Environment variables set for the launcher (and so the ranks).
    pub env: Vec<(&'static str, &'static str)>,
    /// The command, shortly, for reports.
    pub description: String,
}

impl JobSpec {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .envs(self.env.iter().map(|&(k, v)| (k, v)));
        c
    }
}

/// oxbench's own executable and the `oxrun` built beside it.
pub fn oxbench_and_oxrun() -> Result<(PathBuf, PathBuf), String> {
    let oxbench = std::env::current_exe().map_err(|e| format!("locating oxbench itself: {e}"))?;
    let oxrun = oxbench
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", oxbench.display()))?
        .join("oxrun");
    if !oxrun.is_file() {
        return Err(format!(
            "{} is missing: oxrun must be built beside oxbench (cargo build --workspace, with \
             --release for a release oxbench)",
            oxrun.display()
        ));
    }
    Ok((oxbench, oxrun))
}

/// The command-line arguments of a benchmark run: the benchmark's name,
/// then the options (as a table: never `--json`).
pub fn benchmark_args(benchmark: Benchmark, options: &Options) -> Vec<String> {
    let options = Options {
        json: false,
        ..options.clone()
    };
    std::iter::once(benchmark.name().to_owned())
        .chain(options.to_args())
        .collect()
}

/// An oxbench job of `ranks` ranks under oxrun, restricted to
/// `transports` (an `OXMPI_TRANSPORTS` value).
pub fn oxmpi_job(
    oxrun: &Path,
    oxbench: &Path,
    benchmark: Benchmark,
    options: &Options,
    ranks: usize,
    transports: &str,
) -> JobSpec {
    let setting = format!("{}={transports}", oxmpi::TRANSPORTS_ENV);
    let mut args: Vec<String> = vec!["-n".into(), ranks.to_string(), "-x".into(), setting.clone()];
    args.push(oxbench.display().to_string());
    args.extend(benchmark_args(benchmark, options));
    JobSpec {
        program: oxrun.to_path_buf(),
        args,
        env: Vec::new(),
        description: format!(
            "oxmpi {} (this build): oxrun -n {ranks} -x {setting} oxbench",
            env!("CARGO_PKG_VERSION")
        ),
    }
}

/// The floor of `transport` (`tcp`: `oxbench raw-tcp`, `shm`: `oxbench
/// raw-shm`) for `benchmark`, and its options: the sizes of `options`
/// that the floor can measure (from 1 byte; the shared-memory latency
/// floor up to [`LINE_PAYLOAD`]). `None` when there is no such floor,
/// benchmark or size.
pub fn floor_job(
    oxbench: &Path,
    transport: &str,
    benchmark: Benchmark,
    options: &Options,
) -> Option<(JobSpec, Options)> {
    if !matches!(benchmark, Benchmark::Latency | Benchmark::Bandwidth) {
        return None;
    }
    let (command, most) = match transport {
        "tcp" => ("raw-tcp", usize::MAX),
        "shm" if benchmark.is_latency() => ("raw-shm", LINE_PAYLOAD),
        "shm" => ("raw-shm", usize::MAX),
        _ => return None,
    };
    let floor_options = Options {
        min_size: options.min_size.max(1),
        max_size: options.max_size.min(most),
        ..options.clone()
    };
    if floor_options.min_size > floor_options.max_size {
        return None;
    }
    let mut args = vec![command.to_owned()];
    args.extend(benchmark_args(benchmark, &floor_options));
    let spec = JobSpec {
        program: oxbench.to_path_buf(),
        args,
        env: Vec::new(),
        description: format!("oxbench {command} {}", benchmark.name()),
    };
    Some((spec, floor_options))
}

/// What one job measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The `# library: ...` header line's text, if the table had one.
    pub library: Option<String>,
    /// The figures of each size (one per column of the benchmark), in
    /// the order measured.
    pub rows: Vec<(usize, Vec<f64>)>,
}

impl Measured {
    /// The first figure of each size (latency or MB/s).
    pub fn first_figures(&self) -> Vec<(usize, f64)> {
        self.rows.iter().map(|(size, f)| (*size, f[0])).collect()
    }
}

/// Runs `spec`'s job of `benchmark` with `options` (and `ranks` ranks),
/// named `what` in messages, within the bounds its work allows; calls
/// `progress` with the number of sizes done after each. Returns the
/// figures, or why there are none: it could not start, was killed past a
/// bound (with every process it started), failed, or printed something
/// other than the expected table.
pub fn run_job(
    spec: &JobSpec,
    what: &str,
    benchmark: Benchmark,
    options: &Options,
    ranks: usize,
    mut progress: impl FnMut(usize),
) -> Result<Measured, String> {
    let bounds = size_bounds(benchmark, options, ranks);
    let whole: Duration = START_ALLOWANCE + bounds.iter().sum::<Duration>() + END_ALLOWANCE;
    let short = |f: oxmpi_jobs::JobFailure| f.summary(QUOTED_LINES);
    let mut job = Job::spawn(spec.command(), whole)
        .map_err(short)?
        .named(what);
    for (done, bound) in bounds.iter().enumerate() {
        let allowed = if done == 0 {
            START_ALLOWANCE + *bound
        } else {
            *bound
        };
        job.try_wait_for_line(allowed, is_result_line)
            .map_err(|mut f| {
                f.why = format!("wrote {done} of {} results, then {}", bounds.len(), f.why);
                short(f)
            })?;
        progress(done + 1);
    }
    job.set_bound(END_ALLOWANCE);
    let stdout = match job.try_finish() {
        Ok(out) if out.status.success() => out.stdout,
        Ok(out) => {
            return Err(
                format!("{what} failed ({})", out.status) + &quote_tail(&out.stderr, &out.stdout)
            )
        }
        // Debian's MPICH (ch4:ucx over TCP) now and then hangs in
        // MPI_Finalize after a benchmark has printed everything: the
        // figures are whole, so they stand, and the hang is reported.
        Err(f) => {
            eprintln!(
                "oxbench: warning: {what} wrote every result, then {}; its figures stand",
                f.why
            );
            f.stdout
        }
    };
    parse_table(&stdout, benchmark, options.tail, &options.sizes())
}

/// The end of a job's error output (or of its standard output, if it
/// wrote no errors), indented after a colon, for a message.
fn quote_tail(stderr: &str, stdout: &str) -> String {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut s = String::new();
    if !lines.is_empty() {
        s.push(':');
        for line in &lines[lines.len().saturating_sub(QUOTED_LINES)..] {
            s.push_str("\n    ");
            s.push_str(line);
        }
    }
    s
}

/// The bound of each size of a job: 30 s plus the time its messages
/// would take at 200 µs each and 500 MB/s, all pairs' messages in turn
/// (a small machine may run them one after another), a one-sided
/// benchmark's lock and unlock counted as messages.
pub fn size_bounds(benchmark: Benchmark, options: &Options, ranks: usize) -> Vec<Duration> {
    let pairs = if benchmark.is_multi_pair() {
        ranks / 2
    } else {
        1
    };
    // What `--sync lock` adds to a one-sided iteration: a lock and an
    // unlock, each a round trip.
    let lock_messages = if benchmark.is_rma() && options.sync == Synchronization::Lock {
        4
    } else {
        0
    };
    let per_iteration = pairs
        * match benchmark {
            Benchmark::Latency | Benchmark::MultiLatency => 2,
            // An operation and a flush, or a lock, an operation and an
            // unlock (`--sync lock`; a lock over TCP is a message and its
            // grant): a slow peer's lock path stretches each iteration.
            Benchmark::PutLatency
            | Benchmark::GetLatency
            | Benchmark::AccLatency
            | Benchmark::FopLatency
            | Benchmark::CasLatency => 2 + lock_messages,
            Benchmark::Bandwidth | Benchmark::MultiBandwidth => WINDOW + 1,
            Benchmark::PutBandwidth | Benchmark::GetBandwidth => WINDOW + 1 + lock_messages,
            Benchmark::BiBandwidth => 2 * WINDOW,
            // A window: a communicator copied, all-gathers of the ranks'
            // rows and agreements, the free's barrier, each every rank
            // with every other, and the memory mapped.
            Benchmark::WinCreate => 8 * ranks * ranks,
            // The collectives: every rank may exchange a message with
            // every other, and the barrier after each operation.
            _ => 2 * ranks * ranks,
        };
    options
        .sizes()
        .into_iter()
        .map(|size| {
            let messages = (options.warmup_for(size) + options.iterations_for(size))
                .saturating_mul(per_iteration) as f64;
            let seconds = messages * (SLOW_MESSAGE.as_secs_f64() + size as f64 / SLOW_RATE);
            SIZE_SLACK + Duration::from_secs_f64(seconds.min(1e9))
        })
        .collect()
}

/// Whether a benchmark's output line is a result (`size figure...`).
fn is_result_line(line: &str) -> bool {
    line.starts_with(|c: char| c.is_ascii_digit())
}

/// Reads a benchmark's table: `#` header lines (the `# library: ...` one
/// names the library), then `size figure...` lines with one figure per
/// column of `benchmark` (and of the tail's, if `tail`). Other lines (a launcher's warnings) are
/// skipped. The sizes must be `sizes`, in order, and every figure a
/// number of at least 0 (a rate can print as 0.00 on a loaded machine).
pub fn parse_table(
    stdout: &str,
    benchmark: Benchmark,
    tail: bool,
    sizes: &[usize],
) -> Result<Measured, String> {
    let mut library = None;
    let mut rows = Vec::new();
    let columns = crate::report::columns(benchmark, tail).len();
    for line in stdout.lines() {
        if let Some(text) = line.strip_prefix("# library: ") {
            library = Some(text.trim().to_owned());
            continue;
        }
        if !is_result_line(line) {
            continue;
        }
        let mut fields = line.split_whitespace();
        let size = fields.next().and_then(|s| s.parse::<usize>().ok());
        let figures: Vec<f64> = fields.filter_map(|f| f.parse::<f64>().ok()).collect();
        let well_formed = figures.len() == columns
            && line.split_whitespace().count() == columns + 1
            && figures.iter().all(|f| f.is_finite() && *f >= 0.0);
        match size {
            Some(size) if well_formed => rows.push((size, figures)),
            _ => return Err(format!("unexpected result line {line:?} in its output")),
        }
    }
    let got: Vec<usize> = rows.iter().map(|(size, _)| *size).collect();
    if got != sizes {
        return Err(format!(
            "its output has results for the sizes {got:?}, expected {sizes:?}:\n{stdout}"
        ));
    }
    Ok(Measured { library, rows })
}

/// The median of `values` (not empty): the middle one, or the mean of the
/// two middle ones.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::OSU_COUNTS;

    fn options(min: usize, max: usize) -> Options {
        Options {
            min_size: min,
            max_size: max,
            counts: crate::cli::Counts {
                iterations: 10,
                iterations_large: 10,
                warmup: 1,
                warmup_large: 1,
            },
            counts_default: false,
            json: false,
            tail: false,
            sync: Synchronization::Flush,
            flavor: crate::cli::WindowFlavor::Allocate,
        }
    }

    #[test]
    fn tables_are_read_back() {
        let text = "# MPI latency test\n# library: MPICH Version: 4.0.2\n# Size          Latency (us)\n\
                    a launcher's warning\n1                       3.46\n2                       3.50\n";
        let m = parse_table(text, Benchmark::Latency, false, &[1, 2]).unwrap();
        assert_eq!(m.library.as_deref(), Some("MPICH Version: 4.0.2"));
        assert_eq!(m.first_figures(), vec![(1, 3.46), (2, 3.5)]);
        assert!(parse_table(text, Benchmark::Latency, false, &[1, 2, 4]).is_err());
        assert!(parse_table("1   -1.00\n", Benchmark::Latency, false, &[1]).is_err());
        assert!(parse_table("1   0.00\n", Benchmark::Bandwidth, false, &[1]).is_ok());
        assert!(parse_table("1   3.0 extra\n", Benchmark::Latency, false, &[1]).is_err());
        assert!(parse_table("1   3.0 4.0\n", Benchmark::Latency, false, &[1]).is_err());
        assert!(parse_table("", Benchmark::Latency, false, &[])
            .unwrap()
            .rows
            .is_empty());
        let m = parse_table(
            "8   1.50   187500.00\n",
            Benchmark::MultiBandwidth,
            false,
            &[8],
        )
        .unwrap();
        assert_eq!(m.rows, vec![(8, vec![1.5, 187500.0])]);
        assert!(parse_table("8   1.50\n", Benchmark::MultiBandwidth, false, &[8]).is_err());
        let line = "131072   134.17   30.50   4100.00   8112.25   17.00\n";
        let m = parse_table(line, Benchmark::GetLatency, true, &[131072]).unwrap();
        assert_eq!(
            m.rows,
            vec![(131072, vec![134.17, 30.5, 4100.0, 8112.25, 17.0])]
        );
        assert!(parse_table(line, Benchmark::GetLatency, false, &[131072]).is_err());
        assert!(parse_table("131072   134.17\n", Benchmark::GetLatency, true, &[131072]).is_err());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn bounds_grow_with_the_work() {
        let small = size_bounds(Benchmark::Latency, &options(1, 1), 2);
        assert_eq!(small.len(), 1);
        assert!(small[0] >= SIZE_SLACK);
        let big = size_bounds(Benchmark::Bandwidth, &options(4 << 20, 4 << 20), 2);
        // 11 windows of 64 4 MiB messages at SLOW_RATE: about 6 s more.
        assert!(big[0] > small[0] + Duration::from_secs(5));
        let pairs = size_bounds(Benchmark::MultiBandwidth, &options(4 << 20, 4 << 20), 8);
        assert!(pairs[0] > big[0] + Duration::from_secs(15));
        // A lock and an unlock around each one-sided operation are four
        // messages more than an operation and its flush.
        let mut locked = options(8, 8);
        locked.counts.iterations = 100_000;
        let flushed = size_bounds(Benchmark::CasLatency, &locked, 2);
        locked.sync = Synchronization::Lock;
        let with_locks = size_bounds(Benchmark::CasLatency, &locked, 2);
        let ratio =
            (with_locks[0] - SIZE_SLACK).as_secs_f64() / (flushed[0] - SIZE_SLACK).as_secs_f64();
        assert!((ratio - 3.0).abs() < 1e-6, "lock mode's bound: {ratio}x");
    }

    #[test]
    fn arguments_never_ask_for_json() {
        let o = Options {
            json: true,
            tail: false,
            ..Options::defaults(Benchmark::Bandwidth)
        };
        let args = benchmark_args(Benchmark::BiBandwidth, &o);
        assert_eq!(args[0], "bibw");
        assert!(!args.iter().any(|a| a == "--json"));
        assert!(args.contains(&OSU_COUNTS.iterations.to_string()));
    }

    #[test]
    fn failed_and_stuck_jobs_are_reported_with_their_output() {
        let sh = |script: &str| JobSpec {
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            description: "sh".into(),
        };
        let o = options(1, 2);
        let e = run_job(
            &sh("echo oops >&2; exit 3"),
            "the shell",
            Benchmark::Latency,
            &o,
            2,
            |_| {},
        )
        .unwrap_err();
        assert!(e.contains("the shell") && e.contains("oops"), "{e}");
        let ok = run_job(
            &sh("echo '# t'; echo '1 2.5'; echo '2 3.5'"),
            "the shell",
            Benchmark::Latency,
            &o,
            2,
            |_| {},
        )
        .unwrap();
        assert_eq!(ok.first_figures(), vec![(1, 2.5), (2, 3.5)]);
        let e = run_job(
            &JobSpec {
                program: PathBuf::from("/nonexistent"),
                ..sh("")
            },
            "nothing",
            Benchmark::Latency,
            &o,
            2,
            |_| {},
        )
        .unwrap_err();
        assert!(e.contains("cannot be started"), "{e}");
    }
}
