#!/usr/bin/env bash
# Stops a node started by tests/node/start.sh WORK_DIR and leaves nothing behind:
#   1. the kubelet, kube-proxy and kube-scheduler (the control plane's stop procedure: exactly
#      the PIDs in WORK_DIR/pids whose command line names WORK_DIR, SIGTERM then SIGKILL),
#      with containerd kept running for step 2
#   2. every container: SIGKILL to each process in the node's cgroup root, then containerd's
#      task and container records are removed so that the shims exit
#   3. containerd, then any shim still running (its command line names WORK_DIR's socket)
#   4. every mount under WORK_DIR (container root filesystems, pod network namespaces, volumes),
#      the cgroup root, and containerd's image store; logs stay for post-mortems
# Idempotent.
#
# usage: stop.sh WORK_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 WORK_DIR" >&2; exit 2; }
[ -d "$1" ] || { echo "node/stop.sh: $1: no such directory (nothing to stop)" >&2; exit 0; }
W=$(cd "$1" && pwd -P)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "[node-stop $(date +%H:%M:%S)] $*" >&2; }
exec 8>>"$W/node-stop.lock"
flock 8

SOCK=$W/containerd.sock
# Unique per work directory: two node tiers on one machine never share a cgroup.
CGROUP_ROOT=/podgroup-sync-node-$(printf %s "$W" | sha256sum | cut -c1-12)
ctr_() { timeout 10 ctr --address "$SOCK" --namespace k8s.io "$@"; }

# 1. Everything but containerd, through the generic stop (it skips what is no longer ours). The
#    reaper runs this script under its own PID: never signal ourselves.
containerd_pid=
keep=()
if [ -f "$W/pids" ]; then
  while read -r p; do
    [[ $p =~ ^[0-9]+$ ]] && [ "$p" != "$$" ] || continue
    if { tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | grep -q "^containerd --config $W/"; then
      containerd_pid=$p
    else
      keep+=("$p")
    fi
  done < "$W/pids"
fi
printf '%s\n' "${keep[@]}" > "$W/pids"
"$HERE/../cluster/stop.sh" "$W" || true
printf '%s\n' $containerd_pid > "$W/pids"

# 2. The containers: every process in our cgroup root, then containerd's records of them.
cgroup_procs() {
  local d
  for d in /sys/fs/cgroup/pids"$CGROUP_ROOT" /sys/fs/cgroup/memory"$CGROUP_ROOT" /sys/fs/cgroup"$CGROUP_ROOT"; do
    [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}
for _ in $(seq 50); do
  mapfile -t procs < <(cgroup_procs)
  [ ${#procs[@]} -gt 0 ] || break
  kill -KILL "${procs[@]}" 2>/dev/null || true
  sleep 0.1
done
[ -z "$(cgroup_procs)" ] || log "processes survive in $CGROUP_ROOT: $(cgroup_procs | tr '\n' ' ')"
if [ -S "$SOCK" ]; then
  for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete --force "$t" >/dev/null 2>&1 || true; done
  for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
fi

# 3. containerd, then stray shims (their argv names the socket under WORK_DIR).
"$HERE/../cluster/stop.sh" "$W" || true
mapfile -t shims < <(pgrep -f -- "-address $SOCK" || true)
if [ ${#shims[@]} -gt 0 ]; then
  log "SIGKILL shims ${shims[*]}"
  kill -KILL "${shims[@]}" 2>/dev/null || true
fi

# 4. Mounts (deepest first), cgroups (deepest first), the image store.
for _ in 1 2 3; do
  mapfile -t mounts < <(awk -v w="$W/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  [ ${#mounts[@]} -gt 0 ] || break
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
done
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ -d "$h${CGROUP_ROOT#/}" ] || continue
  find "$h${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  [ ! -d "$h${CGROUP_ROOT#/}" ] || log "cannot remove $h${CGROUP_ROOT#/}"
done
rm -rf "$W/containerd" "$W/kubelet" "$W/cni/ipam"
log "stopped node in $W"
