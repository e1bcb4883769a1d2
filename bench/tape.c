/* Tape overhead on scalars: the tutorial function
       f(a, b) = (a/b - a) * (b/a + a + b) * (a - b)
   recorded, differentiated with ad_backward and forgotten with ad_tape_reset, many times.
   Reports nanoseconds per recorded op (the entries counted by ad_tape_length) and per
   iteration; the time includes making the two leaves, the forward ops and the backward sweep.

   Build: cc -O2 -I. bench/tape.c -lm -lpthread
   Run:   bench/tape      (environment BENCH_CLOCK=cpu: see bench.h) */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

static ad_tensor *tutorial_f(ad_tape *T, ad_tensor *a, ad_tensor *b)
{
    ad_tensor *left = ad_sub(T, ad_div(T, a, b), a);
    ad_tensor *middle = ad_add(T, ad_add(T, ad_div(T, b, a), a), b);
    ad_tensor *right = ad_sub(T, a, b);
    return ad_mul(T, ad_mul(T, left, middle), right);
}

/* One iteration; returns the number of recorded entries, or 0 on error. */
static size_t step(ad_tape *T, ad_real av, ad_real bv, ad_real *out)
{
    ad_tensor *a = ad_var(T, av), *b = ad_var(T, bv), *y = tutorial_f(T, a, b);
    size_t ops = ad_tape_length(T);
    if (ad_backward(T, y) != 0) return 0;
    out[0] = ad_item(y);
    out[1] = ad_grad_item(a);
    out[2] = ad_grad_item(b);
    ad_tape_reset(T);
    return ops;
}

int main(void)
{
    enum { BATCHES = 7 };
    ad_tape *T = ad_tape_new();
    ad_real r[3] = {0, 0, 0};
    double times[BATCHES], t, sum = 0, ns_iter;
    size_t ops = 0;
    long iters = 1000, i;
    int b;
    if (!T) return 1;
    ad_set_threads(T, bench_threads());
    /* warm up the arena, then size a batch to about 0.1 s */
    for (i = 0; i < 1000; i++) ops = step(T, (ad_real)1.5, (ad_real)0.7, r);
    if (ops == 0) {
        fprintf(stderr, "tape: %s\n", ad_tape_error(T) ? ad_tape_error(T) : "no entries recorded");
        return 1;
    }
    for (;;) {
        t = bench_time();
        for (i = 0; i < iters; i++) step(T, (ad_real)1.5, (ad_real)0.7, r);
        t = bench_time() - t;
        if (t > 0.1 || iters >= 1L << 26) break;
        iters *= 2;
    }
    for (b = 0; b < BATCHES; b++) {
        t = bench_time();
        for (i = 0; i < iters; i++) {
            step(T, (ad_real)(1.5 + 1e-7 * (double)(i & 7)), (ad_real)0.7, r);
            sum += (double)r[1];
        }
        times[b] = bench_time() - t;
    }
    step(T, (ad_real)1.5, (ad_real)0.7, r);
    ns_iter = bench_median(times, BATCHES) / (double)iters * 1e9;
    printf("# f(1.5, 0.7) = %.6f  df/da = %.6f  df/db = %.6f  (%zu ops recorded per iteration)\n",
           (double)r[0], (double)r[1], (double)r[2], ops);
    printf("# %.1f ns per iteration, %.1f ns per op (%ld iterations per batch, checksum %.3g)\n",
           ns_iter, ns_iter / (double)ops, iters, sum);
    bench_result("tape.ops", (double)ops);
    bench_result("tape.ns_iter.ours", ns_iter);
    bench_result("tape.ns_op.ours", ns_iter / (double)ops);
    bench_result("tape.dfda.ours", (double)r[1]);
    bench_result("tape.dfdb.ours", (double)r[2]);
    ad_tape_free(T);
    return 0;
}
