/* Ops of your own with ad_custom, checked with ad_gradcheck.

   1. log(cosh(x)), a smooth absolute value (a robust regression loss), computed without
      overflow as |x| + log1p(exp(-2|x|)) - log 2. Its backward, g * tanh(x), is recorded with
      the library's own ops, so second derivatives pass through it: the check covers both
      orders, and Newton steps use the exact curvature 1 - tanh(x)^2.
   2. The Lennard-Jones energy of a small cluster of atoms, sum over pairs of
      4 eps ((sigma/r)^12 - (sigma/r)^6), a forward and a backward (the forces) on plain arrays,
      as a physics code has them. First order only; the check covers it.

   Build: cc -O2 examples/custom_op.c -lm. Exits non-zero when a check fails. */
#define AUTODIFF_DOUBLE /* tight gradient checks; the ops work in float builds too */
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <math.h>
#include <stdio.h>

/* ---- 1. log-cosh: forward on arrays, backward recorded ---- */
static int logcosh_forward(const ad_custom_call *c)
{
    const ad_real *x = c->in[0]->data;
    size_t i;
    for (i = 0; i < c->out->size; i++) {
        double a = fabs(x[i]);
        c->out->data[i] = a + log1p(exp(-2 * a)) - log(2.0);
    }
    return 0;
}

static int logcosh_backward(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **grad_in)
{
    grad_in[0] = ad_mul(T, g, ad_tanh(T, c->in[0])); /* d/dx log cosh x = tanh x */
    return 0;
}

static const ad_custom_op logcosh_op = {.name = "logcosh", .forward = logcosh_forward, .backward = logcosh_backward};

static ad_tensor *logcosh(ad_tape *T, ad_tensor *x) { return ad_custom(T, &logcosh_op, 1, &x); }

/* The robust loss of a line through points: sum logcosh(a * t + b - y). */
typedef struct line_data {
    const ad_real *t, *y;
    int n;
} line_data;

static ad_tensor *line_loss(ad_tape *T, ad_tensor *const *in, void *ctx)
{
    const line_data *d = (const line_data *)ctx;
    ad_tensor *t = ad_tensor_new(T, 1, &d->n, d->t, 0), *y = ad_tensor_new(T, 1, &d->n, d->y, 0);
    ad_tensor *r = ad_sub(T, ad_add(T, ad_mul(T, in[0], t), in[1]), y);
    return ad_sum(T, logcosh(T, r));
}

/* ---- 2. Lennard-Jones: forward and backward on arrays ---- */
typedef struct lj_params {
    double eps, sigma;
} lj_params;

/* in[0]: positions [atoms, 3]; out: the energy (a scalar, from the shape function) */
static int lj_shape(const ad_custom_call *c, int *ndim, int *shape)
{
    (void)shape;
    *ndim = 0;
    return c->in[0]->ndim == 2 && c->in[0]->shape[1] == 3 ? 0 : 1; /* 1: not [atoms, 3] */
}

static int lj_forward(const ad_custom_call *c)
{
    const lj_params *p = (const lj_params *)c->ctx;
    const ad_real *x = c->in[0]->data;
    int n = c->in[0]->shape[0], i, j, k;
    double e = 0;
    for (i = 0; i < n; i++)
        for (j = i + 1; j < n; j++) {
            double r2 = 0, s6;
            for (k = 0; k < 3; k++) r2 += (x[3 * i + k] - x[3 * j + k]) * (x[3 * i + k] - x[3 * j + k]);
            s6 = pow(p->sigma * p->sigma / r2, 3);
            e += 4 * p->eps * (s6 * s6 - s6);
        }
    c->out->data[0] = e;
    return 0;
}

/* dE/dx_i = sum_j dV/dr (x_i - x_j) / r, dV/dr = 4 eps (-12 s^12 + 6 s^6) / r */
static int lj_backward(const ad_custom_call *c, const ad_real *g, ad_real *const *grad_in)
{
    const lj_params *p = (const lj_params *)c->ctx;
    const ad_real *x = c->in[0]->data;
    ad_real *gx = grad_in[0];
    int n = c->in[0]->shape[0], i, j, k;
    for (i = 0; i < n; i++)
        for (j = i + 1; j < n; j++) {
            double r2 = 0, s6, f;
            for (k = 0; k < 3; k++) r2 += (x[3 * i + k] - x[3 * j + k]) * (x[3 * i + k] - x[3 * j + k]);
            s6 = pow(p->sigma * p->sigma / r2, 3);
            f = g[0] * 4 * p->eps * (-12 * s6 * s6 + 6 * s6) / r2; /* dV/dr / r */
            for (k = 0; k < 3; k++) {
                gx[3 * i + k] += f * (x[3 * i + k] - x[3 * j + k]);
                gx[3 * j + k] -= f * (x[3 * i + k] - x[3 * j + k]);
            }
        }
    return 0;
}

static ad_tensor *lj_energy(ad_tape *T, ad_tensor *const *in, void *ctx)
{
    ad_custom_op op = {.name = "lennard_jones", .forward = lj_forward, .backward_array = lj_backward,
                       .shape = lj_shape, .ctx = ctx};
    return ad_custom(T, &op, 1, in);
}

static int report(const char *what, int rc, const ad_gradcheck_result *r)
{
    printf("%-42s %s (%zu derivatives, largest error %.2g)\n", what, rc == 0 ? "ok" : r->message, r->checked,
           r->max_error);
    return rc != 0;
}

int main(void)
{
    ad_tape *T = ad_tape_new();
    ad_gradcheck_result res;
    ad_gradcheck_options both = {.orders = 3}; /* first and second derivatives */
    int failures = 0, step, rc;
    const ad_real t[6] = {0, 1, 2, 3, 4, 5}, y[6] = {0.9, 3.1, 5.0, 30.0, 9.1, 10.8}; /* one outlier */
    line_data data = {t, y, 6};
    lj_params lj = {1.0, 1.0};
    /* a slightly squeezed tetrahedron of four atoms */
    const ad_real pos[12] = {0, 0, 0, 1.1, 0, 0, 0.55, 0.95, 0, 0.55, 0.32, 0.9};
    ad_tensor *ab[2], *x;

    /* log-cosh: first and second derivatives against finite differences */
    ab[0] = ad_var(T, 1.5);
    ab[1] = ad_var(T, 0.2);
    rc = ad_gradcheck(T, line_loss, &data, 2, ab, &both, &res);
    failures += report("logcosh line loss, orders 1 and 2", rc, &res);

    /* Damped Newton steps on (a, b): (H + lambda I) d = -g, with the Hessian H through the
       custom op's recorded backward; lambda shrinks after a step that lowers the loss and grows
       after one that does not (Levenberg-Marquardt), since far from the fit log-cosh is nearly
       linear and a plain Newton step overshoots */
    {
        ad_real a = 1.5, b = 0.2;
        double lambda = 1;
        for (step = 0; step < 60; step++) {
            ad_tensor *p[2], *L, *ga, *gb, *haa, *hab, *hbb, *L2;
            double h11, h22, det, da, db;
            ad_tape_reset(T);
            p[0] = ad_var(T, a);
            p[1] = ad_var(T, b);
            L = line_loss(T, p, &data);
            ga = ad_grad(T, L, p[0], 1);
            gb = ad_grad(T, L, p[1], 1);
            haa = ad_grad(T, ga, p[0], 0);
            hab = ad_grad(T, ga, p[1], 0);
            hbb = ad_grad(T, gb, p[1], 0);
            if (!haa || !hab || !hbb) {
                fprintf(stderr, "%s\n", ad_tape_error(T));
                return 1;
            }
            h11 = ad_item(haa) + lambda;
            h22 = ad_item(hbb) + lambda;
            det = h11 * h22 - ad_item(hab) * ad_item(hab);
            da = -(h22 * ad_item(ga) - ad_item(hab) * ad_item(gb)) / det;
            db = -(h11 * ad_item(gb) - ad_item(hab) * ad_item(ga)) / det;
            p[0] = ad_scalar(T, (ad_real)(a + da));
            p[1] = ad_scalar(T, (ad_real)(b + db));
            L2 = line_loss(T, p, &data);
            if (L2 && ad_item(L2) < ad_item(L)) {
                a += (ad_real)da;
                b += (ad_real)db;
                lambda /= 3;
            } else {
                lambda *= 3;
            }
        }
        printf("robust line through the points: y = %.3f t + %.3f (the outlier at t = 3 barely "
               "moves it)\n", a, b);
        if (!(fabs(a - 2.0) < 0.2 && fabs(b - 1.0) < 0.3)) {
            printf("unexpected fit\n");
            failures++;
        }
    }

    /* Lennard-Jones: forces on arrays against finite differences of the energy */
    ad_tape_reset(T);
    x = ad_tensor_new(T, AD_SHAPE(4, 3), pos, 1);
    rc = ad_gradcheck(T, lj_energy, &lj, 1, &x, NULL, &res);
    failures += report("Lennard-Jones forces, order 1", rc, &res);
    /* its backward is first order only: create_graph through it is refused, naming the op */
    {
        ad_tensor *e = lj_energy(T, &x, &lj), *gx = ad_grad(T, e, x, 1);
        printf("create_graph through it: %s\n", gx ? "accepted?" : ad_tape_error(T));
        if (gx) failures++;
        ad_tape_clear_error(T);
        gx = ad_grad(T, e, x, 0);
        printf("energy %.4f, force on atom 0: (%.4f, %.4f, %.4f)\n", ad_item(e), gx ? -gx->data[0] : 0,
               gx ? -gx->data[1] : 0, gx ? -gx->data[2] : 0);
        if (!gx) failures++;
    }
    ad_tape_free(T);
    printf("%s\n", failures ? "FAILED" : "all checks passed");
    return failures != 0;
}
