/* Custom ops (ad_custom) and the public gradient checker (ad_gradcheck).

   Custom ops of both kinds (a backward recorded with library ops, and one on arrays) against
   finite differences through ad_gradcheck and against the same function built from library
   ops; several inputs, inputs without grad, second derivatives through a recorded backward,
   the error for create_graph through a backward on arrays, and user errors (wrong shapes, NULL
   gradients, failing callbacks), each message naming the op. The checker itself must catch a
   deliberately wrong first and second derivative and name the worst element. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

/* ---- op 1: y = a * sin(b) (elementwise, two inputs), both kinds ---- */
static int asin_fwd(const ad_custom_call *c)
{
    size_t i;
    for (i = 0; i < c->out->size; i++) c->out->data[i] = c->in[0]->data[i] * sin(c->in[1]->data[i]);
    return 0;
}

static int asin_bwd(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    if (c->needs_grad[0]) gin[0] = ad_mul(T, g, ad_sin(T, c->in[1]));
    if (c->needs_grad[1]) gin[1] = ad_mul(T, g, ad_mul(T, c->in[0], ad_cos(T, c->in[1])));
    return 0;
}

static int asin_bwd_array_calls;
static int asin_bwd_array(const ad_custom_call *c, const ad_real *g, ad_real *const *gin)
{
    size_t i;
    asin_bwd_array_calls++;
    for (i = 0; i < c->out->size; i++) {
        if (gin[0]) gin[0][i] = g[i] * sin(c->in[1]->data[i]);
        if (gin[1]) gin[1][i] = g[i] * c->in[0]->data[i] * cos(c->in[1]->data[i]);
    }
    return 0;
}

static const ad_custom_op asin_rec = {"asin_rec", asin_fwd, asin_bwd, NULL, NULL, NULL, 0};
static const ad_custom_op asin_arr = {"asin_arr", asin_fwd, NULL, asin_bwd_array, NULL, NULL, 0};

/* ---- op 2: a weighted dot product of three inputs, a scalar output (shape function) and
   saved bytes: the forward saves the sum of c's values, which the backward uses. ---- */
typedef struct dot3_saved {
    double csum;
} dot3_saved;

static int dot3_shape(const ad_custom_call *c, int *ndim, int *shape)
{
    (void)c;
    (void)shape;
    *ndim = 0;
    return 0;
}

/* y = sum(a * b) * sum(c) */
static int dot3_fwd(const ad_custom_call *c)
{
    dot3_saved *s = (dot3_saved *)c->saved;
    double ab = 0, cs = 0;
    size_t i;
    for (i = 0; i < c->in[0]->size; i++) ab += c->in[0]->data[i] * c->in[1]->data[i];
    for (i = 0; i < c->in[2]->size; i++) cs += c->in[2]->data[i];
    s->csum = cs;
    c->out->data[0] = ab * cs;
    return 0;
}

static int dot3_bwd(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    /* recorded from the inputs (not from the saved sum), so that it is differentiable */
    ad_tensor *cs = ad_sum(T, c->in[2]);
    ad_tensor *gc = ad_mul(T, g, cs);
    if (c->needs_grad[0]) gin[0] = ad_mul(T, gc, c->in[1]);
    if (c->needs_grad[1]) gin[1] = ad_mul(T, gc, c->in[0]);
    if (c->needs_grad[2]) {
        ad_tensor *ab = ad_sum(T, ad_mul(T, c->in[0], c->in[1]));
        gin[2] = ad_broadcast_to(T, ad_mul(T, g, ab), c->in[2]->ndim, c->in[2]->shape);
    }
    return 0;
}

static int dot3_bwd_array(const ad_custom_call *c, const ad_real *g, ad_real *const *gin)
{
    const dot3_saved *s = (const dot3_saved *)c->saved;
    double ab = 0;
    size_t i;
    for (i = 0; i < c->in[0]->size; i++) ab += c->in[0]->data[i] * c->in[1]->data[i];
    for (i = 0; i < c->in[0]->size; i++) {
        if (gin[0]) gin[0][i] = g[0] * s->csum * c->in[1]->data[i];
        if (gin[1]) gin[1][i] = g[0] * s->csum * c->in[0]->data[i];
    }
    if (gin[2])
        for (i = 0; i < c->in[2]->size; i++) gin[2][i] = g[0] * ab;
    return 0;
}

static const ad_custom_op dot3_rec = {"dot3", dot3_fwd, dot3_bwd, NULL, dot3_shape, NULL, sizeof(dot3_saved)};
static const ad_custom_op dot3_arr = {"dot3_arr", dot3_fwd, NULL, dot3_bwd_array, dot3_shape, NULL,
                                      sizeof(dot3_saved)};

/* ---- functions under check ---- */
static ad_tensor *f_asin(ad_tape *T, ad_tensor **x, void *ctx)
{
    const ad_custom_op *op = (const ad_custom_op *)ctx;
    ad_tensor *y = ad_custom(T, op, 2, x);
    return ad_mul(T, y, y); /* something after the op, so that its incoming gradient is not ones */
}

static ad_tensor *f_asin_builtin(ad_tape *T, ad_tensor **x, void *ctx)
{
    ad_tensor *y = ad_mul(T, x[0], ad_sin(T, x[1]));
    (void)ctx;
    return ad_mul(T, y, y);
}

static ad_tensor *f_dot3(ad_tape *T, ad_tensor **x, void *ctx)
{
    const ad_custom_op *op = (const ad_custom_op *)ctx;
    return ad_tanh(T, ad_custom(T, op, 3, x));
}

/* public-checker form */
static ad_tensor *g_asin(ad_tape *T, ad_tensor *const *x, void *ctx)
{
    return f_asin(T, (ad_tensor **)x, ctx);
}

/* ---- deliberately wrong derivatives, for the checker ---- */
/* y = x^3 whose first derivative is wrong at flat index 4 of input 1 */
static int cube_fwd(const ad_custom_call *c)
{
    size_t i;
    for (i = 0; i < c->out->size; i++) c->out->data[i] = c->in[0]->data[i] * c->in[0]->data[i] * c->in[0]->data[i];
    return 0;
}

static int cube_bwd_bad_first(const ad_custom_call *c, const ad_real *g, ad_real *const *gin)
{
    size_t i;
    for (i = 0; i < c->out->size; i++) gin[0][i] = g[i] * 3 * c->in[0]->data[i] * c->in[0]->data[i];
    if (c->out->size > 4) gin[0][4] *= 1.01; /* 1% off at one element */
    return 0;
}

/* right first derivative, wrong second: 3 x^2 recorded as 3 * x * stop(x), so d/dx of it is 3x
   instead of 6x */
static int cube_bwd_bad_second(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    ad_tensor *x = c->in[0];
    ad_tensor *xc = ad_tensor_new(T, x->ndim, x->shape, x->data, 0);
    gin[0] = ad_mul(T, g, ad_mul_scalar(T, ad_mul(T, x, xc), 3));
    return 0;
}

static int cube_bwd_good(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    gin[0] = ad_mul(T, g, ad_mul_scalar(T, ad_square(T, c->in[0]), 3));
    return 0;
}

static const ad_custom_op cube_bad1 = {"cube_bad1", cube_fwd, NULL, cube_bwd_bad_first, NULL, NULL, 0};
static const ad_custom_op cube_bad2 = {"cube_bad2", cube_fwd, cube_bwd_bad_second, NULL, NULL, NULL, 0};
static const ad_custom_op cube_good = {"cube", cube_fwd, cube_bwd_good, NULL, NULL, NULL, 0};

/* f(a, b) = sum(a) + cube(b): the op is on input 1 */
static ad_tensor *g_cube(ad_tape *T, ad_tensor *const *x, void *ctx)
{
    ad_tensor *b = x[1];
    return ad_add(T, ad_sum(T, x[0]), ad_custom(T, (const ad_custom_op *)ctx, 1, &b));
}

/* ---- user errors ---- */
static int bad_grad_mode;
static int err_bwd(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    (void)c;
    if (bad_grad_mode == 0) gin[0] = NULL;                              /* NULL gradient */
    else if (bad_grad_mode == 1) gin[0] = ad_sum(T, g);                 /* wrong shape */
    else if (bad_grad_mode == 2) return 7;                              /* failure code */
    return 0;
}
static int err_fwd_fails(const ad_custom_call *c)
{
    (void)c;
    return 3;
}
static int bad_shape(const ad_custom_call *c, int *ndim, int *shape)
{
    (void)c;
    *ndim = 1;
    shape[0] = -2;
    return 0;
}

static int count_checks(int before) { return th_passed + th_failed - before; }

static void test_custom_matches_builtin(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng r;
    int k, before = th_passed + th_failed;
    ad_rng_seed(&r, 5);
    for (k = 0; k < 2; k++) {
        const ad_custom_op *op = k ? &asin_arr : &asin_rec;
        ad_tensor *x[2], *xb[2], *y, *yb;
        size_t i;
        double e = 0, eg = 0;
        ad_tape_reset(T);
        x[0] = ad_rand(T, AD_SHAPE(3, 4), -2, 2, &r);
        x[1] = ad_rand(T, AD_SHAPE(3, 4), -2, 2, &r);
        ad_set_requires_grad(x[0], 1);
        ad_set_requires_grad(x[1], 1);
        xb[0] = ad_tensor_new(T, 2, x[0]->shape, x[0]->data, 1);
        xb[1] = ad_tensor_new(T, 2, x[1]->shape, x[1]->data, 1);
        y = ad_sum(T, f_asin(T, x, (void *)op));
        yb = ad_sum(T, f_asin_builtin(T, xb, NULL));
        TH_CHECK(y && yb && ad_backward(T, y) == 0 && ad_backward(T, yb) == 0, "%s: %s", op->name,
                 ad_tape_error(T));
        if (!y || !yb || !x[0]->grad || !x[1]->grad) continue;
        TH_CHECK(fabs(ad_item(y) - ad_item(yb)) < 1e-12, "%s: value %g vs %g", op->name, ad_item(y), ad_item(yb));
        for (i = 0; i < 12; i++) {
            e = fmax(e, fabs(x[0]->grad[i] - xb[0]->grad[i]));
            eg = fmax(eg, fabs(x[1]->grad[i] - xb[1]->grad[i]));
        }
        TH_CHECK(e < 1e-12 && eg < 1e-12, "%s: gradients differ from the built-in ops' by %g, %g", op->name, e, eg);
    }
    /* a constant input (no grad): only the other gets a gradient, and the backward is told */
    {
        ad_tensor *x[2], *y;
        asin_bwd_array_calls = 0;
        ad_tape_reset(T);
        x[0] = ad_tensor_new(T, AD_SHAPE(4), (const ad_real[]){1, 2, 3, 4}, 0);
        x[1] = ad_tensor_new(T, AD_SHAPE(4), (const ad_real[]){0.1, 0.2, 0.3, 0.4}, 1);
        y = ad_sum(T, ad_custom(T, &asin_arr, 2, x));
        TH_CHECK(y && ad_backward(T, y) == 0, "constant input: %s", ad_tape_error(T));
        TH_CHECK(x[0]->grad == NULL, "a constant input got a gradient");
        TH_CHECK(x[1]->grad && fabs(x[1]->grad[2] - 3 * cos(0.3)) < 1e-12, "d/db wrong");
        TH_CHECK(asin_bwd_array_calls == 1, "backward called %d times", asin_bwd_array_calls);
        /* nothing requires grad: nothing recorded, the value still computed */
        ad_tape_reset(T);
        x[0] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){2, 3}, 0);
        x[1] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){0.5, 1}, 0);
        y = ad_custom(T, &asin_rec, 2, x);
        TH_CHECK(y && ad_tape_length(T) == 0 && fabs(y->data[1] - 3 * sin(1.0)) < 1e-12, "constant op");
        /* a NULL input passes through without a message */
        x[0] = NULL;
        TH_CHECK(ad_custom(T, &asin_rec, 2, x) == NULL && !ad_tape_error(T), "NULL input: %s", ad_tape_error(T));
    }
    ad_tape_free(T);
    printf("  custom ops against built-in ops        %d checks\n", count_checks(before));
}

static void test_custom_gradcheck(void)
{
    int before = th_passed + th_failed;
    th_input s2[2], s3[3];
    s2[0] = th_in(AD_SHAPE(2, 3), -1.5, 1.5, 0);
    s2[1] = th_in(AD_SHAPE(2, 3), -2, 2, 0);
    th_gradcheck("asin recorded", f_asin, (void *)&asin_rec, 2, s2);
    th_gradcheck("asin on arrays", f_asin, (void *)&asin_arr, 2, s2);
    th_gradgradcheck("asin recorded", f_asin, (void *)&asin_rec, 2, s2);
    s3[0] = th_in(AD_SHAPE(5), -1, 1, 0);
    s3[1] = th_in(AD_SHAPE(5), -1, 1, 0);
    s3[2] = th_in(AD_SHAPE(2, 2), -0.5, 1, 0);
    th_gradcheck("dot3 recorded", f_dot3, (void *)&dot3_rec, 3, s3);
    th_gradcheck("dot3 on arrays, saved bytes", f_dot3, (void *)&dot3_arr, 3, s3);
    th_gradgradcheck("dot3 recorded", f_dot3, (void *)&dot3_rec, 3, s3);
    printf("  custom ops against finite differences  %d checks\n", count_checks(before));
}

/* ad_hessian-style: the Hessian-vector product through the recorded op equals the built-in's */
static void test_custom_create_graph(void)
{
    ad_tape *T = ad_tape_new();
    int before = th_passed + th_failed, k;
    double h[2][4];
    for (k = 0; k < 2; k++) {
        ad_tensor *x[2], *y, *g0, *g1, *s;
        size_t i;
        ad_tape_reset(T);
        x[0] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){0.7, -1.2}, 1);
        x[1] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){0.3, 2.1}, 1);
        y = ad_sum(T, k ? f_asin_builtin(T, x, NULL) : f_asin(T, x, (void *)&asin_rec));
        g0 = ad_grad(T, y, x[0], 1);
        g1 = ad_grad(T, y, x[1], 1);
        s = ad_add(T, ad_sum(T, g0), ad_sum(T, ad_mul_scalar(T, g1, 2)));
        TH_CHECK(s && ad_backward(T, s) == 0 && x[0]->grad && x[1]->grad, "create_graph: %s", ad_tape_error(T));
        for (i = 0; i < 2; i++) {
            h[k][i] = x[0]->grad ? x[0]->grad[i] : NAN;
            h[k][2 + i] = x[1]->grad ? x[1]->grad[i] : NAN;
        }
    }
    for (k = 0; k < 4; k++)
        TH_CHECK(fabs(h[0][k] - h[1][k]) < 1e-12 && h[0][k] != 0, "Hv[%d]: %g vs built-in %g", k, h[0][k], h[1][k]);
    /* third order: d/dx of d2/dx2 of cube(x) = 6 */
    {
        ad_tensor *x = ad_tensor_new(T, AD_SHAPE(1), (const ad_real[]){0.4}, 1), *g1, *g2, *g3;
        ad_tape_reset(T);
        x = ad_tensor_new(T, AD_SHAPE(1), (const ad_real[]){0.4}, 1);
        g1 = ad_grad(T, ad_sum(T, ad_custom(T, &cube_good, 1, &x)), x, 1);
        g2 = ad_grad(T, ad_sum(T, g1), x, 1);
        g3 = ad_grad(T, ad_sum(T, g2), x, 0);
        TH_CHECK(g1 && g2 && g3 && fabs(g1->data[0] - 0.48) < 1e-12 && fabs(g2->data[0] - 2.4) < 1e-12 &&
                     fabs(g3->data[0] - 6) < 1e-12,
                 "third order through a custom op: %s", ad_tape_error(T));
    }
    /* create_graph through a backward on arrays: a clear error naming the op */
    {
        ad_tensor *x[2], *y;
        ad_tape_reset(T);
        x[0] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){1, 2}, 1);
        x[1] = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){3, 4}, 1);
        y = ad_sum(T, ad_custom(T, &asin_arr, 2, x));
        TH_CHECK(ad_grad(T, y, x[0], 1) == NULL, "create_graph through backward_array succeeded");
        TH_CHECK_ERROR(T, "ad_custom \"asin_arr\": create_graph through an op whose backward is on arrays");
        ad_tape_clear_error(T);
        TH_CHECK(ad_grad(T, y, x[0], 0) != NULL && !ad_tape_error(T), "first order after: %s", ad_tape_error(T));
    }
    ad_tape_free(T);
    printf("  create_graph through custom ops        %d checks\n", count_checks(before));
}

static void test_custom_errors(void)
{
    ad_tape *T = ad_tape_new();
    int before = th_passed + th_failed;
    ad_tensor *x, *y, *in[AD_CUSTOM_MAX_INPUTS + 1];
    ad_custom_op op;
    int i;
    const char *wants[3] = {"ad_custom \"errop\" backward: the gradient of input 0 is NULL",
                            "ad_custom \"errop\" backward: the gradient of input 0 has shape []; the input has shape [3]",
                            "ad_custom \"errop\" backward: returned 7"};
    memset(&op, 0, sizeof op);
    op.name = "errop";
    op.forward = cube_fwd;
    op.backward = err_bwd;
    for (bad_grad_mode = 0; bad_grad_mode < 3; bad_grad_mode++) {
        ad_tape_reset(T);
        x = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
        y = ad_sum(T, ad_custom(T, &op, 1, &x));
        TH_CHECK(y && ad_backward(T, y) == -1, "bad backward %d accepted", bad_grad_mode);
        TH_CHECK_ERROR(T, wants[bad_grad_mode]);
    }
    /* the forward fails */
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    op.forward = err_fwd_fails;
    TH_CHECK(ad_custom(T, &op, 1, &x) == NULL, "failing forward accepted");
    TH_CHECK_ERROR(T, "ad_custom \"errop\": the forward returned 3");
    /* a bad output shape */
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    op.forward = cube_fwd;
    op.shape = bad_shape;
    TH_CHECK(ad_custom(T, &op, 1, &x) == NULL, "bad shape accepted");
    TH_CHECK_ERROR(T, "ad_custom \"errop\": shape [-2]: dimension 0 is -2");
    op.shape = NULL;
    /* no backward while an input requires grad; fine in no-grad mode */
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    op.backward = NULL;
    TH_CHECK(ad_custom(T, &op, 1, &x) == NULL, "op without backward accepted");
    TH_CHECK_ERROR(T, "ad_custom \"errop\": an input requires grad but the op has no backward");
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    ad_set_grad_enabled(T, 0);
    TH_CHECK(ad_custom(T, &op, 1, &x) != NULL, "no-grad mode: %s", ad_tape_error(T));
    ad_set_grad_enabled(T, 1);
    /* no forward, too many inputs, NULL op, a tensor of another tape */
    op.forward = NULL;
    TH_CHECK(ad_custom(T, &op, 1, &x) == NULL, "no forward accepted");
    TH_CHECK_ERROR(T, "ad_custom \"errop\": the op has no forward function");
    ad_tape_clear_error(T);
    op.forward = cube_fwd;
    for (i = 0; i <= AD_CUSTOM_MAX_INPUTS; i++) in[i] = x;
    TH_CHECK(ad_custom(T, &op, AD_CUSTOM_MAX_INPUTS + 1, in) == NULL, "17 inputs accepted");
    TH_CHECK_ERROR(T, "ad_custom \"errop\": 17 inputs; between 1 and 16 are supported");
    ad_tape_clear_error(T);
    TH_CHECK(ad_custom(T, NULL, 1, &x) == NULL, "NULL op accepted");
    TH_CHECK_ERROR(T, "ad_custom: op is NULL");
    ad_tape_clear_error(T);
    {
        ad_tape *U = ad_tape_new();
        ad_tensor *u = ad_tensor_new(U, AD_SHAPE(3), NULL, 1);
        TH_CHECK(ad_custom(T, &op, 1, &u) == NULL, "another tape's tensor accepted");
        TH_CHECK_ERROR(T, "ad_custom \"errop\": input 0 belongs to another tape");
        ad_tape_free(U);
    }
    /* the descriptor is copied: a local one that changes after the op is applied */
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(2), (const ad_real[]){1, 2}, 1);
    {
        char name[16] = "local";
        op.backward = cube_bwd_good;
        op.name = name;
        y = ad_sum(T, ad_custom(T, &op, 1, &x));
        op.backward = err_bwd;
        bad_grad_mode = 0;
        strcpy(name, "changed");
        TH_CHECK(y && ad_backward(T, y) == 0 && x->grad && fabs(x->grad[1] - 12) < 1e-12,
                 "copied descriptor: %s", ad_tape_error(T));
    }
    ad_tape_free(T);
    printf("  custom op errors                       %d checks\n", count_checks(before));
}

static ad_tensor *g_fails(ad_tape *T, ad_tensor *const *x, void *ctx)
{
    (void)ctx;
    return ad_matmul(T, x[0], x[0]);
}

static void test_gradcheck_itself(void)
{
    ad_tape *T = ad_tape_new();
    ad_gradcheck_options opt;
    ad_gradcheck_result res;
    ad_tensor *x[2];
    ad_rng r;
    int before = th_passed + th_failed, rc;
    ad_rng_seed(&r, 11);
    x[0] = ad_rand(T, AD_SHAPE(3), -1, 1, &r);
    x[1] = ad_rand(T, AD_SHAPE(2, 4), 0.5, 1.5, &r);
    ad_set_requires_grad(x[0], 1);
    ad_set_requires_grad(x[1], 1);
    /* correct ops pass, with small errors, at both orders */
    memset(&opt, 0, sizeof opt);
    opt.orders = 3;
    rc = ad_gradcheck(T, g_cube, (void *)&cube_good, 2, x, &opt, &res);
    TH_CHECK(rc == 0 && res.passed && res.mismatches == 0 && res.checked == 2 * 11 && res.max_ratio <= 1 &&
                 res.max_error < 1e-6,
             "good op: rc %d, %s", rc, res.message);
    rc = ad_gradcheck(T, g_asin, (void *)&asin_rec, 2, (ad_tensor *[]){x[1], x[1]}, NULL, &res);
    TH_CHECK(rc == 0 && res.checked == 16, "default options: rc %d, %s", rc, res.message);
    /* a first derivative 1% off at input 1 [4]: caught and named */
    rc = ad_gradcheck(T, g_cube, (void *)&cube_bad1, 2, x, NULL, &res);
    TH_CHECK(rc == 1 && !res.passed && res.mismatches == 1 && res.order == 1 && res.input == 1 && res.index == 4,
             "wrong first derivative: rc %d, %s", rc, res.message);
    TH_CHECK(fabs(res.analytic - 1.01 * res.numeric) < 1e-6 * fabs(res.numeric) && res.max_ratio > 1 &&
                 res.max_error > 1e-3 * fabs(res.numeric),
             "the worst element's values: %s", res.message);
    TH_CHECK(strstr(res.message, "FAILED") && strstr(res.message, "input 1 [4]"), "message: %s", res.message);
    TH_CHECK(!ad_tape_error(T), "a mismatch is not a tape error: %s", ad_tape_error(T));
    /* a wrong second derivative: first order passes, second order names an element of input 1 */
    opt.orders = 1;
    rc = ad_gradcheck(T, g_cube, (void *)&cube_bad2, 2, x, &opt, &res);
    TH_CHECK(rc == 0, "first order of cube_bad2: %s", res.message);
    opt.orders = 2;
    rc = ad_gradcheck(T, g_cube, (void *)&cube_bad2, 2, x, &opt, &res);
    TH_CHECK(rc == 1 && res.order == 2 && res.input == 1 && res.mismatches >= 1, "wrong second derivative: rc %d, %s",
             rc, res.message);
    /* input 0 enters linearly: its second derivatives are 0 and correct */
    TH_CHECK(res.mismatches <= 8, "mismatches %zu", res.mismatches);
    /* inputs that do not require grad are not checked */
    ad_set_requires_grad(x[1], 0);
    rc = ad_gradcheck(T, g_cube, (void *)&cube_bad1, 2, x, NULL, &res);
    TH_CHECK(rc == 0 && res.checked == 3, "constant input checked: rc %d, checked %zu", rc, res.checked);
    ad_set_requires_grad(x[0], 0);
    rc = ad_gradcheck(T, g_cube, (void *)&cube_good, 2, x, NULL, &res);
    TH_CHECK(rc == -1, "nothing to check: rc %d", rc);
    TH_CHECK_ERROR(T, "ad_gradcheck: no input requires grad");
    ad_tape_clear_error(T);
    ad_set_requires_grad(x[0], 1);
    /* f fails: -1 and f's own error */
    rc = ad_gradcheck(T, g_fails, NULL, 1, x + 1, NULL, &res);
    TH_CHECK(rc == -1 && strstr(res.message, "ad_matmul"), "failing f: rc %d, %s", rc, res.message);
    TH_CHECK_ERROR(T, "ad_gradcheck: f failed: ad_matmul");
    ad_tape_clear_error(T);
    TH_CHECK(ad_gradcheck(T, NULL, NULL, 1, x, NULL, NULL) == -1, "NULL f");
    TH_CHECK_ERROR(T, "ad_gradcheck: f is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_gradcheck(T, g_cube, (void *)&cube_good, 0, x, NULL, NULL) == -1, "n 0");
    TH_CHECK_ERROR(T, "ad_gradcheck: 0 inputs");
    ad_tape_free(T);
    printf("  ad_gradcheck itself                    %d checks\n", count_checks(before));
}

int main(void)
{
    test_custom_matches_builtin();
    test_custom_gradcheck();
    test_custom_create_graph();
    test_custom_errors();
    test_gradcheck_itself();
    return th_summary();
}
