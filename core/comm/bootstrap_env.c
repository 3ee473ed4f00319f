// Bootstrap: who am I in the job. Reads the launch variables of torchrun, mpirun (Open MPI),
// srun (SLURM), PMI launchers or llama3d's own L3D_* names (see core/comm/bootstrap.h for the
// order), and where the store lives (MASTER_ADDR/MASTER_PORT, L3D_MASTER_* overriding).
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/bootstrap.h"
#include "core/comm/bootstrap_wire.h"
#include "core/l3d_core.h"

typedef struct conv {
    const char *source, *rank, *size, *local_rank, *local_size;
} conv_t;

static const conv_t convs[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"explicit", "L3D_RANK", "L3D_WORLD_SIZE", "L3D_LOCAL_RANK", "L3D_LOCAL_WORLD_SIZE"},
};

static l3d_status env_int(l3d_ctx_t *ctx, const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    char *end = NULL;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: '%s' is not an integer in [%ld, %ld]", name,
                         v ? v : "", lo, hi);
    *out = (int)x;
    return L3D_OK;
}

static const char *env_first(const char *a, const char *b, const char **name) {
    const char *v = getenv(a);
    *name = a;
    if (!v) {
        v = getenv(b);
        *name = b;
    }
    return v;
}

l3d_status l3d_launch_env_read(l3d_ctx_t *ctx, l3d_launch_env_t *env) {
    memset(env, 0, sizeof(*env));
    const conv_t *c = NULL, *partial = NULL;
    for (size_t i = 0; i < L3D_ARRAY_LEN(convs) && !c; i++) {
        int r = getenv(convs[i].rank) != NULL, s = getenv(convs[i].size) != NULL;
        if (r && s) c = &convs[i];
        else if ((r || s) && !partial) partial = &convs[i];
    }
    if (!c && partial)
        return l3d_error(ctx, L3D_ERR_CONFIG, "launch environment: %s is set but %s is not (%s "
                         "style needs both)", getenv(partial->rank) ? partial->rank : partial->size,
                         getenv(partial->rank) ? partial->size : partial->rank, partial->source);
    if (!c)
        return l3d_error(ctx, L3D_ERR_CONFIG, "launch environment: RANK and WORLD_SIZE are not "
                         "set (start the job with l3d launch -n N, torchrun, mpirun or srun; see "
                         "docs/launch.md)");
    L3D_CHECK(ctx, env_int(ctx, c->size, 1, INT_MAX, &env->size));
    L3D_CHECK(ctx, env_int(ctx, c->rank, 0, INT_MAX, &env->rank));
    if (env->rank >= env->size)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s is %d but %s is %d (a rank is below the world "
                         "size)", c->rank, env->rank, c->size, env->size);
    if (getenv(c->local_size)) {
        L3D_CHECK(ctx, env_int(ctx, c->local_size, 1, env->size, &env->local_size));
    }
    if (getenv(c->local_rank)) {
        L3D_CHECK(ctx, env_int(ctx, c->local_rank, 0, env->size - 1, &env->local_rank));
        if (env->local_size && env->local_rank >= env->local_size)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s is %d but %s is %d", c->local_rank,
                             env->local_rank, c->local_size, env->local_size);
    } else {
        // No local rank given: block placement is the usual guess (one node: the rank).
        env->local_rank = env->local_size ? env->rank % env->local_size : env->rank;
    }
    snprintf(env->source, sizeof(env->source), "%s", c->source);

    const char *aname, *pname;
    const char *addr = env_first("L3D_MASTER_ADDR", "MASTER_ADDR", &aname);
    const char *port = env_first("L3D_MASTER_PORT", "MASTER_PORT", &pname);
    if (!addr && env->size == 1) {
        addr = "127.0.0.1";  // a world of one needs no rendezvous address: any local port does
    } else if (!addr) {
        return l3d_error(ctx, L3D_ERR_CONFIG, "MASTER_ADDR is not set: %s gives %s and %s but not "
                         "the store address; set MASTER_ADDR to rank 0's host and MASTER_PORT to "
                         "a free port (e.g. 29500) for every rank", c->source, c->rank, c->size);
    }
    if (!addr[0] || strlen(addr) >= sizeof(env->master_addr))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: '%.64s' is not a host name or address", aname,
                         addr);
    snprintf(env->master_addr, sizeof(env->master_addr), "%s", addr);
    if (!port && env->size == 1) {
        env->master_port = 0;
    } else if (!port) {
        return l3d_error(ctx, L3D_ERR_CONFIG, "MASTER_PORT is not set (the store at %s needs a "
                         "port, e.g. 29500, the same for every rank)", env->master_addr);
    } else {
        L3D_CHECK(ctx, env_int(ctx, pname, env->size == 1 ? 0 : 1, 65535, &env->master_port));
    }
    const char *tok = getenv("L3D_JOB_TOKEN");
    if (tok && strlen(tok) > BS_TOKEN_MAX)
        return l3d_error(ctx, L3D_ERR_CONFIG, "L3D_JOB_TOKEN is %zu bytes long, at most %d are "
                         "allowed", strlen(tok), BS_TOKEN_MAX);
    snprintf(env->job_token, sizeof(env->job_token), "%s", tok ? tok : "");
    return L3D_OK;
}
