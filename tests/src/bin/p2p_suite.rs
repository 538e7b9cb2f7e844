//! Point-to-point checks run as real jobs: `p2p_suite CHECK`, started by
//! the harness through oxrun. Each check verifies its own results and
//! exits non-zero, saying why, when something is wrong.

use oxmpi::collective::SystemOperation;
use oxmpi::request::{scope, wait_all, wait_any};
use oxmpi::{Communicator, ErrorClass, Result, Threading, ANY_TAG, PROC_NULL};
use oxmpi_jobs::checks::{check_bytes, cpu_time, ensure, fail, filled};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    let threading = if check == "threads" || check == "mprobe" {
        Threading::Multiple
    } else {
        Threading::Single
    };
    run_check(&format!("p2p_suite {check}"), threading, |universe| {
        let world = world_returning_errors(universe);
        match check.as_str() {
            "all-pairs" => all_pairs(&world),
            "ordered" => ordered(&world),
            "sizes" => sizes(&world),
            "many-irecv" => many_irecv(&world),
            "truncation" => truncation(&world),
            "probe" => probe_unknown_size(&world),
            "self" => self_messages(&universe.self_comm(), &world),
            "errors" => argument_errors(&world),
            "threads" => threads(&world),
            "single-thread" => single_thread(&world),
            "modes" => send_modes(&world),
            "proc-null" => proc_null(&world),
            "cancel-send" => cancel_send(&world),
            "mprobe" => mprobe_race(&world),
            "huge" => huge_message(&world),
            "long" => long_messages(&world),
            "mid-sizes" => mid_sizes(&world),
            "flood" => flood(&world),
            "direct" => direct_receives(&world),
            "reply-burst" => reply_burst(&world),
            "crowded" => crowded(&world),
            "lazy-queues" => lazy_queues(&world),
            "affinity" => affinity(&world),
            // Failures the launcher must notice: rank 1 leaves without
            // finalizing (exit code 0), or aborts the job with code 7.
            "exit-early" => {
                if world.rank() == 1 {
                    std::process::exit(0);
                }
                hold(&world)
            }
            "abort" => {
                if world.rank() == 1 {
                    world.abort(7);
                }
                hold(&world)
            }
            other => Err(fail(format!("unknown check {other:?}"))),
        }
    })
}

/// The shared-memory queues this process maps: the distinct memory files
/// (by inode: a placed queue may show as several lines) of its
/// `/proc/self/maps` lines labelled `/memfd:oxmpi-shm-`.
fn queues_mapped() -> Result<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| fail(format!("reading /proc/self/maps: {e}")))?;
    let inodes: std::collections::HashSet<&str> = maps
        .lines()
        .filter(|line| line.contains("/memfd:oxmpi-shm-"))
        .filter_map(|line| line.split_whitespace().nth(4))
        .collect();
    Ok(inodes.len())
}

/// Queues are made only when a pair first talks: in a ring over shared
/// memory (at least 3 ranks, so that the two neighbours differ), a rank
/// maps none before its first message and two after it (to its next
/// neighbour, from its previous one), whatever the job's size.
fn lazy_queues(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    ensure(size >= 3, || {
        format!("lazy-queues needs 3 ranks or more, not {size}")
    })?;
    let before = queues_mapped()?;
    let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
    let (out, mut got) = (filled(rank as u64, 8), [0u8; 8]);
    scope(|s| -> Result<()> {
        let receive = world
            .process_at_rank(previous)
            .immediate_receive_into(s, &mut got[..])?;
        world
            .process_at_rank(next)
            .immediate_send(s, &out[..])?
            .wait()?;
        receive.wait()?;
        Ok(())
    })?;
    check_bytes(previous as u64, &got, "the ring's message")?;
    let after = queues_mapped()?;
    ensure((before, after) == (0, 2), || {
        format!(
            "rank {rank} of {size} mapped {before} queues before the ring and {after} after \
             it, not 0 and 2"
        )
    })
}

/// Prints this rank's CPU affinity as the kernel has it, `rank R:
/// Cpus_allowed_list: LIST` (from `/proc/self/status`), for the harness
/// to compare with what oxrun reported.
fn affinity(world: &Communicator) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| fail(format!("reading /proc/self/status: {e}")))?;
    let line = status
        .lines()
        .find(|line| line.starts_with("Cpus_allowed_list:"))
        .ok_or_else(|| fail("no Cpus_allowed_list in /proc/self/status"))?;
    println!("rank {}: {line}", world.rank());
    Ok(())
}

/// Every rank sends to every other; receives are from ANY_SOURCE.
fn all_pairs(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let mut got = vec![false; size as usize];
    let payloads: Vec<Vec<u8>> = (0..size)
        .map(|to| filled((rank * 1000 + to) as u64, 100 + to as usize))
        .collect();
    scope(|s| -> Result<()> {
        let mut sends = Vec::new();
        for to in (0..size).filter(|&to| to != rank) {
            sends.push(world.process_at_rank(to).immediate_send_with_tag(
                s,
                &payloads[to as usize][..],
                5,
            )?);
        }
        for _ in 1..size {
            let (data, status) = world.any_process().receive_vec::<u8>()?;
            let from = status.source_rank();
            ensure(status.tag() == 5, || {
                format!("tag {} from {from}", status.tag())
            })?;
            ensure(!got[from as usize], || {
                format!("two messages from rank {from}")
            })?;
            got[from as usize] = true;
            ensure(data.len() == 100 + rank as usize, || {
                format!("length {} from {from}", data.len())
            })?;
            check_bytes((from * 1000 + rank) as u64, &data, "all-pairs message")?;
        }
        wait_all(sends)?;
        Ok(())
    })
}

/// 10,000 messages with one tag arrive in the order they were sent, also
/// when received with wildcards.
fn ordered(world: &Communicator) -> Result<()> {
    const N: u64 = 10_000;
    match world.rank() {
        0 => {
            for i in 0..N {
                world.process_at_rank(1).send_with_tag(&i, 3)?;
            }
        }
        1 => {
            for i in 0..N {
                let (v, status) = if i % 2 == 0 {
                    world.any_process().receive::<u64>()?
                } else {
                    world.process_at_rank(0).receive::<u64>()?
                };
                ensure(v == i && status.tag() == 3, || {
                    format!("message {i} arrived as {v} (tag {})", status.tag())
                })?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Every rank but 0 sends rank 0 `FLOOD` eager messages (1 byte to
/// 4000) before rank 0 posts a receive: all of them are unexpected, and a
/// transport with bounded buffers must hold them back without deadlock
/// (the barrier's own messages queue behind them). Then rank 0 receives
/// them, from each sender in order, every byte checked.
fn flood(world: &Communicator) -> Result<()> {
    const FLOOD: u64 = 3000;
    let len = |i: u64| 1 + (i as usize * 37) % 4000;
    if world.rank() != 0 {
        let zero = world.process_at_rank(0);
        for i in 0..FLOOD {
            let seed = i + 1_000_000 * world.rank() as u64;
            zero.send_with_tag(&filled(seed, len(i))[..], 9)?;
        }
        return world.barrier();
    }
    world.barrier()?;
    for i in 0..FLOOD {
        for source in 1..world.size() {
            let (data, status) = world.process_at_rank(source).receive_vec::<u8>()?;
            ensure(data.len() == len(i) && status.tag() == 9, || {
                format!(
                    "message {i} from rank {source} has {} bytes and tag {}",
                    data.len(),
                    status.tag()
                )
            })?;
            check_bytes(i + 1_000_000 * source as u64, &data, "flood")?;
        }
    }
    Ok(())
}

fn threshold() -> usize {
    std::env::var("OXMPI_TCP_EAGER_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 * 1024)
}

/// Messages across the eager/rendezvous threshold and up to 64 MiB, every
/// byte checked, in both directions.
fn sizes(world: &Communicator) -> Result<()> {
    let t = threshold();
    let sizes = [0, 1, t - 1, t, t + 1, 1 << 20, 64 << 20];
    if world.rank() > 1 {
        return Ok(());
    }
    let peer = world.process_at_rank(1 - world.rank());
    for (k, &len) in sizes.iter().enumerate() {
        let seed = k as u64;
        if world.rank() == 0 {
            peer.send_with_tag(&filled(seed, len)[..], k as i32)?;
            let mut back = vec![0u8; len];
            let status = peer.receive_into_with_tag(&mut back[..], k as i32)?;
            ensure(status.byte_count() == len, || {
                format!("echo of {len} bytes came back with {}", status.byte_count())
            })?;
            check_bytes(seed + 100, &back, &format!("echo of {len} bytes"))?;
        } else {
            let mut buf = vec![0u8; len];
            let status = peer.receive_into(&mut buf[..])?;
            ensure(
                status.byte_count() == len && status.tag() == k as i32,
                || {
                    format!(
                        "{len}-byte message arrived with {} bytes, tag {}",
                        status.byte_count(),
                        status.tag()
                    )
                },
            )?;
            check_bytes(seed, &buf, &format!("{len}-byte message"))?;
            peer.send_with_tag(&filled(seed + 100, len)[..], k as i32)?;
        }
    }
    Ok(())
}

/// Messages between the shared-memory transport's always-eager limit (6
/// KiB) and its eager limit (16 KiB, the longest single copy read whole
/// too), and around 32 KiB (the longest read whole when alone), from and
/// into buffers off page boundaries, every byte checked. One at a time,
/// each waited for (by single copy past 6 KiB where cross-memory attach
/// is on); then in windows of one tag (the first by single copy, read
/// whole, those sent while it is under way through the queue, or past
/// 16 KiB by single copies in halves), which must arrive in the order
/// sent, with their receives posted first, and posted only after every
/// message of the window arrived.
fn mid_sizes(world: &Communicator) -> Result<()> {
    const WINDOW: usize = 16;
    // Tag of the message that follows a window whose receives wait.
    const ARRIVED: i32 = 999;
    let sizes = [6144, 6145, 8192, 12_345, 16_384, 32_768, 32_769];
    let rank = world.rank();
    if rank > 1 {
        return Ok(());
    }
    let peer = world.process_at_rank(1 - rank);
    let seed = |k: usize, i: usize| (k * 100 + i) as u64;
    for (k, &len) in sizes.iter().enumerate() {
        let tag = k as i32;
        let out = filled(seed(k, rank as usize), len + 3);
        let mut back = vec![0u8; len + 5];
        if rank == 0 {
            peer.send_with_tag(&out[3..], tag)?;
            peer.receive_into_with_tag(&mut back[5..], tag)?;
        } else {
            peer.receive_into_with_tag(&mut back[5..], tag)?;
            peer.send_with_tag(&out[3..], tag)?;
        }
        let expected = &filled(seed(k, 1 - rank as usize), len + 3)[3..];
        ensure(&back[5..] == expected, || {
            format!("{len}-byte message, one at a time, from rank {}", 1 - rank)
        })?;
    }
    for posted_first in [true, false] {
        for (k, &len) in sizes.iter().enumerate() {
            let tag = k as i32;
            if rank == 0 {
                let outs: Vec<Vec<u8>> = (0..WINDOW).map(|i| filled(seed(k, i), len + 3)).collect();
                if posted_first {
                    // The receives are posted.
                    peer.receive::<u8>()?;
                }
                scope(|s| -> Result<()> {
                    let mut sends = Vec::with_capacity(WINDOW);
                    for out in &outs {
                        sends.push(peer.immediate_send_with_tag(s, &out[3..], tag)?);
                    }
                    if !posted_first {
                        // Behind the window on the same connection: it
                        // arrives after every message of it.
                        peer.send_with_tag(&1u8, ARRIVED)?;
                    }
                    wait_all(sends)?;
                    Ok(())
                })?;
            } else {
                let mut bufs = vec![vec![0u8; len + 5]; WINDOW];
                if !posted_first {
                    peer.receive_into_with_tag(&mut [0u8][..], ARRIVED)?;
                }
                scope(|s| -> Result<()> {
                    let mut receives = Vec::with_capacity(WINDOW);
                    for buf in bufs.iter_mut() {
                        receives.push(peer.immediate_receive_into_with_tag(
                            s,
                            &mut buf[5..],
                            tag,
                        )?);
                    }
                    if posted_first {
                        peer.send(&1u8)?;
                    }
                    for status in wait_all(receives)? {
                        ensure(status.byte_count() == len, || {
                            format!(
                                "{len}-byte message of a window arrived with {} bytes",
                                status.byte_count()
                            )
                        })?;
                    }
                    Ok(())
                })?;
                for (i, buf) in bufs.iter().enumerate() {
                    let expected = &filled(seed(k, i), len + 3)[3..];
                    ensure(&buf[5..] == expected, || {
                        format!(
                            "message {i} of a window of {len}-byte messages (receives posted {}): \
                             not the {i}th sent",
                            if posted_first {
                                "first"
                            } else {
                                "after they arrived"
                            }
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

/// Replies that one poll asks for all at once must leave. Every rank
/// first talks to every other (over TCP, more than four connections make
/// the transport poll by epoll, which reports a writable socket once).
/// Then rank 1 posts `BURST` receives for long messages from rank 0 and
/// does not poll while rank 0's requests to send arrive, so one poll finds
/// them all and answers each with a clear-to-send; rank 1 sends nothing
/// else, so those answers must leave by themselves, or both ranks wait
/// for ever.
fn reply_burst(world: &Communicator) -> Result<()> {
    const BURST: usize = 3;
    const LEN: usize = 200 * 1024 + 9;
    let (rank, size) = (world.rank(), world.size());
    ensure(size >= 2, || {
        format!("reply-burst needs 2 ranks or more, not {size}")
    })?;
    let token = [rank as u8];
    let mut tokens = vec![[0u8]; size as usize];
    scope(|s| -> Result<()> {
        let mut requests = Vec::new();
        for (from, token_in) in tokens.iter_mut().enumerate() {
            if from as i32 != rank {
                let peer = world.process_at_rank(from as i32);
                requests.push(peer.immediate_receive_into(s, &mut token_in[..])?);
            }
        }
        for to in (0..size).filter(|&to| to != rank) {
            requests.push(world.process_at_rank(to).immediate_send(s, &token[..])?);
        }
        wait_all(requests).map(drop)
    })?;
    let seed = |k: usize| 7000 + k as u64;
    match rank {
        0 => {
            let outs: Vec<Vec<u8>> = (0..BURST).map(|k| filled(seed(k), LEN)).collect();
            let peer = world.process_at_rank(1);
            scope(|s| -> Result<()> {
                let mut sends = Vec::new();
                for out in &outs {
                    sends.push(peer.immediate_send(s, &out[..])?);
                }
                wait_all(sends).map(drop)
            })?;
        }
        1 => {
            let mut bufs = vec![vec![0u8; LEN]; BURST];
            let peer = world.process_at_rank(0);
            scope(|s| -> Result<()> {
                let mut receives = Vec::new();
                for buf in bufs.iter_mut() {
                    receives.push(peer.immediate_receive_into(s, &mut buf[..])?);
                }
                // No poll while the requests to send arrive.
                std::thread::sleep(Duration::from_millis(200));
                wait_all(receives).map(drop)
            })?;
            for (k, buf) in bufs.iter().enumerate() {
                check_bytes(seed(k), buf, &format!("long message {k} of the burst"))?;
            }
        }
        _ => {}
    }
    world.barrier()
}

/// Long messages as a single-copy transport must move them: sizes that
/// are no multiple of a page, from just past the threshold to beyond
/// 4 MiB, from and into buffers that start off any page boundary, both
/// ways at once (each rank sends while it receives) and one after the
/// other; a synchronous one; a truncated one; and, with more than 2
/// ranks, one from each other rank to rank 0 received from any source.
fn long_messages(world: &Communicator) -> Result<()> {
    let t = threshold();
    let sizes = [
        t + 1,
        // Past the longest single copy that the receiver reads whole.
        16_385,
        17 * 4096 + 5,
        (1 << 20) + 123,
        (5 << 20) + 4097,
        9 << 20,
    ];
    let (rank, size) = (world.rank(), world.size());
    if rank <= 1 {
        let peer = world.process_at_rank(1 - rank);
        for (k, &len) in sizes.iter().enumerate() {
            // Offsets 3 and 5: neither buffer starts on a page.
            let out = filled(k as u64 + 10 * rank as u64, len + 3);
            let mut back = vec![0u8; len + 5];
            scope(|s| -> Result<()> {
                let receive = peer.immediate_receive_into_with_tag(s, &mut back[5..], k as i32)?;
                peer.immediate_send_with_tag(s, &out[3..], k as i32)?
                    .wait()?;
                let status = receive.wait()?;
                ensure(status.byte_count() == len, || {
                    format!(
                        "{len}-byte message arrived with {} bytes",
                        status.byte_count()
                    )
                })
            })?;
            let seed = k as u64 + 10 * (1 - rank) as u64;
            let expected = &filled(seed, len + 3)[3..];
            ensure(&back[5..] == expected, || {
                let i = (0..len).find(|&i| back[5 + i] != expected[i]).unwrap_or(0);
                format!(
                    "{len}-byte message from rank {}: byte {i} differs",
                    1 - rank
                )
            })?;
        }
        let (long, short) = ((2 << 20) + 7, (1 << 20) + 3);
        if rank == 0 {
            peer.synchronous_send_with_tag(&filled(50, long)[..], 50)?;
            peer.send_with_tag(&filled(51, long)[..], 51)?;
        } else {
            let mut buf = vec![0u8; long];
            peer.receive_into_with_tag(&mut buf[..], 50)?;
            check_bytes(50, &buf, "synchronous long message")?;
            let mut small = vec![0u8; short];
            match peer.receive_into_with_tag(&mut small[..], 51) {
                Err(e) if e.class() == ErrorClass::Truncate => {
                    check_bytes(51, &small, "truncated long message")?;
                }
                other => {
                    return Err(fail(format!(
                        "{long} bytes into {short}: expected MPI_ERR_TRUNCATE, got {other:?}"
                    )))
                }
            }
        }
    }
    if size > 2 {
        let len = |from: i32| (3 << 20) + 1000 * from as usize + 1;
        if rank == 0 {
            for _ in 1..size {
                let (data, status) = world.any_process().receive_vec::<u8>()?;
                let from = status.source_rank();
                ensure(data.len() == len(from), || {
                    format!("{} bytes from rank {from}", data.len())
                })?;
                check_bytes(60 + from as u64, &data, "long message from any source")?;
            }
        } else {
            world
                .process_at_rank(0)
                .send(&filled(60 + rank as u64, len(rank))[..])?;
        }
    }
    Ok(())
}

/// 10,000 immediate receives outstanding at once, each for its own tag;
/// the sender sends the tags in a shuffled order and the receiver completes
/// them with wait_any in whatever order they finish.
fn many_irecv(world: &Communicator) -> Result<()> {
    const N: usize = 10_000;
    match world.rank() {
        0 => {
            let mut order: Vec<usize> = (0..N).collect();
            // A fixed xorshift shuffle: random order, reproducible failures.
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for i in (1..N).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            // Wait until every receive is posted, so that none is unexpected.
            world.process_at_rank(1).receive::<u8>()?;
            for tag in order {
                world
                    .process_at_rank(1)
                    .send_with_tag(&(tag as u64 * 3), tag as i32)?;
            }
        }
        1 => {
            let mut bufs = vec![0u64; N];
            scope(|s| -> Result<()> {
                let mut requests = Vec::with_capacity(N);
                let mut tags = Vec::with_capacity(N);
                for (tag, buf) in bufs.iter_mut().enumerate() {
                    requests.push(
                        world
                            .process_at_rank(0)
                            .immediate_receive_into_with_tag(s, buf, tag as i32)?,
                    );
                    tags.push(tag);
                }
                world.process_at_rank(0).send(&1u8)?;
                while let Some((index, status)) = wait_any(&mut requests)? {
                    let tag = tags.remove(index);
                    let status = status?;
                    ensure(status.tag() == tag as i32, || {
                        format!("request for tag {tag} got tag {}", status.tag())
                    })?;
                }
                Ok(())
            })?;
            for (tag, v) in bufs.iter().enumerate() {
                ensure(*v == tag as u64 * 3, || format!("tag {tag} holds {v}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A message longer than the receive buffer is a truncation error on that
/// receive, for the short and the long protocol; the job goes on.
fn truncation(world: &Communicator) -> Result<()> {
    let long = threshold() * 2;
    match world.rank() {
        0 => {
            for len in [100, long] {
                world.process_at_rank(1).send(&filled(1, len)[..])?;
            }
            world.process_at_rank(1).send(&42u32)?;
        }
        1 => {
            for len in [100, long] {
                let mut small = vec![0u8; 10];
                match world.process_at_rank(0).receive_into(&mut small[..]) {
                    Err(e) if e.class() == ErrorClass::Truncate => {
                        check_bytes(1, &small, "truncated message's first bytes")?;
                    }
                    other => {
                        return Err(fail(format!(
                            "{len} bytes into 10: expected MPI_ERR_TRUNCATE, got {other:?}"
                        )))
                    }
                }
            }
            let (v, _) = world.process_at_rank(0).receive::<u32>()?;
            ensure(v == 42, || format!("message after the truncations is {v}"))?;
        }
        _ => {}
    }
    Ok(())
}

/// Blocking receives, which wait without a request where the device
/// allows (its direct receive): one posted after an immediate receive
/// that accepts the same messages gets the second message; each kind of
/// message (one shared-memory cell, several, a rendezvous) arrives whole
/// into a blocking receive posted before it; a longer one is an
/// `MPI_ERR_TRUNCATE` with what fits placed; and from any source, a
/// message from this rank itself and one from a peer are both received.
/// Rank 0 sends each message some time after rank 1 says it is about to
/// block, so that the receive is usually posted first (the checks hold
/// either way).
fn direct_receives(world: &Communicator) -> Result<()> {
    const TAG: i32 = 3;
    let long = threshold() * 2;
    let kinds = [(3, 0), (4, 40), (5, 1000), (6, long)];
    let truncated = [(7, 30), (8, long)];
    match world.rank() {
        0 => {
            let one = world.process_at_rank(1);
            let after_ready = || -> Result<()> {
                one.receive::<u8>()?;
                std::thread::sleep(Duration::from_millis(20));
                Ok(())
            };
            after_ready()?;
            one.send_with_tag(&filled(1, 8)[..], TAG)?;
            one.send_with_tag(&filled(2, 8)[..], TAG)?;
            for (seed, len) in kinds.into_iter().chain(truncated) {
                after_ready()?;
                one.send_with_tag(&filled(seed, len)[..], TAG)?;
            }
            after_ready()?;
            one.send_with_tag(&filled(9, 16)[..], TAG)?;
        }
        1 => {
            let zero = world.process_at_rank(0);
            let (mut first, mut second) = ([0u8; 8], [0u8; 8]);
            scope(|s| -> Result<()> {
                let earlier = zero.immediate_receive_into_with_tag(s, &mut first[..], TAG)?;
                zero.send(&0u8)?;
                zero.receive_into_with_tag(&mut second[..], TAG)?;
                earlier.wait()?;
                Ok(())
            })?;
            check_bytes(1, &first, "the immediate receive posted first")?;
            check_bytes(2, &second, "the blocking receive posted after it")?;
            for (seed, len) in kinds {
                let mut buf = vec![0u8; len];
                zero.send(&0u8)?;
                let status = zero.receive_into_with_tag(&mut buf[..], TAG)?;
                ensure(status.byte_count() == len, || {
                    format!("{len} bytes arrived as {}", status.byte_count())
                })?;
                check_bytes(seed, &buf, "a message into a blocking receive")?;
            }
            for (seed, len) in truncated {
                let mut small = vec![0u8; 10];
                zero.send(&0u8)?;
                match zero.receive_into_with_tag(&mut small[..], TAG) {
                    Err(e) if e.class() == ErrorClass::Truncate => {
                        check_bytes(seed, &small, "a truncated message's first bytes")?;
                    }
                    other => {
                        return Err(fail(format!(
                            "{len} bytes into 10: expected MPI_ERR_TRUNCATE, got {other:?}"
                        )))
                    }
                }
            }
            let me = world.process_at_rank(1);
            let mine = filled(10, 12);
            scope(|s| -> Result<()> {
                let to_self = me.immediate_send_with_tag(s, &mine[..], TAG)?;
                zero.send(&0u8)?;
                let mut got = [false; 2];
                for _ in 0..2 {
                    let mut buf = [0u8; 16];
                    let status = world
                        .any_process()
                        .receive_into_with_tag(&mut buf[..], TAG)?;
                    let from = status.source_rank();
                    let (seed, len) = match from {
                        0 => (9, 16),
                        1 => (10, 12),
                        other => return Err(fail(format!("a message from rank {other}"))),
                    };
                    ensure(!got[from as usize], || {
                        format!("two messages from rank {from}")
                    })?;
                    got[from as usize] = true;
                    ensure(status.byte_count() == len, || {
                        format!(
                            "{len} bytes from rank {from} arrived as {}",
                            status.byte_count()
                        )
                    })?;
                    check_bytes(seed, &buf[..len], "a message from any source")?;
                }
                to_self.wait()?;
                Ok(())
            })?;
        }
        _ => {}
    }
    Ok(())
}

/// Probe learns the size of a message, then the receive takes exactly it;
/// immediate probe sees nothing before the message is sent.
fn probe_unknown_size(world: &Communicator) -> Result<()> {
    match world.rank() {
        0 => {
            world.process_at_rank(1).receive::<u8>()?;
            world
                .process_at_rank(1)
                .send_with_tag(&filled(9, 12345)[..], 77)?;
            world
                .process_at_rank(1)
                .send_with_tag(&filled(8, 300_000)[..], 78)?;
        }
        1 => {
            ensure(world.any_process().immediate_probe()?.is_none(), || {
                "immediate probe found a message that was never sent".into()
            })?;
            world.process_at_rank(0).send(&0u8)?;
            for (tag, len, seed) in [(77, 12345, 9), (78, 300_000, 8)] {
                let status = world.any_process().probe_with_tag(tag)?;
                ensure(
                    status.byte_count() == len && status.source_rank() == 0,
                    || format!("probe saw {status:?}"),
                )?;
                let mut buf = vec![0u8; status.byte_count()];
                world
                    .process_at_rank(0)
                    .receive_into_with_tag(&mut buf[..], tag)?;
                check_bytes(seed, &buf, "probed message")?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Messages to oneself, short and long, on the self and world communicators.
fn self_messages(self_comm: &Communicator, world: &Communicator) -> Result<()> {
    for comm in [self_comm, world] {
        let me = comm.process_at_rank(comm.rank());
        for len in [0, 5, 200_000] {
            let out = filled(len as u64, len);
            let mut back = vec![0u8; len];
            scope(|s| -> Result<()> {
                let r = me.immediate_receive_into(s, &mut back[..])?;
                me.send(&out[..])?;
                r.wait()?;
                Ok(())
            })?;
            check_bytes(len as u64, &back, "message to self")?;
        }
    }
    Ok(())
}

/// Bad arguments are errors of the right class, and cancel works.
fn argument_errors(world: &Communicator) -> Result<()> {
    let class = |r: Result<()>| r.err().map(|e| e.class());
    ensure(
        class(world.process_at_rank(world.size()).send(&1u8)) == Some(ErrorClass::Rank),
        || "rank = size accepted".into(),
    )?;
    ensure(
        class(world.process_at_rank(-5).send(&1u8)) == Some(ErrorClass::Rank),
        || "rank -5 accepted".into(),
    )?;
    ensure(
        class(world.process_at_rank(0).send_with_tag(&1u8, -3)) == Some(ErrorClass::Tag),
        || "tag -3 accepted".into(),
    )?;
    ensure(
        class(world.process_at_rank(0).send_with_tag(&1u8, ANY_TAG)) == Some(ErrorClass::Tag),
        || "ANY_TAG accepted for a send".into(),
    )?;
    let mut buf = 0u64;
    let cancelled = scope(|s| -> Result<bool> {
        let r = world
            .any_process()
            .immediate_receive_into_with_tag(s, &mut buf, 999)?;
        r.cancel();
        Ok(r.wait()?.is_cancelled())
    })?;
    ensure(cancelled, || "a pending receive was not cancelled".into())
}

/// Waits for a message that never comes, so only the launcher ends this rank.
fn hold(world: &Communicator) -> Result<()> {
    world.any_process().receive::<u8>()?;
    Err(fail("a message arrived that nobody sent"))
}

/// Four threads on each of two ranks at once, each pair of same-numbered
/// threads on its own tag (even pairs send from rank 0, odd pairs from
/// rank 1): blocking and immediate sends; receives by tag, after a probe,
/// and from any source; every message checked to arrive in its pair's
/// order, then a per-pair acknowledgement.
fn threads(world: &Communicator) -> Result<()> {
    const THREADS: i32 = 4;
    const MESSAGES: u64 = 2000;
    ensure(world.size() == 2, || {
        "the threads check needs 2 ranks".into()
    })?;
    let other = 1 - world.rank();
    std::thread::scope(|threads| {
        let pairs: Vec<_> = (0..THREADS)
            .map(|t| {
                threads.spawn(move || -> Result<()> {
                    let peer = world.process_at_rank(other);
                    let ack_tag = THREADS + t;
                    if t % 2 == world.rank() {
                        for i in 0..MESSAGES {
                            let message = [t as u64, i];
                            if i % 2 == 0 {
                                peer.send_with_tag(&message[..], t)?;
                            } else {
                                scope(|s| {
                                    peer.immediate_send_with_tag(s, &message[..], t)?
                                        .wait()
                                        .map(drop)
                                })?;
                            }
                        }
                        let mut ack = [0u64; 1];
                        peer.receive_into_with_tag(&mut ack[..], ack_tag)?;
                        ensure(ack[0] == MESSAGES, || {
                            format!("thread {t}: acknowledged {} of {MESSAGES}", ack[0])
                        })
                    } else {
                        for i in 0..MESSAGES {
                            let mut message = [0u64; 2];
                            match i % 3 {
                                0 => peer.receive_into_with_tag(&mut message[..], t)?,
                                1 => {
                                    let probed = peer.probe_with_tag(t)?;
                                    ensure(probed.tag() == t && probed.byte_count() == 16, || {
                                        format!("thread {t}: probe found {probed:?}")
                                    })?;
                                    peer.receive_into_with_tag(&mut message[..], t)?
                                }
                                _ => world
                                    .any_process()
                                    .receive_into_with_tag(&mut message[..], t)?,
                            };
                            ensure(message == [t as u64, i], || {
                                format!("thread {t}: message {i} arrived as {message:?}")
                            })?;
                        }
                        peer.send_with_tag(&[MESSAGES][..], ack_tag)
                    }
                })
            })
            .collect();
        pairs.into_iter().try_for_each(|pair| {
            pair.join()
                .map_err(|_| fail("a thread panicked"))
                .and_then(|r| r)
        })
    })
}

/// At the single level (where the initializing thread keeps the device),
/// a call from another thread fails with `MPI_ERR_OTHER` and says why,
/// instead of waiting for a device that is never let go; the
/// initializing thread's calls go on working, before and after.
fn single_thread(world: &Communicator) -> Result<()> {
    ensure(world.size() == 2, || {
        "the single-thread check needs 2 ranks".into()
    })?;
    let peer = world.process_at_rank(1 - world.rank());
    let exchange = |round: u64| -> Result<()> {
        let mut got = [0u64; 2];
        if world.rank() == 0 {
            peer.send(&[round, 0][..])?;
            peer.receive_into(&mut got[..])?;
        } else {
            peer.receive_into(&mut got[..])?;
            peer.send(&[round, 1][..])?;
        }
        ensure(got == [round, 1 - world.rank() as u64], || {
            format!("round {round}: received {got:?}")
        })
    };
    exchange(0)?;
    let refused = std::thread::scope(|threads| {
        threads
            .spawn(|| peer.send(&[9u64][..]))
            .join()
            .map_err(|_| fail("the other thread panicked"))
    })?;
    match refused {
        Err(e) if e.class() == ErrorClass::Other && e.message().contains("only the thread") => {}
        other => {
            return Err(fail(format!(
                "a send from another thread at the single level gave {other:?}"
            )))
        }
    }
    exchange(1)
}

/// Synchronous sends complete only once the receive started, eager and
/// rendezvous alike; a standard eager send completes at once; a ready send
/// reaches its posted receive.
fn send_modes(world: &Communicator) -> Result<()> {
    ensure(world.size() == 2, || "the modes check needs 2 ranks".into())?;
    const GO: i32 = 100;
    let sizes = [8usize, threshold() + 1];
    let peer = world.process_at_rank(1 - world.rank());
    for (round, &size) in sizes.iter().enumerate() {
        let tag = round as i32;
        if world.rank() == 0 {
            let message = filled(size as u64, size);
            scope(|s| -> Result<()> {
                let mut sync = peer.immediate_synchronous_send_with_tag(s, &message[..], tag)?;
                // The receiver posts nothing until told to go: the send
                // must stay pending however long it is tested.
                let until = Instant::now() + Duration::from_millis(200);
                while Instant::now() < until {
                    sync = match sync.test() {
                        Err(pending) => pending,
                        Ok(_) => {
                            return Err(fail(format!(
                                "a synchronous send of {size} bytes completed before its receive was posted"
                            )))
                        }
                    };
                }
                peer.send_with_tag(&[1u8][..], GO)?;
                sync.wait().map(drop)
            })?;
            if size <= threshold() {
                let standard = scope(|s| -> Result<bool> {
                    let request = peer.immediate_send_with_tag(s, &message[..], tag)?;
                    let done = request.test().is_ok();
                    Ok(done)
                })?;
                ensure(standard, || {
                    "a standard eager send did not complete at once".into()
                })?;
                peer.send_with_tag(&[1u8][..], GO)?;
            }
        } else {
            let mut go = [0u8; 1];
            let expected = if size <= threshold() { 2 } else { 1 };
            for _ in 0..expected {
                peer.receive_into_with_tag(&mut go[..], GO)?;
                let mut got = vec![0u8; size];
                peer.receive_into_with_tag(&mut got[..], tag)?;
                check_bytes(size as u64, &got, "synchronous or standard send")?;
            }
        }
    }
    // Ready send: rank 1 posts the receive, then says so.
    const READY: i32 = 7;
    if world.rank() == 1 {
        let mut got = [0u64; 4];
        scope(|s| -> Result<()> {
            let request = peer.immediate_receive_into_with_tag(s, &mut got[..], READY)?;
            peer.send_with_tag(&[1u8][..], GO)?;
            request.wait().map(drop)
        })?;
        ensure(got == [1, 2, 3, 4], || {
            format!("ready send delivered {got:?}")
        })
    } else {
        let mut go = [0u8; 1];
        peer.receive_into_with_tag(&mut go[..], GO)?;
        peer.ready_send_with_tag(&[1u64, 2, 3, 4][..], READY)?;
        scope(|s| {
            peer.immediate_ready_send_with_tag(s, &[9u8][..], READY + 1)?
                .wait()
                .map(drop)
        })?;
        Ok(())
    }
    .and_then(|()| {
        if world.rank() == 1 {
            let (value, _) = peer.receive::<u8>()?;
            ensure(value == 9, || {
                format!("immediate ready send delivered {value}")
            })
        } else {
            Ok(())
        }
    })
}

/// Every operation on PROC_NULL completes at once with the standard's
/// status.
fn proc_null(world: &Communicator) -> Result<()> {
    let nobody = world.process_at_rank(PROC_NULL);
    nobody.send(&[1u32, 2][..])?;
    nobody.synchronous_send(&[1u8][..])?;
    let mut buf = [7u8; 4];
    let status = nobody.receive_into(&mut buf[..])?;
    let null_status = |what: &str, status: oxmpi::Status| {
        ensure(
            status.source_rank() == PROC_NULL
                && status.tag() == ANY_TAG
                && status.byte_count() == 0,
            || format!("{what} from PROC_NULL gave {status:?}"),
        )
    };
    null_status("receive", status)?;
    ensure(buf == [7; 4], || {
        "a receive from PROC_NULL wrote into its buffer".into()
    })?;
    null_status("probe", nobody.probe()?)?;
    let (message, status) = nobody.matched_probe_with_tag(ANY_TAG)?;
    null_status("matched probe", status)?;
    null_status("matched receive", message.receive_into(&mut buf[..])?)?;
    scope(|s| -> Result<()> {
        let send = nobody.immediate_send(s, &[1u8][..])?;
        let receive = nobody.immediate_receive_into(s, &mut buf[..])?;
        let statuses = wait_all(vec![send, receive])?;
        null_status("immediate receive", statuses[1])
    })?;
    // A bad tag is still an error, even to nobody.
    match nobody.send_with_tag(&[1u8][..], -5) {
        Err(e) if e.class() == ErrorClass::Tag => Ok(()),
        other => Err(fail(format!(
            "a send to PROC_NULL with tag -5 gave {other:?}"
        ))),
    }
}

/// A send that no receive matched can be cancelled (rendezvous and
/// synchronous eager); the receiver never sees it. A standard eager send
/// has completed and is not cancelled; it is delivered.
fn cancel_send(world: &Communicator) -> Result<()> {
    ensure(world.size() == 2, || {
        "the cancel-send check needs 2 ranks".into()
    })?;
    const LONG: i32 = 3;
    const SYNC: i32 = 4;
    const EAGER: i32 = 5;
    const DONE: i32 = 6;
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 0 {
        let long = filled(1, threshold() * 2);
        let cancelled = scope(|s| -> Result<Vec<bool>> {
            let requests = vec![
                peer.immediate_send_with_tag(s, &long[..], LONG)?,
                peer.immediate_synchronous_send_with_tag(s, &[5u8; 16][..], SYNC)?,
                peer.immediate_send_with_tag(s, &[6u8; 16][..], EAGER)?,
            ];
            for r in &requests {
                r.cancel();
            }
            Ok(wait_all(requests)?
                .iter()
                .map(|st| st.is_cancelled())
                .collect())
        })?;
        ensure(cancelled == [true, true, false], || {
            format!(
                "cancelled (long, synchronous, eager): {cancelled:?}, expected [true, true, false]"
            )
        })?;
        peer.send_with_tag(&[1u8][..], DONE)
    } else {
        peer.receive_into_with_tag(&mut [0u8; 1][..], DONE)?;
        // Packets on one connection arrive in order: the cancels came
        // before DONE, so the withdrawn messages are gone by now.
        for tag in [LONG, SYNC] {
            let left = peer.immediate_probe_with_tag(tag)?;
            ensure(left.is_none(), || {
                format!("cancelled message with tag {tag} still arrived: {left:?}")
            })?;
        }
        let mut eager = [0u8; 16];
        peer.receive_into_with_tag(&mut eager[..], EAGER)?;
        ensure(eager == [6; 16], || {
            format!("the eager send delivered {eager:?}")
        })
    }
}

/// Ranks 1.. each send 200 messages of their own sizes and tags to rank 0,
/// where two threads race to take them with matched probes from any source
/// and receive them: every message is received exactly once, whole, by
/// exactly one thread.
fn mprobe_race(world: &Communicator) -> Result<()> {
    const PER_RANK: usize = 200;
    ensure(world.size() >= 3, || {
        "the mprobe check needs at least 3 ranks".into()
    })?;
    if world.rank() != 0 {
        let root = world.process_at_rank(0);
        for i in 0..PER_RANK {
            let len = 1 + (i * 37 + world.rank() as usize * 11) % 300;
            let seed = (world.rank() as u64) << 32 | i as u64;
            root.send_with_tag(&filled(seed, len)[..], i as i32)?;
        }
        return Ok(());
    }
    let total = PER_RANK * (world.size() as usize - 1);
    let taken = std::sync::atomic::AtomicUsize::new(0);
    let seen = std::sync::Mutex::new(vec![false; total]);
    std::thread::scope(|threads| {
        let racers: Vec<_> = (0..2)
            .map(|_| {
                threads.spawn(|| -> Result<()> {
                    while taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < total {
                        let (message, probed) =
                            world.any_process().matched_probe_with_tag(ANY_TAG)?;
                        let mut buf = vec![0u8; probed.byte_count()];
                        let status = message.receive_into(&mut buf[..])?;
                        ensure(status == probed, || {
                            format!("probed {probed:?}, received {status:?}")
                        })?;
                        let (source, i) = (status.source_rank() as usize, status.tag() as usize);
                        check_bytes((source as u64) << 32 | i as u64, &buf, "matched receive")?;
                        let index = (source - 1) * PER_RANK + i;
                        let mut seen = seen.lock().map_err(|_| fail("a racer panicked"))?;
                        ensure(!std::mem::replace(&mut seen[index], true), || {
                            format!("message {i} of rank {source} was received twice")
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        racers.into_iter().try_for_each(|racer| {
            racer
                .join()
                .map_err(|_| fail("a racer panicked"))
                .and_then(|r| r)
        })
    })?;
    let seen = seen.into_inner().map_err(|_| fail("a racer panicked"))?;
    ensure(seen.iter().all(|&s| s), || {
        "some messages were never received".into()
    })
}

/// Word `i` of the huge test message: cheap to make and to check, and
/// different at every offset, so a misplaced chunk shows.
fn huge_word(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0123_4567_89ab_cdef
}

/// A 3 GiB message (beyond 2^31 bytes, and beyond what one read or write
/// system call moves) from rank 0 to rank 1, every word checked, with the
/// count reported in bytes and in u64 elements.
fn huge_message(world: &Communicator) -> Result<()> {
    const WORDS: usize = 3 << 27; // 3 GiB of u64
    ensure(world.size() == 2, || "the huge check needs 2 ranks".into())?;
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 0 {
        let message: Vec<u64> = (0..WORDS).map(huge_word).collect();
        peer.send(&message[..])
    } else {
        let mut got = vec![0u64; WORDS];
        let status = peer.receive_into(&mut got[..])?;
        ensure(
            status.byte_count() == WORDS * 8 && status.count::<u64>() == Some(WORDS),
            || format!("3 GiB arrived as {status:?}"),
        )?;
        match got.iter().enumerate().find(|&(i, &w)| w != huge_word(i)) {
            None => Ok(()),
            Some((i, w)) => Err(fail(format!(
                "word {i} of the 3 GiB message is {w:#x}, expected {:#x}",
                huge_word(i)
            ))),
        }
    }
}

/// For a node whose ranks outnumber its cores (the harness runs it on
/// one CPU): messages around a ring and all-reduces keep moving; then the
/// others wait for rank 0 in a receive and in a barrier, while it
/// computes outside MPI and while it sleeps. Each such wait must use less
/// than [`CROWDED_WAIT_SHARE`] of its time on the processor: a wait that
/// spun would keep the core from the rank that computes, and one that
/// kept yielding would burn the idle core while rank 0 sleeps.
fn crowded(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
    for round in 0..2_000i64 {
        world
            .process_at_rank(next)
            .send(&(round * i64::from(size) + i64::from(rank)))?;
        let (got, _) = world.process_at_rank(previous).receive::<i64>()?;
        let expected = round * i64::from(size) + i64::from(previous);
        ensure(got == expected, || {
            format!("round {round}: {got} from rank {previous}, expected {expected}")
        })?;
        if round % 100 == 0 {
            let mut sum = [0i64];
            world.all_reduce_into(&[round][..], &mut sum[..], SystemOperation::sum())?;
            ensure(sum[0] == round * i64::from(size), || {
                format!("round {round}: all-reduce gave {}", sum[0])
            })?;
        }
    }
    for computes in [true, false] {
        for in_barrier in [false, true] {
            world.barrier()?;
            if rank == 0 {
                if computes {
                    let start = Instant::now();
                    while start.elapsed() < CROWDED_WAIT {
                        std::hint::black_box(start);
                    }
                } else {
                    std::thread::sleep(CROWDED_WAIT);
                }
                if in_barrier {
                    world.barrier()?;
                } else {
                    for to in 1..size {
                        world.process_at_rank(to).send(&0u8)?;
                    }
                }
                continue;
            }
            let (cpu, start) = (cpu_time()?, Instant::now());
            if in_barrier {
                world.barrier()?;
            } else {
                world.process_at_rank(0).receive::<u8>()?;
            }
            let (cpu, wall) = (cpu_time()? - cpu, start.elapsed());
            let wait = if in_barrier { "a barrier" } else { "a receive" };
            let rank0 = if computes { "computed" } else { "slept" };
            ensure(
                cpu.as_secs_f64() < CROWDED_WAIT_SHARE * wall.as_secs_f64(),
                || {
                    format!(
                    "waiting {wall:?} in {wait} for rank 0, which {rank0}, took {cpu:?} of the \
                     processor: a long wait must leave it"
                )
                },
            )?;
        }
    }
    Ok(())
}

/// How long rank 0 of `crowded` computes or sleeps while the others wait
/// for it.
const CROWDED_WAIT: Duration = Duration::from_millis(500);
/// The most of its time a wait of `crowded` may use the processor (a
/// wait that spun or kept yielding would take about a fair share of the
/// one core: a quarter or a third at 4 ranks).
const CROWDED_WAIT_SHARE: f64 = 0.1;
