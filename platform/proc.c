// Processes: is a pid provably dead, and which machine (and pid namespace) are we on.
// Used to clean up what a killed process left behind without ever touching a live one's.
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "platform/platform.h"

int l3d_proc_is_dead(int64_t pid) {
    if (pid <= 0 || (int64_t)(pid_t)pid != pid) return 0;
    // EPERM means a process exists that we may not signal: alive.
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

// A pid is only meaningful on one boot of one machine and inside one pid namespace
// (containers on one host share the boot id but not their pids), so the id joins both.
int l3d_host_id(char *buf, size_t cap) {
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return -ENOENT;
    int ok = fgets(boot, sizeof(boot), f) != NULL;
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
    ssize_t k = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    if (!ok || !boot[0] || k <= 0) return -ENOENT;
    ns[k] = '\0';
    int n = snprintf(buf, cap, "%s %s", boot, ns);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

int l3d_host_tag(char *buf, size_t cap) {
    char id[256];
    int rc = l3d_host_id(id, sizeof(id));
    if (rc) return rc;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = id; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    int n = snprintf(buf, cap, "%016llx", (unsigned long long)h);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

// Block `index` of `count` equal blocks of the CPUs this process may run on (mpirun's
// --bind-to core with a rank's share of the cores): ranks busy-polling each other then never
// share a core, as they may for tens of milliseconds after a fork until the scheduler
// spreads them.
int l3d_cpu_bind_block(int index, int count) {
    cpu_set_t all, mine;
    if (count < 1 || index < 0 || index >= count) return -EINVAL;
    if (sched_getaffinity(0, sizeof(all), &all)) return -errno;
    int ncpu = CPU_COUNT(&all);
    if (count > ncpu) return 0;
    int per = ncpu / count, k = 0;
    CPU_ZERO(&mine);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &all)) continue;
        if (k >= index * per && k < (index + 1) * per) CPU_SET(c, &mine);
        k++;
    }
    if (sched_setaffinity(0, sizeof(mine), &mine)) return -errno;
    return 1;
}
