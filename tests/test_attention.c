/* ad_attention, the fused scaled dot-product attention.

   Its forward against a plain-loop computation written here and against the same attention
   composed of existing ops (matmul, masked softmax, matmul), causal and not, on odd shapes
   (one query, seven, D = 5, Tq != Tk, several blocks of rows and keys, B H > 1); its first and
   second derivatives against central finite differences (th_gradcheck, th_gradgradcheck); the
   recorded derivative (create_graph) against the fused one of a plain sweep, and the fused
   gradients against the composition's; q, k and v as one tensor; values and gradients on two
   and three threads equal to one thread's bit for bit; large logits that stay finite; no
   [T, T] matrix kept on the tape; bad arguments, whose messages name the op and the shapes, and
   NULL inputs. ad_self_attention, which reads q, k and v from one [B, T, 3 C] tensor and merges
   the heads: its values and gradients against splitting, ad_attention and merging, bit for
   bit; its derivatives against finite differences; its recorded derivative against the fused
   one; its threads; its errors. Each family prints the number of its checks. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

/* One case: shapes and settings. */
typedef struct attn_case {
    int b, h, tq, tk, d, dv, causal;
    double scale; /* 0: 1 / sqrt(d) */
} attn_case;

static void shape4(int *s, int b, int h, int t, int d)
{
    s[0] = b;
    s[1] = h;
    s[2] = t;
    s[3] = d;
}

/* The plain-loop reference: o [b, h, tq, dv]. */
static void naive(const attn_case *c, const double *q, const double *k, const double *v, double *o)
{
    double scale = c->scale != 0 ? c->scale : 1 / sqrt((double)c->d);
    double *s = (double *)malloc((size_t)c->tk * sizeof(double));
    int p, i, j, e;
    for (p = 0; p < c->b * c->h; p++)
        for (i = 0; i < c->tq; i++) {
            const double *qi = q + ((size_t)p * c->tq + i) * c->d;
            double m = -HUGE_VAL, sum = 0;
            int n = c->causal && i + 1 < c->tk ? i + 1 : c->tk;
            for (j = 0; j < n; j++) {
                const double *kj = k + ((size_t)p * c->tk + j) * c->d;
                double dot = 0;
                for (e = 0; e < c->d; e++) dot += qi[e] * kj[e];
                s[j] = dot * scale;
                if (s[j] > m) m = s[j];
            }
            for (j = 0; j < n; j++) sum += (s[j] = exp(s[j] - m));
            for (e = 0; e < c->dv; e++) {
                double acc = 0;
                for (j = 0; j < n; j++) acc += s[j] * v[((size_t)p * c->tk + j) * c->dv + e];
                o[((size_t)p * c->tq + i) * c->dv + e] = acc / sum;
            }
        }
    free(s);
}

/* The same attention composed of existing ops. */
static ad_tensor *composed(ad_tape *T, ad_tensor *q, ad_tensor *k, ad_tensor *v, int causal, double scale)
{
    ad_tensor *s;
    if (!q || !k || !v) return NULL;
    if (scale == 0) scale = 1 / sqrt((double)q->shape[3]);
    s = ad_mul_scalar(T, ad_matmul_t(T, q, k, 0, 1), scale);
    if (causal) {
        int shape[2], i, j;
        ad_tensor *mask;
        shape[0] = q->shape[2];
        shape[1] = k->shape[2];
        mask = ad_zeros(T, 2, shape);
        for (i = 0; i < shape[0]; i++)
            for (j = 0; j < shape[1]; j++) mask->data[i * shape[1] + j] = j > i;
        s = ad_masked_fill(T, s, mask, -HUGE_VAL);
    }
    return ad_matmul(T, ad_softmax(T, s, -1), v);
}

/* q, k and v of case c on T, uniform in [lo, hi]. */
static void make_inputs(ad_tape *T, const attn_case *c, double lo, double hi, ad_rng *rng, int requires_grad,
                        ad_tensor **q, ad_tensor **k, ad_tensor **v)
{
    int s[4];
    shape4(s, c->b, c->h, c->tq, c->d);
    *q = ad_rand(T, 4, s, lo, hi, rng);
    shape4(s, c->b, c->h, c->tk, c->d);
    *k = ad_rand(T, 4, s, lo, hi, rng);
    shape4(s, c->b, c->h, c->tk, c->dv);
    *v = ad_rand(T, 4, s, lo, hi, rng);
    if (requires_grad) {
        ad_set_requires_grad(*q, 1);
        ad_set_requires_grad(*k, 1);
        ad_set_requires_grad(*v, 1);
    }
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= worst)) worst = d; /* a NaN wins */
    }
    return worst;
}

static const attn_case cases[] = {
    {1, 1, 1, 1, 1, 1, 0, 0},     {1, 1, 1, 1, 1, 1, 1, 0},     {2, 3, 7, 7, 5, 5, 0, 0},
    {2, 3, 7, 7, 5, 5, 1, 0},     {1, 2, 7, 5, 5, 3, 1, 0},     {1, 2, 3, 9, 4, 6, 1, 0.7},
    {1, 2, 3, 9, 4, 6, 0, -0.3},  {2, 2, 70, 70, 8, 8, 1, 0},   {1, 1, 130, 67, 5, 6, 0, 0},
    {1, 1, 130, 67, 5, 6, 1, 0},  {1, 1, 67, 130, 3, 2, 1, 0},  {3, 4, 64, 64, 32, 32, 1, 0},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* ---- forward ------------------------------------------------------------------------------ */
static void test_forward(void)
{
    int ci;
    for (ci = 0; ci < NCASES; ci++) {
        const attn_case *c = &cases[ci];
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        ad_tensor *q, *k, *v, *y, *z;
        double *ref;
        ad_rng_seed(&rng, 100 + (uint64_t)ci);
        make_inputs(T, c, -2, 2, &rng, 0, &q, &k, &v);
        y = ad_attention(T, q, k, v, c->causal, c->scale);
        z = composed(T, q, k, v, c->causal, c->scale);
        TH_CHECK(y && y->ndim == 4 && y->shape[0] == c->b && y->shape[1] == c->h && y->shape[2] == c->tq &&
                     y->shape[3] == c->dv,
                 "case %d: shape or error: %s", ci, th_errs(T));
        ref = (double *)malloc((size_t)c->b * c->h * c->tq * c->dv * sizeof(double));
        naive(c, q->data, k->data, v->data, ref);
        if (y && z) {
            double dn = max_diff(y->data, ref, y->size), dc = max_diff(y->data, z->data, y->size);
            TH_CHECK(dn < 1e-12, "case %d (causal %d): %g from the plain loops", ci, c->causal, dn);
            TH_CHECK(dc < 1e-12, "case %d (causal %d): %g from the composed ops", ci, c->causal, dc);
        }
        free(ref);
        ad_tape_free(T);
    }
    {
        /* a causal first row is its first value; without the mask it is not */
        attn_case c = {1, 1, 5, 5, 3, 2, 1, 0};
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        ad_tensor *q, *k, *v, *y, *u;
        ad_rng_seed(&rng, 7);
        make_inputs(T, &c, -1, 1, &rng, 0, &q, &k, &v);
        y = ad_attention(T, q, k, v, 1, 0);
        u = ad_attention(T, q, k, v, 0, 0);
        TH_CHECK(y && y->data[0] == v->data[0] && y->data[1] == v->data[1], "causal row 0 is not v[0]");
        TH_CHECK(u && fabs(u->data[0] - v->data[0]) > 1e-6, "the unmasked row 0 is v[0]");
        ad_tape_free(T);
    }
    th_family("forward against loops and ops");
}

/* ---- derivatives -------------------------------------------------------------------------- */
static ad_tensor *f_attn(ad_tape *T, ad_tensor **x, void *ctx)
{
    const attn_case *c = (const attn_case *)ctx;
    return ad_attention(T, x[0], x[1], x[2], c->causal, c->scale);
}

/* The same tensor as q, k and v. */
static ad_tensor *f_self(ad_tape *T, ad_tensor **x, void *ctx)
{
    const attn_case *c = (const attn_case *)ctx;
    return ad_attention(T, x[0], x[0], x[0], c->causal, c->scale);
}

/* attention then a nonlinearity, so that second derivatives mix the inputs */
static ad_tensor *f_attn_sq(ad_tape *T, ad_tensor **x, void *ctx)
{
    return ad_square(T, f_attn(T, x, ctx));
}

static void specs_of(const attn_case *c, th_input *s)
{
    int sh[4];
    shape4(sh, c->b, c->h, c->tq, c->d);
    s[0] = th_in(4, sh, -1.5, 1.5, 0);
    shape4(sh, c->b, c->h, c->tk, c->d);
    s[1] = th_in(4, sh, -1.5, 1.5, 0);
    shape4(sh, c->b, c->h, c->tk, c->dv);
    s[2] = th_in(4, sh, -1.5, 1.5, 0);
}

/* sum(w f(x)) through ad_grad with and without create_graph: the recorded derivative and the
   fused one must agree. */
static void check_paths(const char *name, th_fn f, void *ctx, int nin, const th_input *specs)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *x[3], *loss;
    double *data[3], worst = 0;
    int i, ok = 1;
    for (i = 0; i < nin; i++) {
        size_t n = th_numel(&specs[i]);
        data[i] = (double *)malloc(n * sizeof(double));
        th_fill(&specs[i], data[i], n, &th_rng_state);
    }
    loss = th_weighted(T, f, ctx, th_leaves(T, nin, specs, data, x), 77);
    for (i = 0; ok && i < nin; i++) {
        ad_tensor *plain = ad_grad(T, loss, x[i], 0), *graph = ad_grad(T, loss, x[i], 1);
        ok = plain && graph && plain->size == graph->size;
        if (ok) worst = max_diff(plain->data, graph->data, plain->size);
        if (!(worst <= 1e-12)) ok = 0;
    }
    TH_CHECK(ok, "%s: recorded and fused gradients differ (by %g): %s", name, worst, th_errs(T));
    for (i = 0; i < nin; i++) free(data[i]);
    ad_tape_free(T);
}

static void test_derivatives(void)
{
    static const attn_case small[] = {
        {1, 1, 1, 1, 1, 1, 0, 0}, {1, 2, 7, 7, 5, 5, 0, 0}, {1, 2, 7, 7, 5, 5, 1, 0},
        {2, 1, 5, 3, 2, 4, 1, 0}, {1, 1, 3, 6, 2, 3, 0, 0.8},
    };
    static const attn_case blocks[] = {{1, 1, 70, 66, 2, 2, 1, 0}, {1, 1, 66, 70, 2, 1, 0, 0}};
    th_input s[3];
    char name[96];
    int i;
    for (i = 0; i < (int)(sizeof small / sizeof small[0]); i++) {
        const attn_case *c = &small[i];
        specs_of(c, s);
        snprintf(name, sizeof name, "attention [%d,%d,%d|%d,%d|%d] causal %d", c->b, c->h, c->tq, c->tk, c->d,
                 c->dv, c->causal);
        th_gradcheck(name, f_attn, (void *)c, 3, s);
        th_gradgradcheck(name, f_attn, (void *)c, 3, s);
        th_gradgradcheck(name, f_attn_sq, (void *)c, 3, s);
        check_paths(name, f_attn, (void *)c, 3, s);
        check_paths(name, f_attn_sq, (void *)c, 3, s);
        if (c->tq == c->tk && c->d == c->dv) {
            th_gradcheck(name, f_self, (void *)c, 1, s);
            th_gradgradcheck(name, f_self, (void *)c, 1, s);
            check_paths(name, f_self, (void *)c, 1, s);
        }
    }
    for (i = 0; i < (int)(sizeof blocks / sizeof blocks[0]); i++) {
        const attn_case *c = &blocks[i];
        specs_of(c, s);
        snprintf(name, sizeof name, "attention over blocks %d|%d causal %d", c->tq, c->tk, c->causal);
        th_gradcheck(name, f_attn, (void *)c, 3, s);
        check_paths(name, f_attn, (void *)c, 3, s);
    }
    th_family("first and second derivatives");
}

/* Fused gradients against those of the composed ops, on the larger cases. */
static void test_against_ops(void)
{
    int ci, i;
    for (ci = 0; ci < NCASES; ci++) {
        const attn_case *c = &cases[ci];
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        ad_tensor *q, *k, *v, *w, *a, *b, *x[3], *ga, *gb;
        double worst = 0;
        ad_rng_seed(&rng, 300 + (uint64_t)ci);
        make_inputs(T, c, -2, 2, &rng, 1, &q, &k, &v);
        a = ad_attention(T, q, k, v, c->causal, c->scale);
        b = composed(T, q, k, v, c->causal, c->scale);
        w = a ? ad_rand(T, 4, a->shape, -1, 1, &rng) : NULL;
        a = ad_sum(T, ad_mul(T, a, w));
        b = ad_sum(T, ad_mul(T, b, w));
        x[0] = q;
        x[1] = k;
        x[2] = v;
        for (i = 0; i < 3; i++) {
            ga = ad_grad(T, a, x[i], 0);
            gb = ad_grad(T, b, x[i], 0);
            if (!ga || !gb) worst = HUGE_VAL;
            else {
                double d = max_diff(ga->data, gb->data, ga->size);
                if (!(d <= worst)) worst = d;
            }
        }
        TH_CHECK(worst < 1e-11, "case %d (causal %d): gradients %g from the composed ops: %s", ci, c->causal,
                 worst, th_errs(T));
        ad_tape_free(T);
    }
    th_family("gradients against the composed ops");
}

/* ---- threads ------------------------------------------------------------------------------ */
/* y and the three gradients of case c on t threads, into out (y, dq, dk, dv one after another);
   self: q, k and v one tensor (c square), with gradients accumulated over two backward sweeps. */
static int run_threads(const attn_case *c, int t, int self, double *out)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_tensor *q, *k, *v, *y, *loss;
    size_t at = 0;
    int ok, i;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 5);
    make_inputs(T, c, -2, 2, &rng, 1, &q, &k, &v);
    if (self) k = v = q;
    y = ad_attention(T, q, k, v, c->causal, c->scale);
    loss = y ? ad_sum(T, ad_mul(T, y, ad_rand(T, 4, y->shape, -1, 1, &rng))) : NULL;
    ok = loss && ad_backward(T, loss) == 0;
    if (ok && self) ok = ad_backward(T, ad_mul_scalar(T, loss, 0.5)) == 0;
    if (ok) {
        memcpy(out, y->data, y->size * sizeof(double));
        at = y->size;
        for (i = 0; i < 3; i++) {
            ad_tensor *x = i == 0 ? q : i == 1 ? k : v;
            memcpy(out + at, x->grad, x->size * sizeof(double));
            at += x->size;
        }
    } else {
        printf("run_threads on %d threads: %s\n", t, th_errs(T));
    }
    ad_tape_free(T);
    return ok;
}

static void test_threads(void)
{
    static const attn_case split[] = {{3, 4, 64, 64, 32, 32, 1, 0}, {2, 3, 130, 67, 16, 8, 0, 0},
                                      {1, 2, 200, 200, 24, 24, 1, 0}};
    int i, t, self;
    for (i = 0; i < 3; i++) {
        const attn_case *c = &split[i];
        size_t n = (size_t)c->b * c->h * (2 * c->tq * (c->d + c->dv) + c->tk * (c->d + c->dv));
        double *one = (double *)calloc(n, sizeof(double)), *more = (double *)calloc(n, sizeof(double));
        for (self = 0; self <= (c->tq == c->tk && c->d == c->dv); self++) {
            int ok1 = run_threads(c, 1, self, one);
            TH_CHECK(ok1, "case %d on one thread failed", i);
            for (t = 2; ok1 && t <= 3; t++) {
                int ok = run_threads(c, t, self, more);
                TH_CHECK(ok && memcmp(one, more, n * sizeof(double)) == 0,
                         "case %d (self %d) on %d threads: values or gradients differ", i, self, t);
            }
        }
        free(one);
        free(more);
    }
    th_family("1, 2 and 3 threads");
}

/* ---- extremes and memory ------------------------------------------------------------------ */
static void test_extremes(void)
{
    attn_case c = {2, 2, 9, 9, 4, 3, 0, 0};
    int causal;
    for (causal = 0; causal <= 1; causal++) {
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        ad_tensor *q, *k, *v, *y, *loss;
        double *ref;
        size_t i;
        int finite = 1;
        c.causal = causal;
        ad_rng_seed(&rng, 11);
        make_inputs(T, &c, -1, 1, &rng, 1, &q, &k, &v);
        /* logits of order 1e6: a plain exp would overflow */
        for (i = 0; i < q->size; i++) q->data[i] *= 1000;
        for (i = 0; i < k->size; i++) k->data[i] *= 2000;
        y = ad_attention(T, q, k, v, causal, 0);
        loss = y ? ad_sum(T, ad_mul(T, y, y)) : NULL;
        TH_CHECK(loss && ad_backward(T, loss) == 0, "large logits: %s", th_errs(T));
        ref = (double *)malloc(y ? y->size * sizeof(double) : 1);
        if (y) naive(&c, q->data, k->data, v->data, ref);
        for (i = 0; y && i < y->size; i++) finite &= isfinite(y->data[i]);
        for (i = 0; loss && i < q->size; i++) finite &= isfinite(q->grad[i]) && isfinite(k->grad[i]);
        for (i = 0; loss && i < v->size; i++) finite &= isfinite(v->grad[i]);
        TH_CHECK(y && finite, "large logits (causal %d): not finite", causal);
        TH_CHECK(y && max_diff(y->data, ref, y->size) < 1e-12, "large logits (causal %d): %g from the loops",
                 causal, y ? max_diff(y->data, ref, y->size) : 0);
        free(ref);
        ad_tape_free(T);
    }
    {
        /* one T x T score matrix would be 2 MiB; the op keeps its output and T values more */
        attn_case m = {1, 1, 512, 512, 8, 8, 1, 0};
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        ad_tensor *q, *k, *v, *y;
        size_t before, grew;
        ad_rng_seed(&rng, 12);
        make_inputs(T, &m, -1, 1, &rng, 1, &q, &k, &v);
        before = ad_tape_bytes_used(T);
        y = ad_attention(T, q, k, v, 1, 0);
        grew = ad_tape_bytes_used(T) - before;
        TH_CHECK(y && grew < (size_t)512 * 512 * sizeof(double) / 8,
                 "the forward took %zu bytes; a score matrix is %zu", grew, (size_t)512 * 512 * sizeof(double));
        ad_tape_free(T);
    }
    th_family("large logits, memory");
}

/* ---- errors ------------------------------------------------------------------------------- */
/* call must fail with the tape's error starting "OP: " and holding needle. */
#define BAD_OP(T, op, call, needle)                                                            \
    do {                                                                                       \
        ad_tensor *bad_;                                                                       \
        ad_tape_clear_error(T);                                                                \
        bad_ = (call);                                                                         \
        TH_CHECK(bad_ == NULL, "%s did not fail", #call);                                     \
        TH_CHECK(ad_tape_error(T) && strncmp(ad_tape_error(T), op ": ", strlen(op ": ")) == 0 && \
                     strstr(ad_tape_error(T), needle),                                         \
                 "%s: expected \"%s: ...%s...\", got \"%s\"", #call, op, needle, th_errs(T)); \
    } while (0)
#define BAD(T, call, needle) BAD_OP(T, "ad_attention", call, needle)

static void test_errors(void)
{
    ad_tape *T = ad_tape_new(), *other = ad_tape_new();
    int s[4], s3[3] = {2, 7, 5};
    ad_tensor *q, *k, *v, *q3, *kb, *kh, *kd, *vt, *vo;
    shape4(s, 2, 3, 7, 5);
    q = ad_zeros(T, 4, s);
    k = ad_zeros(T, 4, s);
    v = ad_zeros(T, 4, s);
    q3 = ad_zeros(T, 3, s3);
    shape4(s, 1, 3, 7, 5);
    kb = ad_zeros(T, 4, s);
    shape4(s, 2, 4, 7, 5);
    kh = ad_zeros(T, 4, s);
    shape4(s, 2, 3, 7, 4);
    kd = ad_zeros(T, 4, s);
    shape4(s, 2, 3, 6, 5);
    vt = ad_zeros(T, 4, s);
    vo = ad_zeros(other, 4, s);
    BAD(T, ad_attention(T, q3, k, v, 0, 0), "q [2,7,5], k [2,3,7,5], v [2,3,7,5]: each must be [B, H, T, D]");
    BAD(T, ad_attention(T, q, q3, v, 1, 0), "each must be [B, H, T, D]");
    BAD(T, ad_attention(T, q, k, q3, 1, 0), "each must be [B, H, T, D]");
    BAD(T, ad_attention(T, q, kb, v, 0, 0), "k [1,3,7,5], v [2,3,7,5]: B and H must agree");
    BAD(T, ad_attention(T, q, k, kh, 0, 0), "v [2,4,7,5]: B and H must agree");
    BAD(T, ad_attention(T, q, kd, v, 0, 0), "k [2,3,7,4], v [2,3,7,5]: q and k must have the same D");
    BAD(T, ad_attention(T, q, k, vt, 0, 0), "v [2,3,6,5]: k and v must have as many keys");
    BAD(T, ad_attention(T, q, k, v, 0, (ad_real)HUGE_VAL), "scale must be finite");
    BAD(T, ad_attention(T, q, k, v, 0, (ad_real)NAN), "scale must be finite");
    BAD(T, ad_attention(T, q, k, vo, 0, 0), "v belongs to another tape");
    ad_tape_clear_error(T);
    TH_CHECK(ad_attention(T, NULL, k, v, 0, 0) == NULL && ad_attention(T, q, NULL, v, 0, 0) == NULL &&
                 ad_attention(T, q, k, NULL, 0, 0) == NULL && ad_attention(NULL, q, k, v, 0, 0) == NULL,
             "a NULL input gave a tensor");
    TH_CHECK(ad_tape_error(T) == NULL, "a NULL input set \"%s\"", th_errs(T));
    /* a different value length is allowed */
    shape4(s, 2, 3, 7, 2);
    TH_CHECK(ad_attention(T, q, k, ad_zeros(T, 4, s), 1, 0) != NULL, "v with Dv = 2: %s", th_errs(T));
    ad_tape_free(T);
    ad_tape_free(other);
    th_family("errors");
}

/* ---- ad_self_attention -------------------------------------------------------------------- */
/* One case of the fused projection: qkv [b, t, 3 heads d]. */
typedef struct self_case {
    int b, t, heads, d, causal;
    double scale;
} self_case;

/* The same attention through the ops a model would write without ad_self_attention. */
static ad_tensor *self_composed(ad_tape *T, ad_tensor *qkv, const self_case *c)
{
    static const int to_heads[5] = {2, 0, 3, 1, 4}, merge[4] = {0, 2, 1, 3};
    int split[5] = {c->b, c->t, 3, c->heads, c->d}, heads[4] = {c->b, c->heads, c->t, c->d};
    int flat[3] = {c->b, c->t, c->heads * c->d};
    ad_tensor *x = ad_permute(T, ad_reshape(T, qkv, 5, split), to_heads), *q, *k, *v;
    q = ad_reshape(T, ad_slice(T, x, 0, 0, 1), 4, heads);
    k = ad_reshape(T, ad_slice(T, x, 0, 1, 2), 4, heads);
    v = ad_reshape(T, ad_slice(T, x, 0, 2, 3), 4, heads);
    return ad_reshape(T, ad_permute(T, ad_attention(T, q, k, v, c->causal, c->scale), merge), 3, flat);
}

static ad_tensor *f_fused(ad_tape *T, ad_tensor **x, void *ctx)
{
    const self_case *c = (const self_case *)ctx;
    return ad_self_attention(T, x[0], c->heads, c->causal, c->scale);
}

/* qkv reaches the loss twice, and the other route first in the sweep, so the attention's
   gradient is added into a buffer that holds one already */
static ad_tensor *f_fused_twice(ad_tape *T, ad_tensor **x, void *ctx)
{
    ad_tensor *y = ad_square(T, f_fused(T, x, ctx));
    return ad_add(T, y, ad_mul_scalar(T, ad_sum(T, ad_square(T, x[0])), 0.25));
}

static const self_case self_cases[] = {
    {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 0},  {2, 7, 3, 5, 0, 0},   {2, 7, 3, 5, 1, 0},    {1, 9, 2, 4, 1, 0.7},
    {2, 5, 1, 3, 0, -0.3}, {1, 70, 2, 8, 1, 0}, {2, 67, 3, 6, 0, 0}, {3, 64, 4, 32, 1, 0},
};
#define NSELF (int)(sizeof self_cases / sizeof self_cases[0])

static void self_input(const self_case *c, th_input *s)
{
    int sh[3];
    sh[0] = c->b;
    sh[1] = c->t;
    sh[2] = 3 * c->heads * c->d;
    *s = th_in(3, sh, -1.5, 1.5, 0);
}

/* Values and the gradient of sum(w y) against the composition: the same bits. */
static void test_self_against_ops(void)
{
    int ci;
    for (ci = 0; ci < NSELF; ci++) {
        const self_case *c = &self_cases[ci];
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        int sh[3] = {c->b, c->t, 3 * c->heads * c->d};
        ad_tensor *qkv, *a, *b, *w, *ga, *gb;
        double dy = HUGE_VAL, dg = HUGE_VAL;
        ad_rng_seed(&rng, 700 + (uint64_t)ci);
        qkv = ad_rand(T, 3, sh, -2, 2, &rng);
        ad_set_requires_grad(qkv, 1);
        a = ad_self_attention(T, qkv, c->heads, c->causal, c->scale);
        b = self_composed(T, qkv, c);
        if (a && b && a->size == b->size) {
            TH_CHECK(a->ndim == 3 && a->shape[0] == c->b && a->shape[1] == c->t && a->shape[2] == c->heads * c->d,
                     "case %d: shape [%d,%d,%d]", ci, a->shape[0], a->shape[1], a->shape[2]);
            dy = max_diff(a->data, b->data, a->size);
            w = ad_rand(T, 3, a->shape, -1, 1, &rng);
            ga = ad_grad(T, ad_sum(T, ad_mul(T, a, w)), qkv, 0);
            gb = ad_grad(T, ad_sum(T, ad_mul(T, b, w)), qkv, 0);
            if (ga && gb) dg = max_diff(ga->data, gb->data, ga->size);
        }
        TH_CHECK(dy == 0 && dg == 0, "case %d (causal %d): values %g, gradients %g from the composed ops: %s", ci,
                 c->causal, dy, dg, th_errs(T));
        ad_tape_free(T);
    }
    th_family("self-attention against split, attention, merge");
}

static void test_self_derivatives(void)
{
    th_input s;
    char name[96];
    int i;
    for (i = 0; i < 6; i++) { /* the small cases */
        const self_case *c = &self_cases[i];
        self_input(c, &s);
        snprintf(name, sizeof name, "self-attention [%d,%d] heads %d of %d causal %d", c->b, c->t, c->heads, c->d,
                 c->causal);
        th_gradcheck(name, f_fused, (void *)c, 1, &s);
        th_gradgradcheck(name, f_fused, (void *)c, 1, &s);
        th_gradcheck(name, f_fused_twice, (void *)c, 1, &s);
        th_gradgradcheck(name, f_fused_twice, (void *)c, 1, &s);
        check_paths(name, f_fused, (void *)c, 1, &s);
        check_paths(name, f_fused_twice, (void *)c, 1, &s);
    }
    self_input(&self_cases[6], &s);
    th_gradcheck("self-attention over blocks", f_fused, (void *)&self_cases[6], 1, &s);
    check_paths("self-attention over blocks", f_fused, (void *)&self_cases[6], 1, &s);
    th_family("self-attention: first and second derivatives");
}

/* y and qkv's gradient on t threads, into out. */
static int run_self_threads(const self_case *c, int t, double *out)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int sh[3] = {c->b, c->t, 3 * c->heads * c->d}, ok;
    ad_tensor *qkv, *y, *loss;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 9);
    qkv = ad_rand(T, 3, sh, -2, 2, &rng);
    ad_set_requires_grad(qkv, 1);
    y = ad_self_attention(T, qkv, c->heads, c->causal, c->scale);
    loss = y ? ad_sum(T, ad_mul(T, y, ad_rand(T, 3, y->shape, -1, 1, &rng))) : NULL;
    ok = loss && ad_backward(T, loss) == 0;
    if (ok) {
        memcpy(out, y->data, y->size * sizeof(double));
        memcpy(out + y->size, qkv->grad, qkv->size * sizeof(double));
    } else {
        printf("run_self_threads on %d threads: %s\n", t, th_errs(T));
    }
    ad_tape_free(T);
    return ok;
}

static void test_self_threads(void)
{
    static const self_case split[] = {{3, 64, 4, 32, 1, 0}, {2, 130, 3, 16, 0, 0}};
    int i, t;
    for (i = 0; i < 2; i++) {
        const self_case *c = &split[i];
        size_t n = (size_t)c->b * c->t * 4 * c->heads * c->d;
        double *one = (double *)calloc(n, sizeof(double)), *more = (double *)calloc(n, sizeof(double));
        int ok1 = run_self_threads(c, 1, one);
        TH_CHECK(ok1, "self case %d on one thread failed", i);
        for (t = 2; ok1 && t <= 3; t++) {
            int ok = run_self_threads(c, t, more);
            TH_CHECK(ok && memcmp(one, more, n * sizeof(double)) == 0,
                     "self case %d on %d threads: values or gradients differ", i, t);
        }
        free(one);
        free(more);
    }
    th_family("self-attention: 1, 2 and 3 threads");
}

#define BAD_SELF(T, call, needle) BAD_OP(T, "ad_self_attention", call, needle)

static void test_self_errors(void)
{
    ad_tape *T = ad_tape_new(), *other = ad_tape_new();
    int s3[3] = {2, 7, 30}, s4[4] = {2, 7, 3, 10}, s5[3] = {2, 7, 20};
    ad_tensor *qkv = ad_zeros(T, 3, s3), *four = ad_zeros(T, 4, s4), *odd = ad_zeros(T, 3, s5);
    ad_tensor *elsewhere = ad_zeros(other, 3, s3);
    BAD_SELF(T, ad_self_attention(T, four, 2, 1, 0), "qkv [2,7,3,10], heads 2: must be [B, T, 3 C]");
    BAD_SELF(T, ad_self_attention(T, qkv, 0, 1, 0), "qkv [2,7,30], heads 0: heads must be at least 1");
    BAD_SELF(T, ad_self_attention(T, qkv, 4, 1, 0), "heads 4: the last dimension must be a multiple of 3 heads");
    BAD_SELF(T, ad_self_attention(T, odd, 1, 1, 0), "qkv [2,7,20], heads 1: the last dimension must be a multiple");
    BAD_SELF(T, ad_self_attention(T, qkv, 2, 0, (ad_real)NAN), "scale must be finite");
    BAD_SELF(T, ad_self_attention(T, elsewhere, 2, 0, 0), "qkv belongs to another tape");
    ad_tape_clear_error(T);
    TH_CHECK(ad_self_attention(T, NULL, 2, 1, 0) == NULL && ad_self_attention(NULL, qkv, 2, 1, 0) == NULL,
             "a NULL input gave a tensor");
    TH_CHECK(ad_tape_error(T) == NULL, "a NULL input set \"%s\"", th_errs(T));
    TH_CHECK(ad_self_attention(T, qkv, 5, 1, 0) != NULL, "qkv [2,7,30] with 5 heads of 2: %s", th_errs(T));
    ad_tape_free(T);
    ad_tape_free(other);
    th_family("self-attention: errors");
}

int main(void)
{
    printf("test_attention\n");
    test_forward();
    test_derivatives();
    test_against_ops();
    test_threads();
    test_extremes();
    test_errors();
    test_self_against_ops();
    test_self_derivatives();
    test_self_threads();
    test_self_errors();
    return th_summary();
}
