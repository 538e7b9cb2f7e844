//! `oxrun`: starts an oxmpi job on this machine and serves PMI-1 to it.
//!
//! It owns process management for one host: starting the ranks (each in
//! its own process group, dying with oxrun), serving the PMI-1 wire protocol
//! over a socket each rank inherits (`PMI_FD`), forwarding output, and
//! ending the job when a rank fails. It must not know anything of MPI
//! beyond PMI: no transports, no packets.
//!
//! A rank fails when it exits non-zero, dies by a signal, calls abort, or
//! exits without finalizing after it initialized PMI. Then oxrun ends every
//! other rank (SIGTERM, then SIGKILL after a second), prints one line
//! naming the rank, its PID and what happened, and exits with the abort
//! code or the highest exit status (128 + signal for a signal), as hydra
//! does. Programs that never use PMI simply run.
//!
//! A job may have several parts (MPMD, `-n 2 a : -n 2 b`, see [`args`]):
//! ranks are numbered across them in order and each rank's PMI appnum is
//! its part's index. Before a rank's program starts, its process is bound
//! to the CPUs [`placement`] chose for it.

mod args;
mod placement;

use args::{Command as Parsed, Options, USAGE};
use oxmpi_adi::pmi::{Message, MAX_LINE};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the PMI server knows of one rank.
#[derive(Default)]
struct RankState {
    initialized: bool,
    finalized: bool,
    aborted: Option<i32>,
}

/// The job's key-value space and barrier, shared by the PMI threads.
struct Server {
    size: usize,
    /// Each rank's application number: the index of its part.
    appnums: Vec<usize>,
    kvsname: String,
    kvs: Mutex<HashMap<String, String>>,
    barrier: Mutex<(usize, u64)>,
    barrier_done: Condvar,
    ranks: Mutex<Vec<RankState>>,
    /// Tells the main thread that a rank called abort.
    events: Sender<Event>,
}

/// What oxrun's main thread waits for. It sleeps until one comes, so it
/// never wakes on a timer while a job runs: on a machine with as many
/// cores as ranks, every wake-up of oxrun takes a core from a rank.
enum Event {
    /// A rank's process ended (or could not be waited for).
    Exited {
        rank: usize,
        status: std::io::Result<ExitStatus>,
    },
    /// A rank called abort; its code is in the server's rank state.
    Aborted,
    /// oxrun itself got this signal (SIGINT or SIGTERM).
    Signal(i32),
}

/// How long ranks get between SIGTERM and SIGKILL when a job is ended.
const GRACE: Duration = Duration::from_secs(1);

/// How long an abort waits before it is named as the job's failure. A
/// rank whose peer died aborts moments later (MPI's default error
/// handler is fatal), often before the waiter of the dead rank has
/// reported its end: an end that comes within this time is the cause,
/// and is named instead.
const ABORT_SETTLE: Duration = Duration::from_millis(100);

impl Server {
    fn reply(&self, rank: usize, m: &Message) -> Option<Message> {
        let ok = |cmd: &str| Message::new(cmd, &[("rc", "0"), ("msg", "success")]);
        Some(match m.cmd.as_str() {
            "init" => {
                self.ranks.lock().unwrap()[rank].initialized = true;
                Message::new(
                    "response_to_init",
                    &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", "0")],
                )
            }
            "get_maxes" => Message::new(
                "maxes",
                &[
                    ("kvsname_max", "256"),
                    ("keylen_max", "64"),
                    ("vallen_max", &(MAX_LINE - 64).to_string()),
                ],
            ),
            "get_appnum" => Message::new("appnum", &[("appnum", &self.appnums[rank].to_string())]),
            "get_my_kvsname" => Message::new("my_kvsname", &[("kvsname", &self.kvsname)]),
            "get_universe_size" => {
                Message::new("universe_size", &[("size", &self.size.to_string())])
            }
            "put" => match (m.get("key"), m.get("value")) {
                (Some(k), Some(v)) => {
                    self.kvs.lock().unwrap().insert(k.to_owned(), v.to_owned());
                    ok("put_result")
                }
                _ => Message::new(
                    "put_result",
                    &[("rc", "-1"), ("msg", "key_or_value_missing")],
                ),
            },
            "get" => match m
                .get("key")
                .and_then(|k| self.kvs.lock().unwrap().get(k).cloned())
            {
                Some(v) => Message::new(
                    "get_result",
                    &[("rc", "0"), ("msg", "success"), ("value", &v)],
                ),
                None => Message::new("get_result", &[("rc", "-1"), ("msg", "key_not_found")]),
            },
            "barrier_in" => {
                let mut b = self.barrier.lock().unwrap();
                let generation = b.1;
                b.0 += 1;
                if b.0 == self.size {
                    *b = (0, generation + 1);
                    self.barrier_done.notify_all();
                } else {
                    while b.1 == generation {
                        b = self.barrier_done.wait(b).unwrap();
                    }
                }
                Message::new("barrier_out", &[])
            }
            "finalize" => {
                self.ranks.lock().unwrap()[rank].finalized = true;
                Message::new("finalize_ack", &[])
            }
            "abort" => {
                let code = m.get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1);
                self.ranks.lock().unwrap()[rank].aborted = Some(code);
                let _ = self.events.send(Event::Aborted);
                return None;
            }
            other => Message::new(other, &[("rc", "-1"), ("msg", "unknown_command")]),
        })
    }

    /// Serves one rank's PMI connection until it closes.
    fn serve(&self, rank: usize, stream: UnixStream) {
        let Ok(mut writer) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let reply = match Message::parse(&line) {
                Ok(m) => self.reply(rank, &m),
                Err(e) => {
                    eprintln!("oxrun: rank {rank} sent a bad PMI line: {e}");
                    Some(Message::new(
                        "error",
                        &[("rc", "-1"), ("msg", "malformed_line")],
                    ))
                }
            };
            if let Some(r) = reply {
                if writer.write_all(r.format().as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Copies `pipe` to `out` line by line, prefixed with `[rank] ` if asked.
fn forward(
    pipe: impl Read + Send + 'static,
    rank: usize,
    tag: bool,
    stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let mut text = Vec::with_capacity(line.len() + 8);
            if tag {
                text.extend_from_slice(format!("[{rank}] ").as_bytes());
            }
            text.extend_from_slice(&line);
            if !text.ends_with(b"\n") {
                text.push(b'\n');
            }
            // One write per line so lines of different ranks never mix.
            let _ = if stderr {
                std::io::stderr().lock().write_all(&text)
            } else {
                std::io::stdout().lock().write_all(&text)
            };
            line.clear();
        }
    })
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGINT => "SIGINT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// SIGINT and SIGTERM: the signals that end a job from outside.
fn ending_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it before
    // sigaddset adds valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks the ending signals in this thread (and so in every thread it
/// starts afterwards) and delivers them as events from a thread that
/// waits for them, so no signal handler is needed.
fn signals_as_events(events: Sender<Event>) -> std::io::Result<()> {
    let set = ending_signals();
    // SAFETY: `set` is an initialized signal set; a null old-set pointer is
    // allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: `set` and `sig` are valid for the call; the signals in
        // `set` are blocked in every thread, as sigwait requires.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 && events.send(Event::Signal(sig)).is_err()
        {
            return;
        }
    });
    Ok(())
}

/// Sends `sig` to the process group led by rank process `pid`.
fn kill_group(pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions; the rank leads its
    // own process group (process_group(0)).
    unsafe { libc::kill(-(pid as i32), sig) };
}

/// How the end of a rank's process fails the job, if it does: what
/// happened (for the one-line message) and the exit code it gives oxrun.
fn rank_failure(state: &RankState, status: std::io::Result<ExitStatus>) -> Option<(String, i32)> {
    let status = match status {
        Ok(status) => status,
        Err(e) => return Some((format!("could not be waited for ({e})"), 1)),
    };
    if let Some(sig) = status.signal() {
        return Some((
            format!("was killed by signal {sig} ({})", signal_name(sig)),
            128 + sig,
        ));
    }
    let code = status.code().unwrap_or(1);
    if code != 0 {
        Some((format!("exited with code {code}"), code))
    } else if state.initialized && !state.finalized && state.aborted.is_none() {
        Some(("exited without finalizing MPI".to_owned(), 1))
    } else {
        None
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match args::parse(&args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("oxrun: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    ExitCode::from(run(options).clamp(0, 255) as u8)
}

fn run(options: Options) -> i32 {
    let mut secret = [0u8; 32];
    if let Err(e) = getrandom::getrandom(&mut secret) {
        eprintln!("oxrun: cannot draw a job secret: {e}");
        return 1;
    }
    let secret_hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    // Each rank's part, in rank order.
    let appnums: Vec<usize> = options
        .parts
        .iter()
        .enumerate()
        .flat_map(|(index, part)| std::iter::repeat_n(index, part.ranks))
        .collect();
    let n = appnums.len();
    let plan = placement::plan(&options.placement, n);
    if let Some(warning) = &plan.warning {
        eprintln!("{warning}");
    }
    let (events, event_queue) = mpsc::channel();
    if let Err(e) = signals_as_events(events.clone()) {
        eprintln!("oxrun: cannot take over SIGINT and SIGTERM: {e}");
        return 1;
    }
    let server = Arc::new(Server {
        size: n,
        appnums: appnums.clone(),
        kvsname: format!("kvs_{}_0", std::process::id()),
        kvs: Mutex::new(HashMap::new()),
        barrier: Mutex::new((0, 0)),
        barrier_done: Condvar::new(),
        ranks: Mutex::new((0..n).map(|_| RankState::default()).collect()),
        events: events.clone(),
    });
    let signals = ending_signals();

    // Process ids of the ranks started, by rank; each also leads its
    // process group.
    let mut pids: Vec<u32> = Vec::new();
    let mut threads = Vec::new();
    for (rank, &appnum) in appnums.iter().enumerate() {
        let part = &options.parts[appnum];
        let (ours, theirs) = match UnixStream::pair() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("oxrun: cannot create a PMI socket: {e}");
                return 1;
            }
        };
        let theirs: OwnedFd = theirs.into();
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(&part.program[0]);
        cmd.args(&part.program[1..])
            .env("PMI_FD", fd.to_string())
            .env("PMI_RANK", rank.to_string())
            .env("PMI_SIZE", n.to_string())
            .env("MPI_LOCALNRANKS", n.to_string())
            .env("MPI_LOCALRANKID", rank.to_string())
            .env("OXMPI_JOB_SECRET", &secret_hex)
            .stdin(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let binding = plan.bindings[rank].clone();
        match &binding {
            Some(b) => cmd.envs(b.env()),
            None => cmd
                .env_remove(placement::CPUSET_ENV)
                .env_remove(placement::NUMA_ENV),
        };
        // Last: what the part's `-x` names wins over what oxrun sets (an
        // unbound rank given OXMPI_NUMA_NODES keeps it).
        cmd.envs(part.env.iter().map(|(k, v)| (k, v)));
        // SAFETY: between fork and exec only async-signal-safe calls are
        // made: sigprocmask, prctl, sched_setaffinity (Binding::apply,
        // which does not allocate), and fcntl on the inherited descriptor.
        unsafe {
            cmd.pre_exec(move || {
                // oxrun blocks the ending signals; the rank must not.
                libc::sigprocmask(libc::SIG_UNBLOCK, &signals, std::ptr::null_mut());
                // Die with oxrun, so no rank outlives the job.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(b) = &binding {
                    b.apply()?;
                }
                // Keep the PMI socket open across exec.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut child) => {
                drop(theirs);
                pids.push(child.id());
                if options.placement.report {
                    eprintln!("{}", plan.report(rank));
                }
                if let Some(out) = child.stdout.take() {
                    threads.push(forward(out, rank, options.tag_output, false));
                }
                if let Some(err) = child.stderr.take() {
                    threads.push(forward(err, rank, options.tag_output, true));
                }
                let s = server.clone();
                std::thread::spawn(move || s.serve(rank, ours));
                let events = events.clone();
                std::thread::spawn(move || {
                    let status = child.wait();
                    let _ = events.send(Event::Exited { rank, status });
                });
            }
            Err(e) => {
                let bound = plan.bindings[rank]
                    .as_ref()
                    .map(|b| format!(" bound to {}", b.describe()))
                    .unwrap_or_default();
                eprintln!(
                    "oxrun: cannot start rank {rank} ({}){bound}: {e}",
                    part.program[0]
                );
                for &pid in &pids {
                    kill_group(pid, libc::SIGKILL);
                }
                return 127;
            }
        }
    }

    let mut alive = vec![true; n];
    let mut worst = 0;
    let mut failure: Option<(Option<usize>, String, i32)> = None;
    let mut ending_since: Option<Instant> = None;
    let mut killed = false;
    // When the first abort's settling time ends (`ABORT_SETTLE`), and
    // whether it has.
    let mut abort_settles_at: Option<Instant> = None;
    let mut abort_settled = false;
    while alive.contains(&true) {
        let event = match (ending_since, abort_settles_at) {
            (None, Some(at)) => {
                match event_queue.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => {
                        abort_settles_at = None;
                        abort_settled = true;
                        Event::Aborted
                    }
                    // oxrun holds a sender itself.
                    Err(RecvTimeoutError::Disconnected) => unreachable!(),
                }
            }
            (Some(t), _) if !killed => {
                match event_queue.recv_timeout(GRACE.saturating_sub(t.elapsed())) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => {
                        for (rank, _) in alive.iter().enumerate().filter(|(_, a)| **a) {
                            kill_group(pids[rank], libc::SIGKILL);
                        }
                        killed = true;
                        continue;
                    }
                    // oxrun holds a sender itself.
                    Err(RecvTimeoutError::Disconnected) => unreachable!(),
                }
            }
            _ => event_queue.recv().expect("oxrun holds a sender itself"),
        };
        match event {
            Event::Exited { rank, status } => {
                alive[rank] = false;
                if ending_since.is_some() {
                    continue;
                }
                let Some((what, code)) = rank_failure(&server.ranks.lock().unwrap()[rank], status)
                else {
                    continue;
                };
                worst = worst.max(code);
                failure.get_or_insert((Some(rank), what, code));
            }
            Event::Aborted if !abort_settled => {
                abort_settles_at.get_or_insert(Instant::now() + ABORT_SETTLE);
                continue;
            }
            Event::Aborted => {
                let ranks = server.ranks.lock().unwrap();
                if let Some((rank, code)) = ranks
                    .iter()
                    .enumerate()
                    .find_map(|(r, s)| s.aborted.map(|c| (r, c)))
                {
                    failure.get_or_insert((
                        Some(rank),
                        format!("called abort with code {code}"),
                        code,
                    ));
                    worst = worst.max(code);
                }
            }
            Event::Signal(sig) => {
                failure.get_or_insert((
                    None,
                    format!("got signal {sig} ({})", signal_name(sig)),
                    128 + sig,
                ));
                worst = worst.max(128 + sig);
            }
        }
        if let (Some((rank, what, _)), None) = (&failure, ending_since) {
            match rank {
                Some(rank) => eprintln!(
                    "oxrun: rank {rank} (pid {}) {what}; ending the job",
                    pids[*rank]
                ),
                None => eprintln!("oxrun: {what}; ending the job"),
            }
            // A rank that exited may be reaped already; its group id is
            // not signalled, since another process could take it over.
            for (rank, _) in alive.iter().enumerate().filter(|(_, a)| **a) {
                kill_group(pids[rank], libc::SIGTERM);
            }
            ending_since = Some(Instant::now());
        }
    }
    for t in threads {
        let _ = t.join();
    }
    match failure {
        Some((_, _, code)) => code.max(worst).max(1),
        None => 0,
    }
}
