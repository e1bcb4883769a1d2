/* A small test harness for autodiff.h's tests: checks that count, and gradient checks against
   central finite differences (build the tests with -DAUTODIFF_DOUBLE).

   A test program includes autodiff.h with its implementation, then this file, calls TH_CHECK and
   the th_gradcheck family (a front to the library's ad_gradcheck), and returns th_summary(),
   which prints "N passed, N failed". */
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

/* The tape's error message, or "(none)", for a check's message. */
TH_UNUSED static const char *th_errs(const ad_tape *T)
{
    const char *e = ad_tape_error(T);
    return e ? e : "(none)";
}

/* Prints how many checks a family of tests made since the last family ended. */
TH_UNUSED static int th_family_start;
TH_UNUSED static void th_family(const char *name)
{
    printf("  %-40s %d checks\n", name, th_passed + th_failed - th_family_start);
    th_family_start = th_passed + th_failed;
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

/* th_fn called through the library's ad_fn. */
typedef struct th_adapter {
    th_fn f;
    void *ctx;
} th_adapter;

TH_UNUSED static ad_tensor *th_adapt(ad_tape *T, ad_tensor *const *in, void *ctx)
{
    const th_adapter *a = (const th_adapter *)ctx;
    return a->f(T, (ad_tensor **)in, a->ctx);
}

/* Checks f's derivatives with the library's checker, ad_gradcheck (>>api:gradcheck), at inputs
   drawn from specs: order 1 (ad_backward against central differences, step 1e-6 max(1, |x|))
   or 2 (the gradient of a Hessian-vector product through create_graph, step 1e-5 max(1, |x|)),
   within atol + rtol |numeric|. Counts one check; returns the number of mismatching elements
   (1 when the check could not run). */
TH_UNUSED static int th_check_order(const char *name, th_fn f, void *ctx, int nin, const th_input *specs,
                                    int order, double atol, double rtol)
{
    double *data[TH_MAX_INPUTS];
    ad_tensor *x[TH_MAX_INPUTS];
    ad_tape *T = ad_tape_new();
    ad_gradcheck_options opt;
    ad_gradcheck_result res;
    th_adapter a;
    int i, rc, bad;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    memset(&opt, 0, sizeof opt);
    opt.orders = order;
    opt.eps = 1e-6;
    opt.atol = atol;
    opt.rtol = rtol;
    opt.eps2 = 1e-5;
    opt.atol2 = atol;
    opt.rtol2 = rtol;
    a.f = f;
    a.ctx = ctx;
    rc = ad_gradcheck(T, th_adapt, &a, nin, th_leaves(T, nin, specs, data, x), &opt, &res);
    bad = rc < 0 ? 1 : (int)res.mismatches;
    if (rc < 0) printf("FAIL %s%s: %s\n", name, order == 2 ? " (second order)" : "", ad_tape_error(T));
    else if (rc > 0)
        printf("FAIL %s%s: %zu elements differ; worst: input %d [%zu]: analytic %.10g, numeric %.10g\n", name,
               order == 2 ? " (second order)" : "", res.mismatches, res.input, res.index, res.analytic,
               res.numeric);
    if (bad) th_failed++;
    else th_passed++;
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
    return bad;
}

/* First derivatives (ad_backward) of every input against central differences. */
TH_UNUSED static int th_gradcheck_tol(const char *name, th_fn f, void *ctx, int nin, const th_input *specs,
                                      double atol, double rtol)
{
    return th_check_order(name, f, ctx, nin, specs, 1, atol, rtol);
}

TH_UNUSED static int th_gradcheck(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    return th_gradcheck_tol(name, f, ctx, nin, specs, 1e-6, 1e-5);
}

/* Second derivatives: the gradient of sum_i sum(v_i * dL/dx_i), recorded with create_graph,
   against central differences of that sum computed by plain sweeps. */
TH_UNUSED static int th_gradgradcheck_tol(const char *name, th_fn f, void *ctx, int nin, const th_input *specs,
                                          double atol, double rtol)
{
    return th_check_order(name, f, ctx, nin, specs, 2, atol, rtol);
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
