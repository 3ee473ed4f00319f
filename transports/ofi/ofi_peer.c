// Peer failure for the libfabric transport: failing a dead peer's operations, and noticing that
// a peer on this node has exited, which libfabric 1.17 does not report (shm has no liveness at
// all; tcp;ofi_rxm logs the refused reconnect and keeps answering -FI_EAGAIN).
// defines: l3d_ofi_fail_peer, l3d_ofi_check_peers, l3d_ofi_ident_*
//
// Each address blob carries its process's identity (boot id, pid namespace, pid, start time).
// A peer with our boot id and pid namespace is on this kernel, so /proc/<pid>/stat says whether
// it still runs; the start time tells a reused pid apart and a zombie counts as exited. The
// check costs one small /proc read per such peer, at most every OFI_CHECK_PERIOD_S, and only
// while something with that peer is pending. Peers on other nodes are left to the core's
// timeout unless the provider reports an error.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/ofi/ofi_internal.h"

#define OFI_CHECK_PERIOD_S 0.5

// Reads the state and start time (fields 3 and 22) of /proc/<pid>/stat; -1 if it is gone.
static int ofi_proc_stat(const char *path, char *state, uint64_t *start) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    // The command name (field 2) may hold spaces and parentheses: start after the last ')'.
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2]) return -1;
    *state = p[2];
    p += 3;
    for (int field = 4; field <= 22; field++) {
        while (*p == ' ') p++;
        char *end = p;
        unsigned long long v = 0;
        while (*end >= '0' && *end <= '9') v = v * 10 + (unsigned long long)(*end++ - '0');
        if (end == p && *p != '-') return -1;
        while (*end && *end != ' ') end++;  // negative fields (priority) are skipped whole
        if (field == 22) *start = v;
        p = end;
    }
    return 0;
}

void l3d_ofi_ident_self(l3d_ofi_ident_t *id) {
    memset(id, 0, sizeof(*id));
    id->pid = (uint32_t)getpid();
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id->boot_id, sizeof(id->boot_id), f)) id->boot_id[0] = 0;
        fclose(f);
        id->boot_id[strcspn(id->boot_id, "\n")] = 0;
    }
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) == 0) id->pidns = (uint64_t)sb.st_ino;
    char state;
    if (ofi_proc_stat("/proc/self/stat", &state, &id->starttime) < 0) id->boot_id[0] = 0;
}

static void put64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

void l3d_ofi_ident_pack(const l3d_ofi_ident_t *id, unsigned char *b) {
    memset(b, 0, L3D_OFI_IDENT_LEN);
    memcpy(b, id->boot_id, strnlen(id->boot_id, 39));
    put64(b + 40, id->pidns);
    put64(b + 48, id->starttime);
    put64(b + 56, id->pid);
}

void l3d_ofi_ident_unpack(l3d_ofi_ident_t *id, const unsigned char *b) {
    memset(id, 0, sizeof(*id));
    memcpy(id->boot_id, b, 39);
    id->pidns = get64(b + 40);
    id->starttime = get64(b + 48);
    id->pid = (uint32_t)get64(b + 56);
}

int l3d_ofi_ident_exited(const l3d_ofi_ident_t *id) {
    char path[64], state = 0;
    uint64_t start = 0;
    snprintf(path, sizeof(path), "/proc/%u/stat", (unsigned)id->pid);
    if (ofi_proc_stat(path, &state, &start) < 0) return 1;
    return state == 'Z' || state == 'X' || start != id->starttime;
}

// Marks `peer` dead and fails everything pending with it. Receives are cancelled (the provider
// then hands their context back); sends usually cannot be, so each request is reported failed
// at once but stays allocated ("detached") until the provider releases it or fini closes the
// endpoint: a completion can never land in freed memory.
void l3d_ofi_fail_peer(l3d_ofi_t *o, int peer, const char *why) {
    if (peer < 0 || peer >= o->nranks || o->peer_dead[peer]) return;
    o->peer_dead[peer] = 1;
    snprintf(o->peer_why[peer], sizeof(o->peer_why[peer]), "%s", why);
    l3d_log(o->ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "ofi: rank %d: peer rank %d failed: %s",
            o->rank, peer, why);
    for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next) {
        if (r->done || r->peer != peer ||
            (r->kind != L3D_OFI_REQ_SEND && r->kind != L3D_OFI_REQ_RECV))
            continue;
        r->done = 1;
        r->detached = 1;
        r->st = L3D_ERR_PEER_FAILED;
        r->cancelled = 1;
        if (!o->ep_closed) (void)fi_cancel(&o->ep->fid, &r->fictx);
    }
}

int l3d_ofi_check_peers(l3d_ofi_t *o) {
    if (!o->connected || !o->self.boot_id[0]) return 0;
    double t = l3d_time_now();
    if (t < o->next_check) return 0;
    o->next_check = t + OFI_CHECK_PERIOD_S;
    for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next)
        if (!r->done && r->peer >= 0 &&
            (r->kind == L3D_OFI_REQ_SEND || r->kind == L3D_OFI_REQ_RECV))
            o->peers[r->peer].want_check = 1;
    int marked = 0;
    for (int p = 0; p < o->nranks; p++) {
        l3d_ofi_peer_t *pe = &o->peers[p];
        if (!pe->want_check) continue;
        pe->want_check = 0;
        if (p == o->rank || !pe->local || o->peer_dead[p]) continue;
        if (l3d_ofi_ident_exited(&pe->id)) {
            pe->exited = 1;
            marked++;
        }
    }
    return marked;
}

// A peer that sent and then exited (a finished rank, or one that sent its abort notice) has
// its last messages in our shm region or socket already; failing it before they are read
// would report "exited" for a receive whose data had arrived, or hide the notice that names
// the rank that really failed. The drain that runs between check and this call reads them.
void l3d_ofi_fail_exited(l3d_ofi_t *o) {
    for (int p = 0; p < o->nranks; p++) {
        l3d_ofi_peer_t *pe = &o->peers[p];
        if (!pe->exited) continue;
        pe->exited = 0;
        char why[L3D_OFI_WHY_LEN];
        snprintf(why, sizeof(why), "rank %d (pid %u on this node) exited", p,
                 (unsigned)pe->id.pid);
        l3d_ofi_fail_peer(o, p, why);
    }
}
