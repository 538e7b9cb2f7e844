//! oxrun's command line: options for the whole job, then one part or
//! several separated by `:` (MPMD, as mpiexec has), each with its own
//! number of ranks, environment and program.
//!
//! This module only reads the command line; it must not start anything.

use crate::placement::{BindTo, MapBy, Request};

/// The help text.
pub const USAGE: &str = "usage: oxrun [job options] -n N [part options] program [args...]
       oxrun [job options] -n N1 [part options] prog1 [args...] : -n N2 [part options] prog2 [args...] ...

Starts the ranks of one job on this machine and serves them PMI-1. With
parts separated by ':', ranks are numbered across the parts in order (the
first part's N1 ranks are 0..N1-1, and so on) and each rank's PMI appnum is
its part's index (0, 1, ...).

part options (in each part, for that part only):
  -n, -np N          number of ranks of the part (required)
  -x NAME[=VALUE]    set NAME in the part's ranks' environment (without a
                     value: pass oxrun's own value), over any value oxrun
                     sets itself; may be repeated

job options (before the first part's program):
  --tag-output       prefix each output line with [rank]
  --bind-to WHAT     bind each rank to a core, a NUMA node, or nothing:
                     core|numa|none (default: core when the job has no more
                     ranks than the machine has cores, else none)
  --map-by HOW       spread ranks over core (consecutive ranks on
                     consecutive cores, the default) or numa (round-robin
                     over NUMA nodes)
  --report-bindings  print each rank's binding to standard error
  -h, --help         this help

Each rank gets PMI_FD, PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS,
MPI_LOCALRANKID and OXMPI_JOB_SECRET (a fresh 32-byte secret per job); a
bound rank also gets OXMPI_CPUSET and OXMPI_NUMA_NODES.";

/// One part of the job: ranks that run the same program.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    /// Number of ranks.
    pub ranks: usize,
    /// Variables set in these ranks' environment (`-x`).
    pub env: Vec<(String, String)>,
    /// The program and its arguments.
    pub program: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub struct Options {
    /// Prefix output lines with the rank.
    pub tag_output: bool,
    /// Where ranks run.
    pub placement: Request,
    /// The job's parts, in rank order; never empty.
    pub parts: Vec<Part>,
}

/// What oxrun is asked to do.
#[derive(Debug)]
pub enum Command {
    /// Run a job.
    Run(Options),
    /// Print the usage.
    Help,
}

/// Reads oxrun's arguments (without the program name). A bad command line
/// is an error that says what is wrong.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut options = Options {
        tag_output: false,
        placement: Request::default(),
        parts: Vec::new(),
    };
    let segments: Vec<&[String]> = args.split(|a| a == ":").collect();
    let last = segments.len() - 1;
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() && last > 0 {
            return Err(if index == last {
                "':' ends the command line: a part (-n N program) must follow it".to_owned()
            } else {
                format!(
                    "part {} of the command line is empty: give -n N and a program between \
                     the ':'s",
                    index + 1
                )
            });
        }
        // Job options are read in the first part only.
        let job = (index == 0).then_some(&mut options);
        match parse_part(segment, job) {
            Ok(Some(part)) => options.parts.push(part),
            Ok(None) => return Ok(Command::Help),
            // The single-part form keeps its messages short.
            Err(e) if last == 0 => return Err(e),
            Err(e) => return Err(format!("part {} of the command line: {e}", index + 1)),
        }
    }
    Ok(Command::Run(options))
}

/// Reads one part: its options, then its program. `job` is where job
/// options go, in the first part; elsewhere they are an error. `None` when
/// help is asked for.
fn parse_part(args: &[String], mut job: Option<&mut Options>) -> Result<Option<Part>, String> {
    let mut ranks = None;
    let mut env = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let value = || args.get(i + 1).ok_or(format!("{a} needs a value"));
        let takes_value = matches!(a, "-n" | "-np" | "--np" | "-x" | "--bind-to" | "--map-by");
        match a {
            "-n" | "-np" | "--np" => {
                let v = value()?;
                let n: usize = v.parse().map_err(|_| format!("-n {v:?} is not a number"))?;
                if n == 0 {
                    return Err("-n must be at least 1".into());
                }
                ranks = Some(n);
            }
            "-x" => env.push(env_setting(value()?)?),
            "-h" | "--help" => return Ok(None),
            "--tag-output" | "--bind-to" | "--map-by" | "--report-bindings" => {
                let Some(options) = job.as_deref_mut() else {
                    return Err(format!(
                        "{a} applies to the whole job: give it before the first part's program"
                    ));
                };
                let placement = &mut options.placement;
                match a {
                    "--tag-output" => options.tag_output = true,
                    "--report-bindings" => placement.report = true,
                    "--bind-to" => placement.bind_to = Some(BindTo::parse(value()?)?),
                    _ => placement.map_by = MapBy::parse(value()?)?,
                }
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => {
                let ranks = ranks.ok_or_else(|| format!("-n N is required before {a}"))?;
                return Ok(Some(Part {
                    ranks,
                    env,
                    program: args[i..].to_vec(),
                }));
            }
        }
        i += if takes_value { 2 } else { 1 };
    }
    Err("no program given".into())
}

/// The variable `-x` sets: `NAME=VALUE`, or `NAME` with oxrun's own value.
fn env_setting(v: &str) -> Result<(String, String), String> {
    match v.split_once('=') {
        Some((k, val)) if !k.is_empty() => Ok((k.to_owned(), val.to_owned())),
        Some(_) => Err(format!("-x {v:?} has no name")),
        None => std::env::var(v)
            .map(|val| (v.to_owned(), val))
            .map_err(|_| format!("-x {v}: {v} is not set in oxrun's environment")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn options(s: &str) -> Options {
        match parse(&args(s)) {
            Ok(Command::Run(o)) => o,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    fn error(s: &str) -> String {
        match parse(&args(s)) {
            Err(e) => e,
            Ok(c) => panic!("accepted {s:?} as {c:?}"),
        }
    }

    #[test]
    fn parses_the_usual_spellings() {
        let o = options("-np 3 --tag-output -x A=1 prog -n 5");
        assert!(o.tag_output);
        assert_eq!(
            o.parts,
            [Part {
                ranks: 3,
                env: vec![("A".to_owned(), "1".to_owned())],
                program: args("prog -n 5"),
            }]
        );
        assert_eq!(options("-n 2 hostname").parts[0].ranks, 2);
        assert!(matches!(parse(&args("-n 2 --help")), Ok(Command::Help)));
    }

    #[test]
    fn parts_have_their_own_ranks_and_environment() {
        let o = options("--tag-output -n 2 -x A=1 a x : -np 3 -x B=2 -x C=3 b y z : -n 1 c");
        assert!(o.tag_output);
        let summary: Vec<(usize, usize, &str)> = o
            .parts
            .iter()
            .map(|p| (p.ranks, p.env.len(), p.program[0].as_str()))
            .collect();
        assert_eq!(summary, [(2, 1, "a"), (3, 2, "b"), (1, 0, "c")]);
        assert_eq!(o.parts[1].program, args("b y z"));
        assert_eq!(o.parts[1].env[1], ("C".to_owned(), "3".to_owned()));
    }

    #[test]
    fn placement_options() {
        let o = options("--bind-to numa --map-by numa --report-bindings -n 2 a");
        assert_eq!(o.placement.bind_to, Some(BindTo::Numa));
        assert_eq!(o.placement.map_by, MapBy::Numa);
        assert!(o.placement.report);
        let o = options("-n 2 a");
        assert_eq!(o.placement, Request::default());
        assert_eq!(o.placement.bind_to, None);
        assert_eq!(o.placement.map_by, MapBy::Core);
        assert_eq!(
            options("--bind-to none -n 1 a").placement.bind_to,
            Some(BindTo::None)
        );
    }

    #[test]
    fn rejects_bad_command_lines() {
        for bad in [
            "",
            "prog",
            "-n",
            "-n x prog",
            "-n 0 prog",
            "-n 2",
            "--bogus -n 2 prog",
            "-n 2 -x =1 prog",
            "--bind-to socket -n 2 prog",
            "--bind-to",
            "--map-by slot -n 2 prog",
        ] {
            error(bad);
        }
    }

    #[test]
    fn rejects_bad_parts_saying_which() {
        assert!(error("-n 2 a :").contains("':' ends the command line"));
        assert!(error("-n 2 a : : -n 1 b").contains("part 2 of the command line is empty"));
        assert!(error(": -n 1 b").contains("part 1 of the command line is empty"));
        let e = error("-n 2 a : b");
        assert!(
            e.contains("part 2") && e.contains("-n N is required"),
            "{e}"
        );
        let e = error("-n 2 a : -n 1");
        assert!(e.contains("part 2") && e.contains("no program"), "{e}");
        let e = error("-n 1 a : --tag-output -n 1 b");
        assert!(e.contains("part 2") && e.contains("whole job"), "{e}");
        let e = error("-n 1 a : -n 1 --bind-to core b");
        assert!(e.contains("whole job"), "{e}");
    }
}
