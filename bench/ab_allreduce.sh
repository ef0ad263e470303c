#!/bin/sh
# A/B latency of the 2-rank float32 allreduce through the public API, two builds interleaved in
# one run (this machine's numbers drift by up to 2x between runs: compare only within one).
#   bench/ab_allreduce.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS] [OLD_BACKEND] [NEW_BACKEND]
# Each round runs `adaptcomm launch -n 2 -- adaptcomm bench --backend B` of each build,
# alternately; prints the median over rounds of each size's median latency (us) and the ratio
# new/old. Backends default to auto (what a user gets); gloo on both compares the engine alone.
set -eu
old=$1 new=$2 rounds=${3:-6} old_backend=${4:-auto} new_backend=${5:-auto}
sizes=4KiB,256KiB,4MiB,64MiB
out=$(mktemp -d)
for i in $(seq 1 "$rounds"); do
  for which in old new; do
    dir=$old backend=$old_backend
    [ $which = new ] && dir=$new backend=$new_backend
    "$dir/tools/adaptcomm" launch -n 2 -- "$dir/tools/adaptcomm" bench --backend "$backend" --ops allreduce \
      --sizes $sizes --iters 30 --warmup 5 --json 2>/dev/null |
      sed -n 's/^\[rank 0\] //p' >"$out/$which.$i.json"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for which in ("old", "new"):
    for i in range(1, rounds + 1):
        for r in json.load(open(f"{out}/{which}.{i}.json"))["results"]:
            med.setdefault((which, r["bytes"]), []).append(r["median_us"])
print(f"{'size':>10} {'old us':>10} {'new us':>10} {'new/old':>8}")
for size in sorted({b for _, b in med}):
    o, n = statistics.median(med[("old", size)]), statistics.median(med[("new", size)])
    print(f"{size:>10} {o:>10.1f} {n:>10.1f} {n / o:>8.2f}")
PY
rm -rf "$out"
