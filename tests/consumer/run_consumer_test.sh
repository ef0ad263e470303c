#!/bin/sh
# Installs the current build into a scratch prefix and moves the prefix elsewhere (an install must
# be relocatable), then uses it the way a trainer would:
#   0. the installed `adaptcomm profile explain` reads the moved prefix's configs, not the source
#      tree's;
#   1. CMake: find_package(adaptcomm) builds tests/consumer, run by the installed
#      `adaptcomm launch -n 4` (a 4-rank allreduce that must print OK on every rank);
#   2. pkg-config: `pkg-config --cflags --libs adaptcomm` compiles and links a small program.
# Usage: run_consumer_test.sh CMAKE BUILD_DIR SOURCE_DIR CXX LIBDIR
set -eu
CMAKE=$1
BUILD_DIR=$2
SOURCE_DIR=$3
CXX=$4
LIBDIR=$5

work=$(mktemp -d "${TMPDIR:-/tmp}/adaptcomm-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
work=$(cd "$work" && pwd -P)  # the library reports its configs by their resolved path
# Installed into $staging, then used only from $prefix, where it was moved.
staging=$work/staging
prefix=$work/moved/prefix

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# Runs a step with its output in a log that is shown only on failure.
step() {
  name=$1
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    fail "$name: $*"
  fi
}

step install timeout 120 "$CMAKE" --install "$BUILD_DIR" --prefix "$staging"
mkdir -p "$work/moved"
mv "$staging" "$prefix"
for f in include/adaptcomm/adaptcomm.h include/adaptcomm/communicator.h bin/adaptcomm \
         "$LIBDIR/libadaptcomm.so" "$LIBDIR/cmake/adaptcomm/adaptcommConfig.cmake" \
         "$LIBDIR/cmake/adaptcomm/adaptcommConfigVersion.cmake" \
         "$LIBDIR/cmake/adaptcomm/adaptcommTargets.cmake" "$LIBDIR/pkgconfig/adaptcomm.pc"; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
[ -d "$prefix/share/adaptcomm/configs" ] || fail "not installed: share/adaptcomm/configs"
# The installed tool must find the installed library by itself (RPATH $ORIGIN/../lib).
step tool_help timeout 30 "$prefix/bin/adaptcomm" launch --help

# --- configs: found next to the installed library, wherever the prefix went ---
step explain timeout 30 env -u ADAPTCOMM_CONFIG_DIR -u ADAPTCOMM_PROFILE \
  "$prefix/bin/adaptcomm" profile explain --model 70B
profile_file=$(sed -n 's/^ *profile file: *//p' "$work/explain.log")
[ "$profile_file" = "$prefix/share/adaptcomm/configs/profiles.yaml" ] ||
  fail "installed 'profile explain' read '$profile_file', not the moved prefix's configs"

# --- CMake consumer ---
step configure timeout 120 "$CMAKE" -S "$SOURCE_DIR/tests/consumer" -B "$work/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
found=$(sed -n 's/^adaptcomm_DIR:PATH=//p' "$work/build/CMakeCache.txt")
case "$found" in
  "$prefix"/*) ;;
  *) fail "find_package(adaptcomm) used '$found', not the installed package under $prefix" ;;
esac
step build timeout 300 "$CMAKE" --build "$work/build"

set +e
timeout 200 "$prefix/bin/adaptcomm" launch -n 4 --timeout 150 -- "$work/build/consumer" \
  >"$work/run.out" 2>"$work/run.err"
rc=$?
set -e
cat "$work/run.out"
if [ "$rc" -ne 0 ]; then
  cat "$work/run.err" >&2
  fail "4-rank consumer exited with $rc"
fi
for r in 0 1 2 3; do
  grep -q "^\[rank $r\] OK rank $r of 4 sum 10 " "$work/run.out" || fail "rank $r did not print OK"
done

# --- pkg-config consumer ---
export PKG_CONFIG_PATH="$prefix/$LIBDIR/pkgconfig"
flags=$(pkg-config --cflags --libs adaptcomm) || fail "pkg-config --cflags --libs adaptcomm"
# shellcheck disable=SC2086 # the flags are meant to split
step pkgconfig_build "$CXX" -std=c++17 -Wall -Wextra -Werror \
  "$SOURCE_DIR/tests/consumer/pkgconfig_check.cc" -o "$work/pkgconfig_check" $flags
out=$(LD_LIBRARY_PATH="$prefix/$LIBDIR" timeout 30 "$work/pkgconfig_check") ||
  fail "pkg-config program failed"
[ "$out" = "bf16 1" ] || fail "pkg-config program printed '$out', expected 'bf16 1'"

echo "consumer test passed (CMake package, 4-rank allreduce, pkg-config)"
