/* Training speed: epochs of an MLP classifier (ReLU between fully connected layers, softmax
   cross-entropy) on MNIST's 60000 training images, batch 64, plain SGD with learning rate 0.1,
   Kaiming-uniform weights (bound sqrt(6 / fan_in)) and zero biases. The parameters live in an
   ad_params store; each step updates the parameters on the tape's threads (ad_optim_step_on)
   and, with the optimizer's zero_grad, zeroes their gradients in the same pass, where PyTorch
   calls optimizer.zero_grad().

   Data: MNIST_DIR/train-{images-idx3,labels-idx1}-ubyte (raw or .gz) when MNIST_DIR is set,
   otherwise random data of the same size (the time per epoch is the same; the loss is not
   meaningful then). Each step picks its 64 shuffled rows out of the whole set with
   ad_embedding, which splits the copy over the tape's threads, as PyTorch's x[idx] does.

   Build: cc -O2 -I. bench/mlp.c -lm -lpthread
   Run:   bench/mlp [784,128,10]    (layer widths; environment BENCH_EPOCHS, default 1)
   Reports seconds per epoch (the median when several; also in wall time, whatever
   BENCH_CLOCK says, for comparing thread counts) and the mean loss of the last epoch.
   BENCH_CLOCK=cpu times in CPU time of the calling thread (see bench.h).

   Data-parallel over MPI: mpicc -O2 -I. -DBENCH_MPI bench/mlp.c -lm, then
   mpirun -np N bench/mlp_mpi [widths]. Each of the N processes takes its share of every batch of
   64 and the gradients are summed by examples/data_parallel.h, which starts each bucket from the
   store's gradient hook while the sweep goes on (BENCH_DP_OVERLAP=0: one MPI_Allreduce after
   the sweep instead). Reports samples per second over all processes, in wall time, and the
   time per step that rank 0 spent waiting for the sums. */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"
#ifdef BENCH_MPI
#include <mpi.h>
#include "examples/data_parallel.h"
#endif

#define MAX_LAYERS 8

typedef struct layer {
    int W, b; /* parameter ids; W is [in, out] */
} layer;

int main(int argc, char **argv)
{
    enum { BATCH = 64 };
    const double lr = 0.1;
    const char *spec = argc > 1 ? argv[1] : "784,128,10";
    const char *env_epochs = getenv("BENCH_EPOCHS");
    int widths[MAX_LAYERS + 1], nw = 0, nl, l, epochs = env_epochs ? atoi(env_epochs) : 1, e;
    layer L[MAX_LAYERS];
    bench_data d;
    ad_rng rng;
    ad_tape *T;
    ad_params *P;
    ad_optim *opt;
    ad_optim_desc sgd;
    int *yb, *perm, i;
    double times[64], walls[64], loss_sum = 0;
    char key[160], name[96];
    const char *p = spec, *prefix;
    int root = 1; /* the process that reports */
#ifdef BENCH_MPI
    dp_group dp;
    int provided;
    const char *env_overlap = getenv("BENCH_DP_OVERLAP");
    dp_options dpo;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    dp_init(&dp, MPI_COMM_WORLD);
    root = dp.rank == 0;
    memset(&dpo, 0, sizeof dpo);
    dpo.no_overlap = env_overlap && atoi(env_overlap) == 0;
#endif

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
    if (root)
        printf("# MLP %s, %s (%d images), batch %d, SGD lr %g, %d epoch(s), %d thread(s)\n", spec,
               d.real ? "MNIST" : "synthetic data", d.n, BATCH, lr, epochs, bench_threads());

    ad_rng_seed(&rng, 1);
    P = ad_params_new(1);
    if (!P) return 1;
    for (l = 0; l < nl; l++) {
        int shape[2];
        char wname[32], bname[32];
        size_t nwt = (size_t)widths[l] * widths[l + 1], k;
        double bound = sqrt(6.0 / widths[l]);
        float *w;
        shape[0] = widths[l];
        shape[1] = widths[l + 1];
        snprintf(wname, sizeof wname, "fc%d.weight", l + 1);
        snprintf(bname, sizeof bname, "fc%d.bias", l + 1);
        L[l].W = ad_params_add(P, wname, 2, shape, NULL);
        L[l].b = ad_params_add(P, bname, 1, &shape[1], NULL);
        if (L[l].W < 0 || L[l].b < 0) {
            fprintf(stderr, "mlp: %s\n", ad_params_error(P));
            return 1;
        }
        w = ad_params_info(P, L[l].W).value;
        for (k = 0; k < nwt; k++) w[k] = (float)((2 * ad_rng_uniform(&rng) - 1) * bound);
    }
    memset(&sgd, 0, sizeof sgd);
    sgd.kind = AD_OPTIM_SGD;
    sgd.lr = lr;
    sgd.zero_grad = 1;
    opt = ad_optim_new(P, &sgd);
    yb = (int *)malloc(BATCH * sizeof(int));
    perm = (int *)malloc((size_t)d.n * sizeof(int));
    T = ad_tape_new();
    if (!yb || !perm || !T || !opt) return 1;
    ad_set_threads(T, bench_threads());
    prefix = bench_precision(T);
    if (root && *prefix) printf("# products in bfloat16\n");
    for (i = 0; i < d.n; i++) perm[i] = i;
#ifdef BENCH_MPI
    if (dp_attach(&dp, P, &dpo) != 0) return 1;
    dp_broadcast_parameters(&dp);
    if (root)
        printf("# data-parallel over %d processes, gradients summed %s\n", dp.size,
               dpo.no_overlap ? "by one MPI_Allreduce after the sweep" : "in buckets started during the sweep");
#endif

    for (e = 0; e < epochs; e++) {
        double t0, w0;
        int start;
        bench_shuffle(perm, d.n, &rng);
        loss_sum = 0;
        t0 = bench_time();
        w0 = bench_now();
#ifdef BENCH_MPI
        MPI_Barrier(dp.comm);
        w0 = bench_now();
        t0 = bench_time();
        dp.wait_seconds = 0;
        dp.steps = 0;
#endif
        for (start = 0; start < d.n; start += BATCH) {
            int bs = d.n - start < BATCH ? d.n - start : BATCH, lo = 0, hi = bs;
            ad_tensor *h, *loss;
            double share = 1;
#ifdef BENCH_MPI
            share = dp_share(&dp, bs, &lo, &hi);
            dp_begin(&dp);
#endif
            ad_tape_reset(T);
            h = bench_batch(T, &d, perm, start + lo, hi - lo, yb);
            for (l = 0; l < nl; l++) {
                h = ad_linear(T, h, ad_param(T, P, L[l].W), ad_param(T, P, L[l].b));
                if (l < nl - 1) h = ad_relu(T, h);
            }
            loss = ad_cross_entropy(T, h, yb);
            if (!loss || ad_backward(T, share != 1 ? ad_mul_scalar(T, loss, (ad_real)share) : loss) != 0) {
                fprintf(stderr, "mlp: %s\n", ad_tape_error(T));
                return 1;
            }
#ifdef BENCH_MPI
            dp_end(&dp);
#endif
            if (ad_optim_step_on(opt, T) != 0) {
                fprintf(stderr, "mlp: %s\n", ad_params_error(P));
                return 1;
            }
            loss_sum += (double)ad_item(loss) * (hi - lo);
        }
        times[e] = bench_time() - t0;
        walls[e] = bench_now() - w0;
#ifdef BENCH_MPI
        dp_sum(&dp, &loss_sum, 1);
#endif
        if (root) printf("# epoch %d: %.3f s, mean train loss %.4f\n", e + 1, times[e], loss_sum / d.n);
        fflush(stdout);
    }
#ifdef BENCH_MPI
    if (root) {
        snprintf(key, sizeof key, "mpi.%s.samples_s.np%dt%d%s", name, dp.size, bench_threads(),
                 dpo.no_overlap ? ".blocking" : "");
        bench_result(key, d.n / bench_median(walls, epochs));
        snprintf(key, sizeof key, "mpi.%s.wait_us.np%dt%d%s", name, dp.size, bench_threads(),
                 dpo.no_overlap ? ".blocking" : "");
        bench_result(key, 1e6 * dp.wait_seconds / (dp.steps ? dp.steps : 1));
        snprintf(key, sizeof key, "mpi.%s.loss.np%dt%d%s", name, dp.size, bench_threads(),
                 dpo.no_overlap ? ".blocking" : "");
        bench_result(key, loss_sum / d.n);
    }
    dp_detach(&dp);
    MPI_Finalize();
#else
    snprintf(key, sizeof key, "%smlp.%s.loss.ours", prefix, name);
    bench_result(key, loss_sum / d.n);
    snprintf(key, sizeof key, "%smlp.%s.s_epoch.ours", prefix, name);
    bench_result(key, bench_median(times, epochs));
    snprintf(key, sizeof key, "%smlp.%s.s_epoch_wall.ours", prefix, name);
    bench_result(key, bench_median(walls, epochs));
    bench_result("mlp.real_data", d.real);
#endif

    ad_tape_free(T);
    ad_optim_free(opt);
    ad_params_free(P);
    free(yb);
    free(perm);
    free(d.x);
    free(d.y);
    return 0;
}
