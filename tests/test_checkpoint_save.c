#define _GNU_SOURCE  // mkstemps
// Where a save may write (core/checkpoint/checkpoint_publish.c), through the library: single-rank
// and sharded saves replace only a directory llama3d wrote, follow a symlink, and remove the
// temporaries of killed saves whose owner is provably dead, never a live owner's.
// Sharded saves run two ranks as threads over the in-process transport.
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "devices/device.h"
#include "llama3d/llama3d.h"
#include "platform/platform.h"

static char g_dir[64], g_data[128];

static void setup(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/l3d_ckpt_save_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_data, sizeof(g_data), "%s/data.bin", g_dir);
    FILE *f = fopen(g_data, "wb");
    cr_assert_not_null(f);
    for (uint32_t i = 0; i < 4096; i++) {
        uint32_t id = (i * 31u) % 251u;
        fwrite(&id, 4, 1, f);
    }
    cr_assert_eq(fclose(f), 0);
}

static void teardown(void) { l3d_dir_remove_tree(g_dir); }

static void path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void put(const char *p, const char *text) {
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

static int is_file(const char *dir, const char *name) {
    char p[300];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

typedef struct rank {
    l3d_comm_t *comm;
    const char *save;
    l3d_status st;
    char err[512];
} rank_t;

static void *rank_main(void *p) {
    rank_t *a = p;
    l3d_ctx_t *ctx;
    a->st = l3d_ctx_create(NULL, &ctx);
    if (a->st < 0) return NULL;
    l3d_train_config_t cfg;
    l3d_train_config_default(ctx, &cfg);
    cfg.model.hidden_size = 32;
    cfg.model.intermediate_size = 64;
    cfg.model.num_hidden_layers = 1;
    cfg.model.num_attention_heads = 2;
    cfg.model.num_key_value_heads = 2;
    cfg.model.head_dim = 16;
    snprintf(cfg.data_path, sizeof(cfg.data_path), "%s", g_data);
    cfg.seq_len = 16;
    cfg.micro_batch_size = 1;
    cfg.dp = a->comm ? 2 : 1;
    cfg.grad_accum_steps = 1;
    cfg.train_batch_size = cfg.dp;
    cfg.num_threads = 1;
    l3d_trainer_t *t = NULL;
    a->st = l3d_train_config_finalize(ctx, &cfg);
    if (a->st >= 0) a->st = l3d_trainer_create_parallel(ctx, &cfg, a->comm, &t);
    if (a->st >= 0) a->st = l3d_trainer_save(t, a->save);
    snprintf(a->err, sizeof(a->err), "%s", l3d_ctx_last_error(ctx));
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
    return NULL;
}

// Saves to `dir` with `n` ranks (1: single-rank layout, 2: sharded); rank 0's status.
static l3d_status save_ranks(int n, const char *dir, rank_t *r) {
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[2] = {0};
    if (n > 1) cr_assert_eq(l3d_comm_create_local(wctx, n, comms), L3D_OK);
    pthread_t th[2];
    for (int i = 0; i < n; i++) {
        r[i] = (rank_t){.comm = comms[i], .save = dir};
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++) l3d_comm_destroy(comms[i]);
    l3d_ctx_destroy(wctx);
    return r[0].st;
}

// A folder with a file llama3d did not write: refused on every rank, naming the file;
// nothing deleted, no temporary left.
static void refuses_foreign(int n) {
    char dir[128], p[200];
    rank_t r[2];
    path(dir, sizeof(dir), "project");
    cr_assert_eq(l3d_dir_create(dir), 0);
    snprintf(p, sizeof(p), "%s/notes.txt", dir);
    put(p, "precious");
    snprintf(p, sizeof(p), "%s/config.json", dir);
    put(p, "{}");
    cr_assert_eq(save_ranks(n, dir, r), L3D_ERR_CONFIG, "%s", r[0].err);
    cr_assert(strstr(r[0].err, "notes.txt") && strstr(r[0].err, "project"), "%s", r[0].err);
    if (n > 1) cr_assert(r[1].st < 0);
    cr_assert(is_file(dir, "notes.txt") && is_file(dir, "config.json"));
    cr_assert(!is_file(dir, "model.safetensors") && !is_file(dir, "shards.json"));
    // a regular file as the target
    path(p, sizeof(p), "file.txt");
    put(p, "mine");
    cr_assert_eq(save_ranks(n, p, r), L3D_ERR_CONFIG, "%s", r[0].err);
    cr_assert(strstr(r[0].err, "regular file"), "%s", r[0].err);
    cr_assert(is_file(g_dir, "file.txt"));
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "test -z \"$(ls -d %s/*.tmp.* 2>/dev/null)\"", g_dir);
    cr_assert_eq(system(cmd), 0, "a temporary was left behind");
}

Test(save, single_rank_refuses_foreign, .init = setup, .fini = teardown) { refuses_foreign(1); }
Test(save, sharded_refuses_foreign, .init = setup, .fini = teardown) { refuses_foreign(2); }

// A symlink to a directory: the save goes into the target and the link stays.
static void follows_symlink(int n) {
    char real[128], link[128];
    rank_t r[2];
    path(real, sizeof(real), "real");
    path(link, sizeof(link), "link");
    cr_assert_eq(l3d_dir_create(real), 0);
    cr_assert_eq(symlink("real", link), 0);
    for (int k = 0; k < 2; k++) {  // into the empty target, then over its own checkpoint
        cr_assert_eq(save_ranks(n, link, r), L3D_OK, "%s", r[0].err);
        struct stat st;
        cr_assert(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced");
        cr_assert(is_file(real, "config.json") && is_file(real, "trainer_state.json"));
        cr_assert(is_file(real, n > 1 ? "shards.json" : "model.safetensors"));
        cr_assert(!is_file(real, ".llama3d-save"), "the marker was published");
    }
}

Test(save, single_rank_follows_symlink, .init = setup, .fini = teardown) { follows_symlink(1); }
Test(save, sharded_follows_symlink, .init = setup, .fini = teardown) { follows_symlink(2); }

// "<target>.tmp.<pid>" with llama3d's marker for `pid` on `host`.
static void fake_tmp(const char *target, long pid, const char *host) {
    char p[300], text[400];
    snprintf(p, sizeof(p), "%s.tmp.%ld", target, pid);
    cr_assert_eq(l3d_dir_create(p), 0);
    snprintf(p, sizeof(p), "%s.tmp.%ld/model.safetensors", target, pid);
    put(p, "partial");
    snprintf(p, sizeof(p), "%s.tmp.%ld/.llama3d-save", target, pid);
    snprintf(text, sizeof(text), "llama3d checkpoint save in progress\npid %ld\nhost %s\n"
             "hostname test\n", pid, host);
    put(p, text);
}

static int tmp_exists(const char *target, long pid) {
    char p[300];
    snprintf(p, sizeof(p), "%s.tmp.%ld", target, pid);
    return l3d_path_is_dir(p);
}

static void cleans_dead_temporaries(int n) {
    char host[200], ck[128];
    rank_t r[2];
    if (l3d_host_id(host, sizeof(host)) != 0) cr_skip_test("no boot id on this system");
    path(ck, sizeof(ck), "ck");
    pid_t child = fork();
    if (child == 0) _exit(0);
    cr_assert(child > 0);
    cr_assert_eq(waitpid(child, NULL, 0), child);  // reaped: provably dead
    long dead = (long)child, live = (long)getppid(), far = (long)child + 1000000;
    fake_tmp(ck, dead, host);
    fake_tmp(ck, live, host);
    fake_tmp(ck, far, "another-boot pid:[1]");  // another machine's pid is never trusted
    char other[128];
    path(other, sizeof(other), "other");
    fake_tmp(other, dead, host);  // another target's
    cr_assert_eq(save_ranks(n, ck, r), L3D_OK, "%s", r[0].err);
    cr_assert(!tmp_exists(ck, dead), "a dead owner's temporary stayed");
    cr_assert(tmp_exists(ck, live), "a live owner's temporary was removed");
    cr_assert(tmp_exists(ck, far), "another host's temporary was removed");
    cr_assert(tmp_exists(other, dead), "another target's temporary was removed");
    cr_assert(is_file(ck, "config.json"));
}

Test(save, single_rank_cleans_dead_temporaries, .init = setup, .fini = teardown) {
    cleans_dead_temporaries(1);
}
Test(save, sharded_cleans_dead_temporaries, .init = setup, .fini = teardown) {
    cleans_dead_temporaries(2);
}

// The model-only save (l3d_model_save) follows the same rule.
Test(save, model_save_refuses_a_file, .init = setup, .fini = teardown) {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    l3d_model_t *m;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &dev), L3D_OK);
    l3d_model_config_t cfg;
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-tiny", &cfg), L3D_OK);
    cr_assert_eq(l3d_model_create(ctx, dev, &cfg, &m), L3D_OK);
    char p[128];
    path(p, sizeof(p), "weights");
    put(p, "not a checkpoint");
    cr_assert_eq(l3d_model_save(m, p), L3D_ERR_CONFIG);
    cr_assert(is_file(g_dir, "weights"));
    cr_assert_eq(l3d_model_save(m, ""), L3D_ERR_CONFIG, "an empty name saved nothing silently");
    cr_assert_eq(l3d_checkpoint_check_target(ctx, p), L3D_ERR_CONFIG);
    path(p, sizeof(p), "fresh");
    cr_assert_eq(l3d_checkpoint_check_target(ctx, p), L3D_OK);
    cr_assert(!l3d_path_exists(p), "checking created the target");
    cr_assert_eq(l3d_model_save(m, p), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert(is_file(p, "model.safetensors"));
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
}

// Loading a sharded checkpoint reports progress as a single-rank one does: through the ctx's
// progress callback, named after the directory, ending with every byte of the shard files.
typedef struct seen {
    char what[256];
    uint64_t done, total;
    int calls, last;
} seen_t;

static void on_progress(const char *what, uint64_t done, uint64_t total, int last, void *user) {
    seen_t *s = user;
    snprintf(s->what, sizeof(s->what), "%s", what);
    s->done = done;
    s->total = total;
    s->last = last;
    s->calls++;
}

Test(load, sharded_reports_progress, .init = setup, .fini = teardown) {
    char p[128];
    path(p, sizeof(p), "ck");
    rank_t r[2];
    cr_assert_eq(save_ranks(2, p, r), L3D_OK, "%s", r[0].err);
    cr_assert(is_file(p, "shards.json"));
    seen_t seen = {0};
    l3d_ctx_params_t prm = {.progress_fn = on_progress, .progress_user = &seen};
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(&prm, &ctx), L3D_OK);
    l3d_device_t *dev;
    l3d_model_t *m;
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &dev), L3D_OK);
    cr_assert_eq(l3d_model_open(ctx, dev, p, &m), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    uint64_t shards = 0, size;
    for (int i = 0; i < 2; i++) {
        char f[256];
        snprintf(f, sizeof(f), "%s/shard-%05d-of-00002.safetensors", p, i);
        cr_assert_eq(l3d_path_size(f, &size), 0, "%s", f);
        shards += size;
    }
    cr_assert(seen.calls > 0 && seen.last, "no final progress report");
    cr_assert(strstr(seen.what, "loading") && strstr(seen.what, p), "%s", seen.what);
    cr_assert_eq(seen.total, shards, "total %llu, shard files %llu",
                 (unsigned long long)seen.total, (unsigned long long)shards);
    cr_assert_eq(seen.done, seen.total);
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
}
