#!/usr/bin/env bash
# The main job: builds oxmpi optimized and runs the benchmarks between two
# ranks on this machine, over every transport present (TCP for now).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/install-deps.sh
cargo build --release --workspace --quiet
bin=target/release
for transport in tcp; do
  echo "== transport: $transport"
  "$bin/oxrun" -n 2 -x OXMPI_TRANSPORTS="$transport" "$bin/oxbench" latency
  "$bin/oxrun" -n 2 -x OXMPI_TRANSPORTS="$transport" "$bin/oxbench" bw
done
echo "== raw TCP between two plain processes (the floor)"
"$bin/oxbench" raw-tcp latency
"$bin/oxbench" raw-tcp bw
