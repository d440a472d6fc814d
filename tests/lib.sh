# shellcheck shell=bash
# Shared by the scripts under tests/ (sourced, never run): building components from the Go module
# proxy, and starting processes that a reaper stops when their owner exits.
#
# A start script sets W (its work directory), SCRIPT (its name in messages), HERE and a log()
# function before it calls the start helpers.

# --- building from the Go module proxy ----------------------------------------------------------

# one_run_at_a_time LOCKFILE WHAT: serialises runs on fd 9 (held until the script exits).
one_run_at_a_time() {
  exec 9>>"$1"
  if ! flock -n 9; then
    log "waiting for another $2 run to finish"
    flock 9
  fi
}

# modjson MODULE@VERSION FIELD: downloads a module (zip only) and prints one field of its JSON.
modjson() {
  local out
  out=$(cd /tmp && GOFLAGS='' go mod download -json "$1") || {
    echo "$out" >&2; log "the Go module proxy does not serve $1"; return 1; }
  python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])" <<<"$out"
}

# replace_flags GOMOD LOCALVERSION [K8S]: `go mod edit` flags copying GOMOD's replace
# directives; a local-path replace (a nested module of the same repository) becomes that module
# at LOCALVERSION. With K8S (e.g. 1.34.4), k8s.io/kubernetes is replaced by v$K8S and every
# k8s.io/* module replaced at v0.<same minor>.* by v0.<K8S minor.patch>.
replace_flags() {
  go mod edit -json "$1" | python3 -c '
import json, sys
local, pin = sys.argv[1], sys.argv[2]
for r in json.load(sys.stdin).get("Replace") or []:
    o, n = r["Old"], r["New"]
    old = o["Path"] + ("@" + o["Version"] if o.get("Version") else "")
    if n.get("Version"):
        ver = n["Version"]
        if pin and n["Path"] == "k8s.io/kubernetes":
            ver = "v" + pin
        elif pin and n["Path"].startswith("k8s.io/") and ver.startswith("v0.%s." % pin.split(".")[1]):
            ver = "v0." + pin.split(".", 1)[1]
        print("-replace=%s=%s@%s" % (old, n["Path"], ver))
    else:
        print("-replace=%s=%s@%s" % (old, o["Path"], local))
' "$2" "${3:-}"
}

# k8s_ldflags K8S_VERSION: the version variables Kubernetes binaries derive their version (and
# compatibility/emulation version) from; a plain build reports v0.0.0-master.
k8s_ldflags() {
  local minor=${1#1.}; minor=${minor%%.*}
  local V=k8s.io/component-base/version C=k8s.io/client-go/pkg/version
  echo "-s -w -X $V.gitVersion=v$1 -X $V.gitMajor=1 -X $V.gitMinor=$minor -X $V.gitTreeState=clean" \
       "-X $V.buildDate=1970-01-01T00:00:00Z -X $C.gitVersion=v$1 -X $C.gitMajor=1 -X $C.gitMinor=$minor"
}

# --- starting processes -------------------------------------------------------------------------

# refuse_if_running: exits when W already has live processes of an earlier start.
refuse_if_running() {
  [ -s "$W/pids" ] || return 0
  local p
  while read -r p; do
    if [ -n "$p" ] && { tr '\0' '\n' < "/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$W"; then
      echo "$SCRIPT: $W already has running components (PID $p); run stop.sh $W first" >&2
      exit 1
    fi
  done < "$W/pids"
}

# list_self_until_started: lists this script in W/pids while it runs, so that the reaper also ends
# a start interrupted by the owner's death, and stops what was started if the start fails.
STARTED_OK=0
list_self_until_started() {
  echo $$ > "$W/pids"
  trap on_exit EXIT
  trap 'exit 130' INT TERM
}
unlist_self() { grep -vx "$$" "$W/pids" > "$W/pids.tmp" || true; mv "$W/pids.tmp" "$W/pids"; }
on_exit() {
  local rc=$?
  unlist_self
  if [ "$STARTED_OK" != 1 ]; then
    log "start failed (exit $rc); stopping what was started"
    STOP_IF_IDLE=1 "$HERE/stop.sh" "$W" >&2 || true
  fi
}

# fail COMPONENT MESSAGE: print the message and the tail of W/COMPONENT.log, then exit.
fail() {
  echo "$SCRIPT: $1: $2" >&2
  if [ -f "$W/$1.log" ]; then
    echo "----- last 40 lines of $W/$1.log -----" >&2
    tail -n 40 "$W/$1.log" >&2
    echo "----- end of $1.log -----" >&2
  fi
  exit 1
}

# proc_start PID: the start time (field 22 of /proc/PID/stat), which identifies a process across
# PID reuse.
# shellcheck disable=SC2086  # word splitting of the stat fields is intended
proc_start() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "${20}"; }

# start_reaper NAME WHAT: a detached process (own session, stdio not inherited, so that it
# outlives the owner and never keeps the owner's pipes open) that runs HERE/stop.sh W once the
# owner PID $OWNER exits. Its argv contains W, which stop.sh relies on.
start_reaper() {
  local name=$1 what=$2 owner_start
  owner_start=$(proc_start "$OWNER") || { echo "$SCRIPT: owner PID $OWNER vanished" >&2; exit 2; }
  # shellcheck disable=SC2016  # expanded by the reaper's bash
  setsid bash -c '
    W=$1 OWNER=$2 OWNER_START=$3 STOP=$4 NAME=$5 WHAT=$6
    echo $$ > "$W/reaper.pid.tmp" && mv "$W/reaper.pid.tmp" "$W/reaper.pid"
    alive() { local s; s=$(cat "/proc/$OWNER/stat" 2>/dev/null) || return 1
              s=${s##*) }; set -- $s; [ "$1" != Z ] && [ "${20}" = "$OWNER_START" ]; }
    while alive; do sleep 1; done
    echo "[$NAME $(date +%H:%M:%S)] owner $OWNER exited; stopping $WHAT"
    exec "$STOP" "$W"
  ' "pgs-$name" "$W" "$OWNER" "$owner_start" "$HERE/stop.sh" "$name" "$what" </dev/null >>"$W/reaper.log" 2>&1 &
  for _ in $(seq 100); do [ -s "$W/reaper.pid" ] && break; sleep 0.05; done
  [ -s "$W/reaper.pid" ] || fail reaper "the reaper did not start"
  cat "$W/reaper.pid" >> "$W/pids"
  log "reaper $(cat "$W/reaper.pid") watches owner PID $OWNER"
}

# free_ports N: N distinct free loopback ports (all bound at once, then released).
free_ports() {
  python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])' "$1"
}

# start NAME CMD...: runs CMD detached from our stdio, logging to W/NAME.log; its PID is appended
# to W/pids and left in STARTED_PID.
STARTED_PID=
start() {
  local name=$1; shift
  "$@" </dev/null >"$W/$name.log" 2>&1 &
  STARTED_PID=$!
  echo "$STARTED_PID" >> "$W/pids"
}
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s%% *}" != Z ]; }

# wait_ready NAME PID CMD...: polls CMD (every 0.2 s) until it succeeds; fails if PID dies or
# READY_TIMEOUT seconds pass.
wait_ready() {
  local name=$1 pid=$2 rc; shift 2
  local deadline=$(( $(date +%s) + READY_TIMEOUT ))
  until "$@" >/dev/null 2>&1; do
    alive "$pid" || { wait "$pid" 2>/dev/null && rc=0 || rc=$?; fail "$name" "exited (status $rc) before becoming ready"; }
    [ "$(date +%s)" -lt "$deadline" ] || fail "$name" "not ready after ${READY_TIMEOUT}s"
    sleep 0.2
  done
}
http_ok() { curl -fsS --max-time 3 -o /dev/null "$1"; }
https_ok() { curl -fsSk --max-time 3 -o /dev/null "$1"; }
