// OS glue: threads and a thread pool, time, files. Knows nothing of llama3d's objects.
// defines: l3d_pool_t, l3d_time_*, l3d_file_*, l3d_num_cores
//
// Functions here return 0 on success or a negative errno value, so callers in core/ can
// turn them into an l3d_status with their own text (strerror(-rc)).
#ifndef L3D_PLATFORM_H
#define L3D_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"

// ---- threads -----------------------------------------------------------------------------
int l3d_num_cores(void);
// Binds the calling process to block `index` of `count` equal blocks of the CPUs it may run
// on (its affinity mask, in CPU order; a remainder stays unused). 1: bound; 0: more blocks
// than CPUs, left unbound; < 0: -errno.
int l3d_cpu_bind_block(int index, int count);

// A fixed pool of worker threads. l3d_pool_run() runs fn(arg, task, ntasks) for every task
// in [0, ntasks) and returns when all are done; the calling thread works too. Which thread
// runs a task is not fixed, so results must depend only on the task decomposition (this is
// how kernels stay bit-deterministic for any thread count). Not reentrant: one run at a time
// per pool; a task must not call l3d_pool_run on the same pool.
typedef struct l3d_pool l3d_pool_t;
typedef void (*l3d_pool_fn)(void *arg, int task, int ntasks);

// nthreads counts the caller: 1 means no extra threads. alloc may be NULL (malloc).
int l3d_pool_create(int nthreads, const l3d_allocator_t *alloc, l3d_pool_t **pool_p);
void l3d_pool_destroy(l3d_pool_t *pool);
int l3d_pool_size(const l3d_pool_t *pool);
void l3d_pool_run(l3d_pool_t *pool, l3d_pool_fn fn, void *arg, int ntasks);

// ---- time --------------------------------------------------------------------------------
double l3d_time_now(void);  // monotonic seconds

// ---- files -------------------------------------------------------------------------------
// Reads a whole regular file into a malloc'd NUL-terminated buffer (*len_p excludes the NUL).
// Caller frees with free(). max_len caps the size (0 = no cap; over the cap is -EFBIG).
// Never blocks on a FIFO: a directory is -EISDIR, any other non-regular file (FIFO, device,
// socket) -EINVAL; l3d_path_kind names it for the message.
int l3d_file_read_all(const char *path, size_t max_len, char **buf_p, size_t *len_p);

// Writes all `len` bytes to `fd`, retrying short writes and EINTR. 0, or -errno (-EIO when
// the file takes nothing).
int l3d_fd_write_all(int fd, const void *data, size_t len);

// Maps a regular file read-only (errors as l3d_file_read_all). l3d_file_unmap releases it.
// A zero-length file maps to NULL, 0.
int l3d_file_map(const char *path, const void **data_p, size_t *len_p);
void l3d_file_unmap(const void *data, size_t len);
// Releases the pages of [data, data + len) inside mapping (map, map_len) from this process's
// memory (the file keeps them; touching them again reads them back): a loader that has
// converted a tensor drops it, so its peak is the model plus one tensor, not the model twice.
void l3d_file_map_drop(const void *map, size_t map_len, const void *data, size_t len);

// Atomic replace: writes to "<path>.tmp.<pid>", fsyncs it, renames over `path`, fsyncs the
// directory. A crash at any point leaves either the old file or the new one, whole.
// The writer is given `n` pieces so callers need not concatenate large buffers.
typedef struct l3d_iovec {
    const void *data;
    size_t len;
} l3d_iovec_t;
int l3d_file_write_atomic(const char *path, const l3d_iovec_t *pieces, size_t n);
// Writes to a path a user named: a regular file or a missing path as l3d_file_write_atomic;
// a device, FIFO or symlink is opened and written through (never replaced); a directory is
// -EISDIR. Every write, sync and close is checked (/dev/full is -ENOSPC).
int l3d_file_write(const char *path, const l3d_iovec_t *pieces, size_t n);

// mkdir -p. Existing directories are fine.
int l3d_dir_create(const char *path);
// Atomically replaces directory `dst` by `src` (both on one file system): dst is renamed
// aside, src renamed to dst, then the old one removed. Used to publish a whole checkpoint.
int l3d_dir_replace(const char *src, const char *dst);
// l3d_dir_replace without the removal: afterwards dst names src's tree and src the previous
// dst (nothing when there was none), for callers that remove it in their own order.
int l3d_dir_swap(const char *src, const char *dst);
// Removes a directory tree (files and sub-directories). Missing is fine.
int l3d_dir_remove_tree(const char *path);
int l3d_path_exists(const char *path);
int l3d_path_is_dir(const char *path);
// Whether a directory entry named `path` is there, whatever it is (a symlink is not followed):
// a reader asks this before reading a file that may be absent, so that a symlink loop, a
// dangling link or a FIFO under that name is read, and refused with what it is, instead of
// being taken for no file at all.
int l3d_path_present(const char *path);
// What `path` is, for messages: "a regular file", "a directory", "a FIFO (named pipe)",
// "a character device", ..., "a symlink loop", "a dangling symlink", "missing",
// "unreadable". Follows symlinks.
const char *l3d_path_kind(const char *path);
// The size of what `path` names (following symlinks): 0 or -errno.
int l3d_path_size(const char *path, uint64_t *size);
// `path` with symlinks in its last component followed (relative targets joined to the
// link's directory) and trailing slashes dropped, into out[cap]. A missing path (or a
// dangling link's target) is returned as is: the caller may create it. Too many links: -ELOOP.
int l3d_path_follow(const char *path, char *out, size_t cap);
// Calls fn for every entry of directory `path` but "." and ".."; is_file: a regular file
// (symlinks are not). Stops at fn's first non-zero return and returns it; else 0 or -errno.
int l3d_dir_each(const char *path, int (*fn)(void *arg, const char *name, int is_file),
                 void *arg);

// ---- processes ---------------------------------------------------------------------------
// 1 when no process `pid` exists here (kill(pid, 0) says ESRCH); 0 when it may be alive.
int l3d_proc_is_dead(int64_t pid);
// This boot of this machine and this pid namespace, as one string ("<boot id> pid:[<ino>]"):
// a pid means something only where this matches. -ENOENT where it cannot be known.
int l3d_host_id(char *buf, size_t cap);
// l3d_host_id as 16 hex digits (its FNV-1a 64), short enough to go into a file's name.
int l3d_host_tag(char *buf, size_t cap);

// ---- memory shared between processes (platform/shm.c) -------------------------------------
// A zeroed region of `bytes` that other processes of this machine (same user and pid
// namespace) can map while *fd_p stays open: an anonymous memfd, never named in /dev/shm, so a
// killed process leaves nothing behind. l3d_shm_attach maps the region that process `pid`
// holds as descriptor `fd` (our own pid: the descriptor itself, for threads); -EINVAL when
// that descriptor is not a region of `bytes` (the caller checks the contents too). Release with l3d_shm_close_fd (the creator, once every
// process has attached or given up) and l3d_shm_unmap.
int l3d_shm_create(size_t bytes, int *fd_p, void **addr_p);
int l3d_shm_attach(int64_t pid, int fd, size_t bytes, void **addr_p);
void l3d_shm_close_fd(int fd);
void l3d_shm_unmap(void *addr, size_t bytes);

// ---- output files (platform/outfile.c) ---------------------------------------------------
// Side-channel files (metrics, monitors): opened where the path points (symlinks and devices
// followed, not replaced), written a whole piece at a time.
// Creates or truncates `path` (append: continues it); returns a descriptor or -errno.
int l3d_outfile_open(const char *path, int append);
// Writes all of data[0..len) at the end, or returns -errno having cut a partial piece off a
// regular file again, so the file ends with a whole record or line.
int l3d_outfile_append(int fd, const void *data, size_t len);
int l3d_outfile_close(int fd);  // fd < 0 is fine; 0 or -errno
// Bytes in the file (0 for a device or a pipe), or -errno.
int64_t l3d_outfile_size(int fd);
int l3d_process_id(void);
double l3d_time_wall(void);     // seconds since the Unix epoch (for time stamps, not intervals)
void l3d_host_name(char *buf, size_t cap);  // gethostname, or "localhost"

#endif
