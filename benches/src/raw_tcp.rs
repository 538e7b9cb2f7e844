//! The raw TCP baseline: the same patterns as the MPI benchmarks between
//! two plain processes over one loopback TCP connection, the floor an MPI
//! library over TCP on this machine can approach.
//!
//! `oxbench raw-tcp latency|bw` listens on an ephemeral port of 127.0.0.1
//! (never another address), starts itself again as its peer (the hidden
//! subcommand [`RAW_TCP_PEER`] with the port and
//! a random token), and accepts only a connection from a loopback address
//! that presents the token first. Both ends set `TCP_NODELAY` and make the
//! socket non-blocking, and both busy-poll: a read or write that would
//! block is retried at once, never slept on (FACTS.md: sleeping in a
//! blocking read costs a factor of ten in latency).
//!
//! - Latency: the parent writes a message, the child reads it whole and
//!   writes one back; half the round trip, averaged.
//! - Bandwidth: the parent writes [`WINDOW`] messages, one write call per
//!   message (continued if the kernel takes part of it), then reads a
//!   4-byte acknowledgement; the child reads each message into its own
//!   buffer of the window, as the MPI receiver does, then acknowledges.
//!
//! TCP has no message boundaries: both ends know the sizes from the shared
//! options, and a zero-byte message does not exist, so sizes start at 1.
//! Before each size the two exchange one byte; buffers are filled and
//! checked as in the MPI benchmarks.
//!
//! The child is always reaped: the parent kills and waits for it on every
//! error path (a guard's `Drop`), and waits for its exit at the end. If
//! the parent itself dies, the child sees its connection close (or cannot
//! connect) and exits; a peer that makes no progress for
//! [`STALL_LIMIT`] is an error on either side.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options, RAW_TCP_PEER, WINDOW};
use crate::mpi_bench;
use crate::report::StdoutReport;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long either end waits for the other to make progress (connect,
/// read or write anything) before giving up.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);
/// How long the parent waits for the child to connect, and for it to exit
/// at the end.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Size of an acknowledgement.
const ACK_SIZE: usize = 4;

/// Runs the raw TCP `benchmark` as the parent (the side that reports).
pub fn main(benchmark: Benchmark, options: &Options) -> ExitCode {
    match run_parent(benchmark, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench raw-tcp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the child side: connects to the parent at `port` on 127.0.0.1
/// and presents `token`.
pub fn peer_main(benchmark: Benchmark, options: &Options, port: u16, token: u64) -> ExitCode {
    let result = (|| {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut stream = TcpStream::connect_timeout(&address, START_LIMIT)
            .map_err(|e| format!("connecting to {address}: {e}"))?;
        stream
            .write_all(&token.to_le_bytes())
            .map_err(|e| format!("sending the token: {e}"))?;
        let mut link = Link::new(stream)?;
        exchange(&mut link, Side::Child, benchmark, options, None)
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench raw-tcp (child): {e}");
            ExitCode::FAILURE
        }
    }
}

/// A child process, killed and reaped unless it was waited for.
pub(crate) struct ChildGuard {
    child: Child,
    reaped: bool,
}

impl ChildGuard {
    /// Guards `child`.
    pub(crate) fn new(child: Child) -> ChildGuard {
        ChildGuard {
            child,
            reaped: false,
        }
    }

    /// Has the child exited? (Reaps it if so.)
    pub(crate) fn exited(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    /// Waits up to `limit` for the child to exit; kills it after that.
    pub(crate) fn wait(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.exited() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() > deadline => {
                    return Err(format!(
                        "the child did not exit within {limit:?}; killed it"
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => return Err(format!("waiting for the child: {e}")),
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            // It may have exited meanwhile: then kill fails harmlessly, and
            // wait reaps it either way.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A token no other process can guess easily: std's per-process random
/// hash keys, mixed with the time.
pub(crate) fn random_token() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn run_parent(benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("listening on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("reading the listening port: {e}"))?
        .port();
    let token = random_token();
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let child = Command::new(&exe)
        .arg(RAW_TCP_PEER)
        .arg(benchmark.name())
        .arg(port.to_string())
        .arg(token.to_string())
        .args(options.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let mut child = ChildGuard::new(child);
    let stream = accept_child(&listener, &mut child, token)?;
    drop(listener);
    let mut link = Link::new(stream)?;
    let notes = vec![
        "2 processes over 127.0.0.1, TCP_NODELAY, both busy-polling non-blocking sockets"
            .to_owned(),
        options.describe_iterations(),
        if benchmark.is_latency() {
            "one write per message; one-way latency is half the round trip".to_owned()
        } else {
            format!(
                "window: {WINDOW} messages, one write each, then a {ACK_SIZE}-byte acknowledgement"
            )
        },
    ];
    let mut report =
        StdoutReport::to_stdout(benchmark, "raw-tcp", notes, options.json, options.tail)?;
    exchange(
        &mut link,
        Side::Parent,
        benchmark,
        options,
        Some(&mut report),
    )?;
    drop(link);
    let status = child.wait(START_LIMIT)?;
    if !status.success() {
        return Err(format!("the child failed: {status}"));
    }
    report.end()
}

/// Accepts the child's connection: from a loopback address, presenting
/// `token` first. Anything else is dropped and waiting goes on, until the
/// child exits or [`START_LIMIT`] passes.
fn accept_child(
    listener: &TcpListener,
    child: &mut ChildGuard,
    token: u64,
) -> Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("making the listener non-blocking: {e}"))?;
    let deadline = Instant::now() + START_LIMIT;
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                if from.ip().is_loopback() && presents_token(&stream, token) {
                    return Ok(stream);
                }
                eprintln!(
                    "oxbench raw-tcp: refused a connection from {from} that is not the child"
                );
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Some(status) = child
                    .exited()
                    .map_err(|e| format!("checking on the child: {e}"))?
                {
                    return Err(format!("the child exited ({status}) before connecting"));
                }
                if Instant::now() > deadline {
                    return Err(format!("the child did not connect within {START_LIMIT:?}"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accepting the child's connection: {e}")),
        }
    }
}

/// Whether the first 8 bytes on `stream` (read within a second) are
/// `token`.
fn presents_token(mut stream: &TcpStream, token: u64) -> bool {
    let mut bytes = [0u8; 8];
    stream.set_nonblocking(false).is_ok()
        && stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .is_ok()
        && stream.read_exact(&mut bytes).is_ok()
        && u64::from_le_bytes(bytes) == token
        && stream.set_read_timeout(None).is_ok()
}

/// Which end of the connection this process is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Sends first, times, reports.
    Parent,
    /// Answers.
    Child,
}

/// The connection, non-blocking, with busy-polling whole-buffer I/O.
struct Link {
    stream: TcpStream,
}

/// How many would-block retries pass between looks at the clock (a
/// power of two).
const SPINS_PER_CLOCK_CHECK: u32 = 1 << 14;

impl Link {
    fn new(stream: TcpStream) -> Result<Link, String> {
        stream
            .set_nodelay(true)
            .map_err(|e| format!("setting TCP_NODELAY: {e}"))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| format!("making the socket non-blocking: {e}"))?;
        Ok(Link { stream })
    }

    /// Reads exactly `buf.len()` bytes, polling.
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), String> {
        let mut done = 0;
        let mut stall = Stall::default();
        while done < buf.len() {
            match self.stream.read(&mut buf[done..]) {
                Ok(0) => {
                    return Err(format!(
                        "the other process closed the connection ({done} of {} bytes read)",
                        buf.len()
                    ))
                }
                Ok(n) => {
                    done += n;
                    stall = Stall::default();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => stall.spin("reading")?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading: {e}")),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` (one write call, continued while the kernel
    /// takes only part of it), polling.
    fn write_all(&mut self, buf: &[u8]) -> Result<(), String> {
        let mut done = 0;
        let mut stall = Stall::default();
        while done < buf.len() {
            match self.stream.write(&buf[done..]) {
                Ok(0) => return Err("the connection accepts no more data".to_owned()),
                Ok(n) => {
                    done += n;
                    stall = Stall::default();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => stall.spin("writing")?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("writing: {e}")),
            }
        }
        Ok(())
    }
}

/// Counts retries without progress; errs after [`STALL_LIMIT`].
#[derive(Default)]
struct Stall {
    spins: u32,
    since: Option<Instant>,
}

impl Stall {
    fn spin(&mut self, doing: &str) -> Result<(), String> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & (SPINS_PER_CLOCK_CHECK - 1) == 0 {
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() > STALL_LIMIT {
                return Err(format!("{doing}: no progress for {STALL_LIMIT:?}"));
            }
        }
        Ok(())
    }
}

/// Both sides' loop over the sizes; the parent times and reports. The
/// benchmark is `latency` or `bw` (the command line allows no other).
fn exchange(
    link: &mut Link,
    side: Side,
    benchmark: Benchmark,
    options: &Options,
    mut report: Option<&mut StdoutReport>,
) -> Result<(), String> {
    let max = options.max_size;
    let mut send = AlignedBuf::new(max)?;
    let latency = benchmark.is_latency();
    let receive_len = match (latency, side) {
        (false, Side::Child) => max * WINDOW,
        (false, Side::Parent) => 0,
        (true, _) => max,
    };
    let mut receive = AlignedBuf::new(receive_len)?;
    let mut one = [0u8; 1];
    let mut ack = [0u8; ACK_SIZE];
    for size in options.sizes() {
        let iterations = options.iterations_for(size);
        let warmup = options.warmup_for(size);
        let send = &mut send.as_mut_slice()[..size];
        fill_pattern(send, size);
        let receive = match (latency, side) {
            (false, Side::Child) => &mut receive.as_mut_slice()[..size * WINDOW],
            (false, Side::Parent) => &mut receive.as_mut_slice()[..0],
            (true, _) => &mut receive.as_mut_slice()[..size],
        };
        receive.fill(0);
        // Synchronize: one byte each way.
        if side == Side::Parent {
            link.write_all(&one)?;
            link.read_exact(&mut one)?;
        } else {
            link.read_exact(&mut one)?;
            link.write_all(&one)?;
        }
        let mut start = Instant::now();
        for i in 0..warmup + iterations {
            if i == warmup {
                start = Instant::now();
            }
            match (latency, side) {
                (true, Side::Parent) => {
                    link.write_all(send)?;
                    link.read_exact(receive)?;
                }
                (true, Side::Child) => {
                    link.read_exact(receive)?;
                    link.write_all(send)?;
                }
                (false, Side::Parent) => {
                    for _ in 0..WINDOW {
                        link.write_all(send)?;
                    }
                    link.read_exact(&mut ack)?;
                }
                (false, Side::Child) => {
                    for buf in receive.chunks_mut(size) {
                        link.read_exact(buf)?;
                    }
                    link.write_all(&ack)?;
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        check_messages(receive, send)
            .map_err(|e| format!("{}, {size} bytes: {e}", benchmark.name()))?;
        if let Some(report) = report.as_deref_mut() {
            let figures = mpi_bench::figures(benchmark, size, iterations, &[seconds]);
            report.record(size, &figures)?;
        }
    }
    Ok(())
}
