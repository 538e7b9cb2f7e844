//! Long messages of a remote-copy rendezvous (verbs: RDMA READ into the
//! receive buffer) run as real jobs: `rendezvous CHECK`, started by the
//! harness through oxrun. Each check verifies its own results and exits
//! non-zero, saying why, when something is wrong.
//! - `repeat`: rank 0 sends one 4 MiB buffer 20 times, refilled each
//!   time, and rank 1 receives into one buffer (under `OXMPI_VERBOSE=1`
//!   each rank says it registered its buffer once);
//! - `remap`: rank 0 sends twice from a mapping, unmaps it, maps the same
//!   addresses again with other bounds and sends new data from there:
//!   what arrives is the new data (the stale registration is invalidated);
//! - `many`: every rank sends 8 messages of 32 KiB to 3 MiB to every other
//!   at once, and receives them from any source into buffers posted first;
//! - `refused` (3 ranks): rank 0 makes the buffer of a long send to rank 1
//!   inaccessible before rank 1 receives it (an erroneous program): the
//!   read of it is refused, the receive and the send fail with
//!   `MPI_ERR_PROC_FAILED` naming the remote access error and the broken
//!   pair, and both ranks still talk to rank 2.

use oxmpi::request::{scope, wait_all};
use oxmpi::Threading;
use oxmpi::{Communicator, ErrorClass, Result};
use oxmpi_jobs::checks::{check_bytes, ensure, expect_class, fail, fill};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;

const MIB: usize = 1 << 20;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("rendezvous {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            match check.as_str() {
                "repeat" => repeat(&world),
                "remap" => remap(&world),
                "many" => many(&world),
                "refused" => refused(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

fn repeat(world: &Communicator) -> Result<()> {
    const ROUNDS: u64 = 20;
    let peer = world.process_at_rank(1 - world.rank());
    let mut buf = vec![0u8; 4 * MIB];
    for round in 0..ROUNDS {
        if world.rank() == 0 {
            fill(round, &mut buf);
            peer.send(&buf[..])?;
        } else {
            let status = peer.receive_into(&mut buf[..])?;
            ensure(status.byte_count() == buf.len(), || {
                format!("round {round}: {} bytes", status.byte_count())
            })?;
            check_bytes(round, &buf, &format!("round {round}"))?;
        }
    }
    Ok(())
}

/// An anonymous private mapping of `len` bytes; at `at` if given, which
/// must be a range of the caller's own mappings, replaced at once
/// (`MAP_FIXED`: no other thread, such as the soft NIC's, can take the
/// place between an unmap and a map).
fn map(at: Option<usize>, len: usize) -> Result<*mut u8> {
    let (addr, fixed) = match at {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a new anonymous mapping at a place the kernel picks, or over
    // the caller's own mapping, which nothing references any more.
    let p = unsafe {
        libc::mmap(
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || at.is_some_and(|a| p as usize != a) {
        return Err(fail(format!(
            "mmap of {len} bytes at {at:x?}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(p.cast())
}

fn remap(world: &Communicator) -> Result<()> {
    let len = 4 * MIB;
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 1 {
        let mut buf = vec![0u8; len];
        for seed in [1, 2, 3] {
            let status = peer.receive_into(&mut buf[..])?;
            ensure(status.byte_count() == len, || {
                format!("message {seed}: {} bytes", status.byte_count())
            })?;
            check_bytes(seed, &buf, &format!("message {seed}"))?;
        }
        return Ok(());
    }
    // Sent from the first half of a mapping twice the message's length.
    let p = map(None, 2 * len)?;
    {
        // SAFETY: the mapping just made, used through this slice alone
        // until it is unmapped below.
        let first = unsafe { std::slice::from_raw_parts_mut(p, len) };
        for seed in [1, 2] {
            fill(seed, first);
            peer.send(&first[..])?;
        }
    }
    // The same addresses again, in a mapping of the message's length: the
    // old mapping's second half unmapped, its first replaced.
    // SAFETY: the second half of the mapping made above; no reference to
    // it is left.
    if unsafe { libc::munmap(p.add(len).cast(), len) } != 0 {
        return Err(fail(format!("munmap: {}", std::io::Error::last_os_error())));
    }
    let q = map(Some(p as usize), len)?;
    {
        // SAFETY: the new mapping, used through this slice alone until it
        // is unmapped below.
        let second = unsafe { std::slice::from_raw_parts_mut(q, len) };
        fill(3, second);
        peer.send(&second[..])?;
    }
    // SAFETY: the mapping made above; no reference to it is left.
    if unsafe { libc::munmap(q.cast(), len) } != 0 {
        return Err(fail(format!("munmap: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

/// Length of message `k` from `from` to `to`: from just past the eager
/// limit to 3 MiB, none starting on a page.
fn many_len(from: i32, to: i32, k: usize) -> usize {
    let lens = [
        32 * 1024 + 1,
        64 * 1024 - 7,
        200 * 1024 + 3,
        MIB - 1,
        MIB + 4097,
        2 * MIB + 11,
        3 * MIB,
        96 * 1024 + 5,
    ];
    lens[(k + from as usize + 2 * to as usize) % lens.len()]
}

fn many(world: &Communicator) -> Result<()> {
    const EACH: usize = 8;
    let (rank, size) = (world.rank(), world.size());
    let seed = |from: i32, to: i32, k: usize| (from * 1000 + to * 100) as u64 + k as u64;
    let outgoing: Vec<(i32, Vec<u8>)> = (0..size)
        .filter(|&to| to != rank)
        .flat_map(|to| (0..EACH).map(move |k| (to, k)))
        .map(|(to, k)| {
            let mut data = vec![0u8; many_len(rank, to, k) + 1];
            fill(seed(rank, to, k), &mut data[1..]);
            (to, data)
        })
        .collect();
    let incoming = (size as usize - 1) * EACH;
    let mut buffers: Vec<Vec<u8>> = (0..incoming).map(|_| vec![0u8; 3 * MIB + 2]).collect();
    let statuses = scope(|s| -> Result<_> {
        let mut receives = Vec::new();
        for buf in buffers.iter_mut() {
            receives.push(world.any_process().immediate_receive_into_with_tag(
                s,
                &mut buf[1..],
                7,
            )?);
        }
        let mut sends = Vec::new();
        for (to, data) in &outgoing {
            let peer = world.process_at_rank(*to);
            sends.push(peer.immediate_send_with_tag(s, &data[1..], 7)?);
        }
        let statuses = wait_all(receives)?;
        wait_all(sends)?;
        Ok(statuses)
    })?;
    // Per source, messages match in the order they were sent.
    let mut next = vec![0usize; size as usize];
    for (buf, status) in buffers.iter().zip(statuses) {
        let from = status.source_rank();
        let k = next[from as usize];
        next[from as usize] += 1;
        let len = many_len(from, rank, k);
        ensure(status.byte_count() == len, || {
            format!(
                "message {k} from {from}: {} bytes, expected {len}",
                status.byte_count()
            )
        })?;
        check_bytes(
            seed(from, rank, k),
            &buf[1..1 + len],
            &format!("message {k} from {from}"),
        )?;
    }
    Ok(())
}

fn refused(world: &Communicator) -> Result<()> {
    let len = 4 * MIB;
    ensure(world.size() == 3, || "refused needs 3 ranks".into())?;
    match world.rank() {
        0 => {
            let p = map(None, len)?;
            {
                // SAFETY: the mapping just made, used through this slice
                // alone; the program breaks the send's rule on purpose by
                // making it inaccessible during the send, which only the
                // NIC reads.
                let data = unsafe { std::slice::from_raw_parts_mut(p, len) };
                fill(1, data);
                let sent = scope(|s| -> Result<Result<oxmpi::Status>> {
                    let send = world
                        .process_at_rank(1)
                        .immediate_send_with_tag(s, &data[..], 1)?;
                    // SAFETY: the mapping made above; only the NIC reads it.
                    if unsafe { libc::mprotect(p.cast(), len, libc::PROT_NONE) } != 0 {
                        return Err(fail(format!(
                            "mprotect: {}",
                            std::io::Error::last_os_error()
                        )));
                    }
                    world.process_at_rank(1).send_with_tag(&0u8, 2)?;
                    Ok(send.wait())
                })?;
                if let Err(e) = &sent {
                    ensure(e.message().contains("rendezvous read"), || {
                        format!("the send's error does not name the refused read: {e}")
                    })?;
                }
                expect_class(sent, ErrorClass::ProcFailed, "the refused send")?;
            }
            // SAFETY: the mapping made above; no reference to it is left.
            if unsafe { libc::munmap(p.cast(), len) } != 0 {
                return Err(fail(format!("munmap: {}", std::io::Error::last_os_error())));
            }
        }
        1 => {
            let zero = world.process_at_rank(0);
            let mut go = [0u8];
            zero.receive_into_with_tag(&mut go[..], 2)?;
            let mut buf = vec![0u8; len];
            let received = zero.receive_into_with_tag(&mut buf[..], 1);
            if let Err(e) = &received {
                ensure(e.message().contains("REM_ACCESS_ERR"), || {
                    format!("the receive's error does not name the remote access error: {e}")
                })?;
            }
            expect_class(received, ErrorClass::ProcFailed, "the refused receive")?;
            // The pair is broken: later messages between them fail too.
            expect_class(
                zero.send(&1u8),
                ErrorClass::ProcFailed,
                "a send over the broken pair",
            )?;
        }
        _ => {}
    }
    // Everyone still reaches rank 2, by long messages too.
    if world.rank() == 2 {
        for from in [0, 1] {
            let mut buf = vec![0u8; len];
            world.process_at_rank(from).receive_into(&mut buf[..])?;
            check_bytes(10 + from as u64, &buf, &format!("message from {from}"))?;
            world.process_at_rank(from).send(&buf[..])?;
        }
    } else {
        let mut data = vec![0u8; len];
        fill(10 + world.rank() as u64, &mut data);
        let two = world.process_at_rank(2);
        two.send(&data[..])?;
        two.receive_into(&mut data[..])?;
        check_bytes(10 + world.rank() as u64, &data, "echo from rank 2")?;
    }
    Ok(())
}
