// libfabric shm endpoint names, and removal of the regions that exited llama3d processes left in
// /dev/shm.
// defines: l3d_ofi_shm_prepare
//
// Left to itself, shm 1.17 names an endpoint's region "<pid>:<uid>:<index>". A SIGKILLed
// process leaves that file behind, and a later process that is given the same pid meets it:
// libfabric reads the old region's pid, finds /proc/<pid> (now ours) and fails fi_enable with
// EBUSY. So each endpoint gets its own name before fi_enable (fi_setname), one that no other
// process, alive or dead, can hold:
//   l3d-<uid>-<pid namespace inode>-<pid>-<start time>-<endpoint address>
// The start time (/proc/self/stat field 22) tells a reused pid apart, the pid namespace makes it
// safe on a /dev/shm shared between containers, and the address of our l3d_ofi_t (alive as long
// as the endpoint) separates several endpoints of one process. Every field is zero-padded so
// that all ranks' addresses have one length (the address blob check in ofi.c compares them;
// libfabric's own names vary with the number of digits in the pid).
//
// Cleaning. A file named like ours is removed only when it is provably dead: same uid (name and
// owner), same pid namespace as us, and /proc says that pid is gone, a zombie, or a different
// process (another start time). A file with exactly this endpoint's name can only be a leftover
// of an earlier endpoint of this process at the same address that was not closed cleanly.
// Anything else (libfabric's default names, another namespace, another user) is left alone:
// it can no longer collide with us.
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/ofi/ofi_internal.h"

#define OFI_SHM_DIR "/dev/shm"
#define OFI_SHM_PREFIX "l3d-"

typedef struct ofi_shm_gc {
    l3d_ofi_t *o;
    unsigned uid;
} ofi_shm_gc_t;

// Parses a region name of ours (optionally followed by "_<n>": libfabric's per-message mmap
// files derive from the endpoint name). Returns 0 on success.
static int ofi_shm_parse(const char *name, unsigned *uid, uint64_t *pidns, uint32_t *pid,
                         uint64_t *start) {
    unsigned long long ns = 0, st = 0, addr = 0;
    unsigned u = 0, p = 0;
    int used = 0;
    if (strncmp(name, OFI_SHM_PREFIX, strlen(OFI_SHM_PREFIX))) return -1;
    if (sscanf(name, OFI_SHM_PREFIX "%10u-%20llu-%10u-%20llu-%16llx%n", &u, &ns, &p, &st, &addr,
               &used) != 5)
        return -1;
    const char *rest = name + used;
    if (*rest == '_') {
        rest++;
        if (!*rest) return -1;
        while (*rest >= '0' && *rest <= '9') rest++;
    }
    if (*rest || p == 0 || p > INT32_MAX) return -1;
    *uid = u;
    *pidns = ns;
    *pid = p;
    *start = st;
    return 0;
}

static int ofi_shm_gc_one(void *arg, const char *name, int is_file) {
    ofi_shm_gc_t *g = arg;
    l3d_ofi_t *o = g->o;
    unsigned uid;
    l3d_ofi_ident_t id = {0};
    if (!is_file || ofi_shm_parse(name, &uid, &id.pidns, &id.pid, &id.starttime)) return 0;
    // Another user's or another pid namespace's process cannot be checked from here.
    if (uid != g->uid || id.pidns != o->self.pidns) return 0;
    // Our own process: other endpoints of it may be alive (only our exact name is handled).
    if (id.pid == o->self.pid && id.starttime == o->self.starttime) return 0;
    char path[300];
    struct stat sb;
    snprintf(path, sizeof(path), OFI_SHM_DIR "/%s", name);
    if (lstat(path, &sb) || !S_ISREG(sb.st_mode) || sb.st_uid != (uid_t)g->uid) return 0;
    if (!l3d_ofi_ident_exited(&id)) return 0;
    // A /proc that hides other processes (hidepid) must not read as "exited": an existing pid
    // counts as dead only when its /proc entry was readable (zombie or another start time).
    snprintf(path, sizeof(path), "/proc/%u/stat", (unsigned)id.pid);
    if ((kill((pid_t)id.pid, 0) == 0 || errno == EPERM) && access(path, R_OK)) return 0;
    if (shm_unlink(name) == 0)
        l3d_log(o->ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM,
                "ofi: rank %d: removed " OFI_SHM_DIR "/%s left by exited process %u", o->rank,
                name, (unsigned)id.pid);
    return 0;
}

l3d_status l3d_ofi_shm_prepare(l3d_ofi_t *o) {
    // Without our own identity (no /proc) nothing can be proven: keep libfabric's naming.
    if (!o->self.boot_id[0] || !o->self.starttime) return L3D_OK;
    unsigned uid = (unsigned)getuid();
    char name[128];
    int n = snprintf(name, sizeof(name), OFI_SHM_PREFIX "%010u-%020" PRIu64 "-%010" PRIu32
                     "-%020" PRIu64 "-%016" PRIxPTR,
                     uid, o->self.pidns, o->self.pid, o->self.starttime, (uintptr_t)o);
    if (n < 0 || (size_t)n >= sizeof(name))
        return l3d_error(o->ctx, L3D_ERR_INTERNAL, "ofi: shm endpoint name too long");
    ofi_shm_gc_t g = {.o = o, .uid = uid};
    int rc = l3d_dir_each(OFI_SHM_DIR, ofi_shm_gc_one, &g);
    if (rc)
        l3d_log(o->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                "ofi: rank %d: cannot list " OFI_SHM_DIR " (%s): stale regions stay", o->rank,
                strerror(-rc));
    // This very name existing means an earlier endpoint of ours at this address leaked it.
    (void)shm_unlink(name);
    L3D_FI_CHECK(o, fi_setname(&o->ep->fid, name, (size_t)n + 1), "fi_setname(shm)");
    return L3D_OK;
}
