#!/usr/bin/env bash
# Stops a control plane started by start.sh: kills exactly the PIDs listed in WORK_DIR/pids
# (SIGTERM, then SIGKILL after STOP_GRACE seconds, default 5), then removes the etcd data
# directory (etcd preallocates 64 MB WAL files). Logs, PKI and kubeconfig stay for post-mortems.
# Idempotent: dead PIDs are skipped, and a PID is only signalled while its command line still
# mentions WORK_DIR, so a recycled PID is never hit.
#
# usage: stop.sh WORK_DIR
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 WORK_DIR" >&2; exit 2; }
[ -d "$1" ] || { echo "stop.sh: $1: no such directory (nothing to stop)" >&2; exit 0; }
W=$(cd "$1" && pwd -P)
GRACE=${STOP_GRACE:-5}
log() { echo "[stop $(date +%H:%M:%S)] $*" >&2; }

# Serialise concurrent stops (the reaper and a failing start.sh may race). With STOP_IF_IDLE=1
# (used by start.sh) a stop already in progress is left to finish the job.
exec 9>>"$W/stop.lock"
if ! flock -n 9; then
  [ "${STOP_IF_IDLE:-0}" != 1 ] || { log "another stop is in progress for $W"; exit 0; }
  flock 9
fi

# ours PID: PID is alive (not a zombie) and its argv mentions WORK_DIR.
ours() {
  local p=$1 s
  [ "$p" != "$$" ] || return 1      # the reaper execs this script: never signal ourselves
  s=$(cat "/proc/$p/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [ "${s%% *}" != Z ] || return 1
  { tr '\0' '\n' < "/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$W"
}

pids=()
if [ -f "$W/pids" ]; then
  while read -r p; do
    [[ $p =~ ^[0-9]+$ ]] && pids+=("$p")
  done < "$W/pids"
fi

live=()
for p in "${pids[@]}"; do ours "$p" && live+=("$p"); done
if [ ${#live[@]} -gt 0 ]; then
  log "SIGTERM ${live[*]}"
  kill -TERM "${live[@]}" 2>/dev/null || true
  deadline=$(( ${EPOCHREALTIME/./} + GRACE * 1000000 ))
  while :; do
    remaining=()
    for p in "${live[@]}"; do ours "$p" && remaining+=("$p"); done
    [ ${#remaining[@]} -gt 0 ] || break
    if [ "${EPOCHREALTIME/./}" -ge "$deadline" ]; then
      log "SIGKILL ${remaining[*]}"
      kill -KILL "${remaining[@]}" 2>/dev/null || true
      for _ in $(seq 50); do
        still=()
        for p in "${remaining[@]}"; do ours "$p" && still+=("$p"); done
        [ ${#still[@]} -gt 0 ] || break
        sleep 0.1
      done
      break
    fi
    sleep 0.1
  done
fi

# Only drop the data once nothing of ours is left running.
for p in "${pids[@]}"; do
  if ours "$p"; then log "PID $p survived SIGKILL; keeping $W/etcd"; exit 1; fi
done
rm -rf "$W/etcd"
log "stopped control plane in $W"
