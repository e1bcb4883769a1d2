/* Elementwise functions: exp, log, sigmoid, tanh and sin of a [256, 1024] float tensor (values in
   [0.5, 1.5)), and softmax along its rows, forward alone, and forward, sum and backward pass
   together (the softmax's sum is weighted, as its plain sum has a zero gradient), on a tape
   that is reset between iterations. Reports microseconds per iteration, the median of several
   batches.

   Build: cc -O2 -I. bench/unary.c -lm -lpthread
   Run:   bench/unary      (environment BENCH_CLOCK=cpu: see bench.h) */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

enum { ROWS = 256, COLS = 1024, BATCHES = 7, ITERS = 32 };

static ad_tensor *apply(ad_tape *T, int which, ad_tensor *x)
{
    switch (which) {
    case 0: return ad_exp(T, x);
    case 1: return ad_log(T, x);
    case 2: return ad_sigmoid(T, x);
    case 3: return ad_tanh(T, x);
    case 4: return ad_sin(T, x);
    default: return ad_softmax(T, x, 1);
    }
}

/* One iteration: the function of a fresh leaf over x, and with backward also the sum and the
   backward pass. Returns a value of the result, or NAN on error. */
static double iteration(ad_tape *T, int which, float *x, int backward)
{
    int shape[2] = {ROWS, COLS};
    ad_tensor *a, *y;
    double v;
    ad_tape_reset(T);
    a = ad_tensor_view(T, 2, shape, x, NULL, 1);
    y = apply(T, which, a);
    if (backward && (!y || ad_backward(T, ad_sum(T, which == 5 ? ad_mul(T, y, a) : y)) != 0)) return NAN;
    v = y ? (double)y->data[ROWS * COLS / 2] : NAN;
    return v;
}

int main(void)
{
    static const char *names[6] = {"exp", "log", "sigmoid", "tanh", "sin", "softmax"};
    ad_tape *T = ad_tape_new();
    float *x = (float *)malloc(sizeof(float) * ROWS * COLS);
    int which, backward, i, b;
    if (!T || !x) return 1;
    ad_set_threads(T, bench_threads());
    for (i = 0; i < ROWS * COLS; i++) x[i] = 0.5f + (float)(i % 1000) * 0.001f;
    for (which = 0; which < 6; which++)
        for (backward = 0; backward <= 1; backward++) {
            double times[BATCHES], check = 0, us;
            char key[64];
            for (i = 0; i < ITERS; i++) check += iteration(T, which, x, backward);
            for (b = 0; b < BATCHES; b++) {
                double t = bench_time();
                for (i = 0; i < ITERS; i++) check += iteration(T, which, x, backward);
                times[b] = bench_time() - t;
            }
            if (check != check) {
                fprintf(stderr, "unary: %s: %s\n", names[which], ad_tape_error(T) ? ad_tape_error(T) : "NaN");
                return 1;
            }
            us = bench_median(times, BATCHES) / ITERS * 1e6;
            printf("# %-8s %s: %8.1f us per iteration\n", names[which], backward ? "forward+backward" : "forward",
                   us);
            snprintf(key, sizeof key, "unary.%s.%s.us.ours", names[which], backward ? "train" : "fwd");
            bench_result(key, us);
        }
    ad_tape_free(T);
    free(x);
    return 0;
}
