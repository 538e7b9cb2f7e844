//! oxbench: oxmpi's benchmark programs.
//!
//! This crate owns the benchmark programs, nothing else: OSU-style
//! point-to-point latency and bandwidth over oxmpi (`oxbench latency`,
//! `oxbench bw`, run as a 2-rank job with `oxrun -n 2`), and the raw TCP
//! baseline they are compared with (`oxbench raw-tcp latency|bw`, two
//! plain processes over a loopback socket). It uses the `oxmpi` crate's
//! public API only, like any MPI program: it must not know the abstract
//! device, PMI or any transport; which transports a job uses is the
//! library's business (`OXMPI_TRANSPORTS`), reported as set.
//!
//! The conventions are OSU micro-benchmarks' (`osu_latency`, `osu_bw`):
//! sizes doubling from 0 (latency) or 1 (bandwidth) to 4 MiB, 10000 timed
//! iterations after 100 warm-up ones up to 8 KiB and 1000 after 10 above,
//! windows of 64 messages acknowledged by a small message, MB/s as 10^6
//! bytes per second, the same table layout (see [`report`]), page-aligned
//! buffers touched before timing. Beyond OSU, every received message's
//! size and bytes are checked.
//!
//! Modules: [`cli`] (command line), [`report`] (table and JSON),
//! [`buffers`] (aligned, patterned buffers), [`mpi_bench`] (the MPI
//! benchmarks), [`raw_tcp`] (the baseline).

#![forbid(unsafe_code)]

pub mod buffers;
pub mod cli;
pub mod mpi_bench;
pub mod raw_tcp;
pub mod report;
