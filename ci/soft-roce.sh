#!/usr/bin/env bash
# Sets up soft-RoCE (the kernel's rdma_rxe driver) so that oxmpi's
# hardware tests (hw-tests/) can run on a machine with no RDMA NIC, on
# kernels that have rdma_rxe. Everything it makes is inside a network
# namespace of its own: the host's interfaces, addresses and routes are
# never touched.
#
#   ci/soft-roce.sh [up]   loads rdma_rxe; creates the network namespace
#                          oxmpi-rxe, a veth pair inside it (oxrxe-a with
#                          10.232.0.1/30, oxrxe-b with 10.232.0.2/30) and
#                          the soft-RoCE device oxrxe0 on oxrxe-a
#   ci/soft-roce.sh down   removes the device and the namespace (with the
#                          veth pair in it); leaves the module loaded
#   ci/soft-roce.sh check  only says whether this kernel has rdma_rxe
#
# up and down need root. Exit status: 0 done; 1 a command failed, or a bad
# argument; 2 this machine cannot have soft-RoCE (no rdma_rxe module, or
# no ip or rdma command): nothing was changed.
set -Eeuo pipefail

NS=oxmpi-rxe
VETH_A=oxrxe-a
VETH_B=oxrxe-b
ADDR_A=10.232.0.1/30
ADDR_B=10.232.0.2/30
RXE=oxrxe0

say() { echo "soft-roce: $*"; }
die() {
  local status=$1
  shift
  echo "soft-roce: error: $*" >&2
  exit "$status"
}

# Runs a command, showing it first.
run() {
  echo "+ $*"
  "$@"
}

require_tools() {
  local tool
  for tool in ip rdma; do
    command -v "$tool" >/dev/null 2>&1 ||
      die 2 "the '$tool' command is missing: install iproute2 (Debian: apt-get install iproute2)"
  done
}

# Whether the running kernel has rdma_rxe: loaded (or built in), or a
# module file for it in the kernel's module tree.
have_rxe() {
  [ -d /sys/module/rdma_rxe ] && return 0
  if command -v modinfo >/dev/null 2>&1 && modinfo rdma_rxe >/dev/null 2>&1; then
    return 0
  fi
  local dir
  dir="/lib/modules/$(uname -r)"
  [ -d "$dir" ] || return 1
  grep -q '/rdma_rxe\.ko' "$dir/modules.builtin" 2>/dev/null && return 0
  [ -n "$(find "$dir" -name 'rdma_rxe.ko*' -print -quit 2>/dev/null)" ]
}

require_rxe() {
  have_rxe || die 2 "this kernel ($(uname -r)) has no soft-RoCE: the rdma_rxe module is \
neither loaded nor in /lib/modules/$(uname -r) (Linux option CONFIG_RDMA_RXE: Debian's \
kernels have it, Ubuntu's in linux-modules-extra-$(uname -r)). Without a device the \
hardware tests skip; see README.md."
}

require_root() {
  [ "$(id -u)" -eq 0 ] || die 1 "$1 needs root: run it with sudo"
}

namespace_exists() { [ -e "/run/netns/$NS" ]; }

down() {
  if ! namespace_exists; then
    say "nothing to remove: there is no network namespace $NS"
    return 0
  fi
  require_root down
  if ip netns exec "$NS" rdma link show "$RXE/1" >/dev/null 2>&1; then
    run ip netns exec "$NS" rdma link delete "$RXE"
  fi
  run ip netns delete "$NS"
  say "removed the network namespace $NS (with $VETH_A and $VETH_B);" \
    "rdma_rxe stays loaded (remove it with: modprobe -r rdma_rxe)"
}

up() {
  require_tools
  require_rxe
  require_root up
  namespace_exists && die 1 "the network namespace $NS exists already: run '$0 down' first"
  if [ ! -d /sys/module/rdma_rxe ]; then
    run modprobe rdma_rxe
  fi
  run ip netns add "$NS"
  # From here on, a failure removes what was made.
  trap 'trap - ERR; echo "soft-roce: error: a command failed; undoing" >&2; down; exit 1' ERR
  run ip -n "$NS" link set lo up
  run ip -n "$NS" link add "$VETH_A" type veth peer name "$VETH_B"
  run ip -n "$NS" addr add "$ADDR_A" dev "$VETH_A"
  run ip -n "$NS" addr add "$ADDR_B" dev "$VETH_B"
  run ip -n "$NS" link set "$VETH_A" up
  run ip -n "$NS" link set "$VETH_B" up
  run ip netns exec "$NS" rdma link add "$RXE" type rxe netdev "$VETH_A"
  run ip netns exec "$NS" rdma link show "$RXE/1"
  trap - ERR
  say "soft-RoCE device $RXE on $VETH_A (${ADDR_A%/*}) in the network namespace $NS."
  say "run the hardware tests inside the namespace, as yourself, e.g.:"
  echo "    cargo build --release -p oxmpi-launcher"
  echo "    cargo test --release -p oxmpi-hw-tests --features rdma-core --no-run"
  echo "    sudo ip netns exec $NS sudo -u \"\$USER\" env \"PATH=\$PATH\" OXMPI_VERBS_DEVICE=$RXE \\"
  echo "        cargo test --release -p oxmpi-hw-tests --features rdma-core"
  say "remove it with: sudo $0 down"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  check)
    require_tools
    require_rxe
    say "this kernel ($(uname -r)) has rdma_rxe: '$0 up' can set up soft-RoCE"
    ;;
  *) die 1 "usage: $0 [up|down|check]" ;;
esac
