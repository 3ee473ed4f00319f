// l3d launch: starts N ranks of a program on this machine (the `deepspeed --num_gpus N` and
// `torchrun --nproc-per-node N` habit) with the torchrun variables and a fresh job token,
// prefixes every line they print with "[rank K] ", and stops them all when one fails.
//
// Each child gets its own process group, so a terminal's Ctrl-C reaches only the launcher,
// which forwards SIGINT/SIGTERM/SIGHUP to every group (a rank's own children included) and
// decides the exit status: 0 when every rank exited 0, 1 when one failed, 128+SIG when the
// launcher itself was signalled. A second signal kills the ranks at once.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "platform/platform.h"
#include "platform/net.h"
#include "transports/transport.h"

#define LAUNCH_GRACE_S 5.0       // SIGTERM, then SIGKILL after this long
#define LAUNCH_LINE_MAX 65536    // a longer line is cut into pieces of this size
#define LAUNCH_MAX_RANKS 4096

// The signal handler's state: the program's, not the library's (which has no globals).
static volatile sig_atomic_t launch_sig;     // the last SIGINT/SIGTERM/SIGHUP received
static volatile sig_atomic_t launch_nsig;    // how many of them
static int launch_wake = -1;                 // write end of the self-pipe that wakes poll()

static void on_signal(int sig) {
    int saved = errno;
    if (sig != SIGCHLD) {
        launch_sig = sig;
        launch_nsig++;
    }
    char c = 0;
    ssize_t w = write(launch_wake, &c, 1);
    (void)w;  // a full pipe already holds a wake-up
    errno = saved;
}

typedef struct stream {
    int fd;   // read end of the child's pipe, -1 at EOF
    int dst;  // 1 or 2
    size_t n;
    char buf[LAUNCH_LINE_MAX];
} stream_t;

typedef struct child {
    pid_t pid;
    int running;
    stream_t out[2];
} child_t;

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // stdout closed (l3d launch ... | head): drop the rest
        p += w;
        n -= (size_t)w;
    }
}

// One line, prefixed, in one write() so lines of different ranks never mix.
static void emit(int dst, int rank, const char *line, size_t n) {
    static char out[LAUNCH_LINE_MAX + 32];
    int k = snprintf(out, 32, "[rank %d] ", rank);
    memcpy(out + k, line, n);
    out[k + (int)n] = '\n';
    write_all(dst, out, (size_t)k + n + 1);
}

// Reads what is there and prints every complete line; at EOF the rest too. Returns what
// read() returned (-1 with EAGAIN: nothing there yet).
static ssize_t pump(stream_t *s, int rank) {
    ssize_t r;
    do {
        r = read(s->fd, s->buf + s->n, sizeof(s->buf) - s->n);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (r > 0) s->n += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->buf[i] == '\n') {
            emit(s->dst, rank, s->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && s->n == sizeof(s->buf)) {  // a line longer than the buffer: cut it
        emit(s->dst, rank, s->buf, s->n);
        start = s->n;
    }
    memmove(s->buf, s->buf + start, s->n - start);
    s->n -= start;
    if (r <= 0) {  // EOF or error: the last, unterminated line
        if (s->n) emit(s->dst, rank, s->buf, s->n);
        s->n = 0;
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    return r;
}

static const char *sig_name(int sig) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {{SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"},
                 {SIGILL, "SIGILL"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},
                 {SIGFPE, "SIGFPE"}, {SIGKILL, "SIGKILL"}, {SIGSEGV, "SIGSEGV"},
                 {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
                 {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (names[i].sig == sig) return names[i].name;
    return "?";
}

// A free port on loopback, or -1.
static int free_port(void) {
    int port = -1;
    return l3d_net_free_port("127.0.0.1", &port) ? -1 : port;
}

static int make_token(char *tok, size_t len) {
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, raw, sizeof(raw));
    close(fd);
    if (n != (ssize_t)sizeof(raw) || len < 2 * sizeof(raw) + 1) return -1;
    for (size_t i = 0; i < sizeof(raw); i++) snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

// The network transports of this build, for --transport ("local" is in-process only).
static int transport_ok(const char *name, char *list, size_t len) {
    int ok = 0;
    size_t o = 0;
    list[0] = 0;
    for (int i = 0; l3d_transport_backends[i]; i++) {
        const char *t = l3d_transport_backends[i]->name;
        if (!strcmp(t, "local")) continue;
        if (!strcmp(t, name)) ok = 1;
        o += (size_t)snprintf(list + o, len - o, "%s%s", o ? ", " : "", t);
        if (o >= len) break;
    }
    return ok;
}

static void set_int_env(const char *name, long v) {
    char s[32];
    snprintf(s, sizeof(s), "%ld", v);
    setenv(name, s, 1);
}

// In the child, after fork: becomes rank `rank` and execs the program. Never returns.
static void exec_rank(int rank, int n, int port, const char *token, const char *transport,
                      int bind, int out_fd, int err_fd, char **prog) {
    setpgid(0, 0);
    // --bind core: this rank's block of the cores (none when there are more ranks than cores).
    if (bind) (void)l3d_cpu_bind_block(rank, n);
    // The launcher's handlers were inherited with the signals blocked; a signal forwarded
    // before exec is still pending and now takes its default action.
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) signal(sigs[i], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    set_int_env("RANK", rank);
    set_int_env("WORLD_SIZE", n);
    set_int_env("LOCAL_RANK", rank);
    set_int_env("LOCAL_WORLD_SIZE", n);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_int_env("MASTER_PORT", port);
    setenv("L3D_JOB_TOKEN", token, 1);
    if (transport) setenv("L3D_TRANSPORT", transport, 1);
    // These would override what the launcher sets (see docs/launch.md).
    const char *drop[] = {"L3D_RANK", "L3D_WORLD_SIZE", "L3D_LOCAL_RANK",
                          "L3D_LOCAL_WORLD_SIZE", "L3D_MASTER_ADDR", "L3D_MASTER_PORT"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) unsetenv(drop[i]);
    execvp(prog[0], prog);
    dprintf(2, "l3d launch: cannot run '%s': %s\n", prog[0], strerror(errno));
    _exit(127);
}

static void signal_all(child_t *ch, int n, int sig) {
    for (int k = 0; k < n; k++)
        if (ch[k].running) {
            kill(-ch[k].pid, sig);  // the group: the rank's own children too
            // A stopped rank (SIGSTOP, a debugger) would hold SIGTERM until the SIGKILL 5 s
            // later: let it run so that it terminates now.
            if (sig == SIGTERM) kill(-ch[k].pid, SIGCONT);
        }
}

static int run(int n, int port, const char *token, const char *transport, int bind,
               char **prog) {
    child_t *ch = calloc((size_t)n, sizeof(*ch));
    struct pollfd *pf = calloc(2 * (size_t)n + 1, sizeof(*pf));
    int wake[2];
    if (!ch || !pf || pipe(wake)) {
        fprintf(stderr, "l3d launch: out of memory or file descriptors\n");
        free(ch);
        free(pf);
        return L3D_EXIT_FAIL;
    }
    fcntl(wake[0], F_SETFL, O_NONBLOCK);
    fcntl(wake[1], F_SETFL, O_NONBLOCK);
    fcntl(wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(wake[1], F_SETFD, FD_CLOEXEC);
    launch_wake = wake[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int running = 0, code = L3D_EXIT_OK, stopping = 0, handled_nsig = 0;
    double kill_at = 0;
    fflush(NULL);
    for (int k = 0; k < n && !launch_nsig; k++) {
        int po[2], pe[2];
        if (pipe(po) || pipe(pe)) {
            fprintf(stderr, "l3d launch: pipe: %s\n", strerror(errno));
            code = L3D_EXIT_FAIL;
            break;
        }
        sigset_t block, old;
        sigemptyset(&block);
        for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) sigaddset(&block, sigs[i]);
        sigprocmask(SIG_BLOCK, &block, &old);
        pid_t pid = fork();
        if (pid == 0) {
            close(po[0]);
            close(pe[0]);
            exec_rank(k, n, port, token, transport, bind, po[1], pe[1], prog);
        }
        if (pid > 0) setpgid(pid, pid);  // also here, so a signal forwarded at once finds it
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(po[1]);
        close(pe[1]);
        if (pid < 0) {
            fprintf(stderr, "l3d launch: fork: %s\n", strerror(errno));
            close(po[0]);
            close(pe[0]);
            code = L3D_EXIT_FAIL;
            break;
        }
        ch[k].pid = pid;
        ch[k].running = 1;
        running++;
        int fds[2] = {po[0], pe[0]};
        for (int j = 0; j < 2; j++) {
            fcntl(fds[j], F_SETFL, O_NONBLOCK);
            fcntl(fds[j], F_SETFD, FD_CLOEXEC);
            ch[k].out[j].fd = fds[j];
            ch[k].out[j].dst = 1 + j;
        }
    }
    if (code != L3D_EXIT_OK && running) {  // could not start them all: stop the others
        stopping = 1;
        signal_all(ch, n, SIGTERM);
        kill_at = l3d_time_now() + LAUNCH_GRACE_S;
    }

    while (running > 0) {
        int np = 0;
        pf[np++] = (struct pollfd){.fd = wake[0], .events = POLLIN};
        for (int k = 0; k < n; k++)
            for (int j = 0; j < 2; j++)
                if (ch[k].out[j].fd >= 0)
                    pf[np++] = (struct pollfd){.fd = ch[k].out[j].fd, .events = POLLIN};
        int tmo = 1000;  // a safety net: SIGCHLD normally wakes us
        if (kill_at) {
            double left = kill_at - l3d_time_now();
            tmo = left <= 0 ? 0 : (int)(left * 1000) + 1 < tmo ? (int)(left * 1000) + 1 : tmo;
        }
        poll(pf, (nfds_t)np, tmo);
        char drain[64];
        while (read(wake[0], drain, sizeof(drain)) > 0) {
        }
        for (int k = 0; k < n; k++)
            for (int j = 0; j < 2; j++)
                if (ch[k].out[j].fd >= 0) {
                    for (int i = 1; i < np; i++)
                        if (pf[i].fd == ch[k].out[j].fd && pf[i].revents) pump(&ch[k].out[j], k);
                }
        int nsig = launch_nsig;
        if (nsig > handled_nsig) {
            int sig = launch_sig;
            if (handled_nsig == 0) {
                fprintf(stderr, "l3d launch: got %s, passing it to the ranks\n", sig_name(sig));
                signal_all(ch, n, sig);
                code = 128 + sig;
                if (!kill_at) kill_at = l3d_time_now() + LAUNCH_GRACE_S;
            } else {
                fprintf(stderr, "l3d launch: got %s again, killing the ranks\n", sig_name(sig));
                signal_all(ch, n, SIGKILL);
                kill_at = 0;
            }
            stopping = 1;
            handled_nsig = nsig;
        }
        for (int k = 0; k < n; k++) {
            int st;
            if (!ch[k].running || waitpid(ch[k].pid, &st, WNOHANG) != ch[k].pid) continue;
            ch[k].running = 0;
            running--;
            int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (ok || stopping) continue;
            if (WIFEXITED(st))
                fprintf(stderr, "l3d launch: rank %d exited with status %d\n", k,
                        WEXITSTATUS(st));
            else
                fprintf(stderr, "l3d launch: rank %d was killed by signal %d (%s)\n", k,
                        WTERMSIG(st), sig_name(WTERMSIG(st)));
            if (running)
                fprintf(stderr, "l3d launch: stopping the other %d rank%s\n", running,
                        running == 1 ? "" : "s");
            code = L3D_EXIT_FAIL;
            stopping = 1;
            signal_all(ch, n, SIGTERM);
            kill_at = l3d_time_now() + LAUNCH_GRACE_S;
        }
        if (kill_at && running && l3d_time_now() >= kill_at) {
            for (int k = 0; k < n; k++)
                if (ch[k].running)
                    fprintf(stderr, "l3d launch: rank %d did not stop within %.0f s; killing it\n",
                            k, LAUNCH_GRACE_S);
            signal_all(ch, n, SIGKILL);
            kill_at = 0;
        }
    }
    // Every rank has exited: print what is still in the pipes, without waiting for whatever
    // grandchildren may still hold them open.
    for (int k = 0; k < n; k++)
        for (int j = 0; j < 2; j++) {
            stream_t *s = &ch[k].out[j];
            while (s->fd >= 0)
                if (pump(s, k) < 0) {  // nothing more right now
                    if (s->n) emit(s->dst, k, s->buf, s->n);
                    close(s->fd);
                    s->fd = -1;
                }
        }
    close(wake[0]);
    close(wake[1]);
    launch_wake = -1;
    free(pf);
    free(ch);
    return code;
}

int l3d_cmd_launch(int argc, char **argv) {
    const char *n_s = NULL, *transport = NULL, *port_s = NULL, *help = NULL, *bind_s = NULL;
    const l3d_cli_flag_t flags[] = {
        {"-n", "N", "ranks to start on this machine (deepspeed --num_gpus N)", &n_s, 0},
        {"--transport", "NAME", "network transport for the ranks: sets L3D_TRANSPORT", &transport,
         0},
        {"--port", "P", "store port on 127.0.0.1 (default: a free port)", &port_s, 0},
        {"--bind", "core|none", "core (default): each rank runs on its own block of cores/N "
         "cores, as mpirun's --bind-to core; none: wherever the OS puts it", &bind_s, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    // The program starts after "--", or at the first word that is neither a flag nor a value.
    int end = argc, prog = argc;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            end = i;
            prog = i + 1;
            break;
        }
        if (a[0] != '-') {
            end = prog = i;
            break;
        }
        for (int k = 0; k < nflags; k++)
            if (!flags[k].is_switch && !strcmp(a, flags[k].name)) i++;
    }
    // Other launchers' spellings of -n get pointed at it.
    static const char *habits[] = {"--num_gpus", "--num-gpus", "--nproc_per_node",
                                   "--nproc-per-node", "--nproc", "--np", "-np"};
    for (int i = 2; i < end; i++)
        for (size_t k = 0; k < sizeof(habits) / sizeof(habits[0]); k++)
            if (!strncmp(argv[i], habits[k], strlen(habits[k])) &&
                (argv[i][strlen(habits[k])] == 0 || argv[i][strlen(habits[k])] == '=')) {
                fprintf(stderr, "l3d launch: unknown flag '%s' (did you mean '-n'?)\n",
                        habits[k]);
                return L3D_EXIT_USAGE;
            }
    if (l3d_cli_parse("launch", end, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "launch", "-n N [FLAGS] -- PROGRAM [ARGS...]", flags, nflags);
        printf("\nEach rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
               "MASTER_PORT and L3D_JOB_TOKEN; its output is prefixed with [rank K].\n"
               "See docs/launch.md for several machines (mpirun, srun, torchrun).\n");
        return L3D_EXIT_OK;
    }
    long long n = 0, port = 0;
    if (!n_s) {
        fprintf(stderr, "l3d launch: -n N is required (how many ranks to start)\n");
        return L3D_EXIT_USAGE;
    }
    if (l3d_cli_int("launch", "-n", n_s, 1, LAUNCH_MAX_RANKS, &n)) return L3D_EXIT_USAGE;
    if (port_s && l3d_cli_int("launch", "--port", port_s, 1, 65535, &port)) return L3D_EXIT_USAGE;
    int bind = 1;
    if (bind_s && (strcmp(bind_s, "core") && strcmp(bind_s, "none"))) {
        fprintf(stderr, "l3d launch: --bind: '%s' is not core or none\n", bind_s);
        return L3D_EXIT_USAGE;
    }
    if (bind_s && !strcmp(bind_s, "none")) bind = 0;
    char list[256];
    if (transport && !strcmp(transport, "local")) {
        // Built, but it cannot join processes: say what it is for instead of "not built".
        fprintf(stderr, "l3d launch: --transport local connects the ranks of one process (as "
                "threads), not separate processes; to run a layout over it, run l3d train "
                "without the launcher (e.g. l3d train --dp 2 --tp 2)\n");
        return L3D_EXIT_USAGE;
    }
    if (transport && !transport_ok(transport, list, sizeof(list))) {
        if (list[0])
            fprintf(stderr, "l3d launch: --transport: '%s' is not built into this l3d (built: "
                    "%s)\n", transport, list);
        else
            fprintf(stderr, "l3d launch: --transport: '%s' is not built into this l3d (built: "
                    "none; install libucx-dev or libfabric-dev and rebuild)\n", transport);
        return L3D_EXIT_USAGE;
    }
    if (prog >= argc) {
        fprintf(stderr, "l3d launch: no program given (l3d launch -n N -- PROGRAM ARGS...)\n");
        return L3D_EXIT_USAGE;
    }
    if (!port_s && (port = free_port()) < 0) {
        fprintf(stderr, "l3d launch: cannot find a free port on 127.0.0.1: %s\n",
                strerror(errno));
        return L3D_EXIT_FAIL;
    }
    char token[64];
    if (make_token(token, sizeof(token))) {
        fprintf(stderr, "l3d launch: cannot read /dev/urandom for the job token\n");
        return L3D_EXIT_FAIL;
    }
    return run((int)n, (int)port, token, transport, bind, argv + prog);
}
