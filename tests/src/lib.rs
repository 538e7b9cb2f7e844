//! The harness for oxmpi's multi-process tests: it starts real jobs
//! through `oxrun` (or MPICH's `mpiexec`), bounds each in time, and reaps
//! everything a job started, also when the test fails.
//!
//! The programs the jobs run are this crate's binaries (`p2p_suite`) and
//! the examples of the `oxmpi` crate; `cargo test --workspace` builds all
//! of them next to `oxrun`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The directory that holds the workspace's binaries for this build.
fn bin_dir(any_bin: &str) -> PathBuf {
    Path::new(any_bin)
        .parent()
        .expect("a binary path has a parent")
        .to_path_buf()
}

/// Paths of the binaries a job test needs, given the path of one of this
/// crate's binaries (`env!("CARGO_BIN_EXE_p2p_suite")`).
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Locates the binaries next to `any_bin`.
    pub fn new(any_bin: &str) -> Binaries {
        Binaries {
            dir: bin_dir(any_bin),
        }
    }

    /// The launcher.
    pub fn oxrun(&self) -> PathBuf {
        self.existing(self.dir.join("oxrun"))
    }

    /// One of the workspace's examples.
    pub fn example(&self, name: &str) -> PathBuf {
        self.existing(self.dir.join("examples").join(name))
    }

    /// One of this crate's binaries.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.existing(self.dir.join(name))
    }

    fn existing(&self, path: PathBuf) -> PathBuf {
        assert!(
            path.exists(),
            "{} is missing: run the tests with `cargo test --workspace` so every binary is built",
            path.display()
        );
        path
    }
}

/// What a finished job left.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status of the launcher.
    pub status: ExitStatus,
    /// Everything it wrote to standard output.
    pub stdout: String,
    /// Everything it wrote to standard error.
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
}

impl Outcome {
    /// Panics, showing the job's output, unless it exited with 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "job failed with {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A job started in its own process group, killed with everything in it if
/// it outlives its bound or the test panics.
pub struct Job {
    child: Child,
    readers: Vec<JoinHandle<String>>,
    started: Instant,
    bound: Duration,
    what: String,
}

impl Job {
    /// Starts `command` (typically `oxrun ...`) with a time bound.
    pub fn start(mut command: Command, bound: Duration) -> Job {
        let what = format!("{command:?}");
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let readers = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|mut pipe| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                String::from_utf8_lossy(&bytes).into_owned()
            })
        })
        .collect();
        Job {
            child,
            readers,
            started: Instant::now(),
            bound,
            what,
        }
    }

    /// Process id of the launcher.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits for the job to end within its bound; panics (after killing
    /// it) with its output if it does not.
    pub fn finish(mut self) -> Outcome {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let mut output = std::mem::take(&mut self.readers)
                        .into_iter()
                        .map(|r| r.join().unwrap_or_default());
                    return Outcome {
                        status,
                        stdout: output.next().unwrap_or_default(),
                        stderr: output.next().unwrap_or_default(),
                        elapsed: self.started.elapsed(),
                    };
                }
                Ok(None) if self.started.elapsed() > self.bound => {
                    self.kill();
                    let output: Vec<String> = std::mem::take(&mut self.readers)
                        .into_iter()
                        .map(|r| r.join().unwrap_or_default())
                        .collect();
                    panic!(
                        "job exceeded its bound of {:?} and was killed: {}\n--- output\n{}",
                        self.bound,
                        self.what,
                        output.join("\n--- stderr\n")
                    );
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("waiting for {}: {e}", self.what),
            }
        }
    }

    fn kill(&mut self) {
        // The ranks die with the launcher (it sets a parent-death signal),
        // and the launcher with its process group.
        for pid in descendants(self.child.id()) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // SAFETY: as above; the group id is the launcher's pid.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Runs `command` to completion within `bound`.
pub fn run(command: Command, bound: Duration) -> Outcome {
    Job::start(command, bound).finish()
}

/// Process ids of every descendant of `pid`, found through /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = std::collections::HashMap::<u32, Vec<u32>>::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = parent_of(child) {
                parents.entry(ppid).or_default().push(child);
            }
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in parents.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            found.push(c);
            todo.push(c);
        }
    }
    found
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(1)?.parse().ok()
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
    let mut inodes = std::collections::HashSet::new();
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

/// Names of files in /dev/shm that look like oxmpi's, to check nothing leaks.
pub fn shm_leftovers() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("oxmpi"))
                .collect()
        })
        .unwrap_or_default()
}
