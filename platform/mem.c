// Available memory: /proc/meminfo and the cgroup (v2 or v1) limits of this process. A model
// that does not fit must be refused before it is allocated: with overcommit, malloc succeeds
// and the OOM killer ends the process while the weights are being filled.
#define _DEFAULT_SOURCE  // madvise and MADV_HUGEPAGE are not ISO C
#include "platform/mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

// One unsigned number from a file of one line ("max" -> UINT64_MAX). 0 or -errno.
static int read_u64(const char *path, uint64_t *v) {
    FILE *f = fopen(path, "r");
    if (!f) return -errno;
    char buf[64];
    int rc = fgets(buf, sizeof(buf), f) ? 0 : -EINVAL;
    fclose(f);
    if (rc) return rc;
    if (!strncmp(buf, "max", 3)) {
        *v = UINT64_MAX;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (errno || end == buf) return -EINVAL;
    *v = (uint64_t)x;
    return 0;
}

static int meminfo_available(const char *root, uint64_t *v) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/proc/meminfo", root);
    FILE *f = fopen(path, "r");
    if (!f) return -errno;
    char line[256];
    int rc = -ENOENT;
    unsigned long long kib;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            *v = (uint64_t)kib * 1024;
            rc = 0;
            break;
        }
    fclose(f);
    return rc;
}

// limit - usage, where limit "max" or a v1 "unlimited" (a huge page-rounded number) means
// no bound: returns 1 for "no limit here".
static int cgroup_room(const char *limit_path, const char *usage_path, uint64_t *v) {
    uint64_t lim, use = 0;
    if (read_u64(limit_path, &lim)) return 1;
    if (lim >= (UINT64_MAX >> 2)) return 1;  // v1 writes 0x7FFFFFFFFFFFF000 for none
    read_u64(usage_path, &use);              // unreadable usage: count the whole limit
    *v = use < lim ? lim - use : 0;
    return 0;
}

// The smallest room of cgroup `cg` and its ancestors under `base` (a parent's limit binds
// its children; inside a container the hierarchy's root is the container's own cgroup).
// 0 and *v, or 1 when none of them has a limit.
static int cgroup_tree_room(const char *base, const char *cg, const char *limit_file,
                            const char *usage_file, uint64_t *v) {
    char dir[4096], lim[4200], use[4200];
    snprintf(dir, sizeof(dir), "%s", cg);
    int none = 1;
    for (;;) {
        uint64_t room;
        snprintf(lim, sizeof(lim), "%s%s/%s", base, dir, limit_file);
        snprintf(use, sizeof(use), "%s%s/%s", base, dir, usage_file);
        if (cgroup_room(lim, use, &room) == 0 && (none || room < *v)) {
            *v = room;
            none = 0;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || !dir[0]) break;
        *slash = 0;  // "/a/b" -> "/a" -> "" (the root)
    }
    return none;
}

// This process's cgroup: the "0::/path" line (v2) or the memory controller's line (v1).
static int cgroup_bound(const char *root, uint64_t *v, const char **src) {
    char path[4096], line[4096], base[4200];
    snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    int none = 1;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0;
        *c2 = 0;
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        uint64_t room;
        if (!strcmp(line, "0") && !ctrl[0]) {  // v2 unified hierarchy
            snprintf(base, sizeof(base), "%s/sys/fs/cgroup", root);
            if (!cgroup_tree_room(base, cg, "memory.max", "memory.current", &room) &&
                (none || room < *v)) {
                *v = room;
                *src = "cgroup memory.max";
                none = 0;
            }
        } else if (strstr(ctrl, "memory")) {  // v1: "N:memory:/path" (or "N:cpu,memory:")
            snprintf(base, sizeof(base), "%s/sys/fs/cgroup/memory", root);
            if (!cgroup_tree_room(base, cg, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                  &room) &&
                (none || room < *v)) {
                *v = room;
                *src = "cgroup memory.limit_in_bytes";
                none = 0;
            }
        }
    }
    fclose(f);
    return none;
}

int l3d_mem_available_at(const char *root, uint64_t *bytes_p, const char **src_p) {
    uint64_t best = UINT64_MAX, cg = 0;
    const char *src = NULL, *cgsrc = NULL;
    if (meminfo_available(root, &best) == 0) src = "MemAvailable in /proc/meminfo";
    if (cgroup_bound(root, &cg, &cgsrc) == 0 && cg < best) {
        best = cg;
        src = cgsrc;
    }
    if (!src) return -ENOENT;
    *bytes_p = best;
    if (src_p) *src_p = src;
    return 0;
}

int l3d_mem_available(uint64_t *bytes_p, const char **src_p) {
    return l3d_mem_available_at("", bytes_p, src_p);
}

int l3d_mem_advise_huge(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;  // x86-64 and aarch64 (4 KiB base pages)
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi <= lo) return 0;
    return madvise((void *)lo, hi - lo, MADV_HUGEPAGE) ? -errno : 0;
#else
    (void)p, (void)bytes;
    return -ENOSYS;
#endif
}
