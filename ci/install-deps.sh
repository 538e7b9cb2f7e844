#!/usr/bin/env bash
# Installs what building and testing oxmpi needs on a fresh Debian machine:
# a C toolchain (for crates with C parts), MPICH, whose mpiexec (hydra) the
# tests use to prove oxmpi programs run under another PMI-1 launcher, and
# MPICH's and Open MPI's compilers and launchers, the peers `oxbench compare`
# measures oxmpi against; hwloc's headers (oxrun's placement, built with
# pkg-config); iproute2, whose `ip netns` the network-namespace job test
# uses; and rdma-core's headers and libclang (bindgen), with which the verbs
# crate's `rdma-core` feature is built and tested (rdma-sys needs
# libibverbs-dev and librdmacm-dev; programs built with it need libibverbs1,
# which libibverbs-dev brings, even on machines with no RDMA device).
# Run as root, or with sudo available.
set -euo pipefail
packages=(build-essential pkg-config libhwloc-dev iproute2 mpich libmpich-dev openmpi-bin libopenmpi-dev
  libibverbs-dev librdmacm-dev libclang-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust (https://rustup.rs) and re-run" >&2
  exit 1
fi
