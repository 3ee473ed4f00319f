#!/usr/bin/env bash
# The configurations CI runs besides the README's test command (the main build, OpenBLAS's own
# choice of kernels, the cpu device):
# - the numerics-sensitive tests under every OpenBLAS kernel set this CPU can run, and in a
#   Release build: our users' CPUs (Intel, AMD; AVX2 or AVX-512) get other kernels than the
#   build machine, and fp32 sums come out in another order. OPENBLAS_CORETYPE forces a kernel
#   set on any x86 machine; SkylakeX needs AVX-512 (it dies with SIGILL without it), so it runs
#   only where /proc/cpuinfo lists avx512f, and says so where it does not. Likewise the CPU
#   device's bfloat16 levels (L3D_CPU_BF16).
# - serving and generation on cpu-async (memory the host cannot read, ops that finish at the
#   next wait). Training, checkpoints, generation and forward on both test devices are in every
#   ctest run, bit for bit against the cpu device (tests/test_parallel_devices.c: every layout
#   kind, precision, offload and resharding; tests/cli_devices.sh).
# A kernel set is left out when it computes what OpenBLAS's own choice computes, which the
# README's run already tested: the same name, or the same weights, bit for bit, after three
# steps of the main job. (Debian 12's OpenBLAS 0.3.21 gives AMD Zen the float32 GEMM of
# Haswell: the same kernel, blocking and unrolling, in KERNEL.ZEN and param.h; cblas_sgemm is
# the only BLAS routine llama3d calls.) The first kernel set left runs in the Release build (the
# two axes in one pass: each only reorders float32 sums, which the tests' derived tolerances
# cover; rerunning the pass with one of them at a time tells which failed), the others in the
# main build.
#   usage: tests/matrix.sh BUILD_DIR     (a configured and built tree; builds BUILD_DIR-release)
set -euo pipefail
build=${1:?usage: matrix.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
# test_parallel's float64 references depend on no kernel, build type or device: compute them
# once for every pass
export L3D_TEST_F64_CACHE=${L3D_TEST_F64_CACHE:-$(cd "$build" && pwd)/tests/f64-cache}
numerics='test_parallel|test_parallel_zero|test_comm_tp2d|test_comm_tp_modes_model|test_parallel_tp2d|test_comm_tp3d|test_parallel_tp3d|test_cpu_norm_rows|test_cpu_ops|test_cpu_vocab|test_cpu_dtypes|test_cpu_grad|test_model|test_trainer|torch_test_forward|torch_test_train'
devices='cli_generate|cli_serve'

pass() {  # pass BUILD_DIR CORETYPE DEVICE TESTS
    echo "== $(basename "$1"), OPENBLAS_CORETYPE=$2, L3D_DEVICE=$3"
    OPENBLAS_CORETYPE=$2 L3D_DEVICE=$3 ctest --test-dir "$1" --output-on-failure -j2 -R "^($4)\$"
}

# OpenBLAS's own choice, as the test programs load it (l3d itself may start again with a better
# set: cli/main.c), and the main job's weights after three steps under a kernel set.
default=$(python3 -c "import ctypes; b = ctypes.CDLL('libopenblas.so.0')
b.openblas_get_corename.restype = ctypes.c_char_p; print(b.openblas_get_corename().decode())")
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
weights() {  # CORETYPE
    OPENBLAS_CORETYPE=$1 "$build/l3d" train --steps 3 --threads 2 --save "$probe/$1" \
        >"$probe/$1.log" 2>&1 || { cat "$probe/$1.log" >&2; exit 1; }
    echo "$probe/$1/model.safetensors"
}
cores=(Haswell Sandybridge)
if grep -qw avx512f /proc/cpuinfo; then
    cores+=(SkylakeX)
else
    echo "matrix.sh: this CPU has no AVX-512: SkylakeX kernels not run here"
fi
run=()
own=$(weights "$default")
for c in "${cores[@]}"; do
    if [ "$c" = "$default" ]; then
        echo "matrix.sh: $c is OpenBLAS's own choice here: the README's run tested it"
    elif cmp -s "$own" "$(weights "$c")"; then
        echo "matrix.sh: $c computes what $default does here (the same weights, bit for bit):" \
            "the README's run tested it"
    else
        run+=("$c")
    fi
done
[ ${#run[@]} -gt 0 ] || run=("$default")

echo "== building $build-release (CMAKE_BUILD_TYPE=Release)"
# (the CUDA device is compiled and checked in the main build; its numerics need a GPU)
cmake -S "$src" -B "$build-release" -DCMAKE_BUILD_TYPE=Release -DL3D_WERROR=ON \
    -DL3D_BUILD_BENCH=OFF -DL3D_WITH_CUDA=OFF >/dev/null
cmake --build "$build-release" -j"$(nproc)" >/dev/null
pass "$build-release" "${run[0]}" cpu "$numerics"
for c in "${run[@]:1}"; do pass "$build" "$c" cpu "$numerics"; done
pass "$build-release" "${run[0]}" cpu-async "$devices"

# The CPU device's bfloat16 products: each level this CPU has besides the default one (auto:
# AMX where present, else widened to float32), on the tests that multiply bfloat16.
bf16_tests='^(test_cpu_dtypes|test_parallel_bf16|test_parallel_cdt|test_loss_scaler)$'
levels=(off)
grep -qw avx512_bf16 /proc/cpuinfo && levels+=(avx512)
grep -qw amx_bf16 /proc/cpuinfo || echo "matrix.sh: this CPU has no AMX-BF16: the AMX kernel not run here"
for l in "${levels[@]}"; do
    echo "== L3D_CPU_BF16=$l"
    L3D_CPU_BF16=$l ctest --test-dir "$build" --output-on-failure -j2 -R "$bf16_tests"
done
