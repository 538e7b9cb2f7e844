#!/usr/bin/env bash
# The main job: builds oxmpi optimized, runs the benchmark suite between two
# ranks over every transport present (with the raw TCP floor; tables, and
# a plot in target/oxbench-suite.svg), then compares oxmpi with MPICH and
# Open MPI on this machine, each figure the median of three alternating
# rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/install-deps.sh
cargo build --release --workspace --quiet
bin=target/release
"$bin/oxbench" suite --svg target/oxbench-suite.svg
"$bin/oxbench" compare latency bw bibw --rounds 3 --iterations-large 100
