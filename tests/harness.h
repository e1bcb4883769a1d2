/* A small test harness for autodiff.h's tests: checks that count, and gradient checks against
   central finite differences (build the tests with -DAUTODIFF_DOUBLE).

   A test program includes autodiff.h with its implementation, then this file, calls TH_CHECK and
   the th_gradcheck family, and returns th_summary(), which prints "N passed, N failed". */
#ifndef TESTS_HARNESS_H
#define TESTS_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define TH_UNUSED __attribute__((unused))
#else
#define TH_UNUSED
#endif

static int th_passed, th_failed;

/* Counts one check; prints the failing ones with their place and a message. */
#define TH_CHECK(cond, ...)                                                          \
    do {                                                                             \
        if (cond) {                                                                  \
            th_passed++;                                                             \
        } else {                                                                     \
            th_failed++;                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                              \
            printf(__VA_ARGS__);                                                     \
            printf("\n");                                                            \
        }                                                                            \
    } while (0)

/* Checks that the tape's error contains needle. */
#define TH_CHECK_ERROR(T, needle)                                                    \
    do {                                                                             \
        const char *th_msg = ad_tape_error(T);                                       \
        TH_CHECK(th_msg && strstr(th_msg, needle), "expected error containing \"%s\", got \"%s\"", \
                 needle, th_msg ? th_msg : "(none)");                                \
    } while (0)

/* Parameter stores (ad_params) keep their own error: the message, never NULL. */
#define th_params_error(P) (ad_params_error(P) ? ad_params_error(P) : "(none)")

/* Checks that the store's error contains needle, then clears it. */
#define TH_CHECK_PERROR(P, needle)                                                   \
    do {                                                                             \
        const char *th_pmsg = ad_params_error(P);                                    \
        TH_CHECK(th_pmsg && strstr(th_pmsg, needle),                                 \
                 "expected store error containing \"%s\", got \"%s\"", needle,      \
                 th_pmsg ? th_pmsg : "(none)");                                      \
        ad_params_clear_error(P);                                                    \
    } while (0)

TH_UNUSED static int th_summary(void)
{
    printf("%d passed, %d failed\n", th_passed, th_failed);
    return th_failed ? 1 : 0;
}

#ifdef AUTODIFF_DOUBLE
/* Gradient checks, in double precision only. */

/* One input of a function under test: its shape and how to fill it. Values are uniform in
   [lo, hi]; when away > 0 values with |x| < away are redrawn (keeps kinks of relu, abs, ...
   out of the finite differences). */
typedef struct th_input {
    int ndim;
    int shape[AD_MAX_DIMS];
    double lo, hi, away;
} th_input;

/* The function under test: builds its result from the inputs on T. */
typedef ad_tensor *(*th_fn)(ad_tape *T, ad_tensor **in, void *ctx);

#define TH_MAX_INPUTS 8

/* The inputs' generator; tests may reseed it. Never all zeros, which would repeat forever. */
TH_UNUSED static ad_rng th_rng_state = {{0x9E3779B97F4A7C15ull, 0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull, 1}};

TH_UNUSED static void th_fill(const th_input *spec, double *dst, size_t n, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) {
        double v;
        do v = spec->lo + (spec->hi - spec->lo) * ad_rng_uniform(rng);
        while (spec->away > 0 && fabs(v) < spec->away);
        dst[i] = v;
    }
}

TH_UNUSED static size_t th_numel(const th_input *spec)
{
    size_t n = 1;
    int i;
    for (i = 0; i < spec->ndim; i++) n *= (size_t)spec->shape[i];
    return n;
}

/* sum(w * f(x)) for fixed weights w (seeded), so every output element matters. */
TH_UNUSED static ad_tensor *th_weighted(ad_tape *T, th_fn f, void *ctx, ad_tensor **x, unsigned seed)
{
    ad_tensor *y = f(T, x, ctx), *w;
    ad_rng r;
    if (!y) return NULL;
    ad_rng_seed(&r, seed);
    w = ad_rand(T, y->ndim, y->shape, (ad_real)0.5, (ad_real)1.5, &r);
    return ad_sum(T, ad_mul(T, y, w));
}

TH_UNUSED static ad_tensor **th_leaves(ad_tape *T, int nin, const th_input *specs, double **data, ad_tensor **x)
{
    int i;
    for (i = 0; i < nin; i++) x[i] = ad_tensor_new(T, specs[i].ndim, specs[i].shape, data[i], 1);
    return x;
}

/* The value of the weighted sum at the given data, with nothing recorded. */
TH_UNUSED static double th_value(th_fn f, void *ctx, int nin, const th_input *specs, double **data, unsigned seed)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *x[TH_MAX_INPUTS], *y;
    double v;
    ad_set_grad_enabled(T, 0);
    y = th_weighted(T, f, ctx, th_leaves(T, nin, specs, data, x), seed);
    v = y ? ad_item(y) : NAN;
    ad_tape_free(T);
    return v;
}

TH_UNUSED static int th_close(double analytic, double numeric, double atol, double rtol)
{
    return fabs(analytic - numeric) <= atol + rtol * fabs(numeric);
}

/* Checks ad_backward's gradient of every input against central differences. Returns the number
   of mismatches (each also counted as a failed check). */
TH_UNUSED static int th_gradcheck_tol(const char *name, th_fn f, void *ctx, int nin, const th_input *specs,
                            double atol, double rtol)
{
    double *data[TH_MAX_INPUTS];
    ad_tensor *x[TH_MAX_INPUTS], *loss;
    ad_tape *T = ad_tape_new();
    unsigned seed = 1234;
    int i, bad = 0;
    size_t j;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    loss = th_weighted(T, f, ctx, th_leaves(T, nin, specs, data, x), seed);
    TH_CHECK(loss != NULL, "%s: forward failed: %s", name, ad_tape_error(T));
    if (loss && ad_backward(T, loss) == 0) {
        for (i = 0; i < nin && !bad; i++) {
            size_t n = th_numel(&specs[i]);
            for (j = 0; j < n; j++) {
                double keep = data[i][j], h = 1e-6 * (fabs(keep) > 1 ? fabs(keep) : 1), lp, lm, num, ana;
                data[i][j] = keep + h;
                lp = th_value(f, ctx, nin, specs, data, seed);
                data[i][j] = keep - h;
                lm = th_value(f, ctx, nin, specs, data, seed);
                data[i][j] = keep;
                num = (lp - lm) / (2 * h);
                ana = x[i]->grad ? x[i]->grad[j] : 0;
                if (!th_close(ana, num, atol, rtol)) {
                    if (!bad)
                        printf("FAIL %s: d/d input %d [%zu]: analytic %.10g, numeric %.10g\n", name, i, j,
                               ana, num);
                    bad++;
                }
            }
        }
    } else if (loss) {
        printf("FAIL %s: backward failed: %s\n", name, ad_tape_error(T));
        bad++;
    }
    if (bad) th_failed++;
    else th_passed++;
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
    return bad;
}

TH_UNUSED static int th_gradcheck(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    return th_gradcheck_tol(name, f, ctx, nin, specs, 1e-6, 1e-5);
}

/* s(x) = sum_i sum(v_i * dL/dx_i) for fixed random v: its gradient is a Hessian-vector product.
   With create_graph the result stays differentiable. */
TH_UNUSED static ad_tensor *th_grad_dot(ad_tape *T, th_fn f, void *ctx, int nin, ad_tensor **x, int create_graph)
{
    ad_tensor *loss = th_weighted(T, f, ctx, x, 1234), *s = NULL;
    ad_rng r;
    int i;
    if (!loss) return NULL;
    ad_rng_seed(&r, 99);
    for (i = 0; i < nin; i++) {
        ad_tensor *g = ad_grad(T, loss, x[i], create_graph);
        ad_tensor *v = ad_rand(T, x[i]->ndim, x[i]->shape, (ad_real)-1, (ad_real)1, &r);
        ad_tensor *term = ad_sum(T, ad_mul(T, g, v));
        s = s ? ad_add(T, s, term) : term;
    }
    return s;
}

/* Checks second derivatives: the gradient of th_grad_dot recorded with create_graph against
   central differences of th_grad_dot computed without it. */
TH_UNUSED static int th_gradgradcheck_tol(const char *name, th_fn f, void *ctx, int nin, const th_input *specs,
                                double atol, double rtol)
{
    double *data[TH_MAX_INPUTS];
    ad_tensor *x[TH_MAX_INPUTS], *s;
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    int i, bad = 0;
    size_t j;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    s = th_grad_dot(T, f, ctx, nin, th_leaves(T, nin, specs, data, x), 1);
    if (!s || ad_backward(T, s) != 0) {
        printf("FAIL %s: second-order sweep failed: %s\n", name, ad_tape_error(T));
        bad++;
    }
    for (i = 0; i < nin && !bad; i++) {
        size_t n = th_numel(&specs[i]);
        for (j = 0; j < n; j++) {
            double keep = data[i][j], h = 1e-5 * (fabs(keep) > 1 ? fabs(keep) : 1), sp, sm, num, ana;
            ad_tensor *xu[TH_MAX_INPUTS];
            data[i][j] = keep + h;
            ad_tape_reset(U);
            sp = ad_item(th_grad_dot(U, f, ctx, nin, th_leaves(U, nin, specs, data, xu), 0));
            data[i][j] = keep - h;
            ad_tape_reset(U);
            sm = ad_item(th_grad_dot(U, f, ctx, nin, th_leaves(U, nin, specs, data, xu), 0));
            data[i][j] = keep;
            num = (sp - sm) / (2 * h);
            ana = x[i]->grad ? x[i]->grad[j] : 0;
            if (!th_close(ana, num, atol, rtol)) {
                if (!bad)
                    printf("FAIL %s (second order): input %d [%zu]: analytic %.10g, numeric %.10g\n", name,
                           i, j, ana, num);
                bad++;
            }
        }
    }
    if (bad) th_failed++;
    else th_passed++;
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
    ad_tape_free(U);
    return bad;
}

TH_UNUSED static int th_gradgradcheck(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    return th_gradgradcheck_tol(name, f, ctx, nin, specs, 1e-5, 1e-4);
}

/* A spec in one expression: TH_IN2(3, 5, -1, 1) is a [3,5] input uniform in [-1, 1]. */
TH_UNUSED static th_input th_in(int ndim, const int *shape, double lo, double hi, double away)
{
    th_input s;
    int i;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (i = 0; i < ndim; i++) s.shape[i] = shape[i];
    s.lo = lo;
    s.hi = hi;
    s.away = away;
    return s;
}
#endif /* AUTODIFF_DOUBLE */

#endif
