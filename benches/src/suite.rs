//! `oxbench suite`: the main job. For every transport this build of oxmpi
//! offers ([`oxmpi::TRANSPORT_NAMES`]; verbs only when
//! `OXMPI_VERBS_PROVIDER` is set, since without it verbs needs a device
//! that most machines lack), or those named with `--transports`, it runs `latency`, `bw`, `bibw` and `mbw_mr` as 2-rank
//! jobs through oxrun with `OXMPI_TRANSPORTS` set to that transport alone,
//! then that transport's floor where oxbench has one (`raw-tcp`,
//! `raw-shm`: latency and bw). It shows progress on standard error while
//! the jobs run, prints one table per transport and per floor, and writes
//! an SVG plot of latency and bandwidth against message size
//! ([`crate::plot`]).
//!
//! The jobs run through [`crate::runner`], bounded in time. A benchmark
//! that fails is reported on standard error, shown as `failed` in its
//! table, and makes the exit status 1; the others still run and are
//! plotted.

use crate::cli::{Benchmark, Options, SuiteOptions};
use crate::plot::{self, Chart, Series};
use crate::report;
use crate::runner::{self, JobSpec, Measured};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Instant;

/// The benchmarks the suite runs over each transport, in order.
pub const BENCHMARKS: [Benchmark; 4] = [
    Benchmark::Latency,
    Benchmark::Bandwidth,
    Benchmark::BiBandwidth,
    Benchmark::MultiBandwidth,
];

/// Width of the size column of the tables.
const SIZE_WIDTH: usize = 10;
/// Width of the other columns.
const COLUMN_WIDTH: usize = 16;

/// The results of one group of jobs: oxmpi's over a transport, or the
/// transport's floor.
struct Group {
    /// The transport.
    transport: String,
    /// Whether these are the floor's (no MPI) rather than oxmpi's.
    floor: bool,
    /// Each benchmark's figures, or why there are none.
    results: Vec<(Benchmark, Result<Measured, String>)>,
}

impl Group {
    fn figures(&self, benchmark: Benchmark) -> Option<&Measured> {
        self.results
            .iter()
            .find(|(b, _)| *b == benchmark)
            .and_then(|(_, r)| r.as_ref().ok())
    }

    /// Its name in the plot's legends and in JSON.
    fn name(&self) -> String {
        if self.floor {
            format!("raw {}", self.transport)
        } else {
            format!("oxmpi {}", self.transport)
        }
    }

    /// The first line of its table.
    fn title(&self) -> String {
        match (self.floor, self.transport.as_str()) {
            (false, t) => format!("# oxmpi over {t} (OXMPI_TRANSPORTS={t}), 2 ranks"),
            (true, "tcp") => "# raw TCP between two plain processes: the floor".to_owned(),
            (true, "shm") => {
                "# shared memory without MPI, the floor: two processes on a cache line \
                             (latency), one thread's memcpy into the window (bw)"
                    .to_owned()
            }
            (true, t) => format!("# the floor of {t}"),
        }
    }
}

/// Runs the suite; see the module docs.
pub fn main(suite: &SuiteOptions) -> ExitCode {
    match run(suite) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("oxbench suite: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The transports to measure: those asked for, each checked against the
/// build's, or all of the build's (verbs only when `OXMPI_VERBS_PROVIDER`
/// is set).
fn transports(asked: &[String]) -> Result<Vec<String>, String> {
    transports_with(asked, std::env::var_os("OXMPI_VERBS_PROVIDER").is_some())
}

/// [`transports`], told whether `OXMPI_VERBS_PROVIDER` is set.
fn transports_with(asked: &[String], verbs_provider: bool) -> Result<Vec<String>, String> {
    let known = oxmpi::TRANSPORT_NAMES;
    if asked.is_empty() {
        return Ok(known
            .iter()
            .filter(|&&t| t != "verbs" || verbs_provider)
            .map(|t| t.to_string())
            .collect());
    }
    for t in asked {
        if !known.contains(&t.as_str()) {
            return Err(format!(
                "this build of oxmpi has no transport {t:?}; it has {}",
                known.join(", ")
            ));
        }
    }
    Ok(asked.to_vec())
}

fn run(suite: &SuiteOptions) -> Result<bool, String> {
    let transports = transports(&suite.transports)?;
    let (oxbench, oxrun) = runner::oxbench_and_oxrun()?;
    let options = &suite.options;
    let mut progress = Progress::new();
    let mut groups = Vec::new();
    for transport in &transports {
        let jobs = BENCHMARKS.iter().map(|&benchmark| {
            let spec = runner::oxmpi_job(&oxrun, &oxbench, benchmark, options, 2, transport);
            (benchmark, spec, options.clone())
        });
        groups.push(run_group(transport, false, jobs, &mut progress));
    }
    for transport in &transports {
        let jobs: Vec<(Benchmark, JobSpec, Options)> = BENCHMARKS
            .iter()
            .filter_map(|&benchmark| {
                let (spec, options) = runner::floor_job(&oxbench, transport, benchmark, options)?;
                Some((benchmark, spec, options))
            })
            .collect();
        if !jobs.is_empty() {
            groups.push(run_group(transport, true, jobs.into_iter(), &mut progress));
        }
    }

    let text = if options.json {
        json_lines(&groups)
    } else {
        let mut text = String::new();
        for group in &groups {
            text.push_str(&table(group, options));
            text.push('\n');
        }
        text
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the result: {e}"))?;

    let title = format!(
        "oxbench suite: oxmpi {}, 2 ranks on this machine",
        env!("CARGO_PKG_VERSION")
    );
    plot::write_svg(&suite.svg, &title, &charts(&groups))?;
    eprintln!("oxbench suite: wrote the plot to {}", suite.svg.display());
    Ok(groups
        .iter()
        .all(|g| g.results.iter().all(|(_, r)| r.is_ok())))
}

/// Runs a group's jobs one after the other, showing their progress; a
/// failure is reported at once.
fn run_group(
    transport: &str,
    floor: bool,
    jobs: impl Iterator<Item = (Benchmark, JobSpec, Options)>,
    progress: &mut Progress,
) -> Group {
    let kind = if floor { "raw" } else { "oxmpi" };
    let results = jobs
        .map(|(benchmark, spec, options)| {
            let label = format!("{kind} {transport} {}", benchmark.name());
            let total = options.sizes().len();
            progress.start(&label, total);
            let result = runner::run_job(&spec, &label, benchmark, &options, 2, |done| {
                progress.step(&label, done, total)
            });
            progress.end(&label, &result);
            (benchmark, result)
        })
        .collect();
    Group {
        transport: transport.to_owned(),
        floor,
        results,
    }
}

/// Progress on standard error: on a terminal, one line rewritten as each
/// size completes; elsewhere (a log), a line when each job starts and
/// ends.
struct Progress {
    terminal: bool,
    started: Instant,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    fn start(&mut self, label: &str, total: usize) {
        self.started = Instant::now();
        if self.terminal {
            self.step(label, 0, total);
        } else {
            eprintln!("oxbench suite: {label}: {total} sizes ...");
        }
    }

    fn step(&self, label: &str, done: usize, total: usize) {
        if self.terminal {
            eprint!(
                "\r\x1b[Koxbench suite: {label}: {done}/{total} sizes, {:.0?}",
                self.started.elapsed()
            );
        }
    }

    fn end(&self, label: &str, result: &Result<Measured, String>) {
        if self.terminal {
            eprint!("\r\x1b[K");
        }
        match result {
            Ok(_) => eprintln!(
                "oxbench suite: {label}: done in {:.1?}",
                self.started.elapsed()
            ),
            Err(e) => eprintln!("oxbench suite: {label}: failed: {e}"),
        }
    }
}

/// The columns of a group's table: (benchmark, which figure, header).
fn columns(group: &Group) -> Vec<(Benchmark, usize, &'static str)> {
    let all = [
        (Benchmark::Latency, 0, "latency (us)"),
        (Benchmark::Bandwidth, 0, "bw (MB/s)"),
        (Benchmark::BiBandwidth, 0, "bibw (MB/s)"),
        (Benchmark::MultiBandwidth, 1, "messages/s"),
    ];
    all.into_iter()
        .filter(|(b, _, _)| group.results.iter().any(|(r, _)| r == b))
        .collect()
}

/// A group's table: one line per size, one column per figure; `-` for a
/// size a floor does not measure.
fn table(group: &Group, options: &Options) -> String {
    let columns = columns(group);
    let mut s = format!("{}\n# {}\n", group.title(), options.describe_iterations());
    for (benchmark, result) in &group.results {
        if let Err(e) = result {
            let first_line = e.lines().next().unwrap_or_default();
            s.push_str(&format!("# {} failed: {first_line}\n", benchmark.name()));
        }
    }
    s.push_str(&format!("{:<SIZE_WIDTH$}", "# Size"));
    for (_, _, header) in &columns {
        s.push_str(&format!("{header:>COLUMN_WIDTH$}"));
    }
    s.push('\n');
    for size in options.sizes() {
        s.push_str(&format!("{size:<SIZE_WIDTH$}"));
        for &(benchmark, figure, _) in &columns {
            let text = match group.figures(benchmark) {
                None => "failed".to_owned(),
                Some(m) => match m.rows.iter().find(|(s, _)| *s == size) {
                    Some((_, f)) => format!("{:.2}", f[figure]),
                    None => "-".to_owned(),
                },
            };
            s.push_str(&format!("{text:>COLUMN_WIDTH$}"));
        }
        s.push('\n');
    }
    s
}

/// The results as JSON lines: one object per job, as `oxbench --json`
/// prints it, the implementation named `oxmpi/TRANSPORT` or
/// `raw/TRANSPORT`; a failed job has no results and a note `failed:
/// REASON`.
fn json_lines(groups: &[Group]) -> String {
    let mut s = String::new();
    for group in groups {
        let implementation = group.name().replace(' ', "/");
        for (benchmark, result) in &group.results {
            let (notes, rows) = match result {
                Ok(m) => (m.library.iter().cloned().collect(), m.rows.clone()),
                Err(e) => (vec![format!("failed: {e}")], Vec::new()),
            };
            s.push_str(&report::json(
                &report::figure_keys(*benchmark, false),
                *benchmark,
                &implementation,
                &notes,
                &rows,
            ));
            s.push('\n');
        }
    }
    s
}

/// The plot: latency of every group, and bandwidth (bw and bibw) of
/// every group.
fn charts(groups: &[Group]) -> Vec<Chart> {
    let series = |benchmark: Benchmark, suffix: &str| -> Vec<Series> {
        groups
            .iter()
            .filter(|g| g.results.iter().any(|(b, _)| *b == benchmark))
            .map(|g| Series {
                name: format!("{}{suffix}", g.name()),
                points: g
                    .figures(benchmark)
                    .map(Measured::first_figures)
                    .unwrap_or_default(),
            })
            .collect()
    };
    let mut bandwidth = series(Benchmark::Bandwidth, " bw");
    bandwidth.extend(series(Benchmark::BiBandwidth, " bibw"));
    vec![
        Chart {
            title: "Latency (one way)".to_owned(),
            y_label: "latency (us)".to_owned(),
            series: series(Benchmark::Latency, ""),
        },
        Chart {
            title: "Bandwidth".to_owned(),
            y_label: "bandwidth (MB/s)".to_owned(),
            series: bandwidth,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(rows: Vec<(usize, Vec<f64>)>) -> Result<Measured, String> {
        Ok(Measured {
            library: None,
            rows,
        })
    }

    fn options() -> Options {
        Options {
            min_size: 1,
            max_size: 2,
            ..Options::defaults(Benchmark::Bandwidth)
        }
    }

    #[test]
    fn tables_show_every_figure_and_failures() {
        let group = Group {
            transport: "tcp".to_owned(),
            floor: false,
            results: vec![
                (
                    Benchmark::Latency,
                    measured(vec![(1, vec![5.0]), (2, vec![5.5])]),
                ),
                (Benchmark::Bandwidth, Err("killed\nmore".to_owned())),
                (
                    Benchmark::BiBandwidth,
                    measured(vec![(1, vec![2.0]), (2, vec![4.0])]),
                ),
                (
                    Benchmark::MultiBandwidth,
                    measured(vec![(1, vec![1.0, 1e6]), (2, vec![2.0, 1e6])]),
                ),
            ],
        };
        let t = table(&group, &options());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "# oxmpi over tcp (OXMPI_TRANSPORTS=tcp), 2 ranks");
        assert_eq!(lines[2], "# bw failed: killed");
        assert_eq!(
            lines[3],
            "# Size        latency (us)       bw (MB/s)     bibw (MB/s)      messages/s"
        );
        assert_eq!(
            lines[4],
            "1                     5.00          failed            2.00      1000000.00"
        );
        assert_eq!(lines.len(), 6);
        let j = json_lines(std::slice::from_ref(&group));
        assert_eq!(j.lines().count(), 4);
        assert!(j.contains("\"implementation\":\"oxmpi/tcp\""), "{j}");
        let floor = Group {
            transport: "shm".to_owned(),
            floor: true,
            results: vec![(Benchmark::Latency, measured(vec![(1, vec![0.2])]))],
        };
        let t = table(&floor, &options());
        assert!(
            t.starts_with("# shared memory without MPI, the floor"),
            "{t}"
        );
        assert!(
            t.ends_with("1                     0.20\n2                        -\n"),
            "{t}"
        );
        assert!(json_lines(&[floor]).contains("\"implementation\":\"raw/shm\""));
        assert!(
            j.contains("\"notes\":[\"failed: killed\\nmore\"],\"results\":[]"),
            "{j}"
        );
        let charts = charts(&[group]);
        assert_eq!(charts.len(), 2);
        assert_eq!(charts[0].series[0].name, "oxmpi tcp");
        assert_eq!(charts[0].series[0].points, vec![(1, 5.0), (2, 5.5)]);
        let names: Vec<&str> = charts[1].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["oxmpi tcp bw", "oxmpi tcp bibw"]);
        assert!(charts[1].series[0].points.is_empty());
    }

    #[test]
    fn transports_are_checked() {
        assert_eq!(transports_with(&[], true).unwrap(), oxmpi::TRANSPORT_NAMES);
        assert_eq!(transports_with(&[], false).unwrap(), ["shm", "tcp"]);
        assert_eq!(
            transports_with(&["verbs".to_owned()], false).unwrap(),
            ["verbs"]
        );
        assert_eq!(transports(&["tcp".to_owned()]).unwrap(), ["tcp"]);
        let e = transports(&["carrier-pigeon".to_owned()]).unwrap_err();
        assert!(e.contains("no transport \"carrier-pigeon\""), "{e}");
    }
}
