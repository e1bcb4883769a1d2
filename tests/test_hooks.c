/* Gradient hooks, retain_grad, a parameter store's hook, anomaly mode, names and DOT pictures. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensor hooks ---- */

static int hook_calls;

static ad_tensor *scale_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)x;
    hook_calls++;
    return ad_mul_scalar(T, grad, *(const double *)ctx);
}

static ad_tensor *keep_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)T;
    (void)x;
    *(double *)ctx = grad->data[0]; /* what the hook saw */
    hook_calls++;
    return NULL;
}

static ad_tensor *replace_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)grad;
    (void)ctx;
    hook_calls++;
    return ad_full(T, x->ndim, x->shape, 7);
}

static ad_tensor *bad_shape_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)x;
    (void)grad;
    (void)ctx;
    return ad_zeros(T, AD_SHAPE(5));
}

static ad_tensor *failing_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)x;
    (void)ctx;
    return ad_reshape(T, grad, AD_SHAPE(17)); /* fails: wrong size */
}

static void test_tensor_hooks(void)
{
    ad_tape *T = ad_tape_new();
    double two = 2, three = 3, seen = 0;
    ad_tensor *a, *b, *h, *y, *g;

    /* y = (a * b)^2 with a = 3, b = 5: dy/dh = 2h = 30 at h = a b = 15 */
    a = ad_var(T, 3);
    b = ad_var(T, 5);
    h = ad_mul(T, a, b);
    y = ad_mul(T, h, h);
    hook_calls = 0;
    TH_CHECK(ad_register_hook(h, scale_hook, &two) == 0, "register: %s", ad_tape_error(T));
    TH_CHECK(ad_register_hook(h, keep_hook, &seen) == 0, "register: %s", ad_tape_error(T));
    TH_CHECK(ad_backward(T, y) == 0, "backward: %s", ad_tape_error(T));
    TH_CHECK(hook_calls == 2, "two hooks on h called once each: %d calls", hook_calls);
    TH_CHECK(seen == 60, "the second hook sees the first one's result: %g", seen);
    TH_CHECK(ad_grad_item(a) == 60 * 5 && ad_grad_item(b) == 60 * 3, "scaled gradient flows on: %g %g",
             ad_grad_item(a), ad_grad_item(b));
    ad_tape_reset(T);

    /* hooks on leaves: scaled before being added into ->grad, which keeps what it had */
    a = ad_var(T, 3);
    b = ad_var(T, 5);
    y = ad_mul(T, a, b);
    TH_CHECK(ad_register_hook(a, scale_hook, &three) == 0, "register on a leaf");
    TH_CHECK(ad_backward(T, y) == 0 && ad_backward(T, y) == 0, "two backwards: %s", ad_tape_error(T));
    TH_CHECK(ad_grad_item(a) == 2 * 3 * 5, "leaf hook scaled each sweep's gradient: %g", ad_grad_item(a));
    TH_CHECK(ad_grad_item(b) == 2 * 3, "unhooked leaf: %g", ad_grad_item(b));
    ad_tape_reset(T);

    /* a replacement; ad_grad calls hooks too; a tensor with no route gets no call */
    {
        double xs[3] = {1, 2, 3};
        ad_tensor *x = ad_tensor_new(T, AD_SHAPE(3), xs, 1), *sq = ad_square(T, x), *other = ad_exp(T, x);
        hook_calls = 0;
        ad_register_hook(sq, replace_hook, NULL);
        ad_register_hook(other, scale_hook, &two);
        y = ad_sum(T, ad_mul(T, sq, x)); /* d/dsq = x, replaced by 7: dx = 7 * 2x + sq */
        g = ad_grad(T, y, x, 0);
        TH_CHECK(g && hook_calls == 1, "ad_grad runs the one reachable hook: %d", hook_calls);
        TH_CHECK(g && g->data[0] == 7 * 2 * 1 + 1 && g->data[2] == 7 * 2 * 3 + 9, "replaced: %g %g",
                 g ? g->data[0] : -1, g ? g->data[2] : -1);
        TH_CHECK(x->grad == NULL, "ad_grad touches no grad field");
        /* create_graph: the hook's op is recorded, so the gradient differentiates again */
        {
            ad_tensor *z = ad_var(T, 2), *w = ad_mul(T, z, z), *u = ad_mul(T, w, z), *gz, *ggz;
            ad_register_hook(w, scale_hook, &three); /* du/dw = z, scaled: 3 z; du/dz = 3 z * 2z + w */
            gz = ad_grad(T, u, z, 1);
            ggz = gz ? ad_grad(T, gz, z, 0) : NULL;
            TH_CHECK(gz && ad_item(gz) == 3 * 2 * 2 * 2 + 4, "create_graph through a hook: %g", ad_item(gz));
            /* gz = 3z * z + 3z * z + w as recorded (12 z^2 + ...): d/dz of the two products is
               12z = 24, and the second sweep runs w's hook again on d gz / d w = 1: 3 * 2z = 12 */
            TH_CHECK(ggz && ad_item(ggz) == 36, "second order through a hook: %g %s", ad_item(ggz), ad_tape_error(T) ? ad_tape_error(T) : "");
        }
    }
    ad_tape_reset(T);

    /* errors */
    a = ad_var(T, 1);
    b = ad_scalar(T, 2);
    TH_CHECK(ad_register_hook(b, scale_hook, &two) == -1, "a constant takes no hook");
    TH_CHECK_ERROR(T, "ad_register_hook: x ([]) does not require grad");
    ad_tape_clear_error(T);
    TH_CHECK(ad_register_hook(a, NULL, NULL) == -1, "NULL hook");
    TH_CHECK_ERROR(T, "ad_register_hook: hook is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_register_hook(NULL, scale_hook, NULL) == -1, "NULL tensor");
    h = ad_mul(T, a, a);
    ad_set_name(h, "h");
    ad_register_hook(h, bad_shape_hook, NULL);
    TH_CHECK(ad_backward(T, ad_mul(T, h, a)) == -1, "a hook's result of the wrong shape fails the sweep");
    TH_CHECK_ERROR(T, "ad_backward: the gradient hook of a tensor [], \"h\" returned shape [5]");
    ad_tape_reset(T);
    a = ad_var(T, 1);
    h = ad_mul(T, a, a);
    ad_register_hook(h, failing_hook, NULL);
    TH_CHECK(ad_backward(T, ad_mul(T, h, a)) == -1, "a hook whose op fails stops the sweep");
    TH_CHECK_ERROR(T, "ad_reshape");
    ad_tape_reset(T);
    {
        ad_tensor *stale = ad_var(T, 1);
        ad_tape_reset(T);
        TH_CHECK(ad_register_hook(stale, scale_hook, &two) == -1, "a tensor from before the reset");
        TH_CHECK_ERROR(T, "ad_register_hook: x was made before the tape's last reset");
    }
    ad_tape_free(T);
}

static void test_retain_grad(void)
{
    ad_tape *T = ad_tape_new();
    double xs[2] = {1, 2}, two = 2;
    ad_tensor *x = ad_tensor_new(T, AD_SHAPE(2), xs, 1), *h = ad_exp(T, x), *k = ad_mul_scalar(T, h, 3);
    ad_tensor *y = ad_sum(T, ad_square(T, k)), *c = ad_scalar(T, 1);
    TH_CHECK(ad_retain_grad(h) == 0 && ad_retain_grad(k) == 0 && ad_retain_grad(x) == 0, "retain: %s",
             ad_tape_error(T));
    TH_CHECK(ad_retain_grad(c) == -1, "a constant cannot retain a gradient");
    TH_CHECK_ERROR(T, "ad_retain_grad: x ([]) does not require grad");
    ad_tape_clear_error(T);
    ad_register_hook(k, scale_hook, &two); /* the retained gradient is the one after the hooks */
    TH_CHECK(ad_backward(T, y) == 0, "backward: %s", ad_tape_error(T));
    TH_CHECK(k->grad && fabs(k->grad[1] - 2 * 2 * k->data[1]) < 1e-12, "k->grad = 2 * 2k: %g",
             k->grad ? k->grad[1] : -1);
    TH_CHECK(h->grad && fabs(h->grad[0] - 3 * 2 * 2 * k->data[0]) < 1e-9, "h->grad = 3 * 4k: %g",
             h->grad ? h->grad[0] : -1);
    TH_CHECK(fabs(x->grad[1] - h->grad[1] * h->data[1]) < 1e-9, "x->grad is as without retain_grad");
    TH_CHECK(y->grad == NULL, "y was not retained");
    TH_CHECK(ad_backward(T, y) == 0 && fabs(h->grad[0] - 2 * 3 * 2 * 2 * k->data[0]) < 1e-9,
             "retained gradients accumulate as a leaf's: %g", h->grad[0]);
    {
        ad_tensor *g = ad_grad(T, y, x, 0);
        TH_CHECK(g && fabs(h->grad[0] - 2 * 3 * 2 * 2 * k->data[0]) < 1e-9, "ad_grad leaves ->grad alone");
    }
    ad_tape_free(T);
}

/* ---- the store's hook ---- */

typedef struct param_log {
    ad_params *P;
    int ids[16], n;
    double sums[16];     /* the gradient's sum when the hook ran */
    size_t tape_len_at[16];
    int *entries_left;   /* the test's counter of entries not yet run, read at each call */
    int lefts[16];
} param_log;

static double grad_sum(ad_params *P, int id)
{
    ad_param_info in = ad_params_info(P, id);
    double s = 0;
    size_t i;
    for (i = 0; i < in.size; i++) s += in.grad[i];
    return s;
}

static int entries_left;

static void log_hook(ad_params *P, int id, void *ctx)
{
    param_log *L = (param_log *)ctx;
    if (L->n < 16) {
        L->ids[L->n] = id;
        L->sums[L->n] = grad_sum(P, id);
        L->lefts[L->n] = entries_left;
    }
    L->n++;
}

/* counts the entries of the sweep as they run: a hook on each op's result sees them in order */
static ad_tensor *count_hook(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)T;
    (void)x;
    (void)grad;
    (void)ctx;
    entries_left--;
    return NULL;
}

static void test_param_hook(void)
{
    ad_params *P = ad_params_new(1), *Q = ad_params_new(2);
    ad_tape *T = ad_tape_new();
    ad_init init = {AD_INIT_UNIFORM, -1, 1, 0};
    int W1 = ad_params_add(P, "fc1.weight", AD_SHAPE(4, 5), &init), b1 = ad_params_add(P, "fc1.bias", AD_SHAPE(5), &init);
    int W2 = ad_params_add(P, "fc2.weight", AD_SHAPE(5, 3), &init), unused = ad_params_add(P, "unused", AD_SHAPE(2), &init);
    int q = ad_params_add(Q, "q", AD_SHAPE(3), &init);
    int labels[2] = {0, 2}, k, step;
    double xs[8] = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8}, final_sums[4];
    param_log L;
    (void)unused;
    memset(&L, 0, sizeof L);
    ad_params_set_grad_hook(P, log_hook, &L);
    for (step = 0; step < 2; step++) {
        ad_tensor *x = ad_tensor_new(T, AD_SHAPE(2, 4), xs, 0), *W1t, *h1, *h2, *logits, *loss;
        /* W1 is put on the tape twice: its gradient is complete after its earlier use */
        W1t = ad_param(T, P, W1);
        h1 = ad_relu(T, ad_linear(T, x, W1t, ad_param(T, P, b1)));
        h2 = ad_add(T, h1, ad_sum_axis(T, ad_param(T, P, W1), 0, 0)); /* [2,5] + [5] */
        logits = ad_matmul(T, h2, ad_mul(T, ad_param(T, P, W2), ad_sum(T, ad_mul(T, ad_param(T, Q, q), ad_param(T, Q, q)))));
        loss = ad_cross_entropy(T, logits, labels);
        TH_CHECK(loss != NULL, "forward: %s", ad_tape_error(T));
        /* a counting hook on every op result, to know how many entries remain when the store's hook runs */
        {
            ad_tensor *outs[10];
            int i, nouts = 0;
            outs[nouts++] = h1;
            outs[nouts++] = h2;
            outs[nouts++] = logits;
            outs[nouts++] = loss;
            for (i = 0; i < nouts; i++) ad_register_hook(outs[i], count_hook, NULL);
            entries_left = nouts;
        }
        ad_params_zero_grad(P);
        memset(&L, 0, sizeof L);
        TH_CHECK(ad_backward(T, loss) == 0, "backward: %s", ad_tape_error(T));
        TH_CHECK(L.n == 4, "once per parameter of the store: %d calls", L.n);
        for (k = 0; k < 4; k++) {
            int j, count = 0;
            for (j = 0; j < L.n && j < 16; j++) count += L.ids[j] == k;
            TH_CHECK(count == 1, "parameter %d reported %d times", k, count);
            final_sums[k] = grad_sum(P, k);
        }
        for (k = 0; k < L.n && k < 16; k++)
            TH_CHECK(L.sums[k] == final_sums[L.ids[k]], "parameter %d's gradient was final when reported (%g vs %g)",
                     L.ids[k], L.sums[k], final_sums[L.ids[k]]);
        /* order: fc2.weight is complete first (the last layer), then fc1.weight's second use is past but
           its first (the linear) is not, so fc1 weight and bias complete after h1's entry; unused at the end */
        TH_CHECK(L.ids[0] == W2, "fc2.weight first: %d", L.ids[0]);
        TH_CHECK(L.lefts[0] == 2, "fc2.weight reported during the sweep, with entries left: %d", L.lefts[0]);
        TH_CHECK(L.ids[3] == 3 && L.lefts[3] == 0, "the unused parameter last, at the end: %d %d", L.ids[3], L.lefts[3]);
        TH_CHECK((L.ids[1] == W1 || L.ids[1] == b1) && (L.ids[2] == W1 || L.ids[2] == b1) && L.lefts[1] == 0,
                 "fc1 after its first use: %d %d", L.ids[1], L.ids[2]);
        TH_CHECK(fabs(final_sums[W1]) > 0, "W1 has a gradient");
        ad_tape_reset(T);
    }
    /* no calls from ad_grad; none once the hook is removed */
    {
        ad_tensor *w = ad_param(T, P, b1), *y = ad_sum(T, ad_square(T, w));
        memset(&L, 0, sizeof L);
        TH_CHECK(ad_grad(T, y, w, 0) != NULL && L.n == 0, "ad_grad calls no store hook: %d", L.n);
        ad_params_set_grad_hook(P, NULL, NULL);
        TH_CHECK(ad_backward(T, y) == 0 && L.n == 0, "removed hook: %d", L.n);
    }
    {   /* a store without a hook, freed before the tape's reset, is not read by a later sweep */
        ad_params *R = ad_params_new(3);
        int r = ad_params_add(R, "r", AD_SHAPE(2), NULL);
        ad_tensor *v = ad_var(T, 2);
        TH_CHECK(ad_param(T, R, r) != NULL, "ad_param");
        ad_params_free(R);
        TH_CHECK(ad_backward(T, ad_mul(T, v, v)) == 0 && ad_grad_item(v) == 4, "a sweep after the store was freed");
    }
    ad_tape_free(T);
    ad_params_free(P);
    ad_params_free(Q);
}

/* ---- anomaly mode ---- */

static void test_anomaly(void)
{
    ad_tape *T = ad_tape_new();
    double xs[3] = {1, -1, 2}, zs[3] = {4, 0, 9};
    ad_tensor *x, *y, *z, *s;
    TH_CHECK(ad_set_detect_anomaly(T, 1) == 0, "off by default");
    TH_CHECK(ad_set_detect_anomaly(T, 1) == 1, "returns the previous setting");
    TH_CHECK(ad_set_detect_anomaly(NULL, 1) == -1, "NULL tape");

    /* a NaN made in the forward: log(-1) */
    x = ad_set_name(ad_tensor_new(T, AD_SHAPE(3), xs, 1), "x");
    TH_CHECK(x != NULL, "ad_set_name returns x");
    y = ad_log(T, x);
    TH_CHECK(y == NULL, "log(-1) in anomaly mode returns NULL");
    TH_CHECK_ERROR(T, "ad_log forward: NaN in the result ([3]) from input 0 ([3], \"x\")");
    ad_tape_reset(T);

    /* a NaN that comes from a NaN already there is not the op's fault: only the first op is named */
    x = ad_set_name(ad_tensor_new(T, AD_SHAPE(3), xs, 1), "x");
    x->data[0] = NAN;
    y = ad_exp(T, x);
    TH_CHECK(y != NULL && ad_tape_error(T) == NULL, "NaN in, NaN out: not reported: %s",
             ad_tape_error(T) ? ad_tape_error(T) : "");
    ad_tape_reset(T);

    /* one-element ops (the scalar path), with the second input named */
    {
        ad_tensor *a = ad_var(T, 1), *b = ad_set_name(ad_var(T, 0), "b");
        TH_CHECK(ad_div(T, a, b) == NULL, "1 / 0 is reported");
        TH_CHECK_ERROR(T, "ad_div forward: Inf in the result ([]) from input 0 ([]), input 1 ([], \"b\")");
    }
    ad_tape_reset(T);
    {   /* constants too: ops that record nothing are checked */
        ad_tensor *c = ad_set_name(ad_scalar(T, -1), "c");
        TH_CHECK(ad_sqrt(T, c) == NULL, "sqrt of a negative constant");
        TH_CHECK_ERROR(T, "ad_sqrt forward: NaN in the result ([]) from input 0 ([], \"c\")");
    }
    ad_tape_reset(T);

    /* an Inf made only in the backward: sqrt at 0 */
    z = ad_set_name(ad_tensor_new(T, AD_SHAPE(3), zs, 1), "z");
    s = ad_sqrt(T, z);
    TH_CHECK(s != NULL && s->data[1] == 0, "sqrt(0) = 0 passes the forward check: %s",
             ad_tape_error(T) ? ad_tape_error(T) : "");
    y = ad_sum(T, s);
    TH_CHECK(ad_backward(T, y) == -1, "the backward's Inf is reported");
    TH_CHECK_ERROR(T, "ad_sqrt backward: Inf in the gradient of input 0 ([3], \"z\")");
    ad_tape_reset(T);
    /* the same through ad_grad, with create_graph */
    z = ad_tensor_new(T, AD_SHAPE(3), zs, 1);
    TH_CHECK(ad_grad(T, ad_sum(T, ad_sqrt(T, z)), z, 1) == NULL, "ad_grad with create_graph reports it too");
    TH_CHECK_ERROR(T, "ad_sqrt backward: Inf in the gradient of input 0 ([3])");
    ad_tape_reset(T);
    /* an Inf in the gradient coming in is not the next op's fault */
    ad_set_detect_anomaly(T, 0);
    z = ad_tensor_new(T, AD_SHAPE(3), zs, 1);
    y = ad_sum(T, ad_mul_scalar(T, ad_sqrt(T, z), 2));
    TH_CHECK(ad_backward(T, y) == 0 && isinf(z->grad[1]), "anomaly mode off: Inf silently");
    ad_tape_reset(T);
    /* a parameter named by its store in messages */
    {
        ad_params *P = ad_params_new(1);
        int w = ad_params_add(P, "layer.w", AD_SHAPE(2), NULL);
        ad_set_detect_anomaly(T, 1);
        TH_CHECK(ad_log(T, ad_param(T, P, w)) == NULL, "log(0) of a parameter");
        TH_CHECK_ERROR(T, "ad_log forward: Inf in the result ([2]) from input 0 ([2], \"layer.w\")");
        ad_params_free(P);
    }
    TH_CHECK(ad_set_name(NULL, "n") == NULL, "NULL tensor");
    ad_tape_reset(T);
    x = ad_var(T, 1);
    TH_CHECK(ad_set_name(x, NULL) == NULL, "NULL name");
    TH_CHECK_ERROR(T, "ad_set_name: name is NULL");
    ad_tape_free(T);
}

/* A clean training step with anomaly mode on gives the same numbers as with it off. */
static void mlp_step(int anomaly, double *out, int nout)
{
    ad_params *P = ad_params_new(7);
    ad_tape *T = ad_tape_new();
    ad_init init = {AD_INIT_KAIMING_UNIFORM, 0, 0, 0};
    int W1 = ad_params_add(P, "W1", AD_SHAPE(6, 8), &init), b1 = ad_params_add(P, "b1", AD_SHAPE(8), NULL);
    int W2 = ad_params_add(P, "W2", AD_SHAPE(8, 3), &init), labels[4] = {0, 1, 2, 1}, i;
    ad_rng rng;
    ad_tensor *x, *loss;
    ad_rng_seed(&rng, 3);
    ad_set_detect_anomaly(T, anomaly);
    x = ad_randn(T, AD_SHAPE(4, 6), 0, 1, &rng);
    loss = ad_cross_entropy(T, ad_linear(T, ad_tanh(T, ad_linear(T, x, ad_param(T, P, W1), ad_param(T, P, b1))),
                                          ad_param(T, P, W2), NULL), labels);
    TH_CHECK(loss && ad_backward(T, loss) == 0, "clean step (anomaly %d): %s", anomaly,
             ad_tape_error(T) ? ad_tape_error(T) : "");
    out[0] = ad_item(loss);
    for (i = 1; i < nout; i++) out[i] = ad_params_grads(P)[(size_t)(i * 7) % ad_params_scalars(P)];
    ad_tape_free(T);
    ad_params_free(P);
}

static void test_anomaly_clean(void)
{
    double off[12], on[12];
    mlp_step(0, off, 12);
    mlp_step(1, on, 12);
    TH_CHECK(memcmp(off, on, sizeof off) == 0, "anomaly mode changes no result");
}

/* ---- pictures ---- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    const char *p = text;
    while ((p = strstr(p, needle)) != NULL) {
        n++;
        p += strlen(needle);
    }
    return n;
}

static void test_dot(void)
{
    ad_tape *T = ad_tape_new();
    ad_params *P = ad_params_new(1);
    int W = ad_params_add(P, "W", AD_SHAPE(2, 1), NULL), b = ad_params_add(P, "b", AD_SHAPE(1), NULL);
    double xs[6] = {1, 2, 3, 4, 5, 6};
    char path[64], cmd[256];
    ad_tensor *x, *z, *y, *unrelated;
    char *dot;
    snprintf(path, sizeof path, "build/tests/hooks_graph_%d.dot", (int)(xs[0]));
    x = ad_set_name(ad_tensor_new(T, AD_SHAPE(3, 2), xs, 0), "x \"in\"");
    z = ad_linear(T, x, ad_param(T, P, W), ad_param(T, P, b));
    y = ad_sigmoid(T, z);
    ad_set_name(y, "sigma");
    unrelated = ad_exp(T, ad_var(T, 1));
    TH_CHECK(unrelated != NULL, "unrelated op");
    TH_CHECK(ad_tape_write_dot(T, y, path) == 0, "write: %s", ad_tape_error(T) ? ad_tape_error(T) : "");
    dot = read_file(path);
    TH_CHECK(dot != NULL, "the file is there");
    if (dot) {
        TH_CHECK(strncmp(dot, "digraph", 7) == 0 && dot[strlen(dot) - 2] == '}', "a whole digraph");
        TH_CHECK(count_of(dot, "shape=box") == 2, "two ops: %d", count_of(dot, "shape=box"));
        TH_CHECK(strstr(dot, "ad_linear\\n[3,1]") != NULL, "the linear op with its shape");
        TH_CHECK(strstr(dot, "ad_sigmoid\\n[3,1]\\nsigma") != NULL, "the sigmoid with its name");
        TH_CHECK(strstr(dot, "\"W\\n[2,1]\"") != NULL && strstr(dot, "\"b\\n[1]\"") != NULL, "parameters by store name");
        TH_CHECK(strstr(dot, "x \\\"in\\\"\\n[3,2]") != NULL, "the input's name, quotes escaped");
        TH_CHECK(count_of(dot, " -> ") == 4, "four edges: %d", count_of(dot, " -> "));
        TH_CHECK(count_of(dot, "ellipse") == 3, "three leaves: %d", count_of(dot, "ellipse"));
        TH_CHECK(strstr(dot, "ad_exp") == NULL, "only what y depends on");
        TH_CHECK(count_of(dot, "peripheries=2") == 1, "y marked");
        free(dot);
    }
    /* a scalar graph: the one-element path's entries have their names; x used twice */
    {
        ad_tensor *a = ad_set_name(ad_var(T, 2), "a"), *d = ad_mul(T, a, ad_add(T, a, ad_scalar(T, 1)));
        TH_CHECK(ad_tape_write_dot(T, d, path) == 0, "write scalar graph");
        dot = read_file(path);
        TH_CHECK(dot && strstr(dot, "ad_mul\\n[]") && strstr(dot, "ad_add\\n[]") && strstr(dot, "\"1\\n[]\""),
                 "scalar ops by name");
        TH_CHECK(dot && count_of(dot, " -> ") == 4 && count_of(dot, "shape=ellipse") == 2, "a drawn once, used twice");
        free(dot);
    }
    if (system("command -v dot >/dev/null 2>&1") == 0) {
        ad_tape_write_dot(T, y, path);
        snprintf(cmd, sizeof cmd, "dot -Tsvg %s -o %s.svg", path, path);
        TH_CHECK(system(cmd) == 0, "dot accepts the file");
    } else {
        printf("(dot not installed: not rendered)\n");
    }
    /* errors */
    TH_CHECK(ad_tape_write_dot(T, y, "build/tests/no/such/folder/g.dot") == -1, "unwritable path");
    TH_CHECK_ERROR(T, "ad_tape_write_dot: cannot open \"build/tests/no/such/folder/g.dot\" for writing");
    ad_tape_clear_error(T);
    TH_CHECK(ad_tape_write_dot(T, y, NULL) == -1, "NULL path");
    TH_CHECK_ERROR(T, "ad_tape_write_dot: path is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_tape_write_dot(T, NULL, path) == -1, "NULL y");
    TH_CHECK_ERROR(T, "ad_tape_write_dot: y is NULL");
    TH_CHECK(ad_tape_write_dot(NULL, y, path) == -1, "NULL tape");
    ad_tape_free(T);
    ad_params_free(P);
}

int main(void)
{
    test_tensor_hooks();
    test_retain_grad();
    test_param_hook();
    test_anomaly();
    test_anomaly_clean();
    test_dot();
    return th_summary();
}
