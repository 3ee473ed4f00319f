// Running a command's ranks: as this process (a single rank, or one rank of a job started by
// l3d launch / mpirun) or as threads of it over the in-process transport (a layout without a
// launcher). Shared by l3d train and l3d generate.
// defines: l3d_cli_rank_t, l3d_cli_rank_fn, l3d_cli_rank_failed, l3d_cli_run_process,
//          l3d_cli_run_threads
#ifndef L3D_CLI_RANKS_H
#define L3D_CLI_RANKS_H

#include "cli/cli.h"

// The most ranks a layout without a launcher runs as threads of one process.
#define L3D_CLI_MAX_THREADED_RANKS 4096

// One rank's run and its outcome.
typedef struct l3d_cli_rank {
    const char *cmd;   // "train": starts the messages
    void *job;         // what every rank runs (the command's; read-only once ranks start)
    l3d_comm_t *comm;  // this rank's world (NULL: a single rank)
    int rank, world;
    int threaded;      // the ranks are threads of this process
    int rc;            // exit code
    l3d_status st;     // the failure's status (L3D_OK when rc is from elsewhere)
    char err[1024];    // the failure's message
} l3d_cli_rank_t;

// Runs one rank with its own context; sets r->rc (and st, err on failure). On failure with a
// world it need not abort the comm: the runner does, so the peers fail fast naming it.
typedef void (*l3d_cli_rank_fn)(l3d_cli_rank_t *r, l3d_ctx_t *ctx);

// Records st (and ctx's detail) as r's failure.
void l3d_cli_rank_failed(l3d_cli_rank_t *r, l3d_ctx_t *ctx, l3d_status st);
// Rank `rank` of `world` in this process (world > 1: over l3d_comm_create_env). Progress
// lines on rank 0 only. Prints the failure; returns the exit code.
int l3d_cli_run_process(const char *cmd, void *job, int rank, int world, l3d_cli_rank_fn fn);
// A launched job's place (l3d launch, torchrun, mpirun, srun) for a dp 1 x tp x pp layout:
// *rank, *world and *local (the ranks on this node, at least 1), its size checked against
// tp x pp. Prints the failure as `l3d CMD: ...` and returns its exit code; 0 when fine.
int l3d_cli_launched_layout(const char *cmd, int tp, int pp, int *rank, int *world, int *local);
// Every rank as a thread over the in-process transport. Prints each distinct failure once
// (naming the rank unless every rank had it), then the first peer's report; returns the
// exit code of the failure that came first (a rank's own, not a peer's report of it), or 0.
int l3d_cli_run_threads(const char *cmd, void *job, int world, l3d_cli_rank_fn fn);

#endif
