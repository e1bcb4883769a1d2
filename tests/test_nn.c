/* Convolution, pooling, dropout, batch / layer norm and embedding: gradients and second
   derivatives against finite differences, forward values against naive loops, running
   statistics, dropout statistics, and the error messages of every misuse. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

static int quick;

static th_input spec4(int a, int b, int c, int d, double lo, double hi)
{
    int s[4];
    s[0] = a; s[1] = b; s[2] = c; s[3] = d;
    return th_in(4, s, lo, hi, 0);
}

static th_input spec1(int a, double lo, double hi)
{
    return th_in(1, &a, lo, hi, 0);
}

/* ---- conv2d: finite differences ---------------------------------------------------------- */
typedef struct conv_case {
    const char *name;
    ad_conv2d_desc d;
    int use_desc, bias, square, twice;
    int x[4], w[4];
} conv_case;

static ad_tensor *f_conv(ad_tape *T, ad_tensor **in, void *ctx)
{
    conv_case *c = (conv_case *)ctx;
    ad_tensor *y = ad_conv2d(T, in[0], in[1], c->bias ? in[2] : NULL, c->use_desc ? &c->d : NULL);
    if (c->twice) /* every input gets two contributions, added into one gradient */
        y = ad_add(T, y, ad_mul_scalar(T, ad_conv2d(T, in[0], in[1], c->bias ? in[2] : NULL,
                                                      c->use_desc ? &c->d : NULL), 0.5));
    /* squared, the gradient depends on the output, which reaches every derivative of the three
       convolution maps in the second-order check */
    return c->square ? ad_square(T, y) : y;
}

static void check_conv_grads(conv_case *c)
{
    th_input in[3];
    char name[128];
    int nin = c->bias ? 3 : 2;
    in[0] = spec4(c->x[0], c->x[1], c->x[2], c->x[3], -1, 1);
    in[1] = spec4(c->w[0], c->w[1], c->w[2], c->w[3], -1, 1);
    in[2] = spec1(c->w[0], -1, 1);
    c->square = 0;
    c->twice = 1;
    snprintf(name, sizeof name, "conv2d %s twice", c->name);
    th_gradcheck(name, f_conv, c, nin, in);
    c->twice = 0;
    snprintf(name, sizeof name, "conv2d %s", c->name);
    th_gradcheck(name, f_conv, c, nin, in);
    th_gradgradcheck(name, f_conv, c, nin, in);
    c->square = 1;
    snprintf(name, sizeof name, "conv2d %s squared", c->name);
    th_gradcheck(name, f_conv, c, nin, in);
    th_gradgradcheck(name, f_conv, c, nin, in);
}

static void set4(int *d, int a, int b, int c, int e)
{
    d[0] = a; d[1] = b; d[2] = c; d[3] = e;
}

static void test_conv_gradients(void)
{
    conv_case c;
    int groups, bias;
    for (groups = 1; groups <= 3; groups += 2)
        for (bias = 0; bias <= 1; bias++) {
            char name[64];
            memset(&c, 0, sizeof c);
            snprintf(name, sizeof name, "k3x2 s2x1 p1x2 d2x1 groups %d%s", groups, bias ? " bias" : "");
            c.name = name;
            c.use_desc = 1;
            c.d.stride_h = 2; c.d.stride_w = 1;
            c.d.pad_h = 1; c.d.pad_w = 2;
            c.d.dilation_h = 2; c.d.dilation_w = 1;
            c.d.groups = groups;
            c.bias = bias;
            set4(c.x, 2, 3, 7, 6);
            set4(c.w, 6, 3 / groups, 3, 2);
            check_conv_grads(&c);
        }
    /* strided columns (stride_w > 1), asymmetric padding and no groups field */
    memset(&c, 0, sizeof c);
    c.name = "k2x3 s1x3 p0x1";
    c.use_desc = 1;
    c.d.stride_w = 3;
    c.d.pad_w = 1;
    c.bias = 1;
    set4(c.x, 2, 2, 5, 8);
    set4(c.w, 3, 2, 2, 3);
    check_conv_grads(&c);
    /* 1x1 kernel: the input is the GEMM operand, no im2col */
    memset(&c, 0, sizeof c);
    c.name = "1x1 groups 3";
    c.use_desc = 1;
    c.d.groups = 3;
    c.bias = 1;
    set4(c.x, 2, 3, 3, 5);
    set4(c.w, 6, 1, 1, 1);
    check_conv_grads(&c);
    /* NULL desc: all defaults; size-1 batch */
    memset(&c, 0, sizeof c);
    c.name = "defaults";
    c.bias = 1;
    set4(c.x, 1, 2, 5, 4);
    set4(c.w, 4, 2, 3, 3);
    check_conv_grads(&c);
    /* a bigger one, so that the GEMM takes its packed path */
    memset(&c, 0, sizeof c);
    c.name = "packed gemm";
    c.use_desc = 1;
    c.d.pad_h = c.d.pad_w = 1;
    set4(c.x, 1, 4, 9, 9);
    set4(c.w, 8, 4, 3, 3);
    c.bias = 1;
    c.square = 0;
    {
        th_input in[3];
        in[0] = spec4(1, 4, 9, 9, -1, 1);
        in[1] = spec4(8, 4, 3, 3, -1, 1);
        in[2] = spec1(8, -1, 1);
        th_gradcheck("conv2d packed gemm", f_conv, &c, 3, in);
    }
}

/* ---- conv2d: naive 7-loop reference over random configurations ---------------------------- */
static int rnd(ad_rng *r, int lo, int hi) /* uniform in [lo, hi] */
{
    return lo + (int)ad_rng_below(r, (uint64_t)(hi - lo + 1));
}

static void test_conv_reference(void)
{
    ad_rng r;
    int trial, trials = quick ? 60 : 400, valid = 0, errors = 0;
    ad_rng_seed(&r, 2024);
    for (trial = 0; trial < trials; trial++) {
        int N = rnd(&r, 1, 3), G = rnd(&r, 1, 3), cg = rnd(&r, 1, 3), og = rnd(&r, 1, 3);
        int H = rnd(&r, 1, 9), W = rnd(&r, 1, 9), kh = rnd(&r, 1, 4), kw = rnd(&r, 1, 4);
        int sh = rnd(&r, 1, 3), sw = rnd(&r, 1, 3), ph = rnd(&r, 0, 2), pw = rnd(&r, 0, 2);
        int dh = rnd(&r, 1, 3), dw = rnd(&r, 1, 3), C = G * cg, O = G * og, bias = rnd(&r, 0, 1);
        int OH, OW, n, o, oy, ox, ci, ki, kj, xs[4], ws[4], ok = 1;
        ad_conv2d_desc d;
        ad_tape *T;
        ad_tensor *x, *w, *b = NULL, *y, *gc;
        double *yr, *dx, *dw_, *db;
        size_t i;
        if (trial % 10 == 0) { kh = kw = 1; sh = sw = 1; ph = pw = 0; } /* the direct 1x1 path */
        if (trial < 6) {
            /* larger images: the layers of a small MNIST network, odd sizes with padding, strided
               rows; im2row's block copies and the GEMM's unpacked path; batches whose images are
               spread over threads, with fewer images than weight-gradient parts and more */
            static const int big[6][12] = {
                /* N  G cg og  H   W  kh kw sh sw ph pw */
                {2, 1, 1, 8, 28, 28, 5, 5, 1, 1, 0, 0},
                {2, 1, 8, 16, 12, 12, 5, 5, 1, 1, 0, 0},
                {2, 1, 3, 5, 13, 11, 5, 5, 1, 1, 2, 2},
                {1, 2, 2, 4, 17, 9, 3, 5, 2, 1, 1, 1},
                {6, 1, 1, 8, 28, 28, 5, 5, 1, 1, 0, 0},
                {11, 2, 4, 8, 16, 15, 3, 3, 1, 1, 1, 1},
            };
            N = big[trial][0]; G = big[trial][1]; cg = big[trial][2]; og = big[trial][3];
            H = big[trial][4]; W = big[trial][5]; kh = big[trial][6]; kw = big[trial][7];
            sh = big[trial][8]; sw = big[trial][9]; ph = big[trial][10]; pw = big[trial][11];
            dh = dw = 1;
            C = G * cg;
            O = G * og;
        }
        memset(&d, 0, sizeof d);
        /* 0 means the default 1 */
        d.stride_h = sh == 1 && rnd(&r, 0, 1) ? 0 : sh;
        d.stride_w = sw == 1 && rnd(&r, 0, 1) ? 0 : sw;
        d.dilation_h = dh == 1 && rnd(&r, 0, 1) ? 0 : dh;
        d.dilation_w = dw == 1 && rnd(&r, 0, 1) ? 0 : dw;
        d.groups = G == 1 && rnd(&r, 0, 1) ? 0 : G;
        d.pad_h = ph;
        d.pad_w = pw;
        T = ad_tape_new();
        set4(xs, N, C, H, W);
        set4(ws, O, cg, kh, kw);
        x = ad_rand(T, 4, xs, -1, 1, &r);
        w = ad_rand(T, 4, ws, -1, 1, &r);
        ad_set_requires_grad(x, 1);
        ad_set_requires_grad(w, 1);
        if (bias) {
            b = ad_rand(T, 1, &O, -1, 1, &r);
            ad_set_requires_grad(b, 1);
        }
        OH = (H + 2 * ph - dh * (kh - 1) - 1) >= 0 ? (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1 : 0;
        OW = (W + 2 * pw - dw * (kw - 1) - 1) >= 0 ? (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1 : 0;
        y = ad_conv2d(T, x, w, b, &d);
        if (OH < 1 || OW < 1) {
            errors++;
            TH_CHECK(y == NULL, "trial %d: expected an error for an empty output", trial);
            TH_CHECK_ERROR(T, "ad_conv2d");
            TH_CHECK_ERROR(T, "larger than the padded input");
            ad_tape_free(T);
            continue;
        }
        valid++;
        TH_CHECK(y && y->ndim == 4 && y->shape[0] == N && y->shape[1] == O && y->shape[2] == OH &&
                 y->shape[3] == OW, "trial %d: output shape, error %s", trial, th_errs(T));
        if (!y || y->shape[2] != OH || y->shape[3] != OW) { ad_tape_free(T); continue; }
        gc = ad_rand(T, 4, y->shape, -1, 1, &r);
        ad_backward(T, ad_sum(T, ad_mul(T, y, gc)));
        yr = (double *)calloc(y->size, sizeof(double));
        dx = (double *)calloc(x->size, sizeof(double));
        dw_ = (double *)calloc(w->size, sizeof(double));
        db = (double *)calloc((size_t)O, sizeof(double));
        for (n = 0; n < N; n++)
            for (o = 0; o < O; o++)
                for (oy = 0; oy < OH; oy++)
                    for (ox = 0; ox < OW; ox++) {
                        size_t yi = (((size_t)n * O + o) * OH + oy) * OW + ox;
                        double acc = bias ? b->data[o] : 0, gv = gc->data[yi];
                        for (ci = 0; ci < cg; ci++)
                            for (ki = 0; ki < kh; ki++)
                                for (kj = 0; kj < kw; kj++) {
                                    int c = (o / og) * cg + ci, iy = oy * sh - ph + ki * dh, ix = ox * sw - pw + kj * dw;
                                    size_t xi, wi;
                                    if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                    xi = (((size_t)n * C + c) * H + iy) * W + ix;
                                    wi = (((size_t)o * cg + ci) * kh + ki) * kw + kj;
                                    acc += x->data[xi] * w->data[wi];
                                    dx[xi] += gv * w->data[wi];
                                    dw_[wi] += gv * x->data[xi];
                                }
                        yr[yi] = acc;
                        db[o] += gv;
                    }
        for (i = 0; i < y->size && ok; i++)
            if (fabs(y->data[i] - yr[i]) > 1e-12 * (1 + fabs(yr[i]))) ok = 0;
        for (i = 0; i < x->size && ok; i++)
            if (fabs((x->grad ? x->grad[i] : 0) - dx[i]) > 1e-12 * (1 + fabs(dx[i]))) ok = 0;
        for (i = 0; i < w->size && ok; i++)
            if (fabs((w->grad ? w->grad[i] : 0) - dw_[i]) > 1e-12 * (1 + fabs(dw_[i]))) ok = 0;
        for (i = 0; bias && i < (size_t)O && ok; i++)
            if (fabs((b->grad ? b->grad[i] : 0) - db[i]) > 1e-12 * (1 + fabs(db[i]))) ok = 0;
        TH_CHECK(ok, "trial %d: N%d C%d H%d W%d O%d k%dx%d s%dx%d p%dx%d d%dx%d g%d bias %d: values or "
                 "gradients differ from the naive loops", trial, N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw,
                 G, bias);
        free(yr); free(dx); free(dw_); free(db);
        ad_tape_free(T);
    }
    TH_CHECK(valid > trials / 3 && errors > 0, "configurations: %d valid, %d empty", valid, errors);
}

/* ---- conv2d on threads: the images of a batch spread over 1, 2 and 3 threads ------------------ */
static void conv_run(int threads, int N, int groups, int pad, ad_real **out, size_t *sizes)
{
    ad_tape *T = ad_tape_new();
    ad_conv2d_desc d;
    ad_rng r;
    ad_tensor *x, *w, *b, *y;
    int xs[4], ws[4], O = 8 * groups, C = 3 * groups;
    ad_tensor *all[4];
    int i;
    ad_set_threads(T, threads);
    ad_rng_seed(&r, 99);
    memset(&d, 0, sizeof d);
    d.groups = groups;
    d.pad_h = d.pad_w = pad;
    set4(xs, N, C, 19, 17);
    set4(ws, O, 3, 5, 3);
    x = ad_rand(T, 4, xs, -1, 1, &r);
    w = ad_rand(T, 4, ws, -1, 1, &r);
    b = ad_rand(T, 1, &O, -1, 1, &r);
    ad_set_requires_grad(x, 1);
    ad_set_requires_grad(w, 1);
    ad_set_requires_grad(b, 1);
    y = ad_conv2d(T, x, w, b, &d);
    TH_CHECK(y && ad_backward(T, ad_sum(T, ad_mul(T, y, ad_rand(T, 4, y->shape, -1, 1, &r)))) == 0, "conv on %d "
             "threads: %s", threads, th_errs(T));
    all[0] = y; all[1] = x; all[2] = w; all[3] = b;
    for (i = 0; i < 4; i++) {
        const ad_real *src = i == 0 ? (y ? y->data : NULL) : all[i]->grad;
        sizes[i] = i == 0 ? (y ? y->size : 0) : all[i]->size;
        out[i] = (ad_real *)malloc(sizes[i] * sizeof(ad_real) + 1);
        if (src) memcpy(out[i], src, sizes[i] * sizeof(ad_real));
        else memset(out[i], 0, sizes[i] * sizeof(ad_real));
    }
    ad_tape_free(T);
}

static void test_conv_threads(void)
{
    static const int cases[][3] = {{13, 1, 0}, {5, 2, 2}, {64, 1, 1}};
    static const char *what[4] = {"output", "input gradient", "weight gradient", "bias gradient"};
    size_t c, i;
    int t, threads[2] = {2, 3};
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ad_real *want[4], *got[4];
        size_t sizes[4], got_sizes[4];
        conv_run(1, cases[c][0], cases[c][1], cases[c][2], want, sizes);
        for (t = 0; t < 2; t++) {
            conv_run(threads[t], cases[c][0], cases[c][1], cases[c][2], got, got_sizes);
            for (i = 0; i < 4; i++) {
                TH_CHECK(sizes[i] == got_sizes[i] && memcmp(want[i], got[i], sizes[i] * sizeof(ad_real)) == 0,
                         "conv N=%d groups %d pad %d: the %s on %d threads differs from one thread's", cases[c][0],
                         cases[c][1], cases[c][2], what[i], threads[t]);
                free(got[i]);
            }
        }
        for (i = 0; i < 4; i++) free(want[i]);
    }
}

static void test_conv_errors(void)
{
    ad_tape *T = ad_tape_new();
    ad_conv2d_desc d;
    ad_tensor *x = ad_zeros(T, AD_SHAPE(2, 3, 7, 6)), *w = ad_zeros(T, AD_SHAPE(6, 3, 3, 2));
    ad_tensor *x3 = ad_zeros(T, AD_SHAPE(3, 7, 6)), *b5 = ad_zeros(T, AD_SHAPE(5));
    ad_tensor *wg = ad_zeros(T, AD_SHAPE(6, 1, 3, 2)), *w4 = ad_zeros(T, AD_SHAPE(4, 1, 3, 2));
    ad_tensor *big = ad_zeros(T, AD_SHAPE(6, 3, 9, 2));

#define EXPECT_CONV_ERROR(call, needle)                                               \
    do {                                                                              \
        ad_tape_clear_error(T);                                                       \
        TH_CHECK((call) == NULL, "%s should fail", #call);                            \
        TH_CHECK_ERROR(T, "ad_conv2d");                                               \
        TH_CHECK_ERROR(T, needle);                                                    \
    } while (0)

    EXPECT_CONV_ERROR(ad_conv2d(T, x3, w, NULL, NULL), "[3,7,6]");
    EXPECT_CONV_ERROR(ad_conv2d(T, x3, w, NULL, NULL), "must be [N, C, H, W]");
    EXPECT_CONV_ERROR(ad_conv2d(T, x, x3, NULL, NULL), "[3,7,6]");
    memset(&d, 0, sizeof d);
    d.groups = 2; /* 3 channels */
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "groups 2 must divide");
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "[2,3,7,6]");
    d.groups = 3; /* 4 output channels */
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w4, NULL, &d), "the 4 output channels");
    d.groups = 3; /* w has 3 input channels per group; needs 1 */
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "w has 3 input channels per group");
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "[6,3,3,2]");
    d.groups = 1;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, wg, NULL, &d), "need 3");
    d.groups = -1;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "groups -1");
    memset(&d, 0, sizeof d);
    d.stride_w = -1;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "stride 0x-1");
    memset(&d, 0, sizeof d);
    d.dilation_h = -2;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "dilation -2x0");
    memset(&d, 0, sizeof d);
    d.pad_h = -1;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "padding -1x0 must not be negative");
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, b5, NULL), "b [5]: b must be [6]");
    /* kernel 9 tall on 7 rows; with padding 1 it fits */
    EXPECT_CONV_ERROR(ad_conv2d(T, x, big, NULL, NULL), "larger than the padded input 7x6");
    memset(&d, 0, sizeof d);
    d.pad_h = 1;
    ad_tape_clear_error(T);
    TH_CHECK(ad_conv2d(T, x, big, NULL, &d) != NULL, "a kernel as tall as the padded input: %s",
             th_errs(T));
    /* dilation widens the kernel: 2 taps 5 apart span 6 columns, which fit; 6 apart, 7 do not */
    memset(&d, 0, sizeof d);
    d.dilation_w = 5;
    ad_tape_clear_error(T);
    TH_CHECK(ad_conv2d(T, x, w, NULL, &d) != NULL, "dilation 5: %s", th_errs(T));
    d.dilation_w = 6;
    EXPECT_CONV_ERROR(ad_conv2d(T, x, w, NULL, &d), "spans 3x7");
#undef EXPECT_CONV_ERROR
    /* NULL inputs propagate silently */
    ad_tape_clear_error(T);
    TH_CHECK(ad_conv2d(T, NULL, w, NULL, NULL) == NULL && ad_tape_error(T) == NULL, "NULL x is silent");
    ad_tape_free(T);
}

/* ad_backward adds into the gradients that leaves already hold */
static void test_conv_accumulates(void)
{
    ad_tape *T = ad_tape_new();
    ad_conv2d_desc d;
    ad_rng r;
    ad_tensor *x, *w, *b, *loss;
    double *first[3];
    ad_tensor *t[3];
    int i, ok = 1, groups;
    size_t j;
    for (groups = 1; groups <= 2; groups++) {
        ad_tape_reset(T);
        ad_rng_seed(&r, 12);
        memset(&d, 0, sizeof d);
        d.pad_h = 1;
        d.stride_w = 2;
        d.groups = groups;
        x = ad_rand(T, AD_SHAPE(2, 4, 5, 6), -1, 1, &r);
        w = ad_rand(T, AD_SHAPE(6, 4 / groups, 3, 2), -1, 1, &r);
        b = ad_rand(T, AD_SHAPE(6), -1, 1, &r);
        t[0] = x; t[1] = w; t[2] = b;
        for (i = 0; i < 3; i++) ad_set_requires_grad(t[i], 1);
        loss = ad_sum(T, ad_square(T, ad_conv2d(T, x, w, b, &d)));
        TH_CHECK(ad_backward(T, loss) == 0, "first backward: %s", th_errs(T));
        for (i = 0; i < 3; i++) {
            first[i] = (double *)malloc(t[i]->size * sizeof(double));
            memcpy(first[i], t[i]->grad, t[i]->size * sizeof(double));
        }
        TH_CHECK(ad_backward(T, loss) == 0, "second backward: %s", th_errs(T));
        for (i = 0; i < 3; i++) {
            for (j = 0; j < t[i]->size; j++)
                if (fabs(t[i]->grad[j] - 2 * first[i][j]) > 1e-12 * (1 + fabs(first[i][j]))) ok = 0;
            free(first[i]);
        }
        TH_CHECK(ok, "groups %d: a second ad_backward doubles the gradients", groups);
        /* an input that needs no gradient (the images); conv is linear in w, so
           <w, d/dw sum(y^2)> = 2 sum(y^2) */
        {
            ad_tensor *x2 = ad_tensor_new(T, 4, x->shape, x->data, 0);
            ad_tensor *w2 = ad_tensor_new(T, 4, w->shape, w->data, 1);
            ad_tensor *y2 = ad_conv2d(T, x2, w2, NULL, &d), *y1, *l2 = ad_sum(T, ad_mul(T, y2, y2));
            size_t len = ad_tape_length(T);
            double lhs = 0, rhs = 0;
            TH_CHECK(ad_backward(T, l2) == 0 && w2->grad && !x2->grad, "backward with a constant input: %s",
                     th_errs(T));
            ad_set_grad_enabled(T, 0);
            y1 = ad_conv2d(T, x2, w2, b, &d);
            ad_set_grad_enabled(T, 1);
            TH_CHECK(y1 && !y1->requires_grad && ad_tape_length(T) == len, "no-grad conv records nothing");
            for (j = 0; w2->grad && j < w2->size; j++) lhs += w2->data[j] * w2->grad[j];
            for (j = 0; j < y2->size; j++) rhs += 2 * y2->data[j] * y2->data[j];
            ok = fabs(lhs - rhs) < 1e-10 * (1 + fabs(rhs));
            TH_CHECK(ok, "groups %d: weight gradient with a constant input (Euler identity)", groups);
        }
    }
    ad_tape_free(T);
}

/* ---- pooling ------------------------------------------------------------------------------ */
typedef struct pool_case {
    const char *name;
    int kind; /* 0 max, 1 avg, 2 global avg */
    int kh, kw;
    ad_pool2d_desc d;
    int square, twice;
    double *offset; /* max pooling: constant added to x, far apart, so that no window ties */
    int x[4];
} pool_case;

static ad_tensor *f_pool(ad_tape *T, ad_tensor **in, void *ctx)
{
    pool_case *c = (pool_case *)ctx;
    ad_tensor *x = in[0], *y;
    if (c->offset) x = ad_add(T, x, ad_tensor_new(T, 4, c->x, c->offset, 0));
    if (c->kind == 0) y = ad_max_pool2d(T, x, c->kh, c->kw, &c->d);
    else if (c->kind == 1) y = ad_avg_pool2d(T, x, c->kh, c->kw, &c->d);
    else y = ad_global_avg_pool2d(T, x);
    if (c->twice && c->kind == 0) /* a second use of x: the gradients add up */
        y = ad_add(T, y, ad_mul_scalar(T, ad_max_pool2d(T, x, c->kh, c->kw, &c->d), 0.5));
    else if (c->twice && c->kind == 1)
        y = ad_add(T, y, ad_mul_scalar(T, ad_avg_pool2d(T, x, c->kh, c->kw, &c->d), 0.5));
    return c->square ? ad_square(T, y) : y;
}

/* offsets 0.25 * a random permutation of 0..n-1: with x in [-0.1, 0.1] every two cells differ
   by at least 0.05, far more than the finite-difference steps */
static double *distinct_offsets(size_t n, unsigned seed)
{
    double *v = (double *)malloc(n * sizeof(double));
    ad_rng r;
    size_t i;
    ad_rng_seed(&r, seed);
    for (i = 0; i < n; i++) v[i] = 0.25 * (double)i;
    for (i = n - 1; i > 0; i--) {
        size_t j = (size_t)ad_rng_below(&r, i + 1);
        double t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    return v;
}

static void check_pool(pool_case *c)
{
    th_input in = spec4(c->x[0], c->x[1], c->x[2], c->x[3], c->kind == 0 ? -0.1 : -1, c->kind == 0 ? 0.1 : 1);
    char name[128];
    c->offset = c->kind == 0 ? distinct_offsets((size_t)c->x[0] * c->x[1] * c->x[2] * c->x[3], 7) : NULL;
    c->square = 0;
    c->twice = 1;
    snprintf(name, sizeof name, "%s twice", c->name);
    th_gradcheck(name, f_pool, c, 1, &in);
    c->twice = 0;
    snprintf(name, sizeof name, "%s", c->name);
    th_gradcheck(name, f_pool, c, 1, &in);
    th_gradgradcheck(name, f_pool, c, 1, &in);
    c->square = 1;
    snprintf(name, sizeof name, "%s squared", c->name);
    th_gradcheck(name, f_pool, c, 1, &in);
    th_gradgradcheck(name, f_pool, c, 1, &in);
    free(c->offset);
    c->offset = NULL;
}

static void test_pool_gradients(void)
{
    pool_case c;
    int kind;
    for (kind = 0; kind < 2; kind++) {
        memset(&c, 0, sizeof c);
        c.kind = kind;
        /* odd sizes, kernel 3x2, stride 2x1 (overlapping columns), padding 1x1 */
        c.name = kind ? "avg_pool2d k3x2 s2x1 p1x1" : "max_pool2d k3x2 s2x1 p1x1";
        c.kh = 3; c.kw = 2;
        c.d.stride_h = 2; c.d.stride_w = 1; c.d.pad_h = 1; c.d.pad_w = 1;
        set4(c.x, 2, 3, 7, 5);
        check_pool(&c);
        /* defaults: stride = kernel, the last row and column left over */
        memset(&c.d, 0, sizeof c.d);
        c.name = kind ? "avg_pool2d k2x2" : "max_pool2d k2x2";
        c.kh = c.kw = 2;
        set4(c.x, 2, 2, 5, 7);
        check_pool(&c);
        /* 3x3 windows, stride 1, padding 1: every cell in up to nine windows */
        c.name = kind ? "avg_pool2d k3x3 s1 p1" : "max_pool2d k3x3 s1 p1";
        c.kh = c.kw = 3;
        c.d.stride_h = c.d.stride_w = 1;
        c.d.pad_h = c.d.pad_w = 1;
        set4(c.x, 1, 2, 4, 5);
        check_pool(&c);
    }
    memset(&c, 0, sizeof c);
    c.kind = 1;
    c.name = "avg_pool2d k3x3 s2 p1 exclude_pad";
    c.kh = c.kw = 3;
    c.d.stride_h = c.d.stride_w = 2;
    c.d.pad_h = c.d.pad_w = 1;
    c.d.exclude_pad = 1;
    set4(c.x, 2, 2, 5, 6);
    check_pool(&c);
    memset(&c, 0, sizeof c);
    c.kind = 2;
    c.name = "global_avg_pool2d";
    set4(c.x, 2, 3, 5, 3);
    check_pool(&c);
}

/* Naive pooling: the value and the gradient of sum(y * gc); for max the first maximum of the
   real cells of each window in row-major order wins. */
static void naive_pool(int kind, const int *xs, int kh, int kw, int sh, int sw, int ph, int pw, int excl,
                       const double *x, const double *gc, double *y, double *dx, int OH, int OW)
{
    int p, oy, ox, iy, ix, P = xs[0] * xs[1], H = xs[2], W = xs[3];
    memset(dx, 0, (size_t)P * H * W * sizeof(double));
    for (p = 0; p < P; p++)
        for (oy = 0; oy < OH; oy++)
            for (ox = 0; ox < OW; ox++) {
                double best = 0, sum = 0;
                int at = -1, cnt = 0;
                size_t yi = ((size_t)p * OH + oy) * OW + ox;
                for (iy = oy * sh - ph; iy < oy * sh - ph + kh; iy++)
                    for (ix = ox * sw - pw; ix < ox * sw - pw + kw; ix++) {
                        double v;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                        v = x[((size_t)p * H + iy) * W + ix];
                        if (at < 0 || v > best) { best = v; at = iy * W + ix; }
                        sum += v;
                        cnt++;
                    }
                if (kind == 0) {
                    y[yi] = best;
                    dx[(size_t)p * H * W + at] += gc[yi];
                } else {
                    double div = excl ? cnt : kh * kw;
                    y[yi] = sum / div;
                    for (iy = oy * sh - ph; iy < oy * sh - ph + kh; iy++)
                        for (ix = ox * sw - pw; ix < ox * sw - pw + kw; ix++)
                            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                dx[((size_t)p * H + iy) * W + ix] += gc[yi] / div;
                }
            }
}

static void test_pool_reference(void)
{
    ad_rng r;
    int trial, trials = quick ? 40 : 300, kind;
    ad_rng_seed(&r, 77);
    for (kind = 0; kind < 2; kind++)
        for (trial = 0; trial < trials; trial++) {
            int xs[4], kh = rnd(&r, 1, 4), kw = rnd(&r, 1, 4), sh = rnd(&r, 1, 3), sw = rnd(&r, 1, 3);
            int ph = rnd(&r, 0, kh / 2), pw = rnd(&r, 0, kw / 2), excl = rnd(&r, 0, 1), OH, OW, ok = 1;
            ad_pool2d_desc d;
            ad_tape *T = ad_tape_new();
            ad_tensor *x, *y, *gc;
            double *yr, *dx;
            size_t i;
            if (trial % 4 == 1) { /* the 2x2 stride-2 fast path, with ties */
                kh = kw = sh = sw = 2;
                ph = pw = 0;
            }
            xs[0] = rnd(&r, 1, 2); /* one draw per statement: the same sequence with any compiler */
            xs[1] = rnd(&r, 1, 3);
            xs[2] = rnd(&r, 1, 8);
            xs[3] = rnd(&r, 1, 8);
            memset(&d, 0, sizeof d);
            d.stride_h = sh == kh && rnd(&r, 0, 1) ? 0 : sh;
            d.stride_w = sw == kw && rnd(&r, 0, 1) ? 0 : sw;
            d.pad_h = ph;
            d.pad_w = pw;
            d.exclude_pad = excl;
            /* all negative, with ties now and then (rounded values): padding must never win and
               ties go to the first cell */
            x = ad_rand(T, 4, xs, -2, -1, &r);
            for (i = 0; i < x->size; i++)
                if (trial % 2) x->data[i] = floor(x->data[i] * 4) / 4;
            ad_set_requires_grad(x, 1);
            y = kind ? ad_avg_pool2d(T, x, kh, kw, &d) : ad_max_pool2d(T, x, kh, kw, &d);
            OH = xs[2] + 2 * ph >= kh ? (xs[2] + 2 * ph - kh) / sh + 1 : 0;
            OW = xs[3] + 2 * pw >= kw ? (xs[3] + 2 * pw - kw) / sw + 1 : 0;
            if (OH < 1 || OW < 1) {
                TH_CHECK(y == NULL, "pool trial %d: expected an error", trial);
                TH_CHECK_ERROR(T, kind ? "ad_avg_pool2d" : "ad_max_pool2d");
                TH_CHECK_ERROR(T, "larger than the padded input");
                ad_tape_free(T);
                continue;
            }
            TH_CHECK(y && y->shape[2] == OH && y->shape[3] == OW, "pool trial %d: shape (%s)", trial,
                     th_errs(T));
            if (!y || y->shape[2] != OH || y->shape[3] != OW) { ad_tape_free(T); continue; }
            gc = ad_rand(T, 4, y->shape, -1, 1, &r);
            ad_backward(T, ad_sum(T, ad_mul(T, y, gc)));
            yr = (double *)malloc(y->size * sizeof(double));
            dx = (double *)malloc(x->size * sizeof(double));
            naive_pool(kind, xs, kh, kw, sh, sw, ph, pw, excl, x->data, gc->data, yr, dx, OH, OW);
            for (i = 0; i < y->size && ok; i++)
                if (fabs(y->data[i] - yr[i]) > 1e-12) ok = 0;
            for (i = 0; i < x->size && ok; i++)
                if (fabs(x->grad[i] - dx[i]) > 1e-12) ok = 0;
            TH_CHECK(ok, "%s trial %d: x [%d,%d,%d,%d] k%dx%d s%dx%d p%dx%d excl %d: values or gradient "
                     "differ from the naive loops", kind ? "avg" : "max", trial, xs[0], xs[1], xs[2], xs[3],
                     kh, kw, sh, sw, ph, pw, excl);
            free(yr);
            free(dx);
            ad_tape_free(T);
        }
}

static void test_pool_misc(void)
{
    ad_tape *T = ad_tape_new();
    ad_pool2d_desc d;
    ad_tensor *x = ad_zeros(T, AD_SHAPE(2, 3, 5, 4)), *x3 = ad_zeros(T, AD_SHAPE(3, 5, 4)), *y;
    size_t len;
    const char *ops[2] = {"ad_max_pool2d", "ad_avg_pool2d"};
    int k;
    for (k = 0; k < 2; k++) {
#define POOL(x_, kh_, kw_, d_) (k ? ad_avg_pool2d(T, x_, kh_, kw_, d_) : ad_max_pool2d(T, x_, kh_, kw_, d_))
#define EXPECT_POOL_ERROR(call, needle)                                                \
    do {                                                                               \
        ad_tape_clear_error(T);                                                        \
        TH_CHECK((call) == NULL, "%s %s should fail", ops[k], #call);                  \
        TH_CHECK_ERROR(T, ops[k]);                                                     \
        TH_CHECK_ERROR(T, needle);                                                     \
    } while (0)
        EXPECT_POOL_ERROR(POOL(x3, 2, 2, NULL), "x [3,5,4] must be [N, C, H, W]");
        EXPECT_POOL_ERROR(POOL(x, 0, 2, NULL), "kernel 0x2");
        memset(&d, 0, sizeof d);
        d.stride_h = -1;
        EXPECT_POOL_ERROR(POOL(x, 2, 2, &d), "stride -1x0");
        memset(&d, 0, sizeof d);
        d.pad_w = -1;
        EXPECT_POOL_ERROR(POOL(x, 2, 2, &d), "padding 0x-1");
        d.pad_w = 2;
        EXPECT_POOL_ERROR(POOL(x, 3, 3, &d), "between 0 and half the kernel 3x3");
        EXPECT_POOL_ERROR(POOL(x, 6, 2, NULL), "larger than the padded input 5x4");
        EXPECT_POOL_ERROR(POOL(x, 6, 2, NULL), "[2,3,5,4]");
#undef POOL
#undef EXPECT_POOL_ERROR
    }
    ad_tape_clear_error(T);
    y = ad_global_avg_pool2d(T, x3);
    TH_CHECK(y == NULL, "global_avg_pool2d of a 3-d tensor");
    TH_CHECK_ERROR(T, "ad_global_avg_pool2d: x [3,5,4]");
    /* nothing recorded for inputs that need no gradient, and in no-grad mode */
    ad_tape_clear_error(T);
    len = ad_tape_length(T);
    y = ad_max_pool2d(T, x, 2, 2, NULL);
    TH_CHECK(y && ad_tape_length(T) == len && !y->requires_grad, "max_pool2d of a constant records nothing");
    ad_set_requires_grad(x, 1);
    ad_set_grad_enabled(T, 0);
    y = ad_max_pool2d(T, x, 2, 2, NULL);
    TH_CHECK(y && ad_tape_length(T) == len && !y->requires_grad, "no-grad mode records nothing");
    ad_set_grad_enabled(T, 1);
    y = ad_max_pool2d(T, x, 2, 2, NULL);
    TH_CHECK(y && ad_tape_length(T) == len + 1 && y->requires_grad, "max_pool2d is one entry");
    /* a NaN wins its windows and stays, as in PyTorch; the gradient goes to it */
    {
        ad_tensor *z = ad_tensor_new(T, AD_SHAPE(1, 1, 2, 4), NULL, 1), *m;
        double vals[8] = {1, NAN, 5, 2, 0, 7, 3, 9};
        int i;
        for (i = 0; i < 8; i++) z->data[i] = vals[i];
        m = ad_max_pool2d(T, z, 2, 2, NULL);
        TH_CHECK(m && isnan(m->data[0]) && m->data[1] == 9, "max_pool2d with a NaN: %g %g", m ? m->data[0] : 0.0,
                 m ? m->data[1] : 0.0);
        ad_backward(T, ad_sum(T, ad_mul(T, m, ad_full(T, AD_SHAPE(1, 1, 1, 2), 1))));
        TH_CHECK(z->grad && z->grad[1] == 1 && z->grad[5] == 0 && z->grad[7] == 1 && z->grad[0] == 0,
                 "max_pool2d: the gradient goes to the NaN");
        z->data[1] = 8; /* padding 1: 3x3 windows, the NaN now in a later cell of one window */
        z->data[6] = NAN;
        memset(&d, 0, sizeof d);
        d.pad_h = d.pad_w = 1;
        d.stride_h = d.stride_w = 2;
        m = ad_max_pool2d(T, z, 3, 3, &d);
        TH_CHECK(m && m->shape[3] == 2 && m->data[0] == 8 && isnan(m->data[1]), "NaN after a larger value");
        /* two NaNs in a window: the first one wins */
        z = ad_tensor_new(T, AD_SHAPE(1, 1, 2, 2), NULL, 1);
        z->data[0] = 1;
        z->data[1] = NAN;
        z->data[2] = 2;
        z->data[3] = NAN;
        m = ad_max_pool2d(T, z, 2, 2, NULL);
        ad_backward(T, ad_sum(T, m));
        TH_CHECK(m && isnan(m->data[0]) && z->grad && z->grad[1] == 1 && z->grad[3] == 0, "the first NaN wins");
    }
    /* global average: values */
    {
        ad_tensor *z = ad_tensor_new(T, AD_SHAPE(1, 2, 2, 3), NULL, 0), *g;
        int i;
        for (i = 0; i < 12; i++) z->data[i] = i;
        g = ad_global_avg_pool2d(T, z);
        TH_CHECK(g && g->ndim == 2 && g->shape[0] == 1 && g->shape[1] == 2 && fabs(g->data[0] - 2.5) < 1e-15 &&
                 fabs(g->data[1] - 8.5) < 1e-15, "global average values");
    }
    ad_tape_free(T);
}

/* ---- dropout ------------------------------------------------------------------------------ */
typedef struct drop_case { double p; uint64_t seed; int square; } drop_case;

static ad_tensor *f_dropout(ad_tape *T, ad_tensor **in, void *ctx)
{
    drop_case *c = (drop_case *)ctx;
    ad_rng r;
    ad_tensor *y;
    ad_rng_seed(&r, c->seed); /* the same mask on every evaluation */
    y = ad_dropout(T, in[0], (ad_real)c->p, &r);
    return c->square ? ad_mul(T, y, y) : y;
}

static void test_dropout(void)
{
    drop_case c;
    th_input in;
    ad_tape *T = ad_tape_new();
    ad_tensor *x, *y;
    ad_rng r;
    size_t i, zeros = 0, other = 0, len;
    double sum = 0, p = 0.3;
    int shape[2];
    c.p = 0.4;
    c.seed = 5;
    c.square = 0;
    in = spec4(2, 3, 5, 3, -1, 1);
    th_gradcheck("dropout", f_dropout, &c, 1, &in);
    th_gradgradcheck("dropout", f_dropout, &c, 1, &in);
    c.square = 1;
    th_gradcheck("dropout squared", f_dropout, &c, 1, &in);
    th_gradgradcheck("dropout squared", f_dropout, &c, 1, &in);

    /* statistics of 100000 draws */
    ad_rng_seed(&r, 11);
    shape[0] = 1000;
    shape[1] = 100;
    x = ad_ones(T, 2, shape);
    y = ad_dropout(T, x, (ad_real)p, &r);
    TH_CHECK(y && y != x, "dropout in training mode makes a new tensor");
    for (i = 0; y && i < y->size; i++) {
        if (y->data[i] == 0) zeros++;
        else if (fabs(y->data[i] - 1 / (1 - p)) > 1e-15) other++;
        sum += y->data[i];
    }
    TH_CHECK(fabs((double)zeros / 100000 - p) < 0.01, "fraction zeroed %g, expected %g", (double)zeros / 100000, p);
    TH_CHECK(other == 0, "%zu kept values are not 1/(1-p)", other);
    TH_CHECK(fabs(sum / 100000 - 1) < 0.02, "mean %g, expected 1", sum / 100000);
    /* the mask depends on the rng only */
    {
        ad_rng r1, r2;
        ad_tensor *a, *b;
        int same = 1;
        ad_rng_seed(&r1, 3);
        ad_rng_seed(&r2, 3);
        a = ad_dropout(T, x, (ad_real)0.5, &r1);
        b = ad_dropout(T, x, (ad_real)0.5, &r2);
        for (i = 0; a && b && i < a->size; i++) same &= a->data[i] == b->data[i];
        TH_CHECK(a && b && same, "same seed, same mask");
    }
    /* p = 1: all zeros; p = 0: x itself */
    y = ad_dropout(T, x, 1, &r);
    for (i = 0, zeros = 0; y && i < y->size; i++) zeros += y->data[i] == 0;
    TH_CHECK(y && zeros == y->size, "p = 1 zeroes everything");
    TH_CHECK(ad_dropout(T, x, 0, &r) == x, "p = 0 is the identity");
    /* evaluation mode: x itself, nothing recorded, rng not needed */
    ad_set_requires_grad(x, 1);
    ad_set_training(T, 0);
    len = ad_tape_length(T);
    TH_CHECK(ad_dropout(T, x, (ad_real)0.5, NULL) == x && ad_tape_length(T) == len, "eval mode: identity");
    ad_set_training(T, 1);
    /* errors */
    TH_CHECK(ad_dropout(T, x, (ad_real)-0.1, &r) == NULL, "p < 0");
    TH_CHECK_ERROR(T, "ad_dropout: p = -0.1 must be in [0, 1]");
    ad_tape_clear_error(T);
    TH_CHECK(ad_dropout(T, x, (ad_real)1.5, &r) == NULL, "p > 1");
    TH_CHECK_ERROR(T, "ad_dropout: p = 1.5");
    ad_tape_clear_error(T);
    TH_CHECK(ad_dropout(T, x, (ad_real)NAN, &r) == NULL, "p NaN");
    TH_CHECK_ERROR(T, "ad_dropout");
    ad_tape_clear_error(T);
    TH_CHECK(ad_dropout(T, x, (ad_real)0.5, NULL) == NULL, "rng NULL in training");
    TH_CHECK_ERROR(T, "ad_dropout: rng is NULL");
    ad_tape_free(T);
}

/* ---- batch norm --------------------------------------------------------------------------- */
typedef struct bn_case {
    ad_batch_norm_state *bn;
    int affine, eval, square;
} bn_case;

static ad_tensor *f_bn(ad_tape *T, ad_tensor **in, void *ctx)
{
    bn_case *c = (bn_case *)ctx;
    ad_tensor *y;
    ad_set_training(T, !c->eval);
    y = ad_batch_norm(T, in[0], c->bn, c->affine ? in[1] : NULL, c->affine ? in[2] : NULL);
    return c->square ? ad_mul(T, y, ad_sin(T, y)) : y;
}

static void test_batch_norm_gradients(void)
{
    ad_batch_norm_state bn;
    bn_case c;
    th_input in[3];
    int C, twod;
    for (twod = 0; twod < 2; twod++) {
        C = twod ? 4 : 3;
        ad_batch_norm_init(&bn, C, NULL, NULL, NULL, 0);
        /* eval mode reads these */
        bn.running_mean[0] = 0.3;
        bn.running_var[0] = 2.0;
        bn.running_mean[C - 1] = -0.2;
        bn.running_var[C - 1] = 0.5;
        in[0] = twod ? spec4(3, C, 5, 2, -2, 2) : th_in(AD_SHAPE(5, 3), -2, 2, 0);
        in[1] = spec1(C, 0.5, 1.5);
        in[2] = spec1(C, -1, 1);
        memset(&c, 0, sizeof c);
        c.bn = &bn;
        for (c.eval = 0; c.eval < 2; c.eval++)
            for (c.affine = 0; c.affine < 2; c.affine++)
                for (c.square = 0; c.square < 2; c.square++) {
                    char name[96];
                    snprintf(name, sizeof name, "batch_norm %s %s%s%s", twod ? "2-d" : "1-d",
                             c.eval ? "eval" : "train", c.affine ? " affine" : "", c.square ? " y sin y" : "");
                    th_gradcheck(name, f_bn, &c, c.affine ? 3 : 1, in);
                    th_gradgradcheck(name, f_bn, &c, c.affine ? 3 : 1, in);
                }
        ad_batch_norm_free(&bn);
    }
}

static void test_batch_norm_stats(void)
{
    ad_batch_norm_state bn;
    ad_real mean_buf[3], var_buf[3];
    double rm[3] = {0, 0, 0}, rv[3] = {1, 1, 1}, mom = 0.2, eps = 1e-3;
    ad_tape *T = ad_tape_new();
    ad_rng r;
    int step, N = 4, C = 3, H = 3, W = 2, n, c, i, ok;
    ad_tensor *x, *y, *gamma, *beta;
    TH_CHECK(ad_batch_norm_init(&bn, C, mean_buf, var_buf, NULL, 0) == 0, "init with caller buffers");
    TH_CHECK(bn.running_mean == mean_buf && bn.running_var == var_buf && !bn.owns_buffers &&
             mean_buf[2] == 0 && var_buf[2] == 1 && fabs(bn.momentum - 0.1) < 1e-15 && fabs(bn.eps - 1e-5) < 1e-20,
             "init values");
    bn.momentum = (ad_real)mom;
    bn.eps = (ad_real)eps;
    ad_rng_seed(&r, 31);
    gamma = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    beta = ad_tensor_new(T, AD_SHAPE(3), NULL, 1);
    for (c = 0; c < C; c++) {
        gamma->data[c] = 1 + 0.5 * c;
        beta->data[c] = 0.1 * c - 0.1;
    }
    for (step = 0; step < 4; step++) {
        x = ad_randn(T, AD_SHAPE(4, 3, 3, 2), step, 1 + step, &r);
        y = ad_batch_norm(T, x, &bn, gamma, beta);
        ok = y != NULL && y->ndim == 4;
        for (c = 0; c < C && ok; c++) {
            double m = 0, v = 0;
            int cnt = N * H * W;
            for (n = 0; n < N; n++)
                for (i = 0; i < H * W; i++) m += x->data[((size_t)n * C + c) * H * W + i];
            m /= cnt;
            for (n = 0; n < N; n++)
                for (i = 0; i < H * W; i++) {
                    double d = x->data[((size_t)n * C + c) * H * W + i] - m;
                    v += d * d;
                }
            v /= cnt;
            for (n = 0; n < N; n++)
                for (i = 0; i < H * W; i++) {
                    size_t at = ((size_t)n * C + c) * H * W + i;
                    double want = (x->data[at] - m) / sqrt(v + eps) * gamma->data[c] + beta->data[c];
                    if (fabs(y->data[at] - want) > 1e-12) ok = 0;
                }
            rm[c] = (1 - mom) * rm[c] + mom * m;
            rv[c] = (1 - mom) * rv[c] + mom * v * cnt / (cnt - 1);
        }
        TH_CHECK(ok, "step %d: training output", step);
        for (c = 0; c < C; c++)
            TH_CHECK(fabs(bn.running_mean[c] - rm[c]) < 1e-12 && fabs(bn.running_var[c] - rv[c]) < 1e-12,
                     "step %d channel %d: running mean %g var %g, expected %g %g", step, c, bn.running_mean[c],
                     bn.running_var[c], rm[c], rv[c]);
    }
    /* no-grad mode in training still updates (as PyTorch) */
    ad_set_grad_enabled(T, 0);
    x = ad_randn(T, AD_SHAPE(4, 3, 3, 2), 0, 1, &r);
    y = ad_batch_norm(T, x, &bn, NULL, NULL);
    TH_CHECK(y && fabs(bn.running_mean[0] - rm[0]) > 1e-6, "training under no-grad updates the statistics");
    for (c = 0; c < C; c++) {
        rm[c] = bn.running_mean[c];
        rv[c] = bn.running_var[c];
    }
    ad_set_grad_enabled(T, 1);
    /* evaluation: the running statistics, untouched */
    ad_set_training(T, 0);
    x = ad_randn(T, AD_SHAPE(2, 3, 3, 2), 1, 2, &r);
    y = ad_batch_norm(T, x, &bn, gamma, beta);
    ok = y != NULL;
    for (n = 0; n < 2 && ok; n++)
        for (c = 0; c < C; c++)
            for (i = 0; i < H * W; i++) {
                size_t at = ((size_t)n * C + c) * H * W + i;
                double want = (x->data[at] - rm[c]) / sqrt(rv[c] + eps) * gamma->data[c] + beta->data[c];
                if (fabs(y->data[at] - want) > 1e-12) ok = 0;
            }
    TH_CHECK(ok, "eval mode uses the running statistics");
    for (c = 0; c < C; c++)
        TH_CHECK(bn.running_mean[c] == rm[c] && bn.running_var[c] == rv[c], "eval mode leaves the state alone");
    /* eval mode allows a single value per channel */
    x = ad_randn(T, AD_SHAPE(1, 3), 0, 1, &r);
    TH_CHECK(ad_batch_norm(T, x, &bn, NULL, NULL) != NULL, "eval with one row: %s", th_errs(T));
    ad_set_training(T, 1);
    /* 1-d training output: per channel mean 0, variance 1 */
    x = ad_randn(T, AD_SHAPE(7, 3), 2, 3, &r);
    y = ad_batch_norm(T, x, &bn, NULL, NULL);
    ok = y != NULL;
    for (c = 0; c < C && ok; c++) {
        double m = 0, v = 0;
        for (n = 0; n < 7; n++) m += y->data[n * 3 + c] / 7;
        for (n = 0; n < 7; n++) v += (y->data[n * 3 + c] - m) * (y->data[n * 3 + c] - m) / 7;
        if (fabs(m) > 1e-12 || fabs(v - 1) > 1e-3) ok = 0;
    }
    TH_CHECK(ok, "1-d training output is normalised per channel");

    /* errors */
    {
        ad_batch_norm_state empty;
        ad_tensor *g4 = ad_ones(T, AD_SHAPE(4));
        memset(&empty, 0, sizeof empty);
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, x, &empty, NULL, NULL) == NULL, "uninitialised state");
        TH_CHECK_ERROR(T, "ad_batch_norm: x [7,3]: the state is not initialised");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, x, NULL, NULL, NULL) == NULL, "NULL state");
        TH_CHECK_ERROR(T, "not initialised");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, ad_ones(T, AD_SHAPE(7, 4)), &bn, NULL, NULL) == NULL, "channels");
        TH_CHECK_ERROR(T, "ad_batch_norm: x [7,4] has 4 channels; the state has 3 features");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, ad_ones(T, AD_SHAPE(7, 3, 2)), &bn, NULL, NULL) == NULL, "rank");
        TH_CHECK_ERROR(T, "ad_batch_norm: x [7,3,2] must be [N, C] or [N, C, H, W]");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, x, &bn, g4, NULL) == NULL, "gamma");
        TH_CHECK_ERROR(T, "gamma [4]: it must be [3]");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, x, &bn, NULL, g4) == NULL, "beta");
        TH_CHECK_ERROR(T, "beta [4]: it must be [3]");
        ad_tape_clear_error(T);
        TH_CHECK(ad_batch_norm(T, ad_ones(T, AD_SHAPE(1, 3, 1, 1)), &bn, NULL, NULL) == NULL, "one value");
        TH_CHECK_ERROR(T, "ad_batch_norm: x [1,3,1,1]: training needs more than one value per channel");
        TH_CHECK(ad_batch_norm_init(&empty, 0, NULL, NULL, NULL, 0) == -1 && empty.running_mean == NULL, "init 0 features");
        TH_CHECK(ad_batch_norm_init(&empty, 3, mean_buf, NULL, NULL, 0) == -1, "init with one buffer");
        TH_CHECK(ad_batch_norm_init(&empty, 5, NULL, NULL, NULL, 0) == 0 && empty.owns_buffers &&
                 empty.running_var[4] == 1, "init allocates");
        ad_batch_norm_free(&empty);
        TH_CHECK(empty.running_mean == NULL && empty.num_features == 0, "free clears");
        ad_batch_norm_free(&empty);
        ad_batch_norm_free(&bn); /* caller's buffers: not freed */
    }
    ad_tape_free(T);
}

/* ---- layer norm --------------------------------------------------------------------------- */
typedef struct ln_case { int k, affine, square; } ln_case;

static ad_tensor *f_ln(ad_tape *T, ad_tensor **in, void *ctx)
{
    ln_case *c = (ln_case *)ctx;
    ad_tensor *y = ad_layer_norm(T, in[0], c->k, c->affine ? in[1] : NULL, c->affine ? in[2] : NULL,
                                 (ad_real)1e-5);
    return c->square ? ad_mul(T, y, ad_sin(T, y)) : y;
}

static void test_layer_norm(void)
{
    ln_case c;
    th_input in[3];
    ad_tape *T = ad_tape_new();
    ad_rng r;
    ad_tensor *x, *y, *g;
    int i, j, ok = 1;
    in[0] = th_in(AD_SHAPE(3, 4, 5), -2, 2, 0);
    for (c.k = 1; c.k <= 2; c.k++)
        for (c.affine = 0; c.affine < 2; c.affine++)
            for (c.square = 0; c.square < 2; c.square++) {
                char name[64];
                in[1] = c.k == 1 ? th_in(AD_SHAPE(5), 0.5, 1.5, 0) : th_in(AD_SHAPE(4, 5), 0.5, 1.5, 0);
                in[2] = c.k == 1 ? th_in(AD_SHAPE(5), -1, 1, 0) : th_in(AD_SHAPE(4, 5), -1, 1, 0);
                snprintf(name, sizeof name, "layer_norm k=%d%s%s", c.k, c.affine ? " affine" : "",
                         c.square ? " y sin y" : "");
                th_gradcheck(name, f_ln, &c, c.affine ? 3 : 1, in);
                th_gradgradcheck(name, f_ln, &c, c.affine ? 3 : 1, in);
            }
    /* values */
    ad_rng_seed(&r, 4);
    x = ad_randn(T, AD_SHAPE(3, 4, 5), 1, 2, &r);
    g = ad_randn(T, AD_SHAPE(4, 5), 1, 1, &r);
    y = ad_layer_norm(T, x, 2, g, NULL, (ad_real)0.01);
    for (i = 0; y && i < 3; i++) {
        double m = 0, v = 0;
        for (j = 0; j < 20; j++) m += x->data[i * 20 + j] / 20;
        for (j = 0; j < 20; j++) v += (x->data[i * 20 + j] - m) * (x->data[i * 20 + j] - m) / 20;
        for (j = 0; j < 20; j++)
            if (fabs(y->data[i * 20 + j] - (x->data[i * 20 + j] - m) / sqrt(v + 0.01) * g->data[j]) > 1e-12) ok = 0;
    }
    TH_CHECK(y && ok, "layer_norm values");
    /* errors */
    TH_CHECK(ad_layer_norm(T, x, 0, NULL, NULL, 0) == NULL, "k = 0");
    TH_CHECK_ERROR(T, "ad_layer_norm: x [3,4,5]: k = 0 must be between 1 and 3");
    ad_tape_clear_error(T);
    TH_CHECK(ad_layer_norm(T, x, 4, NULL, NULL, 0) == NULL, "k = 4");
    TH_CHECK_ERROR(T, "k = 4 must be between 1 and 3");
    ad_tape_clear_error(T);
    TH_CHECK(ad_layer_norm(T, x, 1, g, NULL, 0) == NULL, "gamma shape");
    TH_CHECK_ERROR(T, "ad_layer_norm: x [3,4,5], k = 1: gamma [4,5] must have x's last 1 dimension(s)");
    ad_tape_clear_error(T);
    TH_CHECK(ad_layer_norm(T, x, 2, NULL, ad_ones(T, AD_SHAPE(5, 4)), 0) == NULL, "beta shape");
    TH_CHECK_ERROR(T, "beta [5,4]");
    ad_tape_clear_error(T);
    TH_CHECK(ad_layer_norm(T, x, 2, NULL, NULL, -1) == NULL, "eps");
    TH_CHECK_ERROR(T, "eps -1 must not be negative");
    ad_tape_free(T);
}

/* The fused layer norm against the same function composed of ops (mean, variance, pow), on
   [2, 137, 131] normalised over the last one or two dimensions (274 rows, which 2 threads split,
   in the backward's blocks of rows with a short last one; or 2 rows), with gamma and beta: values
   and the gradients of x, gamma and beta within 1e-12; then the same bits, values and gradients,
   on 1 and 2 threads. Also in a residual block, x + norm(x), where the norm's backward adds to a
   gradient of x that the add shares with its output. */
static ad_tensor *ln_composed(ad_tape *T, ad_tensor *x, int k, ad_tensor *gamma, ad_tensor *beta, ad_real eps)
{
    int shape[2], i;
    ad_tensor *x2, *xc, *var, *y;
    shape[1] = 1;
    for (i = x->ndim - k; i < x->ndim; i++) shape[1] *= x->shape[i];
    shape[0] = (int)(x->size / (size_t)shape[1]);
    x2 = ad_reshape(T, x, 2, shape);
    xc = ad_sub(T, x2, ad_mean_axis(T, x2, 1, 1));
    var = ad_mean_axis(T, ad_square(T, xc), 1, 1);
    y = ad_reshape(T, ad_mul(T, xc, ad_pow(T, ad_add_scalar(T, var, eps), -0.5)), x->ndim, x->shape);
    return ad_add(T, ad_mul(T, y, gamma), beta);
}

static void test_layer_norm_fused(void)
{
    int k, t, composed, residual, kr;
    for (kr = 0; kr < 4; kr++) {
        ad_real *bits[2][4] = {{NULL}};
        size_t sizes[4];
        double worst = 0;
        k = 1 + kr % 2;
        residual = kr / 2;
        for (t = 0; t < 2; t++)
            for (composed = 0; composed < 2; composed++) {
                ad_tape *T = ad_tape_new();
                ad_rng r;
                ad_tensor *x, *gamma, *beta, *w, *y, *in[3];
                int i, pshape[2] = {137, 131};
                size_t e;
                ad_rng_seed(&r, 11);
                ad_set_threads(T, composed ? 1 : t + 1);
                x = ad_randn(T, AD_SHAPE(2, 137, 131), 3, 2, &r);
                gamma = ad_randn(T, k, pshape + 2 - k, 1, 0.5, &r);
                beta = ad_randn(T, k, pshape + 2 - k, 0, 1, &r);
                w = ad_randn(T, AD_SHAPE(2, 137, 131), 0, 1, &r);
                in[0] = x, in[1] = gamma, in[2] = beta;
                for (i = 0; i < 3; i++) ad_set_requires_grad(in[i], 1);
                y = composed ? ln_composed(T, x, k, gamma, beta, (ad_real)1e-5)
                             : ad_layer_norm(T, x, k, gamma, beta, (ad_real)1e-5);
                if (residual) y = ad_add(T, x, y);
                if (!y || ad_backward(T, ad_sum(T, ad_mul(T, y, w))) != 0) {
                    TH_CHECK(0, "layer norm k=%d%s: %s", k, residual ? " residual" : "", ad_tape_error(T));
                    ad_tape_free(T);
                    continue;
                }
                if (composed) {
                    for (i = 0; i < 4; i++) {
                        const ad_real *a = i ? in[i - 1]->grad : y->data;
                        for (e = 0; e < sizes[i]; e++) {
                            double d = fabs(a[e] - bits[0][i][e]) / (1 + fabs(a[e]));
                            if (d > worst) worst = d;
                        }
                    }
                } else {
                    for (i = 0; i < 4; i++) {
                        const ad_real *a = i ? in[i - 1]->grad : y->data;
                        sizes[i] = i ? in[i - 1]->size : y->size;
                        bits[t][i] = (ad_real *)malloc(sizes[i] * sizeof(ad_real));
                        if (bits[t][i]) memcpy(bits[t][i], a, sizes[i] * sizeof(ad_real));
                    }
                }
                ad_tape_free(T);
            }
        TH_CHECK(worst <= 1e-12, "layer norm k=%d%s: fused and composed differ by %.3g", k,
                 residual ? " residual" : "", worst);
        {
            int same = 1, i;
            for (i = 0; i < 4; i++)
                same = same && bits[0][i] && bits[1][i] && memcmp(bits[0][i], bits[1][i], sizes[i] * sizeof(ad_real)) == 0;
            TH_CHECK(same, "layer norm k=%d%s: 1 and 2 threads give different bits", k, residual ? " residual" : "");
            for (i = 0; i < 4; i++) {
                free(bits[0][i]);
                free(bits[1][i]);
            }
        }
    }
}

/* ---- embedding ---------------------------------------------------------------------------- */
static const int emb_idx[6] = {3, 0, 3, 6, 3, 1};

static ad_tensor *f_emb(ad_tape *T, ad_tensor **in, void *ctx)
{
    int square = *(int *)ctx;
    ad_tensor *y = ad_embedding(T, in[0], emb_idx, 6);
    return square ? ad_mul(T, y, ad_sin(T, y)) : y;
}

static void test_embedding(void)
{
    th_input in = th_in(AD_SHAPE(7, 4), -1, 1, 0);
    int square, idx[4] = {2, 2, 0, 4}, i, j, ok = 1;
    ad_tape *T = ad_tape_new();
    ad_rng r;
    ad_tensor *w, *y;
    for (square = 0; square < 2; square++) {
        th_gradcheck(square ? "embedding y sin y" : "embedding", f_emb, &square, 1, &in);
        th_gradgradcheck(square ? "embedding y sin y" : "embedding", f_emb, &square, 1, &in);
    }
    ad_rng_seed(&r, 8);
    w = ad_rand(T, AD_SHAPE(5, 3), -1, 1, &r);
    ad_set_requires_grad(w, 1);
    y = ad_embedding(T, w, idx, 4);
    TH_CHECK(y && y->ndim == 2 && y->shape[0] == 4 && y->shape[1] == 3, "embedding shape");
    for (i = 0; y && i < 4; i++)
        for (j = 0; j < 3; j++)
            if (y->data[i * 3 + j] != w->data[idx[i] * 3 + j]) ok = 0;
    TH_CHECK(ok, "embedding rows");
    /* the indices were copied: changing the caller's array does not move the gradient */
    idx[0] = 1;
    idx[1] = 1;
    ad_backward(T, ad_sum(T, y));
    ok = w->grad != NULL;
    for (i = 0; ok && i < 5; i++)
        for (j = 0; j < 3; j++) {
            double want = i == 2 ? 2 : (i == 0 || i == 4 ? 1 : 0);
            if (w->grad[i * 3 + j] != want) ok = 0;
        }
    TH_CHECK(ok, "embedding gradient: rows counted, untouched rows zero");
    /* into a gradient buffer that already holds values: untouched rows keep them */
    {
        ad_real wv[15], gv[15];
        ad_tensor *wt;
        int used[3] = {4, 1, 4};
        for (i = 0; i < 15; i++) { wv[i] = i; gv[i] = 5; }
        wt = ad_tensor_view(T, AD_SHAPE(5, 3), wv, gv, 1);
        ad_backward(T, ad_sum(T, ad_embedding(T, wt, used, 3)));
        ok = 1;
        for (i = 0; i < 5; i++)
            for (j = 0; j < 3; j++)
                if (gv[i * 3 + j] != 5 + (i == 4 ? 2 : (i == 1 ? 1 : 0))) ok = 0;
        TH_CHECK(ok, "embedding gradient added into an existing buffer");
    }
    idx[0] = 5;
    TH_CHECK(ad_embedding(T, w, idx, 4) == NULL, "index V");
    TH_CHECK_ERROR(T, "ad_embedding: weight [5,3]: index 5 (position 0) is outside 0..4");
    ad_tape_clear_error(T);
    idx[0] = 0;
    idx[3] = -1;
    TH_CHECK(ad_embedding(T, w, idx, 4) == NULL, "index -1");
    TH_CHECK_ERROR(T, "index -1 (position 3) is outside 0..4");
    ad_tape_clear_error(T);
    TH_CHECK(ad_embedding(T, w, idx, 0) == NULL, "n = 0");
    TH_CHECK_ERROR(T, "ad_embedding: weight [5,3]: n must be at least 1");
    ad_tape_clear_error(T);
    TH_CHECK(ad_embedding(T, w, NULL, 3) == NULL, "NULL indices");
    TH_CHECK_ERROR(T, "indices is NULL");
    ad_tape_clear_error(T);
    TH_CHECK(ad_embedding(T, ad_ones(T, AD_SHAPE(5)), idx, 2) == NULL, "1-d weight");
    TH_CHECK_ERROR(T, "ad_embedding: weight [5] must be [V, D]");
    ad_tape_free(T);
}

/* ---- a small CNN end to end: second order through conv, pool, batch norm, dropout ---------- */
typedef struct cnn_case { ad_batch_norm_state bn; } cnn_case;

static ad_tensor *f_cnn(ad_tape *T, ad_tensor **in, void *ctx)
{
    cnn_case *c = (cnn_case *)ctx;
    ad_conv2d_desc d;
    ad_pool2d_desc pd;
    ad_rng r;
    ad_tensor *h;
    int labels[2] = {1, 0};
    memset(&d, 0, sizeof d);
    memset(&pd, 0, sizeof pd);
    d.pad_h = d.pad_w = 1;
    ad_rng_seed(&r, 17);
    h = ad_conv2d(T, in[0], in[1], in[2], &d);
    h = ad_batch_norm(T, h, &c->bn, NULL, NULL);
    h = ad_tanh(T, h);
    h = ad_avg_pool2d(T, h, 2, 2, &pd);
    h = ad_dropout(T, ad_flatten(T, h), (ad_real)0.25, &r);
    h = ad_linear(T, h, in[3], NULL);
    return ad_cross_entropy(T, h, labels);
}

static void test_small_cnn(void)
{
    cnn_case c;
    th_input in[4];
    ad_batch_norm_init(&c.bn, 3, NULL, NULL, NULL, 0);
    in[0] = spec4(2, 2, 5, 4, -1, 1);
    in[1] = spec4(3, 2, 3, 3, -1, 1);
    in[2] = spec1(3, -1, 1);
    in[3] = th_in(AD_SHAPE(12, 2), -1, 1, 0);
    th_gradcheck("small cnn", f_cnn, &c, 4, in);
    th_gradgradcheck("small cnn", f_cnn, &c, 4, in);
    ad_batch_norm_free(&c.bn);
}

/* A gather large enough to be split over threads (a batch of rows picked from a data set held
   as one tensor): on 1, 2 and 3 threads every row must be the named row of the table. */
/* Rows of fewer than 64 values are copied by a loop, longer ones by memcpy with each row's first
   line requested some rows ahead; both on several threads, with more and fewer rows than that. */
static void test_embedding_threads(void)
{
    enum { V = 1000, N = 1501 };
    static const int widths[2] = {47, 131}, counts[2] = {N, 5};
    static int idx[N];
    int i, t, c, k, bad;
    ad_rng r;
    ad_tape *T;
    ad_tensor *w, *y;
    ad_rng_seed(&r, 12);
    for (i = 0; i < N; i++) idx[i] = (int)ad_rng_below(&r, V);
    for (k = 0; k < 2; k++)
        for (c = 0; c < 2; c++)
            for (t = 1; t <= 3; t++) {
                int D = widths[k], n = counts[c];
                T = ad_tape_new();
                ad_set_threads(T, t);
                w = ad_rand(T, AD_SHAPE(V, D), -1, 1, &r);
                y = ad_embedding(T, w, idx, n);
                bad = y == NULL;
                for (i = 0; y && i < n; i++)
                    if (memcmp(y->data + (size_t)i * D, w->data + (size_t)idx[i] * D, D * sizeof(ad_real)) != 0)
                        bad++;
                TH_CHECK(!bad, "embedding of %d rows of %d on %d threads: %d rows differ from the table's", n, D,
                         t, bad);
                ad_tape_free(T);
            }
}

/* In double precision the products stay in double: bfloat16 is refused, with the reason. (The
   bfloat16 products themselves are tested in tests/test_tape.c, built in float.) */
static void test_matmul_precision_double(void)
{
    ad_tape *T = ad_tape_new();
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == -1, "bfloat16 is refused in double builds");
    TH_CHECK_ERROR(T, "AUTODIFF_DOUBLE");
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_FLOAT32, "and the tape keeps its products in double");
    ad_tape_clear_error(T);
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_FLOAT32) == AD_MATMUL_FLOAT32, "float32 (ad_real) is accepted");
    ad_tape_free(T);
    th_family("ad_set_matmul_precision in double");
}

int main(void)
{
    quick = getenv("TH_QUICK") != NULL;
    ad_rng_seed(&th_rng_state, 42);
    test_matmul_precision_double();
    test_conv_gradients();
    test_conv_reference();
    test_conv_threads();
    test_conv_errors();
    test_conv_accumulates();
    test_pool_gradients();
    test_pool_reference();
    test_pool_misc();
    test_dropout();
    test_batch_norm_gradients();
    test_batch_norm_stats();
    test_layer_norm();
    test_layer_norm_fused();
    test_embedding();
    test_embedding_threads();
    test_small_cnn();
    return th_summary();
}
