// DeepSpeed's monitors, written by the library so an embedding program gets them too:
// TensorBoard event files (the "tensorboard" section) and CSV files ("csv_monitor"), with
// DeepSpeed's tags, directories and file names. wandb is refused when the config is read.
// defines: l3d_monitor_t, l3d_monitor_event_t, l3d_monitor_*
//
// Metrics are a side channel: a write that fails (a full disk, an I/O error) is logged once as
// a warning naming the file, that monitor stops writing, and the calls go on returning
// normally, so training and checkpoints are never stopped by them.
#ifndef LLAMA3D_MONITOR_H
#define LLAMA3D_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/status.h"
#include "llama3d/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_monitor l3d_monitor_t;

// One scalar, as DeepSpeed's monitor.write_events takes them: (tag, value, step).
typedef struct l3d_monitor_event {
    const char *tag;  // "Train/Samples/train_loss"; the CSV file is the tag with '/' and ' '
                      // as '_' (at most 32 tags per monitor, each under 128 bytes)
    double value;     // TensorBoard stores it as a float32; the CSV keeps the double
    int64_t step;     // the x axis; DeepSpeed's Train/Samples/ tags count samples
} l3d_monitor_event_t;

// Opens the monitors the trainer's config enables (cfg->tensorboard, cfg->csv_monitor) on
// world rank 0, creating their directories; on every other rank, or with none enabled,
// *monitor_p is NULL, which every call below takes (it writes nothing). `append` (a resumed run): the CSV files are continued, and
// TensorBoard gets a new event file beside the earlier ones (it reads them all). A directory
// or file that cannot be created is L3D_ERR_IO naming it.
l3d_status l3d_monitor_create(l3d_trainer_t *t, int append, l3d_monitor_t **monitor_p);
// DeepSpeed's events of a step at step x train_batch_size samples: Train/Samples/train_loss,
// lr and loss_scale (1: training runs in fp32), and llama3d's grad_norm, tokens_per_s, mfu
// and mem_peak_bytes under the same prefix.
void l3d_monitor_write_step(l3d_monitor_t *m, const l3d_step_stats_t *stats);
// Any scalars (an evaluation loss, a program's own): written to every open monitor.
void l3d_monitor_write_events(l3d_monitor_t *m, const l3d_monitor_event_t *events, size_t n);
// Closes the files; NULL is fine.
void l3d_monitor_destroy(l3d_monitor_t *m);

#ifdef __cplusplus
}
#endif
#endif
