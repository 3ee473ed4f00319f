// Test harness: run a function on every rank of a world over a given transport.
// "local": ranks are threads of this process (l3d_comm_create_local). Any other transport:
// ranks are fork()ed processes that rendezvous through the bootstrap store on 127.0.0.1 with
// the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and a fresh job token,
// exactly as a user's job does (l3d_comm_create_env).
#ifndef L3D_TEST_WORLD_H
#define L3D_TEST_WORLD_H

#include <stddef.h>

#include "llama3d/comm.h"

// A rank's body: returns 0 on success, or nonzero with a message in err.
typedef int (*l3d_world_fn)(l3d_comm_t *comm, void *arg, char *err, size_t errlen);

// Runs fn on nranks ranks. Returns 0 when every rank returned 0 within timeout_s; otherwise
// nonzero with err naming the first failing rank and its message (or signal, or timeout).
// Rank processes that outlive the timeout are killed.
int l3d_world_run(const char *transport, int nranks, l3d_world_fn fn, void *arg,
                  double timeout_s, char *err, size_t errlen);

// Like l3d_world_run but reports every rank's result: rcs[i] is rank i's return value, or
// 128 + signal for a process killed by a signal, or -1 if it did not finish in time.
int l3d_world_run_all(const char *transport, int nranks, l3d_world_fn fn, void *arg,
                      double timeout_s, int *rcs, char (*errs)[256]);

// The transports this build contains ("local" first; not nccl, which needs a GPU per rank),
// at most max; returns the count.
int l3d_world_transports(const char **names, int max);

#endif
