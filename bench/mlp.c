/* Training speed: epochs of an MLP classifier (ReLU between fully connected layers, softmax
   cross-entropy) on MNIST's 60000 training images, batch 64, plain SGD with learning rate 0.1,
   Kaiming-uniform weights (bound sqrt(6 / fan_in)) and zero biases. The parameters are plain
   arrays, wrapped with ad_tensor_view on every step; the update is a loop over them.

   Data: MNIST_DIR/train-{images-idx3,labels-idx1}-ubyte (raw or .gz) when MNIST_DIR is set,
   otherwise random data of the same size (the time per epoch is the same; the loss is not
   meaningful then). Each step copies its 64 shuffled rows into one batch buffer.

   Build: cc -O2 -I. bench/mlp.c -lm -lpthread
   Run:   bench/mlp [784,128,10]    (layer widths; environment BENCH_EPOCHS, default 1)
   Reports seconds per epoch (the median when several) and the mean loss of the last epoch.
   BENCH_CLOCK=cpu times in CPU time of the calling thread (see bench.h). */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

#define MAX_LAYERS 8

typedef struct layer {
    int in, out;
    float *W, *b, *gW, *gb; /* W is [in, out] */
} layer;

/* w -= lr * g. The blocks of 16 have a constant trip count, which GCC vectorises at -O2 (a
   plain loop over n it leaves scalar there). */
static void sgd(float *AD__RESTRICT w, const float *AD__RESTRICT g, size_t n, float lr)
{
    size_t i = 0, j;
    for (; i + 16 <= n; i += 16)
        for (j = 0; j < 16; j++) w[i + j] -= lr * g[i + j];
    for (; i < n; i++) w[i] -= lr * g[i];
}

int main(int argc, char **argv)
{
    enum { BATCH = 64 };
    const float lr = 0.1f;
    const char *spec = argc > 1 ? argv[1] : "784,128,10";
    const char *env_epochs = getenv("BENCH_EPOCHS");
    int widths[MAX_LAYERS + 1], nw = 0, nl, l, epochs = env_epochs ? atoi(env_epochs) : 1, e;
    layer L[MAX_LAYERS];
    bench_data d;
    ad_rng rng;
    ad_tape *T;
    float *xb;
    int *yb, *perm, i;
    double times[64], loss_sum = 0;
    char key[160], name[96];
    const char *p = spec;

    /* layer widths */
    while (*p && nw <= MAX_LAYERS) {
        widths[nw++] = atoi(p);
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    nl = nw - 1;
    if (nl < 1 || *p || widths[0] != 784 || widths[nl] != 10) {
        fprintf(stderr, "mlp: layer widths like 784,128,10 (784 in, 10 out, at most %d layers)\n", MAX_LAYERS);
        return 2;
    }
    for (l = 0; l <= nl; l++)
        if (widths[l] < 1 || widths[l] > 65536) { fprintf(stderr, "mlp: bad width %d\n", widths[l]); return 2; }
    /* the configuration's name in result keys: widths joined by '-' */
    snprintf(name, sizeof name, "%s", spec);
    for (i = 0; name[i]; i++)
        if (name[i] == ',') name[i] = '-';
    if (epochs < 1) epochs = 1;
    if (epochs > 64) epochs = 64;

    memset(&d, 0, sizeof d);
    if (bench_mnist_load(&d) != 0 && bench_synthetic(&d, 7) != 0) {
        fprintf(stderr, "mlp: out of memory\n");
        return 1;
    }
    printf("# MLP %s, %s (%d images), batch %d, SGD lr %g, %d epoch(s), %d thread(s)\n", spec,
           d.real ? "MNIST" : "synthetic data", d.n, BATCH, (double)lr, epochs, bench_threads());

    ad_rng_seed(&rng, 1);
    for (l = 0; l < nl; l++) {
        size_t nwt = (size_t)widths[l] * widths[l + 1], k;
        double bound = sqrt(6.0 / widths[l]);
        L[l].in = widths[l];
        L[l].out = widths[l + 1];
        L[l].W = (float *)malloc(nwt * sizeof(float));
        L[l].gW = (float *)malloc(nwt * sizeof(float));
        L[l].b = (float *)calloc((size_t)L[l].out, sizeof(float));
        L[l].gb = (float *)malloc((size_t)L[l].out * sizeof(float));
        if (!L[l].W || !L[l].gW || !L[l].b || !L[l].gb) return 1;
        for (k = 0; k < nwt; k++) L[l].W[k] = (float)((2 * ad_rng_uniform(&rng) - 1) * bound);
    }
    xb = (float *)malloc((size_t)BATCH * d.dim * sizeof(float));
    yb = (int *)malloc(BATCH * sizeof(int));
    perm = (int *)malloc((size_t)d.n * sizeof(int));
    T = ad_tape_new();
    if (!xb || !yb || !perm || !T) return 1;
    ad_set_threads(T, bench_threads());
    for (i = 0; i < d.n; i++) perm[i] = i;

    for (e = 0; e < epochs; e++) {
        double t0;
        int start;
        bench_shuffle(perm, d.n, &rng);
        loss_sum = 0;
        t0 = bench_time();
        for (start = 0; start < d.n; start += BATCH) {
            int bs = d.n - start < BATCH ? d.n - start : BATCH, shape[2];
            ad_tensor *h, *loss;
            bench_gather(&d, perm, start, bs, xb, yb);
            ad_tape_reset(T);
            shape[0] = bs;
            shape[1] = d.dim;
            h = ad_tensor_view(T, 2, shape, xb, NULL, 0);
            for (l = 0; l < nl; l++) {
                ad_tensor *W, *b;
                shape[0] = L[l].in;
                shape[1] = L[l].out;
                W = ad_tensor_view(T, 2, shape, L[l].W, L[l].gW, 1);
                b = ad_tensor_view(T, 1, &L[l].out, L[l].b, L[l].gb, 1);
                h = ad_linear(T, h, W, b);
                if (l < nl - 1) h = ad_relu(T, h);
            }
            loss = ad_cross_entropy(T, h, yb);
            for (l = 0; l < nl; l++) {
                memset(L[l].gW, 0, (size_t)L[l].in * L[l].out * sizeof(float));
                memset(L[l].gb, 0, (size_t)L[l].out * sizeof(float));
            }
            if (!loss || ad_backward(T, loss) != 0) {
                fprintf(stderr, "mlp: %s\n", ad_tape_error(T));
                return 1;
            }
            for (l = 0; l < nl; l++) {
                sgd(L[l].W, L[l].gW, (size_t)L[l].in * L[l].out, lr);
                sgd(L[l].b, L[l].gb, (size_t)L[l].out, lr);
            }
            loss_sum += (double)ad_item(loss) * bs;
        }
        times[e] = bench_time() - t0;
        printf("# epoch %d: %.3f s, mean train loss %.4f\n", e + 1, times[e], loss_sum / d.n);
        fflush(stdout);
    }
    snprintf(key, sizeof key, "mlp.%s.loss.ours", name);
    bench_result(key, loss_sum / d.n);
    snprintf(key, sizeof key, "mlp.%s.s_epoch.ours", name);
    bench_result(key, bench_median(times, epochs));
    bench_result("mlp.real_data", d.real);

    ad_tape_free(T);
    for (l = 0; l < nl; l++) {
        free(L[l].W);
        free(L[l].gW);
        free(L[l].b);
        free(L[l].gb);
    }
    free(xb);
    free(yb);
    free(perm);
    free(d.x);
    free(d.y);
    return 0;
}
