// Chunked reading and crash-safe chunked writing (see file_stream.h).
#define _GNU_SOURCE  // mkostemp
#include "platform/file_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/platform.h"

// ---- reading -----------------------------------------------------------------------------

int l3d_file_in_open(const char *path, int *fd_p, uint64_t *size_p) {
    // O_NONBLOCK: opening a FIFO that has no writer would otherwise wait forever.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return S_ISDIR(st.st_mode) ? -EISDIR : -ENODEV;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_p = fd;
    *size_p = (uint64_t)st.st_size;
    return 0;
}

int l3d_file_in_read(int fd, void *buf, size_t cap, size_t *got_p) {
    char *p = buf;
    size_t got = 0;
    while (got < cap) {
        ssize_t r = read(fd, p + got, cap - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    *got_p = got;
    return 0;
}

void l3d_file_in_close(int fd) {
    if (fd >= 0) close(fd);
}

// ---- writing -----------------------------------------------------------------------------

struct l3d_file_out {
    int fd;
    char *path, *tmp;
};

static void out_free(l3d_file_out_t *o) {
    free(o->path);
    free(o->tmp);
    free(o);
}

int l3d_file_out_open(const char *path, l3d_file_out_t **out_p) {
    l3d_file_out_t *o = calloc(1, sizeof(*o));
    size_t tlen = strlen(path) + 64;
    if (!o || !(o->path = strdup(path)) || !(o->tmp = malloc(tlen))) {
        if (o) out_free(o);
        return -ENOMEM;
    }
    // The pid and host in the name let a later process tell a killed writer's temporary from
    // a live one's, here or on another machine sharing the directory (l3d_file_out_sweep).
    char host[32];
    if (l3d_host_tag(host, sizeof(host))) snprintf(host, sizeof(host), "x");
    snprintf(o->tmp, tlen, "%s.tmp.%ld.%s.XXXXXX", path, (long)getpid(), host);
    // mkostemp creates with O_EXCL: a planted symlink or another thread's file is never used.
    o->fd = mkostemp(o->tmp, O_CLOEXEC);
    if (o->fd < 0) {
        int rc = -errno;
        out_free(o);
        return rc;
    }
    (void)fchmod(o->fd, 0644);  // mkostemp makes 0600; a cache is as readable as its source
    *out_p = o;
    return 0;
}

int l3d_file_out_write(l3d_file_out_t *o, const void *data, size_t len) {
    return l3d_fd_write_all(o->fd, data, len);
}

void l3d_file_out_abort(l3d_file_out_t *o) {
    if (!o) return;
    close(o->fd);
    unlink(o->tmp);
    out_free(o);
}

int l3d_file_out_commit(l3d_file_out_t *o) {
    int rc = 0;
    while (fsync(o->fd) != 0) {
        if (errno != EINTR) {
            rc = -errno;
            break;
        }
    }
    // Linux closes the descriptor even when close() says EINTR; the data is synced already.
    if (close(o->fd) != 0 && rc == 0 && errno != EINTR) rc = -errno;
    o->fd = -1;
    if (rc == 0 && rename(o->tmp, o->path) != 0) rc = -errno;
    if (rc != 0) {
        unlink(o->tmp);
        out_free(o);
        return rc;
    }
    // The rename is durable once its directory is synced; file systems that cannot sync a
    // directory say EINVAL, and there is nothing more to do on those.
    char *slash = strrchr(o->path, '/');
    const char *dir = ".";
    if (slash) {
        *slash = 0;
        dir = slash == o->path ? "/" : o->path;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) rc = -errno;
        close(dfd);
    }
    out_free(o);
    return rc;
}

typedef struct sweep {
    const char *dir, *base, *host;
    int removed;
} sweep_t;

// "<base>.tmp.<pid>.<host>.XXXXXX" of this host whose pid is dead: removed.
static int sweep_entry(void *arg, const char *name, int is_file) {
    sweep_t *s = arg;
    size_t bl = strlen(s->base), hl = strlen(s->host);
    if (!is_file || strncmp(name, s->base, bl) || strncmp(name + bl, ".tmp.", 5)) return 0;
    const char *p = name + bl + 5;
    size_t digits = strspn(p, "0123456789");
    if (digits == 0 || digits > 18 || p[digits] != '.') return 0;
    const char *h = p + digits + 1;
    if (strncmp(h, s->host, hl) || h[hl] != '.' || strlen(h + hl + 1) != 6) return 0;
    long long pid = strtoll(p, NULL, 10);
    if (!l3d_proc_is_dead(pid)) return 0;  // ours (another thread's) included
    char path[4200];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", s->dir, name) >= sizeof(path)) return 0;
    if (unlink(path) == 0) s->removed++;
    return 0;
}

int l3d_file_out_sweep(const char *path) {
    char host[32], dir[4096];
    if (l3d_host_tag(host, sizeof(host))) return 0;  // no pid can be proved dead
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if ((size_t)(slash - path) >= sizeof(dir)) return -ENAMETOOLONG;
    else snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    sweep_t s = {dir, slash ? slash + 1 : path, host, 0};
    int rc = l3d_dir_each(dir, sweep_entry, &s);
    return rc < 0 ? rc : s.removed;
}

// ---- maps -----------------------------------------------------------------

void l3d_file_map_release(const void *data, size_t off, size_t len) {
    long page = sysconf(_SC_PAGESIZE);
    if (!data || page <= 0) return;
    uintptr_t lo = (uintptr_t)data + off, hi = lo + len, p = (uintptr_t)page;
    lo = (lo + p - 1) / p * p;  // only whole pages inside the range
    hi = hi / p * p;
    // A read-only private map that was never written: the pages are the file's, and
    // MADV_DONTNEED only drops them from this process (they are read again when touched).
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
