#!/bin/sh
# Installs what adaptcomm needs from Debian 12's packages, skipping what is already there.
#   scripts/install-deps.sh        build + demo dependencies (with the Redis and etcd store clients'
#                                  libraries: hiredis, libcurl; cpp-httplib for the metrics server)
#   scripts/install-deps.sh test   also what the test suite uses (gmock, clang's libFuzzer, the
#                                  redis-server and etcd servers the external-store tests start,
#                                  and the Prometheus server that scrapes the demo)
set -eu
packages="build-essential cmake pkg-config libgloo-dev libyaml-cpp-dev libabsl-dev libgtest-dev
  libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libhiredis-dev libcurl4-openssl-dev
  libcpp-httplib-dev"
if [ "${1:-}" = test ]; then
  packages="$packages clang libclang-rt-14-dev iproute2 redis-server etcd-server prometheus"
fi
missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi
