// TensorBoard's event files, encoded here rather than through a protobuf library: an event
// file is a sequence of TFRecords (uint64 length, masked CRC-32C of the length, the data,
// masked CRC-32C of the data; all little-endian), each holding one serialized Event proto:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// Only these fields are written, so the encoder needs varints, fixed 32/64-bit fields and
// length-delimited fields whose lengths are known before they are written.
// defines: l3d_tb_file_name, l3d_tb_version_record, l3d_tb_scalar_record
#include <stdio.h>
#include <string.h>

#include "core/monitor/monitor_internal.h"

// Wire types.
enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2, PB_FIXED32 = 5 };

static size_t put_varint(unsigned char *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

static size_t put_key(unsigned char *p, unsigned field, unsigned wire) {
    return put_varint(p, (uint64_t)field << 3 | wire);
}

static size_t put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}

static size_t put_double(unsigned char *p, unsigned field, double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof(bits));
    size_t n = put_key(p, field, PB_FIXED64);
    return n + put_le(p + n, bits, 8);
}

static size_t put_bytes(unsigned char *p, unsigned field, const void *data, size_t len) {
    size_t n = put_key(p, field, PB_LEN);
    n += put_varint(p + n, len);
    memcpy(p + n, data, len);
    return n + len;
}

// Frames the `len` bytes of data already at buf + 12 as a TFRecord; returns its length.
static size_t frame(unsigned char *buf, size_t len) {
    put_le(buf, len, 8);
    put_le(buf + 8, l3d_crc32c_masked(buf, 8), 4);
    put_le(buf + 12 + len, l3d_crc32c_masked(buf + 12, len), 4);
    return 12 + len + 4;
}

void l3d_tb_file_name(char *buf, size_t cap, double wall_time, const char *host, int pid) {
    snprintf(buf, cap, "events.out.tfevents.%010lld.%s.%d.0", (long long)wall_time, host, pid);
}

size_t l3d_tb_version_record(unsigned char *buf, double wall_time) {
    static const char version[] = "brain.Event:2";
    unsigned char *ev = buf + 12;
    size_t n = put_double(ev, 1, wall_time);
    n += put_bytes(ev + n, 3, version, sizeof(version) - 1);
    return frame(buf, n);
}

size_t l3d_tb_scalar_record(unsigned char *buf, double wall_time, int64_t step,
                            const char *tag, float value) {
    size_t tag_len = strlen(tag);
    if (tag_len >= 128) return 0;  // bounds the record by L3D_TB_RECORD_MAX
    // Value: tag, then simple_value as a little-endian float32.
    unsigned char val[160];
    size_t nv = put_bytes(val, 1, tag, tag_len);
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    nv += put_key(val + nv, 2, PB_FIXED32);
    nv += put_le(val + nv, bits, 4);
    unsigned char sum[170];
    size_t ns = put_bytes(sum, 1, val, nv);
    unsigned char *ev = buf + 12;
    size_t n = put_double(ev, 1, wall_time);
    n += put_key(ev + n, 2, PB_VARINT);
    n += put_varint(ev + n, (uint64_t)step);  // int64: negative steps take ten bytes
    n += put_bytes(ev + n, 5, sum, ns);
    return frame(buf, n);
}
