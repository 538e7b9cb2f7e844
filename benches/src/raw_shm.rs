//! The shared-memory floor: what two processes on one machine reach
//! without any MPI library, the figures a shared-memory transport can
//! approach.
//!
//! - `oxbench raw-shm latency`: two processes ping-pong a message through
//!   a cache line each way that they both map — a sequence number and up
//!   to [`LINE_PAYLOAD`] bytes in one 64-byte line. The writer fills the
//!   payload, then publishes the sequence number (release); the reader
//!   spins on the sequence number (acquire), then copies the payload out.
//!   One-way latency is half the round trip, averaged. Sizes are limited
//!   to what fits beside the sequence number: this is the floor of a short
//!   message, not of a copy. The two processes are bound to a core each
//!   as oxrun binds the two ranks of `oxrun -n 2 oxbench latency`
//!   ([`crate::pinning`]), so that the floor and the MPI figures it is set
//!   beside run alike; the report says where they ran.
//! - `oxbench raw-shm bw`: one process copies each message into a window
//!   of [`WINDOW`] consecutive buffers, as the MPI bandwidth receiver holds
//!   them, with a plain `memcpy` (`copy_from_slice`): the single copy a
//!   single-copy (CMA) transport must make, on one core.
//!
//! The lines live in a file the parent creates in `/dev/shm` with a random
//! name, exclusively and with mode 0600, and unlinks at once: the child
//! inherits it as its standard input, so nothing is left behind whatever
//! happens. Both ends busy-poll; a peer that stops answering for
//! [`STALL_LIMIT`] is an error, and the child exits when its parent dies.
//! Buffers are filled and checked as in the MPI benchmarks.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options, RAW_SHM_PEER, WINDOW};
use crate::mpi_bench;
use crate::pinning::{self, FloorPlacement};
use crate::raw_tcp::{random_token, ChildGuard, STALL_LIMIT};
use crate::report::StdoutReport;
use shared::Lines;
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Bytes of payload a line carries beside its sequence number.
pub const LINE_PAYLOAD: usize = 56;
/// How long the parent waits for the child to exit at the end.
const EXIT_LIMIT: Duration = Duration::from_secs(30);
/// How many spins pass between looks at the clock and at the other
/// process (a power of two).
const SPINS_PER_CHECK: u32 = 1 << 14;

/// Runs the raw shared-memory `benchmark` as the parent (the side that
/// reports; `bw` has no other side).
pub fn main(benchmark: Benchmark, options: &Options) -> ExitCode {
    let result = if benchmark.is_latency() {
        run_parent(options)
    } else {
        run_memcpy(options)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench raw-shm: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the child side of the latency benchmark: the shared file is its
/// standard input, `parent` the pid of the process that started it.
pub fn peer_main(options: &Options, parent: u32) -> ExitCode {
    let result = (|| {
        let file = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map(File::from)
            .map_err(|e| format!("taking the shared file from standard input: {e}"))?;
        let lines = Lines::map(&file)?;
        let mut watch = Watch::new(None, parent);
        // The parent may have died before this process started watching.
        watch.parent_alive()?;
        ping_pong(&lines, Side::Child, options, &mut watch, None)
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench raw-shm (child): {e}");
            ExitCode::FAILURE
        }
    }
}

fn report(
    benchmark: Benchmark,
    options: &Options,
    notes: &[String],
) -> Result<StdoutReport, String> {
    StdoutReport::to_stdout(
        benchmark,
        "raw-shm",
        notes
            .iter()
            .cloned()
            .chain([options.describe_iterations()])
            .collect(),
        options.json,
        options.tail,
    )
}

fn run_parent(options: &Options) -> Result<(), String> {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!(
        "oxbench-raw-shm-{}-{:016x}",
        std::process::id(),
        random_token()
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    // Unlinked before anything else can fail: the two processes hold it
    // open, nothing else ever sees it.
    std::fs::remove_file(&path).map_err(|e| format!("unlinking {}: {e}", path.display()))?;
    let lines = Lines::create(&file)?;
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let placement = FloorPlacement::here();
    let child = Command::new(&exe)
        .arg(RAW_SHM_PEER)
        .arg(std::process::id().to_string())
        .args(options.to_args())
        .stdin(Stdio::from(file))
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let child_id = child.id();
    let mut child = ChildGuard::new(child);
    if let FloorPlacement::Bound {
        parent,
        child: child_cpus,
    } = &placement
    {
        // The child binds before its first answer: it waits for this
        // process's first message, sent after both bindings.
        pinning::bind(child_id, child_cpus)?;
        pinning::bind(0, parent)?;
    }
    let mut report = report(
        Benchmark::Latency,
        options,
        &[
            "2 processes spinning on one shared cache line each way (a sequence number and the \
             payload)"
                .to_owned(),
            placement.describe(),
        ],
    )?;
    let mut watch = Watch::new(Some(&mut child), std::os::unix::process::parent_id());
    ping_pong(&lines, Side::Parent, options, &mut watch, Some(&mut report))?;
    let status = child.wait(EXIT_LIMIT)?;
    if !status.success() {
        return Err(format!("the child failed: {status}"));
    }
    report.end()
}

/// Which process this is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Writes first, times, reports.
    Parent,
    /// Answers.
    Child,
}

/// Both sides' loop over the sizes. Line 0 carries the parent's messages,
/// line 1 the child's; each iteration (warm-up ones too) has its own
/// sequence number, and before each size the two exchange one untimed
/// message. The parent reports.
fn ping_pong(
    lines: &Lines,
    side: Side,
    options: &Options,
    watch: &mut Watch<'_>,
    mut report: Option<&mut StdoutReport>,
) -> Result<(), String> {
    let (out, inbound) = match side {
        Side::Parent => (0, 1),
        Side::Child => (1, 0),
    };
    let mut sequence = 0u64;
    let mut message = [0u8; LINE_PAYLOAD];
    let mut received = [0u8; LINE_PAYLOAD];
    for size in options.sizes() {
        let (iterations, warmup) = (options.iterations_for(size), options.warmup_for(size));
        fill_pattern(&mut message[..size], size);
        received.fill(0);
        let mut exchange = |sequence: u64| -> Result<(), String> {
            if side == Side::Parent {
                lines.publish(out, sequence, &message[..size]);
                lines.wait_for(inbound, sequence, &mut received[..size], || watch.check())
            } else {
                lines.wait_for(inbound, sequence, &mut received[..size], || watch.check())?;
                lines.publish(out, sequence, &message[..size]);
                Ok(())
            }
        };
        sequence += 1;
        exchange(sequence)?;
        let mut start = Instant::now();
        for i in 0..warmup + iterations {
            if i == warmup {
                start = Instant::now();
            }
            sequence += 1;
            exchange(sequence)?;
        }
        let seconds = start.elapsed().as_secs_f64();
        check_messages(&received[..size], &message[..size])
            .map_err(|e| format!("latency, {size} bytes: {e}"))?;
        if let Some(report) = report.as_deref_mut() {
            let figures = mpi_bench::figures(Benchmark::Latency, size, iterations, &[seconds]);
            report.record(size, &figures)?;
        }
    }
    Ok(())
}

/// What a spinning side checks now and then: that the other process is
/// still there (the parent: the child has not exited; the child: its
/// parent has not died), and that it answered within [`STALL_LIMIT`].
struct Watch<'a> {
    /// The parent's child; `None` in the child.
    child: Option<&'a mut ChildGuard>,
    /// This process's parent (the child's is the benchmark's parent).
    parent_id: u32,
    spins: u32,
    since: Option<Instant>,
}

impl<'a> Watch<'a> {
    fn new(child: Option<&'a mut ChildGuard>, parent_id: u32) -> Watch<'a> {
        Watch {
            child,
            parent_id,
            spins: 0,
            since: None,
        }
    }

    /// Whether this process's parent is still the one it was started by
    /// (an orphan is adopted by another process).
    fn parent_alive(&self) -> Result<(), String> {
        if std::os::unix::process::parent_id() == self.parent_id {
            Ok(())
        } else {
            Err("the parent died".to_owned())
        }
    }

    /// Called on every spin without an answer.
    fn check(&mut self) -> Result<(), String> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & (SPINS_PER_CHECK - 1) != 0 {
            return Ok(());
        }
        match self.child.as_mut() {
            Some(child) => {
                if let Some(status) = child
                    .exited()
                    .map_err(|e| format!("checking on the child: {e}"))?
                {
                    return Err(format!("the child exited ({status}) before answering"));
                }
            }
            None => self.parent_alive()?,
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > STALL_LIMIT {
            return Err(format!("no answer for {STALL_LIMIT:?}"));
        }
        Ok(())
    }
}

/// The memcpy floor: see the module doc.
fn run_memcpy(options: &Options) -> Result<(), String> {
    let mut report = report(
        Benchmark::Bandwidth,
        options,
        &[format!(
            "1 process, memcpy of each message into a window of {WINDOW} buffers, 1 thread"
        )],
    )?;
    let max = options.max_size;
    let mut message = AlignedBuf::new(max)?;
    let mut window = AlignedBuf::new(max * WINDOW)?;
    for size in options.sizes() {
        let (iterations, warmup) = (options.iterations_for(size), options.warmup_for(size));
        let message = &mut message.as_mut_slice()[..size];
        fill_pattern(message, size);
        let window = &mut window.as_mut_slice()[..size * WINDOW];
        window.fill(0);
        let mut start = Instant::now();
        for i in 0..warmup + iterations {
            if i == warmup {
                start = Instant::now();
            }
            for buf in window.chunks_exact_mut(size) {
                buf.copy_from_slice(message);
            }
            // Keep the copies: the optimizer must not drop or merge them.
            std::hint::black_box(&mut *window);
        }
        let seconds = start.elapsed().as_secs_f64();
        check_messages(window, message).map_err(|e| format!("memcpy, {size} bytes: {e}"))?;
        let figures = mpi_bench::figures(Benchmark::Bandwidth, size, iterations, &[seconds]);
        report.record(size, &figures)?;
    }
    report.end()
}

/// The two shared cache lines, and the only unsafe code of this crate.
#[allow(unsafe_code)]
mod shared {
    use super::LINE_PAYLOAD;
    use memmap2::MmapMut;
    use std::fs::File;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Bytes of one line: its sequence number and payload.
    const LINE: usize = 64;
    /// Bytes mapped: two lines, each alone in a 128-byte block so that the
    /// adjacent-line prefetcher does not couple them.
    const MAPPED: usize = 256;
    /// Where line `i` starts.
    const fn line_offset(i: usize) -> usize {
        i * 128
    }

    /// Two cache-line mailboxes in memory both processes map.
    pub struct Lines {
        map: MmapMut,
    }

    impl Lines {
        /// Sizes the (new, empty) shared file and maps it.
        pub fn create(file: &File) -> Result<Lines, String> {
            file.set_len(MAPPED as u64)
                .map_err(|e| format!("sizing the shared file: {e}"))?;
            Lines::map(file)
        }

        /// Maps the shared file, which must hold the two lines.
        pub fn map(file: &File) -> Result<Lines, String> {
            let len = file
                .metadata()
                .map_err(|e| format!("reading the shared file's size: {e}"))?
                .len();
            if len != MAPPED as u64 {
                return Err(format!(
                    "the shared file has {len} bytes, expected {MAPPED}"
                ));
            }
            // SAFETY: the file is private to the parent and its child (it
            // was created exclusively with mode 0600 and unlinked at once)
            // and is never resized after `create`; the two processes touch
            // the mapping only through `publish` and `wait_for`, whose
            // protocol keeps each line's payload written by one process at
            // a time.
            let map = unsafe { MmapMut::map_mut(file) }
                .map_err(|e| format!("mapping the shared file: {e}"))?;
            Ok(Lines { map })
        }

        /// The sequence number of line `i`.
        fn sequence(&self, i: usize) -> &AtomicU64 {
            let offset = line_offset(i);
            assert!(offset + LINE <= self.map.len());
            // SAFETY: the offset is in bounds (checked above) and 8-byte
            // aligned (the mapping is page-aligned and lines start at
            // multiples of 128); the word is only ever accessed atomically
            // by both processes; the reference lives no longer than `self`,
            // which owns the mapping.
            unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(offset) as *mut u64) }
        }

        /// The payload of line `i`.
        fn payload(&self, i: usize) -> *mut u8 {
            // In bounds: `sequence` checks the whole line.
            self.map.as_ptr().wrapping_add(line_offset(i) + 8) as *mut u8
        }

        /// Writes `data` (at most [`LINE_PAYLOAD`] bytes) into line `i`,
        /// then publishes `sequence` on it.
        pub fn publish(&self, i: usize, sequence: u64, data: &[u8]) {
            assert!(data.len() <= LINE_PAYLOAD);
            let word = self.sequence(i);
            // SAFETY: the payload area holds LINE_PAYLOAD bytes in the
            // mapping; the other process reads it only after it sees this
            // sequence number, published below with Release after the
            // copy, and never writes it (each line has one writer).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.payload(i), data.len()) };
            word.store(sequence, Ordering::Release);
        }

        /// Spins until line `i` carries `sequence`, calling `check` on
        /// every spin (it may end the wait with an error), then copies its
        /// payload into `out`.
        pub fn wait_for(
            &self,
            i: usize,
            sequence: u64,
            out: &mut [u8],
            mut check: impl FnMut() -> Result<(), String>,
        ) -> Result<(), String> {
            assert!(out.len() <= LINE_PAYLOAD);
            let word = self.sequence(i);
            loop {
                // Acquire: pairs with the writer's Release store, so the
                // payload written before it is visible below.
                let seen = word.load(Ordering::Acquire);
                if seen == sequence {
                    break;
                }
                if seen > sequence {
                    return Err(format!(
                        "the other process is ahead: message {seen}, expected {sequence}"
                    ));
                }
                check()?;
                std::hint::spin_loop();
            }
            // SAFETY: the writer finished this payload before publishing
            // `sequence` (Release/Acquire above) and does not write it again
            // until this process answers.
            unsafe { std::ptr::copy_nonoverlapping(self.payload(i), out.as_mut_ptr(), out.len()) };
            Ok(())
        }
    }
}
