// The monitor object: which of DeepSpeed's monitors are open on this rank, their files, and
// the rule that makes metrics a side channel (a failed write warns once naming the file and
// stops that monitor; nothing is returned to stop training). The formats are in
// core/monitor/monitor_tb.c and core/monitor/monitor_csv.c.
// A library object rather than the CLI's: DeepSpeed's engine writes these files for any
// program that passes the config, and a program embedding llama3d expects the same.
// defines: l3d_monitor_create, l3d_monitor_write_step, l3d_monitor_write_events,
//          l3d_monitor_destroy
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/comm/mesh.h"
#include "core/monitor/monitor_internal.h"
#include "core/train/trainer_internal.h"
#include "llama3d/monitor.h"
#include "platform/platform.h"

#define MAX_TAGS 32
#define PATH_CAP 1024

typedef struct csv_file {
    char tag[128];
    int fd;
} csv_file_t;

struct l3d_monitor {
    l3d_ctx_t *ctx;
    int64_t samples_per_step;  // the global batch: DeepSpeed's x axis counts samples
    int append;
    int tb_fd;                 // -1: TensorBoard off or stopped
    char tb_path[PATH_CAP];
    int csv_on;                // 0: csv_monitor off or stopped
    char csv_dir[PATH_CAP];
    int n_csv;
    csv_file_t csv[MAX_TAGS];
    int csv_full_warned;       // more than MAX_TAGS tags: said once
};

// A monitor that failed stops; the warning names the file and says training goes on.
static void stop_tb(l3d_monitor_t *m, int err) {
    l3d_log(m->ctx, L3D_LOG_WARN, L3D_SUBSYS_TRAIN,
            "tensorboard: cannot write %s: %s; no more events go there, training goes on",
            m->tb_path, strerror(-err));
    l3d_outfile_close(m->tb_fd);
    m->tb_fd = -1;
}

static void stop_csv(l3d_monitor_t *m, const char *path, int err) {
    l3d_log(m->ctx, L3D_LOG_WARN, L3D_SUBSYS_TRAIN,
            "csv_monitor: cannot write %s: %s; no more rows go to %s, training goes on", path,
            strerror(-err), m->csv_dir);
    for (int i = 0; i < m->n_csv; i++) l3d_outfile_close(m->csv[i].fd);
    m->n_csv = 0;
    m->csv_on = 0;
}

static l3d_status open_tb(l3d_monitor_t *m, const char *dir) {
    int e = l3d_dir_create(dir);
    if (e)
        return l3d_error(m->ctx, L3D_ERR_IO, "tensorboard: cannot create %s: %s", dir,
                         strerror(-e));
    char host[256], name[400];
    double now = l3d_time_wall();
    l3d_host_name(host, sizeof(host));
    l3d_tb_file_name(name, sizeof(name), now, host, l3d_process_id());
    int w = snprintf(m->tb_path, sizeof(m->tb_path), "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= sizeof(m->tb_path))
        return l3d_error(m->ctx, L3D_ERR_IO, "tensorboard: the path %s/%s is too long", dir,
                         name);
    // A resumed run gets a file of its own too: TensorBoard reads every file in the
    // directory, and a second writer must never append to a file with its own version record.
    int fd = l3d_outfile_open(m->tb_path, 0);
    if (fd < 0)
        return l3d_error(m->ctx, L3D_ERR_IO, "tensorboard: cannot create %s: %s", m->tb_path,
                         strerror(-fd));
    m->tb_fd = fd;
    unsigned char rec[L3D_TB_RECORD_MAX];
    size_t n = l3d_tb_version_record(rec, now);
    if ((e = l3d_outfile_append(fd, rec, n)) < 0) stop_tb(m, e);
    return L3D_OK;
}

static l3d_status open_csv(l3d_monitor_t *m, const char *dir) {
    int e = l3d_dir_create(dir);
    if (e)
        return l3d_error(m->ctx, L3D_ERR_IO, "csv_monitor: cannot create %s: %s", dir,
                         strerror(-e));
    snprintf(m->csv_dir, sizeof(m->csv_dir), "%s", dir);
    m->csv_on = 1;
    return L3D_OK;
}

l3d_status l3d_monitor_create(l3d_trainer_t *t, int append, l3d_monitor_t **monitor_p) {
    l3d_ctx_t *ctx = t->ctx;
    int rank0 = !t->mesh || t->mesh->rank == 0;  // only rank 0 writes, as in DeepSpeed
    *monitor_p = NULL;                           // nothing to write: every call takes NULL
    if (!rank0 || (!t->cfg.tensorboard && !t->cfg.csv_monitor)) return L3D_OK;
    l3d_monitor_t *m = l3d_calloc(ctx, 1, sizeof(*m), "other");
    if (!m) return L3D_ERR_NOMEM;
    m->ctx = ctx;
    m->samples_per_step = t->cfg.train_batch_size;
    m->append = append;
    m->tb_fd = -1;
    l3d_status st = L3D_OK;
    if (t->cfg.tensorboard) st = open_tb(m, t->cfg.tensorboard_dir);
    if (st == L3D_OK && t->cfg.csv_monitor) st = open_csv(m, t->cfg.csv_monitor_dir);
    if (st < 0) {
        l3d_monitor_destroy(m);
        return st;
    }
    *monitor_p = m;
    return L3D_OK;
}

// The CSV file of `tag`, opened on its first event (DeepSpeed opens one per tag it sees).
// Returns its index, or -1 when the monitor stopped or the tag has no room.
static int csv_file(l3d_monitor_t *m, const char *tag) {
    for (int i = 0; i < m->n_csv; i++)
        if (!strcmp(m->csv[i].tag, tag)) return i;
    char path[PATH_CAP + 160], head[200];
    size_t hn = l3d_csv_header(head, sizeof(head), tag);
    if (m->n_csv == MAX_TAGS || strlen(tag) >= sizeof(m->csv[0].tag) || !hn ||
        l3d_csv_file_name(path, sizeof(path), m->csv_dir, tag) < 0) {
        if (!m->csv_full_warned)
            l3d_log(m->ctx, L3D_LOG_WARN, L3D_SUBSYS_TRAIN,
                    "csv_monitor: tag %.128s not written (at most %d tags of < 128 bytes)", tag,
                    MAX_TAGS);
        m->csv_full_warned = 1;
        return -1;
    }
    // A fresh run starts each file over (as the JSONL metrics do); a resumed one continues
    // it, and the header is written once per file, not once per process as DeepSpeed does.
    int fd = l3d_outfile_open(path, m->append);
    if (fd < 0) {
        stop_csv(m, path, fd);
        return -1;
    }
    int i = m->n_csv++;
    snprintf(m->csv[i].tag, sizeof(m->csv[i].tag), "%s", tag);
    m->csv[i].fd = fd;
    int64_t size = l3d_outfile_size(fd);
    int e = size == 0 ? l3d_outfile_append(fd, head, hn) : 0;
    if (e < 0) {
        stop_csv(m, path, e);
        return -1;
    }
    return i;
}

static void write_csv(l3d_monitor_t *m, const l3d_monitor_event_t *ev) {
    int i = csv_file(m, ev->tag);
    if (i < 0) return;
    char row[96];
    size_t n = l3d_csv_row(row, sizeof(row), ev->step, ev->value);
    int e = l3d_outfile_append(m->csv[i].fd, row, n);
    if (e < 0) {
        char path[PATH_CAP + 160];
        l3d_csv_file_name(path, sizeof(path), m->csv_dir, ev->tag);
        stop_csv(m, path, e);
    }
}

void l3d_monitor_write_events(l3d_monitor_t *m, const l3d_monitor_event_t *events, size_t n) {
    if (!m) return;
    double now = l3d_time_wall();
    for (size_t k = 0; k < n; k++) {
        const l3d_monitor_event_t *ev = &events[k];
        if (m->tb_fd >= 0) {
            unsigned char rec[L3D_TB_RECORD_MAX];
            size_t len = l3d_tb_scalar_record(rec, now, ev->step, ev->tag, (float)ev->value);
            int e = len ? l3d_outfile_append(m->tb_fd, rec, len) : 0;
            if (e < 0) stop_tb(m, e);
        }
        if (m->csv_on) write_csv(m, ev);
    }
}

void l3d_monitor_write_step(l3d_monitor_t *m, const l3d_step_stats_t *s) {
    if (!m || (m->tb_fd < 0 && !m->csv_on)) return;
    int64_t x = (int64_t)s->step * m->samples_per_step;
    const l3d_monitor_event_t ev[] = {
        {"Train/Samples/train_loss", s->loss, x},
        {"Train/Samples/lr", s->lr, x},
        {"Train/Samples/loss_scale", s->loss_scale, x},
        {"Train/Samples/grad_norm", s->grad_norm, x},
        {"Train/Samples/tokens_per_s", s->tokens_per_s, x},
        {"Train/Samples/mfu", s->mfu, x},
        {"Train/Samples/mem_peak_bytes", (double)s->mem_peak, x},
    };
    l3d_monitor_write_events(m, ev, L3D_ARRAY_LEN(ev));
    // Steps that evaluated (train.eval_interval) carry the eval loss too.
    if (!isnan(s->eval_loss)) {
        const l3d_monitor_event_t e = {"Train/Samples/eval_loss", s->eval_loss, x};
        l3d_monitor_write_events(m, &e, 1);
    }
}

void l3d_monitor_destroy(l3d_monitor_t *m) {
    if (!m) return;
    int e = l3d_outfile_close(m->tb_fd);
    if (e < 0)
        l3d_log(m->ctx, L3D_LOG_WARN, L3D_SUBSYS_TRAIN, "tensorboard: closing %s: %s",
                m->tb_path, strerror(-e));
    for (int i = 0; i < m->n_csv; i++)
        if ((e = l3d_outfile_close(m->csv[i].fd)) < 0)
            l3d_log(m->ctx, L3D_LOG_WARN, L3D_SUBSYS_TRAIN, "csv_monitor: closing the file of "
                    "%s in %s: %s", m->csv[i].tag, m->csv_dir, strerror(-e));
    l3d_free(m->ctx, m, sizeof(*m), "other");
}
