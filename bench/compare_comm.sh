#!/usr/bin/env bash
# compare_comm.sh: llama3d's collectives and point-to-point transfers beside the reference tools
# on this machine: OpenMPI MPI_Allreduce, torch.distributed gloo, ucx_perftest, fabtests'
# fi_pingpong. Two ranks on one machine, every figure the best of $COMPARE_REPS runs (default 3:
# timings here vary by 30-50% from run to run).
#
#   bash bench/compare_comm.sh [BUILD_DIR]      (default ./build; needs BUILD_DIR/l3d)
#
# Progress goes to stderr, one markdown table to stdout: | measurement | llama3d | peer | ratio |,
# ratio = llama3d / peer. A row whose tool or transport is missing reads "n/a (why)".
#
# What is compared, and in which units (all GB/s = 1e9 bytes/s):
# - allreduce, float sum, 1/4/16/64 MiB, busbw of the out-of-place column (nccl-tests' busbw =
#   size/time * 2(n-1)/n): `l3d bench comm` on thread ranks (-t 2, local transport) and on
#   process ranks through `l3d launch` over ucx (UCX_TLS=posix,self) and ofi (FI_PROVIDER=shm),
#   against bench/peers/mpi_allreduce.c (mpirun -np 2) and bench/peers/gloo_allreduce.py
#   (2 processes). Same sizes, 20 timed iterations after 5 warmups, slowest rank's time.
# - allreduce latency, float sum, 8 B, 64 B, 1 KiB, 8 KiB, 64 KiB: the out-of-place time per
#   call in microseconds, from runs of their own (the same l3d commands and OpenMPI peer, 2000
#   timed iterations after 200 warmups), slowest rank's time, the lowest over the repetitions.
#   Target (issue 13): llama3d within 2x of OpenMPI (ratio <= 2) on every transport.
# - the 64 MiB memory bound printed by the local run (busbw <= 2(n-1)/n * B/n, B = measured
#   memcpy bandwidth). Targets: local >= 80% of it, and >= 2.5x OpenMPI at 64 MiB.
# - 64 MiB point to point: `l3d bench comm p2p` (rank 0 streams to rank 1, algbw = size/time)
#   against `ucx_perftest -t tag_bw`, with UCX_TLS=posix,self and UCX_TLS=tcp; `l3d bench comm
#   pingpong` (half round trip, algbw = size/time) against `fi_pingpong -e rdm` with
#   FI_PROVIDER=shm and "tcp;ofi_rxm". Target: llama3d >= 90% of the raw tool.
#
# Environment of this machine (docs: /work/shared/notes/machine-facts.md): OpenMPI refuses root
# unless allowed; UCX and libfabric tcp are pinned to loopback; torch is only in /usr/bin/python3.
set -u -o pipefail

# --help prints the comment above (what is measured, usage, environment) and runs nothing.
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
BUILD=${1:-./build}
L3D=$BUILD/l3d
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPS=${COMPARE_REPS:-3}
TMO=${COMPARE_TIMEOUT:-120}  # seconds per command: a hung transport costs one row, not the run
PY=/usr/bin/python3
SIZES=(1048576 4194304 16777216 67108864)
ITERS=20
WARMUP=5
P2P_BYTES=67108864
SMALL=(8 64 1024 8192 65536)
SMALL_ITERS=2000
SMALL_WARMUP=200
UCX_ITERS=30   # ucx_perftest -n 30, and the same for l3d p2p
FI_ITERS=20    # fi_pingpong -I 20, and the same for l3d pingpong

log() { echo "[compare] $*" >&2; }

if [[ ! -x $L3D ]]; then
    echo "compare_comm.sh: no $L3D (build the l3d target first)" >&2
    exit 2
fi
L3D=$(cd "$(dirname "$L3D")" && pwd)/l3d

WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare_comm.XXXXXX")
PIDS=()
# Every command runs under timeout(1), which makes itself a process group leader: killing the
# group takes its children too (mpirun's ranks, l3d launch's ranks, a server left waiting).
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -TERM -- "-$p" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Transports and tools pinned to loopback for every run.
export UCX_NET_DEVICES=lo FI_TCP_IFACE=lo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# run OUT CMD...: CMD's stdout and stderr into OUT; returns its status (124: timed out). It runs
# in the background and is waited for so that a signal reaches the trap at once.
run() {
    local out=$1 p
    shift
    timeout -k 5 "$TMO" "$@" >"$out" 2>&1 &
    p=$!
    PIDS+=("$p")
    wait "$p"
}

# start_bg OUT CMD...: a server in the background; its pid in BGPID.
BGPID=
start_bg() {
    local out=$1
    shift
    timeout -k 5 "$TMO" "$@" >"$out" 2>&1 &
    BGPID=$!
    PIDS+=("$BGPID")
}

free_port() {
    local code='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
    "$PY" -c "$code" 2>/dev/null || python3 -c "$code"
}

# wait_listen PORT PID: until a TCP socket listens on PORT (or PID died; 10 s at most).
wait_listen() {
    local port=$1 pid=$2 i
    if ! command -v ss >/dev/null; then
        sleep 1
        return
    fi
    for ((i = 0; i < 100; i++)); do
        [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && return
        kill -0 "$pid" 2>/dev/null || return
        sleep 0.1
    done
}

# why OUT RC: a short reason for a failed run, from the last line it printed.
why() {
    local last
    last=$(sed -E 's/^\[rank [0-9]+\] //' "$1" | grep -v '^[[:space:]]*$' | tail -n 1 |
        tr -d '|`' | cut -c1-70)
    if [[ $2 -eq 124 || $2 -eq 137 ]]; then
        echo "timed out after ${TMO}s"
    else
        echo "exit $2${last:+: $last}"
    fi
}

declare -A BEST WHY
# best KEY VALUE: keep the largest value seen for KEY.
best() {
    local key=$1 val=$2
    [[ -n $val ]] || return
    if [[ -z ${BEST[$key]:-} ]] ||
        awk -v a="$val" -v b="${BEST[$key]}" 'BEGIN { exit !(a + 0 > b + 0) }'; then
        BEST[$key]=$val
    fi
}
# low KEY VALUE: keep the smallest value seen for KEY (times).
low() {
    local key=$1 val=$2
    [[ -n $val ]] || return
    if [[ -z ${BEST[$key]:-} ]] ||
        awk -v a="$val" -v b="${BEST[$key]}" 'BEGIN { exit !(a + 0 < b + 0) }'; then
        BEST[$key]=$val
    fi
}
fail() { [[ -n ${BEST[$1]:-} ]] || WHY[$1]=$2; }

# l3d_field OUT SIZE COL: column COL of the table row for SIZE (rank prefixes stripped).
# Columns: 1 size, 7 algbw, 8 busbw (out-of-place).
l3d_field() {
    sed -E 's/^\[rank [0-9]+\] //' "$1" | awk -v s="$2" -v c="$3" '$1 == s { print $c; exit }'
}

# --- what is there -------------------------------------------------------------------------
HAVE_MPI=1 HAVE_GLOO=1 HAVE_UCX=1 HAVE_OFI=1 HAVE_PERFTEST=1 HAVE_PINGPONG=1
MPI_WHY='' GLOO_WHY='' UCX_WHY='' OFI_WHY=''
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    HAVE_MPI=0 MPI_WHY="mpicc/mpirun not installed"
elif ! mpicc -O2 -o "$WORK/mpi_allreduce" "$HERE/peers/mpi_allreduce.c" 2>"$WORK/mpicc.txt"; then
    HAVE_MPI=0 MPI_WHY="mpicc failed: $(head -c 60 "$WORK/mpicc.txt" | tr -d '|\n')"
fi
if ! "$PY" -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null; then
    HAVE_GLOO=0 GLOO_WHY="no torch.distributed in $PY"
fi
command -v ucx_perftest >/dev/null || HAVE_PERFTEST=0
command -v fi_pingpong >/dev/null || HAVE_PINGPONG=0
# A transport that was not built makes `l3d bench comm --transport NAME` fail at once.
for t in ucx ofi; do
    if ! run "$WORK/probe_$t.txt" "$L3D" bench comm allreduce -t 1 -b 8 -e 8 -n 1 -w 0 -c 0 \
        --transport "$t"; then
        r=$(why "$WORK/probe_$t.txt" 1)
        r=${r#exit 1: }
        r="l3d: ${r#l3d bench comm: }"
        if [[ $t == ucx ]]; then HAVE_UCX=0 UCX_WHY=$r; fi
        if [[ $t == ofi ]]; then HAVE_OFI=0 OFI_WHY=$r; fi
    fi
done
log "l3d: $L3D; mpi $HAVE_MPI, gloo $HAVE_GLOO, l3d ucx $HAVE_UCX, l3d ofi $HAVE_OFI," \
    "ucx_perftest $HAVE_PERFTEST, fi_pingpong $HAVE_PINGPONG; best of $REPS"

AR_FLAGS=(allreduce -b 1M -e 64M -f 4 -n "$ITERS" -w "$WARMUP" -c 0 -d float)
LAT_FLAGS=(allreduce -b 8 -e 64K -f 2 -n "$SMALL_ITERS" -w "$SMALL_WARMUP" -c 0 -d float)

# l3d_table KEY OUT COL KEEP SIZES CMD...: run an l3d table, keep column COL of each size of
# the array named SIZES under KEY.SIZE with KEEP (best: largest, low: smallest).
l3d_table() {
    local key=$1 out=$2 col=$3 keep=$4 rc s v
    local -n sizes=$5
    shift 5
    run "$out" "$@"
    rc=$?
    if [[ $rc -ne 0 ]]; then
        for s in "${sizes[@]}"; do fail "$key.$s" "$(why "$out" $rc)"; done
        log "$key: $(why "$out" $rc)"
        return 1
    fi
    for s in "${sizes[@]}"; do
        v=$(l3d_field "$out" "$s" "$col")
        if [[ -n $v && $v != N/A ]]; then "$keep" "$key.$s" "$v"; else fail "$key.$s" "no row"; fi
    done
    log "$key (column $col, sizes ${sizes[*]}): $(for s in "${sizes[@]}"; do
        printf '%s ' "$(l3d_field "$out" "$s" "$col")"; done)"
}
# l3d_allreduce KEY OUT CMD...: busbw (GB/s) per size of SIZES; l3d_latency: the out-of-place
# time (us) per size of SMALL, under KEY.lat.
l3d_allreduce() { local k=$1 o=$2; shift 2; l3d_table "$k" "$o" 8 best SIZES "$@"; }
l3d_latency() { local k=$1 o=$2; shift 2; l3d_table "$k.lat" "$o" 6 low SMALL "$@"; }

# peer_table KEY OUT FIELD KEEP SIZES CMD...: a peer printing `SIZE BUSBW [TIME_US]` lines;
# field FIELD of each size kept under KEY.SIZE.
peer_table() {
    local key=$1 out=$2 f=$3 keep=$4 rc s v
    local -n sizes=$5
    shift 5
    run "$out" "$@"
    rc=$?
    for s in "${sizes[@]}"; do
        v=$(awk -v s="$s" -v f="$f" '$1 == s && NF >= f { print $f; exit }' "$out")
        if [[ $rc -eq 0 && -n $v ]]; then "$keep" "$key.$s" "$v"; else fail "$key.$s" "$(why "$out" $rc)"; fi
    done
    if [[ $rc -ne 0 ]]; then log "$key: $(why "$out" $rc)"; return 1; fi
    log "$key (field $f): $(awk -v f="$f" 'NF >= f { printf "%s ", $f }' "$out")"
}
# peer_allreduce KEY OUT CMD...: busbw per size of SIZES; peer_latency: time per size of SMALL.
peer_allreduce() { local k=$1 o=$2; shift 2; peer_table "$k" "$o" 2 best SIZES "$@"; }
peer_latency() { local k=$1 o=$2; shift 2; peer_table "$k.lat" "$o" 3 low SMALL "$@"; }

# l3d_p2p KEY OUT ITERS OP TRANSPORT ENV...: one 64 MiB p2p or pingpong row over l3d launch.
l3d_p2p() {
    local key=$1 out=$2 iters=$3 op=$4 tr=$5 rc v
    shift 5
    run "$out" env "$@" "$L3D" launch -n 2 --transport "$tr" -- "$L3D" bench comm "$op" \
        -b "$P2P_BYTES" -e "$P2P_BYTES" -n "$iters" -w "$WARMUP" -c 0 -d float
    rc=$?
    v=$(l3d_field "$out" "$P2P_BYTES" 7)
    if [[ $rc -eq 0 && -n $v && $v != N/A ]]; then
        best "$key" "$v"
        log "$key: $v GB/s"
    else
        fail "$key" "$(why "$out" $rc)"
        log "$key: $(why "$out" $rc)"
    fi
}

# perftest KEY TLS: ucx_perftest tag_bw 64 MiB, server and client on 127.0.0.1.
perftest() {
    local key=$1 tls=$2 port srv rc v
    port=$(free_port)
    start_bg "$WORK/$key.srv" env UCX_TLS="$tls" ucx_perftest -p "$port"
    srv=$BGPID
    wait_listen "$port" "$srv"
    run "$WORK/$key.txt" env UCX_TLS="$tls" ucx_perftest 127.0.0.1 -p "$port" -t tag_bw \
        -s "$P2P_BYTES" -n "$UCX_ITERS"
    rc=$?
    # A client that failed leaves the server waiting for it until its timeout.
    [[ $rc -eq 0 ]] || kill -TERM -- "-$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    # The client (the sender) prints `Final: iters p50 avg-overhead overall-overhead
    # avg-MB/s overall-MB/s avg-msg/s overall-msg/s`. Its "MB/s" is 2^20 bytes per second
    # (perftest divides bytes by 1024*1024: 64 MiB in 9783 us prints 6541.7), so GB/s (1e9) is
    # MB/s * 1048576 / 1e9, not MB/s / 1000 (that would understate it by 4.9%).
    v=$(awk '$1 == "Final:" { printf "%.2f", $6 * 1048576 / 1e9; exit }' "$WORK/$key.txt")
    if [[ $rc -eq 0 && -n $v ]]; then
        best "$key" "$v"
        log "$key: $v GB/s"
    else
        fail "$key" "$(why "$WORK/$key.txt" $rc)"
        log "$key: $(why "$WORK/$key.txt" $rc)"
    fi
}

# pingpong KEY PROVIDER: fi_pingpong -e rdm 64 MiB, server and client on 127.0.0.1.
pingpong() {
    local key=$1 prov=$2 port srv rc v
    port=$(free_port)
    local args=(-p "$prov" -e rdm -S "$P2P_BYTES" -I "$FI_ITERS")
    start_bg "$WORK/$key.srv" fi_pingpong "${args[@]}" -B "$port"
    srv=$BGPID
    wait_listen "$port" "$srv"
    run "$WORK/$key.txt" fi_pingpong "${args[@]}" -P "$port" 127.0.0.1
    rc=$?
    # A client that failed leaves the server waiting for it until its timeout.
    [[ $rc -eq 0 ]] || kill -TERM -- "-$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    # Columns: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec. MB/sec is decimal
    # (total bytes / elapsed microseconds; 64 MiB at 12136.8 usec/xfer prints 5529.4), and total
    # counts ping and pong while the time is the round trip, so MB/sec = size / half round trip:
    # the same quantity as l3d pingpong's algbw. GB/s = MB/sec / 1000.
    v=$(awk 'NR > 1 && $1 ~ /^[0-9]/ && NF == 8 { v = $6 }
             END { if (v != "") printf "%.2f", v / 1000 }' "$WORK/$key.txt")
    if [[ $rc -eq 0 && -n $v ]]; then
        best "$key" "$v"
        log "$key: $v GB/s"
    else
        fail "$key" "$(why "$WORK/$key.txt" $rc)"
        log "$key: $(why "$WORK/$key.txt" $rc)"
    fi
}

# --- the runs: repetitions interleaved, so slow spells spread over all figures ---------------
BOUND_PCT='' BOUND_LINE=''
SECONDS=0
for ((rep = 1; rep <= REPS; rep++)); do
    log "--- repetition $rep of $REPS (${SECONDS}s so far)"
    if l3d_allreduce local "$WORK/local.txt" "$L3D" bench comm "${AR_FLAGS[@]}" -t 2; then
        # `# allreduce memory bound at 64 MiB: busbw <= 2(n-1)/n*B/n = 4.06 GB/s; measured
        # out-of-place 3.40 (84%), in-place ...`: keep the run with the best out-of-place share.
        line=$(grep -m1 '^# allreduce memory bound at 64 MiB' "$WORK/local.txt")
        pct=$(sed -nE 's/.*measured out-of-place [0-9.]+ \(([0-9.]+)%\).*/\1/p' <<<"$line")
        if [[ -n $pct ]] && { [[ -z $BOUND_PCT ]] ||
            awk -v a="$pct" -v b="$BOUND_PCT" 'BEGIN { exit !(a + 0 > b + 0) }'; }; then
            BOUND_PCT=$pct BOUND_LINE=$line
        fi
    fi
    if ((HAVE_UCX)); then
        l3d_allreduce ucx "$WORK/ucx.txt" env UCX_TLS=posix,self "$L3D" launch -n 2 \
            --transport ucx -- "$L3D" bench comm "${AR_FLAGS[@]}"
    fi
    if ((HAVE_OFI)); then
        l3d_allreduce ofi "$WORK/ofi.txt" env FI_PROVIDER=shm "$L3D" launch -n 2 \
            --transport ofi -- "$L3D" bench comm "${AR_FLAGS[@]}"
    fi
    if ((HAVE_MPI)); then
        peer_allreduce mpi "$WORK/mpi.txt" mpirun --allow-run-as-root --oversubscribe -np 2 \
            "$WORK/mpi_allreduce" "$ITERS" "$WARMUP" "${SIZES[@]}"
    fi
    l3d_latency local "$WORK/local_lat.txt" "$L3D" bench comm "${LAT_FLAGS[@]}" -t 2
    if ((HAVE_UCX)); then
        l3d_latency ucx "$WORK/ucx_lat.txt" env UCX_TLS=posix,self "$L3D" launch -n 2 \
            --transport ucx -- "$L3D" bench comm "${LAT_FLAGS[@]}"
    fi
    if ((HAVE_OFI)); then
        l3d_latency ofi "$WORK/ofi_lat.txt" env FI_PROVIDER=shm "$L3D" launch -n 2 \
            --transport ofi -- "$L3D" bench comm "${LAT_FLAGS[@]}"
    fi
    if ((HAVE_MPI)); then
        peer_latency mpi "$WORK/mpi_lat.txt" mpirun --allow-run-as-root --oversubscribe -np 2 \
            "$WORK/mpi_allreduce" "$SMALL_ITERS" "$SMALL_WARMUP" "${SMALL[@]}"
    fi
    if ((HAVE_GLOO)); then
        peer_allreduce gloo "$WORK/gloo.txt" "$PY" "$HERE/peers/gloo_allreduce.py" --nranks 2 \
            --iters "$ITERS" --warmup "$WARMUP" "${SIZES[@]}"
    fi
    if ((HAVE_UCX)); then
        l3d_p2p p2p_shm "$WORK/p2p_shm.txt" "$UCX_ITERS" p2p ucx UCX_TLS=posix,self
        l3d_p2p p2p_tcp "$WORK/p2p_tcp.txt" "$UCX_ITERS" p2p ucx UCX_TLS=tcp
    fi
    if ((HAVE_PERFTEST)); then
        perftest perf_shm posix,self
        perftest perf_tcp tcp
    fi
    if ((HAVE_OFI)); then
        l3d_p2p pp_shm "$WORK/pp_shm.txt" "$FI_ITERS" pingpong ofi FI_PROVIDER=shm
        l3d_p2p pp_tcp "$WORK/pp_tcp.txt" "$FI_ITERS" pingpong ofi "FI_PROVIDER=tcp;ofi_rxm"
    fi
    if ((HAVE_PINGPONG)); then
        pingpong fpp_shm shm
        pingpong fpp_tcp "tcp;ofi_rxm"
    fi
done
log "done in ${SECONDS}s"

# --- the table ----------------------------------------------------------------------------
# cell KEY [DEFAULT-WHY]: the best figure, or "n/a (why)".
cell() {
    if [[ -n ${BEST[$1]:-} ]]; then
        printf '%.2f' "${BEST[$1]}"
    else
        printf 'n/a (%s)' "${WHY[$1]:-${2:-not run}}"
    fi
}
# ratio A B [TARGET]: A/B, with a verdict against TARGET when given.
ratio() {
    local a=${BEST[$1]:-} b=${BEST[$2]:-} target=${3:-}
    if [[ -z $a || -z $b ]]; then
        printf 'n/a'
        return
    fi
    awk -v a="$a" -v b="$b" -v t="$target" 'BEGIN {
        if (b + 0 <= 0) { printf "n/a"; exit }
        r = a / b; printf "%.2f", r
        if (t != "") printf (r >= t ? " (meets >= %s)" : " (below %s)"), t
    }'
}
# ratio_low A B TARGET: A/B for times, with a verdict against an upper TARGET.
ratio_low() {
    local a=${BEST[$1]:-} b=${BEST[$2]:-} target=$3
    if [[ -z $a || -z $b ]]; then
        printf 'n/a'
        return
    fi
    awk -v a="$a" -v b="$b" -v t="$target" 'BEGIN {
        if (b + 0 <= 0) { printf "n/a"; exit }
        r = a / b; printf "%.2f", r
        printf (r <= t ? " (meets <= %s)" : " (above %s)"), t
    }'
}
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4"; }
size_name() { if (($1 >= 1024)); then echo "$(($1 / 1024)) KiB"; else echo "$1 B"; fi; }
mib() { echo "$(($1 / 1048576)) MiB"; }

echo "| measurement | llama3d | peer | ratio |"
echo "|---|---|---|---|"
for s in "${SIZES[@]}"; do
    t=
    [[ $s -eq 67108864 ]] && t=2.5
    row "allreduce $(mib "$s") busbw GB/s: local -t 2 vs OpenMPI${t:+ (target >= ${t}x)}" \
        "$(cell "local.$s")" "$(cell "mpi.$s" "$MPI_WHY")" "$(ratio "local.$s" "mpi.$s" "$t")"
    row "allreduce $(mib "$s") busbw GB/s: local -t 2 vs torch gloo" \
        "$(cell "local.$s")" "$(cell "gloo.$s" "$GLOO_WHY")" "$(ratio "local.$s" "gloo.$s")"
    row "allreduce $(mib "$s") busbw GB/s: ucx posix,self (processes) vs OpenMPI" \
        "$(cell "ucx.$s" "$UCX_WHY")" "$(cell "mpi.$s" "$MPI_WHY")" "$(ratio "ucx.$s" "mpi.$s")"
    row "allreduce $(mib "$s") busbw GB/s: ofi shm (processes) vs OpenMPI" \
        "$(cell "ofi.$s" "$OFI_WHY")" "$(cell "mpi.$s" "$MPI_WHY")" "$(ratio "ofi.$s" "mpi.$s")"
done
for s in "${SMALL[@]}"; do
    for tr in local ucx ofi; do
        case $tr in
            local) what="local -t 2" trw='' ;;
            ucx) what="ucx posix,self (processes)" trw=$UCX_WHY ;;
            ofi) what="ofi shm (processes)" trw=$OFI_WHY ;;
        esac
        row "allreduce $(size_name "$s") time us: $what vs OpenMPI (target <= 2x)" \
            "$(cell "$tr.lat.$s" "$trw")" "$(cell "mpi.lat.$s" "$MPI_WHY")" \
            "$(ratio_low "$tr.lat.$s" "mpi.lat.$s" 2)"
    done
done
if [[ -n $BOUND_LINE ]]; then
    bound=$(sed -nE 's/.*= ([0-9.]+) GB\/s;.*/\1/p' <<<"$BOUND_LINE")
    meas=$(sed -nE 's/.*measured out-of-place ([0-9.]+) .*/\1/p' <<<"$BOUND_LINE")
    verdict=$(awk -v p="$BOUND_PCT" 'BEGIN { print (p + 0 >= 80 ? "meets >= 80%" : "below 80%") }')
    row "allreduce 64 MiB local busbw vs memory bound 2(n-1)/n*B/n, GB/s (target >= 80%)" \
        "$meas" "$bound (bound)" "${BOUND_PCT}% ($verdict)"
else
    row "allreduce 64 MiB local vs memory bound (target >= 80%)" "n/a (no bound line)" "n/a" "n/a"
fi
PERF_WHY="ucx_perftest not installed"
PP_WHY="fi_pingpong not installed"
row "p2p 64 MiB GB/s, UCX_TLS=posix,self: l3d p2p vs ucx_perftest tag_bw (target >= 0.9)" \
    "$(cell p2p_shm "$UCX_WHY")" "$(cell perf_shm "$PERF_WHY")" "$(ratio p2p_shm perf_shm 0.9)"
row "p2p 64 MiB GB/s, UCX_TLS=tcp: l3d p2p vs ucx_perftest tag_bw (target >= 0.9)" \
    "$(cell p2p_tcp "$UCX_WHY")" "$(cell perf_tcp "$PERF_WHY")" "$(ratio p2p_tcp perf_tcp 0.9)"
row "pingpong 64 MiB GB/s, FI_PROVIDER=shm: l3d pingpong vs fi_pingpong (target >= 0.9)" \
    "$(cell pp_shm "$OFI_WHY")" "$(cell fpp_shm "$PP_WHY")" "$(ratio pp_shm fpp_shm 0.9)"
row "pingpong 64 MiB GB/s, FI_PROVIDER=tcp;ofi_rxm: l3d pingpong vs fi_pingpong (target >= 0.9)" \
    "$(cell pp_tcp "$OFI_WHY")" "$(cell fpp_tcp "$PP_WHY")" "$(ratio pp_tcp fpp_tcp 0.9)"
