//! `oxrun -n N oxbench memory [--pattern all|ring]`: the shared memory a
//! rank maps, after traffic that makes every queue it uses lap at least
//! once (so every page of it has been touched), and again once the ranks
//! have also run collectives and hold a window.
//!
//! Each rank exchanges [`ROUNDS`] messages of [`MESSAGE`] bytes each way
//! with each of its partners — every other rank (`all`, so every pair of
//! ranks connects) or its two ring neighbours (`ring`, the sparse case) —
//! then reads `/proc/self/smaps` and sums, over its mappings of oxmpi's
//! shared memory files, the mapped size, the resident size (Rss) and the
//! proportional set size (Pss: each page divided by the number of
//! processes that map it, so the ranks' Pss add up to the node's shared
//! memory), for the point-to-point queues (`/memfd:oxmpi-shm-...`) and
//! for the shared regions (oxmpi's other memory files:
//! `oxmpi-collectives`, `oxmpi-window`, `oxmpi-window-block`) apart. Then every rank takes part in a
//! barrier, an all-reduce of [`REDUCED`] bytes and a broadcast of
//! [`BROADCAST`] bytes, allocates a window of [`WINDOW`] bytes, and reads
//! its mappings again with the window held. Rank 0 prints a table per
//! measurement: a row per rank and a summary.
//! The figure is the library's business, measured from outside the
//! library: whatever transports the job uses, only the memory files named
//! as oxmpi's count.

use crate::cli::{MemoryOptions, Pattern};
use crate::mpi_bench::transports_note;
use oxmpi::collective::SystemOperation;
use oxmpi::request::{scope, wait_all};
use oxmpi::rma::Window;
use oxmpi::{Communicator, Info};
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
/// Bytes each rank all-reduces before the second measurement.
pub const REDUCED: usize = 1 << 10;
/// Bytes rank 0 broadcasts before the second measurement.
pub const BROADCAST: usize = 64 << 10;
/// Bytes of the window each rank allocates for the second measurement.
pub const WINDOW: usize = 64 << 10;

/// What one rank maps of one kind of memory file, in KiB as smaps counts
/// it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    /// Mappings.
    pub segments: u64,
    /// Their size.
    pub size_kib: u64,
    /// Their resident pages.
    pub rss_kib: u64,
    /// Their proportional set size.
    pub pss_kib: u64,
}

/// What one rank maps of oxmpi's shared memory files, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// The point-to-point queues' segments (`oxmpi-shm-...`).
    pub queues: Mapped,
    /// Shared regions: collectives' and windows'.
    pub regions: Mapped,
}

impl Footprint {
    /// The fields in a fixed order, for a gather.
    fn to_array(self) -> [u64; 8] {
        let [q, r] = [self.queues, self.regions];
        [
            q.segments, q.size_kib, q.rss_kib, q.pss_kib, r.segments, r.size_kib, r.rss_kib,
            r.pss_kib,
        ]
    }

    fn from_slice(v: &[u64]) -> Footprint {
        let mapped = |v: &[u64]| Mapped {
            segments: v[0],
            size_kib: v[1],
            rss_kib: v[2],
            pss_kib: v[3],
        };
        Footprint {
            queues: mapped(&v[..4]),
            regions: mapped(&v[4..8]),
        }
    }

    fn of_kind(&mut self, kind: Kind) -> &mut Mapped {
        match kind {
            Kind::Queues => &mut self.queues,
            Kind::Regions => &mut self.regions,
        }
    }
}

/// The kinds of oxmpi's shared memory files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Queues,
    Regions,
}

impl Kind {
    /// The kind of memory file a mapping's path names, if it is oxmpi's.
    fn of(path: &str) -> Option<Kind> {
        if path.starts_with("/memfd:oxmpi-shm-") {
            Some(Kind::Queues)
        } else if path.starts_with("/memfd:oxmpi-") {
            Some(Kind::Regions)
        } else {
            None
        }
    }
}

/// oxmpi's shared memory files' share of `smaps` (the text of
/// `/proc/PID/smaps`).
pub fn shared_segments(smaps: &str) -> Footprint {
    let mut total = Footprint::default();
    // The kind of the mapping whose fields are being read, if oxmpi's.
    let mut counting = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(field) = first.strip_suffix(':') {
            if let Some(kind) = counting {
                let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                let mapped = total.of_kind(kind);
                match field {
                    "Size" => mapped.size_kib += kib,
                    "Rss" => mapped.rss_kib += kib,
                    "Pss" => mapped.pss_kib += kib,
                    _ => {}
                }
            }
        } else {
            // A mapping's first line: `ADDRESSES PERMS OFFSET DEV INODE PATH`.
            counting = words.nth(4).and_then(Kind::of);
            if let Some(kind) = counting {
                total.of_kind(kind).segments += 1;
            }
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
    let root = world.process_at_rank(0);
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
    let after_messages = footprint()?;
    let fail = |e: oxmpi::Error| e.to_string();
    world.barrier().map_err(fail)?;
    let mine = vec![rank as u64; REDUCED / 8];
    let mut sum = vec![0u64; REDUCED / 8];
    world
        .all_reduce_into(&mine[..], &mut sum[..], SystemOperation::sum())
        .map_err(fail)?;
    let mut broadcast = vec![rank as u8; BROADCAST];
    root.broadcast_into(&mut broadcast[..]).map_err(fail)?;
    let want = u64::from(size as u32) * u64::from((size as u32).saturating_sub(1)) / 2;
    if sum.iter().any(|&v| v != want) || broadcast.iter().any(|&b| b != 0) {
        return Err("the all-reduce or the broadcast gave a wrong result".to_owned());
    }
    // Every page of the window written, as a rank's computation would.
    let window = Window::allocate(world, WINDOW, 1, &Info::new()).map_err(fail)?;
    window
        .write_local(0, &vec![rank as u8; WINDOW][..])
        .map_err(fail)?;
    let with_window = footprint()?;
    let mut measured = after_messages.to_array().to_vec();
    measured.extend(with_window.to_array());
    world.barrier().map_err(fail)?;
    window.free().map_err(fail)?;
    if rank != 0 {
        return root.gather_into(&measured[..]).map_err(fail);
    }
    let mut all = vec![0u64; measured.len() * size as usize];
    root.gather_into_root(&measured[..], &mut all[..])
        .map_err(fail)?;
    let [messages, collectives]: [Vec<Footprint>; 2] = [0, 1].map(|phase| {
        all.chunks_exact(16)
            .map(|rank| Footprint::from_slice(&rank[8 * phase..8 * phase + 8]))
            .collect()
    });
    print!(
        "{}",
        report(
            options.pattern,
            &format!(
                "after {ROUNDS} messages of {} KiB each way with each partner",
                MESSAGE >> 10
            ),
            &messages
        )
    );
    print!(
        "{}",
        report(
            options.pattern,
            &format!(
                "then a barrier, an all-reduce of {} KiB, a broadcast of {} KiB, and a window of {} KiB per rank held",
                REDUCED >> 10,
                BROADCAST >> 10,
                WINDOW >> 10
            ),
            &collectives
        )
    );
    Ok(())
}

/// This rank's mappings of oxmpi's shared memory files, now.
fn footprint() -> Result<Footprint, String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .map_err(|e| format!("cannot read /proc/self/smaps: {e}"))?;
    Ok(shared_segments(&smaps))
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

/// The report of one measurement, `when` the ranks made it: a row per
/// rank, then the smallest, mean and largest Pss and the node's total.
pub fn report(pattern: Pattern, when: &str, ranks: &[Footprint]) -> String {
    let n = ranks.len();
    let mut out = format!(
        "# oxbench memory: shared memory mapped per rank, {n} ranks, pattern {} ({})\n\
         # {when}; {}\n\
         # {:>4} {:>7} {:>12} {:>10} {:>8} {:>12} {:>10} {:>10}\n",
        pattern.name(),
        pattern.description(),
        transports_note(),
        "rank",
        "queues",
        "mapped(KiB)",
        "Pss(KiB)",
        "regions",
        "mapped(KiB)",
        "Pss(KiB)",
        "all Pss"
    );
    for (rank, f) in ranks.iter().enumerate() {
        let (q, r) = (f.queues, f.regions);
        out += &format!(
            "  {rank:>4} {:>7} {:>12} {:>10} {:>8} {:>12} {:>10} {:>10}\n",
            q.segments,
            q.size_kib,
            q.pss_kib,
            r.segments,
            r.size_kib,
            r.pss_kib,
            q.pss_kib + r.pss_kib
        );
    }
    let pss: Vec<u64> = ranks
        .iter()
        .map(|f| f.queues.pss_kib + f.regions.pss_kib)
        .collect();
    let total: u64 = pss.iter().sum();
    let regions: u64 = ranks.iter().map(|f| f.regions.pss_kib).sum();
    out += &format!(
        "# Pss per rank (KiB): min {} mean {} max {}; all ranks {} KiB, of which regions {} KiB\n",
        pss.iter().min().unwrap_or(&0),
        total / n.max(1) as u64,
        pss.iter().max().unwrap_or(&0),
        total,
        regions
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
7f0000600000-7f0000611000 rw-s 00000000 00:01 45 /memfd:oxmpi-window (deleted)
Size:                 68 kB
Rss:                  64 kB
Pss:                  16 kB
";

    #[test]
    fn only_oxmpis_segments_count_each_kind_apart() {
        assert_eq!(
            shared_segments(SMAPS),
            Footprint {
                queues: Mapped {
                    segments: 2,
                    size_kib: 2056,
                    rss_kib: 1124,
                    pss_kib: 562
                },
                regions: Mapped {
                    segments: 1,
                    size_kib: 68,
                    rss_kib: 64,
                    pss_kib: 16
                },
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
        let f = |queues, regions| Footprint {
            queues: m(queues),
            regions: m(regions),
        };
        let text = report(Pattern::Ring, "now", &[f(100, 10), f(300, 30)]);
        assert!(text.contains("2 ranks, pattern ring"), "{text}");
        assert!(
            text.contains("min 110 mean 220 max 330; all ranks 440 KiB, of which regions 40 KiB"),
            "{text}"
        );
    }
}
