/* The autograd features together: Jacobians, Hessians and vector products through custom ops of
   both kinds, gradient hooks during ad_vjp and ad_jacobian, anomaly mode inside a Hessian, and a
   picture of a graph that holds a custom op. Each feature has its own tests; these check that
   they compose as a user would combine them. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#include <string.h>

/* y = x^3 elementwise: a backward recorded with ops, and the same on arrays */
static int cube_fwd(const ad_custom_call *c)
{
    size_t i;
    for (i = 0; i < c->out->size; i++) c->out->data[i] = c->in[0]->data[i] * c->in[0]->data[i] * c->in[0]->data[i];
    return 0;
}

static int cube_bwd(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
{
    gin[0] = ad_mul(T, g, ad_mul_scalar(T, ad_square(T, c->in[0]), 3));
    return 0;
}

static int cube_bwd_array(const ad_custom_call *c, const ad_real *g, ad_real *const *gin)
{
    size_t i;
    for (i = 0; i < c->out->size; i++) gin[0][i] = g[i] * 3 * c->in[0]->data[i] * c->in[0]->data[i];
    return 0;
}

static const ad_custom_op cube_rec = {"cube_rec", cube_fwd, cube_bwd, NULL, NULL, NULL, 0};
static const ad_custom_op cube_arr = {"cube_arr", cube_fwd, NULL, cube_bwd_array, NULL, NULL, 0};

static int hook_calls;
static ad_tensor *double_it(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)x;
    (void)ctx;
    hook_calls++;
    return ad_mul_scalar(T, grad, 2);
}

/* The Jacobian of W cube(x) is W diag(3 x^2), by either kind of custom op (reverse mode: two
   rows, three columns); the Hessian of sum(cube(x)) is diag(6 x), through the recorded kind. */
static void jacobian_and_hessian_through_custom_ops(void)
{
    double xv[3] = {0.5, -1.25, 2.0}, wv[6] = {1, 2, 3, -1, 0.5, 4};
    int k;
    for (k = 0; k < 2; k++) {
        ad_tape *T = ad_tape_new();
        int s3[1] = {3}, s23[2] = {2, 3};
        ad_tensor *x = ad_tensor_new(T, 1, s3, xv, 1), *W = ad_tensor_new(T, 2, s23, wv, 0);
        ad_tensor *y = ad_matmul(T, W, ad_reshape(T, ad_custom(T, k ? &cube_arr : &cube_rec, 1, &x), 2,
                                                  (int[]){3, 1}));
        ad_tensor *J = ad_jacobian(T, ad_reshape(T, y, 1, (int[]){2}), x, 0);
        double worst = 0;
        int i, j;
        TH_CHECK(J && J->ndim == 2 && J->shape[0] == 2 && J->shape[1] == 3, "%s: Jacobian's shape: %s",
                 k ? "arrays" : "recorded", th_errs(T));
        for (i = 0; J && i < 2; i++)
            for (j = 0; j < 3; j++)
                worst = fmax(worst, fabs(J->data[i * 3 + j] - wv[i * 3 + j] * 3 * xv[j] * xv[j]));
        TH_CHECK(J && worst < 1e-12, "%s: Jacobian differs from W diag(3 x^2) by %g", k ? "arrays" : "recorded",
                 worst);
        ad_tape_free(T);
    }
    {
        ad_tape *T = ad_tape_new();
        int s3[1] = {3};
        ad_tensor *x = ad_tensor_new(T, 1, s3, xv, 1);
        ad_tensor *H = ad_hessian(T, ad_sum(T, ad_custom(T, &cube_rec, 1, &x)), x, 0);
        double worst = 0;
        int i, j;
        for (i = 0; H && i < 3; i++)
            for (j = 0; j < 3; j++) worst = fmax(worst, fabs(H->data[i * 3 + j] - (i == j ? 6 * xv[i] : 0)));
        TH_CHECK(H && worst < 1e-12, "Hessian through a recorded custom op: error %g (%s)", worst, th_errs(T));
        ad_tape_free(T);
    }
    /* a Hessian needs a recorded backward: through the array kind it is refused, naming the op */
    {
        ad_tape *T = ad_tape_new();
        int s3[1] = {3};
        ad_tensor *x = ad_tensor_new(T, 1, s3, xv, 1);
        ad_tensor *H = ad_hessian(T, ad_sum(T, ad_custom(T, &cube_arr, 1, &x)), x, 0);
        TH_CHECK(!H && strstr(th_errs(T), "cube_arr") != NULL, "Hessian through an array backward: %s", th_errs(T));
        ad_tape_free(T);
    }
}

/* ad_jvp through a recorded custom op: J u = 3 x^2 u */
static void jvp_through_custom_op(void)
{
    double xv[4] = {1, -2, 0.5, 3}, uv[4] = {0.25, 1, -1, 2};
    ad_tape *T = ad_tape_new();
    int s4[1] = {4}, i;
    ad_tensor *x = ad_tensor_new(T, 1, s4, xv, 1), *u = ad_tensor_new(T, 1, s4, uv, 0);
    ad_tensor *Ju = ad_jvp(T, ad_custom(T, &cube_rec, 1, &x), x, u, 0);
    double worst = 0;
    for (i = 0; Ju && i < 4; i++) worst = fmax(worst, fabs(Ju->data[i] - 3 * xv[i] * xv[i] * uv[i]));
    TH_CHECK(Ju && worst < 1e-12, "jvp through a custom op: error %g (%s)", worst, th_errs(T));
    ad_tape_free(T);
}

/* A hook that doubles the gradient reaching an intermediate h acts in ad_vjp and in each
   row of ad_jacobian, as it does in ad_backward. */
static void hooks_in_vector_products(void)
{
    double xv[3] = {0.5, 1.5, -2};
    ad_tape *T = ad_tape_new();
    int s3[1] = {3}, i;
    ad_tensor *x = ad_tensor_new(T, 1, s3, xv, 1), *h = ad_mul_scalar(T, x, 3), *y = ad_square(T, h), *v, *J;
    TH_CHECK(ad_register_hook(h, double_it, NULL) == 0, "register_hook: %s", th_errs(T));
    hook_calls = 0;
    v = ad_vjp(T, y, x, ad_full(T, 1, s3, 1), 0);
    /* dy/dx = 2 h * 3, doubled at h */
    for (i = 0; v && i < 3; i++) TH_CHECK(fabs(v->data[i] - 2 * 2 * (3 * xv[i]) * 3) < 1e-12, "vjp with hook [%d]", i);
    TH_CHECK(v && hook_calls == 1, "the hook ran %d times in one vjp", hook_calls);
    hook_calls = 0;
    J = ad_jacobian(T, y, x, 0);
    for (i = 0; J && i < 9; i++)
        TH_CHECK(fabs(J->data[i] - (i % 4 == 0 ? 2 * 2 * (3 * xv[i / 4]) * 3 : 0)) < 1e-12, "Jacobian with hook [%d]",
                 i);
    TH_CHECK(J && hook_calls >= 1, "the hook ran %d times in a Jacobian", hook_calls);
    ad_tape_free(T);
}

/* In anomaly mode, a Hessian whose backward makes an Inf (sqrt at 0) names the op and the
   input's name; the same Hessian away from 0 runs clean and gives the closed form. */
static void anomaly_inside_hessian(void)
{
    int s2[1] = {2}, k;
    for (k = 0; k < 2; k++) {
        double xv[2] = {k ? 4.0 : 0.0, 9.0};
        ad_tape *T = ad_tape_new();
        ad_tensor *x = ad_set_name(ad_tensor_new(T, 1, s2, xv, 1), "x"), *H;
        ad_set_detect_anomaly(T, 1);
        H = ad_hessian(T, ad_sum(T, ad_sqrt(T, x)), x, 0);
        if (k == 0) {
            TH_CHECK(!H && strstr(th_errs(T), "ad_sqrt backward") && strstr(th_errs(T), "\"x\""),
                     "anomaly at sqrt(0) in a Hessian: %s", th_errs(T));
        } else {
            /* d2/dx2 sqrt(x) = -x^(-3/2) / 4 */
            TH_CHECK(H && fabs(H->data[0] + 0.25 / 8) < 1e-12 && fabs(H->data[3] + 0.25 / 27) < 1e-12 &&
                         H->data[1] == 0 && H->data[2] == 0,
                     "clean Hessian in anomaly mode: %s", th_errs(T));
        }
        ad_tape_free(T);
    }
}

/* The picture of a graph with a custom op names the op and the named leaf. */
static void picture_with_custom_op(void)
{
    const char *path = "build/tests/autograd_mix.dot";
    double xv[2] = {1, 2};
    ad_tape *T = ad_tape_new();
    int s2[1] = {2};
    ad_tensor *x = ad_set_name(ad_tensor_new(T, 1, s2, xv, 1), "position");
    ad_tensor *y = ad_sum(T, ad_custom(T, &cube_rec, 1, &x));
    char text[8192];
    size_t n = 0;
    FILE *f;
    TH_CHECK(ad_tape_write_dot(T, y, path) == 0, "write_dot: %s", th_errs(T));
    f = fopen(path, "rb");
    if (f) {
        n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
    }
    text[n] = 0;
    TH_CHECK(strstr(text, "digraph") && strstr(text, "cube_rec") && strstr(text, "position"),
             "the picture names the custom op and the leaf:\n%s", text);
    remove(path);
    ad_tape_free(T);
}

int main(void)
{
    jacobian_and_hessian_through_custom_ops();
    jvp_through_custom_op();
    hooks_in_vector_products();
    anomaly_inside_hessian();
    picture_with_custom_op();
    return th_summary();
}
