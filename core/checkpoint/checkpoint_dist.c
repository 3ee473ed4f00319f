// Sharded checkpoints: each rank writes its part in parallel, any layout reads them back
// (the format is in core/checkpoint/checkpoint_dist.h and docs/checkpoints.md).
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_dist.h"
#include "core/checkpoint/checkpoint_hf.h"
#include "core/checkpoint/checkpoint_publish.h"
#include "core/input.h"
#include "core/checkpoint/safetensors.h"
#include "platform/platform.h"

static const char *const k_suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};

// ---- host views --------------------------------------------------------------------------
// n floats of an array on the host: the array itself where it is host memory (a host device,
// or state ZeRO offload keeps on the host), else a copy.
static l3d_status host_view(l3d_model_t *m, const float *a, size_t n, float **h_p) {
    if (!l3d_dev_is_device_ptr(m->dev, a)) {
        *h_p = (float *)a;
        return L3D_OK;
    }
    float *h = l3d_malloc(m->ctx, n * sizeof(float), "staging");
    if (!h) return L3D_ERR_NOMEM;
    l3d_status st = l3d_dev_copy(m->dev, h, a, n * sizeof(float), L3D_COPY_D2H);
    if (st >= 0) st = l3d_dev_sync(m->dev);
    if (st < 0) {
        l3d_free(m->ctx, h, n * sizeof(float), "staging");
        return st;
    }
    *h_p = h;
    return L3D_OK;
}
static void host_release(l3d_model_t *m, const float *a, float *h, size_t n) {
    if (h && h != a) l3d_free(m->ctx, h, n * sizeof(float), "staging");
}

// ---- rectangles --------------------------------------------------------------------------
// A tensor's local shard is rows x cols (1-D tensors: one row); element e of it is full-tensor
// element (row0 + e / cols, col0 + e % cols).
static void shard_dims(const l3d_param_t *p, int64_t *rows, int64_t *cols, int64_t *row0,
                       int64_t *col0) {
    if (p->ndim == 2) {
        *rows = p->shape[0], *cols = p->shape[1], *row0 = p->r0, *col0 = p->c0;
    } else {
        *rows = 1, *cols = p->shape[0], *row0 = 0, *col0 = p->r0;
    }
}

typedef struct rect {
    const l3d_param_t *p;
    size_t e;            // first element, in the tensor's local shard
    size_t arena;        // its arena offset
    int64_t R, C, h, w;  // full-tensor top-left and extent
} rect_t;

// The first holder of a tensor writes it (l3d_param_primary).
static int writes(const l3d_model_t *m, const l3d_param_t *p) { return l3d_param_primary(m, p); }

// The rectangles covering arena floats [lo, hi) of m's tensors (out NULL: count only).
static size_t piece_rects(const l3d_model_t *m, size_t lo, size_t hi, rect_t *out) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const l3d_param_t *p = &m->tensors[i];
        size_t a0 = lo > p->offset ? lo : p->offset, a1 = p->offset + p->numel;
        a1 = a1 < hi ? a1 : hi;
        if (a1 <= a0 || !writes(m, p)) continue;
        int64_t rows, cols, row0, col0;
        shard_dims(p, &rows, &cols, &row0, &col0);
        int64_t e0 = (int64_t)(a0 - p->offset), e1 = (int64_t)(a1 - p->offset);
        // [e0, e1) row-major: a partial first row, whole rows, a partial last row
        while (e0 < e1) {
            int64_t r = e0 / cols, c = e0 % cols, h, w;
            if (c > 0 || e1 - e0 < cols) {
                w = (c + (e1 - e0) < cols ? e1 - e0 : cols - c);
                h = 1;
            } else {
                h = (e1 - e0) / cols;
                w = cols;
            }
            if (out)
                out[n] = (rect_t){p, (size_t)e0, p->offset + (size_t)e0, row0 + r, col0 + c, h, w};
            n++;
            e0 += h * w;
        }
        (void)rows;
    }
    return n;
}

static l3d_status write_shard(const l3d_ckpt_dist_src_t *t, const char *tmp, int rank,
                              int world) {
    l3d_model_t *m = t->model;
    l3d_ctx_t *ctx = t->ctx;
    int np = t->pieces;
    size_t nr = 0;
    for (int k = 0; k < np; k++) {
        size_t lo, hi, sh;
        t->piece(t->arg, k, &lo, &hi, &sh);
        nr += piece_rects(m, lo, hi, NULL);
    }
    size_t ne = 3 * nr, olen = t->optim_len;
    rect_t *rects = l3d_calloc(ctx, nr ? nr : 1, sizeof(*rects), "staging");
    l3d_st_entry_t *e = l3d_calloc(ctx, ne ? ne : 1, sizeof(*e), "staging");
    char(*names)[96] = l3d_calloc(ctx, ne ? ne : 1, sizeof(*names), "staging");
    float *hp = NULL, *hm = NULL, *hv = NULL;
    l3d_status st = rects && e && names ? L3D_OK : L3D_ERR_NOMEM;
    if (st >= 0) st = host_view(m, m->params, m->n_params, &hp);
    if (st >= 0) st = host_view(m, t->exp_avg, olen, &hm);
    if (st >= 0) st = host_view(m, t->exp_avg_sq, olen, &hv);
    size_t n = 0;
    for (int k = 0; k < np && st >= 0; k++) {
        size_t lo, hi, sh;
        t->piece(t->arg, k, &lo, &hi, &sh);
        size_t cnt = piece_rects(m, lo, hi, rects);
        for (size_t i = 0; i < cnt; i++) {
            const rect_t *r = &rects[i];
            const float *src[3] = {hp + r->arena, hm + sh + (r->arena - lo),
                                   hv + sh + (r->arena - lo)};
            for (int s = 0; s < 3; s++, n++) {
                snprintf(names[n], sizeof(names[n]), "%s%s@%lld,%lld", r->p->name, k_suffix[s],
                         (long long)r->R, (long long)r->C);
                e[n].name = names[n];
                e[n].ndim = r->p->ndim;
                e[n].shape[0] = r->p->ndim == 2 ? r->h : r->w;
                e[n].shape[1] = r->w;
                e[n].data = src[s];
            }
        }
    }
    if (st >= 0) {
        char path[1200], who[64];
        snprintf(path, sizeof(path), "%s/shard-%05d-of-%05d.safetensors", tmp, rank, world);
        snprintf(who, sizeof(who), "dp %d tp %d pp %d", t->dp_rank, m->tp.rank, m->pp_rank);
        const char *k[] = {"format", "llama3d", "rank"}, *v[] = {"pt", L3D_CKPT_DIST_FORMAT, who};
        st = l3d_st_write(ctx, path, e, n, k, v, 3);
    }
    host_release(m, t->exp_avg_sq, hv, olen);
    host_release(m, t->exp_avg, hm, olen);
    host_release(m, m->params, hp, m->n_params);
    l3d_free(ctx, names, (ne ? ne : 1) * sizeof(*names), "staging");
    l3d_free(ctx, e, (ne ? ne : 1) * sizeof(*e), "staging");
    l3d_free(ctx, rects, (nr ? nr : 1) * sizeof(*rects), "staging");
    return st;
}

static l3d_status write_manifest(const l3d_ckpt_dist_src_t *t, const char *tmp, int world) {
    json_t *files = json_array(), *root = NULL;
    char name[64], path[1200];
    for (int r = 0; files && r < world; r++) {
        snprintf(name, sizeof(name), "shard-%05d-of-%05d.safetensors", r, world);
        json_array_append_new(files, json_string(name));
    }
    root = files ? json_pack("{s:s, s:i, s:o}", "format", L3D_CKPT_DIST_FORMAT, "world", world,
                             "files", files)
                 : NULL;
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) return l3d_error(t->ctx, L3D_ERR_NOMEM, "building shards.json");
    snprintf(path, sizeof(path), "%s/shards.json", tmp);
    // Synced like every other file of the checkpoint (json_dump_file neither syncs nor says
    // why it failed).
    l3d_iovec_t io = {text, strlen(text)};
    int rc = l3d_file_write_atomic(path, &io, 1);
    free(text);
    return rc ? l3d_error(t->ctx, L3D_ERR_IO, "writing %s: %s", path, strerror(-rc)) : L3D_OK;
}

// Every rank's outcome: L3D_OK only when all succeeded. A rank that failed keeps its detail.
static l3d_status agree(const l3d_ckpt_dist_src_t *t, l3d_status st, const char *what,
                        const char *dir) {
    l3d_comm_t *world = t->world;
    int32_t ok = st >= 0, all = 0;
    l3d_status cst = l3d_comm_allreduce(world, &ok, &all, 1, L3D_INT32, L3D_MIN);
    if (st < 0) return st;
    if (cst < 0)
        return l3d_error(t->ctx, cst, "save %s (%s): %s", dir, what,
                         l3d_ctx_last_error(l3d_comm_ctx(world)));
    if (!all)
        return l3d_error(t->ctx, L3D_ERR_IO, "save %s: another rank failed (%s)", dir, what);
    return L3D_OK;
}

l3d_status l3d_ckpt_dist_save(const l3d_ckpt_dist_src_t *t, const char *dir) {
    l3d_comm_t *world = t->world;
    int W = l3d_comm_size(world), R = l3d_comm_rank(world);
    // One temporary directory for all ranks: world rank 0 vets the target, creates
    // "<target>.tmp.<its pid>" and broadcasts the name (core/checkpoint/checkpoint_publish.h).
    char target[1024] = "", tmp[1100] = "";
    l3d_status st = L3D_OK;
    if (R == 0) {
        st = l3d_ckpt_target_resolve(t->ctx, dir, target, sizeof(target));
        if (st >= 0) st = l3d_ckpt_tmp_create(t->ctx, target, (int64_t)getpid(), tmp, sizeof(tmp));
    }
    L3D_CHECK(t->ctx, agree(t, st, "creating the temporary directory", dir));
    st = l3d_comm_broadcast(world, tmp, tmp, sizeof(tmp), L3D_UINT8, 0);
    if (st < 0) {
        if (R == 0) l3d_ckpt_tmp_remove(tmp);
        return l3d_error(t->ctx, st, "save %s: %s", dir, l3d_ctx_last_error(l3d_comm_ctx(world)));
    }
    tmp[sizeof(tmp) - 1] = '\0';
    st = write_shard(t, tmp, R, W);
    if (st >= 0 && R == 0) st = l3d_ckpt_write_config(t->model, tmp);
    if (st >= 0 && R == 0) st = t->write_state(t->arg, tmp);
    if (st >= 0 && R == 0) st = write_manifest(t, tmp, W);
    if (st >= 0 && R == 0 && t->model->save.carry_from[0])
        st = l3d_ckpt_carry_files(t->ctx, t->model->save.carry_from, tmp);
    st = agree(t, st, "writing the shards", dir);
    if (R == 0) {
        if (st >= 0) st = l3d_ckpt_tmp_publish(t->ctx, tmp, target);
        if (st < 0) l3d_ckpt_tmp_remove(tmp);
    }
    return agree(t, st, "publishing", dir);
}

// ---- reading -----------------------------------------------------------------------------
// "<name><suffix>@R,C" -> the tensor's index in m (-1: not one of m's), suffix index, R, C.
// l3d_ckpt_dist_check has checked every name against the whole model; a tensor m lacks is
// another stage's.
static l3d_status parse_entry(l3d_ctx_t *ctx, const char *path, const l3d_model_t *m,
                              const char *ename, int *ti, int *si, long long *R, long long *C) {
    char base[128];
    int64_t r, c;
    if (l3d_ckpt_rect_name_parse(ename, base, sizeof(base), si, &r, &c))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not named "
                         "<tensor>[.exp_avg|.exp_avg_sq]@ROW,COL", path, ename);
    *R = r;
    *C = c;
    *ti = -1;
    for (int i = 0; i < m->n_tensors && *ti < 0; i++)
        if (!strcmp(m->tensors[i].name, base)) *ti = i;
    return L3D_OK;
}

// The shard files named by dir/shards.json.
static l3d_status read_manifest(l3d_ctx_t *ctx, const char *dir, json_t **files_p) {
    char path[1100];
    snprintf(path, sizeof(path), "%s/shards.json", dir);
    json_t *root;
    L3D_CHECK(ctx, l3d_input_json(ctx, path, NULL, 0, &root));
    json_t *fmt = json_object_get(root, "format"), *files = json_object_get(root, "files");
    l3d_status st = L3D_OK;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), L3D_CKPT_DIST_FORMAT))
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: format is not '%s'", path, L3D_CKPT_DIST_FORMAT);
    else if (!json_is_array(files) || json_array_size(files) == 0)
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'files' must be a non-empty array", path);
    for (size_t i = 0; st >= 0 && i < json_array_size(files); i++) {
        json_t *f = json_array_get(files, i);
        if (!json_is_string(f) || strchr(json_string_value(f), '/') ||
            !json_string_value(f)[0] || json_string_value(f)[0] == '.')
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: files[%zu] is not a file name in the "
                           "directory", path, i);
    }
    if (st >= 0) *files_p = json_incref(files);
    json_decref(root);
    return st;
}

l3d_status l3d_ckpt_dist_read(l3d_model_t *m, const char *dir, float *params, float *exp_avg,
                              float *exp_avg_sq) {
    l3d_ctx_t *ctx = m->ctx;
    float *dev[3] = {params, exp_avg, exp_avg_sq}, *host[3] = {NULL, NULL, NULL};
    json_t *files = NULL;
    L3D_CHECK(ctx, read_manifest(ctx, dir, &files));
    size_t nt = (size_t)m->n_tensors, bytes = m->n_params * sizeof(float);
    size_t *cov = l3d_calloc(ctx, 3 * nt, sizeof(size_t), "staging");
    l3d_status st = cov ? L3D_OK : L3D_ERR_NOMEM;
    int is_host[3];  // each array: host memory (read into), or the device's (through a copy)
    for (int s = 0; s < 3; s++) is_host[s] = !l3d_dev_is_device_ptr(m->dev, dev[s]);
    for (int s = 0; s < 3 && st >= 0; s++)
        if (dev[s] && !(host[s] = is_host[s] ? dev[s] : l3d_malloc(ctx, bytes, "staging")))
            st = L3D_ERR_NOMEM;
    // Progress (on a terminal, after a second) in bytes of the shard files read so far.
    char path[1100];
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < json_array_size(files); i++) {
        uint64_t size = 0;
        snprintf(path, sizeof(path), "%s/%s", dir, json_string_value(json_array_get(files, i)));
        if (l3d_path_size(path, &size) == 0) total += size;
    }
    l3d_progress_t pr;
    l3d_progress_begin(ctx, &pr, total, "loading %s", dir);
    for (size_t i = 0; st >= 0 && i < json_array_size(files); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, json_string_value(json_array_get(files, i)));
        uint64_t size = 0;
        (void)l3d_path_size(path, &size);
        l3d_st_file_t *f = NULL;
        st = l3d_st_open(ctx, path, &f);
        for (size_t j = 0; st >= 0 && j < l3d_st_count(f); j++) {
            const l3d_st_tensor_t *e = l3d_st_at(f, j);
            l3d_progress_update(&pr, done + (uint64_t)e->end);
            int ti, si;
            long long R, C;
            st = parse_entry(ctx, path, m, e->name, &ti, &si, &R, &C);
            if (st < 0 || ti < 0 || !host[si]) continue;  // another part's tensor, or not asked
            size_t n = 0;
            st = l3d_ckpt_place(ctx, path, e, &m->tensors[ti], R, C, host[si], L3D_FLOAT32,
                                    NULL, &n, f);
            cov[(size_t)si * nt + (size_t)ti] += n;
        }
        l3d_st_close(f);
        done += size;
    }
    if (st >= 0) pr.done = total;
    l3d_progress_end(&pr);
    // Rectangles never overlap, so the counts say whether every element was found.
    for (int s = 0; s < 3 && st >= 0; s++)
        for (size_t i = 0; host[s] && i < nt && st >= 0; i++)
            if (cov[(size_t)s * nt + i] != m->tensors[i].numel)
                st = l3d_error(ctx, L3D_ERR_FORMAT, "checkpoint %s: tensor '%s%s' has %zu of its "
                               "%zu elements (a shard is missing or was written for another "
                               "model)", dir, m->tensors[i].name, k_suffix[s],
                               cov[(size_t)s * nt + i], m->tensors[i].numel);
    for (int s = 0; s < 3 && st >= 0; s++)
        if (host[s] && !is_host[s]) st = l3d_dev_copy(m->dev, dev[s], host[s], bytes, L3D_COPY_H2D);
    if (st >= 0) st = l3d_dev_sync(m->dev);
    for (int s = 0; s < 3; s++)
        if (host[s] && !is_host[s]) l3d_free(ctx, host[s], bytes, "staging");
    l3d_free(ctx, cov, 3 * nt * sizeof(size_t), "staging");
    json_decref(files);
    return st;
}
