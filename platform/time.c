// Monotonic time: immune to wall-clock steps (NTP, the user), so intervals are always >= 0.
#include <time.h>

#include "platform/platform.h"

double l3d_time_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
