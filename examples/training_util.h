/* Small helpers shared by the training programs of the examples: a wall clock, whether stderr
   is a terminal (for progress bars drawn in place), and the tape's error message.
   Include after autodiff.h. */
#ifndef TRAINING_UTIL_H
#define TRAINING_UTIL_H

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

#endif
