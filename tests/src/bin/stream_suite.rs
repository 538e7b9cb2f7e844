//! Large non-contiguous messages as a real job of 2 ranks:
//! `stream_suite <check>`, started by the harness through oxrun. Each
//! check verifies its own results and exits non-zero, saying why, when
//! something is wrong.
//!
//! - `large`: about 64 MiB of data through derived datatypes — a vector
//!   of every other `f64`, an indexed type resized to leave gaps, a
//!   struct — sent and received blocking and immediate, strided to
//!   strided, strided to contiguous and contiguous to strided, received
//!   from any source after a probe, by a matched probe, and into a
//!   receive too small for it (`MPI_ERR_TRUNCATE`). The receiver checks
//!   every byte, and that the gaps between its blocks are untouched.
//! - `memory`: the peak resident memory (`VmHWM`) of both ranks across a
//!   64 MiB strided send and receive must grow by less than 16 MiB: the
//!   data moves in pieces, never as a whole packed copy.

use oxmpi::datatype::{Equivalence, MutView, UserDatatype, View};
use oxmpi::request::scope;
use oxmpi::Threading;
use oxmpi::{Communicator, ErrorClass, Result};
use oxmpi_jobs::checks::{ensure, fail, peak_kib};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;

/// `f64`s in a strided buffer: 128 MiB, of which every other one is data.
const DOUBLES: usize = 16 << 20;
/// What fills a receive buffer first: gaps must still hold it.
const UNTOUCHED: f64 = -1.5;
/// The largest growth of peak memory a 64 MiB message may cause.
const MEMORY_BOUND_KIB: u64 = 16 * 1024;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("stream_suite {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            if world.size() != 2 {
                return Err(fail("stream_suite runs on 2 ranks"));
            }
            match check.as_str() {
                "large" => large(&world),
                "memory" => memory(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// The value of the `i`th `f64` of a sender's buffer.
fn value(i: usize) -> f64 {
    i as f64 * 0.25 + 3.0
}

fn source_buffer(len: usize) -> Vec<f64> {
    (0..len).map(value).collect()
}

/// Checks `received` against `sent` bit for bit where `is_data(i)`, and
/// that every other element still holds [`UNTOUCHED`].
fn check_landed(
    what: &str,
    received: &[f64],
    mut expected: impl FnMut(usize) -> Option<f64>,
) -> Result<()> {
    for (i, got) in received.iter().enumerate() {
        let want = expected(i).unwrap_or(UNTOUCHED);
        ensure(got.to_bits() == want.to_bits(), || {
            format!("{what}: element {i} is {got}, expected {want}")
        })?;
    }
    Ok(())
}

fn expect_class<T>(what: &str, result: Result<T>, class: ErrorClass) -> Result<()> {
    match result {
        Err(e) if e.class() == class => Ok(()),
        Err(e) => Err(fail(format!("{what}: expected {class}, got {e}"))),
        Ok(_) => Err(fail(format!("{what}: expected {class}, got success"))),
    }
}

fn large(world: &Communicator) -> Result<()> {
    let f64t = f64::equivalent_datatype();
    // Every other f64: 8 Mi blocks, 64 MiB of data in 128 MiB.
    let strided = UserDatatype::vector((DOUBLES / 2) as i32, 1, 2, &f64t)?;
    let is_strided = |i: usize| i.is_multiple_of(2);
    // Blocks of 3 and 1 f64 at 0 and 5 in each 8: 32 of every 64 bytes.
    let blocks = UserDatatype::indexed(&[3, 1], &[0, 5], &f64t)?;
    let cells = UserDatatype::resized(&blocks, 0, 64)?;
    let cell_count = DOUBLES / 8;
    let in_cell = |i: usize| matches!(i % 8, 0..=2 | 5);
    // A struct of two f64 at 0 and one at 40, 64 bytes apart: 24 of 64.
    let fields = UserDatatype::structured(&[2, 1], &[0, 40], &[&f64t, &f64t])?;
    let records = UserDatatype::resized(&fields, 0, 64)?;
    let in_record = |i: usize| matches!(i % 8, 0 | 1 | 5);
    let peer = world.process_at_rank(1 - world.rank());

    if world.rank() == 0 {
        let data = source_buffer(DOUBLES);
        let strided_view = View::with_count_and_datatype(&data[..], 1, &strided)?;
        peer.send_with_tag(&strided_view, 1)?;
        peer.send_with_tag(&strided_view, 2)?;
        // Contiguous to strided: the receiver asks for pieces.
        peer.send_with_tag(&data[..DOUBLES / 2], 3)?;
        let cell_view = View::with_count_and_datatype(&data[..], cell_count as i32, &cells)?;
        peer.send_with_tag(&cell_view, 4)?;
        let record_view = View::with_count_and_datatype(&data[..], cell_count as i32, &records)?;
        scope(|s| peer.immediate_send_with_tag(s, &record_view, 5)?.wait())?;
        for tag in [6, 7, 8] {
            peer.send_with_tag(&strided_view, tag)?;
        }
        return world.barrier();
    }

    let data_index = |i: usize| value(i);
    // Strided to strided.
    let mut target = vec![UNTOUCHED; DOUBLES];
    let status = peer.receive_into_with_tag(
        &mut MutView::with_count_and_datatype(&mut target[..], 1, &strided)?,
        1,
    )?;
    ensure(status.byte_count() == DOUBLES / 2 * 8, || {
        format!("strided message of {} bytes", status.byte_count())
    })?;
    check_landed("strided to strided", &target, |i| {
        is_strided(i).then(|| data_index(i))
    })?;
    // Strided to contiguous.
    let mut dense = vec![UNTOUCHED; DOUBLES / 2];
    peer.receive_into_with_tag(&mut dense[..], 2)?;
    check_landed("strided to contiguous", &dense, |i| Some(value(2 * i)))?;
    // Contiguous to strided.
    target.fill(UNTOUCHED);
    peer.receive_into_with_tag(
        &mut MutView::with_count_and_datatype(&mut target[..], 1, &strided)?,
        3,
    )?;
    check_landed("contiguous to strided", &target, |i| {
        is_strided(i).then(|| value(i / 2))
    })?;
    // Indexed blocks, resized.
    target.fill(UNTOUCHED);
    let status = peer.receive_into_with_tag(
        &mut MutView::with_count_and_datatype(&mut target[..], cell_count as i32, &cells)?,
        4,
    )?;
    ensure(status.count_of(&cells) == Some(cell_count), || {
        format!("indexed cells: count {:?}", status.count_of(&cells))
    })?;
    check_landed("indexed to indexed", &target, |i| {
        in_cell(i).then(|| value(i))
    })?;
    // A struct, immediate.
    target.fill(UNTOUCHED);
    {
        let mut view =
            MutView::with_count_and_datatype(&mut target[..], cell_count as i32, &records)?;
        scope(|s| {
            peer.immediate_receive_into_with_tag(s, &mut view, 5)?
                .wait()
        })?;
    }
    check_landed("struct to struct, immediate", &target, |i| {
        in_record(i).then(|| value(i))
    })?;
    // From any source, after a probe that reports its length.
    let any = world.any_process();
    let probed = any.probe_with_tag(6)?;
    ensure(
        probed.byte_count() == DOUBLES / 2 * 8 && probed.source_rank() == 0,
        || {
            format!(
                "probe: {} bytes from {}",
                probed.byte_count(),
                probed.source_rank()
            )
        },
    )?;
    target.fill(UNTOUCHED);
    let status = any.receive_into_with_tag(
        &mut MutView::with_count_and_datatype(&mut target[..], 1, &strided)?,
        6,
    )?;
    ensure(status.source_rank() == 0, || {
        format!("any source: from {}", status.source_rank())
    })?;
    check_landed("any source", &target, |i| is_strided(i).then(|| value(i)))?;
    // A matched probe.
    let (message, _) = peer.matched_probe_with_tag(7)?;
    target.fill(UNTOUCHED);
    message.receive_into(&mut MutView::with_count_and_datatype(
        &mut target[..],
        1,
        &strided,
    )?)?;
    check_landed("matched probe", &target, |i| {
        is_strided(i).then(|| value(i))
    })?;
    // Truncation: room for half the message. The first half lands.
    let half = UserDatatype::vector((DOUBLES / 4) as i32, 1, 2, &f64t)?;
    target.fill(UNTOUCHED);
    expect_class(
        "64 MiB into a 32 MiB strided receive",
        peer.receive_into_with_tag(
            &mut MutView::with_count_and_datatype(&mut target[..], 1, &half)?,
            8,
        ),
        ErrorClass::Truncate,
    )?;
    check_landed("truncated", &target, |i| {
        (is_strided(i) && i < DOUBLES / 2).then(|| value(i))
    })?;
    world.barrier()?;
    println!("stream_suite large: every message landed");
    Ok(())
}

fn memory(world: &Communicator) -> Result<()> {
    let f64t = f64::equivalent_datatype();
    let strided = UserDatatype::vector((DOUBLES / 2) as i32, 1, 2, &f64t)?;
    let small = UserDatatype::vector((DOUBLES / 32) as i32, 1, 2, &f64t)?;
    let peer = world.process_at_rank(1 - world.rank());
    // Every buffer is allocated and touched first, and a 4 MiB message
    // warms the transport's rings and the device's chunks, so that the
    // peak grows only by what the large message itself costs.
    let mut buffer = if world.rank() == 0 {
        source_buffer(DOUBLES)
    } else {
        vec![UNTOUCHED; DOUBLES]
    };
    if world.rank() == 0 {
        peer.send_with_tag(&View::with_count_and_datatype(&buffer[..], 1, &small)?, 1)?;
    } else {
        peer.receive_into_with_tag(
            &mut MutView::with_count_and_datatype(&mut buffer[..], 1, &small)?,
            1,
        )?;
        buffer.fill(UNTOUCHED);
    }
    world.barrier()?;
    let before = peak_kib()?;
    if world.rank() == 0 {
        peer.send_with_tag(&View::with_count_and_datatype(&buffer[..], 1, &strided)?, 2)?;
    } else {
        peer.receive_into_with_tag(
            &mut MutView::with_count_and_datatype(&mut buffer[..], 1, &strided)?,
            2,
        )?;
    }
    let after = peak_kib()?;
    world.barrier()?;
    if world.rank() == 1 {
        check_landed("strided", &buffer, |i| {
            (i.is_multiple_of(2)).then(|| value(i))
        })?;
    }
    let grown = after.saturating_sub(before);
    let role = if world.rank() == 0 {
        "sender"
    } else {
        "receiver"
    };
    println!(
        "stream_suite memory: {role}: VmHWM {before} KiB before, {after} KiB after a 64 MiB \
         strided message: +{grown} KiB"
    );
    ensure(grown < MEMORY_BOUND_KIB, || {
        format!(
            "the {role}'s peak memory grew by {grown} KiB over a 64 MiB message (bound \
             {MEMORY_BOUND_KIB} KiB): the message was copied whole"
        )
    })
}
