# Sourced by the CLI tests that run a job over each network transport this l3d has.
# network_transports L3D: their names, one line, from launch's list of the built ones; local
# (threads, not processes) left out, and nccl unless this machine has a GPU (one per rank:
# tests/cli_nccl.sh and tools/gpu-check.sh run it).
network_transports() {
  local t out=""
  for t in $("$1" launch -n 1 --transport nosuch -- true 2>&1 | sed -nE 's/.*\(built: ([^)]*)\).*/\1/p' | tr -d ,); do
    [ "$t" = local ] && continue
    [ "$t" = nccl ] && [ ! -e /dev/nvidiactl ] && continue
    out="$out $t"
  done
  echo $out
}
