/* Training speed of the character-level language models of examples/char_model.h, one step at a
   time on random token ids (fixed seed; the same batch every step), against the same models in
   PyTorch (bench/torch_bench.py gpt, lstm):

   gpt   nanoGPT's shakespeare_char recipe for a CPU: vocabulary 65, context 64, batch 12, 4
         layers, 4 heads, embedding 128, no biases, no dropout, output layer tied to the token
         embedding, pre-norm layer norms (weight only, eps 1e-5), GELU MLP of 4 x 128.
   lstm  2 stacked LSTM layers of 256 over an embedding of 256, a linear head to the 65
         characters, batch 32, 64 steps of truncated backpropagation through time: the state
         left by one step enters the next as a constant.

   Both train with AdamW (lr 1e-3, betas 0.9 and 0.99, weight decay 0.1 on the matrices only)
   and clip the gradients' norm at 1.0. One step: zero the gradients, forward, cross-entropy,
   backward, clip, optimizer step, reset the tape.

   Build: cc -O2 -I. bench/gpt.c -lm -lpthread
   Run:   bench/gpt [gpt|lstm] [steps]     (defaults: gpt, 20 timed steps after 3 warm-up steps)
   Reports tokens per second (batch x length over the median time of a step; also in wall time,
   whatever BENCH_CLOCK says, for comparing thread counts), the loss of the first step (about
   ln 65 = 4.17 from the initialisation), the parameter count, the arena's peak over a step and,
   for the GPT, the floating-point operations of one step counted from its matrix products and
   the GFLOP/s they make. AUTODIFF_THREADS sets the thread count (default 1); BENCH_CLOCK=cpu
   times in CPU time of the calling thread (see bench.h). */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"
#include "examples/char_model.h"
#include "bench/seq_setup.h"

#define WARMUP 3
#define MAX_STEPS 1000

/* Floating-point operations of one GPT training step, counted as 2 M N K for each matrix
   product: per layer the four weight products (x W_attn, y W_proj, h W_fc, g W_fc_proj: 24 N C^2
   for N = B L rows) and the attention's Q K^T and P V (4 B L^2 C, every score of the L x L
   square, the causal mask's skipped half included, as nanoGPT's estimate_mfu counts them), plus
   the output layer x wte^T (2 N C V). The backward sweep does two products of the same size for
   each product of the forward, so a step is 3 times the forward. Layer norms, GELU, softmax,
   the loss and the optimizer are not counted. */
static double gpt_flop_step(const char_config *c, int B, int L)
{
    double N = (double)B * L, C = c->embd;
    double layer = 24 * N * C * C + 4.0 * B * (double)L * L * C;
    return 3 * (c->layers * layer + 2 * N * C * c->vocab);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "gpt";
    int steps = argc > 2 ? atoi(argv[2]) : 20, gpt = strcmp(mode, "gpt") == 0, B, L, s, i;
    char_config cfg;
    char_model m;
    ad_params *P;
    ad_optim_desc desc;
    ad_optim *opt;
    ad_tape *T;
    ad_rng rng;
    int *ids, *targets;
    double times[MAX_STEPS], walls[MAX_STEPS], loss0 = 0, tok, flop = 0;
    char key[64];

    if ((!gpt && strcmp(mode, "lstm") != 0) || steps < 1 || steps > MAX_STEPS) {
        fprintf(stderr, "gpt: bench/gpt [gpt|lstm] [steps, 1 to %d]\n", MAX_STEPS);
        return 2;
    }
    bench_seq_config(gpt, &cfg, &B, &L);
    P = ad_params_new(1337);
    if (!P || char_model_init(&m, &cfg, P) != 0) {
        fprintf(stderr, "gpt: cannot build the model: %s\n", P ? ad_params_error(P) : "out of memory");
        return 1;
    }
    desc = bench_seq_adamw();
    opt = ad_optim_new(P, &desc);
    T = ad_tape_new();
    ids = (int *)malloc((size_t)B * L * sizeof(int));
    targets = (int *)malloc((size_t)B * L * sizeof(int));
    if (!opt || !T || !ids || !targets) {
        fprintf(stderr, "gpt: out of memory\n");
        return 1;
    }
    ad_set_threads(T, bench_threads());
    ad_rng_seed(&rng, 42);
    for (i = 0; i < B * L; i++) ids[i] = (int)ad_rng_below(&rng, (uint64_t)cfg.vocab);
    for (i = 0; i < B * L; i++) targets[i] = (int)ad_rng_below(&rng, (uint64_t)cfg.vocab);
    if (gpt)
        printf("# GPT %d layers, %d heads, embedding %d, vocabulary %d, context %d, batch %d, %zu parameters, %d thread(s)\n",
               cfg.layers, cfg.heads, cfg.embd, cfg.vocab, cfg.ctx, B, ad_params_scalars(P), bench_threads());
    else
        printf("# LSTM %d layers of %d, vocabulary %d, batch %d, %d steps, %zu parameters, %d thread(s)\n", cfg.layers,
               cfg.embd, cfg.vocab, B, L, ad_params_scalars(P), bench_threads());

    for (s = 0; s < WARMUP + steps; s++) {
        double t0 = bench_time(), w0 = bench_now();
        ad_tensor *loss;
        ad_params_zero_grad_on(P, T);
        loss = ad_cross_entropy(T, char_forward(T, &m, ids, B, L), targets);
        if (!loss || ad_backward(T, loss) != 0 || ad_clip_grad_norm_on(P, 1.0, T) < 0 || ad_optim_step_on(opt, T) != 0) {
            fprintf(stderr, "gpt: %s\n", ad_tape_error(T) ? ad_tape_error(T) : ad_params_error(P));
            return 1;
        }
        if (s == 0) loss0 = ad_item(loss);
        ad_tape_reset(T);
        if (s >= WARMUP) {
            times[s - WARMUP] = bench_time() - t0;
            walls[s - WARMUP] = bench_now() - w0;
        }
    }
    tok = (double)B * L / bench_median(times, steps);
    printf("# first loss %.4f (ln %d = %.4f), %.1f ms per step, %.0f tokens/s, arena peak %.1f MiB\n", loss0,
           cfg.vocab, log((double)cfg.vocab), 1e3 * B * L / tok, tok, (double)ad_tape_bytes_peak(T) / (1 << 20));
    snprintf(key, sizeof key, "%s.tok_s.ours", mode);
    bench_result(key, tok);
    snprintf(key, sizeof key, "%s.tok_s_wall.ours", mode);
    bench_result(key, (double)B * L / bench_median(walls, steps));
    snprintf(key, sizeof key, "%s.loss0.ours", mode);
    bench_result(key, loss0);
    printf("@ %s.params.ours %zu\n", mode, ad_params_scalars(P)); /* exact, where bench_result keeps 6 digits */
    snprintf(key, sizeof key, "%s.arena_mib.ours", mode);
    bench_result(key, (double)ad_tape_bytes_peak(T) / (1 << 20));
    if (gpt) {
        flop = gpt_flop_step(&cfg, B, L);
        printf("# %.3f GFLOP per step (matrix products, forward and backward): %.1f GFLOP/s\n", flop * 1e-9,
               flop * tok / (B * L) * 1e-9);
        bench_result("gpt.gflop_step", flop * 1e-9);
        bench_result("gpt.gflops.ours", flop * tok / (B * L) * 1e-9);
    }
    char_model_free(&m);
    ad_tape_free(T);
    ad_optim_free(opt);
    ad_params_free(P);
    free(ids);
    free(targets);
    return 0;
}
