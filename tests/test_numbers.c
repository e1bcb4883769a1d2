/* The lean tape for single numbers (ad_num, >>api:numbers).

   Every op: its value and its derivatives against the same op on one-element tensors (the same
   table row, so equal up to the order of a product's factors) and against central finite
   differences of its own values; points on both sides of every kink. Then routes (a number used
   many times, a long chain, a deep tree), several sweeps of one tape, growth of the tape after a
   sweep, places no route reaches (an infinite local derivative there adds no NaN), and misuse:
   numbers kept from before a reset, numbers of another tape, failed numbers carried on, bad
   bounds. Each family prints the number of its checks.
   Built in float (the default) and with AUTODIFF_DOUBLE; the finite differences and the
   comparisons to the last bit run in double precision. The allocator fills new blocks with a
   pattern, so that anything growth fails to copy shows. */
#include <stdlib.h>
#include <string.h>
static void *patterned_malloc(size_t n)
{
    void *p = malloc(n);
    if (p) memset(p, 0xA5, n);
    return p;
}
#define AUTODIFF_MALLOC(sz) patterned_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) realloc(p, sz)
#define AUTODIFF_FREE(p) free(p)
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "tests/harness.h"

#ifdef AUTODIFF_DOUBLE
#define SAME 1e-15      /* numbers against tensors: one formula, its factors rounded in another order */
#define SAME_VALUE 0.0  /* their values: the same bits */
#define EXACT 1e-14     /* against an analytic derivative */
#define LONG_CHAIN 1e-12 /* 15,000 numbers against a loop in double */
#else
#define SAME 4e-6       /* the tensors' vector functions are within 1.3 ulp of the C library's */
#define SAME_VALUE 4e-7
#define EXACT 2e-6
#define LONG_CHAIN 2e-3
#endif

/* Relative closeness with an absolute floor of tol for values near 0. */
static int close_to(double got, double want, double tol)
{
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want)) return got == want;
    return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

/* ---- unary ops ---------------------------------------------------------------------------- */
typedef struct unary_case {
    const char *name;
    ad_num (*num)(ad_tape *T, ad_num x, double p0, double p1);
    ad_tensor *(*tensor)(ad_tape *T, ad_tensor *x, double p0, double p1);
    double p0, p1;
    double points[6]; /* where it is smooth; NaN ends the list */
} unary_case;

#define UNARY0(name)                                                                                   \
    static ad_num num_##name(ad_tape *T, ad_num x, double p0, double p1)                               \
    {                                                                                                  \
        (void)p0;                                                                                      \
        (void)p1;                                                                                      \
        return ad_num_##name(T, x);                                                                    \
    }                                                                                                  \
    static ad_tensor *ten_##name(ad_tape *T, ad_tensor *x, double p0, double p1)                       \
    {                                                                                                  \
        (void)p0;                                                                                      \
        (void)p1;                                                                                      \
        return ad_##name(T, x);                                                                        \
    }
UNARY0(neg)
UNARY0(exp)
UNARY0(log)
UNARY0(sin)
UNARY0(cos)
UNARY0(tanh)
UNARY0(sigmoid)
UNARY0(relu)
UNARY0(gelu)
UNARY0(sqrt)
UNARY0(abs)
UNARY0(square)
UNARY0(log1p)
UNARY0(expm1)
UNARY0(softplus)
UNARY0(silu)
UNARY0(erf)
UNARY0(atan)
UNARY0(reciprocal)
UNARY0(rsqrt)
#undef UNARY0
static ad_num num_leaky_relu(ad_tape *T, ad_num x, double p0, double p1) { (void)p1; return ad_num_leaky_relu(T, x, p0); }
static ad_tensor *ten_leaky_relu(ad_tape *T, ad_tensor *x, double p0, double p1) { (void)p1; return ad_leaky_relu(T, x, p0); }
static ad_num num_pow(ad_tape *T, ad_num x, double p0, double p1) { (void)p1; return ad_num_pow(T, x, p0); }
static ad_tensor *ten_pow(ad_tape *T, ad_tensor *x, double p0, double p1) { (void)p1; return ad_pow(T, x, p0); }
static ad_num num_elu(ad_tape *T, ad_num x, double p0, double p1) { (void)p1; return ad_num_elu(T, x, p0); }
static ad_tensor *ten_elu(ad_tape *T, ad_tensor *x, double p0, double p1) { (void)p1; return ad_elu(T, x, p0); }
static ad_num num_clamp(ad_tape *T, ad_num x, double p0, double p1) { return ad_num_clamp(T, x, p0, p1); }
static ad_tensor *ten_clamp(ad_tape *T, ad_tensor *x, double p0, double p1) { return ad_clamp(T, x, p0, p1); }
static ad_num num_affine(ad_tape *T, ad_num x, double p0, double p1) { return ad_num_affine(T, x, p0, p1); }
static ad_tensor *ten_affine(ad_tape *T, ad_tensor *x, double p0, double p1) { return ad_affine(T, x, p0, p1); }

#define END NAN
static const unary_case unary_cases[] = {
    {"neg", num_neg, ten_neg, 0, 0, {-1.3, 0.4, 2.5, END}},
    {"exp", num_exp, ten_exp, 0, 0, {-2.1, 0.3, 1.7, END}},
    {"log", num_log, ten_log, 0, 0, {0.05, 0.9, 7.5, END}},
    {"sin", num_sin, ten_sin, 0, 0, {-2.5, 0.2, 4.0, END}},
    {"cos", num_cos, ten_cos, 0, 0, {-2.5, 0.2, 4.0, END}},
    {"tanh", num_tanh, ten_tanh, 0, 0, {-1.9, 0.1, 0.8, END}},
    {"sigmoid", num_sigmoid, ten_sigmoid, 0, 0, {-3.0, 0.25, 2.2, END}},
    {"relu", num_relu, ten_relu, 0, 0, {-1.5, 0.7, 3.0, END}},
    {"leaky_relu", num_leaky_relu, ten_leaky_relu, 0.07, 0, {-1.5, 0.7, END}},
    {"gelu", num_gelu, ten_gelu, 0, 0, {-2.2, -0.3, 0.6, 1.9, END}},
    {"sqrt", num_sqrt, ten_sqrt, 0, 0, {0.04, 1.3, 9.0, END}},
    {"abs", num_abs, ten_abs, 0, 0, {-2.0, 0.35, END}},
    {"square", num_square, ten_square, 0, 0, {-1.7, 0.2, 3.1, END}},
    {"pow", num_pow, ten_pow, 2.5, 0, {0.3, 1.1, 2.4, END}},
    {"pow (negative)", num_pow, ten_pow, -1.5, 0, {0.3, 1.1, 2.4, END}},
    {"clamp", num_clamp, ten_clamp, -0.5, 1.25, {-2.0, -0.1, 0.9, 3.0, END}},
    {"affine", num_affine, ten_affine, -1.75, 0.3, {-2.0, 0.5, END}},
    {"log1p", num_log1p, ten_log1p, 0, 0, {-0.6, 1e-4, 2.0, END}},
    {"expm1", num_expm1, ten_expm1, 0, 0, {-1.2, 1e-4, 0.9, END}},
    {"softplus", num_softplus, ten_softplus, 0, 0, {-25.0, -0.4, 0.6, 30.0, END}},
    {"silu", num_silu, ten_silu, 0, 0, {-2.5, 0.1, 1.6, END}},
    {"erf", num_erf, ten_erf, 0, 0, {-1.1, 0.05, 0.7, END}},
    {"atan", num_atan, ten_atan, 0, 0, {-3.0, 0.4, 1.2, END}},
    {"reciprocal", num_reciprocal, ten_reciprocal, 0, 0, {-2.5, 0.3, 4.0, END}},
    {"rsqrt", num_rsqrt, ten_rsqrt, 0, 0, {0.09, 1.0, 6.2, END}},
    {"elu", num_elu, ten_elu, 0.8, 0, {-1.3, 0.45, 2.0, END}},
};

TH_UNUSED static double unary_value(ad_tape *T, const unary_case *c, double x)
{
    ad_num y = c->num(T, ad_num_const(T, x), c->p0, c->p1);
    return y.value;
}

static void test_unary(void)
{
    ad_tape *T = ad_tape_new();
    size_t k;
    int j;
    for (k = 0; k < sizeof unary_cases / sizeof unary_cases[0]; k++) {
        const unary_case *c = &unary_cases[k];
        for (j = 0; j < 6 && !isnan(c->points[j]); j++) {
            double x0 = c->points[j], h = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1), fd, tensor_value, tensor_grad;
            ad_num x, y;
            ad_tensor *tx, *ty;
            ad_tape_reset(T);
            x = ad_num_var(T, x0);
            y = c->num(T, x, c->p0, c->p1);
            TH_CHECK(ad_num_ok(y) && ad_num_backward(T, y) == 0, "%s(%g): %s", c->name, x0, th_errs(T));
            tx = ad_var(T, x0);
            ty = c->tensor(T, tx, c->p0, c->p1);
            TH_CHECK(ty && ad_backward(T, ty) == 0, "%s(%g) on a tensor: %s", c->name, x0, th_errs(T));
            if (!ty) continue;
            tensor_value = ad_item(ty);
            tensor_grad = ad_grad_item(tx);
            TH_CHECK(close_to(y.value, tensor_value, SAME_VALUE), "%s(%g) = %.17g, on a tensor %.17g", c->name, x0,
                     (double)y.value, tensor_value);
            TH_CHECK(close_to(ad_num_grad(T, x), tensor_grad, SAME), "%s'(%g) = %.17g, on a tensor %.17g", c->name,
                     x0, (double)ad_num_grad(T, x), tensor_grad);
#ifdef AUTODIFF_DOUBLE
            fd = (unary_value(T, c, x0 + h) - unary_value(T, c, x0 - h)) / (2 * h);
            TH_CHECK(close_to(ad_num_grad(T, x), fd, 1e-6), "%s'(%g) = %.12g, central difference %.12g", c->name,
                     x0, ad_num_grad(T, x), fd);
#else
            (void)fd;
            (void)h;
#endif
        }
    }
    ad_tape_free(T);
    th_family("unary ops against tensors and differences");
}

/* ---- binary ops --------------------------------------------------------------------------- */
typedef struct binary_case {
    const char *name;
    ad_num (*num)(ad_tape *T, ad_num a, ad_num b);
    ad_tensor *(*tensor)(ad_tape *T, ad_tensor *a, ad_tensor *b);
    double a[4], b[4];
} binary_case;

static const binary_case binary_cases[] = {
    {"add", ad_num_add, ad_add, {-1.5, 0.25, 3.0, 0.7}, {2.0, -0.75, 0.5, 0.7}},
    {"sub", ad_num_sub, ad_sub, {-1.5, 0.25, 3.0, 0.7}, {2.0, -0.75, 0.5, 0.7}},
    {"mul", ad_num_mul, ad_mul, {-1.5, 0.25, 3.0, 0.7}, {2.0, -0.75, 0.5, 0.7}},
    {"div", ad_num_div, ad_div, {-1.5, 0.25, 3.0, 0.7}, {2.0, -0.75, 0.5, 0.7}},
    {"maximum", ad_num_maximum, ad_maximum, {-1.5, 0.25, 3.0, -0.2}, {2.0, -0.75, 0.5, 0.9}},
    {"minimum", ad_num_minimum, ad_minimum, {-1.5, 0.25, 3.0, -0.2}, {2.0, -0.75, 0.5, 0.9}},
    {"pow_num", ad_num_pow_num, ad_pow_tensor, {0.3, 1.25, 2.5, 0.8}, {2.0, -0.75, 0.5, 3.0}},
};

TH_UNUSED static double binary_value(ad_tape *T, const binary_case *c, double a, double b)
{
    return c->num(T, ad_num_const(T, a), ad_num_const(T, b)).value;
}

static void test_binary(void)
{
    ad_tape *T = ad_tape_new();
    size_t k;
    int j, side;
    ad_num a, b, y;
    ad_tensor *ta, *tb, *ty;
    ad_real ga, gb;
    for (k = 0; k < sizeof binary_cases / sizeof binary_cases[0]; k++) {
        const binary_case *c = &binary_cases[k];
        for (j = 0; j < 4; j++) {
            double a0 = c->a[j], b0 = c->b[j];
            ad_tape_reset(T);
            a = ad_num_var(T, a0);
            b = ad_num_var(T, b0);
            y = c->num(T, a, b);
            TH_CHECK(ad_num_ok(y) && ad_num_backward(T, y) == 0, "%s(%g, %g): %s", c->name, a0, b0, th_errs(T));
            ta = ad_var(T, a0);
            tb = ad_var(T, b0);
            ty = c->tensor(T, ta, tb);
            TH_CHECK(ty && ad_backward(T, ty) == 0, "%s(%g, %g) on tensors: %s", c->name, a0, b0, th_errs(T));
            if (!ty) continue;
            TH_CHECK(close_to(y.value, ad_item(ty), SAME_VALUE), "%s(%g, %g) = %.17g, on tensors %.17g", c->name,
                     a0, b0, (double)y.value, (double)ad_item(ty));
            TH_CHECK(close_to(ad_num_grad(T, a), ad_grad_item(ta), SAME) &&
                         close_to(ad_num_grad(T, b), ad_grad_item(tb), SAME),
                     "%s(%g, %g): gradients %.17g %.17g, on tensors %.17g %.17g", c->name, a0, b0,
                     (double)ad_num_grad(T, a), (double)ad_num_grad(T, b), (double)ad_grad_item(ta),
                     (double)ad_grad_item(tb));
#ifdef AUTODIFF_DOUBLE
            for (side = 0; side < 2; side++) {
                double h = 1e-6, fd, got = ad_num_grad(T, side ? b : a);
                if (side) fd = (binary_value(T, c, a0, b0 + h) - binary_value(T, c, a0, b0 - h)) / (2 * h);
                else fd = (binary_value(T, c, a0 + h, b0) - binary_value(T, c, a0 - h, b0)) / (2 * h);
                TH_CHECK(close_to(got, fd, 1e-6), "%s(%g, %g): d/d%c = %.12g, central difference %.12g", c->name, a0,
                         b0, side ? 'b' : 'a', got, fd);
            }
#else
            (void)side;
#endif
        }
        /* a constant on either side gives the derivative a number there gives the other side;
           one number on both sides gets both routes, also right after it is made (then the two
           meet in the register the sweep keeps for the place below) */
        ad_tape_reset(T);
        a = ad_num_var(T, c->a[1]);
        b = ad_num_var(T, c->b[1]);
        y = c->num(T, a, b);
        TH_CHECK(ad_num_backward(T, y) == 0, "%s: %s", c->name, th_errs(T));
        ga = ad_num_grad(T, a);
        gb = ad_num_grad(T, b);
        y = c->num(T, a, ad_num_const(T, c->b[1]));
        TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == ga, "%s with a constant b: %.17g, expected %.17g",
                 c->name, (double)ad_num_grad(T, a), (double)ga);
        y = c->num(T, ad_num_const(T, c->a[1]), b);
        TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, b) == gb, "%s with a constant a: %.17g, expected %.17g",
                 c->name, (double)ad_num_grad(T, b), (double)gb);
        for (j = 0; j < 2; j++) {
            ad_num x = j ? ad_num_var(T, c->b[1]) : b;
            tb = ad_var(T, c->b[1]);
            ty = c->tensor(T, tb, tb);
            y = c->num(T, x, x);
            TH_CHECK(ad_num_backward(T, y) == 0 && ty && ad_backward(T, ty) == 0 &&
                         close_to(ad_num_grad(T, x), ad_grad_item(tb), SAME),
                     "%s of one number on both sides%s: %.17g, on tensors %.17g", c->name, j ? ", just made" : "",
                     (double)ad_num_grad(T, x), ty ? (double)ad_grad_item(tb) : 0.0);
        }
    }
    ad_tape_free(T);
    th_family("binary ops against tensors and differences");
}

/* ---- routes ------------------------------------------------------------------------------- */
/* The tutorial's f(a, b) = (a/b - a) * (b/a + a + b) * (a - b): a and b each take five routes. */
static ad_num tutorial_f(ad_tape *T, ad_num a, ad_num b)
{
    ad_num left = ad_num_sub(T, ad_num_div(T, a, b), a);
    ad_num middle = ad_num_add(T, ad_num_add(T, ad_num_div(T, b, a), a), b);
    return ad_num_mul(T, ad_num_mul(T, left, middle), ad_num_sub(T, a, b));
}

/* A long chain with a side route at every step: x_{k+1} = 0.999 x_k + sin(v) x_k / (1 + v^2). */
#define CHAIN_STEPS 5000
static double chain_value(double v)
{
    double x = v;
    int k;
    for (k = 0; k < CHAIN_STEPS; k++) x = 0.999 * x + sin(v) * x / (1 + v * v);
    return x;
}

static void test_routes(void)
{
    ad_tape *T = ad_tape_new();
    double a0 = 1.5, b0 = 0.7, da, db, h = 1e-6;
    ad_num a, b, y, v, x, w;
    ad_tensor *ta, *tb, *ty, *tx;
    int k;
    /* the tutorial: analytic derivatives, and the tensor tape */
    a = ad_num_var(T, a0);
    b = ad_num_var(T, b0);
    y = tutorial_f(T, a, b);
    TH_CHECK(ad_num_backward(T, y) == 0, "f: %s", th_errs(T));
    {
        double l = a0 / b0 - a0, m = b0 / a0 + a0 + b0, r = a0 - b0;
        da = (1 / b0 - 1) * m * r + l * (-b0 / (a0 * a0) + 1) * r + l * m;
        db = (-a0 / (b0 * b0)) * m * r + l * (1 / a0 + 1) * r - l * m;
        TH_CHECK(close_to(y.value, l * m * r, EXACT), "f = %.17g, expected %.17g", (double)y.value, l * m * r);
    }
    TH_CHECK(close_to(ad_num_grad(T, a), da, EXACT) && close_to(ad_num_grad(T, b), db, EXACT),
             "f: gradients %.17g %.17g, analytic %.17g %.17g", (double)ad_num_grad(T, a), (double)ad_num_grad(T, b),
             da, db);
    ta = ad_var(T, a0);
    tb = ad_var(T, b0);
    ty = ad_mul(T, ad_mul(T, ad_sub(T, ad_div(T, ta, tb), ta), ad_add(T, ad_add(T, ad_div(T, tb, ta), ta), tb)),
                ad_sub(T, ta, tb));
    TH_CHECK(ty && ad_backward(T, ty) == 0 && ad_item(ty) == y.value &&
                 close_to(ad_num_grad(T, a), ad_grad_item(ta), SAME) &&
                 close_to(ad_num_grad(T, b), ad_grad_item(tb), SAME),
             "f on tensors: %.17g %.17g %.17g", ty ? ad_item(ty) : 0.0, ta->grad ? ad_grad_item(ta) : 0.0,
             tb->grad ? ad_grad_item(tb) : 0.0);
    TH_CHECK(ad_num_count(T) == 10, "f recorded %zu numbers, expected 2 + 8", ad_num_count(T));

    /* a long chain (15,001 numbers: the tape grows many times) */
    ad_tape_reset(T);
    v = ad_num_var(T, 0.3);
    x = v;
    w = ad_num_div(T, ad_num_sin(T, v), ad_num_add(T, ad_num_const(T, 1), ad_num_square(T, v)));
    for (k = 0; k < CHAIN_STEPS; k++)
        x = ad_num_add(T, ad_num_mul(T, ad_num_const(T, 0.999), x), ad_num_mul(T, w, x));
    TH_CHECK(ad_num_ok(x) && ad_num_backward(T, x) == 0, "chain: %s", th_errs(T));
    TH_CHECK(close_to(x.value, chain_value((double)(ad_real)0.3), LONG_CHAIN), "chain value %.17g, expected %.17g",
             (double)x.value, chain_value((double)(ad_real)0.3));
    da = (chain_value(0.3 + h) - chain_value(0.3 - h)) / (2 * h);
    TH_CHECK(close_to(ad_num_grad(T, v), da, LONG_CHAIN > 1e-6 ? LONG_CHAIN : 1e-6),
             "chain: gradient %.12g, central difference %.12g", (double)ad_num_grad(T, v), da);
    tx = ad_var(T, 0.3);
    ty = tx;
    {
        ad_tensor *tw = ad_div(T, ad_sin(T, tx), ad_add(T, ad_scalar(T, 1), ad_square(T, tx)));
        for (k = 0; k < CHAIN_STEPS; k++) ty = ad_add(T, ad_mul(T, ad_scalar(T, 0.999), ty), ad_mul(T, tw, ty));
    }
    TH_CHECK(ty && ad_backward(T, ty) == 0 && close_to(ad_num_grad(T, v), ad_grad_item(tx), LONG_CHAIN),
             "chain: gradient %.17g, on tensors %.17g", ad_num_grad(T, v), ty ? ad_grad_item(tx) : 0.0);

    /* a second sweep from a number in the middle, and numbers made after the sweep's y, on a
       new tape (whose room is still the first) */
    ad_tape_free(T);
    T = ad_tape_new();
    a = ad_num_var(T, 2);
    b = ad_num_var(T, 3);
    v = ad_num_var(T, 4); /* no route from y or x: its gradient reads +0 */
    x = ad_num_mul(T, a, b);
    y = ad_num_add(T, ad_num_square(T, x), a);
    TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 2 * 6 * 3 + 1 && ad_num_grad(T, b) == 2 * 6 * 2 &&
                 ad_num_grad(T, x) == 12 && ad_num_grad(T, y) == 1,
             "y = (ab)^2 + a: %g %g %g", ad_num_grad(T, a), ad_num_grad(T, b), ad_num_grad(T, x));
    TH_CHECK(ad_num_backward(T, x) == 0 && ad_num_grad(T, a) == 3 && ad_num_grad(T, b) == 2 && ad_num_grad(T, y) == 0,
             "x = ab after y: %g %g, y's %g", ad_num_grad(T, a), ad_num_grad(T, b), ad_num_grad(T, y));
    TH_CHECK(ad_num_grad(T, ad_num_const(T, 5)) == 0, "a constant has a gradient");
    /* the tape grows past its first room after a sweep: the sweep's gradients stay */
    for (k = 0; k < 500; k++) w = ad_num_sin(T, a);
    TH_CHECK(ad_num_grad(T, a) == 3 && ad_num_grad(T, b) == 2 && ad_num_grad(T, w) == 0 && ad_num_grad(T, v) == 0 &&
                 !signbit(ad_num_grad(T, v)),
             "gradients after the tape grew: %g %g %g %g", ad_num_grad(T, a), ad_num_grad(T, b), ad_num_grad(T, w),
             ad_num_grad(T, v));
    TH_CHECK(ad_num_backward(T, b) == 0 && ad_num_grad(T, b) == 1 && ad_num_grad(T, a) == 0,
             "y = b itself: %g %g", ad_num_grad(T, b), ad_num_grad(T, a));

    /* sweeps one after another: a place's first contribution in a sweep replaces what an
       earlier sweep left there, so neither the tape's growth before the first sweep (here at 64
       and 128 places) nor a sweep from a constant in between may let an earlier sweep's gradient
       be added to. d x / d a = -0, so a's gradient is -0 exactly when nothing else was */
    ad_tape_free(T);
    T = ad_tape_new();
    a = ad_num_var(T, 2);
    b = ad_num_var(T, 3);
    x = ad_num_mul(T, a, ad_num_const(T, -0.0));
    y = b;
    for (k = 0; k < 150; k++) y = ad_num_add(T, y, b);
    y = ad_num_add(T, y, x);
    w = b;
    for (k = 0; k < 300; k++) w = ad_num_add(T, w, b); /* places after y's, which its sweep leaves */
    w = ad_num_add(T, w, x);
    for (k = 0; k < 2; k++) {
        TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, b) == 151 && ad_num_grad(T, a) == 0 &&
                     signbit(ad_num_grad(T, a)),
                 "round %d, 151 b + a * -0: d/db %g, d/da %g", k, ad_num_grad(T, b), ad_num_grad(T, a));
        TH_CHECK(ad_num_backward(T, w) == 0 && ad_num_grad(T, b) == 301 && ad_num_grad(T, a) == 0 &&
                     signbit(ad_num_grad(T, a)),
                 "round %d, 301 b + a * -0: d/db %g, d/da %g", k, ad_num_grad(T, b), ad_num_grad(T, a));
        TH_CHECK(ad_num_backward(T, ad_num_const(T, 1)) == 0 && ad_num_grad(T, b) == 0,
                 "round %d, a constant's sweep: d/db %g", k, ad_num_grad(T, b));
    }

    /* a place no route from y reaches passes nothing on: log's infinite derivative at 0 there
       adds no NaN (as the tensors' sweep, and PyTorch, which never visits it) */
    ad_tape_reset(T);
    a = ad_num_var(T, 0);
    w = ad_num_log(T, a);
    y = ad_num_mul(T, a, ad_num_const(T, 2));
    TH_CHECK(isinf(w.value) && ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 2,
             "log(0) off the route: d y / d a = %g", ad_num_grad(T, a));
    /* a route that carries 0 does pass it on, as PyTorch does: 0 * inf is NaN */
    y = ad_num_mul(T, w, ad_num_const(T, 0));
    TH_CHECK(ad_num_backward(T, y) == 0 && isnan(ad_num_grad(T, a)), "0 * log(0): d/da = %g, expected NaN",
             ad_num_grad(T, a));
    /* a sign of zero that arrives by one route is kept */
    a = ad_num_var(T, 1);
    y = ad_num_mul(T, a, ad_num_const(T, -0.0));
    TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 0 && signbit(ad_num_grad(T, a)),
             "a * -0: d/da = %g, expected -0", ad_num_grad(T, a));
    ad_tape_free(T);
    th_family("routes, sweeps and growth");
}

/* ---- what records, and resets ---------------------------------------------------------------- */
static void test_recording(void)
{
    ad_tape *T = ad_tape_new();
    ad_num a, b, c, y;
    /* ops on constants give constants and record nothing, as tensors without gradients do */
    c = ad_num_exp(T, ad_num_add(T, ad_num_const(T, 1), ad_num_const(T, 2)));
    TH_CHECK(ad_num_ok(c) && close_to(c.value, exp(3.0), EXACT) && ad_num_count(T) == 0,
             "exp(1 + 2) on constants: %g, %zu recorded", (double)c.value, ad_num_count(T));
    TH_CHECK(ad_num_backward(T, c) == 0 && ad_num_grad(T, c) == 0, "the sweep of a constant");
    a = ad_num_var(T, 2);
    y = ad_num_mul(T, a, c);
    TH_CHECK(ad_num_count(T) == 2 && ad_num_backward(T, y) == 0 && close_to(ad_num_grad(T, a), exp(3.0), EXACT) &&
                 ad_num_grad(T, c) == 0,
             "a * exp(3): %zu recorded, d/da %g", ad_num_count(T), (double)ad_num_grad(T, a));
    /* no-grad mode: the ops compute and record nothing */
    ad_set_grad_enabled(T, 0);
    b = ad_num_sin(T, ad_num_mul(T, a, a));
    ad_set_grad_enabled(T, 1);
    TH_CHECK(ad_num_ok(b) && close_to(b.value, sin(4.0), EXACT) && ad_num_count(T) == 2,
             "no-grad mode: sin(a a) = %g, %zu recorded", (double)b.value, ad_num_count(T));
    y = ad_num_add(T, a, b);
    TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 1, "a + (a constant from no-grad mode): d/da = %g",
             (double)ad_num_grad(T, a));
    /* after a reset a number at a swept place reads 0 until the next sweep */
    ad_tape_reset(T);
    a = ad_num_var(T, 5);
    TH_CHECK(ad_num_grad(T, a) == 0 && ad_tape_error(T) == NULL, "before any sweep since the reset: %g",
             (double)ad_num_grad(T, a));
    /* the places start again from 1 past 2^31 ids; numbers work on, and 0 never becomes an id */
    T->nums.base = 0x80000000u - 3;
    a = ad_num_var(T, 1.5);
    y = ad_num_square(T, a);
    TH_CHECK(ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 3, "before the places wrap: %g", (double)ad_num_grad(T, a));
    ad_tape_reset(T);
    c = ad_num_const(T, 1);
    a = ad_num_var(T, 1.5);
    y = ad_num_mul(T, ad_num_square(T, a), c);
    TH_CHECK(T->nums.base == 1 && ad_num_ok(c) && ad_num_backward(T, y) == 0 && ad_num_grad(T, a) == 3,
             "after the places wrap: base %u, d/da %g", T->nums.base, (double)ad_num_grad(T, a));
    /* the sweeps' numbers wrap after 2^32 sweeps and start again from 1: the first sweep's
       marks must not read as the new one's, or log(0) off the route passes 0 * inf = NaN */
    ad_tape_free(T);
    T = ad_tape_new();
    a = ad_num_var(T, 0);
    b = ad_num_var(T, 2);
    c = ad_num_log(T, a);
    y = ad_num_sin(T, b);
    TH_CHECK(ad_num_backward(T, c) == 0 && T->nums.sweep == 1 && isinf(ad_num_grad(T, a)),
             "the first sweep, from log(0): number %u, d/da %g", T->nums.sweep, (double)ad_num_grad(T, a));
    T->nums.sweep = 0xffffffffu;
    TH_CHECK(ad_num_backward(T, y) == 0 && T->nums.sweep == 1 && ad_num_grad(T, a) == 0 && ad_num_grad(T, c) == 0 &&
                 close_to(ad_num_grad(T, b), cos(2.0), EXACT),
             "after the sweeps wrap: number %u, d/da %g, d/dlog %g, d/db %g", T->nums.sweep, (double)ad_num_grad(T, a),
             (double)ad_num_grad(T, c), (double)ad_num_grad(T, b));
    ad_tape_free(T);
    th_family("constants, no-grad mode, resets");
}

/* ---- misuse ------------------------------------------------------------------------------- */
static void test_misuse(void)
{
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    ad_num a, b, y, stale, other, bad;
    a = ad_num_var(T, 1);
    stale = ad_num_var(T, 2);
    other = ad_num_var(U, 3);
    ad_tape_reset(T);
    a = ad_num_var(T, 1);
    b = ad_num_var(T, 4); /* stale's place, taken again */
    y = ad_num_add(T, a, stale);
    TH_CHECK(!ad_num_ok(y) && isnan(y.value), "a number from before the reset was accepted");
    TH_CHECK_ERROR(T, "ad_num_add: b is not a number of this tape (made before its last reset");
    ad_tape_clear_error(T);
    y = ad_num_exp(T, stale);
    TH_CHECK_ERROR(T, "ad_num_exp: the input is not a number of this tape");
    ad_tape_clear_error(T);
    TH_CHECK(ad_num_backward(T, stale) == -1, "ad_num_backward of a stale number did not fail");
    TH_CHECK_ERROR(T, "ad_num_backward: y is not a number of this tape");
    ad_tape_clear_error(T);
    TH_CHECK(isnan(ad_num_grad(T, stale)), "the gradient of a stale number is not NaN");
    TH_CHECK_ERROR(T, "ad_num_grad: x is not a number of this tape");
    ad_tape_clear_error(T);
    y = ad_num_mul(T, other, a);
    TH_CHECK(!ad_num_ok(y), "a number of another tape was accepted");
    TH_CHECK_ERROR(T, "ad_num_mul: a is not a number of this tape");
    /* a failed number is carried on without a second message */
    ad_tape_clear_error(T);
    bad = ad_num_clamp(T, a, 2, 1);
    TH_CHECK(!ad_num_ok(bad), "clamp with lo > hi gave a number");
    TH_CHECK_ERROR(T, "ad_num_clamp: lower bound 2 is above upper bound 1");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_num_ok(ad_num_clamp(T, a, 0, (ad_real)NAN)), "clamp with a NaN bound gave a number");
    TH_CHECK_ERROR(T, "ad_num_clamp: lower bound 0 is above upper bound nan");
    ad_tape_clear_error(T);
    bad = ad_num_clamp(T, a, 2, 1);
    y = ad_num_sin(T, ad_num_add(T, a, bad));
    b = ad_num_mul(T, y, stale);
    TH_CHECK(!ad_num_ok(y) && !ad_num_ok(b) && ad_num_backward(T, b) == -1, "a failed number was not carried on");
    TH_CHECK_ERROR(T, "ad_num_clamp: lower bound 2 is above upper bound 1");
    /* a NULL tape */
    TH_CHECK(!ad_num_ok(ad_num_var(NULL, 1)) && !ad_num_ok(ad_num_add(NULL, a, a)) &&
                 !ad_num_ok(ad_num_const(NULL, 1)) && ad_num_backward(NULL, a) == -1 && isnan(ad_num_grad(NULL, a)) &&
                 ad_num_count(NULL) == 0,
             "a NULL tape");
    /* a NaN value is a number, not a failure */
    ad_tape_reset(T);
    a = ad_num_var(T, -1);
    y = ad_num_log(T, a);
    TH_CHECK(ad_num_ok(y) && isnan(y.value) && ad_tape_error(T) == NULL, "log(-1) is not an ok NaN");
    /* numbers and tensors on one tape, and a reset that forgets both */
    TH_CHECK(ad_num_count(T) == 2, "count %zu, expected 2", ad_num_count(T));
    ad_tape_reset(T);
    TH_CHECK(ad_num_count(T) == 0, "count %zu after a reset", ad_num_count(T));
    ad_tape_free(T);
    ad_tape_free(U);
    th_family("misuse");
}

int main(void)
{
    test_unary();
    test_binary();
    test_routes();
    test_recording();
    test_misuse();
    return th_summary();
}
