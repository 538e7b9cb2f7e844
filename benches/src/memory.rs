//! `oxrun -n N oxbench memory [--pattern all|ring]`: the shared memory a
//! rank maps, after traffic that makes every queue it uses lap at least
//! once (so every page of it has been touched).
//!
//! Each rank exchanges [`ROUNDS`] messages of [`MESSAGE`] bytes each way
//! with each of its partners — every other rank (`all`, so every pair of
//! ranks connects) or its two ring neighbours (`ring`, the sparse case) —
//! then reads `/proc/self/smaps` and sums, over its mappings of oxmpi's
//! shared segments (`/memfd:oxmpi-shm-...`), the mapped size, the resident
//! size (Rss) and the proportional set size (Pss: each page divided by the
//! number of processes that map it, so the ranks' Pss add up to the
//! node's shared memory). Rank 0 prints a row per rank and a summary.
//! The figure is the library's business, measured from outside the
//! library: whatever transports the job uses, only the memory files named
//! as oxmpi's shared segments count.

use crate::cli::{MemoryOptions, Pattern};
use crate::mpi_bench::transports_note;
use oxmpi::request::{scope, wait_all};
use oxmpi::Communicator;
use std::process::ExitCode;

/// Messages each rank sends each partner (and receives from it).
pub const ROUNDS: usize = 128;
/// Bytes of each message: the shared-memory transport's default eager
/// limit (16 KiB with cross-memory attach, 64 KiB without), so messages
/// go through the queues' cells rather than by a single copy between the
/// buffers. [`ROUNDS`] of them, 2 MiB, lap every default queue (1 MiB at
/// most).
pub const MESSAGE: usize = 16 << 10;
/// Tag of the traffic.
const TAG: i32 = 5;

/// What one rank maps, in KiB as smaps counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    /// Mappings of shared segments.
    pub segments: u64,
    /// Their size.
    pub size_kib: u64,
    /// Their resident pages.
    pub rss_kib: u64,
    /// Their proportional set size.
    pub pss_kib: u64,
}

impl Mapped {
    fn to_array(self) -> [u64; 4] {
        [self.segments, self.size_kib, self.rss_kib, self.pss_kib]
    }

    fn from_slice(v: &[u64]) -> Mapped {
        Mapped {
            segments: v[0],
            size_kib: v[1],
            rss_kib: v[2],
            pss_kib: v[3],
        }
    }
}

/// The shared segments' share of `smaps` (the text of `/proc/PID/smaps`).
pub fn shared_segments(smaps: &str) -> Mapped {
    let mut total = Mapped::default();
    let mut counting = false;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(field) = first.strip_suffix(':') {
            if counting {
                let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                match field {
                    "Size" => total.size_kib += kib,
                    "Rss" => total.rss_kib += kib,
                    "Pss" => total.pss_kib += kib,
                    _ => {}
                }
            }
        } else {
            // A mapping's first line: `ADDRESSES PERMS OFFSET DEV INODE PATH`.
            counting = words
                .nth(4)
                .is_some_and(|p| p.starts_with("/memfd:oxmpi-shm-"));
            total.segments += u64::from(counting);
        }
    }
    total
}

/// The ranks `rank` of `size` exchanges messages with.
pub fn partners(pattern: Pattern, rank: i32, size: i32) -> Vec<i32> {
    let mut p: Vec<i32> = match pattern {
        Pattern::All => (0..size).filter(|&r| r != rank).collect(),
        Pattern::Ring => vec![(rank + 1) % size, (rank + size - 1) % size],
    };
    p.sort_unstable();
    p.dedup();
    p.retain(|&r| r != rank);
    p
}

/// Runs the measurement in this rank of the job; rank 0 prints it.
pub fn main(options: &MemoryOptions) -> ExitCode {
    let universe = match oxmpi::initialize() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("oxbench: cannot initialize MPI: {e}");
            return ExitCode::FAILURE;
        }
    };
    let world = universe.world();
    let rank = world.rank();
    if let Err(e) = run(&world, options) {
        eprintln!("oxbench: rank {rank}: {e}");
        world.abort(1);
    }
    match universe.finalize() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench: rank {rank}: finalize failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(world: &Communicator, options: &MemoryOptions) -> Result<(), String> {
    let (rank, size) = (world.rank(), world.size());
    let partners = partners(options.pattern, rank, size);
    let message = vec![rank as u8; MESSAGE];
    let mut inbox = vec![0u8; MESSAGE * partners.len()];
    for _ in 0..ROUNDS {
        exchange(world, &partners, &message, &mut inbox)?;
    }
    // A last, empty message from each partner says it has read all of
    // this rank's: every page of the queues between them has been touched
    // by both. No collective before the measurement: its messages would
    // connect pairs the pattern leaves apart. (The ranks stay alive, with
    // their mappings, until all are in finalize.)
    exchange(world, &partners, &[], &mut [])?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .map_err(|e| format!("cannot read /proc/self/smaps: {e}"))?;
    let mine = shared_segments(&smaps).to_array();
    let root = world.process_at_rank(0);
    if rank != 0 {
        return root.gather_into(&mine[..]).map_err(|e| e.to_string());
    }
    let mut all = vec![0u64; 4 * size as usize];
    root.gather_into_root(&mine[..], &mut all[..])
        .map_err(|e| e.to_string())?;
    let ranks: Vec<Mapped> = all.chunks_exact(4).map(Mapped::from_slice).collect();
    print!("{}", report(options.pattern, &ranks));
    Ok(())
}

/// One round: `message` to every partner, and one of the same length from
/// each into its share of `inbox` (empty messages need no inbox).
fn exchange(
    world: &Communicator,
    partners: &[i32],
    message: &[u8],
    inbox: &mut [u8],
) -> Result<(), String> {
    let fail = |e: oxmpi::Error| e.to_string();
    scope(|scope| -> Result<(), String> {
        let mut receives = Vec::with_capacity(partners.len());
        let mut boxes = inbox.chunks_mut(message.len().max(1));
        for &p in partners {
            let from = world.process_at_rank(p);
            let buf = boxes.next().unwrap_or_default();
            receives.push(
                from.immediate_receive_into_with_tag(scope, buf, TAG)
                    .map_err(fail)?,
            );
        }
        let mut sends = Vec::with_capacity(partners.len());
        for &p in partners {
            let to = world.process_at_rank(p);
            sends.push(
                to.immediate_send_with_tag(scope, message, TAG)
                    .map_err(fail)?,
            );
        }
        wait_all(sends).map_err(fail)?;
        for status in wait_all(receives).map_err(fail)? {
            if status.byte_count() != message.len() {
                return Err(format!(
                    "received {} bytes where {} were sent",
                    status.byte_count(),
                    message.len()
                ));
            }
        }
        Ok(())
    })?;
    for (&p, buf) in partners.iter().zip(inbox.chunks(message.len().max(1))) {
        if buf.iter().any(|&b| b != p as u8) {
            return Err(format!("the message from rank {p} arrived corrupted"));
        }
    }
    Ok(())
}

/// The report: a row per rank, then the smallest, mean and largest Pss
/// and the node's total.
pub fn report(pattern: Pattern, ranks: &[Mapped]) -> String {
    let n = ranks.len();
    let mut out = format!(
        "# oxbench memory: shared segments mapped per rank, {n} ranks, pattern {} ({})\n\
         # after {ROUNDS} messages of {} KiB each way with each partner; {}\n\
         # {:>4} {:>9} {:>12} {:>10} {:>10}\n",
        pattern.name(),
        pattern.description(),
        MESSAGE >> 10,
        transports_note(),
        "rank",
        "segments",
        "mapped(KiB)",
        "Rss(KiB)",
        "Pss(KiB)"
    );
    for (rank, m) in ranks.iter().enumerate() {
        out += &format!(
            "  {rank:>4} {:>9} {:>12} {:>10} {:>10}\n",
            m.segments, m.size_kib, m.rss_kib, m.pss_kib
        );
    }
    let pss: Vec<u64> = ranks.iter().map(|m| m.pss_kib).collect();
    let total: u64 = pss.iter().sum();
    out += &format!(
        "# Pss per rank (KiB): min {} mean {} max {}; all ranks {} KiB\n",
        pss.iter().min().unwrap_or(&0),
        total / n.max(1) as u64,
        pss.iter().max().unwrap_or(&0),
        total
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000101000 rw-s 00000000 00:01 42 /memfd:oxmpi-shm-10-0-to-1 (deleted)
Size:               1028 kB
Rss:                1024 kB
Pss:                 512 kB
Shared_Clean:          0 kB
7f0000200000-7f0000201000 rw-p 00000000 00:00 0 
Size:                  4 kB
Rss:                   4 kB
Pss:                   4 kB
7f0000300000-7f0000401000 rw-s 00000000 00:01 43 /memfd:oxmpi-shm-11-1-to-0 (deleted)
Size:               1028 kB
Rss:                 100 kB
Pss:                  50 kB
7f0000500000-7f0000501000 rw-s 00000000 00:01 44 /memfd:other (deleted)
Size:                  4 kB
Rss:                   4 kB
Pss:                   4 kB
";

    #[test]
    fn only_oxmpis_segments_count() {
        assert_eq!(
            shared_segments(SMAPS),
            Mapped {
                segments: 2,
                size_kib: 2056,
                rss_kib: 1124,
                pss_kib: 562
            }
        );
    }

    #[test]
    fn partners_by_pattern() {
        assert_eq!(partners(Pattern::All, 1, 4), [0, 2, 3]);
        assert_eq!(partners(Pattern::Ring, 0, 4), [1, 3]);
        assert_eq!(partners(Pattern::Ring, 0, 2), [1]);
        assert!(partners(Pattern::Ring, 0, 1).is_empty());
    }

    #[test]
    fn the_report_sums_the_ranks() {
        let m = |pss| Mapped {
            segments: 2,
            size_kib: 2056,
            rss_kib: 2 * pss,
            pss_kib: pss,
        };
        let text = report(Pattern::Ring, &[m(100), m(300)]);
        assert!(text.contains("2 ranks, pattern ring"), "{text}");
        assert!(
            text.contains("min 100 mean 200 max 300; all ranks 400 KiB"),
            "{text}"
        );
    }
}
