/*
 * peer_bench: oxbench's MPI benchmarks written against the standard MPI C
 * API, so that other MPI libraries (MPICH, Open MPI) are measured with
 * exactly the same patterns as oxmpi. `oxbench compare` builds it with
 * each library's `mpicc` and runs it under the library's launcher.
 *
 * It mirrors benches/src/mpi_bench.rs, benches/src/coll_bench.rs,
 * benches/src/rma_bench.rs, benches/src/win_bench.rs and
 * benches/src/cli.rs (read their docs for the patterns), and must be kept
 * in step with them:
 * - command line: `latency|bw|bibw|mbw_mr|multi_lat|barrier|bcast|
 *   allreduce|alltoall|neighbor_allgather|neighbor_alltoall|
 *   inter_allreduce|put_latency|...|win_create [--min-size N]
 *   [--max-size N] [--size N] [--iterations N] [--iterations-large N]
 *   [--warmup N] [--warmup-large N] [--sync flush|lock] [--flavor
 *   allocate|create]` (`--sync` for the one-sided benchmarks only,
 *   `--flavor` for win_create only), `--name value` or `--name=value`,
 *   sizes in bytes with an optional K, M or G suffix (powers of 1024);
 *   sizes double from the smallest to the largest (0 is followed by 1);
 *   a count given for all sizes applies above 8 KiB too unless the
 *   `-large` one is given;
 * - OSU's counts: 10000 timed iterations after 100 warm-up ones up to
 *   8 KiB, 1000 after 10 above, unless given;
 * - pairs: rank i of the first half with rank i + n/2, the first the
 *   initiator; latency, bw and bibw need exactly 2 ranks, mbw_mr and
 *   multi_lat an even number;
 * - latency, multi_lat: the initiator sends, its partner answers with the
 *   same size; half the round trip in microseconds, averaged (over the
 *   pairs too);
 * - bw, mbw_mr: the initiator starts 64 immediate sends, waits for them,
 *   and receives a 4-byte acknowledgement; its partner posts 64 immediate
 *   receives into 64 consecutive buffers, waits, and acknowledges; MB/s,
 *   10^6 bytes per second, of all pairs over their mean time (and, for
 *   mbw_mr, messages per second);
 * - bibw: both post 64 immediate receives, start 64 immediate sends and
 *   wait for all; MB/s of both directions;
 * - before each size, every rank sends one byte to rank 0, which answers
 *   each (the multi-pair benchmarks again after the warm-up); page-aligned
 *   buffers filled with a size-dependent pattern (bytes 1..=251 cycling)
 *   before timing; every receive's byte count checked, and the received
 *   bytes compared with the pattern after the timed loop; initiators send
 *   their times to rank 0;
 * - barrier, bcast, allreduce, alltoall: every rank takes part (any
 *   number); each operation is timed alone and followed by an untimed
 *   barrier (barrier: barriers back to back, one row of size 0); bcast
 *   from rank 0, allreduce the sum of size/4 floats (sizes from 4),
 *   alltoall a block of `size` bytes to and from every rank; each rank's
 *   mean time per operation in microseconds, averaged over the ranks with
 *   MPI_Reduce; after the timed loop the root's bytes, the exact sums and
 *   each sender's block are checked;
 * - neighbor_allgather, neighbor_alltoall: the same, on a periodic ring of
 *   every rank (MPI_Cart_create, 1 dimension, no reordering; neighbours
 *   rank - 1 then rank + 1): `size` bytes to both neighbours, or a block
 *   of `size` bytes to and from each (block j of rank r filled from
 *   block_pattern(size, r, j), the all-gather's from j = 0); each
 *   neighbour's block is checked;
 * - inter_allreduce (2 ranks or more): the same as allreduce over an
 *   intercommunicator (MPI_Comm_split, MPI_Intercomm_create) between the
 *   ranks below n/2 and the rest; each group's sums of the other's data
 *   are checked;
 * - put_latency, get_latency, acc_latency, fop_latency, cas_latency,
 *   put_bw, get_bw (2 ranks; rma_bench.rs): both allocate a window of
 *   the largest size, WINDOW times that for the bandwidths
 *   (MPI_Win_allocate, disp unit 1); rank 0 runs the warm-up then the
 *   timed operations, with a barrier before and after each size,
 *   synchronised as --sync says (cli.rs's Synchronization, OSU's -s):
 *   flush (the default) locks rank 1 shared for the size and flushes
 *   after each operation (each window of 64, for the bandwidths); lock
 *   puts each operation or window in a lock of its own, then unlocks
 *   (exclusive for fop and cas, shared for the others, as OSU's
 *   run_*_with_lock); latencies report the time per operation (not
 *   halved); acc sums
 *   uint64s (from 8 bytes), fop and cas one uint64 (8 bytes only); the
 *   bandwidths do 64 operations per window, MB/s, operation j moving
 *   the j-th of 64 consecutive size-byte slots at both ends (origin
 *   buffer and target displacement j * size), as OSU's osu_put_bw and
 *   osu_get_bw; the target's window after puts and accumulates, the
 *   gets' data and every fetched value (at the origin) are checked;
 * - win_create (any number of ranks; win_bench.rs): per size, a barrier,
 *   then windows of the size made and freed back to back, the warm-up
 *   ones then the timed ones: MPI_Win_allocate (--flavor allocate, the
 *   default) or MPI_Win_create on one buffer of the largest size
 *   (--flavor create), disp unit 1, then MPI_Win_free; each rank's mean
 *   time per window in microseconds, averaged over the ranks with
 *   MPI_Reduce; then one more window, untimed, whose MPI_WIN_CREATE_FLAVOR
 *   and MPI_WIN_SIZE are checked (not its memory: MPI does not promise
 *   zeroed memory, and Open MPI's osc pt2pt gives it unzeroed, where
 *   win_bench.rs checks oxmpi's own promise);
 *   its default counts are 200 timed windows after 20 up to 8 KiB, 50
 *   after 5 above (cli.rs's WIN_CREATE_COUNTS);
 * - output (rank 0): `#` header lines (one `# library: ...`), the column
 *   header, then one line per size, the size in 10 columns and each
 *   figure in 18 with 2 decimals, as oxbench prints it.
 *
 * Errors in MPI calls abort the job (MPI's default error handler); a bad
 * command line exits with status 2 before MPI is initialized.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64
#define LARGE_MESSAGE_SIZE 8192
#define ITERATIONS_SMALL 10000
#define ITERATIONS_LARGE 1000
#define WARMUP_SMALL 100
#define WARMUP_LARGE 10
#define WIN_CREATE_ITERATIONS_SMALL 200
#define WIN_CREATE_ITERATIONS_LARGE 50
#define WIN_CREATE_WARMUP_SMALL 20
#define WIN_CREATE_WARMUP_LARGE 5
#define DEFAULT_MAX_SIZE ((size_t)4 << 20)
#define SIZE_LIMIT ((size_t)64 << 20)
#define ALIGNMENT 4096
#define PERIOD 251
#define ACK_SIZE 4

#define TAG_SYNC 1
#define TAG_DATA 2
#define TAG_ACK 3
#define TAG_TIME 4

enum benchmark {
    LATENCY,
    BANDWIDTH,
    BIBANDWIDTH,
    MULTI_BANDWIDTH,
    MULTI_LATENCY,
    BARRIER,
    BCAST,
    ALLREDUCE,
    ALLTOALL,
    NEIGHBOR_ALLGATHER,
    NEIGHBOR_ALLTOALL,
    INTER_ALLREDUCE,
    PUT_LATENCY,
    GET_LATENCY,
    ACC_LATENCY,
    FOP_LATENCY,
    CAS_LATENCY,
    PUT_BW,
    GET_BW,
    WIN_CREATE
};

static const char *const names[] = {"latency",
                                    "bw",
                                    "bibw",
                                    "mbw_mr",
                                    "multi_lat",
                                    "barrier",
                                    "bcast",
                                    "allreduce",
                                    "alltoall",
                                    "neighbor_allgather",
                                    "neighbor_alltoall",
                                    "inter_allreduce",
                                    "put_latency",
                                    "get_latency",
                                    "acc_latency",
                                    "fop_latency",
                                    "cas_latency",
                                    "put_bw",
                                    "get_bw",
                                    "win_create"};
static const char *const descriptions[] = {"latency",
                                           "bandwidth",
                                           "bi-directional bandwidth",
                                           "multiple bandwidth / message rate",
                                           "multi-pair latency",
                                           "barrier latency",
                                           "broadcast latency",
                                           "all-reduce latency",
                                           "all-to-all latency",
                                           "neighbourhood all-gather latency",
                                           "neighbourhood all-to-all latency",
                                           "intercommunicator all-reduce latency",
                                           "one-sided put latency",
                                           "one-sided get latency",
                                           "one-sided accumulate latency",
                                           "one-sided fetch-and-op latency",
                                           "one-sided compare-and-swap latency",
                                           "one-sided put bandwidth",
                                           "one-sided get bandwidth",
                                           "window creation and free latency"};

static int is_collective(enum benchmark b) { return b >= BARRIER && b <= INTER_ALLREDUCE; }
static int is_rma(enum benchmark b) { return b >= PUT_LATENCY && b <= GET_BW; }
/* The collectives and win_create: any number of ranks, each rank's mean
 * averaged over them. */
static int is_any_ranks(enum benchmark b) { return is_collective(b) || b == WIN_CREATE; }
static int is_latency(enum benchmark b)
{
    return b == LATENCY || b == MULTI_LATENCY || is_any_ranks(b) ||
           (is_rma(b) && b != PUT_BW && b != GET_BW);
}
static int is_multi_pair(enum benchmark b) { return b == MULTI_BANDWIDTH || b == MULTI_LATENCY; }

/* The smallest size a benchmark measures, as cli.rs's Benchmark::min_size. */
static size_t min_size_of(enum benchmark b)
{
    switch (b) {
    case LATENCY:
    case MULTI_LATENCY:
    case BARRIER:
        return 0;
    case ALLREDUCE:
    case INTER_ALLREDUCE:
        return sizeof(float);
    case ACC_LATENCY:
    case FOP_LATENCY:
    case CAS_LATENCY:
        return sizeof(uint64_t);
    default:
        return 1;
    }
}

/* How the one-sided benchmarks synchronise, as cli.rs's Synchronization. */
enum sync { SYNC_FLUSH, SYNC_LOCK };
static const char *const sync_names[] = {"flush", "lock"};

/* Which window win_create makes, as cli.rs's WindowFlavor. */
enum flavor { FLAVOR_ALLOCATE, FLAVOR_CREATE };
static const char *const flavor_names[] = {"allocate", "create"};

struct options {
    enum benchmark benchmark;
    enum sync sync;
    enum flavor flavor;
    size_t min_size;
    size_t max_size;
    long iterations, iterations_large;
    long warmup, warmup_large;
};

static const char usage[] =
    "usage: mpiexec -n 2 peer_bench latency|bw|bibw|mbw_mr|multi_lat|barrier|bcast|\n"
    "       allreduce|alltoall|neighbor_allgather|neighbor_alltoall|inter_allreduce|\n"
    "       put_latency|get_latency|acc_latency|fop_latency|\n"
    "       cas_latency|put_bw|get_bw|win_create [--min-size N]\n"
    "       [--max-size N] [--size N] [--iterations N] [--iterations-large N]\n"
    "       [--warmup N] [--warmup-large N] [--sync flush|lock]\n"
    "       [--flavor allocate|create]\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "peer_bench: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", usage);
    return 0;
}

/* Parses a size: decimal bytes, then nothing, B, K/k/KiB, M/m/MiB or
 * G/g/GiB. */
static int parse_size(const char *text, size_t *out)
{
    size_t value = 0;
    const char *p = text;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        size_t digit = (size_t)(*p - '0');
        if (value > ((size_t)-1 - digit) / 10)
            return 0;
        value = value * 10 + digit;
    }
    int shift;
    if (!strcmp(p, "") || !strcmp(p, "B"))
        shift = 0;
    else if (!strcmp(p, "K") || !strcmp(p, "k") || !strcmp(p, "KiB"))
        shift = 10;
    else if (!strcmp(p, "M") || !strcmp(p, "m") || !strcmp(p, "MiB"))
        shift = 20;
    else if (!strcmp(p, "G") || !strcmp(p, "g") || !strcmp(p, "GiB"))
        shift = 30;
    else
        return 0;
    if (value > ((size_t)-1 >> shift))
        return 0;
    *out = value << shift;
    return 1;
}

static int parse_count(const char *text, long *out)
{
    char *end;
    if (*text < '0' || *text > '9')
        return 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (*end != '\0' || value > 1000000000000ULL)
        return 0;
    *out = (long)value;
    return 1;
}

/* Parses the command line into `o`; prints what is wrong and returns 0 if
 * it is bad. */
static int parse(int argc, char **argv, struct options *o)
{
    int have_min = 0, have_max = 0, have_size = 0, have_sync = 0, have_flavor = 0, found = 0;
    size_t size = 0;
    long iterations = -1, iterations_large = -1, warmup = -1, warmup_large = -1;
    if (argc < 2)
        return usage_error("no benchmark given", NULL);
    for (int b = LATENCY; b <= WIN_CREATE; b++) {
        if (!strcmp(argv[1], names[b])) {
            o->benchmark = (enum benchmark)b;
            found = 1;
        }
    }
    if (!found)
        return usage_error("unknown benchmark:", argv[1]);
    o->min_size = min_size_of(o->benchmark);
    o->max_size = DEFAULT_MAX_SIZE;
    o->sync = SYNC_FLUSH;
    o->flavor = FLAVOR_ALLOCATE;
    for (int i = 2; i < argc; i++) {
        char name[32];
        const char *value;
        const char *eq = strchr(argv[i], '=');
        if (!strncmp(argv[i], "--", 2) && eq && (size_t)(eq - argv[i]) < sizeof name) {
            memcpy(name, argv[i], (size_t)(eq - argv[i]));
            name[eq - argv[i]] = '\0';
            value = eq + 1;
        } else if (strlen(argv[i]) < sizeof name) {
            strcpy(name, argv[i]);
            if (i + 1 >= argc)
                return usage_error("this option needs a value:", argv[i]);
            value = argv[++i];
        } else {
            return usage_error("unknown option", argv[i]);
        }
        if (!strcmp(name, "--min-size")) {
            if (!parse_size(value, &o->min_size))
                return usage_error("not a size (bytes, or with K, M or G):", value);
            have_min = 1;
        } else if (!strcmp(name, "--max-size")) {
            if (!parse_size(value, &o->max_size))
                return usage_error("not a size (bytes, or with K, M or G):", value);
            have_max = 1;
        } else if (!strcmp(name, "--size")) {
            if (!parse_size(value, &size))
                return usage_error("not a size (bytes, or with K, M or G):", value);
            have_size = 1;
        } else if (!strcmp(name, "--iterations")) {
            if (!parse_count(value, &iterations) || iterations == 0)
                return usage_error("--iterations takes a whole number of at least 1, not", value);
        } else if (!strcmp(name, "--iterations-large")) {
            if (!parse_count(value, &iterations_large) || iterations_large == 0)
                return usage_error("--iterations-large takes a whole number of at least 1, not",
                                   value);
        } else if (!strcmp(name, "--warmup")) {
            if (!parse_count(value, &warmup))
                return usage_error("--warmup takes a whole number, not", value);
        } else if (!strcmp(name, "--warmup-large")) {
            if (!parse_count(value, &warmup_large))
                return usage_error("--warmup-large takes a whole number, not", value);
        } else if (!strcmp(name, "--sync")) {
            if (!strcmp(value, sync_names[SYNC_FLUSH]))
                o->sync = SYNC_FLUSH;
            else if (!strcmp(value, sync_names[SYNC_LOCK]))
                o->sync = SYNC_LOCK;
            else
                return usage_error("--sync takes flush or lock, not", value);
            have_sync = 1;
        } else if (!strcmp(name, "--flavor")) {
            if (!strcmp(value, flavor_names[FLAVOR_ALLOCATE]))
                o->flavor = FLAVOR_ALLOCATE;
            else if (!strcmp(value, flavor_names[FLAVOR_CREATE]))
                o->flavor = FLAVOR_CREATE;
            else
                return usage_error("--flavor takes allocate or create, not", value);
            have_flavor = 1;
        } else {
            return usage_error("unknown option", name);
        }
    }
    int windows = o->benchmark == WIN_CREATE;
    o->iterations = iterations >= 0 ? iterations
                    : windows       ? WIN_CREATE_ITERATIONS_SMALL
                                    : ITERATIONS_SMALL;
    o->iterations_large = iterations_large >= 0 ? iterations_large
                          : iterations >= 0     ? iterations
                          : windows             ? WIN_CREATE_ITERATIONS_LARGE
                                                : ITERATIONS_LARGE;
    o->warmup = warmup >= 0 ? warmup : windows ? WIN_CREATE_WARMUP_SMALL : WARMUP_SMALL;
    o->warmup_large = warmup_large >= 0 ? warmup_large
                      : warmup >= 0     ? warmup
                      : windows         ? WIN_CREATE_WARMUP_LARGE
                                        : WARMUP_LARGE;
    if (have_size) {
        if (have_min || have_max)
            return usage_error("--size cannot be combined with --min-size or --max-size", NULL);
        o->min_size = o->max_size = size;
    }
    if (o->max_size > SIZE_LIMIT)
        return usage_error("message sizes are limited to 64 MiB", NULL);
    if (o->min_size > o->max_size)
        return usage_error("the smallest size is larger than the largest", NULL);
    if (o->min_size < min_size_of(o->benchmark))
        return usage_error("messages are too small for this benchmark", NULL);
    if (have_sync && !is_rma(o->benchmark))
        return usage_error("--sync is for the one-sided benchmarks only", NULL);
    if (have_flavor && o->benchmark != WIN_CREATE)
        return usage_error("--flavor is for win_create only", NULL);
    if (o->benchmark == BARRIER)
        o->min_size = o->max_size = 0;
    if (o->benchmark == FOP_LATENCY || o->benchmark == CAS_LATENCY)
        o->min_size = o->max_size = sizeof(uint64_t);
    return 1;
}

static long iterations_for(const struct options *o, size_t size)
{
    return size > LARGE_MESSAGE_SIZE ? o->iterations_large : o->iterations;
}

static long warmup_for(const struct options *o, size_t size)
{
    return size > LARGE_MESSAGE_SIZE ? o->warmup_large : o->warmup;
}

static void fail(const char *what, size_t size)
{
    fprintf(stderr, "peer_bench: %s (%zu-byte messages)\n", what, size);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* A zeroed page-aligned buffer of `len` bytes (at least one page, so that
 * a zero length still gives a valid pointer). */
static char *aligned_buffer(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, ALIGNMENT, len ? len : ALIGNMENT) != 0)
        fail("cannot allocate the message buffers", len);
    memset(p, 0, len);
    return p;
}

/* The pattern of a message of `size` bytes, as oxbench's buffers.rs. */
static void fill_pattern(char *buf, size_t len, size_t size)
{
    size_t first = size % PERIOD;
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)((first + i) % PERIOD + 1);
}

/* Checks that `received` holds `count` copies of `expected`. */
static void check_messages(const char *received, size_t count, const char *expected, size_t size)
{
    for (size_t m = 0; m < count; m++) {
        const char *got = received + m * size;
        if (memcmp(got, expected, size) != 0) {
            size_t byte = 0;
            while (got[byte] == expected[byte])
                byte++;
            fprintf(stderr, "peer_bench: received data is wrong: byte %zu of message %zu\n", byte, m);
            fail("received data is wrong", size);
        }
    }
}

static void check_count(MPI_Status *status, size_t size)
{
    int count;
    MPI_Get_count(status, MPI_BYTE, &count);
    if ((size_t)count != size)
        fail("a message arrived with the wrong byte count", size);
}

static void receive_exact(void *buf, size_t size, int peer, int tag)
{
    MPI_Status status;
    MPI_Recv(buf, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &status);
    check_count(&status, size);
}

/* Every rank reports to rank 0 with one byte, then rank 0 answers each. */
static void sync_all(int rank, int ranks)
{
    char token = 0, incoming;
    if (rank == 0) {
        for (int r = 1; r < ranks; r++)
            receive_exact(&incoming, 1, r, TAG_SYNC);
        for (int r = 1; r < ranks; r++)
            MPI_Send(&token, 1, MPI_BYTE, r, TAG_SYNC, MPI_COMM_WORLD);
    } else {
        MPI_Send(&token, 1, MPI_BYTE, 0, TAG_SYNC, MPI_COMM_WORLD);
        receive_exact(&incoming, 1, 0, TAG_SYNC);
    }
}

/* One window: WINDOW immediate receives of `size` bytes into consecutive
 * buffers of `window` (if not NULL), WINDOW immediate sends of `message`
 * (if not NULL), then a wait for all of them. */
static void exchange_window(int peer, const char *message, char *window, size_t size)
{
    MPI_Request requests[2 * WINDOW];
    MPI_Status statuses[2 * WINDOW];
    int n = 0;
    if (window)
        for (int k = 0; k < WINDOW; k++)
            MPI_Irecv(window + (size_t)k * size, (int)size, MPI_BYTE, peer, TAG_DATA,
                      MPI_COMM_WORLD, &requests[n++]);
    if (message)
        for (int k = 0; k < WINDOW; k++)
            MPI_Isend(message, (int)size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD,
                      &requests[n++]);
    MPI_Waitall(n, requests, statuses);
    if (window)
        for (int k = 0; k < WINDOW; k++)
            check_count(&statuses[k], size);
}

/* One iteration of the benchmark in this rank. */
static void step(enum benchmark b, int peer, int initiator, const char *message, char *received,
                 size_t size)
{
    char ack[ACK_SIZE] = {0};
    switch (b) {
    case LATENCY:
    case MULTI_LATENCY:
        if (initiator) {
            MPI_Send(message, (int)size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD);
            receive_exact(received, size, peer, TAG_DATA);
        } else {
            receive_exact(received, size, peer, TAG_DATA);
            MPI_Send(message, (int)size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD);
        }
        break;
    case BANDWIDTH:
    case MULTI_BANDWIDTH:
        if (initiator) {
            exchange_window(peer, message, NULL, size);
            receive_exact(ack, ACK_SIZE, peer, TAG_ACK);
        } else {
            exchange_window(peer, NULL, received, size);
            MPI_Send(ack, ACK_SIZE, MPI_BYTE, peer, TAG_ACK, MPI_COMM_WORLD);
        }
        break;
    case BIBANDWIDTH:
        exchange_window(peer, message, received, size);
        break;
    default:
        fail("not a point-to-point benchmark", size);
    }
}

/* Whether this rank receives windows of messages at once. */
static int receives_windows(enum benchmark b, int initiator)
{
    return b == BIBANDWIDTH || ((b == BANDWIDTH || b == MULTI_BANDWIDTH) && !initiator);
}

static size_t receive_len(enum benchmark b, int initiator, size_t size)
{
    if (receives_windows(b, initiator))
        return size * WINDOW;
    return is_latency(b) ? size : 0;
}

/* The library's name and version: the first line of
 * MPI_Get_library_version, up to its first comma, blanks collapsed. */
static void library_version(char *out, size_t len)
{
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    size_t j = 0;
    MPI_Get_library_version(text, &n);
    for (int i = 0; i < n && text[i] && text[i] != '\n' && text[i] != ','; i++) {
        int blank = text[i] == ' ' || text[i] == '\t' || text[i] == '\r';
        if (blank && (j == 0 || out[j - 1] == ' '))
            continue;
        if (j + 1 < len)
            out[j++] = blank ? ' ' : text[i];
    }
    while (j > 0 && out[j - 1] == ' ')
        j--;
    out[j] = '\0';
}

static void describe_counts(char *out, size_t len, long small, long large)
{
    if (small == large)
        snprintf(out, len, "%ld", small);
    else
        snprintf(out, len, "%ld (\u2264 %d B), %ld (larger)", small, LARGE_MESSAGE_SIZE, large);
}

/* Whether the benchmark's lock on the target is exclusive, as cli.rs's
 * Synchronization::exclusive. */
static int lock_is_exclusive(const struct options *o)
{
    return o->sync == SYNC_LOCK && (o->benchmark == FOP_LATENCY || o->benchmark == CAS_LATENCY);
}

/* The one-sided benchmarks' header line, in the words of cli.rs's
 * Synchronization::describe. */
static void print_rma_sync(const struct options *o)
{
    char operations[64];
    const char *lock = lock_is_exclusive(o) ? "an exclusive" : "a shared";
    if (is_latency(o->benchmark))
        snprintf(operations, sizeof operations, "each operation");
    else
        snprintf(operations, sizeof operations, "%d operations to consecutive slots", WINDOW);
    if (o->sync == SYNC_LOCK)
        printf("# window: allocated; sync: lock (%s in %s lock of its own on the target, then "
               "an unlock)\n",
               operations, lock);
    else
        printf("# window: allocated; sync: flush (%s lock on the target per size; %s, then a "
               "flush)\n",
               lock, operations);
}

static void print_header(const struct options *o, int ranks)
{
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    char iterations[64], warmup[64];
    enum benchmark b = o->benchmark;
    library_version(version, sizeof version);
    describe_counts(iterations, sizeof iterations, o->iterations, o->iterations_large);
    describe_counts(warmup, sizeof warmup, o->warmup, o->warmup_large);
    printf("# MPI %s test\n", descriptions[b]);
    printf("# library: %s\n", version);
    printf("# ranks: %d; iterations: %s; warm-up: %s\n", ranks, iterations, warmup);
    if (is_multi_pair(b))
        printf("# pairs: %d (rank i with rank i + %d), running at once\n", ranks / 2, ranks / 2);
    if (b == WIN_CREATE)
        printf("# window: %s (%s, then MPI_Win_free, back to back over every rank; the figure "
               "is each rank's mean time per window, averaged over the ranks)\n",
               flavor_names[o->flavor],
               o->flavor == FLAVOR_CREATE ? "MPI_Win_create on a buffer of the largest size"
                                          : "MPI_Win_allocate");
    else if (is_collective(b))
        printf("# each operation timed alone, then an untimed barrier; the figure is each "
               "rank's mean time per operation, averaged over the ranks\n");
    else if (is_rma(b))
        print_rma_sync(o);
    else if (b == BIBANDWIDTH)
        printf("# window: %d immediate sends each way at once\n", WINDOW);
    else if (!is_latency(b))
        printf("# window: %d immediate sends, then a %d-byte acknowledgement\n", WINDOW, ACK_SIZE);
    /* The communicator's shape, as coll_bench.rs's communicator() says it. */
    if (b == NEIGHBOR_ALLGATHER || b == NEIGHBOR_ALLTOALL)
        printf("# topology: a periodic ring of every rank (1-d Cartesian); blocks to and from "
               "rank - 1 and rank + 1\n");
    else if (b == INTER_ALLREDUCE)
        printf("# groups: ranks below N/2 and the rest, over an intercommunicator; each gets the "
               "sums of the other's data\n");
    if (is_any_ranks(b))
        printf("%-10s%18s\n", "# Size", "Avg Latency (us)");
    else if (is_latency(b))
        printf("%-10s%18s\n", "# Size", "Latency (us)");
    else if (b == MULTI_BANDWIDTH)
        printf("%-10s%18s%18s\n", "# Size", "MB/s", "Messages/s");
    else
        printf("%-10s%18s\n", "# Size", "Bandwidth (MB/s)");
    fflush(stdout);
}

/* The pattern's start for the alltoall block from `from` to `to`, as
 * coll_bench.rs's block_pattern. */
static size_t block_pattern(size_t size, int from, int to)
{
    return size + 7 * (size_t)from + 13 * (size_t)to;
}

/* Element `i` of `rank`'s allreduce input: small integers, whose sums are
 * exact in float in any order. */
static float addend(size_t i, int rank) { return (float)((i + (size_t)rank) % 16); }

/* The tag of the leaders' messages when inter_allreduce makes its
 * intercommunicator, as coll_bench.rs's INTER_TAG. */
#define INTER_TAG 77

/* The communicator a collective benchmark operates on, as coll_bench.rs's
 * communicator(): a periodic ring of every rank for the neighbourhood
 * ones, an intercommunicator between the ranks below n/2 and the rest for
 * inter_allreduce, else world. */
static MPI_Comm communicator(enum benchmark b, int rank, int ranks)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    if (b == NEIGHBOR_ALLGATHER || b == NEIGHBOR_ALLTOALL) {
        int dims[1] = {ranks}, periods[1] = {1};
        MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &comm);
    } else if (b == INTER_ALLREDUCE) {
        int half = ranks / 2, in_first = rank < half;
        MPI_Comm local;
        MPI_Comm_split(MPI_COMM_WORLD, in_first, 0, &local);
        MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, in_first ? half : 0, INTER_TAG, &comm);
        MPI_Comm_free(&local);
    }
    return comm;
}

/* One operation of a collective benchmark with data, over `comm`. */
static void operate(enum benchmark b, MPI_Comm comm, char *send, char *receive, float *floats,
                    float *sums, size_t size)
{
    switch (b) {
    case BCAST:
        MPI_Bcast(send, (int)size, MPI_BYTE, 0, comm);
        break;
    case ALLREDUCE:
    case INTER_ALLREDUCE:
        MPI_Allreduce(floats, sums, (int)(size / sizeof(float)), MPI_FLOAT, MPI_SUM, comm);
        break;
    case ALLTOALL:
        MPI_Alltoall(send, (int)size, MPI_BYTE, receive, (int)size, MPI_BYTE, comm);
        break;
    case NEIGHBOR_ALLGATHER:
        MPI_Neighbor_allgather(send, (int)size, MPI_BYTE, receive, (int)size, MPI_BYTE, comm);
        break;
    case NEIGHBOR_ALLTOALL:
        MPI_Neighbor_alltoall(send, (int)size, MPI_BYTE, receive, (int)size, MPI_BYTE, comm);
        break;
    default:
        fail("not a collective with data", size);
    }
}

/* The collective benchmarks: see the comment at the top. */
static void run_collective(const struct options *o, int rank, int ranks)
{
    enum benchmark b = o->benchmark;
    size_t max = o->max_size;
    int neighborhood = b == NEIGHBOR_ALLGATHER || b == NEIGHBOR_ALLTOALL;
    size_t bytes = b == BCAST || b == NEIGHBOR_ALLGATHER ? max
                   : b == ALLTOALL                       ? max * (size_t)ranks
                   : b == NEIGHBOR_ALLTOALL              ? 2 * max
                                                         : 0;
    size_t received_bytes = b == ALLTOALL ? bytes : neighborhood ? 2 * max : 0;
    size_t count_max = b == ALLREDUCE || b == INTER_ALLREDUCE ? max / sizeof(float) : 0;
    /* inter_allreduce sums the other group's data. */
    int half = ranks / 2;
    int summed_from = b == INTER_ALLREDUCE && rank < half ? half : 0;
    int summed_to = b == INTER_ALLREDUCE && rank >= half ? half : ranks;
    /* The ring's neighbours: rank - 1, then rank + 1. */
    int neighbors[2] = {(rank + ranks - 1) % ranks, (rank + 1) % ranks};
    MPI_Comm comm = communicator(b, rank, ranks);
    char *send = aligned_buffer(bytes);
    char *receive = aligned_buffer(received_bytes);
    char *expected = aligned_buffer(max);
    float *floats = malloc(sizeof(float) * (count_max ? count_max : 1));
    float *sums = malloc(sizeof(float) * (count_max ? count_max : 1));
    if (!floats || !sums)
        fail("cannot allocate the all-reduce buffers", max);
    for (size_t size = o->min_size; size <= max; size = size ? size * 2 : 1) {
        long iterations = iterations_for(o, size);
        long warmup = warmup_for(o, size);
        size_t count = size / sizeof(float);
        if (b == BCAST) {
            if (rank == 0)
                fill_pattern(send, size, size);
            else
                memset(send, 0, size);
        } else if (b == ALLTOALL) {
            for (int to = 0; to < ranks; to++)
                fill_pattern(send + (size_t)to * size, size, block_pattern(size, rank, to));
            memset(receive, 0, size * (size_t)ranks);
        } else if (b == NEIGHBOR_ALLGATHER) {
            fill_pattern(send, size, block_pattern(size, rank, 0));
            memset(receive, 0, 2 * size);
        } else if (b == NEIGHBOR_ALLTOALL) {
            for (int slot = 0; slot < 2; slot++)
                fill_pattern(send + (size_t)slot * size, size, block_pattern(size, rank, slot));
            memset(receive, 0, 2 * size);
        } else if (b == ALLREDUCE || b == INTER_ALLREDUCE) {
            for (size_t i = 0; i < count; i++)
                floats[i] = addend(i, rank);
            memset(sums, 0, sizeof(float) * count);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double seconds = 0;
        if (b == BARRIER) {
            for (long i = 0; i < warmup; i++)
                MPI_Barrier(MPI_COMM_WORLD);
            double start = MPI_Wtime();
            for (long i = 0; i < iterations; i++)
                MPI_Barrier(MPI_COMM_WORLD);
            seconds = MPI_Wtime() - start;
        } else {
            for (long i = 0; i < warmup + iterations; i++) {
                double start = MPI_Wtime();
                operate(b, comm, send, receive, floats, sums, size);
                if (i >= warmup)
                    seconds += MPI_Wtime() - start;
                MPI_Barrier(MPI_COMM_WORLD);
            }
        }
        if (b == BCAST) {
            fill_pattern(expected, size, size);
            check_messages(send, size ? 1 : 0, expected, size);
        } else if (b == ALLTOALL) {
            for (int from = 0; from < ranks; from++) {
                fill_pattern(expected, size, block_pattern(size, from, rank));
                check_messages(receive + (size_t)from * size, size ? 1 : 0, expected, size);
            }
        } else if (neighborhood) {
            /* From rank - 1 comes what it sent to its rank + 1 (its block 1
             * of an all-to-all), from rank + 1 its block 0. */
            for (int slot = 0; slot < 2; slot++) {
                int sent = b == NEIGHBOR_ALLTOALL ? 1 - slot : 0;
                fill_pattern(expected, size, block_pattern(size, neighbors[slot], sent));
                check_messages(receive + (size_t)slot * size, size ? 1 : 0, expected, size);
            }
        } else if (b == ALLREDUCE || b == INTER_ALLREDUCE) {
            for (size_t i = 0; i < count; i++) {
                float exact = 0;
                for (int k = summed_from; k < summed_to; k++)
                    exact += addend(i, k);
                if (sums[i] != exact)
                    fail("an all-reduce sum is not exact", size);
            }
        }
        double mean_us = seconds * 1e6 / (double)iterations, sum = 0;
        MPI_Reduce(&mean_us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%-10zu%18.2f\n", size, sum / ranks);
            fflush(stdout);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm != MPI_COMM_WORLD)
        MPI_Comm_free(&comm);
    free(floats);
    free(sums);
    free(send);
    free(receive);
    free(expected);
}

/* One operation of a one-sided benchmark (a window of them for the
 * bandwidths), completed as --sync says: in a lock of its own, then an
 * unlock, or (the lock held for the size) followed by a flush; `i`
 * numbers it within the size. */
static void rma_operate(const struct options *o, MPI_Win win, const char *origin, char *results,
                        uint64_t *ones, size_t size, long i)
{
    enum benchmark b = o->benchmark;
    uint64_t one = 1, old = 0, compare = (uint64_t)i, swap = (uint64_t)i + 1;
    if (o->sync == SYNC_LOCK)
        MPI_Win_lock(lock_is_exclusive(o) ? MPI_LOCK_EXCLUSIVE : MPI_LOCK_SHARED, 1, 0, win);
    switch (b) {
    case PUT_LATENCY:
        MPI_Put(origin, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
        break;
    case GET_LATENCY:
        MPI_Get(results, (int)size, MPI_BYTE, 1, 0, (int)size, MPI_BYTE, win);
        break;
    case ACC_LATENCY:
        MPI_Accumulate(ones, (int)(size / 8), MPI_UINT64_T, 1, 0, (int)(size / 8), MPI_UINT64_T,
                       MPI_SUM, win);
        break;
    case FOP_LATENCY:
        MPI_Fetch_and_op(&one, &old, MPI_UINT64_T, 1, 0, MPI_SUM, win);
        break;
    case CAS_LATENCY:
        MPI_Compare_and_swap(&swap, &compare, &old, MPI_UINT64_T, 1, 0, win);
        break;
    case PUT_BW:
        for (int w = 0; w < WINDOW; w++)
            MPI_Put(origin + (size_t)w * size, (int)size, MPI_BYTE, 1, (MPI_Aint)(w * size),
                    (int)size, MPI_BYTE, win);
        break;
    case GET_BW:
        for (int w = 0; w < WINDOW; w++)
            MPI_Get(results + (size_t)w * size, (int)size, MPI_BYTE, 1, (MPI_Aint)(w * size),
                    (int)size, MPI_BYTE, win);
        break;
    default:
        fail("not a one-sided benchmark", size);
    }
    if (o->sync == SYNC_LOCK)
        MPI_Win_unlock(1, win);
    else
        MPI_Win_flush(1, win);
    if ((b == FOP_LATENCY || b == CAS_LATENCY) && old != (uint64_t)i)
        fail("a fetched value is wrong", size);
}

/* The one-sided benchmarks: see the comment at the top. */
static void run_rma(const struct options *o, int rank)
{
    enum benchmark b = o->benchmark;
    size_t max = o->max_size;
    /* The slots an operation's data may take at each end: one, or the
     * bandwidths' window of them. */
    size_t slots = is_latency(b) ? 1 : WINDOW;
    size_t window_len = slots * max < 8 ? 8 : slots * max;
    char *base;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)window_len, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    char *origin = aligned_buffer(slots * max);
    char *results = aligned_buffer(b == GET_BW || b == GET_LATENCY ? slots * max : 0);
    size_t ones_len = max < 8 ? 8 : max;
    uint64_t *ones = malloc(ones_len);
    if (!ones)
        fail("cannot allocate the accumulate's data", max);
    for (size_t k = 0; k < ones_len / 8; k++)
        ones[k] = 1;
    for (size_t size = o->min_size; size <= max; size = size ? size * 2 : 1) {
        long iterations = iterations_for(o, size);
        long warmup = warmup_for(o, size);
        long total = warmup + iterations;
        for (size_t slot = 0; slot < slots; slot++)
            fill_pattern(origin + slot * size, size, size);
        if (rank == 1) {
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
            if (b == GET_LATENCY || b == GET_BW)
                memcpy(base, origin, slots * size);
            else
                memset(base, 0, slots * size);
            MPI_Win_unlock(1, win);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            if (o->sync == SYNC_FLUSH)
                MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
            double start = MPI_Wtime();
            for (long i = 0; i < total; i++) {
                if (i == warmup)
                    start = MPI_Wtime();
                rma_operate(o, win, origin, results, ones, size, i);
            }
            double seconds = MPI_Wtime() - start;
            if (o->sync == SYNC_FLUSH)
                MPI_Win_unlock(1, win);
            if (b == GET_LATENCY || b == GET_BW)
                check_messages(results, slots, origin, size);
            printf("%-10zu%18.2f\n", size,
                   slots > 1 ? (double)size * WINDOW * (double)iterations / seconds / 1e6
                            : seconds * 1e6 / (double)iterations);
            fflush(stdout);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 1) {
            MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
            if (b == PUT_LATENCY || b == PUT_BW)
                check_messages(base, slots, origin, size);
            for (size_t k = 0; b == ACC_LATENCY && k < size / 8; k++) {
                uint64_t value;
                memcpy(&value, base + 8 * k, 8);
                if (value != (uint64_t)total)
                    fail("the target's window is wrong after the operations", size);
            }
            MPI_Win_unlock(1, win);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    free(ones);
    free(origin);
    free(results);
}

/* Makes a window of `size` bytes in the flavour asked for (a created one
 * on the start of `lent`); checks its flavour and size if `check`; frees
 * it. */
static void make_window(const struct options *o, size_t size, char *lent, int check)
{
    MPI_Win win;
    char *base;
    if (o->flavor == FLAVOR_CREATE)
        MPI_Win_create(lent, (MPI_Aint)size, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    else
        MPI_Win_allocate((MPI_Aint)size, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    if (check) {
        int *flavor, flag_flavor, flag_size;
        MPI_Aint *win_size;
        MPI_Win_get_attr(win, MPI_WIN_CREATE_FLAVOR, &flavor, &flag_flavor);
        MPI_Win_get_attr(win, MPI_WIN_SIZE, &win_size, &flag_size);
        int expected = o->flavor == FLAVOR_CREATE ? MPI_WIN_FLAVOR_CREATE : MPI_WIN_FLAVOR_ALLOCATE;
        if (!flag_flavor || !flag_size || *flavor != expected || *win_size != (MPI_Aint)size)
            fail("the window is not of the flavour and size asked for", size);
    }
    MPI_Win_free(&win);
}

static void run_win_create(const struct options *o, int rank, int ranks)
{
    size_t max = o->max_size;
    /* The memory a created window lends, zeroed (so touched) now. */
    char *lent = aligned_buffer(o->flavor == FLAVOR_CREATE ? max : 0);
    for (size_t size = o->min_size; size <= max; size = size ? size * 2 : 1) {
        long iterations = iterations_for(o, size);
        long warmup = warmup_for(o, size);
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        for (long i = 0; i < warmup + iterations; i++) {
            if (i == warmup)
                start = MPI_Wtime();
            make_window(o, size, lent, 0);
        }
        double seconds = MPI_Wtime() - start;
        make_window(o, size, lent, 1);
        double mean_us = seconds * 1e6 / (double)iterations, sum = 0;
        MPI_Reduce(&mean_us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%-10zu%18.2f\n", size, sum / ranks);
            fflush(stdout);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(lent);
}

int main(int argc, char **argv)
{
    struct options o;
    int rank, ranks;
    if (!parse(argc, argv, &o))
        return 2;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    enum benchmark b = o.benchmark;
    if (b == INTER_ALLREDUCE && ranks < 2) {
        fprintf(stderr,
                "peer_bench: inter_allreduce needs 2 or more ranks (two groups), this job has %d\n",
                ranks);
        MPI_Finalize();
        return 1;
    }
    if (is_any_ranks(b)) {
        if (rank == 0)
            print_header(&o, ranks);
        if (b == WIN_CREATE)
            run_win_create(&o, rank, ranks);
        else
            run_collective(&o, rank, ranks);
        MPI_Finalize();
        return 0;
    }
    if (is_multi_pair(b) ? (ranks < 2 || ranks % 2) : ranks != 2) {
        if (rank == 0)
            fprintf(stderr, "peer_bench: %s needs %s ranks, this job has %d\n", names[b],
                    is_multi_pair(b) ? "an even number of" : "exactly 2", ranks);
        MPI_Finalize();
        return 1;
    }
    if (rank == 0)
        print_header(&o, ranks);
    if (is_rma(b)) {
        run_rma(&o, rank);
        MPI_Finalize();
        return 0;
    }

    int pairs = ranks / 2;
    int initiator = rank < pairs;
    int peer = initiator ? rank + pairs : rank - pairs;
    size_t max = o.max_size;
    char *send = aligned_buffer(max);
    char *receive = aligned_buffer(receive_len(b, initiator, max));
    double *times = malloc(sizeof(double) * (size_t)pairs);
    if (!times)
        fail("cannot allocate the times", 0);
    for (size_t size = o.min_size; size <= max; size = size ? size * 2 : 1) {
        long iterations = iterations_for(&o, size);
        long warmup = warmup_for(&o, size);
        size_t received_len = receive_len(b, initiator, size);
        fill_pattern(send, size, size);
        memset(receive, 0, received_len);
        sync_all(rank, ranks);
        for (long i = 0; i < warmup; i++)
            step(b, peer, initiator, send, receive, size);
        if (is_multi_pair(b))
            sync_all(rank, ranks);
        double start = MPI_Wtime();
        for (long i = 0; i < iterations; i++)
            step(b, peer, initiator, send, receive, size);
        double seconds = MPI_Wtime() - start;
        if (received_len && size)
            check_messages(receive, received_len / size, send, size);
        if (rank == 0) {
            times[0] = seconds;
            for (int r = 1; r < pairs; r++)
                receive_exact(&times[r], sizeof(double), r, TAG_TIME);
        } else if (initiator) {
            MPI_Send(&seconds, sizeof(double), MPI_BYTE, 0, TAG_TIME, MPI_COMM_WORLD);
        }
        if (rank == 0) {
            double mean = 0;
            for (int r = 0; r < pairs; r++)
                mean += times[r];
            mean /= pairs;
            double window_bytes = (double)size * WINDOW * (double)iterations;
            printf("%-10zu", size);
            switch (b) {
            case LATENCY:
            case MULTI_LATENCY:
                printf("%18.2f\n", mean * 1e6 / (2.0 * (double)iterations));
                break;
            case BANDWIDTH:
                printf("%18.2f\n", window_bytes / mean / 1e6);
                break;
            case BIBANDWIDTH:
                printf("%18.2f\n", 2.0 * window_bytes / mean / 1e6);
                break;
            case MULTI_BANDWIDTH:
                printf("%18.2f%18.2f\n", pairs * window_bytes / mean / 1e6,
                       pairs * WINDOW * (double)iterations / mean);
                break;
            default:
                fail("not a point-to-point benchmark", size);
            }
            fflush(stdout);
        }
    }
    /* Every rank is done before finalizing. */
    sync_all(rank, ranks);
    free(times);
    free(send);
    free(receive);
    MPI_Finalize();
    return 0;
}
