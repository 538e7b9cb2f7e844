//! Command line of `oxbench`: which benchmark to run and with which
//! options. Parsing needs no MPI, so a bad command line is reported (exit
//! status 2) before any process is started or MPI initialized.

use std::fmt;

/// Number of immediate sends per window in the bandwidth benchmarks, as
/// OSU's `osu_bw`.
pub const WINDOW: usize = 64;

/// Messages larger than this many bytes use the "large" iteration and
/// warm-up counts (OSU's `LARGE_MESSAGE_SIZE`).
pub const LARGE_MESSAGE_SIZE: usize = 8192;

/// Timed iterations per size up to [`LARGE_MESSAGE_SIZE`] (OSU's default).
pub const ITERATIONS_SMALL: usize = 10_000;
/// Timed iterations per size above [`LARGE_MESSAGE_SIZE`].
pub const ITERATIONS_LARGE: usize = 1_000;
/// Untimed warm-up iterations per size up to [`LARGE_MESSAGE_SIZE`].
pub const WARMUP_SMALL: usize = 100;
/// Untimed warm-up iterations per size above [`LARGE_MESSAGE_SIZE`].
pub const WARMUP_LARGE: usize = 10;

/// Default largest message size: 4 MiB, as OSU.
pub const DEFAULT_MAX_SIZE: usize = 4 << 20;
/// The largest message size accepted. The bandwidth receivers hold a
/// window of [`WINDOW`] buffers of the largest size (4 GiB at this limit).
pub const SIZE_LIMIT: usize = 64 << 20;

/// What a benchmark measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Benchmark {
    /// Ping-pong: one-way latency in microseconds (`osu_latency`).
    Latency,
    /// Streaming: windows of [`WINDOW`] messages then an acknowledgement,
    /// bandwidth in MB/s (`osu_bw`).
    Bandwidth,
}

impl Benchmark {
    /// The name used on the command line and in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Benchmark::Latency => "latency",
            Benchmark::Bandwidth => "bw",
        }
    }

    /// The unit of the figures.
    pub fn unit(self) -> &'static str {
        match self {
            Benchmark::Latency => "us",
            Benchmark::Bandwidth => "MB/s",
        }
    }

    /// The smallest size the benchmark can measure by default. Zero-byte
    /// messages have a latency, but carry no bandwidth.
    fn default_min_size(self) -> usize {
        match self {
            Benchmark::Latency => 0,
            Benchmark::Bandwidth => 1,
        }
    }

    fn parse(word: &str) -> Option<Benchmark> {
        match word {
            "latency" => Some(Benchmark::Latency),
            "bw" => Some(Benchmark::Bandwidth),
            _ => None,
        }
    }
}

/// The options shared by every benchmark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Smallest message size in bytes.
    pub min_size: usize,
    /// Largest message size in bytes.
    pub max_size: usize,
    /// Timed iterations per size; `None`: OSU's defaults by size.
    pub iterations: Option<usize>,
    /// Warm-up iterations per size; `None`: OSU's defaults by size.
    pub warmup: Option<usize>,
    /// Print one JSON object instead of the OSU-style table.
    pub json: bool,
}

impl Options {
    /// The message sizes to measure: `min_size`, then doubling (0 is
    /// followed by 1), up to `max_size` included, as OSU.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut size = self.min_size;
        while size <= self.max_size {
            sizes.push(size);
            size = if size == 0 { 1 } else { size * 2 };
        }
        sizes
    }

    /// Timed iterations for messages of `size` bytes.
    pub fn iterations_for(&self, size: usize) -> usize {
        self.iterations.unwrap_or(if size > LARGE_MESSAGE_SIZE {
            ITERATIONS_LARGE
        } else {
            ITERATIONS_SMALL
        })
    }

    /// Warm-up iterations for messages of `size` bytes.
    pub fn warmup_for(&self, size: usize) -> usize {
        self.warmup.unwrap_or(if size > LARGE_MESSAGE_SIZE {
            WARMUP_LARGE
        } else {
            WARMUP_SMALL
        })
    }

    /// The options as command-line arguments that parse back to the same
    /// options (for the raw TCP benchmark's second process).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--min-size".to_owned(),
            self.min_size.to_string(),
            "--max-size".to_owned(),
            self.max_size.to_string(),
        ];
        if let Some(n) = self.iterations {
            args.extend(["--iterations".to_owned(), n.to_string()]);
        }
        if let Some(n) = self.warmup {
            args.extend(["--warmup".to_owned(), n.to_string()]);
        }
        if self.json {
            args.push("--json".to_owned());
        }
        args
    }

    /// A line describing the iteration counts, for the output's header.
    pub fn describe_iterations(&self) -> String {
        let part = |fixed: Option<usize>, small: usize, large: usize| match fixed {
            Some(n) => n.to_string(),
            None => format!("{small} (≤ {LARGE_MESSAGE_SIZE} B), {large} (larger)"),
        };
        format!(
            "iterations: {}; warm-up: {}",
            part(self.iterations, ITERATIONS_SMALL, ITERATIONS_LARGE),
            part(self.warmup, WARMUP_SMALL, WARMUP_LARGE)
        )
    }
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Print the usage text and exit successfully.
    Help,
    /// An MPI benchmark between ranks 0 and 1 of a 2-rank job.
    Mpi(Benchmark, Options),
    /// The raw TCP baseline: this process and a child it starts.
    RawTcp(Benchmark, Options),
    /// The child of the raw TCP baseline (internal): connects to the
    /// parent's port on 127.0.0.1 and proves it is the child with `token`.
    RawTcpPeer {
        /// The benchmark the parent runs.
        benchmark: Benchmark,
        /// The parent's options.
        options: Options,
        /// The parent's listening port on 127.0.0.1.
        port: u16,
        /// The token the parent gave the child, sent first on connecting.
        token: u64,
    },
}

/// The hidden subcommand the raw TCP benchmark starts its child with.
pub const RAW_TCP_PEER: &str = "__raw-tcp-peer";

/// A bad command line, with a message for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage_error<T>(message: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(message.into()))
}

/// The usage text.
pub const USAGE: &str = "\
usage: oxrun -n 2 oxbench latency|bw [OPTIONS]
       oxbench raw-tcp latency|bw [OPTIONS]

benchmarks:
  latency          ping-pong one-way latency in us (as OSU's osu_latency)
  bw               bandwidth in MB/s (1 MB = 1e6 bytes) of windows of 64
                   immediate sends, each window acknowledged (as osu_bw)
  raw-tcp BENCH    the same pattern between this process and a child over a
                   plain loopback TCP socket (127.0.0.1, TCP_NODELAY, both
                   sides busy-polling non-blocking sockets): the floor

options:
  --min-size N     smallest message size (default 0 for latency, 1 for bw
                   and raw-tcp)
  --max-size N     largest message size (default 4M, at most 64M)
  --size N         measure only this size
  --iterations N   timed iterations per size (default 10000, 1000 above 8K)
  --warmup N       untimed warm-up iterations per size (default 100, 10
                   above 8K)
  --json           print one JSON object instead of the table
  -h, --help       print this text

Sizes are bytes, with an optional binary suffix: 64K = 65536, 4M = 4194304.
Sizes double from the smallest to the largest.";

/// Parses a size: decimal bytes with an optional `K`/`KiB`/`M`/`MiB`/`G`/
/// `GiB` suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, UsageError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    let shift = match suffix {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "m" | "MiB" => 20,
        "G" | "g" | "GiB" => 30,
        _ => return usage_error(format!("{text:?} is not a size (bytes, or with K, M or G)")),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| UsageError(format!("{text:?} is not a size (bytes, or with K, M or G)")))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| UsageError(format!("size {text:?} is too large")))
}

fn parse_count(option: &str, text: &str) -> Result<usize, UsageError> {
    text.parse()
        .map_err(|_| UsageError(format!("{option} takes a whole number, not {text:?}")))
}

/// Parses the arguments after the program name.
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Command, UsageError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    if args.iter().any(|a| *a == "-h" || *a == "--help") {
        return Ok(Command::Help);
    }
    let Some((&first, rest)) = args.split_first() else {
        return usage_error("no benchmark given");
    };
    let benchmark_at = |rest: &[&str]| -> Result<Benchmark, UsageError> {
        match rest.first() {
            None => usage_error(format!("{first} needs a benchmark: latency or bw")),
            Some(word) => Benchmark::parse(word).ok_or_else(|| {
                UsageError(format!(
                    "unknown benchmark {word:?}: expected latency or bw"
                ))
            }),
        }
    };
    match first {
        "raw-tcp" => {
            let benchmark = benchmark_at(rest)?;
            let options = parse_options(benchmark, 1, &rest[1..])?;
            Ok(Command::RawTcp(benchmark, options))
        }
        RAW_TCP_PEER => {
            let benchmark = benchmark_at(rest)?;
            let [port, token, options @ ..] = &rest[1..] else {
                return usage_error(format!("{RAW_TCP_PEER} needs a port and a token"));
            };
            let port = port
                .parse()
                .map_err(|_| UsageError(format!("bad port {port:?}")))?;
            let token = token
                .parse()
                .map_err(|_| UsageError(format!("bad token {token:?}")))?;
            let options = parse_options(benchmark, 1, options)?;
            Ok(Command::RawTcpPeer {
                benchmark,
                options,
                port,
                token,
            })
        }
        word => match Benchmark::parse(word) {
            Some(benchmark) => {
                let options = parse_options(benchmark, benchmark.default_min_size(), rest)?;
                Ok(Command::Mpi(benchmark, options))
            }
            None => usage_error(format!(
                "unknown benchmark {word:?}: expected latency, bw or raw-tcp"
            )),
        },
    }
}

/// Parses options. `default_min` is the default smallest size, and also
/// the least one allowed: 0 for MPI latency, 1 for everything else.
fn parse_options(
    benchmark: Benchmark,
    default_min: usize,
    args: &[&str],
) -> Result<Options, UsageError> {
    let mut min_size = None;
    let mut max_size = None;
    let mut size = None;
    let mut iterations = None;
    let mut warmup = None;
    let mut json = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        i += 1;
        // `--name=value` or `--name value`.
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg, None),
        };
        let mut value = |name: &str| -> Result<&str, UsageError> {
            if let Some(v) = inline {
                return Ok(v);
            }
            let v = args
                .get(i)
                .copied()
                .ok_or_else(|| UsageError(format!("{name} needs a value")))?;
            i += 1;
            Ok(v)
        };
        match name {
            "--min-size" => min_size = Some(parse_size(value(name)?)?),
            "--max-size" => max_size = Some(parse_size(value(name)?)?),
            "--size" => size = Some(parse_size(value(name)?)?),
            "--iterations" => {
                let n = parse_count(name, value(name)?)?;
                if n == 0 {
                    return usage_error("--iterations must be at least 1");
                }
                iterations = Some(n);
            }
            "--warmup" => warmup = Some(parse_count(name, value(name)?)?),
            "--json" if inline.is_none() => json = true,
            _ => return usage_error(format!("unknown option {arg:?}")),
        }
    }
    let (min_size, max_size) = match size {
        Some(s) => {
            if min_size.is_some() || max_size.is_some() {
                return usage_error("--size cannot be combined with --min-size or --max-size");
            }
            (s, s)
        }
        None => (
            min_size.unwrap_or(default_min),
            max_size.unwrap_or(DEFAULT_MAX_SIZE),
        ),
    };
    if max_size > SIZE_LIMIT {
        return usage_error(format!(
            "message size {max_size} is larger than the limit of {SIZE_LIMIT} bytes"
        ));
    }
    if min_size > max_size {
        return usage_error(format!(
            "the smallest size ({min_size}) is larger than the largest ({max_size})"
        ));
    }
    let least = if default_min == 0 { 0 } else { 1 };
    if min_size < least {
        let what = if benchmark == Benchmark::Bandwidth {
            "bandwidth needs messages of at least 1 byte"
        } else {
            "raw TCP carries no zero-byte messages: sizes start at 1"
        };
        return usage_error(what);
    }
    Ok(Options {
        min_size,
        max_size,
        iterations,
        warmup,
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(min: usize, max: usize) -> Options {
        Options {
            min_size: min,
            max_size: max,
            iterations: None,
            warmup: None,
            json: false,
        }
    }

    #[test]
    fn defaults_follow_osu() {
        let Ok(Command::Mpi(Benchmark::Latency, o)) = parse(&["latency"]) else {
            panic!("latency did not parse");
        };
        assert_eq!(o, opts(0, 4 << 20));
        let sizes = o.sizes();
        assert_eq!(sizes.len(), 24);
        assert_eq!(&sizes[..4], &[0, 1, 2, 4]);
        assert_eq!(sizes.last(), Some(&(4 << 20)));
        assert_eq!((o.iterations_for(8192), o.warmup_for(8192)), (10_000, 100));
        assert_eq!((o.iterations_for(8193), o.warmup_for(16384)), (1_000, 10));

        let Ok(Command::Mpi(Benchmark::Bandwidth, o)) = parse(&["bw"]) else {
            panic!("bw did not parse");
        };
        assert_eq!(o.sizes()[0], 1);
        assert_eq!(o.sizes().len(), 23);

        let Ok(Command::RawTcp(Benchmark::Latency, o)) = parse(&["raw-tcp", "latency"]) else {
            panic!("raw-tcp latency did not parse");
        };
        assert_eq!(o.sizes()[0], 1);
    }

    #[test]
    fn options_parse_in_both_forms() {
        let c = parse(&[
            "latency",
            "--max-size",
            "1K",
            "--iterations=50",
            "--warmup",
            "5",
            "--json",
            "--min-size=2",
        ])
        .unwrap();
        let expected = Options {
            min_size: 2,
            max_size: 1024,
            iterations: Some(50),
            warmup: Some(5),
            json: true,
        };
        assert_eq!(c, Command::Mpi(Benchmark::Latency, expected.clone()));
        assert_eq!(expected.iterations_for(1 << 20), 50);
        assert_eq!(expected.warmup_for(1 << 20), 5);
        assert_eq!(
            expected.sizes(),
            vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        );
        let c = parse(&["raw-tcp", "bw", "--size", "64K"]).unwrap();
        assert_eq!(c, Command::RawTcp(Benchmark::Bandwidth, opts(65536, 65536)));
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in ["", "K", "-1", "1.5M", "4 M", "4T", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        let bad: &[&[&str]] = &[
            &[],
            &["lat"],
            &["raw-tcp"],
            &["raw-tcp", "put"],
            &["latency", "--max-size"],
            &["latency", "--iterations", "0"],
            &["latency", "--iterations", "ten"],
            &["latency", "--warmup", "-1"],
            &["latency", "--min-size", "64", "--max-size", "8"],
            &["latency", "--max-size", "65M"],
            &["latency", "--size", "8", "--max-size", "8"],
            &["latency", "--verbose"],
            &["latency", "--json=yes"],
            &["bw", "--min-size", "0"],
            &["raw-tcp", "latency", "--size", "0"],
            &[RAW_TCP_PEER, "latency", "7"],
        ];
        for args in bad {
            assert!(parse(args).is_err(), "{args:?} parsed: {:?}", parse(args));
        }
        assert_eq!(parse(&["bw", "--help"]), Ok(Command::Help));
        assert_eq!(parse(&["-h"]), Ok(Command::Help));
    }

    #[test]
    fn peer_options_round_trip() {
        let options = Options {
            min_size: 8,
            max_size: 4 << 20,
            iterations: Some(3),
            warmup: Some(0),
            json: true,
        };
        let mut args = vec![
            RAW_TCP_PEER.to_owned(),
            "bw".to_owned(),
            "4242".to_owned(),
            "99".to_owned(),
        ];
        args.extend(options.to_args());
        assert_eq!(
            parse(&args),
            Ok(Command::RawTcpPeer {
                benchmark: Benchmark::Bandwidth,
                options,
                port: 4242,
                token: 99,
            })
        );
    }
}
