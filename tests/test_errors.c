/* Misuse of every public op: the call returns NULL (or -1) and leaves a message on the tape that
   names the op and the shapes involved; NULL inputs pass through silently; the first error
   sticks; running out of memory is an error like the others, without crashes or leaks. */
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>

/* An allocator that fails the allocation numbered fail_at, and with fail_rest every one after
   it too (fail_at < 0: none). The thread pool's workers free their start-up arguments, so the
   counters are atomic. */
static long alloc_index, live_blocks, fail_at = -1;
static int fail_rest;
static int should_fail(long i) { return fail_at >= 0 && (fail_rest ? i >= fail_at : i == fail_at); }
static void *failing_malloc(size_t n)
{
    long i = __atomic_fetch_add(&alloc_index, 1, __ATOMIC_SEQ_CST);
    void *p;
    if (should_fail(i)) return NULL;
    p = malloc(n);
    if (p) __atomic_fetch_add(&live_blocks, 1, __ATOMIC_SEQ_CST);
    return p;
}
static void *failing_realloc(void *old, size_t n)
{
    long i = __atomic_fetch_add(&alloc_index, 1, __ATOMIC_SEQ_CST);
    void *p;
    if (should_fail(i)) return NULL;
    p = realloc(old, n);
    if (p && !old) __atomic_fetch_add(&live_blocks, 1, __ATOMIC_SEQ_CST);
    return p;
}
static void failing_free(void *p)
{
    if (p) __atomic_fetch_sub(&live_blocks, 1, __ATOMIC_SEQ_CST);
    free(p);
}
#define AUTODIFF_MALLOC(sz) failing_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) failing_realloc(p, sz)
#define AUTODIFF_FREE(p) failing_free(p)
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "tests/harness.h"

/* The call must fail: return NULL and set an error (checked by the TH_CHECK_ERRORs after it). */
#define MISUSE(T, call)                                                                    \
    do {                                                                                   \
        ad_tape_clear_error(T);                                                            \
        TH_CHECK((call) == NULL, "%s did not fail", #call);                                \
    } while (0)

/* The call is given a NULL tensor: it returns NULL and adds no message. */
#define PASSES_NULL(T, call)                                                               \
    do {                                                                                   \
        ad_tape_clear_error(T);                                                            \
        TH_CHECK((call) == NULL, "%s: a NULL input gave a tensor", #call);                 \
        TH_CHECK(ad_tape_error(T) == NULL, "%s: a NULL input set the error \"%s\"", #call, \
                 ad_tape_error(T) ? ad_tape_error(T) : "");                                \
    } while (0)

static void test_creation(ad_tape *T)
{
    int neg[] = {3, -1}, zero[] = {0, 4}, many[] = {INT_MAX, INT_MAX, INT_MAX}, nine[9], ok[] = {2, 3};
    ad_real data[6] = {0};
    ad_rng rng;
    int i;
    for (i = 0; i < 9; i++) nine[i] = 1;
    ad_rng_seed(&rng, 1);
    MISUSE(T, ad_tensor_new(T, 2, neg, NULL, 0));
    TH_CHECK_ERROR(T, "ad_tensor_new: shape [3,-1]: dimension 1 is -1; dimensions must be positive");
    MISUSE(T, ad_tensor_new(T, 2, zero, NULL, 1));
    TH_CHECK_ERROR(T, "ad_tensor_new: shape [0,4]: dimension 0 is 0");
    MISUSE(T, ad_tensor_new(T, -1, ok, NULL, 0));
    TH_CHECK_ERROR(T, "ad_tensor_new: -1 dimensions");
    MISUSE(T, ad_tensor_new(T, 9, nine, NULL, 0));
    TH_CHECK_ERROR(T, "ad_tensor_new: 9 dimensions; between 0 and 8 are supported");
    MISUSE(T, ad_tensor_new(T, 2, NULL, NULL, 0));
    TH_CHECK_ERROR(T, "ad_tensor_new: shape is NULL for 2 dimensions");
    MISUSE(T, ad_tensor_new(T, 3, many, NULL, 0));
    TH_CHECK_ERROR(T, "ad_tensor_new: shape [2147483647,2147483647,2147483647] has too many elements");
    MISUSE(T, ad_tensor_view(T, 2, ok, NULL, NULL, 1));
    TH_CHECK_ERROR(T, "ad_tensor_view: data is NULL");
    MISUSE(T, ad_tensor_view(T, 2, neg, data, NULL, 1));
    TH_CHECK_ERROR(T, "ad_tensor_view: shape [3,-1]: dimension 1 is -1");
    MISUSE(T, ad_zeros(T, 2, zero));
    TH_CHECK_ERROR(T, "ad_zeros: shape [0,4]");
    MISUSE(T, ad_ones(T, 2, neg));
    TH_CHECK_ERROR(T, "ad_ones: shape [3,-1]");
    MISUSE(T, ad_full(T, 2, zero, 1));
    TH_CHECK_ERROR(T, "ad_full: shape [0,4]");
    MISUSE(T, ad_rand(T, 2, ok, 0, 1, NULL));
    TH_CHECK_ERROR(T, "ad_rand: rng is NULL");
    MISUSE(T, ad_randn(T, 2, ok, 0, 1, NULL));
    TH_CHECK_ERROR(T, "ad_randn: rng is NULL");
    MISUSE(T, ad_rand(T, 2, neg, 0, 1, &rng));
    TH_CHECK_ERROR(T, "ad_rand: shape [3,-1]");
    MISUSE(T, ad_randn(T, 2, zero, 0, 1, &rng));
    TH_CHECK_ERROR(T, "ad_randn: shape [0,4]");
    /* a scalar needs no shape */
    ad_tape_clear_error(T);
    TH_CHECK(ad_tensor_new(T, 0, NULL, NULL, 1) != NULL && ad_tape_error(T) == NULL, "a scalar with a NULL shape");
}

static void test_elementwise_binary(ad_tape *T)
{
    int s35[] = {3, 5}, s4[] = {4}, s357[] = {3, 5, 7}, s27[] = {2, 7};
    ad_tensor *a = ad_zeros(T, 2, s35), *b = ad_zeros(T, 1, s4), *c = ad_zeros(T, 3, s357), *d = ad_zeros(T, 2, s27);
    MISUSE(T, ad_clamp(T, a, 2, 1));
    TH_CHECK_ERROR(T, "ad_clamp: lower bound 2 is above upper bound 1");
    MISUSE(T, ad_div_scalar(T, a, 0));
    TH_CHECK_ERROR(T, "ad_div_scalar: division by zero");
    MISUSE(T, ad_add(T, a, b));
    TH_CHECK_ERROR(T, "ad_add: shapes [3,5] and [4] cannot be broadcast (dimension 1: 5 vs 4)");
    MISUSE(T, ad_sub(T, b, a));
    TH_CHECK_ERROR(T, "ad_sub: shapes [4] and [3,5] cannot be broadcast (dimension 1: 4 vs 5)");
    MISUSE(T, ad_mul(T, c, d));
    TH_CHECK_ERROR(T, "ad_mul: shapes [3,5,7] and [2,7] cannot be broadcast (dimension 1: 5 vs 2)");
    MISUSE(T, ad_div(T, d, c));
    TH_CHECK_ERROR(T, "ad_div: shapes [2,7] and [3,5,7] cannot be broadcast");
    MISUSE(T, ad_maximum(T, a, b));
    TH_CHECK_ERROR(T, "ad_maximum: shapes [3,5] and [4] cannot be broadcast");
    MISUSE(T, ad_minimum(T, c, a));
    TH_CHECK_ERROR(T, "ad_minimum: shapes [3,5,7] and [3,5] cannot be broadcast (dimension 1: 5 vs 3)");
}

static void test_reduce_shape(ad_tape *T)
{
    int s35[] = {3, 5}, s357[] = {3, 5, 7}, s44[] = {4, 4}, m11[] = {-1, -1}, z[] = {0, 15}, m14[] = {-1, 4};
    int nine[9], p_dup[] = {0, 0, 1}, p_big[] = {0, 1, 3}, p_neg[] = {-1, 0, 1};
    int s327[] = {3, 2, 7}, s346[] = {3, 4, 6}, s47[] = {4, 7}, s45[] = {4, 5}, s5[] = {5}, s3[] = {3};
    ad_tensor *a = ad_zeros(T, 2, s35), *c = ad_zeros(T, 3, s357), *scalar = ad_scalar(T, 1), *xs[3];
    int i;
    for (i = 0; i < 9; i++) nine[i] = 1;
    MISUSE(T, ad_sum_axis(T, c, 3, 0));
    TH_CHECK_ERROR(T, "ad_sum_axis: axis 3 is out of range for shape [3,5,7]");
    MISUSE(T, ad_mean_axis(T, c, -4, 1));
    TH_CHECK_ERROR(T, "ad_mean_axis: axis -4 is out of range for shape [3,5,7]");
    MISUSE(T, ad_max_axis(T, scalar, 0, 0));
    TH_CHECK_ERROR(T, "ad_max_axis: axis 0 is out of range for shape []");
    MISUSE(T, ad_reshape(T, a, 2, s44));
    TH_CHECK_ERROR(T, "ad_reshape: [3,5] to [4,4]: 15 elements do not fit");
    MISUSE(T, ad_reshape(T, a, 2, m14));
    TH_CHECK_ERROR(T, "ad_reshape: [3,5] to [-1,4]: 15 elements do not fit");
    MISUSE(T, ad_reshape(T, a, 2, m11));
    TH_CHECK_ERROR(T, "ad_reshape: [3,5] to [-1,-1]: dimension 1 is -1");
    MISUSE(T, ad_reshape(T, a, 2, z));
    TH_CHECK_ERROR(T, "ad_reshape: [3,5] to [0,15]: dimension 0 is 0");
    MISUSE(T, ad_reshape(T, a, 9, nine));
    TH_CHECK_ERROR(T, "ad_reshape: 9 dimensions");
    MISUSE(T, ad_flatten(T, scalar));
    TH_CHECK_ERROR(T, "ad_flatten: a scalar has no batch dimension");
    MISUSE(T, ad_transpose(T, c, 0, 3));
    TH_CHECK_ERROR(T, "ad_transpose: axis 3 is out of range for shape [3,5,7]");
    MISUSE(T, ad_transpose(T, c, -4, 0));
    TH_CHECK_ERROR(T, "ad_transpose: axis -4 is out of range for shape [3,5,7]");
    MISUSE(T, ad_permute(T, c, p_dup));
    TH_CHECK_ERROR(T, "ad_permute: shape [3,5,7]: perm[1] = 0 is not a permutation of 0..2");
    MISUSE(T, ad_permute(T, c, p_big));
    TH_CHECK_ERROR(T, "ad_permute: shape [3,5,7]: perm[2] = 3 is not a permutation of 0..2");
    MISUSE(T, ad_permute(T, c, p_neg));
    TH_CHECK_ERROR(T, "ad_permute: shape [3,5,7]: perm[0] = -1");
    MISUSE(T, ad_permute(T, c, NULL));
    TH_CHECK_ERROR(T, "ad_permute: perm is NULL");
    xs[0] = ad_zeros(T, 3, s327);
    xs[1] = ad_zeros(T, 3, s346);
    xs[2] = c;
    MISUSE(T, ad_concat(T, xs, 3, 1));
    TH_CHECK_ERROR(T, "ad_concat: along axis 1, tensor 1 has shape [3,4,6], which does not match [3,2,7]");
    xs[1] = a;
    MISUSE(T, ad_concat(T, xs, 2, 1));
    TH_CHECK_ERROR(T, "ad_concat: along axis 1, tensor 1 has shape [3,5], which does not match [3,2,7]");
    MISUSE(T, ad_concat(T, xs, 1, 3));
    TH_CHECK_ERROR(T, "ad_concat: axis 3 is out of range for shape [3,2,7]");
    MISUSE(T, ad_concat(T, xs, 0, 0));
    TH_CHECK_ERROR(T, "ad_concat: no tensors given");
    MISUSE(T, ad_concat(T, NULL, 2, 0));
    TH_CHECK_ERROR(T, "ad_concat: no tensors given");
    MISUSE(T, ad_slice(T, c, 1, 2, 9));
    TH_CHECK_ERROR(T, "ad_slice: shape [3,5,7], axis 1: range [2, 9) is empty or outside 0..5");
    MISUSE(T, ad_slice(T, c, -1, 4, 4));
    TH_CHECK_ERROR(T, "ad_slice: shape [3,5,7], axis -1: range [4, 4) is empty or outside 0..7");
    MISUSE(T, ad_slice(T, c, 0, -5, 2));
    TH_CHECK_ERROR(T, "ad_slice: shape [3,5,7], axis 0");
    MISUSE(T, ad_slice(T, c, 3, 0, 1));
    TH_CHECK_ERROR(T, "ad_slice: axis 3 is out of range for shape [3,5,7]");
    MISUSE(T, ad_broadcast_to(T, a, 2, s45));
    TH_CHECK_ERROR(T, "ad_broadcast_to: shape [3,5] cannot be broadcast to [4,5]");
    MISUSE(T, ad_broadcast_to(T, a, 1, s5));
    TH_CHECK_ERROR(T, "ad_broadcast_to: shape [3,5] cannot be broadcast to [5]");
    MISUSE(T, ad_broadcast_to(T, a, 2, z));
    TH_CHECK_ERROR(T, "ad_broadcast_to: shape [0,15]: dimension 0 is 0");
    MISUSE(T, ad_sum_to(T, c, 2, s47));
    TH_CHECK_ERROR(T, "ad_sum_to: shape [3,5,7] cannot be summed to [4,7]");
    MISUSE(T, ad_sum_to(T, a, 1, s3));
    TH_CHECK_ERROR(T, "ad_sum_to: shape [3,5] cannot be summed to [3]");
}

static void test_linalg_nn_loss(ad_tape *T)
{
    int s_x[] = {64, 784}, s_w[] = {128, 10}, s43[] = {4, 3}, s56[] = {5, 6}, s5[] = {5}, s53[] = {5, 3};
    int s234[] = {2, 3, 4}, s345[] = {3, 4, 5}, s613[] = {6, 13}, s125[] = {12, 5}, s135[] = {13, 5}, s4[] = {4};
    int s2135[] = {2, 13, 5}, s34[] = {3, 4}, s410[] = {4, 10};
    int lab_hi[] = {0, 1, 10, 2}, lab_neg[] = {0, -1, 0, 0};
    ad_tensor *x = ad_zeros(T, 2, s_x), *w = ad_zeros(T, 2, s_w), *a43 = ad_zeros(T, 2, s43);
    ad_tensor *b56 = ad_zeros(T, 2, s56), *v5 = ad_zeros(T, 1, s5), *m53 = ad_zeros(T, 2, s53);
    ad_tensor *t234 = ad_zeros(T, 3, s234), *t345 = ad_zeros(T, 3, s345), *x613 = ad_zeros(T, 2, s613);
    ad_tensor *w125 = ad_zeros(T, 2, s125), *w135 = ad_zeros(T, 2, s135), *b4 = ad_zeros(T, 1, s4);
    ad_tensor *w2135 = ad_zeros(T, 3, s2135), *p34 = ad_zeros(T, 2, s34), *l410 = ad_zeros(T, 2, s410);
    ad_tensor *q43 = ad_zeros(T, 2, s43);
    MISUSE(T, ad_matmul(T, x, w));
    TH_CHECK_ERROR(T, "ad_matmul: [64,784] x [128,10]: inner dimensions 784 and 128 differ");
    MISUSE(T, ad_matmul_t(T, a43, b56, 1, 0));
    TH_CHECK_ERROR(T, "ad_matmul_t: [4,3]^T x [5,6]: inner dimensions 4 and 5 differ");
    MISUSE(T, ad_matmul_t(T, a43, b56, 0, 1));
    TH_CHECK_ERROR(T, "ad_matmul_t: [4,3] x [5,6]^T: inner dimensions 3 and 6 differ");
    MISUSE(T, ad_matmul(T, v5, m53));
    TH_CHECK_ERROR(T, "ad_matmul: [5] x [5,3]: both operands need at least 2 dimensions");
    MISUSE(T, ad_matmul(T, t234, t345));
    TH_CHECK_ERROR(T, "ad_matmul: [2,3,4] x [3,4,5]: batch dimensions differ");
    MISUSE(T, ad_linear(T, x613, w125, NULL));
    TH_CHECK_ERROR(T, "ad_linear: x [6,13] and W [12,5]: W must be [in, out] with in = x's last dimension");
    MISUSE(T, ad_linear(T, x613, w2135, NULL));
    TH_CHECK_ERROR(T, "ad_linear: x [6,13] and W [2,13,5]");
    MISUSE(T, ad_linear(T, x613, w135, b4));
    TH_CHECK_ERROR(T, "ad_linear: W [13,5] and b [4]: b must be [5]");
    MISUSE(T, ad_softmax(T, p34, 2));
    TH_CHECK_ERROR(T, "ad_softmax: axis 2 is out of range for shape [3,4]");
    MISUSE(T, ad_log_softmax(T, p34, -3));
    TH_CHECK_ERROR(T, "ad_log_softmax: axis -3 is out of range for shape [3,4]");
    MISUSE(T, ad_cross_entropy(T, t234, lab_hi));
    TH_CHECK_ERROR(T, "ad_cross_entropy: logits [2,3,4] must be [N, C]");
    MISUSE(T, ad_cross_entropy(T, l410, NULL));
    TH_CHECK_ERROR(T, "ad_cross_entropy: labels is NULL");
    MISUSE(T, ad_cross_entropy(T, l410, lab_hi));
    TH_CHECK_ERROR(T, "ad_cross_entropy: logits [4,10]: label 10 of row 2 is outside 0..9");
    MISUSE(T, ad_cross_entropy(T, l410, lab_neg));
    TH_CHECK_ERROR(T, "ad_cross_entropy: logits [4,10]: label -1 of row 1 is outside 0..9");
    MISUSE(T, ad_mse(T, p34, q43));
    TH_CHECK_ERROR(T, "ad_mse: shapes [3,4] and [4,3] differ; they must be equal");
    MISUSE(T, ad_bce_with_logits(T, q43, p34));
    TH_CHECK_ERROR(T, "ad_bce_with_logits: shapes [4,3] and [3,4] differ; they must be equal");
}

static void test_backward_errors(ad_tape *T)
{
    int s34[] = {3, 4};
    ad_tensor *x = ad_ones(T, 2, s34), *v = ad_var(T, 2), *y;
    ad_set_requires_grad(x, 1);
    y = ad_mul(T, x, x);
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, y) == -1, "ad_backward on a [3,4] result did not fail");
    TH_CHECK_ERROR(T, "ad_backward: y has shape [3,4]; it must have exactly one element");
    TH_CHECK(x->grad == NULL, "a failed ad_backward wrote a gradient");
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, NULL) == -1, "ad_backward(T, NULL) did not fail");
    TH_CHECK_ERROR(T, "ad_backward: y is NULL");
    MISUSE(T, ad_grad(T, y, x, 0));
    TH_CHECK_ERROR(T, "ad_grad: y has shape [3,4]; it must have exactly one element");
    MISUSE(T, ad_grad(T, ad_sum(T, y), NULL, 0));
    TH_CHECK_ERROR(T, "ad_grad: x is NULL");
    MISUSE(T, ad_grad(T, NULL, v, 1));
    TH_CHECK_ERROR(T, "ad_grad: y is NULL");
    /* no tape at all */
    TH_CHECK(ad_backward(NULL, v) == -1, "ad_backward without a tape");
    TH_CHECK(ad_grad(NULL, v, v, 0) == NULL, "ad_grad without a tape");
    TH_CHECK(ad_tape_error(NULL) != NULL, "ad_tape_error(NULL) says nothing");
    TH_CHECK(ad_add(NULL, v, v) == NULL && ad_var(NULL, 1) == NULL && ad_zeros(NULL, 2, s34) == NULL,
             "ops without a tape");
    ad_tape_clear_error(T);
}

/* Every op given a NULL tensor returns NULL and records no message, so a chain needs one check
   at its end; the error of the op that failed first is what remains. */
static void test_null_propagation(ad_tape *T)
{
    int s23[] = {2, 3}, s3[] = {3}, perm[] = {1, 0}, labels[] = {0, 1};
    ad_tensor *a = ad_ones(T, 2, s23), *n = NULL, *xs[2];
    PASSES_NULL(T, ad_neg(T, n));
    PASSES_NULL(T, ad_exp(T, n));
    PASSES_NULL(T, ad_log(T, n));
    PASSES_NULL(T, ad_sin(T, n));
    PASSES_NULL(T, ad_cos(T, n));
    PASSES_NULL(T, ad_tanh(T, n));
    PASSES_NULL(T, ad_sigmoid(T, n));
    PASSES_NULL(T, ad_relu(T, n));
    PASSES_NULL(T, ad_leaky_relu(T, n, 0.1f));
    PASSES_NULL(T, ad_gelu(T, n));
    PASSES_NULL(T, ad_sqrt(T, n));
    PASSES_NULL(T, ad_abs(T, n));
    PASSES_NULL(T, ad_square(T, n));
    PASSES_NULL(T, ad_pow(T, n, 2));
    PASSES_NULL(T, ad_clamp(T, n, 0, 1));
    PASSES_NULL(T, ad_clamp(T, n, 1, 0)); /* the bad bounds are not reported for a NULL input */
    PASSES_NULL(T, ad_affine(T, n, 2, 1));
    PASSES_NULL(T, ad_add_scalar(T, n, 1));
    PASSES_NULL(T, ad_sub_scalar(T, n, 1));
    PASSES_NULL(T, ad_rsub_scalar(T, 1, n));
    PASSES_NULL(T, ad_mul_scalar(T, n, 2));
    PASSES_NULL(T, ad_div_scalar(T, n, 2));
    PASSES_NULL(T, ad_div_scalar(T, n, 0));
    PASSES_NULL(T, ad_maximum_scalar(T, n, 0));
    PASSES_NULL(T, ad_minimum_scalar(T, n, 0));
    PASSES_NULL(T, ad_add(T, a, n));
    PASSES_NULL(T, ad_sub(T, n, a));
    PASSES_NULL(T, ad_mul(T, n, n));
    PASSES_NULL(T, ad_div(T, a, n));
    PASSES_NULL(T, ad_maximum(T, n, a));
    PASSES_NULL(T, ad_minimum(T, a, n));
    PASSES_NULL(T, ad_sum(T, n));
    PASSES_NULL(T, ad_mean(T, n));
    PASSES_NULL(T, ad_max(T, n));
    PASSES_NULL(T, ad_sum_axis(T, n, 0, 0));
    PASSES_NULL(T, ad_mean_axis(T, n, 5, 0));
    PASSES_NULL(T, ad_max_axis(T, n, 0, 1));
    PASSES_NULL(T, ad_reshape(T, n, 2, s23));
    PASSES_NULL(T, ad_flatten(T, n));
    PASSES_NULL(T, ad_transpose(T, n, 0, 1));
    PASSES_NULL(T, ad_permute(T, n, perm));
    xs[0] = a;
    xs[1] = n;
    PASSES_NULL(T, ad_concat(T, xs, 2, 0));
    PASSES_NULL(T, ad_slice(T, n, 0, 0, 1));
    PASSES_NULL(T, ad_broadcast_to(T, n, 2, s23));
    PASSES_NULL(T, ad_sum_to(T, n, 1, s3));
    PASSES_NULL(T, ad_matmul(T, n, a));
    PASSES_NULL(T, ad_matmul_t(T, a, n, 0, 1));
    PASSES_NULL(T, ad_linear(T, n, a, NULL));
    PASSES_NULL(T, ad_linear(T, a, n, NULL));
    PASSES_NULL(T, ad_softmax(T, n, 0));
    PASSES_NULL(T, ad_log_softmax(T, n, 0));
    PASSES_NULL(T, ad_cross_entropy(T, n, labels));
    PASSES_NULL(T, ad_mse(T, n, a));
    PASSES_NULL(T, ad_bce_with_logits(T, a, n));
    /* ad_backward and ad_grad, at the end of a chain, do report */
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, ad_sum(T, ad_exp(T, n))) == -1, "ad_backward of a NULL chain");
    TH_CHECK_ERROR(T, "ad_backward: y is NULL");
    TH_CHECK(ad_item(n) == 0 && ad_grad_item(n) == 0, "ad_item of NULL");
}

/* The first error sticks until cleared or reset; a chain keeps the message of its first failure. */
static void test_first_error_sticks(ad_tape *T)
{
    int s_x[] = {64, 784}, s_w[] = {128, 10}, s3[] = {3}, s4[] = {4};
    ad_tensor *x = ad_zeros(T, 2, s_x), *w = ad_zeros(T, 2, s_w), *y;
    ad_tape_clear_error(T);
    y = ad_relu(T, ad_matmul(T, x, w));
    y = ad_add(T, ad_ones(T, 1, s3), ad_ones(T, 1, s4)); /* a second, unrelated error */
    TH_CHECK(y == NULL, "broadcast clash");
    TH_CHECK_ERROR(T, "ad_matmul: [64,784] x [128,10]: inner dimensions 784 and 128 differ");
    ad_tape_clear_error(T);
    y = ad_add(T, ad_ones(T, 1, s3), ad_ones(T, 1, s4));
    TH_CHECK_ERROR(T, "ad_add: shapes [3] and [4]");
    ad_tape_reset(T);
    TH_CHECK(ad_tape_error(T) == NULL, "reset kept the error");
}

/* ---- out of memory ---------------------------------------------------------------------- */
/* A small training step that touches every kind of allocation: the tape, arena chunks (one larger
   than a chunk), the GEMM packing buffer, the thread pool, gradients and a recorded backward,
   and a chain of numbers whose entries grow.
   Returns the loss plus the sum of a gradient, or a NaN when something failed. */
static double oom_scenario(const char **error, int *tape_made)
{
    int sx[] = {64, 100}, sw[] = {100, 50}, sw2[] = {50, 10}, big[] = {600, 600}, labels[64], i;
    ad_rng rng;
    double result = NAN;
    ad_tape *T = ad_tape_new();
    ad_tensor *x, *W, *W2, *h, *loss, *g, *gg;
    ad_num v, y;
    static char message[320];
    *tape_made = T != NULL;
    *error = NULL;
    if (!T) return result;
    for (i = 0; i < 64; i++) labels[i] = i % 10;
    ad_rng_seed(&rng, 4);
    x = ad_rand(T, 2, sx, -1, 1, &rng);
    W = ad_rand(T, 2, sw, -0.1f, 0.1f, &rng);
    W2 = ad_rand(T, 2, sw2, -0.1f, 0.1f, &rng);
    ad_set_requires_grad(W, 1);
    ad_set_requires_grad(W2, 1);
    h = ad_add(T, ad_relu(T, ad_matmul(T, x, W)), ad_sum(T, ad_ones(T, 2, big)));
    loss = ad_cross_entropy(T, ad_linear(T, ad_tanh(T, ad_mul_scalar(T, h, 1e-5f)), W2, NULL), labels);
    g = ad_grad(T, loss, W2, 1);
    gg = ad_grad(T, ad_sum(T, ad_square(T, g)), W, 0);
    /* numbers: 451 of them, so that their entries grow three times */
    v = ad_num_var(T, 0.5);
    y = v;
    for (i = 0; i < 150; i++) y = ad_num_add(T, ad_num_mul(T, y, ad_num_const(T, 0.99)), ad_num_sin(T, v));
    if (loss && g && gg && ad_backward(T, loss) == 0 && ad_num_backward(T, y) == 0)
        result = (double)ad_item(loss) + (double)ad_item(ad_sum(T, gg)) + (double)W->grad[7] +
                 (double)ad_num_grad(T, v);
    if (ad_tape_error(T)) {
        snprintf(message, sizeof message, "%s", ad_tape_error(T));
        *error = message;
    }
    ad_tape_free(T);
    return result;
}

static void test_out_of_memory(void)
{
    const char *error;
    double reference, r;
    long total, n;
    int made, failures = 0, successes = 0, bad_message = 0, bad_value = 0, leaks = 0;
    fail_at = -1;
    alloc_index = 0;
    reference = oom_scenario(&error, &made);
    total = alloc_index;
    TH_CHECK(made && !error && reference == reference, "the scenario fails without injected failures: %s",
             error ? error : "");
    TH_CHECK(live_blocks == 0, "the scenario leaks %ld blocks", live_blocks);
    /* fail one allocation, or every allocation from it on, for each allocation of the scenario */
    for (fail_rest = 0; fail_rest <= 1; fail_rest++)
        for (n = 0; n <= total; n++) {
            fail_at = n;
            alloc_index = 0;
            r = oom_scenario(&error, &made);
            if (live_blocks != 0) {
                leaks++;
                printf("FAIL: failing allocation %ld (%s) leaks %ld blocks\n", n, fail_rest ? "and on" : "only",
                       live_blocks);
                live_blocks = 0;
            }
            if (!made) continue; /* ad_tape_new itself failed and returned NULL */
            if (error) {
                failures++;
                if (!strstr(error, "out of memory")) {
                    bad_message++;
                    printf("FAIL: failing allocation %ld: message \"%s\"\n", n, error);
                }
            } else {
                /* a failed allocation that the library could do without (the thread pool) */
                successes++;
                if (r != reference) {
                    bad_value++;
                    printf("FAIL: failing allocation %ld: result %.9g, reference %.9g\n", n, r, reference);
                }
            }
        }
    fail_at = -1;
    printf("out of memory: %ld allocations in the scenario; %d runs reported it, %d completed\n", total,
           failures, successes);
    TH_CHECK(total >= 3 && failures >= 2, "the scenario exercised too little (%ld allocations)", total);
    TH_CHECK(leaks == 0, "%d runs leaked", leaks);
    TH_CHECK(bad_message == 0, "%d runs reported something other than out of memory", bad_message);
    TH_CHECK(bad_value == 0, "%d runs completed with a wrong result", bad_value);
}

/* Tensors live until their tape's next reset: one kept across a reset is refused by every op
   and by the sweeps, at once and in the steps after, while tensors made since work. */
static void test_stale_tensors(void)
{
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    int s23[] = {2, 3}, s1[] = {1}, step, caught = 0, worked = 0;
    ad_tensor *w = ad_tensor_new(T, 2, s23, NULL, 1), *v = ad_var(T, 3), *x, *y;
    ad_tensor *other = ad_tensor_new(U, 2, s23, NULL, 1);
    TH_CHECK(w && ad_add(T, w, w) != NULL, "a fresh tensor works");
    TH_CHECK(ad_add(T, w, other) == NULL, "a tensor of another tape was accepted");
    TH_CHECK_ERROR(T, "ad_add: b belongs to another tape");
    ad_tape_reset(T);
    x = ad_tensor_new(T, 2, s23, NULL, 1);
    MISUSE(T, ad_add(T, x, w));
    TH_CHECK_ERROR(T, "ad_add: b was made before the tape's last reset");
    MISUSE(T, ad_exp(T, w));
    TH_CHECK_ERROR(T, "ad_exp: the input was made before the tape's last reset");
    MISUSE(T, ad_sum(T, w));
    TH_CHECK_ERROR(T, "before the tape's last reset");
    MISUSE(T, ad_reshape(T, w, 1, (int[]){6}));
    TH_CHECK_ERROR(T, "ad_reshape: the input was made before the tape's last reset");
    MISUSE(T, ad_matmul(T, x, ad_transpose(T, w, 0, 1)));
    TH_CHECK_ERROR(T, "before the tape's last reset");
    MISUSE(T, ad_concat(T, (ad_tensor *[]){x, w}, 2, 0));
    TH_CHECK_ERROR(T, "ad_concat: tensor 1 was made before the tape's last reset");
    ad_tape_clear_error(T);
    TH_CHECK(ad_backward(T, v) == -1, "ad_backward of a stale result did not fail");
    TH_CHECK_ERROR(T, "ad_backward: y was made before the tape's last reset");
    MISUSE(T, ad_grad(T, ad_sum(T, x), w, 0));
    TH_CHECK_ERROR(T, "ad_grad: x was made before the tape's last reset");
    /* a tensor made before a training loop and used in every step */
    ad_tape_reset(T);
    w = ad_tensor_new(T, 1, s1, NULL, 1);
    for (step = 0; step < 6; step++) {
        x = ad_tensor_new(T, 1, s1, NULL, 1);
        y = ad_mul(T, x, w);
        if (step == 0) worked += y != NULL && ad_backward(T, ad_sum(T, y)) == 0;
        else caught += y == NULL && ad_tape_error(T) && strstr(ad_tape_error(T), "before the tape's last reset");
        ad_tape_reset(T);
    }
    TH_CHECK(worked == 1 && caught == 5, "a tensor kept across resets: used once, caught %d of 5 times", caught);
    x = ad_tensor_new(T, 2, s23, NULL, 0);
    ad_tensor_new(U, 2, s23, NULL, 0);
    ad_tape_reset(U);
    ad_tensor_new(U, 2, s23, NULL, 0);
    TH_CHECK(ad_tape_bytes_used(T) == ad_tape_bytes_used(U) && ad_tape_bytes_used(T) < 256,
             "bytes in use after resets: %zu and %zu", ad_tape_bytes_used(T), ad_tape_bytes_used(U));
    ad_tape_free(T);
    ad_tape_free(U);
}

/* Sizes that the caller gives are multiplied without wrapping. */
static void test_size_overflow(ad_tape *T)
{
    int s22[] = {2, 2}, wrap[] = {-1, 1 << 30, 1 << 30, 16}, big[] = {1 << 30, 1 << 30, 1 << 30};
    ad_tensor *a = ad_zeros(T, 2, s22);
    MISUSE(T, ad_reshape(T, a, 4, wrap));
    TH_CHECK_ERROR(T, "ad_reshape: [2,2] to [-1,1073741824,1073741824,16]: 4 elements do not fit");
    MISUSE(T, ad_reshape(T, a, 3, big));
    TH_CHECK_ERROR(T, "ad_reshape: [2,2] to [1073741824,1073741824,1073741824]: 4 elements do not fit");
    MISUSE(T, ad_reshape(T, a, 3, (int[]){-1, -1, 1}));
    TH_CHECK_ERROR(T, "ad_reshape: [2,2] to [-1,-1,1]: dimension 1 is -1; only one may be -1");
    MISUSE(T, ad_reshape(T, a, 2, (int[]){-1, 3}));
    TH_CHECK_ERROR(T, "ad_reshape: [2,2] to [-1,3]: 4 elements do not fit");
    MISUSE(T, ad_zeros(T, 3, big));
    TH_CHECK_ERROR(T, "ad_zeros: shape [1073741824,1073741824,1073741824] has too many elements");
    MISUSE(T, ad_broadcast_to(T, a, 4, (int[]){1 << 30, 1 << 30, 1 << 30, 2}));
    TH_CHECK_ERROR(T, "ad_broadcast_to: shape [1073741824,1073741824,1073741824,2] has too many elements");
    MISUSE(T, ad_conv2d(T, ad_zeros(T, 4, (int[]){1, 1, 3, 3}), ad_zeros(T, 4, (int[]){1, 1, 2, 2}), NULL,
                        &(ad_conv2d_desc){0, 0, INT_MAX, INT_MAX, 0, 0, 0}));
    TH_CHECK_ERROR(T, "ad_conv2d: x [1,1,3,3], w [1,1,2,2]: too large");
    MISUSE(T, ad_max_pool2d(T, ad_zeros(T, 4, (int[]){1, 1, 3, 3}), INT_MAX, 2, NULL));
    TH_CHECK_ERROR(T, "ad_max_pool2d: x [1,1,3,3]: the kernel 2147483647x2 is larger than the padded input");
    ad_tape_clear_error(T);
}

int main(void)
{
    ad_tape *T = ad_tape_new();
    test_creation(T);
    test_elementwise_binary(T);
    test_reduce_shape(T);
    test_linalg_nn_loss(T);
    test_backward_errors(T);
    test_null_propagation(T);
    test_first_error_sticks(T);
    test_size_overflow(T);
    ad_tape_free(T);
    test_stale_tensors();
    TH_CHECK(live_blocks == 0, "%ld blocks left after ad_tape_free", live_blocks);
    test_out_of_memory();
    return th_summary();
}
