// Bootstrap: who am I in the job, and a TCP key-value store to exchange transport addresses.
// defines: l3d_launch_env_t, l3d_launch_env_read, l3d_bootstrap_t, l3d_bootstrap_*
// (l3d_launch_env_read in bootstrap_env.c, the store in bootstrap_store.c, the client in
// bootstrap.c; the wire format they share in bootstrap_wire.h)
//
// The launch conventions users already have are read in this order (first complete set wins):
//   torchrun:  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// mpirun:    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, ..._LOCAL_SIZE
// 
//   srun:      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//   PMI:       PMI_RANK, PMI_SIZE
// MASTER_ADDR/MASTER_PORT (or L3D_MASTER_ADDR/L3D_MASTER_PORT) name the store for every
// convention; under mpirun/srun without them the job cannot rendezvous and says so.
// L3D_JOB_TOKEN (set by `l3d launch`, or by the user across nodes) must match on every rank:
// a process of another job that reaches the store is refused, with a message on both sides.
#ifndef L3D_BOOTSTRAP_H
#define L3D_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

typedef struct l3d_launch_env {
    int rank, size;             // world rank and size
    int local_rank, local_size; // on this node (local_size 0 = unknown)
    char master_addr[256];      // store host (rank 0 binds here; others connect)
    int master_port;
    char job_token[128];        // "" = none given
    char source[32];            // "torchrun", "mpirun", "srun", "pmi", "explicit"
} l3d_launch_env_t;

// Reads the launch variables. Missing or inconsistent ones (rank >= size, non-numeric, port
// out of range) are L3D_ERR_CONFIG naming the variable.
l3d_status l3d_launch_env_read(l3d_ctx_t *ctx, l3d_launch_env_t *env);

typedef struct l3d_bootstrap l3d_bootstrap_t;

// Joins the store of the job described by env: rank 0 listens on master_addr:master_port
// (binding only that address) and serves until every rank has said goodbye in
// l3d_bootstrap_destroy; everyone (rank 0 included) connects as a client. Blocking, bounded
// by timeout_s. Every message is length-checked; a malformed message or a wrong job token
// fails that connection with a clear error instead of corrupting the store.
l3d_status l3d_bootstrap_create(l3d_ctx_t *ctx, const l3d_launch_env_t *env, double timeout_s,
                                l3d_bootstrap_t **bs_p);
void l3d_bootstrap_destroy(l3d_bootstrap_t *bs);
// Caps how long rank 0's destroy keeps serving ranks that have not said goodbye (default: the
// timeout). After a rank failure nobody needs the store any more, and a stopped rank would
// otherwise hold rank 0 for a whole second timeout.
void l3d_bootstrap_set_drain(l3d_bootstrap_t *bs, double seconds);
int l3d_bootstrap_rank(const l3d_bootstrap_t *bs);
int l3d_bootstrap_size(const l3d_bootstrap_t *bs);

// Sets key to value (at most 1 MiB). Keys are strings up to 255 bytes.
l3d_status l3d_bootstrap_put(l3d_bootstrap_t *bs, const char *key, const void *val, size_t len);
// Waits until key exists (bounded by the timeout) and returns a copy, allocated through the
// context's allocator (tag "comm"); release it with l3d_bootstrap_free(bs, *val_p, *len_p).
l3d_status l3d_bootstrap_get(l3d_bootstrap_t *bs, const char *key, void **val_p, size_t *len_p);
// Frees a value from l3d_bootstrap_get; `len` is the length get returned. NULL is a no-op.
void l3d_bootstrap_free(l3d_bootstrap_t *bs, void *val, size_t len);
// Every rank contributes `len` bytes (lengths may differ per rank); on return all[i] is rank
// i's blob (an array of blobs, all from the context's allocator, tag "comm"; free them with
// l3d_bootstrap_free_all). `tag` names the exchange so several can happen in sequence.
l3d_status l3d_bootstrap_allgather(l3d_bootstrap_t *bs, const char *tag, const void *mine,
                                   size_t len, void ***all_p, size_t **lens_p);
// Frees allgather's result (both arrays and every blob). NULL `all` is a no-op.
void l3d_bootstrap_free_all(l3d_bootstrap_t *bs, void **all, size_t *lens);
l3d_status l3d_bootstrap_barrier(l3d_bootstrap_t *bs, const char *tag);

#endif
