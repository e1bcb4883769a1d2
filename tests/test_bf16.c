/* Products in bfloat16 (ad_set_matmul_precision): the rounding of an operand against a reference
   computed another way, every kernel's products against sums in double of the rounded
   operands, on odd shapes and every transpose, the ops that run products (matmul, linear and
   its gradients, convolution, attention) against their float results, bitwise the same results
   on 1, 2 and 3 threads, and the setting's errors. Built in float; with AUTODIFF_DOUBLE only the
   setting's refusal is checked. */
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "harness.h"

#include <float.h>

/* TH_QUICK (the sanitizer runs): fewer random roundings, and the kernels on two of the four
   transposes */
static int quick;

#if AD__GEMM_BF16

/* The bfloat16 value nearest to x (ties to even), by scaling in double: x's unit in the last
   of 8 significant bits is 2^(e - 7) for x in [2^e, 2^(e+1)). Finite x whose result is finite. */
static float reference_round(float x)
{
    double ax = fabs((double)x), ulp, r;
    int e;
    if (ax == 0 || ax < FLT_MIN) { /* zero and subnormals: the ulp of the smallest exponent */
        ulp = ldexp(1.0, -126 - 7);
    } else {
        frexp(ax, &e); /* ax = m 2^e, m in [0.5, 1) */
        ulp = ldexp(1.0, e - 1 - 7);
    }
    r = nearbyint((double)x / ulp) * ulp; /* the default rounding mode: to nearest, ties even */
    return (float)r;
}

static float bits_to_float(uint32_t b16)
{
    uint32_t u = b16 << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float rounded(float x) { return bits_to_float(ad__bf16_bits(x)); }

static void test_rounding(void)
{
    static const struct { uint32_t in, out; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8, halfway: to the even 1 */
        {0x3f818000u, 0x3f82}, /* halfway between 0x3f81 and 0x3f82: to the even */
        {0x3f808001u, 0x3f81}, /* just above halfway */
        {0x3f807fffu, 0x3f80}, /* just below */
        {0xbf818000u, 0xbf82}, /* the same below zero */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds up to inf */
        {0x7f7f7fffu, 0x7f7f}, /* the largest that stays finite */
        {0x00000001u, 0x0000}, /* the smallest subnormal rounds to 0 */
        {0x00008000u, 0x0000}, /* halfway to the smallest bfloat16 subnormal: to even, 0 */
        {0x00018000u, 0x0002}, /* halfway, to the even 2 */
    };
    size_t i;
    ad_rng rng;
    int bad = 0, n;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x;
        memcpy(&x, &cases[i].in, 4);
        TH_CHECK(ad__bf16_bits(x) == cases[i].out, "bf16 of 0x%08x: 0x%04x, expected 0x%04x", cases[i].in,
                 ad__bf16_bits(x), cases[i].out);
    }
    {
        float nan_in = NAN, back;
        uint32_t u;
        back = bits_to_float(ad__bf16_bits(nan_in));
        TH_CHECK(back != back, "NaN rounds to a NaN");
        u = 0x7f800001u; /* a NaN whose payload is in the low bits only: must not become inf */
        memcpy(&nan_in, &u, 4);
        back = bits_to_float(ad__bf16_bits(nan_in));
        TH_CHECK(back != back, "a NaN with a low payload stays NaN (0x%04x)", ad__bf16_bits(nan_in));
    }
    /* random floats of every size, and values next to ties, against the reference */
    ad_rng_seed(&rng, 7);
    for (n = 0; n < (quick ? 20000 : 200000); n++) {
        uint32_t u = (uint32_t)ad_rng_below(&rng, 0xffffffffu);
        float x, want;
        if (n % 4 == 1) u = (u & 0xffff0000u) | 0x8000u; /* ties */
        if (n % 4 == 2) u = (u & 0xffff0000u) | (0x8000u + (uint32_t)(n & 1 ? 1 : -1));
        memcpy(&x, &u, 4);
        if (!isfinite(x) || fabsf(x) > 3.38e38f) continue;
        want = reference_round(x);
        if (rounded(x) != want && !(want == 0 && rounded(x) == 0)) {
            if (bad++ < 5) printf("  0x%08x: bf16 %a, reference %a\n", u, rounded(x), want);
        }
    }
    TH_CHECK(bad == 0, "%d random floats round unlike the reference", bad);
    th_family("bfloat16 rounding");
}

/* A matrix of rows x cols with values in [-1, 1), some of them larger or tiny. */
static void fill(float *x, size_t n, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) {
        x[i] = (float)(2 * ad_rng_uniform(rng) - 1);
        if (i % 11 == 3) x[i] *= 37.5f;
        if (i % 13 == 5) x[i] *= 1e-3f;
    }
}

/* Checks C (M x N, float) against sums in double of op(A) op(B)'s rounded operands: each element
   within 4 K 2^-24 of the sum of its products' magnitudes, the room float sums need. Returns the
   largest |C - reference| relative to that bound. */
static double check_product(const char *what, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                            const float *C)
{
    double worst = 0;
    int i, j, k, bad = 0;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double sum = 0, mag = 0, bound;
            for (k = 0; k < K; k++) {
                double a = rounded(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]);
                double b = rounded(tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
                sum += a * b;
                mag += fabs(a * b);
            }
            bound = 4.0 * K * ldexp(1.0, -24) * mag + 1e-30;
            if (fabs(C[(size_t)i * N + j] - sum) > bound) {
                if (bad++ < 3)
                    printf("  %s [%d,%d]: %.9g, rounded operands give %.9g (bound %.3g)\n", what, i, j,
                           C[(size_t)i * N + j], sum, bound);
            }
            if (fabs(C[(size_t)i * N + j] - sum) / bound > worst) worst = fabs(C[(size_t)i * N + j] - sum) / bound;
        }
    TH_CHECK(bad == 0, "%s %dx%dx%d ta %d tb %d: %d elements off the rounded operands' product", what, M, N, K, ta,
             tb, bad);
    return worst;
}

static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {8, 1, 300}, {1, 40, 515}, {300, 2, 3},
                                {64, 128, 784}, {129, 257, 65}, {64, 10, 128}, {31, 47, 257}, {200, 96, 530}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static ad__bf16_gemm_kernel kernel(ad__bf16_kernel fn, int mr, int nr, int a_by_rows, int pair_block)
{
    ad__bf16_gemm_kernel k;
    k.fn = fn, k.block = NULL, k.mr = mr, k.nr = nr, k.a_by_rows = a_by_rows, k.pair_block = pair_block;
    return k;
}

/* Every kernel this machine can run, on the packed path, against the rounded operands. */
static void test_kernels(void)
{
    ad__bf16_gemm_kernel kernels[5];
    const char *names[5];
    int nk = 0, s, t, k;
    ad_rng rng;
    float *A, *B, *C;
    ad_real *pack = (ad_real *)malloc(AD__PACK_PER_THREAD * sizeof(ad_real) + 64);
    ad_rng_seed(&rng, 11);
    kernels[nk] = kernel(ad__bf16_widen_generic, 4, AD__HAS_VECTOR_EXT ? 8 : 4, 0, 1);
    names[nk++] = "widening, generic";
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        kernels[nk] = kernel(ad__bf16_widen_avx2, 4, 16, 0, 1);
        names[nk++] = "widening, AVX2";
    }
    if (ad__isa() == AD__ISA_AVX512) {
        kernels[nk] = kernel(ad__bf16_widen_avx512, 8, 32, 0, 1);
        names[nk++] = "widening, AVX-512";
    }
#if AD__HAS_BF16_INSTRUCTION
    if (ad__isa_features() & AD__ISA_BF16) {
        kernels[nk] = kernel(ad__bf16_dot_avx512, 8, 32, 0, 1);
        names[nk++] = "AVX512-BF16 dot product";
    }
#endif
#if AD__HAS_AMX
    if (ad__amx_permitted()) {
        kernels[nk] = ad__bf16_pick(AD__BF16_AMX);
        names[nk++] = "AMX tiles";
    }
#endif
#endif
    A = (float *)malloc(300 * 800 * sizeof(float));
    B = (float *)malloc(800 * 300 * sizeof(float));
    C = (float *)malloc(300 * 300 * sizeof(float));
    if (!pack || !A || !B || !C) {
        TH_CHECK(0, "out of memory");
        return;
    }
    for (k = 0; k < nk; k++) {
        double worst = 0;
        for (s = 0; s < NSHAPES; s++)
            for (t = 0; t < 4; t += quick ? 3 : 1) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = t & 1, tb = t >> 1;
                double w;
                if ((size_t)M * K > 300 * 800 || (size_t)K * N > 800 * 300 || (size_t)M * N > 300 * 300) continue;
                fill(A, (size_t)M * K, &rng);
                fill(B, (size_t)K * N, &rng);
                ad__gemm_serial_bf16(kernels[k], pack, pack + (size_t)AD__MC * AD__KC, ta, tb, M, N, K, A,
                                     ta ? M : K, B, tb ? K : N, C, N, 0);
                w = check_product(names[k], ta, tb, M, N, K, A, B, C);
                if (w > worst) worst = w;
            }
        printf("  %-28s largest error %.2f of the bound\n", names[k], worst);
    }
    free(A);
    free(B);
    free(C);
    free(pack);
    th_family("bfloat16 kernels");
}

/* A leaf with values from fill, requiring grad when grad is set. */
static ad_tensor *leaf(ad_tape *T, int ndim, const int *shape, ad_rng *rng, int grad)
{
    ad_tensor *t = ad_tensor_new(T, ndim, shape, NULL, grad);
    if (t) fill(t->data, t->size, rng);
    return t;
}

static ad_tensor *random_tensor(ad_tape *T, int ndim, const int *shape, ad_rng *rng)
{
    return leaf(T, ndim, shape, rng, 0);
}

/* ad_matmul_t, with every transpose, through the tape (threads, the small-product path). */
static void test_matmul(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int s, t;
    ad_rng_seed(&rng, 3);
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == AD_MATMUL_FLOAT32, "the default is float32");
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_BFLOAT16, "the setting reads back");
    for (s = 0; s < NSHAPES; s++)
        for (t = 0; t < 4; t++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = t & 1, tb = t >> 1;
            int sa[2], sb[2];
            ad_tensor *a, *b, *c;
            sa[0] = ta ? K : M, sa[1] = ta ? M : K;
            sb[0] = tb ? N : K, sb[1] = tb ? K : N;
            a = random_tensor(T, 2, sa, &rng);
            b = random_tensor(T, 2, sb, &rng);
            c = ad_matmul_t(T, a, b, ta, tb);
            TH_CHECK(c != NULL, "matmul: %s", th_errs(T));
            if (c) check_product("ad_matmul_t", ta, tb, M, N, K, a->data, b->data, c->data);
            ad_tape_reset(T);
        }
    ad_tape_free(T);
    th_family("ad_matmul_t in bfloat16");
}

/* ad_linear's forward and both gradients, each a product of rounded operands; and the float
   results differ, so the rounding took place. */
static void test_linear(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int shape_x[2] = {37, 91}, shape_w[2] = {91, 29};
    ad_tensor *x, *W, *y, *loss;
    float *xs, *ws, *g, *float_y;
    size_t i;
    double differ = 0;
    ad_rng_seed(&rng, 5);
    ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
    x = leaf(T, 2, shape_x, &rng, 1);
    W = leaf(T, 2, shape_w, &rng, 1);
    y = ad_linear(T, x, W, NULL);
    /* the loss sum(y * y / 2) sends y itself back as y's gradient */
    loss = ad_div_scalar(T, ad_sum(T, ad_mul(T, y, y)), 2);
    TH_CHECK(loss && ad_backward(T, loss) == 0, "linear: %s", th_errs(T));
    if (!loss) {
        ad_tape_free(T);
        return;
    }
    check_product("ad_linear forward", 0, 0, 37, 29, 91, x->data, W->data, y->data);
    g = y->data; /* the incoming gradient */
    check_product("ad_linear dx = g W^T", 0, 1, 37, 91, 29, g, W->data, x->grad);
    check_product("ad_linear dW = x^T g", 1, 0, 91, 29, 37, x->data, g, W->grad);
    xs = x->data, ws = W->data;
    float_y = (float *)malloc(37 * 29 * sizeof(float));
    for (i = 0; float_y && i < 37 * 29; i++) {
        double sum = 0;
        int k;
        for (k = 0; k < 91; k++) sum += (double)xs[i / 29 * 91 + k] * ws[k * 29 + i % 29];
        float_y[i] = (float)sum;
        if (fabs(sum - y->data[i]) > differ) differ = fabs(sum - y->data[i]);
    }
    TH_CHECK(differ > 1e-3, "the bfloat16 product differs from the float one (largest difference %g)", differ);
    free(float_y);
    ad_tape_free(T);
    th_family("ad_linear in bfloat16");
}

/* The same bits on 1, 2 and 3 threads: products split into stripes, along K, and the
   convolution's images split over threads. */
static void test_threads(void)
{
    static const int prods[][3] = {{300, 520, 700}, {64, 128, 784}, {520, 64, 300}};
    int p, threads;
    for (p = 0; p < 3; p++) {
        float *first = NULL;
        size_t n = (size_t)prods[p][0] * prods[p][1];
        for (threads = 1; threads <= 3; threads++) {
            ad_tape *T = ad_tape_new();
            ad_rng rng;
            int sa[2] = {prods[p][0], prods[p][2]}, sb[2] = {prods[p][2], prods[p][1]};
            ad_tensor *c;
            ad_rng_seed(&rng, 9);
            ad_set_threads(T, threads);
            ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
            c = ad_matmul(T, random_tensor(T, 2, sa, &rng), random_tensor(T, 2, sb, &rng));
            TH_CHECK(c != NULL, "matmul: %s", th_errs(T));
            if (c && !first) {
                first = (float *)malloc(n * sizeof(float));
                if (first) memcpy(first, c->data, n * sizeof(float));
            } else if (c && first) {
                TH_CHECK(memcmp(first, c->data, n * sizeof(float)) == 0, "%dx%dx%d: %d threads differ from one",
                         prods[p][0], prods[p][1], prods[p][2], threads);
            }
            ad_tape_free(T);
        }
        free(first);
    }
    {
        float *first = NULL;
        size_t n = 0;
        for (threads = 1; threads <= 3; threads++) {
            ad_tape *T = ad_tape_new();
            ad_rng rng;
            int sx[4] = {6, 3, 19, 17}, sw[4] = {8, 3, 5, 5};
            ad_tensor *x, *w, *y;
            ad_rng_seed(&rng, 13);
            ad_set_threads(T, threads);
            ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
            x = random_tensor(T, 4, sx, &rng);
            w = leaf(T, 4, sw, &rng, 1);
            y = ad_conv2d(T, x, w, NULL, NULL);
            TH_CHECK(y && ad_backward(T, ad_sum(T, y)) == 0, "conv2d: %s", th_errs(T));
            if (y && !first) {
                n = w->size;
                first = (float *)malloc(n * sizeof(float));
                if (first) memcpy(first, w->grad, n * sizeof(float));
            } else if (y && first) {
                TH_CHECK(memcmp(first, w->grad, n * sizeof(float)) == 0, "conv2d's weight gradient: %d threads differ",
                         threads);
            }
            ad_tape_free(T);
        }
        free(first);
    }
    th_family("bfloat16 on 1, 2 and 3 threads");
}

/* The convolution and the attention in bfloat16 stay within bfloat16's rounding of their float
   results, and differ from them. */
static void test_ops_near_float(void)
{
    int pass;
    float *ref[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    double worst[2] = {0, 0}, scale[2] = {0, 0};
    for (pass = 0; pass < 2; pass++) {
        ad_tape *T = ad_tape_new();
        ad_rng rng;
        int sx[4] = {2, 4, 13, 11}, sw[4] = {5, 4, 3, 3}, sq[4] = {2, 3, 37, 16};
        ad_tensor *outs[2];
        int o;
        ad_rng_seed(&rng, 17);
        if (pass) ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
        outs[0] = ad_conv2d(T, random_tensor(T, 4, sx, &rng), random_tensor(T, 4, sw, &rng), NULL, NULL);
        /* scores of moderate size: bfloat16 moves each by about 2^-8 of its terms, which a
           softmax of large scores turns into large changes of its weights */
        outs[1] = ad_attention(T, ad_tanh(T, random_tensor(T, 4, sq, &rng)), ad_tanh(T, random_tensor(T, 4, sq, &rng)),
                               random_tensor(T, 4, sq, &rng), 1, 0.25f);
        TH_CHECK(outs[0] && outs[1], "conv2d, attention: %s", th_errs(T));
        for (o = 0; o < 2 && outs[0] && outs[1]; o++) {
            size_t i;
            if (!pass) {
                n[o] = outs[o]->size;
                ref[o] = (float *)malloc(n[o] * sizeof(float));
                if (ref[o]) memcpy(ref[o], outs[o]->data, n[o] * sizeof(float));
                continue;
            }
            for (i = 0; ref[o] && i < n[o]; i++) {
                double d = fabs(outs[o]->data[i] - ref[o][i]);
                if (d > worst[o]) worst[o] = d;
                if (fabs(ref[o][i]) > scale[o]) scale[o] = fabs(ref[o][i]);
            }
        }
        ad_tape_free(T);
    }
    TH_CHECK(worst[0] > 0 && worst[0] < 0.02 * scale[0], "conv2d: bfloat16 against float %g (largest value %g)",
             worst[0], scale[0]);
    TH_CHECK(worst[1] > 0 && worst[1] < 0.02 * scale[1], "attention: bfloat16 against float %g (largest value %g)",
             worst[1], scale[1]);
    free(ref[0]);
    free(ref[1]);
    th_family("conv2d and attention in bfloat16");
}
#endif /* AD__GEMM_BF16 */

static void test_setting(void)
{
    ad_tape *T = ad_tape_new();
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_FLOAT32, "a new tape computes products in float");
    TH_CHECK(ad_set_matmul_precision(T, 7) == -1, "an unknown precision is refused");
    TH_CHECK_ERROR(T, "ad_set_matmul_precision: unknown precision 7");
    ad_tape_clear_error(T);
#if AD__GEMM_BF16
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == AD_MATMUL_FLOAT32, "set: the previous setting");
    ad_tape_reset(T);
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_BFLOAT16, "the setting lasts across resets");
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_FLOAT32) == AD_MATMUL_BFLOAT16, "and goes back to float");
#else
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == -1, "bfloat16 is refused in double builds");
    TH_CHECK_ERROR(T, "AUTODIFF_DOUBLE");
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_FLOAT32, "and the tape stays in double");
#endif
    TH_CHECK(ad_set_matmul_precision(NULL, AD_MATMUL_FLOAT32) == -1, "a NULL tape");
    ad_tape_free(T);
    th_family("ad_set_matmul_precision");
}

int main(void)
{
    quick = getenv("TH_QUICK") != NULL;
    test_setting();
#if AD__GEMM_BF16
    test_rounding();
    test_kernels();
    test_matmul();
    test_linear();
    test_threads();
    test_ops_near_float();
#endif
    return th_summary();
}
