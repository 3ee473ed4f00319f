// Folder core/monitor (docs/architecture.md): DeepSpeed's monitors, TensorBoard event files,
// CSV, CRC-32C. May use core/train (a monitor opens from a trainer) and every folder below
// it; not core/plan.
//
// The monitors' file formats, apart from the monitor object (core/monitor/monitor.c) so each can be
// tested on its own: CRC-32C (core/monitor/crc32c.c), TensorBoard's TFRecord-framed Event protos
// (core/monitor/monitor_tb.c) and DeepSpeed's CSV rows (core/monitor/monitor_csv.c).
// defines: l3d_crc32c, l3d_crc32c_masked, l3d_tb_*, l3d_csv_*
#ifndef L3D_MONITOR_INTERNAL_H
#define L3D_MONITOR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

// CRC-32C of data[0..len) continuing `crc` (0 to start).
uint32_t l3d_crc32c(uint32_t crc, const void *data, size_t len);
// TFRecord's masked CRC-32C: rotate right by 15, add 0xa282ead8.
uint32_t l3d_crc32c_masked(const void *data, size_t len);

// ---- TensorBoard (core/monitor/monitor_tb.c) ---------------------------------------------------
// The largest record l3d_tb_* encode: framing (16 bytes) and an Event with one scalar whose
// tag is under 128 bytes.
#define L3D_TB_RECORD_MAX 256
// "events.out.tfevents.<unix time, 10 digits>.<host>.<pid>.0", SummaryWriter's file name.
void l3d_tb_file_name(char *buf, size_t cap, double wall_time, const char *host, int pid);
// The file's first record, Event{wall_time, file_version "brain.Event:2"}, framed; returns
// its length.
size_t l3d_tb_version_record(unsigned char *buf, double wall_time);
// Event{wall_time, step, summary{value{tag, simple_value}}}, framed; returns its length, or 0
// when the tag is 128 bytes or more.
size_t l3d_tb_scalar_record(unsigned char *buf, double wall_time, int64_t step,
                            const char *tag, float value);

// ---- CSV (core/monitor/monitor_csv.c)
// ------------------------------------------------------------
// DeepSpeed's csv_monitor file for `tag` in `dir`: dir/<tag with '/' and ' ' as '_'>.csv.
// Returns 0, or -1 when it does not fit.
int l3d_csv_file_name(char *buf, size_t cap, const char *dir, const char *tag);
// DeepSpeed's header row "step,<tag after its last '/'>\r\n" (Python's csv.writer ends rows
// with \r\n); returns its length, or 0 when it does not fit.
size_t l3d_csv_header(char *buf, size_t cap, const char *tag);
// The row "<step>,<value>\r\n", the value as Python's repr(float) writes it (shortest text
// that reads back to the same double); returns its length.
size_t l3d_csv_row(char *buf, size_t cap, int64_t step, double value);

#endif
