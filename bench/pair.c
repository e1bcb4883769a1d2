/* The driver of bench/pair.sh: times two builds of bench/pair_work.c (pair_old against the
   older autodiff.h, pair_new against the newer) in one process, alternately, so that both meet
   the same moments of a shared, noisy machine.

   Usage: pair WORK [STEPS [ROUNDS]]   (WORK: tape, cnn, conv, mlp, gemm, gpt, clip or norm;
                                        STEPS per round, default chosen per work for about 20-80 ms;
                                        ROUNDS default 30)
   Each round times STEPS steps of each build, the order flipped every round, in CPU time of the
   thread, or in wall-clock time when PAIR_THREADS asks for more than one thread (the CPU time of
   the calling thread would miss the workers' share, and its waits for them). Prints the best
   round of each side per step and the median over rounds of the ratio old time / new time
   (above 1: the new build is faster), and whether the two builds' results were equal (a change
   that alters the last bits shows as "differ"). Exits non-zero when the work is unknown or
   failed. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double pair_old(const char *work, long steps);
double pair_new(const char *work, long steps);

/* bench/bench.h has a thread clock and a comparison too, but calls the library, which this
   driver does not link but through the two builds' static copies. */

static double pair_time(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int pair_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long pair_default_steps(const char *work)
{
    if (strcmp(work, "tape") == 0) return 500000;
    if (strcmp(work, "gemm") == 0) return 4;
    if (strcmp(work, "gpt") == 0) return 2;
    return 20;
}

int main(int argc, char **argv)
{
    enum { MAX_ROUNDS = 1000 };
    static double ratios[MAX_ROUNDS];
    double (*side[2])(const char *, long) = {pair_old, pair_new};
    double best[2] = {INFINITY, INFINITY}, check[2];
    const char *work = argc > 1 ? argv[1] : "";
    long steps = argc > 2 ? atol(argv[2]) : pair_default_steps(work);
    int rounds = argc > 3 ? atoi(argv[3]) : 30, r, k;
    const char *threads = getenv("PAIR_THREADS");
    clockid_t clock = threads && atoi(threads) > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
    if (steps < 1) steps = pair_default_steps(work);
    if (rounds < 1) rounds = 1;
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    /* warm up, then the same steps from both builds' fresh state: their results compared */
    for (k = 0; k < 2; k++) check[k] = side[k](work, 1);
    if (isnan(check[0]) || isnan(check[1])) {
        fprintf(stderr, "pair: work '%s' unknown or failed (tape, cnn, conv, mlp, gemm, gpt, clip, norm)\n", work);
        return 1;
    }
    for (k = 0; k < 2; k++) check[k] = side[k](work, steps);
    for (r = 0; r < rounds; r++) {
        double t[2];
        for (k = 0; k < 2; k++) {
            int s = r % 2 ? 1 - k : k; /* the old build first in even rounds */
            double start = pair_time(clock);
            if (isnan(side[s](work, steps))) {
                fprintf(stderr, "pair: work '%s' failed in round %d\n", work, r);
                return 1;
            }
            t[s] = (pair_time(clock) - start) / (double)steps;
        }
        for (k = 0; k < 2; k++)
            if (t[k] < best[k]) best[k] = t[k];
        ratios[r] = t[0] / t[1];
    }
    qsort(ratios, (size_t)rounds, sizeof ratios[0], pair_cmp);
    printf("%s: %ld steps a round, %d rounds; per step, best round: old %.4g us, new %.4g us; "
           "old/new median %.3f (quartiles %.3f-%.3f); results %s\n",
           work, steps, rounds, best[0] * 1e6, best[1] * 1e6, ratios[rounds / 2], ratios[rounds / 4],
           ratios[(3 * rounds) / 4],
           check[0] == check[1] ? "equal" : "differ");
    return 0;
}
