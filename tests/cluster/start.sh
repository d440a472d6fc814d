#!/usr/bin/env bash
# Starts a throw-away Kubernetes control plane on loopback for the tests:
#   etcd, kube-apiserver (TLS, client-cert admin, RBAC, service-account signing key),
#   the upstream CRDs (Kubeflow PyTorchJob/TFJob, MPIJob v2beta1, scheduler-plugins and Volcano
#   PodGroups, Volcano Queue), then kube-controller-manager (garbage collector, namespace, job and
#   service-account-token controllers).
#
# usage: start.sh WORK_DIR [--owner-pid PID]
#
#   WORK_DIR        created if missing; receives pki/, etcd/ (data), *.log and:
#                     kubeconfig  admin client-cert user, current context "test"
#                     env         shell-sourceable: KUBECONFIG API_URL BIN CRDS WORK_DIR ETCD_URL
#                     pids        one PID per line: exactly the processes this script started
#   --owner-pid PID also starts a detached reaper (own session) that runs stop.sh WORK_DIR as soon
#                   as PID exits, so a test binary that panics or is killed leaks no processes.
#
# environment:
#   START_KCM=0         do not start kube-controller-manager (no GC, namespaces stay Terminating)
#   READY_TIMEOUT=120   seconds each component may take to become ready
#   AUDIT=1             the API server logs every PodGroup write (user, verb, object, times) to
#                       $W/audit.log
#   WORKLOAD_CRDS=1     also install the JobSet, LeaderWorkerSet, RayCluster, RayJob, TrainJob,
#                       TrainingRuntime and ClusterTrainingRuntime CRDs
#   PGS_BIN_DIR, PGS_CRDS_DIR   use these directories instead of running get-binaries.sh
#   NATIVE_GANG=1       Kubernetes' own gang scheduling: K8S_VERSION defaults to 1.37.2, the
#                       GenericWorkload gate is on in every component, scheduling.k8s.io/v1beta1
#                       is served (a beta API off by default), and KCM also runs the
#                       podgroup-protection controller (it lifts the finalizer the API server
#                       puts on every native PodGroup); kube-scheduler is built beside the
#                       other binaries for tests/e2e/start.sh (E2E_NATIVE=1), which starts it
#   TOPOLOGY_GATE=1     with NATIVE_GANG=1, the TopologyAwareWorkloadScheduling gate is on too
#                       (alpha in 1.37, off by default: without it the API server drops a native
#                       PodGroup's schedulingConstraints)
#   NODE_IP=ADDR        for the node tier (tests/node/), which runs inside a network namespace
#                       of its own: kube-apiserver listens on every address of that namespace
#                       and advertises ADDR (the `kubernetes` Service's endpoint, which kube-proxy
#                       routes pods to), the ServiceAccount admission plugin mounts tokens, and
#                       KCM also runs the controllers a Deployment, a Service and a Node need
#
# Progress goes to stderr. On success the last stdout lines are KUBECONFIG=..., API_URL=... (the
# same as WORK_DIR/env). On failure every process started so far is stopped and the tail of the
# failing component's log is printed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=start.sh
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
T0=${EPOCHREALTIME/./}
elapsed() { local us=$(( ${EPOCHREALTIME/./} - T0 )); printf '%d.%d' $(( us / 1000000 )) $(( us / 100000 % 10 )); }
log() { printf '[start %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(elapsed)" "$*" >&2; }
usage() { echo "usage: $0 WORK_DIR [--owner-pid PID]" >&2; exit 2; }

[ $# -ge 1 ] || usage
W=$1; shift
OWNER=
while [ $# -gt 0 ]; do
  case $1 in
    --owner-pid) [ $# -ge 2 ] || usage; OWNER=$2; shift 2 ;;
    --owner-pid=*) OWNER=${1#*=}; shift ;;
    *) usage ;;
  esac
done
if [ -n "$OWNER" ] && ! [ -d "/proc/$OWNER" ]; then
  echo "start.sh: owner PID $OWNER is not running" >&2; exit 2
fi
READY_TIMEOUT=${READY_TIMEOUT:-120}
START_KCM=${START_KCM:-1}
GATES=() APISERVER_EXTRA=() KCM_CONTROLLERS=garbage-collector-controller,namespace-controller,job-controller,serviceaccount-token-controller
if [ "${NATIVE_GANG:-0}" = 1 ]; then
  export K8S_VERSION=${K8S_VERSION:-1.37.2} K8S_SCHEDULER=1
  GATES=(--feature-gates=GenericWorkload=true)
  [ "${TOPOLOGY_GATE:-0}" = 1 ] && GATES=(--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true)
  APISERVER_EXTRA=(--runtime-config=scheduling.k8s.io/v1beta1=true)
  KCM_CONTROLLERS=$KCM_CONTROLLERS,podgroup-protection-controller
fi

mkdir -p "$W"
W=$(cd "$W" && pwd -P)   # absolute: it is written into kubeconfig/env and matched by stop.sh
# AUDIT=1: every PodGroup write is logged to $W/audit.log (who, what, when), one JSON line each.
if [ "${AUDIT:-0}" = 1 ]; then
  cat > "$W/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: scheduling.x-k8s.io
  - group: scheduling.volcano.sh
  - group: scheduling.k8s.io
- level: None
POLICY
  APISERVER_EXTRA+=(--audit-policy-file="$W/audit-policy.yaml" --audit-log-path="$W/audit.log"
    --audit-log-mode=blocking)
fi
# Outside the node tier: loopback only, no Service endpoint for the API server, no token mounts.
BIND=127.0.0.1 ADVERTISE=127.0.0.1 NODE_SANS=
APISERVER_NET=(--endpoint-reconciler-type=none --disable-admission-plugins=ServiceAccount)
if [ -n "${NODE_IP:-}" ]; then
  export K8S_NODE=1
  BIND=0.0.0.0 ADVERTISE=$NODE_IP NODE_SANS=",IP:$NODE_IP"
  # Logs and exec reach the kubelet at the node's InternalIP (there is no DNS), with the admin
  # client certificate (the test kubelet trusts the CA and allows any authenticated user).
  APISERVER_NET=(--kubelet-preferred-address-types=InternalIP
    "--kubelet-client-certificate=$W/pki/admin.crt" "--kubelet-client-key=$W/pki/admin.key")
  KCM_CONTROLLERS=$KCM_CONTROLLERS,deployment-controller,replicaset-controller,endpointslice-controller,serviceaccount-controller,root-ca-certificate-publisher-controller,pod-garbage-collector-controller,node-lifecycle-controller
fi
refuse_if_running
rm -rf "$W/pki" "$W/etcd" "$W/pids" "$W/env" "$W/kubeconfig" "$W/reaper.pid" "$W/stop.lock"
mkdir -p "$W/pki"
mkdir -m 700 "$W/etcd"
list_self_until_started

# --- reaper -----------------------------------------------------------------------------------
[ -z "$OWNER" ] || start_reaper reaper "the control plane"

# --- binaries and CRDs ------------------------------------------------------------------------
if [ -n "${PGS_BIN_DIR:-}" ] && [ -n "${PGS_CRDS_DIR:-}" ]; then
  BIN=$PGS_BIN_DIR CRDS=$PGS_CRDS_DIR
else
  log "get-binaries.sh (cold: tens of minutes; warm: seconds)"
  out=$("$HERE/get-binaries.sh" </dev/null) || { echo "start.sh: get-binaries.sh failed" >&2; exit 1; }
  BIN=$(printf '%s\n' "$out" | sed -n 's/^BIN=//p' | tail -n 1)
  CRDS=$(printf '%s\n' "$out" | sed -n 's/^CRDS=//p' | tail -n 1)
fi
for b in etcd kube-apiserver kubectl; do
  [ -x "$BIN/$b" ] || { echo "start.sh: $BIN/$b is missing" >&2; exit 1; }
done
[ "$START_KCM" = 0 ] || [ -x "$BIN/kube-controller-manager" ] ||
  { echo "start.sh: $BIN/kube-controller-manager is missing" >&2; exit 1; }
CRD_FILES=(
  "$CRDS/training-operator/kubeflow.org_pytorchjobs.yaml"
  "$CRDS/training-operator/kubeflow.org_tfjobs.yaml"
  "$CRDS/training-operator/kubeflow.org_xgboostjobs.yaml"
  "$CRDS/training-operator/kubeflow.org_paddlejobs.yaml"
  "$CRDS/training-operator/kubeflow.org_jaxjobs.yaml"
  "$CRDS/mpi-operator/kubeflow.org_mpijobs.yaml"   # v2beta1; NOT training-operator's (same name)
  "$CRDS/scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml"
  "$CRDS/volcano/scheduling.volcano.sh_podgroups.yaml"
  "$CRDS/volcano/scheduling.volcano.sh_queues.yaml"
)
# The other operators' CRDs (SPEC §11), 4.8 MB: only for the tests that create such objects
# (installing them takes about 4 s of every start).
if [ "${WORKLOAD_CRDS:-0}" = 1 ]; then
  CRD_FILES+=(
    "$CRDS/workloads/jobset.x-k8s.io_jobsets.yaml"
    "$CRDS/workloads/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    "$CRDS/workloads/ray.io_rayclusters.yaml"
    "$CRDS/workloads/ray.io_rayjobs.yaml"
    "$CRDS/workloads/trainer.kubeflow.org_trainjobs.yaml"
    "$CRDS/workloads/trainer.kubeflow.org_trainingruntimes.yaml"
    "$CRDS/workloads/trainer.kubeflow.org_clustertrainingruntimes.yaml"
  )
fi
for f in "${CRD_FILES[@]}"; do [ -f "$f" ] || { echo "start.sh: CRD file $f is missing" >&2; exit 1; }; done

# --- ports and PKI ----------------------------------------------------------------------------
# Four distinct free loopback ports (all bound at once, then released; a tiny race remains).
read -r ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT < <(free_ports 4)
ETCD_URL=http://127.0.0.1:$ETCD_PORT
API_URL=https://127.0.0.1:$API_PORT

log "PKI in $W/pki"
(
  cd "$W/pki"
  ec() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }  # PKCS#8
  ec ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 7 -subj /CN=podgroup-sync-test-ca -out ca.crt \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  # sign NAME SUBJECT EXTENSIONS
  sign() {
    ec "$1.key"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
    printf '%b\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 7 \
      -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  }
  sign apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1$NODE_SANS\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE"
  sign admin '/O=system:masters/CN=admin' 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE'
  ec sa.key                                     # service-account token signing key (ES256)
  openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
) || fail pki "openssl failed"

b64() { base64 -w0 < "$1"; }
cat > "$W/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: $API_URL
    certificate-authority-data: $(b64 "$W/pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$W/pki/admin.crt")
    client-key-data: $(b64 "$W/pki/admin.key")
contexts:
- name: test
  context:
    cluster: test
    user: admin
    namespace: default
current-context: test
EOF
chmod 600 "$W/kubeconfig"

# --- etcd -------------------------------------------------------------------------------------
log "etcd on $ETCD_URL"
start etcd "$BIN/etcd" --name=pgs --data-dir="$W/etcd" --unsafe-no-fsync --log-level=warn \
  --listen-client-urls="$ETCD_URL" --advertise-client-urls="$ETCD_URL" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="pgs=http://127.0.0.1:$ETCD_PEER_PORT"
etcd_ready() { [ "$(curl -fsS --max-time 2 "$ETCD_URL/readyz")" = ok ]; }
wait_ready etcd "$STARTED_PID" etcd_ready
log "etcd ready"

# --- kube-apiserver ---------------------------------------------------------------------------
log "kube-apiserver on $API_URL"
start apiserver "$BIN/kube-apiserver" \
  --etcd-servers="$ETCD_URL" --bind-address="$BIND" --advertise-address="$ADVERTISE" \
  --secure-port="$API_PORT" \
  --tls-cert-file="$W/pki/apiserver.crt" --tls-private-key-file="$W/pki/apiserver.key" \
  --client-ca-file="$W/pki/ca.crt" --cert-dir="$W/pki" \
  --service-account-issuer="$API_URL" --service-account-key-file="$W/pki/sa.pub" \
  --service-account-signing-key-file="$W/pki/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
  --authorization-mode=RBAC --allow-privileged=true "${APISERVER_NET[@]}" \
  --requestheader-client-ca-file="$W/pki/ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- "${GATES[@]}" "${APISERVER_EXTRA[@]}"
# (The requestheader flags only fill kube-system/extension-apiserver-authentication completely;
# without them KCM's delegated authentication logs "missing content for CA bundle" in a loop.
# No front-proxy-client certificate is ever issued.)
# /readyz is readable anonymously (system:public-info-viewer); --cacert checks the serving cert.
api_ready() { [ "$(curl -sS --max-time 5 --cacert "$W/pki/ca.crt" "$API_URL/readyz")" = ok ]; }
wait_ready apiserver "$STARTED_PID" api_ready
log "kube-apiserver ready"

# --- CRDs -------------------------------------------------------------------------------------
export KUBECONFIG=$W/kubeconfig
kubectl() { "$BIN/kubectl" --kubeconfig="$W/kubeconfig" "$@"; }
log "installing CRDs (server-side apply)"
apply_args=()
for f in "${CRD_FILES[@]}"; do apply_args+=(-f "$f"); done
kubectl apply --server-side --field-manager=podgroup-sync-tests "${apply_args[@]}" \
  >"$W/crds.log" 2>&1 || fail crds "kubectl apply of the CRDs failed"
kubectl wait --for=condition=Established --timeout="${READY_TIMEOUT}s" "${apply_args[@]}" \
  >>"$W/crds.log" 2>&1 || fail crds "CRDs not Established"
log "CRDs established"

# --- kube-controller-manager ------------------------------------------------------------------
if [ "$START_KCM" != 0 ]; then
  log "kube-controller-manager (secure port $KCM_PORT)"
  start kcm "$BIN/kube-controller-manager" --kubeconfig="$W/kubeconfig" \
    --authentication-kubeconfig="$W/kubeconfig" --authorization-kubeconfig="$W/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$W/pki/kcm" \
    --leader-elect=false \
    --controllers="$KCM_CONTROLLERS" "${GATES[@]}" \
    --service-account-private-key-file="$W/pki/sa.key" --root-ca-file="$W/pki/ca.crt" \
    --use-service-account-credentials=false
  # /healthz is in KCM's default --authorization-always-allow-paths; its serving cert is self-signed.
  kcm_ready() { [ "$(curl -sSk --max-time 5 "https://127.0.0.1:$KCM_PORT/healthz")" = ok ]; }
  wait_ready kcm "$STARTED_PID" kcm_ready
  log "kube-controller-manager ready"
else
  log "START_KCM=0: no kube-controller-manager (no garbage collection, no namespace deletion)"
fi

{
  printf 'export KUBECONFIG=%q\n' "$W/kubeconfig"
  printf 'export API_URL=%q\n' "$API_URL"
  printf 'export BIN=%q\n' "$BIN"
  printf 'export CRDS=%q\n' "$CRDS"
  printf 'export WORK_DIR=%q\n' "$W"
  printf 'export ETCD_URL=%q\n' "$ETCD_URL"
} > "$W/env"

STARTED_OK=1
log "control plane ready: $API_URL (KUBECONFIG=$W/kubeconfig; stop: $HERE/stop.sh $W)"
echo "KUBECONFIG=$W/kubeconfig"
echo "API_URL=$API_URL"
