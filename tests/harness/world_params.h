// Criterion parameters for tests that run once per built transport (as UCX's gtest does):
//   ParameterizedTestParameters(suite, name) { return l3d_world_transport_params(); }
//   ParameterizedTest(l3d_tp_param_t *p, suite, name) { ... p->name ... }
#ifndef L3D_TEST_WORLD_PARAMS_H
#define L3D_TEST_WORLD_PARAMS_H

#include <criterion/parameterized.h>
#include <stdio.h>

#include "tests/harness/world.h"

typedef struct l3d_tp_param {
    char name[16];
} l3d_tp_param_t;

static inline struct criterion_test_params l3d_world_transport_params(void) {
    static l3d_tp_param_t ps[8];  // Criterion keeps a pointer to the array: static storage
    const char *names[8];
    int n = l3d_world_transports(names, 8);
    for (int i = 0; i < n; i++) snprintf(ps[i].name, sizeof(ps[i].name), "%s", names[i]);
    return cr_make_param_array(l3d_tp_param_t, ps, (size_t)n);
}

#endif
