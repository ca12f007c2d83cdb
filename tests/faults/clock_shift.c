/* An LD_PRELOAD library that moves one process's wall clock (CLOCK_REALTIME, gettimeofday, time)
 * by the seconds written in the file named by STRATA_CLOCK_SHIFT_FILE, read again at most every
 * 50 ms, so a test can make the clock jump while the process runs, as an NTP step does. The
 * monotonic clocks are left alone, as a wall-clock step leaves them. (libfaketime 0.9.10 with
 * DONT_FAKE_MONOTONIC makes clock_nanosleep on CLOCK_MONOTONIC fail with EINVAL, which breaks
 * Python's time.sleep.) Built by tests/faults/clock.py with the system's C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static long long shift_ns;
static long long next_read_ns;

static long long mono_ns(void) {
    struct timespec ts;
    real_clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long current_shift(void) {
    if (!real_clock_gettime)
        real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    long long now = mono_ns();
    if (now >= next_read_ns) {
        next_read_ns = now + 50000000LL;
        const char *path = getenv("STRATA_CLOCK_SHIFT_FILE");
        double seconds = 0;
        FILE *f = path ? fopen(path, "r") : NULL;
        if (f) {
            if (fscanf(f, "%lf", &seconds) != 1)
                seconds = 0;
            fclose(f);
        }
        __atomic_store_n(&shift_ns, (long long)(seconds * 1e9), __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&shift_ns, __ATOMIC_RELAXED);
}

static void add_ns(struct timespec *ts, long long ns) {
    long long total = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + ns;
    ts->tv_sec = total / 1000000000LL;
    ts->tv_nsec = total % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long long shift = current_shift();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        add_ns(ts, shift);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
