#!/bin/bash
# 2- and 4-rank float32 allreduce: the shm backend and the Gloo backend (bench/shm_bench) and
# OpenMPI's shared-memory transport (vader), interleaved per round so machine drift hits all alike.
# OpenMPI is a measurement peer only: apt-get install openmpi-bin libopenmpi-dev.
# Both place ranks alike: a core each when there are enough (mpirun's default for 2 ranks,
# shm_bench's --bind-to auto), unbound otherwise (mpirun --oversubscribe, auto with too few cores).
#
#   bench/shm_vs_mpi.sh [build dir] [rounds]   (the *_best columns: GB/s busbw of the best round)
set -euo pipefail
build=${1:-build}
rounds=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d /tmp/shm_vs_mpi.XXXXXX)
mpicc -O2 -o "$out/mpi_allreduce_baseline" "$here/mpi_allreduce_baseline.c"
sizes="4096 262144 4194304 67108864"
for n in 2 4; do
  for s in $sizes; do
    for r in $(seq "$rounds"); do
      "$build/bench/shm_bench" --ranks "$n" --sizes "$s" --rounds 1 >> "$out/ours.$n.$s"
      mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl self,vader \
        "$out/mpi_allreduce_baseline" 1 "$s" >> "$out/mpi.$n.$s"
    done
  done
done
# Per size and transport: the median of the rounds, and the best round. OpenMPI's vader is
# bimodal here: about a third of its launches run 3-4x slower at 4 MiB with more kernel time (its
# CMA single copy), so its best round is the peer at its best; compare like with like.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
best() { sort -n | head -1; }
printf "%-6s %10s %12s %12s %12s %10s %10s %10s %10s %10s\n" ranks bytes shm_us gloo_us mpi_us \
  shm_GBps gloo_GBps mpi_GBps shm_best mpi_best
for n in 2 4; do
  for s in $sizes; do
    shm=$(awk '{print $6}' "$out/ours.$n.$s" | median)
    gloo=$(awk '{print $12}' "$out/ours.$n.$s" | median)
    mpi=$(awk '{print $6}' "$out/mpi.$n.$s" | median)
    shm_best=$(awk '{print $6}' "$out/ours.$n.$s" | best)
    mpi_best=$(awk '{print $6}' "$out/mpi.$n.$s" | best)
    awk -v n="$n" -v s="$s" -v a="$shm" -v g="$gloo" -v m="$mpi" -v ab="$shm_best" \
      -v mb="$mpi_best" 'BEGIN {
      f = 2 * (n - 1) / n
      printf "%-6d %10d %12.1f %12.1f %12.1f %10.3f %10.3f %10.3f %10.3f %10.3f\n", n, s, a, g, m,
             s / a / 1e3 * f, s / g / 1e3 * f, s / m / 1e3 * f, s / ab / 1e3 * f,
             s / mb / 1e3 * f }'
  done
done
rm -rf "$out"
