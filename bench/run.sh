#!/usr/bin/env bash
# The scale benchmark of issue 7: builds the release controller, runs
# `cargo bench --bench scale -- ARGS...` (which starts its own control planes and writes
# RESULTS.md, summary.json, curves.csv and per-job CSVs into its --out directory), then draws
# scale.png with matplotlib from a venv it keeps in ~/.cache/podgroup-sync/bench-venv.
#
# usage: bench/run.sh [--publish] [--no-plot] [BENCH ARGS...]
#   BENCH ARGS  passed to the benchmark, e.g. --jobs 5000 --namespaces 100 --concurrency 16
#               --skip-training-operator --out DIR (see `cargo bench --bench scale -- --help`);
#               default --out: target/bench/scale-<unix time>
#   --publish   copy RESULTS.md, scale.png, summary.json and curves.csv into bench/results/
#   --no-plot   no venv, no plot (CI smoke)
#   --smoke     no separate release build of the controller: the one `cargo bench` builds beside
#               the benchmark is used (its tokio has the test features of the dev-dependencies
#               unified in; one release build instead of two, about 3 minutes less on 2 cores).
#               The published matrix (`make bench`) measures the plain `cargo build --release`.
# Exit status: the benchmark's (non-zero only when a PodGroup is missing or wrong, or a restart
# wrote one; never on timing).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
VENV=$PGS_CACHE/bench-venv
CARGO=${CARGO:-cargo}

publish=0 plot=1 smoke=0 out='' args=()
while [ $# -gt 0 ]; do
  case $1 in
    --publish) publish=1 ;;
    --no-plot) plot=0 ;;
    --smoke) smoke=1 ;;
    --out) [ $# -ge 2 ] || { echo "run.sh: --out needs a directory" >&2; exit 2; }
           out=$2; args+=(--out "$2"); shift ;;
    --out=*) out=${1#*=}; args+=("$1") ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ -z "$out" ]; then
  out=$ROOT/target/bench/scale-$(date +%s)
  args+=(--out "$out")
fi
mkdir -p "$out"

cd "$ROOT"
echo "[bench] load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
[ "$smoke" = 1 ] || $CARGO build --release --bin podgroup-sync
rc=0
$CARGO bench --bench scale -- "${args[@]}" || rc=$?

if [ "$plot" = 1 ] && { [ -f "$out/curves.csv" ] || [ -f "$out/growth.csv" ]; }; then
  if ! "$VENV/bin/python" -c 'import matplotlib' >/dev/null 2>&1; then
    echo "[bench] creating $VENV with matplotlib" >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check 'matplotlib>=3.8,<4'
  fi
  # A matrix: its growth plot, and the convergence plot of each run.
  for d in "$out" "$out"/*/; do
    [ -f "$d/curves.csv" ] || [ -f "$d/growth.csv" ] || continue
    "$VENV/bin/python" "$HERE/plot.py" "$d" || { echo "[bench] plotting $d failed" >&2; [ "$rc" != 0 ] || rc=1; }
  done
fi

if [ "$publish" = 1 ]; then
  mkdir -p "$HERE/results"
  for f in RESULTS.md scale.png summary.json curves.csv growth.png growth.csv matrix.json; do
    [ -f "$out/$f" ] && cp "$out/$f" "$HERE/results/$f"
  done
  # A matrix: the convergence plot of its first run at the ratio size.
  first=$(ls -d "$out"/*-run1 2>/dev/null | head -1)
  if [ -n "$first" ] && [ -f "$first/scale.png" ]; then
    cp "$first/scale.png" "$HERE/results/scale.png"
  fi
  echo "[bench] published into $HERE/results" >&2
fi
echo "[bench] results: $out/RESULTS.md" >&2
exit "$rc"
