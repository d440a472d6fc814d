#!/usr/bin/env bash
# Runs a command inside a network namespace of its own (unshare --net), the way the node tier
# runs: inside it are only its loopback (up) and one bridge, pgsbr0, holding the node's address
# NODE_IP/24 (default 10.244.0.1), to which the CNI bridge plugin attaches the pods. The control
# plane, the kubelet, containerd, kube-proxy, the pods and the test itself then talk over addresses
# that exist only in this namespace; nothing is reachable from, or reaches, the machine's own
# network. Service IPs (SERVICE_CIDR, tests/cluster/start.sh's --service-cluster-ip-range) are
# routed to the bridge, so that kube-proxy's rules translate them for the processes of the
# namespace itself (the API server calling the webhook, the test scraping /metrics), as they do
# for the pods, whose default route is the bridge. The namespace ends with the last process in
# it: nothing to clean up.
#
# usage: netns.sh CMD [ARGS...]
# environment: NODE_IP (default 10.244.0.1), SERVICE_CIDR (default 10.0.0.0/24)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
if [ "${PGS_NODE_NETNS:-}" != "$$" ]; then
  # Re-run this script in a new network namespace; the marker is the PID it will have there.
  exec unshare --net --fork -- bash -c 'PGS_NODE_NETNS=$$ exec "$0" "$@"' "$0" "$@"
fi
NODE_IP=${NODE_IP:-10.244.0.1}
ip link set lo up
ip link add pgsbr0 type bridge
ip addr add "$NODE_IP/24" dev pgsbr0
ip link set pgsbr0 up
ip route add "${SERVICE_CIDR:-10.0.0.0/24}" dev pgsbr0 src "$NODE_IP"
export NODE_IP
unset PGS_NODE_NETNS
exec "$@"
