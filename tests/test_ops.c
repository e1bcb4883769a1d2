/* Gradients and values of every differentiable op of autodiff.h's core.

   Each op is checked twice against central finite differences in double precision: its first
   derivative (th_gradcheck, through ad_backward) and its second derivative (th_gradgradcheck,
   through ad_grad with create_graph). Inputs stay in each op's smooth domain: kinks (relu, abs,
   clamp, max) are kept away from every input by construction, so no finite difference straddles
   one. The forwards are then compared with plain-C computations written here. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

/* The tape's error for a message: "(none)" when there is none. */
static int quick; /* TH_QUICK: the sanitizer run does the large cases once, not twice */

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

/* First and second derivatives of f. */
static void check(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    th_gradcheck(name, f, ctx, nin, specs);
    th_gradgradcheck(name, f, ctx, nin, specs);
}

static void check1(const char *name, th_fn f, void *ctx, th_input a) { check(name, f, ctx, 1, &a); }

static void check2(const char *name, th_fn f, void *ctx, th_input a, th_input b)
{
    th_input s[2];
    s[0] = a;
    s[1] = b;
    check(name, f, ctx, 2, s);
}

/* x + c with c cycling through -1.5, 0, 1.5 by element: for x in [-0.4, 0.4] the values fall
   in three groups, [-1.9, -1.1], [-0.4, 0.4] and [1.1, 1.9], so kinks placed at +-1 or between
   the groups are never within a finite-difference step of any value. */
static ad_tensor *spread(ad_tape *T, ad_tensor *x)
{
    ad_tensor *c = ad_zeros(T, x->ndim, x->shape);
    size_t i;
    for (i = 0; i < c->size; i++) c->data[i] = (double)((int)(i % 3) - 1) * 1.5;
    return ad_add(T, x, c);
}

/* x + c with all elements of c distinct and 0.5 apart: for x in [-0.2, 0.2] every maximum is
   unique by a margin. */
static ad_tensor *distinct(ad_tape *T, ad_tensor *x)
{
    ad_tensor *c = ad_zeros(T, x->ndim, x->shape);
    size_t i;
    for (i = 0; i < c->size; i++) c->data[i] = (double)((i * 37) % c->size) * 0.5;
    return ad_add(T, x, c);
}

#define FN(name, expr)                                                   \
    static ad_tensor *name(ad_tape *T, ad_tensor **x, void *ctx)         \
    {                                                                    \
        (void)ctx;                                                       \
        return (expr);                                                   \
    }

/* ---- elementwise ---------------------------------------------------------------------- */
FN(f_neg, ad_neg(T, x[0]))
FN(f_exp, ad_exp(T, x[0]))
FN(f_log, ad_log(T, x[0]))
FN(f_sin, ad_sin(T, x[0]))
FN(f_cos, ad_cos(T, x[0]))
FN(f_tanh, ad_tanh(T, x[0]))
FN(f_sigmoid, ad_sigmoid(T, x[0]))
FN(f_relu, ad_relu(T, x[0]))
FN(f_leaky_relu, ad_leaky_relu(T, x[0], 0.1))
FN(f_gelu, ad_gelu(T, x[0]))
FN(f_sqrt, ad_sqrt(T, x[0]))
FN(f_abs, ad_abs(T, x[0]))
FN(f_square, ad_square(T, x[0]))
FN(f_pow_frac, ad_pow(T, x[0], 2.5))
FN(f_pow_neg, ad_pow(T, x[0], -1.5))
FN(f_pow_int, ad_pow(T, x[0], 3))
FN(f_clamp, ad_clamp(T, spread(T, x[0]), -1, 1))
FN(f_clamp_lo, ad_clamp(T, x[0], 0, 5))
FN(f_clamp_hi, ad_clamp(T, x[0], -5, 0))
FN(f_affine, ad_affine(T, x[0], 2.5, -0.7))
FN(f_add_scalar, ad_add_scalar(T, x[0], 0.3))
FN(f_sub_scalar, ad_sub_scalar(T, x[0], 0.3))
FN(f_rsub_scalar, ad_rsub_scalar(T, 0.3, x[0]))
FN(f_mul_scalar, ad_mul_scalar(T, x[0], -1.7))
FN(f_div_scalar, ad_div_scalar(T, x[0], 3))
FN(f_maximum_scalar, ad_maximum_scalar(T, spread(T, x[0]), 1))
FN(f_minimum_scalar, ad_minimum_scalar(T, spread(T, x[0]), -1))
FN(f_log1p, ad_log1p(T, x[0]))
FN(f_expm1, ad_expm1(T, x[0]))
FN(f_softplus, ad_softplus(T, x[0]))
FN(f_silu, ad_silu(T, x[0]))
FN(f_erf, ad_erf(T, x[0]))
FN(f_atan, ad_atan(T, x[0]))
FN(f_reciprocal, ad_reciprocal(T, x[0]))
FN(f_rsqrt, ad_rsqrt(T, x[0]))
FN(f_elu, ad_elu(T, x[0], 1))
FN(f_elu_alpha, ad_elu(T, x[0], 0.3))
/* nonlinear compositions, so that second derivatives of the piecewise ops meet curvature */
FN(f_relu_sq, ad_square(T, ad_relu(T, x[0])))
FN(f_abs_exp, ad_exp(T, ad_abs(T, x[0])))
FN(f_clamp_sq, ad_mul(T, ad_clamp(T, spread(T, x[0]), -1, 1), x[0]))
/* Gradients passed on unchanged (by sums and shifts) share a buffer: x's first contribution is
   the buffer that x * x still reads. */
static ad_tensor *f_shift_shared(ad_tape *T, ad_tensor **x, void *ctx)
{
    ad_tensor *square = ad_mul(T, x[0], x[0]), *shifted = ad_add_scalar(T, x[0], 0.3);
    (void)ctx;
    return ad_add(T, square, shifted);
}

static void test_elementwise(void)
{
    th_input x = S("3,5,7", -2, 2, 0), kink = S("3,5,7", -2, 2, 0.05), pos = S("3,5,7", 0.2, 3, 0);
    th_input grouped = S("3,5,7", -0.4, 0.4, 0);
    check1("neg", f_neg, NULL, x);
    check1("exp", f_exp, NULL, x);
    check1("log", f_log, NULL, pos);
    check1("sin", f_sin, NULL, S("3,5,7", -3, 3, 0));
    check1("cos", f_cos, NULL, S("3,5,7", -3, 3, 0));
    check1("tanh", f_tanh, NULL, S("3,5,7", -3, 3, 0));
    check1("sigmoid", f_sigmoid, NULL, S("3,5,7", -6, 6, 0));
    check1("relu", f_relu, NULL, kink);
    check1("leaky_relu", f_leaky_relu, NULL, kink);
    check1("gelu", f_gelu, NULL, S("3,5,7", -3, 3, 0));
    check1("sqrt", f_sqrt, NULL, pos);
    check1("abs", f_abs, NULL, kink);
    check1("square", f_square, NULL, x);
    check1("pow 2.5", f_pow_frac, NULL, pos);
    check1("pow -1.5", f_pow_neg, NULL, S("3,5,7", 0.3, 2, 0));
    check1("pow 3", f_pow_int, NULL, x);
    check1("clamp [-1,1]", f_clamp, NULL, grouped);
    check1("clamp [0,5]", f_clamp_lo, NULL, kink);
    check1("clamp [-5,0]", f_clamp_hi, NULL, kink);
    check1("affine", f_affine, NULL, x);
    check1("add_scalar", f_add_scalar, NULL, x);
    check1("sub_scalar", f_sub_scalar, NULL, x);
    check1("rsub_scalar", f_rsub_scalar, NULL, x);
    check1("mul_scalar", f_mul_scalar, NULL, x);
    check1("div_scalar", f_div_scalar, NULL, x);
    check1("maximum_scalar", f_maximum_scalar, NULL, grouped);
    check1("minimum_scalar", f_minimum_scalar, NULL, grouped);
    check1("log1p", f_log1p, NULL, S("3,5,7", -0.7, 3, 0));
    check1("expm1", f_expm1, NULL, x);
    check1("softplus", f_softplus, NULL, S("3,5,7", -6, 6, 0));
    check1("silu", f_silu, NULL, S("3,5,7", -5, 5, 0));
    check1("erf", f_erf, NULL, S("3,5,7", -2.5, 2.5, 0));
    check1("atan", f_atan, NULL, S("3,5,7", -3, 3, 0));
    check1("reciprocal", f_reciprocal, NULL, S("3,5,7", 0.3, 2, 0));
    check1("reciprocal of negatives", f_reciprocal, NULL, S("3,5,7", -2, -0.3, 0));
    check1("rsqrt", f_rsqrt, NULL, pos);
    check1("elu", f_elu, NULL, kink);
    check1("elu alpha 0.3", f_elu_alpha, NULL, kink);
    check1("relu then square", f_relu_sq, NULL, kink);
    check1("abs then exp", f_abs_exp, NULL, kink);
    check1("clamp times x", f_clamp_sq, NULL, grouped);
    check1("shared gradient", f_shift_shared, NULL, x);
    /* one element: the backward of a scalar tape's entries, for each kind of loop */
    check1("exp of a scalar", f_exp, NULL, S("", -1, 1, 0));
    check1("tanh of [1]", f_tanh, NULL, S("1", -1, 1, 0));
    check1("sigmoid of a scalar", f_sigmoid, NULL, S("", -3, 3, 0));
    check1("relu of a scalar", f_relu_sq, NULL, S("", -2, 2, 0.05));
    check1("square of a scalar", f_square, NULL, S("", -2, 2, 0));
    check1("affine of a scalar", f_affine, NULL, S("", -2, 2, 0));
    check1("log of a scalar", f_log, NULL, S("", 0.2, 3, 0));
    check1("silu of a scalar", f_silu, NULL, S("", -2, 2, 0));
    check1("elu of a scalar", f_elu, NULL, S("", -2, 2, 0.05));
    check1("shared gradient, a scalar", f_shift_shared, NULL, S("", -2, 2, 0));
    check1("sin of a scalar", f_sin, NULL, S("", -3, 3, 0));
    check1("gelu of [1]", f_gelu, NULL, S("1", -3, 3, 0));
    check1("pow 2.5 of a scalar", f_pow_frac, NULL, S("", 0.2, 3, 0));
    check1("clamp of a scalar", f_clamp_sq, NULL, S("", -0.4, 0.4, 0));
}

/* ---- binary, with broadcasting ---------------------------------------------------------- */
FN(f_add, ad_add(T, x[0], x[1]))
FN(f_sub, ad_sub(T, x[0], x[1]))
FN(f_mul, ad_mul(T, x[0], x[1]))
FN(f_div, ad_div(T, x[0], x[1]))
/* x[0] in [-0.9, -0.5] u [0.5, 0.9] never meets the groups of spread(x[1]) */
FN(f_maximum, ad_maximum(T, x[0], spread(T, x[1])))
FN(f_minimum, ad_minimum(T, x[0], spread(T, x[1])))
FN(f_maximum_rev, ad_maximum(T, spread(T, x[1]), x[0]))
FN(f_minimum_rev, ad_minimum(T, spread(T, x[1]), x[0]))
FN(f_maximum_sq, ad_square(T, ad_maximum(T, x[0], spread(T, x[1]))))
FN(f_pow_tensor, ad_pow_tensor(T, x[0], x[1]))

static void test_binary(void)
{
    static const char *const pairs[][2] = {
        {"3,5,7", "3,5,7"}, {"3,5,7", "5,1"}, {"5,1", "3,5,7"}, {"3,5,7", "1,7"}, {"1,7", "3,5,7"},
        {"3,5,7", ""},      {"", "3,5,7"},   {"3,1,7", "5,1"}, {"5,1", "3,1,7"}, {"1,5,1", "3,1,7"},
        {"", ""},           {"7", "3,5,1"},
    };
    char name[96];
    size_t i;
    for (i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *a = pairs[i][0], *b = pairs[i][1];
        th_input sa = S(a, -2, 2, 0), sb = S(b, -2, 2, 0), den = S(b, 0.5, 2, 0);
        th_input sep = S(a, -0.9, 0.9, 0.5), grouped = S(b, -0.4, 0.4, 0), base = S(a, 0.3, 2, 0);
        snprintf(name, sizeof name, "add [%s] [%s]", a, b);
        check2(name, f_add, NULL, sa, sb);
        snprintf(name, sizeof name, "sub [%s] [%s]", a, b);
        check2(name, f_sub, NULL, sa, sb);
        snprintf(name, sizeof name, "mul [%s] [%s]", a, b);
        check2(name, f_mul, NULL, sa, sb);
        snprintf(name, sizeof name, "div [%s] [%s]", a, b);
        check2(name, f_div, NULL, sa, den);
        snprintf(name, sizeof name, "maximum [%s] [%s]", a, b);
        check2(name, f_maximum, NULL, sep, grouped);
        snprintf(name, sizeof name, "minimum [%s] [%s]", a, b);
        check2(name, f_minimum, NULL, sep, grouped);
        snprintf(name, sizeof name, "maximum reversed [%s] [%s]", a, b);
        check2(name, f_maximum_rev, NULL, sep, grouped);
        snprintf(name, sizeof name, "minimum reversed [%s] [%s]", a, b);
        check2(name, f_minimum_rev, NULL, sep, grouped);
        snprintf(name, sizeof name, "maximum squared [%s] [%s]", a, b);
        check2(name, f_maximum_sq, NULL, sep, grouped);
        snprintf(name, sizeof name, "pow_tensor [%s] [%s]", a, b);
        check2(name, f_pow_tensor, NULL, base, sb);
    }
}

/* ---- reductions ------------------------------------------------------------------------- */
typedef struct axis_ctx { int axis, keepdim; } axis_ctx;

FN(f_sum, ad_sum(T, x[0]))
FN(f_mean, ad_mean(T, x[0]))
FN(f_max, ad_max(T, distinct(T, x[0])))
FN(f_sum_sq, ad_square(T, ad_sum(T, x[0])))
FN(f_max_sq, ad_square(T, ad_max(T, distinct(T, x[0]))))

static ad_tensor *f_sum_axis(ad_tape *T, ad_tensor **x, void *ctx)
{
    const axis_ctx *c = (const axis_ctx *)ctx;
    return ad_square(T, ad_sum_axis(T, x[0], c->axis, c->keepdim));
}
static ad_tensor *f_mean_axis(ad_tape *T, ad_tensor **x, void *ctx)
{
    const axis_ctx *c = (const axis_ctx *)ctx;
    return ad_square(T, ad_mean_axis(T, x[0], c->axis, c->keepdim));
}
static ad_tensor *f_max_axis(ad_tape *T, ad_tensor **x, void *ctx)
{
    const axis_ctx *c = (const axis_ctx *)ctx;
    return ad_square(T, ad_max_axis(T, distinct(T, x[0]), c->axis, c->keepdim));
}
static ad_tensor *f_max_axis_plain(ad_tape *T, ad_tensor **x, void *ctx)
{
    const axis_ctx *c = (const axis_ctx *)ctx;
    return ad_max_axis(T, distinct(T, x[0]), c->axis, c->keepdim);
}

static void test_reduce(void)
{
    static const int axes[] = {0, 1, 2, -1, -2, -3};
    th_input x = S("3,5,7", -1, 1, 0), small = S("3,5,7", -0.2, 0.2, 0);
    char name[96];
    size_t i;
    int keep;
    check1("sum", f_sum, NULL, x);
    check1("mean", f_mean, NULL, x);
    check1("max", f_max, NULL, small);
    check1("sum squared", f_sum_sq, NULL, x);
    check1("max squared", f_max_sq, NULL, small);
    check1("sum of a scalar", f_sum_sq, NULL, S("", -1, 1, 0));
    for (i = 0; i < sizeof axes / sizeof axes[0]; i++)
        for (keep = 0; keep <= 1; keep++) {
            axis_ctx c;
            c.axis = axes[i];
            c.keepdim = keep;
            snprintf(name, sizeof name, "sum_axis %d keepdim %d", c.axis, keep);
            check1(name, f_sum_axis, &c, x);
            snprintf(name, sizeof name, "mean_axis %d keepdim %d", c.axis, keep);
            check1(name, f_mean_axis, &c, x);
            snprintf(name, sizeof name, "max_axis %d keepdim %d", c.axis, keep);
            check1(name, f_max_axis, &c, small);
            snprintf(name, sizeof name, "max_axis %d keepdim %d (linear)", c.axis, keep);
            check1(name, f_max_axis_plain, &c, small);
        }
    {
        axis_ctx c;
        c.axis = 1;
        c.keepdim = 0;
        check1("sum_axis over a size-1 axis", f_sum_axis, &c, S("4,1,3", -1, 1, 0));
        check1("mean_axis over a size-1 axis", f_mean_axis, &c, S("4,1,3", -1, 1, 0));
        c.axis = 0;
        check1("sum_axis of a vector", f_sum_axis, &c, S("6", -1, 1, 0));
    }
}

/* ---- shape ops -------------------------------------------------------------------------- */
typedef struct shape_ctx {
    int ndim, shape[AD_MAX_DIMS];
    int axis, start, end;
} shape_ctx;

static shape_ctx SC(const char *dims)
{
    shape_ctx c;
    th_input s = S(dims, 0, 0, 0);
    memset(&c, 0, sizeof c);
    c.ndim = s.ndim;
    memcpy(c.shape, s.shape, sizeof c.shape);
    return c;
}

/* the shape ops are linear; a square after them gives the second-order check something */
static ad_tensor *f_reshape(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_square(T, ad_reshape(T, ad_sin(T, x[0]), c->ndim, c->shape));
}
FN(f_flatten, ad_square(T, ad_flatten(T, x[0])))
static ad_tensor *f_transpose(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_mul(T, ad_transpose(T, x[0], c->start, c->end), ad_transpose(T, ad_sin(T, x[0]), c->start, c->end));
}
static ad_tensor *f_permute(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_square(T, ad_permute(T, x[0], c->shape));
}
static ad_tensor *f_concat(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    ad_tensor *y = ad_concat(T, x, 3, c->axis);
    return ad_mul(T, y, ad_sin(T, y));
}
static ad_tensor *f_slice(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_square(T, ad_slice(T, x[0], c->axis, c->start, c->end));
}
static ad_tensor *f_broadcast_to(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_square(T, ad_broadcast_to(T, x[0], c->ndim, c->shape));
}
static ad_tensor *f_sum_to(ad_tape *T, ad_tensor **x, void *ctx)
{
    const shape_ctx *c = (const shape_ctx *)ctx;
    return ad_square(T, ad_sum_to(T, x[0], c->ndim, c->shape));
}

static void test_shape(void)
{
    static const char *const reshapes[] = {"5,-1", "7,15", "105", "1,3,35", "-1", "3,1,5,7", "-1,5,1"};
    static const char *const sums[] = {"5,1", "1,7", "", "3,1,7", "7", "1,5,7", "3,5,7", "1"};
    static const int slices[][3] = {{1, -4, -1}, {-1, 2, 7}, {0, 1, 2}, {2, -7, -6}, {0, -3, 3}};
    th_input x = S("3,5,7", -1, 1, 0), cin[3];
    char name[96];
    size_t i;
    shape_ctx c;
    for (i = 0; i < sizeof reshapes / sizeof reshapes[0]; i++) {
        c = SC(reshapes[i]);
        snprintf(name, sizeof name, "reshape [3,5,7] to [%s]", reshapes[i]);
        check1(name, f_reshape, &c, x);
    }
    c = SC("1,1");
    check1("reshape [] to [1,1]", f_reshape, &c, S("", -1, 1, 0));
    check1("flatten [3,5,7]", f_flatten, NULL, x);
    check1("flatten [2,3,2,2]", f_flatten, NULL, S("2,3,2,2", -1, 1, 0));
    c = SC("");
    c.start = 0; c.end = 2;
    check1("transpose 0 2", f_transpose, &c, x);
    c.start = -1; c.end = -2;
    check1("transpose -1 -2", f_transpose, &c, x);
    c.start = 1; c.end = 1;
    check1("transpose 1 1", f_transpose, &c, x);
    c = SC("2,0,1");
    check1("permute [3,5,7] (2,0,1)", f_permute, &c, x);
    c = SC("1,2,0");
    check1("permute [3,5,7] (1,2,0)", f_permute, &c, x);
    c = SC("3,1,0,2");
    check1("permute [2,3,4,5] (3,1,0,2)", f_permute, &c, S("2,3,4,5", -1, 1, 0));
    c = SC("0,2,3,1");
    check1("permute [2,3,4,5] (0,2,3,1)", f_permute, &c, S("2,3,4,5", -1, 1, 0));
    c = SC("0,1,2,3");
    check1("permute [2,3,4,5] identity", f_permute, &c, S("2,3,4,5", -1, 1, 0));
    cin[0] = S("3,2,7", -1, 1, 0);
    cin[1] = S("3,5,7", -1, 1, 0);
    cin[2] = S("3,1,7", -1, 1, 0);
    c = SC("");
    c.axis = 1;
    check("concat 3 inputs, axis 1", f_concat, &c, 3, cin);
    cin[0] = S("2,5,7", -1, 1, 0);
    cin[1] = S("1,5,7", -1, 1, 0);
    cin[2] = S("3,5,7", -1, 1, 0);
    c.axis = 0;
    check("concat 3 inputs, axis 0", f_concat, &c, 3, cin);
    cin[0] = S("3,5,4", -1, 1, 0);
    cin[1] = S("3,5,1", -1, 1, 0);
    cin[2] = S("3,5,2", -1, 1, 0);
    c.axis = -1;
    check("concat 3 inputs, axis -1", f_concat, &c, 3, cin);
    for (i = 0; i < sizeof slices / sizeof slices[0]; i++) {
        c = SC("");
        c.axis = slices[i][0];
        c.start = slices[i][1];
        c.end = slices[i][2];
        snprintf(name, sizeof name, "slice axis %d [%d, %d)", c.axis, c.start, c.end);
        check1(name, f_slice, &c, x);
    }
    c = SC("3,5,7");
    check1("broadcast_to [5,1] -> [3,5,7]", f_broadcast_to, &c, S("5,1", -1, 1, 0));
    check1("broadcast_to [] -> [3,5,7]", f_broadcast_to, &c, S("", -1, 1, 0));
    check1("broadcast_to [3,1,7] -> [3,5,7]", f_broadcast_to, &c, S("3,1,7", -1, 1, 0));
    c = SC("4,1,7");
    check1("broadcast_to [1,7] -> [4,1,7]", f_broadcast_to, &c, S("1,7", -1, 1, 0));
    for (i = 0; i < sizeof sums / sizeof sums[0]; i++) {
        c = SC(sums[i]);
        snprintf(name, sizeof name, "sum_to [3,5,7] -> [%s]", sums[i]);
        check1(name, f_sum_to, &c, x);
    }
}

/* ---- linear algebra --------------------------------------------------------------------- */
typedef struct mm_ctx { int ta, tb; } mm_ctx;

FN(f_matmul, ad_matmul(T, x[0], x[1]))
static ad_tensor *f_matmul_t(ad_tape *T, ad_tensor **x, void *ctx)
{
    const mm_ctx *c = (const mm_ctx *)ctx;
    return ad_matmul_t(T, x[0], x[1], c->ta, c->tb);
}
/* a product squared: the second derivative then involves both operands */
static ad_tensor *f_matmul_t_sq(ad_tape *T, ad_tensor **x, void *ctx)
{
    const mm_ctx *c = (const mm_ctx *)ctx;
    return ad_square(T, ad_matmul_t(T, x[0], x[1], c->ta, c->tb));
}
FN(f_linear, ad_tanh(T, ad_linear(T, x[0], x[1], x[2])))
FN(f_linear_nobias, ad_tanh(T, ad_linear(T, x[0], x[1], NULL)))

/* the shape of op(x) for a matmul operand given as [.., r, c] */
static th_input mm_in(int m, int k, int trans, const char *batch)
{
    char dims[64];
    if (trans) snprintf(dims, sizeof dims, "%s%s%d,%d", batch, *batch ? "," : "", k, m);
    else snprintf(dims, sizeof dims, "%s%s%d,%d", batch, *batch ? "," : "", m, k);
    return S(dims, -1, 1, 0);
}

static void test_linalg(void)
{
    /* m, k, n: odd sizes on the plain-loop path, then sizes that take the packed GEMM path (a
       packed case with fewer inputs under TH_QUICK, where each evaluation's new tape costs more) */
    int sizes[][3] = {{7, 13, 5}, {37, 61, 29}, {1, 9, 1}, {4, 300, 3}};
    int pm = quick ? 53 : 37, pk = quick ? 3 : 61, pn = quick ? 53 : 29;
    char name[128], da[32], db[32];
    size_t i;
    int ta, tb;
    th_input lin[3], io[2];
    sizes[1][0] = pm;
    sizes[1][1] = pk;
    sizes[1][2] = pn;
    check2("matmul [7,13] x [13,5]", f_matmul, NULL, S("7,13", -1, 1, 0), S("13,5", -1, 1, 0));
    snprintf(da, sizeof da, "%d,%d", pm, pk);
    snprintf(db, sizeof db, "%d,%d", pk, pn);
    snprintf(name, sizeof name, "matmul [%s] x [%s] (packed)", da, db);
    check2(name, f_matmul, NULL, S(da, -1, 1, 0), S(db, -1, 1, 0));
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++) {
                int m = sizes[i][0], k = sizes[i][1], n = sizes[i][2];
                mm_ctx c;
                c.ta = ta;
                c.tb = tb;
                snprintf(name, sizeof name, "matmul_t m=%d k=%d n=%d ta=%d tb=%d", m, k, n, ta, tb);
                io[0] = mm_in(m, k, ta, "");
                io[1] = mm_in(k, n, tb, "");
                if (quick && m * k * n >= 8192) th_gradcheck(name, f_matmul_t, &c, 2, io);
                else check(name, f_matmul_t, &c, 2, io);
                snprintf(name, sizeof name, "matmul_t squared m=%d k=%d n=%d ta=%d tb=%d", m, k, n, ta, tb);
                if (m * k * n < 1000) check2(name, f_matmul_t_sq, &c, mm_in(m, k, ta, ""), mm_in(k, n, tb, ""));
            }
    check2("matmul batched [2,3,4,5] x [2,3,5,6]", f_matmul, NULL, S("2,3,4,5", -1, 1, 0), S("2,3,5,6", -1, 1, 0));
    check2("matmul batch x 2-D [2,3,4,5] x [5,6]", f_matmul, NULL, S("2,3,4,5", -1, 1, 0), S("5,6", -1, 1, 0));
    check2("matmul 2-D x batch [4,5] x [2,3,5,6]", f_matmul, NULL, S("4,5", -1, 1, 0), S("2,3,5,6", -1, 1, 0));
    /* batched products large enough for the packed path: through the one tall product (batch
       x 2-D) and one product per batch entry (2-D x batch) */
    if (quick) {
        io[0] = S("2,27,3", -1, 1, 0);
        io[1] = S("3,53", -1, 1, 0);
        th_gradcheck("matmul batch x 2-D, packed", f_matmul, NULL, 2, io);
        io[0] = S("53,3", -1, 1, 0);
        io[1] = S("2,3,53", -1, 1, 0);
        th_gradcheck("matmul 2-D x batch, packed", f_matmul, NULL, 2, io);
    } else {
        check2("matmul batch x 2-D, packed", f_matmul, NULL, S("2,20,30", -1, 1, 0), S("30,25", -1, 1, 0));
        check2("matmul 2-D x batch, packed", f_matmul, NULL, S("20,30", -1, 1, 0), S("2,30,25", -1, 1, 0));
    }
    for (ta = 0; ta <= 1; ta++)
        for (tb = 0; tb <= 1; tb++) {
            mm_ctx c;
            c.ta = ta;
            c.tb = tb;
            snprintf(name, sizeof name, "matmul_t batched ta=%d tb=%d", ta, tb);
            check2(name, f_matmul_t_sq, &c, mm_in(4, 5, ta, "2,3"), mm_in(5, 6, tb, "2,3"));
            snprintf(name, sizeof name, "matmul_t batch x 2-D ta=%d tb=%d", ta, tb);
            check2(name, f_matmul_t_sq, &c, mm_in(4, 5, ta, "2,3"), mm_in(5, 6, tb, ""));
            snprintf(name, sizeof name, "matmul_t 2-D x batch ta=%d tb=%d", ta, tb);
            check2(name, f_matmul_t_sq, &c, mm_in(4, 5, ta, ""), mm_in(5, 6, tb, "3"));
        }
    lin[0] = S("6,13", -1, 1, 0);
    lin[1] = S("13,5", -1, 1, 0);
    lin[2] = S("5", -1, 1, 0);
    check("linear with bias", f_linear, NULL, 3, lin);
    check("linear without bias", f_linear_nobias, NULL, 2, lin);
    lin[0] = S("2,3,13", -1, 1, 0);
    check("linear, 3-D x", f_linear, NULL, 3, lin);
    check("linear without bias, 3-D x", f_linear_nobias, NULL, 2, lin);
    lin[0] = S("1,13", -1, 1, 0);
    check("linear, one row", f_linear, NULL, 3, lin);
    lin[0] = S("13", -1, 1, 0);
    check("linear, 1-D x", f_linear, NULL, 3, lin);
    /* with a bias the packed GEMM accumulates onto it */
    lin[0] = S(da, -0.3, 0.3, 0);
    lin[1] = S(db, -0.3, 0.3, 0);
    snprintf(name, sizeof name, "%d", pn);
    lin[2] = S(name, -1, 1, 0);
    if (quick) th_gradcheck("linear with bias, packed", f_linear, NULL, 3, lin);
    else check("linear with bias, packed", f_linear, NULL, 3, lin);
}

/* ---- softmax and losses ----------------------------------------------------------------- */
static const int labels6[] = {4, 0, 2, 2, 1, 3};
static int labels37[37];

static ad_tensor *f_softmax(ad_tape *T, ad_tensor **x, void *ctx)
{
    return ad_softmax(T, x[0], ((const axis_ctx *)ctx)->axis);
}
static ad_tensor *f_log_softmax(ad_tape *T, ad_tensor **x, void *ctx)
{
    return ad_log_softmax(T, x[0], ((const axis_ctx *)ctx)->axis);
}
FN(f_xent6, ad_cross_entropy(T, x[0], labels6))
FN(f_xent37, ad_cross_entropy(T, x[0], labels37))
FN(f_xent_linear, ad_cross_entropy(T, ad_linear(T, x[0], x[1], NULL), labels6))
FN(f_mse, ad_mse(T, x[0], x[1]))
FN(f_bce, ad_bce_with_logits(T, x[0], x[1]))
FN(f_bce_sigmoid_targets, ad_bce_with_logits(T, x[0], ad_sigmoid(T, x[1])))

static void test_nn(void)
{
    static const int axes[] = {0, 1, 2, -1, -3};
    char name[96];
    size_t i;
    th_input in[2];
    for (i = 0; i < sizeof axes / sizeof axes[0]; i++) {
        axis_ctx c;
        c.axis = axes[i];
        c.keepdim = 0;
        snprintf(name, sizeof name, "softmax axis %d", c.axis);
        check1(name, f_softmax, &c, S("3,4,5", -2, 2, 0));
        snprintf(name, sizeof name, "log_softmax axis %d", c.axis);
        check1(name, f_log_softmax, &c, S("3,4,5", -2, 2, 0));
    }
    {
        axis_ctx c;
        c.axis = 0;
        check1("softmax of a vector", f_softmax, &c, S("6", -2, 2, 0));
        check1("log_softmax of a vector", f_log_softmax, &c, S("6", -2, 2, 0));
        /* rows longer than the eight chains of the row sums, with a remainder */
        c.axis = 1;
        check1("softmax of rows of 19", f_softmax, &c, S("3,19", -2, 2, 0));
        check1("log_softmax of rows of 19", f_log_softmax, &c, S("3,19", -2, 2, 0));
    }
    check1("cross_entropy [6,5]", f_xent6, NULL, S("6,5", -2, 2, 0));
    for (i = 0; i < 37; i++) labels37[i] = (int)((i * 7) % 10);
    check1("cross_entropy [37,10]", f_xent37, NULL, S("37,10", -3, 3, 0));
    check2("cross_entropy of a linear layer", f_xent_linear, NULL, S("6,4", -1, 1, 0), S("4,5", -1, 1, 0));
    in[0] = S("3,5,7", -2, 2, 0);
    in[1] = S("3,5,7", -2, 2, 0);
    check("mse", f_mse, NULL, 2, in);
    in[1] = S("3,5,7", 0, 1, 0);
    check("bce_with_logits (logits and targets)", f_bce, NULL, 2, in);
    in[1] = S("3,5,7", -2, 2, 0);
    check("bce_with_logits of sigmoid targets", f_bce_sigmoid_targets, NULL, 2, in);
    check2("bce_with_logits of a scalar", f_bce, NULL, S("", -3, 3, 0), S("", 0, 1, 0));
}

/* ---- forward values against plain C ----------------------------------------------------- */
static double rel_err(double a, double b) { return fabs(a - b) / (fabs(b) > 1 ? fabs(b) : 1); }

/* C[m,n] = op(A) op(B) with A stored [m,k] (or [k,m] when ta) and B [k,n] (or [n,k]). */
static void naive_matmul(int ta, int tb, int m, int n, int k, const double *A, const double *B, double *C)
{
    int i, j, p;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            double s = 0;
            for (p = 0; p < k; p++) s += (ta ? A[p * m + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * n + j]);
            C[i * n + j] = s;
        }
}

static void test_matmul_values(void)
{
    /* around the micro-kernel tile (6/12 rows, 8/16 columns), the blocks (MC 144, KC 256, NC 2048)
       and the small-product threshold */
    static const int sizes[][3] = {
        {1, 1, 1},     {1, 300, 7},   {300, 1, 5},   {3, 3, 3},     {4, 4, 512},   {5, 7, 300},
        {6, 8, 256},   {12, 16, 257}, {13, 17, 255}, {11, 15, 1},   {31, 33, 64},  {64, 64, 64},
        {65, 97, 129}, {143, 17, 40}, {144, 16, 40}, {145, 19, 41}, {150, 150, 300}, {300, 300, 300},
        {5, 2100, 3},  {2, 2049, 9},  {200, 7, 13},  {17, 300, 2},  {1, 257, 300}, {97, 1, 300},
    };
    ad_rng rng;
    size_t i;
    int ta, tb;
    ad_rng_seed(&rng, 7);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int m = sizes[i][0], n = sizes[i][1], k = sizes[i][2];
        if (quick && (double)m * n * k > 1e6) continue;
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++) {
                ad_tape *T = ad_tape_new();
                int sa[2], sb[2];
                ad_tensor *a, *b, *c;
                double *ref = (double *)malloc((size_t)m * n * sizeof(double)), worst = 0;
                size_t j;
                sa[0] = ta ? k : m; sa[1] = ta ? m : k;
                sb[0] = tb ? n : k; sb[1] = tb ? k : n;
                a = ad_rand(T, 2, sa, -1, 1, &rng);
                b = ad_rand(T, 2, sb, -1, 1, &rng);
                c = ad_matmul_t(T, a, b, ta, tb);
                naive_matmul(ta, tb, m, n, k, a->data, b->data, ref);
                TH_CHECK(c && c->ndim == 2 && c->shape[0] == m && c->shape[1] == n,
                         "matmul_t %dx%dx%d ta=%d tb=%d: bad result %s", m, n, k, ta, tb, th_errs(T));
                if (c)
                    for (j = 0; j < c->size; j++) {
                        double e = rel_err(c->data[j], ref[j]);
                        if (e > worst) worst = e;
                    }
                TH_CHECK(c && worst < 1e-12 * k, "matmul_t m=%d n=%d k=%d ta=%d tb=%d: error %g", m, n, k, ta,
                         tb, worst);
                free(ref);
                ad_tape_free(T);
            }
    }
    /* batched, and linear with a bias (the accumulating path of the GEMM) */
    {
        ad_tape *T = ad_tape_new();
        int sa[] = {3, 20, 30}, sb[] = {3, 30, 25}, sw[] = {30, 25}, sbias[] = {25}, b;
        ad_tensor *A = ad_rand(T, 3, sa, -1, 1, &rng), *B = ad_rand(T, 3, sb, -1, 1, &rng);
        ad_tensor *W = ad_rand(T, 2, sw, -1, 1, &rng), *bias = ad_rand(T, 1, sbias, -1, 1, &rng);
        ad_tensor *C = ad_matmul(T, A, B), *L = ad_linear(T, A, W, bias);
        double ref[20 * 25], worst = 0, worst_lin = 0;
        int j;
        for (b = 0; b < 3; b++) {
            naive_matmul(0, 0, 20, 25, 30, A->data + b * 600, B->data + b * 750, ref);
            for (j = 0; j < 500; j++) worst = fmax(worst, rel_err(C->data[b * 500 + j], ref[j]));
            naive_matmul(0, 0, 20, 25, 30, A->data + b * 600, W->data, ref);
            for (j = 0; j < 500; j++) worst_lin = fmax(worst_lin, rel_err(L->data[b * 500 + j], ref[j] + bias->data[j % 25]));
        }
        TH_CHECK(C->ndim == 3 && C->shape[0] == 3 && C->shape[1] == 20 && C->shape[2] == 25, "batched shape");
        TH_CHECK(worst < 1e-12, "batched matmul error %g", worst);
        TH_CHECK(L->ndim == 3 && L->shape[2] == 25, "linear shape");
        TH_CHECK(worst_lin < 1e-12, "linear with bias error %g", worst_lin);
        ad_tape_free(T);
    }
}

/* y[i] for a flat index i of a broadcast result, reading x of a smaller shape. */
static double bcast_at(const ad_tensor *x, int ndim, const int *shape, size_t i)
{
    size_t off = 0, stride = 1;
    int d;
    for (d = ndim - 1; d >= 0; d--) {
        size_t idx = i % (size_t)shape[d];
        int xd = d - (ndim - x->ndim);
        i /= (size_t)shape[d];
        if (xd < 0) continue;
        if (x->shape[xd] != 1) off += idx * stride;
        stride *= (size_t)x->shape[xd];
    }
    return x->data[off];
}

static void test_forward_values(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int s357[] = {3, 5, 7}, s51[] = {5, 1}, s317[] = {3, 1, 7};
    ad_tensor *a, *b, *y;
    size_t i;
    int d, ok;
    ad_rng_seed(&rng, 11);

    /* broadcasting binary ops */
    a = ad_rand(T, 3, s317, -2, 2, &rng);
    b = ad_rand(T, 2, s51, 0.5, 2, &rng);
    {
        ad_tensor *ys[6];
        double worst = 0;
        int k;
        ys[0] = ad_add(T, a, b);
        ys[1] = ad_sub(T, a, b);
        ys[2] = ad_mul(T, a, b);
        ys[3] = ad_div(T, a, b);
        ys[4] = ad_maximum(T, a, b);
        ys[5] = ad_minimum(T, a, b);
        for (k = 0; k < 6; k++) {
            TH_CHECK(ys[k] && ys[k]->ndim == 3 && ys[k]->shape[0] == 3 && ys[k]->shape[1] == 5 &&
                         ys[k]->shape[2] == 7, "binary op %d: shape", k);
            for (i = 0; i < 105; i++) {
                double x = bcast_at(a, 3, s357, i), z = bcast_at(b, 3, s357, i), r;
                switch (k) {
                case 0: r = x + z; break;
                case 1: r = x - z; break;
                case 2: r = x * z; break;
                case 3: r = x / z; break;
                case 4: r = x > z ? x : z; break;
                default: r = x < z ? x : z; break;
                }
                worst = fmax(worst, fabs(ys[k]->data[i] - r));
            }
        }
        TH_CHECK(worst < 1e-15, "broadcasting binary ops: error %g", worst);
    }

    /* reductions along each axis against loops */
    a = ad_rand(T, 3, s357, -2, 2, &rng);
    for (d = 0; d < 3; d++) {
        ad_tensor *s = ad_sum_axis(T, a, d, 0), *m = ad_mean_axis(T, a, d, 1), *mx = ad_max_axis(T, a, d, 0);
        double worst = 0;
        int i0, i1, i2, len = s357[d];
        for (i0 = 0; i0 < 3; i0++)
            for (i1 = 0; i1 < 5; i1++)
                for (i2 = 0; i2 < 7; i2++) {
                    int idx[3], j, o;
                    double sum = 0, big = -HUGE_VAL;
                    idx[0] = i0; idx[1] = i1; idx[2] = i2;
                    if (idx[d] != 0) continue;
                    for (j = 0; j < len; j++) {
                        double v;
                        idx[d] = j;
                        v = a->data[(idx[0] * 5 + idx[1]) * 7 + idx[2]];
                        sum += v;
                        if (v > big) big = v;
                    }
                    idx[d] = 0;
                    /* flat index of the output without the axis (the same with it kept as 1) */
                    o = d == 0 ? i1 * 7 + i2 : d == 1 ? i0 * 7 + i2 : i0 * 5 + i1;
                    worst = fmax(worst, fabs(s->data[o] - sum));
                    worst = fmax(worst, fabs(m->data[o] - sum / len));
                    worst = fmax(worst, fabs(mx->data[o] - big));
                }
        TH_CHECK(s->ndim == 2 && m->ndim == 3 && m->shape[d] == 1 && mx->ndim == 2, "reduce axis %d: shapes", d);
        TH_CHECK(worst < 1e-13, "reductions along axis %d: error %g", d, worst);
    }
    {
        double sum = 0, big = -HUGE_VAL;
        for (i = 0; i < a->size; i++) {
            sum += a->data[i];
            if (a->data[i] > big) big = a->data[i];
        }
        TH_CHECK(fabs(ad_item(ad_sum(T, a)) - sum) < 1e-13, "sum");
        TH_CHECK(fabs(ad_item(ad_mean(T, a)) - sum / 105) < 1e-13, "mean");
        TH_CHECK(ad_item(ad_max(T, a)) == big, "max");
        TH_CHECK(ad_sum(T, a)->ndim == 0, "sum is a scalar");
    }

    /* permute against index arithmetic */
    {
        int s2345[] = {2, 3, 4, 5}, perm[] = {3, 1, 0, 2}, i0, i1, i2, i3;
        ad_tensor *x = ad_rand(T, 4, s2345, -1, 1, &rng), *p = ad_permute(T, x, perm);
        ok = p && p->shape[0] == 5 && p->shape[1] == 3 && p->shape[2] == 2 && p->shape[3] == 4;
        for (i0 = 0; ok && i0 < 2; i0++)
            for (i1 = 0; i1 < 3; i1++)
                for (i2 = 0; i2 < 4; i2++)
                    for (i3 = 0; i3 < 5; i3++)
                        if (p->data[((i3 * 3 + i1) * 2 + i0) * 4 + i2] != x->data[((i0 * 3 + i1) * 4 + i2) * 5 + i3])
                            ok = 0;
        TH_CHECK(ok, "permute (3,1,0,2) moves elements wrongly");
        y = ad_transpose(T, x, 1, -1);
        ok = y && y->shape[1] == 5 && y->shape[3] == 3;
        for (i0 = 0; ok && i0 < 2; i0++)
            for (i1 = 0; i1 < 3; i1++)
                for (i2 = 0; i2 < 4; i2++)
                    for (i3 = 0; i3 < 5; i3++)
                        if (y->data[((i0 * 5 + i3) * 4 + i2) * 3 + i1] != x->data[((i0 * 3 + i1) * 4 + i2) * 5 + i3])
                            ok = 0;
        TH_CHECK(ok, "transpose 1 -1 moves elements wrongly");
    }

    /* concat and slice */
    {
        int s1[] = {2, 1, 3}, s2[] = {2, 2, 3}, j, k;
        ad_tensor *xs[3], *c, *sl;
        xs[0] = ad_rand(T, 3, s1, -1, 1, &rng);
        xs[1] = ad_rand(T, 3, s2, -1, 1, &rng);
        xs[2] = ad_rand(T, 3, s1, -1, 1, &rng);
        c = ad_concat(T, xs, 3, 1);
        ok = c && c->shape[0] == 2 && c->shape[1] == 4 && c->shape[2] == 3;
        for (i = 0; ok && i < 2; i++)
            for (j = 0; j < 4; j++)
                for (k = 0; k < 3; k++) {
                    double want = j == 0 ? xs[0]->data[i * 3 + k]
                                : j < 3  ? xs[1]->data[(i * 2 + (j - 1)) * 3 + k]
                                         : xs[2]->data[i * 3 + k];
                    if (c->data[(i * 4 + j) * 3 + k] != want) ok = 0;
                }
        TH_CHECK(ok, "concat along axis 1 puts elements wrongly");
        sl = ad_slice(T, c, -2, -3, -1); /* rows 1 and 2 of axis 1: xs[1] */
        ok = sl && sl->shape[1] == 2 && memcmp(sl->data, xs[1]->data, 12 * sizeof(double)) == 0;
        TH_CHECK(ok, "slice [-3, -1) of axis -2 is not the middle input");
    }

    /* reshape is a view and infers -1 */
    {
        int to[] = {-1, 5};
        y = ad_reshape(T, a, 2, to);
        TH_CHECK(y && y->shape[0] == 21 && y->shape[1] == 5 && y->data == a->data, "reshape to [-1,5]");
        y = ad_flatten(T, a);
        TH_CHECK(y && y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 35, "flatten");
    }

    /* broadcast_to and sum_to */
    {
        ad_tensor *bt = ad_broadcast_to(T, b, 3, s357), *st;
        double worst = 0, col[5] = {0};
        int j;
        for (i = 0; i < 105; i++) worst = fmax(worst, fabs(bt->data[i] - b->data[(i / 7) % 5]));
        TH_CHECK(worst == 0, "broadcast_to [5,1] -> [3,5,7]");
        st = ad_sum_to(T, a, 2, s51);
        for (i = 0; i < 105; i++) col[(i / 7) % 5] += a->data[i];
        worst = 0;
        for (j = 0; j < 5; j++) worst = fmax(worst, fabs(st->data[j] - col[j]));
        TH_CHECK(st->ndim == 2 && st->shape[0] == 5 && st->shape[1] == 1 && worst < 1e-13, "sum_to [5,1]: %g", worst);
    }

    /* softmax sums to one along its axis; log_softmax is its log */
    for (d = -1; d < 3; d++) {
        int s345[] = {3, 4, 5};
        ad_tensor *x = ad_rand(T, 3, s345, -3, 3, &rng);
        ad_tensor *sm = ad_softmax(T, x, d), *ls = ad_log_softmax(T, x, d);
        ad_tensor *tot = ad_sum_axis(T, sm, d, 0);
        double worst = 0;
        for (i = 0; i < tot->size; i++) worst = fmax(worst, fabs(tot->data[i] - 1));
        for (i = 0; i < sm->size; i++) worst = fmax(worst, fabs(log(sm->data[i]) - ls->data[i]));
        TH_CHECK(worst < 1e-14, "softmax axis %d: rows do not sum to 1 (%g)", d, worst);
    }

    /* elementwise values */
    {
        static const double gx[] = {-3, -1, -0.5, 0.5, 1, 2, 3};
        static const double gelu_ref[] = {-0.00404969409489031, -0.15865525393145707, -0.15426876936299344,
                                          0.34573123063700656, 0.8413447460685429, 1.9544997361036416,
                                          2.99595030590511};
        int s7[] = {7};
        ad_tensor *x = ad_tensor_new(T, 1, s7, gx, 0), *g = ad_gelu(T, x);
        ad_tensor *sg = ad_sigmoid(T, x), *lr = ad_leaky_relu(T, x, 0.1), *cl = ad_clamp(T, x, -1, 0.75);
        ad_tensor *pw = ad_pow(T, ad_abs(T, x), 1.5), *af = ad_affine(T, x, 2, 1);
        double worst = 0;
        for (i = 0; i < 7; i++) {
            double v = gx[i];
            worst = fmax(worst, fabs(g->data[i] - gelu_ref[i]));
            worst = fmax(worst, fabs(sg->data[i] - 1 / (1 + exp(-v))));
            worst = fmax(worst, fabs(lr->data[i] - (v > 0 ? v : 0.1 * v)));
            worst = fmax(worst, fabs(cl->data[i] - (v < -1 ? -1 : v > 0.75 ? 0.75 : v)));
            worst = fmax(worst, fabs(pw->data[i] - pow(fabs(v), 1.5)));
            worst = fmax(worst, fabs(af->data[i] - (2 * v + 1)));
        }
        TH_CHECK(worst < 1e-15, "elementwise values: error %g", worst);
    }
    /* the functions added through the table, against the C library's definitions */
    {
        static const double gx[] = {-40, -3, -1, -0.5, -1e-9, 0, 1e-9, 0.5, 1, 2, 3, 40};
        int s12[] = {12};
        ad_tensor *x = ad_tensor_new(T, 1, s12, gx, 0), *pos = ad_abs(T, x);
        ad_tensor *l1 = ad_log1p(T, pos), *em = ad_expm1(T, x), *sp = ad_softplus(T, x), *si = ad_silu(T, x);
        ad_tensor *ef = ad_erf(T, x), *at = ad_atan(T, x), *el = ad_elu(T, x, 0.7);
        ad_tensor *rc = ad_reciprocal(T, x), *rs = ad_rsqrt(T, pos);
        double worst = 0;
        for (i = 0; i < 12; i++) {
            double v = gx[i], a = fabs(v);
            worst = fmax(worst, fabs(l1->data[i] - log1p(a)) / fmax(1e-300, fabs(log1p(a))) * (a > 0));
            worst = fmax(worst, fabs(em->data[i] - expm1(v)) / fmax(1e-300, fabs(expm1(v))) * (v != 0));
            worst = fmax(worst, fabs(sp->data[i] - (v > 30 ? v : log1p(exp(v)))) / (v > 30 ? v : log1p(exp(v))));
            worst = fmax(worst, fabs(si->data[i] - v / (1 + exp(-v))));
            worst = fmax(worst, fabs(ef->data[i] - erf(v)));
            worst = fmax(worst, fabs(at->data[i] - atan(v)));
            worst = fmax(worst, fabs(el->data[i] - (v > 0 ? v : 0.7 * (exp(v) - 1))));
            if (v != 0) worst = fmax(worst, fabs(rc->data[i] - 1 / v) * fabs(v));
            if (a > 0) worst = fmax(worst, fabs(rs->data[i] - 1 / sqrt(a)) * sqrt(a));
        }
        TH_CHECK(worst < 1e-14, "log1p, expm1, softplus, silu, erf, atan, elu, reciprocal, rsqrt: error %g", worst);
        TH_CHECK(isinf(rc->data[5]) && rc->data[5] > 0 && isinf(rs->data[5]), "1 / 0 and 1 / sqrt(0) are infinite");
    }
    /* pow_tensor against pow, broadcast, and its gradient at a zero base */
    {
        static const double base[] = {0, 0.5, 2, 3}, ex[] = {2, -1, 0.5};
        int s41[] = {4, 1}, s3[] = {3};
        ad_tensor *a = ad_tensor_new(T, 2, s41, base, 1), *e = ad_tensor_new(T, 1, s3, ex, 1);
        ad_tensor *p = ad_pow_tensor(T, a, e);
        double worst = 0;
        int j;
        for (i = 0; i < 4; i++)
            for (j = 0; j < 3; j++) worst = fmax(worst, fabs(p->data[i * 3 + j] - pow(base[i], ex[j])) * (i > 0));
        TH_CHECK(p->ndim == 2 && p->shape[0] == 4 && p->shape[1] == 3 && worst < 1e-15 && p->data[0] == 0 &&
                     isinf(p->data[1]),
                 "pow_tensor values: error %g", worst);
        TH_CHECK(ad_backward(T, ad_sum(T, ad_mul(T, p, ad_scalar(T, 0)))) == 0, "pow_tensor backward: %s",
                 ad_tape_error(T) ? ad_tape_error(T) : "");
        ad_tape_reset(T);
        a = ad_tensor_new(T, 1, s41, base, 1);
        e = ad_scalar(T, 2);
        ad_set_requires_grad(e, 1);
        TH_CHECK(ad_backward(T, ad_sum(T, ad_pow_tensor(T, a, e))) == 0 && a->grad[0] == 0 && isfinite(e->grad[0]),
                 "pow_tensor at a zero base with exponent 2: da %g, de %g", a->grad[0], e->grad[0]);
    }
    ad_tape_free(T);
}

/* Softmax, log-softmax, cross-entropy and bce at logits of +-1000: finite, and right. */
static void test_stability(void)
{
    ad_tape *T = ad_tape_new();
    double big[] = {1000, -1000, 0, 999};
    int s4[] = {4}, s22[] = {2, 2}, lab[] = {1, 0};
    ad_tensor *x = ad_tensor_new(T, 1, s4, big, 1);
    ad_tensor *sm = ad_softmax(T, x, 0), *ls = ad_log_softmax(T, x, 0), *sg = ad_sigmoid(T, x);
    ad_tensor *lg, *ce, *t, *bce;
    double e1 = exp(-1.0), ce_ref;
    size_t i;
    int finite = 1;
    for (i = 0; i < 4; i++) finite &= isfinite(sm->data[i]) && isfinite(ls->data[i]) && isfinite(sg->data[i]);
    TH_CHECK(finite, "softmax / log_softmax / sigmoid at +-1000 are not finite");
    TH_CHECK(fabs(sm->data[0] - 1 / (1 + e1)) < 1e-15 && sm->data[1] == 0 && fabs(sm->data[3] - e1 / (1 + e1)) < 1e-15,
             "softmax at +-1000: %g %g %g", sm->data[0], sm->data[1], sm->data[3]);
    TH_CHECK(fabs(ls->data[1] - (-2000 - log(1 + e1))) < 1e-12, "log_softmax at -1000: %.17g", ls->data[1]);
    TH_CHECK(sg->data[0] == 1 && sg->data[1] == 0 && sg->data[2] == 0.5, "sigmoid at +-1000");
    {
        ad_tensor *sp = ad_softplus(T, x), *si = ad_silu(T, x);
        TH_CHECK(sp->data[0] == 1000 && sp->data[1] == 0 && fabs(sp->data[2] - log(2.0)) < 1e-15 && si->data[0] == 1000 &&
                     si->data[1] == 0,
                 "softplus and silu at +-1000: %g %g %g %g", sp->data[0], sp->data[1], si->data[0], si->data[1]);
    }

    /* rows [1000, -1000] label 1 and [-1000, 1000] label 0: loss 2000 each */
    {
        double v[] = {1000, -1000, -1000, 1000};
        lg = ad_tensor_new(T, 2, s22, v, 1);
    }
    ce = ad_cross_entropy(T, lg, lab);
    ce_ref = 2000;
    TH_CHECK(ce && fabs(ad_item(ce) - ce_ref) < 1e-9, "cross_entropy at +-1000: %.17g", ad_item(ce));
    {
        double tv[] = {0, 1, 1, 0};
        t = ad_tensor_new(T, 2, s22, tv, 1);
    }
    bce = ad_bce_with_logits(T, lg, t); /* every element is wrong by 1000: mean 1000 */
    TH_CHECK(bce && fabs(ad_item(bce) - 1000) < 1e-9, "bce_with_logits at +-1000: %.17g", ad_item(bce));
    TH_CHECK(ad_backward(T, ad_add(T, ce, bce)) == 0, "backward: %s", th_errs(T));
    finite = 1;
    for (i = 0; i < 4; i++) finite &= isfinite(lg->grad[i]) && isfinite(t->grad[i]);
    TH_CHECK(finite, "gradients at +-1000 are not finite");
    /* d ce / d logits = (softmax - onehot) / 2 = [0.5, -0.5; -0.5, 0.5]; d bce / d x = (sigmoid - t) / 4 */
    TH_CHECK(fabs(lg->grad[0] - (0.5 + 0.25)) < 1e-15 && fabs(lg->grad[1] - (-0.5 - 0.25)) < 1e-15,
             "logit gradients at +-1000: %g %g", lg->grad[0], lg->grad[1]);
    TH_CHECK(fabs(t->grad[0] - (-1000.0 / 4)) < 1e-12, "target gradient: %g", t->grad[0]);
    {
        double v[] = {1000, -1000}, tv[] = {1, 0};
        int s2[] = {2};
        ad_tensor *ok = ad_bce_with_logits(T, ad_tensor_new(T, 1, s2, v, 0), ad_tensor_new(T, 1, s2, tv, 0));
        TH_CHECK(ok && ad_item(ok) == 0, "bce_with_logits right at +-1000: %g", ad_item(ok));
    }
    ad_tape_free(T);
}

/* ---- ad_grad and ad_backward semantics --------------------------------------------------- */
static void test_grad_semantics(void)
{
    ad_tape *T = ad_tape_new();
    int s34[] = {3, 4};
    ad_rng rng;
    ad_tensor *x, *z, *y, *g;
    size_t i;
    int allzero;
    ad_rng_seed(&rng, 5);
    x = ad_rand(T, 2, s34, -1, 1, &rng);
    z = ad_rand(T, 2, s34, -1, 1, &rng);
    ad_set_requires_grad(x, 1);
    ad_set_requires_grad(z, 1);

    /* y does not depend on x: zeros of x's shape */
    y = ad_sum(T, ad_mul(T, z, z));
    g = ad_grad(T, y, x, 0);
    allzero = g && g->ndim == 2 && g->shape[0] == 3 && g->shape[1] == 4 && g->size == 12;
    for (i = 0; allzero && i < 12; i++) allzero = g->data[i] == 0;
    TH_CHECK(allzero, "ad_grad of an independent x is not zeros of its shape");
    g = ad_grad(T, y, x, 1);
    allzero = g && g->size == 12;
    for (i = 0; allzero && i < 12; i++) allzero = g->data[i] == 0;
    TH_CHECK(allzero, "ad_grad(create_graph) of an independent x is not zeros");

    /* ad_grad leaves every grad field alone */
    g = ad_grad(T, y, z, 0);
    TH_CHECK(x->grad == NULL && z->grad == NULL, "ad_grad wrote into a grad field");
    allzero = g != NULL;
    for (i = 0; g && i < 12; i++)
        if (fabs(g->data[i] - 2 * z->data[i]) > 1e-15) allzero = 0;
    TH_CHECK(allzero, "ad_grad of sum(z*z) is not 2z");

    /* ad_backward accumulates across calls; ad_grad after it changes nothing */
    TH_CHECK(ad_backward(T, y) == 0, "backward");
    TH_CHECK(z->grad != NULL && x->grad == NULL, "backward: grads of z only");
    {
        double once[12];
        int same = 1, twice = 1;
        memcpy(once, z->grad, sizeof once);
        g = ad_grad(T, y, z, 1);
        for (i = 0; i < 12; i++) same &= z->grad[i] == once[i];
        TH_CHECK(same && g, "ad_grad after backward changed z->grad");
        TH_CHECK(ad_backward(T, y) == 0, "second backward");
        for (i = 0; i < 12; i++) twice &= fabs(z->grad[i] - 2 * once[i]) < 1e-15 && fabs(once[i] - 2 * z->data[i]) < 1e-15;
        TH_CHECK(twice, "a second ad_backward does not add to the first");
    }
    ad_tape_free(T);

    /* one input used along many routes: the routes are summed */
    T = ad_tape_new();
    {
        double a0 = 0.7, want;
        ad_tensor *a = ad_var(T, a0), *f;
        /* f = a^3 + a sin(a) + exp(a) / a + (a + a) a */
        f = ad_add(T, ad_add(T, ad_mul(T, ad_mul(T, a, a), a), ad_mul(T, a, ad_sin(T, a))),
                   ad_add(T, ad_div(T, ad_exp(T, a), a), ad_mul(T, ad_add(T, a, a), a)));
        want = 3 * a0 * a0 + sin(a0) + a0 * cos(a0) + exp(a0) / a0 - exp(a0) / (a0 * a0) + 4 * a0;
        TH_CHECK(ad_backward(T, f) == 0, "backward");
        TH_CHECK(fabs(ad_grad_item(a) - want) < 1e-14, "many routes: %.17g, want %.17g", ad_grad_item(a), want);
    }
    {
        /* a tensor read by a broadcasting op and a reduction at once */
        int s3[] = {3}, s23[] = {2, 3};
        double xv[] = {0.5, -1, 2}, wv[] = {1, 2, 3, 4, 5, 6};
        ad_tensor *v = ad_tensor_new(T, 1, s3, xv, 1), *w = ad_tensor_new(T, 2, s23, wv, 0);
        ad_tensor *f = ad_add(T, ad_sum(T, ad_mul(T, w, v)), ad_mul(T, ad_sum(T, v), ad_sum(T, v)));
        double s = xv[0] + xv[1] + xv[2];
        int ok = ad_backward(T, f) == 0;
        for (i = 0; ok && i < 3; i++) ok = fabs(v->grad[i] - (wv[i] + wv[i + 3] + 2 * s)) < 1e-14;
        TH_CHECK(ok, "gradient of a vector used along three routes");
    }
    ad_tape_free(T);

    /* mixed partial: f = a^2 b^3 + sin(a b), d2f/da db = 6 a b^2 + cos(ab) - ab sin(ab) */
    T = ad_tape_new();
    {
        double av = 1.3, bv = -0.6, want = 6 * av * bv * bv + cos(av * bv) - av * bv * sin(av * bv);
        ad_tensor *a = ad_var(T, av), *b = ad_var(T, bv);
        ad_tensor *f = ad_add(T, ad_mul(T, ad_square(T, a), ad_pow(T, b, 3)), ad_sin(T, ad_mul(T, a, b)));
        ad_tensor *fa = ad_grad(T, f, a, 1), *fab = ad_grad(T, fa, b, 0);
        ad_tensor *fb = ad_grad(T, f, b, 1), *fba = ad_grad(T, fb, a, 0);
        TH_CHECK(fab && fabs(ad_item(fab) - want) < 1e-13, "d2f/dadb = %.17g, want %.17g", ad_item(fab), want);
        TH_CHECK(fba && fabs(ad_item(fba) - want) < 1e-13, "d2f/dbda = %.17g, want %.17g", ad_item(fba), want);
        TH_CHECK(fabs(ad_item(fa) - (2 * av * bv * bv * bv + bv * cos(av * bv))) < 1e-13, "df/da");
    }
    /* third derivative: d3/dx3 x^4 = 24 x */
    {
        ad_tensor *x1 = ad_var(T, 1.7);
        ad_tensor *f = ad_mul(T, ad_square(T, x1), ad_square(T, x1));
        ad_tensor *d1 = ad_grad(T, f, x1, 1), *d2 = ad_grad(T, d1, x1, 1), *d3 = ad_grad(T, d2, x1, 0);
        TH_CHECK(d3 && fabs(ad_item(d3) - 24 * 1.7) < 1e-12, "third derivative %.17g", ad_item(d3));
        TH_CHECK(fabs(ad_item(d2) - 12 * 1.7 * 1.7) < 1e-12, "second derivative %.17g", ad_item(d2));
    }
    /* ties of maximum split the gradient evenly */
    {
        ad_tensor *p = ad_var(T, 2), *q = ad_var(T, 2);
        TH_CHECK(ad_backward(T, ad_maximum(T, p, q)) == 0 && ad_grad_item(p) == 0.5 && ad_grad_item(q) == 0.5,
                 "maximum at a tie: %g %g", ad_grad_item(p), ad_grad_item(q));
    }
    ad_tape_free(T);
}

int main(void)
{
    quick = getenv("TH_QUICK") != NULL;
    ad_rng_seed(&th_rng_state, 20261122);
    test_elementwise();
    test_binary();
    test_reduce();
    test_shape();
    test_linalg();
    test_nn();
    test_matmul_values();
    test_forward_values();
    test_stability();
    test_grad_semantics();
    return th_summary();
}
