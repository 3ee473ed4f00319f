// Tests for the monitors' formats: CRC-32C against its standard check value, TensorBoard
// records byte for byte against an encoding made with Python's struct and crcmod (not with
// this code), DeepSpeed's CSV rows as Python's csv.writer and repr() write them, and the
// whole-piece writes that keep a failed metrics file from ending in a torn record.
// tests/cli_monitor.sh reads whole runs' files with protoc and crcmod.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "core/monitor/monitor_internal.h"
#include "platform/platform.h"

Test(monitor, crc32c_check_value) {
    // The CRC catalogue's check value of CRC-32C over "123456789", and TFRecord's mask of it.
    cr_assert_eq(l3d_crc32c(0, "123456789", 9), 0xe3069283u);
    cr_assert_eq(l3d_crc32c_masked("123456789", 9), 0xc78ab0e5u);
    // Continuing a CRC equals one pass.
    cr_assert_eq(l3d_crc32c(l3d_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
}

Test(monitor, tfrecord_bytes) {
    // Event{wall_time 1.5, file_version "brain.Event:2"} and
    // Event{wall_time 1.5, step 200, summary{value{tag "a/b", simple_value 0.25}}}, framed.
    static const unsigned char version[] = {
        0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e,
        0x2e, 0x45, 0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32, 0x2a, 0x28, 0x64, 0x6c};
    static const unsigned char scalar[] = {
        0x1a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x9b, 0xd8, 0x2d, 0x09, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0xc8, 0x01, 0x2a, 0x0c, 0x0a, 0x0a,
        0x0a, 0x03, 0x61, 0x2f, 0x62, 0x15, 0x00, 0x00, 0x80, 0x3e, 0x7f, 0xc2, 0x33, 0x9e};
    unsigned char buf[L3D_TB_RECORD_MAX];
    cr_assert_eq(l3d_tb_version_record(buf, 1.5), sizeof(version));
    cr_assert_eq(memcmp(buf, version, sizeof(version)), 0);
    cr_assert_eq(l3d_tb_scalar_record(buf, 1.5, 200, "a/b", 0.25f), sizeof(scalar));
    cr_assert_eq(memcmp(buf, scalar, sizeof(scalar)), 0);
    // The longest tag fits the buffer; a longer one is refused rather than overrun.
    char tag[200];
    memset(tag, 'x', sizeof(tag));
    tag[127] = '\0';
    size_t n = l3d_tb_scalar_record(buf, 1.5, -1, tag, 1.0f);
    cr_assert(n > 0 && n <= L3D_TB_RECORD_MAX, "%zu", n);
    tag[127] = 'x';
    tag[128] = '\0';
    cr_assert_eq(l3d_tb_scalar_record(buf, 1.5, 1, tag, 1.0f), 0);
}

Test(monitor, tb_file_name) {
    char name[128];
    l3d_tb_file_name(name, sizeof(name), 1700000000.75, "node1", 42);
    cr_assert_str_eq(name, "events.out.tfevents.1700000000.node1.42.0");
}

Test(monitor, csv_rows_as_python_writes_them) {
    char buf[128];
    cr_assert_eq(l3d_csv_file_name(buf, sizeof(buf), "out/j", "Train/Samples/train loss"), 0);
    cr_assert_str_eq(buf, "out/j/Train_Samples_train_loss.csv");
    cr_assert(l3d_csv_header(buf, sizeof(buf), "Train/Samples/lr") > 0);
    cr_assert_str_eq(buf, "step,lr\r\n");
    // repr() of each double, from Python 3.
    static const struct {
        double v;
        const char *text;
    } rows[] = {
        {0.0003000000142492354, "0.0003000000142492354"}, {5.532810883596539, "5.532810883596539"},
        {1e8, "100000000.0"}, {2.0, "2.0"}, {1e-05, "1e-05"}, {1e16, "1e+16"},
        {123456.789, "123456.789"}, {0.1, "0.1"}, {1e22, "1e+22"}, {21125340.0, "21125340.0"},
        {1.5e-7, "1.5e-07"}, {0.0001, "0.0001"}, {-3.25, "-3.25"}};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), "16,%s\r\n", rows[i].text);
        cr_assert(l3d_csv_row(buf, sizeof(buf), 16, rows[i].v) > 0);
        cr_assert_str_eq(buf, want);
    }
}

Test(monitor, failed_write_is_reported) {
    // A full device: the write fails with ENOSPC (reported, never a short success).
    int fd = l3d_outfile_open("/dev/full", 0);
    cr_assert(fd >= 0, "%s", strerror(-fd));
    cr_assert_eq(l3d_outfile_append(fd, "x\n", 2), -ENOSPC);
    cr_assert_eq(l3d_outfile_close(fd), 0);
}
