//! Output of the benchmarks: OSU's table, or one JSON object.
//!
//! The table is what OSU's programs print: `#` header lines, a column
//! header (`# Size          Latency (us)`), then one line per size, the
//! size left-aligned in 10 columns and each figure right-aligned in 18
//! with 2 decimals (`mbw_mr` has two figures: MB/s and messages/s). Table
//! lines are written as each size is measured; the JSON object
//! (`{"benchmark", "implementation", "unit", "notes", "results": [{"size",
//! "value"}, ...]}`, with `"messages_per_second"` beside `"value"` for
//! `mbw_mr`) once, at the end, on one line.
//!
//! With `--tail` (the one-sided latencies) each size has the
//! [`TAIL_COLUMNS`] after its mean ([`tail_figures`]): a mean above the
//! median says whether every operation was slower or a few stalled.

use crate::cli::Benchmark;
use std::io::{self, Write};

/// Width of the size column (OSU's `%-10d`).
const SIZE_WIDTH: usize = 10;
/// Width of the figure column (OSU's `FIELD_WIDTH`).
const FIELD_WIDTH: usize = 18;

/// The columns `--tail` adds after a latency's mean.
pub const TAIL_COLUMNS: [&str; 4] = ["P50 (us)", "P99 (us)", "Max (us)", "Over 1 ms"];
/// Their JSON keys.
const TAIL_KEYS: [&str; 4] = ["p50", "p99", "max", "over_1ms"];
/// An operation longer than this many seconds counts in `Over 1 ms`: a
/// stall (a sleep, a lost core, a retransmission), not a slow operation.
pub const STALL: f64 = 1e-3;

/// Writes one benchmark's results to `out`.
pub struct Report<W: Write> {
    out: W,
    benchmark: Benchmark,
    implementation: String,
    notes: Vec<String>,
    json: bool,
    tail: bool,
    results: Vec<(usize, Vec<f64>)>,
}

impl<W: Write> Report<W> {
    /// A report of `benchmark` run over `implementation` (`"oxmpi"`,
    /// `"raw-tcp"`), with `notes` describing the run (one header line
    /// each), as a table or as JSON, with the [`TAIL_COLUMNS`] if
    /// `tail`. Writes the table's header at once.
    pub fn start(
        mut out: W,
        benchmark: Benchmark,
        implementation: &str,
        notes: Vec<String>,
        json: bool,
        tail: bool,
    ) -> io::Result<Report<W>> {
        if !json {
            writeln!(out, "# {}", title(benchmark, implementation))?;
            for note in &notes {
                writeln!(out, "# {note}")?;
            }
            writeln!(out, "{}", column_header(benchmark, tail))?;
            out.flush()?;
        }
        Ok(Report {
            out,
            benchmark,
            implementation: implementation.to_owned(),
            notes,
            json,
            tail,
            results: Vec::new(),
        })
    }

    /// Records the figures for one size, one per column of the benchmark
    /// (and of the tail, if asked for), and prints its table line.
    pub fn row(&mut self, size: usize, figures: &[f64]) -> io::Result<()> {
        debug_assert_eq!(figures.len(), columns(self.benchmark, self.tail).len());
        self.results.push((size, figures.to_vec()));
        if !self.json {
            writeln!(self.out, "{}", table_line(size, figures))?;
            self.out.flush()?;
        }
        Ok(())
    }

    /// Ends the report (prints the JSON object) and gives `out` back.
    pub fn finish(mut self) -> io::Result<W> {
        if self.json {
            let text = json(
                &figure_keys(self.benchmark, self.tail),
                self.benchmark,
                &self.implementation,
                &self.notes,
                &self.results,
            );
            writeln!(self.out, "{text}")?;
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// A report on the standard output, as every benchmark writes one.
pub type StdoutReport = Report<io::StdoutLock<'static>>;

impl StdoutReport {
    /// [`Report::start`] on the standard output, with an I/O error put
    /// in words.
    pub fn to_stdout(
        benchmark: Benchmark,
        implementation: &str,
        notes: Vec<String>,
        json: bool,
        tail: bool,
    ) -> Result<StdoutReport, String> {
        Report::start(
            io::stdout().lock(),
            benchmark,
            implementation,
            notes,
            json,
            tail,
        )
        .map_err(written)
    }

    /// [`Report::row`], with an I/O error put in words.
    pub fn record(&mut self, size: usize, figures: &[f64]) -> Result<(), String> {
        self.row(size, figures).map_err(written)
    }

    /// [`Report::finish`], with an I/O error put in words.
    pub fn end(self) -> Result<(), String> {
        self.finish().map(drop).map_err(written)
    }
}

fn written(e: io::Error) -> String {
    format!("writing the report: {e}")
}

/// The first header line's text (after `# `).
pub fn title(benchmark: Benchmark, implementation: &str) -> String {
    let who = match implementation {
        "raw-tcp" => "raw TCP",
        "raw-shm" => "raw shared-memory",
        other => other,
    };
    format!("{who} {} test", benchmark.description())
}

/// The headers of a report's figure columns: the benchmark's, then the
/// [`TAIL_COLUMNS`] if `tail`.
pub fn columns(benchmark: Benchmark, tail: bool) -> Vec<&'static str> {
    let tail: &[&str] = if tail { &TAIL_COLUMNS } else { &[] };
    [benchmark.columns(), tail].concat()
}

/// The [`TAIL_COLUMNS`]' figures of one size, from its operations'
/// durations in seconds (sorted in place): the median, the 99th
/// percentile and the longest in microseconds (by nearest rank: each is
/// one operation's time), and how many took over [`STALL`]. All zero if
/// there were no operations.
pub fn tail_figures(durations: &mut [f64]) -> [f64; 4] {
    if durations.is_empty() {
        return [0.0; 4];
    }
    durations.sort_unstable_by(f64::total_cmp);
    let rank = |percent: usize| {
        let nearest = (durations.len() * percent).div_ceil(100);
        durations[nearest.max(1) - 1] * 1e6
    };
    let stalls = durations.iter().filter(|&&d| d > STALL).count();
    [rank(50), rank(99), rank(100), stalls as f64]
}

/// The column header, as OSU's (with the tail's columns after).
pub fn column_header(benchmark: Benchmark, tail: bool) -> String {
    let mut s = format!("{:<SIZE_WIDTH$}", "# Size");
    for figure in columns(benchmark, tail) {
        s.push_str(&format!("{figure:>FIELD_WIDTH$}"));
    }
    s
}

/// One line of the table.
pub fn table_line(size: usize, figures: &[f64]) -> String {
    let mut s = format!("{size:<SIZE_WIDTH$}");
    for value in figures {
        s.push_str(&format!("{value:>FIELD_WIDTH$.2}"));
    }
    s
}

/// The JSON keys of a report's figures, in column order (the tail's
/// after the benchmark's if `tail`).
pub fn figure_keys(benchmark: Benchmark, tail: bool) -> Vec<&'static str> {
    let own: &[&str] = match benchmark {
        Benchmark::MultiBandwidth => &["value", "messages_per_second"],
        _ => &["value"],
    };
    let tail: &[&str] = if tail { &TAIL_KEYS } else { &[] };
    [own, tail].concat()
}

/// The JSON object of a whole run, on one line, each result's figures
/// under `keys`.
pub fn json(
    keys: &[&str],
    benchmark: Benchmark,
    implementation: &str,
    notes: &[String],
    results: &[(usize, Vec<f64>)],
) -> String {
    let results: Vec<String> = results
        .iter()
        .map(|(size, figures)| {
            let mut item = format!("{{\"size\":{size}");
            for (key, &value) in keys.iter().zip(figures) {
                item.push_str(&format!(",\"{key}\":{}", json_number(value)));
            }
            item.push('}');
            item
        })
        .collect();
    format!(
        "{{\"benchmark\":{},\"implementation\":{},\"unit\":{},\"notes\":{},\"results\":[{}]}}",
        json_string(benchmark.name()),
        json_string(implementation),
        json_string(benchmark.unit()),
        json_strings(notes),
        results.join(",")
    )
}

/// A JSON array of strings.
pub fn json_strings(texts: &[String]) -> String {
    let items: Vec<String> = texts.iter().map(|t| json_string(t)).collect();
    format!("[{}]", items.join(","))
}

/// A JSON number; JSON has no infinities or NaN, so those are `null`.
pub fn json_number(value: f64) -> String {
    if value.is_finite() {
        // Rust prints finite floats without an exponent, in the shortest
        // form that reads back to the same value: valid JSON.
        format!("{value}")
    } else {
        "null".to_owned()
    }
}

/// A JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Records, for `size`, the mean over the ranks of `world` of each
/// rank's `mean_us`: rank 0, whose `report` it is, reduces the others'
/// into it; every other rank (no report) sends its own. Collective.
pub fn record_rank_mean(
    world: &oxmpi::Communicator,
    report: Option<&mut StdoutReport>,
    size: usize,
    mean_us: f64,
) -> Result<(), String> {
    use oxmpi::collective::SystemOperation;
    let reducing = |e: oxmpi::Error| format!("reducing the times: {e}");
    let root = world.process_at_rank(0);
    match report {
        Some(report) => {
            let mut sum = 0.0f64;
            root.reduce_into_root(&mean_us, &mut sum, SystemOperation::sum())
                .map_err(reducing)?;
            report.record(size, &[sum / f64::from(world.size())])
        }
        None => root
            .reduce_into(&mean_us, SystemOperation::sum())
            .map_err(reducing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_osu_layout() {
        assert_eq!(
            column_header(Benchmark::Latency, false),
            "# Size          Latency (us)"
        );
        assert_eq!(
            column_header(Benchmark::Bandwidth, false),
            "# Size      Bandwidth (MB/s)"
        );
        assert_eq!(
            column_header(Benchmark::MultiBandwidth, false),
            "# Size                  MB/s        Messages/s"
        );
        assert_eq!(
            column_header(Benchmark::GetLatency, true),
            "# Size          Latency (us)          P50 (us)          P99 (us)          \
             Max (us)         Over 1 ms"
        );
        assert_eq!(table_line(0, &[3.456]), "0                       3.46");
        assert_eq!(
            table_line(4194304, &[5629.0]),
            "4194304              5629.00"
        );
        assert_eq!(table_line(8, &[0.004]).len(), SIZE_WIDTH + FIELD_WIDTH);
        assert_eq!(
            table_line(8, &[1.5, 187500.0]),
            "8                       1.50         187500.00"
        );
    }

    #[test]
    fn text_report() {
        let mut r = Report::start(
            Vec::new(),
            Benchmark::Latency,
            "oxmpi",
            vec!["2 ranks".into()],
            false,
            false,
        )
        .unwrap();
        r.row(0, &[3.0]).unwrap();
        r.row(1, &[3.25]).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        assert_eq!(
            text,
            "# oxmpi latency test\n# 2 ranks\n# Size          Latency (us)\n\
             0                       3.00\n1                       3.25\n"
        );
    }

    #[test]
    fn json_report() {
        let mut r = Report::start(
            Vec::new(),
            Benchmark::Bandwidth,
            "raw-tcp",
            vec!["say \"hi\"\\\n\u{1}".into()],
            true,
            false,
        )
        .unwrap();
        r.row(1, &[1.5]).unwrap();
        r.row(2, &[f64::INFINITY]).unwrap();
        r.row(4, &[1234.0]).unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"benchmark\":\"bw\",\"implementation\":\"raw-tcp\",\"unit\":\"MB/s\",\
             \"notes\":[\"say \\\"hi\\\"\\\\\\n\\u0001\"],\
             \"results\":[{\"size\":1,\"value\":1.5},{\"size\":2,\"value\":null},\
             {\"size\":4,\"value\":1234}]}\n"
        );
        assert_eq!(json_number(1e-7), "0.0000001");
        let text = json(
            &figure_keys(Benchmark::MultiBandwidth, false),
            Benchmark::MultiBandwidth,
            "oxmpi",
            &[],
            &[(8, vec![1.5, 187500.0])],
        );
        assert!(
            text.ends_with(
                "\"results\":[{\"size\":8,\"value\":1.5,\"messages_per_second\":187500}]}"
            ),
            "{text}"
        );
    }

    #[test]
    fn tail_figures_are_nearest_rank_percentiles_and_the_stalls() {
        // 200 operations: 190 of 30 us, 6 of 40 us, 4 stalls (2, 4, 4
        // and 8 ms), shuffled.
        let mut durations: Vec<f64> = (0..200)
            .map(|i| match (i * 37) % 200 {
                0..=189 => 30e-6,
                190..=195 => 40e-6,
                196 => 2e-3,
                197 | 198 => 4e-3,
                _ => 8e-3,
            })
            .collect();
        let [p50, p99, max, stalls] = tail_figures(&mut durations);
        assert!((p50 - 30.0).abs() < 1e-9, "{p50}");
        // The 198th of 200 sorted: the second 4 ms stall.
        assert!((p99 - 4000.0).abs() < 1e-6, "{p99}");
        assert!((max - 8000.0).abs() < 1e-6, "{max}");
        assert_eq!(stalls, 4.0);
        // One operation: every percentile is it; exactly 1 ms is no stall.
        assert_eq!(tail_figures(&mut [1e-3]), [1000.0, 1000.0, 1000.0, 0.0]);
        assert_eq!(tail_figures(&mut []), [0.0; 4]);
    }

    #[test]
    fn tail_report_has_its_columns_and_keys() {
        let mut r = Report::start(
            Vec::new(),
            Benchmark::GetLatency,
            "oxmpi",
            vec![],
            true,
            true,
        )
        .unwrap();
        r.row(131072, &[134.5, 30.25, 4100.0, 8112.0, 17.0])
            .unwrap();
        let text = String::from_utf8(r.finish().unwrap()).unwrap();
        assert!(
            text.ends_with(
                "\"results\":[{\"size\":131072,\"value\":134.5,\"p50\":30.25,\"p99\":4100,\
                 \"max\":8112,\"over_1ms\":17}]}\n"
            ),
            "{text}"
        );
        assert_eq!(
            table_line(131072, &[134.5, 30.25, 4100.0, 8112.0, 17.0])
                .split_whitespace()
                .count(),
            6
        );
    }

    #[test]
    fn titles() {
        assert_eq!(title(Benchmark::Latency, "oxmpi"), "oxmpi latency test");
        assert_eq!(
            title(Benchmark::Bandwidth, "raw-tcp"),
            "raw TCP bandwidth test"
        );
        assert_eq!(
            title(Benchmark::BiBandwidth, "oxmpi"),
            "oxmpi bi-directional bandwidth test"
        );
    }
}
