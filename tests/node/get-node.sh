#!/usr/bin/env bash
# Gets (once) what the node tier runs beyond the control plane, and prints where it is:
#   Debian packages   containerd, runc, containernetworking-plugins, iptables, conntrack, umoci,
#                     qemu-user-static (to run the image's arm64 binary) (apt-get install, only
#                     those missing)
#   kubelet, kube-proxy, kube-scheduler
#                     built from the Go module proxy beside the control plane's binaries
#                     (tests/cluster/get-binaries.sh with K8S_NODE=1), the same Kubernetes version
#   the pause image   built from the Kubernetes module's own source (build/pause/linux/pause.c,
#                     gcc -static) into an OCI archive (hack/oci-archive.sh), cached as
#                     $PGS_CACHE/images/pause-<tag>-k8s-v<version>.oci.tar
# Nothing is pulled from a container registry. Idempotent; progress goes to stderr and the last
# stdout lines are BIN=<dir>, CRDS=<dir>, PAUSE=<archive> and PAUSE_IMAGE=<name:tag>.
#
# usage: get-node.sh        environment: K8S_VERSION (default 1.34.4), PGS_CACHE
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
log() { echo "[get-node $(date +%H:%M:%S)] $*" >&2; }

K8S_VERSION=${K8S_VERSION:-1.34.4}
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}

# --- Debian packages --------------------------------------------------------------------------
need=()
for pair in containerd:containerd ctr:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
    iptables:iptables conntrack:conntrack umoci:umoci qemu-aarch64-static:qemu-user-static; do
  cmd=${pair%%:*} pkg=${pair#*:}
  if [[ $cmd == /* ]]; then [ -x "$cmd" ] || need+=("$pkg"); else command -v "$cmd" >/dev/null || need+=("$pkg"); fi
done
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends "${need[@]}" >&2; }
fi

# --- kubelet, kube-proxy, kube-scheduler ------------------------------------------------------
out=$(K8S_VERSION=$K8S_VERSION K8S_NODE=1 "$HERE/../cluster/get-binaries.sh" </dev/null)
BIN=$(printf '%s\n' "$out" | sed -n 's/^BIN=//p' | tail -n 1)
CRDS=$(printf '%s\n' "$out" | sed -n 's/^CRDS=//p' | tail -n 1)

# --- the pause image, from source -------------------------------------------------------------
src=$(modjson "k8s.io/kubernetes@v$K8S_VERSION" Dir)/build/pause
tag=$(sed -n 's/^TAG ?= *//p' "$src/Makefile")
PAUSE=$PGS_CACHE/images/pause-$tag-k8s-v$K8S_VERSION.oci.tar
PAUSE_IMAGE=localhost/podgroup-sync-node/pause:$tag
if [ ! -s "$PAUSE" ]; then
  log "building the pause image $tag from $src/linux/pause.c"
  mkdir -p "$(dirname "$PAUSE")"
  work=$(mktemp -d "${TMPDIR:-/tmp}/podgroup-sync-pause.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/rootfs"
  # The upstream Makefile's flags, with the version string it would stamp.
  gcc -Os -Wall -Werror -static "-DVERSION=v$tag-podgroup-sync" -o "$work/rootfs/pause" "$src/linux/pause.c"
  strip "$work/rootfs/pause"
  "$HERE/../../hack/oci-archive.sh" "$work/rootfs" "$PAUSE" "$tag" tests/node/get-node.sh \
    --config.user 65535:65535 --config.entrypoint /pause
  log "built $PAUSE ($(du -k "$PAUSE" | cut -f1) KiB)"
fi

echo "BIN=$BIN"
echo "CRDS=$CRDS"
echo "PAUSE=$PAUSE"
echo "PAUSE_IMAGE=$PAUSE_IMAGE"
