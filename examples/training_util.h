/* Small helpers shared by the training programs of the examples: a wall clock, whether stderr
   is a terminal (for progress bars drawn in place), the tape's error message, and the
   little-endian writers and readers of the run state they keep in a checkpoint's extra bytes.
   Include after autodiff.h. */
#ifndef TRAINING_UTIL_H
#define TRAINING_UTIL_H

#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define STDERR_IS_TERMINAL() isatty(2)
#else
#define STDERR_IS_TERMINAL() 0
#endif

/* Wall-clock seconds (processor time before C11). */
static double seconds(void)
{
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
#else
    return (double)clock() / CLOCKS_PER_SEC;
#endif
}

/* The tape's error message, or a placeholder when there is none. */
static const char *tape_error(const ad_tape *T)
{
    const char *e = ad_tape_error(T);
    return e ? e : "unknown error";
}

/* ---- little-endian fields: each writer returns the next free byte, each reader advances *p ---- */

static unsigned char *put_u64(unsigned char *p, uint64_t x)
{
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
    return p + 8;
}

static unsigned char *put_u32(unsigned char *p, uint32_t x)
{
    int i;
    for (i = 0; i < 4; i++) p[i] = (unsigned char)(x >> (8 * i));
    return p + 4;
}

static unsigned char *put_f64(unsigned char *p, double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return put_u64(p, u);
}

static uint64_t get_u64(const unsigned char **p)
{
    uint64_t x = 0;
    int i;
    for (i = 7; i >= 0; i--) x = x << 8 | (*p)[i];
    *p += 8;
    return x;
}

static uint32_t get_u32(const unsigned char **p)
{
    uint32_t x = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 | (uint32_t)(*p)[3] << 24;
    *p += 4;
    return x;
}

static double get_f64(const unsigned char **p)
{
    uint64_t u = get_u64(p);
    double x;
    memcpy(&x, &u, 8);
    return x;
}

#endif
