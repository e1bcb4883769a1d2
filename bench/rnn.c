/* Recurrent cells: the forward and backward of `steps` unrolled steps of ad_lstm_cell (or
   ad_gru_cell) against the same cell written with existing ops (two products, adds, slices,
   sigmoid, tanh, products and sums), in the same run; or (lstm-layer, gru-layer) the layer
   ad_lstm or ad_gru over the `steps` steps against `steps` unrolled cells. The weights and biases are
   leaves with gradient buffers of their own (as parameters are), h and c start as zeros, x is
   random, and the loss is the sum of the last h. Each repetition records the steps, runs
   ad_backward and resets the tape; with BENCH_NO_GRAD=1 it runs the steps in no-grad mode
   (evaluation: nothing recorded, no backward) and resets.

   Build: cc -O2 -I. bench/rnn.c -lm -lpthread
   Run:   bench/rnn [lstm|gru|lstm-layer|gru-layer] [N] [I] [H] [steps]   (defaults: lstm 12 128 128 1)
   Reports microseconds per step (forward and backward), the median of 7 rounds, for the fused
   cell (or the layer) and the composition (or the unrolled cells), their ratio, and the bytes
   of the tape's arena one repetition of each used.
   AUTODIFF_THREADS sets the thread count (default 1); BENCH_CLOCK=cpu times in CPU time of the
   calling thread (see bench.h). */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

static ad_tensor *block(ad_tape *T, ad_tensor *a, int k, int H) { return ad_slice(T, a, 1, k * H, (k + 1) * H); }

static ad_tensor *comp_lstm(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *c, ad_tensor *const *w,
                            ad_tensor **c_out)
{
    int H = h->shape[1];
    ad_tensor *pre = ad_add(T, ad_add(T, ad_matmul_t(T, x, w[0], 0, 1), w[2]),
                            ad_add(T, ad_matmul_t(T, h, w[1], 0, 1), w[3]));
    ad_tensor *i = ad_sigmoid(T, block(T, pre, 0, H)), *f = ad_sigmoid(T, block(T, pre, 1, H));
    ad_tensor *g = ad_tanh(T, block(T, pre, 2, H)), *o = ad_sigmoid(T, block(T, pre, 3, H));
    *c_out = ad_add(T, ad_mul(T, f, c), ad_mul(T, i, g));
    return ad_mul(T, o, ad_tanh(T, *c_out));
}

static ad_tensor *comp_gru(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *const *w)
{
    int H = h->shape[1];
    ad_tensor *gi = ad_add(T, ad_matmul_t(T, x, w[0], 0, 1), w[2]);
    ad_tensor *gh = ad_add(T, ad_matmul_t(T, h, w[1], 0, 1), w[3]);
    ad_tensor *r = ad_sigmoid(T, ad_add(T, block(T, gi, 0, H), block(T, gh, 0, H)));
    ad_tensor *z = ad_sigmoid(T, ad_add(T, block(T, gi, 1, H), block(T, gh, 1, H)));
    ad_tensor *n = ad_tanh(T, ad_add(T, block(T, gi, 2, H), ad_mul(T, r, block(T, gh, 2, H))));
    return ad_add(T, ad_mul(T, ad_rsub_scalar(T, 1, z), n), ad_mul(T, z, h));
}

enum { LSTM, GRU, LSTM_LAYER, GRU_LAYER };

/* One repetition: `steps` steps, the backward sweep (unless no_grad), a reset; *arena gets the
   bytes of the arena in use before the reset. Returns 0 on success. */
static int run(ad_tape *T, int kind, int fused, int no_grad, int N, int I, int H, int steps, ad_real *const *wdata,
               ad_real *const *wgrad, const ad_real *xdata, size_t *arena)
{
    int gru = kind == GRU || kind == GRU_LAYER, layer = kind >= LSTM_LAYER, G = (gru ? 3 : 4) * H, shape[3], s, rc = 0;
    ad_tensor *w[4], *h, *c, *x;
    ad_set_grad_enabled(T, !no_grad);
    shape[0] = G;
    shape[1] = I;
    w[0] = ad_tensor_view(T, 2, shape, wdata[0], wgrad[0], 1);
    shape[1] = H;
    w[1] = ad_tensor_view(T, 2, shape, wdata[1], wgrad[1], 1);
    w[2] = ad_tensor_view(T, 1, &G, wdata[2], wgrad[2], 1);
    w[3] = ad_tensor_view(T, 1, &G, wdata[3], wgrad[3], 1);
    shape[0] = N;
    h = ad_zeros(T, 2, shape);
    c = ad_zeros(T, 2, shape);
    shape[1] = I;
    if (layer && fused) {
        shape[0] = steps;
        shape[1] = N;
        shape[2] = I;
        x = ad_tensor_view(T, 3, shape, (ad_real *)xdata, NULL, 0);
        if (gru) ad_gru(T, x, h, w[0], w[1], w[2], w[3], &h);
        else ad_lstm(T, x, h, c, w[0], w[1], w[2], w[3], &h, NULL);
        steps = 0;
    }
    for (s = 0; s < steps; s++) {
        x = ad_tensor_view(T, 2, shape, (ad_real *)xdata + (size_t)s * N * I, NULL, 0);
        if (gru) h = fused || layer ? ad_gru_cell(T, x, h, w[0], w[1], w[2], w[3]) : comp_gru(T, x, h, w);
        else if (fused || layer) h = ad_lstm_cell(T, x, h, c, w[0], w[1], w[2], w[3], &c);
        else h = comp_lstm(T, x, h, c, w, &c);
    }
    if (!no_grad) rc = ad_backward(T, ad_sum(T, h));
    else if (!h) rc = -1;
    if (rc != 0) fprintf(stderr, "rnn: %s\n", ad_tape_error(T));
    *arena = ad_tape_bytes_used(T);
    ad_tape_reset(T);
    return rc;
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"lstm", "gru", "lstm-layer", "gru-layer"};
    int kind = LSTM;
    int N = argc > 2 ? atoi(argv[2]) : 12, I = argc > 3 ? atoi(argv[3]) : 128, H = argc > 4 ? atoi(argv[4]) : 128;
    int steps = argc > 5 ? atoi(argv[5]) : 1, G, round, fused, rep, reps, i, no_grad = getenv("BENCH_NO_GRAD") && atoi(getenv("BENCH_NO_GRAD")) == 1;
    ad_real *wdata[4], *wgrad[4], *xdata;
    size_t sizes[4], arena[2];
    double us[2][7], med[2], t0;
    ad_rng rng;
    ad_tape *T = ad_tape_new();
    char key[128];
    while (argc > 1 && kind < GRU_LAYER && strcmp(argv[1], names[kind]) != 0) kind++;
    if ((argc > 1 && strcmp(argv[1], names[kind]) != 0) || N < 1 || I < 1 || H < 1 || steps < 1 || N > 4096 || I > 4096 || H > 4096 || steps > 1024 || !T) {
        fprintf(stderr, "rnn: bench/rnn [lstm|gru|lstm-layer|gru-layer] [N] [I] [H] [steps]\n");
        return 2;
    }
    G = (kind == GRU || kind == GRU_LAYER ? 3 : 4) * H;
    sizes[0] = (size_t)G * I;
    sizes[1] = (size_t)G * H;
    sizes[2] = sizes[3] = (size_t)G;
    ad_rng_seed(&rng, 7);
    for (i = 0; i < 4; i++) {
        size_t j;
        wdata[i] = (ad_real *)malloc(sizes[i] * sizeof(ad_real));
        wgrad[i] = (ad_real *)calloc(sizes[i], sizeof(ad_real));
        if (!wdata[i] || !wgrad[i]) return 1;
        for (j = 0; j < sizes[i]; j++) wdata[i][j] = (ad_real)((ad_rng_uniform(&rng) * 2 - 1) / 12);
    }
    xdata = (ad_real *)malloc((size_t)steps * N * I * sizeof(ad_real));
    if (!xdata) return 1;
    for (i = 0; i < steps * N * I; i++) xdata[i] = (ad_real)(ad_rng_uniform(&rng) * 2 - 1);
    ad_set_threads(T, bench_threads());
    /* about 50 ms a round */
    t0 = bench_time();
    for (rep = 0; rep < 20; rep++)
        if (run(T, kind, 1, no_grad, N, I, H, steps, wdata, wgrad, xdata, &arena[1]) != 0) return 1;
    reps = (int)(0.05 / ((bench_time() - t0) / 20 + 1e-9)) + 1;
    for (round = 0; round < 7; round++)
        for (fused = 1; fused >= 0; fused--) {
            t0 = bench_time();
            for (rep = 0; rep < reps; rep++)
                if (run(T, kind, fused, no_grad, N, I, H, steps, wdata, wgrad, xdata, &arena[fused]) != 0) return 1;
            us[fused][round] = (bench_time() - t0) * 1e6 / reps / steps;
        }
    for (fused = 0; fused <= 1; fused++) med[fused] = bench_median(us[fused], 7);
    printf("%s N=%d I=%d H=%d, %d step(s), %d thread(s)%s: %s %.2f us/step, %s %.2f us/step (%.2fx); arena %.2f and %.2f MiB\n",
           names[kind], N, I, H, steps, bench_threads(), no_grad ? ", no-grad" : "",
           kind >= LSTM_LAYER ? "layer" : "fused", med[1], kind >= LSTM_LAYER ? "unrolled cells" : "composition", med[0],
           med[0] / med[1], (double)arena[1] / 1048576, (double)arena[0] / 1048576);
    snprintf(key, sizeof key, "rnn.%s%s.%d-%d-%d-%d.us_step.fused", names[kind], no_grad ? "-nograd" : "", N, I, H, steps);
    bench_result(key, med[1]);
    snprintf(key, sizeof key, "rnn.%s%s.%d-%d-%d-%d.us_step.composition", names[kind], no_grad ? "-nograd" : "", N, I, H,
             steps);
    bench_result(key, med[0]);
    for (i = 0; i < 4; i++) {
        free(wdata[i]);
        free(wgrad[i]);
    }
    free(xdata);
    ad_tape_free(T);
    return 0;
}
