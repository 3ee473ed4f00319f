// l3d train's two halves: cli/train.c builds the configuration (file, flags, the launcher's
// world) and prints the start-up summary; cli/train_ranks.c runs the ranks, as this process
// (one rank of a launched job, or a single rank) or as threads of it (a layout without a
// launcher).
#ifndef L3D_CLI_TRAIN_H
#define L3D_CLI_TRAIN_H

#include "cli/cli.h"

// What every rank runs, read-only once the ranks start.
typedef struct l3d_train_job {
    const l3d_train_config_t *cfg;  // finalized
    const char *resume;             // --resume DIR, or NULL
    int nthreads;                   // CPU threads per rank
    int rank;                       // this process's rank (0 when threaded)
    int world;                      // ranks in the job
    int threaded;                   // the ranks are threads of this process
    double t0;                      // l3d_time_now() when l3d train started: the summary's
                                    // wall time is what the user waited
    l3d_mem_breakdown_t *mems;      // threaded: every rank's memory, printed by rank 0 in order
} l3d_train_job_t;

// Runs rank job->rank of a launched job (world > 1, over l3d_comm_create_env) or the single
// rank; returns the exit code.
int l3d_train_run_process(const l3d_train_job_t *job);
// Runs every rank of the layout as a thread of this process over the in-process transport;
// rank 0 prints as a launched rank 0 does. Returns the exit code of the failure that came
// first (a rank's own, not a peer's report of it), or 0.
int l3d_train_run_threads(const l3d_train_job_t *job);

// The MFU roof (cli/peak.c): train.peak_flops, else this machine's cached sgemm peak for
// `threads` threads, else measured now and cached. Sets cfg->peak_flops; `source` says which.
l3d_status l3d_train_resolve_peak(l3d_ctx_t *ctx, l3d_train_config_t *cfg, int threads,
                                  char *source, size_t cap);

void l3d_train_print_config(const l3d_train_config_t *c, l3d_trainer_t *t, int threads);
// One rank's memory line; `world` > 1 names the rank.
// With a pipeline: the stage needing the most memory, when it is not stage 0 (m0).
void l3d_train_print_largest_stage(const l3d_train_config_t *c, const l3d_mem_breakdown_t *m0);
void l3d_train_print_memory(const l3d_train_config_t *c, const l3d_mem_breakdown_t *mem,
                            int estimate, int rank, int world);

#endif
