/* The tape: a deep chain with shared subexpressions, allocation behaviour through a counting
   allocator, no-grad mode, reset, tensors of two tapes, caller-owned leaves, the arena, the
   single-precision matrix product and its bfloat16 form, the optimizers in single precision and
   the accuracy of exp, log, sigmoid, tanh and softmax in single precision, layer norm's rows at
   AVX2's width and 2x2 max pooling, its gradient and col2im at AVX-512's against the portable
   ones, and gradients that the sweep computes in place. Built in the default precision (float),
   as most programs use it. */
#include <float.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

/* A counting allocator through the library's allocator macros. The thread pool's workers free
   their start-up arguments, so the counters are updated atomically. */
static long count_allocs; /* successful malloc, and realloc of NULL */
static long count_live;   /* blocks allocated and not yet freed */
static void *count_malloc(size_t n)
{
    void *p = malloc(n);
    if (p) {
        __atomic_fetch_add(&count_allocs, 1, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&count_live, 1, __ATOMIC_SEQ_CST);
    }
    return p;
}
static void *count_realloc(void *old, size_t n)
{
    void *p = realloc(old, n);
    if (p && !old) {
        __atomic_fetch_add(&count_allocs, 1, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&count_live, 1, __ATOMIC_SEQ_CST);
    } else if (p && p != old) {
        __atomic_fetch_add(&count_allocs, 1, __ATOMIC_SEQ_CST);
    }
    return p;
}
static void count_free(void *p)
{
    if (p) __atomic_fetch_sub(&count_live, 1, __ATOMIC_SEQ_CST);
    free(p);
}
#define AUTODIFF_MALLOC(sz) count_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) count_realloc(p, sz)
#define AUTODIFF_FREE(p) count_free(p)
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "tests/harness.h"

/* The tape's error for a message: "(none)" when there is none. */
static long allocs(void) { return __atomic_load_n(&count_allocs, __ATOMIC_SEQ_CST); }
static long live(void) { return __atomic_load_n(&count_live, __ATOMIC_SEQ_CST); }

/* (a) x_{i+1} = x_i + h (0.5 x_i sin(x_i) - 0.1 x_i^2 + a cos(x_i)): each level reads x_i along
   five routes, so the number of routes from the end to x_0 is 5^2000; the sweep visits each
   entry once. The gradient is checked against forward-mode recurrences over the tape's own
   values: d_i = dx_i/dx_0 (per element) and e_i = dx_i/da. */
#define CHAIN 2000
static void test_chain(void)
{
    ad_tape *T = ad_tape_new();
    static ad_tensor *xs[CHAIN + 1];
    const double h = 0.001;
    float x0v[] = {0.3f, -1.2f, 2.0f, 0.05f};
    int s4[] = {4}, i, j, ok = 1;
    ad_tensor *a = ad_var(T, 0.8f), *loss;
    double d[4] = {1, 1, 1, 1}, e[4] = {0, 0, 0, 0}, ga = 0, worst = 0;
    clock_t t0;
    xs[0] = ad_tensor_new(T, 1, s4, x0v, 1);
    for (i = 0; i < CHAIN; i++) {
        ad_tensor *x = xs[i];
        ad_tensor *r = ad_add(T, ad_sub(T, ad_mul_scalar(T, ad_mul(T, x, ad_sin(T, x)), 0.5f),
                                        ad_mul_scalar(T, ad_mul(T, x, x), 0.1f)),
                              ad_mul(T, a, ad_cos(T, x)));
        xs[i + 1] = ad_add(T, x, ad_mul_scalar(T, r, (float)h));
    }
    loss = ad_sum(T, xs[CHAIN]);
    TH_CHECK(loss != NULL, "chain forward: %s", th_errs(T));
    TH_CHECK(ad_tape_length(T) == (size_t)CHAIN * 11 + 1, "chain: %zu entries recorded", ad_tape_length(T));
    t0 = clock();
    TH_CHECK(ad_backward(T, loss) == 0, "chain backward: %s", th_errs(T));
    printf("chain of %d levels (%zu entries): backward %.1f ms, arena peak %.1f MiB\n", CHAIN,
           ad_tape_length(T), 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC,
           (double)ad_tape_bytes_peak(T) / (1 << 20));
    for (i = 0; i < CHAIN; i++)
        for (j = 0; j < 4; j++) {
            double x = xs[i]->data[j];
            double f = 1 + h * (0.5 * (sin(x) + x * cos(x)) - 0.2 * x - ad_item(a) * sin(x));
            e[j] = e[j] * f + h * cos(x);
            d[j] *= f;
        }
    for (j = 0; j < 4; j++) {
        double err = fabs(xs[0]->grad[j] - d[j]) / fabs(d[j]);
        if (err > worst) worst = err;
        ga += e[j];
        if (!(fabs(d[j]) > 1e-3 && fabs(d[j]) < 1e3)) ok = 0; /* the check means something */
    }
    TH_CHECK(ok, "chain: the recurrence's gradients are degenerate");
    TH_CHECK(worst < 1e-4, "chain: d x_N / d x_0 off by %g relative", worst);
    TH_CHECK(fabs(ad_grad_item(a) - ga) < 1e-4 * fabs(ga), "chain: d loss / da = %.8g, recurrence %.8g",
             (double)ad_grad_item(a), ga);
    ad_tape_free(T);
}

/* (b) a training-shaped loop allocates nothing after its first step and frees everything. */
static void test_allocations(void)
{
    enum { N = 64, IN = 100, HID = 50, OUT = 10, STEPS = 6 };
    int sx[] = {N, IN}, sw1[] = {IN, HID}, sb1[] = {HID}, sw2[] = {HID, OUT}, labels[N], step, i;
    float *w1 = (float *)calloc(IN * HID, sizeof(float)), *gw1 = (float *)calloc(IN * HID, sizeof(float));
    float *b1 = (float *)calloc(HID, sizeof(float)), *gb1 = (float *)calloc(HID, sizeof(float));
    float *w2 = (float *)calloc(HID * OUT, sizeof(float)), *gw2 = (float *)calloc(HID * OUT, sizeof(float));
    float *xb = (float *)malloc(N * IN * sizeof(float));
    long before = live(), after_first = 0, live_first = 0;
    float first_loss = 0;
    ad_rng rng;
    ad_tape *T;
    ad_rng_seed(&rng, 3);
    for (i = 0; i < IN * HID; i++) w1[i] = (float)(ad_rng_uniform(&rng) - 0.5) * 0.2f;
    for (i = 0; i < HID * OUT; i++) w2[i] = (float)(ad_rng_uniform(&rng) - 0.5) * 0.2f;
    for (i = 0; i < N * IN; i++) xb[i] = (float)ad_rng_uniform(&rng);
    for (i = 0; i < N; i++) labels[i] = i % OUT;
    T = ad_tape_new();
    for (step = 0; step < STEPS; step++) {
        ad_tensor *x = ad_tensor_new(T, 2, sx, xb, 0);
        ad_tensor *W1 = ad_tensor_view(T, 2, sw1, w1, gw1, 1), *B1 = ad_tensor_view(T, 1, sb1, b1, gb1, 1);
        ad_tensor *W2 = ad_tensor_view(T, 2, sw2, w2, gw2, 1);
        ad_tensor *h = ad_relu(T, ad_linear(T, x, W1, B1));
        ad_tensor *loss = ad_cross_entropy(T, ad_matmul(T, h, W2), labels);
        int rc = ad_backward(T, loss);
        TH_CHECK(loss && rc == 0, "step %d: %s", step, th_errs(T));
        if (step == 0) first_loss = ad_item(loss);
        /* plain SGD on the caller's buffers */
        for (i = 0; i < IN * HID; i++) { w1[i] -= 0.5f * gw1[i]; gw1[i] = 0; }
        for (i = 0; i < HID; i++) { b1[i] -= 0.5f * gb1[i]; gb1[i] = 0; }
        for (i = 0; i < HID * OUT; i++) { w2[i] -= 0.5f * gw2[i]; gw2[i] = 0; }
        if (step == STEPS - 1)
            TH_CHECK(ad_item(loss) < first_loss, "training does not lower the loss: %g -> %g", first_loss,
                     (double)ad_item(loss));
        ad_tape_reset(T);
        if (step == 0) {
            after_first = allocs();
            live_first = live(); /* (a worker of the thread pool may still be starting) */
        }
    }
    TH_CHECK(allocs() == after_first, "%ld allocations after the first step", allocs() - after_first);
    TH_CHECK(live_first > before, "the allocator macros were not used");
    ad_tape_free(T);
    TH_CHECK(live() == before, "ad_tape_free left %ld blocks", live() - before);
    free(w1); free(gw1); free(b1); free(gb1); free(w2); free(gw2); free(xb);
}

/* (c) no-grad mode computes the same values and records nothing. */
static ad_tensor *small_net(ad_tape *T, ad_tensor *x, ad_tensor *W, ad_tensor *b)
{
    return ad_softmax(T, ad_tanh(T, ad_add(T, ad_matmul(T, x, W), b)), -1);
}

static void test_no_grad(void)
{
    ad_tape *T = ad_tape_new();
    int sx[] = {5, 7}, sw[] = {7, 3}, sb[] = {3};
    ad_rng rng;
    ad_tensor *x, *W, *b, *y1, *y2;
    size_t len;
    int prev;
    ad_rng_seed(&rng, 9);
    x = ad_rand(T, 2, sx, -1, 1, &rng);
    W = ad_rand(T, 2, sw, -1, 1, &rng);
    b = ad_rand(T, 1, sb, -1, 1, &rng);
    ad_set_requires_grad(W, 1);
    ad_set_requires_grad(b, 1);
    y1 = small_net(T, x, W, b);
    len = ad_tape_length(T);
    TH_CHECK(len == 4 && y1->requires_grad, "grad mode: %zu entries", len);
    prev = ad_set_grad_enabled(T, 0);
    TH_CHECK(prev == 1, "grad was not enabled by default");
    y2 = small_net(T, x, W, b);
    TH_CHECK(ad_tape_length(T) == len, "no-grad mode recorded %zu entries", ad_tape_length(T) - len);
    TH_CHECK(y2 && !y2->requires_grad, "a no-grad result requires grad");
    TH_CHECK(y2 && y1->size == y2->size && memcmp(y1->data, y2->data, y1->size * sizeof(ad_real)) == 0,
             "no-grad values differ from recorded ones");
    TH_CHECK(ad_backward(T, ad_sum(T, y2)) == 0 && W->grad == NULL, "backward from a no-grad result touched W");
    TH_CHECK(ad_set_grad_enabled(T, 1) == 0, "set_grad_enabled did not return the previous setting");
    ad_tape_free(T);
    /* from a fresh tape: nothing recorded at all */
    T = ad_tape_new();
    ad_set_grad_enabled(T, 0);
    {
        ad_tensor *v = ad_var(T, 2);
        ad_tensor *y = ad_exp(T, ad_mul(T, v, v));
        TH_CHECK(ad_tape_length(T) == 0 && y && fabs(ad_item(y) - exp(4.0)) < 1e-3 * exp(4.0),
                 "no-grad from the start: %zu entries", ad_tape_length(T));
    }
    ad_tape_free(T);
}

/* (d) reset clears the error and the arena's use, and keeps its peak. */
static void test_reset(void)
{
    ad_tape *T = ad_tape_new();
    int s[] = {300, 300}, bad[] = {4, 5};
    size_t peak;
    ad_tensor *a = ad_ones(T, 2, s), *y;
    y = ad_add(T, a, ad_ones(T, 2, bad));
    TH_CHECK(y == NULL && ad_tape_error(T) != NULL, "a broadcasting clash gave no error");
    TH_CHECK(ad_tape_bytes_used(T) >= 300 * 300 * sizeof(ad_real), "bytes used %zu", ad_tape_bytes_used(T));
    peak = ad_tape_bytes_peak(T);
    TH_CHECK(peak >= ad_tape_bytes_used(T), "peak below use");
    ad_tape_reset(T);
    TH_CHECK(ad_tape_error(T) == NULL, "reset kept the error");
    TH_CHECK(ad_tape_bytes_used(T) == 0, "bytes used after reset: %zu", ad_tape_bytes_used(T));
    TH_CHECK(ad_tape_bytes_peak(T) == peak, "peak changed by reset: %zu -> %zu", peak, ad_tape_bytes_peak(T));
    TH_CHECK(ad_tape_length(T) == 0, "entries after reset");
    /* the tape works on after the reset, and the peak only grows */
    {
        ad_tensor *v = ad_var(T, 3);
        TH_CHECK(ad_backward(T, ad_mul(T, v, v)) == 0 && ad_grad_item(v) == 6, "tape after reset");
        TH_CHECK(ad_tape_bytes_peak(T) == peak, "peak after a small step");
    }
    /* clear_error keeps everything else */
    {
        ad_tensor *v = ad_var(T, 1.5f);
        size_t used;
        ad_sum_axis(T, v, 0, 0);
        TH_CHECK(ad_tape_error(T) != NULL, "no error for an axis of a scalar");
        used = ad_tape_bytes_used(T);
        ad_tape_clear_error(T);
        TH_CHECK(ad_tape_error(T) == NULL && ad_tape_bytes_used(T) == used && ad_item(v) == 1.5f,
                 "clear_error changed the tape");
        TH_CHECK(ad_backward(T, ad_square(T, v)) == 0 && ad_grad_item(v) == 3, "tape after clear_error");
    }
    ad_tape_free(T);
}

/* (e) every op refuses tensors of another tape. */
static void test_two_tapes(void)
{
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    int s23[] = {2, 3}, s32[] = {3, 2}, s3[] = {3}, labels[] = {0, 1};
    ad_tensor *a = ad_ones(T, 2, s23), *b = ad_ones(U, 2, s23), *bt = ad_ones(U, 2, s32);
    ad_tensor *W = ad_ones(U, 2, s32), *v3 = ad_ones(U, 1, s3), *xs[2];
    ad_tensor *y = ad_var(U, 1);
    int perm[] = {1, 0};
    size_t len;
#define EXPECT_OTHER_TAPE(call)                                                                         \
    do {                                                                                                \
        ad_tape_clear_error(T);                                                                         \
        len = ad_tape_length(T);                                                                        \
        TH_CHECK((call) == NULL, "%s accepted a tensor of another tape", #call);                        \
        TH_CHECK_ERROR(T, "another tape");                                                              \
        TH_CHECK(ad_tape_length(T) == len, "%s recorded an entry", #call);                              \
    } while (0)
    ad_set_requires_grad(b, 1);
    ad_set_requires_grad(v3, 1);
    EXPECT_OTHER_TAPE(ad_add(T, a, b));
    EXPECT_OTHER_TAPE(ad_mul(T, b, a));
    EXPECT_OTHER_TAPE(ad_maximum(T, a, b));
    EXPECT_OTHER_TAPE(ad_exp(T, b));
    EXPECT_OTHER_TAPE(ad_relu(T, b));
    EXPECT_OTHER_TAPE(ad_clamp(T, b, 0, 1));
    EXPECT_OTHER_TAPE(ad_mul_scalar(T, b, 2));
    EXPECT_OTHER_TAPE(ad_sum(T, b));
    EXPECT_OTHER_TAPE(ad_max_axis(T, b, 0, 0));
    EXPECT_OTHER_TAPE(ad_reshape(T, b, 2, s32));
    EXPECT_OTHER_TAPE(ad_flatten(T, b));
    EXPECT_OTHER_TAPE(ad_transpose(T, b, 0, 1));
    EXPECT_OTHER_TAPE(ad_permute(T, b, perm));
    xs[0] = a;
    xs[1] = b;
    EXPECT_OTHER_TAPE(ad_concat(T, xs, 2, 0));
    EXPECT_OTHER_TAPE(ad_slice(T, b, 1, 0, 2));
    EXPECT_OTHER_TAPE(ad_broadcast_to(T, v3, 2, s23));
    EXPECT_OTHER_TAPE(ad_sum_to(T, b, 1, s3));
    EXPECT_OTHER_TAPE(ad_matmul(T, a, bt));
    EXPECT_OTHER_TAPE(ad_matmul_t(T, a, b, 0, 1));
    EXPECT_OTHER_TAPE(ad_linear(T, a, W, NULL));
    EXPECT_OTHER_TAPE(ad_softmax(T, b, 1));
    EXPECT_OTHER_TAPE(ad_log_softmax(T, b, 1));
    EXPECT_OTHER_TAPE(ad_cross_entropy(T, b, labels));
    EXPECT_OTHER_TAPE(ad_mse(T, a, b));
    EXPECT_OTHER_TAPE(ad_bce_with_logits(T, a, b));
    EXPECT_OTHER_TAPE(ad_grad(T, ad_sum(T, a), b, 0));
#undef EXPECT_OTHER_TAPE
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, y) == -1, "ad_backward accepted y of another tape");
    TH_CHECK_ERROR(T, "another tape");
    TH_CHECK(ad_tape_error(U) == NULL, "the other tape got an error: %s", th_errs(U));
    ad_tape_free(T);
    ad_tape_free(U);
}

/* (f) caller-owned leaves: values are not copied and gradients add into the caller's buffer. */
static void test_views(void)
{
    ad_tape *T = ad_tape_new();
    ad_real data[6] = {1, 2, 3, 4, 5, 6}, grad[6] = {10, 10, 10, 10, 10, 10}, wv[6] = {1, -1, 2, -2, 3, -3};
    int s23[] = {2, 3}, i, ok = 1;
    ad_tensor *x = ad_tensor_view(T, 2, s23, data, grad, 1), *w = ad_tensor_new(T, 2, s23, wv, 0), *loss;
    TH_CHECK(x->data == data && x->grad == grad, "view copied the caller's memory");
    loss = ad_sum(T, ad_mul(T, ad_square(T, x), w)); /* d/dx = 2 x w */
    TH_CHECK(ad_backward(T, loss) == 0, "backward: %s", th_errs(T));
    for (i = 0; i < 6; i++) ok &= grad[i] == 10 + 2 * data[i] * wv[i];
    TH_CHECK(ok, "the gradient did not add into the caller's buffer");
    TH_CHECK(ad_backward(T, loss) == 0, "second backward");
    for (i = 0; i < 6; i++) ok &= grad[i] == 10 + 4 * data[i] * wv[i];
    TH_CHECK(ok, "a second backward did not add again");
    /* the data pointer is the caller's: a write shows through */
    data[0] = 7;
    TH_CHECK(x->data[0] == 7, "view data is a copy");
    /* the tape does not free the caller's buffers */
    ad_tape_reset(T);
    TH_CHECK(grad[0] == 10 + 4 * 1 * 1, "reset touched the caller's gradient");
    /* a view without a gradient buffer gets one on the tape */
    x = ad_tensor_view(T, 2, s23, data, NULL, 1);
    TH_CHECK(ad_backward(T, ad_sum(T, x)) == 0 && x->grad != NULL && x->grad != grad && x->grad[5] == 1,
             "view without a gradient buffer");
    /* the same buffers viewed twice in one graph (a weight shared by two layers): both
       contributions arrive */
    {
        ad_real d2[3] = {0.5f, -1, 2}, g2[3] = {1, 1, 1};
        int s3[] = {3};
        ad_tensor *p = ad_tensor_view(T, 1, s3, d2, g2, 1), *q = ad_tensor_view(T, 1, s3, d2, g2, 1);
        ad_tensor *f = ad_add(T, ad_sum(T, ad_mul(T, p, ad_exp(T, q))), ad_sum(T, ad_square(T, q)));
        TH_CHECK(ad_backward(T, f) == 0, "backward with a shared view");
        ok = 1;
        for (i = 0; i < 3; i++) {
            double e = exp((double)d2[i]), want = 1 + e + d2[i] * e + 2 * d2[i];
            ok &= fabs(g2[i] - want) < 1e-5 * fabs(want);
        }
        TH_CHECK(ok, "a buffer viewed twice: %g %g %g", (double)g2[0], (double)g2[1], (double)g2[2]);
    }
    /* a view that does not require grad receives nothing */
    x = ad_tensor_view(T, 2, s23, data, grad, 0);
    TH_CHECK(ad_backward(T, ad_sum(T, ad_mul(T, x, ad_tensor_new(T, 2, s23, wv, 1)))) == 0 &&
                 grad[0] == 10 + 4 * 1 * 1,
             "a view without requires_grad got a gradient");
    ad_tape_free(T);
}

/* (g) the arena: tensors larger than a chunk, data that never moves, alignment, reuse. */
static int arena_round(ad_tape *T, int round)
{
    enum { MANY = 40 };
    int big[] = {700, 500}, small[] = {3, 7}, huge[] = {1100, 1000}, i, ok = 1;
    ad_tensor *ts[MANY], *s;
    for (i = 0; i < MANY; i++) {
        /* small blocks, blocks above the 1 MiB chunk size, and larger ones, interleaved in an
           order that depends on the round */
        int kind = (i + round) % 4;
        if (kind == 0) ts[i] = ad_full(T, 2, big, (ad_real)i);
        else if (kind == 3 && i % 8 == 3) ts[i] = ad_full(T, 2, huge, (ad_real)i);
        else ts[i] = ad_full(T, 2, small, (ad_real)i);
        if (!ts[i] || ((uintptr_t)ts[i]->data & 63) != 0) ok = 0;
    }
    TH_CHECK(ok, "round %d: allocation failed or data not 64-byte aligned", round);
    /* nothing was overwritten: every tensor still holds its own index */
    for (i = 0; ok && i < MANY; i++) {
        size_t j;
        for (j = 0; j < ts[i]->size; j++)
            if (ts[i]->data[j] != (ad_real)i) { ok = 0; break; }
    }
    TH_CHECK(ok, "round %d: a tensor was overwritten by a later one", round);
    s = ad_sum(T, ad_ones(T, 2, huge));
    TH_CHECK(s && ad_item(s) == 1100000.0f, "sum of a %d x %d tensor: %g", huge[0], huge[1], (double)ad_item(s));
    return ok;
}

static void test_arena(void)
{
    ad_tape *T = ad_tape_new();
    long settled;
    size_t used;
    int round;
    /* the same sequence every round: nothing is allocated after the first */
    arena_round(T, 0);
    used = ad_tape_bytes_used(T);
    ad_tape_reset(T);
    settled = allocs();
    for (round = 0; round < 3; round++) {
        arena_round(T, 0);
        TH_CHECK(ad_tape_bytes_used(T) == used, "the same round used %zu bytes, then %zu", used, ad_tape_bytes_used(T));
        ad_tape_reset(T);
    }
    TH_CHECK(allocs() == settled, "a repeated round allocated %ld more blocks", allocs() - settled);
    /* a sequence that changes with period 4: the kept chunks settle within a few periods */
    for (round = 1; round < 12; round++) {
        arena_round(T, round);
        ad_tape_reset(T);
    }
    settled = allocs();
    for (round = 12; round < 20; round++) {
        arena_round(T, round);
        ad_tape_reset(T);
    }
    TH_CHECK(allocs() == settled, "a periodic sequence kept allocating: %ld more blocks", allocs() - settled);
    TH_CHECK(ad_tape_bytes_peak(T) >= (size_t)1100 * 1000 * sizeof(ad_real), "peak %zu", ad_tape_bytes_peak(T));
    ad_tape_free(T);
}

/* Element (r, c) of op(A) op(B) in double, the K values of op(A) ta-transposed with rows lda
   apart and of op(B) likewise; into *mag the sum of the products' magnitudes, for the bound
   |c - ref| <= K u sum |a| |b|. */
static double gemm_reference(int ta, int tb, int k, const float *A, int lda, const float *B, int ldb, int r, int c,
                             double *mag)
{
    double ref = 0;
    int p;
    *mag = 0;
    for (p = 0; p < k; p++) {
        double u = ta ? A[p * lda + r] : A[r * lda + p], v = tb ? B[c * ldb + p] : B[p * ldb + c];
        ref += u * v;
        *mag += fabs(u * v);
    }
    return ref;
}

/* (h) the single-precision GEMM against a double-precision reference, within the classic
   error bound |c - ref| <= K u sum |a| |b| (u the unit roundoff), on both sides of the
   small-product threshold, the register tile, the cache blocks and the thread split. */
static void test_float_matmul(void)
{
    static const int sizes[][3] = {{1, 1, 1},   {3, 300, 7},   {13, 17, 255}, {12, 33, 257}, {8, 64, 1},
                                   {64, 10, 50}, {145, 19, 41}, {200, 130, 300}, {5, 2100, 3},
                                   {67, 13, 300}, {150, 16, 40}, {9, 5, 17}, {70, 12, 300}, {40, 11, 5},
                                   {150, 2200, 40}};
    ad_rng rng;
    size_t i;
    int ta, tb;
    ad_rng_seed(&rng, 12);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++) {
                int m = sizes[i][0], n = sizes[i][1], k = sizes[i][2], sa[2], sb[2], r, c, ok = 1;
                ad_tape *T = ad_tape_new();
                ad_tensor *a, *b, *y;
                sa[0] = ta ? k : m; sa[1] = ta ? m : k;
                sb[0] = tb ? n : k; sb[1] = tb ? k : n;
                a = ad_rand(T, 2, sa, -1, 1, &rng);
                b = ad_rand(T, 2, sb, -1, 1, &rng);
                y = ad_matmul_t(T, a, b, ta, tb);
                for (r = 0; ok && y && r < m; r++)
                    for (c = 0; c < n; c++) {
                        double mag, ref = gemm_reference(ta, tb, k, a->data, ta ? m : k, b->data, tb ? k : n, r, c, &mag);
                        if (fabs(y->data[r * n + c] - ref) > k * 6e-8 * mag + 1e-30) { ok = 0; break; }
                    }
                TH_CHECK(y && ok, "float matmul_t m=%d n=%d k=%d ta=%d tb=%d is off", m, n, k, ta, tb);
                ad_tape_free(T);
            }
}

/* (h2) ad__gemm itself on products with few columns, the shapes its narrow and column kernels
   take (N up to a vector and a bit over, ragged M, K over the cache block), with and without
   accumulating, every transpose. B is allocated to its exact size, so a read past its end shows
   under AddressSanitizer; C sits in a wider array whose other columns must stay untouched.
   Each result is held to the same bound as (h), and on three threads must equal one thread's
   bit for bit. */
static int gemm_case_ok(ad_tape *T, ad_rng *rng, int ta, int tb, int m, int n, int k, int accumulate,
                        int padded_ldb, float *out)
{
    const float sentinel = 12345.0f;
    int lda = ta ? m : k, ldb = (tb ? k : n) + padded_ldb, ldc = n + 3, rows_b = tb ? n : k, r, c, ok = 1;
    float *A = (float *)malloc((size_t)(ta ? k : m) * lda * sizeof(float));
    float *B = (float *)malloc(((size_t)(rows_b - 1) * ldb + (tb ? k : n)) * sizeof(float));
    float *C = (float *)malloc((size_t)m * ldc * sizeof(float)), *C0 = (float *)malloc((size_t)m * ldc * sizeof(float));
    if (!A || !B || !C || !C0) {
        free(A); free(B); free(C); free(C0);
        return 0;
    }
    for (r = 0; r < (ta ? k : m) * lda; r++) A[r] = (float)(2 * ad_rng_uniform(rng) - 1);
    for (r = 0; r < (rows_b - 1) * ldb + (tb ? k : n); r++) B[r] = (float)(2 * ad_rng_uniform(rng) - 1);
    for (r = 0; r < m; r++)
        for (c = 0; c < ldc; c++) C[r * ldc + c] = c < n ? (float)(2 * ad_rng_uniform(rng) - 1) : sentinel;
    memcpy(C0, C, (size_t)m * ldc * sizeof(float));
    if (ad__gemm(T, ta, tb, m, n, k, A, lda, B, ldb, C, ldc, accumulate) != 0) ok = 0;
    for (r = 0; ok && r < m; r++)
        for (c = 0; c < ldc; c++) {
            double start = accumulate ? C0[r * ldc + c] : 0, mag, ref;
            if (c >= n) {
                if (C[r * ldc + c] != sentinel) { ok = 0; break; }
                continue;
            }
            ref = start + gemm_reference(ta, tb, k, A, lda, B, ldb, r, c, &mag);
            if (fabs(C[r * ldc + c] - ref) > (k + 1) * 6e-8 * (mag + fabs(start)) + 1e-30) { ok = 0; break; }
        }
    if (ok && out) memcpy(out, C, (size_t)m * ldc * sizeof(float));
    free(A); free(B); free(C); free(C0);
    return ok;
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
typedef void (*thin_kernel_fn)(int ta, int tb, int M, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                               ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate);

/* Whether two widths of a thin kernel give the same bits for one product (C with two columns
   more than n, zeros there); 0 also when memory runs out, with the failure recorded. */
static int thin_widths_agree(thin_kernel_fn wide, thin_kernel_fn narrow, ad_rng *rng, int ta, int tb, int m, int n,
                             int k)
{
    const int ldc = n + 2;
    float *A = (float *)malloc((size_t)m * k * sizeof(float)), *B = (float *)malloc((size_t)n * k * sizeof(float));
    float *cw = (float *)calloc((size_t)m * ldc, sizeof(float)), *cn = (float *)calloc((size_t)m * ldc, sizeof(float));
    int r, same = 0;
    if (A && B && cw && cn) {
        for (r = 0; r < m * k; r++) A[r] = (float)(2 * ad_rng_uniform(rng) - 1);
        for (r = 0; r < n * k; r++) B[r] = (float)(2 * ad_rng_uniform(rng) - 1);
        wide(ta, tb, m, n, k, A, ta ? m : k, B, tb ? k : n, cw, ldc, 0);
        narrow(ta, tb, m, n, k, A, ta ? m : k, B, tb ? k : n, cn, ldc, 0);
        same = memcmp(cw, cn, (size_t)m * ldc * sizeof(float)) == 0;
        if (!same) TH_CHECK(0, "thin kernels' widths differ, m=%d n=%d k=%d ta=%d tb=%d", m, n, k, ta, tb);
    } else {
        TH_CHECK(0, "out of memory");
    }
    free(A); free(B); free(cw); free(cn);
    return same;
}
#endif

/* One product on one, two and three threads: each result held to the bound of (h), and the
   two- and three-thread results equal to the one-thread result bit for bit. */
static void check_gemm_threads(ad_tape *T, uint64_t seed, int ta, int tb, int m, int n, int k, int acc)
{
    size_t bytes = (size_t)m * (n + 3) * sizeof(float); /* C's rows padded by 3, as in gemm_case_ok */
    float *one = (float *)malloc(bytes), *more = (float *)malloc(bytes);
    int t;
    if (!one || !more) { free(one); free(more); TH_CHECK(0, "out of memory"); return; }
    for (t = 1; t <= 3; t++) {
        ad_rng rng;
        int ok;
        ad_rng_seed(&rng, seed);
        ad_set_threads(T, t);
        ok = gemm_case_ok(T, &rng, ta, tb, m, n, k, acc, tb ? 3 : 0, t == 1 ? one : more);
        TH_CHECK(ok, "gemm m=%d n=%d k=%d ta=%d tb=%d accumulate=%d on %d thread(s) is off", m, n, k, ta, tb, acc, t);
        if (t > 1)
            TH_CHECK(ok && memcmp(one, more, bytes) == 0,
                     "gemm m=%d n=%d k=%d ta=%d tb=%d accumulate=%d: %d threads differ from one", m, n, k, ta, tb, acc,
                     t);
    }
    ad_set_threads(T, 1);
    free(one);
    free(more);
}

/* (h2a) products with one to three rows of C, which the thin kernels take (ad__gemm_thin): every
   transpose, N and K on both sides of a vector, of four vectors and of the dot products' 16
   running sums, with and without accumulating, B at its exact size and C's other columns
   untouched (gemm_case_ok). Where the processor has AVX-512, the AVX2 kernels must give the
   same bits: the dot products' order does not depend on the vector width. */
static void test_float_gemm_thin(void)
{
    static const int ns[] = {1, 3, 8, 15, 16, 17, 31, 33, 48, 64, 65, 100, 129},
                     ks[] = {1, 5, 15, 16, 17, 33, 64, 100, 257};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    size_t ni, ki;
    int m, ta, tb, acc, bad = 0, cases = 0;
    ad_rng_seed(&rng, 23);
    ad_set_threads(T, 1);
    for (m = 1; m <= 3; m++)
        for (ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        for (acc = 0; acc <= 1; acc++) {
                            int n = ns[ni], k = ks[ki];
                            cases++;
                            if (!gemm_case_ok(T, &rng, ta, tb, m, n, k, acc, (m + n + k) % 3 == 0 ? 5 : 0, NULL)) {
                                if (bad++ < 5)
                                    TH_CHECK(0, "gemm m=%d n=%d k=%d ta=%d tb=%d accumulate=%d is off", m, n, k, ta,
                                             tb, acc);
                            }
                        }
    TH_CHECK(bad == 0, "%d of %d thin products are off", bad, cases);
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (ad__isa() == AD__ISA_AVX512) {
        static const int shapes[][2] = {{1, 1}, {37, 5}, {16, 16}, {100, 257}, {65, 1000}};
        size_t i;
        int differ = 0;
        for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (m = 1; m <= 3; m++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        if (!(ta && tb))
                            differ += !thin_widths_agree(ad__thin_avx512, ad__thin_avx2, &rng, ta, tb, m,
                                                         shapes[i][0], shapes[i][1]);
        TH_CHECK(differ == 0, "%d thin products differ between AVX2 and AVX-512", differ);
    }
#endif
    /* large enough for their columns to be split over threads (ad__gemm_thin_split): the split
       must not change a bit, at the least split (two stretches) and past it */
    {
        static const int wide[] = {2 * AD__THIN_STRETCH, 577, 1031};
        for (m = 1; m <= 3; m++)
            for (ni = 0; ni < sizeof wide / sizeof wide[0]; ni++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        if (!(ta && tb)) check_gemm_threads(T, 31 + (uint64_t)ni, ta, tb, m, wide[ni], 347, m == 2);
    }
    ad_tape_free(T);
}

/* C (m x 1, its values adjacent, then a sentinel) (+)= op(A) op(B) for one column of C: the
   few-columns kernels store such a column of C as a vector. */
static int gemm_column_ok(ad_tape *T, ad_rng *rng, int ta, int tb, int m, int k, int accumulate)
{
    const float sentinel = 12345.0f;
    int lda = ta ? m : k, r, ok = 1;
    float *A = (float *)malloc((size_t)m * k * sizeof(float)), *B = (float *)malloc((size_t)k * sizeof(float));
    float *C = (float *)malloc((size_t)(m + 1) * sizeof(float)), *C0 = (float *)malloc((size_t)m * sizeof(float));
    if (!A || !B || !C || !C0) {
        free(A); free(B); free(C); free(C0);
        return 0;
    }
    for (r = 0; r < m * k; r++) A[r] = (float)(2 * ad_rng_uniform(rng) - 1);
    for (r = 0; r < k; r++) B[r] = (float)(2 * ad_rng_uniform(rng) - 1);
    for (r = 0; r < m; r++) C[r] = C0[r] = (float)(2 * ad_rng_uniform(rng) - 1);
    C[m] = sentinel;
    if (ad__gemm(T, ta, tb, m, 1, k, A, lda, B, tb ? k : 1, C, 1, accumulate) != 0 || C[m] != sentinel) ok = 0;
    for (r = 0; ok && r < m; r++) {
        double start = accumulate ? C0[r] : 0, mag, ref = start + gemm_reference(ta, tb, k, A, lda, B, tb ? k : 1, r, 0, &mag);
        if (fabs(C[r] - ref) > (k + 1) * 6e-8 * (mag + fabs(start)) + 1e-30) ok = 0;
    }
    free(A); free(B); free(C); free(C0);
    return ok;
}

/* (h2b) products with one to three columns of C and more rows (a matrix times a vector), which
   the thin kernels take as the transposed product (ad__thin_*_few_columns): every transpose, M
   on both sides of the dot products' groups and the sums' blocks of vectors, K on both sides of
   a step and of the stretches in which B's columns are copied to rows (AD__THIN_COPY), with and
   without accumulating, B's rows padded or not; C's other columns untouched (gemm_case_ok: C's
   column a scattered row of C^T) and a column of adjacent values (stored as vectors). Where the
   processor has AVX-512, the AVX2 kernels give the same bits. Split over threads (rows of C in
   stretches), no bit changes. */
static void test_float_gemm_few_columns(void)
{
    static const int ms[] = {4, 5, 15, 16, 17, 63, 64, 65, 100, 197},
                     ks[] = {1, 5, 16, 17, 100, AD__THIN_COPY, AD__THIN_COPY + 1, 600};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    size_t mi, ki;
    int n, ta, tb, acc, bad = 0, cases = 0, column_bad = 0, column_cases = 0;
    ad_rng_seed(&rng, 29);
    ad_set_threads(T, 1);
    for (n = 1; n <= 3; n++)
        for (mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        for (acc = 0; acc <= 1; acc++) {
                            int m = ms[mi], k = ks[ki];
                            cases++;
                            if (!gemm_case_ok(T, &rng, ta, tb, m, n, k, acc, (m + k + acc) % 2 ? 3 : 0, NULL) &&
                                bad++ < 5)
                                TH_CHECK(0, "gemm m=%d n=%d k=%d ta=%d tb=%d accumulate=%d is off", m, n, k, ta, tb,
                                         acc);
                            if (n > 1) continue;
                            column_cases++;
                            if (!gemm_column_ok(T, &rng, ta, tb, m, k, acc) && column_bad++ < 5)
                                TH_CHECK(0, "gemm into a column m=%d k=%d ta=%d tb=%d accumulate=%d is off", m, k, ta,
                                         tb, acc);
                        }
    TH_CHECK(bad == 0, "%d of %d products with few columns are off", bad, cases);
    TH_CHECK(column_bad == 0, "%d of %d products into one column are off", column_bad, column_cases);
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (ad__isa() == AD__ISA_AVX512) {
        static const int shapes[][2] = {{4, 1}, {37, 5}, {64, 16}, {100, 257}, {65, 1000}};
        size_t i;
        int differ = 0;
        for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (n = 1; n <= 3; n++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        differ += !thin_widths_agree(ad__thin_avx512_few_columns, ad__thin_avx2_few_columns, &rng, ta,
                                                     tb, shapes[i][0], n, shapes[i][1]);
        TH_CHECK(differ == 0, "%d products with few columns differ between AVX2 and AVX-512", differ);
    }
#endif
    {
        static const int tall[] = {2 * AD__THIN_STRETCH, 577, 1031};
        for (n = 1; n <= 3; n++)
            for (mi = 0; mi < sizeof tall / sizeof tall[0]; mi++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        check_gemm_threads(T, 37 + (uint64_t)mi, ta, tb, tall[mi], n, 347, n == 2);
    }
    ad_tape_free(T);
}

static void test_float_gemm_narrow(void)
{
    static const int ms[] = {4, 9, 16, 17, 64, 70}, ns[] = {4, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 20},
                     ks[] = {3, 64, 257};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    size_t mi, ni, ki;
    int ta, tb, acc, bad = 0, cases = 0;
    ad_rng_seed(&rng, 21);
    ad_set_threads(T, 1);
    for (mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (ta = 0; ta <= 1; ta++)
                    for (tb = 0; tb <= 1; tb++)
                        for (acc = 0; acc <= 1; acc++) {
                            int m = ms[mi], n = ns[ni], k = ks[ki];
                            cases++;
                            if (!gemm_case_ok(T, &rng, ta, tb, m, n, k, acc, (m + n + k) % 3 == 0 ? 5 : 0, NULL)) {
                                if (bad++ < 5)
                                    TH_CHECK(0, "gemm m=%d n=%d k=%d ta=%d tb=%d accumulate=%d is off", m, n, k, ta,
                                             tb, acc);
                            }
                        }
    TH_CHECK(bad == 0, "%d of %d narrow products are off", bad, cases);
    /* op(A) transposed: a last tile of at most 24 rows goes to the narrow kernel, whole tiles of
       32 to the column kernel; each row gets the same bits either way (here against the first
       rows of a product of 128 rows, all in whole tiles) */
    {
        static const int rows[] = {4, 8, 17, 24, 36, 56, 100}, cols[] = {4, 10, 12}, depth[] = {9, 64, 300};
        int differ = 0, compared = 0;
        for (mi = 0; mi < sizeof rows / sizeof rows[0]; mi++)
            for (ni = 0; ni < sizeof cols / sizeof cols[0]; ni++)
                for (ki = 0; ki < sizeof depth / sizeof depth[0]; ki++) {
                    int m = rows[mi], n = cols[ni], k = depth[ki], r;
                    float *A = (float *)malloc((size_t)k * 128 * sizeof(float)), *B = (float *)malloc((size_t)k * n * sizeof(float));
                    float *all = (float *)malloc((size_t)128 * n * sizeof(float)), *some = (float *)malloc((size_t)m * n * sizeof(float));
                    if (!A || !B || !all || !some) {
                        free(A); free(B); free(all); free(some);
                        TH_CHECK(0, "out of memory");
                        return;
                    }
                    for (r = 0; r < k * 128; r++) A[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                    for (r = 0; r < k * n; r++) B[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                    compared++;
                    if (ad__gemm(T, 1, 0, 128, n, k, A, 128, B, n, all, n, 0) != 0 ||
                        ad__gemm(T, 1, 0, m, n, k, A, 128, B, n, some, n, 0) != 0 ||
                        memcmp(all, some, (size_t)m * n * sizeof(float)) != 0)
                        differ++;
                    free(A); free(B); free(all); free(some);
                }
        TH_CHECK(differ == 0, "%d of %d products with op(A) transposed change bits with their last tile's kernel", differ,
                 compared);
    }
    /* large enough to be split over threads: the split must not change a bit */
    for (ta = 0; ta <= 1; ta++)
        for (ni = 0; ni < 3; ni++) {
            static const int wide[] = {10, 13, 16};
            int m = 3001, n = wide[ni], k = 300, ldc = n + 3;
            float *one = (float *)malloc((size_t)m * ldc * sizeof(float)), *three = (float *)malloc((size_t)m * ldc * sizeof(float));
            ad_rng r1, r3;
            int ok1, ok3;
            if (!one || !three) { free(one); free(three); TH_CHECK(0, "out of memory"); return; }
            ad_rng_seed(&r1, 99 + ni);
            r3 = r1;
            ad_set_threads(T, 1);
            ok1 = gemm_case_ok(T, &r1, ta, 0, m, n, k, ta, 0, one);
            ad_set_threads(T, 3);
            ok3 = gemm_case_ok(T, &r3, ta, 0, m, n, k, ta, 0, three);
            TH_CHECK(ok1 && ok3 && memcmp(one, three, (size_t)m * ldc * sizeof(float)) == 0,
                     "gemm m=%d n=%d k=%d ta=%d: three threads differ from one", m, n, k, ta);
            free(one);
            free(three);
        }
    ad_tape_free(T);
}

/* (h2) the spread kernel (ad__spread_kernel: neither operand transposed, nine or ten columns,
   A's values along k spread over a vector's lanes). Its packing agrees with the layout's map
   ad__spread_slot: blocks of B with ten columns one row after another (read in place), with its
   rows further apart and a last, short block of nine columns (both staged first). Then whole
   products: ragged rows (the tile's last rows read the last row again), K from one block to past
   the cache block with a short last block, with and without accumulating, each within the bound
   of (h), and B with its rows padded giving the same bits as B without, so that a staged B and
   one read in place feed the kernel the same panel. Where the processor has AVX-512 the products
   with nine or ten columns are taken there. */
static void test_float_gemm_spread(void)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    static const int ms[] = {4, 5, 8, 9, 17, 64}, ks[] = {8, 9, 15, 16, 64, 100, 257, 600};
    ad_tape *T;
    ad_rng rng;
    float B[16 * 13], tens[2 * AD__SPREAD_BLOCK], apart[2 * AD__SPREAD_BLOCK], short_block[AD__SPREAD_BLOCK];
    int s, j, n, mi, ki, acc, layout_bad = 0, bad = 0, differ = 0, cases = 0;
    if (ad__isa() != AD__ISA_AVX512) return;
    TH_CHECK(ad__gemm_pick(10).spread && ad__gemm_pick(9).spread, "the spread kernel is not offered with AVX-512");
    ad_rng_seed(&rng, 77);
    for (s = 0; s < 16 * 13; s++) B[s] = (float)(2 * ad_rng_uniform(&rng) - 1);
    ad__pack_spread_b(B, 10, 0, 16, 10, tens);   /* two blocks, ten columns, rows adjacent */
    ad__pack_spread_b(B, 13, 0, 16, 10, apart);  /* the same columns of rows 13 apart */
    ad__pack_spread_b(B, 10, 0, 5, 9, short_block); /* five rows, nine columns */
    for (s = 0; s < 16; s++)
        for (j = 0; j < 10; j++) {
            int at = (s / AD__SPREAD_K) * AD__SPREAD_BLOCK + ad__spread_slot(s % AD__SPREAD_K, j);
            layout_bad += tens[at] != B[s * 10 + j];
            layout_bad += apart[at] != B[s * 13 + j];
            if (s < AD__SPREAD_K) layout_bad += short_block[ad__spread_slot(s, j)] != (s < 5 && j < 9 ? B[s * 10 + j] : 0);
        }
    TH_CHECK(layout_bad == 0, "%d values of packed spread blocks are out of place", layout_bad);

    T = ad_tape_new();
    ad_set_threads(T, 1);
    for (n = 9; n <= 10; n++)
        for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++)
            for (ki = 0; ki < (int)(sizeof ks / sizeof ks[0]); ki++)
                for (acc = 0; acc <= 1; acc++) {
                    int m = ms[mi], k = ks[ki], r, c, ok = 1;
                    float *A = (float *)malloc((size_t)m * k * sizeof(float));
                    float *Bx = (float *)malloc((size_t)k * n * sizeof(float)), *Bp = (float *)malloc((size_t)k * (n + 3) * sizeof(float));
                    float *C0 = (float *)malloc((size_t)m * n * sizeof(float)), *Cx = (float *)malloc((size_t)m * n * sizeof(float)),
                          *Cp = (float *)malloc((size_t)m * n * sizeof(float));
                    cases++;
                    if (!A || !Bx || !Bp || !C0 || !Cx || !Cp) {
                        free(A); free(Bx); free(Bp); free(C0); free(Cx); free(Cp);
                        TH_CHECK(0, "out of memory");
                        break;
                    }
                    for (r = 0; r < m * k; r++) A[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                    for (r = 0; r < k; r++)
                        for (c = 0; c < n + 3; c++) {
                            Bp[r * (n + 3) + c] = (float)(2 * ad_rng_uniform(&rng) - 1);
                            if (c < n) Bx[r * n + c] = Bp[r * (n + 3) + c];
                        }
                    for (r = 0; r < m * n; r++) C0[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                    memcpy(Cx, C0, (size_t)m * n * sizeof(float));
                    memcpy(Cp, C0, (size_t)m * n * sizeof(float));
                    if (ad__gemm(T, 0, 0, m, n, k, A, k, Bx, n, Cx, n, acc) != 0 ||
                        ad__gemm(T, 0, 0, m, n, k, A, k, Bp, n + 3, Cp, n, acc) != 0)
                        ok = 0;
                    for (r = 0; ok && r < m; r++)
                        for (c = 0; c < n; c++) {
                            double mag, start = acc ? C0[r * n + c] : 0;
                            double ref = start + gemm_reference(0, 0, k, A, k, Bx, n, r, c, &mag);
                            if (fabs(Cx[r * n + c] - ref) > (k + 1) * 6e-8 * (mag + fabs(start)) + 1e-30) { ok = 0; break; }
                        }
                    if (!ok && bad++ < 3) TH_CHECK(0, "spread gemm m=%d n=%d k=%d accumulate=%d is off", m, n, k, acc);
                    if (memcmp(Cx, Cp, (size_t)m * n * sizeof(float)) != 0 && differ++ < 3)
                        TH_CHECK(0, "spread gemm m=%d n=%d k=%d accumulate=%d: a padded B gives other bits", m, n, k, acc);
                    free(A); free(Bx); free(Bp); free(C0); free(Cx); free(Cp);
                }
    TH_CHECK(bad == 0, "%d of %d spread products are off", bad, cases);
    TH_CHECK(differ == 0, "%d of %d spread products change with B's row stride", differ, cases);
    ad_tape_free(T);
#endif
}

/* (h2b) an operand that would be read in place with its rows crowding a few L1 sets is packed
   instead (ad__gemm_pack_strided): the same product with that operand's rows padded by a few
   values, which is read in place, must give the same bits, and both must hold to the bound of
   (h). Shapes that read A in place (transposed, at most four panels of columns) and B in place
   (few rows), with K over one cache block; each is packed where the kernel's tiles read it often
   enough (four for A, the kernel's pack_b_reuse for B), and one at least is on every kernel. */
static void test_float_gemm_stride_paths(void)
{
    static const int cases[][5] = {/* ta, tb, m, n, k */
                                   {1, 0, 128, 128, 300}, {1, 0, 64, 100, 260}, {0, 0, 100, 128, 300},
                                   {0, 0, 37, 64, 280}, {1, 0, 192, 100, 513}, {1, 0, 64, 64, 300}};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    size_t ci;
    int both_paths = 0;
    ad_rng_seed(&rng, 31);
    ad_set_threads(T, 1);
    for (ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int ta = cases[ci][0], tb = cases[ci][1], m = cases[ci][2], n = cases[ci][3], k = cases[ci][4];
        int rows_a = ta ? k : m, cols_a = ta ? m : k, rows_b = tb ? n : k, cols_b = tb ? k : n, pad = 5, r, c;
        int lda = cols_a, ldb = cols_b, lda_p = cols_a + pad, ldb_p = cols_b + pad;
        float *A = (float *)malloc((size_t)rows_a * lda * sizeof(float)), *B = (float *)malloc((size_t)rows_b * ldb * sizeof(float));
        float *Ap = (float *)malloc((size_t)rows_a * lda_p * sizeof(float)), *Bp = (float *)malloc((size_t)rows_b * ldb_p * sizeof(float));
        float *C = (float *)malloc((size_t)m * n * sizeof(float)), *Cp = (float *)malloc((size_t)m * n * sizeof(float));
        int ok = A && B && Ap && Bp && C && Cp, same;
        double worst = 0;
        if (ok) {
            for (r = 0; r < rows_a; r++)
                for (c = 0; c < lda_p; c++) {
                    float v = (float)(2 * ad_rng_uniform(&rng) - 1);
                    Ap[r * lda_p + c] = v;
                    if (c < lda) A[r * lda + c] = v;
                }
            for (r = 0; r < rows_b; r++)
                for (c = 0; c < ldb_p; c++) {
                    float v = (float)(2 * ad_rng_uniform(&rng) - 1);
                    Bp[r * ldb_p + c] = v;
                    if (c < ldb) B[r * ldb + c] = v;
                }
            {
                ad__gemm_kernel ker = ad__gemm_pick(n);
                int kc = ad__gemm_kstep(m, n, k, tb), reuse = ta ? (n + ker.nr - 1) / ker.nr : (m + ker.mr - 1) / ker.mr;
                /* packed where enough tiles read it: four for A, ker.pack_b_reuse for B */
                int min_reuse = ta ? 4 : ker.pack_b_reuse;
                int packed = ad__gemm_pack_strided(ta ? lda : ldb, kc, reuse, min_reuse);
                TH_CHECK(packed == (reuse >= min_reuse) && !ad__gemm_pack_strided(ta ? lda_p : ldb_p, kc, reuse, min_reuse),
                         "case %d: packed %d with %d tiles", (int)ci, packed, reuse);
                /* a transposed A is read in place only with few panels of B's columns */
                both_paths += packed && (!ta || ad__gemm_a_in_place(ker, ta, lda_p, m, n, kc) > 0);
            }
            ok = ad__gemm(T, ta, tb, m, n, k, A, lda, B, ldb, C, n, 0) == 0 &&
                 ad__gemm(T, ta, tb, m, n, k, Ap, lda_p, Bp, ldb_p, Cp, n, 0) == 0;
        }
        same = ok && memcmp(C, Cp, (size_t)m * n * sizeof(float)) == 0;
        for (r = 0; ok && r < m; r++)
            for (c = 0; c < n; c++) {
                double mag, ref = gemm_reference(ta, tb, k, A, lda, B, ldb, r, c, &mag);
                double err = fabs(C[r * n + c] - ref) / (k * 6e-8 * mag + 1e-30);
                if (err > worst) worst = err;
            }
        TH_CHECK(ok && same, "gemm ta=%d tb=%d m=%d n=%d k=%d: packed and in-place reads differ", ta, tb, m, n, k);
        TH_CHECK(ok && worst <= 1, "gemm ta=%d tb=%d m=%d n=%d k=%d is off: %g of the bound", ta, tb, m, n, k, worst);
        free(A); free(B); free(Ap); free(Bp); free(C); free(Cp);
    }
    TH_CHECK(both_paths > 0, "no case packs a crowded operand");
    ad_tape_free(T);
}

/* (h2c) A's packing into panels of eight rows (the AVX-512 kernels') and of six (AVX2's),
   untransposed (register transposes where the processor has AVX2, one value at a time in the
   AUTODIFF_NO_DISPATCH build) and transposed (whole panels four at a time): every value where the
   micro-kernel reads it, dst[panel][k][row], and zeros below the last row of a ragged panel.
   Blocks that start inside A, with kc not a multiple of 8, panels of mr and fewer rows, and
   whole panels in groups of four and fewer, a transposed A's rows a power of two apart. */
static void test_float_pack_a(void)
{
    static const int cases[][5] = {/* rows, cols, i0, mc, kc; k0 = 3 */
                                   {8, 11, 0, 8, 8},      {12, 20, 2, 8, 13},    {40, 140, 5, 19, 131},
                                   {30, 300, 1, 24, 256},  {9, 9, 1, 8, 1},       {64, 784, 0, 64, 261},
                                   {512, 300, 8, 144, 256}, {100, 40, 0, 100, 37}, {128, 260, 0, 128, 256}};
    static const int heights[2] = {8, 6};
    size_t ci;
    int ta, hi;
    for (ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (hi = 0; hi < 2; hi++)
            for (ta = 0; ta <= 1; ta++) {
                int rows = cases[ci][0], cols = cases[ci][1], i0 = cases[ci][2], mc = cases[ci][3];
                int kc = cases[ci][4], mr = heights[hi], k0 = 3, panels = (mc + mr - 1) / mr, bad = 0, p, k, r;
                /* op(A) is rows x cols: stored as is, or as its transpose */
                int lda = ta ? rows : cols;
                float *A = (float *)malloc((size_t)rows * cols * sizeof(float));
                float *dst = (float *)malloc((size_t)panels * mr * kc * sizeof(float));
                if (!A || !dst) {
                    TH_CHECK(0, "out of memory");
                    free(A);
                    free(dst);
                    return;
                }
                for (r = 0; r < rows * cols; r++) A[r] = (float)(r + 1);
                memset(dst, 0xff, (size_t)panels * mr * kc * sizeof(float));
                ad__pack_a(ta, A, lda, i0, mc, k0, kc, mr, dst);
                for (p = 0; p < panels; p++)
                    for (k = 0; k < kc; k++)
                        for (r = 0; r < mr; r++) {
                            int i = i0 + mr * p + r;
                            float want = mr * p + r < mc ? (ta ? A[(size_t)(k0 + k) * lda + i] : A[(size_t)i * lda + k0 + k])
                                                         : 0;
                            bad += dst[((size_t)p * kc + k) * mr + r] != want;
                        }
                TH_CHECK(bad == 0, "pack_a ta=%d mr=%d rows %d cols %d i0 %d mc %d kc %d: %d values misplaced", ta, mr,
                         rows, cols, i0, mc, kc, bad);
                free(A);
                free(dst);
            }
}

/* Sets the products' longest K block (ad__gemm_kc_limit) for the tests that follow; 0 probes the
   machine's again. Without dispatch the limit is AD__KC_UNKNOWN_L2 whatever is asked. */
static void set_gemm_kc_limit(int kc)
{
#if AD__X86_DISPATCH
    ad__gemm_kc_probed = kc;
#else
    (void)kc;
#endif
}

/* The K block from L2's size: an MC x KC block of A in at most half of L2, a multiple of 16,
   between 64 and AD__KC_MAX, AD__KC_UNKNOWN_L2 for an unknown L2; this machine's limit is that
   of its L2 and even (the bfloat16 panels round kc up to even inside the buffers). */
static void test_gemm_kc_for_l2(void)
{
    size_t half_l2_at_max = (size_t)AD__MC * AD__KC_MAX * sizeof(ad_real) * 2;
    int limit;
    TH_CHECK(ad__gemm_kc_for_l2(0) == AD__KC_UNKNOWN_L2, "unknown L2: KC %d", ad__gemm_kc_for_l2(0));
    TH_CHECK(ad__gemm_kc_for_l2(half_l2_at_max) == AD__KC_MAX, "L2 of %zu bytes: KC %d", half_l2_at_max,
             ad__gemm_kc_for_l2(half_l2_at_max));
    TH_CHECK(ad__gemm_kc_for_l2(64u << 20) == AD__KC_MAX, "64 MiB of L2: KC %d", ad__gemm_kc_for_l2(64u << 20));
    TH_CHECK(ad__gemm_kc_for_l2(256u << 10) == (int)((128u << 10) / (AD__MC * sizeof(ad_real)) / 16 * 16),
             "256 KiB of L2: KC %d", ad__gemm_kc_for_l2(256u << 10));
    TH_CHECK(ad__gemm_kc_for_l2(16u << 10) == 64, "16 KiB of L2: KC %d", ad__gemm_kc_for_l2(16u << 10));
    set_gemm_kc_limit(0);
    limit = ad__gemm_kc_limit();
    TH_CHECK(limit == ad__gemm_kc_for_l2(ad__l2_bytes()),
             "the probed limit %d is not that of L2's %zu bytes", limit, ad__l2_bytes());
    TH_CHECK(limit % 16 == 0 && limit >= 64 && limit <= AD__KC_MAX, "the probed limit %d", limit);
    th_family("ad__gemm_kc_for_l2: the K block from L2's size");
}

/* A product's K blocks follow the limit: with blocks of at most `limit`, C equals, bit for bit,
   the product of the first block's columns of op(A) and rows of op(B), then each later block's
   added to C (accumulate), each block as long as the even split gives (520 = 174 + 174 + 172
   under 256, 260 + 260 under 512). A C of at most AD__KSPLIT_MAX_C values with B not transposed
   takes two blocks where K is longer than AD__KC_SMALL_C and fits one block (ad__gemm_kstep):
   the fourth shape's 500 under 512, as two of 250, but in one block with B transposed, and the
   last shape's, whose C is larger, in one block. The blocks' products are taken with B
   transposed, which keeps each of them one block. Every transpose, one thread. */
static void check_gemm_blocks(int limit)
{
    static const int sizes[][3] = {{37, 70, 520}, {100, 130, 1100}, {9, 300, 700}, {64, 256, 500}, {200, 180, 500}};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    size_t si;
    int ta, tb;
    ad_rng_seed(&rng, 47);
    ad_set_threads(T, 1);
    set_gemm_kc_limit(limit);
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++) {
                int m = sizes[si][0], n = sizes[si][1], k = sizes[si][2], r, j;
                int blocks = (k + limit - 1) / limit, len, k0;
                float *A = (float *)malloc((size_t)m * k * sizeof(float)), *B = (float *)malloc((size_t)k * n * sizeof(float));
                float *Bt = (float *)malloc((size_t)k * n * sizeof(float)); /* op(B) transposed: [n, k] */
                float *C = (float *)malloc((size_t)m * n * sizeof(float)), *Cb = (float *)malloc((size_t)m * n * sizeof(float));
                int ok = A && B && Bt && C && Cb;
                if (blocks == 1 && !tb && (double)m * n <= AD__KSPLIT_MAX_C && k > AD__KC_SMALL_C) blocks = 2;
                len = (k + blocks - 1) / blocks;
                for (r = 0; ok && r < m * k; r++) A[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                for (r = 0; ok && r < k * n; r++) B[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
                for (j = 0; ok && j < n; j++)
                    for (r = 0; r < k; r++) Bt[(size_t)j * k + r] = tb ? B[(size_t)j * k + r] : B[(size_t)r * n + j];
                ok = ok && ad__gemm(T, ta, tb, m, n, k, A, ta ? m : k, B, tb ? k : n, C, n, 0) == 0;
                for (k0 = 0; ok && k0 < k; k0 += len) {
                    int kc = k - k0 < len ? k - k0 : len;
                    const float *a = ta ? A + (size_t)k0 * m : A + k0;
                    ok = ad__gemm(T, ta, 1, m, n, kc, a, ta ? m : k, Bt + k0, k, Cb, n, k0 > 0) == 0;
                }
                TH_CHECK(ok && memcmp(C, Cb, (size_t)m * n * sizeof(float)) == 0,
                         "%d x %d x %d, ta %d tb %d, blocks of at most %d: not the sum of %d blocks of %d", m, n, k,
                         ta, tb, limit, blocks, len);
                free(A);
                free(B);
                free(Bt);
                free(C);
                free(Cb);
            }
    set_gemm_kc_limit(0);
    ad_tape_free(T);
}

/* Each parameter's bands (ad__param_band) cover it once, in order, cut on whole blocks from its
   start, for sizes around a block and large ones, and 1 to 5 tasks. */
static void check_param_bands_cover(void)
{
    static const size_t sizes[] = {1, 15, 16, 17, 100, 513, 4097, 401408};
    size_t si, lo, hi;
    int tasks, task;
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (tasks = 1; tasks <= 5; tasks++) {
            ad__param q;
            size_t at;
            int ok = 1;
            memset(&q, 0, sizeof q);
            q.offset = 1000;
            q.size = sizes[si];
            at = q.offset;
            for (task = 0; task < tasks; task++) {
                if (!ad__param_band(&q, tasks, task, &lo, &hi)) continue;
                if (lo != at || hi <= lo || (lo - q.offset) % AD__STORE_BLOCK != 0) ok = 0;
                at = hi;
            }
            TH_CHECK(ok && at == q.offset + q.size, "%zu scalars in %d bands: not covered once in whole blocks",
                     q.size, tasks);
        }
}

/* On two threads the band of a 784 x 512 or a 512 x 256 weight is the band of rows that its
   layer's product (x [64, 784] W, x [64, 512] W) splits along K gives the same task, under K
   blocks of 256 and of this machine's limit. */
static void check_weight_bands_match_ksplit(void)
{
    static const int layers[][3] = {{64, 512, 784}, {64, 256, 512}}; /* M, N, K: x [M, K] W [K, N] */
    size_t lo, hi;
    int pass, li;
    for (pass = 0; pass < 2; pass++) {
        set_gemm_kc_limit(pass == 0 ? AD__KC_UNKNOWN_L2 : 0);
        for (li = 0; li < 2; li++) {
            int M = layers[li][0], N = layers[li][1], K = layers[li][2];
            ad__param w;
            ad__gemm_job job;
            ad__gemm_ksplit_job s;
            memset(&w, 0, sizeof w);
            memset(&job, 0, sizeof job);
            w.size = (size_t)K * N;
            job.ker = ad__gemm_pick(N);
            job.M = M;
            job.N = N;
            job.K = K;
            job.kstep = ad__gemm_kstep(M, N, K, 0);
            TH_CHECK(ad__gemm_splits_k(&job, 2), "x [%d, %d] W [%d, %d] on 2 threads: not split along K (K block %d)",
                     M, K, K, N, job.kstep);
            ad__ksplit_plan(&s, &job, 2);
            TH_CHECK(ad__param_band(&w, 2, 0, &lo, &hi) && hi == (size_t)s.first_end * s.kstep * N,
                     "W [%d, %d]: the first band ends at scalar %zu, the product's first task's rows at row %d", K, N,
                     hi, s.first_end * s.kstep);
        }
    }
    set_gemm_kc_limit(0);
}

/* A store's work on threads is cut per parameter (ad__param_band), in bands that line up with a
   weight's product split along K. */
static void test_param_bands(void)
{
    check_param_bands_cover();
    check_weight_bands_match_ksplit();
    th_family("ad__param_band: a store's bands, and a weight's band against the product's split along K");
}

static void test_gemm_blocks(void)
{
    check_gemm_blocks(AD__KC_UNKNOWN_L2);
    if (AD__X86_DISPATCH) check_gemm_blocks(AD__KC_MAX);
    th_family("ad__gemm: K blocks of the limit's length, added in order");
}

/* check_gemm_threads for each of count shapes (m, n, k), every transpose, with and without
   accumulating; the data of shape i from seed + i. */
static void check_gemm_shapes_threads(const int (*sizes)[3], size_t count, uint64_t seed)
{
    ad_tape *T = ad_tape_new();
    size_t si;
    int ta, tb, acc;
    for (si = 0; si < count; si++)
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++)
                for (acc = 0; acc <= 1; acc++)
                    check_gemm_threads(T, seed + si, ta, tb, sizes[si][0], sizes[si][1], sizes[si][2], acc);
    ad_tape_free(T);
}

/* (h3) products large enough for the threads to share one packed block of B and take blocks of
   A's rows as they come: ragged rows, a K remainder, more columns than one block of B (whose last
   block is narrow enough for A to be read in place), every transpose, with and without
   accumulating, a padded B. */
static void test_float_gemm_shared(void)
{
    static const int sizes[][3] = {{301, 203, 600}, {150, 2100, 110}, {777, 70, 620}};
    ad_tape *T = ad_tape_new();
    size_t si;
    int ta, tb;
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (ta = 0; ta <= 1; ta++)
            for (tb = 0; tb <= 1; tb++)
                check_gemm_threads(T, 500 + si, ta, tb, sizes[si][0], sizes[si][1], sizes[si][2], ta ^ tb);
    ad_tape_free(T);
}

/* (h3) products of one block of rows and many columns, whose threads share one packed op(A) and
   take runs of B's panels as they come: a layer's weight gradient (128 x 512 from K = 768, three
   whole blocks), ragged rows, columns and K blocks (600 = 200 x 3, 520 = 174 + 174 + 172), a
   run of panels past AD__NC, so many columns that a thread's share would overflow its buffer for
   B (17,000 columns, whole blocks of K), every transpose, with and without accumulating, a
   padded B. */
static void test_float_gemm_shared_a(void)
{
    static const int sizes[][3] = {{128, 512, 768}, {131, 515, 600}, {97, 1100, 520}, {20, 2300, 900},
                                   {9, 17000, 256}};
    check_gemm_shapes_threads(sizes, sizeof sizes / sizeof sizes[0], 600);
}

/* (h4) products with a small C and a long K, which threads split along K: a K of whole blocks,
   one of three ragged blocks (two threads take one and two of them), one of five (three threads
   take one, two and two), ragged rows and columns, every transpose, with and without
   accumulating, a padded B. */
static void test_float_gemm_ksplit(void)
{
    static const int sizes[][3] = {{64, 128, 784}, {37, 203, 700}, {120, 130, 1030}};
    check_gemm_shapes_threads(sizes, sizeof sizes / sizeof sizes[0], 700);
}

/* (h4) ad__gemm_packed with B^T packed once (ad__gemm_prepack_bt), as the recurrent layers use
   it, equals ad__gemm packing B itself, bit for bit, on 1, 2 and 3 threads, with and without
   accumulating, on shapes that take each path: a few rows (the layers' per-step products, split
   by columns on threads), K over the cache block with a shorter last block (520 = 174 + 174 +
   172), N over AD__NC, a small C split along K, B shared between threads (M over AD__MC) and A
   shared (one block of rows, many columns). */
static void test_float_gemm_prepacked(void)
{
    static const int sizes[][3] = {{32, 1024, 256}, {5, 1200, 520}, {6, 2100, 40}, {4, 1024, 1024},
                                   {200, 300, 600}, {3, 64, 64}, {120, 1100, 520}};
    size_t si;
    int threads, acc, r;
    ad_rng rng;
    ad_rng_seed(&rng, 44);
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int m = sizes[si][0], n = sizes[si][1], k = sizes[si][2];
        float *A = (float *)malloc((size_t)m * k * sizeof(float)), *B = (float *)malloc((size_t)n * k * sizeof(float));
        float *C = (float *)malloc((size_t)m * n * sizeof(float)), *Cp = (float *)malloc((size_t)m * n * sizeof(float));
        for (r = 0; r < m * k; r++) A[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
        for (r = 0; r < n * k; r++) B[r] = (float)(2 * ad_rng_uniform(&rng) - 1);
        for (threads = 1; threads <= 3; threads++)
            for (acc = 0; acc <= 1; acc++) {
                ad_tape *T = ad_tape_new();
                ad__packed_b pk;
                int ok;
                ad_set_threads(T, threads);
                ad__gemm_prepack_bt(T, n, k, B, k, ad__panels_room(T, ad__packed_bt_values(n, k)), &pk);
                for (r = 0; r < m * n; r++) C[r] = Cp[r] = (float)r / (float)(m * n);
                ok = ad__gemm(T, 0, 1, m, n, k, A, k, B, k, C, n, acc) == 0 &&
                     ad__gemm_packed(T, 0, 1, m, n, k, A, k, B, k, Cp, n, acc, &pk) == 0;
                TH_CHECK(ok && pk.data && memcmp(C, Cp, (size_t)m * n * sizeof(float)) == 0,
                         "%d x %d x %d on %d thread(s), accumulate %d: the product from B packed once differs",
                         m, n, k, threads, acc);
                ad_tape_free(T);
            }
        free(A);
        free(B);
        free(C);
        free(Cp);
    }
}

/* (h5) recurrent layers in a loop, recorded and in no-grad mode, allocate nothing after the
   first pass: their packed weights live in room the tape keeps. */
static void test_layer_allocations(void)
{
    enum { L = 6, N = 8, I = 24, H = 40, PASSES = 4 };
    int sx[] = {L, N, I}, sw_ih[] = {4 * H, I}, sw_hh[] = {4 * H, H}, pass, gru;
    long after_first = 0, before = live();
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_rng_seed(&rng, 45);
    for (pass = 0; pass < PASSES; pass++) {
        for (gru = 0; gru <= 1; gru++) {
            ad_tensor *x, *w_ih, *w_hh, *y;
            sw_ih[0] = sw_hh[0] = (gru ? 3 : 4) * H;
            x = ad_rand(T, 3, sx, -1, 1, &rng);
            w_ih = ad_rand(T, 2, sw_ih, -0.2, 0.2, &rng);
            w_hh = ad_rand(T, 2, sw_hh, -0.2, 0.2, &rng);
            ad_set_requires_grad(w_hh, 1);
            ad_set_grad_enabled(T, pass % 2);
            y = gru ? ad_gru(T, x, NULL, w_ih, w_hh, NULL, NULL, NULL)
                    : ad_lstm(T, x, NULL, NULL, w_ih, w_hh, NULL, NULL, NULL, NULL);
            TH_CHECK(y && (pass % 2 == 0 || ad_backward(T, ad_sum(T, y)) == 0), "%s, pass %d: %s",
                     gru ? "ad_gru" : "ad_lstm", pass, th_errs(T));
            ad_tape_reset(T);
        }
        if (pass == 1) after_first = allocs(); /* a recorded pass and one in no-grad mode */
    }
    TH_CHECK(allocs() == after_first, "%ld allocations after the first passes of the layers", allocs() - after_first);
    ad_tape_free(T);
    TH_CHECK(live() == before, "ad_tape_free left %ld blocks", live() - before);
}

/* (i) the thread pool: many products in quick succession, split by rows and by columns, on more
   threads than the machine may have cores, now and then after a pause long enough for the
   workers to fall asleep; every result must equal the single-thread one bit for bit. */
static void busy_wait_ms(double ms)
{
    clock_t until = clock() + (clock_t)(ms * CLOCKS_PER_SEC / 1000.0);
    while (clock() < until) {}
}

static void test_threads(void)
{
    static const int sizes[][3] = {{64, 128, 784}, {300, 40, 70}, {33, 257, 65}, {129, 129, 129}};
    enum { NSIZES = sizeof sizes / sizeof sizes[0], ROUNDS = 120 };
    static const int thread_counts[] = {2, 3, 5};
    ad_tape *ref = ad_tape_new(), *T;
    ad_tensor *a[NSIZES], *b[NSIZES], *want[NSIZES];
    ad_rng rng;
    size_t t;
    int i, r, mismatches;
    ad_rng_seed(&rng, 5);
    ad_set_threads(ref, 1);
    for (i = 0; i < NSIZES; i++) {
        int sa[2], sb[2];
        sa[0] = sizes[i][0]; sa[1] = sizes[i][2];
        sb[0] = sizes[i][2]; sb[1] = sizes[i][1];
        a[i] = ad_rand(ref, 2, sa, -1, 1, &rng);
        b[i] = ad_rand(ref, 2, sb, -1, 1, &rng);
        want[i] = ad_matmul(ref, a[i], b[i]);
    }
    for (t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
        T = ad_tape_new();
        ad_set_threads(T, thread_counts[t]);
        mismatches = 0;
        for (r = 0; r < ROUNDS; r++) {
            ad_tensor *y;
            i = r % NSIZES;
            if (r % 40 == 39) busy_wait_ms(3);
            y = ad_matmul(T, ad_tensor_view(T, 2, a[i]->shape, a[i]->data, NULL, 0),
                          ad_tensor_view(T, 2, b[i]->shape, b[i]->data, NULL, 0));
            if (!y || memcmp(y->data, want[i]->data, y->size * sizeof(ad_real)) != 0) mismatches++;
            ad_tape_reset(T);
        }
        TH_CHECK(mismatches == 0, "%d threads: %d of %d products differ from one thread's", thread_counts[t],
                 mismatches, (int)ROUNDS);
        ad_tape_free(T);
    }
    ad_tape_free(ref);
}

/* (i2) elementwise functions of one and two tensors, softmax, sums of rows and columns, the sum
   of everything and cross-entropy with their gradients, large enough to be split over threads
   (over 2^18 values, well past 2^16, where even relu is split): values and gradients on two and three threads
   equal to one thread's bit for bit. The length is no multiple of a vector, so the last
   stretch ends in a part of one; the gradient is written (x used once) and added (x used again
   before). */
enum { SPLIT_FUNCS = 21, SPLIT_ROWS = 1031, SPLIT_COLS = 263 };

static ad_tensor *split_func(ad_tape *T, int f, ad_tensor *x, ad_tensor *x2)
{
    static int labels[SPLIT_ROWS];
    int r;
    for (r = 0; r < SPLIT_ROWS; r++) labels[r] = (r * 37) % SPLIT_COLS;
    switch (f) {
    case 0: return ad_exp(T, x);
    case 1: return ad_log(T, ad_abs(T, x));
    case 2: return ad_sigmoid(T, x);
    case 3: return ad_tanh(T, x);
    case 4: return ad_sin(T, x);
    case 5: return ad_relu(T, x);
    case 6: return ad_leaky_relu(T, x, (ad_real)0.1);
    case 7: return ad_square(T, x);
    case 8: return ad_clamp(T, x, (ad_real)-0.5, (ad_real)0.7);
    case 9: return ad_affine(T, x, (ad_real)-1.5, (ad_real)0.25);
    case 10: return ad_softmax(T, x, 1);
    case 11: return ad_softmax(T, x, 0);
    case 12: return ad_log_softmax(T, x, 1);
    case 13: return ad_gelu(T, x);
    case 14: return ad_mul(T, x, x2);
    case 15: return ad_div(T, x, ad_add_scalar(T, ad_abs(T, x2), (ad_real)0.5));
    case 16: return ad_sub(T, x, x2);
    case 17: return ad_maximum(T, x, x2);
    case 18: return ad_sum_axis(T, x, 1, 1);
    case 19: return ad_mean_axis(T, x, 0, 1);
    default: return ad_cross_entropy(T, x, labels); /* rows of 263 classes */
    }
}

/* f's value and the gradients of sum(f(x, x2) w) (+ sum(x w) + sum(x2 w) recorded first when
   reuse) on t threads, copied into y (zeros after f's values), dx and dx2; the sum itself into
   *total */
static int split_run(int t, int f, int reuse, ad_real *y, ad_real *dx, ad_real *dx2, ad_real *total)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_tensor *x, *x2, *w, *fx, *loss;
    int ok;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 40 + (uint64_t)f);
    x = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -2, 2, &rng);
    x2 = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -2, 2, &rng);
    w = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -1, 1, &rng);
    ad_set_requires_grad(x, 1);
    ad_set_requires_grad(x2, 1);
    fx = split_func(T, f, x, x2);
    loss = ad_sum(T, ad_mul(T, fx, w));
    if (reuse) loss = ad_add(T, ad_sum(T, ad_mul(T, ad_add(T, x, x2), w)), loss);
    ok = fx && loss && ad_backward(T, loss) == 0 && x->grad;
    if (ok) {
        memset(y, 0, (size_t)SPLIT_ROWS * SPLIT_COLS * sizeof(ad_real));
        memcpy(y, fx->data, fx->size * sizeof(ad_real));
        *total = loss->data[0];
        memcpy(dx, x->grad, x->size * sizeof(ad_real));
        if (x2->grad) memcpy(dx2, x2->grad, x2->size * sizeof(ad_real));
        else memset(dx2, 0, x2->size * sizeof(ad_real));
    }
    ad_tape_free(T);
    return ok;
}

/* (i3) sums of long runs, taken in chunks on threads, against the exact sum of the same floats
   (in long double): within the worst-case rounding of the order the header sums in, depth u
   times the sum of magnitudes, where a value passes through at most depth additions (a
   chunk's lane of chunk / 8 values, three to combine the lanes and the tail, at most 256
   chunk sums); lengths across the chunk sizes */
static void test_float_long_sum(void)
{
    static const size_t lengths[] = {32768, 32769, 262143, 262144 + 17, 1000003, 9000011};
    ad_tape *T = ad_tape_new();
    size_t li, i;
    int t;
    for (li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
        for (t = 1; t <= 3; t += 2) {
            size_t n = lengths[li];
            int shape[1];
            ad_tensor *x, *s;
            long double exact = 0, mag = 0;
            shape[0] = (int)n;
            ad_set_threads(T, t);
            x = ad_zeros(T, 1, shape);
            if (!x) {
                TH_CHECK(0, "out of memory");
                break;
            }
            for (i = 0; i < n; i++) {
                x->data[i] = (float)((double)(i % 1000) * 0.001 - 0.3);
                exact += x->data[i];
                mag += fabsl((long double)x->data[i]);
            }
            s = ad_sum(T, x);
            {
                size_t chunk = n / 256 + 1 > 32768 ? n / 256 + 1 : 32768;
                long double depth = (long double)(chunk / 8 + 1 + 3 + 256);
                TH_CHECK(s && fabsl((long double)s->data[0] - exact) <= depth * ldexp(1.0, -24) * mag,
                         "sum of %zu floats on %d thread(s): %.9g, exact %.9Lg", n, t, s ? (double)s->data[0] : 0.0,
                         exact);
            }
            ad_tape_reset(T);
        }
    ad_tape_free(T);
}

/* (i4) max and average pooling, split over threads by planes (images times channels) from 32K
   input values: 2x2 windows (with an odd width, whose last column no window reaches) and 3x3
   windows with stride 2 and padding (averages over the cells inside), some planes holding NaNs
   and ties; values and the input's gradient (written, and added when x was used before) on two
   and three threads equal to one thread's bit for bit. */
enum { POOL_N = 3, POOL_C = 13, POOL_H = 31, POOL_W = 35 };

static int pool_run(int t, int avg, int wide, int reuse, ad_real *y, ad_real *dx)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_pool2d_desc d;
    ad_tensor *x, *w, *m, *loss;
    size_t k;
    int ok;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 90 + (uint64_t)wide);
    memset(&d, 0, sizeof d);
    d.stride_h = d.stride_w = 2;
    d.pad_h = d.pad_w = wide;
    d.exclude_pad = wide;
    x = ad_rand(T, AD_SHAPE(POOL_N, POOL_C, POOL_H, POOL_W), -1, 1, &rng);
    if (!x) {
        ad_tape_free(T);
        return 0;
    }
    for (k = 0; k + 1 < x->size; k += 97) x->data[k] = x->data[k + 1]; /* ties */
    for (k = 5; k < x->size; k += 4099) x->data[k] = (ad_real)NAN;
    ad_set_requires_grad(x, 1);
    m = avg ? ad_avg_pool2d(T, x, 2 + wide, 2 + wide, &d) : ad_max_pool2d(T, x, 2 + wide, 2 + wide, &d);
    w = m ? ad_rand(T, m->ndim, m->shape, -1, 1, &rng) : NULL;
    loss = ad_sum(T, ad_mul(T, m, w));
    if (reuse) loss = ad_add(T, ad_sum(T, ad_mul_scalar(T, x, 3)), loss);
    ok = loss && ad_backward(T, loss) == 0 && x->grad;
    if (ok) {
        memset(y, 0, x->size * sizeof(ad_real));
        memcpy(y, m->data, m->size * sizeof(ad_real));
        memcpy(dx, x->grad, x->size * sizeof(ad_real));
    }
    ad_tape_free(T);
    return ok;
}

static void test_threads_pool(void)
{
    size_t n = (size_t)POOL_N * POOL_C * POOL_H * POOL_W, bytes = n * sizeof(ad_real);
    ad_real *one = (ad_real *)calloc(2, bytes), *more = (ad_real *)calloc(2, bytes);
    int avg, wide, reuse, t;
    if (!one || !more) {
        TH_CHECK(0, "out of memory");
        free(one);
        free(more);
        return;
    }
    for (avg = 0; avg <= 1; avg++)
        for (wide = 0; wide <= 1; wide++)
            for (reuse = 0; reuse <= 1; reuse++) {
                const char *kind = avg ? "average" : "max";
                TH_CHECK(pool_run(1, avg, wide, reuse, one, one + n), "%dx%d %s pooling on one thread failed",
                         2 + wide, 2 + wide, kind);
                for (t = 2; t <= 3; t++) {
                    int ok = pool_run(t, avg, wide, reuse, more, more + n);
                    TH_CHECK(ok && memcmp(more, one, bytes) == 0, "%dx%d %s pooling on %d threads: values differ",
                             2 + wide, 2 + wide, kind, t);
                    TH_CHECK(ok && memcmp(more + n, one + n, bytes) == 0,
                             "%dx%d %s pooling on %d threads (input used %s): gradients differ", 2 + wide, 2 + wide,
                             kind, t, reuse ? "twice" : "once");
                }
            }
    free(one);
    free(more);
}

static void test_threads_elementwise(void)
{
    size_t n = (size_t)SPLIT_ROWS * SPLIT_COLS, bytes = n * sizeof(ad_real);
    ad_real *one = (ad_real *)malloc(3 * bytes), *more = (ad_real *)malloc(3 * bytes);
    int f, t, reuse;
    if (!one || !more) {
        TH_CHECK(0, "out of memory");
        free(one);
        free(more);
        return;
    }
    for (f = 0; f < SPLIT_FUNCS; f++)
        for (reuse = 0; reuse <= 1; reuse++) {
            ad_real total1 = 0, total = 0;
            TH_CHECK(split_run(1, f, reuse, one, one + n, one + 2 * n, &total1), "function %d on one thread failed", f);
            for (t = 2; t <= 3; t++) {
                int ok = split_run(t, f, reuse, more, more + n, more + 2 * n, &total);
                TH_CHECK(ok && memcmp(&total, &total1, sizeof total) == 0,
                         "function %d on %d threads: the sum differs from one thread's", f, t);
                TH_CHECK(ok && memcmp(more, one, bytes) == 0,
                         "function %d on %d threads: values differ from one thread's", f, t);
                TH_CHECK(ok && memcmp(more + n, one + n, 2 * bytes) == 0,
                         "function %d on %d threads (inputs used %s): gradients differ from one thread's", f, t,
                         reuse ? "twice" : "once");
            }
        }
    free(one);
    free(more);
}

/* (i2b) leaves' gradients added up over two sweeps, on tensors large enough for the sums to be
   split over threads: x and x2 get the gradient of an add, then a second sweep adds exp(x) x2
   and exp(x) to them. On two and three threads the bits of one thread's, and near
   w + exp(x) x2 and w + exp(x). */
static int leaf_run(int t, ad_real *dx, ad_real *dx2, ad_real *want, ad_real *want2)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    ad_tensor *x, *x2, *w, *loss;
    size_t i;
    int ok;
    ad_set_threads(T, t);
    ad_rng_seed(&rng, 71);
    x = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -2, 2, &rng);
    x2 = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -2, 2, &rng);
    w = ad_rand(T, AD_SHAPE(SPLIT_ROWS, SPLIT_COLS), -1, 1, &rng);
    ad_set_requires_grad(x, 1);
    ad_set_requires_grad(x2, 1);
    loss = ad_sum(T, ad_mul(T, ad_add(T, x, x2), w));
    ok = loss && ad_backward(T, loss) == 0;
    loss = ad_sum(T, ad_mul(T, ad_exp(T, x), x2));
    ok = ok && loss && ad_backward(T, loss) == 0 && x->grad && x2->grad;
    if (ok) {
        memcpy(dx, x->grad, x->size * sizeof(ad_real));
        memcpy(dx2, x2->grad, x2->size * sizeof(ad_real));
        for (i = 0; i < x->size; i++) {
            want[i] = w->data[i] + (ad_real)exp((double)x->data[i]) * x2->data[i];
            want2[i] = w->data[i] + (ad_real)exp((double)x->data[i]);
        }
    }
    ad_tape_free(T);
    return ok;
}

static void test_threads_leaf_grads(void)
{
    size_t n = (size_t)SPLIT_ROWS * SPLIT_COLS, bytes = n * sizeof(ad_real), i, far = 0;
    ad_real *one = (ad_real *)malloc(4 * bytes), *more = (ad_real *)malloc(4 * bytes);
    int t;
    if (!one || !more) {
        TH_CHECK(0, "out of memory");
        free(one);
        free(more);
        return;
    }
    TH_CHECK(leaf_run(1, one, one + n, one + 2 * n, one + 3 * n), "leaf gradients on one thread failed");
    for (i = 0; i < 2 * n; i++)
        if (fabs((double)one[i] - (double)one[2 * n + i]) > 1e-5 * (1 + fabs((double)one[2 * n + i]))) far++;
    TH_CHECK(far == 0, "%zu leaf gradients far from w + exp(x) x2 and w + exp(x)", far);
    for (t = 2; t <= 3; t++) {
        int ok = leaf_run(t, more, more + n, more + 2 * n, more + 3 * n);
        TH_CHECK(ok && memcmp(more, one, 2 * bytes) == 0, "leaf gradients on %d threads differ from one thread's", t);
    }
    free(one);
    free(more);
}

/* (j) scalar tapes: ops on one-element tensors take a path of their own (one block per binary
   entry; in plain sweeps gradients held as values in the sweep's table, not as tensors). The
   same expressions on two-element tensors take the general path, and on a tape in anomaly mode
   the sweep holds every gradient as a tensor; all must give the same values and gradients,
   through leaves used several times, squares, unary functions, sums that share one gradient,
   caller-owned gradients that accumulate, ad_grad of intermediates, second derivatives and
   reused tapes. */
enum { SCALAR_LEAVES = 3 };

/* A fixed expression over three leaves of any one shape; returns its one-element result (a sum
   of the elements for the two-element form) and, in *mid, an intermediate. */
static ad_tensor *scalar_expr(ad_tape *T, ad_tensor **x, ad_tensor **mid)
{
    ad_tensor *a = x[0], *b = x[1], *c = x[2];
    ad_tensor *u = ad_sub(T, b, ad_mul(T, a, c));         /* u's gradient becomes the product's */
    ad_tensor *v = ad_mul(T, u, u);                        /* a square */
    ad_tensor *w = ad_div(T, ad_sub(T, v, a), ad_add(T, b, c));
    ad_tensor *z = ad_mul(T, ad_sub(T, w, ad_mul(T, a, c)), ad_add(T, ad_div(T, c, a), b));
    ad_tensor *m = ad_maximum(T, z, ad_minimum(T, a, c)); /* the general backward */
    ad_tensor *r = w ? ad_reshape(T, w, w->ndim, w->shape) : NULL; /* w shares r's gradient */
    ad_tensor *s = ad_add(T, ad_sin(T, u), ad_exp(T, ad_neg(T, ad_square(T, c))));
    ad_tensor *l = ad_log(T, ad_add_scalar(T, ad_mul(T, b, b), 1)); /* a shift passes g on */
    ad_tensor *y = ad_add(T, ad_mul(T, m, ad_sub(T, a, r)), ad_add(T, z, ad_mul(T, ad_tanh(T, s), l)));
    if (mid) *mid = u;
    return y && y->size > 1 ? ad_sum(T, y) : y;
}

static int scalar_close(double got, double want)
{
    return fabs(got - want) <= 1e-6 * (fabs(want) > 1 ? fabs(want) : 1);
}

static void test_scalar_tape(void)
{
    static const float vals[][SCALAR_LEAVES] = {{1.5f, 0.7f, -0.4f}, {-2.0f, 0.3f, 1.25f}, {0.9f, -1.1f, 2.5f}};
    ad_tape *T = ad_tape_new(), *R = ad_tape_new(), *A = ad_tape_new();
    int two[] = {2}, round, i, k;
    long settled = 0;
    size_t peak = 0;
    for (round = 0; round < 40; round++) {
        const float *v = vals[round % 3];
        ad_tensor *x[SCALAR_LEAVES], *xr[SCALAR_LEAVES], *xa[SCALAR_LEAVES], *y, *yr, *u, *ur, *gu, *gur;
        float pair[2], held[SCALAR_LEAVES] = {0.5f, 0, 0}, ext_data = v[0];
        ad_real plain_or_watched[2][SCALAR_LEAVES];
        for (i = 0; i < SCALAR_LEAVES; i++) {
            pair[0] = pair[1] = v[i];
            xr[i] = ad_tensor_new(R, 1, two, pair, 1);
        }
        /* the first leaf is the caller's, with a gradient that already holds 0.5 */
        x[0] = ad_tensor_view(T, 0, NULL, &ext_data, &held[0], 1);
        x[1] = ad_var(T, v[1]);
        x[2] = ad_var(T, v[2]);
        y = scalar_expr(T, x, &u);
        yr = scalar_expr(R, xr, &ur);
        TH_CHECK(y && yr, "round %d: %s / %s", round, th_errs(T), th_errs(R));
        if (!y || !yr) break;
        TH_CHECK(scalar_close(ad_item(y), 0.5 * ad_item(yr)), "round %d: value %.9g, general path %.9g",
                 round, (double)ad_item(y), 0.5 * (double)ad_item(yr));
        /* d y / d u of an intermediate, before and after ad_backward, and twice ad_backward */
        gu = ad_grad(T, y, u, 0);
        gur = ad_grad(R, yr, ur, 0);
        TH_CHECK(gu && gur && scalar_close(gu->data[0], gur->data[0]), "round %d: d y / d u %g vs %g", round,
                 gu ? (double)gu->data[0] : 0.0, gur ? (double)gur->data[0] : 0.0);
        TH_CHECK(ad_backward(T, y) == 0 && ad_backward(T, y) == 0, "round %d backward: %s", round, th_errs(T));
        TH_CHECK(ad_backward(R, yr) == 0 && ad_backward(R, yr) == 0, "round %d backward: %s", round, th_errs(R));
        TH_CHECK(gu && gur && scalar_close(gu->data[0], gur->data[0]), "round %d: ad_backward changed d y / d u",
                 round);
        TH_CHECK(scalar_close(held[0], 0.5 + xr[0]->grad[0]) && scalar_close(held[0], 0.5 + xr[0]->grad[1]),
                 "round %d: caller's gradient %.9g, general path 0.5 + %.9g", round, (double)held[0],
                 (double)xr[0]->grad[0]);
        for (k = 1; k < SCALAR_LEAVES; k++)
            TH_CHECK(scalar_close(ad_grad_item(x[k]), xr[k]->grad[0]), "round %d: d y / d x%d %.9g, general %.9g",
                     round, k, (double)ad_grad_item(x[k]), (double)xr[k]->grad[0]);
        /* one sweep holding one-element gradients as values, one (anomaly mode) holding them
           as tensors: the same formulas in the same order, so bit for bit */
        for (k = 0; k < 2; k++) {
            ad_set_detect_anomaly(A, k);
            for (i = 0; i < SCALAR_LEAVES; i++) xa[i] = ad_var(A, v[i]);
            TH_CHECK(ad_backward(A, scalar_expr(A, xa, NULL)) == 0, "round %d, anomaly mode %d: %s", round, k,
                     th_errs(A));
            for (i = 0; i < SCALAR_LEAVES; i++) plain_or_watched[k][i] = ad_grad_item(xa[i]);
            ad_tape_reset(A);
        }
        TH_CHECK(memcmp(plain_or_watched[0], plain_or_watched[1], sizeof plain_or_watched[0]) == 0,
                 "round %d: gradients %.9g %.9g %.9g in a plain sweep, %.9g %.9g %.9g in anomaly mode", round,
                 (double)plain_or_watched[0][0], (double)plain_or_watched[0][1], (double)plain_or_watched[0][2],
                 (double)plain_or_watched[1][0], (double)plain_or_watched[1][1], (double)plain_or_watched[1][2]);
        ad_tape_reset(T);
        ad_tape_reset(R);
        /* the same rounds on a reused tape: no allocation, the same peak */
        if (round == 5) {
            settled = allocs();
            peak = ad_tape_bytes_peak(T);
        }
    }
    TH_CHECK(allocs() == settled, "a scalar tape kept allocating: %ld blocks", allocs() - settled);
    TH_CHECK(ad_tape_bytes_peak(T) == peak, "a scalar tape's peak grew from %zu to %zu", peak,
             ad_tape_bytes_peak(T));
    /* the tutorial function against its derivatives by hand */
    {
        double a = 1.5, b = 0.7, l = a / b - a, m = b / a + a + b, r = a - b;
        double dl_da = 1 / b - 1, dl_db = -a / (b * b), dm_da = -b / (a * a) + 1, dm_db = 1 / a + 1;
        double da = dl_da * m * r + l * dm_da * r + l * m, db = dl_db * m * r + l * dm_db * r - l * m;
        ad_tensor *A = ad_var(T, (ad_real)a), *B = ad_var(T, (ad_real)b);
        ad_tensor *f = ad_mul(T, ad_mul(T, ad_sub(T, ad_div(T, A, B), A), ad_add(T, ad_add(T, ad_div(T, B, A), A), B)),
                              ad_sub(T, A, B));
        TH_CHECK(ad_backward(T, f) == 0, "tutorial: %s", th_errs(T));
        TH_CHECK(fabs(ad_grad_item(A) - da) < 1e-5 * fabs(da) && fabs(ad_grad_item(B) - db) < 1e-5 * fabs(db),
                 "tutorial: gradients %.7g %.7g, by hand %.7g %.7g", (double)ad_grad_item(A),
                 (double)ad_grad_item(B), da, db);
        ad_tape_reset(T);
    }
    /* names and parameters do not make a sweep hold gradients as tensors: the sweep of the
       tutorial function takes as many bytes of the tape with a named leaf as with plain leaves,
       and with leaves from a parameter store as with leaves whose gradients are the caller's
       (both get views of their gradient buffers), and all give the same gradients */
    {
        ad_params *P = ad_params_new(1);
        int pa = ad_params_add(P, "a", 0, NULL, NULL), pb = ad_params_add(P, "b", 0, NULL, NULL), kind;
        size_t sweep_bytes[4] = {0, 0, 0, 0};
        ad_real grads[4][2], data[2], caller_grads[2];
        memset(grads, 0, sizeof grads);
        for (kind = 0; kind < 4 && P; kind++) {
            ad_tensor *A, *B, *f;
            size_t before;
            if (kind < 2) {
                A = ad_var(T, 1.5f);
                B = ad_var(T, 0.7f);
                if (kind == 1) ad_set_name(A, "a");
            } else if (kind == 2) {
                data[0] = 1.5f;
                data[1] = 0.7f;
                caller_grads[0] = caller_grads[1] = 0;
                A = ad_tensor_view(T, 0, NULL, &data[0], &caller_grads[0], 1);
                B = ad_tensor_view(T, 0, NULL, &data[1], &caller_grads[1], 1);
            } else {
                A = ad_param(T, P, pa);
                B = ad_param(T, P, pb);
                if (A && B) {
                    A->data[0] = 1.5f;
                    B->data[0] = 0.7f;
                }
            }
            f = ad_mul(T, ad_mul(T, ad_sub(T, ad_div(T, A, B), A), ad_add(T, ad_add(T, ad_div(T, B, A), A), B)),
                       ad_sub(T, A, B));
            before = ad_tape_bytes_used(T);
            TH_CHECK(f && ad_backward(T, f) == 0, "sweep %d: %s", kind, th_errs(T));
            sweep_bytes[kind] = ad_tape_bytes_used(T) - before;
            grads[kind][0] = A && A->grad ? A->grad[0] : 0;
            grads[kind][1] = B && B->grad ? B->grad[0] : 0;
            ad_tape_reset(T);
        }
        /* (the same up to the alignment of the sweep's table: a name moves the arena's offset) */
        TH_CHECK(P && sweep_bytes[1] < sweep_bytes[0] + 64 && sweep_bytes[3] < sweep_bytes[2] + 64,
                 "a sweep took %zu bytes with plain leaves and %zu with a named leaf; %zu with the "
                 "caller's gradients and %zu with parameters",
                 sweep_bytes[0], sweep_bytes[1], sweep_bytes[2], sweep_bytes[3]);
        for (kind = 1; kind < 4; kind++)
            TH_CHECK(memcmp(grads[kind], grads[0], sizeof grads[0]) == 0,
                     "sweep %d: gradients %.9g %.9g, with plain leaves %.9g %.9g", kind, (double)grads[kind][0],
                     (double)grads[kind][1], (double)grads[0][0], (double)grads[0][1]);
        ad_params_free(P);
    }
    /* a gradient of -0 stays -0 whether the sweep holds it as a value or as a tensor (anomaly
       mode): d (a c) / d a = c = -0, reached once; d (a c + a c) / d a = -0 + -0 */
    for (k = 0; k < 2; k++) {
        ad_tensor *A, *C, *f;
        ad_set_detect_anomaly(T, k);
        A = ad_var(T, 2.0f);
        C = ad_var(T, -(ad_real)0);
        f = ad_mul(T, A, C);
        TH_CHECK(f && ad_backward(T, f) == 0 && A->grad && C->grad && signbit(A->grad[0]) && A->grad[0] == 0 &&
                     C->grad[0] == 2,
                 "anomaly mode %d: d (a c) / d a = %g (sign %d), d / d c = %g", k, A->grad ? (double)A->grad[0] : 1.0,
                 A->grad ? (int)(signbit(A->grad[0]) != 0) : -1, C->grad ? (double)C->grad[0] : 0.0);
        ad_tape_reset(T);
        A = ad_var(T, 2.0f);
        C = ad_var(T, -(ad_real)0);
        f = ad_add(T, ad_mul(T, A, C), ad_mul(T, C, A));
        TH_CHECK(f && ad_backward(T, f) == 0 && A->grad && signbit(A->grad[0]) && A->grad[0] == 0, "anomaly mode %d: two -0 "
                 "contributions gave %g (sign %d)", k, A->grad ? (double)A->grad[0] : 1.0,
                 A->grad ? (int)(signbit(A->grad[0]) != 0) : -1);
        ad_tape_reset(T);
    }
    ad_set_detect_anomaly(T, 0);
    /* second derivatives go through the general backward: d2 (x^3 / x2) / dx2 = 6 x / x2 */
    {
        ad_tensor *X = ad_var(T, 1.25f), *X2 = ad_var(T, 2.0f);
        ad_tensor *c = ad_div(T, ad_mul(T, ad_mul(T, X, X), X), X2);
        ad_tensor *d1 = ad_grad(T, c, X, 1), *d2 = d1 ? ad_grad(T, d1, X, 0) : NULL;
        TH_CHECK(d1 && fabs(d1->data[0] - 3 * 1.25 * 1.25 / 2) < 1e-6, "first derivative %g",
                 d1 ? (double)d1->data[0] : 0.0);
        TH_CHECK(d2 && fabs(d2->data[0] - 6 * 1.25 / 2) < 1e-6, "second derivative %g", d2 ? (double)d2->data[0] : 0.0);
        ad_tape_reset(T);
    }
    /* scalar entries between general ones, shapes [1,1] and [1] (broadcast against a scalar),
       constants, and no-grad mode */
    {
        int s3[] = {3}, s11[] = {1, 1}, s1[] = {1};
        float three[] = {0.5f, -1.0f, 2.0f}, one = 0.75f;
        ad_tensor *P = ad_tensor_new(T, 1, s3, three, 1), *Q = ad_tensor_new(T, 2, s11, &one, 1);
        ad_tensor *S1 = ad_tensor_new(T, 1, s1, &one, 1), *k = ad_scalar(T, 3);
        ad_tensor *s = ad_sum(T, ad_mul(T, P, P));             /* 5.25: the general path */
        ad_tensor *q = ad_mul(T, ad_add(T, Q, Q), Q);          /* [1,1]: 2 Q^2 */
        ad_tensor *h = ad_mul(T, ad_mul(T, s, k), ad_sub(T, S1, s)); /* [1]: broadcast */
        ad_tensor *o = ad_add(T, ad_sum(T, h), ad_sum(T, q));
        int was;
        /* [1,1] + [1]: both one element, so the two inputs share the sum's gradient; the [1,1]
           input's own entry must not reuse it, as the [1] input's entry reads it later */
        ad_tensor *e1 = ad_mul(T, S1, S1), *e2 = ad_mul(T, ad_mul(T, Q, Q), Q);
        o = ad_add(T, o, ad_sum(T, ad_mul(T, ad_add(T, e2, e1), k)));
        TH_CHECK(o && ad_backward(T, o) == 0, "mixed: %s", th_errs(T));
        /* o = 3 s (S1 - s) + 2 Q^2 + 3 (Q^3 + S1^2): do/ds = 3 S1 - 6 s, ds/dP = 2 P */
        for (i = 0; i < 3; i++)
            TH_CHECK(fabs(P->grad[i] - (3 * 0.75 - 6 * 5.25) * 2 * three[i]) < 1e-4, "mixed: d o / d P[%d] = %g", i,
                     (double)P->grad[i]);
        TH_CHECK(fabs(Q->grad[0] - (4 * 0.75 + 9 * 0.75 * 0.75)) < 1e-5 && fabs(S1->grad[0] - 3 * 5.25 - 6 * 0.75) < 1e-5 &&
                     k->grad == NULL,
                 "mixed: d o / d Q = %g, d o / d S1 = %g", (double)Q->grad[0], (double)S1->grad[0]);
        was = ad_set_grad_enabled(T, 0);
        k = ad_mul(T, Q, Q);
        TH_CHECK(k && k->node == NULL && !k->requires_grad && ad_item(k) == 0.75f * 0.75f,
                 "no-grad scalar op recorded or wrong");
        ad_set_grad_enabled(T, was);
    }
    ad_tape_free(T);
    ad_tape_free(R);
    ad_tape_free(A);
}

/* (i) the optimizers in single precision against their formulas in double, on a store whose
   runs of trained parameters (a frozen one between them) are no multiple of any vector width,
   so both the vector loops and their scalar tails are checked: five steps of each kind. "b"
   has a group of its own (half the lr, no weight decay). */
static void test_float_optim(void)
{
    static const int s_a[2] = {5, 7}, s_frozen[1] = {13}, s_b[2] = {3, 9}, s_c[1] = {1}, s_d[1] = {101};
    const char *names[7] = {"SGD", "SGD with momentum", "Adam", "AdamW", "RMSprop centered with momentum",
                            "RMSprop", "Adagrad"};
    int k;
    for (k = 0; k < 7; k++) {
        ad_params *P = ad_params_new(5);
        ad_optim_desc d;
        ad_optim *O;
        ad_rng rng;
        ad_init init;
        double *p, *m, *v, *b, worst = 0;
        size_t n, i, f0, f1, b0, b1;
        int step;
        memset(&init, 0, sizeof init);
        init.kind = AD_INIT_NORMAL;
        ad_params_add(P, "a", 2, s_a, &init);
        ad_params_set_trainable(P, ad_params_add(P, "frozen", 1, s_frozen, &init), 0);
        ad_params_set_group(P, ad_params_add(P, "b", 2, s_b, &init), 0.5, 0);
        ad_params_add(P, "c", 1, s_c, &init);
        ad_params_add(P, "d", 1, s_d, &init);
        memset(&d, 0, sizeof d);
        d.kind = k < 2 ? AD_OPTIM_SGD : k == 2 ? AD_OPTIM_ADAM : k == 3 ? AD_OPTIM_ADAMW : k < 6 ? AD_OPTIM_RMSPROP
                                                                                            : AD_OPTIM_ADAGRAD;
        d.lr = k < 2 ? 0.05 : 0.01;
        d.momentum = k == 1 || k == 4 ? 0.9 : 0;
        d.weight_decay = k == 3 ? 0.1 : 0.01;
        d.beta1 = 0.9;
        d.beta2 = 0.999;
        d.eps = k == 6 ? 1e-10 : 1e-8;
        d.alpha = 0.9;
        d.centered = k == 4;
        d.lr_decay = 0.05;
        d.initial_accumulator_value = 0.1;
        O = ad_optim_new(P, &d);
        n = ad_params_scalars(P);
        f0 = ad_params_info(P, 1).offset;
        f1 = f0 + ad_params_info(P, 1).size;
        b0 = ad_params_info(P, 2).offset;
        b1 = b0 + ad_params_info(P, 2).size;
        p = (double *)calloc(4 * n, sizeof(double));
        if (!O || !p) {
            TH_CHECK(0, "%s: set-up failed", names[k]);
            ad_optim_free(O);
            ad_params_free(P);
            free(p);
            continue;
        }
        m = p + n;
        v = m + n;
        b = v + n;
        for (i = 0; i < n; i++) p[i] = ad_params_values(P)[i];
        if (d.kind == AD_OPTIM_ADAGRAD)
            for (i = 0; i < n; i++) v[i] = (float)d.initial_accumulator_value;
        ad_rng_seed(&rng, 11);
        for (step = 1; step <= 5; step++) {
            for (i = 0; i < n; i++) ad_params_grads(P)[i] = (float)ad_rng_normal(&rng);
            for (i = 0; i < n; i++) {
                double g = ad_params_grads(P)[i], avg;
                int in_b = i >= b0 && i < b1;
                double lr = in_b ? d.lr * 0.5 : d.lr, wd = in_b ? 0 : d.weight_decay;
                if (i >= f0 && i < f1) continue;
                if (d.kind == AD_OPTIM_SGD) {
                    g += wd * p[i];
                    if (d.momentum != 0) g = m[i] = step > 1 ? d.momentum * m[i] + g : g;
                    p[i] -= lr * g;
                    continue;
                }
                if (d.kind == AD_OPTIM_RMSPROP) {
                    g += wd * p[i];
                    v[i] = d.alpha * v[i] + (1 - d.alpha) * g * g;
                    if (d.centered) {
                        m[i] = d.alpha * m[i] + (1 - d.alpha) * g;
                        avg = sqrt(v[i] - m[i] * m[i]) + d.eps;
                    } else {
                        avg = sqrt(v[i]) + d.eps;
                    }
                    if (d.momentum != 0) p[i] -= lr * (b[i] = d.momentum * b[i] + g / avg);
                    else p[i] -= lr * g / avg;
                    continue;
                }
                if (d.kind == AD_OPTIM_ADAGRAD) {
                    g += wd * p[i];
                    v[i] += g * g;
                    p[i] -= lr / (1 + (step - 1) * d.lr_decay) * g / (sqrt(v[i]) + d.eps);
                    continue;
                }
                if (d.kind == AD_OPTIM_ADAMW) p[i] -= lr * wd * p[i];
                else g += wd * p[i];
                m[i] = d.beta1 * m[i] + (1 - d.beta1) * g;
                v[i] = d.beta2 * v[i] + (1 - d.beta2) * g * g;
                p[i] -= lr * (m[i] / (1 - pow(d.beta1, step))) / (sqrt(v[i] / (1 - pow(d.beta2, step))) + d.eps);
            }
            TH_CHECK(ad_optim_step(O) == 0, "%s: step %d", names[k], step);
        }
        for (i = 0; i < n; i++) {
            double e = fabs(ad_params_values(P)[i] - p[i]) / (1 + fabs(p[i]));
            if (e > worst) worst = e;
        }
        TH_CHECK(worst <= 1e-6, "%s in single precision: off its formula by %g (relative to 1 + |p|)", names[k],
                 worst);
        ad_optim_free(O);
        ad_params_free(P);
        free(p);
    }
}

/* Distance of a float result from the exact value ref, in units in the last place of the float
   nearest ref (the smallest subnormal below the normal range); 0 when both are the same
   infinity or both NaN, and 1e30 for any other mismatch of kind. */
static double ulps_off(float y, double ref)
{
    float r = (float)ref;
    double unit;
    if (ref != ref) return y != y ? 0 : 1e30;
    if (isinf(r) || isinf(y)) return y == r ? 0 : 1e30;
    if (y != y) return 1e30;
    unit = (double)nextafterf(fabsf(r), INFINITY) - fabsf(r);
    return fabs((double)y - ref) / unit;
}

/* The inputs of the accuracy tests: n floats, alternately linear steps across [-115, 115] and
   powers of ten from 1e-40 to 1e2, both signs. */
static void fill_accuracy_grid(float *x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        double u = (double)i / (double)n;
        float mag = i % 4 < 2 ? (float)(230 * u - 115) : (float)pow(10.0, -40 + 42 * u);
        x[i] = i % 2 ? -mag : mag;
    }
}

/* (j) exp, log, sigmoid, tanh, sin and cos in single precision (vectorised where the machine
   allows) against double-precision values, over about a million inputs: linear steps across the
   whole range where the result is finite and beyond, and powers of ten down to subnormals, both
   signs, an odd count so that a last part vector is done; then the special values, among them
   the worst cases of sin and cos found over all floats up to 2^20. */
static void test_float_unary_accuracy(void)
{
    static const struct {
        const char *name;
        double bound; /* ulps: the vector functions' worst case over all floats, see >>ops:elementwise */
    } kinds[6] = {{"ad_exp", 1.25}, {"ad_log", 1.0}, {"ad_sigmoid", 2.5}, {"ad_tanh", 3.3}, {"ad_sin", 0.55},
                  {"ad_cos", 0.55}};
    /* where sin and cos come from the C library (AUTODIFF_NO_DISPATCH, other machines), its
       bound: within 1 ulp (glibc's sinf and cosf are 0.56 off on these inputs) */
    ad_real probe = 0;
    double sincos_bound = ad__unary_vectorised(AD__U_SIN, &probe, &probe, 0) ? 0.55 : 1.0;
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 88.72283f,
                                    88.7229f, 89.0f, -87.33654f, -103.97f, -104.0f, -150.0f, 10.0f, -10.5f,
                                    1048576.0f, -1048576.0f, 780036.25f, 1092.48877f, 1.5707964f, 3.1415927f};
    const size_t n = ((size_t)1 << 20) + 13, ns = sizeof special / sizeof special[0];
    int shape[1], k;
    size_t i;
    float *x = (float *)malloc((n + ns) * sizeof(float));
    ad_tape *T = ad_tape_new();
    if (!x || !T) {
        TH_CHECK(0, "out of memory");
        free(x);
        ad_tape_free(T);
        return;
    }
    fill_accuracy_grid(x, n);
    memcpy(x + n, special, sizeof special);
    shape[0] = (int)(n + ns);
    for (k = 0; k < 6; k++) {
        ad_tensor *a = ad_tensor_view(T, 1, shape, x, NULL, 0);
        ad_tensor *y = k == 0 ? ad_exp(T, a) : k == 1 ? ad_log(T, a) : k == 2 ? ad_sigmoid(T, a) : k == 3 ? ad_tanh(T, a)
                     : k == 4 ? ad_sin(T, a) : ad_cos(T, a);
        double worst = 0, worst_x = 0;
        int specials_ok = 1;
        if (!y) {
            TH_CHECK(0, "%s: %s", kinds[k].name, ad_tape_error(T));
            break;
        }
        for (i = 0; i < n + ns; i++) {
            double xi = x[i], ref = k == 0 ? exp(xi) : k == 1 ? log(xi) : k == 2 ? 1 / (1 + exp(-xi)) : k == 3 ? tanh(xi)
                                  : k == 4 ? sin(xi) : cos(xi);
            double off = ulps_off(y->data[i], ref);
            if (off > worst) {
                worst = off;
                worst_x = xi;
            }
            /* exact values at 0 and -0: 1, -infinity, 0.5, a zero of x's sign (tanh, sin), 1 */
            if (xi == 0 && (k == 0 || k == 5 ? y->data[i] != 1
                            : k == 1         ? y->data[i] != -INFINITY
                            : k == 2         ? y->data[i] != 0.5f
                                             : y->data[i] != 0 || signbit(y->data[i]) != signbit(x[i])))
                specials_ok = 0;
        }
        TH_CHECK(worst <= (k >= 4 ? sincos_bound : kinds[k].bound),
                 "%s: %.3g ulps from the exact value at x = %.9g (bound %g)", kinds[k].name, worst, worst_x,
                 k >= 4 ? sincos_bound : kinds[k].bound);
        TH_CHECK(specials_ok, "%s: wrong value at 0 or -0", kinds[k].name);
        ad_tape_reset(T);
    }
    /* sin and cos leave magnitudes past 2^20, infinities and NaN to the C library: each such
       value, wherever it sits in a vector, is the C library's */
    {
        static const float far[] = {1048576.125f, -3e7f, 1e30f, -INFINITY, NAN, 2e6f, 123456789.0f};
        enum { FAR = sizeof far / sizeof far[0], LEN = 53 };
        float v[LEN];
        int bad = 0;
        for (k = 0; k < 2; k++) {
            ad_tensor *y;
            for (i = 0; i < LEN; i++) v[i] = i % 5 == 2 ? far[(i / 5) % FAR] : (float)i * 0.37f - 9.0f;
            shape[0] = LEN;
            y = k ? ad_cos(T, ad_tensor_view(T, 1, shape, v, NULL, 0)) : ad_sin(T, ad_tensor_view(T, 1, shape, v, NULL, 0));
            for (i = 0; y && i < LEN; i++) {
                float want = k ? cosf(v[i]) : sinf(v[i]);
                if (i % 5 == 2 && memcmp(&y->data[i], &want, sizeof want) != 0 && !(want != want && y->data[i] != y->data[i]))
                    bad++;
            }
            TH_CHECK(y && bad == 0, "%s: %d values past 2^20, infinite or NaN differ from the C library's",
                     k ? "ad_cos" : "ad_sin", bad);
            ad_tape_reset(T);
        }
    }
    ad_tape_free(T);
    free(x);
}

/* (j1) The AVX2 versions of the vector functions, which run on machines without AVX-512, give
   bitwise the AVX-512 versions' values (NaN for NaN) on the million inputs of (j), the special
   values and every 4099th float; where AVX-512 is there to compare with. */
static void test_float_unary_avx2(void)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    static const int kinds[] = {AD__U_EXP, AD__U_LOG, AD__U_SIGMOID, AD__U_TANH, AD__U_SIN,
                                AD__U_COS, AD__U_ERF, AD__U_GELU, AD__VM_GELU_GRAD};
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 88.72283f,
                                    89.0f, -104.0f, -150.0f, 1048576.0f, -1048576.125f, 3.1415927f};
    const size_t grid = ((size_t)1 << 20) + 13, ns = sizeof special / sizeof special[0], step = 4099;
    const size_t n = grid + ns + ((size_t)1 << 32) / step + 1;
    float *x, *wide, *narrow;
    size_t i, k;
    if (ad__isa() != AD__ISA_AVX512) return;
    x = (float *)malloc(n * sizeof(float));
    wide = (float *)malloc(n * sizeof(float));
    narrow = (float *)malloc(n * sizeof(float));
    if (!x || !wide || !narrow) {
        TH_CHECK(0, "out of memory");
        free(x);
        free(wide);
        free(narrow);
        return;
    }
    fill_accuracy_grid(x, grid);
    memcpy(x + grid, special, sizeof special);
    for (i = grid + ns; i < n; i++) {
        uint32_t bits = (uint32_t)((i - grid - ns) * step);
        memcpy(&x[i], &bits, sizeof bits);
    }
    for (k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t differ = 0, first = 0;
        ad__vm512_unary(kinds[k], x, wide, n);
        ad__vm256_unary(kinds[k], x, narrow, n);
        for (i = 0; i < n; i++)
            if (memcmp(&wide[i], &narrow[i], sizeof(float)) != 0 && !(wide[i] != wide[i] && narrow[i] != narrow[i]))
                if (differ++ == 0) first = i;
        TH_CHECK(differ == 0, "%s: AVX2 and AVX-512 differ on %zu values, first at x = %.9g (%.9g against %.9g)",
                 kinds[k] < AD__U_COUNT ? ad__unary_names[kinds[k]] : "GELU's derivative", differ, x[first],
                 narrow[first], wide[first]);
    }
    free(x);
    free(wide);
    free(narrow);
#endif
}

/* The gradient norm's sums of squares at AVX2's width equal the portable loop's bit for bit,
   chunk by chunk: a store of several chunks and a last one that is no multiple of 8 values, values
   from 1e-30 to 1e30 (their squares beyond float's range, not double's), subnormals and zeros. */
static void test_float_clip_sum_avx2(void)
{
#if AD__X86_DISPATCH
    enum { N = 3 * 32768 + 6173, MAX_CHUNKS = 16 };
    static ad_real g[N];
    double part[2][MAX_CHUNKS];
    ad__clip_job job;
    ad_rng rng;
    size_t i, chunks;
    if (ad__isa() < AD__ISA_AVX2) return;
    ad_rng_seed(&rng, 78);
    for (i = 0; i < N; i++) g[i] = (ad_real)(ad_rng_normal(&rng) * pow(10.0, (double)(i % 61) - 30));
    g[5] = 1e-40f;
    g[77] = -1e-44f;
    g[N - 1] = 0;
    memset(&job, 0, sizeof job);
    job.g = g;
    job.n = N;
    job.chunk = ad__sum_chunk_length(N);
    chunks = (N + job.chunk - 1) / job.chunk;
    TH_CHECK(chunks > 1 && chunks <= MAX_CHUNKS && N % job.chunk % 8 != 0, "%u chunks of %u values",
             (unsigned)chunks, (unsigned)job.chunk);
    if (chunks > MAX_CHUNKS) return;
    job.part = part[0];
    ad__clip_sum_range(&job, 0, chunks);
    job.part = part[1];
    ad__clip_sum_range_avx2(&job, 0, chunks);
    TH_CHECK(memcmp(part[0], part[1], chunks * sizeof(double)) == 0, "the AVX2 sums of squares differ from the portable loop's");
#endif
}

/* (j1b) layer norm's rows at AVX2's width give the portable loops' bits: the forward (y and
   each row's statistics) and the backward (dx assigned and added, with and without a weight,
   and each block's dgamma and dbeta), on rows of 131 values (no multiple of a vector) and a
   last block of fewer than AD__NORM_ROWS rows. */
static void test_float_norm_avx2(void)
{
#if AD__X86_DISPATCH
    enum { ROWS = 37, N = 131, BLOCKS = (ROWS + AD__NORM_ROWS - 1) / AD__NORM_ROWS };
    static ad_real x[ROWS * N], g[ROWS * N], gamma[N], beta[N];
    static ad_real y[2][ROWS * N], stats[2][2 * ROWS], dx[2][ROWS * N], part[2][BLOCKS * 2 * N];
    ad_rng rng;
    ad__norm_job job;
    int v, weighted, add;
    size_t i;
    if (ad__isa() < AD__ISA_AVX2) return;
    ad_rng_seed(&rng, 77);
    for (i = 0; i < ROWS * N; i++) {
        x[i] = (ad_real)(3 * ad_rng_normal(&rng) + 0.5);
        g[i] = (ad_real)ad_rng_normal(&rng);
    }
    for (i = 0; i < N; i++) {
        gamma[i] = (ad_real)(1 + 0.2 * ad_rng_normal(&rng));
        beta[i] = (ad_real)(0.1 * ad_rng_normal(&rng));
    }
    for (weighted = 0; weighted < 2; weighted++)
        for (add = 0; add < 2; add++) {
            for (v = 0; v < 2; v++) {
                memset(&job, 0, sizeof job);
                job.x = x;
                job.gamma = weighted ? gamma : NULL;
                job.beta = weighted ? beta : NULL;
                job.y = y[v];
                job.stats = stats[v];
                job.inner = N;
                job.eps = (ad_real)1e-5;
                if (v) ad__norm_forward_range_avx2(&job, 0, ROWS);
                else ad__norm_forward_range(&job, 0, ROWS);
                job.g = g;
                job.dx = dx[v];
                job.part = part[v];
                job.add_x = add;
                for (i = 0; i < ROWS * N; i++) dx[v][i] = add ? g[i] : 0;
                if (v) ad__norm_backward_range_avx2(&job, 0, ROWS);
                else ad__norm_backward_range(&job, 0, ROWS);
            }
            TH_CHECK(memcmp(y[0], y[1], sizeof y[0]) == 0 && memcmp(stats[0], stats[1], sizeof stats[0]) == 0,
                     "layer norm forward%s: AVX2 and portable rows differ", weighted ? " with a weight" : "");
            TH_CHECK(memcmp(dx[0], dx[1], sizeof dx[0]) == 0 && memcmp(part[0], part[1], sizeof part[0]) == 0,
                     "layer norm backward%s, dx %s: AVX2 and portable rows differ", weighted ? " with a weight" : "",
                     add ? "added" : "assigned");
        }
#endif
}

/* The geometry of a 2x2 max pooling with stride 2 of one h x w plane, and n test values for
   it of kind mode: 0 spread values, 1 three values (many ties), 2 some NaNs, 3 some infinities. */
TH_UNUSED static ad__win2d pool_2x2_geometry(int h, int w)
{
    ad__win2d G;
    memset(&G, 0, sizeof G);
    G.n = G.c = G.o = 1;
    G.h = h;
    G.w = w;
    G.kh = G.kw = G.sh = G.sw = 2;
    G.dh = G.dw = 1;
    G.oh = h / 2;
    G.ow = w / 2;
    return G;
}

TH_UNUSED static void pool_test_values(float *x, int n, int mode, ad_rng *rng)
{
    int i;
    for (i = 0; i < n; i++) {
        x[i] = mode == 1 ? (float)ad_rng_below(rng, 3) : (float)ad_rng_normal(rng);
        if (mode == 2 && ad_rng_below(rng, 13) == 0) x[i] = NAN;
        if (mode == 3 && ad_rng_below(rng, 7) == 0) x[i] = ad_rng_below(rng, 2) ? INFINITY : -INFINITY;
    }
}

/* (i3) 2x2 max pooling with stride 2 at AVX-512's width against the portable plane: the same
   maxima, winners and NaN handling, on planes of odd and even sizes (the widths put a last part
   block of sixteen windows, or none, and an unused last column), with random values, many ties,
   NaNs and infinities. A guard value after each output must stay untouched. */
static void test_float_max_pool_avx512(void)
{
#if AD__X86_DISPATCH
    static const int hs[] = {2, 3, 9, 24}, ws[] = {2, 3, 7, 24, 31, 32, 33, 34, 65};
    enum { MAX_IN = 24 * 65, MAX_OUT = 12 * 32 + 1 };
    static float x[MAX_IN], y[2][MAX_OUT];
    static int arg[2][MAX_OUT];
    ad_rng rng;
    int hi, wi, mode, v, same, guarded;
    if (ad__isa() != AD__ISA_AVX512) return;
    ad_rng_seed(&rng, 31);
    for (hi = 0; hi < 4; hi++)
        for (wi = 0; wi < 9; wi++)
            for (mode = 0; mode < 4; mode++) {
                int i, h = hs[hi], w = ws[wi];
                ad__win2d G = pool_2x2_geometry(h, w);
                int L = G.oh * G.ow;
                pool_test_values(x, h * w, mode, &rng);
                for (v = 0; v < 2; v++) {
                    for (i = 0; i < MAX_OUT; i++) {
                        y[v][i] = -7.0f;
                        arg[v][i] = -7;
                    }
                    if (v) ad__max_pool_plane_2x2_avx512(&G, x, y[v], arg[v]);
                    else ad__max_pool_plane_2x2(&G, x, y[v], arg[v]);
                }
                same = memcmp(y[0], y[1], (size_t)L * sizeof(float)) == 0 &&
                       memcmp(arg[0], arg[1], (size_t)L * sizeof(int)) == 0;
                guarded = y[1][L] == -7.0f && arg[1][L] == -7;
                TH_CHECK(same && guarded, "max pool 2x2 of %d x %d, values of kind %d: AVX-512 %s", h, w, mode,
                         same ? "wrote past the plane's outputs" : "and portable planes differ");
            }
#endif
}

/* (i3b) The gradient of a 2x2 max pooling with stride 2 written cell by cell at AVX-512's width
   against the scatter (clear, then add g at the winners), to the bit: the max pool test's planes
   and value kinds, with gradients that include -0, for one plane and for a batch of 2 x 3
   planes. A guard value after the image must stay untouched. */
static void test_float_max_pool_adjoint_avx512(void)
{
#if AD__X86_DISPATCH
    static const int hs[] = {2, 3, 9, 24}, ws[] = {2, 3, 7, 24, 31, 32, 33, 34, 65};
    enum { PLANES = 6, MAX_IN = PLANES * 24 * 65, MAX_OUT = PLANES * 12 * 32 };
    static float x[MAX_IN], y[MAX_OUT], g[MAX_OUT], d[2][MAX_IN + 1];
    static int arg[MAX_OUT];
    ad_rng rng;
    ad_tape *T = ad_tape_new();
    int hi, wi, mode, planes;
    if (!T || ad__isa() != AD__ISA_AVX512) {
        ad_tape_free(T);
        return;
    }
    ad_rng_seed(&rng, 53);
    for (planes = 1; planes <= PLANES; planes += PLANES - 1)
        for (hi = 0; hi < 4; hi++)
            for (wi = 0; wi < 9; wi++)
                for (mode = 0; mode < 4; mode++) {
                    int shape_x[4], shape_g[4], i, p, h = hs[hi], w = ws[wi], v;
                    ad__win2d G = pool_2x2_geometry(h, w);
                    int L = G.oh * G.ow, HW = h * w;
                    ad_tensor *xt, *gt;
                    pool_test_values(x, planes * HW, mode, &rng);
                    for (i = 0; i < planes * L; i++) g[i] = i % 5 == 0 ? -0.0f : (float)ad_rng_normal(&rng);
                    for (p = 0; p < planes; p++) ad__max_pool_plane_2x2(&G, x + p * HW, y + p * L, arg + p * L);
                    shape_x[0] = shape_g[0] = planes == 1 ? 1 : 2;
                    shape_x[1] = shape_g[1] = planes == 1 ? 1 : 3;
                    shape_x[2] = h;
                    shape_x[3] = w;
                    shape_g[2] = G.oh;
                    shape_g[3] = G.ow;
                    xt = ad_tensor_view(T, 4, shape_x, x, NULL, 0);
                    gt = ad_tensor_view(T, 4, shape_g, g, NULL, 0);
                    if (!xt || !gt) break;
                    for (v = 0; v < 2; v++) {
                        for (i = 0; i <= planes * HW; i++) d[v][i] = -7.0f;
                        if (v) ad__max_pool_2x2_adjoint(T, gt, arg, xt, d[v]);
                        else ad__scatter_kernel(T, g, arg, (size_t)planes, (size_t)HW, (size_t)L, 1, d[v], 0);
                    }
                    TH_CHECK(memcmp(d[0], d[1], (size_t)(planes * HW + 1) * sizeof(float)) == 0,
                             "max pool 2x2 gradient of %d planes of %d x %d, values of kind %d: AVX-512 and scatter "
                             "differ, or it wrote past the image",
                             planes, h, w, mode);
                    ad_tape_reset(T);
                }
    ad_tape_free(T);
#endif
}

/* (i3c) Max pooling's gradients of higher order keep its geometry: with y = maxpool(x) (2x2,
   stride 2, 2 x 3 planes of 9 x 13), g1 = d sum(y w1) / dx and g2 = d sum(g1 w2) / dw1, both
   recorded, ad_backward of sum(g2 w3) gives w2 the gradient w3 put at each window's winner and 0
   elsewhere: a plain sweep through the gather that g2's recording made. */
static void test_float_max_pool_third_order(void)
{
    enum { N = 2, C = 3, H = 9, W = 13, OH = H / 2, OW = W / 2, PLANES = N * C };
    int xs[4] = {N, C, H, W}, ys[4] = {N, C, OH, OW}, p, i, bad = 0;
    static float want[PLANES * H * W], y[OH * OW];
    static int arg[OH * OW];
    ad__win2d G = pool_2x2_geometry(H, W);
    ad_tape *T = ad_tape_new();
    ad_tensor *x, *w1, *w2, *w3, *g1, *g2;
    ad_rng rng;
    if (!T) {
        TH_CHECK(0, "out of memory");
        return;
    }
    ad_rng_seed(&rng, 61);
    x = ad_zeros(T, 4, xs);
    w1 = ad_zeros(T, 4, ys);
    w2 = ad_zeros(T, 4, xs);
    w3 = ad_zeros(T, 4, ys);
    if (x && w1 && w2 && w3) {
        pool_test_values(x->data, PLANES * H * W, 1, &rng); /* many ties */
        for (i = 0; i < PLANES * OH * OW; i++) {
            w1->data[i] = (float)ad_rng_normal(&rng);
            w3->data[i] = (float)ad_rng_normal(&rng);
        }
        for (i = 0; i < PLANES * H * W; i++) w2->data[i] = (float)ad_rng_normal(&rng);
        ad_set_requires_grad(w1, 1);
        ad_set_requires_grad(w2, 1);
        ad_set_requires_grad(x, 1);
    }
    g1 = ad_grad(T, ad_sum(T, ad_mul(T, ad_max_pool2d(T, x, 2, 2, NULL), w1)), x, 1);
    g2 = ad_grad(T, ad_sum(T, ad_mul(T, g1, w2)), w1, 1);
    if (!g2 || ad_backward(T, ad_sum(T, ad_mul(T, g2, w3))) != 0 || !w2->grad) {
        TH_CHECK(0, "max pool, third order: %s", ad_tape_error(T));
        ad_tape_free(T);
        return;
    }
    memset(want, 0, sizeof want);
    for (p = 0; p < PLANES; p++) {
        ad__max_pool_plane_2x2(&G, x->data + p * H * W, y, arg);
        for (i = 0; i < OH * OW; i++) want[p * H * W + arg[i]] = w3->data[p * OH * OW + i];
    }
    for (i = 0; i < PLANES * H * W; i++) bad += w2->grad[i] != want[i];
    TH_CHECK(bad == 0, "max pool, third order: %d of w2's gradients differ from w3 at the winners", bad);
    ad_tape_free(T);
}

/* (i4) col2im (a convolution's input gradient from its patch matrix) at AVX-512's width against
   the portable loop, to the bit: 1 to 9 channels (a last part block of eight), rows of 5 to 40
   values (one to three runs of sixteen), 1x1 to 5x5 kernels, padding, dilation, a row stride of
   2, and taps that meet no input; added into values already there. A guard value after the
   image must stay untouched. */
static void test_float_col2im_avx512(void)
{
#if AD__X86_DISPATCH
    /* channels, h, w, kh, kw, padding, dilation, row stride */
    static const int geos[][8] = {{8, 12, 12, 5, 5, 0, 1, 1}, {1, 28, 28, 5, 5, 0, 1, 1}, {3, 17, 17, 3, 3, 1, 1, 1},
                                  {9, 7, 7, 3, 3, 1, 1, 1},   {4, 6, 40, 3, 5, 2, 1, 1},  {5, 9, 33, 2, 3, 0, 2, 1},
                                  {2, 11, 16, 1, 1, 0, 1, 1}, {7, 10, 5, 5, 5, 3, 1, 2},  {6, 4, 20, 3, 3, 6, 1, 1}};
    enum { MAX_X = 9 * 17 * 40 + 1, MAX_COL = 1 << 16 };
    static float col[MAX_COL], x[2][MAX_X];
    ad_rng rng;
    size_t i;
    int g, v;
    if (ad__isa() != AD__ISA_AVX512) return;
    ad_rng_seed(&rng, 41);
    for (i = 0; i < MAX_COL; i++) col[i] = (float)ad_rng_normal(&rng);
    for (g = 0; g < (int)(sizeof geos / sizeof geos[0]); g++) {
        ad__win2d G;
        size_t n;
        memset(&G, 0, sizeof G);
        G.n = G.groups = 1;
        G.c = geos[g][0];
        G.h = geos[g][1];
        G.w = geos[g][2];
        G.kh = geos[g][3];
        G.kw = geos[g][4];
        G.ph = G.pw = geos[g][5];
        G.dh = G.dw = geos[g][6];
        G.sh = geos[g][7];
        G.sw = 1;
        G.oh = (G.h + 2 * G.ph - G.dh * (G.kh - 1) - 1) / G.sh + 1;
        G.ow = G.w + 2 * G.pw - G.dw * (G.kw - 1);
        n = (size_t)G.c * G.h * G.w;
        for (v = 0; v < 2; v++) {
            for (i = 0; i < MAX_X; i++) x[v][i] = i < n ? (float)(0.25 * (double)(i % 5)) : -7.0f;
            if (v) ad__col2im_avx512(&G, G.c, col, x[v]);
            else ad__col2im(&G, G.c, col, x[v]);
        }
        TH_CHECK(memcmp(x[0], x[1], n * sizeof(float)) == 0 && x[1][n] == -7.0f,
                 "col2im of %d channels of %d x %d, kernel %d x %d, padding %d, dilation %d, stride %d: AVX-512 "
                 "and portable differ, or it wrote past the image",
                 G.c, G.h, G.w, G.kh, G.kw, G.ph, G.dh, G.sh);
    }
#endif
}

/* The straight weight gradient reads whole vectors of positions; the lanes past the output
   plane's end fall on input rows below the ones a tap's outputs reach, and must add nothing: an
   infinite value in the last input row leaves finite the taps of kernel rows 0 and 1, which
   reach rows ki to ki + oh - 1 only (oh = 4, h = 6). The plane of 4 x 5 outputs is one vector
   of sixteen and a part, so the last input row falls in the first half of the second vector for
   kernel row 1 and in its second half for kernel row 0. */
static void test_float_conv_straight_tail(void)
{
#if AD__X86_DISPATCH
    ad__win2d G;
    ad__conv_scratch_t s;
    ad_tape *T = ad_tape_new();
    float x[2 * 3 * 6 * 7], g[2 * 5 * 4 * 5], dw[5 * 3 * 3 * 3];
    int i, o, c, ki, kj, finite = 1;
    if (ad__isa() == AD__ISA_PLAIN) {
        ad_tape_free(T);
        return;
    }
    memset(&G, 0, sizeof G);
    G.n = 2; G.c = 3; G.h = 6; G.w = 7; G.o = 5; G.kh = G.kw = 3;
    G.sh = G.sw = G.dh = G.dw = G.groups = 1;
    G.oh = 4; G.ow = 5;
    for (i = 0; i < (int)(sizeof x / sizeof x[0]); i++) x[i] = 0.25f + 0.125f * (float)(i % 5);
    for (i = 0; i < 2 * 3; i++) /* the last row of every channel of every image */
        for (kj = 0; kj < G.w; kj++) x[(i * G.h + G.h - 1) * G.w + kj] = INFINITY;
    for (i = 0; i < (int)(sizeof g / sizeof g[0]); i++) g[i] = 1.0f / (float)(1 + i % 7);
    TH_CHECK(ad__conv_scratch(T, &G, "test", AD__CONV_WEIGHT_GRAD, &s) == 0 && s.straight,
             "the tail geometry is not taken straight from the images");
    if (s.straight) {
        ad__conv_kernel(T, AD__CONV_WEIGHT_GRAD, &G, x, g, NULL, dw, 0, &s);
        for (o = 0; o < G.o; o++)
            for (c = 0; c < G.c; c++)
                for (ki = 0; ki + G.oh < G.h; ki++)
                    for (kj = 0; kj < G.kw; kj++) finite &= isfinite(dw[((o * G.c + c) * G.kh + ki) * G.kw + kj]) != 0;
        TH_CHECK(finite, "straight weight gradient: an input no output reaches made a tap of kernel rows 0 or 1 "
                         "infinite or NaN");
    }
    ad_tape_free(T);
#endif
}

/* The forward map and the weight gradient of convolutions taken straight from the images
   (ad__conv_forward_straight, ad__conv_weight_grad_straight: AVX-512's or AVX2's, whichever the
   processor takes), with the input gradient beside them (with AVX-512 straight from the output
   gradient, ad__conv_input_grad_avx512; with AVX2 im2col's GEMM and col2im), against sums in
   double precision, within float's rounding of the
   sum of the terms' magnitudes, on odd geometries: padding as wide as the kernel, kernels larger
   than the image, rows of 3 to 40 outputs, output planes that are not whole vectors, channels
   and taps past a whole block, more images than parts, parts of several chunks, and a batch of
   images too large to go straight but for its size (AD__STRAIGHT_IMAGES). The forward map and
   the input gradient also add into their outputs; nothing is written past the outputs; 1, 2 and
   3 threads give the same bits. With AVX-512, the weight gradient of the whole batch as one part
   (several chunks for most geometries) within the same bound, its chunks' sums reduced one by one
   and, where they fit AD__WGRAD_KEEP_BYTES, kept as vectors from chunk to chunk (the last
   geometry's do not fit). */
static void test_float_conv_straight(void)
{
#if AD__X86_DISPATCH
    /* n, c, h, w, o, kh, kw, padding across and down */
    static const int geos[][9] = {{3, 1, 28, 28, 8, 5, 5, 0, 0}, {5, 8, 12, 12, 16, 5, 5, 0, 0},
                                  {4, 3, 17, 13, 11, 3, 3, 1, 1}, {2, 4, 9, 9, 5, 2, 4, 0, 0},
                                  {3, 2, 6, 40, 9, 3, 5, 2, 2},  {9, 5, 7, 7, 17, 3, 3, 1, 1},
                                  {2, 1, 5, 5, 3, 7, 7, 3, 3},   {2, 2, 33, 3, 4, 1, 3, 0, 1},
                                  {2, 3, 4, 4, 2, 1, 1, 1, 1},   {1, 6, 16, 16, 8, 3, 3, 1, 1},
                                  {2, 3, 6, 6, 4, 3, 3, 3, 1},   {20, 3, 16, 16, 16, 3, 3, 1, 1},
                                  {16, 8, 14, 14, 24, 5, 5, 2, 2}, {16, 24, 6, 6, 48, 3, 3, 1, 1}};
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int k;
    if (ad__isa() == AD__ISA_PLAIN) {
        ad_tape_free(T);
        return;
    }
    ad_rng_seed(&rng, 43);
    for (k = 0; k < (int)(sizeof geos / sizeof geos[0]); k++) {
        ad__win2d G;
        ad__conv_scratch_t s[3]; /* for each map */
        size_t nx, ny, nw, i;
        float *x, *w, *b, *g, *y, *y0, *dw, *dw1, *dx, *dx0, *dx1;
        double worst_y = 0, worst_w = 0, worst_x = 0, *ref_w, *size_w;
        int n, o, c, oy, ox, ki, kj, threads, bits_same = 1;
        memset(&G, 0, sizeof G);
        G.n = geos[k][0]; G.c = geos[k][1]; G.h = geos[k][2]; G.w = geos[k][3]; G.o = geos[k][4];
        G.kh = geos[k][5]; G.kw = geos[k][6]; G.pw = geos[k][7]; G.ph = geos[k][8];
        G.sh = G.sw = G.dh = G.dw = G.groups = 1;
        G.oh = G.h + 2 * G.ph - G.kh + 1;
        G.ow = G.w + 2 * G.pw - G.kw + 1;
        nx = (size_t)G.n * G.c * G.h * G.w;
        ny = (size_t)G.n * G.o * G.oh * G.ow;
        nw = (size_t)G.o * G.c * G.kh * G.kw;
        x = (float *)malloc(nx * sizeof(float));
        w = (float *)malloc(nw * sizeof(float));
        b = (float *)malloc((size_t)G.o * sizeof(float));
        g = (float *)malloc(ny * sizeof(float));
        y = (float *)malloc((ny + 1) * sizeof(float));
        y0 = (float *)malloc(ny * sizeof(float));
        dw = (float *)malloc((nw + 1) * sizeof(float));
        dw1 = (float *)malloc((nw + 1) * sizeof(float));
        dx = (float *)malloc((nx + 1) * sizeof(float));
        dx0 = (float *)malloc(nx * sizeof(float));
        dx1 = (float *)malloc(nx * sizeof(float));
        ref_w = (double *)malloc(nw * sizeof(double));
        size_w = (double *)malloc(nw * sizeof(double));
        for (i = 0; i < nx; i++) x[i] = (float)ad_rng_normal(&rng);
        for (i = 0; i < nx; i++) dx[i] = dx0[i] = (float)ad_rng_normal(&rng);
        for (i = 0; i < nw; i++) w[i] = (float)ad_rng_normal(&rng);
        for (i = 0; i < (size_t)G.o; i++) b[i] = (float)ad_rng_normal(&rng);
        for (i = 0; i < ny; i++) g[i] = (float)ad_rng_normal(&rng);
        for (i = 0; i < ny; i++) y[i] = y0[i] = (float)ad_rng_normal(&rng);
        y[ny] = dw[nw] = dw1[nw] = dx[nx] = -7.0f;
        ad_set_threads(T, 1);
        for (i = 0; i < 3; i++)
            TH_CHECK(ad__conv_scratch(T, &G, "test", (int)i, &s[i]) == 0 && s[i].straight,
                     "geometry %d is not taken straight from the images", k);
        TH_CHECK((s[AD__CONV_INPUT_GRAD].taps && s[AD__CONV_WEIGHT_GRAD].taps) == (ad__isa() == AD__ISA_AVX512),
                 "geometry %d: the input gradient goes straight from the output gradient %s", k,
                 ad__isa() == AD__ISA_AVX512 ? "not with AVX-512" : "without AVX-512");
        if (k == 0) { /* with more output channels than AD__IGRAD_MAX_OUTPUTS, it stays a product */
            ad__win2d wide = G;
            ad__conv_scratch_t sw;
            wide.o = AD__IGRAD_MAX_OUTPUTS + 1;
            wide.n = AD__STRAIGHT_IMAGES; /* enough images to go straight with that many channels */
            TH_CHECK(ad__conv_scratch(T, &wide, "test", AD__CONV_WEIGHT_GRAD, &sw) == 0 && sw.straight && !sw.taps,
                     "%d output channels: the input gradient was to stay im2col's product", wide.o);
        }
        ad__conv_kernel(T, AD__CONV_FORWARD, &G, x, w, b, y, 1, &s[AD__CONV_FORWARD]);
        /* the input gradient first, in the weight gradient's scratch, as the backward sweep runs them */
        ad__conv_kernel(T, AD__CONV_INPUT_GRAD, &G, g, w, NULL, dx, 1, &s[AD__CONV_WEIGHT_GRAD]);
        ad__conv_kernel(T, AD__CONV_WEIGHT_GRAD, &G, x, g, NULL, dw, 0, &s[AD__CONV_WEIGHT_GRAD]);
        for (n = 0; n < G.n; n++)
            for (c = 0; c < G.c; c++)
                for (oy = 0; oy < G.h; oy++) /* (oy, ox): the input's position */
                    for (ox = 0; ox < G.w; ox++) {
                        size_t at = (((size_t)n * G.c + c) * G.h + oy) * G.w + ox;
                        double sum = dx0[at], size = fabs(sum);
                        for (o = 0; o < G.o; o++)
                            for (ki = 0; ki < G.kh; ki++)
                                for (kj = 0; kj < G.kw; kj++) {
                                    int py = oy + G.ph - ki, px = ox + G.pw - kj;
                                    double term;
                                    if (py < 0 || py >= G.oh || px < 0 || px >= G.ow) continue;
                                    term = (double)w[((size_t)o * G.c + c) * G.kh * G.kw + (size_t)ki * G.kw + kj] *
                                           g[(((size_t)n * G.o + o) * G.oh + py) * G.ow + px];
                                    sum += term;
                                    size += fabs(term);
                                }
                        if (fabs(dx[at] - sum) / (size + 1e-30) > worst_x) worst_x = fabs(dx[at] - sum) / (size + 1e-30);
                    }
        for (n = 0; n < G.n; n++)
            for (o = 0; o < G.o; o++)
                for (oy = 0; oy < G.oh; oy++)
                    for (ox = 0; ox < G.ow; ox++) {
                        size_t at = (((size_t)n * G.o + o) * G.oh + oy) * G.ow + ox;
                        double sum = (double)y0[at] + b[o], size = fabs(sum);
                        for (c = 0; c < G.c; c++)
                            for (ki = 0; ki < G.kh; ki++)
                                for (kj = 0; kj < G.kw; kj++) {
                                    int iy = oy + ki - G.ph, ix = ox + kj - G.pw;
                                    double term;
                                    if (iy < 0 || iy >= G.h || ix < 0 || ix >= G.w) continue;
                                    term = (double)w[((size_t)o * G.c + c) * G.kh * G.kw + (size_t)ki * G.kw + kj] *
                                           x[(((size_t)n * G.c + c) * G.h + iy) * G.w + ix];
                                    sum += term;
                                    size += fabs(term);
                                }
                        if (fabs(y[at] - sum) / (size + 1e-30) > worst_y) worst_y = fabs(y[at] - sum) / (size + 1e-30);
                    }
        for (o = 0; o < G.o; o++)
            for (c = 0; c < G.c; c++)
                for (ki = 0; ki < G.kh; ki++)
                    for (kj = 0; kj < G.kw; kj++) {
                        size_t at = ((size_t)o * G.c + c) * G.kh * G.kw + (size_t)ki * G.kw + kj;
                        double sum = 0, size = 0;
                        for (n = 0; n < G.n; n++)
                            for (oy = 0; oy < G.oh; oy++)
                                for (ox = 0; ox < G.ow; ox++) {
                                    int iy = oy + ki - G.ph, ix = ox + kj - G.pw;
                                    double term;
                                    if (iy < 0 || iy >= G.h || ix < 0 || ix >= G.w) continue;
                                    term = (double)g[(((size_t)n * G.o + o) * G.oh + oy) * G.ow + ox] *
                                           x[(((size_t)n * G.c + c) * G.h + iy) * G.w + ix];
                                    sum += term;
                                    size += fabs(term);
                                }
                        ref_w[at] = sum;
                        size_w[at] = size;
                        if (fabs(dw[at] - sum) / (size + 1e-30) > worst_w) worst_w = fabs(dw[at] - sum) / (size + 1e-30);
                    }
        /* float's rounding over sums of up to a few thousand terms, relative to their magnitudes */
        TH_CHECK(worst_y < 1e-5 && y[ny] == -7.0f,
                 "straight convolution, geometry %d: forward off by %.3g of the terms' size, or wrote past y", k, worst_y);
        TH_CHECK(worst_w < 1e-5 && dw[nw] == -7.0f,
                 "straight convolution, geometry %d: weight gradient off by %.3g of the terms' size, or wrote past it",
                 k, worst_w);
        TH_CHECK(worst_x < 1e-5 && dx[nx] == -7.0f,
                 "straight convolution, geometry %d: input gradient off by %.3g of the terms' size, or wrote past it",
                 k, worst_x);
#if !defined(AUTODIFF_DOUBLE)
        if (ad__isa() == AD__ISA_AVX512) {
            size_t ld = ad__conv_row_ld(&G), K = nw / (size_t)G.o;
            float *scratch = (float *)ad__alloc(T, ad__straight_scratch_floats(&G) * sizeof(float), "test");
            float *sums = (float *)ad__alloc(T, (size_t)G.o * ld * sizeof(float), "test");
            int keep;
            for (keep = 0; keep <= (ad__wgrad_keep_floats(&G) > 0) && scratch && sums; keep++) {
                double worst = 0;
                ad__conv_weight_grad_avx512(&G, x, g, 0, G.n, scratch, keep, sums, ld, 0);
                for (o = 0; o < G.o; o++)
                    for (i = 0; i < K; i++) {
                        size_t at = (size_t)o * K + i;
                        double off = fabs(sums[(size_t)o * ld + i] - ref_w[at]) / (size_w[at] + 1e-30);
                        if (off > worst) worst = off;
                    }
                TH_CHECK(worst < 1e-5, "straight weight gradient of geometry %d as one part, sums %s: off by %.3g of "
                         "the terms' size", k, keep ? "kept as vectors" : "reduced chunk by chunk", worst);
            }
            TH_CHECK(k + 1 < (int)(sizeof geos / sizeof geos[0]) || ad__wgrad_keep_floats(&G) == 0,
                     "the last geometry's kept sums were to exceed AD__WGRAD_KEEP_BYTES");
        }
#endif
        /* one thread's maps without adding, before another thread count's scratch (which may
           replace the tape's packing buffers) */
        ad__conv_kernel(T, AD__CONV_FORWARD, &G, x, w, b, y, 0, &s[AD__CONV_FORWARD]);
        ad__conv_kernel(T, AD__CONV_INPUT_GRAD, &G, g, w, NULL, dx0, 0, &s[AD__CONV_INPUT_GRAD]);
        for (threads = 2; threads <= 3; threads++) {
            ad__conv_scratch_t s2[3];
            ad_set_threads(T, threads);
            for (i = 0; i < 3; i++)
                if (ad__conv_scratch(T, &G, "test", (int)i, &s2[i]) != 0) break;
            if (i < 3) break;
            ad__conv_kernel(T, AD__CONV_FORWARD, &G, x, w, b, y0, 0, &s2[AD__CONV_FORWARD]);
            ad__conv_kernel(T, AD__CONV_INPUT_GRAD, &G, g, w, NULL, dx1, 0, &s2[AD__CONV_WEIGHT_GRAD]);
            ad__conv_kernel(T, AD__CONV_WEIGHT_GRAD, &G, x, g, NULL, dw1, 0, &s2[AD__CONV_WEIGHT_GRAD]);
            bits_same &= memcmp(y0, y, ny * sizeof(float)) == 0 && memcmp(dw1, dw, nw * sizeof(float)) == 0 &&
                         memcmp(dx1, dx0, nx * sizeof(float)) == 0;
        }
        ad_set_threads(T, 1);
        TH_CHECK(bits_same, "straight convolution, geometry %d: the bits depend on the thread count", k);
        { /* AVX2's forward map gives AVX-512's bits (checked where the processor has both) */
            size_t npack = (size_t)(G.o + AD__CONV_OUTPUTS - 1) / AD__CONV_OUTPUTS * AD__CONV_OUTPUTS * G.c * G.kh * G.kw;
            float *packed = (float *)malloc(npack * sizeof(float));
            float *xs = (float *)calloc(ad__straight_input_floats(&G), sizeof(float));
            ad__conv_pack_weights(&G, w, packed, 0);
            for (n = 0; n < G.n; n++) ad__conv_forward_avx2(&G, x, packed, b, y, n, xs, 0);
            for (n = 0; n < G.n; n++)
                if (ad__isa() == AD__ISA_AVX512) ad__conv_forward_avx512(&G, x, packed, b, y0, n, xs, 0, 0);
                else ad__conv_forward_avx2(&G, x, packed, b, y0, n, xs, 0);
            TH_CHECK(memcmp(y, y0, ny * sizeof(float)) == 0,
                     "straight convolution, geometry %d: AVX2's forward map and AVX-512's differ", k);
            free(packed);
            free(xs);
        }
        free(x); free(w); free(b); free(g); free(y); free(y0); free(dw); free(dw1); free(dx); free(dx0); free(dx1);
        free(ref_w); free(size_w);
        ad_tape_reset(T);
    }
    ad_tape_free(T);
#endif
}

/* (j2) the gradients of sin and cos in single precision, cos(x) and -sin(x), within the same
   bound of the exact values, on 1001 values (a last part vector) and on a one-element tensor */
static void test_float_sincos_grad(void)
{
    enum { N = 1001 };
    ad_tape *T = ad_tape_new();
    ad_real probe = 0;
    double bound = ad__unary_vectorised(AD__U_SIN, &probe, &probe, 0) ? 0.55 : 1.0; /* as in (j) */
    int k, len;
    size_t i;
    for (k = 0; k < 2; k++)
        for (len = 1; len <= N; len += N - 1) {
            ad_tensor *x = ad_zeros(T, AD_SHAPE(len));
            double worst = 0;
            for (i = 0; i < (size_t)len; i++) x->data[i] = (float)(-7.3 + 14.6 * (double)i / N);
            ad_set_requires_grad(x, 1);
            if (ad_backward(T, ad_sum(T, k ? ad_cos(T, x) : ad_sin(T, x))) != 0 || !x->grad) {
                TH_CHECK(0, "sin/cos gradient: %s", ad_tape_error(T));
                break;
            }
            for (i = 0; i < (size_t)len; i++) {
                double xi = x->data[i], off = ulps_off(x->grad[i], k ? -sin(xi) : cos(xi));
                if (off > worst) worst = off;
            }
            TH_CHECK(worst <= bound, "gradient of %s on %d value(s): %.3g ulps from the exact value (bound %g)",
                     k ? "cos" : "sin", len, worst, bound);
            ad_tape_reset(T);
        }
    ad_tape_free(T);
}

/* (j4) A sum's gradient, one value for every element of its input, is kept as that value, read
   as it is by the backward of unary functions and of binary ops on operands of one shape, and
   passed on as it is by sums and shifts (AD__GRAD_UNIFORM); everywhere else it must act as a
   full tensor of that value: asked for with ad_grad, met by a second contribution before or
   after, passed to a broadcasting op, scaled by a mean, or seen by a hook. Each case against
   its gradient written out, on a [5, 7] input and on 3000 values (more than one run of the
   repeated value, split over threads). */
static ad_tensor *uniform_hook_double(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx)
{
    (void)x;
    (void)ctx;
    return ad_mul_scalar(T, grad, 2);
}

static void test_uniform_gradient(void)
{
    static const char *names[] = {"ad_grad of a sum", "ad_grad of a mean",   "sum(h) + sum(h h)",
                                  "sum(h h) + sum(h)", "sum(a b)",          "sum(x + 1)",
                                  "sum(sin x) + sum(exp x)", "mean(sigmoid x) * 3", "a hooked exp",
                                  "sum(h + b)", "sum(h - h b)", "sum(h + h)", "mean(x x)",
                                  "sum(h row), row broadcast", "sum(x + big), x broadcast"};
    int sizes[2][2] = {{5, 7}, {3, 1000}}, s, c;
    ad_tape *T = ad_tape_new();
    if (!T) {
        TH_CHECK(0, "out of memory");
        return;
    }
    ad_set_threads(T, 2);
    for (s = 0; s < 2; s++)
        for (c = 0; c < 15; c++) {
            int row_shape[2], big_shape[3];
            ad_tensor *x = ad_zeros(T, 2, sizes[s]), *b = ad_zeros(T, 2, sizes[s]), *row, *big, *h, *y, *g = NULL;
            size_t i, n;
            double worst = 0;
            int failed = 0;
            row_shape[0] = 1;
            row_shape[1] = sizes[s][1];
            row = ad_zeros(T, 2, row_shape);
            big_shape[0] = 2;
            big_shape[1] = sizes[s][0];
            big_shape[2] = sizes[s][1];
            big = ad_zeros(T, 3, big_shape);
            if (!x || !b || !row || !big) break;
            n = x->size;
            for (i = 0; i < row->size; i++) row->data[i] = (float)(0.75 + (double)(i % 5) * 0.5);
            for (i = 0; i < n; i++) {
                x->data[i] = (float)(-1.3 + 2.9 * (double)((i * 37) % n) / (double)n);
                b->data[i] = (float)(0.5 + (double)(i % 11) * 0.25);
            }
            ad_set_requires_grad(x, 1);
            h = ad_exp(T, x);
            switch (c) {
            case 0: g = ad_grad(T, ad_sum(T, h), h, 0); break;
            case 1: g = ad_grad(T, ad_mean(T, h), h, 0); break;
            case 2: y = ad_add(T, ad_sum(T, h), ad_sum(T, ad_mul(T, h, h))); failed = ad_backward(T, y); break;
            case 3: y = ad_add(T, ad_sum(T, ad_mul(T, h, h)), ad_sum(T, h)); failed = ad_backward(T, y); break;
            case 4: failed = ad_backward(T, ad_sum(T, ad_mul(T, x, b))); break;
            case 5: failed = ad_backward(T, ad_sum(T, ad_add_scalar(T, x, 1))); break;
            case 6: failed = ad_backward(T, ad_add(T, ad_sum(T, ad_sin(T, x)), ad_sum(T, h))); break;
            case 7: failed = ad_backward(T, ad_mul_scalar(T, ad_mean(T, ad_sigmoid(T, x)), 3)); break;
            case 8:
                failed = ad_register_hook(h, uniform_hook_double, NULL) || ad_backward(T, ad_sum(T, h));
                break;
            case 9: failed = ad_backward(T, ad_sum(T, ad_add(T, h, b))); break;
            case 10: failed = ad_backward(T, ad_sum(T, ad_sub(T, h, ad_mul(T, h, b)))); break;
            case 11: failed = ad_backward(T, ad_sum(T, ad_add(T, h, h))); break;
            case 12: failed = ad_backward(T, ad_mean(T, ad_mul(T, x, x))); break;
            case 13: failed = ad_backward(T, ad_sum(T, ad_mul(T, h, row))); break;
            default: failed = ad_backward(T, ad_sum(T, ad_add(T, x, big))); break;
            }
            if (failed || (c < 2 ? !g : !x->grad)) {
                TH_CHECK(0, "%s: %s", names[c], ad_tape_error(T));
                ad_tape_reset(T);
                continue;
            }
            if (c < 2) TH_CHECK(ad__same_shape(g, h), "%s: the gradient has h's shape", names[c]);
            for (i = 0; i < n; i++) {
                double xi = x->data[i], e = exp(xi), sg = 1 / (1 + exp(-xi)), want, got = c < 2 ? g->data[i] : x->grad[i];
                want = c == 0   ? 1
                       : c == 1 ? 1.0 / (double)n
                       : c <= 3 ? e * (1 + 2 * e)
                       : c == 4 ? b->data[i]
                       : c == 5 ? 1
                       : c == 6 ? cos(xi) + e
                       : c == 7  ? 3 * sg * (1 - sg) / (double)n
                       : c == 8  ? 2 * e
                       : c == 9  ? e
                       : c == 10 ? e * (1 - b->data[i])
                       : c == 11 ? 2 * e
                       : c == 12 ? 2 * xi / (double)n
                       : c == 13 ? e * row->data[i % row->size]
                                 : 2;
                if (fabs(got - want) / fabs(want) > worst) worst = fabs(got - want) / fabs(want);
            }
            TH_CHECK(worst < 1e-5, "%s on %d x %d: gradient off by %.3g of itself", names[c], sizes[s][0],
                     sizes[s][1], worst);
            ad_tape_reset(T);
        }
    ad_tape_free(T);
}

/* (j2b) The backward of an elementwise unary op computes its input's gradient over its output's
   gradient, in place, where ad_backward's sweep allows it (ad__grad_take_over). Each graph's
   leaf gradients from ad_backward must equal, to the bit, those of ad_grad on the same tape,
   which never takes a buffer over: chains of unary ops (sigmoid, GELU, sin, cos, ReLU, exp,
   tanh, log) after products that give a fresh gradient; an input used twice, before and after;
   an output gradient shared with another tensor (an add passes it on); a leaf that takes its
   consumer's buffer; 1, 2 and 3 threads; [5, 7] and 3 x 1000 values. A second ad_backward adds
   the same values again. */
static void test_take_over(void)
{
    static const char *names[] = {"sum(w relu(a b))",          "sum(w sigmoid(gelu(tanh(a b))))",
                                  "sum(w sin(a) + w cos(a))",  "sum(w exp(h) h), h = log(a)",
                                  "sum(w relu(h) + w h), h = a b", "sum(w (relu(a b) + b))",
                                  "sum(w gelu(a))",            "sum(w relu(a) a)"};
    int sizes[2][2] = {{5, 7}, {3, 1000}}, s, c, threads;
    ad_tape *T = ad_tape_new();
    if (!T) {
        TH_CHECK(0, "out of memory");
        return;
    }
    for (threads = 1; threads <= 3; threads++)
        for (s = 0; s < 2; s++)
            for (c = 0; c < 8; c++) {
                ad_tensor *a = ad_zeros(T, 2, sizes[s]), *b = ad_zeros(T, 2, sizes[s]);
                ad_tensor *w = ad_zeros(T, 2, sizes[s]), *y = NULL, *h, *ga, *gb;
                float *first_a, *first_b;
                size_t i, n;
                int same = 1, twice = 1, uses_b = c <= 1 || c == 4 || c == 5;
                ad_set_threads(T, threads);
                if (!a || !b || !w) break;
                n = a->size;
                for (i = 0; i < n; i++) {
                    a->data[i] = (float)(0.1 + 1.9 * (double)((i * 37) % n) / (double)n) * (i % 3 ? 1.0f : -1.0f);
                    b->data[i] = (float)(0.5 + (double)(i % 11) * 0.25);
                    w->data[i] = (float)(1.0 - (double)(i % 7) * 0.3);
                }
                if (c == 3)
                    for (i = 0; i < n; i++) a->data[i] = (float)fabs(a->data[i]) + 0.25f;
                ad_set_requires_grad(a, 1);
                ad_set_requires_grad(b, 1);
                switch (c) {
                case 0: y = ad_mul(T, w, ad_relu(T, ad_mul(T, a, b))); break;
                case 1: y = ad_mul(T, w, ad_sigmoid(T, ad_gelu(T, ad_tanh(T, ad_mul(T, a, b))))); break;
                case 2: y = ad_add(T, ad_mul(T, w, ad_sin(T, a)), ad_mul(T, w, ad_cos(T, a))); break;
                case 3:
                    h = ad_log(T, a);
                    y = ad_mul(T, ad_mul(T, w, ad_exp(T, h)), h);
                    break;
                case 4:
                    h = ad_mul(T, a, b);
                    y = ad_add(T, ad_mul(T, w, ad_relu(T, h)), ad_mul(T, w, h));
                    break;
                case 5: y = ad_mul(T, w, ad_add(T, ad_relu(T, ad_mul(T, a, b)), b)); break;
                case 6: y = ad_mul(T, w, ad_gelu(T, a)); break;
                default: y = ad_mul(T, ad_mul(T, w, ad_relu(T, a)), a); break;
                }
                y = ad_sum(T, y);
                ga = ad_grad(T, y, a, 0);
                gb = uses_b ? ad_grad(T, y, b, 0) : a; /* b unused: a stands in */
                if (!ga || !gb || ad_backward(T, y) != 0 || !a->grad || (uses_b && !b->grad)) {
                    TH_CHECK(0, "%s: %s", names[c], ad_tape_error(T));
                    ad_tape_reset(T);
                    continue;
                }
                for (i = 0; i < n; i++)
                    if (memcmp(&ga->data[i], &a->grad[i], sizeof(float)) ||
                        (uses_b && memcmp(&gb->data[i], &b->grad[i], sizeof(float))))
                        same = 0;
                TH_CHECK(same, "%s on %d x %d, %d threads: ad_backward's gradients differ from ad_grad's",
                         names[c], sizes[s][0], sizes[s][1], threads);
                /* a second sweep adds into the leaves' buffers, which take nothing over (a sum of
                   contributions may round differently added to the first sweep's) */
                first_a = (float *)malloc(n * sizeof(float));
                first_b = (float *)malloc(n * sizeof(float));
                if (first_a && first_b) {
                    memcpy(first_a, a->grad, n * sizeof(float));
                    if (uses_b) memcpy(first_b, b->grad, n * sizeof(float));
                    if (ad_backward(T, y) != 0) twice = 0;
                    for (i = 0; i < n && twice; i++)
                        if (fabs(a->grad[i] - 2.0 * first_a[i]) > 1e-6 * (1 + fabs(first_a[i])) ||
                            (uses_b && fabs(b->grad[i] - 2.0 * first_b[i]) > 1e-6 * (1 + fabs(first_b[i]))))
                            twice = 0;
                    TH_CHECK(twice, "%s on %d x %d, %d threads: a second ad_backward does not add the same gradient",
                             names[c], sizes[s][0], sizes[s][1], threads);
                }
                free(first_a);
                free(first_b);
                ad_tape_reset(T);
            }
    ad_tape_free(T);
}

/* (j3) erf, GELU and GELU's gradient in single precision against double precision, on the
   million inputs of (j) and on every 97th float from -6 to 6, with the bounds measured (see
   >>ops:elementwise) where the vector functions run, without fused multiply-adds (-std=c99):
   erf 1.4 ulps; GELU 7.6 ulps from x = -5.54 up, and below it (where it is 0) within 8.3e-8;
   GELU's derivative Phi(x) + x phi(x), whose two terms cancel near -0.75, within 3.9 ulps of
   Phi(x) + |x| phi(x) from -5.5 up and within 1.5e-8 below. The C library's erf (AUTODIFF_NO_DISPATCH, other
   machines) is held to 1 ulp; GELU's formula on it, 0.5 x (1 + erf(x / sqrt 2)), to nothing
   tighter than the absolute error of the cancellation, 2^-23 (1 + |x|). */
static void test_float_erf_gelu(void)
{
    const size_t grid = ((size_t)1 << 20) + 13;
    const uint32_t stride = 97, top = 0x40C00000u; /* 6.0f */
    size_t n = grid + 2 * (top / stride + 1), i, k;
    float *x = (float *)malloc(n * sizeof(float));
    ad_tape *T = ad_tape_new();
    ad_real probe = 0;
    int vector = ad__unary_vectorised(AD__U_GELU, &probe, &probe, 0), shape[1];
    double worst[3] = {0, 0, 0}, worst_x[3] = {0, 0, 0};
    if (!x || !T) {
        TH_CHECK(0, "out of memory");
        free(x);
        ad_tape_free(T);
        return;
    }
    fill_accuracy_grid(x, grid);
    for (k = 0, i = grid; k <= top / stride; k++) {
        uint32_t b = (uint32_t)k * stride;
        memcpy(&x[i++], &b, 4);
        b |= 0x80000000u;
        memcpy(&x[i++], &b, 4);
    }
    n = i;
    shape[0] = (int)n;
    {
        ad_tensor *a = ad_tensor_view(T, 1, shape, x, NULL, 0), *e = ad_erf(T, a);
        ad_tensor *v = ad_zeros(T, 1, shape), *g;
        memcpy(v->data, x, n * sizeof(float));
        ad_set_requires_grad(v, 1);
        g = ad_gelu(T, v);
        if (!e || !g || ad_backward(T, ad_sum(T, g)) != 0 || !v->grad) {
            TH_CHECK(0, "erf/gelu: %s", ad_tape_error(T));
            goto done;
        }
        for (i = 0; i < n; i++) {
            double xi = x[i], phi = exp(-0.5 * xi * xi) * 0.39894228040143267794, Phi = 0.5 * erfc(-xi / sqrt(2.0));
            double off[3];
            if (xi != xi) continue;
            off[0] = ulps_off(e->data[i], erf(xi));
            if (!vector) off[1] = fabs(g->data[i] - xi * Phi) / (ldexp(1.0, -23) * (1 + fabs(xi)));
            else if (xi >= -5.54) off[1] = ulps_off(g->data[i], xi * Phi) / 7.6;
            else off[1] = fabs(g->data[i] - xi * Phi) / 8.3e-8;
            if (!vector || isinf(xi)) off[2] = 0;
            else if (xi >= -5.5) {
                float scale = (float)(Phi + fabs(xi) * phi);
                off[2] = fabs(v->grad[i] - (Phi + xi * phi)) / ((double)nextafterf(scale, INFINITY) - scale) / 3.9;
            } else off[2] = fabs(v->grad[i] - (Phi + xi * phi)) / 1.5e-8;
            for (k = 0; k < 3; k++)
                if (off[k] > worst[k]) {
                    worst[k] = off[k];
                    worst_x[k] = xi;
                }
        }
        TH_CHECK(worst[0] <= (vector ? 1.4 : 1.0), "ad_erf: %.3g ulps from the exact value at x = %.9g (bound %g)",
                 worst[0], worst_x[0], vector ? 1.4 : 1.0);
        TH_CHECK(worst[1] <= 1, "ad_gelu: %.3g of its bound from the exact value at x = %.9g", worst[1], worst_x[1]);
        TH_CHECK(worst[2] <= 1, "ad_gelu's gradient: %.3g of its bound from the exact value at x = %.9g", worst[2],
                 worst_x[2]);
    }
done:
    ad_tape_free(T);
    free(x);
}

/* (j3b) GELU's gradient where its forward saves the derivative (float, vector functions): equal
   bit for bit to g times the derivative the vector function gives in the backward
   (AD__VM_GELU_GRAD), the path of machines without them and of one-element tensors, with the
   gradient written into a new buffer, added to one (x used twice) and written over the
   incoming one (the sweep's own buffer taken over); NaNs compared as NaNs. */
static void test_gelu_saved_grad(void)
{
    enum { N = 3001 };
    static float x[N], w[N], f[N];
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int shape[1] = {N}, i, form;
    ad_rng_seed(&rng, 23);
    for (i = 0; i < N; i++) {
        x[i] = (float)(3 * ad_rng_normal(&rng));
        w[i] = (float)ad_rng_normal(&rng);
    }
    x[0] = -INFINITY;
    x[1] = INFINITY;
    x[2] = NAN;
    x[3] = -0.0f;
    x[4] = -10.5f;
    if (!ad__unary_vectorised(AD__VM_GELU_GRAD, x, f, N)) {
        ad_tape_free(T);
        return; /* no vector functions: the backward evaluates the derivative itself */
    }
    for (form = 0; form < 3; form++) {
        ad_tensor *a = ad_tensor_view(T, 1, shape, x, NULL, 1), *wt = ad_tensor_view(T, 1, shape, w, NULL, 0);
        ad_tensor *y = ad_gelu(T, a), *loss;
        int differ = 0;
        if (form == 0) loss = ad_sum(T, ad_mul(T, wt, y));                                /* in place */
        else if (form == 1) loss = ad_sum(T, ad_add(T, ad_mul(T, wt, y), ad_mul(T, wt, a))); /* added */
        else loss = ad_sum(T, ad_mul(T, ad_relu(T, ad_affine(T, y, 1, 100)), wt));          /* written */
        if (!loss || ad_backward(T, loss) != 0 || !a->grad) {
            TH_CHECK(0, "GELU's saved derivative, form %d: %s", form, ad_tape_error(T));
            break;
        }
        for (i = 0; i < N; i++) {
            float want = form == 1 ? w[i] * f[i] + w[i] : w[i] * f[i];
            if (!(isnan(want) && isnan(a->grad[i])) && memcmp(&want, &a->grad[i], sizeof want) != 0) differ++;
        }
        TH_CHECK(differ == 0, "GELU's saved derivative, form %d: %d of %d gradients differ from g f'(x)", form, differ,
                 N);
        ad_tape_reset(T);
    }
    ad_tape_free(T);
}

/* (k) softmax and log-softmax of float rows (the vector exp where the machine has it) against
   double precision: each value within the rounding a row of n terms can gather, n + 2 units u
   of float's roundoff, plus |x - max| u from rounding x - max to float before the exponential;
   relative to the value (softmax; subnormal results: to the smallest normal float) or to
   1 + |value| (log-softmax). Rows of odd length, one with a very large and one with a very
   negative logit. */
static void test_float_softmax(void)
{
    enum { ROWS = 5, N = 37 };
    float x[ROWS * N];
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int shape[2] = {ROWS, N}, form, r, j;
    const double u = ldexp(1.0, -24);
    ad_rng_seed(&rng, 17);
    for (j = 0; j < ROWS * N; j++) x[j] = (float)(4 * ad_rng_normal(&rng));
    x[N + 3] = 80.0f;
    x[2 * N + 5] = -90.0f;
    for (form = 0; form < 2; form++) {
        ad_tensor *a = ad_tensor_view(T, 2, shape, x, NULL, 0);
        ad_tensor *y = form ? ad_log_softmax(T, a, 1) : ad_softmax(T, a, 1);
        double worst = 0;
        if (!y) {
            TH_CHECK(0, "softmax: %s", ad_tape_error(T));
            break;
        }
        for (r = 0; r < ROWS; r++) {
            double m = x[r * N], s = 0;
            for (j = 1; j < N; j++) m = x[r * N + j] > m ? x[r * N + j] : m;
            for (j = 0; j < N; j++) s += exp((double)x[r * N + j] - m);
            for (j = 0; j < N; j++) {
                double ls = (double)x[r * N + j] - m - log(s), ref = form ? ls : exp(ls);
                double scale = form ? 1 + fabs(ref) : ref > FLT_MIN ? ref : FLT_MIN; /* subnormals: absolute */
                /* x - m is rounded to float before the exponential: |x - m| u more */
                double err = fabs(y->data[r * N + j] - ref) / scale / (N + 2 + fabs(x[r * N + j] - m));
                if (err > worst) worst = err;
            }
        }
        TH_CHECK(worst <= u, "%s of float rows: error %.3g units of roundoff per term of the bound, at most 1",
                 form ? "log_softmax" : "softmax", worst / u);
        ad_tape_reset(T);
    }
    ad_tape_free(T);
}


/* ---- products in bfloat16 (ad_set_matmul_precision) ----------------------------------------
   The rounding of an operand against a reference computed another way; every kernel's products
   against sums in double of the rounded operands, on odd shapes and every transpose; the ops
   that run products (matmul, linear and its gradients, convolution, attention) against their
   float results; bitwise the same results on 1, 2 and 3 threads; the setting. Under TH_QUICK
   (the sanitizer runs) fewer random roundings, and the kernels on two of the four transposes. */
static int bf16_quick;


/* The bfloat16 value nearest to x (ties to even), by scaling in double: x's unit in the last
   of 8 significant bits is 2^(e - 7) for x in [2^e, 2^(e+1)). Finite x whose result is finite. */
static float bf16_reference(float x)
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

static float bf16_value(uint32_t b16)
{
    uint32_t u = b16 << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float bf16_rounded(float x) { return bf16_value(ad__bf16_bits(x)); }

typedef void (*bf16_round_fn)(const float *in, float *out); /* sixteen floats */
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* ad__bf16_round_avx512 of in[0, 16) into out. */
static __attribute__((target("avx512f"))) void bf16_round_sixteen(const float *in, float *out)
{
    _mm512_storeu_ps(out, ad__bf16_round_avx512(_mm512_loadu_ps(in), 1));
}

/* The AVX2 thin kernels' rounding (ad__bf16_round_v32), eight floats at a time. */
static __attribute__((target("avx2,fma"))) void bf16_round_sixteen_v32(const float *in, float *out)
{
    ad__bf16_round_v32_floats v;
    int h;
    for (h = 0; h < 2; h++) {
        memcpy(&v, in + 8 * h, sizeof v);
        v = ad__bf16_round_v32(v);
        memcpy(out + 8 * h, &v, sizeof v);
    }
}
#endif
#if AD__HAS_VECTOR_EXT && !defined(AUTODIFF_DOUBLE)
/* The generic thin kernels' rounding (ad__bf16_round_v16), four floats at a time. */
static void bf16_round_sixteen_v16(const float *in, float *out)
{
    ad__bf16_round_v16_floats v;
    int q;
    for (q = 0; q < 4; q++) {
        memcpy(&v, in + 4 * q, sizeof v);
        v = ad__bf16_round_v16(v);
        memcpy(out + 4 * q, &v, sizeof v);
    }
}
#endif

/* A vector rounding (round, named what) gives ad__bf16_round's bits for every kind of float: ties
   both ways, infinities, subnormals, and NaNs whose payload lies in the low bits only (which a
   plain add would carry into an infinity). */
static void bf16_check_vector_rounding(bf16_round_fn round, const char *what)
{
    static const uint32_t edges[16] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf818000u,
                                       0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x00018000u,
                                       0x7f800001u, 0xff80ffffu, 0x7fc00000u, 0x00000001u, 0x7f7f7fffu,
                                       0xffffffffu};
    float in[16], out[16];
    ad_rng rng;
    int n, i, bad = 0;
    ad_rng_seed(&rng, 11);
    for (n = 0; n < (bf16_quick ? 2000 : 20000); n++) {
        for (i = 0; i < 16; i++) {
            uint32_t u = n ? (uint32_t)ad_rng_below(&rng, 0xffffffffu) : edges[i];
            if (n % 3 == 1) u = (u & 0xffff0000u) | 0x8000u; /* ties */
            memcpy(&in[i], &u, 4);
        }
        round(in, out);
        for (i = 0; i < 16; i++) {
            float want = ad__bf16_round(in[i]);
            if (memcmp(&want, &out[i], 4) != 0 && bad++ < 5) {
                uint32_t u, got, wanted;
                memcpy(&u, &in[i], 4);
                memcpy(&got, &out[i], 4);
                memcpy(&wanted, &want, 4);
                printf("  0x%08x: vector 0x%08x, scalar 0x%08x\n", u, got, wanted);
            }
        }
    }
    TH_CHECK(bad == 0, "%d floats rounded by %s unlike ad__bf16_round", bad, what);
}

static void test_bf16_rounding(void)
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
        back = bf16_value(ad__bf16_bits(nan_in));
        TH_CHECK(back != back, "NaN rounds to a NaN");
        u = 0x7f800001u; /* a NaN whose payload is in the low bits only: must not become inf */
        memcpy(&nan_in, &u, 4);
        back = bf16_value(ad__bf16_bits(nan_in));
        TH_CHECK(back != back, "a NaN with a low payload stays NaN (0x%04x)", ad__bf16_bits(nan_in));
    }
    /* random floats of every size, and values next to ties, against the reference */
    ad_rng_seed(&rng, 7);
    for (n = 0; n < (bf16_quick ? 20000 : 200000); n++) {
        uint32_t u = (uint32_t)ad_rng_below(&rng, 0xffffffffu);
        float x, want;
        if (n % 4 == 1) u = (u & 0xffff0000u) | 0x8000u; /* ties */
        if (n % 4 == 2) u = (u & 0xffff0000u) | (0x8000u + (uint32_t)(n & 1 ? 1 : -1));
        memcpy(&x, &u, 4);
        if (!isfinite(x) || fabsf(x) > 3.38e38f) continue;
        want = bf16_reference(x);
        if (bf16_rounded(x) != want && !(want == 0 && bf16_rounded(x) == 0)) {
            if (bad++ < 5) printf("  0x%08x: bf16 %a, reference %a\n", u, bf16_rounded(x), want);
        }
    }
    TH_CHECK(bad == 0, "%d random floats round unlike the reference", bad);
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    /* the straight convolutions' copies and the AVX-512 thin kernels */
    if (ad__isa() == AD__ISA_AVX512) bf16_check_vector_rounding(bf16_round_sixteen, "AVX-512");
    if (ad__isa() >= AD__ISA_AVX2) bf16_check_vector_rounding(bf16_round_sixteen_v32, "the AVX2 thin kernels");
#endif
#if AD__HAS_VECTOR_EXT && !defined(AUTODIFF_DOUBLE)
    bf16_check_vector_rounding(bf16_round_sixteen_v16, "the generic thin kernels");
#endif
    th_family("bfloat16 rounding");
}

/* A matrix of rows x cols with values in [-1, 1), some of them larger or tiny. */
static void bf16_fill(float *x, size_t n, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) {
        x[i] = (float)(2 * ad_rng_uniform(rng) - 1);
        if (i % 11 == 3) x[i] *= 37.5f;
        if (i % 13 == 5) x[i] *= 1e-3f;
    }
}

/* Checks C (M x N, float; C0 what it held before, when the product was added to it, else NULL)
   against sums in double of op(A) op(B)'s rounded operands: each element within 4 K 2^-24 of the
   sum of its terms' magnitudes (4 (K + 1) with C0, for the one more addition), the room float
   sums need. Returns the largest |C - reference| relative to that bound. */
static double bf16_check_product(const char *what, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                                 const float *C0, const float *C)
{
    double worst = 0;
    int i, j, k, bad = 0;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double sum = C0 ? C0[(size_t)i * N + j] : 0, mag = fabs(sum), bound;
            for (k = 0; k < K; k++) {
                double a = bf16_rounded(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]);
                double b = bf16_rounded(tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
                sum += a * b;
                mag += fabs(a * b);
            }
            bound = 4.0 * (K + (C0 ? 1 : 0)) * ldexp(1.0, -24) * mag + 1e-30;
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

/* Checks that C is, bit for bit, what the bfloat16 dot-product instruction's order of operations
   gives: per K block of ad__gemm_kc, a sum from 0 that adds each pair's k + 1 product, then its k
   product (an odd K block's last pair with a zero for k + 1), each rounded to float, then the
   block's sum added to C (or stored, for the first block without C0). The kernels on floats
   promise exactly this; the products of rounded operands are exact in float for these values. */
static void bf16_check_pair_order(const char *what, int ta, int tb, int M, int N, int K, const float *A,
                                  const float *B, const float *C0, const float *C)
{
    int i, j, k0, k, kstep = ad__gemm_kstep(M, N, K, tb), bad = 0;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            float c = C0 ? C0[(size_t)i * N + j] : 0;
            for (k0 = 0; k0 < K; k0 += kstep) {
                int kc = K - k0 < kstep ? K - k0 : kstep;
                float block = 0;
                for (k = k0; k < k0 + kc; k += 2) {
                    float a_lo = bf16_rounded(ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k]);
                    float b_lo = bf16_rounded(tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
                    float a_hi = 0, b_hi = 0;
                    if (k + 1 < k0 + kc) {
                        a_hi = bf16_rounded(ta ? A[(size_t)(k + 1) * M + i] : A[(size_t)i * K + k + 1]);
                        b_hi = bf16_rounded(tb ? B[(size_t)j * K + k + 1] : B[(size_t)(k + 1) * N + j]);
                    }
                    block += a_hi * b_hi;
                    block += a_lo * b_lo;
                }
                c = k0 == 0 && !C0 ? block : c + block;
            }
            if (memcmp(&c, &C[(size_t)i * N + j], sizeof c) != 0 && bad++ < 3)
                printf("  %s [%d,%d]: %a, the pairs' order gives %a\n", what, i, j, (double)C[(size_t)i * N + j],
                       (double)c);
        }
    TH_CHECK(bad == 0, "%s %dx%dx%d ta %d tb %d: %d elements not in the pairs' order", what, M, N, K, ta, tb, bad);
}

static const int bf16_shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {8, 1, 300}, {1, 40, 515}, {300, 2, 3},
                                {64, 128, 784}, {129, 257, 65}, {64, 10, 128}, {31, 47, 257}, {200, 96, 530},
                                {5, 2100, 255}};
#define BF16_SHAPES ((int)(sizeof bf16_shapes / sizeof bf16_shapes[0]))

/* A kernel of pair panels (fn), or a float kernel on rounded floats (floats). */
static ad__bf16_gemm_kernel bf16_kernel(ad__bf16_kernel fn, ad__microkernel floats, int mr, int nr)
{
    ad__bf16_gemm_kernel k;
    k.fn = fn, k.block = NULL, k.floats = floats, k.mr = mr, k.nr = nr, k.a_by_rows = 0, k.pair_block = 1;
    return k;
}

/* One product on kernel ker's path, through packing buffers first filled with NaN (so that a
   value the packing leaves unwritten shows). */
static void bf16_product(ad__bf16_gemm_kernel ker, ad_real *pack, int ta, int tb, int M, int N, int K, const float *A,
                         const float *B, float *C, int accumulate)
{
    size_t i;
    for (i = 0; i < AD__PACK_PER_THREAD; i++) pack[i] = (ad_real)NAN;
    if (ker.floats)
        ad__gemm_serial_bf16_floats(ker, pack, pack + (size_t)AD__MC * AD__KC_MAX, ta, tb, M, N, K,
                                    ad__gemm_kstep(M, N, K, tb), A, ta ? M : K, B, tb ? K : N, C, N, accumulate);
    else
        ad__gemm_serial_bf16(ker, pack, pack + (size_t)AD__MC * AD__KC_MAX, ta, tb, M, N, K,
                             ad__gemm_kstep(M, N, K, tb), A, ta ? M : K, B, tb ? K : N, C, N, accumulate);
}

/* Every kernel this machine can run, and the one ad__bf16_pick picks for each product's shape, on
   the packed path, against the rounded operands, half the products added to what C held; the
   kernels on floats also bit for bit against the dot product's order, and the dot product's tall
   tile (16 x 16, for few columns) bit for bit against its wide one (8 x 32). */
static void test_bf16_kernels(void)
{
    ad__bf16_gemm_kernel kernels[7];
    const char *names[7];
    int nk = 0, s, t, k;
    size_t a_max = 0, b_max = 0, c_max = 0;
    ad_rng rng;
    float *A, *B, *C, *C0, *C2;
    ad_real *pack = (ad_real *)malloc(AD__PACK_PER_THREAD * sizeof(ad_real));
    ad_rng_seed(&rng, 11);
    kernels[nk] = bf16_kernel(NULL, NULL, 0, 0); /* replaced by ad__bf16_pick's for each product */
    names[nk++] = "as picked for the product";
    kernels[nk] = bf16_kernel(NULL, ad__kernel_generic, AD__HAS_VECTOR_EXT ? 6 : 4, AD__HAS_VECTOR_EXT ? 8 : 4);
    names[nk++] = "float kernel, generic";
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        kernels[nk] = bf16_kernel(NULL, ad__kernel_avx2, 6, 16);
        names[nk++] = "float kernel, AVX2";
    }
    if (ad__isa() == AD__ISA_AVX512) {
        kernels[nk] = bf16_kernel(NULL, ad__kernel_avx512, 8, 32);
        names[nk++] = "float kernel, AVX-512";
    }
#if AD__HAS_BF16_INSTRUCTION
    if (ad__isa_features() & AD__ISA_BF16) {
        kernels[nk] = bf16_kernel(ad__bf16_dot_avx512, NULL, 8, 32);
        names[nk++] = "AVX512-BF16 dot product";
        kernels[nk] = bf16_kernel(ad__bf16_dot16_avx512, NULL, 16, 16);
        names[nk++] = "AVX512-BF16 dot, 16 x 16";
    }
#endif
#if AD__HAS_AMX
    if (ad__amx_permitted()) {
        kernels[nk] = ad__bf16_pick(AD__BF16_AMX, ad__gemm_pick(32), 32, 32);
        names[nk++] = "AMX tiles";
    }
#endif
#endif
    for (s = 0; s < BF16_SHAPES; s++) {
        size_t M = (size_t)bf16_shapes[s][0], N = (size_t)bf16_shapes[s][1], K = (size_t)bf16_shapes[s][2];
        if (M * K > a_max) a_max = M * K;
        if (K * N > b_max) b_max = K * N;
        if (M * N > c_max) c_max = M * N;
    }
    A = (float *)malloc(a_max * sizeof(float));
    B = (float *)malloc(b_max * sizeof(float));
    C = (float *)malloc(c_max * sizeof(float));
    C0 = (float *)malloc(c_max * sizeof(float));
    C2 = (float *)malloc(c_max * sizeof(float));
    if (!pack || !A || !B || !C || !C0 || !C2) {
        TH_CHECK(0, "out of memory");
        free(A), free(B), free(C), free(C0), free(C2), free(pack);
        return;
    }
    for (k = 0; k < nk; k++) {
        double worst = 0;
        for (s = 0; s < BF16_SHAPES; s++)
            for (t = 0; t < 4; t += bf16_quick ? 3 : 1) {
                int M = bf16_shapes[s][0], N = bf16_shapes[s][1], K = bf16_shapes[s][2], ta = t & 1, tb = t >> 1;
                int accumulate = (s + t) & 1;
                ad__bf16_gemm_kernel ker = k == 0 ? ad__bf16_pick(AD__BF16_VECTORS, ad__gemm_pick(N), M, N) : kernels[k];
                double w;
                bf16_fill(A, (size_t)M * K, &rng);
                bf16_fill(B, (size_t)K * N, &rng);
                bf16_fill(C0, (size_t)M * N, &rng);
                memcpy(C, C0, (size_t)M * N * sizeof(float));
                bf16_product(ker, pack, ta, tb, M, N, K, A, B, C, accumulate);
                w = bf16_check_product(names[k], ta, tb, M, N, K, A, B, accumulate ? C0 : NULL, C);
                if (w > worst) worst = w;
                if (ker.floats) bf16_check_pair_order(names[k], ta, tb, M, N, K, A, B, accumulate ? C0 : NULL, C);
#if AD__X86_DISPATCH && AD__HAS_BF16_INSTRUCTION
                if (ker.fn == ad__bf16_dot16_avx512) {
                    memcpy(C2, C0, (size_t)M * N * sizeof(float));
                    bf16_product(bf16_kernel(ad__bf16_dot_avx512, NULL, 8, 32), pack, ta, tb, M, N, K, A, B, C2,
                                 accumulate);
                    TH_CHECK(memcmp(C, C2, (size_t)M * N * sizeof(float)) == 0,
                             "%s %dx%dx%d ta %d tb %d: not the 8 x 32 tile's bits", names[k], M, N, K, ta, tb);
                }
#endif
            }
        printf("  %-28s largest error %.2f of the bound\n", names[k], worst);
    }
    free(A);
    free(B);
    free(C);
    free(C0);
    free(C2);
    free(pack);
    th_family("bfloat16 kernels");
}

/* A leaf with values from fill, requiring grad when grad is set. */
static ad_tensor *bf16_leaf(ad_tape *T, int ndim, const int *shape, ad_rng *rng, int grad)
{
    ad_tensor *t = ad_tensor_new(T, ndim, shape, NULL, grad);
    if (t) bf16_fill(t->data, t->size, rng);
    return t;
}

static ad_tensor *bf16_tensor(ad_tape *T, int ndim, const int *shape, ad_rng *rng)
{
    return bf16_leaf(T, ndim, shape, rng, 0);
}

/* ad_matmul_t, with every transpose, through the tape (threads, the small-product path). */
static void test_bf16_matmul(void)
{
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    int s, t;
    ad_rng_seed(&rng, 3);
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == AD_MATMUL_FLOAT32, "the default is float32");
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_BFLOAT16, "the setting reads back");
    for (s = 0; s < BF16_SHAPES; s++)
        for (t = 0; t < 4; t++) {
            int M = bf16_shapes[s][0], N = bf16_shapes[s][1], K = bf16_shapes[s][2], ta = t & 1, tb = t >> 1;
            int sa[2], sb[2];
            ad_tensor *a, *b, *c;
            sa[0] = ta ? K : M, sa[1] = ta ? M : K;
            sb[0] = tb ? N : K, sb[1] = tb ? K : N;
            a = bf16_tensor(T, 2, sa, &rng);
            b = bf16_tensor(T, 2, sb, &rng);
            c = ad_matmul_t(T, a, b, ta, tb);
            TH_CHECK(c != NULL, "matmul: %s", th_errs(T));
            if (c) bf16_check_product("ad_matmul_t", ta, tb, M, N, K, a->data, b->data, NULL, c->data);
            ad_tape_reset(T);
        }
    ad_tape_free(T);
    th_family("ad_matmul_t in bfloat16");
}

/* ad_linear's forward and both gradients, each a product of rounded operands; and the float
   results differ, so the rounding took place. */
static void test_bf16_linear(void)
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
    x = bf16_leaf(T, 2, shape_x, &rng, 1);
    W = bf16_leaf(T, 2, shape_w, &rng, 1);
    y = ad_linear(T, x, W, NULL);
    /* the loss sum(y * y / 2) sends y itself back as y's gradient */
    loss = ad_div_scalar(T, ad_sum(T, ad_mul(T, y, y)), 2);
    TH_CHECK(loss && ad_backward(T, loss) == 0, "linear: %s", th_errs(T));
    if (!loss) {
        ad_tape_free(T);
        return;
    }
    bf16_check_product("ad_linear forward", 0, 0, 37, 29, 91, x->data, W->data, NULL, y->data);
    g = y->data; /* the incoming gradient */
    bf16_check_product("ad_linear dx = g W^T", 0, 1, 37, 91, 29, g, W->data, NULL, x->grad);
    bf16_check_product("ad_linear dW = x^T g", 1, 0, 91, 29, 37, x->data, g, NULL, W->grad);
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
static void test_bf16_threads(void)
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
            c = ad_matmul(T, bf16_tensor(T, 2, sa, &rng), bf16_tensor(T, 2, sb, &rng));
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
            x = bf16_tensor(T, 4, sx, &rng);
            w = bf16_leaf(T, 4, sw, &rng, 1);
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

/* The largest difference between a[0, n) and b[0, n), and b's largest magnitude. */
static double bf16_worst_difference(const float *a, const float *b, size_t n, double *scale)
{
    double worst = 0;
    size_t i;
    *scale = 0;
    for (i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > worst) worst = fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > *scale) *scale = fabs((double)b[i]);
    }
    return worst;
}

/* One thin product (one to three rows or columns of C) on a tape in bfloat16 (T) and on a float
   tape (F) from copies of A and B rounded to bfloat16 beforehand, C starting from the same values:
   the thin kernels round each value as they read it, so the two must be the same bits (or both
   NaN). With
   edges, some values of A and B are the floats whose rounding is delicate (ties, a NaN whose
   payload lies in its low bits, the largest floats, subnormals). Returns whether they are. */
static int bf16_thin_case(ad_tape *T, ad_tape *F, ad_rng *rng, int ta, int tb, int m, int n, int k, int accumulate,
                          int edges)
{
    static const uint32_t edge_bits[] = {0x3f808000u, 0x3f818000u, 0xbf818000u, 0x7f800001u, 0x7f7fffffu,
                                         0x00018000u, 0x80000001u, 0x7f7f7fffu};
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *A = (float *)malloc(na * sizeof(float)), *Ar = (float *)malloc(na * sizeof(float));
    float *B = (float *)malloc(nb * sizeof(float)), *Br = (float *)malloc(nb * sizeof(float));
    float *C = (float *)malloc(nc * sizeof(float)), *Cr = (float *)malloc(nc * sizeof(float));
    size_t i;
    int same = 0;
    if (A && Ar && B && Br && C && Cr) {
        bf16_fill(A, na, rng);
        bf16_fill(B, nb, rng);
        bf16_fill(C, nc, rng);
        if (edges) {
            for (i = 0; i < na; i += 7) memcpy(&A[i], &edge_bits[i / 7 % 8], 4);
            for (i = 3; i < nb; i += 11) memcpy(&B[i], &edge_bits[i / 11 % 8], 4);
        }
        for (i = 0; i < na; i++) Ar[i] = bf16_rounded(A[i]);
        for (i = 0; i < nb; i++) Br[i] = bf16_rounded(B[i]);
        memcpy(Cr, C, nc * sizeof(float));
        ad__gemm(T, ta, tb, m, n, k, A, ta ? m : k, B, tb ? k : n, C, n, accumulate);
        ad__gemm(F, ta, tb, m, n, k, Ar, ta ? m : k, Br, tb ? k : n, Cr, n, accumulate);
        same = 1;
        for (i = 0; i < nc; i++) /* NaNs alike, whichever operand's NaN an instruction passed on */
            same &= (isnan(C[i]) && isnan(Cr[i])) || memcmp(&C[i], &Cr[i], sizeof(float)) == 0;
    } else {
        TH_CHECK(0, "out of memory");
    }
    free(A), free(Ar), free(B), free(Br), free(C), free(Cr);
    return same;
}

/* Products with one to three rows of C (the operands not both transposed) or one to three
   columns, which the thin kernels take in bfloat16 too, rounding as they read: every transpose,
   K on both sides of a step of the dot products (16) and of the stretches of copied columns
   (AD__THIN_COPY), with and without accumulating, some with the delicate floats; the same bits
   as the float kernels on operands rounded beforehand (bf16_thin_case), so that no value is read
   unrounded. Large enough ones are split over threads: the same bits on 1, 2 and 3 threads.
   Where the processor has AVX-512, the AVX2 kernels give the same bits. */
static void test_bf16_thin(void)
{
    static const int sides[] = {1, 2, 3}, others[] = {4, 17, 70}, ks[] = {1, 16, 37, 300};
    ad_tape *T = ad_tape_new(), *F = ad_tape_new();
    ad_rng rng;
    int s, o, ki, t, acc, cases = 0, differ = 0, threads;
    ad_rng_seed(&rng, 41);
    ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
    for (s = 0; s < 3; s++)
        for (o = 0; o < 3; o++)
            for (ki = 0; ki < 4; ki++)
                for (t = 0; t < 4; t++)
                    for (acc = 0; acc <= 1; acc++) {
                        int ta = t & 1, tb = t >> 1, k = ks[ki], edges = (s + o + ki + acc) % 3 == 0;
                        /* few rows (not both transposed), then few columns */
                        if (!(ta && tb)) {
                            cases++;
                            if (!bf16_thin_case(T, F, &rng, ta, tb, sides[s], others[o], k, acc, edges) &&
                                differ++ < 5)
                                TH_CHECK(0, "bfloat16 m=%d n=%d k=%d ta=%d tb=%d accumulate=%d: not the rounded "
                                            "operands' float product", sides[s], others[o], k, ta, tb, acc);
                        }
                        cases++;
                        if (!bf16_thin_case(T, F, &rng, ta, tb, others[o], sides[s], k, acc, edges) && differ++ < 5)
                            TH_CHECK(0, "bfloat16 m=%d n=%d k=%d ta=%d tb=%d accumulate=%d: not the rounded "
                                        "operands' float product", others[o], sides[s], k, ta, tb, acc);
                    }
    TH_CHECK(differ == 0, "%d of %d thin bfloat16 products differ from the float ones of rounded operands", differ,
             cases);
    for (threads = 1; threads <= 3; threads++) {
        ad_set_threads(T, threads);
        ad_set_threads(F, threads);
        for (t = 0; t < 4; t++) {
            int ta = t & 1, tb = t >> 1;
            if (!(ta && tb))
                TH_CHECK(bf16_thin_case(T, F, &rng, ta, tb, 2, 2 * AD__THIN_STRETCH + 193, 347, t == 1, 0),
                         "bfloat16 m=2 n=577 ta=%d tb=%d on %d threads", ta, tb, threads);
            TH_CHECK(bf16_thin_case(T, F, &rng, ta, tb, 2 * AD__THIN_STRETCH + 193, 3, 347, t == 2, 0),
                     "bfloat16 m=577 n=3 ta=%d tb=%d on %d threads", ta, tb, threads);
        }
    }
#if AD__X86_DISPATCH
    if (ad__isa() == AD__ISA_AVX512) {
        static const int shapes[][2] = {{1, 1}, {37, 5}, {100, 257}, {65, 1000}};
        size_t i;
        int r;
        differ = 0;
        for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (r = 1; r <= 3; r++)
                for (t = 0; t < 4; t++) {
                    int ta = t & 1, tb = t >> 1;
                    if (!(ta && tb))
                        differ += !thin_widths_agree(ad__thin_bf16_avx512, ad__thin_bf16_avx2, &rng, ta, tb, r,
                                                     shapes[i][0], shapes[i][1]);
                    differ += !thin_widths_agree(ad__thin_bf16_avx512_few_columns, ad__thin_bf16_avx2_few_columns,
                                                 &rng, ta, tb, shapes[i][0] + 3, r, shapes[i][1]);
                }
        TH_CHECK(differ == 0, "%d thin bfloat16 products differ between AVX2 and AVX-512", differ);
    }
#endif
    ad_tape_free(T);
    ad_tape_free(F);
    th_family("thin products in bfloat16");
}

/* The convolution and the attention in bfloat16 stay within bfloat16's rounding of their float
   results, and differ from them. */
static void test_bf16_ops(void)
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
        outs[0] = ad_conv2d(T, bf16_tensor(T, 4, sx, &rng), bf16_tensor(T, 4, sw, &rng), NULL, NULL);
        /* scores of moderate size: bfloat16 moves each by about 2^-8 of its terms, which a
           softmax of large scores turns into large changes of its weights */
        outs[1] = ad_attention(T, ad_tanh(T, bf16_tensor(T, 4, sq, &rng)), ad_tanh(T, bf16_tensor(T, 4, sq, &rng)),
                               bf16_tensor(T, 4, sq, &rng), 1, 0.25f);
        TH_CHECK(outs[0] && outs[1], "conv2d, attention: %s", th_errs(T));
        for (o = 0; o < 2 && outs[0] && outs[1]; o++) {
            if (!pass) {
                n[o] = outs[o]->size;
                ref[o] = (float *)malloc(n[o] * sizeof(float));
                if (ref[o]) memcpy(ref[o], outs[o]->data, n[o] * sizeof(float));
            } else if (ref[o]) {
                worst[o] = bf16_worst_difference(outs[o]->data, ref[o], n[o], &scale[o]);
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

/* t's values rounded to bfloat16 in place. */
static void bf16_round_values(ad_tensor *t)
{
    size_t i;
    for (i = 0; i < t->size; i++) t->data[i] = ad__bf16_round(t->data[i]);
}

/* A convolution in bfloat16 is the float convolution of its operands rounded to bfloat16: its
   output, and its input and weight gradients (the float run given the output gradient rounded,
   the bfloat16 run the same one unrounded), within float's rounding of the sums. Up to
   AD__BF16_STRAIGHT_OUTPUTS channels the maps go straight from the images with AVX-512, which
   round as they copy; the last geometry has more and goes through im2col's products. A rounding
   left out moves results by about 2^-9 of their terms, some hundred times the bound. */
static void test_bf16_conv_rounded(void)
{
    static const int geoms[][9] = {/* n, c, h, w, o, kh, kw, padding h, w */
                                   {16, 1, 28, 28, 8, 5, 5, 0, 0},
                                   {16, 8, 12, 12, 16, 5, 5, 0, 0},
                                   {5, 3, 13, 11, 5, 3, 3, 1, 1},
                                   {3, 4, 9, 10, AD__BF16_STRAIGHT_OUTPUTS + 4, 3, 3, 1, 0}};
    int gi, pass, r;
    for (gi = 0; gi < (int)(sizeof geoms / sizeof geoms[0]); gi++) {
        const int *g = geoms[gi];
        int sx[4] = {g[0], g[1], g[2], g[3]}, sw[4] = {g[4], g[1], g[5], g[6]};
        float *got[2][3] = {{NULL, NULL, NULL}, {NULL, NULL, NULL}};
        size_t n[3] = {0, 0, 0};
        ad_conv2d_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.pad_h = g[7];
        desc.pad_w = g[8];
        for (pass = 0; pass < 2; pass++) { /* 0: float on rounded operands, 1: bfloat16 */
            ad_tape *T = ad_tape_new();
            ad_rng rng;
            ad_tensor *x, *w, *y, *dy = NULL, *res[3];
            ad_rng_seed(&rng, 23 + gi);
            if (pass) ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16);
            x = bf16_leaf(T, 4, sx, &rng, 1);
            w = bf16_leaf(T, 4, sw, &rng, 1);
            if (x && w && !pass) {
                bf16_round_values(x);
                bf16_round_values(w);
            }
            y = ad_conv2d(T, x, w, NULL, &desc);
            if (y) dy = bf16_tensor(T, y->ndim, y->shape, &rng);
            if (dy && !pass) bf16_round_values(dy);
            TH_CHECK(dy && ad_backward(T, ad_sum(T, ad_mul(T, y, dy))) == 0, "geometry %d: %s", gi, th_errs(T));
            res[0] = y;
            res[1] = x;
            res[2] = w;
            for (r = 0; r < 3 && dy; r++) {
                const float *v = r ? res[r]->grad : res[r]->data;
                n[r] = res[r]->size;
                got[pass][r] = (float *)malloc(n[r] * sizeof(float));
                if (got[pass][r] && v) memcpy(got[pass][r], v, n[r] * sizeof(float));
            }
            ad_tape_free(T);
        }
        for (r = 0; r < 3; r++) {
            static const char *what[3] = {"output", "input gradient", "weight gradient"};
            double scale, worst;
            if (!got[0][r] || !got[1][r]) {
                TH_CHECK(0, "geometry %d: no %s", gi, what[r]);
                continue;
            }
            worst = bf16_worst_difference(got[1][r], got[0][r], n[r], &scale);
            TH_CHECK(scale > 0 && worst <= 1e-5 * scale, "geometry %d: the %s in bfloat16 is %g from the float one on "
                     "rounded operands (largest value %g)", gi, what[r], worst, scale);
        }
        for (pass = 0; pass < 2; pass++)
            for (r = 0; r < 3; r++) free(got[pass][r]);
    }
    th_family("conv2d in bfloat16: the float convolution of rounded operands");
}

static void test_bf16_setting(void)
{
    ad_tape *T = ad_tape_new();
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_FLOAT32, "a new tape computes products in float");
    TH_CHECK(ad_set_matmul_precision(T, 7) == -1, "an unknown precision is refused");
    TH_CHECK_ERROR(T, "ad_set_matmul_precision: unknown precision 7");
    ad_tape_clear_error(T);
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) == AD_MATMUL_FLOAT32, "set: the previous setting");
    ad_tape_reset(T);
    TH_CHECK(ad_get_matmul_precision(T) == AD_MATMUL_BFLOAT16, "the setting lasts across resets");
    TH_CHECK(ad_set_matmul_precision(T, AD_MATMUL_FLOAT32) == AD_MATMUL_BFLOAT16, "and goes back to float");
    TH_CHECK(ad_set_matmul_precision(NULL, AD_MATMUL_FLOAT32) == -1, "a NULL tape");
    ad_tape_free(T);
    th_family("ad_set_matmul_precision");
}

int main(void)
{
    long start = live();
    int kc_limit;
    test_chain();
    test_allocations();
    test_no_grad();
    test_reset();
    test_two_tapes();
    test_views();
    test_arena();
    th_family("the tape: chains, resets, views, the arena");
    test_gemm_kc_for_l2();
    test_gemm_blocks();
    test_param_bands();
    for (kc_limit = 0; kc_limit <= 1; kc_limit++) {
        /* the shapes' K blocks were chosen for blocks of 256, then this machine's */
        set_gemm_kc_limit(kc_limit ? 0 : AD__KC_UNKNOWN_L2);
        test_float_matmul();
        test_float_gemm_thin();
        test_float_gemm_few_columns();
        test_float_gemm_narrow();
        test_float_gemm_spread();
        if (!kc_limit) test_float_gemm_stride_paths(); /* its K blocks of at most 256 rows fit L1's sets */
        test_float_pack_a();
        test_float_gemm_shared();
        test_float_gemm_shared_a();
        test_float_gemm_ksplit();
        test_float_gemm_prepacked();
    }
    test_layer_allocations();
    test_float_optim();
    test_float_unary_accuracy();
    test_float_unary_avx2();
    test_float_norm_avx2();
    test_float_clip_sum_avx2();
    test_float_max_pool_avx512();
    test_float_max_pool_adjoint_avx512();
    test_float_max_pool_third_order();
    test_float_col2im_avx512();
    test_float_conv_straight();
    test_float_conv_straight_tail();
    test_float_sincos_grad();
    test_uniform_gradient();
    test_take_over();
    test_float_erf_gelu();
    test_gelu_saved_grad();
    test_float_softmax();
    test_threads();
    test_threads_elementwise();
    test_threads_leaf_grads();
    test_threads_pool();
    test_float_long_sum();
    test_scalar_tape();
    bf16_quick = getenv("TH_QUICK") != NULL;
    test_bf16_setting();
    test_bf16_rounding();
    test_bf16_kernels();
    test_bf16_matmul();
    test_bf16_linear();
    test_bf16_threads();
    test_bf16_thin();
    test_bf16_ops();
    test_bf16_conv_rounded();
    TH_CHECK(live() == start, "%ld blocks leaked in total", live() - start);
    return th_summary();
}
