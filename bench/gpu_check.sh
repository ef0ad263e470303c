#!/usr/bin/env bash
# GPU check of the NCCL backend: builds adaptcomm with CUDA (its own build directory) and runs
# bench/gpu_check: every collective x dtype on NCCL (one process per GPU; with one GPU, world 1 and
# two communicators in one process), a stalled stream that must time out and abort, allreduce busbw
# 1 MiB..1 GiB (nccl-tests' definition) on NCCL and on the Gloo-staged path, the host overhead of a
# stream-ordered allreduce against ncclAllReduce itself, and its overlap with a busy stream.
# Self-contained: no downloads. Without a GPU it says "no GPU" and exits 0.
# The engine's GPU targets (host overhead, overlap, the stalled stream) run first, so a run cut by
# its bound (GPU_CHECK_BOUND_S, default 420 s: with the build it fits a 10-minute session) has them.
#   bench/gpu_check.sh [build-dir]        (default: build-gpu-check next to this tree's sources)
#
# Mode two-rank-abort: two ranks on GPU 0 (one process each, distinct NCCL_HOSTID so that NCCL
# accepts two ranks of one device, loopback sockets, IB off); rank 1 stops mid-allreduce, rank 0's
# communicator is aborted while a consumer kernel on the trainer's stream waits for the result; no
# committed step (and no op reported OK) may have let the consumer see a partial sum
# (bench/gpu_check_abort.cc; docs/gpu.md). Then a Split of a fresh communicator: its child must be
# built by ncclCommSplit and sum exactly; then a stream-ordered group (a receive, an allreduce and a
# send in one ncclGroupStart/ncclGroupEnd) whose consumer kernel after Wait() must see exact
# results. The ranks run under `timeout 280`
# (GPU_CHECK_ABORT_BOUND_S); without a GPU it says "no CUDA device" and exits 77 (skip).
#   bench/gpu_check.sh two-rank-abort [build-dir]
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=full
if [[ "${1:-}" == "two-rank-abort" ]]; then
  mode=two-rank-abort
  shift
fi
build="${1:-${src}/build-gpu-check}"
jobs="$(nproc 2>/dev/null || echo 2)"

echo "== adaptcomm gpu check: building in ${build}"
mkdir -p "${build}"
cmake -S "${src}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DADAPTCOMM_WITH_CUDA=ON \
  -DADAPTCOMM_BUILD_TESTS=OFF -DADAPTCOMM_BUILD_TOOLS=OFF -DADAPTCOMM_BUILD_EXAMPLES=OFF \
  -DADAPTCOMM_BUILD_BENCH=ON >"${build}/gpu_check.cmake.log" 2>&1 || {
  cat "${build}/gpu_check.cmake.log"; echo "FAIL: cmake (see above)"; exit 1; }
target=gpu_check
[[ "${mode}" == two-rank-abort ]] && target=gpu_check_abort
cmake --build "${build}" --target "${target}" -j "${jobs}" >"${build}/${target}.build.log" 2>&1 || {
  tail -50 "${build}/${target}.build.log"
  echo "FAIL: build of ${target} (see above; gpu_check_abort needs nvcc: 'CUDA cast kernels' in"
  echo "      ${build}/gpu_check.cmake.log)"
  exit 1; }

if [[ "${mode}" == two-rank-abort ]]; then
  exe="${build}/bench/gpu_check_abort"
  rc=0
  "${exe}" --probe || rc=$?
  (( rc == 77 )) && exit 77  # "no CUDA device ...", printed by the probe
  (( rc != 0 )) && { echo "FAIL: gpu_check_abort --probe exited ${rc}"; exit 1; }
  nvidia-smi -L 2>/dev/null || true
  port="$("${exe}" --free-port)"
  bound="${GPU_CHECK_ABORT_BOUND_S:-280}"
  echo "== two-rank-abort: 2 ranks on GPU 0, store on 127.0.0.1:${port}, bounded by ${bound} s"
  export ADAPTCOMM_LOG_LEVEL="${ADAPTCOMM_LOG_LEVEL:-warning}"
  pids=()
  for r in 0 1; do
    # NCCL refuses two ranks of one device on one host ("Duplicate GPU detected"); a distinct
    # NCCL_HOSTID makes the ranks look like two hosts, which then talk over sockets (lo, IB off;
    # no P2P, SHM or NVLS between them).
    RANK="${r}" WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT="${port}" \
      ADAPTCOMM_CUDA_DEVICE=0 GLOO_SOCKET_IFNAME=lo NCCL_HOSTID="adaptcomm-two-rank-abort-${r}" \
      NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_NVLS_ENABLE=0 \
      timeout --kill-after=10 "${bound}" "${exe}" > >(sed -u "s/^/[rank ${r}] /") 2>&1 &
    pids+=("$!")
  done
  failed=0
  for r in 0 1; do
    rc=0
    wait "${pids[${r}]}" || rc=$?
    if (( rc == 124 || rc == 137 )); then
      echo "rank ${r}: killed by the ${bound} s bound (exit ${rc})"
    fi
    (( rc == 0 )) || failed=$((failed + 1))
  done
  sleep 0.5  # the rank's last lines, through sed
  if (( failed == 0 )); then
    echo "PASS: two-rank-abort: no consumer saw a partial sum in a committed step or an OK op"
    exit 0
  fi
  echo "FAIL: two-rank-abort: ${failed} of 2 ranks failed (see the lines above)"
  exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>/dev/null || true
  nvidia-smi topo -m 2>/dev/null || true
else
  echo "nvidia-smi not found"
fi
bound="${GPU_CHECK_BOUND_S:-420}"
echo "== running gpu_check (bounded by ${bound} s)"
export ADAPTCOMM_LOG_LEVEL="${ADAPTCOMM_LOG_LEVEL:-warning}"
exec timeout --kill-after=10 "${bound}" "${build}/bench/gpu_check"
