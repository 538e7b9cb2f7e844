#!/usr/bin/env bash
# The main job: builds oxmpi optimized, runs the benchmark suite between two
# ranks over every transport present (with each transport's floor; tables,
# and a plot in target/oxbench-suite.svg), then compares oxmpi with MPICH
# and Open MPI on this machine over TCP and over shared memory, point to
# point and collectives (2 ranks), each figure the median of three
# alternating rounds. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/install-deps.sh
cargo build --release --workspace --quiet
bin=target/release
"$bin/oxbench" suite --svg target/oxbench-suite.svg
counts=(--iterations 2000 --iterations-large 100 --rounds 3)
"$bin/oxbench" compare latency bw bibw --transport tcp "${counts[@]}"
"$bin/oxbench" compare latency bw bibw --transport shm "${counts[@]}"
"$bin/oxbench" compare barrier bcast allreduce alltoall --transport shm --max-size 1M \
    "${counts[@]}"
