#!/usr/bin/env bash
# The demo: a local control plane with the upstream CRDs, podgroup-sync running against it, the
# sample jobs of examples/ applied into an enabled namespace, and the PodGroups they got.
#
# usage: hack/demo.sh [--keep]   (--keep leaves the control plane and controller running)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KEEP=0; [ "${1:-}" = "--keep" ] && KEEP=1
W=${DEMO_DIR:-$(mktemp -d /tmp/podgroup-sync-demo.XXXXXX)}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building podgroup-sync"
cargo build --release --manifest-path "$ROOT/Cargo.toml" 2>&1 | tail -1

say "starting etcd, kube-apiserver, kube-controller-manager and the CRDs in $W"
if [ $KEEP = 1 ]; then "$ROOT/tests/cluster/start.sh" "$W" >/dev/null
else "$ROOT/tests/cluster/start.sh" "$W" --owner-pid $$ >/dev/null; fi
# shellcheck disable=SC1091
source "$W/env"
export KUBECONFIG
k() { "$BIN/kubectl" "$@"; }
cleanup() {
  [ -n "${CTRL_PID:-}" ] && kill "$CTRL_PID" 2>/dev/null || true
  "$ROOT/tests/cluster/stop.sh" "$W" >/dev/null 2>&1 || true
}
[ $KEEP = 1 ] || trap cleanup EXIT

say "starting podgroup-sync (log: $W/podgroup-sync.log)"
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$ROOT/target/release/podgroup-sync" --kubeconfig "$KUBECONFIG" --http-addr "127.0.0.1:$PORT" \
  > "$W/podgroup-sync.log" 2>&1 &
CTRL_PID=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null || { tail -20 "$W/podgroup-sync.log"; exit 1; }

say "an enabled namespace and the sample jobs"
k create namespace demo
k annotate namespace demo podgroup-sync.io/enabled=true
k -n demo apply --server-side -f "$ROOT/examples/"

say "waiting for the PodGroups"
for _ in $(seq 100); do
  n=$(( $(k -n demo get podgroups.scheduling.x-k8s.io -o name | wc -l) + $(k -n demo get podgroups.scheduling.volcano.sh -o name | wc -l) ))
  [ "$n" -ge 3 ] && break; sleep 0.2
done
k -n demo get pytorchjobs,tfjobs,mpijobs,xgboostjobs,paddlejobs,jaxjobs
echo
k -n demo get podgroups.scheduling.x-k8s.io -o custom-columns='SCHEDULER-PLUGINS PODGROUP:.metadata.name,MIN-MEMBER:.spec.minMember,MIN-RESOURCES:.spec.minResources,OWNER:.metadata.ownerReferences[0].kind'
echo
k -n demo get podgroups.scheduling.volcano.sh -o custom-columns='VOLCANO PODGROUP:.metadata.name,MIN-MEMBER:.spec.minMember,QUEUE:.spec.queue,MIN-RESOURCES:.spec.minResources,OWNER:.metadata.ownerReferences[0].kind'

say "the reasoning, offline: podgroup-sync explain -f examples/pytorchjob.yaml"
"$ROOT/target/release/podgroup-sync" explain -f "$ROOT/examples/pytorchjob.yaml" | sed -n '1,8p'

say "scale the PyTorchJob to 5 workers: the PodGroup follows"
k -n demo patch pytorchjob pytorch-demo --type merge -p '{"spec":{"pytorchReplicaSpecs":{"Worker":{"replicas":5}}}}'
for _ in $(seq 50); do
  [ "$(k -n demo get podgroups.scheduling.x-k8s.io pytorch-demo -o jsonpath='{.spec.minMember}')" = 6 ] && break; sleep 0.2
done
k -n demo get podgroups.scheduling.x-k8s.io pytorch-demo -o custom-columns='PODGROUP:.metadata.name,MIN-MEMBER:.spec.minMember,MIN-RESOURCES:.spec.minResources'

say "events podgroup-sync reported on the jobs"
k -n demo get events --field-selector reportingComponent=podgroup-sync -o custom-columns='OBJECT:.involvedObject.name,TYPE:.type,REASON:.reason,MESSAGE:.message' 2>/dev/null || true

say "metrics (excerpt)"
curl -fs "http://127.0.0.1:$PORT/metrics" | grep -E '^podgroup_sync_(podgroup_writes_total|reconcile_total|watched_kinds|backend_served)' | grep -v ' 0$' || true

if [ $KEEP = 1 ]; then
  say "left running: export KUBECONFIG=$KUBECONFIG; stop with: kill $CTRL_PID; tests/cluster/stop.sh $W"
fi
