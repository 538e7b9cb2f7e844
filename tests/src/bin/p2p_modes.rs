//! Checks of buffered sends, persistent requests, send-receive-replace and
//! element counts, run as real jobs: `p2p_modes CHECK`, started by the
//! harness through oxrun (tests/tests/modes.rs). Each check verifies its
//! own results; on a failure the rank says why and aborts the job, so a
//! failed check never hangs.

use oxmpi::buffered::{attach_buffer, detach_buffer, flush_buffer, BSEND_OVERHEAD};
use oxmpi::persistent::{start_all, wait_all};
use oxmpi::request::scope;
use oxmpi::{Communicator, ErrorClass, Result, Status, Threading, ANY_TAG, PROC_NULL};
use oxmpi_jobs::checks::{check_bytes, ensure, fail, filled, pattern};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    let threading = if check == "buffered-threads" {
        Threading::Multiple
    } else {
        Threading::Single
    };
    run_check(&format!("p2p_modes {check}"), threading, |universe| {
        let world = world_returning_errors(universe);
        match check.as_str() {
            "buffered" => buffered(&world),
            "buffered-all" => buffered_all(&world),
            "buffered-overflow" => buffered_overflow(&world),
            "buffered-threads" => buffered_threads(&world),
            "persistent" => persistent(&world),
            "persistent-ring" => persistent_ring(&world),
            "replace-ring" => replace_ring(&world),
            "elements" => elements(&world),
            other => Err(fail(format!("unknown check {other:?}"))),
        }
    })
}

/// The TCP eager limit the job runs with.
fn threshold() -> usize {
    std::env::var("OXMPI_TCP_EAGER_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 * 1024)
}

/// Expects `result` to be an error of `class` whose message contains
/// every one of `words`.
fn expect_error<T: std::fmt::Debug>(
    result: Result<T>,
    class: ErrorClass,
    words: &[&str],
    what: &str,
) -> Result<()> {
    match result {
        Err(e) if e.class() == class && words.iter().all(|w| e.message().contains(w)) => Ok(()),
        other => Err(fail(format!(
            "{what}: expected {class} saying {words:?}, got {other:?}"
        ))),
    }
}

/// Waits up to 20 s for a message with `tag` from `rank`, so that a
/// sender stuck in a call that should have returned fails the check
/// instead of hanging the job.
fn await_message(world: &Communicator, rank: i32, tag: i32, why: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while world
        .process_at_rank(rank)
        .immediate_probe_with_tag(tag)?
        .is_none()
    {
        ensure(Instant::now() < deadline, || {
            format!("no message with tag {tag} from rank {rank} after 20 s: {why}")
        })?;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Rank 0's buffered sends, short and long (rendezvous), return before
/// rank 1 posts any receive; detach waits until they have left (rank 1
/// has posted its receives) and gives the memory back; the space of
/// completed sends is reused.
fn buffered(world: &Communicator) -> Result<()> {
    const GO: i32 = 100;
    const POSTED: i32 = 101;
    const IBSEND: i32 = 50;
    const REUSE: i32 = 60;
    const REUSES: usize = 50;
    let t = threshold();
    let sizes = [0, 10, 1000, t, t + 1, 1 << 20];
    if world.rank() > 1 {
        return Ok(());
    }
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 0 {
        let total: usize =
            sizes.iter().map(|len| len + BSEND_OVERHEAD).sum::<usize>() + (100 + BSEND_OVERHEAD);
        attach_buffer(vec![0u8; total])?;
        for (k, &len) in sizes.iter().enumerate() {
            peer.buffered_send_with_tag(&filled(k as u64, len)[..], k as i32)?;
        }
        scope(|s| -> Result<()> {
            let request = peer.immediate_buffered_send_with_tag(s, &filled(50, 100)[..], IBSEND)?;
            match request.test() {
                Ok(status) => status.map(drop),
                Err(_) => Err(fail("an immediate buffered send was not complete at once")),
            }
        })?;
        // Every message is buffered and rank 1 has posted nothing yet: it
        // waits for this.
        peer.send_with_tag(&[1u8][..], GO)?;
        let memory = detach_buffer()?;
        ensure(memory.len() == total, || {
            format!("detach gave back {} bytes of {total}", memory.len())
        })?;
        // Rank 1 says POSTED before it posts the receives, and the long
        // messages could only leave after that: detach must have seen it.
        ensure(peer.immediate_probe_with_tag(POSTED)?.is_some(), || {
            "detach returned before the long buffered messages were received".into()
        })?;
        peer.receive_into_with_tag(&mut [0u8; 1][..], POSTED)?;
        expect_error(
            peer.buffered_send(&[1u8][..]),
            ErrorClass::Buffer,
            &["no buffer is attached"],
            "a buffered send after detach",
        )?;
        // Room for one message at a time: each eager send completes at
        // once, and its space is reused by the next.
        let mut memory = memory;
        memory.truncate(1000 + BSEND_OVERHEAD);
        attach_buffer(memory)?;
        for i in 0..REUSES {
            peer.buffered_send_with_tag(&filled(1000 + i as u64, 1000)[..], REUSE)?;
        }
        ensure(detach_buffer()?.len() == 1000 + BSEND_OVERHEAD, || {
            "the second detach gave back another buffer".into()
        })
    } else {
        await_message(
            world,
            0,
            GO,
            "rank 0's buffered sends did not return before their receives were posted",
        )?;
        peer.receive_into_with_tag(&mut [0u8; 1][..], GO)?;
        // Let rank 0 get into detach, which must wait for these receives.
        std::thread::sleep(Duration::from_millis(100));
        peer.send_with_tag(&[1u8][..], POSTED)?;
        for (k, &len) in sizes.iter().enumerate() {
            let mut got = vec![0u8; len];
            let status = peer.receive_into_with_tag(&mut got[..], k as i32)?;
            ensure(status.byte_count() == len, || {
                format!("buffered message {k} arrived with {status:?}, expected {len} bytes")
            })?;
            check_bytes(k as u64, &got, &format!("buffered message of {len} bytes"))?;
        }
        let mut got = vec![0u8; 100];
        peer.receive_into_with_tag(&mut got[..], IBSEND)?;
        check_bytes(50, &got, "immediate buffered message")?;
        for i in 0..REUSES {
            let mut got = vec![0u8; 1000];
            peer.receive_into_with_tag(&mut got[..], REUSE)?;
            check_bytes(1000 + i as u64, &got, "message through a reused buffer")?;
        }
        Ok(())
    }
}

/// Every rank sends to every other before receiving anything, short and
/// long messages: with standard sends the long ones would wait for each
/// other; buffered, every rank gets to its receives.
fn buffered_all(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let sizes = [7usize, threshold() * 2];
    let seed = |from: i32, to: i32, k: usize| (from * 1000 + to) as u64 * 10 + k as u64;
    let per_peer: usize = sizes.iter().map(|len| len + BSEND_OVERHEAD).sum();
    attach_buffer(vec![0u8; per_peer * (size as usize - 1)])?;
    for to in (0..size).filter(|&to| to != rank) {
        for (k, &len) in sizes.iter().enumerate() {
            world
                .process_at_rank(to)
                .buffered_send_with_tag(&filled(seed(rank, to, k), len)[..], k as i32)?;
        }
    }
    for from in (0..size).filter(|&from| from != rank) {
        for (k, &len) in sizes.iter().enumerate() {
            let mut got = vec![0u8; len];
            world
                .process_at_rank(from)
                .receive_into_with_tag(&mut got[..], k as i32)?;
            check_bytes(seed(from, rank, k), &got, "buffered message")?;
        }
    }
    detach_buffer().map(drop)
}

/// No buffer, a second attach, no room left, a message larger than the
/// buffer: each is an MPI_ERR_BUFFER error saying what was needed and
/// what is free, and the job goes on; nothing is lost.
fn buffered_overflow(world: &Communicator) -> Result<()> {
    const GO: i32 = 100;
    if world.rank() > 1 {
        return Ok(());
    }
    let long = threshold() * 2;
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 1 {
        peer.receive_into_with_tag(&mut [0u8; 1][..], GO)?;
        let mut got = vec![0u8; long];
        peer.receive_into_with_tag(&mut got[..], 1)?;
        check_bytes(1, &got, "the long buffered message")?;
        let mut got = [0u8; 10];
        peer.receive_into_with_tag(&mut got[..], 2)?;
        return check_bytes(2, &got, "the buffered message after the flush");
    }
    expect_error(
        peer.buffered_send(&[1u8; 10][..]),
        ErrorClass::Buffer,
        &["needs 106 bytes", "no buffer is attached"],
        "a buffered send without a buffer",
    )?;
    expect_error(
        detach_buffer(),
        ErrorClass::Buffer,
        &["no buffer is attached"],
        "detach without a buffer",
    )?;
    let total = long + BSEND_OVERHEAD + 50;
    attach_buffer(vec![0u8; total])?;
    expect_error(
        attach_buffer(vec![0u8; 10]),
        ErrorClass::Buffer,
        &["already attached"],
        "a second attach",
    )?;
    // Pending until rank 1 is told to go: it takes all but 50 bytes.
    peer.buffered_send_with_tag(&filled(1, long)[..], 1)?;
    let free = format!("50 of its {total} bytes are free");
    expect_error(
        peer.buffered_send_with_tag(&filled(2, 10)[..], 2),
        ErrorClass::Buffer,
        &["needs 106 bytes", &free],
        "a buffered send that does not fit",
    )?;
    expect_error(
        peer.buffered_send_with_tag(&vec![0u8; total][..], 3),
        ErrorClass::Buffer,
        &[&format!("needs {} bytes", total + BSEND_OVERHEAD), &free],
        "a buffered send larger than the buffer",
    )?;
    scope(|s| {
        expect_error(
            peer.immediate_buffered_send_with_tag(s, &[0u8; 10][..], 3),
            ErrorClass::Buffer,
            &["needs 106 bytes"],
            "an immediate buffered send that does not fit",
        )?;
        let mut request = peer.buffered_send_init(s, &[0u8; 10], 3)?;
        expect_error(
            request.start(),
            ErrorClass::Buffer,
            &["needs 106 bytes"],
            "a persistent buffered send that does not fit",
        )?;
        ensure(!request.is_active(), || {
            "a persistent buffered send that failed to start is active".into()
        })
    })?;
    // The job goes on: other sends work, and the long message arrives
    // once rank 1 receives it; flushing waits for that.
    peer.send_with_tag(&[1u8][..], GO)?;
    flush_buffer()?;
    peer.buffered_send_with_tag(&filled(2, 10)[..], 2)?;
    let memory = detach_buffer()?;
    ensure(memory.len() == total, || {
        format!("detach gave back {} bytes of {total}", memory.len())
    })
}

/// Four threads on rank 0 send buffered messages at once (short and
/// long) while the main thread flushes the buffer; four threads on rank 1
/// receive each sender's messages in order.
fn buffered_threads(world: &Communicator) -> Result<()> {
    const THREADS: i32 = 4;
    const MESSAGES: usize = 300;
    if world.rank() > 1 {
        return Ok(());
    }
    let t = threshold();
    let len = |thread: i32, i: usize| {
        if i % 50 == 49 {
            t + 1 + thread as usize
        } else {
            (i * 37 + thread as usize * 11) % 2000
        }
    };
    let seed = |thread: i32, i: usize| (thread as u64) << 32 | i as u64;
    let peer = world.process_at_rank(1 - world.rank());
    let sending = world.rank() == 0;
    if sending {
        let total: usize = (0..THREADS)
            .flat_map(|thread| (0..MESSAGES).map(move |i| len(thread, i) + BSEND_OVERHEAD))
            .sum();
        attach_buffer(vec![0u8; total])?;
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|threads| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                threads.spawn(move || -> Result<()> {
                    for i in 0..MESSAGES {
                        let message = filled(seed(thread, i), len(thread, i));
                        if sending {
                            peer.buffered_send_with_tag(&message[..], thread)?;
                        } else {
                            let mut got = vec![0u8; message.len()];
                            let status = peer.receive_into_with_tag(&mut got[..], thread)?;
                            ensure(status.byte_count() == message.len(), || {
                                format!("thread {thread}: message {i} arrived as {status:?}")
                            })?;
                            check_bytes(seed(thread, i), &got, "buffered message from a thread")?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let flusher = threads.spawn(|| -> Result<()> {
            while sending && !done.load(std::sync::atomic::Ordering::SeqCst) {
                flush_buffer()?;
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        });
        let joined = workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .map_err(|_| fail("a thread panicked"))
                .and_then(|r| r)
        });
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let flushed = flusher
            .join()
            .map_err(|_| fail("the flushing thread panicked"))
            .and_then(|r| r);
        joined.and(flushed)
    })?;
    if sending {
        detach_buffer()?;
    }
    Ok(())
}

/// Value `j` of message `i` from `rank` in the persistent checks.
fn value(rank: i32, i: usize, j: usize) -> u64 {
    (rank as u64) << 40 | (i as u64) << 16 | j as u64
}

/// Persistent sends and receives between ranks 0 and 1: restarted 1,000
/// times (start_all and wait_all, or start and wait and test), the data
/// changed and checked every time; long messages; synchronous, ready and
/// buffered ones; misuse is an error; the end of the scope completes an
/// active request.
fn persistent(world: &Communicator) -> Result<()> {
    const ROUNDS: usize = 1000;
    const GO: i32 = 100;
    if world.rank() > 1 {
        return Ok(());
    }
    let rank = world.rank();
    let other = 1 - rank;
    let peer = world.process_at_rank(other);
    let mut outgoing = [0u64; 32];
    let mut incoming = [0u64; 32];
    scope(|s| -> Result<()> {
        let send = peer.send_init(s, &mut outgoing, 1)?;
        let receive = peer.receive_init(s, &mut incoming, 1)?;
        let mut requests = [receive, send];
        for i in 0..ROUNDS {
            for (j, x) in requests[1].buffer_mut()?.iter_mut().enumerate() {
                *x = value(rank, i, j);
            }
            let status = if i % 2 == 0 {
                start_all(&mut requests)?;
                wait_all(&mut requests)?[0]
            } else {
                requests[0].start()?;
                requests[1].start()?;
                requests[1].wait()?;
                loop {
                    if let Some(status) = requests[0].test()? {
                        break status;
                    }
                }
            };
            ensure(
                status.source_rank() == other
                    && status.tag() == 1
                    && status.count::<u64>() == Some(32),
                || format!("round {i}: the persistent receive completed with {status:?}"),
            )?;
            let got = requests[0].buffer()?;
            if let Some(j) = (0..32).find(|&j| got[j] != value(other, i, j)) {
                return Err(fail(format!(
                    "round {i}: value {j} is {:#x}, expected {:#x}",
                    got[j],
                    value(other, i, j)
                )));
            }
        }
        // Misuse: starting an active request, touching a lent buffer.
        requests[0].start()?;
        expect_error(
            requests[0].start(),
            ErrorClass::Request,
            &["already active"],
            "starting an active persistent receive",
        )?;
        expect_error(
            requests[0].buffer().map(drop),
            ErrorClass::Request,
            &["active"],
            "reading an active receive's buffer",
        )?;
        expect_error(
            requests[0].buffer_mut().map(drop),
            ErrorClass::Request,
            &["active"],
            "changing an active receive's buffer",
        )?;
        expect_error(
            start_all(&mut requests),
            ErrorClass::Request,
            &["request 0 of 2", "none was started"],
            "start_all with an active request",
        )?;
        ensure(!requests[1].is_active(), || {
            "start_all started a request although another was active".into()
        })?;
        let status = requests[1].wait()?;
        ensure(status.tag() == ANY_TAG && status.byte_count() == 0, || {
            format!("waiting for an inactive request gave {status:?}")
        })?;
        ensure(requests[1].test()?.is_some(), || {
            "testing an inactive request said it is pending".into()
        })?;
        // Nobody sends tag 1 now: the receive is cancelled.
        requests[0].cancel();
        ensure(requests[0].wait()?.is_cancelled(), || {
            "a cancelled persistent receive was not cancelled".into()
        })?;
        Ok(())
    })?;
    ensure(incoming[0] == value(other, ROUNDS - 1, 0), || {
        "the receive buffer does not hold the last message after the scope".into()
    })?;

    // Long messages (rendezvous), 50 times.
    let long = threshold() * 2 + 3;
    let mut outgoing = vec![0u8; long];
    let mut incoming = vec![0u8; long];
    scope(|s| -> Result<()> {
        let send = peer.send_init(s, &mut outgoing, 2)?;
        let receive = peer.receive_init(s, &mut incoming, 2)?;
        let mut requests = [send, receive];
        for i in 0..50u64 {
            requests[0]
                .buffer_mut()?
                .copy_from_slice(&filled(i << 8 | rank as u64, long));
            start_all(&mut requests)?;
            let statuses = wait_all(&mut requests)?;
            ensure(statuses[1].byte_count() == long, || {
                format!("long round {i}: {:?}", statuses[1])
            })?;
            check_bytes(
                i << 8 | other as u64,
                requests[1].buffer()?,
                "long persistent message",
            )?;
        }
        Ok(())
    })?;

    // Rank 0 sends, rank 1 receives: synchronous (a shared buffer), ready
    // (to a receive posted before GO) and buffered.
    const CONSTANT: [u32; 4] = [1, 2, 3, 4];
    let mut got = [0u32; 4];
    let mut got_ready = [0u32; 4];
    let mut got_buffered = [0u32; 4];
    scope(|s| -> Result<()> {
        if rank == 0 {
            let mut synchronous = peer.synchronous_send_init(s, &CONSTANT, 3)?;
            expect_error(
                synchronous.buffer_mut().map(drop),
                ErrorClass::Buffer,
                &["lent shared"],
                "changing a shared send buffer",
            )?;
            let mut ready = peer.ready_send_init(s, &CONSTANT, 4)?;
            attach_buffer(vec![0u8; 16 + BSEND_OVERHEAD])?;
            let mut buffered = peer.buffered_send_init(s, &CONSTANT, 5)?;
            for _ in 0..100 {
                synchronous.start()?;
                ensure(synchronous.buffer()? == &CONSTANT, || {
                    "an active send's buffer reads wrong".into()
                })?;
                synchronous.wait()?;
                peer.receive_into_with_tag(&mut [0u8; 1][..], GO)?;
                ready.start()?;
                ready.wait()?;
                buffered.start()?;
                ensure(buffered.test()?.is_some(), || {
                    "a persistent buffered send did not complete at once".into()
                })?;
            }
            detach_buffer().map(drop)
        } else {
            let mut synchronous = peer.receive_init(s, &mut got, 3)?;
            let mut ready = world.any_process().receive_init(s, &mut got_ready, 4)?;
            let mut buffered = peer.receive_init(s, &mut got_buffered, 5)?;
            for i in 0..100 {
                synchronous.start()?;
                synchronous.wait()?;
                ready.start()?;
                peer.send_with_tag(&[1u8][..], GO)?;
                let status = ready.wait()?;
                ensure(status.source_rank() == 0, || {
                    format!("ready round {i}: {status:?}")
                })?;
                buffered.start()?;
                buffered.wait()?;
                for (what, request) in [
                    ("synchronous", &synchronous),
                    ("ready", &ready),
                    ("buffered", &buffered),
                ] {
                    ensure(request.buffer()? == &CONSTANT, || {
                        format!("{what} round {i} delivered {:?}", request.buffer())
                    })?;
                }
            }
            Ok(())
        }
    })?;

    // A scope ends with an active receive that nothing matches (one left
    // in a variable, one leaked): the scope cancels both, and the buffers
    // are free again.
    let mut left = [7u8; 4];
    let mut leaked = [8u8; 4];
    scope(|s| -> Result<()> {
        let mut request = peer.receive_init(s, &mut left, 999)?;
        request.start()?;
        let mut request = world.any_process().receive_init(s, &mut leaked, 999)?;
        request.start()?;
        std::mem::forget(request);
        Ok(())
    })?;
    left[0] = 1;
    leaked[0] = 1;
    ensure(left == [1, 7, 7, 7] && leaked == [1, 8, 8, 8], || {
        "a cancelled receive wrote into its buffer".into()
    })
}

/// Every rank sends to its right and receives from its left with one
/// pair of persistent requests, started together 1,000 times.
fn persistent_ring(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let mut outgoing = [0u64; 8];
    let mut incoming = [0u64; 8];
    scope(|s| -> Result<()> {
        let mut requests = [
            world
                .process_at_rank(left)
                .receive_init(s, &mut incoming, 0)?,
            world
                .process_at_rank(right)
                .send_init(s, &mut outgoing, 0)?,
        ];
        for i in 0..1000 {
            for (j, x) in requests[1].buffer_mut()?.iter_mut().enumerate() {
                *x = value(rank, i, j);
            }
            start_all(&mut requests)?;
            let status = wait_all(&mut requests)?[0];
            ensure(status.source_rank() == left, || {
                format!("round {i}: {status:?}")
            })?;
            let got = requests[0].buffer()?;
            ensure((0..8).all(|j| got[j] == value(left, i, j)), || {
                format!("round {i}: received {got:x?} from rank {left}")
            })?;
        }
        Ok(())
    })
}

/// Send-receive-replace around a ring (every rank at once, short and
/// long messages, so a rank that sent before receiving would wait for
/// ever), then along a chain with PROC_NULL at its ends, where each rank
/// receives a shorter message than it sent.
fn replace_ring(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let seed = |rank: i32, len: usize| (rank as u64) << 32 | len as u64;
    for len in [0, 5, 1000, threshold() + 1, 1 << 20] {
        let mut buf = filled(seed(rank, len), len);
        let status = world.process_at_rank(right).send_receive_replace(
            &mut buf[..],
            7,
            &world.process_at_rank(left),
            7,
        )?;
        ensure(
            status.source_rank() == left && status.tag() == 7 && status.byte_count() == len,
            || format!("{len} bytes around the ring: {status:?}"),
        )?;
        check_bytes(seed(left, len), &buf, "message replaced around the ring")?;
    }
    // The communicator's form, with u64 elements, and any tag.
    let mut values = [rank as u64; 3];
    let status = world.send_receive_replace(
        &mut values[..],
        &world.process_at_rank(right),
        &world.process_at_rank(left),
    )?;
    ensure(
        values == [left as u64; 3] && status.count::<u64>() == Some(3),
        || format!("u64 ring: got {values:?} with {status:?}"),
    )?;
    // A chain: rank r sends 10 + r bytes right and receives 9 + r from
    // the left; the last byte keeps what was sent. Rank 0 receives from
    // PROC_NULL, which leaves its buffer as it was.
    let to = if rank + 1 < size { rank + 1 } else { PROC_NULL };
    let from = if rank > 0 { rank - 1 } else { PROC_NULL };
    let len = 10 + rank as usize;
    let mut buf = filled(seed(rank, 0), len);
    let status = world.process_at_rank(to).send_receive_replace(
        &mut buf[..],
        8,
        &world.process_at_rank(from),
        ANY_TAG,
    )?;
    if from == PROC_NULL {
        ensure(
            status.source_rank() == PROC_NULL && status.byte_count() == 0,
            || format!("chain from PROC_NULL: {status:?}"),
        )?;
        check_bytes(seed(rank, 0), &buf, "buffer after a receive from PROC_NULL")
    } else {
        ensure(
            status.source_rank() == from && status.tag() == 8 && status.byte_count() == len - 1,
            || format!("chain: {status:?}"),
        )?;
        check_bytes(seed(from, 0), &buf[..len - 1], "chain message")?;
        ensure(buf[len - 1] == pattern(seed(rank, 0), len - 1), || {
            "the byte past a shorter message was overwritten".into()
        })
    }
}

/// Element counts (MPI_Get_elements) equal counts for basic types: a
/// 12-byte message is 12 u8, 3 u32 or f32, and no whole number of u64.
fn elements(world: &Communicator) -> Result<()> {
    if world.rank() > 1 {
        return Ok(());
    }
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 0 {
        peer.send(&[1u8; 12][..])?;
        peer.send(&[0u8; 0][..])?;
        return peer.send(&[1.5f64, 2.5][..]);
    }
    let counts = |status: &Status| {
        (
            status.count::<u8>(),
            status.elements::<u8>(),
            status.count::<u32>(),
            status.elements::<u32>(),
            status.elements::<f32>(),
            status.count::<u64>(),
            status.elements::<u64>(),
        )
    };
    let mut buf = [0u8; 16];
    let status = peer.receive_into(&mut buf[..])?;
    ensure(
        counts(&status) == (Some(12), Some(12), Some(3), Some(3), Some(3), None, None),
        || format!("12 bytes: counts {:?}", counts(&status)),
    )?;
    let status = peer.receive_into(&mut buf[..])?;
    ensure(
        counts(&status)
            == (
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
            ),
        || format!("0 bytes: counts {:?}", counts(&status)),
    )?;
    let mut doubles = [0.0f64; 4];
    let status = scope(|s| -> Result<Status> {
        let mut request = peer.receive_init(s, &mut doubles, ANY_TAG)?;
        request.start()?;
        request.wait()
    })?;
    ensure(
        status.elements::<f64>() == Some(2) && status.count::<f64>() == Some(2),
        || format!("two f64: {status:?}"),
    )?;
    ensure(doubles == [1.5, 2.5, 0.0, 0.0], || {
        format!("two f64 arrived as {doubles:?}")
    })
}
