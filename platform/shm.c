// Memory that the processes of one machine share: an anonymous memfd, which another process
// of the same user and pid namespace maps through /proc/<pid>/fd/<fd> while the creator keeps
// the descriptor open. Nothing gets a name in /dev/shm, so a process killed at any point
// leaves nothing behind: the pages go with the last mapping.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/platform.h"

int l3d_shm_create(size_t bytes, int *fd_p, void **addr_p) {
    int fd = memfd_create("l3d-shm", MFD_CLOEXEC);
    if (fd < 0) return -errno;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    // Zero pages: nothing in the region holds data yet.
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return -e;
    }
    *fd_p = fd;
    *addr_p = p;
    return 0;
}

int l3d_shm_attach(int64_t pid, int fd, size_t bytes, void **addr_p) {
    int f;
    if (pid == (int64_t)getpid()) {
        f = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // a thread of the creator: no /proc needed
    } else {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%lld/fd/%d", (long long)pid, fd);
        f = open(path, O_RDWR | O_CLOEXEC);
    }
    if (f < 0) return -errno;
    struct stat sb;
    // Another process's fd of that number (pid reused, another namespace) is no memfd of
    // this size; the caller checks the region's contents as well.
    if (fstat(f, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size != bytes) {
        close(f);
        return -EINVAL;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    int e = errno;
    close(f);  // the mapping keeps the memory
    if (p == MAP_FAILED) return -e;
    *addr_p = p;
    return 0;
}

void l3d_shm_close_fd(int fd) {
    if (fd >= 0) close(fd);
}

void l3d_shm_unmap(void *addr, size_t bytes) {
    if (addr) munmap(addr, bytes);
}
