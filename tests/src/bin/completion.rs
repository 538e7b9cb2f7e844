//! Checks of completing many requests (MPI 4.1 §3.7.5) run as real jobs:
//! `completion CHECK`, started by the harness through oxrun. Each check
//! verifies its own results; on a failure the rank says why and aborts
//! the job, so a failed check never leaves the other ranks waiting.
//!
//! - `order`: wait_some, test_some, test_any and wait_any over receives
//!   that complete out of order, step by step, with every index checked
//!   against the vector as it was when the call started (ranks 0 and 1).
//! - `bulk`: rank 0 completes hundreds of receives from every other rank,
//!   sent in shuffled order and some long, by a mix of the four calls.
//! - `get-status`: `Request::get_status` sees receives and a synchronous
//!   send complete (it makes progress itself) without freeing them, also
//!   a truncated receive; a later wait or test returns the same outcome.
//! - `in-status`: one short and one long truncated receive among several:
//!   wait_all returns MPI_ERR_IN_STATUS naming exactly them and completes
//!   the rest; wait_all_outcomes, test_all and wait_some show which
//!   failed; the job goes on.

use oxmpi::request::{
    scope, test_all, test_any, test_some, wait_all, wait_all_outcomes, wait_any, wait_some,
    Completed, Request,
};
use oxmpi::Threading;
use oxmpi::{Communicator, ErrorClass, Process, Result, Status};
use oxmpi_jobs::checks::{check_bytes, ensure, fail, filled};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Tag of the messages that pace a check (never one of its data tags).
const CONTROL: i32 = 1_000_000;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("completion {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            match check.as_str() {
                "order" => order(&world),
                "bulk" => bulk(&world),
                "get-status" => get_status(&world),
                "in-status" => in_status(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// Calls `poll` until it gives a value; fails after 30 s instead of
/// hanging (the harness's bound would only say that the job hung).
fn until<T>(what: &str, mut poll: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = poll()? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(fail(format!("{what}: nothing after 30 s")));
        }
    }
}

/// Waits for the next pacing message from `peer`.
fn control(peer: &Process) -> Result<()> {
    peer.receive_into_with_tag(&mut 0u8, CONTROL).map(|_| ())
}

fn threshold() -> usize {
    std::env::var("OXMPI_TCP_EAGER_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 * 1024)
}

/// Checks what a wait_some or test_some gave against `tags` (the tag of
/// each request, as the vector was when the call started), removes the
/// completed ones from `tags` and returns their tags in index order.
/// Every outcome must be a status with its request's tag.
fn take_some(done: Completed, tags: &mut Vec<i32>, what: &str) -> Result<Vec<i32>> {
    ensure(done.windows(2).all(|w| w[0].0 < w[1].0), || {
        format!("{what}: indices not ascending: {:?}", indices(&done))
    })?;
    let mut completed = Vec::new();
    for (index, outcome) in &done {
        let tag = *tags.get(*index).ok_or_else(|| {
            fail(format!(
                "{what}: index {index} of a vector of {}",
                tags.len()
            ))
        })?;
        let status = outcome
            .clone()
            .map_err(|e| fail(format!("{what}: request {index} (tag {tag}) failed: {e}")))?;
        ensure(status.tag() == tag, || {
            format!(
                "{what}: request {index} is for tag {tag}, its status says {}",
                status.tag()
            )
        })?;
        completed.push(tag);
    }
    for (index, _) in done.iter().rev() {
        tags.remove(*index);
    }
    Ok(completed)
}

fn indices(done: &Completed) -> Vec<usize> {
    done.iter().map(|(i, _)| *i).collect()
}

/// Receives on rank 1 complete in an order rank 0 dictates, step by step:
/// each call must complete exactly what was sent so far and name it by
/// its index in the vector as it was when the call started.
fn order(world: &Communicator) -> Result<()> {
    const N: i32 = 8;
    let value = |tag: i32| tag as u64 * 100 + 1;
    match world.rank() {
        0 => {
            let peer = world.process_at_rank(1);
            for step in [&[5][..], &[7, 1], &[0], &[6, 4, 3, 2]] {
                control(&peer)?;
                for &tag in step {
                    peer.send_with_tag(&value(tag), tag)?;
                }
            }
            Ok(())
        }
        1 => {
            let peer = world.process_at_rank(0);
            let mut bufs = [0u64; N as usize];
            scope(|s| -> Result<()> {
                let mut none: Vec<Request> = Vec::new();
                ensure(wait_some(&mut none)?.is_none(), || {
                    "wait_some of no requests is not None".into()
                })?;
                ensure(test_some(&mut none)?.is_none(), || {
                    "test_some of no requests is not None".into()
                })?;
                ensure(test_any(&mut none)?.is_none(), || {
                    "test_any of no requests is not None".into()
                })?;
                ensure(wait_any(&mut none)?.is_none(), || {
                    "wait_any of no requests is not None".into()
                })?;

                let mut requests = Vec::new();
                let mut tags: Vec<i32> = (0..N).collect();
                for (tag, buf) in bufs.iter_mut().enumerate() {
                    requests.push(peer.immediate_receive_into_with_tag(s, buf, tag as i32)?);
                }
                // Nothing is sent before the first CONTROL.
                let early = test_some(&mut requests)?;
                ensure(early.as_ref().is_some_and(|d| d.is_empty()), || {
                    format!("test_some before any send gave {early:?}")
                })?;
                let early = test_any(&mut requests)?;
                ensure(early.is_none(), || {
                    format!("test_any before any send gave {early:?}")
                })?;
                ensure(requests.len() == N as usize, || {
                    "a test that completed nothing removed requests".into()
                })?;

                // Step 1: tag 5 alone.
                peer.send_with_tag(&0u8, CONTROL)?;
                let done = wait_some(&mut requests)?.ok_or_else(|| fail("wait_some: None"))?;
                ensure(indices(&done) == [5], || {
                    format!("wait_some after tag 5 completed {:?}", indices(&done))
                })?;
                take_some(done, &mut tags, "wait_some after tag 5")?;

                // Step 2: tags 7 and 1. Once get_status sees both done, one
                // wait_some takes both: tag 1 at index 1, tag 7 at index 6
                // (where it is now that tag 5 is gone).
                peer.send_with_tag(&0u8, CONTROL)?;
                for index in [6, 1] {
                    until("get_status of tags 7 and 1", || {
                        requests[index].get_status()
                    })?;
                }
                let done = wait_some(&mut requests)?.ok_or_else(|| fail("wait_some: None"))?;
                ensure(indices(&done) == [1, 6], || {
                    format!("wait_some after tags 7, 1 completed {:?}", indices(&done))
                })?;
                take_some(done, &mut tags, "wait_some after tags 7, 1")?;
                ensure(tags == [0, 2, 3, 4, 6], || format!("left: {tags:?}"))?;

                // Step 3: tag 0, by test_any.
                peer.send_with_tag(&0u8, CONTROL)?;
                let (index, outcome) = until("test_any of tag 0", || test_any(&mut requests))?;
                let status = outcome?;
                ensure(index == 0 && status.tag() == 0, || {
                    format!("test_any gave index {index} with tag {}", status.tag())
                })?;
                tags.remove(index);

                // Step 4: tags 6, 4, 3, 2 (last to first) by test_some and
                // wait_any, whatever order they arrive in.
                peer.send_with_tag(&0u8, CONTROL)?;
                let mut round = 0;
                while !requests.is_empty() {
                    round += 1;
                    if round % 2 == 0 {
                        let (index, outcome) = wait_any(&mut requests)?
                            .ok_or_else(|| fail("wait_any: None with requests left"))?;
                        let status = outcome?;
                        let tag = tags.remove(index);
                        ensure(status.tag() == tag, || {
                            format!("wait_any: index {index} is tag {tag}, got {status:?}")
                        })?;
                    } else if let Some(done) = test_some(&mut requests)? {
                        take_some(done, &mut tags, "test_some of tags 6, 4, 3, 2")?;
                    }
                }
                ensure(tags.is_empty(), || format!("tags left: {tags:?}"))?;
                ensure(wait_some(&mut requests)?.is_none(), || {
                    "wait_some of the emptied vector is not None".into()
                })?;
                Ok(())
            })?;
            for (tag, &v) in bufs.iter().enumerate() {
                ensure(v == value(tag as i32), || format!("tag {tag} holds {v}"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Receives per sending rank in `bulk`.
const BULK: usize = 300;

/// Length of message `tag` from `rank` in `bulk`: every 37th is long
/// (rendezvous), the rest short, of varied lengths.
fn bulk_len(rank: i32, tag: usize) -> usize {
    if tag % 37 == 5 {
        threshold() * 2 + tag
    } else {
        (tag * 7 + rank as usize) % 200
    }
}

fn bulk_seed(rank: i32, tag: usize) -> u64 {
    (rank as u64) << 32 | tag as u64
}

/// Every other rank sends rank 0 `BULK` messages in a shuffled order; rank
/// 0 has posted a receive for each and completes them with a mix of
/// wait_some, test_some, test_any and wait_any.
fn bulk(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    if rank != 0 {
        let mut order: Vec<usize> = (0..BULK).collect();
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ rank as u64;
        for i in (1..BULK).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let root = world.process_at_rank(0);
        control(&root)?;
        for tag in order {
            root.send_with_tag(
                &filled(bulk_seed(rank, tag), bulk_len(rank, tag))[..],
                tag as i32,
            )?;
        }
        return Ok(());
    }
    let senders: Vec<i32> = (1..size).collect();
    let mut bufs: Vec<Vec<u8>> = senders
        .iter()
        .flat_map(|&r| (0..BULK).map(move |tag| vec![0u8; bulk_len(r, tag)]))
        .collect();
    let mut seen = vec![false; bufs.len()];
    let (mut calls, mut out_of_order) = (0usize, 0usize);
    scope(|s| -> Result<()> {
        let mut requests = Vec::new();
        // (source, tag) of each request, as `requests` is now.
        let mut expected: Vec<(i32, usize)> = Vec::new();
        for (k, buf) in bufs.iter_mut().enumerate() {
            let (source, tag) = (senders[k / BULK], k % BULK);
            requests.push(
                world
                    .process_at_rank(source)
                    .immediate_receive_into_with_tag(s, &mut buf[..], tag as i32)?,
            );
            expected.push((source, tag));
        }
        for &r in &senders {
            world.process_at_rank(r).send_with_tag(&0u8, CONTROL)?;
        }
        let mut completed = |index: usize,
                             outcome: Result<Status>,
                             expected: &mut Vec<(i32, usize)>,
                             what: &str|
         -> Result<()> {
            let (source, tag) = expected[index];
            let status = outcome.map_err(|e| fail(format!("{what}: {source}/{tag}: {e}")))?;
            ensure(
                status.source_rank() == source
                    && status.tag() == tag as i32
                    && status.byte_count() == bulk_len(source, tag),
                || format!("{what}: index {index} expects {source}/{tag}, got {status:?}"),
            )?;
            let k = (source as usize - 1) * BULK + tag;
            ensure(!seen[k], || {
                format!("{what}: {source}/{tag} completed twice")
            })?;
            seen[k] = true;
            Ok(())
        };
        while !requests.is_empty() {
            calls += 1;
            let entry = requests.len();
            let what = ["wait_some", "test_some", "test_any", "wait_any"][calls % 4];
            let done: Completed = match calls % 4 {
                0 => wait_some(&mut requests)?.ok_or_else(|| fail("wait_some: None"))?,
                1 => test_some(&mut requests)?.ok_or_else(|| fail("test_some: None"))?,
                2 => test_any(&mut requests)?.into_iter().collect(),
                _ => wait_any(&mut requests)?.into_iter().collect(),
            };
            ensure(requests.len() + done.len() == entry, || {
                format!(
                    "{what}: {entry} requests, {} completed, {} left",
                    done.len(),
                    requests.len()
                )
            })?;
            ensure(done.windows(2).all(|w| w[0].0 < w[1].0), || {
                format!("{what}: indices not ascending: {:?}", indices(&done))
            })?;
            out_of_order += done.iter().filter(|(i, _)| *i > 0).count();
            let mut gone = Vec::new();
            for (index, outcome) in done {
                ensure(index < entry, || {
                    format!("{what}: index {index} of {entry}")
                })?;
                completed(index, outcome, &mut expected, what)?;
                gone.push(index);
            }
            for index in gone.into_iter().rev() {
                expected.remove(index);
            }
        }
        Ok(())
    })?;
    ensure(seen.iter().all(|&s| s), || {
        "a receive never completed".into()
    })?;
    ensure(out_of_order > 0, || {
        "every completion was of the first request: nothing out of order".into()
    })?;
    for (k, buf) in bufs.iter().enumerate() {
        let (source, tag) = (senders[k / BULK], k % BULK);
        check_bytes(
            bulk_seed(source, tag),
            buf,
            &format!("message {tag} from {source}"),
        )?;
    }
    println!(
        "bulk: {} receives in {calls} calls, {out_of_order} completed past the head",
        bufs.len()
    );
    Ok(())
}

/// `Request::get_status` reports completion (making progress itself)
/// without freeing the request.
fn get_status(world: &Communicator) -> Result<()> {
    match world.rank() {
        0 => {
            let peer = world.process_at_rank(1);
            let long = threshold() * 2;
            let mut small = [0u32; 4];
            let mut big = vec![0u8; long];
            let mut tiny = [0u8; 4];
            scope(|s| -> Result<()> {
                let first = peer.immediate_receive_into_with_tag(s, &mut small, 1)?;
                let second = peer.immediate_receive_into_with_tag(s, &mut big[..], 2)?;
                ensure(first.get_status()?.is_none(), || {
                    "get_status before the send says complete".into()
                })?;
                // Rank 1 sends tag 1.
                peer.send_with_tag(&0u8, CONTROL)?;
                let status = until("get_status of tag 1", || first.get_status())?;
                ensure(status.tag() == 1 && status.byte_count() == 16, || {
                    format!("get_status of tag 1 gave {status:?}")
                })?;
                let again = first.get_status()?;
                ensure(again == Some(status), || {
                    format!("get_status again gave {again:?}, first {status:?}")
                })?;
                ensure(second.get_status()?.is_none(), || {
                    "get_status of the unsent tag 2 says complete".into()
                })?;
                // The request is still there: test_some completes it (and
                // only it) with the same status.
                let mut both = vec![first, second];
                let done = test_some(&mut both)?.ok_or_else(|| fail("test_some: None"))?;
                ensure(
                    done.len() == 1 && done[0].0 == 0 && done[0].1 == Ok(status),
                    || format!("test_some after get_status gave {done:?}"),
                )?;
                let second = both.pop().ok_or_else(|| fail("tag 2 request gone"))?;

                // Rank 1 sends tag 2, long (rendezvous).
                peer.send_with_tag(&0u8, CONTROL)?;
                let status = until("get_status of tag 2", || second.get_status())?;
                ensure(status.tag() == 2 && status.byte_count() == long, || {
                    format!("get_status of tag 2 gave {status:?}")
                })?;
                let waited = second.wait()?;
                ensure(waited == status, || {
                    format!("wait after get_status gave {waited:?}, get_status {status:?}")
                })?;

                // A synchronous send is complete once rank 1 receives it,
                // which it does only after the next CONTROL.
                let ssend = peer.immediate_synchronous_send_with_tag(s, &[9u8; 8][..], 3)?;
                ensure(ssend.get_status()?.is_none(), || {
                    "a synchronous send nobody received says complete".into()
                })?;
                peer.send_with_tag(&0u8, CONTROL)?;
                until("get_status of the synchronous send", || ssend.get_status())?;
                let mut sends = vec![ssend];
                let (index, outcome) =
                    test_any(&mut sends)?.ok_or_else(|| fail("test_any of the send: None"))?;
                ensure(index == 0 && outcome.is_ok(), || {
                    format!("test_any of the send after get_status: {index}, {outcome:?}")
                })?;

                // A truncated receive: get_status reports the error, and
                // keeps reporting it; its wait returns it too.
                let cut = peer.immediate_receive_into_with_tag(s, &mut tiny[..], 4)?;
                peer.send_with_tag(&0u8, CONTROL)?;
                let error = until("get_status of the truncated receive", || {
                    match cut.get_status() {
                        Ok(None) => Ok(None),
                        Err(e) if e.class() == ErrorClass::Truncate => Ok(Some(e)),
                        other => Err(fail(format!(
                            "get_status of a truncated receive gave {other:?}"
                        ))),
                    }
                })?;
                let again = cut.get_status();
                ensure(again.as_ref() == Err(&error), || {
                    format!("get_status again gave {again:?}, first {error}")
                })?;
                let waited = cut.wait();
                ensure(waited.as_ref() == Err(&error), || {
                    format!("wait after get_status gave {waited:?}, get_status {error}")
                })?;
                Ok(())
            })?;
            ensure(small == [11, 12, 13, 14], || {
                format!("tag 1 holds {small:?}")
            })?;
            check_bytes(2, &big, "tag 2")?;
            check_bytes(4, &tiny, "truncated tag 4")?;
            Ok(())
        }
        1 => {
            let peer = world.process_at_rank(0);
            control(&peer)?;
            peer.send_with_tag(&[11u32, 12, 13, 14][..], 1)?;
            control(&peer)?;
            peer.send_with_tag(&filled(2, threshold() * 2)[..], 2)?;
            control(&peer)?;
            let mut buf = [0u8; 8];
            peer.receive_into_with_tag(&mut buf[..], 3)?;
            ensure(buf == [9; 8], || format!("synchronous send gave {buf:?}"))?;
            control(&peer)?;
            peer.send_with_tag(&filled(4, 100)[..], 4)
        }
        _ => Ok(()),
    }
}

/// Messages of round `round` in `in-status`: tags `10 * round + k`;
/// message 2 (short) and 4 (long) do not fit their 10-byte buffers.
const IN_STATUS_MESSAGES: usize = 6;
const TRUNCATED: [usize; 2] = [2, 4];

fn in_status_len(k: usize) -> usize {
    match k {
        2 => 100,
        4 => threshold() * 2,
        _ => 10,
    }
}

/// How rank 0 completes one round of `in-status`.
#[derive(Clone, Copy, Debug)]
enum Round {
    WaitAll,
    WaitAllOutcomes,
    TestAll,
    WaitSome,
}

/// Rank 1 sends rank 0 six messages per round, two of them too long for
/// their buffers; rank 0 receives them together with one send of its own
/// (the last request), completing the round as `Round` says.
fn in_status(world: &Communicator) -> Result<()> {
    let rounds = [
        Round::WaitAll,
        Round::WaitAllOutcomes,
        Round::TestAll,
        Round::WaitSome,
    ];
    match world.rank() {
        0 => {
            let peer = world.process_at_rank(1);
            for (r, &round) in rounds.iter().enumerate() {
                let mut bufs = [[0u8; 10]; IN_STATUS_MESSAGES];
                let note = [r as u8; 8];
                let outcomes = scope(|s| -> Result<Option<Vec<Result<Status>>>> {
                    let mut requests = Vec::new();
                    for (k, buf) in bufs.iter_mut().enumerate() {
                        requests.push(peer.immediate_receive_into_with_tag(
                            s,
                            &mut buf[..],
                            (10 * r + k) as i32,
                        )?);
                    }
                    requests.push(peer.immediate_send_with_tag(s, &note[..], CONTROL)?);
                    complete_round(round, requests)
                })?;
                if let Some(outcomes) = outcomes {
                    check_round(round, &outcomes)?;
                }
                for (k, buf) in bufs.iter().enumerate() {
                    // Every request completed: also the truncated ones hold
                    // the first 10 bytes of their message.
                    check_bytes((10 * r + k) as u64, buf, &format!("{round:?} message {k}"))?;
                }
            }
            // The job goes on.
            peer.send_with_tag(&42u32, 7)?;
            let mut v = 0u32;
            peer.receive_into_with_tag(&mut v, 8)?;
            ensure(v == 43, || format!("answer after the rounds is {v}"))
        }
        1 => {
            let peer = world.process_at_rank(0);
            for r in 0..rounds.len() {
                for k in 0..IN_STATUS_MESSAGES {
                    let tag = 10 * r + k;
                    peer.send_with_tag(&filled(tag as u64, in_status_len(k))[..], tag as i32)?;
                }
                let mut note = [0u8; 8];
                peer.receive_into_with_tag(&mut note, CONTROL)?;
                ensure(note == [r as u8; 8], || {
                    format!("round {r} note is {note:?}")
                })?;
            }
            let mut v = 0u32;
            peer.receive_into_with_tag(&mut v, 7)?;
            ensure(v == 42, || format!("message after the rounds is {v}"))?;
            peer.send_with_tag(&43u32, 8)
        }
        _ => Ok(()),
    }
}

/// Completes a round's requests: the outcomes in request order, or `None`
/// for wait_all, which gives no outcomes (its error is checked here).
fn complete_round(round: Round, mut requests: Vec<Request>) -> Result<Option<Vec<Result<Status>>>> {
    let n = requests.len();
    match round {
        Round::WaitAll => match wait_all(requests) {
            Ok(statuses) => Err(fail(format!(
                "wait_all with truncated receives succeeded: {statuses:?}"
            ))),
            Err(e) => {
                let named: Vec<usize> = (0..n)
                    .filter(|i| e.message().contains(&format!("request {i}: ")))
                    .collect();
                ensure(
                    e.class() == ErrorClass::InStatus
                        && e.class().code() == 17
                        && named == TRUNCATED
                        && e.message().matches("MPI_ERR_TRUNCATE").count() == TRUNCATED.len(),
                    || {
                        format!(
                            "wait_all gave {e}; expected MPI_ERR_IN_STATUS naming requests \
                             {TRUNCATED:?} as truncated"
                        )
                    },
                )?;
                Ok(None)
            }
        },
        Round::WaitAllOutcomes => wait_all_outcomes(requests).map(Some),
        Round::TestAll => until("test_all", || test_all(&mut requests)).map(Some),
        Round::WaitSome => {
            let mut outcomes: Vec<Option<Result<Status>>> = vec![None; n];
            // Index of each request left in `requests`, by position.
            let mut left: Vec<usize> = (0..n).collect();
            while let Some(done) = wait_some(&mut requests)? {
                for (index, outcome) in done.iter().rev() {
                    outcomes[left.remove(*index)] = Some(outcome.clone());
                }
            }
            outcomes
                .into_iter()
                .map(|o| o.ok_or_else(|| fail("wait_some never completed a request")))
                .collect::<Result<_>>()
                .map(Some)
        }
    }
}

/// Checks a round's outcomes: exactly the truncated receives failed, with
/// MPI_ERR_TRUNCATE; every other request has its status.
fn check_round(round: Round, outcomes: &[Result<Status>]) -> Result<()> {
    ensure(outcomes.len() == IN_STATUS_MESSAGES + 1, || {
        format!("{round:?}: {} outcomes", outcomes.len())
    })?;
    let failed: Vec<usize> = (0..outcomes.len())
        .filter(|&i| outcomes[i].is_err())
        .collect();
    ensure(failed == TRUNCATED, || {
        format!("{round:?}: requests {failed:?} failed, expected {TRUNCATED:?}: {outcomes:?}")
    })?;
    for (k, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Err(e) => ensure(e.class() == ErrorClass::Truncate, || {
                format!("{round:?}: request {k} failed with {e}, expected MPI_ERR_TRUNCATE")
            })?,
            Ok(status) if k < IN_STATUS_MESSAGES => ensure(
                status.byte_count() == 10 && status.source_rank() == 1,
                || format!("{round:?}: request {k} gave {status:?}"),
            )?,
            Ok(_) => {}
        }
    }
    Ok(())
}
