// libFuzzer target: the rendezvous store (core/comm/bootstrap_store.c) over loopback TCP, as a
// process of another job, a broken client or a port scanner would reach it. One store serves
// every input; each input is one connection's bytes. Bit 0 of the first byte: the harness
// first says a valid HELLO (the job's token and size, a rank not used yet) and reads its OK,
// so that the rest reaches PUT and GET; otherwise the rest is sent from the connection's first
// byte. The harness then closes its sending side and reads until the store closes or says
// ERROR. Checked:
//   - the store closes the connection within 5 s of the peer's end (no hang), and every reply
//     it sends has the header's magic and version, is OK, VALUE or ERROR with a length within
//     the type's limit, an ERROR with code 1-4 (bootstrap_wire.h); a reply cut by the store's
//     close counts as the end (a reset may discard what was in flight);
//   - every 16 inputs a well-behaved client (HELLO, PUT, GET) gets its value back: the store
//     still serves, its table intact;
//   - ASan and UBSan on the store's thread throughout.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/comm/bootstrap_wire.h"
#include "core/l3d_core.h"
#include "platform/net.h"
#include "platform/platform.h"

static void quiet(l3d_log_level level, uint32_t subsys, const char *msg, void *user) {
    if (getenv("FUZZ_STORE_LOG")) fprintf(stderr, "%.3f store: %s\n", l3d_time_now(), msg);
}

// Harness state, not library state: one store for every input, the next unused rank.
static l3d_ctx_t *ctx;
static l3d_bootstrap_store_t *store;
static int port;
#define WORLD (1u << 23)  // ranks enough that no run of the fuzzer uses them all up
static uint32_t next_rank = WORLD - 1;  // the harness's ranks count down from the top
#define TOKEN "fuzz-job"

static void fail(const char *why) {
    fprintf(stderr, "fuzz_store: %s\n", why);
    __builtin_trap();
}

static void setup(void) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    p.log_fn = quiet;
    if (l3d_ctx_create(&p, &ctx) != L3D_OK) fail("context");
    l3d_launch_env_t env = {.rank = 0, .size = (int)WORLD, .master_port = 0};
    snprintf(env.master_addr, sizeof(env.master_addr), "127.0.0.1");
    snprintf(env.job_token, sizeof(env.job_token), TOKEN);
    if (l3d_bootstrap_store_start(ctx, &env, 30.0, &store, &port) != L3D_OK)
        fail(l3d_ctx_last_error(ctx));
}

// A connection to the store (platform/net.h: non-blocking, EINTR-proof, deadline-bounded).
static int dial(void) {
    int fd, rc = l3d_net_connect("127.0.0.1", port, l3d_time_now() + 5.0, &fd, NULL);
    if (rc) {
        fprintf(stderr, "fuzz_store: connect: %s\n", strerror(-rc));
        fail("the store refused a connection");
    }
    // Closed with a reset, not into TIME_WAIT: thousands of connections a second would use up
    // the loopback's ephemeral ports within a minute.
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    return fd;
}

// Sends what the store reads; 0 where it has closed (it may drop a bad peer mid-send).
static int say(int fd, const uint8_t *p, size_t n) {
    int rc = l3d_net_send_all(fd, p, n, l3d_time_now() + 5.0);
    if (rc == -ETIMEDOUT) fail("the store read nothing for 5 s");
    return rc == 0;
}

static size_t message(uint8_t *out, unsigned type, const void *payload, size_t len) {
    bs_put_hdr(out, type, len);
    if (len) memcpy(out + BS_HDR, payload, len);
    return BS_HDR + len;
}

static size_t hello(uint8_t *out, uint32_t rank) {
    uint8_t p[10 + sizeof(TOKEN)];
    bs_put_u32(p, rank);
    bs_put_u32(p + 4, WORLD);
    bs_put_u16(p + 8, sizeof(TOKEN) - 1);
    memcpy(p + 10, TOKEN, sizeof(TOKEN) - 1);
    return message(out, BS_T_HELLO, p, 10 + sizeof(TOKEN) - 1);
}

// Reads one reply within 5 s: its type, or 0 where the store closed the connection first (a
// reset too: dropping a peer with bytes unread, the kernel may discard what was in flight).
static unsigned reply(int fd, uint8_t *payload, size_t cap, size_t *len_p) {
    uint8_t h[BS_HDR];
    double deadline = l3d_time_now() + 5.0;
    int rc = l3d_net_recv_all(fd, h, BS_HDR, deadline);
    if (rc == -ETIMEDOUT) fail("the store neither answered nor closed in 5 s");
    if (rc) return 0;
    unsigned type = bs_get_u16(h + 6);
    size_t len = bs_get_u32(h + 8);
    if (bs_get_u32(h) != BS_MAGIC || bs_get_u16(h + 4) != BS_VERSION)
        fail("a reply with a bad magic or version");
    if ((type != BS_T_OK && type != BS_T_VALUE && type != BS_T_ERROR) ||
        len > bs_type_cap(type) || len > cap)
        fail("a reply of an unknown type or over its limit");
    rc = l3d_net_recv_all(fd, payload, len, deadline);
    if (rc == -ETIMEDOUT) fail("the store neither finished a reply nor closed in 5 s");
    if (rc) return 0;
    if (type == BS_T_ERROR) {
        unsigned code = len >= 2 ? bs_get_u16(payload) : 0;
        if (code < BS_E_TOKEN || code > BS_E_PROTOCOL) fail("an ERROR without a known code");
    }
    *len_p = len;
    return type;
}

// A connection that has said a valid HELLO, as the rank *rank_p counts down from (a rank the
// fuzzer's bytes took is refused, code 3: the next one).
static int join(uint32_t *rank_p) {
    static uint8_t got[BS_TEXT_MAX + 2];
    uint8_t h[BS_HDR + 10 + sizeof(TOKEN)];
    for (int tries = 0; tries < 64; tries++) {
        int fd = dial();
        size_t len, n = hello(h, (*rank_p)--);
        unsigned t = say(fd, h, n) ? reply(fd, got, sizeof(got), &len) : 0;
        if (t == BS_T_OK) return fd;
        l3d_net_close(fd);
        if (t != BS_T_ERROR || bs_get_u16(got) != BS_E_RANK) break;
    }
    fail("a valid HELLO was not answered OK");
    return -1;
}

// A well-behaved rank: HELLO, PUT a key of its own, GET it back.
static void check_serves(void) {
    static uint8_t buf[BS_HDR + BS_VAL_MAX], got[BS_VAL_MAX];
    char key[32], val[48];
    int fd = join(&next_rank);
    uint32_t rank = next_rank + 1;
    int kl = snprintf(key, sizeof(key), "check-%u", rank);
    int vl = snprintf(val, sizeof(val), "value of rank %u", rank);
    uint8_t kh[2];
    bs_put_u16(kh, (unsigned)kl);
    size_t n, len;
    uint8_t kv[2 + 32 + 48];
    memcpy(kv, kh, 2);
    memcpy(kv + 2, key, (size_t)kl);
    memcpy(kv + 2 + kl, val, (size_t)vl);
    n = message(buf, BS_T_PUT, kv, 2 + (size_t)kl + (size_t)vl);
    if (!say(fd, buf, n) || reply(fd, got, sizeof(got), &len) != BS_T_OK)
        fail("a valid PUT was not answered OK");
    n = message(buf, BS_T_GET, kv, 2 + (size_t)kl);
    if (!say(fd, buf, n) || reply(fd, got, sizeof(got), &len) != BS_T_VALUE ||
        len != (size_t)vl || memcmp(got, val, len))
        fail("a GET did not give back the value just PUT");
    n = message(buf, BS_T_BYE, NULL, 0);
    say(fd, buf, n);
    l3d_net_close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t got[BS_VAL_MAX];
    static unsigned inputs;
    if (!store) setup();
    if (size < 1) return 0;
    int fd = data[0] & 1 ? join(&next_rank) : dial();
    size_t len;
    say(fd, data + 1, size - 1);
    shutdown(fd, SHUT_WR);
    // (after an ERROR the store closes, or, refusing a HELLO, waits for the peer to: a client
    // that has read why hangs up)
    for (unsigned t = 1; t && t != BS_T_ERROR;) t = reply(fd, got, sizeof(got), &len);
    l3d_net_close(fd);
    if (++inputs % 16 == 0) check_serves();
    return 0;
}
