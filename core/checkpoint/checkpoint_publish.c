// Save targets and publication: a save replaces only a directory llama3d wrote, follows
// symlinks, and cleans up the temporaries of saves that were killed (the rules are in
// core/checkpoint/checkpoint_publish.h and docs/checkpoints.md).
#include "core/checkpoint/checkpoint_publish.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/l3d_core.h"
#include "platform/platform.h"

// Inside a temporary directory while it is being written; removed just before publishing.
#define MARKER_NAME ".llama3d-save"
#define MARKER_HEAD "llama3d checkpoint save in progress"

static l3d_status io_error(l3d_ctx_t *ctx, int rc, const char *what, const char *path) {
    return l3d_error(ctx, L3D_ERR_IO, "%s %s: %s", what, path, strerror(-rc));
}

// PREFIX 5+ digits "-of-" 5+ digits ".safetensors": checkpoint_dist.c's "shard-" and
// transformers' "model-" shards.
static int is_shard_name(const char *s, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(s, prefix, pl)) return 0;
    s += pl;
    for (int part = 0; part < 2; part++) {
        size_t d = 0;
        while (s[d] >= '0' && s[d] <= '9') d++;
        if (d < 5) return 0;
        s += d;
        const char *sep = part == 0 ? "-of-" : ".safetensors";
        if (strncmp(s, sep, strlen(sep))) return 0;
        s += strlen(sep);
    }
    return *s == '\0';
}

const char *const l3d_ckpt_carried_files[] = {"tokenizer.json", "tokenizer.model",
                                              "tokenizer_config.json", "special_tokens_map.json",
                                              "generation_config.json", NULL};

int l3d_ckpt_is_own_file(const char *name) {
    static const char *const own[] = {"config.json",          "model.safetensors",
                                      "optimizer.safetensors", "optimizer_sq.safetensors",
                                      "trainer_state.json",   "shards.json",
                                      "model.safetensors.index.json", L3D_CKPT_MASTER_FILE,
                                      MARKER_NAME};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (!strcmp(name, own[i])) return 1;
    for (const char *const *c = l3d_ckpt_carried_files; *c; c++)
        if (!strcmp(name, *c)) return 1;
    return is_shard_name(name, "shard-") || is_shard_name(name, "model-");
}

// The first entry of a directory that is not one of llama3d's files (regular files only).
typedef struct foreign {
    char name[256];
    int is_file;
} foreign_t;

static int find_foreign(void *arg, const char *name, int is_file) {
    if (is_file && l3d_ckpt_is_own_file(name)) return 0;
    foreign_t *f = arg;
    snprintf(f->name, sizeof(f->name), "%s", name);
    f->is_file = is_file;
    return 1;
}

// " (where LINK points)" when the user's path was a symlink, for messages.
static void via(char *buf, size_t cap, const char *given, const char *target) {
    buf[0] = '\0';
    size_t n = strlen(given);
    while (n > 1 && given[n - 1] == '/') n--;
    if (strlen(target) != n || strncmp(given, target, n))
        snprintf(buf, cap, " (where %s points)", given);
}

l3d_status l3d_ckpt_target_resolve(l3d_ctx_t *ctx, const char *dir, char *out, size_t cap) {
    if (!dir || !dir[0])
        return l3d_error(ctx, L3D_ERR_CONFIG, "the checkpoint directory name is empty");
    int rc = l3d_path_follow(dir, out, cap);
    if (rc) return io_error(ctx, rc, "save target", dir);
    char note[1100];
    via(note, sizeof(note), dir, out);
    const char *base = strrchr(out, '/');
    base = base ? base + 1 : out;
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return l3d_error(ctx, L3D_ERR_CONFIG, "save target %s%s: name the directory itself, "
                         "not '.', '..' or '/' (a save replaces the directory as a whole)",
                         out, note);
    foreign_t f;
    rc = l3d_dir_each(out, find_foreign, &f);
    if (rc == 0 || rc == -ENOENT) return L3D_OK;  // ours, empty, or not there yet
    if (rc == -ENOTDIR)
        return l3d_error(ctx, L3D_ERR_CONFIG, "save target %s%s is %s, not a checkpoint "
                         "directory; nothing was written or deleted (name a new directory, an "
                         "empty one, or one llama3d wrote)", out, note, l3d_path_kind(out));
    if (rc == 1)
        return l3d_error(ctx, L3D_ERR_CONFIG, "save target %s%s holds '%s'%s, which llama3d "
                         "did not write; a save replaces the whole directory, so it refuses "
                         "and nothing was deleted (name a new directory, an empty one, or one "
                         "llama3d wrote)", out, note, f.name,
                         f.is_file ? "" : " (not a regular file)");
    return io_error(ctx, rc, "cannot list save target", out);
}

// ---- temporaries -------------------------------------------------------------------------
typedef struct sweep {
    l3d_ctx_t *ctx;
    const char *parent, *base;
    const char *host;  // NULL: unknown here, so no marker can be trusted
    int64_t pid;       // ours: "<base>.tmp.<pid>" is the name about to be created
    l3d_status st;
} sweep_t;

// The pid and host a marker records (-1 / "" when it has none or cannot be read).
static void read_marker(const char *dir, int64_t *pid, char *host, size_t hcap) {
    char path[1500], *buf = NULL;
    *pid = -1;
    host[0] = '\0';
    snprintf(path, sizeof(path), "%s/" MARKER_NAME, dir);
    if (l3d_file_read_all(path, 4096, &buf, NULL)) return;
    const char *p = strstr(buf, "\npid "), *h = strstr(buf, "\nhost ");
    if (!strncmp(buf, MARKER_HEAD "\n", strlen(MARKER_HEAD) + 1) && p && h) {
        *pid = strtoll(p + 5, NULL, 10);
        h += 6;
        snprintf(host, hcap, "%.*s", (int)strcspn(h, "\n"), h);
    }
    free(buf);
}

static int remove_marked(const char *dir);

static int count_entry(void *arg, const char *name, int is_file) {
    (void)name, (void)is_file;
    ++*(int *)arg;
    return 0;
}

static int sweep_entry(void *arg, const char *name, int is_file) {
    sweep_t *s = arg;
    size_t bl = strlen(s->base);
    if (is_file || strncmp(name, s->base, bl) || strncmp(name + bl, ".tmp.", 5)) return 0;
    const char *digits = name + bl + 5;
    if (!*digits || strspn(digits, "0123456789") != strlen(digits) || strlen(digits) > 18)
        return 0;
    int64_t P = strtoll(digits, NULL, 10);
    char path[1400], mhost[256];
    snprintf(path, sizeof(path), "%s/%s", s->parent, name);
    int64_t mpid;
    read_marker(path, &mpid, mhost, sizeof(mhost));
    int here = s->host && mpid == P && !strcmp(mhost, s->host);
    if (P == s->pid) {
        // The name this save needs, left by an earlier process with our pid (we hold the pid
        // now, so that one is gone): ours to reuse if it is llama3d's on this host, or has
        // no marker (older llama3d) and only llama3d's files.
        foreign_t f;
        int plain = mpid < 0 && l3d_dir_each(path, find_foreign, &f) == 0;
        if (!here && !plain) {
            s->st = l3d_error(s->ctx, L3D_ERR_CONFIG, "%s is in the way of this save: it is not "
                              "a temporary llama3d left on this machine (move it away)", path);
            return 1;
        }
    } else if (mpid < 0 && l3d_proc_is_dead(P)) {
        // Killed between mkdir and its marker, or after removing its marker: an empty
        // directory (or one with an empty marker). rmdir cannot delete a file, and fails if
        // anything was written meanwhile.
        char m[1500];
        snprintf(m, sizeof(m), "%s/" MARKER_NAME, path);
        uint64_t size = 1;
        int entries = 0;
        if (l3d_dir_each(path, count_entry, &entries) == 0 && entries == 1 &&
            l3d_path_size(m, &size) == 0 && size == 0)
            remove(m);
        remove(path);
        return 0;
    } else if (!here || !l3d_proc_is_dead(P)) {
        return 0;  // a live owner's, another machine's, or not provably llama3d's
    }
    int rc = remove_marked(path);
    if (rc && P == s->pid) {
        s->st = io_error(s->ctx, rc, "removing", path);
        return 1;
    }
    if (rc)
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_CKPT, "cannot remove %s, left by a killed "
                "save (pid %lld): %s", path, (long long)P, strerror(-rc));
    else if (P != s->pid)
        l3d_log(s->ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "removed %s, left by a save whose "
                "process (pid %lld) has exited", path, (long long)P);
    return 0;
}

// Writes the owner marker `text` as dir/MARKER_NAME (replacing one that is there).
static int put_marker(const char *dir, const char *text) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/" MARKER_NAME, dir);
    FILE *f = fopen(path, "w");
    if (!f) return -errno;
    int ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : -(errno ? errno : EIO);
}

l3d_status l3d_ckpt_tmp_create(l3d_ctx_t *ctx, const char *target, int64_t pid, char *tmp,
                               size_t cap) {
    int n = snprintf(tmp, cap, "%s.tmp.%lld", target, (long long)pid);
    if (n < 0 || (size_t)n >= cap)
        return l3d_error(ctx, L3D_ERR_CONFIG, "save target %s: the path is too long", target);
    char parent[1100], host[200];
    const char *slash = strrchr(target, '/');
    if (!slash) snprintf(parent, sizeof(parent), ".");
    else if (slash == target) snprintf(parent, sizeof(parent), "/");
    else snprintf(parent, sizeof(parent), "%.*s", (int)(slash - target), target);
    int have_host = l3d_host_id(host, sizeof(host)) == 0;
    sweep_t s = {ctx, parent, slash ? slash + 1 : target, have_host ? host : NULL, pid, L3D_OK};
    int rc = l3d_dir_each(parent, sweep_entry, &s);
    if (s.st < 0) return s.st;
    (void)rc;  // a parent we cannot list: creating the temporary below says why
    rc = l3d_dir_create(tmp);
    if (rc) return io_error(ctx, rc, "creating", tmp);
    char text[600], hostname[128] = "", path[1200];
    if (gethostname(hostname, sizeof(hostname) - 1) != 0) hostname[0] = '\0';
    snprintf(text, sizeof(text), MARKER_HEAD "\npid %lld\nhost %s\nhostname %s\n",
             (long long)pid, have_host ? host : "unknown", hostname);
    // Written in place right after mkdir (no temp file, no fsync): the window in which a
    // kill leaves a temporary without its marker stays microseconds long.
    snprintf(path, sizeof(path), "%s/" MARKER_NAME, tmp);
    rc = put_marker(tmp, text);
    if (rc) {
        l3d_dir_remove_tree(tmp);
        return io_error(ctx, rc, "writing", path);
    }
    return L3D_OK;
}

static int remove_unless_marker(void *arg, const char *name, int is_file) {
    (void)is_file;
    char path[1400];
    snprintf(path, sizeof(path), "%s/%s", (const char *)arg, name);
    if (strcmp(name, MARKER_NAME) && remove(path) != 0 && errno != ENOENT) return -errno;
    return 0;
}

// Removes a temporary (or a replaced version) with its marker last, so a kill at any point
// leaves either nothing or something the next save recognises as a dead owner's.
static int remove_marked(const char *dir) {
    char path[1200];
    int rc = l3d_dir_each(dir, remove_unless_marker, (void *)dir);
    if (rc == -ENOENT) return 0;
    if (rc) return l3d_dir_remove_tree(dir);  // a sub-directory: not ours to order
    snprintf(path, sizeof(path), "%s/" MARKER_NAME, dir);
    if (remove(path) != 0 && errno != ENOENT) return -errno;
    return remove(dir) == 0 || errno == ENOENT ? 0 : -errno;
}

void l3d_ckpt_tmp_remove(const char *tmp) { remove_marked(tmp); }

l3d_status l3d_ckpt_tmp_publish(l3d_ctx_t *ctx, const char *tmp, const char *target) {
    char again[1100], marker[1200], *text = NULL;
    // What is published here is what the next save to target vets: a file this save wrote
    // that l3d_ckpt_is_own_file does not name would make that save refuse the directory (a
    // bug in llama3d, caught at the first save rather than the second).
    foreign_t f;
    int rc = l3d_dir_each(tmp, find_foreign, &f);
    if (rc == 1)
        return l3d_error(ctx, L3D_ERR_INTERNAL, "saving %s: the save wrote '%s'%s, which the "
                         "next save to it would refuse as foreign (a bug in llama3d; the "
                         "previous version is kept)", target, f.name,
                         f.is_file ? "" : " (not a regular file)");
    if (rc) return io_error(ctx, rc, "listing", tmp);
    L3D_CHECK(ctx, l3d_ckpt_target_resolve(ctx, target, again, sizeof(again)));
    if (strcmp(again, target))
        return l3d_error(ctx, L3D_ERR_CONFIG, "save target %s became a symlink (to %s) while "
                         "saving; nothing was replaced", target, again);
    // The version being replaced gets this save's marker first: after the swap it sits at
    // the temporary's name, and a kill while it is removed leaves it marked as ours.
    snprintf(marker, sizeof(marker), "%s/" MARKER_NAME, tmp);
    rc = l3d_file_read_all(marker, 4096, &text, NULL);
    if (rc) return io_error(ctx, rc, "reading", marker);
    if (l3d_path_is_dir(target)) rc = put_marker(target, text);
    free(text);
    if (rc) return io_error(ctx, rc, "marking the previous version in", target);
    rc = l3d_dir_swap(tmp, target);
    if (rc) return io_error(ctx, rc, "publishing checkpoint", target);
    snprintf(marker, sizeof(marker), "%s/" MARKER_NAME, target);
    if (remove(marker) != 0 && errno != ENOENT)
        l3d_log(ctx, L3D_LOG_WARN, L3D_SUBSYS_CKPT, "removing %s: %s (harmless: the next save "
                "replaces it)", marker, strerror(errno));
    rc = remove_marked(tmp);
    if (rc)
        l3d_log(ctx, L3D_LOG_WARN, L3D_SUBSYS_CKPT, "saved %s, but removing the previous "
                "version at %s failed: %s (the next save removes it)", target, tmp,
                strerror(-rc));
    return L3D_OK;
}

l3d_status l3d_checkpoint_check_target(l3d_ctx_t *ctx, const char *dir) {
    char target[1100];
    return l3d_ckpt_target_resolve(ctx, dir, target, sizeof(target));
}
