#!/usr/bin/env bash
# The layout suites and the CLI's training, saving, generation and serving on the test devices
# (devices/cpu_test/cpu_test.h): cpu-opaque (memory the host cannot read) and cpu-async (ops
# that finish at the next wait). The layout tests compare with the same float64 references as
# on the cpu device; tests/test_parallel_devices.c and tests/cli_devices.sh (in every ctest
# run) require the cpu device's results bit for bit.
#   usage: tests/devices.sh BUILD_DIR     (a configured and built tree)
set -euo pipefail
build=${1:?usage: devices.sh BUILD_DIR}
export L3D_TEST_F64_CACHE=${L3D_TEST_F64_CACHE:-$(cd "$build" && pwd)/tests/f64-cache}
tests='^(test_parallel|test_parallel_zero|test_parallel_bf16|test_parallel_tp2d|test_parallel_tp3d|test_parallel_cdt|test_parallel_plan|cli_train|cli_generate|cli_save|cli_tp_modes|cli_local|cli_fp16_scaler|cli_serve)$'
for d in cpu-opaque cpu-async; do
    echo "== L3D_DEVICE=$d"
    L3D_DEVICE=$d ctest --test-dir "$build" --output-on-failure -j2 -R "$tests"
done
