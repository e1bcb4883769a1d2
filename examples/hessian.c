/* hessian.c - second derivatives: a Hessian-vector product and a full Hessian.

   ad_grad(T, y, x, 1) returns dy/dx as a tensor that is itself recorded on the tape
   (create_graph), so it can be differentiated again like any other result:

     - Hessian-vector product: H v = d/dx <dy/dx, v> = ad_vjp(T, dy/dx, x, v, 0), one extra
       reverse sweep, without ever forming H (the basis of Newton-CG and of curvature estimates
       in large models);
     - full Hessian: ad_hessian(T, y, x, 0), shape x.shape ++ x.shape, one sweep per element of x
       through the recorded gradient.

   The function is f(x) = sum(tanh(A x)^2) + x0 x1^3 with x in R^4 and a fixed 3 x 4 matrix A.
   Both results are checked against central finite differences of the gradient; the program
   exits non-zero on a mismatch.

       cc -O2 examples/hessian.c -lm && ./a.out */
#define AUTODIFF_DOUBLE
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <math.h>
#include <stdio.h>

#define N 4

static const double A_values[3 * N] = {
    0.5, -1.0, 0.25, 0.8,
    -0.3, 0.7, 1.1, -0.6,
    0.9, 0.2, -0.4, 0.35,
};

/* f(x) for x of shape [N, 1] (a column, so that A x is a matrix product) */
static ad_tensor *f(ad_tape *T, ad_tensor *x)
{
    const int ashape[] = {3, N};
    ad_tensor *A = ad_tensor_new(T, 2, ashape, A_values, 0);
    ad_tensor *smooth = ad_sum(T, ad_square(T, ad_tanh(T, ad_matmul(T, A, x))));
    ad_tensor *x0 = ad_slice(T, x, 0, 0, 1), *x1 = ad_slice(T, x, 0, 1, 2);
    ad_tensor *cubic = ad_sum(T, ad_mul(T, x0, ad_pow(T, x1, 3)));
    return ad_add(T, smooth, cubic);
}

/* The gradient of f at x (plain, not recorded), for the finite differences. */
static void gradient(const double *xv, double *g)
{
    const int xshape[] = {N, 1};
    ad_tape *T = ad_tape_new();
    ad_tensor *x = ad_tensor_new(T, 2, xshape, xv, 1);
    ad_tensor *gx = ad_grad(T, f(T, x), x, 0);
    int i;
    for (i = 0; i < N; i++) g[i] = gx ? gx->data[i] : NAN;
    ad_tape_free(T);
}

/* Column j of the Hessian by central differences of the gradient. */
static void fd_column(const double *xv, int j, double *col)
{
    double xp[N], xm[N], gp[N], gm[N], h = 1e-5;
    int i;
    for (i = 0; i < N; i++) xp[i] = xm[i] = xv[i];
    xp[j] += h;
    xm[j] -= h;
    gradient(xp, gp);
    gradient(xm, gm);
    for (i = 0; i < N; i++) col[i] = (gp[i] - gm[i]) / (2 * h);
}

static int close_enough(double a, double b) { return fabs(a - b) <= 1e-6 * (fabs(b) > 1 ? fabs(b) : 1); }

int main(void)
{
    const int xshape[] = {N, 1};
    const double xv[N] = {0.3, -0.8, 1.2, 0.5}, vv[N] = {1.0, 0.5, -2.0, 0.25};
    double H[N][N], fd[N][N], Hv[N];
    ad_tape *T = ad_tape_new();
    ad_tensor *x, *y, *g, *v, *hvp, *hess;
    int i, j, bad = 0;

    x = ad_tensor_new(T, 2, xshape, xv, 1);
    y = f(T, x);
    g = ad_grad(T, y, x, 1); /* dy/dx, recorded: it can be differentiated again */
    if (!g) {
        const char *error = ad_tape_error(T);
        fprintf(stderr, "%s\n", error ? error : "failed");
        return 1;
    }
    printf("f(x) = sum(tanh(A x)^2) + x0 x1^3 at x = (%g, %g, %g, %g): %.10f\n", xv[0], xv[1], xv[2], xv[3],
           ad_item(y));
    printf("gradient: (%.8f, %.8f, %.8f, %.8f)\n\n", g->data[0], g->data[1], g->data[2], g->data[3]);

    /* Hessian-vector product: H v = d/dx <g, v>, the vector-Jacobian product of g */
    v = ad_tensor_new(T, 2, xshape, vv, 0);
    hvp = ad_vjp(T, g, x, v, 0);

    /* full Hessian, shape [N, 1, N, 1] for x of shape [N, 1] */
    hess = ad_hessian(T, y, x, 0);
    for (i = 0; i < N; i++)
        for (j = 0; j < N; j++) H[i][j] = hess ? hess->data[i * N + j] : NAN;
    if (!hvp || !hess || ad_tape_error(T)) {
        const char *error = ad_tape_error(T);
        fprintf(stderr, "%s\n", error ? error : "failed");
        return 1;
    }

    for (j = 0; j < N; j++) {
        double col[N];
        fd_column(xv, j, col);
        for (i = 0; i < N; i++) fd[i][j] = col[i];
    }
    printf("Hessian (autodiff, then finite differences of the gradient):\n");
    for (i = 0; i < N; i++) {
        printf("  ");
        for (j = 0; j < N; j++) printf("%12.6f", H[i][j]);
        printf("    ");
        for (j = 0; j < N; j++) {
            printf("%12.6f", fd[i][j]);
            if (!close_enough(H[i][j], fd[i][j])) bad++;
            if (!close_enough(H[i][j], H[j][i])) bad++; /* symmetric */
        }
        printf("\n");
    }

    printf("\nHessian-vector product with v = (%g, %g, %g, %g):\n", vv[0], vv[1], vv[2], vv[3]);
    printf("  %-4s %18s %18s %18s\n", "", "d<g,v>/dx", "H v (rows above)", "finite diff.");
    for (i = 0; i < N; i++) {
        double from_rows = 0, from_fd = 0;
        for (j = 0; j < N; j++) {
            from_rows += H[i][j] * vv[j];
            from_fd += fd[i][j] * vv[j];
        }
        Hv[i] = hvp->data[i];
        printf("  [%d]  %18.8f %18.8f %18.8f\n", i, Hv[i], from_rows, from_fd);
        if (!close_enough(Hv[i], from_fd) || !close_enough(Hv[i], from_rows)) bad++;
    }

    ad_tape_free(T);
    printf("\n%s\n", bad ? "MISMATCH: second derivatives disagree with finite differences"
                         : "second derivatives agree with finite differences");
    return bad ? 1 : 0;
}
