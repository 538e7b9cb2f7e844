//! Collectives over shared memory, for communicators whose processes all
//! share a host: barrier, broadcast, reduce and all-reduce of small data
//! through one shared region per communicator, without messages.
//!
//! # The region
//! Made the first time a communicator runs one of these collectives (all
//! its processes do so at the same call, as they call collectives in the
//! same order): every process all-gathers its host identity's key, and
//! rank 0 the name of a region it made ([`SharedRegion`], a memory file
//! the others copy from it with `pidfd_getfd`); when all keys are equal,
//! the others attach it; then an all-reduce tells whether every process
//! has it. If not — processes on several hosts, a kernel that forbids the
//! copy (ptrace restrictions), shared memory not among the transports
//! (`OXMPI_TRANSPORTS`), or `OXMPI_COLL_SHM=0` — the communicator keeps to
//! the message algorithms, and `OXMPI_VERBOSE=1` says why.
//!
//! Each process has a 64-byte line (its generation, and the length of
//! what it published for even and for odd generations) and two data slots
//! (for even and odd generations).
//!
//! # The protocol
//! Every operation has a generation `g`, counted alike by every process.
//! A process enters it by waiting until every line shows at least `g - 1`
//! (everyone has finished `g - 2`, the last user of this parity's slots),
//! writing its data to its slot of parity `g`, and storing `g` (with the
//! length) in its line with release ordering; it then waits for the lines
//! it needs to show `g` and reads their slots after an acquire load:
//! - barrier: every line;
//! - broadcast: the root's (the root waits for no one);
//! - all-reduce: every line, then each process combines all slots in rank
//!   order (`x0 op (x1 op ... )`), so every process gets the same result
//!   and non-commutative operations see rank order;
//! - reduce: the root waits for every line and combines.
//!
//! A process whose length differs from another's gets the same errors as
//! with messages (`MPI_ERR_TRUNCATE` when it would receive more,
//! `MPI_ERR_COUNT` less) after taking its part.
//!
//! A waiting process polls the device now and then (messages and
//! pending non-blocking collectives keep moving), yields the processor now and then (a node with more processes
//! than cores), and naps briefly once it has waited longer than the
//! device's spin time, since no one wakes it from a kernel sleep.

use super::engine::block_on;
use super::op::Reduction;
use super::team::{Scratch, Team};
use super::typed::{Input, Output};
use crate::{with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::Idle;
use oxmpi_adi::host::HostId;
use oxmpi_adi::vlog;
use oxmpi_shm::region::{RegionName, SharedRegion};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The environment variable that turns the shared-memory collectives off
/// (`0`); they are on by default where they can be.
pub const COLL_SHM_ENV: &str = "OXMPI_COLL_SHM";

/// Bytes of a process's line.
const LINE: usize = 64;
/// The region's share of data slots: 2 per process, at most this much in
/// all, each from [`SLOT_MIN`] to [`SLOT_MAX`] bytes.
const SLOTS_BUDGET: usize = 256 << 10;
const SLOT_MIN: usize = 1 << 10;
const SLOT_MAX: usize = 8 << 10;
/// How long a wait sleeps at a time once it has spun for the device's
/// spin time.
const NAP: Duration = Duration::from_micros(20);
/// Fruitless checks between two polls of the device, and between two
/// yields of the processor.
const POLL_EVERY: u32 = 64;
const YIELD_EVERY: u32 = 4096;

/// Data up to this many bytes is combined in a buffer on the stack.
const SMALL: usize = 256;

/// A stack buffer aligned for every element type (as [`Scratch`] is).
#[repr(C, align(16))]
struct Aligned([u8; SMALL]);

/// A communicator's shared region and this process's place in it.
#[derive(Debug)]
pub(crate) struct NodeRegion {
    region: SharedRegion,
    rank: usize,
    size: usize,
    /// Bytes of each data slot: the most one process can publish.
    slot: usize,
    /// The generation of this process's last operation.
    generation: AtomicU64,
}

impl NodeRegion {
    /// Makes or attaches the region of the team's processes, if they all
    /// can: see the module docs. Collective over `t`.
    pub(crate) fn establish(t: &Team) -> Result<Option<NodeRegion>> {
        let (n, rank) = (t.size(), t.rank());
        let wanted = wanted(n);
        let host = HostId::current().ok().map(|h| h.key());
        let slot = slot_bytes(n);
        let made = match (rank, &host, &wanted) {
            (0, Some(_), Ok(())) => match SharedRegion::create(region_len(n, slot)) {
                Ok(made) => Some(made),
                Err(e) => {
                    vlog!("collectives over shared memory: cannot make a region: {e}");
                    None
                }
            },
            _ => None,
        };
        // Each process: its host key (zeros if unknown), and rank 0 the
        // region's name (zeros if none).
        let mut mine = [0u64; 8];
        if let Some(key) = &host {
            for (word, bytes) in mine[..4].iter_mut().zip(key.chunks_exact(8)) {
                *word = u64::from_ne_bytes(bytes.try_into().expect("8-byte chunks"));
            }
        }
        if let Some((_, name)) = &made {
            mine[4..7].copy_from_slice(&name.to_words());
            mine[7] = 1;
        }
        let mut all = vec![0u64; 8 * n];
        {
            let mine = Input::new(&mine)?;
            let mut gathered = Output::new(&mut all[..])?;
            block_on(super::algorithms::all_gather(
                t,
                mine.bytes(),
                gathered.bytes_mut(),
            ))?;
            gathered.finish()?;
        }
        let one_host = host.is_some() && all.chunks_exact(8).all(|p| p[..4] == mine[..4]);
        let region = match (made, wanted) {
            (_, Err(why)) => {
                vlog!("collectives over shared memory: off ({why})");
                None
            }
            _ if !one_host || all[7] == 0 => None,
            (Some((made, _)), Ok(())) => Some(made),
            (None, Ok(())) => {
                let words = [all[4], all[5], all[6]];
                let attached = RegionName::from_words(words)
                    .ok_or_else(|| "a malformed region name".to_owned())
                    .and_then(|name| SharedRegion::attach(&name).map_err(|e| e.to_string()));
                attached
                    .inspect_err(|e| {
                        vlog!("collectives over shared memory: cannot attach rank 0's region: {e}")
                    })
                    .ok()
            }
        };
        let everyone = agree(t, region.is_some())?;
        Ok(region.filter(|_| everyone).map(|region| NodeRegion {
            region,
            rank,
            size: n,
            slot,
            generation: AtomicU64::new(0),
        }))
    }

    /// Whether messages of `len` bytes fit a slot.
    pub(crate) fn fits(&self, len: usize) -> bool {
        len <= self.slot
    }

    /// `MPI_Barrier`.
    pub(crate) fn barrier(&self) -> Result<()> {
        let g = self.enter(&[])?;
        self.wait_for_all(g)
    }

    /// `MPI_Bcast` of `buf` (which fits) from `root`.
    pub(crate) fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        if self.rank == root {
            self.enter(buf)?;
            return Ok(());
        }
        let g = self.enter(&[])?;
        self.wait_for(root, g)?;
        self.take(root, g, buf)
    }

    /// `MPI_Allreduce` in place on `acc` (which fits).
    pub(crate) fn all_reduce(&self, acc: &mut [u8], red: &Reduction) -> Result<()> {
        let g = self.enter(acc)?;
        self.wait_for_all(g)?;
        self.combine(g, acc, red)
    }

    /// `MPI_Reduce` to `root` in place on `acc` (which fits): only the
    /// root's is the result.
    pub(crate) fn reduce(&self, root: usize, acc: &mut [u8], red: &Reduction) -> Result<()> {
        let g = self.enter(acc)?;
        if self.rank != root {
            return Ok(());
        }
        self.wait_for_all(g)?;
        self.combine(g, acc, red)
    }

    /// Starts this process's next operation, publishing `data`: returns
    /// its generation.
    fn enter(&self, data: &[u8]) -> Result<u64> {
        let g = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        // The slots of this parity were last read in generation g - 2:
        // everyone has finished it once every line shows g - 1.
        self.wait_for_all(g - 1)?;
        if !self.region.write(self.slot_offset(g, self.rank), data) {
            return Err(outside(data.len(), self.slot));
        }
        let [generation, len] = self.line(self.rank, g)?;
        len.store(data.len() as u64, Ordering::Relaxed);
        generation.store(g, Ordering::Release);
        Ok(g)
    }

    /// Copies `from`'s data of generation `g` into `buf`, which must be as
    /// long (else the error of a message of the other length).
    fn take(&self, from: usize, g: u64, buf: &mut [u8]) -> Result<()> {
        let len = self.published_len(from, g)?;
        check_len(len, buf.len(), from)?;
        if self.region.read(self.slot_offset(g, from), buf) {
            Ok(())
        } else {
            Err(outside(buf.len(), self.slot))
        }
    }

    /// Replaces `acc` (this process's contribution) by every process's
    /// data of generation `g` combined in rank order.
    fn combine(&self, g: u64, acc: &mut [u8], red: &Reduction) -> Result<()> {
        // Small data (the common case here) needs no allocation; either
        // buffer is 16-byte aligned, as every element type needs.
        let mut on_stack = Aligned([0; SMALL]);
        let mut on_heap = None;
        let input = if acc.len() <= SMALL {
            &mut on_stack.0[..acc.len()]
        } else {
            on_heap.insert(Scratch::zeroed(acc.len())).bytes_mut()
        };
        let mut mismatch = None;
        // acc = x(n-1), then x(k) op acc down to rank 0. This process's
        // own data is read back from its slot like the others'.
        for from in (0..self.size).rev() {
            let taken = self.take(from, g, input);
            if let Err(e) = taken {
                mismatch.get_or_insert(e);
                continue;
            }
            if from == self.size - 1 {
                acc.copy_from_slice(input);
            } else {
                red.apply(input, acc)?;
            }
        }
        mismatch.map_or(Ok(()), Err)
    }

    /// Waits until every line shows generation `g` or later.
    fn wait_for_all(&self, g: u64) -> Result<()> {
        for from in 0..self.size {
            self.wait_for(from, g)?;
        }
        Ok(())
    }

    /// Waits until `from`'s line shows generation `g` or later.
    fn wait_for(&self, from: usize, g: u64) -> Result<()> {
        let [seen, _] = self.line(from, g)?;
        if seen.load(Ordering::Acquire) >= g {
            return Ok(());
        }
        let mut idle = Idle::new();
        let mut checks = 0u32;
        loop {
            if seen.load(Ordering::Acquire) >= g {
                return Ok(());
            }
            checks = checks.wrapping_add(1);
            if checks.is_multiple_of(POLL_EVERY) {
                let tired = with_device(|d| {
                    if d.check_device(false)? {
                        idle = Idle::new();
                        return Ok(false);
                    }
                    Ok(d.idle(&mut idle))
                })?;
                // Pending non-blocking collectives move on too: another
                // process may wait for this one's part of them.
                if super::engine::has_pending() {
                    super::engine::advance()?;
                }
                if tired {
                    std::thread::sleep(NAP);
                } else if checks.is_multiple_of(YIELD_EVERY) {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
    }

    /// The length `from` published with generation `g` (which it has
    /// reached).
    fn published_len(&self, from: usize, g: u64) -> Result<usize> {
        let len = self.line(from, g)?[1].load(Ordering::Relaxed);
        usize::try_from(len)
            .ok()
            .filter(|&len| len <= self.slot)
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    format!(
                        "rank {from} published {len} bytes in a slot of {}",
                        self.slot
                    ),
                )
            })
    }

    /// The words of `rank`'s line that generation `g` uses: the
    /// generation, and the length of generation `g`'s parity.
    fn line(&self, rank: usize, g: u64) -> Result<[&AtomicU64; 2]> {
        let word = |i: usize| self.region.word(rank * LINE + 8 * i);
        match (word(0), word(1 + (g % 2) as usize)) {
            (Some(generation), Some(len)) => Ok([generation, len]),
            _ => Err(Error::new(
                ErrorClass::Intern,
                format!("the line of rank {rank} lies outside the shared region"),
            )),
        }
    }

    /// Where `rank`'s slot of generation `g`'s parity starts.
    fn slot_offset(&self, g: u64, rank: usize) -> usize {
        let parity = (g % 2) as usize;
        self.size * LINE + (parity * self.size + rank) * self.slot
    }
}

/// Whether this process may use shared memory for collectives, or why not.
fn wanted(n: usize) -> std::result::Result<(), String> {
    if n < 2 {
        return Err("one process".to_owned());
    }
    if std::env::var(COLL_SHM_ENV).is_ok_and(|v| v == "0") {
        return Err(format!("{COLL_SHM_ENV}=0"));
    }
    if !with_device(|d| Ok(d.offers("shm"))).unwrap_or(false) {
        return Err("shared memory is not among this process's transports".to_owned());
    }
    Ok(())
}

/// Bytes of each data slot for `n` processes.
fn slot_bytes(n: usize) -> usize {
    (SLOTS_BUDGET / (2 * n)).clamp(SLOT_MIN, SLOT_MAX) / LINE * LINE
}

/// Bytes of the region for `n` processes: lines, then two slots each.
fn region_len(n: usize, slot: usize) -> usize {
    n * LINE + 2 * n * slot
}

/// Whether every process of `t` says `yes` (a bitwise-and all-reduce).
fn agree(t: &Team, yes: bool) -> Result<bool> {
    let band = super::op::SystemOperation::bitwise_and();
    let reduction = Reduction::new(&band, crate::datatype::ElementType::of::<u64>())?;
    let mut word = [u64::from(yes)];
    let mut output = Output::new(&mut word[..])?;
    block_on(super::algorithms::all_reduce(
        t,
        output.bytes_mut(),
        &reduction,
    ))?;
    output.finish()?;
    Ok(word[0] == 1)
}

/// The error of a message of `len` bytes where `expected` were: as the
/// message algorithms report it.
fn check_len(len: usize, expected: usize, from: usize) -> Result<()> {
    match len.cmp(&expected) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(Error::new(
            ErrorClass::Truncate,
            format!("rank {from} contributed {len} bytes where this process expected {expected}"),
        )),
        std::cmp::Ordering::Less => Err(Error::new(
            ErrorClass::Count,
            format!("rank {from} contributed {len} bytes where this process expected {expected}"),
        )),
    }
}

fn outside(len: usize, slot: usize) -> Error {
    Error::new(
        ErrorClass::Intern,
        format!("{len} bytes do not fit a shared slot of {slot}"),
    )
}
