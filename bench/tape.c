/* Tape overhead on scalars: the tutorial function
       f(a, b) = (a/b - a) * (b/a + a + b) * (a - b)
   recorded, differentiated and forgotten with ad_tape_reset, many times, twice over: on the lean
   tape for single numbers (ad_num, ad_num_backward) and on one-element tensors (ad_var,
   ad_backward). Reports nanoseconds per recorded op (the eight of f) and per iteration; the time
   includes making the two leaves, the forward ops, the backward sweep and the reset. The two
   kinds run in alternating batches, so their ratio comes from one stretch of time.

   Build: cc -O2 -I. bench/tape.c -lm -lpthread
   Run:   bench/tape      (environment BENCH_CLOCK=cpu: see bench.h) */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

enum { OPS = 8 }; /* div, sub, div, add, add, sub, mul, mul */

static ad_num tutorial_f_nums(ad_tape *T, ad_num a, ad_num b)
{
    ad_num left = ad_num_sub(T, ad_num_div(T, a, b), a);
    ad_num middle = ad_num_add(T, ad_num_add(T, ad_num_div(T, b, a), a), b);
    ad_num right = ad_num_sub(T, a, b);
    return ad_num_mul(T, ad_num_mul(T, left, middle), right);
}

static ad_tensor *tutorial_f_tensors(ad_tape *T, ad_tensor *a, ad_tensor *b)
{
    ad_tensor *left = ad_sub(T, ad_div(T, a, b), a);
    ad_tensor *middle = ad_add(T, ad_add(T, ad_div(T, b, a), a), b);
    ad_tensor *right = ad_sub(T, a, b);
    return ad_mul(T, ad_mul(T, left, middle), right);
}

/* One iteration on numbers; out gets f, df/da, df/db. Returns the ops recorded, 0 on error. */
static size_t step_nums(ad_tape *T, ad_real av, ad_real bv, ad_real *out)
{
    ad_num a = ad_num_var(T, av), b = ad_num_var(T, bv), y = tutorial_f_nums(T, a, b);
    size_t ops;
    if (ad_num_backward(T, y) != 0) return 0;
    ops = ad_num_count(T) - 2; /* the leaves are not ops */
    out[0] = y.value;
    out[1] = ad_num_grad(T, a);
    out[2] = ad_num_grad(T, b);
    ad_tape_reset(T);
    return ops;
}

/* The same on one-element tensors. */
static size_t step_tensors(ad_tape *T, ad_real av, ad_real bv, ad_real *out)
{
    ad_tensor *a = ad_var(T, av), *b = ad_var(T, bv), *y = tutorial_f_tensors(T, a, b);
    size_t ops = ad_tape_length(T);
    if (ad_backward(T, y) != 0) return 0;
    out[0] = ad_item(y);
    out[1] = ad_grad_item(a);
    out[2] = ad_grad_item(b);
    ad_tape_reset(T);
    return ops;
}

typedef size_t (*step_fn)(ad_tape *T, ad_real av, ad_real bv, ad_real *out);

/* Seconds for iters iterations of step; the checksum keeps the results alive. */
static double batch(step_fn step, ad_tape *T, long iters, double *checksum)
{
    ad_real r[3] = {0, 0, 0};
    double t = bench_time();
    long i;
    for (i = 0; i < iters; i++) {
        step(T, (ad_real)(1.5 + 1e-7 * (double)(i & 7)), (ad_real)0.7, r);
        *checksum += (double)r[1];
    }
    return bench_time() - t;
}

/* Iterations of step that take about 0.1 s. */
static long batch_size(step_fn step, ad_tape *T, double *checksum)
{
    long iters = 1000;
    while (batch(step, T, iters, checksum) < 0.1 && iters < 1L << 26) iters *= 2;
    return iters;
}

int main(void)
{
    enum { BATCHES = 7 };
    ad_tape *T = ad_tape_new();
    ad_real r[3] = {0, 0, 0}, rt[3] = {0, 0, 0};
    double t_nums[BATCHES], t_tensors[BATCHES], sum = 0, ns_nums, ns_tensors;
    long iters_nums, iters_tensors, i;
    int b;
    if (!T) return 1;
    ad_set_threads(T, bench_threads());
    for (i = 0; i < 1000; i++) step_nums(T, (ad_real)1.5, (ad_real)0.7, r); /* warm up the entries */
    for (i = 0; i < 1000; i++) step_tensors(T, (ad_real)1.5, (ad_real)0.7, r); /* and the arena */
    if (step_nums(T, (ad_real)1.5, (ad_real)0.7, r) != OPS || step_tensors(T, (ad_real)1.5, (ad_real)0.7, rt) != OPS) {
        fprintf(stderr, "tape: %s\n", ad_tape_error(T) ? ad_tape_error(T) : "not the 8 ops of f recorded");
        return 1;
    }
    iters_nums = batch_size(step_nums, T, &sum);
    iters_tensors = batch_size(step_tensors, T, &sum);
    for (b = 0; b < BATCHES; b++) {
        t_nums[b] = batch(step_nums, T, iters_nums, &sum);
        t_tensors[b] = batch(step_tensors, T, iters_tensors, &sum);
    }
    ns_nums = bench_median(t_nums, BATCHES) / (double)iters_nums * 1e9;
    ns_tensors = bench_median(t_tensors, BATCHES) / (double)iters_tensors * 1e9;
    printf("# f(1.5, 0.7) = %.6f  df/da = %.6f  df/db = %.6f  (%d ops per iteration; tensors: %.6f %.6f %.6f)\n",
           (double)r[0], (double)r[1], (double)r[2], OPS, (double)rt[0], (double)rt[1], (double)rt[2]);
    printf("# numbers: %.1f ns per iteration, %.2f ns per op; one-element tensors: %.1f ns, %.2f ns per op"
           " (checksum %.3g)\n",
           ns_nums, ns_nums / OPS, ns_tensors, ns_tensors / OPS, sum);
    bench_result("tape.ops", (double)OPS);
    bench_result("tape.ns_iter.ours", ns_nums);
    bench_result("tape.ns_op.ours", ns_nums / OPS);
    bench_result("tape.tensors.ns_iter.ours", ns_tensors);
    bench_result("tape.tensors.ns_op.ours", ns_tensors / OPS);
    bench_result("tape.dfda.ours", (double)r[1]);
    bench_result("tape.dfdb.ours", (double)r[2]);
    ad_tape_free(T);
    return 0;
}
