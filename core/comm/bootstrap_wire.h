// Bootstrap internals shared by the client (bootstrap.c), the store (bootstrap_store.c) and
// the launch environment (bootstrap_env.c): the wire format and the store's start/stop.
// defines: BS_* limits and message types, bs_put_hdr and the little-endian codecs,
//          l3d_bootstrap_store_t, l3d_bootstrap_store_start, l3d_bootstrap_store_stop
//
// ---- store protocol, version 1 ------------------------------------------------------------
// Every message is a 12-byte header and a payload; all integers little-endian:
//   u32 magic 0x4244334c (the bytes "L3DB")  u16 version (1)  u16 type  u32 payload length
// Client -> store                                  Store -> client
//   1 HELLO  u32 rank, u32 size, u16 n, token[n]   2 OK     (empty): HELLO or PUT accepted
//   3 PUT    u16 n, key[n], value (the rest)       5 VALUE  value: answers a GET
//   4 GET    u16 n, key[n]                         7 ERROR  u16 code, text (why, then closes)
//   6 BYE    (empty): this rank is done
// Limits, checked on the header before anything is allocated: token <= 127 bytes, key 1..255
// bytes without NUL, value <= 1 MiB, and each type's payload at most what those allow
// (HELLO 137, PUT 2+255+1 MiB, GET 257, BYE 0; OK 0, VALUE 1 MiB, ERROR 2+1024).
// HELLO must come first and must carry the store's job token and world size, and a rank not
// yet seen; otherwise the store answers ERROR (code 1 token, 2 size, 3 rank) and closes. A GET
// for a key not yet PUT is held until the PUT arrives (one pending GET per connection); a PUT
// of an existing key replaces it. Any malformed message (bad magic, version or type, a length
// over its limit, an inconsistent payload, EOF inside a message, a message before HELLO) makes
// the store log a warning naming the peer, send ERROR code 4 if it can, and drop that
// connection only. A connection must complete HELLO within 2 s (or the timeout, if shorter);
// at most 64 connections without a valid HELLO are kept (a new one evicts the oldest), and
// warnings about them are rate-limited (bootstrap_store.c).
#ifndef L3D_BOOTSTRAP_WIRE_H
#define L3D_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "core/comm/bootstrap.h"

#define BS_MAGIC 0x4244334cu
#define BS_VERSION 1
#define BS_HDR 12
#define BS_TOKEN_MAX 127
#define BS_KEY_MAX 255
#define BS_VAL_MAX ((size_t)1 << 20)
#define BS_TEXT_MAX 1024
#define BS_TAG "bootstrap"  // the store's and the client's own memory
#define BS_OUT_TAG "comm"   // memory handed to the caller (get, allgather)

enum {
    BS_T_HELLO = 1,
    BS_T_OK = 2,
    BS_T_PUT = 3,
    BS_T_GET = 4,
    BS_T_VALUE = 5,
    BS_T_BYE = 6,
    BS_T_ERROR = 7,
};
enum { BS_E_TOKEN = 1, BS_E_SIZE = 2, BS_E_RANK = 3, BS_E_PROTOCOL = 4 };

static inline const char *bs_type_name(unsigned t) {
    static const char *names[] = {"?", "hello", "ok", "put", "get", "value", "bye", "error"};
    return t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

// The largest payload a message of type t may carry.
static inline size_t bs_type_cap(unsigned t) {
    switch (t) {
    case BS_T_HELLO: return 10 + BS_TOKEN_MAX;
    case BS_T_PUT: return 2 + BS_KEY_MAX + BS_VAL_MAX;
    case BS_T_GET: return 2 + BS_KEY_MAX;
    case BS_T_VALUE: return BS_VAL_MAX;
    case BS_T_ERROR: return 2 + BS_TEXT_MAX;
    default: return 0;  // OK, BYE
    }
}

static inline void bs_put_u16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void bs_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline unsigned bs_get_u16(const uint8_t *p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}
static inline uint32_t bs_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void bs_put_hdr(uint8_t *h, unsigned type, size_t len) {
    bs_put_u32(h, BS_MAGIC);
    bs_put_u16(h + 4, BS_VERSION);
    bs_put_u16(h + 6, type);
    bs_put_u32(h + 8, (uint32_t)len);
}

// ---- the store (bootstrap_store.c), run by rank 0's client -------------------------------
typedef struct l3d_bootstrap_store l3d_bootstrap_store_t;

// Listens on env's master_addr:master_port and starts the store thread; *port_p is the port
// it bound (the one asked for, or the kernel's pick for port 0).
l3d_status l3d_bootstrap_store_start(l3d_ctx_t *ctx, const l3d_launch_env_t *env,
                                     double timeout_s, l3d_bootstrap_store_t **s_p, int *port_p);
// Stops serving at `deadline` or when every rank has left, whichever is first, and frees.
void l3d_bootstrap_store_stop(l3d_bootstrap_store_t *s, double deadline);

#endif
