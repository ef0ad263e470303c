#!/bin/bash
# What protection costs: the 2-rank (or N-rank) float32 allreduce through `adaptcomm launch` +
# `adaptcomm bench` with the default profile (retry on, retry.replay auto), with protection off
# (retry.max_attempts: 1) and with per-op copies (retry.replay: copy), on shm and on Gloo, and
# OpenMPI's shared memory (vader) when mpirun is installed (apt-get install openmpi-bin
# libopenmpi-dev; a measurement peer only). Rounds are interleaved so machine drift hits all alike;
# prints the median over rounds of each run's median latency (us) and the ratios to "off" and to
# OpenMPI.
#   [BACKENDS="shm gloo"] bench/protect_cost.sh [build dir] [rounds] [ranks]
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
ranks=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/protect_cost.XXXXXX)
sizes=4KiB,256KiB,4MiB,64MiB
base="$here/../configs/profiles.yaml"
sed 's/^    max_attempts: 3 .*/    max_attempts: 1/' "$base" >"$out/off.yaml"
sed 's/^    replay: auto .*/    replay: copy/' "$base" >"$out/copy.yaml"
grep -q 'max_attempts: 1$' "$out/off.yaml" && grep -q 'replay: copy$' "$out/copy.yaml"
mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -o "$out/mpi_allreduce_baseline" "$here/mpi_allreduce_baseline.c" && mpi=1
fi
backends=${BACKENDS:-shm gloo}
modes=(default off copy)
for r in $(seq "$rounds"); do
  for backend in $backends; do
    # The order of the modes rotates from round to round: the first run after another backend's
    # pays for what that one left behind (page cache, the scheduler's placement).
    for k in 0 1 2; do
      mode=${modes[$(((r + k) % 3))]}
      profile=$base
      [ $mode != default ] && profile="$out/$mode.yaml"
      ADAPTCOMM_PROFILE=$profile "$build/tools/adaptcomm" launch -n "$ranks" -- \
        "$build/tools/adaptcomm" bench --backend $backend --ops allreduce --sizes $sizes \
        --iters 30 --warmup 5 --json 2>/dev/null | sed -n 's/^\[rank 0\] //p' \
        >"$out/$backend.$mode.$r.json"
    done
  done
  if [ $mpi = 1 ]; then
    for s in 4096 262144 4194304 67108864; do
      mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl self,vader \
        "$out/mpi_allreduce_baseline" 1 "$s" 2>/dev/null >>"$out/mpi.$s"
      # Timed as `adaptcomm bench` times ours: refill, barrier, one op, slowest rank, median.
      ADAPTCOMM_MPI_PER_OP=30 mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
        -x ADAPTCOMM_MPI_PER_OP --mca btl self,vader "$out/mpi_allreduce_baseline" 1 "$s" \
        2>/dev/null >>"$out/mpi_per_op.$s"
    done
  fi
done
python3 - "$out" "$rounds" "$mpi" <<'PY'
import json, os, statistics, sys
out, rounds, mpi = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
med = {}
backends = os.environ.get("BACKENDS", "shm gloo").split()
for backend in backends:
    for mode in ("default", "off", "copy"):
        for r in range(1, rounds + 1):
            for x in json.load(open(f"{out}/{backend}.{mode}.{r}.json"))["results"]:
                med.setdefault((backend, mode, x["bytes"]), []).append(x["median_us"])
ompi, ompi_op = {}, {}
if mpi:
    for s in (4096, 262144, 4194304, 67108864):
        # "<n> ranks <bytes> B  mpi <us> us ..." (bench/mpi_allreduce_baseline.c)
        vals = [float(l.split()[5]) for l in open(f"{out}/mpi.{s}") if " mpi " in l]
        ompi[s] = statistics.median(vals)
        vals = [float(l.split()[5]) for l in open(f"{out}/mpi_per_op.{s}") if " mpi " in l]
        ompi_op[s] = statistics.median(vals)
# ompi: OpenMPI's back-to-back mean (its best case); ompi/op: timed as ours are, one op after a
# barrier, the slowest rank (def/ompi divides by this one: like with like).
print(f"{'backend':>7} {'bytes':>9} {'default':>9} {'off':>9} {'copy':>9} {'def/off':>8} "
      f"{'copy/off':>8} {'def/ompi':>8} {'ompi/op':>9} {'ompi':>9}")
for backend in backends:
    for size in sorted({b for (be, _, b) in med if be == backend}):
        d, o, c = (statistics.median(med[(backend, m, size)]) for m in ("default", "off", "copy"))
        m, b2b = ompi_op.get(size), ompi.get(size)
        print(f"{backend:>7} {size:>9} {d:>9.1f} {o:>9.1f} {c:>9.1f} {d / o:>8.2f} {c / o:>8.2f} "
              + (f"{d / m:>8.2f} {m:>9.1f} {b2b:>9.1f}" if m else f"{'-':>8} {'-':>9} {'-':>9}"))
PY
rm -rf "$out"
