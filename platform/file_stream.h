// OS glue for data too large to hold: reading a file in chunks, writing one in chunks that
// appears under its name only once whole, and letting go of pages of a read-only map.
// defines: l3d_file_in_*, l3d_file_out_*, l3d_file_map_release
//
// Functions return 0 on success or a negative errno value, as the rest of platform/ does.
#ifndef L3D_PLATFORM_FILE_STREAM_H
#define L3D_PLATFORM_FILE_STREAM_H

#include <stddef.h>
#include <stdint.h>

// Opens a regular file for sequential reading; *size_p is its size. Never blocks on a FIFO
// without a writer (opened non-blocking, then refused): anything but a regular file is
// -EISDIR (a directory) or -ENODEV (a FIFO, socket or device), which a caller that must read a
// file twice reports as "not a regular file".
int l3d_file_in_open(const char *path, int *fd_p, uint64_t *size_p);
// Reads up to cap bytes (fewer only at the end of the file); *got_p = 0 at the end.
int l3d_file_in_read(int fd, void *buf, size_t cap, size_t *got_p);
void l3d_file_in_close(int fd);

// A file written in pieces that appears at `path` only when complete: the bytes go to a
// temporary "<path>.tmp.<pid>.<host>.XXXXXX" (<host>: l3d_host_tag, "x" where unknown; unique
// even between threads of one process), and commit fsyncs it, renames it over `path` and
// fsyncs the directory. Abort (or a crash) leaves `path` as it was; abort removes the
// temporary, and a crash's is removed by a later l3d_file_out_sweep.
typedef struct l3d_file_out l3d_file_out_t;
int l3d_file_out_open(const char *path, l3d_file_out_t **out_p);
// Removes the temporaries of `path` that killed processes left: those whose name gives this
// machine's host tag and a pid that is provably dead here (l3d_proc_is_dead). A live
// process's, another machine's (a shared file system), or one named otherwise is kept.
// Returns how many were removed, or -errno when the directory cannot be listed.
int l3d_file_out_sweep(const char *path);
int l3d_file_out_write(l3d_file_out_t *out, const void *data, size_t len);
// Both free `out`, whatever they return.
int l3d_file_out_commit(l3d_file_out_t *out);
void l3d_file_out_abort(l3d_file_out_t *out);

// Tells the kernel that the pages of [data + off, data + off + len) of a read-only map from
// l3d_file_map are not needed now: they leave this process's resident set, and reading them
// again reads the file again. Scanning a large map this way keeps the resident set bounded.
void l3d_file_map_release(const void *data, size_t off, size_t len);

#endif
