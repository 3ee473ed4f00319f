// Files: whole reads, read-only maps, crash-safe replacement of files and directories,
// writes through to what a user named, directory listings, symlink resolution.
// Every function returns 0 or a negative errno value; callers add the words.
#define _GNU_SOURCE  // renameat2 + RENAME_EXCHANGE, nftw
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/platform.h"

// ---- helpers -----------------------------------------------------------------------------

// `path` without trailing slashes ("ckpt/" and "ckpt" name the same directory, and
// "<dst>.old.<pid>" must not become "ckpt/.old.<pid>"), malloc'd.
static char *strip_slashes(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, path, n);
    s[n] = '\0';
    return s;
}

// The directory that holds `path` ("." when there is none), malloc'd.
static char *dir_of(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    while (n > 0 && path[n - 1] != '/') n--;
    while (n > 1 && path[n - 1] == '/') n--;
    if (n == 0) return strip_slashes(".");
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

// Makes the directory entries of `dir` durable (a rename is only on disk once its directory
// is synced). File systems that cannot sync a directory say EINVAL; there is nothing more
// to do on those, so that is not an error.
static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = 0;
    while (fsync(fd) != 0) {
        if (errno == EINTR) continue;
        if (errno != EINVAL && errno != ENOTSUP) rc = -errno;
        break;
    }
    close(fd);
    return rc;
}

int l3d_fd_write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        // Linux writes at most ~2 GiB per call; ask for 1 GiB pieces.
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (w == 0) return -EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

// ---- reading -----------------------------------------------------------------------------

// Opens a file the user named for reading. O_NONBLOCK: opening a FIFO without a writer (or
// some devices) would otherwise block forever, before fstat could tell what it is. Only
// regular files are accepted: a directory is -EISDIR, anything else -EINVAL
// (l3d_path_kind says what it is).
static int open_regular(const char *path, struct stat *st) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -errno;
    int rc = 0;
    if (fstat(fd, st) != 0) rc = -errno;
    else if (S_ISDIR(st->st_mode)) rc = -EISDIR;
    else if (!S_ISREG(st->st_mode)) rc = -EINVAL;
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

int l3d_file_read_all(const char *path, size_t max_len, char **buf_p, size_t *len_p) {
    *buf_p = NULL;
    if (len_p) *len_p = 0;
    struct stat st;
    int fd = open_regular(path, &st);
    if (fd < 0) return fd;
    int rc = 0;
    char *buf = NULL;
    // Size the buffer once, +1 for the NUL and +1 so that the read that sees EOF has room
    // and no regrowth happens. Files that report size 0 (/proc) grow as they go.
    size_t cap = 4096;
    if (max_len && (uint64_t)st.st_size > max_len) {
        rc = -EFBIG;
        goto fail;
    }
    if ((uint64_t)st.st_size > SIZE_MAX - 2) {
        rc = -EFBIG;
        goto fail;
    }
    if (st.st_size > 0) cap = (size_t)st.st_size + 2;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto fail;
    }
    size_t len = 0;
    for (;;) {
        if (len + 1 == cap) {
            if (cap > SIZE_MAX / 2) {
                rc = -EFBIG;
                goto fail;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = -ENOMEM;
                goto fail;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = -errno;
            goto fail;
        }
        if (r == 0) break;
        len += (size_t)r;
        // The file may have grown since fstat.
        if (max_len && len > max_len) {
            rc = -EFBIG;
            goto fail;
        }
    }
    close(fd);
    buf[len] = '\0';
    *buf_p = buf;
    if (len_p) *len_p = len;
    return 0;
fail:
    free(buf);
    close(fd);
    return rc;
}

// The mapping is MAP_PRIVATE and read-only; if another process truncates the file while it
// is mapped, touching the lost pages raises SIGBUS. Checkpoints are replaced by rename, never
// rewritten in place, so a mapped file is never truncated by llama3d itself.
int l3d_file_map(const char *path, const void **data_p, size_t *len_p) {
    *data_p = NULL;
    *len_p = 0;
    struct stat st;
    int fd = open_regular(path, &st);
    if (fd < 0) return fd;
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return -EFBIG;
    }
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);  // the mapping keeps its own reference to the file
    if (p == MAP_FAILED) return -err;
    *data_p = p;
    *len_p = len;
    return 0;
}

void l3d_file_unmap(const void *data, size_t len) {
    if (data && len) munmap((void *)data, len);
}

void l3d_file_map_drop(const void *map, size_t map_len, const void *data, size_t len) {
    // Whole pages inside [data, data + len) only: neighbours' pages stay.
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)data,
              hi = (uintptr_t)data + len, base = (uintptr_t)map;
    if (!map || !len || lo < base || hi > base + map_len) return;
    lo = (lo + page - 1) / page * page;
    hi = hi / page * page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

// ---- writing -----------------------------------------------------------------------------

// One writer per `path` at a time: two threads of one process would share the temp name.
int l3d_file_write_atomic(const char *path, const l3d_iovec_t *pieces, size_t n) {
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) return -ENOMEM;
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    // O_NOFOLLOW: a symlink planted at the temp name must not redirect the write.
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        int rc = -errno;
        free(tmp);
        return rc;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (pieces[i].len) rc = l3d_fd_write_all(fd, pieces[i].data, pieces[i].len);
    while (rc == 0 && fsync(fd) != 0) {
        if (errno != EINTR) rc = -errno;
    }
    // Linux closes the descriptor even when close() says EINTR, and the data is already
    // synced, so only a real error counts.
    if (close(fd) != 0 && rc == 0 && errno != EINTR) rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
    if (rc != 0) {
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);
    // The new file is in place; syncing the directory makes the rename itself durable.
    char *dir = dir_of(path);
    if (!dir) return -ENOMEM;
    rc = fsync_dir(dir);
    free(dir);
    return rc;
}

// A path the user named (--out): a regular file, or nothing yet, is replaced atomically;
// anything else is written through, never replaced: a device (/dev/stdout, /dev/full), a
// FIFO, or a symlink (its target is written, the link stays).
int l3d_file_write(const char *path, const l3d_iovec_t *pieces, size_t n) {
    if (!path[0]) return -ENOENT;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) return -errno;
        return l3d_file_write_atomic(path, pieces, n);
    }
    if (S_ISREG(st.st_mode)) return l3d_file_write_atomic(path, pieces, n);
    if (S_ISDIR(st.st_mode)) return -EISDIR;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return -errno;
    int rc = fstat(fd, &st) != 0 ? -errno : 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (pieces[i].len) rc = l3d_fd_write_all(fd, pieces[i].data, pieces[i].len);
    // A regular file behind a symlink is made durable like any other; devices and pipes
    // have nothing to sync (and some say EINVAL).
    while (rc == 0 && S_ISREG(st.st_mode) && fsync(fd) != 0) {
        if (errno != EINTR) rc = -errno;
    }
    if (close(fd) != 0 && rc == 0 && errno != EINTR) rc = -errno;
    return rc;
}

// ---- directories -------------------------------------------------------------------------

int l3d_dir_create(const char *path) {
    if (!path[0]) return -ENOENT;
    char *p = strip_slashes(path);
    if (!p) return -ENOMEM;
    size_t n = strlen(p);
    int rc = 0;
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        if (p[i - 1] == '/') continue;  // "a//b"
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0) {
            int err = errno;
            struct stat st;
            // Existing directories are fine, whatever mkdir said about them (EEXIST, or
            // EACCES/EROFS on some systems for a directory we could not create anyway).
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
                rc = err == EEXIST ? -ENOTDIR : -err;
                break;
            }
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    int r = (flag == FTW_DP || flag == FTW_DNR) ? rmdir(p) : unlink(p);
    if (r != 0 && errno != ENOENT) return errno;
    return 0;
}

int l3d_dir_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode)) return (unlink(path) == 0 || errno == ENOENT) ? 0 : -errno;
    // FTW_PHYS: symlinks are removed, never followed out of the tree.
    int r = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (r > 0) return -r;
    if (r < 0) return -errno;
    return 0;
}

// Publishing a directory. On Linux renameat2(RENAME_EXCHANGE) swaps src and dst in one
// atomic step, so `dst` always names a whole version. Where the file system cannot exchange,
// dst is renamed to "<dst>.old.<pid>", src to dst, and that to src: between the first two
// renames `dst` does not exist. A crash in that window leaves the previous version at
// "<dst>.old.<pid>" and the new one at `src`; a reader that finds no `dst` should look there.
int l3d_dir_swap(const char *src_in, const char *dst_in) {
    char *src = strip_slashes(src_in), *dst = strip_slashes(dst_in);
    char *old = NULL, *dst_parent = NULL, *src_parent = NULL;
    int rc = 0;
    if (!src || !dst) {
        rc = -ENOMEM;
        goto out;
    }
    dst_parent = dir_of(dst);
    src_parent = dir_of(src);
    if (!dst_parent || !src_parent) {
        rc = -ENOMEM;
        goto out;
    }
    struct stat st;
    if (lstat(src, &st) != 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISDIR(st.st_mode)) {
        rc = -ENOTDIR;
        goto out;
    }
    int have_dst = lstat(dst, &st) == 0;
    if (!have_dst && errno != ENOENT) {
        rc = -errno;
        goto out;
    }
#ifdef RENAME_EXCHANGE
    if (have_dst) {
        if (renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_EXCHANGE) == 0) {
            rc = fsync_dir(dst_parent);
            if (rc == 0 && strcmp(src_parent, dst_parent) != 0) rc = fsync_dir(src_parent);
            goto out;
        }
        if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
            rc = -errno;
            goto out;
        }
    }
#endif
    if (have_dst) {
        size_t olen = strlen(dst) + 32;
        old = malloc(olen);
        if (!old) {
            rc = -ENOMEM;
            goto out;
        }
        snprintf(old, olen, "%s.old.%ld", dst, (long)getpid());
        l3d_dir_remove_tree(old);  // left over by an earlier process with this pid
        if (rename(dst, old) != 0) {
            rc = -errno;
            goto out;
        }
    }
    // The window: `dst` does not exist until this rename succeeds.
    if (rename(src, dst) != 0) {
        rc = -errno;
        if (old) rename(old, dst);  // put the previous version back
        goto out;
    }
    rc = fsync_dir(dst_parent);
    if (rc == 0 && strcmp(src_parent, dst_parent) != 0) rc = fsync_dir(src_parent);
    // The previous version goes where src was, as with an exchange; failing that it is
    // removed, so nothing is left under a name the caller does not know.
    if (old && rename(old, src) != 0) {
        int r2 = l3d_dir_remove_tree(old);
        if (rc == 0) rc = r2;
    }
out:
    free(src);
    free(dst);
    free(old);
    free(dst_parent);
    free(src_parent);
    return rc;
}

int l3d_dir_replace(const char *src, const char *dst) {
    int rc = l3d_dir_swap(src, dst);
    if (rc) return rc;
    return l3d_dir_remove_tree(src);  // src now names the previous version (or nothing)
}

int l3d_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int l3d_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int l3d_path_present(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

const char *l3d_path_kind(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        if (err == ELOOP) return "a symlink loop";
        if (err == ENOENT && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return "a dangling symlink";
        return err == ENOENT ? "missing" : "unreadable";
    }
    if (S_ISREG(st.st_mode)) return "a regular file";
    if (S_ISDIR(st.st_mode)) return "a directory";
    if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(st.st_mode)) return "a character device";
    if (S_ISBLK(st.st_mode)) return "a block device";
    if (S_ISSOCK(st.st_mode)) return "a socket";
    return "not a regular file";
}

int l3d_path_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0) return -errno;
    *size = (uint64_t)st.st_size;
    return 0;
}

int l3d_path_follow(const char *path, char *out, size_t cap) {
    char *p = strip_slashes(path);
    if (!p) return -ENOMEM;
    int rc = -ELOOP;
    for (int hop = 0; hop < 40; hop++) {
        struct stat st;
        int missing = 0;
        if (lstat(p, &st) != 0) {
            if (errno != ENOENT) {
                rc = -errno;
                break;
            }
            missing = 1;
        }
        if (missing || !S_ISLNK(st.st_mode)) {
            rc = strlen(p) < cap ? 0 : -ENAMETOOLONG;
            if (rc == 0) memcpy(out, p, strlen(p) + 1);
            break;
        }
        char target[4096];
        ssize_t k = readlink(p, target, sizeof(target) - 1);
        if (k < 0) {
            rc = -errno;
            break;
        }
        target[k] = '\0';
        char *next;
        if (target[0] == '/' || !strchr(p, '/')) {
            next = strip_slashes(target);  // absolute, or relative to "." where p is
        } else {
            char *d = dir_of(p);
            size_t len = d ? strlen(d) + strlen(target) + 2 : 0;
            next = d ? malloc(len) : NULL;
            if (next) snprintf(next, len, "%s/%s", d, target);
            free(d);
            if (next) {
                char *t = strip_slashes(next);
                free(next);
                next = t;
            }
        }
        free(p);
        p = next;
        if (!p) return -ENOMEM;
    }
    free(p);
    return rc;
}

int l3d_dir_each(const char *path, int (*fn)(void *arg, const char *name, int is_file),
                 void *arg) {
    DIR *d = opendir(path);
    if (!d) return -errno;
    int rc = 0, dfd = dirfd(d);
    struct dirent *de;
    errno = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        struct stat st;
        int is_file = fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
        rc = fn(arg, de->d_name, is_file);
        errno = 0;
    }
    if (rc == 0 && errno != 0) rc = -errno;
    closedir(d);
    return rc;
}
