#!/usr/bin/env bash
# The numerics-sensitive tests under every OpenBLAS kernel set this CPU can run, and in a
# Release build: our users' CPUs (Intel, AMD; AVX2 or AVX-512) get other kernels than the
# build machine, and fp32 sums come out in another order. OPENBLAS_CORETYPE forces a kernel
# set on any x86 machine; SkylakeX needs AVX-512 (it dies with SIGILL without it), so it runs
# only where /proc/cpuinfo lists avx512f, and says so where it does not. Likewise the CPU
# device's bfloat16 levels (L3D_CPU_BF16).
#   usage: tests/kernels.sh BUILD_DIR     (a configured and built tree; builds BUILD_DIR-release)
set -euo pipefail
build=${1:?usage: kernels.sh BUILD_DIR}
# test_parallel's float64 references depend on no kernel or build type: compute them once
export L3D_TEST_F64_CACHE=${L3D_TEST_F64_CACHE:-$(cd "$build" && pwd)/tests/f64-cache}
tests='^(test_parallel|test_parallel_zero|test_comm_tp2d|test_comm_tp_modes_model|test_parallel_tp2d|test_comm_tp3d|test_parallel_tp3d|test_cpu_norm_rows|test_cpu_ops|test_cpu_vocab|test_cpu_dtypes|test_cpu_grad|test_model|test_trainer|torch_test_forward|torch_test_train)$'
cores=(Haswell Sandybridge)
if grep -qw avx512f /proc/cpuinfo; then
    cores+=(SkylakeX)
else
    echo "kernels.sh: this CPU has no AVX-512: SkylakeX kernels not run here"
fi
for c in "${cores[@]}"; do
    echo "== OPENBLAS_CORETYPE=$c"
    OPENBLAS_CORETYPE=$c ctest --test-dir "$build" --output-on-failure -j2 -R "$tests"
done
# The CPU device's bfloat16 products: each level this CPU has besides the default one (auto:
# AMX where present, else widened to float32), on the tests that multiply bfloat16.
bf16_tests='^(test_cpu_dtypes|test_parallel_bf16|test_parallel_cdt|test_loss_scaler)$'
levels=(off)
grep -qw avx512_bf16 /proc/cpuinfo && levels+=(avx512)
grep -qw amx_bf16 /proc/cpuinfo || echo "kernels.sh: this CPU has no AMX-BF16: the AMX kernel not run here"
for l in "${levels[@]}"; do
    echo "== L3D_CPU_BF16=$l"
    L3D_CPU_BF16=$l ctest --test-dir "$build" --output-on-failure -j2 -R "$bf16_tests"
done
echo "== CMAKE_BUILD_TYPE=Release"
# (the CUDA device is compiled and checked in the main build; its numerics need a GPU)
cmake -S "$(dirname "$0")/.." -B "$build-release" -DCMAKE_BUILD_TYPE=Release -DL3D_WERROR=ON \
    -DL3D_BUILD_BENCH=OFF -DL3D_WITH_CUDA=OFF >/dev/null
cmake --build "$build-release" -j"$(nproc)" >/dev/null
ctest --test-dir "$build-release" --output-on-failure -j2 -R "$tests"
