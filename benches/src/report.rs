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

use crate::cli::Benchmark;
use std::io::{self, Write};

/// Width of the size column (OSU's `%-10d`).
const SIZE_WIDTH: usize = 10;
/// Width of the figure column (OSU's `FIELD_WIDTH`).
const FIELD_WIDTH: usize = 18;

/// Writes one benchmark's results to `out`.
pub struct Report<W: Write> {
    out: W,
    benchmark: Benchmark,
    implementation: String,
    notes: Vec<String>,
    json: bool,
    results: Vec<(usize, Vec<f64>)>,
}

impl<W: Write> Report<W> {
    /// A report of `benchmark` run over `implementation` (`"oxmpi"`,
    /// `"raw-tcp"`), with `notes` describing the run (one header line
    /// each), as a table or as JSON. Writes the table's header at once.
    pub fn start(
        mut out: W,
        benchmark: Benchmark,
        implementation: &str,
        notes: Vec<String>,
        json: bool,
    ) -> io::Result<Report<W>> {
        if !json {
            writeln!(out, "# {}", title(benchmark, implementation))?;
            for note in &notes {
                writeln!(out, "# {note}")?;
            }
            writeln!(out, "{}", column_header(benchmark))?;
            out.flush()?;
        }
        Ok(Report {
            out,
            benchmark,
            implementation: implementation.to_owned(),
            notes,
            json,
            results: Vec::new(),
        })
    }

    /// Records the figures for one size, one per column of the benchmark
    /// (and prints its table line).
    pub fn row(&mut self, size: usize, figures: &[f64]) -> io::Result<()> {
        debug_assert_eq!(figures.len(), self.benchmark.columns().len());
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
    ) -> Result<StdoutReport, String> {
        Report::start(io::stdout().lock(), benchmark, implementation, notes, json).map_err(written)
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

/// The column header, as OSU's.
pub fn column_header(benchmark: Benchmark) -> String {
    let mut s = format!("{:<SIZE_WIDTH$}", "# Size");
    for figure in benchmark.columns() {
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

/// The JSON keys of a benchmark's figures, in column order.
pub fn figure_keys(benchmark: Benchmark) -> &'static [&'static str] {
    match benchmark {
        Benchmark::MultiBandwidth => &["value", "messages_per_second"],
        _ => &["value"],
    }
}

/// The JSON object of a whole run, on one line.
pub fn json(
    benchmark: Benchmark,
    implementation: &str,
    notes: &[String],
    results: &[(usize, Vec<f64>)],
) -> String {
    let results: Vec<String> = results
        .iter()
        .map(|(size, figures)| {
            let mut item = format!("{{\"size\":{size}");
            for (key, &value) in figure_keys(benchmark).iter().zip(figures) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_osu_layout() {
        assert_eq!(
            column_header(Benchmark::Latency),
            "# Size          Latency (us)"
        );
        assert_eq!(
            column_header(Benchmark::Bandwidth),
            "# Size      Bandwidth (MB/s)"
        );
        assert_eq!(
            column_header(Benchmark::MultiBandwidth),
            "# Size                  MB/s        Messages/s"
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
