/* Shared helpers of the benchmark programs in bench/: a monotonic clock, medians, the result
   lines that bench/run.sh collects, and an MNIST reader (IDX files, raw or gzip-compressed; the
   compressed ones are inflated by the gzip program through popen).

   A program defines _POSIX_C_SOURCE (for popen and clock_gettime) before its first include.
   Every program prints its measurements as lines "@ key value" on stdout; anything else it
   prints is commentary for a human. Include after autodiff.h (with its implementation). */
#ifndef BENCH_BENCH_H
#define BENCH_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__) || defined(__clang__)
#define BENCH_FN static __attribute__((unused))
#else
#define BENCH_FN static
#endif

BENCH_FN double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread: excludes time spent descheduled on a shared machine. */
BENCH_FN double bench_thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The clock the programs time their work with: wall time, or with the environment variable
   BENCH_CLOCK=cpu the CPU time of the calling thread, which leaves out time spent descheduled
   on a busy machine (meaningful for single-thread runs only). */
BENCH_FN double bench_time(void)
{
    static int use_cpu = -1;
    if (use_cpu < 0) {
        const char *s = getenv("BENCH_CLOCK");
        use_cpu = s && strcmp(s, "cpu") == 0;
    }
    return use_cpu ? bench_thread_cpu() : bench_now();
}

BENCH_FN int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n values (sorts v). */
BENCH_FN double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

BENCH_FN void bench_result(const char *key, double value)
{
    printf("@ %s %.6g\n", key, value);
    fflush(stdout);
}

/* The thread count of a run: the environment variable AUTODIFF_THREADS (which autodiff.h also
   reads), default 1. Programs pass it to ad_set_threads and to the peer library. */
BENCH_FN int bench_threads(void)
{
    const char *s = getenv("AUTODIFF_THREADS");
    int t = s ? atoi(s) : 1;
    return t > 0 ? t : 1;
}

/* The precision of a run's products: with the environment variable BENCH_BF16=1 T's products
   are in bfloat16 (ad_set_matmul_precision) and the run's result keys start with "bf16."; the
   prefix is returned. */
BENCH_FN const char *bench_precision(ad_tape *T)
{
    const char *s = getenv("BENCH_BF16");
    if (!s || atoi(s) != 1) return "";
    if (ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) < 0) {
        fprintf(stderr, "bench: %s\n", ad_tape_error(T));
        exit(1);
    }
    return "bf16.";
}

/* ---- MNIST ---------------------------------------------------------------------------------- */

/* Inflates path with `gzip -dc` into a malloc'd buffer; returns NULL on any failure. */
BENCH_FN unsigned char *bench_gunzip(const char *path, size_t *len)
{
    char cmd[4200];
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    FILE *p;
    if (strlen(path) > 4000 || strchr(path, '\'')) return NULL;
    snprintf(cmd, sizeof cmd, "gzip -dc '%s' 2>/dev/null", path);
    p = popen(cmd, "r");
    if (!p) return NULL;
    for (;;) {
        size_t got;
        if (cap - n < 65536) {
            unsigned char *grown = (unsigned char *)realloc(buf, cap ? cap * 2 : 1 << 20);
            if (!grown) { free(buf); pclose(p); return NULL; }
            buf = grown;
            cap = cap ? cap * 2 : 1 << 20;
        }
        got = fread(buf + n, 1, cap - n, p);
        n += got;
        if (got == 0) break;
    }
    if (pclose(p) != 0) { free(buf); return NULL; }
    *len = n;
    return buf;
}

BENCH_FN unsigned bench_be32(const unsigned char *p)
{
    return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | (unsigned)p[3];
}

typedef struct bench_data {
    float *x;      /* n rows of dim values */
    int *y;        /* n labels 0..9 */
    int n, dim;
    int real;      /* 1: MNIST read from MNIST_DIR, 0: synthetic */
} bench_data;

/* Reads dir/name raw, or dir/name.gz through gzip. Returns NULL when neither can be read. */
BENCH_FN unsigned char *bench_read_idx(const char *dir, const char *name, size_t *len)
{
    char path[4096];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (f) {
        unsigned char *buf = NULL;
        long n;
        if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = (unsigned char *)malloc((size_t)n)) != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n) {
            fclose(f);
            *len = (size_t)n;
            return buf;
        }
        free(buf);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/%s.gz", dir, name);
    return bench_gunzip(path, len);
}

/* Loads the MNIST training set from MNIST_DIR (raw or .gz IDX files; pixels scaled to [0, 1]).
   Returns 0, or -1 when MNIST_DIR is unset, the files are missing or malformed. */
BENCH_FN int bench_mnist_load(bench_data *d)
{
    const char *dir = getenv("MNIST_DIR");
    unsigned char *img, *lab;
    size_t ni, nl, i;
    unsigned count;
    if (!dir || !*dir) return -1;
    img = bench_read_idx(dir, "train-images-idx3-ubyte", &ni);
    if (!img) return -1;
    lab = bench_read_idx(dir, "train-labels-idx1-ubyte", &nl);
    if (!lab) { free(img); return -1; }
    count = ni >= 16 ? bench_be32(img + 4) : 0;
    if (ni < 16 || nl < 8 || bench_be32(img) != 0x803 || bench_be32(lab) != 0x801 ||
        bench_be32(img + 8) != 28 || bench_be32(img + 12) != 28 || bench_be32(lab + 4) != count ||
        count == 0 || count > 1000000 || ni - 16 < (size_t)count * 784 || nl - 8 < count) {
        fprintf(stderr, "bench: %s/train-*-idx*-ubyte: not MNIST IDX files\n", dir);
        free(img);
        free(lab);
        return -1;
    }
    d->n = (int)count;
    d->dim = 784;
    d->x = (float *)malloc((size_t)count * 784 * sizeof(float));
    d->y = (int *)malloc((size_t)count * sizeof(int));
    if (!d->x || !d->y) { free(img); free(lab); free(d->x); free(d->y); return -1; }
    for (i = 0; i < (size_t)count * 784; i++) d->x[i] = (float)img[16 + i] * (1.0f / 255.0f);
    for (i = 0; i < count; i++) {
        d->y[i] = lab[8 + i];
        if (d->y[i] > 9) d->y[i] = 0;
    }
    d->real = 1;
    free(img);
    free(lab);
    return 0;
}

/* 60000 rows of 784 uniform values in [0, 1) with uniform labels: the size of MNIST's training
   set, for machines without the files. */
BENCH_FN int bench_synthetic(bench_data *d, uint64_t seed)
{
    ad_rng rng;
    size_t i;
    d->n = 60000;
    d->dim = 784;
    d->real = 0;
    d->x = (float *)malloc((size_t)d->n * d->dim * sizeof(float));
    d->y = (int *)malloc((size_t)d->n * sizeof(int));
    if (!d->x || !d->y) return -1;
    ad_rng_seed(&rng, seed);
    for (i = 0; i < (size_t)d->n * d->dim; i++) d->x[i] = (float)ad_rng_uniform(&rng);
    for (i = 0; i < (size_t)d->n; i++) d->y[i] = (int)ad_rng_below(&rng, 10);
    return 0;
}

/* The samples perm[start .. start + count) as a batch on T: their labels into yb, and their
   images, picked out of the whole set by one ad_embedding (as PyTorch's x[idx]), returned as
   [count, dim]; NULL with T's error set on failure. */
BENCH_FN ad_tensor *bench_batch(ad_tape *T, const bench_data *d, const int *perm, int start, int count, int *yb)
{
    int shape[2], i;
    for (i = 0; i < count; i++) yb[i] = d->y[perm[start + i]];
    shape[0] = d->n;
    shape[1] = d->dim;
    return ad_embedding(T, ad_tensor_view(T, 2, shape, d->x, NULL, 0), perm + start, count);
}

/* A new random order of the n samples (Fisher-Yates), for an epoch. */
BENCH_FN void bench_shuffle(int *perm, int n, ad_rng *rng)
{
    int i;
    for (i = n - 1; i > 0; i--) {
        int j = (int)ad_rng_below(rng, (uint64_t)i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}

#endif
