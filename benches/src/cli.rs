//! Command line of `oxbench`: which benchmark to run and with which
//! options. Parsing needs no MPI, so a bad command line is reported (exit
//! status 2) before any process is started or MPI initialized.

use std::fmt;
use std::path::PathBuf;

/// Number of immediate sends per window in the bandwidth benchmarks, as
/// OSU's `osu_bw`, `osu_bibw` and `osu_mbw_mr`, and of one-sided
/// operations per flush in `osu_put_bw` and `osu_get_bw`.
pub const WINDOW: usize = 64;

/// Messages larger than this many bytes use the "large" iteration and
/// warm-up counts (OSU's `LARGE_MESSAGE_SIZE`).
pub const LARGE_MESSAGE_SIZE: usize = 8192;

/// OSU's iteration and warm-up counts, the default of every benchmark.
pub const OSU_COUNTS: Counts = Counts {
    iterations: 10_000,
    iterations_large: 1_000,
    warmup: 100,
    warmup_large: 10,
};

/// Default largest message size: 4 MiB, as OSU.
pub const DEFAULT_MAX_SIZE: usize = 4 << 20;
/// The largest message size accepted. The bandwidth receivers hold a
/// window of [`WINDOW`] buffers of the largest size (4 GiB at this limit).
pub const SIZE_LIMIT: usize = 64 << 20;

/// What a benchmark measures. Each is the OSU micro-benchmark of the same
/// name (`osu_latency`, `osu_bw`, `osu_bibw`, `osu_mbw_mr`,
/// `osu_multi_lat`); see [`crate::mpi_bench`] for the patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Benchmark {
    /// Ping-pong between 2 ranks: one-way latency in microseconds.
    Latency,
    /// Streaming from rank 0 to rank 1: windows of [`WINDOW`] messages
    /// then an acknowledgement, bandwidth in MB/s.
    Bandwidth,
    /// Windows of [`WINDOW`] messages both ways at once between 2 ranks:
    /// the bytes of both directions per second, in MB/s.
    BiBandwidth,
    /// [`Benchmark::Bandwidth`] between every pair of ranks at once (rank
    /// `i` of the first half sends to rank `i + n/2`): the pairs' total in
    /// MB/s, and in messages per second.
    MultiBandwidth,
    /// [`Benchmark::Latency`] between every pair of ranks at once: the
    /// one-way latency averaged over the pairs, in microseconds.
    MultiLatency,
    /// `barrier` over every rank: microseconds per barrier, averaged over
    /// the ranks.
    Barrier,
    /// `broadcast_into` from rank 0 of messages of each size: microseconds
    /// per broadcast, averaged over the ranks.
    Broadcast,
    /// `all_reduce_into` with the sum of `f32`s, each size in bytes:
    /// microseconds per all-reduce, averaged over the ranks.
    AllReduce,
    /// `all_to_all_into` with blocks of each size to and from every rank:
    /// microseconds per all-to-all, averaged over the ranks.
    AllToAll,
    /// `neighbor_all_gather_into` on a periodic ring of every rank (a
    /// 1-d Cartesian communicator): each size sent to both neighbours,
    /// a block received from each; microseconds per operation, averaged
    /// over the ranks.
    NeighborAllGather,
    /// `neighbor_all_to_all_into` on the same ring: a block of each size
    /// to and from each neighbour.
    NeighborAllToAll,
    /// `all_reduce_into` over an intercommunicator between the first
    /// half of the ranks and the rest (2 ranks or more), the sum of
    /// `f32`s: each group gets the sums of the other's.
    InterAllReduce,
    /// One-sided put of each size from rank 0 into rank 1's window under
    /// a shared lock, a flush after each: microseconds per put
    /// (`osu_put_latency`; see [`crate::rma_bench`]).
    PutLatency,
    /// One-sided get, a flush after each (`osu_get_latency`).
    GetLatency,
    /// One-sided accumulate (sum of `u64`s), a flush after each
    /// (`osu_acc_latency`).
    AccLatency,
    /// Fetch-and-op (sum of one `u64`), a flush after each
    /// (`osu_fop_latency`).
    FopLatency,
    /// Compare-and-swap of one `u64`, a flush after each
    /// (`osu_cas_latency`).
    CasLatency,
    /// Windows of [`WINDOW`] puts, then a flush: MB/s (`osu_put_bw`).
    PutBandwidth,
    /// Windows of [`WINDOW`] gets, then a flush: MB/s (`osu_get_bw`).
    GetBandwidth,
    /// A window of each size made and freed over every rank, back to
    /// back, in the flavour `--flavor` says (`MPI_Win_allocate` or
    /// `MPI_Win_create`, then `MPI_Win_free`): microseconds per window,
    /// each rank's mean averaged over the ranks (see
    /// [`crate::win_bench`]; OSU has no such benchmark).
    WinCreate,
}

impl Benchmark {
    /// Every benchmark, in the order of the usage text.
    pub const ALL: [Benchmark; 20] = [
        Benchmark::Latency,
        Benchmark::Bandwidth,
        Benchmark::BiBandwidth,
        Benchmark::MultiBandwidth,
        Benchmark::MultiLatency,
        Benchmark::Barrier,
        Benchmark::Broadcast,
        Benchmark::AllReduce,
        Benchmark::AllToAll,
        Benchmark::NeighborAllGather,
        Benchmark::NeighborAllToAll,
        Benchmark::InterAllReduce,
        Benchmark::PutLatency,
        Benchmark::GetLatency,
        Benchmark::AccLatency,
        Benchmark::FopLatency,
        Benchmark::CasLatency,
        Benchmark::PutBandwidth,
        Benchmark::GetBandwidth,
        Benchmark::WinCreate,
    ];

    /// The name used on the command line and in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Benchmark::Latency => "latency",
            Benchmark::Bandwidth => "bw",
            Benchmark::BiBandwidth => "bibw",
            Benchmark::MultiBandwidth => "mbw_mr",
            Benchmark::MultiLatency => "multi_lat",
            Benchmark::Barrier => "barrier",
            Benchmark::Broadcast => "bcast",
            Benchmark::AllReduce => "allreduce",
            Benchmark::AllToAll => "alltoall",
            Benchmark::NeighborAllGather => "neighbor_allgather",
            Benchmark::NeighborAllToAll => "neighbor_alltoall",
            Benchmark::InterAllReduce => "inter_allreduce",
            Benchmark::PutLatency => "put_latency",
            Benchmark::GetLatency => "get_latency",
            Benchmark::AccLatency => "acc_latency",
            Benchmark::FopLatency => "fop_latency",
            Benchmark::CasLatency => "cas_latency",
            Benchmark::PutBandwidth => "put_bw",
            Benchmark::GetBandwidth => "get_bw",
            Benchmark::WinCreate => "win_create",
        }
    }

    /// What it measures, in words, for titles.
    pub fn description(self) -> &'static str {
        match self {
            Benchmark::Latency => "latency",
            Benchmark::Bandwidth => "bandwidth",
            Benchmark::BiBandwidth => "bi-directional bandwidth",
            Benchmark::MultiBandwidth => "multiple bandwidth / message rate",
            Benchmark::MultiLatency => "multi-pair latency",
            Benchmark::Barrier => "barrier latency",
            Benchmark::Broadcast => "broadcast latency",
            Benchmark::AllReduce => "all-reduce latency",
            Benchmark::AllToAll => "all-to-all latency",
            Benchmark::NeighborAllGather => "neighbourhood all-gather latency",
            Benchmark::NeighborAllToAll => "neighbourhood all-to-all latency",
            Benchmark::InterAllReduce => "intercommunicator all-reduce latency",
            Benchmark::PutLatency => "one-sided put latency",
            Benchmark::GetLatency => "one-sided get latency",
            Benchmark::AccLatency => "one-sided accumulate latency",
            Benchmark::FopLatency => "one-sided fetch-and-op latency",
            Benchmark::CasLatency => "one-sided compare-and-swap latency",
            Benchmark::PutBandwidth => "one-sided put bandwidth",
            Benchmark::GetBandwidth => "one-sided get bandwidth",
            Benchmark::WinCreate => "window creation and free latency",
        }
    }

    /// The unit of the (first) figure.
    pub fn unit(self) -> &'static str {
        if self.is_latency() {
            "us"
        } else {
            "MB/s"
        }
    }

    /// Whether the figure is a time (lower is better) rather than a rate.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Benchmark::Latency | Benchmark::MultiLatency | Benchmark::WinCreate
        ) || self.is_collective()
            || (self.is_rma() && !matches!(self, Benchmark::PutBandwidth | Benchmark::GetBandwidth))
    }

    /// Whether it times one-sided operations (2 ranks, a window).
    pub fn is_rma(self) -> bool {
        matches!(
            self,
            Benchmark::PutLatency
                | Benchmark::GetLatency
                | Benchmark::AccLatency
                | Benchmark::FopLatency
                | Benchmark::CasLatency
                | Benchmark::PutBandwidth
                | Benchmark::GetBandwidth
        )
    }

    /// Whether it times a collective operation over every rank of the job
    /// (any number of ranks).
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Benchmark::Barrier
                | Benchmark::Broadcast
                | Benchmark::AllReduce
                | Benchmark::AllToAll
                | Benchmark::NeighborAllGather
                | Benchmark::NeighborAllToAll
                | Benchmark::InterAllReduce
        )
    }

    /// Whether it runs over any number of ranks, each rank's mean time
    /// averaged over them: the collectives and `win_create`.
    pub fn is_any_ranks(self) -> bool {
        self.is_collective() || self == Benchmark::WinCreate
    }

    /// Whether it streams windows of [`WINDOW`] messages.
    pub fn is_windowed(self) -> bool {
        !self.is_latency()
    }

    /// Whether it runs between any even number of ranks (pairs), rather
    /// than exactly 2.
    pub fn is_multi_pair(self) -> bool {
        matches!(self, Benchmark::MultiBandwidth | Benchmark::MultiLatency)
    }

    /// The headers of the figure columns, as OSU prints them.
    pub fn columns(self) -> &'static [&'static str] {
        if self.is_any_ranks() {
            &["Avg Latency (us)"]
        } else if self == Benchmark::MultiBandwidth {
            &["MB/s", "Messages/s"]
        } else if self.is_latency() {
            &["Latency (us)"]
        } else {
            &["Bandwidth (MB/s)"]
        }
    }

    /// The smallest size the benchmark can measure. Zero-byte messages
    /// have a latency, but carry no bandwidth; a barrier has no message
    /// (its one row is size 0); an all-reduce adds `f32`s; the one-sided
    /// accumulates work on `u64`s.
    pub fn min_size(self) -> usize {
        match self {
            Benchmark::Latency | Benchmark::MultiLatency | Benchmark::Barrier => 0,
            Benchmark::AllReduce | Benchmark::InterAllReduce => std::mem::size_of::<f32>(),
            Benchmark::AccLatency | Benchmark::FopLatency | Benchmark::CasLatency => {
                std::mem::size_of::<u64>()
            }
            _ => 1,
        }
    }

    /// Its default iteration and warm-up counts: OSU's, but
    /// [`WIN_CREATE_COUNTS`] for `win_create`.
    pub fn default_counts(self) -> Counts {
        if self == Benchmark::WinCreate {
            WIN_CREATE_COUNTS
        } else {
            OSU_COUNTS
        }
    }

    /// The benchmark named `word` on the command line.
    pub fn parse(word: &str) -> Option<Benchmark> {
        Benchmark::ALL.into_iter().find(|b| b.name() == word)
    }
}

/// How a one-sided benchmark synchronises its operations with the target:
/// OSU's `-s` option of `osu_put_latency` and the others, of which oxbench
/// has the two passive-target ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synchronization {
    /// One shared lock on the target for each size, and a flush after each
    /// operation (each window of [`WINDOW`], for the bandwidths): OSU's
    /// default, `-s flush`.
    Flush,
    /// Each timed iteration takes a lock on the target, runs the operation
    /// (or the window of [`WINDOW`]) and unlocks: OSU's `-s lock`. The lock
    /// is exclusive for fetch-and-op and compare-and-swap, shared for the
    /// others, as OSU's.
    Lock,
}

impl Synchronization {
    /// Every mode, the default first.
    pub const ALL: [Synchronization; 2] = [Synchronization::Flush, Synchronization::Lock];

    /// The name on the command line (`--sync NAME`) and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            Synchronization::Flush => "flush",
            Synchronization::Lock => "lock",
        }
    }

    /// The mode named `word`.
    pub fn parse(word: &str) -> Option<Synchronization> {
        Synchronization::ALL.into_iter().find(|s| s.name() == word)
    }

    /// Whether `benchmark`'s lock on the target is exclusive in this mode
    /// (OSU's `run_fop_with_lock` and `run_cas_with_lock` lock
    /// exclusively; every other lock is shared).
    pub fn exclusive(self, benchmark: Benchmark) -> bool {
        self == Synchronization::Lock
            && matches!(benchmark, Benchmark::FopLatency | Benchmark::CasLatency)
    }

    /// How the one-sided `benchmark` synchronises in this mode, for the
    /// reports' header lines (`peer_bench.c` prints the same words).
    pub fn describe(self, benchmark: Benchmark) -> String {
        let operations = if benchmark.is_windowed() {
            format!("{WINDOW} operations to consecutive slots")
        } else {
            "each operation".to_owned()
        };
        let lock = if self.exclusive(benchmark) {
            "an exclusive"
        } else {
            "a shared"
        };
        match self {
            Synchronization::Flush => format!(
                "sync: flush ({lock} lock on the target per size; {operations}, then a flush)"
            ),
            Synchronization::Lock => format!(
                "sync: lock ({operations} in {lock} lock of its own on the target, then an \
                 unlock)"
            ),
        }
    }
}

/// Which window `win_create` makes and frees (`--flavor`): MPI's
/// creation flavours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowFlavor {
    /// Memory MPI allocates (`Window::allocate`, `MPI_Win_allocate`): the
    /// default.
    Allocate,
    /// Memory the program lends, one buffer of the largest size for
    /// every window (`Window::create`, `MPI_Win_create`).
    Create,
}

impl WindowFlavor {
    /// Every flavour, the default first.
    pub const ALL: [WindowFlavor; 2] = [WindowFlavor::Allocate, WindowFlavor::Create];

    /// The name on the command line (`--flavor NAME`) and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            WindowFlavor::Allocate => "allocate",
            WindowFlavor::Create => "create",
        }
    }

    /// The flavour named `word`.
    pub fn parse(word: &str) -> Option<WindowFlavor> {
        WindowFlavor::ALL.into_iter().find(|f| f.name() == word)
    }

    /// The reports' header line (`peer_bench.c` prints the same words).
    pub fn describe(self) -> String {
        let call = match self {
            WindowFlavor::Allocate => "MPI_Win_allocate",
            WindowFlavor::Create => "MPI_Win_create on a buffer of the largest size",
        };
        format!(
            "window: {} ({call}, then MPI_Win_free, back to back over every rank; the figure \
             is each rank's mean time per window, averaged over the ranks)",
            self.name()
        )
    }
}

/// Iteration and warm-up counts: one pair for sizes up to
/// [`LARGE_MESSAGE_SIZE`], one above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Timed iterations per size up to [`LARGE_MESSAGE_SIZE`].
    pub iterations: usize,
    /// Timed iterations per size above [`LARGE_MESSAGE_SIZE`].
    pub iterations_large: usize,
    /// Untimed warm-up iterations per size up to [`LARGE_MESSAGE_SIZE`].
    pub warmup: usize,
    /// Untimed warm-up iterations per size above [`LARGE_MESSAGE_SIZE`].
    pub warmup_large: usize,
}

/// `win_create`'s default counts: a window costs tens of microseconds
/// to milliseconds (a communicator, collectives, memory mapped), so
/// OSU's 10000 per size would take minutes.
pub const WIN_CREATE_COUNTS: Counts = Counts {
    iterations: 200,
    iterations_large: 50,
    warmup: 20,
    warmup_large: 5,
};

/// The options shared by every benchmark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Smallest message size in bytes.
    pub min_size: usize,
    /// Largest message size in bytes.
    pub max_size: usize,
    /// Iteration and warm-up counts.
    pub counts: Counts,
    /// Whether `counts` are the command's defaults, none given: a
    /// benchmark with counts of its own ([`Benchmark::default_counts`])
    /// takes those in [`Options::for_benchmark`] (a comparison may hold
    /// several benchmarks).
    pub counts_default: bool,
    /// Print one JSON object instead of the OSU-style table.
    pub json: bool,
    /// Time each operation too and report the tail of the times beside
    /// the mean ([`crate::report::TAIL_COLUMNS`]): the one-sided latency
    /// benchmarks only.
    pub tail: bool,
    /// How the one-sided benchmarks synchronise (`--sync`; the others
    /// have no window and keep the default).
    pub sync: Synchronization,
    /// Which window `win_create` makes (`--flavor`; the others keep the
    /// default).
    pub flavor: WindowFlavor,
}

impl Options {
    /// Options for `benchmark` with the defaults: OSU's sizes and counts.
    pub fn defaults(benchmark: Benchmark) -> Options {
        Options {
            min_size: benchmark.min_size(),
            max_size: DEFAULT_MAX_SIZE,
            counts: benchmark.default_counts(),
            counts_default: false,
            json: false,
            tail: false,
            sync: Synchronization::Flush,
            flavor: WindowFlavor::Allocate,
        }
    }

    /// The message sizes to measure: `min_size`, then doubling (0 is
    /// followed by 1), up to `max_size` included, as OSU.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut size = self.min_size;
        while size <= self.max_size {
            sizes.push(size);
            size = if size == 0 { 1 } else { size * 2 };
        }
        sizes
    }

    /// These options as `benchmark` runs them: sizes from its smallest
    /// ([`Benchmark::min_size`]), only size 0 for the barrier, only one
    /// `u64` (8 bytes) for fetch-and-op and compare-and-swap, and the
    /// tail only for the one-sided latencies, the synchronization only for
    /// the one-sided benchmarks, the flavour only for `win_create`, and
    /// the benchmark's own counts where none were given (a comparison may
    /// hold others).
    pub fn for_benchmark(&self, benchmark: Benchmark) -> Options {
        let (min_size, max_size) = match benchmark {
            Benchmark::Barrier => (0, 0),
            Benchmark::FopLatency | Benchmark::CasLatency => (8, 8),
            _ => (self.min_size.max(benchmark.min_size()), self.max_size),
        };
        Options {
            min_size,
            max_size,
            tail: self.tail && benchmark.is_rma() && benchmark.is_latency(),
            sync: if benchmark.is_rma() {
                self.sync
            } else {
                Synchronization::Flush
            },
            flavor: if benchmark == Benchmark::WinCreate {
                self.flavor
            } else {
                WindowFlavor::Allocate
            },
            counts: if self.counts_default {
                benchmark.default_counts()
            } else {
                self.counts
            },
            counts_default: false,
            ..self.clone()
        }
    }

    /// Timed iterations for messages of `size` bytes.
    pub fn iterations_for(&self, size: usize) -> usize {
        if size > LARGE_MESSAGE_SIZE {
            self.counts.iterations_large
        } else {
            self.counts.iterations
        }
    }

    /// Warm-up iterations for messages of `size` bytes.
    pub fn warmup_for(&self, size: usize) -> usize {
        if size > LARGE_MESSAGE_SIZE {
            self.counts.warmup_large
        } else {
            self.counts.warmup
        }
    }

    /// The options as command-line arguments that parse back to the same
    /// options (for the jobs and child processes oxbench starts).
    pub fn to_args(&self) -> Vec<String> {
        let c = &self.counts;
        let mut args: Vec<String> = [
            ("--min-size", self.min_size),
            ("--max-size", self.max_size),
            ("--iterations", c.iterations),
            ("--iterations-large", c.iterations_large),
            ("--warmup", c.warmup),
            ("--warmup-large", c.warmup_large),
        ]
        .into_iter()
        .flat_map(|(name, value)| [name.to_owned(), value.to_string()])
        .collect();
        if self.json {
            args.push("--json".to_owned());
        }
        if self.tail {
            args.push("--tail".to_owned());
        }
        // The default is left out: the benchmarks without a window take
        // no `--sync`.
        if self.sync != Synchronization::Flush {
            args.extend(["--sync".to_owned(), self.sync.name().to_owned()]);
        }
        if self.flavor != WindowFlavor::Allocate {
            args.extend(["--flavor".to_owned(), self.flavor.name().to_owned()]);
        }
        args
    }

    /// A line describing the iteration counts, for the output's header.
    pub fn describe_iterations(&self) -> String {
        let part = |small: usize, large: usize| {
            if small == large {
                small.to_string()
            } else {
                format!("{small} (≤ {LARGE_MESSAGE_SIZE} B), {large} (larger)")
            }
        };
        let c = &self.counts;
        format!(
            "iterations: {}; warm-up: {}",
            part(c.iterations, c.iterations_large),
            part(c.warmup, c.warmup_large)
        )
    }
}

/// The transport `oxbench compare` restricts every implementation to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareTransport {
    /// TCP over loopback, also between ranks on one machine.
    Tcp,
    /// Shared memory.
    Shm,
}

impl CompareTransport {
    /// The name on the command line (and oxmpi's name for it).
    pub fn name(self) -> &'static str {
        match self {
            CompareTransport::Tcp => "tcp",
            CompareTransport::Shm => "shm",
        }
    }
}

/// What `oxbench compare` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareOptions {
    /// The benchmarks, each compared in a table of its own.
    pub benchmarks: Vec<Benchmark>,
    /// Sizes and counts (the smallest size is raised to 1 for windowed
    /// benchmarks when it was not given).
    pub options: Options,
    /// Rounds: each runs every implementation once; the figures are the
    /// medians of the rounds.
    pub rounds: usize,
    /// Ranks of the multi-pair benchmarks' jobs (2 for the others).
    pub ranks: usize,
    /// The transport every implementation is restricted to.
    pub transport: CompareTransport,
    /// Peers left out of the comparison (`--without`): for quick checks
    /// where one peer takes minutes (MPICH's one-sided operations over
    /// TCP); its column is then missing and oxmpi/best is over the other.
    pub without: Vec<Peer>,
}

/// A peer implementation `oxbench compare` can leave out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// MPICH (`--without mpich`).
    Mpich,
    /// Open MPI (`--without openmpi`).
    OpenMpi,
}

impl Peer {
    /// The name on the command line.
    pub fn option_name(self) -> &'static str {
        match self {
            Peer::Mpich => "mpich",
            Peer::OpenMpi => "openmpi",
        }
    }
}

/// Which ranks talk to which in `oxbench memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every rank with every other: every pair connects.
    All,
    /// Each rank with its two ring neighbours: the sparse case.
    Ring,
}

impl Pattern {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::All => "all",
            Pattern::Ring => "ring",
        }
    }

    /// What it means, for reports.
    pub fn description(self) -> &'static str {
        match self {
            Pattern::All => "every rank with every other",
            Pattern::Ring => "each rank with its two ring neighbours",
        }
    }
}

/// What `oxbench memory` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Which ranks exchange messages before the measurement.
    pub pattern: Pattern,
}

/// What `oxbench suite` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuiteOptions {
    /// Sizes and counts (the suite's own lighter counts by default).
    pub options: Options,
    /// The transports to measure; empty: every one this build offers.
    pub transports: Vec<String>,
    /// Where the plot is written.
    pub svg: PathBuf,
}

/// The suite's default counts: enough for a stable picture of every
/// size in a minute or so per transport, far fewer than OSU's.
pub const SUITE_COUNTS: Counts = Counts {
    iterations: 2_000,
    iterations_large: 100,
    warmup: 100,
    warmup_large: 5,
};

/// Default path of the suite's plot.
pub const SUITE_SVG: &str = "oxbench-suite.svg";

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Print the usage text and exit successfully.
    Help,
    /// An MPI benchmark in a job of oxmpi ranks.
    Mpi(Benchmark, Options),
    /// The raw TCP baseline: this process and a child it starts.
    RawTcp(Benchmark, Options),
    /// The shared-memory floor: a cache-line ping-pong between this
    /// process and a child (latency), or memcpy in this process (bw).
    RawShm(Benchmark, Options),
    /// The child of the shared-memory latency floor (internal): the
    /// shared file is its standard input; it ends when its parent, whose
    /// pid is given, is gone.
    RawShmPeer {
        /// The parent's options.
        options: Options,
        /// The parent's process id.
        parent: u32,
    },
    /// The child of the raw TCP baseline (internal): connects to the
    /// parent's port on 127.0.0.1 and proves it is the child with `token`.
    RawTcpPeer {
        /// The benchmark the parent runs.
        benchmark: Benchmark,
        /// The parent's options.
        options: Options,
        /// The parent's listening port on 127.0.0.1.
        port: u16,
        /// The token the parent gave the child, sent first on connecting.
        token: u64,
    },
    /// oxmpi beside MPICH and Open MPI.
    Compare(CompareOptions),
    /// Every benchmark over every transport, tables and a plot.
    Suite(SuiteOptions),
    /// The shared memory each rank of a job maps.
    Memory(MemoryOptions),
}

/// The hidden subcommand the raw TCP benchmark starts its child with.
pub const RAW_TCP_PEER: &str = "__raw-tcp-peer";
/// The hidden subcommand the shared-memory latency floor starts its child
/// with.
pub const RAW_SHM_PEER: &str = "__raw-shm-peer";

/// A bad command line, with a message for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage_error<T>(message: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(message.into()))
}

/// The usage text.
pub const USAGE: &str = "\
usage: oxrun -n 2 oxbench latency|bw|bibw [OPTIONS]
       oxrun -n N oxbench mbw_mr|multi_lat [OPTIONS]     (N even)
       oxrun -n N oxbench barrier|bcast|allreduce|alltoall|neighbor_allgather|
                          neighbor_alltoall|inter_allreduce [OPTIONS]
       oxrun -n 2 oxbench put_latency|get_latency|acc_latency|fop_latency|
                          cas_latency|put_bw|get_bw [OPTIONS]
                          [--sync flush|lock]
       oxrun -n N oxbench win_create [OPTIONS] [--flavor allocate|create]
       oxbench raw-tcp latency|bw [OPTIONS]
       oxbench raw-shm latency|bw [OPTIONS]
       oxbench compare [BENCHMARK...] [OPTIONS] [--transport tcp|shm]
                       [--rounds N] [--ranks N] [--without mpich|openmpi]
       oxbench suite [OPTIONS] [--transports LIST] [--svg FILE]
       oxrun -n N oxbench memory [--pattern all|ring]

benchmarks (as the OSU micro-benchmarks of the same names):
  latency          ping-pong one-way latency in us (osu_latency)
  bw               bandwidth in MB/s (1 MB = 1e6 bytes) of windows of 64
                   immediate sends, each window acknowledged (osu_bw)
  bibw             windows of 64 immediate sends both ways at once; MB/s
                   of both directions together (osu_bibw)
  mbw_mr           bw between N/2 pairs at once (rank i sends to i + N/2):
                   total MB/s and messages/s (osu_mbw_mr)
  multi_lat        latency between N/2 pairs at once, averaged (osu_multi_lat)
  barrier          time per barrier over all N ranks (osu_barrier)
  bcast            time per broadcast from rank 0 (osu_bcast)
  allreduce        time per all-reduce, sum of f32s, sizes in bytes from 4
                   (osu_allreduce)
  alltoall         time per all-to-all, each size a block to every rank
                   (osu_alltoall)
  neighbor_allgather
                   time per neighbourhood all-gather on a periodic ring of
                   all N ranks (1-d Cartesian): each size to both
                   neighbours, a block from each
  neighbor_alltoall
                   time per neighbourhood all-to-all on that ring, a block
                   of each size to and from each neighbour
  inter_allreduce  time per all-reduce over an intercommunicator between
                   the first N/2 ranks and the rest (N >= 2), sum of f32s
  put_latency, get_latency, acc_latency, fop_latency, cas_latency
                   time per one-sided operation into a window MPI
                   allocated, under a shared lock, each followed by a
                   flush (osu_put_latency, ...; fop and cas: 8 bytes);
                   with --sync lock, each in a lock of its own
  put_bw, get_bw   windows of 64 puts or gets, then a flush, operation j
                   moving slot j of 64 at both ends (osu_put_bw,
                   osu_get_bw); with --sync lock, each window in a lock
                   of its own
  win_create       time per window made and freed (MPI_Win_allocate or,
                   with --flavor create, MPI_Win_create; then
                   MPI_Win_free) of each size over all N ranks, back to
                   back; each rank's mean, averaged over the ranks (no
                   OSU counterpart; default counts 200 up to 8K and 50
                   above, warm-up 20 and 5)
  (the collectives time each operation alone, with a barrier between
  operations, and report each rank's mean averaged over the ranks)

commands:
  raw-tcp BENCH    latency or bw between this process and a child over a
                   plain loopback TCP socket (127.0.0.1, TCP_NODELAY, both
                   sides busy-polling non-blocking sockets): the floor
  raw-shm BENCH    the shared-memory floor: latency of two processes
                   spinning on a shared cache line each way (up to 56
                   bytes), bound to a core each as oxrun binds 2 ranks;
                   bw as one thread's memcpy of each message into a
                   window of 64 buffers
  compare          runs the benchmarks (default: latency bw) over oxmpi,
                   MPICH and Open MPI on this machine, all over one
                   transport, and the floor (raw-tcp or raw-shm); prints
                   each size's figures and oxmpi's ratios to the better
                   peer and to the floor; builds its C benchmark with each
                   peer's mpicc, installing the Debian packages when root
  suite            runs latency, bw, bibw and mbw_mr as 2-rank jobs through
                   oxrun over every transport this build offers, and the
                   raw TCP floor; prints a table per transport and writes
                   an SVG plot of latency and bandwidth against size
  memory           each rank exchanges 32 messages of 64K each way with
                   every other rank (--pattern all, the default) or its
                   ring neighbours (--pattern ring), then rank 0 prints the
                   shared segments each rank maps: size, Rss and Pss in KiB
                   from /proc/self/smaps

options:
  --min-size N     smallest message size (default 0 for latency and
                   multi_lat, 1 for the others; 1 in the suite)
  --max-size N     largest message size (default 4M, at most 64M)
  --size N         measure only this size
  --iterations N   timed iterations per size (default 10000, in the suite
                   2000); also above 8K unless --iterations-large is given
  --iterations-large N
                   timed iterations per size above 8K (default 1000, in
                   the suite 100)
  --warmup N       untimed warm-up iterations per size (default 100); also
                   above 8K unless --warmup-large is given
  --warmup-large N untimed warm-up iterations above 8K (default 10, in the
                   suite 5)
  --json           print JSON instead of tables (compare: one object per
                   benchmark, one per line)
  --tail           one-sided latencies (put_latency ... cas_latency): also
                   time each operation and print, per size, beside the
                   mean: the median, the 99th percentile and the longest
                   operation in us, and how many took over 1 ms (JSON keys
                   p50, p99, max, over_1ms); compare: oxmpi's jobs of these
                   benchmarks do, and each round's figures follow the
                   table (not with --json)
  --sync MODE      one-sided benchmarks, as OSU's -s: flush (default: one
                   shared lock per size, a flush after each operation or
                   window) or lock (each operation or window in a lock of
                   its own, then an unlock; exclusive for fop_latency and
                   cas_latency, shared for the others); compare passes it
                   to every implementation
  --flavor F       win_create: allocate (default: MPI_Win_allocate) or
                   create (MPI_Win_create on a buffer the program lends);
                   compare passes it to every implementation
  --rounds N       compare: run every implementation N times, alternating,
                   oxmpi and the floor back to back; report medians, and
                   oxmpi's ratios as medians of each round's (default 1)
  --ranks N        compare: ranks of the mbw_mr and multi_lat jobs (even)
                   and of the collectives' and win_create's (default 2)
  --transport T    compare: tcp (default) or shm
  --without PEER   compare: leave out mpich or openmpi (quick checks; the
                   ratio is then over the other peer alone)
  --transports L   suite: comma-separated transports (default: all)
  --svg FILE       suite: where to write the plot (default oxbench-suite.svg)
  -h, --help       print this text

Sizes are bytes, with an optional binary suffix: 64K = 65536, 4M = 4194304.
Sizes double from the smallest to the largest.";

/// Parses a size: decimal bytes with an optional `K`/`KiB`/`M`/`MiB`/`G`/
/// `GiB` suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, UsageError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    let shift = match suffix {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "m" | "MiB" => 20,
        "G" | "g" | "GiB" => 30,
        _ => return usage_error(format!("{text:?} is not a size (bytes, or with K, M or G)")),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| UsageError(format!("{text:?} is not a size (bytes, or with K, M or G)")))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| UsageError(format!("size {text:?} is too large")))
}

fn parse_count(option: &str, text: &str) -> Result<usize, UsageError> {
    text.parse()
        .map_err(|_| UsageError(format!("{option} takes a whole number, not {text:?}")))
}

/// Parses the arguments after the program name.
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Command, UsageError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    if args.iter().any(|a| *a == "-h" || *a == "--help") {
        return Ok(Command::Help);
    }
    let Some((&first, rest)) = args.split_first() else {
        return usage_error("no benchmark given");
    };
    // The raw TCP baseline has the two benchmarks a plain socket can do.
    let raw_benchmark = |rest: &[&str]| -> Result<Benchmark, UsageError> {
        match rest.first().map(|w| (w, Benchmark::parse(w))) {
            None => usage_error(format!("{first} needs a benchmark: latency or bw")),
            Some((_, Some(b @ (Benchmark::Latency | Benchmark::Bandwidth)))) => Ok(b),
            Some((word, _)) => usage_error(format!(
                "{first} has no benchmark {word:?}: expected latency or bw"
            )),
        }
    };
    match first {
        "raw-tcp" => {
            let benchmark = raw_benchmark(rest)?;
            let (options, _) =
                parse_options(Some(benchmark), 1, SIZE_LIMIT, &rest[1..], Extra::None)?;
            Ok(Command::RawTcp(benchmark, options))
        }
        RAW_TCP_PEER => {
            let benchmark = raw_benchmark(rest)?;
            let [port, token, options @ ..] = &rest[1..] else {
                return usage_error(format!("{RAW_TCP_PEER} needs a port and a token"));
            };
            let port = port
                .parse()
                .map_err(|_| UsageError(format!("bad port {port:?}")))?;
            let token = token
                .parse()
                .map_err(|_| UsageError(format!("bad token {token:?}")))?;
            let (options, _) = parse_options(Some(benchmark), 1, SIZE_LIMIT, options, Extra::None)?;
            Ok(Command::RawTcpPeer {
                benchmark,
                options,
                port,
                token,
            })
        }
        "raw-shm" => {
            let benchmark = raw_benchmark(rest)?;
            let most = if benchmark.is_latency() {
                crate::raw_shm::LINE_PAYLOAD
            } else {
                SIZE_LIMIT
            };
            let (options, _) = parse_options(Some(benchmark), 1, most, &rest[1..], Extra::None)?;
            Ok(Command::RawShm(benchmark, options))
        }
        RAW_SHM_PEER => {
            let Some((parent, options)) = rest.split_first() else {
                return usage_error(format!("{RAW_SHM_PEER} needs the parent's pid"));
            };
            let parent = parent
                .parse()
                .map_err(|_| UsageError(format!("bad parent pid {parent:?}")))?;
            let line = crate::raw_shm::LINE_PAYLOAD;
            let (options, _) =
                parse_options(Some(Benchmark::Latency), 1, line, options, Extra::None)?;
            Ok(Command::RawShmPeer { options, parent })
        }
        "compare" => parse_compare(rest),
        "memory" => {
            let pattern = match rest {
                [] => Pattern::All,
                ["--pattern", word] => [Pattern::All, Pattern::Ring]
                    .into_iter()
                    .find(|p| p.name() == *word)
                    .ok_or_else(|| {
                        UsageError(format!("memory: --pattern {word:?}: expected all or ring"))
                    })?,
                _ => return usage_error("memory takes only --pattern all|ring"),
            };
            Ok(Command::Memory(MemoryOptions { pattern }))
        }
        "suite" => {
            let (options, extras) = parse_options(None, 1, SIZE_LIMIT, rest, Extra::Suite)?;
            Ok(Command::Suite(SuiteOptions {
                options,
                transports: extras.transports,
                svg: extras.svg.unwrap_or_else(|| PathBuf::from(SUITE_SVG)),
            }))
        }
        word => match Benchmark::parse(word) {
            Some(benchmark) => {
                let least = benchmark.min_size();
                let (options, _) =
                    parse_options(Some(benchmark), least, SIZE_LIMIT, rest, Extra::None)?;
                Ok(Command::Mpi(benchmark, options.for_benchmark(benchmark)))
            }
            None => usage_error(format!(
                "unknown benchmark {word:?}: expected one of {}, or raw-tcp, raw-shm, compare, \
                 suite or memory",
                benchmark_names()
            )),
        },
    }
}

fn benchmark_names() -> String {
    Benchmark::ALL.map(Benchmark::name).join(", ")
}

fn parse_compare(args: &[&str]) -> Result<Command, UsageError> {
    let named = args.iter().take_while(|a| !a.starts_with('-')).count();
    let mut benchmarks = Vec::new();
    for word in &args[..named] {
        let b = Benchmark::parse(word).ok_or_else(|| {
            UsageError(format!(
                "compare: unknown benchmark {word:?}: expected {}",
                benchmark_names()
            ))
        })?;
        if benchmarks.contains(&b) {
            return usage_error(format!("compare: {word} is named twice"));
        }
        benchmarks.push(b);
    }
    if benchmarks.is_empty() {
        benchmarks = vec![Benchmark::Latency, Benchmark::Bandwidth];
    }
    // Latency can start at 0 bytes, the bandwidths at 1: the least of the
    // chosen benchmarks' smallest sizes is the floor, and each benchmark
    // starts where it can.
    let least = if benchmarks.iter().all(|b| b.is_latency()) {
        0
    } else {
        1
    };
    let (options, extras) = parse_options(None, least, SIZE_LIMIT, &args[named..], Extra::Compare)?;
    if options.tail {
        if options.json {
            return usage_error(
                "compare: --tail prints oxmpi's tail under each table; it has no JSON form",
            );
        }
        if !benchmarks.iter().any(|b| b.is_rma() && b.is_latency()) {
            return usage_error(
                "compare: --tail needs a one-sided latency benchmark (put_latency, get_latency, \
                 acc_latency, fop_latency or cas_latency)",
            );
        }
    }
    if extras.sync_given && !benchmarks.iter().any(|b| b.is_rma()) {
        return usage_error(
            "compare: --sync needs a one-sided benchmark (put_latency, get_latency, acc_latency, \
             fop_latency, cas_latency, put_bw or get_bw)",
        );
    }
    if extras.flavor_given && !benchmarks.contains(&Benchmark::WinCreate) {
        return usage_error("compare: --flavor needs the win_create benchmark");
    }
    let ranks = extras.ranks;
    if ranks % 2 != 0 && benchmarks.iter().any(|b| b.is_multi_pair()) {
        return usage_error(format!(
            "--ranks must be even for mbw_mr and multi_lat (pairs), not {ranks}"
        ));
    }
    Ok(Command::Compare(CompareOptions {
        benchmarks,
        options,
        rounds: extras.rounds,
        ranks: extras.ranks,
        transport: extras.transport,
        without: extras.without,
    }))
}

/// Which options beyond the shared ones a command takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    Compare,
    Suite,
}

/// The values of the options beyond the shared ones (their defaults where
/// the command takes none).
struct Extras {
    /// Whether `--sync` was given (compare refuses it without a one-sided
    /// benchmark).
    sync_given: bool,
    /// Whether `--flavor` was given (compare refuses it without
    /// `win_create`).
    flavor_given: bool,
    rounds: usize,
    ranks: usize,
    transport: CompareTransport,
    without: Vec<Peer>,
    transports: Vec<String>,
    svg: Option<PathBuf>,
}

/// Parses options. `least` is the default smallest size, and also the
/// least one allowed (0 or 1); `most` the largest allowed (and the
/// default largest, when less than 4 MiB). `benchmark` is the one they
/// are for, if one (for messages). `extra` says which further options are
/// accepted, and which counts are the defaults (the suite's own).
fn parse_options(
    benchmark: Option<Benchmark>,
    least: usize,
    most: usize,
    args: &[&str],
    extra: Extra,
) -> Result<(Options, Extras), UsageError> {
    let mut min_size = None;
    let mut max_size = None;
    let mut size = None;
    let mut iterations = None;
    let mut iterations_large = None;
    let mut warmup = None;
    let mut warmup_large = None;
    let mut json = false;
    let mut tail = false;
    let mut sync = None;
    let mut flavor = None;
    let mut rounds = 1;
    let mut ranks = 2;
    let mut transport = CompareTransport::Tcp;
    let mut without = Vec::new();
    let mut transports = Vec::new();
    let mut svg = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        i += 1;
        // `--name=value` or `--name value`.
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg, None),
        };
        let mut value = |name: &str| -> Result<&str, UsageError> {
            if let Some(v) = inline {
                return Ok(v);
            }
            let v = args
                .get(i)
                .copied()
                .ok_or_else(|| UsageError(format!("{name} needs a value")))?;
            i += 1;
            Ok(v)
        };
        let positive = |name: &str, text: &str| -> Result<usize, UsageError> {
            match parse_count(name, text)? {
                0 => usage_error(format!("{name} must be at least 1")),
                n => Ok(n),
            }
        };
        match (name, extra) {
            ("--min-size", _) => min_size = Some(parse_size(value(name)?)?),
            ("--max-size", _) => max_size = Some(parse_size(value(name)?)?),
            ("--size", _) => size = Some(parse_size(value(name)?)?),
            ("--iterations", _) => iterations = Some(positive(name, value(name)?)?),
            ("--iterations-large", _) => iterations_large = Some(positive(name, value(name)?)?),
            ("--warmup", _) => warmup = Some(parse_count(name, value(name)?)?),
            ("--warmup-large", _) => warmup_large = Some(parse_count(name, value(name)?)?),
            ("--json", _) if inline.is_none() => json = true,
            ("--tail", _) if inline.is_none() => tail = true,
            ("--sync", Extra::None | Extra::Compare) => {
                let word = value(name)?;
                sync = Some(Synchronization::parse(word).ok_or_else(|| {
                    UsageError(format!(
                        "--sync takes {}, not {word:?}",
                        Synchronization::ALL.map(Synchronization::name).join(" or ")
                    ))
                })?);
            }
            ("--flavor", Extra::None | Extra::Compare) => {
                let word = value(name)?;
                flavor = Some(WindowFlavor::parse(word).ok_or_else(|| {
                    UsageError(format!(
                        "--flavor takes {}, not {word:?}",
                        WindowFlavor::ALL.map(WindowFlavor::name).join(" or ")
                    ))
                })?);
            }
            ("--rounds", Extra::Compare) => rounds = positive(name, value(name)?)?,
            ("--ranks", Extra::Compare) => ranks = positive(name, value(name)?)?,
            ("--transport", Extra::Compare) => {
                transport = match value(name)? {
                    "tcp" => CompareTransport::Tcp,
                    "shm" => CompareTransport::Shm,
                    other => {
                        return usage_error(format!("--transport takes tcp or shm, not {other:?}"))
                    }
                }
            }
            ("--without", Extra::Compare) => {
                let peer = match value(name)? {
                    "mpich" => Peer::Mpich,
                    "openmpi" => Peer::OpenMpi,
                    other => {
                        return usage_error(format!(
                            "--without takes mpich or openmpi, not {other:?}"
                        ))
                    }
                };
                if !without.contains(&peer) {
                    without.push(peer);
                }
                if without.len() == 2 {
                    return usage_error("--without leaves out both peers: nothing to compare with");
                }
            }
            ("--transports", Extra::Suite) => {
                transports = value(name)?
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect();
                if transports.is_empty() {
                    return usage_error("--transports needs at least one transport");
                }
            }
            ("--svg", Extra::Suite) => svg = Some(PathBuf::from(value(name)?)),
            _ => return usage_error(format!("unknown option {arg:?}")),
        }
    }
    let (min_size, max_size) = match size {
        Some(s) => {
            if min_size.is_some() || max_size.is_some() {
                return usage_error("--size cannot be combined with --min-size or --max-size");
            }
            (s, s)
        }
        None => (
            min_size.unwrap_or(least),
            max_size.unwrap_or(DEFAULT_MAX_SIZE.min(most)),
        ),
    };
    if max_size > most {
        let why = if most < SIZE_LIMIT {
            " (one cache line beside its sequence number)"
        } else {
            ""
        };
        return usage_error(format!(
            "message size {max_size} is larger than the limit of {most} bytes{why}"
        ));
    }
    if min_size > max_size {
        return usage_error(format!(
            "the smallest size ({min_size}) is larger than the largest ({max_size})"
        ));
    }
    if min_size < least {
        let what = match benchmark {
            Some(b) if b.is_windowed() => "bandwidth needs messages of at least 1 byte",
            Some(b @ (Benchmark::AllReduce | Benchmark::InterAllReduce)) => {
                return usage_error(format!(
                    "{} needs messages of at least 4 bytes (one f32)",
                    b.name()
                ))
            }
            Some(
                Benchmark::Broadcast
                | Benchmark::AllToAll
                | Benchmark::NeighborAllGather
                | Benchmark::NeighborAllToAll,
            ) => "collectives are measured from 1 byte",
            _ if extra == Extra::None => "raw TCP carries no zero-byte messages: sizes start at 1",
            _ => "sizes start at 1 here: bandwidths and plots need messages of at least 1 byte",
        };
        return usage_error(what);
    }
    let defaults = match (extra, benchmark) {
        (Extra::Suite, _) => SUITE_COUNTS,
        (_, Some(benchmark)) => benchmark.default_counts(),
        (_, None) => OSU_COUNTS,
    };
    let counts_given = [iterations, iterations_large, warmup, warmup_large]
        .iter()
        .any(Option::is_some);
    // A count given for all sizes applies above 8K too, unless that one is
    // given as well.
    let counts = Counts {
        iterations: iterations.unwrap_or(defaults.iterations),
        iterations_large: iterations_large
            .or(iterations)
            .unwrap_or(defaults.iterations_large),
        warmup: warmup.unwrap_or(defaults.warmup),
        warmup_large: warmup_large.or(warmup).unwrap_or(defaults.warmup_large),
    };
    if tail && extra != Extra::Compare && !benchmark.is_some_and(|b| b.is_rma() && b.is_latency()) {
        return usage_error(
            "--tail times each operation of a one-sided latency benchmark (put_latency, \
             get_latency, acc_latency, fop_latency, cas_latency) run as an oxmpi job; \
             run that benchmark with oxrun",
        );
    }
    if sync.is_some() && extra == Extra::None && !benchmark.is_some_and(Benchmark::is_rma) {
        return usage_error(
            "--sync chooses how a one-sided benchmark (put_latency, get_latency, acc_latency, \
             fop_latency, cas_latency, put_bw, get_bw) synchronises with its target",
        );
    }
    if flavor.is_some() && extra == Extra::None && benchmark != Some(Benchmark::WinCreate) {
        return usage_error("--flavor chooses which window win_create makes (allocate or create)");
    }
    let options = Options {
        min_size,
        max_size,
        counts,
        // A comparison's benchmarks each take their own defaults.
        counts_default: extra == Extra::Compare && !counts_given,
        json,
        tail,
        sync: sync.unwrap_or(Synchronization::Flush),
        flavor: flavor.unwrap_or(WindowFlavor::Allocate),
    };
    let extras = Extras {
        sync_given: sync.is_some(),
        flavor_given: flavor.is_some(),
        rounds,
        ranks,
        transport,
        without,
        transports,
        svg,
    };
    Ok((options, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(min: usize, max: usize) -> Options {
        Options {
            min_size: min,
            max_size: max,
            counts: OSU_COUNTS,
            counts_default: false,
            json: false,
            tail: false,
            sync: Synchronization::Flush,
            flavor: WindowFlavor::Allocate,
        }
    }

    #[test]
    fn defaults_follow_osu() {
        let Ok(Command::Mpi(Benchmark::Latency, o)) = parse(&["latency"]) else {
            panic!("latency did not parse");
        };
        assert_eq!(o, opts(0, 4 << 20));
        assert_eq!(o, Options::defaults(Benchmark::Latency));
        let sizes = o.sizes();
        assert_eq!(sizes.len(), 24);
        assert_eq!(&sizes[..4], &[0, 1, 2, 4]);
        assert_eq!(sizes.last(), Some(&(4 << 20)));
        assert_eq!((o.iterations_for(8192), o.warmup_for(8192)), (10_000, 100));
        assert_eq!((o.iterations_for(8193), o.warmup_for(16384)), (1_000, 10));

        for b in [
            Benchmark::Bandwidth,
            Benchmark::BiBandwidth,
            Benchmark::MultiBandwidth,
        ] {
            let Ok(Command::Mpi(parsed, o)) = parse(&[b.name()]) else {
                panic!("{} did not parse", b.name());
            };
            assert_eq!(parsed, b);
            assert_eq!(o.sizes()[0], 1);
            assert_eq!(o.sizes().len(), 23);
        }
        let Ok(Command::Mpi(Benchmark::MultiLatency, o)) = parse(&["multi_lat"]) else {
            panic!("multi_lat did not parse");
        };
        assert_eq!(o.sizes()[0], 0);

        let Ok(Command::RawTcp(Benchmark::Latency, o)) = parse(&["raw-tcp", "latency"]) else {
            panic!("raw-tcp latency did not parse");
        };
        assert_eq!(o.sizes()[0], 1);
        let Ok(Command::RawShm(Benchmark::Latency, o)) = parse(&["raw-shm", "latency"]) else {
            panic!("raw-shm latency did not parse");
        };
        assert_eq!((o.min_size, o.max_size), (1, 56));
        let Ok(Command::RawShm(Benchmark::Bandwidth, o)) = parse(&["raw-shm", "bw"]) else {
            panic!("raw-shm bw did not parse");
        };
        assert_eq!((o.min_size, o.max_size), (1, 4 << 20));
    }

    #[test]
    fn options_parse_in_both_forms() {
        let c = parse(&[
            "latency",
            "--max-size",
            "1K",
            "--iterations=50",
            "--warmup",
            "5",
            "--json",
            "--min-size=2",
        ])
        .unwrap();
        let expected = Options {
            min_size: 2,
            max_size: 1024,
            counts: Counts {
                iterations: 50,
                iterations_large: 50,
                warmup: 5,
                warmup_large: 5,
            },
            counts_default: false,
            json: true,
            tail: false,
            sync: Synchronization::Flush,
            flavor: WindowFlavor::Allocate,
        };
        assert_eq!(c, Command::Mpi(Benchmark::Latency, expected.clone()));
        assert_eq!(expected.iterations_for(1 << 20), 50);
        assert_eq!(expected.warmup_for(1 << 20), 5);
        assert_eq!(
            expected.sizes(),
            vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        );
        let c = parse(&["raw-tcp", "bw", "--size", "64K"]).unwrap();
        assert_eq!(c, Command::RawTcp(Benchmark::Bandwidth, opts(65536, 65536)));
        let Command::Mpi(_, o) = parse(&["bw", "--iterations-large", "7", "--warmup=3"]).unwrap()
        else {
            panic!("bw did not parse");
        };
        assert_eq!(
            (o.iterations_for(8), o.iterations_for(1 << 20)),
            (10_000, 7)
        );
        assert_eq!((o.warmup_for(8), o.warmup_for(1 << 20)), (3, 3));
        assert_eq!(
            o.describe_iterations(),
            "iterations: 10000 (≤ 8192 B), 7 (larger); warm-up: 3"
        );
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in ["", "K", "-1", "1.5M", "4 M", "4T", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn memory_parses_its_pattern() {
        for (args, pattern) in [
            (&["memory"][..], Pattern::All),
            (&["memory", "--pattern", "ring"][..], Pattern::Ring),
            (&["memory", "--pattern", "all"][..], Pattern::All),
        ] {
            assert_eq!(
                parse(args),
                Ok(Command::Memory(MemoryOptions { pattern })),
                "{args:?}"
            );
        }
        assert!(parse(&["memory", "--pattern"]).is_err());
    }

    #[test]
    fn compare_and_suite_parse() {
        let Command::Compare(c) = parse(&["compare"]).unwrap() else {
            panic!("compare did not parse");
        };
        assert_eq!(c.benchmarks, vec![Benchmark::Latency, Benchmark::Bandwidth]);
        assert_eq!((c.rounds, c.ranks, c.options.min_size), (1, 2, 1));
        assert_eq!(c.transport, CompareTransport::Tcp);
        assert!(c.without.is_empty());
        let Command::Compare(c) = parse(&[
            "compare",
            "latency",
            "mbw_mr",
            "--rounds",
            "3",
            "--ranks=4",
            "--size",
            "8",
            "--transport",
            "shm",
            "--without",
            "mpich",
            "--without=mpich",
        ])
        .unwrap() else {
            panic!("compare did not parse");
        };
        assert_eq!(c.without, vec![Peer::Mpich]);
        assert_eq!(
            c.benchmarks,
            vec![Benchmark::Latency, Benchmark::MultiBandwidth]
        );
        assert_eq!((c.rounds, c.ranks, c.options.sizes()), (3, 4, vec![8]));
        assert_eq!(c.transport, CompareTransport::Shm);
        let Command::Compare(c) = parse(&["compare", "latency"]).unwrap() else {
            panic!("compare latency did not parse");
        };
        assert_eq!(c.options.min_size, 0);

        let Command::Suite(s) = parse(&["suite"]).unwrap() else {
            panic!("suite did not parse");
        };
        assert_eq!(s.options.counts, SUITE_COUNTS);
        assert_eq!(s.options.sizes()[0], 1);
        assert!(s.transports.is_empty());
        assert_eq!(s.svg, PathBuf::from(SUITE_SVG));
        let Command::Suite(s) = parse(&[
            "suite",
            "--transports",
            "tcp, shm",
            "--svg=/tmp/x.svg",
            "--iterations",
            "9",
            "--max-size",
            "64K",
        ])
        .unwrap() else {
            panic!("suite did not parse");
        };
        assert_eq!(s.transports, vec!["tcp", "shm"]);
        assert_eq!(s.svg, PathBuf::from("/tmp/x.svg"));
        assert_eq!(s.options.counts.iterations_large, 9);
        assert_eq!(s.options.counts.warmup_large, SUITE_COUNTS.warmup_large);
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        let bad: &[&[&str]] = &[
            &[],
            &["lat"],
            &["raw-tcp"],
            &["raw-tcp", "put"],
            &["raw-tcp", "bibw"],
            &["latency", "--max-size"],
            &["latency", "--iterations", "0"],
            &["latency", "--iterations-large", "0"],
            &["latency", "--iterations", "ten"],
            &["latency", "--warmup", "-1"],
            &["latency", "--min-size", "64", "--max-size", "8"],
            &["latency", "--max-size", "65M"],
            &["latency", "--size", "8", "--max-size", "8"],
            &["latency", "--verbose"],
            &["latency", "--json=yes"],
            &["latency", "--tail"],
            &["put_bw", "--tail"],
            &["get_latency", "--tail=yes"],
            &["raw-tcp", "latency", "--tail"],
            &["compare", "latency", "--tail"],
            &["compare", "get_latency", "--tail", "--json"],
            &["suite", "--tail"],
            &["latency", "--rounds", "2"],
            &["bw", "--min-size", "0"],
            &["bibw", "--size", "0"],
            &["raw-tcp", "latency", "--size", "0"],
            &["raw-shm", "latency", "--size", "64"],
            &["raw-shm", "bibw"],
            &[RAW_TCP_PEER, "latency", "7"],
            &[RAW_SHM_PEER],
            &[RAW_SHM_PEER, "init"],
            &[RAW_SHM_PEER, "1", "--size", "64"],
            &["compare", "pingpong"],
            &["compare", "latency", "latency"],
            &["compare", "--rounds", "0"],
            &["compare", "mbw_mr", "--ranks", "3"],
            &["compare", "bw", "--min-size", "0"],
            &["compare", "--svg", "x.svg"],
            &["compare", "--transport", "verbs"],
            &["compare", "--without", "mvapich"],
            &["compare", "--without", "mpich", "--without", "openmpi"],
            &["latency", "--without", "mpich"],
            &["suite", "--transport", "tcp"],
            &["suite", "--rounds", "2"],
            &["suite", "--transports", ","],
            &["suite", "--size", "0"],
        ];
        for args in bad {
            assert!(parse(args).is_err(), "{args:?} parsed: {:?}", parse(args));
        }
        assert_eq!(parse(&["bw", "--help"]), Ok(Command::Help));
        assert_eq!(parse(&["-h"]), Ok(Command::Help));
    }

    #[test]
    fn tail_is_for_the_one_sided_latencies() {
        for b in Benchmark::ALL
            .into_iter()
            .filter(|b| b.is_rma() && b.is_latency())
        {
            let Ok(Command::Mpi(parsed, o)) = parse(&[b.name(), "--tail", "--size", "128K"]) else {
                panic!("{} --tail did not parse", b.name());
            };
            assert_eq!(parsed, b);
            assert!(o.tail);
            // The jobs oxbench starts get it too.
            assert!(o.to_args().contains(&"--tail".to_owned()));
        }
        let Ok(Command::Mpi(_, o)) = parse(&["get_latency"]) else {
            panic!("get_latency did not parse");
        };
        assert!(!o.tail);
        assert!(!o.to_args().contains(&"--tail".to_owned()));
        // A comparison passes it to the one-sided latencies only.
        let Ok(Command::Compare(c)) = parse(&["compare", "latency", "get_latency", "--tail"])
        else {
            panic!("compare --tail did not parse");
        };
        assert!(c.options.for_benchmark(Benchmark::GetLatency).tail);
        assert!(!c.options.for_benchmark(Benchmark::Latency).tail);
    }

    #[test]
    fn sync_chooses_how_the_one_sided_benchmarks_synchronise() {
        for b in Benchmark::ALL.into_iter().filter(|b| b.is_rma()) {
            let Ok(Command::Mpi(_, o)) = parse(&[b.name()]) else {
                panic!("{} did not parse", b.name());
            };
            assert_eq!(o.sync, Synchronization::Flush);
            assert!(!o.to_args().contains(&"--sync".to_owned()));
            for sync in Synchronization::ALL {
                let Ok(Command::Mpi(parsed, o)) = parse(&[b.name(), "--sync", sync.name()]) else {
                    panic!("{} --sync {} did not parse", b.name(), sync.name());
                };
                assert_eq!((parsed, o.sync), (b, sync));
                // The jobs oxbench starts run the same mode.
                let mut args = vec![b.name().to_owned()];
                args.extend(o.to_args());
                assert_eq!(parse(&args), Ok(Command::Mpi(b, o)));
            }
        }
        for bad in [
            &["put_latency", "--sync", "fence"][..],
            &["put_latency", "--sync"],
            &["get_bw", "--sync=pscw"],
            &["latency", "--sync", "lock"],
            &["bw", "--sync", "flush"],
            &["raw-tcp", "latency", "--sync", "lock"],
            &["suite", "--sync", "lock"],
            &["compare", "latency", "bw", "--sync", "lock"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        // A comparison runs its one-sided benchmarks in the mode, its
        // others as always, and passes the mode on.
        let Ok(Command::Compare(c)) = parse(&["compare", "latency", "fop_latency", "--sync=lock"])
        else {
            panic!("compare --sync lock did not parse");
        };
        let fop = c.options.for_benchmark(Benchmark::FopLatency);
        assert_eq!(fop.sync, Synchronization::Lock);
        assert!(fop
            .to_args()
            .ends_with(&["--sync".to_owned(), "lock".to_owned()]));
        let latency = c.options.for_benchmark(Benchmark::Latency);
        assert_eq!(latency.sync, Synchronization::Flush);
        assert!(!latency.to_args().contains(&"--sync".to_owned()));
    }

    #[test]
    fn win_create_takes_its_flavor_and_counts() {
        let Ok(Command::Mpi(Benchmark::WinCreate, o)) = parse(&["win_create"]) else {
            panic!("win_create did not parse");
        };
        assert_eq!(o, Options::defaults(Benchmark::WinCreate));
        assert_eq!(
            (o.counts, o.flavor),
            (WIN_CREATE_COUNTS, WindowFlavor::Allocate)
        );
        assert_eq!(o.sizes()[0], 1);
        assert!(!o.to_args().contains(&"--flavor".to_owned()));
        let Ok(Command::Mpi(_, o)) = parse(&["win_create", "--flavor=create", "--iterations", "7"])
        else {
            panic!("win_create --flavor create did not parse");
        };
        assert_eq!(
            (o.flavor, o.counts.iterations_large),
            (WindowFlavor::Create, 7)
        );
        // The jobs oxbench starts make the same windows.
        let mut args = vec!["win_create".to_owned()];
        args.extend(o.to_args());
        assert_eq!(parse(&args), Ok(Command::Mpi(Benchmark::WinCreate, o)));
        // A comparison gives each benchmark its own counts unless some
        // are given, and the flavour to win_create alone.
        let Ok(Command::Compare(c)) =
            parse(&["compare", "latency", "win_create", "--flavor", "create"])
        else {
            panic!("compare win_create did not parse");
        };
        let windows = c.options.for_benchmark(Benchmark::WinCreate);
        assert_eq!(
            (windows.counts, windows.flavor),
            (WIN_CREATE_COUNTS, WindowFlavor::Create)
        );
        assert!(windows
            .to_args()
            .ends_with(&["--flavor".to_owned(), "create".to_owned()]));
        let latency = c.options.for_benchmark(Benchmark::Latency);
        assert_eq!(
            (latency.counts, latency.flavor),
            (OSU_COUNTS, WindowFlavor::Allocate)
        );
        let Ok(Command::Compare(c)) = parse(&["compare", "win_create", "--warmup", "3"]) else {
            panic!("compare win_create --warmup did not parse");
        };
        let windows = c.options.for_benchmark(Benchmark::WinCreate);
        assert_eq!(
            (windows.counts.iterations, windows.counts.warmup),
            (10_000, 3)
        );
        for bad in [
            &["win_create", "--flavor", "dynamic"][..],
            &["win_create", "--flavor"],
            &["latency", "--flavor", "create"],
            &["put_latency", "--flavor=allocate"],
            &["raw-tcp", "latency", "--flavor", "create"],
            &["suite", "--flavor", "create"],
            &["compare", "latency", "--flavor", "create"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn sync_modes_are_described_as_osu_locks() {
        use Synchronization::{Flush, Lock};
        assert_eq!(
            Flush.describe(Benchmark::PutLatency),
            "sync: flush (a shared lock on the target per size; each operation, then a flush)"
        );
        assert_eq!(
            Flush.describe(Benchmark::CasLatency),
            "sync: flush (a shared lock on the target per size; each operation, then a flush)"
        );
        assert_eq!(
            Lock.describe(Benchmark::GetBandwidth),
            "sync: lock (64 operations to consecutive slots in a shared lock of its own on the \
             target, then an unlock)"
        );
        assert_eq!(
            Lock.describe(Benchmark::FopLatency),
            "sync: lock (each operation in an exclusive lock of its own on the target, then an \
             unlock)"
        );
        let exclusive: Vec<Benchmark> = Benchmark::ALL
            .into_iter()
            .filter(|&b| Lock.exclusive(b))
            .collect();
        assert_eq!(exclusive, [Benchmark::FopLatency, Benchmark::CasLatency]);
        assert!(!Benchmark::ALL.into_iter().any(|b| Flush.exclusive(b)));
    }

    #[test]
    fn options_round_trip_through_arguments() {
        let options = Options {
            min_size: 8,
            max_size: 4 << 20,
            counts: Counts {
                iterations: 3,
                iterations_large: 2,
                warmup: 0,
                warmup_large: 1,
            },
            counts_default: false,
            json: true,
            tail: false,
            sync: Synchronization::Flush,
            flavor: WindowFlavor::Allocate,
        };
        let mut args = vec![
            RAW_TCP_PEER.to_owned(),
            "bw".to_owned(),
            "4242".to_owned(),
            "99".to_owned(),
        ];
        args.extend(options.to_args());
        assert_eq!(
            parse(&args),
            Ok(Command::RawTcpPeer {
                benchmark: Benchmark::Bandwidth,
                options: options.clone(),
                port: 4242,
                token: 99,
            })
        );
        let mut args = vec!["mbw_mr".to_owned()];
        args.extend(options.to_args());
        assert_eq!(
            parse(&args),
            Ok(Command::Mpi(Benchmark::MultiBandwidth, options))
        );
    }
}
