/* Training speed of a small CNN on MNIST: conv 5x5 (1 -> 8) - ReLU - max pool 2 - conv 5x5
   (8 -> 16) - ReLU - max pool 2 - linear (256 -> 10), softmax cross-entropy, batch 64, plain
   SGD with learning rate 0.05, through the library's parameter store and optimizer.

   Data as bench/mlp.c: MNIST_DIR when set, otherwise random data of the same size.
   Build: cc -O2 -I. bench/cnn.c -lm -lpthread
   Run:   bench/cnn      (environment BENCH_EPOCHS, default 1; BENCH_STEPS limits the batches of
                          an epoch, for profiling)
   Reports seconds per epoch (the median when several; also in wall time, whatever
   BENCH_CLOCK says, for comparing thread counts) and the mean loss of the last epoch. */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

int main(void)
{
    enum { BATCH = 64 };
    const char *env_epochs = getenv("BENCH_EPOCHS"), *env_steps = getenv("BENCH_STEPS");
    int epochs = env_epochs ? atoi(env_epochs) : 1, e, i, n_used;
    int w1[4] = {8, 1, 5, 5}, w2[4] = {16, 8, 5, 5}, wf[2] = {256, 10}, c1 = 8, c2 = 16, cf = 10;
    int W1, B1, W2, B2, WF, BF;
    bench_data d;
    ad_params *P = ad_params_new(1);
    ad_optim_desc desc;
    ad_optim *opt;
    ad_init kaiming;
    ad_rng rng;
    ad_tape *T = ad_tape_new();
    int *yb, *perm;
    double times[64], walls[64], loss_sum = 0;
    char key[64];
    const char *prefix;

    if (epochs < 1) epochs = 1;
    if (epochs > 64) epochs = 64;
    memset(&d, 0, sizeof d);
    if (bench_mnist_load(&d) != 0 && bench_synthetic(&d, 7) != 0) return 1;
    n_used = d.n;
    if (env_steps && atoi(env_steps) > 0 && (long)atoi(env_steps) * BATCH < d.n) n_used = atoi(env_steps) * BATCH;
    memset(&kaiming, 0, sizeof kaiming);
    kaiming.kind = AD_INIT_KAIMING_UNIFORM;
    W1 = ad_params_add(P, "conv1.weight", 4, w1, &kaiming);
    B1 = ad_params_add(P, "conv1.bias", 1, &c1, NULL);
    W2 = ad_params_add(P, "conv2.weight", 4, w2, &kaiming);
    B2 = ad_params_add(P, "conv2.bias", 1, &c2, NULL);
    WF = ad_params_add(P, "fc.weight", 2, wf, &kaiming);
    BF = ad_params_add(P, "fc.bias", 1, &cf, NULL);
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_SGD;
    desc.lr = 0.05;
    opt = ad_optim_new(P, &desc);
    yb = (int *)malloc(BATCH * sizeof(int));
    perm = (int *)malloc((size_t)d.n * sizeof(int));
    if (!opt || !T || !yb || !perm) return 1;
    ad_set_threads(T, bench_threads());
    prefix = bench_precision(T);
    printf("# CNN conv5x5(1-8)-pool-conv5x5(8-16)-pool-fc, %s (%d images), batch %d, SGD lr 0.05, %d epoch(s), "
           "%d thread(s)%s\n", d.real ? "MNIST" : "synthetic data", d.n, BATCH, epochs, bench_threads(),
           *prefix ? ", bfloat16 products" : "");
    ad_rng_seed(&rng, 1);
    for (i = 0; i < d.n; i++) perm[i] = i;

    for (e = 0; e < epochs; e++) {
        double t0, w0;
        int start;
        bench_shuffle(perm, d.n, &rng);
        loss_sum = 0;
        t0 = bench_time();
        w0 = bench_now();
        for (start = 0; start < n_used; start += BATCH) {
            int bs = n_used - start < BATCH ? n_used - start : BATCH, shape[4];
            ad_tensor *h, *loss;
            ad_tape_reset(T);
            h = bench_batch(T, &d, perm, start, bs, yb);
            shape[0] = bs;
            shape[1] = 1;
            shape[2] = shape[3] = 28;
            h = ad_reshape(T, h, 4, shape);
            h = ad_max_pool2d(T, ad_relu(T, ad_conv2d(T, h, ad_param(T, P, W1), ad_param(T, P, B1), NULL)), 2, 2, NULL);
            h = ad_max_pool2d(T, ad_relu(T, ad_conv2d(T, h, ad_param(T, P, W2), ad_param(T, P, B2), NULL)), 2, 2, NULL);
            loss = ad_cross_entropy(T, ad_linear(T, ad_flatten(T, h), ad_param(T, P, WF), ad_param(T, P, BF)), yb);
            ad_params_zero_grad_on(P, T);
            if (!loss || ad_backward(T, loss) != 0 || ad_optim_step_on(opt, T) != 0) {
                fprintf(stderr, "cnn: %s\n", ad_tape_error(T) ? ad_tape_error(T) : "optimizer failed");
                return 1;
            }
            loss_sum += (double)ad_item(loss) * bs;
        }
        times[e] = bench_time() - t0;
        walls[e] = bench_now() - w0;
        printf("# epoch %d: %.3f s, mean train loss %.4f\n", e + 1, times[e], loss_sum / n_used);
        fflush(stdout);
    }
    snprintf(key, sizeof key, "%scnn.loss.ours", prefix);
    bench_result(key, loss_sum / n_used);
    snprintf(key, sizeof key, "%scnn.s_epoch.ours", prefix);
    bench_result(key, bench_median(times, epochs));
    snprintf(key, sizeof key, "%scnn.s_epoch_wall.ours", prefix);
    bench_result(key, bench_median(walls, epochs));
    ad_tape_free(T);
    ad_optim_free(opt);
    ad_params_free(P);
    free(yb);
    free(perm);
    free(d.x);
    free(d.y);
    return 0;
}
