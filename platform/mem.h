// OS glue: how much memory this process can still take, from the kernel's own accounting.
// defines: l3d_mem_available, l3d_mem_available_at, l3d_mem_advise_huge
//
// Functions return 0 on success or a negative errno value, as the rest of platform/ does.
#ifndef L3D_PLATFORM_MEM_H
#define L3D_PLATFORM_MEM_H

#include <stddef.h>
#include <stdint.h>

// What the process can allocate before the kernel (or its cgroup) kills it: the smaller of
// MemAvailable in /proc/meminfo and, for the process's cgroup, memory.max - memory.current
// (cgroup v2) or memory.limit_in_bytes - memory.usage_in_bytes (v1). *src_p (may be NULL)
// names where the bound came from ("MemAvailable", "cgroup memory.max", ...).
// -ENOENT when none of them can be read (not Linux): the caller cannot check.
int l3d_mem_available(uint64_t *bytes_p, const char **src_p);
// The same with every path under `root` ("" is the real system): tests give it a fake tree
// (root/proc/meminfo, root/proc/self/cgroup, root/sys/fs/cgroup/...).
int l3d_mem_available_at(const char *root, uint64_t *bytes_p, const char **src_p);

// Asks the kernel to back [p, p+bytes) with transparent huge pages (madvise MADV_HUGEPAGE):
// the whole 2 MiB pages inside the range, none if it holds none. Streaming a large buffer
// (decode reads every weight once per token) then walks a page table 512x smaller; on this
// 2-core EPYC, decode ran 8-12% faster (bench/README.md). THP in "madvise" mode, Debian's
// default, honours only advised ranges; "never" ignores it. Advice only: the memory may come
// from the caller's allocator and stays theirs. 0, or -errno (-ENOSYS where there is no THP).
int l3d_mem_advise_huge(void *p, size_t bytes);

#endif
