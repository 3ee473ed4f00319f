// Output files written in whole pieces (metrics lines, event records), the wall clock and the
// host name: what the monitors need from the OS. Side-channel files are never replaced
// atomically: they are opened where the user points them, through symlinks and devices.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

int l3d_outfile_open(const char *path, int append) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0666);
    return fd < 0 ? -errno : fd;
}

int l3d_outfile_append(int fd, const void *data, size_t len) {
    // Where the piece starts, to cut a partial piece off again (a regular file only: a device
    // or a pipe has no length to restore).
    struct stat st;
    off_t start = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? lseek(fd, 0, SEEK_END) : -1;
    int rc = l3d_fd_write_all(fd, data, len);
    // A torn record would end the reader's view of the file (TensorBoard stops at a bad CRC, a
    // CSV or JSONL reader at a broken line): leave only whole pieces.
    if (rc < 0 && start >= 0 && ftruncate(fd, start) != 0) {
        // Nothing more to do: the caller reports rc and stops writing this file.
    }
    return rc;
}

int64_t l3d_outfile_size(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    return S_ISREG(st.st_mode) ? (int64_t)st.st_size : 0;
}

int l3d_outfile_close(int fd) {
    if (fd < 0) return 0;
    return close(fd) != 0 && errno != EINTR ? -errno : 0;
}

double l3d_time_wall(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int l3d_process_id(void) { return (int)getpid(); }

void l3d_host_name(char *buf, size_t cap) {
    if (cap == 0) return;
    if (gethostname(buf, cap) != 0) snprintf(buf, cap, "localhost");
    buf[cap - 1] = '\0';
    if (!buf[0]) snprintf(buf, cap, "localhost");
}
