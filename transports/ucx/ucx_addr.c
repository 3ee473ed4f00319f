// UCX transport: the address header and pid-based liveness of same-host peers.
//
// Why: in UCX 1.13 no shared-memory transport supports UCP_ERR_HANDLING_MODE_PEER (creating
// such an endpoint fails with "posix/memory - no peer failure handler"), so endpoints to
// peers on this host use mode NONE to get shared memory at all, and a peer's death would go
// unnoticed. Each address therefore names its process (pid + start time); while progressing,
// a rank looks at /proc/<pid>/stat of those peers twice a second, and a peer whose process is
// gone (or a zombie, or its pid reused) is failed like one whose endpoint reported an error.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/ucx/ucx_internal.h"

#define WATCH_PERIOD_S 0.5

// Reads state and start time of a process from /proc/<pid>/stat; 0 if it does not exist.
static int proc_stat(uint32_t pid, char *state_p, uint64_t *start_p) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%u/stat", (unsigned)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    // "pid (comm) state f4 ... f22": comm may hold spaces and parentheses, so start after the
    // last ')'.
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    p += 2;
    *state_p = *p;
    unsigned long long start = 0;
    int field = 3;
    for (char *q = p; *q && field < 22; q++)
        if (*q == ' ') {
            field++;
            if (field == 22) sscanf(q + 1, "%llu", &start);
        }
    *start_p = start;
    return 1;
}

void l3d_ucx_hdr_fill(l3d_ucx_addr_hdr_t *h) {
    memset(h, 0, sizeof(*h));
    h->magic = L3D_UCX_ADDR_MAGIC;
    h->pid = (uint32_t)getpid();
    char state;
    if (!proc_stat(h->pid, &state, &h->start_time)) h->start_time = 0;
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) h->pidns = (uint64_t)st.st_ino;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(h->boot_id, sizeof(h->boot_id), f)) h->boot_id[0] = '\0';
        fclose(f);
        h->boot_id[strcspn(h->boot_id, "\n")] = '\0';
    }
}

int l3d_ucx_hdr_same_host(const l3d_ucx_addr_hdr_t *mine, const l3d_ucx_addr_hdr_t *h) {
    // Without a start time or boot id nothing can be checked: treat the peer as remote.
    return mine->start_time && h->start_time && mine->boot_id[0] &&
           !strncmp(mine->boot_id, h->boot_id, sizeof(h->boot_id)) && mine->pidns == h->pidns;
}

int l3d_ucx_tls_may_use_shm(const char *tls) {
    if (!tls || !*tls || tls[0] == '^' || strstr(tls, "all")) return 1;
    static const char *const shm[] = {"posix", "sysv", "sm", "shm", "cma", "xpmem", "knem"};
    for (size_t i = 0; i < L3D_ARRAY_LEN(shm); i++)
        if (strstr(tls, shm[i])) return 1;
    return 0;
}

// Whether the comma-separated UCX_TLS list `tls` lets UCX use transport `name`: "all", a list
// naming it (or the "sm"/"shm" aliases, which include every shared-memory transport), or an
// exclusion list ("^a,b") that does not name it.
int l3d_ucx_tls_allows(const char *tls, const char *name) {
    if (!tls || !*tls) return 1;
    int exclude = tls[0] == '^', named = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls + exclude);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "all") && !exclude) return 1;
        named |= !strcmp(t, name) || (!exclude && (!strcmp(t, "sm") || !strcmp(t, "shm")));
    }
    return exclude ? !named : named;
}

void l3d_ucx_watch(l3d_ucx_t *u) {
    double t = l3d_ucx_now();
    if (t < u->next_watch) return;
    u->next_watch = t + WATCH_PERIOD_S;
    for (int i = 0; i < u->nranks; i++) {
        l3d_ucx_peer_t *pp = &u->peers[i];
        if (!pp->watch || pp->failed) continue;
        char state = 0;
        uint64_t start = 0;
        int exists = proc_stat(pp->pid, &state, &start);
        if (exists && state != 'Z' && state != 'X' && start == pp->start_time) continue;
        char why[96];
        snprintf(why, sizeof(why), "its process (pid %u) is gone", (unsigned)pp->pid);
        snprintf(u->last_ucs, sizeof(u->last_ucs), "%s", why);
        l3d_ucx_peer_fail(u, i, why, L3D_LOG_INFO);
    }
}
