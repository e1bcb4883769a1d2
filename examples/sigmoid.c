/* sigmoid.c - the computational graph sigma(W x + b), evaluated over a grid in one batch.

   The graph of the classic "build a deep-learning framework" tutorial: a linear map followed by
   the logistic function, with W = [3, 1] and b = 0, over a 25 x 25 grid of inputs x in
   [-10, 10]^2. Instead of looping over the 625 points, they are stacked into one [625, 2] matrix
   and the whole grid goes through one ad_linear ([625, 2] x [2, 1] + b) and one ad_sigmoid.
   The program draws sigma over the grid, then differentiates the sum of sigma over the grid with
   respect to W and b, and checks those gradients and the input gradients against finite
   differences. It exits non-zero if any check fails.

       cc -O2 examples/sigmoid.c -lm && ./a.out */
#define AUTODIFF_DOUBLE
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <math.h>
#include <stdio.h>

#define SIDE 25
#define POINTS (SIDE * SIDE)

/* grid coordinate i of 0..SIDE-1 in [-10, 10] */
static double coord(int i) { return -10 + 20.0 * i / (SIDE - 1); }

/* The tutorial builds sigma from primitive nodes: z1 = W x, z2 = z1 + b, z3 = exp(-z2),
   z4 = z3 + 1, z5 = 1 / z4. The same chain, written with ops. */
static ad_tensor *sigma_by_hand(ad_tape *T, ad_tensor *X, ad_tensor *W, ad_tensor *b)
{
    ad_tensor *z2 = ad_add(T, ad_matmul(T, X, W), b);
    ad_tensor *z4 = ad_add_scalar(T, ad_exp(T, ad_neg(T, z2)), 1);
    return ad_div(T, ad_scalar(T, 1), z4);
}

/* Over the grid, in plain C for the finite differences: with target NULL the sum of
   sigma(w0 x1 + w1 x2 + b), else the mean of (sigma - target)^2. */
static double grid_loss(const double *X, const double *target, double w0, double w1, double b)
{
    double s = 0;
    int p;
    for (p = 0; p < POINTS; p++) {
        double sig = 1 / (1 + exp(-(w0 * X[2 * p] + w1 * X[2 * p + 1] + b)));
        s += target ? (sig - target[p]) * (sig - target[p]) / POINTS : sig;
    }
    return s;
}

/* A gradient against a central finite difference of the plain-C loss around (w0, w1, b). */
static int check(const char *what, double autodiff, const double *X, const double *target, const double *at,
                 int which)
{
    const double h = 1e-6;
    double up[3], down[3], numeric;
    int k, ok;
    for (k = 0; k < 3; k++) up[k] = down[k] = at[k];
    up[which] += h;
    down[which] -= h;
    numeric = (grid_loss(X, target, up[0], up[1], up[2]) - grid_loss(X, target, down[0], down[1], down[2])) / (2 * h);
    /* the sum has 625 terms: its rounding makes the difference good to about 1e-7 */
    ok = fabs(autodiff - numeric) <= 1e-6 * (fabs(numeric) > 1 ? fabs(numeric) : 1);
    printf("  %-10s autodiff %14.8f   finite difference %14.8f   %s\n", what, autodiff, numeric,
           ok ? "ok" : "MISMATCH");
    return !ok;
}

int main(void)
{
    static const char shades[] = " .:-=+*#%@";
    const int xshape[] = {POINTS, 2}, wshape[] = {2, 1}, bshape[] = {1};
    const int tshape[] = {POINTS, 1};
    double X[POINTS * 2], target[POINTS], w[2] = {3, 1}, bias[1] = {0}, at[3] = {3, 1, 0}, h = 1e-6, worst = 0;
    ad_tape *T = ad_tape_new();
    ad_tensor *x, *W, *b, *sigma, *loss, *manual, *mse, *gW, *gb;
    int i, j, p, bad = 0;

    /* the grid, one point per row: x = (x1, x2), x1 along the columns, x2 along the rows */
    for (i = 0; i < SIDE; i++)
        for (j = 0; j < SIDE; j++) {
            X[2 * (i * SIDE + j)] = coord(j);
            X[2 * (i * SIDE + j) + 1] = coord(SIDE - 1 - i);
        }

    /* inputs do not need gradients here, except that we ask for d sigma / d x below; W and b are
       the parameters: leaves that require grad */
    x = ad_tensor_new(T, 2, xshape, X, 1);
    W = ad_tensor_new(T, 2, wshape, w, 1);
    b = ad_tensor_new(T, 1, bshape, bias, 1);
    sigma = ad_sigmoid(T, ad_linear(T, x, W, b)); /* [625, 1] */
    loss = ad_sum(T, sigma);
    if (!loss || ad_backward(T, loss) != 0) {
        const char *error = ad_tape_error(T);
        fprintf(stderr, "%s\n", error ? error : "failed");
        return 1;
    }

    printf("sigma(W x + b), W = [3, 1], b = 0, x in [-10, 10]^2 (%d x %d points, one batch)\n\n", SIDE, SIDE);
    printf("        x1 = -10 %*s x1 = 10\n", 2 * SIDE - 18, "");
    for (i = 0; i < SIDE; i++) {
        printf(i == 0 ? "x2 = 10  " : i == SIDE - 1 ? "x2 = -10 " : "         ");
        for (j = 0; j < SIDE; j++) {
            double s = sigma->data[i * SIDE + j];
            int level = (int)(s * (sizeof shades - 1));
            if (level > (int)sizeof shades - 2) level = (int)sizeof shades - 2;
            putchar(shades[level]);
            putchar(shades[level]);
        }
        putchar('\n');
    }
    printf("\nsigma along the row x2 = 0:\n  x1   ");
    for (j = 0; j < SIDE; j += 4) printf("%8.2f", coord(j));
    printf("\n  sig  ");
    for (j = 0; j < SIDE; j += 4) printf("%8.4f", sigma->data[(SIDE / 2) * SIDE + j]);
    printf("\n\n");

    /* the same function from the tutorial's primitive nodes agrees */
    manual = sigma_by_hand(T, x, W, b);
    for (p = 0; p < POINTS; p++) worst = fmax(worst, fabs(manual->data[p] - sigma->data[p]));
    printf("largest difference between ad_sigmoid and 1 / (1 + exp(-z)): %.3g\n\n", worst);
    if (worst > 1e-14) bad++;

    /* d/dW_k = sum sigma'(z) x_k and d/db = sum sigma'(z). The grid is symmetric about the
       origin, where sigma' is even and x odd, so the W gradient of the plain sum is zero. */
    printf("gradient of sum(sigma) over the grid:\n");
    bad += check("d/dW[0]", W->grad[0], X, NULL, at, 0);
    bad += check("d/dW[1]", W->grad[1], X, NULL, at, 1);
    bad += check("d/db", b->grad[0], X, NULL, at, 2);

    /* A loss that W does change: the mean squared error against the target "x2 > 0". ad_grad
       returns each gradient as a new tensor and leaves W->grad and b->grad as they are. */
    for (p = 0; p < POINTS; p++) target[p] = X[2 * p + 1] > 0 ? 1 : 0;
    mse = ad_mse(T, sigma, ad_tensor_new(T, 2, tshape, target, 0));
    gW = ad_grad(T, mse, W, 0);
    gb = ad_grad(T, mse, b, 0);
    if (!gW || !gb) {
        const char *error = ad_tape_error(T);
        fprintf(stderr, "%s\n", error ? error : "failed");
        return 1;
    }
    printf("\ngradient of mean((sigma - [x2 > 0])^2) = %.6f: gradient descent turns W towards [0, 1]\n",
           ad_item(mse));
    bad += check("d/dW[0]", gW->data[0], X, target, at, 0);
    bad += check("d/dW[1]", gW->data[1], X, target, at, 1);
    bad += check("d/db", gb->data[0], X, target, at, 2);

    /* the gradient with respect to each input point: sigma'(z) W */
    printf("\nd sigma / d x at a few points (sigma' W; largest near the boundary 3 x1 + x2 = 0):\n");
    for (p = 0; p < POINTS; p += 78) {
        double x1 = X[2 * p], x2 = X[2 * p + 1], z = 3 * x1 + x2, s = 1 / (1 + exp(-z));
        double num1 = (1 / (1 + exp(-(z + 3 * h))) - 1 / (1 + exp(-(z - 3 * h)))) / (2 * h);
        printf("  x = (%6.2f, %6.2f): sigma %.6f, d/dx1 %.6g, d/dx2 %.6g\n", x1, x2, s, x->grad[2 * p],
               x->grad[2 * p + 1]);
        if (fabs(x->grad[2 * p] - num1) > 1e-6 * fabs(num1) + 1e-9 ||
            fabs(x->grad[2 * p + 1] - x->grad[2 * p] / 3) > 1e-12)
            bad++;
    }

    ad_tape_free(T);
    printf("\n%s\n", bad ? "MISMATCH: some gradients disagree with their finite differences"
                         : "all gradients agree with their finite differences");
    return bad ? 1 : 0;
}
