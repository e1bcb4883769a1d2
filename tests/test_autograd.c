/* ad_grads, ad_vjp, ad_jvp, ad_jacobian, ad_hessian and ad_detach (>>api:backward), and ad_item
   on more than one element: each against closed forms (Jacobians of linear maps W x, Hessians
   of the quadratic x^T A x and of Rosenbrock's function) and against central finite
   differences, on non-scalar outputs, several inputs and outputs, inputs with no route; every
   helper through create_graph (jvp of a vjp, the Hessian of a function that calls ad_grad(..., 1),
   the Jacobian of a gradient, third derivatives); bad arguments, whose messages name the function
   and the shapes. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

static int close_to(double a, double b, double tol) { return fabs(a - b) <= tol * (1 + fabs(b)); }

/* Whether t has the given shape. */
static int has_shape(const ad_tensor *t, int ndim, const int *shape)
{
    int i;
    if (!t || t->ndim != ndim) return 0;
    for (i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return 0;
    return 1;
}

/* A function under test: y from x on T. */
typedef ad_tensor *(*fn_t)(ad_tape *T, ad_tensor *x);

/* Central differences of every element of f(x) in every element of x: fd[i * n + j] = d y_i / d x_j. */
static void fd_jacobian(fn_t f, int ndim, const int *shape, const double *x0, size_t n, double *fd, size_t m)
{
    double *x = (double *)malloc(n * sizeof(double));
    size_t i, j;
    for (j = 0; j < n; j++) {
        double h = 1e-6 * (fabs(x0[j]) > 1 ? fabs(x0[j]) : 1), *yp = (double *)malloc(m * sizeof(double));
        int s;
        for (s = 0; s < 2; s++) {
            ad_tape *T = ad_tape_new();
            ad_tensor *y;
            memcpy(x, x0, n * sizeof(double));
            x[j] += s ? -h : h;
            y = f(T, ad_tensor_new(T, ndim, shape, x, 1));
            for (i = 0; i < m; i++) {
                if (!s) yp[i] = y->data[i];
                else fd[i * n + j] = (yp[i] - y->data[i]) / (2 * h);
            }
            ad_tape_free(T);
        }
        free(yp);
    }
    free(x);
}

static const double Wv[15] = {0.5, -1, 0.25, 0.8, -0.3, 0.7, 1.1, -0.6, 0.9, 0.2, -0.4, 0.35, 1.5, -0.2, 0.05};

/* W x for W [rows, cols] (first rows*cols of Wv) and x [cols]: a linear map */
static ad_tensor *linear_map(ad_tape *T, ad_tensor *x, int rows, int cols)
{
    int ws[2], xs[2];
    ws[0] = rows; ws[1] = cols; xs[0] = cols; xs[1] = 1;
    return ad_reshape(T, ad_matmul(T, ad_tensor_new(T, 2, ws, Wv, 0), ad_reshape(T, x, 2, xs)), 1, ws);
}

/* a smooth map [2,3] -> [3,2]: tanh(x^T M) * x0 + sin(x^T) */
static ad_tensor *smooth(ad_tape *T, ad_tensor *x)
{
    static const double mv[4] = {0.7, -0.2, 0.4, 1.3};
    int ms[2] = {2, 2};
    ad_tensor *xt = ad_transpose(T, x, 0, 1), *M = ad_tensor_new(T, 2, ms, mv, 0);
    ad_tensor *a = ad_tanh(T, ad_matmul(T, xt, M));
    return ad_add(T, ad_mul(T, a, ad_slice(T, ad_reshape(T, x, 1, (int[]){6}), 0, 0, 1)), ad_sin(T, xt));
}

/* Rosenbrock's function sum_i 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2 of x [n] */
static ad_tensor *rosenbrock(ad_tape *T, ad_tensor *x)
{
    int n = x->shape[0];
    ad_tensor *head = ad_slice(T, x, 0, 0, n - 1), *tail = ad_slice(T, x, 0, 1, n);
    ad_tensor *d = ad_sub(T, tail, ad_square(T, head));
    ad_tensor *e = ad_sub(T, ad_scalar(T, 1), head);
    return ad_sum(T, ad_add(T, ad_mul(T, ad_scalar(T, 100), ad_square(T, d)), ad_square(T, e)));
}

/* y = [x^2, x^3, x^4] for a scalar x */
static ad_tensor *powers(ad_tape *T, ad_tensor *x)
{
    ad_tensor *p[3];
    p[0] = ad_pow(T, x, 2);
    p[1] = ad_pow(T, x, 3);
    p[2] = ad_pow(T, x, 4);
    return ad_stack(T, p, 3, 0);
}

static void test_grads(void)
{
    ad_tape *T = ad_tape_new();
    double av[3] = {0.3, -1.2, 0.8}, bv[4] = {0.5, 1.5, -0.7, 0.2}, vv[3] = {1.5, -2, 0.25};
    int s3[1] = {3}, s22[2] = {2, 2};
    ad_tensor *a = ad_tensor_new(T, 1, s3, av, 1), *b = ad_tensor_new(T, 2, s22, bv, 1);
    ad_tensor *c = ad_tensor_new(T, 2, s22, NULL, 1), *v = ad_tensor_new(T, 1, s3, vv, 0);
    ad_tensor *ys[2], *seeds[2], *xs[3], *out[3];
    int i, ok;
    /* y1 = exp(a) * sum(b) seeded with v; y2 = sum(sin(b)) * a[0], a scalar seeded with ones */
    ys[0] = ad_mul(T, ad_exp(T, a), ad_sum(T, b));
    ys[1] = ad_mul(T, ad_sum(T, ad_sin(T, b)), ad_slice(T, a, 0, 0, 1));
    seeds[0] = v;
    seeds[1] = NULL;
    xs[0] = a; xs[1] = b; xs[2] = c;
    TH_CHECK(ad_grads(T, 2, ys, seeds, 3, xs, out, 0) == 0, "ad_grads: %s", th_errs(T));
    if (out[0] && out[1] && out[2]) {
        double sb = 0, ssin = 0, dot = 0;
        for (i = 0; i < 4; i++) { sb += bv[i]; ssin += sin(bv[i]); }
        for (i = 0; i < 3; i++) dot += vv[i] * exp(av[i]);
        ok = has_shape(out[0], 1, s3) && has_shape(out[1], 2, s22) && has_shape(out[2], 2, s22);
        TH_CHECK(ok, "ad_grads: the results do not have their inputs' shapes");
        for (i = 0; i < 3; i++)
            TH_CHECK(close_to(out[0]->data[i], vv[i] * exp(av[i]) * sb + (i == 0) * ssin, 1e-13),
                     "ad_grads d/da[%d] = %.17g", i, out[0]->data[i]);
        for (i = 0; i < 4; i++) {
            TH_CHECK(close_to(out[1]->data[i], dot + cos(bv[i]) * av[0], 1e-13), "ad_grads d/db[%d] = %.17g", i,
                     out[1]->data[i]);
            TH_CHECK(out[2]->data[i] == 0, "ad_grads: an input with no route gets %g", out[2]->data[i]);
        }
    }
    TH_CHECK(a->grad == NULL && b->grad == NULL, "ad_grads wrote into a grad field");
    /* create_graph: the result is differentiable in x and in the seed */
    {
        ad_tensor *vg = ad_tensor_new(T, 1, s3, vv, 1), *g;
        seeds[0] = vg;
        TH_CHECK(ad_grads(T, 1, ys, seeds, 1, xs, out, 1) == 0 && out[0]->requires_grad, "ad_grads recorded: %s",
                 th_errs(T));
        /* out = v * exp(a) * sum(b): d sum(out) / d v = exp(a) sum(b) */
        g = ad_grad(T, ad_sum(T, out[0]), vg, 0);
        for (i = 0, ok = g != NULL; g && i < 3; i++)
            ok &= close_to(g->data[i], exp(av[i]) * (bv[0] + bv[1] + bv[2] + bv[3]), 1e-13);
        TH_CHECK(ok, "ad_grads: the derivative in the seed: %s", th_errs(T));
        g = ad_grad(T, ad_sum(T, out[0]), a, 0);
        for (i = 0, ok = g != NULL; g && i < 3; i++)
            ok &= close_to(g->data[i], vv[i] * exp(av[i]) * (bv[0] + bv[1] + bv[2] + bv[3]), 1e-13);
        TH_CHECK(ok, "ad_grads: the derivative of a recorded result in x: %s", th_errs(T));
    }
    /* an output that does not require grad contributes nothing; the same input twice */
    {
        ad_tensor *k = ad_scalar(T, 3), *two[2], *o2[2];
        two[0] = k; two[1] = ad_sum(T, ad_square(T, a));
        xs[0] = a; xs[1] = a;
        TH_CHECK(ad_grads(T, 2, two, NULL, 2, xs, o2, 0) == 0 && o2[0] && o2[1], "ad_grads: %s", th_errs(T));
        for (i = 0, ok = 1; o2[0] && i < 3; i++) ok &= o2[0]->data[i] == 2 * av[i] && o2[1]->data[i] == 2 * av[i];
        TH_CHECK(ok, "ad_grads with a constant output and a repeated input");
    }
    TH_CHECK(ad_tape_error(T) == NULL, "error left: %s", th_errs(T));
    ad_tape_free(T);
}

static ad_tensor *lin53(ad_tape *T, ad_tensor *x) { return linear_map(T, x, 5, 3); }
static ad_tensor *lin24(ad_tape *T, ad_tensor *x) { return linear_map(T, x, 2, 4); }

static void test_linear(void)
{
    /* the Jacobian of W x is W, by rows (W [2,4]) and by columns (W [5,3]); vjp W^T v, jvp W u */
    int k;
    for (k = 0; k < 2; k++) {
        int rows = k ? 5 : 2, cols = k ? 3 : 4, i, j, ok = 1, ys[1], xs[1];
        double xv[4] = {0.1, -0.5, 2, 0.7}, vv[5] = {1, -1, 0.5, 2, 0.3}, uv[4] = {-0.4, 1.1, 0.6, 2.5};
        ad_tape *T = ad_tape_new();
        ad_tensor *x, *y, *J, *vj, *ju;
        ys[0] = rows;
        xs[0] = cols;
        x = ad_tensor_new(T, 1, xs, xv, 1);
        y = linear_map(T, x, rows, cols);
        J = ad_jacobian(T, y, x, 0);
        TH_CHECK(J && J->ndim == 2 && J->shape[0] == rows && J->shape[1] == cols, "jacobian of W x [%d,%d]: %s",
                 rows, cols, th_errs(T));
        for (i = 0; J && i < rows * cols; i++) ok &= close_to(J->data[i], Wv[i], 1e-15);
        TH_CHECK(ok, "jacobian of W x is not W (%d x %d)", rows, cols);
        vj = ad_vjp(T, y, x, ad_tensor_new(T, 1, ys, vv, 0), 0);
        ju = ad_jvp(T, y, x, ad_tensor_new(T, 1, xs, uv, 0), 0);
        TH_CHECK(vj && ju && has_shape(vj, 1, xs) && has_shape(ju, 1, ys), "vjp, jvp of W x: %s", th_errs(T));
        for (j = 0, ok = vj != NULL; vj && j < cols; j++) {
            double want = 0;
            for (i = 0; i < rows; i++) want += vv[i] * Wv[i * cols + j];
            ok &= close_to(vj->data[j], want, 1e-14);
        }
        TH_CHECK(ok, "vjp of W x is not W^T v");
        for (i = 0, ok = ju != NULL; ju && i < rows; i++) {
            double want = 0;
            for (j = 0; j < cols; j++) want += Wv[i * cols + j] * uv[j];
            ok &= close_to(ju->data[i], want, 1e-14);
        }
        TH_CHECK(ok, "jvp of W x is not W u");
        ad_tape_free(T);
    }
    {
        /* finite differences agree with the plain-loop data just checked, for the functions as such */
        double xv[4] = {0.1, -0.5, 2, 0.7}, fd[20];
        int i, ok = 1;
        fd_jacobian(lin53, 1, (int[]){3}, xv, 3, fd, 5);
        for (i = 0; i < 15; i++) ok &= close_to(fd[i], Wv[i], 1e-8);
        fd_jacobian(lin24, 1, (int[]){4}, xv, 4, fd, 2);
        for (i = 0; i < 8; i++) ok &= close_to(fd[i], Wv[i], 1e-8);
        TH_CHECK(ok, "finite differences of W x");
    }
}

static void test_nonlinear(void)
{
    /* smooth: [2,3] -> [3,2]; its Jacobian [3,2,2,3] against finite differences, by both modes
       (6 = 6: rows), its jvp and vjp against the Jacobian */
    double xv[6] = {0.3, -0.8, 1.2, 0.5, -0.1, 0.9}, fd[36], uv[6] = {1, -0.5, 0.25, 2, 0.1, -1};
    double vv[6] = {0.2, 1, -1.5, 0.4, 0.6, -0.3};
    int s23[2] = {2, 3}, s32[2] = {3, 2}, js[4] = {3, 2, 2, 3}, i, j, ok = 1;
    ad_tape *T = ad_tape_new();
    ad_tensor *x = ad_tensor_new(T, 2, s23, xv, 1), *y = smooth(T, x), *J, *ju, *vj;
    fd_jacobian(smooth, 2, s23, xv, 6, fd, 6);
    J = ad_jacobian(T, y, x, 0);
    TH_CHECK(has_shape(J, 4, js), "jacobian [3,2] of [2,3]: shape %s",
             J ? ad_shape_str(J, (char[32]){0}, 32) : th_errs(T));
    for (i = 0; J && i < 36; i++) ok &= close_to(J->data[i], fd[i], 1e-7);
    TH_CHECK(J && ok, "jacobian of a smooth map against finite differences");
    ju = ad_jvp(T, y, x, ad_tensor_new(T, 2, s23, uv, 0), 0);
    vj = ad_vjp(T, y, x, ad_tensor_new(T, 2, s32, vv, 0), 0);
    TH_CHECK(has_shape(ju, 2, s32) && has_shape(vj, 2, s23), "jvp, vjp shapes: %s", th_errs(T));
    for (i = 0, ok = ju && vj; ok && i < 6; i++) {
        double a = 0, b = 0;
        for (j = 0; j < 6; j++) {
            a += fd[i * 6 + j] * uv[j];
            b += vv[j] * fd[j * 6 + i];
        }
        ok &= close_to(ju->data[i], a, 1e-7) && close_to(vj->data[i], b, 1e-7);
    }
    TH_CHECK(ok, "jvp and vjp of a smooth map against finite differences");
    ad_tape_free(T);

    /* a scalar x and y [3]: forward mode, shape [3]; a [3] x and a one-element y: shape [3] */
    T = ad_tape_new();
    {
        ad_tensor *s = ad_var(T, 1.5), *P = powers(T, s), *Js = ad_jacobian(T, P, s, 0);
        ad_tensor *v3 = ad_tensor_new(T, 1, (int[]){3}, xv, 1), *one = ad_reshape(T, ad_sum(T, ad_exp(T, v3)), 2, (int[]){1, 1});
        ad_tensor *Jo = ad_jacobian(T, one, v3, 0);
        TH_CHECK(has_shape(Js, 1, (int[]){3}) && close_to(Js->data[0], 3, 1e-14) &&
                     close_to(Js->data[1], 3 * 2.25, 1e-14) && close_to(Js->data[2], 4 * 3.375, 1e-14),
                 "jacobian of [x^2, x^3, x^4]: %s", th_errs(T));
        TH_CHECK(has_shape(Jo, 1, (int[]){3}) && close_to(Jo->data[2], exp(xv[2]), 1e-14),
                 "jacobian of a [1,1] y counts y as []: %s", th_errs(T));
    }
    ad_tape_free(T);
}

static void test_hessians(void)
{
    /* x^T A x with A not symmetric: H = A + A^T, for x [3] and for x [2,2] (shape [2,2,2,2]) */
    static const double Av[16] = {2, -1, 0.5, 3, 0.25, 1, -2, 0.7, 1.5, 0.3, -0.6, 4, 0.9, -1.1, 0.2, 0.1};
    double xv[4] = {0.4, -1.3, 0.9, 2.2};
    int n, i, j, ok;
    for (n = 3; n <= 4; n++) {
        ad_tape *T = ad_tape_new();
        int xs[2], as[2], hs[4];
        ad_tensor *x, *A, *f, *H, *x1;
        as[0] = as[1] = n;
        if (n == 3) { xs[0] = 3; } else { xs[0] = xs[1] = 2; }
        x = ad_tensor_new(T, n == 3 ? 1 : 2, xs, xv, 1);
        A = ad_tensor_new(T, 2, as, Av, 0);
        x1 = ad_reshape(T, x, 2, (int[]){n, 1});
        f = ad_sum(T, ad_mul(T, x1, ad_matmul(T, A, x1)));
        H = ad_hessian(T, f, x, 0);
        for (i = 0; i < x->ndim; i++) hs[i] = hs[i + x->ndim] = xs[i];
        TH_CHECK(has_shape(H, 2 * x->ndim, hs), "hessian of x^T A x: shape, %s", th_errs(T));
        for (i = 0, ok = H != NULL; H && i < n; i++)
            for (j = 0; j < n; j++) ok &= close_to(H->data[i * n + j], Av[i * n + j] + Av[j * n + i], 1e-14);
        TH_CHECK(ok, "hessian of x^T A x is not A + A^T (n %d)", n);
        ad_tape_free(T);
    }
    {
        /* Rosenbrock in 4 dimensions, against its closed form */
        ad_tape *T = ad_tape_new();
        ad_tensor *x = ad_tensor_new(T, 1, (int[]){4}, xv, 1), *H = ad_hessian(T, rosenbrock(T, x), x, 0);
        double want[16];
        memset(want, 0, sizeof want);
        for (i = 0; i < 3; i++) {
            want[i * 4 + i] += 1200 * xv[i] * xv[i] - 400 * xv[i + 1] + 2;
            want[i * 4 + i + 1] += -400 * xv[i];
            want[(i + 1) * 4 + i] += -400 * xv[i];
            want[(i + 1) * 4 + i + 1] += 200;
        }
        for (i = 0, ok = H != NULL; H && i < 16; i++) ok &= close_to(H->data[i], want[i], 1e-13);
        TH_CHECK(has_shape(H, 2, (int[]){4, 4}) && ok, "hessian of Rosenbrock: %s", th_errs(T));
        /* a one-element x of shape [1] gives [1, 1] */
        x = ad_tensor_new(T, 1, (int[]){1}, xv, 1);
        H = ad_hessian(T, ad_sum(T, ad_pow(T, x, 3)), x, 0);
        TH_CHECK(has_shape(H, 2, (int[]){1, 1}) && close_to(H->data[0], 6 * xv[0], 1e-14), "hessian of x^3, x [1]");
        ad_tape_free(T);
    }
}

static void test_no_route(void)
{
    ad_tape *T = ad_tape_new();
    double xv[3] = {1, 2, 3};
    ad_tensor *x = ad_tensor_new(T, 1, (int[]){3}, xv, 1), *z = ad_tensor_new(T, 1, (int[]){2}, xv, 1);
    ad_tensor *k = ad_tensor_new(T, 1, (int[]){3}, xv, 0);
    ad_tensor *y = ad_exp(T, z), *s = ad_sum(T, y), *r[6];
    int i, j, ok = 1;
    r[0] = ad_jacobian(T, y, x, 0);     /* [2,3] of zeros */
    r[1] = ad_hessian(T, s, x, 0);      /* [3,3] */
    r[2] = ad_vjp(T, y, x, ad_ones(T, 1, (int[]){2}), 0);
    r[3] = ad_jvp(T, y, x, k, 1);       /* [2] */
    r[4] = ad_jacobian(T, ad_exp(T, k), k, 1); /* neither requires grad: [3,3] */
    r[5] = ad_hessian(T, ad_sum(T, ad_mul(T, x, k)), x, 0); /* linear: a gradient with no route */
    for (i = 0; i < 6; i++) {
        TH_CHECK(r[i] != NULL, "no route %d: %s", i, th_errs(T));
        for (j = 0; r[i] && j < (int)r[i]->size; j++) ok &= r[i]->data[j] == 0;
    }
    TH_CHECK(ok && r[0] && r[0]->size == 6 && r[1]->size == 9 && r[2]->size == 3 && r[3]->size == 2 &&
                 r[4]->size == 9 && r[5]->size == 9,
             "inputs with no route get zeros of the right size");
    TH_CHECK(ad_tape_error(T) == NULL, "no route: %s", th_errs(T));
    ad_tape_free(T);
}

static void test_create_graph(void)
{
    ad_tape *T = ad_tape_new();
    double xv[3] = {0.7, -0.4, 1.1}, vv[3] = {1, 2, -0.5}, uv[3] = {0.3, -1, 0.8};
    int s3[1] = {3}, i, j, ok;
    ad_tensor *x = ad_tensor_new(T, 1, s3, xv, 1), *v = ad_tensor_new(T, 1, s3, vv, 0);
    ad_tensor *u = ad_tensor_new(T, 1, s3, uv, 0);
    double sx = xv[0] + xv[1] + xv[2];
    {
        /* jvp of a vjp: y = x^3 elementwise, vjp = 3 x^2 v, jvp of that = 6 x v u */
        ad_tensor *g = ad_vjp(T, ad_pow(T, x, 3), x, v, 1), *h = ad_jvp(T, g, x, u, 0);
        for (i = 0, ok = h != NULL; h && i < 3; i++) ok &= close_to(h->data[i], 6 * xv[i] * vv[i] * uv[i], 1e-14);
        TH_CHECK(ok, "jvp of a vjp: %s", th_errs(T));
    }
    {
        /* the Hessian of a function that calls ad_grad(..., 1): y = |grad (sum x)^3|^2 = 27 s^4,
           every entry 324 s^2 */
        ad_tensor *f = ad_pow(T, ad_sum(T, x), 3), *g = ad_grad(T, f, x, 1);
        ad_tensor *H = ad_hessian(T, ad_sum(T, ad_square(T, g)), x, 0);
        for (i = 0, ok = H != NULL; H && i < 9; i++) ok &= close_to(H->data[i], 324 * sx * sx, 1e-13);
        TH_CHECK(ok, "hessian of a function of a gradient: %s", th_errs(T));
    }
    {
        /* the Jacobian of a gradient is the Hessian: f = sum(x^4) / 4 + x0 x1 x2 */
        ad_tensor *f = ad_add(T, ad_mul(T, ad_sum(T, ad_pow(T, x, 4)), ad_scalar(T, 0.25)), ad_prod_axis(T, x, 0, 0));
        ad_tensor *J = ad_jacobian(T, ad_grad(T, f, x, 1), x, 0), *H = ad_hessian(T, f, x, 0);
        for (i = 0, ok = J && H; ok && i < 3; i++)
            for (j = 0; j < 3; j++) {
                double want = i == j ? 3 * xv[i] * xv[i] : xv[3 - i - j];
                ok &= close_to(J->data[i * 3 + j], want, 1e-14) && close_to(H->data[i * 3 + j], want, 1e-14);
            }
        TH_CHECK(ok, "jacobian of a gradient, hessian: %s", th_errs(T));
    }
    {
        /* a recorded Hessian differentiated again: d/dx sum(H(sum x^4)) = 24 x */
        ad_tensor *H = ad_hessian(T, ad_sum(T, ad_pow(T, x, 4)), x, 1), *d = ad_grad(T, ad_sum(T, H), x, 0);
        for (i = 0, ok = d != NULL; d && i < 3; i++) ok &= close_to(d->data[i], 24 * xv[i], 1e-13);
        TH_CHECK(ok && H->requires_grad, "third derivative through ad_hessian: %s", th_errs(T));
    }
    {
        /* recorded Jacobians by rows (x^3 elementwise: diag 3x^2) and by columns ([s^2, s^3, s^4]) */
        ad_tensor *J = ad_jacobian(T, ad_pow(T, x, 3), x, 1), *d = ad_grad(T, ad_sum(T, J), x, 0);
        ad_tensor *s = ad_var(T, 0.6), *Js = ad_jacobian(T, powers(T, s), s, 1);
        ad_tensor *ds = ad_grad(T, ad_sum(T, Js), s, 0);
        for (i = 0, ok = d != NULL; d && i < 3; i++) ok &= close_to(d->data[i], 6 * xv[i], 1e-14);
        TH_CHECK(ok, "recorded jacobian by rows: %s", th_errs(T));
        TH_CHECK(ds && close_to(ds->data[0], 2 + 6 * 0.6 + 12 * 0.36, 1e-14), "recorded jacobian by columns: %g, %s",
                 ds ? ds->data[0] : 0, th_errs(T));
    }
    {
        /* a recorded jvp differentiated in u and in x: J u = 3 x^2 u */
        ad_tensor *ur = ad_tensor_new(T, 1, s3, uv, 1), *ju = ad_jvp(T, ad_pow(T, x, 3), x, ur, 1);
        ad_tensor *du, *dx, *xs[2], *o[2];
        xs[0] = ur; xs[1] = x;
        TH_CHECK(ad_grads(T, 1, (ad_tensor *[]){ad_sum(T, ju)}, NULL, 2, xs, o, 0) == 0, "grads of a jvp: %s", th_errs(T));
        du = o[0]; dx = o[1];
        for (i = 0, ok = du && dx; ok && i < 3; i++)
            ok &= close_to(du->data[i], 3 * xv[i] * xv[i], 1e-14) && close_to(dx->data[i], 6 * xv[i] * uv[i], 1e-14);
        TH_CHECK(ok, "a recorded jvp differentiated in u and in x");
    }
    {
        /* all of it in no-grad mode, on a graph recorded before */
        ad_tensor *f = ad_sum(T, ad_pow(T, x, 4)), *H;
        int was = ad_set_grad_enabled(T, 0);
        H = ad_hessian(T, f, x, 1);
        ad_set_grad_enabled(T, was);
        TH_CHECK(H && close_to(H->data[4], 12 * xv[1] * xv[1], 1e-14) && H->data[1] == 0, "hessian in no-grad mode");
    }
    TH_CHECK(ad_tape_error(T) == NULL, "create_graph: %s", th_errs(T));
    ad_tape_free(T);
}

static void test_detach_item(void)
{
    ad_tape *T = ad_tape_new();
    double xv[3] = {1.5, -2, 0.5};
    ad_tensor *x = ad_tensor_new(T, 1, (int[]){3}, xv, 1), *d = ad_detach(T, x), *g;
    int i, ok = 1;
    TH_CHECK(d && d->data == x->data && !d->requires_grad && d->node == NULL && has_shape(d, 1, (int[]){3}),
             "ad_detach: %s", th_errs(T));
    g = ad_grad(T, ad_sum(T, ad_mul(T, x, d)), x, 0); /* x * const: the gradient is x, not 2 x */
    for (i = 0; g && i < 3; i++) ok &= g->data[i] == xv[i];
    TH_CHECK(g && ok, "a gradient flowed through ad_detach");
    TH_CHECK(ad_detach(T, NULL) == NULL, "ad_detach of NULL");
    TH_CHECK_ERROR(T, "ad_detach: x is NULL");
    ad_tape_clear_error(T);
    /* ad_item and ad_grad_item want one element */
    TH_CHECK(ad_item(x) == 0, "ad_item of [3] is %g", ad_item(x));
    TH_CHECK_ERROR(T, "ad_item: x has shape [3]; it must have exactly one element");
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, ad_sum(T, x)) == 0 && ad_grad_item(x) == 0, "ad_grad_item of [3]");
    TH_CHECK_ERROR(T, "ad_grad_item: x has shape [3]");
    ad_tape_clear_error(T);
    {
        ad_tensor *one = ad_reshape(T, ad_sum(T, x), 2, (int[]){1, 1});
        TH_CHECK(ad_item(one) == 0 && ad_tape_error(T) == NULL, "ad_item of a [1,1] zero");
        TH_CHECK(ad_item(ad_sum(T, x)) == 0 && ad_item(ad_var(T, 2.5)) == 2.5 && ad_tape_error(T) == NULL,
                 "ad_item of one element: %s", th_errs(T));
    }
    ad_tape_free(T);
}

static void test_errors(void)
{
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    double xv[4] = {1, 2, 3, 4};
    ad_tensor *x = ad_tensor_new(T, 1, (int[]){4}, xv, 1), *y = ad_exp(T, x), *s = ad_sum(T, y);
    ad_tensor *v3 = ad_ones(T, 1, (int[]){3}), *out[2], *big, *xo = ad_var(U, 1);
    int shape9[5] = {1, 2, 1, 2, 1};
#define EXPECT(call, needle)                                                                 \
    do {                                                                                     \
        ad_tape_clear_error(T);                                                              \
        TH_CHECK((call) == NULL, "%s did not fail", #call);                                  \
        TH_CHECK_ERROR(T, needle);                                                           \
    } while (0)
    EXPECT(ad_vjp(T, y, x, v3, 0), "ad_vjp: v has shape [3] but y has shape [4]; they must be equal");
    EXPECT(ad_vjp(T, y, x, NULL, 0), "ad_vjp: y has shape [4] and v is NULL");
    EXPECT(ad_vjp(T, NULL, x, NULL, 0), "ad_vjp: y is NULL");
    EXPECT(ad_jvp(T, y, x, v3, 0), "ad_jvp: u has shape [3] but x has shape [4]");
    EXPECT(ad_jvp(T, y, x, NULL, 0), "ad_jvp: x has shape [4] and u is NULL");
    EXPECT(ad_jvp(T, y, NULL, v3, 0), "ad_jvp: x is NULL");
    EXPECT(ad_jacobian(T, NULL, x, 0), "ad_jacobian: y is NULL");
    EXPECT(ad_jacobian(T, y, xo, 0), "ad_jacobian: x belongs to another tape");
    EXPECT(ad_hessian(T, y, x, 0), "ad_hessian: y has shape [4]; it must have exactly one element");
    EXPECT(ad_hessian(T, s, NULL, 1), "ad_hessian: x is NULL");
    /* too many dimensions: [1,2,1,2,1] ++ [1,2,1,2,1] */
    big = ad_reshape(T, ad_tensor_new(T, 1, (int[]){4}, xv, 1), 5, shape9);
    EXPECT(ad_jacobian(T, ad_exp(T, big), big, 0),
           "ad_jacobian: y [1,2,1,2,1] and x [1,2,1,2,1]: the result would have 10 dimensions; at most 8");
    EXPECT(ad_hessian(T, ad_sum(T, big), big, 0), "ad_hessian: x [1,2,1,2,1]: the Hessian would have 10 dimensions");
    /* a one-element y of 5 dimensions counts as [] */
    ad_tape_clear_error(T);
    TH_CHECK(ad_jacobian(T, ad_reshape(T, s, 5, (int[]){1, 1, 1, 1, 1}), big, 0) != NULL, "jacobian of [1,1,1,1,1]: %s",
             th_errs(T));
    /* ad_grads */
    ad_tape_clear_error(T);
    out[0] = out[1] = x;
    TH_CHECK(ad_grads(T, 1, &y, NULL, 2, (ad_tensor *[]){x, x}, out, 0) == -1 && !out[0] && !out[1],
             "ad_grads without a seed for [4]");
    TH_CHECK_ERROR(T, "ad_grads: ys[0] has shape [4] and grad_ys[0] is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(T, 2, (ad_tensor *[]){s, y}, (ad_tensor *[]){NULL, v3}, 1, &x, out, 0) == -1, "grads shape");
    TH_CHECK_ERROR(T, "ad_grads: grad_ys[1] has shape [3] but ys[1] has shape [4]");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(T, 1, &s, NULL, 2, (ad_tensor *[]){x, NULL}, out, 0) == -1, "grads NULL x");
    TH_CHECK_ERROR(T, "ad_grads: xs[1] is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(T, 0, &s, NULL, 1, &x, out, 0) == -1, "grads ny 0");
    TH_CHECK_ERROR(T, "ad_grads: 0 outputs");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(T, 1, &s, NULL, 1, &x, NULL, 0) == -1, "grads out NULL");
    TH_CHECK_ERROR(T, "ad_grads: out is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(T, 1, &s, NULL, 1, &xo, out, 0) == -1, "grads other tape");
    TH_CHECK_ERROR(T, "ad_grads: xs[0] belongs to another tape");
    ad_tape_clear_error(T);
    TH_CHECK(ad_grads(NULL, 1, &s, NULL, 1, &x, out, 0) == -1 && ad_vjp(NULL, y, x, y, 0) == NULL &&
                 ad_jvp(NULL, y, x, x, 0) == NULL && ad_jacobian(NULL, y, x, 0) == NULL &&
                 ad_hessian(NULL, s, x, 0) == NULL && ad_detach(NULL, x) == NULL,
             "a NULL tape");
    /* the tape is usable after the errors */
    TH_CHECK(ad_grads(T, 1, &s, NULL, 1, &x, out, 0) == 0 && close_to(out[0]->data[3], exp(4.0), 1e-15),
             "ad_grads after errors: %s", th_errs(T));
#undef EXPECT
    ad_tape_free(U);
    ad_tape_free(T);
}

int main(void)
{
    test_grads();
    test_linear();
    test_nonlinear();
    test_hessians();
    test_no_route();
    test_create_graph();
    test_detach_item();
    test_errors();
    return th_summary();
}
