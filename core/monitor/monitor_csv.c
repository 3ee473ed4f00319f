// DeepSpeed's csv_monitor files: one file per tag, named after the tag, a header row
// "step,<last part of the tag>" and rows "step,value", as Python's csv.writer writes them
// (rows end in \r\n; a float is written as repr() writes it), so scripts written for
// DeepSpeed's files read these unchanged.
// defines: l3d_csv_file_name, l3d_csv_header, l3d_csv_row
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/monitor/monitor_internal.h"

int l3d_csv_file_name(char *buf, size_t cap, const char *dir, const char *tag) {
    int w = snprintf(buf, cap, "%s/%s.csv", dir, tag);
    if (w < 0 || (size_t)w >= cap) return -1;
    for (char *p = buf + strlen(dir) + 1; *p; p++)
        if (*p == '/' || *p == ' ') *p = '_';
    return 0;
}

size_t l3d_csv_header(char *buf, size_t cap, const char *tag) {
    const char *last = strrchr(tag, '/');
    int w = snprintf(buf, cap, "step,%s\r\n", last ? last + 1 : tag);
    return w < 0 || (size_t)w >= cap ? 0 : (size_t)w;
}

// repr(float): the shortest of %.1g .. %.17g that reads back to the same double, written
// without an exponent for decimal exponents -4..15 as Python does (%g switches to one as soon
// as the exponent reaches the precision: 1e+08 where repr says 100000000.0), and with ".0"
// added to a whole number (repr(2.0) is "2.0", %g gives "2").
static void py_repr(char *buf, size_t cap, double v) {
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v || v != v) break;
    }
    char *e = strchr(buf, 'e');
    if (e) {
        int exp = atoi(e + 1);
        int decimals = prec - 1 - exp > 0 ? prec - 1 - exp : 0;
        if (exp >= -4 && exp < 16) snprintf(buf, cap, "%.*f", decimals, v);
    }
    if (!strpbrk(buf, ".eni")) {  // not 1.5, 1e+20, inf, nan
        size_t n = strlen(buf);
        if (n + 2 < cap) memcpy(buf + n, ".0", 3);
    }
}

size_t l3d_csv_row(char *buf, size_t cap, int64_t step, double value) {
    char v[40];
    py_repr(v, sizeof(v), value);
    int w = snprintf(buf, cap, "%lld,%s\r\n", (long long)step, v);
    return w < 0 || (size_t)w >= cap ? 0 : (size_t)w;
}
