/* Optimizer steps: one update of the parameters of the MLP 784-512-256-10 (weights [784,512],
   [512,256], [256,10] and their biases: 535818 scalars, 2.1 MB) by SGD, SGD with momentum 0.9
   and Adam, on the tape's threads (ad_optim_step_on). The gradients are set once; each step
   reads them and the parameters (and the optimizer's state) and writes the parameters back,
   as a training step does after its backward pass. Also the norm of those gradients, as
   ad_clip_grad_norm takes it before a step (a max_norm it never reaches, so nothing is scaled).
   Reports microseconds per step (or per norm), the median of several batches.

   Build: cc -O2 -I. bench/optim.c -lm -lpthread
   Run:   bench/optim      (environment BENCH_CLOCK=cpu: see bench.h) */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

int main(void)
{
    enum { BATCHES = 7, STEPS = 64 };
    static const int widths[4] = {784, 512, 256, 10};
    static const struct {
        const char *key, *what;
        ad_optim_kind kind;
        double momentum;
    } kinds[3] = {{"sgd", "SGD", AD_OPTIM_SGD, 0},
                  {"momentum", "SGD, momentum 0.9", AD_OPTIM_SGD, 0.9},
                  {"adam", "Adam", AD_OPTIM_ADAM, 0}};
    ad_tape *T = ad_tape_new();
    int k;
    if (!T) return 1;
    ad_set_threads(T, bench_threads());
    for (k = 0; k < 3; k++) {
        ad_params *P = ad_params_new(1);
        ad_optim_desc d;
        ad_optim *O;
        ad_rng rng;
        double times[BATCHES], us;
        size_t n, i;
        int l, b, s;
        for (l = 0; l < 3 && P; l++) {
            int shape[2];
            char name[32];
            shape[0] = widths[l];
            shape[1] = widths[l + 1];
            snprintf(name, sizeof name, "fc%d.weight", l + 1);
            ad_params_add(P, name, 2, shape, NULL);
            snprintf(name, sizeof name, "fc%d.bias", l + 1);
            ad_params_add(P, name, 1, &shape[1], NULL);
        }
        memset(&d, 0, sizeof d);
        d.kind = kinds[k].kind;
        d.lr = kinds[k].kind == AD_OPTIM_SGD ? 0.01 : 1e-3;
        d.momentum = kinds[k].momentum;
        O = P ? ad_optim_new(P, &d) : NULL;
        if (!O) {
            fprintf(stderr, "optim: %s\n", P ? ad_params_error(P) : "out of memory");
            return 1;
        }
        n = ad_params_scalars(P);
        ad_rng_seed(&rng, 5);
        for (i = 0; i < n; i++) {
            ad_params_values(P)[i] = (ad_real)(ad_rng_uniform(&rng) - 0.5);
            ad_params_grads(P)[i] = (ad_real)(1e-3 * (ad_rng_uniform(&rng) - 0.5));
        }
        for (s = 0; s < STEPS; s++) ad_optim_step_on(O, T);
        for (b = 0; b < BATCHES; b++) {
            double t = bench_time();
            for (s = 0; s < STEPS; s++) ad_optim_step_on(O, T);
            times[b] = bench_time() - t;
        }
        us = bench_median(times, BATCHES) / STEPS * 1e6;
        printf("# %-18s %zu scalars: %8.1f us per step (checksum %.6g)\n", kinds[k].what, n, us,
               (double)ad_params_values(P)[n / 2]);
        {
            char key[64];
            snprintf(key, sizeof key, "optim.%s.us.ours", kinds[k].key);
            bench_result(key, us);
        }
        if (k == 0) { /* the norm, on the same store */
            double norm = 0;
            for (b = 0; b < BATCHES; b++) {
                double t = bench_time();
                for (s = 0; s < STEPS; s++) norm += ad_clip_grad_norm(P, 1e30);
                times[b] = bench_time() - t;
            }
            us = bench_median(times, BATCHES) / STEPS * 1e6;
            printf("# %-18s %zu scalars: %8.1f us per norm (checksum %.6g)\n", "gradient norm", n, us, norm);
            bench_result("optim.clip.us.ours", us);
        }
        ad_optim_free(O);
        ad_params_free(P);
    }
    ad_tape_free(T);
    return 0;
}
