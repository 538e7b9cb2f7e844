//! The harness for oxmpi's multi-process tests: it starts real jobs
//! through `oxrun` (or MPICH's `mpiexec`, or any other program), bounds
//! each in time, and reaps everything a job started, also when the test
//! fails.
//!
//! A [`Job`] runs in its own process group. Its output arrives line by
//! line while it runs (a test can wait for the first line of standard
//! output with [`Job::wait_for_stdout`]). When it ends, [`Job::finish`]
//! also checks, within the same bound, that its output closes and that no
//! live process is left in its process group: something left behind fails
//! the test, naming what was left. Past its bound, on a failed check, or
//! when dropped unfinished, a job is killed with its process group and its
//! descendants.
//!
//! The programs the jobs run are this crate's binaries (`p2p_suite`) and
//! the examples of the `oxmpi` crate; `cargo test --workspace` builds all
//! of them next to `oxrun`.
//!
//! [`checks`] holds the result checks those programs share,
//! [`program`] the frame around a check that each of them runs in, and
//! [`privilege`] what tests that need root do where they are not.

pub mod affine;
pub mod checks;
pub mod privilege;
pub mod program;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Environment variable every job is started with: the id of the process
/// that started it, so that what outlives a job can be found
/// ([`shm_leftovers`]).
pub const HARNESS_ENV: &str = "OXMPI_TEST_HARNESS";

/// How often a job is checked on while nothing else wakes the harness.
const POLL: Duration = Duration::from_millis(10);

/// How long a failing job's output is still taken in after it is killed.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Paths of the workspace's binaries for this build, found next to one of
/// them (`env!("CARGO_BIN_EXE_p2p_suite")`, `env!("CARGO_BIN_EXE_oxbench")`).
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Locates the binaries next to `any_bin`.
    pub fn new(any_bin: &str) -> Binaries {
        Binaries {
            dir: Path::new(any_bin)
                .parent()
                .expect("a binary path has a parent")
                .to_path_buf(),
        }
    }

    /// The launcher.
    pub fn oxrun(&self) -> PathBuf {
        self.bin("oxrun")
    }

    /// One of the workspace's examples.
    pub fn example(&self, name: &str) -> PathBuf {
        self.existing(self.dir.join("examples").join(name))
    }

    /// One of the workspace's binaries.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.existing(self.dir.join(name))
    }

    /// `oxrun -n ranks <program> <check>` with `env` set: one check of a
    /// test program as a job.
    pub fn check(&self, program: &str, check: &str, ranks: usize, env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(self.oxrun());
        c.arg("-n")
            .arg(ranks.to_string())
            .arg(self.bin(program))
            .arg(check)
            .envs(env.iter().copied());
        c
    }

    fn existing(&self, path: PathBuf) -> PathBuf {
        assert!(
            path.exists(),
            "{} is missing: run the tests with `cargo test --workspace` so every binary \
             is built into the same target directory",
            path.display()
        );
        path
    }
}

/// What a finished job left.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status of the job's first process (the launcher).
    pub status: ExitStatus,
    /// Everything the job wrote to standard output.
    pub stdout: String,
    /// Everything the job wrote to standard error.
    pub stderr: String,
    /// How long it ran, until its first process exited.
    pub elapsed: Duration,
}

impl Outcome {
    /// Panics, showing the job's output, unless it exited with 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "job failed with {}\n{}",
            self.status,
            transcript(&self.stdout, &self.stderr)
        );
        self
    }
}

/// A job's output, as failure messages show it.
fn transcript(stdout: &str, stderr: &str) -> String {
    let gap = if stdout.is_empty() || stdout.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    format!("--- stdout\n{stdout}{gap}--- stderr\n{stderr}")
}

/// What a reader thread passes on from one of a job's output streams.
enum Piece {
    /// A line of standard output, with its newline if it had one.
    Stdout(String),
    /// A line of standard error, with its newline if it had one.
    Stderr(String),
    /// The end of one of the streams.
    Closed,
}

/// Passes on what `pipe` carries, line by line, until it closes (or the
/// job is gone and nobody listens).
fn forward(pipe: impl Read, pieces: Sender<Piece>, piece: fn(String) -> Piece) {
    let mut pipe = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match pipe.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line).into_owned();
                if pieces.send(piece(text)).is_err() {
                    return;
                }
            }
        }
    }
    let _ = pieces.send(Piece::Closed);
}

/// Why a job failed: what it was, what went wrong, and everything it had
/// written by then.
#[derive(Debug)]
pub struct JobFailure {
    /// The job, as it was named (by default its command line).
    pub what: String,
    /// What went wrong, e.g. "exceeded its bound of 30s and was killed".
    pub why: String,
    /// Everything the job wrote to standard output.
    pub stdout: String,
    /// Everything the job wrote to standard error.
    pub stderr: String,
}

impl JobFailure {
    /// The failure in one line, followed by at most the last `lines`
    /// non-blank lines of the job's standard error (or, if it wrote no
    /// errors, of its standard output), indented: for a report that
    /// should stay short.
    pub fn summary(&self, lines: usize) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let written: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut s = format!("{} {}", self.what, self.why);
        if !written.is_empty() {
            s.push(':');
            for line in &written[written.len().saturating_sub(lines)..] {
                s.push_str("\n    ");
                s.push_str(line);
            }
        }
        s
    }
}

impl std::fmt::Display for JobFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}\n{}",
            self.what,
            self.why,
            transcript(&self.stdout, &self.stderr)
        )
    }
}

impl std::error::Error for JobFailure {}

/// A job started in its own process group, bounded in time: killed with
/// everything in its group and everything it started if it outlives its
/// bound, fails a check, or is dropped unfinished (the test panicked).
///
/// The `try_` methods report a failure as a [`JobFailure`] (for programs
/// that supervise jobs, like `oxbench`); the others panic with it (for
/// tests).
pub struct Job {
    child: Child,
    what: String,
    /// When the job must have ended.
    deadline: Instant,
    started: Instant,
    pieces: Receiver<Piece>,
    /// Output streams not yet closed.
    open: usize,
    stdout: String,
    stderr: String,
    /// Lines of standard output not yet handed out by
    /// [`Job::try_wait_for_line`].
    unread: VecDeque<String>,
    /// Whether the first process has been waited for.
    reaped: bool,
}

impl Job {
    /// Starts `command` (typically `oxrun ...`) in a process group of its
    /// own; it has `bound` from now to end (see [`Job::try_finish`]). It
    /// is named by its command line in failures.
    pub fn spawn(mut command: Command, bound: Duration) -> Result<Job, JobFailure> {
        let what = format!("{command:?}");
        command
            .env(HARNESS_ENV, std::process::id().to_string())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| JobFailure {
            what: what.clone(),
            why: format!("cannot be started: {e}"),
            stdout: String::new(),
            stderr: String::new(),
        })?;
        let started = Instant::now();
        let (tx, pieces) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let tx_err = tx.clone();
        std::thread::spawn(move || forward(stdout, tx, Piece::Stdout));
        std::thread::spawn(move || forward(stderr, tx_err, Piece::Stderr));
        Ok(Job {
            child,
            what,
            deadline: started + bound,
            started,
            pieces,
            open: 2,
            stdout: String::new(),
            stderr: String::new(),
            unread: VecDeque::new(),
            reaped: false,
        })
    }

    /// [`Job::spawn`], panicking if the command cannot be started.
    pub fn start(command: Command, bound: Duration) -> Job {
        Job::spawn(command, bound).unwrap_or_else(|f| panic!("{f}"))
    }

    /// Names the job in failures (instead of its command line).
    pub fn named(mut self, what: impl Into<String>) -> Job {
        self.what = what.into();
        self
    }

    /// Gives the job `bound` from now to end, instead of what was left.
    pub fn set_bound(&mut self, bound: Duration) {
        self.deadline = Instant::now() + bound;
    }

    /// Process id of the job's first process (the launcher), which is
    /// also its process group's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits up to `bound` (and never past the job's own bound) for the
    /// next line of standard output, among those not yet handed out, for
    /// which `wanted` holds; lines passed over are handed out too. Returns
    /// the line without its newline. If none comes in time, or the job
    /// closes its output first, the job is killed and the failure
    /// returned.
    pub fn try_wait_for_line(
        &mut self,
        bound: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<String, JobFailure> {
        let asked = Instant::now() + bound;
        let until = self.deadline.min(asked);
        loop {
            while let Some(line) = self.unread.pop_front() {
                let line = line.trim_end_matches(['\n', '\r']).to_owned();
                if wanted(&line) {
                    return Ok(line);
                }
            }
            if self.open == 0 {
                return Err(self.fail("closed its output before the expected line"));
            }
            if !self.receive(until) && Instant::now() >= until {
                let why = if until < asked {
                    "reached the end of its bound without writing the expected line".to_owned()
                } else {
                    format!("wrote no expected line within {bound:.1?}")
                };
                return Err(self.fail(&why));
            }
        }
    }

    /// Waits up to `bound` for the job's first line of standard output;
    /// kills the job and panics, showing its output, if none comes.
    pub fn wait_for_stdout(&mut self, bound: Duration) {
        if let Err(f) = self.try_wait_for_line(bound, |_| true) {
            panic!("{f}");
        }
    }

    /// Waits for the job to end within its bound: its first process
    /// exits, its output closes (nothing it started still holds it), and
    /// no live process is left in its process group. Past the bound, it
    /// kills the job and returns the failure, with its output and what
    /// was left. An exit with a failure status is not a failure here: it
    /// is in the [`Outcome`].
    pub fn try_finish(mut self) -> Result<Outcome, JobFailure> {
        let deadline = self.deadline;
        let bound = deadline.saturating_duration_since(self.started);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    return Err(
                        self.fail(&format!("exceeded its bound of {bound:.1?} and was killed"))
                    )
                }
                Ok(None) => {
                    self.receive(deadline.min(Instant::now() + POLL));
                }
                Err(e) => return Err(self.fail(&format!("cannot be waited for: {e}"))),
            }
        };
        self.reaped = true;
        let elapsed = self.started.elapsed();
        while self.open > 0 {
            if !self.receive(deadline) && Instant::now() >= deadline {
                return Err(self.fail(&format!(
                    "exited with {status}, but something it started still held its output \
                     open at the end of its bound of {bound:.1?}"
                )));
            }
        }
        loop {
            let left = live_processes_in_group(self.pid());
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(self.fail(&format!(
                    "exited with {status}, but left processes alive in its group at the end \
                     of its bound of {bound:.1?}: {left:?}"
                )));
            }
            std::thread::sleep(POLL);
        }
        Ok(Outcome {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
            elapsed,
        })
    }

    /// [`Job::try_finish`], panicking with the failure.
    pub fn finish(self) -> Outcome {
        self.try_finish().unwrap_or_else(|f| panic!("{f}"))
    }

    /// Takes in one piece of output, waiting for it until `until` at
    /// most (sleeping until then if the output is closed); false if none
    /// came.
    fn receive(&mut self, until: Instant) -> bool {
        let wait = until.saturating_duration_since(Instant::now());
        if self.open == 0 {
            std::thread::sleep(wait);
            return false;
        }
        match self.pieces.recv_timeout(wait) {
            Ok(Piece::Stdout(line)) => {
                self.stdout.push_str(&line);
                self.unread.push_back(line);
            }
            Ok(Piece::Stderr(line)) => self.stderr.push_str(&line),
            Ok(Piece::Closed) => self.open -= 1,
            Err(RecvTimeoutError::Timeout) => return false,
            Err(RecvTimeoutError::Disconnected) => {
                self.open = 0;
                return false;
            }
        }
        true
    }

    /// Kills the job, takes in what it wrote last, and returns the
    /// failure with it.
    fn fail(&mut self, why: &str) -> JobFailure {
        self.kill();
        let until = Instant::now() + LAST_WORDS;
        while self.open > 0 && Instant::now() < until && self.receive(until) {}
        JobFailure {
            what: self.what.clone(),
            why: why.to_owned(),
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
        }
    }

    /// Kills the first process's descendants (found while it is not yet
    /// reaped: its orphans would be re-parented), which may have left its
    /// process group, and everything in the group; then reaps it.
    fn kill(&mut self) {
        if !self.reaped {
            for pid in descendants(self.pid()) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        // SAFETY: kill has no memory-safety preconditions. The group is
        // the one this job created: its leader is not reaped yet, or its
        // remaining members keep its id from being reused.
        unsafe { libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL) };
        if !self.reaped {
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
        }
    }
}

/// Runs `command` to completion within `bound`: [`Job::start`], then
/// [`Job::finish`].
pub fn run(command: Command, bound: Duration) -> Outcome {
    Job::start(command, bound).finish()
}

/// What /proc/PID/stat says about a process.
struct Stat {
    pid: u32,
    /// `PID (COMMAND)`, to name the process in messages.
    name: String,
    state: char,
    ppid: u32,
    pgrp: u32,
}

impl Stat {
    /// Reads the stat line of `pid`, if it exists.
    fn of(pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // PID (COMMAND) STATE PPID PGRP ...: the command may hold spaces
        // and parentheses.
        let close = text.rfind(')')?;
        let mut fields = text[close + 1..].split_whitespace();
        Some(Stat {
            pid,
            name: text[..=close].to_owned(),
            state: fields.next()?.chars().next()?,
            ppid: fields.next()?.parse().ok()?,
            pgrp: fields.next()?.parse().ok()?,
        })
    }

    /// Whether the process runs: not a zombie (which only waits to be
    /// reaped) nor dead.
    fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Every process on the machine, from /proc.
fn processes() -> impl Iterator<Item = Stat> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter_map(Stat::of)
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    Stat::of(pid).is_some_and(|s| s.alive())
}

/// Live processes of process group `group`, each as `PID (COMMAND)`.
fn live_processes_in_group(group: u32) -> Vec<String> {
    processes()
        .filter(|s| s.pgrp == group && s.alive())
        .map(|s| s.name)
        .collect()
}

/// Process ids of every descendant of `pid`, found through /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut children = HashMap::<u32, Vec<u32>>::new();
    for s in processes() {
        children.entry(s.ppid).or_default().push(s.pid);
    }
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            found.push(c);
            todo.push(c);
        }
    }
    found
}

/// The rank (`PMI_RANK`) a process was started as, read from its
/// environment.
pub fn rank_of(pid: u32) -> Option<usize> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"PMI_RANK="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

/// TCP ports on which `pid` listens, from /proc (socket inodes of its open
/// files matched against the kernel's table of listening sockets).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, state 0A is LISTEN, inode is field 9.
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            (*state == "0A" && inodes.contains(*inode))
                .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect()
}

/// What outlived this process's finished jobs, to check nothing leaks:
/// each live process that one of its jobs started ([`HARNESS_ENV`] names
/// this process in its environment) and that is no longer among its
/// descendants (so it belongs to no job still running: it escaped its
/// job, which has ended), as `PID (COMMAND)` and the oxmpi shared memory
/// it still maps (`/memfd:oxmpi-...`), if any. oxmpi's shared memory is
/// only ever in memory files without a name, which last exactly as long
/// as a process maps them: nothing else of it can be left. A process
/// must stay outside for `LEFTOVER_GRACE` (2 s) to count: one killed with
/// its job a moment ago may still be on its way out.
pub fn shm_leftovers() -> Vec<String> {
    let deadline = Instant::now() + LEFTOVER_GRACE;
    loop {
        let left = escaped_processes();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long [`shm_leftovers`] waits for escaped processes to go.
const LEFTOVER_GRACE: Duration = Duration::from_secs(2);

/// One look for [`shm_leftovers`]. The processes are listed before this
/// process's descendants are: a job that another test starts meanwhile
/// (tests of one binary run at once) is then among the descendants, not
/// taken for a process that escaped.
fn escaped_processes() -> Vec<String> {
    let me = std::process::id();
    let ours = format!("{HARNESS_ENV}={me}");
    let listed: Vec<Stat> = processes().collect();
    let running: HashSet<u32> = descendants(me).into_iter().collect();
    listed
        .into_iter()
        .filter(|s| s.alive() && !running.contains(&s.pid))
        .filter(|s| {
            std::fs::read(format!("/proc/{}/environ", s.pid))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == ours.as_bytes()))
        })
        .map(|s| {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", s.pid)).unwrap_or_default();
            let memory: HashSet<&str> = maps
                .lines()
                .filter_map(|line| line.split_whitespace().nth(5))
                .filter(|path| path.starts_with("/memfd:oxmpi"))
                .collect();
            format!("{} mapping {memory:?}", s.name)
        })
        .collect()
}

/// One line of `OXMPI_VERBOSE=1` output saying which transport a rank
/// bound a VC to: `[RANK] ... VC to rank PEER bound to METHOD (CARD)`, as
/// oxrun forwards it with `--tag-output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcBinding {
    /// The rank that bound the VC.
    pub rank: usize,
    /// The peer at its other end.
    pub peer: usize,
    /// The transport: `shm`, `tcp`, ...
    pub method: String,
    /// The peer's business card for that transport.
    pub card: String,
}

/// The VC bindings a job with `--tag-output` and `OXMPI_VERBOSE=1` logged
/// on its standard error. A rank logs the VCs it binds by sending first;
/// one bound by a packet that arrived first is not logged, so of two ranks
/// that talked at least one end is. Panics on a binding line it cannot
/// read.
pub fn vc_bindings(stderr: &str) -> Vec<VcBinding> {
    stderr
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(": VC to rank ")?;
            let parse = || -> Option<VcBinding> {
                let rank = line.strip_prefix('[')?.split_once(']')?.0.parse().ok()?;
                let (peer, rest) = rest.split_once(" bound to ")?;
                let (method, card) = rest.split_once(' ')?;
                Some(VcBinding {
                    rank,
                    peer: peer.parse().ok()?,
                    method: method.to_owned(),
                    card: card.strip_prefix('(')?.strip_suffix(')')?.to_owned(),
                })
            };
            Some(parse().unwrap_or_else(|| panic!("unreadable VC binding line {line:?}")))
        })
        .collect()
}
