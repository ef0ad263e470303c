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
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${src}/build-gpu-check}"
jobs="$(nproc 2>/dev/null || echo 2)"

echo "== adaptcomm gpu check: building in ${build}"
mkdir -p "${build}"
cmake -S "${src}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DADAPTCOMM_WITH_CUDA=ON \
  -DADAPTCOMM_BUILD_TESTS=OFF -DADAPTCOMM_BUILD_TOOLS=OFF -DADAPTCOMM_BUILD_EXAMPLES=OFF \
  -DADAPTCOMM_BUILD_BENCH=ON >"${build}/gpu_check.cmake.log" 2>&1 || {
  cat "${build}/gpu_check.cmake.log"; echo "FAIL: cmake (see above)"; exit 1; }
cmake --build "${build}" --target gpu_check -j "${jobs}" >"${build}/gpu_check.build.log" 2>&1 || {
  tail -50 "${build}/gpu_check.build.log"; echo "FAIL: build (see above)"; exit 1; }

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
