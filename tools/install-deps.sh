#!/usr/bin/env bash
# Installs llama3d's build and test dependencies from Debian 12 packages (run as root).
# Idempotent: apt-get skips what is already there.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential cmake pkg-config git
      libjansson-dev libopenblas-dev libpcre2-dev
      libcriterion-dev python3-torch python3-numpy
      libucx-dev ucx-utils libfabric-dev libfabric-bin libopenmpi-dev openmpi-bin
      clang libclang-rt-14-dev
      protobuf-compiler python3-crcmod  # tests/cli_monitor.sh reads the monitors' files
      time bsdutils util-linux)  # /usr/bin/time, script and setpriv for tests/cli_data_mem.sh
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi
