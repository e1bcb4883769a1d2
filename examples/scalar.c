/* scalar.c - reverse-mode derivatives of scalar functions.

   The three functions of the classic "minimal autodiff" tutorial, each built from ops on a tape
   and differentiated with one ad_backward call. Every gradient is printed beside a central
   finite difference of the same function, and the program exits non-zero if any pair differs.

       cc -O2 examples/scalar.c -lm && ./a.out

   How it works: every op runs at once and is recorded on the tape. ad_backward(T, y) walks the
   tape backwards once, multiplying local derivatives along each route from y to an input and
   adding up the routes, and leaves dy/dx in x->grad for every input x made with ad_var.
   Each function is also written on the lean tape for single numbers (ad_num: a value and its
   place, no tensor behind it), which gives the same derivatives at a fraction of the cost per op;
   the program checks that the two agree. */
#define AUTODIFF_DOUBLE /* ad_real is double: finite differences need the precision */
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A function of a few scalars, built on a tape from leaves made with ad_var. */
typedef ad_tensor *(*scalar_fn)(ad_tape *T, ad_tensor **v);

/* The same function on numbers. */
typedef ad_num (*number_fn)(ad_tape *T, const ad_num *v);

/* 1. d = a * (a + b): the route straight to a gives (a + b), the route through c = a + b gives
   a, so dd/da = 2a + b and dd/db = a. */
static ad_tensor *f_product(ad_tape *T, ad_tensor **v)
{
    ad_tensor *a = v[0], *b = v[1];
    ad_tensor *c = ad_add(T, a, b);
    return ad_mul(T, a, c);
}

static ad_num n_product(ad_tape *T, const ad_num *v)
{
    return ad_num_mul(T, v[0], ad_num_add(T, v[0], v[1]));
}

/* 2. f(a, b) = (a/b - a) * (b/a + a + b) * (a - b): a and b are each used five times. */
static ad_tensor *f_rational(ad_tape *T, ad_tensor **v)
{
    ad_tensor *a = v[0], *b = v[1];
    ad_tensor *p = ad_sub(T, ad_div(T, a, b), a);
    ad_tensor *q = ad_add(T, ad_add(T, ad_div(T, b, a), a), b);
    return ad_mul(T, ad_mul(T, p, q), ad_sub(T, a, b));
}

static ad_num n_rational(ad_tape *T, const ad_num *v)
{
    ad_num a = v[0], b = v[1];
    ad_num p = ad_num_sub(T, ad_num_div(T, a, b), a);
    ad_num q = ad_num_add(T, ad_num_add(T, ad_num_div(T, b, a), a), b);
    return ad_num_mul(T, ad_num_mul(T, p, q), ad_num_sub(T, a, b));
}

/* 3. y = log(f * f) * c with f = sin(a * b) + exp(c - a / b). */
static ad_tensor *f_transcendental(ad_tape *T, ad_tensor **v)
{
    ad_tensor *a = v[0], *b = v[1], *c = v[2];
    ad_tensor *f = ad_add(T, ad_sin(T, ad_mul(T, a, b)), ad_exp(T, ad_sub(T, c, ad_div(T, a, b))));
    return ad_mul(T, ad_log(T, ad_mul(T, f, f)), c);
}

static ad_num n_transcendental(ad_tape *T, const ad_num *v)
{
    ad_num a = v[0], b = v[1], c = v[2];
    ad_num f = ad_num_add(T, ad_num_sin(T, ad_num_mul(T, a, b)), ad_num_exp(T, ad_num_sub(T, c, ad_num_div(T, a, b))));
    return ad_num_mul(T, ad_num_log(T, ad_num_mul(T, f, f)), c);
}

/* The value of fn at x[0..n-1], computed on a tape with recording off (no-grad mode). */
static double evaluate(ad_tape *T, scalar_fn fn, const double *x, int n)
{
    ad_tensor *v[8];
    double y;
    int i;
    ad_tape_reset(T);
    ad_set_grad_enabled(T, 0);
    for (i = 0; i < n; i++) v[i] = ad_scalar(T, x[i]);
    y = ad_item(fn(T, v));
    ad_set_grad_enabled(T, 1);
    return y;
}

/* Whether nfn, the same function on numbers, gives the value and gradients of the tensors'
   y and v[] (to 1e-12 of their size: the ops are the same, their order of rounding may differ). */
static int numbers_agree(number_fn nfn, const double *x, int n, double value, ad_tensor *const *v)
{
    ad_tape *T = ad_tape_new();
    ad_num u[8], y;
    int i, agree;
    for (i = 0; i < n; i++) u[i] = ad_num_var(T, x[i]);
    y = nfn(T, u);
    agree = ad_num_ok(y) && ad_num_backward(T, y) == 0 && fabs(y.value - value) <= 1e-12 * fabs(value);
    for (i = 0; i < n && agree; i++) {
        double g = ad_grad_item(v[i]);
        agree = fabs(ad_num_grad(T, u[i]) - g) <= 1e-12 * fabs(g);
    }
    printf("  on numbers (ad_num): %zu recorded, value and gradients %s\n", ad_num_count(T),
           agree ? "the same" : "DIFFERENT");
    ad_tape_free(T);
    return agree;
}

/* Differentiates fn at x, prints each gradient beside (f(x + h) - f(x - h)) / 2h and the value
   the tutorial reports, checks nfn against it, and returns the number of gradients that disagree
   with the finite difference, plus one if the numbers disagree. */
static int show(const char *title, scalar_fn fn, number_fn nfn, const char *const *names, const double *x,
                const double *tutorial, int n)
{
    ad_tape *T = ad_tape_new(), *scratch = ad_tape_new();
    ad_tensor *v[8], *y;
    double at[8], value;
    int i, bad = 0;
    printf("%s\n", title);
    for (i = 0; i < n; i++) v[i] = ad_var(T, x[i]);
    y = fn(T, v);
    if (!y || ad_backward(T, y) != 0) {
        const char *error = ad_tape_error(T);
        printf("  failed: %s\n", error ? error : "unknown error");
        ad_tape_free(T);
        ad_tape_free(scratch);
        return 1;
    }
    value = ad_item(y);
    printf("  at");
    for (i = 0; i < n; i++) printf("%s %s = %g", i ? "," : "", names[i], x[i]);
    printf(": value %.10g\n", value);
    printf("  %-8s %20s %20s %18s\n", "", "autodiff", "finite difference", "tutorial");
    for (i = 0; i < n; i++) {
        double h = 1e-6 * (fabs(x[i]) > 1 ? fabs(x[i]) : 1), up, down, numeric, grad = ad_grad_item(v[i]);
        int ok;
        memcpy(at, x, (size_t)n * sizeof(double));
        at[i] = x[i] + h;
        up = evaluate(scratch, fn, at, n);
        at[i] = x[i] - h;
        down = evaluate(scratch, fn, at, n);
        numeric = (up - down) / (2 * h);
        /* a central difference is good to about h^2 |f'''| plus rounding of about 1e-16 |f| / h */
        ok = fabs(grad - numeric) <= 1e-6 * fabs(numeric) + 1e-14 * fabs(value) / h;
        printf("  d/d%-5s %20.10f %20.10f %18.6f  %s\n", names[i], grad, numeric, tutorial[i], ok ? "ok" : "MISMATCH");
        bad += !ok;
    }
    bad += !numbers_agree(nfn, x, n, value, v);
    printf("\n");
    ad_tape_free(T);
    ad_tape_free(scratch);
    return bad;
}

int main(void)
{
    static const char *const ab[] = {"a", "b"}, *const abc[] = {"a", "b", "c"};
    const double x1[] = {4, 3}, t1[] = {11, 4};
    const double x2[] = {230.3, 33.2}, t2[] = {-153284.83150602411, 3815.0389441500993};
    const double x3[] = {43, 3, 2}, t3[] = {60.85353612046653, 872.2331479536114, -3.2853671032530305};
    int bad = 0;
    bad += show("1. d = a * (a + b)", f_product, n_product, ab, x1, t1, 2);
    bad += show("2. f = (a/b - a) * (b/a + a + b) * (a - b)", f_rational, n_rational, ab, x2, t2, 2);
    bad += show("3. y = log(f * f) * c,  f = sin(a * b) + exp(c - a / b)", f_transcendental, n_transcendental, abc,
                x3, t3, 3);
    if (bad) printf("%d gradient(s) disagree with their finite differences or the numbers' tape\n", bad);
    else printf("all gradients agree with their finite differences and with the numbers' tape\n");
    return bad ? 1 : 0;
}
