#!/usr/bin/env bash
# Registers, shared memory, stack and spills of every CUDA kernel llama3d builds, per
# architecture: ptxas's own report (-Xptxas -v), as a table. Needs nvcc, not a GPU.
# Usage: tools/cuda-report.sh [ARCHS]     (default "80 90"; the build's own architectures)
# Exit 1 if a kernel spills (the build refuses that too: -Xptxas --warn-on-spills,-Werror).
set -u
cd "$(dirname "$0")/.."
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "cuda-report: no nvcc (set CUDACXX)"; exit 2; }
archs=${1:-"80 90"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '| file | kernel | sm | registers | shared bytes | stack bytes | spill stores / loads |\n'
printf '|---|---|---|---|---|---|---|\n'
spills=0
for f in devices/cuda/*.cu; do
  for a in $archs; do
    "$NVCC" -std=c++20 -O3 -I. -Iinclude -arch=sm_$a -Xptxas -v -Xcompiler -fno-exceptions \
      -c "$f" -o "$tmp/o.o" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
    # ptxas: "Compiling entry function 'NAME' for 'sm_90'", then its stack/spills and
    # "Used R registers, used B barriers, S bytes smem" lines
    awk -v file="$(basename "$f")" -v sm="$a" '
      /Compiling entry function/ { k = $0; sub(/.*function .?/, "", k); sub(/.? for .*/, "", k); name = k; smem = 0 }
      /bytes stack frame/ { st = $1; ss = $5; sl = $9 }
      /Used [0-9]+ registers/ {
        r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
        if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", file, name, sm, r, smem, st, ss " / " sl
      }' "$tmp/log" >>"$tmp/rows"
  done
done
# demangled kernel names, one row per kernel and architecture
while IFS=$'\t' read -r file name sm r smem st sp; do
  dn=$(echo "$name" | c++filt 2>/dev/null || echo "$name")
  dn=${dn%%(*}
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$file" "$dn" "$sm" "$r" "$smem" "$st" "$sp"
  case $sp in "0 / 0") ;; *) spills=$((spills + 1)) ;; esac
done <"$tmp/rows"
[ "$spills" -eq 0 ] || { echo "cuda-report: $spills kernel(s) spill"; exit 1; }
