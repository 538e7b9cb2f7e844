//! Derived datatypes checked as a real job of 2 ranks: `datatype_suite`,
//! started by the harness through oxrun. Each check verifies its own
//! results and exits non-zero, saying why, when something is wrong.
//!
//! Every constructor (alone, and each in a type nested three deep) is compared byte for
//! byte with a [`Reference`]: the type map computed here by plain loops
//! over the standard's definitions (MPI 4.1 §5.1), one entry per basic
//! element, independent of how oxmpi flattens and merges it. For each
//! case, both ranks check size, bounds and local pack/unpack against it;
//! rank 0 then sends the view's data three ways (the view to raw bytes,
//! raw bytes to a view, view to view, blocking and immediate) and rank 1
//! checks what arrives.

use oxmpi::datatype::{
    pack_external, pack_external_size, unpack_external, Equivalence, MutView, Order,
    UncommittedUserDatatype, UserDatatype, View,
};
use oxmpi::request::scope;
use oxmpi::traits::*;
use oxmpi::Threading;
use oxmpi::{Communicator, ErrorClass, Result};
use oxmpi_jobs::checks::{ensure, fail};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;

fn main() -> ExitCode {
    run_check("datatype_suite", Threading::Single, |universe| {
        let world = world_returning_errors(universe);
        if world.size() != 2 {
            return Err(fail("datatype_suite runs on 2 ranks"));
        }
        layouts(&world)
            .and_then(|()| partial_messages(&world))
            .and_then(|()| derived_structs(&world))
            .and_then(|()| operations(&world))
            .and_then(|()| external32(&world))
            .and_then(|()| errors(&world))
    })
}

fn expect_class<T>(what: &str, result: Result<T>, class: ErrorClass) -> Result<()> {
    match result {
        Err(e) if e.class() == class => Ok(()),
        Err(e) => Err(fail(format!("{what}: expected {class}, got {e}"))),
        Ok(_) => Err(fail(format!("{what}: expected {class}, got success"))),
    }
}

/// A type map as the standard defines it: each basic element's offset and
/// size, in type-map order, and the bounds.
#[derive(Clone, Debug)]
struct Reference {
    entries: Vec<(isize, usize)>,
    lb: isize,
    ub: isize,
    /// The largest alignment of its basic types (the struct rule's `k`).
    align: usize,
    /// Its bounds come from `resized` markers.
    explicit: bool,
}

impl Reference {
    fn basic(size: usize) -> Reference {
        Reference {
            entries: vec![(0, size)],
            lb: 0,
            ub: size as isize,
            align: size,
            explicit: false,
        }
    }

    fn extent(&self) -> isize {
        self.ub - self.lb
    }

    fn size(&self) -> usize {
        self.entries.iter().map(|e| e.1).sum()
    }

    fn true_bounds(&self) -> (isize, isize) {
        let lo = self.entries.iter().map(|e| e.0).min().unwrap_or(0);
        let hi = self
            .entries
            .iter()
            .map(|e| e.0 + e.1 as isize)
            .max()
            .unwrap_or(0);
        (lo, hi)
    }

    /// Copies of each `(type, displacement)` in order; a struct's bounds
    /// rule when `pad` (markers win, else round up to the alignment).
    fn copies<'a>(
        copies: impl IntoIterator<Item = (&'a Reference, isize)>,
        pad: bool,
    ) -> Reference {
        let mut out = Reference {
            entries: Vec::new(),
            lb: 0,
            ub: 0,
            align: 1,
            explicit: false,
        };
        let mut marked: Option<(isize, isize)> = None;
        let mut unmarked: Option<(isize, isize)> = None;
        for (old, d) in copies {
            out.entries
                .extend(old.entries.iter().map(|&(o, s)| (d + o, s)));
            let bounds = if old.explicit {
                &mut marked
            } else {
                &mut unmarked
            };
            *bounds = Some(match *bounds {
                None => (d + old.lb, d + old.ub),
                Some((l, u)) => (l.min(d + old.lb), u.max(d + old.ub)),
            });
            out.align = out.align.max(old.align);
        }
        out.explicit = marked.is_some();
        (out.lb, out.ub) = marked.or(unmarked).unwrap_or((0, 0));
        let extent = out.extent();
        if pad && !out.explicit && extent % out.align as isize != 0 {
            out.ub += out.align as isize - extent % out.align as isize;
        }
        out
    }

    /// Blocks of copies of `old` from byte displacements.
    fn blocks(old: &Reference, blocks: &[(isize, usize)]) -> Reference {
        let ext = old.extent();
        let copies = blocks
            .iter()
            .flat_map(|&(d, n)| (0..n).map(move |j| (old, d + j as isize * ext)));
        Reference::copies(copies, false)
    }

    fn resized(&self, lb: isize, extent: isize) -> Reference {
        Reference {
            lb,
            ub: lb + extent,
            explicit: true,
            ..self.clone()
        }
    }

    /// The subarray, element by element in its storage order.
    fn subarray(
        sizes: &[usize],
        subsizes: &[usize],
        starts: &[usize],
        c: bool,
        old: &Reference,
    ) -> Reference {
        let n = sizes.len();
        // Dimensions from the fastest-varying one.
        let dims: Vec<usize> = if c {
            (0..n).rev().collect()
        } else {
            (0..n).collect()
        };
        let mut stride = vec![0isize; n];
        let mut s = 1;
        for &d in &dims {
            stride[d] = s;
            s *= sizes[d] as isize;
        }
        let mut index: Vec<usize> = starts.to_vec();
        let total: usize = subsizes.iter().product();
        let mut copies = Vec::new();
        for _ in 0..total {
            let linear: isize = (0..n).map(|d| index[d] as isize * stride[d]).sum();
            copies.push((old, linear * old.extent()));
            for &d in &dims {
                index[d] += 1;
                if index[d] < starts[d] + subsizes[d] {
                    break;
                }
                index[d] = starts[d];
            }
        }
        Reference::copies(copies, false).resized(0, s * old.extent())
    }

    /// Entries of `count` elements.
    fn all(&self, count: usize) -> Vec<(isize, usize)> {
        (0..count)
            .flat_map(|k| {
                self.entries
                    .iter()
                    .map(move |&(o, s)| (o + k as isize * self.extent(), s))
            })
            .collect()
    }

    /// The bytes `count` elements pack to from `memory`.
    fn packed(&self, memory: &[u8], count: usize) -> Vec<u8> {
        self.all(count)
            .into_iter()
            .flat_map(|(o, s)| memory[o as usize..o as usize + s].iter().copied())
            .collect()
    }

    /// `len` zero bytes with `packed` placed where `count` elements are.
    fn scattered(&self, packed: &[u8], count: usize, len: usize) -> Vec<u8> {
        let mut memory = vec![0; len];
        let mut at = 0;
        for (o, s) in self.all(count) {
            let take = s.min(packed.len() - at);
            memory[o as usize..o as usize + take].copy_from_slice(&packed[at..at + take]);
            at += take;
        }
        memory
    }

    /// Bytes of memory `count` elements need.
    fn span(&self, count: usize) -> usize {
        self.all(count)
            .iter()
            .map(|&(o, s)| o as usize + s)
            .max()
            .unwrap_or(0)
    }
}

/// A datatype and its reference, built side by side.
struct Both {
    datatype: UserDatatype,
    reference: Reference,
}

fn basic<T: Equivalence>() -> Result<Both> {
    Ok(Both {
        datatype: UserDatatype::contiguous(1, &T::equivalent_datatype())?,
        reference: Reference::basic(std::mem::size_of::<T>()),
    })
}

fn contiguous(n: usize, old: &Both) -> Result<Both> {
    Ok(Both {
        datatype: UserDatatype::contiguous(n as i32, &old.datatype)?,
        reference: Reference::blocks(&old.reference, &[(0, n)]),
    })
}

fn vector(count: usize, len: usize, stride: isize, old: &Both) -> Result<Both> {
    let ext = old.reference.extent();
    let blocks: Vec<_> = (0..count)
        .map(|i| (i as isize * stride * ext, len))
        .collect();
    Ok(Both {
        datatype: UserDatatype::vector(count as i32, len as i32, stride as i32, &old.datatype)?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn hvector(count: usize, len: usize, stride: isize, old: &Both) -> Result<Both> {
    let blocks: Vec<_> = (0..count).map(|i| (i as isize * stride, len)).collect();
    Ok(Both {
        datatype: UserDatatype::heterogeneous_vector(
            count as i32,
            len as i32,
            stride,
            &old.datatype,
        )?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn indexed(lens: &[i32], displacements: &[i32], old: &Both) -> Result<Both> {
    let ext = old.reference.extent();
    let blocks: Vec<_> = lens
        .iter()
        .zip(displacements)
        .map(|(&n, &d)| (d as isize * ext, n as usize))
        .collect();
    Ok(Both {
        datatype: UserDatatype::indexed(lens, displacements, &old.datatype)?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn hindexed(lens: &[i32], displacements: &[isize], old: &Both) -> Result<Both> {
    let blocks: Vec<_> = lens
        .iter()
        .zip(displacements)
        .map(|(&n, &d)| (d, n as usize))
        .collect();
    Ok(Both {
        datatype: UserDatatype::heterogeneous_indexed(lens, displacements, &old.datatype)?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn indexed_block(len: usize, displacements: &[i32], old: &Both) -> Result<Both> {
    let ext = old.reference.extent();
    let blocks: Vec<_> = displacements
        .iter()
        .map(|&d| (d as isize * ext, len))
        .collect();
    Ok(Both {
        datatype: UserDatatype::indexed_block(len as i32, displacements, &old.datatype)?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn hindexed_block(len: usize, displacements: &[isize], old: &Both) -> Result<Both> {
    let blocks: Vec<_> = displacements.iter().map(|&d| (d, len)).collect();
    Ok(Both {
        datatype: UserDatatype::heterogeneous_indexed_block(
            len as i32,
            displacements,
            &old.datatype,
        )?,
        reference: Reference::blocks(&old.reference, &blocks),
    })
}

fn structured(fields: &[(usize, isize, &Both)]) -> Result<Both> {
    let lens: Vec<i32> = fields.iter().map(|f| f.0 as i32).collect();
    let displacements: Vec<isize> = fields.iter().map(|f| f.1).collect();
    let types: Vec<&dyn UncommittedDatatype> = fields.iter().map(|f| &f.2.datatype as _).collect();
    let copies = fields.iter().flat_map(|&(n, d, old)| {
        let ext = old.reference.extent();
        (0..n).map(move |j| (&old.reference, d + j as isize * ext))
    });
    Ok(Both {
        datatype: UserDatatype::structured(&lens, &displacements, &types)?,
        reference: Reference::copies(copies, true),
    })
}

fn subarray(
    sizes: &[usize],
    subsizes: &[usize],
    starts: &[usize],
    order: Order,
    old: &Both,
) -> Result<Both> {
    let ints = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<_>>();
    Ok(Both {
        datatype: UserDatatype::subarray(
            &ints(sizes),
            &ints(subsizes),
            &ints(starts),
            order,
            &old.datatype,
        )?,
        reference: Reference::subarray(sizes, subsizes, starts, order == Order::C, &old.reference),
    })
}

fn resized(old: &Both, lb: isize, extent: isize) -> Result<Both> {
    Ok(Both {
        datatype: UserDatatype::resized(&old.datatype, lb, extent)?,
        reference: old.reference.resized(lb, extent),
    })
}

fn dup(old: &Both) -> Both {
    Both {
        datatype: old.datatype.dup(),
        reference: old.reference.clone(),
    }
}

/// The cases: every constructor alone, and each in a nest three deep
/// (innermost or outermost).
fn cases() -> Result<Vec<(&'static str, Both, usize)>> {
    let f64t = basic::<f64>()?;
    let i32t = basic::<i32>()?;
    let i16t = basic::<i16>()?;
    let u16t = basic::<u16>()?;
    let u8t = basic::<u8>()?;
    let f32t = basic::<f32>()?;
    let shifted = resized(&i32t, -4, 12)?;
    let triple = {
        // struct { f64 at 0; hvector of indexed of contiguous at 8 }
        let pair = contiguous(2, &i16t)?;
        let picked = indexed(&[1, 2], &[3, 0], &pair)?;
        let spread = hvector(2, 1, 40, &picked)?;
        structured(&[(1, 0, &f64t), (1, 8, &spread)])?
    };
    let indexed_u32 = indexed(&[2, 1, 3], &[5, 0, 9], &basic::<u32>()?)?;
    Ok(vec![
        ("contiguous", contiguous(3, &f64t)?, 2),
        ("vector", vector(3, 2, 4, &i32t)?, 2),
        (
            "vector with a negative stride",
            hindexed(&[1], &[64], &vector(3, 1, -2, &i32t)?)?,
            1,
        ),
        ("hvector", hvector(2, 3, 40, &i16t)?, 2),
        ("indexed", indexed(&[2, 1, 3], &[5, 0, 9], &i32t)?, 2),
        ("hindexed", hindexed(&[1, 2, 0], &[24, 2, 100], &i16t)?, 3),
        ("indexed_block", indexed_block(2, &[4, 0, 8], &f32t)?, 2),
        ("hindexed_block", hindexed_block(1, &[12, 0, 6], &u16t)?, 2),
        (
            "struct",
            structured(&[(1, 0, &f64t), (2, 8, &i32t), (1, 20, &u8t)])?,
            3,
        ),
        (
            "subarray C",
            subarray(&[4, 5, 6], &[2, 3, 2], &[1, 1, 3], Order::C, &f32t)?,
            2,
        ),
        (
            "subarray Fortran",
            subarray(&[4, 5, 6], &[2, 3, 2], &[1, 1, 3], Order::Fortran, &f32t)?,
            2,
        ),
        ("resized", resized(&vector(2, 1, 3, &i32t)?, 0, 40)?, 3),
        (
            "resized with a negative lb, in a struct",
            structured(&[(2, 16, &shifted), (1, 0, &u8t)])?,
            2,
        ),
        ("dup", dup(&indexed_u32), 2),
        ("struct of hvector of indexed of contiguous", triple, 3),
        (
            "hindexed of indexed_block of hindexed_block",
            hindexed(
                &[2, 1],
                &[0, 96],
                &indexed_block(2, &[3, 0], &hindexed_block(1, &[6, 0], &u16t)?)?,
            )?,
            2,
        ),
        (
            "dup of resized of hindexed",
            dup(&resized(&hindexed(&[1, 2], &[0, 10], &i16t)?, -2, 20)?),
            3,
        ),
        (
            "indexed_block of dup of resized",
            indexed_block(2, &[2, 0], &dup(&resized(&i32t, 0, 12)?))?,
            2,
        ),
        (
            "subarray of vector of struct",
            subarray(
                &[3, 4],
                &[2, 2],
                &[1, 1],
                Order::C,
                &vector(2, 1, 2, &structured(&[(1, 0, &f64t), (1, 8, &u8t)])?)?,
            )?,
            2,
        ),
        // Long enough for the rendezvous protocol, not contiguous.
        ("large vector", vector(100_000, 1, 2, &f64t)?, 1),
    ])
}

/// Byte `i` of the test memory.
fn pattern(i: usize) -> u8 {
    (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] | 1
}

/// Every case: shape, local pack and unpack, and the three transfers.
fn layouts(world: &Communicator) -> Result<()> {
    let peer = world.process_at_rank(1 - world.rank());
    for (name, both, count) in cases()? {
        let Both {
            datatype: d,
            reference: r,
        } = &both;
        let context = |what: &str| format!("{name}: {what}");
        let (true_lb, true_ub) = r.true_bounds();
        ensure(
            (d.size(), d.lower_bound(), d.extent()) == (r.size(), r.lb, r.extent())
                && (d.true_lower_bound(), d.true_extent()) == (true_lb, true_ub - true_lb),
            || {
                context(&format!(
                    "size, lb, extent, true lb, true extent are {:?}, expected {:?}",
                    (
                        d.size(),
                        d.lower_bound(),
                        d.extent(),
                        d.true_lower_bound(),
                        d.true_extent()
                    ),
                    (r.size(), r.lb, r.extent(), true_lb, true_ub - true_lb)
                ))
            },
        )?;
        let len = r.span(count) + 8;
        let memory: Vec<u8> = (0..len).map(pattern).collect();
        let expected = r.packed(&memory, count);
        let landed = r.scattered(&expected, count, len);
        let view = View::with_count_and_datatype(&memory[..], count as i32, d)?;
        let packed = world.pack(&view)?;
        ensure(packed == expected, || {
            context("pack differs from the reference")
        })?;
        ensure(world.pack_size(count as i32, d)? == expected.len(), || {
            context("pack_size")
        })?;
        let mut target = vec![0u8; len];
        world.unpack_into(
            &packed,
            &mut MutView::with_count_and_datatype(&mut target[..], count as i32, d)?,
            0,
        )?;
        ensure(target == landed, || {
            context("unpack differs from the reference")
        })?;

        if world.rank() == 0 {
            peer.send_with_tag(&view, 1)?;
            peer.send_with_tag(&expected[..], 2)?;
            peer.send_with_tag(&view, 3)?;
            scope(|s| peer.immediate_send_with_tag(s, &view, 4)?.wait())?;
            peer.send_with_tag(&view, 5)?;
        } else {
            let (bytes, _) = peer.receive_vec::<u8>()?;
            ensure(bytes == expected, || {
                context("the message of a view differs from the reference")
            })?;
            let elements = r.all(count).len();
            for tag in [2, 3] {
                let mut target = vec![0u8; len];
                let mut view = MutView::with_count_and_datatype(&mut target[..], count as i32, d)?;
                let status = peer.receive_into_with_tag(&mut view, tag)?;
                ensure(
                    status.count_of(d) == Some(count) && status.elements_of(d) == Some(elements),
                    || {
                        context(&format!(
                            "count {:?}, elements {:?}",
                            status.count_of(d),
                            status.elements_of(d)
                        ))
                    },
                )?;
                ensure(target == landed, || {
                    context(&format!("received (tag {tag}) differs"))
                })?;
            }
            let mut target = vec![0u8; len];
            let mut view = MutView::with_count_and_datatype(&mut target[..], count as i32, d)?;
            scope(|s| {
                peer.immediate_receive_into_with_tag(s, &mut view, 4)?
                    .wait()
            })?;
            ensure(target == landed, || context("immediate receive differs"))?;
            // A request dropped unwaited: its scope finishes it. The
            // message is there first, so the receive matches at once (the
            // scope would cancel one that has not matched).
            peer.probe_with_tag(5)?;
            let mut target = vec![0u8; len];
            let mut view = MutView::with_count_and_datatype(&mut target[..], count as i32, d)?;
            scope(|s| -> Result<()> {
                drop(peer.immediate_receive_into_with_tag(s, &mut view, 5)?);
                Ok(())
            })?;
            ensure(target == landed, || {
                context("receive completed by its scope differs")
            })?;
        }
    }
    Ok(())
}

/// Messages shorter than the receive: whole and partial elements
/// (`MPI_Get_count`, `MPI_Get_elements`), and longer ones (truncation).
fn partial_messages(world: &Communicator) -> Result<()> {
    // Pairs of (i32, i16): a message of 4 + 2 + 4 bytes holds 1 pair and
    // 3 basic elements; one of 8 bytes ends inside the second i32.
    let pair = UserDatatype::structured(
        &[1, 1],
        &[0, 4],
        &[&i32::equivalent_datatype(), &i16::equivalent_datatype()],
    )?;
    let peer = world.process_at_rank(1 - world.rank());
    if world.rank() == 0 {
        for len in [10usize, 8, 24] {
            peer.send(&vec![7u8; len][..])?;
        }
        return Ok(());
    }
    let mut memory = [0u8; 16];
    for (len, count, elements) in [(10, None, Some(3)), (8, None, None)] {
        let mut view = MutView::with_count_and_datatype(&mut memory[..], 2, &pair)?;
        let status = peer.receive_into(&mut view)?;
        ensure(
            status.byte_count() == len
                && status.count_of(&pair) == count
                && status.elements_of(&pair) == elements,
            || {
                format!(
                    "{len} bytes as pairs: count {:?}, elements {:?}",
                    status.count_of(&pair),
                    status.elements_of(&pair)
                )
            },
        )?;
    }
    let mut view = MutView::with_count_and_datatype(&mut memory[..], 2, &pair)?;
    expect_class(
        "24 bytes into 2 pairs (12 bytes of data)",
        peer.receive_into(&mut view),
        ErrorClass::Truncate,
    )
}

#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Cell {
    kind: u8, // 3 bytes of padding follow
    weight: f32,
}

#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Particle {
    position: [f64; 3],
    charge: i8, // 1 byte of padding follows
    cells: [[Cell; 2]; 2],
    id: u64,
    flags: u16, // 6 bytes of padding follow
}

fn particle(i: u64) -> Particle {
    let cell = |k: u64| Cell {
        kind: (i + k) as u8,
        weight: (i * 10 + k) as f32,
    };
    Particle {
        position: [i as f64, -(i as f64), 0.5],
        charge: -(i as i8),
        cells: [[cell(0), cell(1)], [cell(2), cell(3)]],
        id: i * 1_000_003,
        flags: i as u16 ^ 0xa5a5,
    }
}

/// Derived structs with padding, nested structs and arrays: sent alone,
/// in slices and vectors, received by value, into vectors and by
/// send_receive_replace; their padding never travels.
fn derived_structs(world: &Communicator) -> Result<()> {
    let peer = world.process_at_rank(1 - world.rank());
    let particles: Vec<Particle> = (1..=50).map(particle).collect();
    let size = Particle::equivalent_datatype().size();
    ensure(size == 24 + 1 + 4 * 5 + 8 + 2, || {
        format!("Particle's size is {size}")
    })?;
    if world.rank() == 0 {
        peer.send(&particles[0])?;
        peer.send(&particles[..])?;
        peer.send(&particles)?;
    } else {
        let (one, status) = peer.receive::<Particle>()?;
        ensure(one == particles[0] && status.byte_count() == size, || {
            format!("received {one:?} in {} bytes", status.byte_count())
        })?;
        let mut slice = vec![particle(0); 50];
        let status = peer.receive_into(&mut slice[..])?;
        ensure(
            slice == particles && status.count::<Particle>() == Some(50),
            || "a slice of particles differs".into(),
        )?;
        let (vec, _) = peer.receive_vec::<Particle>()?;
        ensure(vec == particles, || "a vector of particles differs".into())?;
    }
    // Both ranks swap their first 10 particles.
    let mut mine: Vec<Particle> = (0..10)
        .map(|i| particle(100 * world.rank() as u64 + i))
        .collect();
    peer.send_receive_replace(&mut mine[..], 0, &peer, 0)?;
    let theirs: Vec<Particle> = (0..10)
        .map(|i| particle(100 * (1 - world.rank()) as u64 + i))
        .collect();
    ensure(mine == theirs, || {
        "send_receive_replace of particles differs".into()
    })
}

/// Persistent and buffered sends of non-contiguous views, and persistent
/// and matched receives into them: a column of a matrix.
fn operations(world: &Communicator) -> Result<()> {
    let peer = world.process_at_rank(1 - world.rank());
    let column = UserDatatype::vector(8, 1, 8, &f64::equivalent_datatype())?;
    let column_3: Vec<f64> = (0..8).map(|i| f64::from(i * 8 + 3)).collect();
    if world.rank() == 0 {
        let matrix: Vec<f64> = (0..64).map(f64::from).collect();
        let view = View::with_count_and_datatype(&matrix[3..], 1, &column)?;
        scope(|s| -> Result<()> {
            let mut send = peer.send_init(s, &view, 0)?;
            for _ in 0..3 {
                send.start()?;
                send.wait()?;
            }
            Ok(())
        })?;
        oxmpi::buffered::attach_buffer(vec![0; 4096])?;
        peer.buffered_send(&view)?;
        oxmpi::buffered::detach_buffer()?;
        peer.send(&view)?;
        return Ok(());
    }
    let mut matrix = vec![-1.0f64; 64];
    let column_of =
        |matrix: &[f64], j: usize| (0..8).map(|i| matrix[i * 8 + j]).collect::<Vec<_>>();
    let mut target = MutView::with_count_and_datatype(&mut matrix[3..], 1, &column)?;
    scope(|s| -> Result<()> {
        let mut receive = peer.receive_init(s, &mut target, 0)?;
        for round in 0..3 {
            // Cleared through the request between rounds.
            world.unpack_into(&[0u8; 64], receive.buffer_mut()?, 0)?;
            receive.start()?;
            receive.wait()?;
            let got = world.pack(receive.buffer()?)?;
            let expected: Vec<u8> = column_3.iter().flat_map(|x| x.to_ne_bytes()).collect();
            ensure(got == expected, || {
                format!("persistent receive {round} of a column")
            })?;
        }
        Ok(())
    })?;
    ensure(
        column_of(&matrix, 3) == column_3 && matrix[2] == -1.0,
        || format!("persistent receive of a column: {matrix:?}"),
    )?;
    matrix.iter_mut().for_each(|x| *x = -1.0);
    peer.receive_into(&mut MutView::with_count_and_datatype(
        &mut matrix[3..],
        1,
        &column,
    )?)?;
    let (message, _) = peer.matched_probe_with_tag(0)?;
    message.receive_into(&mut MutView::with_count_and_datatype(
        &mut matrix[4..],
        1,
        &column,
    )?)?;
    ensure(
        column_of(&matrix, 3) == column_3 && column_of(&matrix, 4) == column_3,
        || format!("buffered and matched receives of a column: {matrix:?}"),
    )
}

/// external32: a known big-endian encoding, and round trips through a
/// message.
fn external32(world: &Communicator) -> Result<()> {
    let cell = Cell {
        kind: 0x11,
        weight: 1.0,
    };
    let encoded = pack_external(&cell)?;
    ensure(encoded == [0x11, 0x3f, 0x80, 0, 0], || {
        format!("external32 of a Cell: {encoded:x?}")
    })?;
    ensure(
        pack_external_size(3, &Cell::equivalent_datatype())? == 15,
        || "size".into(),
    )?;
    let big = 0x0102_0304_0506_0708u64;
    ensure(pack_external(&big)? == [1, 2, 3, 4, 5, 6, 7, 8], || {
        "external32 of a u64".into()
    })?;
    let peer = world.process_at_rank(1 - world.rank());
    let particles: Vec<Particle> = (0..20).map(particle).collect();
    if world.rank() == 0 {
        peer.send(&pack_external(&particles[..])?[..])?;
    } else {
        let (bytes, _) = peer.receive_vec::<u8>()?;
        let mut back = vec![particle(0); 20];
        let end = unpack_external(&bytes, &mut back[..], 0)?;
        ensure(end == bytes.len() && back == particles, || {
            "external32 round trip of particles differs".into()
        })?;
    }
    Ok(())
}

/// Bad arguments get the right error classes, and nothing is touched.
fn errors(world: &Communicator) -> Result<()> {
    let int = i32::equivalent_datatype();
    expect_class(
        "contiguous(-1)",
        UserDatatype::contiguous(-1, &int),
        ErrorClass::Count,
    )?;
    expect_class(
        "vector blocklength -1",
        UserDatatype::vector(2, -1, 2, &int),
        ErrorClass::Arg,
    )?;
    expect_class(
        "indexed with 2 lengths and 1 displacement",
        UserDatatype::indexed(&[1, 1], &[0], &int),
        ErrorClass::Arg,
    )?;
    expect_class(
        "subarray reaching out of the array",
        UncommittedUserDatatype::subarray(&[4], &[3], &[2], Order::C, &int),
        ErrorClass::Arg,
    )?;
    expect_class(
        "resized past the address space",
        UserDatatype::resized(&int, isize::MAX, 1),
        ErrorClass::Type,
    )?;
    let every_other = UserDatatype::vector(4, 1, 2, &int)?;
    let small = [0i32; 6];
    expect_class(
        "a view too small for its datatype",
        View::with_count_and_datatype(&small[..], 1, &every_other),
        ErrorClass::Buffer,
    )?;
    expect_class(
        "a view with a negative count",
        View::with_count_and_datatype(&small[..], -1, &int),
        ErrorClass::Count,
    )?;
    expect_class(
        "pack_size(-1)",
        world.pack_size(-1, &int),
        ErrorClass::Count,
    )?;
    let mut out = [0i32; 2];
    expect_class(
        "unpacking 4 bytes into 2 ints",
        world.unpack_into(&[0u8; 4], &mut out[..], 0),
        ErrorClass::Truncate,
    )?;
    expect_class(
        "packing 8 bytes into 7",
        world.pack_into(&out[..], &mut [0u8; 7], 0),
        ErrorClass::Truncate,
    )?;
    ensure(out == [0, 0], || "a failed unpack wrote".into())
}
