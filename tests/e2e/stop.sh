#!/usr/bin/env bash
# Stops the e2e components started by tests/e2e/start.sh WORK_DIR: exactly the PIDs listed in
# WORK_DIR/pids whose command line still names WORK_DIR (SIGTERM, then SIGKILL after STOP_GRACE
# seconds). The same procedure as the control plane's stop script, which it runs. Idempotent.
#
# usage: stop.sh WORK_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 WORK_DIR" >&2; exit 2; }
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../cluster/stop.sh" "$1"
