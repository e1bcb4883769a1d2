/* ad_lstm_cell, ad_gru_cell and the layers ad_lstm and ad_gru (>>ops:rnn).

   For both cells, with each choice of biases, on odd sizes (N = 3, I = 5, H = 7): the forward
   against plain loops written here and against the same cell written with existing ops; the
   gradients against that composition's; first and second derivatives against central finite
   differences (th_gradcheck, th_gradgradcheck), of one step and of four unrolled steps; the
   recorded derivative (create_graph) against the fused one of a plain sweep; an input given
   twice (x also as h); gradients added into buffers that leaves already have; values and
   gradients on two and three threads equal to one thread's bit for bit; bad shapes, whose
   messages name the op and every shape, and NULL inputs. Both layers, on one and five steps
   (and more for the gradients), with and without an initial state, with each choice of biases
   and of the results used: their outputs, h_n (and the LSTM's c_n) against unrolled cells',
   their first and second derivatives against finite differences and their gradients against
   the unrolled cells' and the recorded derivative's, also with w_ih given as w_hh; gradients
   into the leaves' buffers, threads and errors as the cells'; calls that are not recorded (no-grad
   mode, or no input wanting a gradient), over several chunks of steps, against recorded ones,
   and the arena they take. Each family prints its number of checks. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

enum { NB = 3, NI = 5, NH = 7, STEPS = 4 };

/* ---- references ----------------------------------------------------------------------------- */
static double sig(double v) { return 1 / (1 + exp(-v)); }

/* row n of x w^T (x [N, in], w [G, in]) at column k */
static double dot_row(const double *x, const double *w, int n, int k, int in)
{
    double s = 0;
    int j;
    for (j = 0; j < in; j++) s += x[n * in + j] * w[k * in + j];
    return s;
}

/* torch.nn.LSTMCell in plain loops; b_ih, b_hh may be NULL. */
static void ref_lstm(int N, int I, int H, const double *x, const double *h, const double *c, const double *w_ih,
                     const double *w_hh, const double *b_ih, const double *b_hh, double *h2, double *c2)
{
    int n, j, k;
    double pre[4 * 64];
    for (n = 0; n < N; n++) {
        for (k = 0; k < 4 * H; k++)
            pre[k] = dot_row(x, w_ih, n, k, I) + dot_row(h, w_hh, n, k, H) + (b_ih ? b_ih[k] : 0) +
                     (b_hh ? b_hh[k] : 0);
        for (j = 0; j < H; j++) {
            double i = sig(pre[j]), f = sig(pre[H + j]), g = tanh(pre[2 * H + j]), o = sig(pre[3 * H + j]);
            c2[n * H + j] = f * c[n * H + j] + i * g;
            h2[n * H + j] = o * tanh(c2[n * H + j]);
        }
    }
}

/* torch.nn.GRUCell in plain loops. */
static void ref_gru(int N, int I, int H, const double *x, const double *h, const double *w_ih, const double *w_hh,
                    const double *b_ih, const double *b_hh, double *h2)
{
    int n, j;
    for (n = 0; n < N; n++)
        for (j = 0; j < H; j++) {
            double ir = dot_row(x, w_ih, n, j, I) + (b_ih ? b_ih[j] : 0);
            double iz = dot_row(x, w_ih, n, H + j, I) + (b_ih ? b_ih[H + j] : 0);
            double in = dot_row(x, w_ih, n, 2 * H + j, I) + (b_ih ? b_ih[2 * H + j] : 0);
            double hr = dot_row(h, w_hh, n, j, H) + (b_hh ? b_hh[j] : 0);
            double hz = dot_row(h, w_hh, n, H + j, H) + (b_hh ? b_hh[H + j] : 0);
            double hn = dot_row(h, w_hh, n, 2 * H + j, H) + (b_hh ? b_hh[2 * H + j] : 0);
            double r = sig(ir + hr), z = sig(iz + hz), nn = tanh(in + r * hn);
            h2[n * H + j] = (1 - z) * nn + z * h[n * H + j];
        }
}

/* The same cells written with existing ops. */
static ad_tensor *block(ad_tape *T, ad_tensor *a, int k, int H) { return ad_slice(T, a, 1, k * H, (k + 1) * H); }

static ad_tensor *affine(ad_tape *T, ad_tensor *x, ad_tensor *w, ad_tensor *b)
{
    ad_tensor *y = ad_matmul_t(T, x, w, 0, 1);
    return b ? ad_add(T, y, b) : y;
}

static ad_tensor *comp_lstm(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *c, ad_tensor *w_ih, ad_tensor *w_hh,
                            ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **c_out)
{
    int H = h->shape[1];
    ad_tensor *pre = ad_add(T, affine(T, x, w_ih, b_ih), affine(T, h, w_hh, b_hh));
    ad_tensor *i = ad_sigmoid(T, block(T, pre, 0, H)), *f = ad_sigmoid(T, block(T, pre, 1, H));
    ad_tensor *g = ad_tanh(T, block(T, pre, 2, H)), *o = ad_sigmoid(T, block(T, pre, 3, H));
    *c_out = ad_add(T, ad_mul(T, f, c), ad_mul(T, i, g));
    return ad_mul(T, o, ad_tanh(T, *c_out));
}

static ad_tensor *comp_gru(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *w_ih, ad_tensor *w_hh, ad_tensor *b_ih,
                           ad_tensor *b_hh)
{
    int H = h->shape[1];
    ad_tensor *gi = affine(T, x, w_ih, b_ih), *gh = affine(T, h, w_hh, b_hh);
    ad_tensor *r = ad_sigmoid(T, ad_add(T, block(T, gi, 0, H), block(T, gh, 0, H)));
    ad_tensor *z = ad_sigmoid(T, ad_add(T, block(T, gi, 1, H), block(T, gh, 1, H)));
    ad_tensor *n = ad_tanh(T, ad_add(T, block(T, gi, 2, H), ad_mul(T, r, block(T, gh, 2, H))));
    return ad_add(T, ad_mul(T, ad_rsub_scalar(T, 1, z), n), ad_mul(T, z, h));
}

/* ---- the functions under test ---------------------------------------------------------------- */
/* Inputs: x [steps N, I], h [N, H], c [N, H] (LSTM only), w_ih, w_hh, then the biases given. */
typedef struct cell_ctx {
    int gru;
    int biases;  /* 1: b_ih, 2: b_hh, 3: both */
    int out;     /* LSTM: 0 h' and c' side by side, 1 h' only, 2 c' only; f_layer: 0 the outputs,
                    h_n and c_n one below the other, 1 the outputs, 2 c_n, 3 h_n */
    int steps;   /* time steps, each on its N rows of x */
    int comp;    /* 1: the composition of existing ops */
    int alias;   /* 1: x is given as h too (I = H, one step; h is then not an input); f_layer:
                    w_ih is given as w_hh too (I = H; w_hh is then not an input) */
    int layer;   /* f_layer: 1 ad_lstm, 0 unrolled ad_lstm_cell steps */
    int zero_state; /* f_layer: h0 and c0 are not inputs but NULL (zeros) */
} cell_ctx;

static cell_ctx K(int gru, int biases, int out, int steps)
{
    cell_ctx k;
    memset(&k, 0, sizeof k);
    k.gru = gru;
    k.biases = biases;
    k.out = out;
    k.steps = steps;
    return k;
}

static ad_tensor *f_cell(ad_tape *T, ad_tensor **in, void *vctx)
{
    const cell_ctx *k = (const cell_ctx *)vctx;
    int lstm = !k->gru, p, s, N;
    ad_tensor *x = in[0], *h, *c, *w_ih, *w_hh, *b_ih, *b_hh;
    if (k->alias) {
        h = x;
        p = lstm ? 2 : 1;
        c = lstm ? in[1] : NULL;
    } else {
        h = in[1];
        p = lstm ? 3 : 2;
        c = lstm ? in[2] : NULL;
    }
    w_ih = in[p];
    w_hh = in[p + 1];
    b_ih = k->biases & 1 ? in[p + 2] : NULL;
    b_hh = k->biases & 2 ? in[p + 2 + (k->biases & 1)] : NULL;
    N = h->shape[0];
    for (s = 0; s < k->steps; s++) {
        ad_tensor *xs = k->steps > 1 ? ad_slice(T, x, 0, s * N, (s + 1) * N) : x;
        if (!lstm) h = k->comp ? comp_gru(T, xs, h, w_ih, w_hh, b_ih, b_hh) : ad_gru_cell(T, xs, h, w_ih, w_hh, b_ih, b_hh);
        else if (k->comp) h = comp_lstm(T, xs, h, c, w_ih, w_hh, b_ih, b_hh, &c);
        else h = ad_lstm_cell(T, xs, h, c, w_ih, w_hh, b_ih, b_hh, &c);
        if (!h) return NULL;
    }
    if (lstm && k->out == 0) {
        ad_tensor *both[2];
        both[0] = h;
        both[1] = c;
        return ad_concat(T, both, 2, 1);
    }
    return lstm && k->out == 2 ? c : h;
}

/* The input specs of a cell of N rows, I inputs and H units; returns their count. */
static int specs_of(const cell_ctx *k, int N, int I, int H, th_input *s)
{
    int G = (k->gru ? 3 : 4) * H, n = 0, dims[2];
    dims[0] = k->steps * N;
    dims[1] = I;
    s[n++] = th_in(2, dims, -1, 1, 0);
    dims[0] = N;
    dims[1] = H;
    if (!(k->alias && !k->layer) && !k->zero_state) s[n++] = th_in(2, dims, -1, 1, 0);
    if (!k->gru && !k->zero_state) s[n++] = th_in(2, dims, -1, 1, 0);
    dims[0] = G;
    dims[1] = I;
    s[n++] = th_in(2, dims, -0.7, 0.7, 0);
    dims[1] = H;
    if (!(k->alias && k->layer)) s[n++] = th_in(2, dims, -0.7, 0.7, 0);
    if (k->biases & 1) s[n++] = th_in(1, &G, -0.5, 0.5, 0);
    if (k->biases & 2) s[n++] = th_in(1, &G, -0.5, 0.5, 0);
    return n;
}

/* Leaves of T from specs, filled from the harness's generator; data[i] (malloc'd) keeps their
   values for the caller to free. */
static void make_inputs(ad_tape *T, int nin, const th_input *specs, double **data, ad_tensor **x)
{
    int i;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    th_leaves(T, nin, specs, data, x);
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= worst)) worst = d; /* a NaN counts as the worst */
    }
    return worst;
}

/* ---- forward ---------------------------------------------------------------------------------- */
static void test_forward(void)
{
    int gru, biases, grad;
    for (gru = 0; gru <= 1; gru++)
        for (biases = 0; biases <= 3; biases++)
            for (grad = 0; grad <= 1; grad++) {
                cell_ctx k = K(gru, biases, 0, 1);
                th_input specs[TH_MAX_INPUTS];
                double *data[TH_MAX_INPUTS], href[NB * NH], cref[NB * NH];
                ad_tensor *x[TH_MAX_INPUTS], *h2, *c2 = NULL, *hc, *cc = NULL;
                ad_tape *T = ad_tape_new();
                int nin = specs_of(&k, NB, NI, NH, specs), i, p = gru ? 2 : 3;
                const double *bi, *bh;
                size_t before;
                make_inputs(T, nin, specs, data, x);
                bi = biases & 1 ? data[p + 2] : NULL;
                bh = biases & 2 ? data[p + 2 + (biases & 1)] : NULL;
                ad_set_grad_enabled(T, grad);
                before = ad_tape_length(T);
                if (gru) {
                    h2 = ad_gru_cell(T, x[0], x[1], x[2], x[3], bi ? x[4] : NULL, bh ? x[4 + (biases & 1)] : NULL);
                    hc = comp_gru(T, x[0], x[1], x[2], x[3], bi ? x[4] : NULL, bh ? x[4 + (biases & 1)] : NULL);
                    ref_gru(NB, NI, NH, data[0], data[1], data[2], data[3], bi, bh, href);
                } else {
                    h2 = ad_lstm_cell(T, x[0], x[1], x[2], x[3], x[4], bi ? x[5] : NULL,
                                      bh ? x[5 + (biases & 1)] : NULL, &c2);
                    hc = comp_lstm(T, x[0], x[1], x[2], x[3], x[4], bi ? x[5] : NULL, bh ? x[5 + (biases & 1)] : NULL,
                                   &cc);
                    ref_lstm(NB, NI, NH, data[0], data[1], data[2], data[3], data[4], bi, bh, href, cref);
                }
                TH_CHECK(h2 && hc && (gru || (c2 && cc)), "%s biases %d: %s", gru ? "gru" : "lstm", biases, th_errs(T));
                if (h2 && hc) {
                    TH_CHECK(h2->ndim == 2 && h2->shape[0] == NB && h2->shape[1] == NH, "%s: h' shape",
                             gru ? "gru" : "lstm");
                    TH_CHECK(max_diff(h2->data, href, NB * NH) < 1e-13, "%s biases %d: h' differs from the loops by %g",
                             gru ? "gru" : "lstm", biases, max_diff(h2->data, href, NB * NH));
                    TH_CHECK(max_diff(h2->data, hc->data, NB * NH) < 1e-13,
                             "%s biases %d: h' differs from the composition by %g", gru ? "gru" : "lstm", biases,
                             max_diff(h2->data, hc->data, NB * NH));
                }
                if (c2 && cc) {
                    TH_CHECK(c2->ndim == 2 && c2->shape[0] == NB && c2->shape[1] == NH, "lstm: c' shape");
                    TH_CHECK(max_diff(c2->data, cref, NB * NH) < 1e-13, "lstm biases %d: c' differs from the loops",
                             biases);
                    TH_CHECK(max_diff(c2->data, cc->data, NB * NH) < 1e-13,
                             "lstm biases %d: c' differs from the composition", biases);
                }
                /* with recording off, the cell records nothing; with it on, its entries only */
                if (!grad) TH_CHECK(ad_tape_length(T) == before, "%s: recorded with grad off", gru ? "gru" : "lstm");
                for (i = 0; i < nin; i++) free(data[i]);
                ad_tape_free(T);
            }
    th_family("forward against loops and composition");
}

/* ---- gradients -------------------------------------------------------------------------------- */
/* sum(w * f(x)) through ad_grad with and without create_graph (the recorded derivative and the
   fused one), and through the composition of existing ops: all three agree. */
static void check_paths(const char *name, th_fn f, void *k, th_fn f_comp, void *k_comp, int nin,
                        const th_input *specs)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *x[TH_MAX_INPUTS], *loss, *loss_c;
    double *data[TH_MAX_INPUTS], worst = 0, worst_c = 0;
    int i, ok = 1, ok_c = 1;
    make_inputs(T, nin, specs, data, x);
    loss = th_weighted(T, f, k, x, 77);
    loss_c = th_weighted(T, f_comp, k_comp, x, 77);
    ok = ok_c = loss && loss_c;
    for (i = 0; ok && ok_c && i < nin; i++) {
        ad_tensor *plain = ad_grad(T, loss, x[i], 0), *graph = ad_grad(T, loss, x[i], 1);
        ad_tensor *comp = ad_grad(T, loss_c, x[i], 0);
        double d, dc;
        ok = plain && graph && plain->size == graph->size;
        ok_c = plain && comp && plain->size == comp->size;
        if (!ok || !ok_c) break;
        d = max_diff(plain->data, graph->data, plain->size);
        dc = max_diff(plain->data, comp->data, plain->size);
        if (!(d <= 1e-12)) ok = 0;
        if (!(dc <= 1e-12)) ok_c = 0;
        if (d > worst) worst = d;
        if (dc > worst_c) worst_c = dc;
    }
    TH_CHECK(ok, "%s: recorded and fused gradients differ (by %g): %s", name, worst, th_errs(T));
    TH_CHECK(ok_c, "%s: gradients differ from the composition's (by %g): %s", name, worst_c, th_errs(T));
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
}

static void check_cell(const char *name, cell_ctx k, int N, int I, int H)
{
    th_input specs[TH_MAX_INPUTS];
    int nin = specs_of(&k, N, I, H, specs);
    cell_ctx kc = k;
    kc.comp = 1;
    th_gradcheck(name, f_cell, &k, nin, specs);
    th_gradgradcheck(name, f_cell, &k, nin, specs);
    check_paths(name, f_cell, &k, f_cell, &kc, nin, specs);
}

static void test_gradients(void)
{
    static const char *const outs[] = {"h' and c'", "h' only", "c' only"};
    char name[96];
    int gru, biases, out;
    for (gru = 0; gru <= 1; gru++)
        for (biases = 0; biases <= 3; biases++) {
            snprintf(name, sizeof name, "%s, biases %d", gru ? "gru" : "lstm", biases);
            check_cell(name, K(gru, biases, 0, 1), NB, NI, NH);
        }
    for (out = 1; out <= 2; out++) {
        snprintf(name, sizeof name, "lstm, %s", outs[out]);
        check_cell(name, K(0, 3, out, 1), NB, NI, NH);
    }
    th_family("one step: gradients, second order");
}

static void test_sequence(void)
{
    int gru;
    for (gru = 0; gru <= 1; gru++) {
        cell_ctx k = K(gru, 3, 0, STEPS);
        check_cell(gru ? "gru, 4 steps" : "lstm, 4 steps", k, NB, NI, NH);
        k.biases = 2;
        k.out = 1;
        check_cell(gru ? "gru, 4 steps, b_hh only" : "lstm, 4 steps, h' only, b_hh only", k, NB, NI, NH);
        k = K(gru, 3, 0, 1);
        k.alias = 1; /* x also as h: its gradient has two shares */
        check_cell(gru ? "gru, x as h" : "lstm, x as h", k, NB, NH, NH);
    }
    th_family("unrolled steps, x as h");
}

/* Gradients added into buffers that leaves already have (parameters' own buffers) equal those
   buffers' old values plus the gradient ad_grad computes. */
static void check_into_leaves(const char *name, th_fn f, void *k, int nin, const th_input *specs)
{
    double *data[TH_MAX_INPUTS], *grads[TH_MAX_INPUTS];
    ad_tensor *x[TH_MAX_INPUTS], *loss;
    ad_tape *T = ad_tape_new();
    int i, ok = 1;
    size_t j;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        grads[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
        for (j = 0; j < n; j++) grads[i][j] = 0.25 * (double)(j % 5);
        x[i] = ad_tensor_view(T, specs[i].ndim, specs[i].shape, data[i], grads[i], 1);
    }
    loss = th_weighted(T, f, k, x, 78);
    for (i = 0; ok && i < nin; i++) {
        ad_tensor *g = ad_grad(T, loss, x[i], 0);
        ok = g != NULL;
        for (j = 0; ok && j < g->size; j++) grads[i][j] -= g->data[j]; /* the old values less it */
    }
    TH_CHECK(ok && ad_backward(T, loss) == 0, "%s: %s", name, th_errs(T));
    for (i = 0; ok && i < nin; i++)
        for (j = 0; ok && j < th_numel(&specs[i]); j++)
            if (fabs(grads[i][j] - 0.25 * (double)(j % 5)) > 1e-12) ok = 0;
    TH_CHECK(ok, "%s: ad_backward into the leaves' buffers: input %d [%zu] is off", name, i - 1, j - 1);
    for (i = 0; i < nin; i++) {
        free(data[i]);
        free(grads[i]);
    }
    ad_tape_free(T);
}

static void test_into_leaves(void)
{
    int gru;
    for (gru = 0; gru <= 1; gru++) {
        cell_ctx k = K(gru, 3, 0, 2);
        th_input specs[TH_MAX_INPUTS];
        int nin = specs_of(&k, NB, NI, NH, specs);
        check_into_leaves(gru ? "gru" : "lstm", f_cell, &k, nin, specs);
    }
    th_family("gradients into the leaves' buffers");
}

/* ---- threads ---------------------------------------------------------------------------------- */
/* Large enough that the products and the gates' passes are split over threads. */
enum { TN = 160, TI = 40, TH = 64 };

/* Three steps of the cell on `threads` threads: h' (and c') into out, then every input's
   gradient after it. Returns the number of values written, 0 on failure. */
static size_t thread_run(th_fn f, void *k, int nin, const th_input *specs, int threads, double *out)
{
    double *data[TH_MAX_INPUTS];
    ad_tensor *x[TH_MAX_INPUTS], *y, *loss;
    ad_tape *T = ad_tape_new();
    int i;
    size_t at = 0;
    ad_rng_seed(&th_rng_state, 4242);
    make_inputs(T, nin, specs, data, x);
    ad_set_threads(T, threads);
    y = f(T, x, k);
    loss = y ? ad_sum(T, ad_mul(T, y, y)) : NULL;
    if (loss && ad_backward(T, loss) == 0) {
        memcpy(out, y->data, y->size * sizeof(double));
        at = y->size;
        for (i = 0; i < nin; i++) {
            memcpy(out + at, x[i]->grad, x[i]->size * sizeof(double));
            at += x[i]->size;
        }
    }
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
    return at;
}

/* Values and gradients of f on 2 and 3 threads against 1 thread's, bit for bit. */
static void check_threads(const char *name, th_fn f, void *k, int nin, const th_input *specs)
{
    size_t cap = 8 * (size_t)TN * 4 * TH + 8 * (size_t)4 * TH * (TI + TH + 2), n1, n;
    double *one = (double *)malloc(cap * sizeof(double)), *more = (double *)malloc(cap * sizeof(double));
    int t;
    n1 = one && more ? thread_run(f, k, nin, specs, 1, one) : 0;
    TH_CHECK(n1 > 0, "%s on one thread failed", name);
    for (t = 2; n1 && t <= 3; t++) {
        n = thread_run(f, k, nin, specs, t, more);
        TH_CHECK(n == n1 && memcmp(one, more, n1 * sizeof(double)) == 0,
                 "%s on %d threads: values or gradients differ from one thread's", name, t);
    }
    free(one);
    free(more);
}

static void test_threads(void)
{
    int gru;
    for (gru = 0; gru <= 1; gru++) {
        cell_ctx k = K(gru, 3, 0, 3);
        th_input specs[TH_MAX_INPUTS];
        int nin = specs_of(&k, TN, TI, TH, specs);
        check_threads(gru ? "gru" : "lstm", f_cell, &k, nin, specs);
    }
    th_family("1, 2 and 3 threads");
}

/* ---- the LSTM layer --------------------------------------------------------------------------- */
/* A layer's inputs are a cell's (specs_of), h0 and c0 left out with zero_state set. */
static cell_ctx KL(int gru, int biases, int out, int zero_state, int steps)
{
    cell_ctx k = K(gru, biases, out, steps);
    k.layer = 1;
    k.zero_state = zero_state;
    return k;
}

enum { MAX_STEPS = 8 };

/* The layer's outputs [steps N, H] and last state, from ad_lstm or ad_gru, or from unrolled
   cells. */
static ad_tensor *f_layer(ad_tape *T, ad_tensor **in, void *vctx)
{
    const cell_ctx *k = (const cell_ctx *)vctx;
    int lstm = !k->gru, p = k->zero_state ? 1 : 2 + lstm, q = p + (k->alias ? 1 : 2), L = k->steps;
    int N = in[0]->shape[0] / L, s, shape[3];
    ad_tensor *x = in[0], *h = k->zero_state ? NULL : in[1], *c = k->zero_state || !lstm ? NULL : in[2], *w_ih = in[p];
    ad_tensor *w_hh = k->alias ? w_ih : in[p + 1], *b_ih = k->biases & 1 ? in[q] : NULL;
    ad_tensor *b_hh = k->biases & 2 ? in[q + (k->biases & 1)] : NULL, *out, *hn = NULL, *cn = NULL, *parts[3];
    int H = w_hh->shape[1];
    shape[0] = N;
    shape[1] = H;
    if (!k->layer) {
        ad_tensor *hs[MAX_STEPS];
        if (!h) h = ad_zeros(T, 2, shape);
        if (!c && lstm) c = ad_zeros(T, 2, shape);
        for (s = 0; s < L; s++) {
            ad_tensor *xs = ad_slice(T, x, 0, s * N, (s + 1) * N);
            h = lstm ? ad_lstm_cell(T, xs, h, c, w_ih, w_hh, b_ih, b_hh, &c) : ad_gru_cell(T, xs, h, w_ih, w_hh, b_ih, b_hh);
            if (!h) return NULL;
            hs[s] = h;
        }
        out = ad_concat(T, hs, L, 0);
        hn = h;
        cn = c;
    } else {
        shape[0] = L;
        shape[1] = N;
        shape[2] = x->shape[1];
        if (lstm)
            out = ad_lstm(T, ad_reshape(T, x, 3, shape), h, c, w_ih, w_hh, b_ih, b_hh,
                          k->out == 0 || k->out == 3 ? &hn : NULL, k->out == 0 || k->out == 2 ? &cn : NULL);
        else
            out = ad_gru(T, ad_reshape(T, x, 3, shape), h, w_ih, w_hh, b_ih, b_hh, k->out == 0 || k->out == 3 ? &hn : NULL);
        if (!out) return NULL;
        shape[0] = L * N;
        shape[1] = H;
        out = ad_reshape(T, out, 2, shape);
    }
    if (k->out == 1) return out;
    if (k->out == 2) return cn;
    if (k->out == 3) return hn;
    parts[0] = out;
    parts[1] = hn;
    parts[2] = cn;
    return ad_concat(T, parts, lstm ? 3 : 2, 0);
}

/* A layer's outputs, h_n and c_n against unrolled cells', and what it records. */
static void test_layer_forward(void)
{
    int gru, biases, state, grad, L;
    for (gru = 0; gru <= 1; gru++)
        for (L = 1; L <= 5; L += 4)
            for (biases = 0; biases <= 3; biases++)
                for (state = 0; state <= 1; state++)
                    for (grad = 0; grad <= 1; grad++) {
                        const char *name = gru ? "gru layer" : "lstm layer";
                        cell_ctx k = KL(gru, biases, 0, !state, L), kc = k;
                        th_input specs[TH_MAX_INPUTS];
                        double *data[TH_MAX_INPUTS];
                        ad_tensor *x[TH_MAX_INPUTS], *y, *yc, *hn = NULL, *cn = NULL, *x3;
                        ad_tape *T = ad_tape_new();
                        int nin = specs_of(&k, NB, NI, NH, specs), i, shape[3], w = state ? 3 - gru : 1;
                        size_t before;
                        make_inputs(T, nin, specs, data, x);
                        ad_set_grad_enabled(T, grad);
                        kc.layer = 0;
                        yc = f_layer(T, x, &kc);
                        before = ad_tape_length(T);
                        y = f_layer(T, x, &k);
                        TH_CHECK(y && yc && y->size == yc->size, "%s L %d biases %d state %d: %s", name, L, biases,
                                 state, th_errs(T));
                        if (y && yc && y->size == yc->size)
                            TH_CHECK(max_diff(y->data, yc->data, y->size) < 1e-13,
                                     "%s L %d biases %d state %d: differs from the cells by %g", name, L, biases, state,
                                     max_diff(y->data, yc->data, y->size));
                        /* with recording off, the layer records nothing (f_layer's reshapes and
                           concat record nothing either) */
                        if (!grad) TH_CHECK(ad_tape_length(T) == before, "%s: recorded with grad off", name);
                        shape[0] = L;
                        shape[1] = NB;
                        shape[2] = NI;
                        x3 = ad_reshape(T, x[0], 3, shape);
                        if (gru) y = ad_gru(T, x3, state ? x[1] : NULL, x[w], x[w + 1], NULL, NULL, &hn);
                        else y = ad_lstm(T, x3, state ? x[1] : NULL, state ? x[2] : NULL, x[w], x[w + 1], NULL, NULL,
                                         &hn, &cn);
                        TH_CHECK(y && y->ndim == 3 && y->shape[0] == L && y->shape[1] == NB && y->shape[2] == NH &&
                                     hn && hn->ndim == 2 && hn->shape[0] == NB && hn->shape[1] == NH &&
                                     (gru || (cn && cn->ndim == 2 && cn->shape[0] == NB && cn->shape[1] == NH)),
                                 "%s L %d: shapes of the outputs, h_n and c_n", name, L);
                        if (y && hn)
                            TH_CHECK(memcmp(hn->data, y->data + (size_t)(L - 1) * NB * NH, NB * NH * sizeof(double)) == 0,
                                     "%s L %d: h_n is not the last output", name, L);
                        for (i = 0; i < nin; i++) free(data[i]);
                        ad_tape_free(T);
                    }
    th_family("layers: forward against unrolled cells");
}

/* A layer's inputs on T, random from seed: in[0] x [L, N, I], in[1] h0 and in[2] c0 [N, H],
   in[3] w_ih [G, I] and in[4] w_hh [G, H] (standard deviations w_scale and w_scale / 2),
   in[5] b_ih and in[6] b_hh [G], with G = 3H for a GRU, 4H for an LSTM. */
static void layer_inputs(ad_tape *T, int gru, int L, int N, int I, int H, double w_scale, unsigned seed,
                         ad_tensor **in)
{
    ad_rng rng;
    int sx[3], sh[2], sw_ih[2], sw_hh[2], sb[1];
    ad_rng_seed(&rng, seed);
    sx[0] = L;
    sx[1] = N;
    sx[2] = I;
    sh[0] = N;
    sh[1] = H;
    sw_ih[0] = sw_hh[0] = sb[0] = (gru ? 3 : 4) * H;
    sw_ih[1] = I;
    sw_hh[1] = H;
    in[0] = ad_randn(T, 3, sx, 0, 1, &rng);
    in[1] = ad_randn(T, 2, sh, 0, 0.5, &rng);
    in[2] = ad_randn(T, 2, sh, 0, 0.5, &rng);
    in[3] = ad_randn(T, 2, sw_ih, 0, w_scale, &rng);
    in[4] = ad_randn(T, 2, sw_hh, 0, w_scale / 2, &rng);
    in[5] = ad_randn(T, 1, sb, 0, 0.2, &rng);
    in[6] = ad_randn(T, 1, sb, 0, 0.2, &rng);
}

/* One layer call on a tape of its own: the outputs (and h_n, c_n) written into out, and the
   arena's growth over the call. record: inputs that want gradients and recording on; else none
   wanted (the layer is not recorded), with grad_off choosing no-grad mode or inputs without
   gradients. */
static size_t chunk_run(int gru, int record, int grad_off, int L, int N, int I, int H, double *out)
{
    ad_tape *T = ad_tape_new();
    int i;
    ad_tensor *in[7], *y, *hn = NULL, *cn = NULL;
    size_t before, grown, plane = (size_t)N * H;
    layer_inputs(T, gru, L, N, I, H, 0.4, 7, in);
    for (i = 0; i < 7; i++) ad_set_requires_grad(in[i], record || !grad_off);
    if (!record) {
        if (grad_off) ad_set_grad_enabled(T, 0);
        else
            for (i = 0; i < 7; i++) ad_set_requires_grad(in[i], 0);
    }
    before = ad_tape_bytes_used(T);
    if (gru) y = ad_gru(T, in[0], in[1], in[3], in[4], in[5], in[6], &hn);
    else y = ad_lstm(T, in[0], in[1], in[2], in[3], in[4], in[5], in[6], &hn, &cn);
    grown = ad_tape_bytes_used(T) - before;
    TH_CHECK(y && hn && (gru || cn) && (ad_tape_length(T) > 0) == record,
             "%s L %d N %d, %s: %s, %zu entries", gru ? "ad_gru" : "ad_lstm", L, N,
             record ? "recorded" : grad_off ? "no-grad mode" : "no input wants a gradient", th_errs(T),
             ad_tape_length(T));
    if (y && hn && (gru || cn)) {
        memcpy(out, y->data, (size_t)L * plane * sizeof(double));
        memcpy(out + (size_t)L * plane, hn->data, plane * sizeof(double));
        if (!gru) memcpy(out + (size_t)(L + 1) * plane, cn->data, plane * sizeof(double));
    }
    ad_tape_free(T);
    return grown;
}

/* Layers that are not recorded keep one chunk's gates, not the sequence's: on several chunks
   (N = 40 rows give chunks of at most 12 steps, so 14 steps are two of 7, 30 three of 10), the
   outputs, h_n and c_n equal a recorded call's up to rounding, in no-grad mode and with no
   input wanting a gradient, and the arena grows by the output, one chunk's gates and three
   planes (with room for headers), where a recorded call keeps six planes a step besides. */
static void test_layer_chunks(void)
{
    enum { N = 40, I = 5, H = 7, HEADERS = 4096 };
    static const int lengths[] = {1, 11, 12, 13, 14, 30};
    int gru, li, grad_off;
    for (gru = 0; gru <= 1; gru++)
        for (li = 0; li < (int)(sizeof lengths / sizeof lengths[0]); li++) {
            int L = lengths[li], chunk = (L + (L + 11) / 12 - 1) / ((L + 11) / 12);
            size_t plane = (size_t)N * H, n = (size_t)(L + 2) * plane, kept;
            size_t bound = ((size_t)(L + 1) + (size_t)(gru ? 3 : 4) * chunk + 3) * plane * sizeof(double) + HEADERS;
            double *rec = (double *)calloc(n, sizeof(double)), *got = (double *)calloc(n, sizeof(double));
            size_t recorded = chunk_run(gru, 1, 0, L, N, I, H, rec);
            TH_CHECK(recorded >= (size_t)(7 * L) * plane * sizeof(double),
                     "%s L %d: a recorded call grew the arena by %zu bytes, less than its kept state",
                     gru ? "ad_gru" : "ad_lstm", L, recorded);
            for (grad_off = 0; grad_off <= 1; grad_off++) {
                memset(got, 0, n * sizeof(double));
                kept = chunk_run(gru, 0, grad_off, L, N, I, H, got);
                TH_CHECK(max_diff(rec, got, n) < 1e-13,
                         "%s L %d, %s: differs from the recorded call by %g", gru ? "ad_gru" : "ad_lstm", L,
                         grad_off ? "no-grad mode" : "no input wants a gradient", max_diff(rec, got, n));
                TH_CHECK(kept <= bound, "%s L %d, %s: the arena grew by %zu bytes, more than %zu",
                         gru ? "ad_gru" : "ad_lstm", L, grad_off ? "no-grad mode" : "no input wants a gradient",
                         kept, bound);
            }
            free(rec);
            free(got);
        }
    th_family("layers not recorded: in chunks, one chunk's gates kept");
}

/* A layer on sizes whose products go through the packed GEMM (w_ih^T and w_hh^T packed once per
   call): I = H = 300 make K two blocks of the GEMM's depth, and 4H = 1200 columns; on 2 and 3
   threads the per-step products (5 rows) split by columns or along K, and the input product
   (200 rows) shares the packed blocks between threads. Its outputs against unrolled cells',
   whose products pack w_hh^T at each step, on 1, 2 and 3 threads, recorded and in no-grad
   mode. */
static void test_layer_packed(void)
{
    enum { L = 40, N = 5, I = 300, H = 300 };
    int gru, threads, grad, i;
    for (gru = 0; gru <= 1; gru++)
        for (threads = 1; threads <= 3; threads++)
            for (grad = 0; grad <= 1; grad++) {
                ad_tape *T = ad_tape_new();
                int s, step_shape[2] = {N, I};
                ad_tensor *in[7], *x, *h0, *c0, *w_ih, *w_hh, *b_ih, *b_hh, *y, *h, *c, *hs[L];
                ad_set_threads(T, threads);
                layer_inputs(T, gru, L, N, I, H, 0.1, 11, in);
                x = in[0];
                h0 = in[1];
                c0 = in[2];
                w_ih = in[3];
                w_hh = in[4];
                b_ih = in[5];
                b_hh = in[6];
                ad_set_requires_grad(w_hh, 1);
                ad_set_grad_enabled(T, grad);
                y = gru ? ad_gru(T, x, h0, w_ih, w_hh, b_ih, b_hh, NULL)
                        : ad_lstm(T, x, h0, c0, w_ih, w_hh, b_ih, b_hh, NULL, NULL);
                h = h0;
                c = c0;
                for (s = 0; s < L && h; s++) {
                    ad_tensor *xs = ad_reshape(T, ad_slice(T, x, 0, s, s + 1), 2, step_shape);
                    h = gru ? ad_gru_cell(T, xs, h, w_ih, w_hh, b_ih, b_hh)
                            : ad_lstm_cell(T, xs, h, c, w_ih, w_hh, b_ih, b_hh, &c);
                    hs[s] = h;
                }
                TH_CHECK(y && h, "%s, %d thread(s), grad %d: %s", gru ? "ad_gru" : "ad_lstm", threads, grad, th_errs(T));
                if (y && h) {
                    double most = 0;
                    for (s = 0; s < L; s++)
                        for (i = 0; i < N * H; i++) {
                            double d = fabs(y->data[(size_t)s * N * H + i] - hs[s]->data[i]);
                            if (d > most) most = d;
                        }
                    TH_CHECK(most < 1e-12, "%s, %d thread(s), grad %d: the outputs differ from unrolled cells' by %g",
                             gru ? "ad_gru" : "ad_lstm", threads, grad, most);
                }
                ad_tape_free(T);
            }
    th_family("layers: packed products against unrolled cells");
}

/* First and second derivatives against finite differences, the recorded derivative and the
   unrolled cells' gradients against the fused sweep's, gradients into the leaves' buffers, and
   threads. */
static void test_layer_gradients(void)
{
    static const char *const outs[] = {"outputs, h_n, c_n", "outputs", "c_n", "h_n"};
    cell_ctx cases[20];
    char name[96];
    int n = 0, i, gru;
    for (gru = 0; gru <= 1; gru++) {
        cases[n++] = KL(gru, 3, 0, 0, 4);
        cases[n++] = KL(gru, 0, 0, 0, 4);
        cases[n++] = KL(gru, 1, 1, 0, 4);
        cases[n++] = KL(gru, 2, gru ? 3 : 2, 0, 3);
        cases[n++] = KL(gru, 3, 3, 0, 3);
        cases[n++] = KL(gru, 3, 0, 1, 4);
        cases[n++] = KL(gru, 2, 1, 1, 2);
        cases[n++] = KL(gru, 3, 0, 0, 1);
        cases[n++] = KL(gru, 3, gru ? 3 : 2, 1, 1);
    }
    for (gru = 0; gru <= 1; gru++) { /* w_ih given as w_hh too: its gradient has both shares */
        cases[n] = KL(gru, 3, 0, 0, 3);
        cases[n++].alias = 1;
    }
    for (i = 0; i < n; i++) {
        cell_ctx kc = cases[i];
        th_input specs[TH_MAX_INPUTS];
        int nin = specs_of(&cases[i], NB, cases[i].alias ? NH : NI, NH, specs);
        snprintf(name, sizeof name, "%s layer L %d, biases %d, %s, %s%s", cases[i].gru ? "gru" : "lstm",
                 cases[i].steps, cases[i].biases, cases[i].zero_state ? "zero state" : "h0 and c0",
                 cases[i].gru && !cases[i].out ? "outputs, h_n" : outs[cases[i].out],
                 cases[i].alias ? ", w_ih as w_hh" : "");
        kc.layer = 0;
        th_gradcheck(name, f_layer, &cases[i], nin, specs);
        th_gradgradcheck(name, f_layer, &cases[i], nin, specs);
        check_paths(name, f_layer, &cases[i], f_layer, &kc, nin, specs);
        check_into_leaves(name, f_layer, &cases[i], nin, specs);
    }
    for (gru = 0; gru <= 1; gru++) {
        cell_ctx k = KL(gru, 3, 0, 0, 3);
        th_input specs[TH_MAX_INPUTS];
        int nin = specs_of(&k, TN, TI, TH, specs);
        check_threads(gru ? "gru layer" : "lstm layer", f_layer, &k, nin, specs);
    }
    th_family("layers: gradients, second order, threads");
}

/* ---- errors ----------------------------------------------------------------------------------- */
static ad_tensor *Z(ad_tape *T, int ndim, int d0, int d1)
{
    int shape[2];
    shape[0] = d0;
    shape[1] = d1;
    return ad_zeros(T, ndim, shape);
}

static void test_errors(void)
{
    ad_tape *T = ad_tape_new(), *other = ad_tape_new();
    ad_tensor *x = Z(T, 2, 3, 5), *h = Z(T, 2, 3, 7), *c = Z(T, 2, 3, 7), *wi = Z(T, 2, 28, 5), *wh = Z(T, 2, 28, 7);
    ad_tensor *b = Z(T, 1, 28, 0), *gwi = Z(T, 2, 21, 5), *gwh = Z(T, 2, 21, 7), *c_out = x, *y;

    /* NULL inputs: NULL, no message, *c_out cleared */
    TH_CHECK(!ad_lstm_cell(T, NULL, h, c, wi, wh, b, b, &c_out) && !c_out && !ad_tape_error(T),
             "lstm NULL x: %s", th_errs(T));
    TH_CHECK(!ad_lstm_cell(T, x, h, NULL, wi, wh, NULL, NULL, &c_out) && !ad_tape_error(T), "lstm NULL c");
    TH_CHECK(!ad_lstm_cell(NULL, x, h, c, wi, wh, NULL, NULL, &c_out), "lstm NULL tape");
    TH_CHECK(!ad_gru_cell(T, x, h, NULL, gwh, NULL, NULL) && !ad_tape_error(T), "gru NULL w_ih: %s", th_errs(T));
    TH_CHECK(!ad_gru_cell(NULL, x, h, gwi, gwh, NULL, NULL), "gru NULL tape");

    /* a good call works, and the bad ones below are told apart from it */
    y = ad_lstm_cell(T, x, h, c, wi, wh, b, NULL, &c_out);
    TH_CHECK(y && c_out && !ad_tape_error(T), "lstm good call: %s", th_errs(T));
    TH_CHECK(ad_gru_cell(T, x, h, gwi, gwh, NULL, Z(T, 1, 21, 0)) && !ad_tape_error(T), "gru good call: %s", th_errs(T));

    TH_CHECK(!ad_lstm_cell(T, x, h, c, wi, wh, NULL, NULL, NULL), "lstm c_out NULL");
    TH_CHECK_ERROR(T, "ad_lstm_cell: c_out is NULL");
    ad_tape_clear_error(T);

    TH_CHECK(!ad_lstm_cell(T, x, h, c, gwi, wh, b, NULL, &c_out) && !c_out, "lstm bad w_ih");
    TH_CHECK_ERROR(T, "ad_lstm_cell: x [3,5], h [3,7], c [3,7], w_ih [21,5], w_hh [28,7], b_ih [28], b_hh none: "
                      "w_ih must be [28,5]");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_lstm_cell(T, x, h, c, wi, gwh, NULL, NULL, &c_out), "lstm bad w_hh");
    TH_CHECK_ERROR(T, "w_hh [21,7], b_ih none, b_hh none: w_hh must be [28,7]");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_lstm_cell(T, x, h, Z(T, 2, 3, 6), wi, wh, NULL, NULL, &c_out), "lstm bad c");
    TH_CHECK_ERROR(T, "c [3,6]");
    TH_CHECK_ERROR(T, "c must be [3,7], as h");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_lstm_cell(T, x, h, c, wi, wh, NULL, Z(T, 1, 21, 0), &c_out), "lstm bad b_hh");
    TH_CHECK_ERROR(T, "b_hh [21]: b_ih and b_hh must be [28]");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_lstm_cell(T, Z(T, 2, 4, 5), h, c, wi, wh, NULL, NULL, &c_out), "lstm rows differ");
    TH_CHECK_ERROR(T, "ad_lstm_cell: x [4,5], h [3,7]");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_lstm_cell(T, Z(T, 1, 5, 0), h, c, wi, wh, NULL, NULL, &c_out), "lstm 1-D x");
    TH_CHECK_ERROR(T, "x must be [N, I] and h [N, H]");
    ad_tape_clear_error(T);

    TH_CHECK(!ad_gru_cell(T, x, h, wi, gwh, NULL, NULL), "gru bad w_ih");
    TH_CHECK_ERROR(T, "ad_gru_cell: x [3,5], h [3,7], w_ih [28,5], w_hh [21,7], b_ih none, b_hh none: w_ih must be "
                      "[21,5]");
    ad_tape_clear_error(T);
    TH_CHECK(!ad_gru_cell(T, x, h, gwi, gwh, b, NULL), "gru bad b_ih");
    TH_CHECK_ERROR(T, "b_ih [28]");
    ad_tape_clear_error(T);

    {
        int s3[3] = {2, 3, 5};
        ad_tensor *xs = ad_zeros(T, 3, s3), *hn = x, *cn = x;
        TH_CHECK(!ad_lstm(T, NULL, h, c, wi, wh, NULL, NULL, &hn, &cn) && !hn && !cn && !ad_tape_error(T),
                 "layer NULL x: %s", th_errs(T));
        TH_CHECK(!ad_lstm(NULL, xs, h, c, wi, wh, NULL, NULL, NULL, NULL), "layer NULL tape");
        TH_CHECK(ad_lstm(T, xs, NULL, NULL, wi, wh, b, b, &hn, &cn) && hn && cn && !ad_tape_error(T),
                 "layer good call: %s", th_errs(T));
        TH_CHECK(!ad_lstm(T, x, NULL, c, wi, wh, NULL, NULL, &hn, &cn) && !hn && !cn, "layer 2-D x, no h0");
        TH_CHECK_ERROR(T, "ad_lstm: x [3,5], h0 none, c0 [3,7], w_ih [28,5], w_hh [28,7], b_ih none, b_hh none: x "
                          "must be [L, N, I]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, x, h, c, wi, wh, NULL, NULL, NULL, NULL), "layer 2-D x");
        TH_CHECK_ERROR(T, "ad_lstm: x [3,5], h0 [3,7], c0 [3,7], w_ih [28,5], w_hh [28,7], b_ih none, b_hh none: "
                          "x must be [L, N, I] and h0 [N, H]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, xs, h, NULL, gwi, wh, b, NULL, NULL, NULL), "layer bad w_ih");
        TH_CHECK_ERROR(T, "ad_lstm: x [2,3,5], h0 [3,7], c0 none, w_ih [21,5], w_hh [28,7], b_ih [28], b_hh none: "
                          "w_ih must be [28,5]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, xs, h, Z(T, 2, 3, 6), wi, wh, NULL, NULL, NULL, NULL), "layer bad c0");
        TH_CHECK_ERROR(T, "c0 must be [3,7], as h0");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, xs, NULL, Z(T, 2, 3, 6), wi, wh, NULL, NULL, NULL, NULL), "layer bad c0, no h0");
        TH_CHECK_ERROR(T, "ad_lstm: x [2,3,5], h0 none, c0 [3,6], w_ih [28,5], w_hh [28,7], b_ih none, b_hh none: c0 "
                          "must be [3,7]");
        ad_tape_clear_error(T);
        { /* shapes are checked before a zero state is made: a bad w_hh costs no memory */
            int sx[3] = {1, 10000, 1};
            ad_tensor *xb = ad_zeros(T, 3, sx), *wib = Z(T, 2, 20, 1), *whb = Z(T, 2, 20, 5000);
            size_t used = ad_tape_bytes_used(T);
            TH_CHECK(!ad_lstm(T, xb, NULL, NULL, wib, whb, NULL, NULL, NULL, NULL) &&
                         ad_tape_bytes_used(T) == used, "layer bad shapes, no state: %zu bytes more",
                     ad_tape_bytes_used(T) - used);
            TH_CHECK_ERROR(T, "ad_lstm: x [1,10000,1], h0 none, c0 none, w_ih [20,1], w_hh [20,5000]");
            ad_tape_clear_error(T);
        }
        TH_CHECK(!ad_lstm(T, xs, Z(T, 2, 4, 7), NULL, wi, wh, NULL, NULL, NULL, NULL), "layer rows differ");
        TH_CHECK_ERROR(T, "ad_lstm: x [2,3,5], h0 [4,7]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, xs, NULL, NULL, wi, Z(T, 1, 28, 0), NULL, NULL, NULL, NULL), "layer 1-D w_hh");
        TH_CHECK_ERROR(T, "ad_lstm: x [2,3,5], h0 none, c0 none, w_ih [28,5], w_hh [28], b_ih none, b_hh none: w_hh "
                          "must be [4H, H]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_lstm(T, xs, Z(other, 2, 3, 7), NULL, wi, wh, NULL, NULL, NULL, NULL), "layer h0 of another tape");
        TH_CHECK_ERROR(T, "ad_lstm: h0 belongs to another tape");
        ad_tape_clear_error(T);

        TH_CHECK(!ad_gru(T, NULL, h, gwi, gwh, NULL, NULL, &hn) && !hn && !ad_tape_error(T), "gru layer NULL x: %s",
                 th_errs(T));
        TH_CHECK(!ad_gru(NULL, xs, h, gwi, gwh, NULL, NULL, NULL), "gru layer NULL tape");
        TH_CHECK(ad_gru(T, xs, NULL, gwi, gwh, NULL, NULL, &hn) && hn && !ad_tape_error(T), "gru layer good call: %s",
                 th_errs(T));
        TH_CHECK(!ad_gru(T, x, NULL, gwi, gwh, NULL, NULL, &hn) && !hn, "gru layer 2-D x, no h0");
        TH_CHECK_ERROR(T, "ad_gru: x [3,5], h0 none, w_ih [21,5], w_hh [21,7], b_ih none, b_hh none: x must be "
                          "[L, N, I]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_gru(T, xs, h, wi, gwh, NULL, NULL, NULL), "gru layer bad w_ih");
        TH_CHECK_ERROR(T, "ad_gru: x [2,3,5], h0 [3,7], w_ih [28,5], w_hh [21,7], b_ih none, b_hh none: w_ih must be "
                          "[21,5]");
        ad_tape_clear_error(T);
        TH_CHECK(!ad_gru(T, xs, Z(T, 2, 3, 6), gwi, gwh, NULL, NULL, NULL), "gru layer bad h0");
        TH_CHECK_ERROR(T, "ad_gru: x [2,3,5], h0 [3,6]");
        ad_tape_clear_error(T);
    }

    TH_CHECK(!ad_gru_cell(T, x, h, gwi, Z(other, 2, 21, 7), NULL, NULL), "gru w_hh of another tape");
    TH_CHECK_ERROR(T, "ad_gru_cell: w_hh belongs to another tape");
    ad_tape_clear_error(T);
    ad_tape_reset(T);
    TH_CHECK(!ad_lstm_cell(T, Z(T, 2, 3, 5), h, Z(T, 2, 3, 7), wi, wh, NULL, NULL, &c_out), "lstm stale h");
    TH_CHECK_ERROR(T, "ad_lstm_cell: h was made before the tape's last reset");

    ad_tape_free(T);
    ad_tape_free(other);
    th_family("errors");
}

int main(void)
{
    ad_rng_seed(&th_rng_state, 20261125);
    test_forward();
    test_gradients();
    test_sequence();
    test_into_leaves();
    test_threads();
    test_layer_forward();
    test_layer_chunks();
    test_layer_packed();
    test_layer_gradients();
    test_errors();
    return th_summary();
}
