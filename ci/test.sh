#!/usr/bin/env bash
# The test command: installs what is needed, checks formatting and lints,
# and runs every test (unit tests and real multi-process jobs via oxrun).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# CI runs as root: the tests that need it (network namespaces, a rank
# under another user) must run, not pass having done nothing.
OXMPI_REQUIRE_PRIVILEGED_TESTS=1 cargo test --workspace 2>&1
# The verbs crate's libibverbs calls, off by default (see its crate docs).
cargo clippy -p oxmpi-verbs --features rdma-core --all-targets --quiet -- -D warnings
cargo test -p oxmpi-verbs --features rdma-core 2>&1
# hw-tests built for the real provider: on a machine with no RDMA device
# it skips, saying why (see hw-tests' crate docs and README.md).
cargo clippy -p oxmpi-hw-tests --features rdma-core --all-targets --quiet -- -D warnings
cargo test -p oxmpi-hw-tests --features rdma-core 2>&1
