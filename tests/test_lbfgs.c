/* L-BFGS against torch.optim.LBFGS. In double precision (-DAUTODIFF_DOUBLE): step by step
   against a reference written here from its step, _strong_wolfe and _cubic_interpolate, on a
   quadratic and on the Rosenbrock function, with and without the line search, and against
   numbers PyTorch itself printed. In both precisions: convergence, the limits on iterations and
   evaluations of each step, frozen parameters, failures of the closure, non-finite losses and
   gradients, and settings refused. tests/run.sh builds it both ways. */
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#ifdef AUTODIFF_DOUBLE
#define IN_DOUBLE 1
#define CLOSE 1e-12 /* agreement with the reference and with PyTorch */
#define NEAR 1e-6   /* distance from a minimum where a run must end */
#else
#define IN_DOUBLE 0
#define NEAR 1e-3
#endif

#define NMAX 10
#define HMAX 100

/* ---- the functions ---- */
typedef struct problem {
    int rosenbrock; /* else the quadratic 0.5 x'Ax - b'x */
    int n;
    double A[NMAX * NMAX], b[NMAX];
    ad_real At[NMAX * NMAX], bt[NMAX]; /* the same in the tape's precision */
} problem;

/* The loss of x (a [n] tensor on T). */
static ad_tensor *objective(ad_tape *T, ad_tensor *x, const problem *pb)
{
    int n = pb->n, row[2] = {1, NMAX}, sq[2];
    if (pb->rosenbrock) { /* sum of 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2 */
        ad_tensor *a = ad_slice(T, x, 0, 0, n - 1), *c = ad_slice(T, x, 0, 1, n);
        ad_tensor *u = ad_sub(T, c, ad_square(T, a)), *v = ad_rsub_scalar(T, 1, a);
        return ad_sum(T, ad_add(T, ad_mul_scalar(T, ad_square(T, u), 100), ad_square(T, v)));
    }
    row[1] = n;
    sq[0] = sq[1] = n;
    {
        ad_tensor *xr = ad_reshape(T, x, 2, row);
        ad_tensor *ax = ad_matmul(T, xr, ad_tensor_new(T, 2, sq, pb->At, 0));
        ad_tensor *bt = ad_tensor_new(T, 1, &n, pb->bt, 0);
        return ad_sub(T, ad_mul_scalar(T, ad_sum(T, ad_mul(T, ax, xr)), 0.5), ad_sum(T, ad_mul(T, bt, x)));
    }
}

typedef struct fit {
    problem *pb;
    ad_params *P;
    int id;
    int calls, fail_at; /* closure calls so far; the call that fails (0: none) */
    int bad_shapes;     /* the failing call leaves an error on the tape */
} fit;

static double closure(ad_tape *T, void *ctx)
{
    fit *f = (fit *)ctx;
    ad_tensor *loss;
    f->calls++;
    if (f->calls == f->fail_at) {
        if (f->bad_shapes) ad_matmul(T, ad_param(T, f->P, f->id), ad_param(T, f->P, f->id));
        return NAN;
    }
    loss = objective(T, ad_param(T, f->P, f->id), f->pb);
    if (!loss || ad_backward(T, loss) != 0) return NAN;
    return ad_item(loss);
}

/* ---- the reference (double precision only) ---- */
#ifdef AUTODIFF_DOUBLE
typedef struct lref {
    const problem *pb;
    ad_tape *T;
    int n;
    double lr, tolerance_grad, tolerance_change;
    int max_iter, max_eval, history_size, wolfe;
    double x[NMAX], d[NMAX], g[NMAX], prev_g[NMAX];
    double old_dirs[HMAX][NMAX], old_stps[HMAX][NMAX], ro[HMAX], al[HMAX];
    int nold;
    double t, H_diag, prev_loss;
    long n_iter, func_evals;
} lref;

static double ref_f(lref *r, const double *x, double *g)
{
    ad_tensor *xt, *loss;
    double f;
    int i;
    ad_tape_reset(r->T);
    xt = ad_tensor_new(r->T, 1, &r->n, x, 1);
    loss = objective(r->T, xt, r->pb);
    ad_backward(r->T, loss);
    f = ad_item(loss);
    for (i = 0; i < r->n; i++) g[i] = xt->grad[i];
    r->func_evals++;
    return f;
}

static double dot(const double *a, const double *b, int n)
{
    double s = 0;
    int i;
    for (i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static double max_abs(const double *a, int n)
{
    double m = 0;
    int i;
    for (i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

static double py_min(double a, double b) { return b < a ? b : a; }
static double py_max(double a, double b) { return b > a ? b : a; }

static double cubic(double x1, double f1, double g1, double x2, double f2, double g2, const double *bounds)
{
    double lo, hi, d1, d2s, d2, mp;
    if (bounds) lo = bounds[0], hi = bounds[1];
    else if (x1 <= x2) lo = x1, hi = x2;
    else lo = x2, hi = x1;
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
    d2s = d1 * d1 - g1 * g2;
    if (d2s >= 0) {
        d2 = sqrt(d2s);
        if (x1 <= x2) mp = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2));
        else mp = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
        return py_min(py_max(mp, lo), hi);
    }
    return (lo + hi) / 2.;
}

/* obj_func(x, t, d): the loss and gradient at x + t d */
static double ref_dir(lref *r, double t, double *g)
{
    double y[NMAX];
    int i;
    for (i = 0; i < r->n; i++) y[i] = r->x[i] + t * r->d[i];
    return ref_f(r, y, g);
}

static void copy(double *to, const double *from, int n) { memcpy(to, from, (size_t)n * sizeof(double)); }

/* _strong_wolfe, line for line; returns the evaluations, *t, *f and g as found */
static int ref_wolfe(lref *r, double *t_io, double *f_io, double *g, double gtd)
{
    const double c1 = 1e-4, c2 = 0.9, tol = 1e-9;
    const int max_ls = 25;
    int n = r->n, evals, ls_iter = 0, done = 0, low, high, insuf = 0, nb = 0;
    double t = *t_io, f = *f_io, d_norm = max_abs(r->d, n), g0[NMAX], g_new[NMAX], g_prev[NMAX], bg[2][NMAX];
    double f_new, gtd_new, t_prev = 0, f_prev = f, gtd_prev = gtd, br[2], bf[2], bgtd[2] = {0, 0};
    copy(g0, g, n);
    f_new = ref_dir(r, t, g_new);
    evals = 1;
    gtd_new = dot(g_new, r->d, n);
    copy(g_prev, g0, n);
    while (ls_iter < max_ls) {
        double bounds[2], tmp;
        if (f_new > (f + c1 * t * gtd) || (ls_iter > 1 && f_new >= f_prev)) {
            br[0] = t_prev, br[1] = t, bf[0] = f_prev, bf[1] = f_new, bgtd[0] = gtd_prev, bgtd[1] = gtd_new;
            copy(bg[0], g_prev, n), copy(bg[1], g_new, n), nb = 2;
            break;
        }
        if (fabs(gtd_new) <= -c2 * gtd) {
            br[0] = t, bf[0] = f_new, copy(bg[0], g_new, n), nb = 1, done = 1;
            break;
        }
        if (gtd_new >= 0) {
            br[0] = t_prev, br[1] = t, bf[0] = f_prev, bf[1] = f_new, bgtd[0] = gtd_prev, bgtd[1] = gtd_new;
            copy(bg[0], g_prev, n), copy(bg[1], g_new, n), nb = 2;
            break;
        }
        bounds[0] = t + 0.01 * (t - t_prev);
        bounds[1] = t * 10;
        tmp = t;
        t = cubic(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds);
        t_prev = tmp, f_prev = f_new, copy(g_prev, g_new, n), gtd_prev = gtd_new;
        f_new = ref_dir(r, t, g_new);
        evals++;
        gtd_new = dot(g_new, r->d, n);
        ls_iter++;
    }
    if (ls_iter == max_ls) br[0] = 0, br[1] = t, bf[0] = f, bf[1] = f_new, copy(bg[0], g0, n), copy(bg[1], g_new, n), nb = 2;
    if (bf[0] <= bf[nb - 1]) low = 0, high = 1;
    else low = 1, high = 0;
    while (!done && ls_iter < max_ls) {
        double eps, bmax, bmin;
        if (fabs(br[1] - br[0]) * d_norm < tol) break;
        t = cubic(br[0], bf[0], bgtd[0], br[1], bf[1], bgtd[1], NULL);
        bmax = py_max(br[0], br[1]);
        bmin = py_min(br[0], br[1]);
        eps = 0.1 * (bmax - bmin);
        if (py_min(bmax - t, t - bmin) < eps) {
            if (insuf || t >= bmax || t <= bmin) {
                t = fabs(t - bmax) < fabs(t - bmin) ? bmax - eps : bmin + eps;
                insuf = 0;
            } else {
                insuf = 1;
            }
        } else {
            insuf = 0;
        }
        f_new = ref_dir(r, t, g_new);
        evals++;
        gtd_new = dot(g_new, r->d, n);
        ls_iter++;
        if (f_new > (f + c1 * t * gtd) || f_new >= bf[low]) {
            br[high] = t, bf[high] = f_new, copy(bg[high], g_new, n), bgtd[high] = gtd_new;
            if (bf[0] <= bf[1]) low = 0, high = 1;
            else low = 1, high = 0;
        } else {
            if (fabs(gtd_new) <= -c2 * gtd) {
                done = 1;
            } else if (gtd_new * (br[high] - br[low]) >= 0) {
                br[high] = br[low], bf[high] = bf[low], copy(bg[high], bg[low], n), bgtd[high] = bgtd[low];
            }
            br[low] = t, bf[low] = f_new, copy(bg[low], g_new, n), bgtd[low] = gtd_new;
        }
    }
    *t_io = br[low];
    *f_io = bf[low];
    copy(g, bg[low], n);
    return evals;
}

/* LBFGS.step */
static double ref_step(lref *r)
{
    int n = r->n, n_iter = 0, current_evals = 1, i, k, opt_cond, ls_evals;
    double orig_loss, loss, gtd;
    orig_loss = loss = ref_f(r, r->x, r->g);
    opt_cond = max_abs(r->g, n) <= r->tolerance_grad;
    if (opt_cond) return orig_loss;
    while (n_iter < r->max_iter) {
        n_iter++;
        r->n_iter++;
        if (r->n_iter == 1) {
            for (i = 0; i < n; i++) r->d[i] = -r->g[i];
            r->nold = 0;
            r->H_diag = 1;
        } else {
            double y[NMAX], s[NMAX], ys, q[NMAX];
            for (i = 0; i < n; i++) y[i] = r->g[i] - r->prev_g[i], s[i] = r->d[i] * r->t;
            ys = dot(y, s, n);
            if (ys > 1e-10) {
                if (r->nold == r->history_size) { /* pop(0) */
                    for (k = 1; k < r->nold; k++) {
                        copy(r->old_dirs[k - 1], r->old_dirs[k], n);
                        copy(r->old_stps[k - 1], r->old_stps[k], n);
                        r->ro[k - 1] = r->ro[k];
                    }
                    r->nold--;
                }
                copy(r->old_dirs[r->nold], y, n);
                copy(r->old_stps[r->nold], s, n);
                r->ro[r->nold++] = 1. / ys;
                r->H_diag = ys / dot(y, y, n);
            }
            for (i = 0; i < n; i++) q[i] = -r->g[i];
            for (k = r->nold - 1; k >= 0; k--) {
                r->al[k] = dot(r->old_stps[k], q, n) * r->ro[k];
                for (i = 0; i < n; i++) q[i] += -r->al[k] * r->old_dirs[k][i];
            }
            for (i = 0; i < n; i++) r->d[i] = q[i] * r->H_diag;
            for (k = 0; k < r->nold; k++) {
                double be = dot(r->old_dirs[k], r->d, n) * r->ro[k];
                for (i = 0; i < n; i++) r->d[i] += (r->al[k] - be) * r->old_stps[k][i];
            }
        }
        copy(r->prev_g, r->g, n);
        r->prev_loss = loss;
        if (r->n_iter == 1) {
            double sum = 0;
            for (i = 0; i < n; i++) sum += fabs(r->g[i]);
            r->t = py_min(1., 1. / sum) * r->lr;
        } else {
            r->t = r->lr;
        }
        gtd = dot(r->g, r->d, n);
        if (gtd > -r->tolerance_change) break;
        ls_evals = 0;
        if (r->wolfe) {
            ls_evals = ref_wolfe(r, &r->t, &loss, r->g, gtd);
            for (i = 0; i < n; i++) r->x[i] += r->t * r->d[i];
            opt_cond = max_abs(r->g, n) <= r->tolerance_grad;
        } else {
            for (i = 0; i < n; i++) r->x[i] += r->t * r->d[i];
            if (n_iter != r->max_iter) {
                loss = ref_f(r, r->x, r->g);
                opt_cond = max_abs(r->g, n) <= r->tolerance_grad;
                ls_evals = 1;
            }
        }
        current_evals += ls_evals;
        if (n_iter == r->max_iter) break;
        if (current_evals >= r->max_eval) break;
        if (opt_cond) break;
        {
            double m = 0;
            for (i = 0; i < n; i++)
                if (fabs(r->d[i] * r->t) > m) m = fabs(r->d[i] * r->t);
            if (m <= r->tolerance_change) break;
        }
        if (fabs(loss - r->prev_loss) < r->tolerance_change) break;
    }
    return orig_loss;
}
#endif /* AUTODIFF_DOUBLE */

/* ---- the tests ---- */
static void make_quadratic(problem *pb, int n)
{
    ad_rng rng;
    double M[NMAX * NMAX];
    int i, j, k;
    memset(pb, 0, sizeof *pb);
    pb->n = n;
    ad_rng_seed(&rng, 17);
    for (i = 0; i < n * n; i++) M[i] = ad_rng_normal(&rng);
    for (i = 0; i < n; i++) { /* A = M M' + n I: symmetric, well conditioned */
        for (j = 0; j < n; j++) {
            double s = i == j ? n : 0;
            for (k = 0; k < n; k++) s += M[i * n + k] * M[j * n + k];
            pb->A[i * n + j] = s;
            pb->At[i * n + j] = (ad_real)s;
        }
        pb->b[i] = ad_rng_normal(&rng);
        pb->bt[i] = (ad_real)pb->b[i];
    }
}

static problem rosenbrock(int n)
{
    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.rosenbrock = 1;
    pb.n = n;
    return pb;
}

/* max |A x - b|: how far x is from solving the quadratic */
static double residual(const problem *pb, const ad_real *x)
{
    double worst = 0;
    int i, j;
    for (i = 0; i < pb->n; i++) {
        double s = -pb->b[i];
        for (j = 0; j < pb->n; j++) s += pb->A[i * pb->n + j] * x[j];
        if (fabs(s) > worst) worst = fabs(s);
    }
    return worst;
}

/* Runs `steps` ad_lbfgs_step calls from x0. Every step must keep to its limits: at most
   max_iter iterations, and at most max_eval evaluations without a line search (max_eval is
   checked after each iteration, so a line search of up to 25 evaluations may pass it by 24);
   the closure is called exactly as often as ad_lbfgs_evaluations counts. In double precision
   the reference takes the same steps, and the loss each step returns, the parameters and the
   counts must agree with it after every step. */
static void compare(const char *what, problem *pb, const double *x0, const ad_lbfgs_desc *desc, int steps,
                    ad_real *final_x)
{
    ad_params *P = ad_params_new(1);
    ad_tape *T = ad_tape_new();
    ad_lbfgs *L;
    ad_lbfgs_desc s;
    fit f;
    int step, i, limits_ok = 1, wolfe;
    int64_t it0, ev0;
#ifdef AUTODIFF_DOUBLE
    ad_tape *R = ad_tape_new();
    lref *r = (lref *)calloc(1, sizeof(lref));
    double worst = 0, worst_loss = 0;
    int counts_ok = 1;
#endif
    memset(&f, 0, sizeof f);
    f.pb = pb;
    f.P = P;
    f.id = ad_params_add(P, "x", 1, &pb->n, NULL);
    for (i = 0; i < pb->n; i++) ad_params_values(P)[i] = (ad_real)x0[i];
    L = ad_lbfgs_new(P, desc);
    TH_CHECK(L != NULL, "%s: %s", what, th_params_error(P));
    if (!L) goto out;
    s = ad_lbfgs_settings(L);
    wolfe = s.line_search == AD_LINE_SEARCH_STRONG_WOLFE;
#ifdef AUTODIFF_DOUBLE
    r->pb = pb;
    r->T = R;
    r->n = pb->n;
    r->lr = s.lr;
    r->tolerance_grad = s.tolerance_grad;
    r->tolerance_change = s.tolerance_change;
    r->max_iter = s.max_iter;
    r->max_eval = s.max_eval;
    r->history_size = s.history_size;
    r->wolfe = wolfe;
    copy(r->x, x0, pb->n);
#endif
    for (step = 0; step < steps; step++) {
        double got;
        int64_t its, evs;
        it0 = ad_lbfgs_iterations(L);
        ev0 = ad_lbfgs_evaluations(L);
        got = ad_lbfgs_step(L, T, closure, &f);
        its = ad_lbfgs_iterations(L) - it0;
        evs = ad_lbfgs_evaluations(L) - ev0;
        if (got != got || its > s.max_iter || evs < 1 || evs > (wolfe ? s.max_eval + 24 : s.max_eval) ||
            evs > 1 + its * (wolfe ? 25 : 1)) {
            if (limits_ok)
                printf("FAIL %s: step %d returned %g after %lld iterations, %lld evaluations (max_iter %d, "
                       "max_eval %d)\n", what, step, got, (long long)its, (long long)evs, s.max_iter, s.max_eval);
            limits_ok = 0;
        }
#ifdef AUTODIFF_DOUBLE
        {
            double want = ref_step(r);
            if (fabs(got - want) > worst_loss) worst_loss = fabs(got - want);
            for (i = 0; i < pb->n; i++) {
                double e = fabs(ad_params_values(P)[i] - r->x[i]) / (1 + fabs(r->x[i]));
                if (e > worst || e != e) worst = e;
            }
            if (ad_lbfgs_iterations(L) != r->n_iter || ad_lbfgs_evaluations(L) != r->func_evals) {
                if (counts_ok)
                    printf("%s: step %d: iterations %lld vs %ld, evaluations %lld vs %ld\n", what, step,
                           (long long)ad_lbfgs_iterations(L), r->n_iter, (long long)ad_lbfgs_evaluations(L),
                           r->func_evals);
                counts_ok = 0;
            }
        }
#endif
    }
    TH_CHECK(!ad_params_error(P), "%s: %s", what, th_params_error(P));
    TH_CHECK(limits_ok && f.calls == ad_lbfgs_evaluations(L),
             "%s: steps within max_iter and max_eval, the closure called as often as counted (%d calls, %lld "
             "counted)", what, f.calls, (long long)ad_lbfgs_evaluations(L));
#ifdef AUTODIFF_DOUBLE
    TH_CHECK(worst <= CLOSE && worst_loss <= CLOSE * (1 + fabs(r->prev_loss)),
             "%s: %d steps: parameters off the reference by %g, losses by %g", what, steps, worst, worst_loss);
    TH_CHECK(counts_ok, "%s: iterations and evaluations as the reference's", what);
#endif
    if (final_x)
        for (i = 0; i < pb->n; i++) final_x[i] = ad_params_values(P)[i];
out:
    ad_lbfgs_free(L);
    ad_params_free(P);
    ad_tape_free(T);
#ifdef AUTODIFF_DOUBLE
    ad_tape_free(R);
    free(r);
#endif
}

static ad_lbfgs_desc lbfgs(double lr, int max_iter, int max_eval, int history, int wolfe)
{
    ad_lbfgs_desc d;
    memset(&d, 0, sizeof d);
    d.lr = lr;
    d.max_iter = max_iter;
    d.max_eval = max_eval;
    d.history_size = history;
    d.line_search = wolfe ? AD_LINE_SEARCH_STRONG_WOLFE : AD_LINE_SEARCH_NONE;
    return d;
}

static void test_quadratic(void)
{
    problem pb;
    ad_lbfgs_desc d;
    double x0[NMAX];
    ad_real x[NMAX];
    int i;
    make_quadratic(&pb, 7);
    for (i = 0; i < pb.n; i++) x0[i] = 0.5 * i - 1;
    d = lbfgs(0, 1, 0, 0, 1);
    compare("quadratic, strong Wolfe, one iteration a step", &pb, x0, &d, 12, NULL);
    d = lbfgs(0, 0, 0, 0, 1);
    compare("quadratic, strong Wolfe, defaults", &pb, x0, &d, 3, x);
    /* the minimum solves A x = b */
    TH_CHECK(residual(&pb, x) < (IN_DOUBLE ? 1e-4 : 1e-2), "quadratic: |A x - b| is %g at the end",
             residual(&pb, x));
    d = lbfgs(0, 100, 0, 0, 1);
    d.tolerance_grad = 1e-12;
    d.tolerance_change = 1e-20;
    compare("quadratic, strong Wolfe, tight tolerances", &pb, x0, &d, 1, x);
    TH_CHECK(residual(&pb, x) < (IN_DOUBLE ? 1e-7 : 1e-3), "quadratic, tight tolerances: |A x - b| is %g",
             residual(&pb, x));
    d = lbfgs(0.1, 1, 0, 0, 0);
    compare("quadratic, fixed steps, one iteration a step", &pb, x0, &d, 25, NULL);
    d = lbfgs(0.1, 6, 0, 3, 0);
    compare("quadratic, fixed steps, six iterations a step, history 3", &pb, x0, &d, 6, NULL);
}

/* One ad_lbfgs_step on the 2-D Rosenbrock function from (-1.2, 1) against what
   torch.optim.LBFGS (PyTorch 1.13.1, float64) printed for the same settings and closure: the
   loss returned, state n_iter and func_evals, and x. In float the counts differ, but the
   limits hold. */
static void test_pytorch_rosenbrock(void)
{
    static const struct {
        const char *what;
        double lr, tolerance_grad, tolerance_change;
        int max_iter, max_eval, wolfe;
        int iterations, evaluations;
        double x[2];
        int converges; /* ends within NEAR of (1, 1) */
    } cases[] = {
        {"max_iter 100, strong Wolfe", 0, 0, 0, 100, 0, 1, 35, 43, {0.9999814210791366, 0.9999619651810989}, 0},
        {"max_iter 100, strong Wolfe, tolerance_grad 1e-12, tolerance_change 1e-20", 0, 1e-12, 1e-20, 100, 0, 1,
         39, 47, {1.000000000003047, 1.000000000005421}, 1},
        {"max_iter 100, lr 0.001, no line search", 0.001, 0, 0, 100, 0, 0, 100, 100,
         {-1.191076110481111, 1.0208740618779484}, 0},
        {"max_iter 100, max_eval 10, strong Wolfe", 0, 0, 0, 100, 10, 1, 8, 10,
         {-0.8802131649658734, 0.7274772060719978}, 0},
    };
    problem pb = rosenbrock(2);
    size_t c;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ad_params *P = ad_params_new(1);
        ad_tape *T = ad_tape_new();
        ad_lbfgs_desc d = lbfgs(cases[c].lr, cases[c].max_iter, cases[c].max_eval, 0, cases[c].wolfe);
        ad_lbfgs *L;
        ad_real *x;
        double loss;
        fit f;
        int64_t its, evs;
        d.tolerance_grad = cases[c].tolerance_grad;
        d.tolerance_change = cases[c].tolerance_change;
        memset(&f, 0, sizeof f);
        f.pb = &pb;
        f.P = P;
        f.id = ad_params_add(P, "x", 1, &pb.n, NULL);
        x = ad_params_values(P);
        x[0] = (ad_real)-1.2;
        x[1] = 1;
        L = ad_lbfgs_new(P, &d);
        loss = ad_lbfgs_step(L, T, closure, &f);
        its = ad_lbfgs_iterations(L);
        evs = ad_lbfgs_evaluations(L);
        TH_CHECK(fabs(loss - 24.199999999999996) <= (IN_DOUBLE ? 1e-12 : 1e-5),
                 "Rosenbrock, %s: first loss %.17g", cases[c].what, loss);
        TH_CHECK(its <= cases[c].max_iter && evs <= (cases[c].max_eval ? cases[c].max_eval + 24 : 125) &&
                     evs == f.calls,
                 "Rosenbrock, %s: %lld iterations, %lld evaluations, %d calls", cases[c].what, (long long)its,
                 (long long)evs, f.calls);
#ifdef AUTODIFF_DOUBLE
        TH_CHECK(its == cases[c].iterations && evs == cases[c].evaluations &&
                     fabs(x[0] - cases[c].x[0]) <= CLOSE && fabs(x[1] - cases[c].x[1]) <= CLOSE,
                 "Rosenbrock as PyTorch, %s: %lld iterations, %lld evaluations, x (%.17g, %.17g)", cases[c].what,
                 (long long)its, (long long)evs, x[0], x[1]);
#else
        (void)cases[c].iterations;
        (void)cases[c].evaluations;
#endif
        if (cases[c].converges)
            TH_CHECK(fabs(x[0] - 1) <= NEAR && fabs(x[1] - 1) <= NEAR, "Rosenbrock, %s: ends at (%.17g, %.17g)",
                     cases[c].what, x[0], x[1]);
        ad_lbfgs_free(L);
        ad_params_free(P);
        ad_tape_free(T);
    }
}

static void test_rosenbrock(void)
{
    problem pb = rosenbrock(2);
    ad_lbfgs_desc d;
    double x0[NMAX];
    ad_real x[NMAX];
    int i, bad = 0;
    x0[0] = -1.2;
    x0[1] = 1;
    d = lbfgs(0, 1, 0, 0, 1);
    compare("Rosenbrock 2-D, strong Wolfe, one iteration a step", &pb, x0, &d, 40, NULL);
    d = lbfgs(0, 100, 0, 0, 1);
    compare("Rosenbrock 2-D, strong Wolfe, 100 iterations", &pb, x0, &d, 2, x);
    TH_CHECK(fabs(x[0] - 1) < 1e-4 && fabs(x[1] - 1) < 1e-4, "Rosenbrock 2-D ends at (%.9g, %.9g)", x[0], x[1]);
    d = lbfgs(0, 10, 6, 0, 1);
    compare("Rosenbrock 2-D, strong Wolfe, max_eval 6", &pb, x0, &d, 10, NULL);
    d = lbfgs(0, 7, 3, 0, 0);
    compare("Rosenbrock 2-D, fixed steps, max_eval 3 below max_iter", &pb, x0, &d, 5, NULL);
    pb.n = 8;
    for (i = 0; i < pb.n; i++) x0[i] = i % 2 ? 1 : -1.2;
    d = lbfgs(0, 5, 0, 3, 1);
    compare("Rosenbrock 8-D, strong Wolfe, history 3", &pb, x0, &d, 40, x);
    for (i = 0; i < pb.n; i++) bad += fabs(x[i] - 1) > (IN_DOUBLE ? 1e-5 : 1e-2);
    TH_CHECK(bad == 0, "Rosenbrock 8-D: %d coordinates away from 1", bad);
    d = lbfgs(0.5, 1, 0, 5, 0);
    compare("Rosenbrock 8-D, fixed steps of 0.5", &pb, x0, &d, 30, NULL);
}

/* A loss that is +Inf past x = 2.5 (where a model overflows), (x - 2)^2 before it: a first
   trial step far past the wall must make the line search back off, not fail or reach NaN. A
   gradient that is Inf (sqrt at 0) is a failure, and the parameters stay. */
typedef struct wall {
    ad_params *P;
    int calls, sqrt_at_zero;
} wall;

static double wall_closure(ad_tape *T, void *ctx)
{
    wall *w = (wall *)ctx;
    ad_tensor *x = ad_param(T, w->P, 0), *loss;
    w->calls++;
    if (w->sqrt_at_zero) loss = ad_sum(T, ad_sqrt(T, x));
    else loss = ad_sum(T, ad_square(T, ad_add_scalar(T, x, -2)));
    if (!loss || ad_backward(T, loss) != 0) return NAN;
    return x->data[0] > (ad_real)2.5 ? INFINITY : ad_item(loss);
}

static void test_non_finite(void)
{
    ad_params *P = ad_params_new(1);
    ad_tape *T = ad_tape_new();
    ad_lbfgs_desc d = lbfgs(100, 50, 0, 0, 1);
    ad_lbfgs *L;
    wall w;
    double got;
    int one = 1;
    memset(&w, 0, sizeof w);
    w.P = P;
    ad_params_add(P, "x", 1, &one, NULL);
    ad_params_values(P)[0] = 0; /* the first trial: t = min(1, 1/4) 100 along +4, x = 100 */
    L = ad_lbfgs_new(P, &d);
    got = ad_lbfgs_step(L, T, wall_closure, &w);
    TH_CHECK(got == 4 && !ad_params_error(P) && fabs(ad_params_values(P)[0] - 2) < 1e-3,
             "an infinite loss at trial points: returned %g, x %.9g, error %s", got, ad_params_values(P)[0],
             th_params_error(P));
    ad_lbfgs_free(L);
    d = lbfgs(0, 0, 0, 0, 0);
    ad_params_values(P)[0] = 0;
    w.sqrt_at_zero = 1;
    L = ad_lbfgs_new(P, &d);
    got = ad_lbfgs_step(L, T, wall_closure, &w);
    TH_CHECK(got != got && ad_params_values(P)[0] == 0 && ad_lbfgs_iterations(L) == 0,
             "an infinite gradient: NaN (got %g), x stays (%g)", got, ad_params_values(P)[0]);
    TH_CHECK_PERROR(P, "ad_lbfgs_step: the gradient at evaluation 1 is not finite");
    ad_lbfgs_free(L);
    ad_params_free(P);
    ad_tape_free(T);
}

/* Frozen parameters stay; the closure's failures come back as NaN with the store's error and
   the parameters of the last completed iteration; misuse is refused with messages that name
   the function. */
static void test_frozen_and_failures(void)
{
    problem pb = rosenbrock(2);
    ad_params *P = ad_params_new(1);
    ad_tape *T = ad_tape_new();
    ad_lbfgs *L;
    ad_lbfgs_desc d, s;
    fit f;
    ad_real before[NMAX];
    double got;
    int one = 1, frozen, k;
    memset(&f, 0, sizeof f);
    f.pb = &pb;
    f.P = P;
    frozen = ad_params_add(P, "frozen", 1, &one, NULL);
    f.id = ad_params_add(P, "x", 1, &pb.n, NULL);
    ad_params_values(P)[0] = 3;
    ad_params_values(P)[1] = (ad_real)-1.2;
    ad_params_values(P)[2] = 1;
    ad_params_set_trainable(P, frozen, 0);
    L = ad_lbfgs_new(P, NULL);
    s = ad_lbfgs_settings(L);
    TH_CHECK(L && s.lr == 1 && s.max_iter == 20 && s.max_eval == 25 && s.tolerance_grad == 1e-7 &&
                 s.tolerance_change == 1e-9 && s.history_size == 100 && s.line_search == AD_LINE_SEARCH_NONE,
             "defaults: PyTorch's");
    ad_lbfgs_free(L);
    d = lbfgs(0, 0, 0, 0, 1);
    L = ad_lbfgs_new(P, &d);
    /* a failure at the first line search evaluation: nothing changes */
    memcpy(before, ad_params_values(P), 3 * sizeof(ad_real));
    f.fail_at = 2;
    f.bad_shapes = 1;
    got = ad_lbfgs_step(L, T, closure, &f);
    TH_CHECK(got != got && memcmp(before, ad_params_values(P), 3 * sizeof(ad_real)) == 0,
             "a failing closure: NaN and the parameters as they were");
    TH_CHECK_PERROR(P, "ad_lbfgs_step: the closure returned NaN (evaluation 2); the tape's error: ad_matmul");
    /* a failure later: the parameters of the last completed iteration, which a fresh step resumes */
    for (k = 0; k < 60; k++) {
        f.calls = 0;
        f.fail_at = k == 0 ? 9 : 0;
        f.bad_shapes = 0;
        got = ad_lbfgs_step(L, T, closure, &f);
        if (k == 0) {
            TH_CHECK(got != got, "a failure at call 9: NaN");
            TH_CHECK_PERROR(P, "the closure returned NaN");
        }
    }
    TH_CHECK(ad_params_values(P)[0] == 3, "the frozen parameter moved to %g", ad_params_values(P)[0]);
    TH_CHECK(fabs(ad_params_values(P)[1] - 1) < 1e-4 && fabs(ad_params_values(P)[2] - 1) < 1e-4,
             "after failures, Rosenbrock still ends at (%g, %g)", ad_params_values(P)[1], ad_params_values(P)[2]);
    /* at the minimum: one evaluation, no iteration */
    {
        int64_t it = ad_lbfgs_iterations(L), ev = ad_lbfgs_evaluations(L);
        ad_params_values(P)[1] = ad_params_values(P)[2] = 1;
        got = ad_lbfgs_step(L, T, closure, &f);
        TH_CHECK(got == 0 && ad_lbfgs_iterations(L) == it && ad_lbfgs_evaluations(L) == ev + 1,
                 "a step at the minimum evaluates once and stops");
    }
    /* misuse */
    got = ad_lbfgs_step(L, NULL, closure, &f);
    TH_CHECK(got != got, "NULL tape");
    TH_CHECK_PERROR(P, "ad_lbfgs_step: the tape is NULL");
    got = ad_lbfgs_step(L, T, NULL, &f);
    TH_CHECK(got != got, "NULL closure");
    TH_CHECK_PERROR(P, "ad_lbfgs_step: the closure is NULL");
    got = ad_lbfgs_step(NULL, T, closure, &f);
    TH_CHECK(got != got && ad_lbfgs_iterations(NULL) == 0 && ad_lbfgs_evaluations(NULL) == 0 &&
                 ad_lbfgs_settings(NULL).max_iter == 0,
             "NULL L-BFGS");
    d = lbfgs(-1, 0, 0, 0, 0);
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "negative lr");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: lr must be finite and >= 0");
    d = lbfgs(INFINITY, 0, 0, 0, 0);
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "infinite lr");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: lr must be finite and >= 0");
    d = lbfgs(0, -3, 0, 0, 0);
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "negative max_iter");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: max_iter and max_eval must be >= 0");
    d = lbfgs(0, 0, -2, 0, 0);
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "negative max_eval");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: max_iter and max_eval must be >= 0");
    d = lbfgs(0, 0, 0, -1, 0);
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "negative history_size");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: history_size must be >= 0");
    d = lbfgs(0, 0, 0, 0, 0);
    d.tolerance_grad = NAN;
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "NaN tolerance");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: tolerance_grad and tolerance_change must be finite and >= 0");
    d.tolerance_grad = 0;
    d.tolerance_change = -1e-9;
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "negative tolerance");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: tolerance_grad and tolerance_change must be finite and >= 0");
    d.tolerance_change = 0;
    d.line_search = (ad_line_search)5;
    TH_CHECK(ad_lbfgs_new(P, &d) == NULL, "unknown line search");
    TH_CHECK_PERROR(P, "ad_lbfgs_new: unknown line search");
    d.line_search = AD_LINE_SEARCH_NONE;
    d.max_iter = 4; /* max_eval from it: 4 * 5 / 4 */
    {
        ad_lbfgs *M = ad_lbfgs_new(P, &d);
        TH_CHECK(M && ad_lbfgs_settings(M).max_eval == 5, "max_eval from max_iter");
        ad_lbfgs_free(M);
    }
    TH_CHECK(!ad_params_error(P), "no error left: %s", th_params_error(P));
    ad_params_add(P, "late", 1, &one, NULL);
    got = ad_lbfgs_step(L, T, closure, &f);
    TH_CHECK(got != got, "a step after adding a parameter");
    TH_CHECK_PERROR(P, "ad_lbfgs_step: the store has 4 scalars, L-BFGS was made for 3; make it after adding every");
    TH_CHECK(ad_lbfgs_new(NULL, NULL) == NULL, "NULL store");
    ad_lbfgs_free(NULL);
    ad_lbfgs_free(L);
    ad_params_free(P);
    ad_tape_free(T);
}

int main(void)
{
    test_quadratic();
    test_pytorch_rosenbrock();
    test_rosenbrock();
    test_non_finite();
    test_frozen_and_failures();
    return th_summary();
}
