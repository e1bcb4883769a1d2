/* The work that bench/pair.sh times: compiled twice, once against each of two versions of
   autodiff.h (AUTODIFF_STATIC, so the two implementations live side by side in one program), with
   PAIR_ENTRY naming this build's entry point. bench/pair.c calls the two builds alternately.

   Each piece of work runs steps times and returns a checksum of its results, so that the driver
   can say whether the two versions computed the same bits; NAN when the work failed.
     tape   f(a, b) of the reverse-mode tutorial on single numbers (ad_num): record, backward,
            reset (bench/tape.c's work)
     cnn    one training step of bench/cnn.c's network (conv 5x5 1->8, ReLU, max pool 2, conv 5x5
            8->16, ReLU, max pool 2, linear 256->10, cross-entropy; batch 64, SGD) on fixed
            random data
     conv   the CNN's two convolutions alone, forward and backward
     mlp    one training step of the 784-512-256-10 MLP (ReLU, cross-entropy, batch 64, SGD) on
            fixed random data
     gemm   a product C = op(A) op(B), no gradient: a square of PAIR_GEMM_SIZE (default 1024) on a
            side, or the shape PAIR_GEMM_SHAPE="M,N,K,ta,tb" (op(A) M x K, op(B) K x N, ta and
            tb: whether A and B are stored transposed)
     gpt    one training step of bench/gpt.c's GPT (examples/char_model.h: 4 layers, 4 heads,
            embedding 128, context 64, batch 12; AdamW, gradient norm clipped at 1) on fixed
            random tokens
     norm   a GPT layer's residual block around its layer norm, x + layer_norm(x) with a weight,
            on [768, 128], forward and backward (the norm's backward adds to the gradient of x
            that the add shares)
     clip   the GPT's gradient norm clipped at 1 (as its step clips it) over its store of 804,096
            gradients, filled with fixed random values once
   Everything runs on one thread, or on PAIR_THREADS threads (each build's tape its own pool). */
#define AUTODIFF_IMPLEMENTATION
#define AUTODIFF_STATIC
#include "autodiff.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../examples/char_model.h"
#include "seq_setup.h"

#ifndef PAIR_ENTRY
#error "define PAIR_ENTRY, the name of this build's entry point"
#endif

enum { PAIR_BATCH = 64 };

/* The next number of a fixed sequence (a linear congruential generator's upper bits): the same
   data for both builds. */
static unsigned pair_random(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 9;
}

/* Values in [-0.5, 0.5) from a fixed seed. */
static ad_real *pair_data(size_t n, unsigned seed)
{
    ad_real *p = (ad_real *)malloc(n * sizeof *p);
    size_t i;
    if (!p) return NULL;
    for (i = 0; i < n; i++) p[i] = (ad_real)(pair_random(&seed) & 0xFFFF) / (ad_real)65536 - (ad_real)0.5;
    return p;
}

static ad_num pair_f(ad_tape *T, ad_num a, ad_num b)
{
    ad_num left = ad_num_sub(T, ad_num_div(T, a, b), a);
    ad_num middle = ad_num_add(T, ad_num_add(T, ad_num_div(T, b, a), a), b);
    ad_num right = ad_num_sub(T, a, b);
    return ad_num_mul(T, ad_num_mul(T, left, middle), right);
}

static double pair_tape(ad_tape *T, long steps)
{
    double sum = 0;
    long i;
    for (i = 0; i < steps; i++) {
        ad_num a = ad_num_var(T, (ad_real)1.5 + (ad_real)(i & 7)), b = ad_num_var(T, (ad_real)0.7);
        ad_num y = pair_f(T, a, b);
        if (ad_num_backward(T, y) != 0) return NAN;
        sum += y.value + ad_num_grad(T, a) + ad_num_grad(T, b);
        ad_tape_reset(T);
    }
    return sum;
}

/* A network of three weights and their biases: its store (Kaiming-uniform weights, zero biases),
   SGD with learning rate 0.05, a batch of inputs and their labels. */
typedef struct pair_net {
    ad_params *P;
    ad_optim *opt;
    int ids[6];
    ad_real *x;
    int labels[PAIR_BATCH];
} pair_net;

static int pair_net_init(pair_net *net, const int (*shapes)[4], const int *ndims, size_t input_values)
{
    static const char *names[6] = {"w1", "b1", "w2", "b2", "w3", "b3"};
    ad_init kaiming;
    ad_optim_desc desc;
    int i;
    memset(&kaiming, 0, sizeof kaiming);
    kaiming.kind = AD_INIT_KAIMING_UNIFORM;
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_SGD;
    desc.lr = 0.05;
    net->P = ad_params_new(1);
    if (!net->P) return -1;
    for (i = 0; i < 6; i++) { /* each weight, then its bias */
        net->ids[i] = ad_params_add(net->P, names[i], ndims[i], shapes[i], i % 2 ? NULL : &kaiming);
        if (net->ids[i] < 0) return -1;
    }
    for (i = 0; i < PAIR_BATCH; i++) net->labels[i] = i % 10;
    net->opt = ad_optim_new(net->P, &desc);
    net->x = pair_data(input_values, 5);
    return net->opt && net->x ? 0 : -1;
}

/* Parameter k of net on T. */
static ad_tensor *pair_param(ad_tape *T, const pair_net *net, int k)
{
    return ad_param(T, net->P, net->ids[k]);
}

/* The step's end after the forward pass: gradients zeroed, the sweep, the update, the tape reset.
   Returns the loss, or NAN when something failed. */
static double pair_sgd_step(ad_tape *T, const pair_net *net, ad_tensor *loss)
{
    double value;
    ad_params_zero_grad_on(net->P, T);
    if (!loss || ad_backward(T, loss) != 0 || ad_optim_step_on(net->opt, T) != 0) return NAN;
    value = ad_item(loss);
    ad_tape_reset(T);
    return value;
}

static double pair_cnn(ad_tape *T, long steps)
{
    static const int shapes[6][4] = {{8, 1, 5, 5}, {8}, {16, 8, 5, 5}, {16}, {256, 10}, {10}};
    static const int ndims[6] = {4, 1, 4, 1, 2, 1};
    static pair_net net;
    double sum = 0;
    long i;
    if (!net.x && pair_net_init(&net, shapes, ndims, (size_t)PAIR_BATCH * 784) != 0) return NAN;
    for (i = 0; i < steps; i++) {
        int shape[4] = {PAIR_BATCH, 1, 28, 28};
        ad_tensor *h = ad_tensor_view(T, 4, shape, net.x, NULL, 0), *loss;
        h = ad_conv2d(T, h, pair_param(T, &net, 0), pair_param(T, &net, 1), NULL);
        h = ad_max_pool2d(T, ad_relu(T, h), 2, 2, NULL);
        h = ad_conv2d(T, h, pair_param(T, &net, 2), pair_param(T, &net, 3), NULL);
        h = ad_max_pool2d(T, ad_relu(T, h), 2, 2, NULL);
        h = ad_linear(T, ad_flatten(T, h), pair_param(T, &net, 4), pair_param(T, &net, 5));
        loss = ad_cross_entropy(T, h, net.labels);
        sum += pair_sgd_step(T, &net, loss);
    }
    return sum;
}

static double pair_conv(ad_tape *T, long steps)
{
    static ad_real *x1, *x2, *w1, *w2, *b1, *b2, *g1, *g2, *gb1, *gb2, *gx2;
    double sum = 0;
    long i;
    if (!x1) {
        x1 = pair_data((size_t)PAIR_BATCH * 784, 1);
        x2 = pair_data((size_t)PAIR_BATCH * 8 * 144, 2);
        w1 = pair_data(8 * 25, 3), g1 = pair_data(8 * 25, 4), b1 = pair_data(8, 5), gb1 = pair_data(8, 6);
        w2 = pair_data(16 * 200, 7), g2 = pair_data(16 * 200, 8), b2 = pair_data(16, 9), gb2 = pair_data(16, 10);
        gx2 = pair_data((size_t)PAIR_BATCH * 8 * 144, 11);
        if (!x1 || !x2 || !w1 || !g1 || !b1 || !gb1 || !w2 || !g2 || !b2 || !gb2 || !gx2) return NAN;
    }
    for (i = 0; i < steps; i++) {
        int sx1[4] = {PAIR_BATCH, 1, 28, 28}, sw1[4] = {8, 1, 5, 5}, sb1[1] = {8};
        int sx2[4] = {PAIR_BATCH, 8, 12, 12}, sw2[4] = {16, 8, 5, 5}, sb2[1] = {16};
        ad_tensor *y1 = ad_conv2d(T, ad_tensor_view(T, 4, sx1, x1, NULL, 0), ad_tensor_view(T, 4, sw1, w1, g1, 1),
                                  ad_tensor_view(T, 1, sb1, b1, gb1, 1), NULL);
        ad_tensor *y2 = ad_conv2d(T, ad_tensor_view(T, 4, sx2, x2, gx2, 1), ad_tensor_view(T, 4, sw2, w2, g2, 1),
                                  ad_tensor_view(T, 1, sb2, b2, gb2, 1), NULL);
        ad_tensor *y = ad_add(T, ad_sum(T, y1), ad_sum(T, y2));
        if (!y || ad_backward(T, y) != 0) return NAN;
        sum += ad_item(y) + g1[3] + g2[7] + gx2[11];
        ad_tape_reset(T);
    }
    return sum;
}

static double pair_norm(ad_tape *T, long steps)
{
    enum { ROWS = 768, WIDTH = 128 };
    static ad_real *x, *gx, *gamma, *ggamma, *w;
    double sum = 0;
    long i;
    if (!x) {
        x = pair_data((size_t)ROWS * WIDTH, 12), gx = pair_data((size_t)ROWS * WIDTH, 13);
        gamma = pair_data(WIDTH, 14), ggamma = pair_data(WIDTH, 15), w = pair_data((size_t)ROWS * WIDTH, 16);
        if (!x || !gx || !gamma || !ggamma || !w) return NAN;
    }
    for (i = 0; i < steps; i++) {
        int sx[2] = {ROWS, WIDTH}, sg[1] = {WIDTH};
        ad_tensor *xt = ad_tensor_view(T, 2, sx, x, gx, 1);
        ad_tensor *y = ad_add(T, xt, ad_layer_norm(T, xt, 1, ad_tensor_view(T, 1, sg, gamma, ggamma, 1), NULL,
                                                   (ad_real)1e-5));
        ad_tensor *loss = ad_sum(T, ad_mul(T, y, ad_tensor_view(T, 2, sx, w, NULL, 0)));
        if (!loss || ad_backward(T, loss) != 0) return NAN;
        sum += ad_item(loss) + gx[5] + ggamma[3];
        ad_tape_reset(T);
    }
    return sum;
}

static double pair_mlp(ad_tape *T, long steps)
{
    static const int shapes[6][4] = {{784, 512}, {512}, {512, 256}, {256}, {256, 10}, {10}};
    static const int ndims[6] = {2, 1, 2, 1, 2, 1};
    static pair_net net;
    double sum = 0;
    long i;
    if (!net.x && pair_net_init(&net, shapes, ndims, (size_t)PAIR_BATCH * 784) != 0) return NAN;
    for (i = 0; i < steps; i++) {
        int shape[2] = {PAIR_BATCH, 784};
        ad_tensor *h = ad_tensor_view(T, 2, shape, net.x, NULL, 0), *loss;
        h = ad_relu(T, ad_linear(T, h, pair_param(T, &net, 0), pair_param(T, &net, 1)));
        h = ad_relu(T, ad_linear(T, h, pair_param(T, &net, 2), pair_param(T, &net, 3)));
        loss = ad_cross_entropy(T, ad_linear(T, h, pair_param(T, &net, 4), pair_param(T, &net, 5)), net.labels);
        sum += pair_sgd_step(T, &net, loss);
    }
    return sum;
}

/* The product's shape: op(A) is M x K, op(B) K x N, each operand stored transposed when its flag
   is set (PAIR_GEMM_SHAPE "M,N,K,ta,tb"), else a square of PAIR_GEMM_SIZE. */
typedef struct pair_gemm_shape {
    int M, N, K, ta, tb;
} pair_gemm_shape;

static pair_gemm_shape pair_gemm_read_shape(void)
{
    pair_gemm_shape g;
    const char *shape = getenv("PAIR_GEMM_SHAPE"), *size = getenv("PAIR_GEMM_SIZE");
    int side = size && atoi(size) > 0 ? atoi(size) : 1024;
    g.M = g.N = g.K = side;
    g.ta = g.tb = 0;
    if (shape && (sscanf(shape, "%d,%d,%d,%d,%d", &g.M, &g.N, &g.K, &g.ta, &g.tb) < 3 || g.M < 1 || g.N < 1 || g.K < 1))
        g.M = 0;
    return g;
}

static double pair_gemm(ad_tape *T, long steps)
{
    static ad_real *a, *b;
    static pair_gemm_shape g;
    double sum = 0;
    long i;
    if (!a) {
        g = pair_gemm_read_shape();
        if (g.M == 0) return NAN;
        a = pair_data((size_t)g.M * g.K, 1);
        b = pair_data((size_t)g.K * g.N, 2);
        if (!a || !b) return NAN;
    }
    for (i = 0; i < steps; i++) {
        int sa[2], sb[2];
        ad_tensor *c;
        sa[0] = g.ta ? g.K : g.M, sa[1] = g.ta ? g.M : g.K;
        sb[0] = g.tb ? g.N : g.K, sb[1] = g.tb ? g.K : g.N;
        c = ad_matmul_t(T, ad_tensor_view(T, 2, sa, a, NULL, 0), ad_tensor_view(T, 2, sb, b, NULL, 0), g.ta, g.tb);
        if (!c) return NAN;
        sum += c->data[(size_t)g.M * g.N / 2];
        ad_tape_reset(T);
    }
    return sum;
}

/* bench/gpt.c's model, optimizer and batch (bench/seq_setup.h), made on the first call. */
typedef struct pair_gpt_state {
    char_model m;
    ad_params *P;
    ad_optim *opt;
    int B, L, *ids, *targets; /* B x L tokens and the next ones */
} pair_gpt_state;

static int pair_gpt_init(pair_gpt_state *g)
{
    char_config cfg;
    ad_optim_desc desc = bench_seq_adamw();
    unsigned seed = 42;
    int i;
    bench_seq_config(1, &cfg, &g->B, &g->L);
    g->ids = (int *)malloc((size_t)g->B * g->L * sizeof(int));
    g->targets = (int *)malloc((size_t)g->B * g->L * sizeof(int));
    if (!g->ids || !g->targets) return -1;
    if (!(g->P = ad_params_new(1337)) || char_model_init(&g->m, &cfg, g->P) != 0) return -1;
    if (!(g->opt = ad_optim_new(g->P, &desc))) return -1;
    for (i = 0; i < g->B * g->L; i++) {
        g->ids[i] = (int)(pair_random(&seed) % (unsigned)cfg.vocab);
        g->targets[i] = (int)(pair_random(&seed) % (unsigned)cfg.vocab);
    }
    return 0;
}

/* The gradient norm clipped at 1 as bench/gpt.c clips it: on the tape's threads from 0.10.11,
   which has ad_clip_grad_norm_on; on the calling thread before. */
static double pair_clip(ad_params *P, ad_tape *T)
{
#if AUTODIFF_VERSION_MAJOR * 10000 + AUTODIFF_VERSION_MINOR * 100 + AUTODIFF_VERSION_PATCH >= 1011
    return ad_clip_grad_norm_on(P, 1.0, T);
#else
    (void)T;
    return ad_clip_grad_norm(P, 1.0);
#endif
}

static double pair_gpt(ad_tape *T, long steps)
{
    static pair_gpt_state g;
    static int made;
    double sum = 0;
    long i;
    if (!made) {
        if (pair_gpt_init(&g) != 0) return NAN;
        made = 1;
    }
    for (i = 0; i < steps; i++) {
        ad_tensor *loss;
        ad_params_zero_grad_on(g.P, T);
        loss = ad_cross_entropy(T, char_forward(T, &g.m, g.ids, g.B, g.L), g.targets);
        if (!loss || ad_backward(T, loss) != 0 || pair_clip(g.P, T) < 0 || ad_optim_step_on(g.opt, T) != 0)
            return NAN;
        sum += ad_item(loss);
        ad_tape_reset(T);
    }
    return sum;
}

static double pair_clip_alone(ad_tape *T, long steps)
{
    static pair_gpt_state g;
    static int made;
    double sum = 0;
    long i;
    if (!made) {
        ad_real *values;
        size_t n;
        if (pair_gpt_init(&g) != 0) return NAN;
        n = ad_params_scalars(g.P);
        if (!(values = pair_data(n, 99))) return NAN;
        memcpy(ad_params_grads(g.P), values, n * sizeof *values);
        free(values);
        made = 1;
    }
    for (i = 0; i < steps; i++) {
        double norm = pair_clip(g.P, T);
        if (norm < 0) return NAN;
        sum += norm;
    }
    return sum;
}

/* Runs work steps times on this build's tape (one thread, or PAIR_THREADS); NAN for unknown work
   or a failure. */
double PAIR_ENTRY(const char *work, long steps);
double PAIR_ENTRY(const char *work, long steps)
{
    static ad_tape *T;
    if (!T) {
        const char *threads = getenv("PAIR_THREADS");
        if (!(T = ad_tape_new())) return NAN;
        ad_set_threads(T, threads && atoi(threads) > 1 ? atoi(threads) : 1);
    }
    if (strcmp(work, "tape") == 0) return pair_tape(T, steps);
    if (strcmp(work, "cnn") == 0) return pair_cnn(T, steps);
    if (strcmp(work, "conv") == 0) return pair_conv(T, steps);
    if (strcmp(work, "mlp") == 0) return pair_mlp(T, steps);
    if (strcmp(work, "gemm") == 0) return pair_gemm(T, steps);
    if (strcmp(work, "gpt") == 0) return pair_gpt(T, steps);
    if (strcmp(work, "clip") == 0) return pair_clip_alone(T, steps);
    if (strcmp(work, "norm") == 0) return pair_norm(T, steps);
    return NAN;
}
