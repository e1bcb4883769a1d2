/* Small helpers shared by the training programs of the examples: a wall clock, whether stderr
   is a terminal (for progress bars drawn in place), the tape's error message, the little-endian
   writers and readers of the run state they keep in a checkpoint's extra bytes, and the group
   of processes a run may be shared by. Include after autodiff.h. */
#ifndef TRAINING_UTIL_H
#define TRAINING_UTIL_H

#include <stdint.h>
#include <stdio.h>
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

/* ---- a run shared by several processes ----
   Each process trains on its share of every batch and measures its share of each estimate;
   examples/train_group_mpi.h makes such a group over MPI. A program that runs alone passes a
   NULL group. */
typedef struct train_group {
    int rank, ranks;
    int threads; /* the default of --threads for each process */
    void *ctx;   /* passed to every function below */
    /* This process's rows lo .. hi-1 of n; returns (hi - lo) / n. */
    double (*share)(void *ctx, int n, int *lo, int *hi);
    /* Every process says whether its setup step went well (ok 1) or why not; each that failed
       prints why. Returns 0 when all went well, else nonzero on every process. */
    int (*agree)(void *ctx, int ok, const char *why);
    /* Whether n bytes are the same on every process as on rank 0; each process whose bytes
       differ says so, naming them by what. Returns 0, or nonzero on every process. */
    int (*same)(void *ctx, const void *bytes, size_t n, const char *what);
    /* Once set up: every process takes rank 0's parameters and checks that its model,
       optimizer and run are rank 0's. Returns 0, or nonzero on every process. */
    int (*start)(void *ctx, ad_params *P, const ad_optim *opt);
    /* Around each ad_backward: afterwards the gradients are those of the whole batch. */
    void (*begin_gradients)(void *ctx);
    void (*end_gradients)(void *ctx);
    /* Sums n values over the processes, in place. */
    void (*sum)(void *ctx, double *v, int n);
    /* An error of this process alone, met while the others may wait for it: stops them all
       (does not return). */
    void (*fail)(void *ctx, const char *why);
    /* Whether every process holds the same parameters; prints each one's fingerprint (on rank
       0) when print is 1. Returns 0, or nonzero on every process (rank 0 says so). */
    int (*check_parameters)(void *ctx, ad_params *P, int print);
} train_group;

/* The outcome of a setup step. Alone: prints why when it failed. In a group: every process
   learns whether any failed (each that did says why). Returns 0 when all went well. */
static int setup_step(const train_group *g, int ok, const char *why)
{
    if (g) return g->agree(g->ctx, ok, why) ? -1 : 0;
    if (!ok) fprintf(stderr, "%s\n", why);
    return ok ? 0 : -1;
}

/* An error met while training. Alone: prints it, and the program ends (returns 1 for main). In
   a group: stops every process. */
static int training_error(const train_group *g, const char *why)
{
    if (g) g->fail(g->ctx, why);
    fprintf(stderr, "%s\n", why);
    return 1;
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
