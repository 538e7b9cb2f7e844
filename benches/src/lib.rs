//! oxbench: oxmpi's benchmark programs.
//!
//! This crate owns the benchmark programs, nothing else:
//! - the OSU-style MPI benchmarks over oxmpi ([`mpi_bench`]): `latency`,
//!   `bw`, `bibw` (2 ranks), `mbw_mr` and `multi_lat` (pairs), and the
//!   collectives `barrier`, `bcast`, `allreduce` and `alltoall` (any
//!   number of ranks, [`coll_bench`]), and the one-sided `put_latency`,
//!   `get_latency`, `acc_latency`, `fop_latency`, `cas_latency`,
//!   `put_bw` and `get_bw` (2 ranks, [`rma_bench`]), and `win_create`,
//!   the cost of making and freeing a window (any number of ranks,
//!   [`win_bench`]), run as jobs with `oxrun -n N oxbench BENCHMARK`;
//! - the raw TCP floor they are compared with ([`raw_tcp`]: `oxbench
//!   raw-tcp latency|bw`, two plain processes over a loopback socket);
//! - `oxbench compare` ([`compare`]): the same benchmarks over MPICH and
//!   Open MPI on the same machine, through a C program written against
//!   the MPI C API (`benches/c/peer_bench.c`), side by side with oxmpi;
//! - `oxbench suite` ([`suite`]): the main job, every benchmark over every
//!   transport, tables and an SVG plot ([`plot`]);
//! - `oxbench memory` ([`memory`]): the shared memory each rank of a job
//!   maps, after all-to-all or ring traffic.
//!
//! It uses the `oxmpi` crate's public API only, like any MPI program: it
//! must not know the abstract device, PMI or any transport; which
//! transports a job uses is the library's business (`OXMPI_TRANSPORTS`),
//! reported as set.
//!
//! The conventions are the OSU micro-benchmarks': sizes doubling from 0
//! (latencies) or 1 (bandwidths) to 4 MiB, 10000 timed iterations after
//! 100 warm-up ones up to 8 KiB and 1000 after 10 above, windows of 64
//! messages acknowledged by a small message, MB/s as 10^6 bytes per
//! second, the same table layout (see [`report`]), page-aligned buffers
//! touched before timing. Beyond OSU, every received message's size and
//! bytes are checked.
//!
//! Other modules: [`cli`] (command line), [`buffers`] (aligned, patterned
//! buffers), [`runner`] (the jobs compare and suite start), [`pinning`]
//! (the cores of the shared-memory floor's processes).

// The only unsafe code is the shared-memory floor's mapping
// (`raw_shm::shared`) and its processes' binding (`pinning::bind`), which
// allow it for themselves.
#![deny(unsafe_code)]

pub mod buffers;
pub mod cli;
pub mod coll_bench;
pub mod compare;
pub mod memory;
pub mod mpi_bench;
pub mod pinning;
pub mod plot;
pub mod raw_shm;
pub mod raw_tcp;
pub mod report;
pub mod rma_bench;
pub mod runner;
pub mod suite;
pub mod win_bench;
