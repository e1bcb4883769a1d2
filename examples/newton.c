/* newton.c - a nonlinear least-squares fit with Levenberg-Marquardt steps built from ad_jacobian.

   The model is a damped oscillator, y(t) = A exp(-k t) cos(w t + phi), fitted to 80 noisy samples
   made with the library's random numbers. Each iteration records the residuals r(p) = y(t; p) -
   samples on a tape, takes the Jacobian J = d r / d p [80, 4] with ad_jacobian (forward mode
   here: four parameters against eighty residuals, so one recorded sweep and four through it),
   and solves the damped normal equations (J^T J + lambda diag(J^T J)) dp = -J^T r. A step that
   lowers the cost is taken and lambda shrinks; otherwise lambda grows (Gauss-Newton near the
   solution, gradient descent far from it). The program exits non-zero when the recovered
   parameters are not close to the ones that made the data.

       cc -O2 examples/newton.c -lm && ./a.out */
#define AUTODIFF_DOUBLE
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <math.h>
#include <stdio.h>

#define NS 80 /* samples */
#define NP 4  /* parameters: A, k, w, phi */

static double ts[NS], samples[NS];

/* The residuals of the model with parameters p [4] on T: shape [NS]. */
static ad_tensor *residuals(ad_tape *T, ad_tensor *p)
{
    const int n[1] = {NS};
    ad_tensor *t = ad_tensor_new(T, 1, n, ts, 0), *obs = ad_tensor_new(T, 1, n, samples, 0);
    ad_tensor *A = ad_slice(T, p, 0, 0, 1), *k = ad_slice(T, p, 0, 1, 2);
    ad_tensor *w = ad_slice(T, p, 0, 2, 3), *phi = ad_slice(T, p, 0, 3, 4);
    ad_tensor *decay = ad_exp(T, ad_neg(T, ad_mul(T, k, t)));
    ad_tensor *wave = ad_cos(T, ad_add(T, ad_mul(T, w, t), phi));
    return ad_sub(T, ad_mul(T, A, ad_mul(T, decay, wave)), obs);
}

/* Solves the NP x NP system M x = b in place by Gaussian elimination with partial pivoting.
   Returns 0, or -1 when M is singular. */
static int solve(double M[NP][NP], double *b)
{
    int i, j, c;
    for (c = 0; c < NP; c++) {
        int piv = c;
        for (i = c + 1; i < NP; i++)
            if (fabs(M[i][c]) > fabs(M[piv][c])) piv = i;
        if (M[piv][c] == 0) return -1;
        for (j = 0; j < NP; j++) { double s = M[c][j]; M[c][j] = M[piv][j]; M[piv][j] = s; }
        { double s = b[c]; b[c] = b[piv]; b[piv] = s; }
        for (i = c + 1; i < NP; i++) {
            double f = M[i][c] / M[c][c];
            for (j = c; j < NP; j++) M[i][j] -= f * M[c][j];
            b[i] -= f * b[c];
        }
    }
    for (i = NP - 1; i >= 0; i--) {
        for (j = i + 1; j < NP; j++) b[i] -= M[i][j] * b[j];
        b[i] /= M[i][i];
    }
    return 0;
}

/* Half the sum of squared residuals at p, with nothing recorded. */
static double cost_at(ad_tape *T, const double *p)
{
    const int np[1] = {NP};
    ad_tensor *r;
    double c = NAN;
    int was = ad_set_grad_enabled(T, 0);
    r = residuals(T, ad_tensor_new(T, 1, np, p, 0));
    if (r) {
        size_t i;
        for (c = 0, i = 0; i < r->size; i++) c += 0.5 * r->data[i] * r->data[i];
    }
    ad_set_grad_enabled(T, was);
    ad_tape_reset(T);
    return c;
}

int main(void)
{
    const double truth[NP] = {2.0, 0.3, 2.5, 0.4}, tol[NP] = {0.05, 0.02, 0.02, 0.05};
    const char *names[NP] = {"A", "k", "w", "phi"};
    const int np[1] = {NP};
    double p[NP] = {1.0, 0.1, 2.3, 0.0}, lambda = 1e-2, cost;
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int i, j, it, bad = 0;

    ad_rng_seed(&rng, 17);
    for (i = 0; i < NS; i++) {
        ts[i] = 8.0 * i / (NS - 1);
        samples[i] = truth[0] * exp(-truth[1] * ts[i]) * cos(truth[2] * ts[i] + truth[3]) +
                     0.02 * ad_rng_normal(&rng);
    }
    cost = cost_at(T, p);
    printf("fitting y = A exp(-k t) cos(w t + phi) to %d noisy samples, Levenberg-Marquardt\n", NS);
    printf("%4s %14s %10s %10s %10s %10s %10s\n", "iter", "cost", "lambda", "A", "k", "w", "phi");
    printf("%4d %14.8f %10.2g %10.5f %10.5f %10.5f %10.5f\n", 0, cost, lambda, p[0], p[1], p[2], p[3]);
    for (it = 1; it <= 100; it++) {
        ad_tensor *pt = ad_tensor_new(T, 1, np, p, 1), *r = residuals(T, pt), *J = ad_jacobian(T, r, pt, 0);
        double JtJ[NP][NP], Jtr[NP], M[NP][NP], step[NP], trial[NP], tcost;
        int k;
        if (!J) {
            const char *e = ad_tape_error(T);
            fprintf(stderr, "%s\n", e ? e : "failed");
            return 1;
        }
        for (i = 0; i < NP; i++) {
            Jtr[i] = 0;
            for (k = 0; k < NS; k++) Jtr[i] += J->data[k * NP + i] * r->data[k];
            for (j = 0; j < NP; j++) {
                JtJ[i][j] = 0;
                for (k = 0; k < NS; k++) JtJ[i][j] += J->data[k * NP + i] * J->data[k * NP + j];
            }
        }
        ad_tape_reset(T);
        /* grow lambda until a step lowers the cost */
        for (;;) {
            for (i = 0; i < NP; i++) {
                for (j = 0; j < NP; j++) M[i][j] = JtJ[i][j] + (i == j ? lambda * JtJ[i][i] : 0);
                step[i] = -Jtr[i];
            }
            if (solve(M, step) == 0) {
                for (i = 0; i < NP; i++) trial[i] = p[i] + step[i];
                tcost = cost_at(T, trial);
                if (tcost < cost) break;
            }
            lambda *= 4;
            if (lambda > 1e12) break;
        }
        if (lambda > 1e12) break; /* no step lowers the cost: a minimum */
        for (i = 0; i < NP; i++) p[i] = trial[i];
        lambda = lambda / 3 > 1e-9 ? lambda / 3 : 1e-9;
        printf("%4d %14.8f %10.2g %10.5f %10.5f %10.5f %10.5f\n", it, tcost, lambda, p[0], p[1], p[2], p[3]);
        if (cost - tcost < 1e-12 * cost) { cost = tcost; break; }
        cost = tcost;
    }
    ad_tape_free(T);
    printf("\n%-4s %10s %10s\n", "", "fitted", "true");
    for (i = 0; i < NP; i++) {
        int ok = fabs(p[i] - truth[i]) <= tol[i];
        printf("%-4s %10.5f %10.5f%s\n", names[i], p[i], truth[i], ok ? "" : "   <- off");
        bad += !ok;
    }
    printf("\n%s\n", bad ? "FIT FAILED: parameters far from the truth" : "parameters recovered");
    return bad ? 1 : 0;
}
