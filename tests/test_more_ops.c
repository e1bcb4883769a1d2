/* The ops beside the core ones: ad_min, ad_min_axis and ad_argmax_axis, ad_logsumexp,
   ad_var_axis and ad_std_axis, ad_prod_axis, ad_cumsum; ad_squeeze, ad_unsqueeze, ad_stack and
   ad_pad; ad_index_select, ad_gather, ad_where and ad_masked_fill; ad_nll_loss, ad_l1_loss,
   ad_huber_loss and ad_kl_div.

   For every op: its forward against a plain-loop computation written here, on odd shapes and
   with broadcasting; its first and second derivatives against central finite differences in
   double precision (th_gradcheck, th_gradgradcheck), and its recorded derivative (create_graph)
   against the fused one of a plain sweep; its bad arguments, whose messages name the op; NULL
   inputs passed through without a message; and, for the ops split over threads, values and
   gradients on two and three threads equal to one thread's bit for bit. Each family prints the
   number of its checks. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#include <limits.h>

/* An input spec from a shape written as text: S("3,5,7", -1, 1, 0); "" is a scalar. */
static th_input S(const char *dims, double lo, double hi, double away)
{
    int shape[AD_MAX_DIMS], n = 0;
    const char *p = dims;
    while (*p && n < AD_MAX_DIMS) {
        char *end;
        shape[n++] = (int)strtol(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
    }
    return th_in(n, shape, lo, hi, away);
}

/* A tensor of T shaped as dims, uniform in [lo, hi] from rng. */
static ad_tensor *R(ad_tape *T, const char *dims, double lo, double hi, ad_rng *rng, int requires_grad)
{
    th_input s = S(dims, 0, 0, 0);
    ad_tensor *t = ad_rand(T, s.ndim, s.shape, lo, hi, rng);
    if (t && requires_grad) ad_set_requires_grad(t, 1);
    return t;
}

/* sum(w * f(x)) through ad_grad with and without create_graph: the recorded derivative and
   the fused one must agree. */
static void check_paths(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *x[TH_MAX_INPUTS], *loss;
    double *data[TH_MAX_INPUTS], worst = 0;
    int i, ok = 1;
    size_t j;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    loss = th_weighted(T, f, ctx, th_leaves(T, nin, specs, data, x), 77);
    for (i = 0; ok && i < nin; i++) {
        ad_tensor *plain = ad_grad(T, loss, x[i], 0), *graph = ad_grad(T, loss, x[i], 1);
        ok = plain && graph && plain->size == graph->size;
        for (j = 0; ok && j < plain->size; j++) {
            double d = fabs(plain->data[j] - graph->data[j]);
            if (!(d <= 1e-12 * (1 + fabs(plain->data[j])))) ok = 0;
            if (d > worst) worst = d;
        }
    }
    TH_CHECK(ok, "%s: recorded and fused gradients differ (by %g): %s", name, worst, th_errs(T));
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
}

/* First and second derivatives of f, and its two gradient paths. */
static void check(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    th_gradcheck(name, f, ctx, nin, specs);
    th_gradgradcheck(name, f, ctx, nin, specs);
    check_paths(name, f, ctx, nin, specs);
}

static void check1(const char *name, th_fn f, void *ctx, th_input a) { check(name, f, ctx, 1, &a); }

static void check2(const char *name, th_fn f, void *ctx, th_input a, th_input b)
{
    th_input s[2];
    s[0] = a;
    s[1] = b;
    check(name, f, ctx, 2, s);
}

/* x + c with all elements of c distinct and 0.5 apart: for x in [-0.2, 0.2] every minimum and
   maximum is unique by a margin. */
static ad_tensor *distinct(ad_tape *T, ad_tensor *x)
{
    ad_tensor *c = ad_zeros(T, x->ndim, x->shape);
    size_t i;
    for (i = 0; i < c->size; i++) c->data[i] = (double)((i * 37) % c->size) * 0.5;
    return ad_add(T, x, c);
}

/* x + c with c cycling through -1.5, 0, 1.5: for x in [-0.4, 0.4] three groups of values. */
static ad_tensor *spread(ad_tape *T, ad_tensor *x)
{
    ad_tensor *c = ad_zeros(T, x->ndim, x->shape);
    size_t i;
    for (i = 0; i < c->size; i++) c->data[i] = (double)((int)(i % 3) - 1) * 1.5;
    return ad_add(T, x, c);
}

/* A constant 0/1 mask shaped as (ndim, shape), about two fifths ones, in a fixed pattern. */
static ad_tensor *mask_of(ad_tape *T, int ndim, const int *shape)
{
    ad_tensor *m = ad_zeros(T, ndim, shape);
    size_t i;
    for (i = 0; m && i < m->size; i++) m->data[i] = (i * 7 + 3) % 5 < 2;
    return m;
}

/* The parameters of the ops under test. */
typedef struct op_ctx {
    int axis, keepdim, correction;
    int ndim, shape[AD_MAX_DIMS]; /* gather's index shape, where's and masked_fill's mask shape */
    const int *index;             /* index_select, gather, nll_loss */
    int n;
    int npads, pads[2 * AD_MAX_DIMS];
    double value;
} op_ctx;

static op_ctx C(int axis, int keepdim)
{
    op_ctx c;
    memset(&c, 0, sizeof c);
    c.axis = axis;
    c.keepdim = keepdim;
    return c;
}

#define FN(name, expr)                                                   \
    static ad_tensor *name(ad_tape *T, ad_tensor **x, void *ctx_)        \
    {                                                                    \
        const op_ctx *c = (const op_ctx *)ctx_;                          \
        (void)c;                                                         \
        return (expr);                                                   \
    }

/* Walks a multi-index over shape (row-major); returns 0 after the last. */
static int next_index(int ndim, const int *shape, int *idx)
{
    int d;
    for (d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return 1;
        idx[d] = 0;
    }
    return 0;
}

/* The flat position in x of the output multi-index idx (nd dimensions), x broadcast. */
static size_t bcast_at(const ad_tensor *x, int nd, const int *idx)
{
    size_t off = 0;
    int d;
    for (d = 0; d < x->ndim; d++) {
        int k = x->shape[d] == 1 ? 0 : idx[nd - x->ndim + d];
        off = off * (size_t)x->shape[d] + (size_t)k;
    }
    return off;
}

/* x's shape split around axis as [outer, n, inner]. */
static void around(const ad_tensor *x, int axis, size_t *outer, size_t *n, size_t *inner)
{
    int d;
    *outer = *inner = 1;
    for (d = 0; d < axis; d++) *outer *= (size_t)x->shape[d];
    *n = (size_t)x->shape[axis];
    for (d = axis + 1; d < x->ndim; d++) *inner *= (size_t)x->shape[d];
}

/* A failing call: NULL, with the tape's message naming op and holding needle. */
#define BAD(T, call, op, needle)                                                              \
    do {                                                                                      \
        ad_tensor *bad_;                                                                      \
        ad_tape_clear_error(T);                                                               \
        bad_ = (call);                                                                        \
        TH_CHECK(bad_ == NULL, "%s did not fail", #call);                                    \
        TH_CHECK(ad_tape_error(T) && strstr(ad_tape_error(T), op ":") == ad_tape_error(T) &&  \
                     strstr(ad_tape_error(T), needle),                                        \
                 "%s: expected \"%s: ...%s...\", got \"%s\"", #call, op, needle, th_errs(T));   \
    } while (0)

/* A NULL input: NULL back and no message. */
#define PASSES_NULL(T, call)                                                                  \
    do {                                                                                      \
        ad_tape_clear_error(T);                                                               \
        TH_CHECK((call) == NULL, "%s: a NULL input gave a tensor", #call);                   \
        TH_CHECK(ad_tape_error(T) == NULL, "%s: a NULL input set \"%s\"", #call, th_errs(T));   \
    } while (0)

/* ---- min and argmax ---------------------------------------------------------------------- */
FN(f_min, ad_min(T, distinct(T, x[0])))
FN(f_min_sq, ad_square(T, ad_min(T, distinct(T, x[0]))))
FN(f_min_axis, ad_min_axis(T, distinct(T, x[0]), c->axis, c->keepdim))
FN(f_min_axis_sq, ad_square(T, ad_min_axis(T, distinct(T, x[0]), c->axis, c->keepdim)))

static void test_min_argmax(void)
{
    static const char *const shapes[] = {"3,1,5", "4,7", "2,3,4", "5"};
    static const int axes[] = {0, 1, 2, -1, -2, -3};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    size_t si, ai;
    int keep;
    ad_rng_seed(&rng, 1);
    /* values against plain loops; values drawn from a few levels, so ties are common */
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        ad_tensor *a = R(T, shapes[si], 0, 1, &rng, 0), *m;
        size_t i, outer, n, inner, o, k, worst = 0;
        double lo = HUGE_VAL;
        for (i = 0; i < a->size; i++) {
            a->data[i] = floor(a->data[i] * 4);
            if (a->data[i] < lo) lo = a->data[i];
        }
        m = ad_min(T, a);
        TH_CHECK(m && m->ndim == 0 && m->data[0] == lo, "ad_min [%s]: %g, want %g", shapes[si], m ? m->data[0] : 0, lo);
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
            int axis = axes[ai], ax = axis < 0 ? axis + a->ndim : axis, *arg;
            if (ax < 0 || ax >= a->ndim) continue;
            around(a, ax, &outer, &n, &inner);
            arg = (int *)malloc(outer * inner * sizeof(int));
            TH_CHECK(ad_argmax_axis(a, axis, arg) == 0, "ad_argmax_axis [%s] axis %d: %s", shapes[si], axis, th_errs(T));
            for (keep = 0; keep <= 1; keep++) {
                ad_tensor *y = ad_min_axis(T, a, axis, keep);
                int ok = y && y->ndim == a->ndim - !keep && y->size == outer * inner;
                if (ok && keep) ok = y->shape[ax] == 1;
                for (o = 0; ok && o < outer; o++)
                    for (i = 0; i < inner; i++) {
                        double small = HUGE_VAL, big = -HUGE_VAL;
                        size_t at = 0;
                        for (k = 0; k < n; k++) {
                            double v = a->data[(o * n + k) * inner + i];
                            if (v < small) small = v;
                            if (v > big) { big = v; at = k; }
                        }
                        if (y->data[o * inner + i] != small) ok = 0;
                        if ((size_t)arg[o * inner + i] != at) worst++;
                    }
                TH_CHECK(ok, "ad_min_axis [%s] axis %d keepdim %d: values or shape", shapes[si], axis, keep);
            }
            TH_CHECK(worst == 0, "ad_argmax_axis [%s] axis %d: %zu positions differ (first maximum)", shapes[si],
                     axis, worst);
            free(arg);
        }
    }
    /* ties: the gradient goes to the first smallest position alone; NaN wins, the first one */
    {
        double v[] = {2, 1, 3, 1, 1, 5, 0.5, 0.5, 7, 7, 0.5, 1};
        int s34[] = {3, 4}, arg[4] = {-1, -1, -1, -1}, arg1[3] = {-1, -1, -1};
        ad_tensor *x = ad_tensor_new(T, 2, s34, v, 1), *x2 = ad_tensor_new(T, 2, s34, v, 1), *y;
        y = ad_sum(T, ad_min_axis(T, x, 1, 0));
        TH_CHECK(y && ad_backward(T, y) == 0, "backward: %s", th_errs(T));
        TH_CHECK(x->grad && x->grad[1] == 1 && x->grad[3] == 0 && x->grad[4] == 0 && x->grad[6] == 1 && x->grad[7] == 0 &&
                     x->grad[10] == 1 && x->grad[2] + x->grad[5] + x->grad[8] + x->grad[11] == 0,
                 "min_axis at ties: the gradient is not at the first minimum");
        y = ad_min(T, x2);
        TH_CHECK(y && y->data[0] == 0.5 && ad_backward(T, y) == 0 && x2->grad[6] == 1 && x2->grad[7] == 0 && x2->grad[10] == 0,
                 "ad_min at ties: the gradient is not at the first minimum");
        TH_CHECK(ad_argmax_axis(x, 0, arg) == 0 && arg[0] == 2 && arg[1] == 2 && arg[2] == 0 && arg[3] == 0,
                 "argmax axis 0 at ties: %d %d %d %d", arg[0], arg[1], arg[2], arg[3]);
        x->data[2] = NAN;
        x->data[3] = NAN;
        x->data[10] = NAN;
        TH_CHECK(ad_argmax_axis(x, 1, arg1) == 0 && arg1[0] == 2 && arg1[1] == 1 && arg1[2] == 2,
                 "argmax with NaN: %d %d %d", arg1[0], arg1[1], arg1[2]);
        y = ad_min_axis(T, x, -1, 1);
        TH_CHECK(y && isnan(y->data[0]) && y->data[1] == 0.5 && isnan(y->data[2]), "min_axis with NaN");
        TH_CHECK(isnan(ad_item(ad_min(T, x))), "ad_min with NaN is not NaN");
    }
    /* a scalar, and one element */
    {
        ad_tensor *s = ad_var(T, 2.5), *m = ad_min(T, s);
        TH_CHECK(m && m->data[0] == 2.5 && ad_backward(T, m) == 0 && ad_grad_item(s) == 1, "ad_min of a scalar");
    }
    ad_tape_free(T);

    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
        for (keep = 0; keep <= 1; keep++) {
            op_ctx c = C(axes[ai], keep);
            snprintf(name, sizeof name, "min_axis [3,4,5] axis %d keepdim %d", c.axis, keep);
            check1(name, f_min_axis, &c, S("3,4,5", -0.2, 0.2, 0));
            snprintf(name, sizeof name, "min_axis squared axis %d keepdim %d", c.axis, keep);
            check1(name, f_min_axis_sq, &c, S("3,4,5", -0.2, 0.2, 0));
        }
    {
        op_ctx c = C(1, 0);
        check1("min_axis [4,1,3] axis 1", f_min_axis, &c, S("4,1,3", -0.2, 0.2, 0));
    }
    check1("min [3,1,5]", f_min, NULL, S("3,1,5", -0.2, 0.2, 0));
    check1("min squared [2,7]", f_min_sq, NULL, S("2,7", -0.2, 0.2, 0));
    check1("min of a scalar", f_min_sq, NULL, S("", -1, 1, 0));

    T = ad_tape_new();
    {
        int s35[] = {3, 5}, out[5];
        ad_tensor *a = ad_ones(T, 2, s35), *sc = ad_scalar(T, 1);
        BAD(T, ad_min_axis(T, a, 2, 0), "ad_min_axis", "axis 2 is out of range for shape [3,5]");
        BAD(T, ad_min_axis(T, a, -3, 1), "ad_min_axis", "axis -3");
        BAD(T, ad_min_axis(T, sc, 0, 0), "ad_min_axis", "[]");
        ad_tape_clear_error(T);
        TH_CHECK(ad_argmax_axis(a, 2, out) == -1 && strstr(th_errs(T), "ad_argmax_axis: axis 2 is out of range for shape [3,5]"),
                 "ad_argmax_axis with a bad axis: %s", th_errs(T));
        ad_tape_clear_error(T);
        TH_CHECK(ad_argmax_axis(a, 0, NULL) == -1 && strstr(th_errs(T), "ad_argmax_axis: shape [3,5]: out is NULL"),
                 "ad_argmax_axis with out NULL: %s", th_errs(T));
        ad_tape_clear_error(T);
        TH_CHECK(ad_argmax_axis(sc, 0, out) == -1 && strstr(th_errs(T), "ad_argmax_axis"), "ad_argmax_axis of a scalar");
        ad_tape_clear_error(T);
        TH_CHECK(ad_argmax_axis(NULL, 0, out) == -1 && ad_tape_error(T) == NULL, "ad_argmax_axis(NULL)");
        PASSES_NULL(T, ad_min(T, NULL));
        PASSES_NULL(T, ad_min_axis(T, NULL, 0, 0));
        TH_CHECK(ad_min(NULL, a) == NULL && ad_min_axis(NULL, a, 0, 1) == NULL, "ops without a tape");
    }
    ad_tape_free(T);
    th_family("min, min_axis, argmax_axis");
}

/* ---- logsumexp --------------------------------------------------------------------------- */
FN(f_lse, ad_logsumexp(T, x[0], c->axis, c->keepdim))
FN(f_lse_sq, ad_square(T, ad_logsumexp(T, x[0], c->axis, c->keepdim)))

static void test_logsumexp(void)
{
    static const char *const shapes[] = {"3,1,5", "4,7", "2,3,4", "5", "1"};
    static const int axes[] = {0, 1, 2, -1, -2};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    size_t si, ai;
    int keep;
    ad_rng_seed(&rng, 2);
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        ad_tensor *a = R(T, shapes[si], -5, 5, &rng, 0);
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
            int axis = axes[ai], ax = axis < 0 ? axis + a->ndim : axis;
            size_t outer, n, inner, o, i, k;
            double worst = 0;
            if (ax < 0 || ax >= a->ndim) continue;
            around(a, ax, &outer, &n, &inner);
            for (keep = 0; keep <= 1; keep++) {
                ad_tensor *y = ad_logsumexp(T, a, axis, keep);
                int ok = y && y->ndim == a->ndim - !keep && y->size == outer * inner;
                for (o = 0; ok && o < outer; o++)
                    for (i = 0; i < inner; i++) {
                        long double s = 0;
                        for (k = 0; k < n; k++) s += expl((long double)a->data[(o * n + k) * inner + i]);
                        worst = fmax(worst, fabs(y->data[o * inner + i] - (double)logl(s)));
                    }
                TH_CHECK(ok && worst < 1e-14, "logsumexp [%s] axis %d keepdim %d: error %g", shapes[si], axis, keep,
                         worst);
            }
        }
    }
    /* far beyond exp's range: finite and right; infinities and NaN passed on */
    {
        double v[] = {1e300, 1e300, -1e300, 1000, -1000, 999, -1e308, -1e308, -1e308,
                      -INFINITY, -INFINITY, -INFINITY, INFINITY, 1, 2, NAN, 1, 2};
        int s63[] = {6, 3};
        ad_tensor *x = ad_tensor_new(T, 2, s63, v, 1), *y = ad_logsumexp(T, x, 1, 0);
        double e1 = exp(-1.0);
        TH_CHECK(y && y->data[0] == 1e300 + log(2.0), "logsumexp at 1e300: %.17g", y ? y->data[0] : 0);
        TH_CHECK(y && fabs(y->data[1] - (1000 + log1p(e1))) < 1e-12, "logsumexp at +-1000: %.17g", y ? y->data[1] : 0);
        TH_CHECK(y && fabs(y->data[2] - (-1e308 + log(3.0))) <= 1e292, "logsumexp at -1e308: %.17g", y ? y->data[2] : 0);
        TH_CHECK(y && y->data[3] == -INFINITY && y->data[4] == INFINITY && isnan(y->data[5]),
                 "logsumexp of -inf, +inf, NaN rows: %g %g %g", y ? y->data[3] : 0, y ? y->data[4] : 0,
                 y ? y->data[5] : 0);
        TH_CHECK(y && ad_backward(T, ad_add(T, ad_slice(T, y, 0, 0, 1), ad_slice(T, y, 0, 1, 2))) == 0, "backward");
        TH_CHECK(x->grad && x->grad[0] == 0.5 && x->grad[1] == 0.5 && x->grad[2] == 0 &&
                     fabs(x->grad[3] - 1 / (1 + e1)) < 1e-15 && x->grad[4] == 0 && fabs(x->grad[5] - e1 / (1 + e1)) < 1e-15,
                 "logsumexp's gradient at 1e300 and +-1000 is not the softmax");
    }
    ad_tape_free(T);

    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
        for (keep = 0; keep <= 1; keep++) {
            op_ctx c = C(axes[ai], keep);
            snprintf(name, sizeof name, "logsumexp [3,4,5] axis %d keepdim %d", c.axis, keep);
            check1(name, f_lse, &c, S("3,4,5", -2, 2, 0));
        }
    {
        op_ctx c = C(-1, 1);
        check1("logsumexp squared [3,1,5]", f_lse_sq, &c, S("3,1,5", -2, 2, 0));
        c.axis = 1;
        check1("logsumexp over a size-1 axis", f_lse_sq, &c, S("3,1,5", -2, 2, 0));
        c.axis = 0;
        check1("logsumexp at +-30", f_lse, &c, S("4,3", -30, 30, 0));
    }

    T = ad_tape_new();
    {
        int s35[] = {3, 5};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_logsumexp(T, a, 2, 0), "ad_logsumexp", "axis 2 is out of range for shape [3,5]");
        BAD(T, ad_logsumexp(T, ad_scalar(T, 1), -1, 0), "ad_logsumexp", "[]");
        PASSES_NULL(T, ad_logsumexp(T, NULL, 0, 0));
    }
    ad_tape_free(T);
    th_family("logsumexp");
}

/* ---- variance and standard deviation ----------------------------------------------------- */
FN(f_var, ad_var_axis(T, x[0], c->axis, c->correction, c->keepdim))
FN(f_std, ad_std_axis(T, x[0], c->axis, c->correction, c->keepdim))
FN(f_std_sq, ad_square(T, ad_std_axis(T, x[0], c->axis, c->correction, c->keepdim)))

static void test_var_std(void)
{
    static const char *const shapes[] = {"3,1,5", "4,7", "2,3,4", "6"};
    static const int axes[] = {0, 1, 2, -1};
    static const int corrections[] = {0, 1, 2};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    size_t si, ai, ci;
    int keep;
    ad_rng_seed(&rng, 3);
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        ad_tensor *a = R(T, shapes[si], -3, 5, &rng, 0);
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
            for (ci = 0; ci < sizeof corrections / sizeof corrections[0]; ci++) {
                int axis = axes[ai], ax = axis < 0 ? axis + a->ndim : axis, corr = corrections[ci];
                size_t outer, n, inner, o, i, k;
                double worst = 0;
                if (ax < 0 || ax >= a->ndim) continue;
                around(a, ax, &outer, &n, &inner);
                for (keep = 0; keep <= 1; keep++) {
                    ad_tensor *v = ad_var_axis(T, a, axis, corr, keep), *s = ad_std_axis(T, a, axis, corr, keep);
                    int ok = v && s && v->ndim == a->ndim - !keep && s->size == outer * inner;
                    for (o = 0; ok && o < outer; o++)
                        for (i = 0; i < inner; i++) {
                            long double mean = 0, ss = 0, want;
                            for (k = 0; k < n; k++) mean += a->data[(o * n + k) * inner + i];
                            mean /= (long double)n;
                            for (k = 0; k < n; k++) {
                                long double d = a->data[(o * n + k) * inner + i] - mean;
                                ss += d * d;
                            }
                            if ((long)n - corr <= 0) {
                                /* PyTorch: inf or NaN */
                                if (!(isinf(v->data[o * inner + i]) || isnan(v->data[o * inner + i]))) ok = 0;
                                continue;
                            }
                            want = ss / (long double)((long)n - corr);
                            worst = fmax(worst, fabs(v->data[o * inner + i] - (double)want));
                            worst = fmax(worst, fabs(s->data[o * inner + i] - (double)sqrtl(want)));
                        }
                    TH_CHECK(ok && worst < 1e-13, "var/std [%s] axis %d correction %d keepdim %d: error %g", shapes[si],
                             axis, corr, keep, worst);
                }
            }
    }
    {
        double v[] = {1, 2, 4};
        int s3[] = {3};
        ad_tensor *x = ad_tensor_new(T, 1, s3, v, 0);
        TH_CHECK(fabs(ad_item(ad_var_axis(T, x, 0, 1, 0)) - 7.0 / 3) < 1e-15 &&
                     fabs(ad_item(ad_var_axis(T, x, 0, 0, 0)) - 14.0 / 9) < 1e-15 &&
                     fabs(ad_item(ad_var_axis(T, x, 0, -1, 0)) - 14.0 / 12) < 1e-15,
                 "variance of {1, 2, 4} with corrections 1, 0, -1");
        TH_CHECK(isinf(ad_item(ad_var_axis(T, x, 0, 3, 0))) && isinf(ad_item(ad_std_axis(T, x, 0, 5, 0))),
                 "N - correction <= 0 is not infinite");
    }
    ad_tape_free(T);

    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
        for (ci = 0; ci < 2; ci++) {
            op_ctx c = C(axes[ai], (int)(ai % 2));
            c.correction = corrections[ci];
            snprintf(name, sizeof name, "var_axis [3,4,5] axis %d correction %d", c.axis, c.correction);
            check1(name, f_var, &c, S("3,4,5", -2, 2, 0));
            snprintf(name, sizeof name, "std_axis [3,4,5] axis %d correction %d", c.axis, c.correction);
            check1(name, f_std, &c, S("3,4,5", -2, 2, 0));
        }
    {
        op_ctx c = C(-1, 0);
        c.correction = 1;
        check1("std squared [2,3,1,4] axis -1", f_std_sq, &c, S("2,3,1,4", -2, 2, 0));
        c.axis = 2;
        c.correction = 0;
        check1("var over a size-1 axis", f_var, &c, S("2,3,1,4", -2, 2, 0));
    }

    T = ad_tape_new();
    {
        int s35[] = {3, 5};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_var_axis(T, a, -3, 1, 0), "ad_var_axis", "axis -3 is out of range for shape [3,5]");
        BAD(T, ad_std_axis(T, a, 2, 1, 0), "ad_std_axis", "axis 2 is out of range for shape [3,5]");
        PASSES_NULL(T, ad_var_axis(T, NULL, 0, 1, 0));
        PASSES_NULL(T, ad_std_axis(T, NULL, 0, 1, 0));
    }
    ad_tape_free(T);
    th_family("var_axis, std_axis");
}

/* ---- product ----------------------------------------------------------------------------- */
FN(f_prod, ad_prod_axis(T, x[0], c->axis, c->keepdim))
FN(f_prod_sq, ad_square(T, ad_prod_axis(T, x[0], c->axis, c->keepdim)))

/* The gradient of sum(w * prod(x)) and the Hessian-vector product of that gradient with v, at
   data holding zeros, against products written out here: d/dx_j = w prod_{k != j} x_k and
   d/dx_m sum_j v_j d/dx_j = w sum_{j != m} v_j prod_{k != j, m} x_k. */
static void check_prod_zeros(const char *name, const double *data, int rows, int n)
{
    ad_tape *T = ad_tape_new();
    int shape[2], r, j, m, k;
    double *w = (double *)malloc((size_t)rows * sizeof(double)), worst1 = 0, worst2 = 0;
    ad_tensor *x, *wt, *y, *g, *v, *h;
    shape[0] = rows;
    shape[1] = n;
    x = ad_tensor_new(T, 2, shape, data, 1);
    wt = ad_tensor_new(T, 1, shape, NULL, 0);
    for (r = 0; r < rows; r++) w[r] = wt->data[r] = 0.5 + r;
    v = ad_tensor_new(T, 2, shape, NULL, 0);
    for (k = 0; k < rows * n; k++) v->data[k] = 0.25 * (k % 5) - 0.3;
    y = ad_sum(T, ad_mul(T, ad_prod_axis(T, x, 1, 0), wt));
    g = ad_grad(T, y, x, 1);
    h = ad_grad(T, ad_sum(T, ad_mul(T, g, v)), x, 0);
    TH_CHECK(g && h, "%s: %s", name, th_errs(T));
    for (r = 0; g && h && r < rows; r++) {
        const double *xr = data + (size_t)r * n, *vr = v->data + (size_t)r * n;
        for (m = 0; m < n; m++) {
            double p = w[r], hv = 0;
            for (k = 0; k < n; k++)
                if (k != m) p *= xr[k];
            for (j = 0; j < n; j++) {
                double q = w[r] * vr[j];
                if (j == m) continue;
                for (k = 0; k < n; k++)
                    if (k != j && k != m) q *= xr[k];
                hv += q;
            }
            worst1 = fmax(worst1, fabs(g->data[r * n + m] - p));
            worst2 = fmax(worst2, fabs(h->data[r * n + m] - hv));
        }
    }
    TH_CHECK(worst1 < 1e-13, "%s: recorded gradient error %g", name, worst1);
    TH_CHECK(worst2 < 1e-13, "%s: second derivative error %g", name, worst2);
    /* the fused gradient of a plain sweep */
    TH_CHECK(ad_backward(T, y) == 0 && x->grad, "%s: backward: %s", name, th_errs(T));
    for (k = 0, worst1 = 0; x->grad && g && k < rows * n; k++) worst1 = fmax(worst1, fabs(x->grad[k] - g->data[k]));
    TH_CHECK(worst1 < 1e-13, "%s: fused and recorded gradients differ by %g", name, worst1);
    free(w);
    ad_tape_free(T);
}

static void test_prod(void)
{
    static const char *const shapes[] = {"3,1,5", "4,7", "2,3,4", "6"};
    static const int axes[] = {0, 1, 2, -1};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    size_t si, ai;
    int keep;
    ad_rng_seed(&rng, 4);
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        ad_tensor *a = R(T, shapes[si], -2, 2, &rng, 0);
        a->data[1] = 0;
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
            int axis = axes[ai], ax = axis < 0 ? axis + a->ndim : axis;
            size_t outer, n, inner, o, i, k;
            double worst = 0;
            if (ax < 0 || ax >= a->ndim) continue;
            around(a, ax, &outer, &n, &inner);
            for (keep = 0; keep <= 1; keep++) {
                ad_tensor *y = ad_prod_axis(T, a, axis, keep);
                int ok = y && y->ndim == a->ndim - !keep && y->size == outer * inner;
                for (o = 0; ok && o < outer; o++)
                    for (i = 0; i < inner; i++) {
                        double p = 1;
                        for (k = 0; k < n; k++) p *= a->data[(o * n + k) * inner + i];
                        worst = fmax(worst, fabs(y->data[o * inner + i] - p));
                    }
                TH_CHECK(ok && worst < 1e-14, "prod [%s] axis %d keepdim %d: error %g", shapes[si], axis, keep, worst);
            }
        }
    }
    ad_tape_free(T);
    {
        /* rows with no zero, one zero (first, middle, last), two, three and only zeros */
        static const double z[] = {1.5, -2, 0.5, 3,   0,  /**/ 0, 1.5, -2, 0.5, 3,  /**/ 1.5, -2, 0, 0.5, 3,
                                   1.5, -2, 0.5, 3,   0,  /**/ 0, 1.5, 0, 0.5, 3,   /**/ 0, 1.5, 0, 0.5, 0,
                                   0,   0,  0,   0,   0,  /**/ 2, 0.5, -1, 1.25, -3};
        check_prod_zeros("prod with zeros in rows of 5", z, 8, 5);
        check_prod_zeros("prod with zeros in rows of 2", z + 3, 4, 2);
        check_prod_zeros("prod of one value", z, 5, 1);
    }
    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
        for (keep = 0; keep <= 1; keep++) {
            op_ctx c = C(axes[ai], keep);
            snprintf(name, sizeof name, "prod_axis [3,4,5] axis %d keepdim %d", c.axis, keep);
            check1(name, f_prod, &c, S("3,4,5", -1.5, 1.5, 0));
        }
    {
        op_ctx c = C(1, 0);
        check1("prod squared [2,3,1,4] axis 1", f_prod_sq, &c, S("2,3,1,4", -1.5, 1.5, 0));
        c.axis = 2;
        check1("prod over a size-1 axis", f_prod_sq, &c, S("2,3,1,4", -1.5, 1.5, 0));
    }

    T = ad_tape_new();
    {
        int s35[] = {3, 5};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_prod_axis(T, a, 5, 0), "ad_prod_axis", "axis 5 is out of range for shape [3,5]");
        PASSES_NULL(T, ad_prod_axis(T, NULL, 0, 0));
    }
    ad_tape_free(T);
    th_family("prod_axis");
}

/* ---- running sum ------------------------------------------------------------------------- */
FN(f_cumsum, ad_mul(T, ad_cumsum(T, x[0], c->axis), ad_sin(T, ad_cumsum(T, x[0], c->axis))))

static void test_cumsum(void)
{
    static const char *const shapes[] = {"3,1,5", "4,7", "2,3,4", "6", "1"};
    static const int axes[] = {0, 1, 2, -1, -3};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    size_t si, ai;
    ad_rng_seed(&rng, 5);
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        ad_tensor *a = R(T, shapes[si], -2, 2, &rng, 0);
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
            int axis = axes[ai], ax = axis < 0 ? axis + a->ndim : axis;
            size_t outer, n, inner, o, i, k, j;
            double worst = 0;
            ad_tensor *y;
            if (ax < 0 || ax >= a->ndim) continue;
            around(a, ax, &outer, &n, &inner);
            y = ad_cumsum(T, a, axis);
            for (o = 0; y && o < outer; o++)
                for (i = 0; i < inner; i++)
                    for (k = 0; k < n; k++) {
                        double s = 0;
                        for (j = 0; j <= k; j++) s += a->data[(o * n + j) * inner + i];
                        worst = fmax(worst, fabs(y->data[(o * n + k) * inner + i] - s));
                    }
            TH_CHECK(y && y->ndim == a->ndim && y->size == a->size && worst < 1e-14, "cumsum [%s] axis %d: error %g",
                     shapes[si], axis, worst);
        }
    }
    ad_tape_free(T);
    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
        op_ctx c = C(axes[ai], 0);
        snprintf(name, sizeof name, "cumsum [3,4,5] axis %d", c.axis);
        check1(name, f_cumsum, &c, S("3,4,5", -1, 1, 0));
    }
    {
        op_ctx c = C(0, 0);
        check1("cumsum [7]", f_cumsum, &c, S("7", -1, 1, 0));
    }
    T = ad_tape_new();
    {
        int s35[] = {3, 5};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_cumsum(T, a, -3), "ad_cumsum", "axis -3 is out of range for shape [3,5]");
        BAD(T, ad_cumsum(T, ad_scalar(T, 2), 0), "ad_cumsum", "[]");
        PASSES_NULL(T, ad_cumsum(T, NULL, 0));
    }
    ad_tape_free(T);
    th_family("cumsum");
}

/* ---- squeeze, unsqueeze, stack ----------------------------------------------------------- */
FN(f_squeeze, ad_square(T, ad_squeeze(T, ad_sin(T, x[0]), c->axis)))
FN(f_unsqueeze, ad_mul(T, ad_unsqueeze(T, x[0], c->axis), ad_unsqueeze(T, ad_sin(T, x[0]), c->axis)))
static ad_tensor *f_stack(ad_tape *T, ad_tensor **x, void *ctx)
{
    const op_ctx *c = (const op_ctx *)ctx;
    ad_tensor *xs[4], *y;
    xs[0] = x[0];
    xs[1] = x[1];
    xs[2] = x[0]; /* the same tensor twice */
    xs[3] = ad_exp(T, x[2]);
    y = ad_stack(T, xs, 4, c->axis);
    return ad_mul(T, y, ad_sin(T, y));
}

static void test_squeeze_stack(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[96];
    int i;
    ad_rng_seed(&rng, 6);
    {
        ad_tensor *a = R(T, "3,1,5,1", -1, 1, &rng, 1), *y;
        y = ad_squeeze(T, a, 1);
        TH_CHECK(y && y->ndim == 3 && y->shape[0] == 3 && y->shape[1] == 5 && y->shape[2] == 1 && y->data == a->data,
                 "squeeze axis 1 of [3,1,5,1]");
        y = ad_squeeze(T, a, -1);
        TH_CHECK(y && y->ndim == 3 && y->shape[2] == 5 && y->data == a->data, "squeeze axis -1 of [3,1,5,1]");
        TH_CHECK(ad_squeeze(T, a, 0) == a && ad_squeeze(T, a, -2) == a, "squeeze of an axis of size 3 or 5 is not a");
        y = ad_unsqueeze(T, a, -1);
        TH_CHECK(y && y->ndim == 5 && y->shape[4] == 1 && y->shape[3] == 1 && y->data == a->data, "unsqueeze -1");
        y = ad_unsqueeze(T, a, 0);
        TH_CHECK(y && y->ndim == 5 && y->shape[0] == 1 && y->shape[1] == 3, "unsqueeze 0");
        y = ad_unsqueeze(T, a, 2);
        TH_CHECK(y && y->shape[1] == 1 && y->shape[2] == 1 && y->shape[3] == 5, "unsqueeze 2");
        y = ad_unsqueeze(T, a, -5);
        TH_CHECK(y && y->shape[0] == 1 && y->shape[1] == 3, "unsqueeze -5");
        y = ad_unsqueeze(T, ad_scalar(T, 3), -1);
        TH_CHECK(y && y->ndim == 1 && y->shape[0] == 1 && y->data[0] == 3, "unsqueeze of a scalar");
        y = ad_squeeze(T, y, 0);
        TH_CHECK(y && y->ndim == 0 && y->data[0] == 3, "squeeze back to a scalar");
        TH_CHECK(ad_squeeze(T, y, 0) == y && ad_squeeze(T, y, -1) == y, "squeeze of a scalar is not itself");
    }
    /* stack against plain loops: shapes [3,1,5] stacked along each of its four places */
    {
        ad_tensor *xs[3];
        int ax, k, total = 15;
        for (i = 0; i < 3; i++) xs[i] = R(T, "3,1,5", -1, 1, &rng, 0);
        for (ax = -4; ax <= 3; ax++) {
            int pos = ax < 0 ? ax + 4 : ax, idx[4] = {0, 0, 0, 0}, ok;
            ad_tensor *y = ad_stack(T, xs, 3, ax);
            ok = y && y->ndim == 4 && y->shape[pos] == 3 && y->size == 45;
            if (ok)
                do {
                    int src[3], d, m = 0, flat;
                    for (d = 0; d < 4; d++)
                        if (d != pos) src[m++] = idx[d];
                    flat = (src[0] * 1 + src[1]) * 5 + src[2];
                    k = 0;
                    for (d = 0; d < 4; d++) k = k * y->shape[d] + idx[d];
                    if (flat >= total || y->data[k] != xs[idx[pos]]->data[flat]) ok = 0;
                } while (ok && next_index(4, y->shape, idx));
            TH_CHECK(ok, "stack of three [3,1,5] along %d", ax);
        }
    }
    ad_tape_free(T);
    {
        static const char *const sq[] = {"4,1,3", "1,5", "3,1"};
        static const int sq_axes[] = {1, 0, -1};
        for (i = 0; i < 3; i++) {
            op_ctx c = C(sq_axes[i], 0);
            snprintf(name, sizeof name, "squeeze [%s] axis %d", sq[i], c.axis);
            check1(name, f_squeeze, &c, S(sq[i], -1, 1, 0));
        }
        for (i = -4; i <= 3; i += 2) {
            op_ctx c = C(i, 0);
            snprintf(name, sizeof name, "unsqueeze [3,1,5] axis %d", i);
            check1(name, f_unsqueeze, &c, S("3,1,5", -1, 1, 0));
        }
    }
    for (i = -3; i <= 2; i++) {
        op_ctx c = C(i, 0);
        th_input in[3];
        in[0] = S("3,5", -1, 1, 0);
        in[1] = S("3,5", -1, 1, 0);
        in[2] = S("3,5", -1, 1, 0);
        snprintf(name, sizeof name, "stack four [3,5] (one twice) axis %d", i);
        check(name, f_stack, &c, 3, in);
    }

    T = ad_tape_new();
    {
        int s35[] = {3, 5}, s53[] = {5, 3}, eight[8] = {1, 1, 1, 1, 1, 1, 1, 2};
        ad_tensor *a = ad_ones(T, 2, s35), *b = ad_ones(T, 2, s53), *full = ad_ones(T, 8, eight), *xs[3];
        ad_tape *U = ad_tape_new();
        BAD(T, ad_squeeze(T, a, 2), "ad_squeeze", "axis 2 is out of range for shape [3,5]");
        BAD(T, ad_squeeze(T, ad_scalar(T, 1), 1), "ad_squeeze", "axis 1 is out of range for shape []");
        BAD(T, ad_unsqueeze(T, a, 3), "ad_unsqueeze", "axis 3 is out of range for a new axis beside shape [3,5]");
        BAD(T, ad_unsqueeze(T, a, -4), "ad_unsqueeze", "axis -4");
        BAD(T, ad_unsqueeze(T, a, INT_MIN), "ad_unsqueeze", "out of range");
        BAD(T, ad_unsqueeze(T, full, 0), "ad_unsqueeze", "[1,1,1,1,1,1,1,2] has 8 dimensions");
        xs[0] = a;
        xs[1] = b;
        xs[2] = a;
        BAD(T, ad_stack(T, xs, 2, 0), "ad_stack", "tensor 1 has shape [5,3], which differs from tensor 0's [3,5]");
        BAD(T, ad_stack(T, xs, 0, 0), "ad_stack", "no tensors");
        BAD(T, ad_stack(T, NULL, 2, 0), "ad_stack", "no tensors");
        xs[1] = a;
        BAD(T, ad_stack(T, xs, 3, 3), "ad_stack", "axis 3 is out of range");
        BAD(T, ad_stack(T, xs, 3, -4), "ad_stack", "axis -4");
        xs[1] = ad_ones(U, 2, s35);
        BAD(T, ad_stack(T, xs, 3, 0), "ad_stack", "tensor 1 belongs to another tape");
        xs[0] = full;
        BAD(T, ad_stack(T, xs, 1, 0), "ad_stack", "8 dimensions");
        xs[1] = NULL;
        xs[0] = a;
        PASSES_NULL(T, ad_stack(T, xs, 3, 0));
        PASSES_NULL(T, ad_squeeze(T, NULL, 0));
        PASSES_NULL(T, ad_unsqueeze(T, NULL, 0));
        BAD(T, ad_squeeze(T, ad_ones(U, 2, s35), 0), "ad_squeeze", "another tape");
        ad_tape_free(U);
    }
    ad_tape_free(T);
    th_family("squeeze, unsqueeze, stack");
}

/* ---- pad ---------------------------------------------------------------------------------- */
FN(f_pad, ad_mul(T, ad_pad(T, x[0], c->npads, c->pads, c->value), ad_sin(T, ad_pad(T, x[0], c->npads, c->pads, c->value))))

static op_ctx P(int npads, int p0, int p1, int p2, int p3, int p4, int p5)
{
    op_ctx c = C(0, 0);
    c.npads = npads;
    c.pads[0] = p0;
    c.pads[1] = p1;
    c.pads[2] = p2;
    c.pads[3] = p3;
    c.pads[4] = p4;
    c.pads[5] = p5;
    c.value = 0.25;
    return c;
}

static void test_pad(void)
{
    op_ctx cases[8];
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[128];
    size_t ci;
    int ncases = 0;
    cases[ncases++] = P(2, 1, 2, 0, 0, 0, 0);
    cases[ncases++] = P(4, 0, 3, 2, 1, 0, 0);
    cases[ncases++] = P(6, 1, 1, 0, 2, 3, 0);
    cases[ncases++] = P(2, -1, 2, 0, 0, 0, 0);   /* crop the first of the last axis */
    cases[ncases++] = P(4, -2, -1, 1, -1, 0, 0); /* crop both ends */
    cases[ncases++] = P(4, 3, -4, 0, 0, 0, 0);   /* shift right past the end */
    cases[ncases++] = P(0, 0, 0, 0, 0, 0, 0);
    cases[ncases++] = P(6, 0, 0, -2, 0, 1, 1);
    ad_rng_seed(&rng, 7);
    for (ci = 0; ci < (size_t)ncases; ci++) {
        const op_ctx *c = &cases[ci];
        ad_tensor *a = R(T, "3,4,5", -1, 1, &rng, 0), *y = ad_pad(T, a, c->npads, c->pads, c->value);
        int want[3] = {3, 4, 5}, before[3] = {0, 0, 0}, k, ok, idx[3] = {0, 0, 0};
        for (k = 0; k < c->npads / 2; k++) {
            before[2 - k] = c->pads[2 * k];
            want[2 - k] += c->pads[2 * k] + c->pads[2 * k + 1];
        }
        ok = y && y->ndim == 3 && y->shape[0] == want[0] && y->shape[1] == want[1] && y->shape[2] == want[2];
        if (ok) {
            size_t at = 0;
            do {
                int s0 = idx[0] - before[0], s1 = idx[1] - before[1], s2 = idx[2] - before[2];
                int inside = s0 >= 0 && s0 < 3 && s1 >= 0 && s1 < 4 && s2 >= 0 && s2 < 5;
                double v = inside ? a->data[(s0 * 4 + s1) * 5 + s2] : c->value;
                if (y->data[at++] != v) ok = 0;
            } while (next_index(3, y->shape, idx));
        }
        TH_CHECK(ok, "pad case %zu of [3,4,5]: shape or values", ci);
        snprintf(name, sizeof name, "pad [3,4,5] by (%d,%d,%d,%d,%d,%d)[:%d]", c->pads[0], c->pads[1], c->pads[2],
                 c->pads[3], c->pads[4], c->pads[5], c->npads);
        check1(name, f_pad, &cases[ci], S("3,4,5", -1, 1, 0));
    }
    {
        op_ctx c = P(2, 2, 1, 0, 0, 0, 0);
        int s2[] = {2};
        ad_tensor *s = ad_var(T, 2), *v = ad_pad(T, s, 0, NULL, 1), *y;
        check1("pad [7]", f_pad, &c, S("7", -1, 1, 0));
        TH_CHECK(v && v->ndim == 0 && v->data[0] == 2, "pad of a scalar by nothing");
        y = ad_pad(T, ad_ones(T, 1, s2), 2, c.pads, NAN);
        TH_CHECK(y && y->size == 5 && isnan(y->data[0]) && y->data[2] == 1 && isnan(y->data[4]), "pad with NaN");
    }
    {
        int s35[] = {3, 5}, odd[] = {1, 2, 3}, big[] = {INT_MAX, 1}, cut[] = {-3, -2}, minp[] = {INT_MIN, INT_MAX};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_pad(T, a, 3, odd, 0), "ad_pad", "shape [3,5]: 3 pad values");
        BAD(T, ad_pad(T, a, 6, odd, 0), "ad_pad", "up to 4");
        BAD(T, ad_pad(T, a, -2, odd, 0), "ad_pad", "-2 pad values");
        BAD(T, ad_pad(T, a, 2, NULL, 0), "ad_pad", "pads is NULL");
        BAD(T, ad_pad(T, a, 2, big, 0), "ad_pad", "dimension 1 2147483653 long");
        BAD(T, ad_pad(T, a, 2, cut, 0), "ad_pad", "pads (-3, -2) make dimension 1 0 long");
        BAD(T, ad_pad(T, a, 2, minp, 0), "ad_pad", "out of range");
        PASSES_NULL(T, ad_pad(T, NULL, 2, odd, 0));
    }
    ad_tape_free(T);
    th_family("pad");
}

/* ---- index_select, gather --------------------------------------------------------------- */
FN(f_index_select, ad_square(T, ad_index_select(T, ad_sin(T, x[0]), c->axis, c->index, c->n)))
FN(f_gather, ad_mul(T, ad_gather(T, x[0], c->axis, c->index, c->ndim, c->shape),
                    ad_gather(T, ad_cos(T, x[0]), c->axis, c->index, c->ndim, c->shape)))

static void test_index_gather(void)
{
    static const int sel[] = {2, 0, 2, 1, 2, 0, 3};
    static const int axes[] = {0, 1, 2, -1};
    static int gidx[4096];
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[128];
    size_t ai;
    int i;
    ad_rng_seed(&rng, 8);
    /* index_select against plain loops */
    for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++) {
        ad_tensor *a = R(T, "4,3,5", -1, 1, &rng, 0), *y;
        int ax = axes[ai] < 0 ? axes[ai] + 3 : axes[ai], n = 5, len = a->shape[ax], idx[3] = {0, 0, 0}, ok;
        int chosen[5];
        size_t at = 0;
        for (i = 0; i < n; i++) chosen[i] = sel[i] % len;
        y = ad_index_select(T, a, axes[ai], chosen, n);
        ok = y && y->ndim == 3 && y->shape[ax] == n;
        if (ok)
            do {
                int s[3];
                s[0] = idx[0];
                s[1] = idx[1];
                s[2] = idx[2];
                s[ax] = chosen[idx[ax]];
                if (y->data[at++] != a->data[(s[0] * 3 + s[1]) * 5 + s[2]]) ok = 0;
            } while (next_index(3, y->shape, idx));
        TH_CHECK(ok, "index_select [4,3,5] axis %d", axes[ai]);
        {
            op_ctx c = C(axes[ai], 0);
            c.index = chosen;
            c.n = n;
            snprintf(name, sizeof name, "index_select [4,3,5] axis %d (repeated indices)", axes[ai]);
            check1(name, f_index_select, &c, S("4,3,5", -1, 1, 0));
        }
    }
    /* gather: the index as large as a, and smaller than a along the other axes */
    {
        static const char *const ishapes[] = {"4,3,5", "2,3,4", "4,6,5", "1,2,3"};
        size_t k;
        for (ai = 0; ai < sizeof axes / sizeof axes[0]; ai++)
            for (k = 0; k < sizeof ishapes / sizeof ishapes[0]; k++) {
                ad_tensor *a = R(T, "4,3,5", -1, 1, &rng, 0), *y;
                th_input is = S(ishapes[k], 0, 0, 0);
                int ax = axes[ai] < 0 ? axes[ai] + 3 : axes[ai], idx[3] = {0, 0, 0}, ok, d, fits = 1;
                size_t at = 0, total = th_numel(&is);
                op_ctx c = C(axes[ai], 0);
                for (d = 0; d < 3; d++)
                    if (d != ax && is.shape[d] > a->shape[d]) fits = 0;
                if (!fits) continue;
                for (at = 0; at < total; at++) gidx[at] = (int)((at * 7 + 2) % (size_t)a->shape[ax]);
                y = ad_gather(T, a, axes[ai], gidx, 3, is.shape);
                ok = y && y->ndim == 3 && y->shape[0] == is.shape[0] && y->shape[1] == is.shape[1] &&
                     y->shape[2] == is.shape[2];
                at = 0;
                if (ok)
                    do {
                        int s[3];
                        s[0] = idx[0];
                        s[1] = idx[1];
                        s[2] = idx[2];
                        s[ax] = gidx[at];
                        if (y->data[at++] != a->data[(s[0] * 3 + s[1]) * 5 + s[2]]) ok = 0;
                    } while (next_index(3, y->shape, idx));
                TH_CHECK(ok, "gather [4,3,5] axis %d index [%s]", axes[ai], ishapes[k]);
                c.index = gidx;
                c.ndim = 3;
                memcpy(c.shape, is.shape, sizeof c.shape);
                snprintf(name, sizeof name, "gather [4,3,5] axis %d index [%s]", axes[ai], ishapes[k]);
                check1(name, f_gather, &c, S("4,3,5", -1, 1, 0));
            }
    }
    {
        int s1[] = {1}, one[] = {0};
        op_ctx c = C(0, 0);
        ad_tensor *v = ad_tensor_new(T, 1, s1, NULL, 1), *y;
        v->data[0] = 4;
        y = ad_gather(T, v, 0, one, 1, s1);
        TH_CHECK(y && y->data[0] == 4 && ad_index_select(T, v, -1, one, 1)->data[0] == 4, "one element");
        c.index = sel;
        c.n = 7;
        check1("index_select of a vector", f_index_select, &c, S("4", -1, 1, 0));
    }
    {
        int s35[] = {3, 5}, s45[] = {4, 5}, s36[] = {3, 6}, s3[] = {3}, bad[] = {0, 5, 1}, neg[] = {-1};
        int ok_idx[30] = {0};
        ad_tensor *a = ad_ones(T, 2, s35);
        BAD(T, ad_index_select(T, a, 2, bad, 1), "ad_index_select", "axis 2 is out of range for shape [3,5]");
        BAD(T, ad_index_select(T, a, 1, bad, 3), "ad_index_select", "shape [3,5], axis 1: index 5 (position 1) is outside 0..4");
        BAD(T, ad_index_select(T, a, 0, neg, 1), "ad_index_select", "index -1 (position 0) is outside 0..2");
        BAD(T, ad_index_select(T, a, 0, NULL, 1), "ad_index_select", "index is NULL");
        BAD(T, ad_index_select(T, a, 0, bad, 0), "ad_index_select", "n is 0");
        BAD(T, ad_gather(T, a, 0, ok_idx, 1, s3), "ad_gather", "a [3,5]: the index has 1 dimensions; it must have a's 2");
        BAD(T, ad_gather(T, a, 0, ok_idx, 2, NULL), "ad_gather", "shape is NULL");
        BAD(T, ad_gather(T, a, 0, ok_idx, 2, s36), "ad_gather", "a [3,5], index [3,6], axis 0: dimension 1 of the index is larger");
        BAD(T, ad_gather(T, a, 0, NULL, 2, s45), "ad_gather", "index is NULL");
        ok_idx[7] = 3;
        BAD(T, ad_gather(T, a, 0, ok_idx, 2, s45), "ad_gather", "index[7] = 3 is outside 0..2");
        ok_idx[7] = 0;
        BAD(T, ad_gather(T, a, -3, ok_idx, 2, s45), "ad_gather", "axis -3 is out of range");
        s45[0] = 0;
        BAD(T, ad_gather(T, a, 1, ok_idx, 2, s45), "ad_gather", "dimension 0 is 0");
        PASSES_NULL(T, ad_index_select(T, NULL, 0, bad, 1));
        PASSES_NULL(T, ad_gather(T, NULL, 0, ok_idx, 2, s35));
    }
    ad_tape_free(T);
    th_family("index_select, gather");
}

/* ---- where, masked_fill ------------------------------------------------------------------ */
FN(f_where, ad_where(T, mask_of(T, c->ndim, c->shape), x[0], x[1]))
FN(f_where_sq, ad_square(T, ad_where(T, mask_of(T, c->ndim, c->shape), ad_sin(T, x[0]), ad_mul(T, x[1], x[1]))))
FN(f_masked_fill, ad_square(T, ad_masked_fill(T, x[0], mask_of(T, c->ndim, c->shape), c->value)))

static void test_where(void)
{
    /* cond, a, b */
    static const char *const cases[][3] = {
        {"3,4,5", "3,4,5", "3,4,5"}, {"4,5", "3,1,5", "4,1"}, {"5", "3,1,5", "4,1"}, {"3,4,1", "4,5", ""},
        {"1", "3,1,5", "3,4,1"},     {"", "4", "4"},          {"3,1,1", "1,4,1", "1,1,5"},
    };
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    char name[128];
    size_t ci;
    ad_rng_seed(&rng, 9);
    for (ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        th_input cs = S(cases[ci][0], 0, 0, 0);
        ad_tensor *cond = mask_of(T, cs.ndim, cs.shape), *a = R(T, cases[ci][1], -1, 1, &rng, 0);
        ad_tensor *b = R(T, cases[ci][2], -1, 1, &rng, 0), *y = ad_where(T, cond, a, b);
        int nd = 0, shape[AD_MAX_DIMS], idx[AD_MAX_DIMS] = {0}, d, ok;
        size_t at = 0;
        const ad_tensor *all[3];
        all[0] = cond;
        all[1] = a;
        all[2] = b;
        for (d = 0; d < 3; d++)
            if (all[d]->ndim > nd) nd = all[d]->ndim;
        for (d = 0; d < nd; d++) {
            int k;
            shape[d] = 1;
            for (k = 0; k < 3; k++) {
                int off = nd - all[k]->ndim;
                if (d >= off && all[k]->shape[d - off] != 1) shape[d] = all[k]->shape[d - off];
            }
        }
        ok = y && y->ndim == nd;
        for (d = 0; ok && d < nd; d++) ok = y->shape[d] == shape[d];
        if (ok)
            do {
                double want = cond->data[bcast_at(cond, nd, idx)] != 0 ? a->data[bcast_at(a, nd, idx)]
                                                                         : b->data[bcast_at(b, nd, idx)];
                if (y->data[at++] != want) ok = 0;
            } while (nd > 0 && next_index(nd, shape, idx));
        TH_CHECK(ok, "where [%s] [%s] [%s]: shape or values", cases[ci][0], cases[ci][1], cases[ci][2]);
        {
            op_ctx c = C(0, 0);
            c.ndim = cs.ndim;
            memcpy(c.shape, cs.shape, sizeof c.shape);
            snprintf(name, sizeof name, "where [%s] [%s] [%s]", cases[ci][0], cases[ci][1], cases[ci][2]);
            check2(name, f_where, &c, S(cases[ci][1], -1, 1, 0), S(cases[ci][2], -1, 1, 0));
            snprintf(name, sizeof name, "where of sin and square [%s] [%s] [%s]", cases[ci][0], cases[ci][1],
                     cases[ci][2]);
            check2(name, f_where_sq, &c, S(cases[ci][1], -1, 1, 0), S(cases[ci][2], -1, 1, 0));
        }
    }
    /* a branch that is infinite where it is not chosen leaves the other's gradient finite */
    {
        double av[] = {1, 2, 3}, bv[] = {INFINITY, 5, -INFINITY}, cv[] = {1, 0, 1};
        int s3[] = {3};
        ad_tensor *a = ad_tensor_new(T, 1, s3, av, 1), *b = ad_tensor_new(T, 1, s3, bv, 1);
        ad_tensor *cond = ad_tensor_new(T, 1, s3, cv, 0), *y = ad_sum(T, ad_where(T, cond, a, b));
        TH_CHECK(y && ad_item(y) == 9 && ad_backward(T, y) == 0, "where with infinities: %s", th_errs(T));
        TH_CHECK(a->grad && b->grad && a->grad[0] == 1 && a->grad[1] == 0 && a->grad[2] == 1 && b->grad[0] == 0 &&
                     b->grad[1] == 1 && b->grad[2] == 0,
                 "where's gradients with infinite branches");
    }
    /* masked_fill against plain loops, the mask broadcast */
    {
        static const char *const masks[] = {"3,4,5", "5", "4,1", "1", "3,1,5"};
        for (ci = 0; ci < sizeof masks / sizeof masks[0]; ci++) {
            th_input ms = S(masks[ci], 0, 0, 0);
            ad_tensor *m = mask_of(T, ms.ndim, ms.shape), *a = R(T, "3,4,5", -1, 1, &rng, 0);
            ad_tensor *y = ad_masked_fill(T, a, m, -7.5);
            int idx[3] = {0, 0, 0}, ok = y && y->ndim == 3 && y->size == 60;
            size_t at = 0;
            op_ctx c = C(0, 0);
            if (ok)
                do {
                    double want = m->data[bcast_at(m, 3, idx)] != 0 ? -7.5 : a->data[at];
                    if (y->data[at++] != want) ok = 0;
                } while (next_index(3, y->shape, idx));
            TH_CHECK(ok, "masked_fill [3,4,5] with mask [%s]", masks[ci]);
            c.ndim = ms.ndim;
            memcpy(c.shape, ms.shape, sizeof c.shape);
            c.value = 0.6;
            snprintf(name, sizeof name, "masked_fill [3,4,5] mask [%s]", masks[ci]);
            check1(name, f_masked_fill, &c, S("3,4,5", -1, 1, 0));
        }
        {
            /* any non-zero value of the mask fills */
            double mv[] = {0, -2, 0.5, NAN};
            int s4[] = {4};
            ad_tensor *a = ad_zeros(T, 1, s4), *y = ad_masked_fill(T, a, ad_tensor_new(T, 1, s4, mv, 0), 3);
            TH_CHECK(y && y->data[0] == 0 && y->data[1] == 3 && y->data[2] == 3 && y->data[3] == 3,
                     "masked_fill with mask values -2, 0.5, NaN");
        }
    }
    {
        int s35[] = {3, 5}, s45[] = {4, 5}, s15[] = {1, 5}, s235[] = {2, 3, 5};
        ad_tensor *a = ad_ones(T, 2, s35), *b = ad_ones(T, 2, s45), *m = ad_ones(T, 2, s15);
        ad_tape *U = ad_tape_new();
        BAD(T, ad_where(T, m, a, b), "ad_where", "shapes [1,5] (cond), [3,5] and [4,5] cannot be broadcast");
        BAD(T, ad_where(T, b, m, a), "ad_where", "[4,5] (cond), [1,5] and [3,5]");
        BAD(T, ad_where(T, ad_ones(U, 2, s15), a, a), "ad_where", "cond belongs to another tape");
        BAD(T, ad_where(T, m, a, ad_ones(U, 2, s15)), "ad_where", "b belongs to another tape");
        BAD(T, ad_masked_fill(T, a, b, 0), "ad_masked_fill", "mask [4,5] cannot be broadcast to the input's shape [3,5]");
        BAD(T, ad_masked_fill(T, a, ad_ones(T, 3, s235), 0), "ad_masked_fill", "mask [2,3,5]");
        BAD(T, ad_masked_fill(T, a, ad_ones(U, 2, s15), 0), "ad_masked_fill", "mask belongs to another tape");
        PASSES_NULL(T, ad_where(T, NULL, a, a));
        PASSES_NULL(T, ad_where(T, m, NULL, a));
        PASSES_NULL(T, ad_where(T, m, a, NULL));
        PASSES_NULL(T, ad_masked_fill(T, NULL, m, 1));
        PASSES_NULL(T, ad_masked_fill(T, a, NULL, 1));
        ad_tape_free(U);
    }
    ad_tape_free(T);
    th_family("where, masked_fill");
}

/* ---- losses ------------------------------------------------------------------------------- */
static const int labels5[] = {3, 0, 2, 2, 1};
FN(f_nll, ad_nll_loss(T, x[0], c->index))
FN(f_nll_lsm, ad_nll_loss(T, ad_log_softmax(T, x[0], 1), c->index))
FN(f_l1, ad_l1_loss(T, x[0], x[1]))
FN(f_l1_sq, ad_l1_loss(T, ad_square(T, x[0]), x[1]))
FN(f_huber, ad_huber_loss(T, spread(T, x[0]), x[1], c->value))
FN(f_huber_sq, ad_huber_loss(T, ad_mul(T, spread(T, x[0]), spread(T, x[0])), ad_mul_scalar(T, x[1], 4), c->value))
FN(f_kl, ad_kl_div(T, x[0], x[1]))
FN(f_kl_soft, ad_kl_div(T, ad_log_softmax(T, x[0], -1), ad_softmax(T, x[1], -1)))

static void test_losses(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int i;
    size_t k;
    ad_rng_seed(&rng, 10);
    /* nll against plain loops, and of log_softmax against cross_entropy, values and gradients */
    {
        ad_tensor *x = R(T, "5,4", -2, 2, &rng, 1), *x2 = ad_tensor_new(T, 2, x->shape, x->data, 1);
        ad_tensor *n1 = ad_nll_loss(T, ad_log_softmax(T, x, 1), labels5), *n0 = ad_nll_loss(T, x, labels5);
        ad_tensor *ce = ad_cross_entropy(T, x2, labels5);
        double want = 0;
        for (i = 0; i < 5; i++) want -= x->data[i * 4 + labels5[i]];
        TH_CHECK(n0 && fabs(ad_item(n0) - want / 5) < 1e-15, "nll_loss: %g, want %g", ad_item(n0), want / 5);
        TH_CHECK(n1 && ce && fabs(ad_item(ce) - ad_item(n1)) < 1e-15, "nll of log_softmax %.17g, cross_entropy %.17g",
                 ad_item(n1), ad_item(ce));
        TH_CHECK(ad_backward(T, n1) == 0 && ad_backward(T, ce) == 0, "backward: %s", th_errs(T));
        for (k = 0; k < 20; k++)
            if (fabs(x2->grad[k] - x->grad[k]) > 1e-15) break;
        TH_CHECK(k == 20, "nll of log_softmax: gradient differs from cross_entropy's at %zu", k);
    }
    {
        op_ctx c = C(0, 0);
        c.index = labels5;
        check1("nll_loss [5,4]", f_nll, &c, S("5,4", -2, 2, 0));
        check1("nll_loss of log_softmax [5,4]", f_nll_lsm, &c, S("5,4", -2, 2, 0));
        check1("nll_loss [5,7]", f_nll_lsm, &c, S("5,7", -2, 2, 0));
    }
    /* l1, huber and kl against plain loops */
    {
        double p[] = {1, -2, 0.5, 3, 0, -0.25, 2, 2}, t[] = {0.5, 1, 0.5, -1, 0.1, 0, 0, 2.5};
        double kx[] = {-1, -2, -0.5, -3, -0.1, -0.7, -1.5, -4}, kt[] = {0.5, 0, 0.25, 0, 0.1, 0.05, 0, 0.1};
        int s24[] = {2, 4}, s8[] = {8};
        ad_tensor *pp = ad_tensor_new(T, 2, s24, p, 1), *tt = ad_tensor_new(T, 2, s24, t, 1), *y;
        ad_tensor *xk = ad_tensor_new(T, 2, s24, kx, 1), *tk = ad_tensor_new(T, 2, s24, kt, 1);
        double l1 = 0, hub = 0, kl = 0, delta = 1.5;
        for (i = 0; i < 8; i++) {
            double d = p[i] - t[i];
            l1 += fabs(d);
            hub += fabs(d) < delta ? 0.5 * d * d : delta * (fabs(d) - 0.5 * delta);
            if (kt[i] > 0) kl += kt[i] * (log(kt[i]) - kx[i]);
        }
        TH_CHECK(fabs(ad_item(ad_l1_loss(T, pp, tt)) - l1 / 8) < 1e-15, "l1_loss value");
        TH_CHECK(fabs(ad_item(ad_huber_loss(T, pp, tt, delta)) - hub / 8) < 1e-15, "huber_loss value");
        TH_CHECK(fabs(ad_item(ad_kl_div(T, xk, tk)) - kl / 2) < 1e-15, "kl_div value %g, want %g",
                 ad_item(ad_kl_div(T, xk, tk)), kl / 2);
        TH_CHECK(fabs(ad_item(ad_kl_div(T, ad_reshape(T, xk, 1, s8), ad_reshape(T, tk, 1, s8))) - kl / 8) < 1e-15,
                 "kl_div of vectors divides by their length");
        /* l1's gradient at pred == target is 0; kl's target gradient is 0 where the target is 0 */
        y = ad_add(T, ad_l1_loss(T, pp, tt), ad_kl_div(T, xk, tk));
        TH_CHECK(ad_backward(T, y) == 0, "backward: %s", th_errs(T));
        TH_CHECK(pp->grad[2] == 0 && tt->grad[2] == 0 && pp->grad[0] == 0.125 && tt->grad[1] == 0.125,
                 "l1_loss gradients: %g %g %g %g", pp->grad[2], tt->grad[2], pp->grad[0], tt->grad[1]);
        for (i = 0, k = 0; i < 8; i++) {
            double wx = -kt[i] / 2, wt = kt[i] == 0 ? 0 : (log(kt[i]) + 1 - kx[i]) / 2;
            if (fabs(xk->grad[i] - wx) > 1e-15 || fabs(tk->grad[i] - wt) > 1e-15) k++;
        }
        TH_CHECK(k == 0, "kl_div gradients with zero targets: %zu wrong", k);
        {
            /* the recorded derivative agrees where the target is 0, and its own derivative is finite */
            ad_tensor *gt = ad_grad(T, ad_kl_div(T, xk, tk), tk, 1), *h;
            TH_CHECK(gt && gt->data[1] == 0 && gt->data[3] == 0 && fabs(gt->data[0] - (log(0.5) + 2) / 2) < 1e-15,
                     "kl_div recorded target gradient");
            h = ad_grad(T, ad_sum(T, gt), tk, 0);
            TH_CHECK(h && h->data[1] == 0 && isfinite(h->data[3]) && fabs(h->data[0] - 1 / (0.5 * 2)) < 1e-15,
                     "kl_div second derivative at zero targets: %g %g", h ? h->data[1] : 0, h ? h->data[0] : 0);
        }
    }
    {
        op_ctx c = C(0, 0);
        check2("l1_loss [3,1,5]", f_l1, &c, S("3,1,5", -2, 2, 0.5), S("3,1,5", -0.2, 0.2, 0));
        check2("l1_loss of a square [4,3]", f_l1_sq, &c, S("4,3", -2, 2, 0.5), S("4,3", -0.2, 0.2, 0));
        c.value = 1;
        check2("huber_loss delta 1 [3,1,5]", f_huber, &c, S("3,1,5", -0.4, 0.4, 0), S("3,1,5", -0.05, 0.05, 0));
        check2("huber_loss delta 1, squares [6]", f_huber_sq, &c, S("6", -0.4, 0.4, 0), S("6", -0.05, 0.05, 0));
        c.value = 0.5;
        check2("huber_loss delta 0.5 [2,3,2]", f_huber, &c, S("2,3,2", -0.4, 0.4, 0), S("2,3,2", -0.05, 0.05, 0));
        c.value = 100;
        check2("huber_loss delta 100 [7]", f_huber_sq, &c, S("7", -0.4, 0.4, 0), S("7", -0.05, 0.05, 0));
        check2("kl_div [3,4]", f_kl, &c, S("3,4", -3, 0, 0), S("3,4", 0.1, 1, 0));
        check2("kl_div [3,1,5] of softmaxes", f_kl_soft, &c, S("3,1,5", -2, 2, 0), S("3,1,5", -2, 2, 0));
        check2("kl_div of scalars", f_kl, &c, S("", -3, 0, 0), S("", 0.1, 1, 0));
    }
    {
        int s35[] = {3, 5}, s53[] = {5, 3}, s3[] = {3}, lab_big[] = {0, 5, 1}, lab_neg[] = {0, 1, -1};
        ad_tensor *a = ad_ones(T, 2, s35), *b = ad_ones(T, 2, s53);
        ad_tape *U = ad_tape_new();
        BAD(T, ad_nll_loss(T, ad_ones(T, 1, s3), lab_big), "ad_nll_loss", "logp [3] must be [N, C]");
        BAD(T, ad_nll_loss(T, a, lab_big), "ad_nll_loss", "logp [3,5]: label 5 of row 1 is outside 0..4");
        BAD(T, ad_nll_loss(T, a, lab_neg), "ad_nll_loss", "label -1 of row 2");
        BAD(T, ad_nll_loss(T, a, NULL), "ad_nll_loss", "labels is NULL");
        BAD(T, ad_nll_loss(T, ad_ones(U, 2, s35), lab_big), "ad_nll_loss", "logp belongs to another tape");
        BAD(T, ad_l1_loss(T, a, b), "ad_l1_loss", "shapes [3,5] and [5,3] differ");
        BAD(T, ad_huber_loss(T, a, b, 1), "ad_huber_loss", "shapes [3,5] and [5,3] differ");
        BAD(T, ad_huber_loss(T, a, a, 0), "ad_huber_loss", "[3,5] and [3,5]: delta 0 must be positive");
        BAD(T, ad_huber_loss(T, a, a, -1), "ad_huber_loss", "delta -1");
        BAD(T, ad_huber_loss(T, a, a, NAN), "ad_huber_loss", "must be positive");
        BAD(T, ad_kl_div(T, a, b), "ad_kl_div", "shapes [3,5] and [5,3] differ");
        BAD(T, ad_kl_div(T, a, ad_ones(U, 2, s35)), "ad_kl_div", "another tape");
        PASSES_NULL(T, ad_nll_loss(T, NULL, lab_big));
        PASSES_NULL(T, ad_l1_loss(T, NULL, a));
        PASSES_NULL(T, ad_l1_loss(T, a, NULL));
        PASSES_NULL(T, ad_huber_loss(T, NULL, a, 1));
        PASSES_NULL(T, ad_huber_loss(T, a, NULL, -1));
        PASSES_NULL(T, ad_kl_div(T, NULL, a));
        PASSES_NULL(T, ad_kl_div(T, a, NULL));
        ad_tape_free(U);
    }
    ad_tape_free(T);
    th_family("nll_loss, l1_loss, huber_loss, kl_div");
}

/* ---- no-grad mode ------------------------------------------------------------------------ */
static void test_no_grad(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_tensor *x, *xs[2], *y[20];
    int lab[] = {0, 1, 2}, idx[] = {1, 0}, pads[] = {1, 1}, gshape[] = {3, 2}, gidx[6] = {0, 1, 2, 3, 4, 0};
    int i, n = 0, ok = 1;
    ad_rng_seed(&rng, 11);
    x = R(T, "3,5", 0.1, 1, &rng, 1);
    ad_set_grad_enabled(T, 0);
    xs[0] = xs[1] = x;
    y[n++] = ad_min(T, x);
    y[n++] = ad_min_axis(T, x, 1, 0);
    y[n++] = ad_logsumexp(T, x, 0, 1);
    y[n++] = ad_var_axis(T, x, 1, 1, 0);
    y[n++] = ad_std_axis(T, x, 0, 0, 0);
    y[n++] = ad_prod_axis(T, x, 1, 1);
    y[n++] = ad_cumsum(T, x, 0);
    y[n++] = ad_squeeze(T, ad_unsqueeze(T, x, 1), 1);
    y[n++] = ad_stack(T, xs, 2, 0);
    y[n++] = ad_pad(T, x, 2, pads, 0);
    y[n++] = ad_index_select(T, x, 1, idx, 2);
    y[n++] = ad_gather(T, x, 1, gidx, 2, gshape);
    y[n++] = ad_where(T, x, x, x);
    y[n++] = ad_masked_fill(T, x, x, 1);
    y[n++] = ad_nll_loss(T, x, lab);
    y[n++] = ad_l1_loss(T, x, x);
    y[n++] = ad_huber_loss(T, x, x, 1);
    y[n++] = ad_kl_div(T, x, x);
    for (i = 0; i < n; i++)
        if (!y[i] || y[i]->requires_grad) ok = 0;
    TH_CHECK(ok && ad_tape_length(T) == 0, "no-grad mode: %zu entries recorded, %s", ad_tape_length(T), th_errs(T));
    ad_tape_free(T);
    th_family("no-grad mode");
}

/* ---- threads: the same bits on one, two and three threads ---------------------------------- */
enum { SPLIT_ROWS = 1031, SPLIT_COLS = 263, SPLIT_OPS = 17 };
static int split_index[SPLIT_ROWS * 2];

static ad_tensor *split_op(ad_tape *T, int f, ad_tensor *x, ad_tensor *x2)
{
    static const int pads[] = {3, -2, 1, 2};
    int gshape[2];
    switch (f) {
    case 0: return ad_logsumexp(T, x, 1, 0);
    case 1: return ad_logsumexp(T, x, 0, 1);
    case 2: return ad_var_axis(T, x, 1, 1, 0);
    case 3: return ad_std_axis(T, x, 0, 0, 1);
    case 4: return ad_prod_axis(T, ad_add_scalar(T, ad_mul_scalar(T, x, (ad_real)0.05), 1), 1, 0);
    case 5: return ad_cumsum(T, x, 1);
    case 6: return ad_cumsum(T, x, 0);
    case 7: return ad_min_axis(T, x, 1, 0);
    case 8: return ad_min_axis(T, x, 0, 1);
    case 9: return ad_index_select(T, x, 0, split_index, SPLIT_ROWS);
    case 10: return ad_index_select(T, x, 1, split_index, SPLIT_COLS);
    case 11:
        gshape[0] = SPLIT_ROWS;
        gshape[1] = 2;
        return ad_gather(T, x, 1, split_index, 2, gshape);
    case 12: return ad_where(T, mask_of(T, x->ndim, x->shape), x, x2);
    case 13: return ad_pad(T, x, 4, pads, (ad_real)0.5);
    case 14: return ad_masked_fill(T, x2, mask_of(T, 1, &x->shape[1]), 2);
    case 15: return ad_var_axis(T, x, 0, 1, 0);
    default: return ad_prod_axis(T, ad_add_scalar(T, ad_mul_scalar(T, x, (ad_real)0.002), 1), 0, 1);
    }
}

/* f's values and the gradients of sum(f(x, x2) w) (+ sum((x + x2) w') first when reuse) on t
   threads, into y (zeros after f's values), dx and dx2 */
static int split_run(int t, int f, int reuse, ad_real *y, ad_real *dx, ad_real *dx2)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_tensor *x, *x2, *fx, *loss;
    size_t n = (size_t)SPLIT_ROWS * SPLIT_COLS;
    int ok;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 60 + (uint64_t)f);
    x = R(T, "1031,263", -2, 2, &rng, 1);
    x2 = R(T, "1031,263", -2, 2, &rng, 1);
    fx = split_op(T, f, x, x2);
    loss = fx ? ad_sum(T, ad_mul(T, fx, ad_rand(T, fx->ndim, fx->shape, -1, 1, &rng))) : NULL;
    if (reuse && loss) loss = ad_add(T, ad_sum(T, ad_mul(T, ad_add(T, x, x2), ad_rand(T, 2, x->shape, -1, 1, &rng))), loss);
    ok = loss && ad_backward(T, loss) == 0 && (x->grad || x2->grad) && fx->size <= 2 * n;
    if (ok) {
        memset(y, 0, 2 * n * sizeof(ad_real));
        memcpy(y, fx->data, fx->size * sizeof(ad_real));
        if (x->grad) memcpy(dx, x->grad, n * sizeof(ad_real));
        else memset(dx, 0, n * sizeof(ad_real));
        if (x2->grad) memcpy(dx2, x2->grad, n * sizeof(ad_real));
        else memset(dx2, 0, n * sizeof(ad_real));
    }
    if (!ok) printf("split_run %d on %d threads: %s\n", f, t, th_errs(T));
    ad_tape_free(T);
    return ok;
}

static void test_threads(void)
{
    size_t n = (size_t)SPLIT_ROWS * SPLIT_COLS, bytes = n * sizeof(ad_real);
    ad_real *one = (ad_real *)malloc(4 * bytes), *more = (ad_real *)malloc(4 * bytes);
    int f, t, reuse, i;
    for (i = 0; i < SPLIT_ROWS * 2; i++) split_index[i] = (i * 37 + 11) % SPLIT_COLS;
    for (f = 0; one && more && f < SPLIT_OPS; f++)
        for (reuse = 0; reuse <= 1; reuse++) {
            int ok1 = split_run(1, f, reuse, one, one + 2 * n, one + 3 * n);
            TH_CHECK(ok1, "op %d on one thread failed", f);
            for (t = 2; ok1 && t <= 3; t++) {
                int ok = split_run(t, f, reuse, more, more + 2 * n, more + 3 * n);
                TH_CHECK(ok && memcmp(more, one, 2 * bytes) == 0, "op %d on %d threads: values differ", f, t);
                TH_CHECK(ok && memcmp(more + 2 * n, one + 2 * n, 2 * bytes) == 0,
                         "op %d on %d threads (inputs used %s): gradients differ", f, t, reuse ? "twice" : "once");
            }
        }
    free(one);
    free(more);
    th_family("1, 2 and 3 threads");
}

int main(void)
{
    ad_rng_seed(&th_rng_state, 20261125);
    test_min_argmax();
    test_logsumexp();
    test_var_std();
    test_prod();
    test_cumsum();
    test_squeeze_stack();
    test_pad();
    test_index_gather();
    test_where();
    test_losses();
    test_no_grad();
    test_threads();
    return th_summary();
}
