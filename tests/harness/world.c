// See world.h. Threads for the in-process transport, fork()ed processes for the others.
#define _GNU_SOURCE
#include "tests/harness/world.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "platform/net.h"
#include "transports/transport.h"

int l3d_world_transports(const char **names, int max) {
    int n = 0;
    for (int i = 0; l3d_transport_backends[i] && n < max; i++) {
        // nccl takes a GPU per rank (test_transport_nccl, tools/gpu-check.sh): not these
        // worlds of host-memory ranks
        if (!strcmp(l3d_transport_backends[i]->name, "nccl")) continue;
        names[n++] = l3d_transport_backends[i]->name;
    }
    return n;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- threads -----------------------------------------------------------------------------
typedef struct thread_arg {
    l3d_comm_t *comm;
    l3d_world_fn fn;
    void *arg;
    int rc;
    char err[256];
} thread_arg_t;

static void *thread_main(void *p) {
    thread_arg_t *t = p;
    t->rc = t->fn(t->comm, t->arg, t->err, sizeof(t->err));
    return NULL;
}

static int run_threads(int nranks, l3d_world_fn fn, void *arg, int *rcs, char (*errs)[256]) {
    l3d_ctx_t *ctx = NULL;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) return -1;
    l3d_comm_t **comms = calloc((size_t)nranks, sizeof(*comms));
    thread_arg_t *ta = calloc((size_t)nranks, sizeof(*ta));
    pthread_t *th = calloc((size_t)nranks, sizeof(*th));
    int rc = -1;
    if (!comms || !ta || !th) goto out;
    l3d_status st = l3d_comm_create_local(ctx, nranks, comms);
    if (st != L3D_OK) {
        for (int i = 0; i < nranks; i++) {
            rcs[i] = 1;
            snprintf(errs[i], 256, "l3d_comm_create_local: %s", l3d_ctx_last_error(ctx));
        }
        goto out;
    }
    for (int i = 0; i < nranks; i++) {
        ta[i] = (thread_arg_t){.comm = comms[i], .fn = fn, .arg = arg};
        pthread_create(&th[i], NULL, thread_main, &ta[i]);
    }
    for (int i = 0; i < nranks; i++) {
        pthread_join(th[i], NULL);
        rcs[i] = ta[i].rc;
        snprintf(errs[i], 256, "%s", ta[i].err);
    }
    for (int i = 0; i < nranks; i++) l3d_comm_destroy(comms[i]);
    rc = 0;
out:
    free(th);
    free(ta);
    free(comms);
    l3d_ctx_destroy(ctx);
    return rc;
}

// ---- processes ---------------------------------------------------------------------------
// A free port on loopback, or -1.
static int free_port(void) {
    int port = -1;
    return l3d_net_free_port("127.0.0.1", &port) ? -1 : port;
}

static void child(const char *transport, int rank, int nranks, int port, const char *token,
                  l3d_world_fn fn, void *arg, int wfd) {
    char v[64];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", nranks);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof(v), "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("L3D_JOB_TOKEN", token, 1);
    char err[256] = "";
    int rc = 1;
    l3d_ctx_t *ctx = NULL;
    l3d_comm_t *comm = NULL;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) {
        snprintf(err, sizeof(err), "l3d_ctx_create failed");
    } else if (l3d_comm_create_env(ctx, transport, &comm) != L3D_OK) {
        snprintf(err, sizeof(err), "l3d_comm_create_env(%s): %s", transport,
                 l3d_ctx_last_error(ctx));
    } else {
        rc = fn(comm, arg, err, sizeof(err));
        l3d_comm_destroy(comm);
    }
    l3d_ctx_destroy(ctx);
    ssize_t w = write(wfd, err, sizeof(err));
    (void)w;
    _exit(rc & 0x7f);
}

static int run_processes(const char *transport, int nranks, l3d_world_fn fn, void *arg,
                         double timeout_s, int *rcs, char (*errs)[256]) {
    int port = free_port();
    if (port < 0) return -1;
    char token[64];
    snprintf(token, sizeof(token), "test-%ld-%d", (long)getpid(), port);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    int *fds = calloc((size_t)nranks, sizeof(int));
    if (!pids || !fds) {
        free(pids);
        free(fds);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nranks; r++) {
        int p[2];
        if (pipe(p)) return -1;
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            child(transport, r, nranks, port, token, fn, arg, p[1]);
        }
        close(p[1]);
        pids[r] = pid;
        fds[r] = p[0];
        rcs[r] = -1;
        errs[r][0] = 0;
    }
    int left = nranks;
    double deadline = now() + timeout_s;
    while (left > 0 && now() < deadline) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            usleep(2000);
            continue;
        }
        for (int r = 0; r < nranks; r++)
            if (pids[r] == pid) {
                rcs[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                ssize_t n = read(fds[r], errs[r], 256);
                if (n <= 0) snprintf(errs[r], 256, "%s", rcs[r] > 128 ? "killed by a signal" : "");
                errs[r][255] = 0;
                pids[r] = 0;
                left--;
            }
    }
    for (int r = 0; r < nranks; r++) {
        if (pids[r] > 0) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
            snprintf(errs[r], 256, "did not finish within %.0f s", timeout_s);
        }
        close(fds[r]);
    }
    free(pids);
    free(fds);
    return 0;
}

int l3d_world_run_all(const char *transport, int nranks, l3d_world_fn fn, void *arg,
                      double timeout_s, int *rcs, char (*errs)[256]) {
    if (!strcmp(transport, "local")) return run_threads(nranks, fn, arg, rcs, errs);
    return run_processes(transport, nranks, fn, arg, timeout_s, rcs, errs);
}

int l3d_world_run(const char *transport, int nranks, l3d_world_fn fn, void *arg,
                  double timeout_s, char *err, size_t errlen) {
    int *rcs = calloc((size_t)nranks, sizeof(int));
    char(*errs)[256] = calloc((size_t)nranks, sizeof(*errs));
    int rc = -1;
    if (rcs && errs && l3d_world_run_all(transport, nranks, fn, arg, timeout_s, rcs, errs) == 0) {
        rc = 0;
        for (int r = 0; r < nranks; r++)
            if (rcs[r] != 0) {
                snprintf(err, errlen, "%s rank %d of %d: exit %d: %s", transport, r, nranks,
                         rcs[r], errs[r]);
                rc = 1;
                break;
            }
    } else {
        snprintf(err, errlen, "%s: could not start %d ranks", transport, nranks);
    }
    free(errs);
    free(rcs);
    return rc;
}
