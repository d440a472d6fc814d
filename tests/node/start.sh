#!/usr/bin/env bash
# Starts a real node next to a running node-tier control plane (tests/cluster/start.sh with
# NODE_IP set), inside the network namespace of tests/node/netns.sh:
#   containerd      Debian's, its own root/state/socket under WORK_DIR, runc, CNI bridge pgsbr0
#                   (host-local IPAM over NODE_IP/24), the sandbox image built by get-node.sh;
#                   the images are imported from OCI archives, never pulled
#   kubelet         the control plane's version, node "pgs-node", cgroupfs driver under a cgroup
#                   root of its own, everything it writes under WORK_DIR
#   kube-proxy      iptables mode: Service IPs (the API server's `kubernetes` Service included)
#   kube-scheduler  schedules the pods onto the node
# Every PID is listed in WORK_DIR/pids; stop.sh also ends the containers and their shims, unmounts
# what they mounted and removes the cgroups.
#
# usage: start.sh WORK_DIR --kubeconfig KUBECONFIG --image ARCHIVE=NAME [--image ...] [--owner-pid PID]
#   --image ARCHIVE=NAME  an OCI archive to import into containerd as NAME (repository, no tag)
#   --owner-pid PID       also starts a detached reaper that runs stop.sh WORK_DIR once PID exits
# environment: NODE_IP (set by netns.sh), READY_TIMEOUT=120
# The last stdout line is NODE=pgs-node; WORK_DIR/env has CONTAINERD_SOCK, CGROUP_ROOT, NODE.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=node/start.sh
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
T0=${EPOCHREALTIME/./}
elapsed() { local us=$(( ${EPOCHREALTIME/./} - T0 )); printf '%d.%d' $(( us / 1000000 )) $(( us / 100000 % 10 )); }
log() { printf '[node-start %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(elapsed)" "$*" >&2; }
usage() { echo "usage: $0 WORK_DIR --kubeconfig KUBECONFIG --image ARCHIVE=NAME... [--owner-pid PID]" >&2; exit 2; }

[ $# -ge 1 ] || usage
W=$1; shift
KC_IN= OWNER= IMAGES=()
while [ $# -gt 0 ]; do
  case $1 in
    --kubeconfig) [ $# -ge 2 ] || usage; KC_IN=$2; shift 2 ;;
    --image) [ $# -ge 2 ] || usage; IMAGES+=("$2"); shift 2 ;;
    --owner-pid) [ $# -ge 2 ] || usage; OWNER=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ -n "$KC_IN" ] || usage
READY_TIMEOUT=${READY_TIMEOUT:-120}
NODE=pgs-node
: "${NODE_IP:?NODE_IP is not set: run the node tier through tests/node/netns.sh}"
# Only inside netns.sh's namespace: the bridge with the node's address exists nowhere else.
ip -4 -o addr show dev pgsbr0 2>/dev/null | grep -qF " $NODE_IP/" ||
  { echo "$SCRIPT: no bridge pgsbr0 with $NODE_IP here: run the node tier through tests/node/netns.sh" >&2; exit 2; }
POD_CIDR=${NODE_IP%.*}.0/24

mkdir -p "$W"
W=$(cd "$W" && pwd -P)
refuse_if_running
rm -rf "$W/pids" "$W/env" "$W/reaper.pid" "$W/stop.lock"
list_self_until_started
[ -z "$OWNER" ] || start_reaper node-reaper "the node"
cp "$KC_IN" "$W/kubeconfig"; KC=$W/kubeconfig

out=$("$HERE/get-node.sh" </dev/null) || { echo "$SCRIPT: get-node.sh failed" >&2; exit 1; }
BIN=$(printf '%s\n' "$out" | sed -n 's/^BIN=//p' | tail -n 1)
PAUSE=$(printf '%s\n' "$out" | sed -n 's/^PAUSE=//p' | tail -n 1)
PAUSE_IMAGE=$(printf '%s\n' "$out" | sed -n 's/^PAUSE_IMAGE=//p' | tail -n 1)
kubectl() { "$BIN/kubectl" --kubeconfig="$KC" "$@"; }

# --- cgroups: a root of our own in every v1 hierarchy (cgroup v2: one directory) ---------------
# Unique per work directory: two node tiers on one machine never share a cgroup.
CGROUP_ROOT=/podgroup-sync-node-$(printf %s "$W" | sha256sum | cut -c1-12)
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p "/sys/fs/cgroup$CGROUP_ROOT"
else
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] && [ "$(basename "$h")" != unified ] || continue
    mkdir -p "$h${CGROUP_ROOT#/}"
  done
  # A v1 cpuset cgroup takes no task until its CPUs and memory nodes are set.
  if [ -d /sys/fs/cgroup/cpuset ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.mems"
  fi
fi

# --- containerd -------------------------------------------------------------------------------
SOCK=$W/containerd.sock
mkdir -p "$W/containerd" "$W/cni/net.d" "$W/cni/ipam"
cat > "$W/containerd.toml" <<TOML
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
# Plugins that would write outside WORK_DIR or need what this machine lacks.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # This machine withholds CAP_SYS_RESOURCE, so no process may lower its OOM score below its
  # parent's; without this the sandbox's -998 fails every pod ("oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$W/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
TOML
cat > "$W/cni/net.d/10-pgs-node.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "pgs-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "pgsbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$W/cni/ipam",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$NODE_IP" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
JSON
log "containerd ($SOCK)"
start containerd containerd --config "$W/containerd.toml"
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
wait_ready containerd "$STARTED_PID" ctr_ version
log "containerd ready; importing the images"
ctr_ images import --base-name "${PAUSE_IMAGE%:*}" "$PAUSE" >"$W/import.log" 2>&1 ||
  fail import "ctr images import $PAUSE"
for spec in "${IMAGES[@]}"; do
  ctr_ images import --base-name "${spec#*=}" "${spec%%=*}" >>"$W/import.log" 2>&1 ||
    fail import "ctr images import ${spec%%=*}"
done
ctr_ images ls -q >>"$W/import.log"

# --- kubelet ----------------------------------------------------------------------------------
mkdir -p "$W/kubelet" "$W/pod-logs"
cat > "$W/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$(dirname "$KC_IN")/pki/ca.crt"}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
podLogsDir: $W/pod-logs
podCIDR: $POD_CIDR
maxPods: 30
# Never evict or collect images because of this shared machine's disk.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
log "kubelet (node $NODE, $NODE_IP, cgroup root $CGROUP_ROOT)"
start kubelet "$BIN/kubelet" --config="$W/kubelet.yaml" --kubeconfig="$KC" \
  --hostname-override="$NODE" --node-ip="$NODE_IP" --root-dir="$W/kubelet" \
  --cert-dir="$W/kubelet/pki" --v=1
node_ready() {
  [ "$(kubectl get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
wait_ready kubelet "$STARTED_PID" node_ready
log "node $NODE Ready"

# --- kube-proxy -------------------------------------------------------------------------------
cat > "$W/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$KC"}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the machine-wide conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
log "kube-proxy (iptables)"
start kube-proxy "$BIN/kube-proxy" --config="$W/kube-proxy.yaml"
proxy_ready() { curl -fsS --max-time 2 http://127.0.0.1:10256/healthz >/dev/null; }
wait_ready kube-proxy "$STARTED_PID" proxy_ready
log "kube-proxy ready"

# --- kube-scheduler ---------------------------------------------------------------------------
read -r SCHED_PORT < <(free_ports 1)
log "kube-scheduler (secure port $SCHED_PORT)"
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$KC" --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
  --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC"
sched_ready() { [ "$(curl -sSk --max-time 2 "https://127.0.0.1:$SCHED_PORT/healthz")" = ok ]; }
wait_ready kube-scheduler "$STARTED_PID" sched_ready
log "kube-scheduler ready"

{
  printf 'export NODE=%q\n' "$NODE"
  printf 'export NODE_IP=%q\n' "$NODE_IP"
  printf 'export CONTAINERD_SOCK=%q\n' "$SOCK"
  printf 'export CGROUP_ROOT=%q\n' "$CGROUP_ROOT"
  printf 'export NODE_DIR=%q\n' "$W"
} > "$W/env"
STARTED_OK=1
log "node ready (stop: $HERE/stop.sh $W)"
echo "NODE=$NODE"
