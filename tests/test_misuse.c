/* Misuse of the public API, family by family: every bad call fails cleanly (NULL, -1 or 0 as
   documented, never a crash) and its message names the public function that was called and,
   where the wording is stable, the reason. Covers tensors made before a tape reset, sizes whose
   products overflow, parameter stores, optimizers, checkpoints and the data loaders. Each case
   runs in a child process, so a crash is reported as a failure of that case alone. Scratch
   files go to a folder made under /tmp and are removed at the end. */
#define _POSIX_C_SOURCE 200809L
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#include <limits.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- checking a failure and its message ------------------------------------------------- */
static int ncases;   /* misuse cases run */
static char err[512]; /* the data loaders' and ad_batch_norm_init's message */

static int is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Whether msg names fn as a whole word, so that "ad_sum" is not found in "ad_sum_to: ...". */
static int names_fn(const char *msg, const char *fn)
{
    size_t n = strlen(fn);
    const char *p = msg;
    while ((p = strstr(p, fn)) != NULL) {
        if ((p == msg || !is_ident(p[-1])) && !is_ident(p[n])) return 1;
        p++;
    }
    return 0;
}

/* Whether msg satisfies needle: "a|b" holds when msg contains a or b; "!a" when it lacks a. */
static int matches(const char *msg, const char *needle)
{
    char alt[160];
    const char *p = needle, *bar;
    if (needle[0] == '!') return strstr(msg, needle + 1) == NULL;
    for (;;) {
        size_t n;
        bar = strchr(p, '|');
        n = bar ? (size_t)(bar - p) : strlen(p);
        if (n >= sizeof alt) n = sizeof alt - 1;
        memcpy(alt, p, n);
        alt[n] = 0;
        if (strstr(msg, alt)) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

/* ---- running each case in a child process ------------------------------------------------ */
/* Each case runs in a child of its own (fork), so that a call that crashes, or that a sanitizer
   stops, fails that case alone and the cases after it still run. The child reports the counters
   back through a pipe; when fork is not available the case runs in this process. */
static int in_child;  /* this process is a case's child */
static int report_fd = -1;

/* Called before a case: returns 1 where the case must run (the child, or this process when no
   child could be made) and 0 in the parent once the child has reported or died. */
static int case_start(const char *file, int line, const char *call)
{
    int fd[2], counts[3], status = 0;
    ssize_t got;
    pid_t pid;
    fflush(stdout);
    if (in_child || pipe(fd) != 0) return 1;
    pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return 1;
    }
    if (pid == 0) {
        close(fd[0]);
        in_child = 1;
        report_fd = fd[1];
        return 1;
    }
    close(fd[1]);
    got = read(fd[0], counts, sizeof counts);
    close(fd[0]);
    waitpid(pid, &status, 0);
    if (got == (ssize_t)sizeof counts && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        th_passed = counts[0];
        th_failed = counts[1];
        ncases = counts[2];
    } else {
        th_failed++;
        ncases++;
        if (WIFSIGNALED(status))
            printf("FAIL %s:%d: %s crashed with signal %d\n", file, line, call, WTERMSIG(status));
        else
            printf("FAIL %s:%d: %s: the process ended with status %d\n", file, line, call, WEXITSTATUS(status));
    }
    return 0;
}

/* Called after a case: the child reports its counters and exits (through exit, so that a leak
   checker, when there is one, looks at what the case left behind). */
static void case_end(void)
{
    int counts[3];
    if (!in_child) return;
    counts[0] = th_passed;
    counts[1] = th_failed;
    counts[2] = ncases;
    fflush(stdout);
    if (write(report_fd, counts, sizeof counts) != (ssize_t)sizeof counts) exit(3);
    exit(0);
}

/* One case: the call must have failed (failed != 0) and msg must name fn and satisfy every
   needle that follows it (the list ends with NULL). Counts two checks. */
static void expect_fail(const char *file, int line, const char *call, int failed, const char *msg,
                        const char *fn, ...)
{
    va_list ap;
    const char *needle, *bad = NULL;
    int ok = msg != NULL && names_fn(msg, fn);
    ncases++;
    if (failed) {
        th_passed++;
    } else {
        th_failed++;
        printf("FAIL %s:%d: %s did not fail\n", file, line, call);
    }
    va_start(ap, fn);
    while ((needle = va_arg(ap, const char *)) != NULL)
        if (!msg || !matches(msg, needle)) {
            ok = 0;
            if (!bad) bad = needle;
        }
    va_end(ap);
    if (ok) {
        th_passed++;
    } else {
        th_failed++;
        printf("FAIL %s:%d: %s: expected a message naming %s%s%s%s, got \"%s\"\n", file, line, call, fn,
               bad ? " and matching \"" : "", bad ? bad : "", bad ? "\"" : "", msg ? msg : "(none)");
    }
}

#define EXPECT_FAIL(call_text, failed, msg, ...) \
    expect_fail(__FILE__, __LINE__, call_text, failed, msg, __VA_ARGS__, (const char *)NULL)

/* Runs the statements of one case in a child; call_text names the case in a crash report. */
#define CASE(call_text, body)                                                              \
    do {                                                                                   \
        if (case_start(__FILE__, __LINE__, call_text)) {                                   \
            body;                                                                          \
            case_end();                                                                    \
        }                                                                                  \
    } while (0)

/* A tape op that must return NULL, with T's error naming fn and matching the needles. */
#define TBAD(T, call, ...)                                                                 \
    CASE(#call, {                                                                          \
        int f_;                                                                            \
        ad_tape_clear_error(T);                                                            \
        f_ = (call) == NULL;                                                               \
        EXPECT_FAIL(#call, f_, ad_tape_error(T), __VA_ARGS__);                             \
    })

/* The same for a call that returns -1 (ad_backward). */
#define TBAD_RC(T, call, ...)                                                              \
    CASE(#call, {                                                                          \
        int f_;                                                                            \
        ad_tape_clear_error(T);                                                            \
        f_ = (call) == -1;                                                                 \
        EXPECT_FAIL(#call, f_, ad_tape_error(T), __VA_ARGS__);                             \
    })

/* A store call that must return -1, with the store's error. */
#define PBAD(P, call, ...)                                                                 \
    CASE(#call, {                                                                          \
        int f_;                                                                            \
        ad_params_clear_error(P);                                                          \
        f_ = (call) == -1;                                                                 \
        EXPECT_FAIL(#call, f_, ad_params_error(P), __VA_ARGS__);                           \
    })

/* ad_optim_new with settings d must return NULL and set P's error. */
#define OPTBAD(P, d, ...)                                                                  \
    CASE("ad_optim_new(P, " #d ")", {                                                      \
        ad_optim *o_;                                                                      \
        ad_optim_desc d_ = (d);                                                            \
        ad_params_clear_error(P);                                                          \
        o_ = ad_optim_new(P, &d_);                                                         \
        EXPECT_FAIL("ad_optim_new(P, " #d ")", o_ == NULL, ad_params_error(P), "ad_optim_new", __VA_ARGS__); \
        ad_optim_free(o_);                                                                 \
    })

/* ad_optim_set_lr must refuse lr: the rate stays as it was and P's error is set. */
#define LRBAD(O, P, lr, ...)                                                               \
    CASE("ad_optim_set_lr(O, " #lr ")", {                                                  \
        double before_ = ad_optim_lr(O);                                                   \
        ad_params_clear_error(P);                                                          \
        ad_optim_set_lr(O, lr);                                                            \
        EXPECT_FAIL("ad_optim_set_lr(O, " #lr ")", ad_optim_lr(O) == before_, ad_params_error(P), \
                    "ad_optim_set_lr", __VA_ARGS__);                                       \
    })

/* A loader call (or ad_batch_norm_init) that must return -1 with its reason in err. */
#define EBAD(call, ...)                                                                    \
    CASE(#call, {                                                                          \
        int f_;                                                                            \
        err[0] = 0;                                                                        \
        f_ = (call) == -1;                                                                 \
        EXPECT_FAIL(#call, f_, err, __VA_ARGS__);                                          \
    })

/* ad_params_load of path must return NULL with its reason in err. */
#define PLOAD_BAD(path, ...)                                                               \
    CASE("ad_params_load(" #path ")", {                                                    \
        ad_params *r_;                                                                     \
        err[0] = 0;                                                                        \
        r_ = ad_params_load(path, err, sizeof err);                                        \
        EXPECT_FAIL("ad_params_load(" #path ")", r_ == NULL, err, "ad_params_load", __VA_ARGS__); \
        ad_params_free(r_);                                                                \
    })

/* ---- scratch files ---------------------------------------------------------------------- */
static char root[64];
static char made[96][320]; /* paths made, removed in reverse order at the end */
static int nmade;

static const char *at(const char *name)
{
    static char buf[4][320];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", root, name);
    return p;
}

static void remember(const char *path)
{
    if (nmade < (int)(sizeof made / sizeof made[0])) snprintf(made[nmade++], sizeof made[0], "%s", path);
}

static void put_dir(const char *name)
{
    const char *p = at(name);
    if (mkdir(p, 0700) == 0) remember(p);
}

static void put_file(const char *name, const void *bytes, size_t n)
{
    const char *p = at(name);
    FILE *f = fopen(p, "wb");
    TH_CHECK(f != NULL, "cannot write %s", p);
    if (!f) return;
    if (n) fwrite(bytes, 1, n, f);
    fclose(f);
    remember(p);
}

static void cleanup(void)
{
    while (nmade > 0) remove(made[--nmade]);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* An uncompressed 24-bit BMP of w x h pixels in out (54 + h * rows of 4-byte multiples). */
static size_t make_bmp(unsigned char *out, int w, int h)
{
    size_t row = ((size_t)w * 3 + 3) & ~(size_t)3, size = 54 + row * (size_t)h;
    int x, y, c;
    memset(out, 0, size);
    out[0] = 'B';
    out[1] = 'M';
    put_le32(out + 2, (uint32_t)size);
    put_le32(out + 10, 54);
    put_le32(out + 14, 40);
    put_le32(out + 18, (uint32_t)w);
    put_le32(out + 22, (uint32_t)h);
    out[26] = 1;
    out[28] = 24;
    put_le32(out + 34, (uint32_t)(row * (size_t)h));
    for (y = 0; y < h; y++)
        for (x = 0; x < w; x++)
            for (c = 0; c < 3; c++)
                out[54 + (size_t)y * row + (size_t)x * 3 + (size_t)c] = (unsigned char)(x * 40 + y * 70 + c * 20);
    return size;
}

/* An IDX file: magic, ndim big-endian dimensions, then payload bytes. */
static size_t make_idx(unsigned char *out, uint32_t magic, int ndim, const uint32_t *dims, size_t payload)
{
    size_t i;
    int k;
    put_be32(out, magic);
    for (k = 0; k < ndim; k++) put_be32(out + 4 + 4 * k, dims[k]);
    for (i = 0; i < payload; i++) out[4 + 4 * (size_t)ndim + i] = (unsigned char)(i * 37 % 10);
    return 4 + 4 * (size_t)ndim + payload;
}

/* ---- option structs in one expression --------------------------------------------------- */
static const ad_conv2d_desc *conv_desc(int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w,
                                       int groups)
{
    static ad_conv2d_desc d;
    d.stride_h = stride_h;
    d.stride_w = stride_w;
    d.pad_h = pad_h;
    d.pad_w = pad_w;
    d.dilation_h = dil_h;
    d.dilation_w = dil_w;
    d.groups = groups;
    return &d;
}

static const ad_pool2d_desc *pool_desc(int stride_h, int stride_w, int pad_h, int pad_w)
{
    static ad_pool2d_desc d;
    memset(&d, 0, sizeof d);
    d.stride_h = stride_h;
    d.stride_w = stride_w;
    d.pad_h = pad_h;
    d.pad_w = pad_w;
    return &d;
}

static const ad_init *init_of(ad_init_kind kind, double a, double b, double gain)
{
    static ad_init i;
    i.kind = kind;
    i.a = a;
    i.b = b;
    i.gain = gain;
    return &i;
}

static ad_optim_desc sgd(double lr, double momentum, double dampening, int nesterov, double weight_decay)
{
    ad_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_SGD;
    d.lr = lr;
    d.momentum = momentum;
    d.dampening = dampening;
    d.nesterov = nesterov;
    d.weight_decay = weight_decay;
    return d;
}

static ad_optim_desc adam(ad_optim_kind kind, double beta1, double beta2, double eps)
{
    ad_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.beta1 = beta1;
    d.beta2 = beta2;
    d.eps = eps;
    return d;
}

/* ---- tensor creation ---------------------------------------------------------------------- */
static void test_creation(ad_tape *T)
{
    int wrap4[] = {65536, 65536, 65536, 65536}; /* 2^64 elements: the product wraps to 0 */
    int wrap8[] = {256, 256, 256, 256, 256, 256, 256, 256};
    int huge3[] = {1 << 30, 1 << 30, 1 << 30}, nine[9], ok[] = {2, 3}, min2[] = {4, INT_MIN}, m7[] = {-7};
    int z1[] = {0};
    ad_real data[6] = {0}, grad[6] = {0};
    ad_rng rng;
    int i;
    for (i = 0; i < 9; i++) nine[i] = 1;
    ad_rng_seed(&rng, 7);
    TBAD(T, ad_tensor_new(T, 4, wrap4, NULL, 1), "ad_tensor_new", "too many");
    TBAD(T, ad_tensor_new(T, 8, wrap8, data, 0), "ad_tensor_new", "too many");
    TBAD(T, ad_full(T, 3, huge3, 1), "ad_full", "too many");
    TBAD(T, ad_full(T, 4, wrap4, 0), "ad_full", "too many");
    TBAD(T, ad_zeros(T, 4, wrap4), "ad_zeros", "too many");
    TBAD(T, ad_ones(T, 3, huge3), "ad_ones", "too many");
    TBAD(T, ad_rand(T, 4, wrap4, 0, 1, &rng), "ad_rand", "too many");
    TBAD(T, ad_randn(T, 3, huge3, 0, 1, &rng), "ad_randn", "too many");
    TBAD(T, ad_tensor_view(T, 4, wrap4, data, NULL, 0), "ad_tensor_view", "too many");
    TBAD(T, ad_tensor_view(T, 9, nine, data, grad, 1), "ad_tensor_view", "9 dimensions");
    TBAD(T, ad_tensor_view(T, 2, NULL, data, NULL, 0), "ad_tensor_view", "NULL");
    TBAD(T, ad_full(T, 2, min2, 0), "ad_full", "[4,-2147483648]", "positive");
    TBAD(T, ad_full(T, 1, z1, 3), "ad_full", "dimension 0 is 0");
    TBAD(T, ad_zeros(T, -3, ok), "ad_zeros", "-3 dimensions");
    TBAD(T, ad_ones(T, 2, NULL), "ad_ones", "NULL");
    TBAD(T, ad_randn(T, 1, m7, 0, 1, &rng), "ad_randn", "-7");
    TBAD(T, ad_rand(T, 9, nine, 0, 1, &rng), "ad_rand", "9 dimensions");
}

/* ---- elementwise functions ---------------------------------------------------------------- */
static void test_elementwise(ad_tape *T, ad_tape *U)
{
    int s35[] = {3, 5};
    ad_tensor *a = ad_ones(T, 2, s35), *o = ad_ones(U, 2, s35); /* o lives on another tape */
    TBAD(T, ad_pow(T, o, 2), "ad_pow", "another tape");
    TBAD(T, ad_leaky_relu(T, o, (ad_real)0.1), "ad_leaky_relu", "another tape");
    TBAD(T, ad_exp(T, o), "ad_exp", "another tape");
    TBAD(T, ad_log(T, o), "ad_log", "another tape");
    TBAD(T, ad_sqrt(T, o), "ad_sqrt", "another tape");
    TBAD(T, ad_gelu(T, o), "ad_gelu", "another tape");
    TBAD(T, ad_sigmoid(T, o), "ad_sigmoid", "another tape");
    TBAD(T, ad_tanh(T, o), "ad_tanh", "another tape");
    TBAD(T, ad_abs(T, o), "ad_abs", "another tape");
    TBAD(T, ad_neg(T, o), "ad_neg", "another tape");
    TBAD(T, ad_sin(T, o), "ad_sin", "another tape");
    TBAD(T, ad_cos(T, o), "ad_cos", "another tape");
    TBAD(T, ad_relu(T, o), "ad_relu", "another tape");
    TBAD(T, ad_square(T, o), "ad_square", "another tape");
    TBAD(T, ad_clamp(T, a, 1, -1), "ad_clamp", "lower bound 1 is above upper bound -1");
    TBAD(T, ad_clamp(T, a, (ad_real)NAN, 1), "ad_clamp", "bound");
    TBAD(T, ad_clamp(T, a, 0, (ad_real)NAN), "ad_clamp", "bound");
    TBAD(T, ad_clamp(T, o, 0, 1), "ad_clamp", "another tape");
    TBAD(T, ad_div_scalar(T, a, (ad_real)-0.0), "ad_div_scalar", "zero");
    TBAD(T, ad_div_scalar(T, o, 2), "ad_div_scalar", "another tape");
    TBAD(T, ad_mul_scalar(T, o, 2), "ad_mul_scalar", "another tape");
    TBAD(T, ad_add_scalar(T, o, 1), "ad_add_scalar", "another tape");
    TBAD(T, ad_sub_scalar(T, o, 1), "ad_sub_scalar", "another tape");
    TBAD(T, ad_rsub_scalar(T, 1, o), "ad_rsub_scalar", "another tape");
    TBAD(T, ad_maximum_scalar(T, o, 0), "ad_maximum_scalar", "another tape");
    TBAD(T, ad_minimum_scalar(T, o, 0), "ad_minimum_scalar", "another tape");
    TBAD(T, ad_affine(T, o, 2, 1), "ad_affine", "another tape");
}

/* ---- broadcasting binary ops: the message names the op and both shapes -------------------- */
static void test_binary(ad_tape *T, ad_tape *U)
{
    int s234[] = {2, 3, 4}, s35[] = {3, 5}, s826[] = {8, 2, 6}, s715[] = {7, 1, 5}, s54[] = {5, 4}, s5[] = {5};
    int s13[] = {1, 3}, s24[] = {2, 4}, s222[] = {2, 2, 2}, s311[] = {3, 1, 1}, s6[] = {6}, s7[] = {7};
    ad_tensor *a = ad_ones(T, 2, s35), *o = ad_ones(U, 2, s35);
    TBAD(T, ad_add(T, ad_ones(T, 3, s234), ad_ones(T, 2, s35)), "ad_add", "[2,3,4]", "[3,5]", "broadcast");
    TBAD(T, ad_sub(T, ad_ones(T, 3, s826), ad_ones(T, 3, s715)), "ad_sub", "[8,2,6]", "[7,1,5]");
    TBAD(T, ad_mul(T, ad_ones(T, 2, s54), ad_ones(T, 1, s5)), "ad_mul", "[5,4]", "[5]");
    TBAD(T, ad_div(T, ad_ones(T, 2, s13), ad_ones(T, 2, s24)), "ad_div", "[1,3]", "[2,4]");
    TBAD(T, ad_maximum(T, ad_ones(T, 3, s222), ad_ones(T, 3, s311)), "ad_maximum", "[2,2,2]", "[3,1,1]");
    TBAD(T, ad_minimum(T, ad_ones(T, 1, s6), ad_ones(T, 1, s7)), "ad_minimum", "[6]", "[7]");
    TBAD(T, ad_add(T, a, o), "ad_add", "another tape");
    TBAD(T, ad_mul(T, o, a), "ad_mul", "another tape");
    TBAD(T, ad_div(T, a, o), "ad_div", "another tape");
    TBAD(T, ad_sub(T, o, o), "ad_sub", "another tape");
    TBAD(T, ad_maximum(T, o, a), "ad_maximum", "another tape");
    TBAD(T, ad_minimum(T, a, o), "ad_minimum", "another tape");
}

/* ---- reductions ----------------------------------------------------------------------------- */
static void test_reduce(ad_tape *T, ad_tape *U)
{
    int s35[] = {3, 5};
    ad_tensor *a = ad_ones(T, 2, s35), *o = ad_ones(U, 2, s35), *s = ad_scalar(T, 2);
    TBAD(T, ad_sum_axis(T, a, -3, 1), "ad_sum_axis", "axis -3", "[3,5]");
    TBAD(T, ad_mean_axis(T, a, 2, 0), "ad_mean_axis", "axis 2", "[3,5]");
    TBAD(T, ad_max_axis(T, a, INT_MIN, 0), "ad_max_axis", "out of range");
    TBAD(T, ad_max_axis(T, a, INT_MAX, 1), "ad_max_axis", "out of range");
    TBAD(T, ad_sum_axis(T, s, -1, 0), "ad_sum_axis", "[]");
    TBAD(T, ad_sum(T, o), "ad_sum", "another tape");
    TBAD(T, ad_mean(T, o), "ad_mean", "another tape");
    TBAD(T, ad_max(T, o), "ad_max", "another tape");
    TBAD(T, ad_sum_axis(T, o, 0, 0), "ad_sum_axis", "another tape");
    TBAD(T, ad_mean_axis(T, o, 0, 1), "ad_mean_axis", "another tape");
    TBAD(T, ad_max_axis(T, o, 1, 0), "ad_max_axis", "another tape");
}

/* ---- shape ops -------------------------------------------------------------------------------- */
/* Four sizes whose product is 1 modulo 2^64: a product of known sizes that wraps to a small
   number, which a check on the wrapped product would take for a match. */
static const int wrap_one[4] = {1815312965, 1285139087, 137347261, 2036223839};

static void test_shape(ad_tape *T, ad_tape *U)
{
    int s22[] = {2, 2}, s35[] = {3, 5}, s357[] = {3, 5, 7}, s327[] = {3, 2, 7}, s347[] = {3, 4, 7};
    int huge3[] = {1 << 30, 1 << 30, 1 << 30}, two_infer[] = {2, -1, -1}, m2[] = {2, -2}, m31[] = {3, -1};
    int p200[] = {2, 0, 0}, pmax[] = {INT_MAX, 0, 1}, pmin[] = {0, 1, INT_MIN}, nine[9], s57[] = {5, 7};
    int m15[] = {-1, 5}, s135[] = {1, 3, 5}, z5[] = {0, 5}, s51[] = {5, 1}, s15[] = {15}, p012[] = {0, 1, 2}, i;
    int inferred[] = {-1, 1 << 30, 1 << 30, 16}, exact[5], infer_one[5];
    ad_tensor *a22 = ad_ones(T, 2, s22), *a = ad_ones(T, 2, s35), *c = ad_ones(T, 3, s357), *s = ad_scalar(T, 1);
    ad_tensor *o = ad_ones(U, 2, s35), *o3 = ad_ones(U, 3, s357), *xs[3];
    for (i = 0; i < 9; i++) nine[i] = 1;
    exact[0] = 4;
    infer_one[0] = -1;
    for (i = 0; i < 4; i++) exact[i + 1] = infer_one[i + 1] = wrap_one[i];
    TBAD(T, ad_reshape(T, a22, 4, inferred), "ad_reshape", "fit|too many|overflow|too large");
    TBAD(T, ad_reshape(T, a22, 5, exact), "ad_reshape", "fit|too many|overflow|too large");
    TBAD(T, ad_reshape(T, a22, 5, infer_one), "ad_reshape", "fit|too many|overflow|too large");
    TBAD(T, ad_reshape(T, a22, 3, huge3), "ad_reshape", "fit|too many|overflow|too large");
    TBAD(T, ad_reshape(T, a22, 3, two_infer), "ad_reshape", "-1");
    TBAD(T, ad_reshape(T, a, -1, s35), "ad_reshape", "dimensions");
    TBAD(T, ad_reshape(T, a, 2, NULL), "ad_reshape");
    TBAD(T, ad_reshape(T, a22, 2, m2), "ad_reshape", "dimension 1 is -2");
    TBAD(T, ad_reshape(T, a22, 2, m31), "ad_reshape", "[3,-1]", "do not fit");
    TBAD(T, ad_reshape(T, o, 1, s15), "ad_reshape", "another tape");
    TBAD(T, ad_flatten(T, o), "ad_flatten", "another tape");
    TBAD(T, ad_transpose(T, c, 1, 7), "ad_transpose", "axis 7", "[3,5,7]");
    TBAD(T, ad_transpose(T, s, 0, 0), "ad_transpose", "out of range");
    TBAD(T, ad_transpose(T, o, 0, 1), "ad_transpose", "another tape");
    TBAD(T, ad_permute(T, c, p200), "ad_permute", "perm", "[3,5,7]");
    TBAD(T, ad_permute(T, c, pmax), "ad_permute", "perm[0]");
    TBAD(T, ad_permute(T, c, pmin), "ad_permute", "perm[2]");
    TBAD(T, ad_permute(T, o3, p012), "ad_permute", "another tape");
    xs[0] = a;
    xs[1] = c;
    xs[2] = o;
    TBAD(T, ad_concat(T, xs, -1, 0), "ad_concat", "no tensors");
    TBAD(T, ad_concat(T, xs, 1, -3), "ad_concat", "axis -3");
    TBAD(T, ad_concat(T, xs, 2, 0), "ad_concat", "[3,5,7]", "[3,5]");
    xs[1] = a;
    TBAD(T, ad_concat(T, xs, 3, 0), "ad_concat", "another tape");
    xs[0] = s;
    xs[1] = s;
    TBAD(T, ad_concat(T, xs, 2, 0), "ad_concat", "axis 0");
    xs[0] = ad_ones(T, 3, s327);
    xs[1] = ad_ones(T, 3, s327);
    xs[2] = ad_ones(T, 2, s57);
    TBAD(T, ad_concat(T, xs, 3, 1), "ad_concat", "tensor 2", "[5,7]");
    xs[2] = ad_ones(T, 3, s347);
    TBAD(T, ad_concat(T, xs, 3, 2), "ad_concat", "tensor 2", "[3,4,7]");
    TBAD(T, ad_slice(T, c, 2, 5, 3), "ad_slice", "[5, 3)");
    TBAD(T, ad_slice(T, c, -4, 0, 1), "ad_slice", "axis -4");
    TBAD(T, ad_slice(T, s, 0, 0, 1), "ad_slice", "[]");
    TBAD(T, ad_slice(T, c, 2, 0, INT_MAX), "ad_slice", "[3,5,7]");
    TBAD(T, ad_slice(T, c, 0, INT_MIN, 1), "ad_slice", "[3,5,7]");
    TBAD(T, ad_slice(T, o, 0, 0, 1), "ad_slice", "another tape");
    TBAD(T, ad_broadcast_to(T, a22, 3, huge3), "ad_broadcast_to", "too many");
    TBAD(T, ad_broadcast_to(T, c, 2, s57), "ad_broadcast_to", "[3,5,7]", "[5,7]");
    TBAD(T, ad_broadcast_to(T, a, 9, nine), "ad_broadcast_to", "9 dimensions");
    TBAD(T, ad_broadcast_to(T, a, 2, NULL), "ad_broadcast_to", "NULL");
    TBAD(T, ad_broadcast_to(T, a, 2, m15), "ad_broadcast_to", "-1");
    TBAD(T, ad_broadcast_to(T, o, 2, s35), "ad_broadcast_to", "another tape");
    TBAD(T, ad_sum_to(T, a, 3, s135), "ad_sum_to", "[3,5]", "[1,3,5]");
    TBAD(T, ad_sum_to(T, a, 2, z5), "ad_sum_to", "[0,5]");
    TBAD(T, ad_sum_to(T, a, 3, huge3), "ad_sum_to", "too many");
    TBAD(T, ad_sum_to(T, a, 2, s51), "ad_sum_to", "[5,1]");
    TBAD(T, ad_sum_to(T, o, 2, s35), "ad_sum_to", "another tape");
}

/* ---- linear algebra ----------------------------------------------------------------------- */
static void test_linalg(ad_tape *T, ad_tape *U)
{
    int s43[] = {4, 3}, s56[] = {5, 6}, s234[] = {2, 3, 4}, s546[] = {5, 4, 6}, s5[] = {5}, s53[] = {5, 3};
    int s613[] = {6, 13}, s13[] = {13}, s135[] = {13, 5}, s15[] = {1, 5};
    ad_tensor *a43 = ad_ones(T, 2, s43), *b56 = ad_ones(T, 2, s56), *v5 = ad_ones(T, 1, s5);
    ad_tensor *m53 = ad_ones(T, 2, s53);
    ad_tensor *x = ad_ones(T, 2, s613), *w = ad_ones(T, 2, s135), *s = ad_scalar(T, 1);
    ad_tensor *ox = ad_ones(U, 2, s613), *ow = ad_ones(U, 2, s135), *ob = ad_ones(U, 1, s5);
    TBAD(T, ad_matmul(T, s, m53), "ad_matmul", "at least 2 dimensions");
    TBAD(T, ad_matmul(T, ad_ones(T, 3, s234), ad_ones(T, 3, s546)), "ad_matmul", "[2,3,4]", "[5,4,6]");
    TBAD(T, ad_matmul(T, a43, a43), "ad_matmul", "inner dimensions 3 and 4");
    TBAD(T, ad_matmul(T, ox, w), "ad_matmul", "another tape");
    TBAD(T, ad_matmul_t(T, a43, b56, 1, 1), "ad_matmul_t", "[4,3]", "[5,6]", "inner");
    TBAD(T, ad_matmul_t(T, v5, m53, 0, 0), "ad_matmul_t", "at least 2 dimensions");
    TBAD(T, ad_matmul_t(T, x, ow, 0, 0), "ad_matmul_t", "another tape");
    TBAD(T, ad_matmul_t(T, a43, a43, 0, 0), "ad_matmul_t", "inner dimensions 3 and 4");
    TBAD(T, ad_linear(T, x, ad_ones(T, 1, s13), NULL), "ad_linear", "[13]");
    TBAD(T, ad_linear(T, s, w, NULL), "ad_linear", "W [13,5]");
    TBAD(T, ad_linear(T, x, w, ad_ones(T, 2, s15)), "ad_linear", "b [1,5]", "b must be [5]");
    TBAD(T, ad_linear(T, x, ow, NULL), "ad_linear", "another tape");
    TBAD(T, ad_linear(T, x, w, ob), "ad_linear", "another tape");
    TBAD(T, ad_linear(T, ox, w, NULL), "ad_linear", "another tape");
}

/* ---- softmax ------------------------------------------------------------------------------- */
static void test_softmax(ad_tape *T, ad_tape *U)
{
    int s34[] = {3, 4};
    ad_tensor *p = ad_ones(T, 2, s34), *o = ad_ones(U, 2, s34), *s = ad_scalar(T, 1);
    TBAD(T, ad_softmax(T, p, -3), "ad_softmax", "axis -3", "[3,4]");
    TBAD(T, ad_softmax(T, s, 0), "ad_softmax", "out of range");
    TBAD(T, ad_log_softmax(T, p, 2), "ad_log_softmax", "axis 2");
    TBAD(T, ad_log_softmax(T, s, -1), "ad_log_softmax", "out of range");
    TBAD(T, ad_softmax(T, o, 1), "ad_softmax", "another tape");
    TBAD(T, ad_log_softmax(T, o, 1), "ad_log_softmax", "another tape");
}

/* ---- convolution ----------------------------------------------------------------------------- */
static void test_conv(ad_tape *T, ad_tape *U)
{
    int s5d[] = {1, 1, 2, 2, 2}, x4[] = {2, 4, 6, 6}, w64[] = {6, 1, 3, 3}, x1[] = {1, 1, 3, 3};
    int w5[] = {1, 1, 5, 5};
    int x44[] = {1, 1, 4, 4}, w3[] = {1, 1, 3, 3}, x11[] = {1, 1, 1, 1}, w11[] = {1, 1, 1, 1}, s61[] = {6, 1};
    int w43[] = {6, 4, 3, 3}, s6[] = {6};
    ad_tensor *x = ad_ones(T, 4, x4), *w = ad_ones(T, 4, w43), *wg = ad_ones(T, 4, w64), *b = ad_ones(T, 1, s6);
    ad_tensor *ox = ad_ones(U, 4, x4), *ow = ad_ones(U, 4, w43), *ob = ad_ones(U, 1, s6);
    ad_tensor *t1 = ad_ones(T, 4, x11), *k1 = ad_ones(T, 4, w11);
    /* a kernel of 65536 x 65536 taps, C * kH * kW above INT_MAX: views of a small buffer, so
       the call must refuse the sizes before it reads anything */
    static ad_real cell[4];
    int s64k[] = {1, 1, 65536, 65536};
    ad_tensor *xv = ad_tensor_view(T, 4, s64k, cell, NULL, 0), *wv = ad_tensor_view(T, 4, s64k, cell, NULL, 0);
    TBAD(T, ad_conv2d(T, ad_ones(T, 5, s5d), w, NULL, NULL), "ad_conv2d", "[1,1,2,2,2]", "[N, C, H, W]");
    TBAD(T, ad_conv2d(T, x, wg, NULL, conv_desc(0, 0, 0, 0, 0, 0, 4)), "ad_conv2d", "groups 4");
    TBAD(T, ad_conv2d(T, x, w, NULL, conv_desc(-3, 0, 0, 0, 0, 0, 0)), "ad_conv2d", "stride -3x0");
    TBAD(T, ad_conv2d(T, x, w, NULL, conv_desc(INT_MIN, INT_MIN, 0, 0, 0, 0, 0)), "ad_conv2d", "stride");
    TBAD(T, ad_conv2d(T, x, w, NULL, conv_desc(0, 0, 0, 0, 0, -1, 0)), "ad_conv2d", "dilation 0x-1");
    TBAD(T, ad_conv2d(T, x, w, NULL, conv_desc(0, 0, 0, -5, 0, 0, 0)), "ad_conv2d", "padding 0x-5");
    TBAD(T, ad_conv2d(T, x, w, NULL, conv_desc(0, 0, 0, 0, 0, 0, INT_MIN)), "ad_conv2d", "groups");
    TBAD(T, ad_conv2d(T, ad_ones(T, 4, x1), ad_ones(T, 4, w5), NULL, NULL), "ad_conv2d",
         "larger than the padded input");
    TBAD(T, ad_conv2d(T, ad_ones(T, 4, x44), ad_ones(T, 4, w3), NULL, conv_desc(0, 0, 0, 0, 2, 2, 0)), "ad_conv2d",
         "spans 5x5");
    TBAD(T, ad_conv2d(T, t1, k1, NULL, conv_desc(0, 0, INT_MAX, 0, 0, 0, 0)), "ad_conv2d", "too large");
    TBAD(T, ad_conv2d(T, t1, ad_ones(T, 4, w3), NULL, conv_desc(0, 0, 0, 0, INT_MAX, 0, 0)), "ad_conv2d",
         "larger|too large");
    TBAD(T, ad_conv2d(T, t1, k1, NULL, conv_desc(0, 0, 50000, 50000, 0, 0, 0)), "ad_conv2d", "too large");
    TBAD(T, ad_conv2d(T, xv, wv, NULL, NULL), "ad_conv2d", "too large|overflow");
    TBAD(T, ad_conv2d(T, x, w, ad_ones(T, 2, s61), NULL), "ad_conv2d", "b [6,1]");
    TBAD(T, ad_conv2d(T, x, w, ob, NULL), "ad_conv2d", "another tape");
    TBAD(T, ad_conv2d(T, x, ow, b, NULL), "ad_conv2d", "another tape");
    TBAD(T, ad_conv2d(T, ox, w, NULL, NULL), "ad_conv2d", "another tape");
}

/* ---- pooling ------------------------------------------------------------------------------- */
static void test_pool(ad_tape *T, ad_tape *U)
{
    int x4[] = {2, 3, 4, 4}, s34[] = {3, 4}, s5d[] = {1, 1, 2, 2, 2};
    ad_tensor *x = ad_ones(T, 4, x4), *o = ad_ones(U, 4, x4), *m = ad_ones(T, 2, s34), *s = ad_scalar(T, 1);
    TBAD(T, ad_max_pool2d(T, x, -1, 2, NULL), "ad_max_pool2d", "kernel -1x2");
    TBAD(T, ad_avg_pool2d(T, x, 2, 0, NULL), "ad_avg_pool2d", "kernel 2x0");
    TBAD(T, ad_max_pool2d(T, x, 2, 2, pool_desc(0, -2, 0, 0)), "ad_max_pool2d", "stride 0x-2");
    TBAD(T, ad_avg_pool2d(T, x, 2, 2, pool_desc(INT_MIN, 0, 0, 0)), "ad_avg_pool2d", "stride");
    TBAD(T, ad_avg_pool2d(T, x, 3, 3, pool_desc(0, 0, 2, 0)), "ad_avg_pool2d", "half the kernel");
    TBAD(T, ad_max_pool2d(T, x, 5, 5, NULL), "ad_max_pool2d", "[2,3,4,4]", "larger than the padded input");
    TBAD(T, ad_avg_pool2d(T, x, INT_MAX, 1, NULL), "ad_avg_pool2d", "larger");
    TBAD(T, ad_max_pool2d(T, m, 2, 2, NULL), "ad_max_pool2d", "[3,4]", "[N, C, H, W]");
    TBAD(T, ad_avg_pool2d(T, ad_ones(T, 5, s5d), 1, 1, NULL), "ad_avg_pool2d", "[N, C, H, W]");
    TBAD(T, ad_max_pool2d(T, o, 2, 2, NULL), "ad_max_pool2d", "another tape");
    TBAD(T, ad_avg_pool2d(T, o, 2, 2, NULL), "ad_avg_pool2d", "another tape");
    TBAD(T, ad_global_avg_pool2d(T, m), "ad_global_avg_pool2d", "[3,4]");
    TBAD(T, ad_global_avg_pool2d(T, ad_ones(T, 5, s5d)), "ad_global_avg_pool2d", "[1,1,2,2,2]");
    TBAD(T, ad_global_avg_pool2d(T, s), "ad_global_avg_pool2d", "[]");
    TBAD(T, ad_global_avg_pool2d(T, o), "ad_global_avg_pool2d", "another tape");
}

/* ---- dropout, normalisation, embedding --------------------------------------------------------- */
static void test_layers(ad_tape *T, ad_tape *U)
{
    int s43[] = {4, 3}, s4533[] = {2, 5, 3, 3}, s3[] = {3}, s13[] = {1, 3}, s345[] = {3, 4, 5}, s4[] = {4};
    int s45[] = {4, 5}, s234[] = {2, 3, 4}, s52[] = {5, 2};
    int big[] = {INT_MAX}, small[] = {INT_MIN}, ok[] = {0, 1};
    ad_tensor *x = ad_ones(T, 2, s43), *o = ad_ones(U, 2, s43), *g3o = ad_ones(U, 1, s3), *s = ad_scalar(T, 1);
    ad_tensor *l = ad_ones(T, 3, s345), *lo = ad_ones(U, 3, s345), *g45o = ad_ones(U, 2, s45);
    ad_tensor *e = ad_ones(T, 2, s52), *eo = ad_ones(U, 2, s52);
    ad_batch_norm_state bn, half;
    ad_real buf[3];
    ad_rng rng;
    ad_rng_seed(&rng, 3);
    x->data[0] = 2; /* some spread, so that training statistics are defined */
    ad_set_training(T, 1);
    TBAD(T, ad_dropout(T, x, (ad_real)-INFINITY, &rng), "ad_dropout", "p = -inf");
    TBAD(T, ad_dropout(T, x, (ad_real)1.0001, &rng), "ad_dropout", "[0, 1]");
    TBAD(T, ad_dropout(T, x, (ad_real)INFINITY, &rng), "ad_dropout", "p = inf");
    TBAD(T, ad_dropout(T, o, (ad_real)0.5, &rng), "ad_dropout", "another tape");
    ad_set_training(T, 0);
    TBAD(T, ad_dropout(T, x, 2, NULL), "ad_dropout", "p = 2");
    ad_set_training(T, 1);

    TH_CHECK(ad_batch_norm_init(&bn, 3, NULL, NULL, err, sizeof err) == 0, "ad_batch_norm_init: %s", err);
    bn.eps = (ad_real)-1e-3;
    TBAD(T, ad_batch_norm(T, x, &bn, NULL, NULL), "ad_batch_norm", "eps");
    bn.eps = (ad_real)NAN;
    TBAD(T, ad_batch_norm(T, x, &bn, NULL, NULL), "ad_batch_norm", "eps");
    bn.eps = -1;
    ad_set_training(T, 0);
    TBAD(T, ad_batch_norm(T, x, &bn, NULL, NULL), "ad_batch_norm", "eps");
    ad_set_training(T, 1);
    bn.eps = (ad_real)1e-5;
    TBAD(T, ad_batch_norm(T, ad_ones(T, 4, s4533), &bn, NULL, NULL), "ad_batch_norm", "5 channels");
    TBAD(T, ad_batch_norm(T, ad_ones(T, 1, s3), &bn, NULL, NULL), "ad_batch_norm", "[3]", "[N, C]");
    TBAD(T, ad_batch_norm(T, o, &bn, NULL, NULL), "ad_batch_norm", "another tape");
    TBAD(T, ad_batch_norm(T, x, &bn, g3o, NULL), "ad_batch_norm", "another tape");
    TBAD(T, ad_batch_norm(T, x, &bn, ad_ones(T, 2, s13), NULL), "ad_batch_norm", "gamma [1,3]");
    half = bn;
    half.running_var = NULL;
    TBAD(T, ad_batch_norm(T, x, &half, NULL, NULL), "ad_batch_norm", "not initialised");
    ad_batch_norm_free(&bn);
    EBAD(ad_batch_norm_init(&half, 0, NULL, NULL, err, sizeof err), "ad_batch_norm_init", "0");
    EBAD(ad_batch_norm_init(&half, -3, NULL, NULL, err, sizeof err), "ad_batch_norm_init", "-3");
    EBAD(ad_batch_norm_init(&half, 3, buf, NULL, err, sizeof err), "ad_batch_norm_init");
    EBAD(ad_batch_norm_init(&half, 3, NULL, buf, err, sizeof err), "ad_batch_norm_init");
    CASE("ad_batch_norm_init without a message buffer", {
        TH_CHECK(ad_batch_norm_init(&half, 0, NULL, NULL, NULL, 0) == -1, "without a message buffer");
    });

    TBAD(T, ad_layer_norm(T, l, 1, NULL, NULL, (ad_real)NAN), "ad_layer_norm", "eps");
    TBAD(T, ad_layer_norm(T, l, 1, NULL, NULL, (ad_real)-INFINITY), "ad_layer_norm", "eps");
    TBAD(T, ad_layer_norm(T, l, -1, NULL, NULL, (ad_real)1e-5), "ad_layer_norm", "k = -1");
    TBAD(T, ad_layer_norm(T, l, 2, ad_ones(T, 1, s4), NULL, (ad_real)1e-5), "ad_layer_norm", "gamma [4]");
    TBAD(T, ad_layer_norm(T, l, 2, g45o, NULL, (ad_real)1e-5), "ad_layer_norm", "another tape");
    TBAD(T, ad_layer_norm(T, lo, 1, NULL, NULL, (ad_real)1e-5), "ad_layer_norm", "another tape");
    TBAD(T, ad_layer_norm(T, s, 1, NULL, NULL, (ad_real)1e-5), "ad_layer_norm", "k = 1");

    TBAD(T, ad_embedding(T, ad_ones(T, 3, s234), ok, 2), "ad_embedding", "[2,3,4]");
    TBAD(T, ad_embedding(T, e, ok, -1), "ad_embedding", "n must be at least 1");
    TBAD(T, ad_embedding(T, e, big, 1), "ad_embedding", "index 2147483647");
    TBAD(T, ad_embedding(T, e, small, 1), "ad_embedding", "index -2147483648");
    TBAD(T, ad_embedding(T, eo, ok, 2), "ad_embedding", "another tape");
    TBAD(T, ad_embedding(T, s, ok, 2), "ad_embedding", "[]");
}

/* ---- losses ------------------------------------------------------------------------------ */
static void test_loss(ad_tape *T, ad_tape *U)
{
    int s410[] = {4, 10}, s10[] = {10}, s3[] = {3}, s31[] = {3, 1}, s23[] = {2, 3}, s1[] = {1}, s2[] = {2};
    int lab_max[] = {0, INT_MAX, 1, 2}, lab_min[] = {INT_MIN, 0, 1, 2}, lab_last[] = {0, 1, 2, 10};
    ad_tensor *l = ad_ones(T, 2, s410), *o = ad_ones(U, 2, s410), *v3 = ad_ones(T, 1, s3), *s = ad_scalar(T, 1);
    ad_tensor *o3 = ad_ones(U, 1, s3);
    TBAD(T, ad_cross_entropy(T, l, lab_max), "ad_cross_entropy", "label 2147483647", "outside 0..9");
    TBAD(T, ad_cross_entropy(T, l, lab_min), "ad_cross_entropy", "label -2147483648");
    TBAD(T, ad_cross_entropy(T, l, lab_last), "ad_cross_entropy", "row 3");
    TBAD(T, ad_cross_entropy(T, ad_ones(T, 1, s10), lab_last), "ad_cross_entropy", "[10]");
    TBAD(T, ad_cross_entropy(T, o, lab_last), "ad_cross_entropy", "another tape");
    TBAD(T, ad_mse(T, v3, ad_ones(T, 2, s31)), "ad_mse", "[3]", "[3,1]");
    TBAD(T, ad_mse(T, s, ad_ones(T, 1, s1)), "ad_mse", "[]", "[1]");
    TBAD(T, ad_mse(T, v3, o3), "ad_mse", "another tape");
    TBAD(T, ad_bce_with_logits(T, ad_ones(T, 2, s23), v3), "ad_bce_with_logits", "[2,3]", "[3]");
    TBAD(T, ad_bce_with_logits(T, s, ad_ones(T, 1, s2)), "ad_bce_with_logits", "[2]");
    TBAD(T, ad_bce_with_logits(T, o3, v3), "ad_bce_with_logits", "another tape");
}

/* ---- ad_backward and ad_grad --------------------------------------------------------------- */
static void test_backward(ad_tape *T, ad_tape *U)
{
    int s12[] = {1, 2}, s21[] = {2, 1}, s2[] = {2};
    ad_tensor *x = ad_tensor_new(T, 1, s2, NULL, 1), *ux = ad_tensor_new(U, 1, s2, NULL, 1);
    ad_tensor *y = ad_sum(T, ad_square(T, x)), *uy = ad_sum(U, ad_square(U, ux));
    ad_tensor *y12 = ad_reshape(T, ad_square(T, x), 2, s12), *y21 = ad_reshape(T, ad_exp(T, x), 2, s21);
    TBAD_RC(T, ad_backward(T, y12), "ad_backward", "[1,2]", "exactly one element");
    TBAD_RC(T, ad_backward(T, uy), "ad_backward", "another tape");
    TBAD_RC(T, ad_backward(T, ad_square(T, x)), "ad_backward", "[2]");
    TBAD(T, ad_grad(T, y21, x, 1), "ad_grad", "[2,1]", "exactly one element");
    TBAD(T, ad_grad(T, y, ux, 0), "ad_grad", "another tape");
    TBAD(T, ad_grad(T, uy, x, 0), "ad_grad", "another tape");
    TBAD(T, ad_grad(T, y, ux, 1), "ad_grad", "x");
}

/* ---- tensors made before the tape's last reset ------------------------------------------------- */
#define STALE "before the tape's last reset"

static void test_stale(void)
{
    int s23[] = {2, 3}, s32[] = {3, 2}, s6[] = {6}, x4[] = {2, 2, 3, 3}, w4[] = {2, 2, 2, 2}, labels[] = {0, 2};
    int idx[] = {0, 1}, sw[] = {3, 4}, s1[] = {1}, s2[] = {2};
    ad_tape *T = ad_tape_new(), *T2 = ad_tape_new(), *T3 = ad_tape_new();
    ad_params *P = ad_params_new(1);
    int W = ad_params_add(P, "w", 2, sw, NULL);
    ad_tensor *w = ad_tensor_new(T, 2, s23, NULL, 1), *w4d = ad_ones(T, 4, x4), *k4d = ad_ones(T, 4, w4);
    ad_tensor *pw = ad_param(T, P, W), *ys = ad_sum(T, ad_square(T, w)), *x, *xs[2], *old;
    ad_batch_norm_state bn;
    ad_batch_norm_init(&bn, 2, NULL, NULL, NULL, 0);
    ad_tape_reset(T);
    x = ad_tensor_new(T, 2, s23, NULL, 1);
    xs[0] = x;
    xs[1] = w;
    TBAD(T, ad_add(T, x, w), "ad_add", STALE);
    TBAD(T, ad_relu(T, w), "ad_relu", STALE);
    TBAD(T, ad_matmul(T, w, ad_ones(T, 2, s32)), "ad_matmul", STALE);
    TBAD(T, ad_reshape(T, w, 1, s6), "ad_reshape", STALE);
    TBAD(T, ad_sum(T, w), "ad_sum", STALE);
    TBAD(T, ad_concat(T, xs, 2, 0), "ad_concat", STALE);
    TBAD(T, ad_linear(T, ad_ones(T, 2, s23), pw, NULL), "ad_linear", STALE);
    TBAD(T, ad_conv2d(T, ad_ones(T, 4, x4), k4d, NULL, NULL), "ad_conv2d", STALE);
    TBAD(T, ad_cross_entropy(T, w, labels), "ad_cross_entropy", STALE);
    TBAD_RC(T, ad_backward(T, ys), "ad_backward", STALE);
    TBAD(T, ad_grad(T, ys, x, 0), "ad_grad", STALE);
    TBAD(T, ad_grad(T, ad_sum(T, x), w, 1), "ad_grad", STALE);
    TBAD(T, ad_softmax(T, w, 1), "ad_softmax", STALE);
    TBAD(T, ad_mse(T, x, w), "ad_mse", STALE);
    TBAD(T, ad_embedding(T, w, idx, 2), "ad_embedding", STALE);
    TBAD(T, ad_batch_norm(T, w4d, &bn, NULL, NULL), "ad_batch_norm", STALE);
    TBAD(T, ad_max_pool2d(T, w4d, 2, 2, NULL), "ad_max_pool2d", STALE);
    /* stale tensors whose memory a new tensor of the same shape may have taken: two resets
       old, and one reset old behind a tensor of another size */
    old = ad_tensor_new(T2, 2, s23, NULL, 1);
    ad_tape_reset(T2);
    ad_tape_reset(T2);
    TBAD(T2, ad_mul(T2, ad_ones(T2, 2, s23), old), "ad_mul", STALE);
    ad_ones(T3, 1, s2);
    old = ad_tensor_new(T3, 2, s23, NULL, 1);
    ad_tape_reset(T3);
    ad_ones(T3, 1, s1);
    x = ad_tensor_new(T3, 2, s23, NULL, 1);
    TBAD(T3, ad_add(T3, x, old), "ad_add", STALE);
    ad_batch_norm_free(&bn);
    ad_params_free(P);
    ad_tape_free(T);
    ad_tape_free(T2);
    ad_tape_free(T3);
}

/* ---- parameter store ------------------------------------------------------------------------ */
static void test_params(ad_tape *T)
{
    int s34[] = {3, 4}, min2[] = {4, INT_MIN}, huge3[] = {1 << 30, 1 << 30, 1 << 30};
    int wrap4[] = {65536, 65536, 65536, 65536};
    char *long_name = (char *)malloc(5001);
    ad_params *P = ad_params_new(1);
    int w;
    memset(long_name, 'n', 5000);
    long_name[5000] = 0;
    w = ad_params_add(P, "fc.weight", 2, s34, NULL);
    TH_CHECK(w == 0, "first parameter: %s", th_params_error(P));
    PBAD(P, ad_params_add(P, NULL, 2, s34, NULL), "ad_params_add", "name");
    PBAD(P, ad_params_add(P, long_name, 2, s34, NULL), "ad_params_add", "5000 bytes");
    PBAD(P, ad_params_add(P, "fc.weight", 1, s34, NULL), "ad_params_add", "\"fc.weight\" already exists");
    PBAD(P, ad_params_add(P, "a", -5, s34, NULL), "ad_params_add", "-5 dimensions");
    PBAD(P, ad_params_add(P, "b", 2, min2, NULL), "ad_params_add", "[4,-2147483648]", "positive");
    PBAD(P, ad_params_add(P, "c", 3, huge3, NULL), "ad_params_add", "too many scalars");
    PBAD(P, ad_params_add(P, "d", 4, wrap4, NULL), "ad_params_add", "too many scalars");
    PBAD(P, ad_params_add(P, "e", 2, NULL, NULL), "ad_params_add", "no shape");
    PBAD(P, ad_params_add(P, "f", 2, s34, init_of((ad_init_kind)-1, 0, 0, 0)), "ad_params_add", "unknown kind");
    PBAD(P, ad_params_add(P, "g", 2, s34, init_of(AD_INIT_NORMAL, 0, -1, 0)), "ad_params_add", "standard deviation");
    PBAD(P, ad_params_add(P, "h", 2, s34, init_of(AD_INIT_KAIMING_UNIFORM, 0, 0, -2)), "ad_params_add", "gain");
    PBAD(P, ad_params_add(P, "i", 2, s34, init_of(AD_INIT_UNIFORM, INFINITY, 1, 0)), "ad_params_add", "finite");
    PBAD(P, ad_params_add(P, "j", 2, s34, init_of(AD_INIT_XAVIER_NORMAL, 0, 0, NAN)), "ad_params_add", "finite");
    CASE("failed adds add nothing", {
        ad_params_add(P, "c", 3, huge3, NULL);
        ad_params_add(P, "fc.weight", 1, s34, NULL);
        TH_CHECK(ad_params_count(P) == 1 && ad_params_find(P, "c") < 0, "failed adds added %d parameters",
                 ad_params_count(P) - 1);
    });
    PBAD(P, ad_params_init(P, -1, NULL), "ad_params_init", "-1");
    PBAD(P, ad_params_init(P, 1, NULL), "ad_params_init", "no parameter 1");
    PBAD(P, ad_params_init(P, w, init_of(AD_INIT_UNIFORM, 2, 1, 0)), "ad_params_init", "low bound");
    PBAD(P, ad_params_set_trainable(P, -1, 0), "ad_params_set_trainable", "-1");
    PBAD(P, ad_params_set_trainable(P, 99, 1), "ad_params_set_trainable", "99");
    TBAD(T, ad_param(T, P, -1), "ad_param", "-1");
    TBAD(T, ad_param(T, P, 1000), "ad_param", "1000");
    TBAD(T, ad_param(T, NULL, 0), "ad_param", "NULL");
    free(long_name);
    ad_params_free(P);
}

/* ---- optimizers -------------------------------------------------------------------------------- */
static void test_optim(void)
{
    int s34[] = {3, 4}, s2[] = {2};
    ad_params *P = ad_params_new(1);
    ad_optim *O, *O2;
    ad_tape *T = ad_tape_new();
    ad_params_add(P, "w", 2, s34, NULL);
    OPTBAD(P, sgd(NAN, 0, 0, 0, 0), "lr");
    OPTBAD(P, sgd(-1, 0, 0, 0, 0), "lr");
    OPTBAD(P, sgd(INFINITY, 0, 0, 0, 0), "lr");
    OPTBAD(P, sgd(0.1, -0.5, 0, 0, 0), "momentum");
    OPTBAD(P, sgd(0.1, 0.9, NAN, 0, 0), "dampening");
    OPTBAD(P, sgd(0.1, 0, 0, 0, NAN), "weight_decay");
    OPTBAD(P, sgd(0.1, 0.9, 0.1, 1, 0), "Nesterov");
    OPTBAD(P, adam(AD_OPTIM_ADAM, 1.0, 0, 0), "beta1");
    OPTBAD(P, adam(AD_OPTIM_ADAM, 0, -0.1, 0), "beta2");
    OPTBAD(P, adam(AD_OPTIM_ADAMW, NAN, 0, 0), "beta1");
    OPTBAD(P, adam(AD_OPTIM_ADAM, 0, 0, -1e-8), "eps");
    OPTBAD(P, adam(AD_OPTIM_ADAMW, 0, 0, NAN), "eps");
    OPTBAD(P, adam((ad_optim_kind)7, 0, 0, 0), "unknown");
    OPTBAD(P, adam((ad_optim_kind)-1, 0, 0, 0), "unknown");
    O = ad_optim_new(P, NULL);
    TH_CHECK(O != NULL, "default optimizer: %s", th_params_error(P));
    if (O) {
        LRBAD(O, P, -1.0, "lr -1");
        LRBAD(O, P, NAN, "lr");
        LRBAD(O, P, INFINITY, "lr");
        LRBAD(O, P, -INFINITY, "lr");
    }
    O2 = ad_optim_new(P, NULL);
    ad_params_add(P, "late", 1, s2, NULL); /* both optimizers are now older than the store */
    if (O && O2) {
        PBAD(P, ad_optim_step(O), "ad_optim_step", "after adding every parameter");
        PBAD(P, ad_optim_step_on(O2, T), "ad_optim_step_on", "after adding every parameter");
    }
    PBAD(P, ad_clip_grad_norm(P, -INFINITY), "ad_clip_grad_norm", "max_norm");
    PBAD(P, ad_clip_grad_norm(P, -0.5), "ad_clip_grad_norm", "max_norm is -0.5");
    PBAD(P, ad_clip_grad_norm(P, NAN), "ad_clip_grad_norm", "max_norm");
    ad_optim_free(O);
    ad_optim_free(O2);
    ad_params_free(P);
    ad_tape_free(T);
}

/* ---- checkpoints ------------------------------------------------------------------------------ */
/* A store whose parameters are named by the letters of names: the first [3,4] ([4,3] when
   transposed), the others [4]. */
static ad_params *store(const char *names, int transposed)
{
    int s34[] = {3, 4}, s43[] = {4, 3}, s4[] = {4};
    ad_params *P = ad_params_new(5);
    char name[2] = {0, 0};
    size_t i;
    for (i = 0; names[i]; i++) {
        name[0] = names[i];
        ad_params_add(P, name, i == 0 ? 2 : 1, i == 0 ? (transposed ? s43 : s34) : s4,
                      init_of(AD_INIT_UNIFORM, -1, 1, 0));
    }
    return P;
}

/* The checkpoint of P (and O) in a new buffer of *len bytes with room for 16 more. */
static unsigned char *saved(ad_params *P, const ad_optim *O, size_t *len)
{
    unsigned char *b;
    *len = ad_checkpoint_size(P, O);
    b = (unsigned char *)calloc(*len + 16, 1);
    TH_CHECK(ad_checkpoint_save_memory(b, *len, P, O) == 0, "save: %s", th_params_error(P));
    return b;
}

static void test_checkpoint(void)
{
    ad_params *A = store("wb", 0), *B = store("wb", 0), *A3 = store("wbc", 0), *Aname = store("wc", 0);
    ad_params *Ashape = store("wb", 1), *S = store("wb", 0);
    ad_optim_desc d_adam = adam(AD_OPTIM_ADAM, 0, 0, 0);
    ad_optim *OA = ad_optim_new(A, NULL), *OB = ad_optim_new(B, &d_adam), *OS = ad_optim_new(S, NULL);
    size_t n, n3, nname, nshape, nadam;
    unsigned char *good = saved(A, NULL, &n), *three = saved(A3, NULL, &n3), *named = saved(Aname, NULL, &nname);
    unsigned char *shaped = saved(Ashape, NULL, &nshape), *with_adam = saved(B, OB, &nadam), *bad;
    unsigned char junk[100];
    size_t i;
    int s2[] = {2};
    for (i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)("not a checkpoint at all "[i % 24]);
    ad_params_add(S, "late", 1, s2, NULL); /* OS is now older than its store */

    bad = (unsigned char *)malloc(n + 16);
    PBAD(A, ad_checkpoint_save_memory(bad, n - 1, A, NULL), "ad_checkpoint_save_memory", "buffer");
    PBAD(A, ad_checkpoint_save_memory(NULL, n, A, NULL), "ad_checkpoint_save_memory", "buffer");
    PBAD(A, ad_checkpoint_save_memory(bad, 0, A, NULL), "ad_checkpoint_save_memory", "holds 0 bytes");
    PBAD(A, ad_checkpoint_save_memory(bad, n + 16, A, OB), "ad_checkpoint_save_memory", "another parameter store");
    PBAD(S, ad_checkpoint_save_memory(bad, n + 16, S, OS), "ad_checkpoint_save_memory", "made for");
    PBAD(A, ad_checkpoint_load_memory(good, n - 1, A, NULL), "ad_checkpoint_load_memory", "truncated|bytes");
    PBAD(A, ad_checkpoint_load_memory(good, 10, A, NULL), "ad_checkpoint_load_memory", "truncated");
    PBAD(A, ad_checkpoint_load_memory(NULL, 10, A, NULL), "ad_checkpoint_load_memory", "NULL");
    PBAD(A, ad_checkpoint_load_memory(NULL, 0, A, NULL), "ad_checkpoint_load_memory", "truncated");
    memcpy(bad, good, n);
    bad[1] = 'X';
    PBAD(A, ad_checkpoint_load_memory(bad, n, A, NULL), "ad_checkpoint_load_memory", "magic");
    memcpy(bad, good, n);
    bad[8] = 99;
    PBAD(A, ad_checkpoint_load_memory(bad, n, A, NULL), "ad_checkpoint_load_memory", "version 99");
    memcpy(bad, good, n);
    bad[12] = 2;
    PBAD(A, ad_checkpoint_load_memory(bad, n, A, NULL), "ad_checkpoint_load_memory", "element type");
    memcpy(bad, good, n);
    bad[n] = 0;
    PBAD(A, ad_checkpoint_load_memory(bad, n + 1, A, NULL), "ad_checkpoint_load_memory", "trailing|bytes");
    memcpy(bad, good, n);
    bad[n - 20] ^= 0x40;
    PBAD(A, ad_checkpoint_load_memory(bad, n, A, NULL), "ad_checkpoint_load_memory", "checksum");
    PBAD(A, ad_checkpoint_load_memory(three, n3, A, NULL), "ad_checkpoint_load_memory", "3 parameters in the file, 2");
    PBAD(A, ad_checkpoint_load_memory(named, nname, A, NULL), "ad_checkpoint_load_memory", "name \"c\"");
    PBAD(A, ad_checkpoint_load_memory(shaped, nshape, A, NULL), "ad_checkpoint_load_memory", "[4,3]", "[3,4]");
    PBAD(A, ad_checkpoint_load_memory(good, n, A, OA), "ad_checkpoint_load_memory", "no optimizer state");
    PBAD(A, ad_checkpoint_load_memory(with_adam, nadam, A, OA), "ad_checkpoint_load_memory", "Adam", "SGD");
    PBAD(A, ad_checkpoint_load_memory(good, n, A, OB), "ad_checkpoint_load_memory", "another parameter store");
    PBAD(S, ad_checkpoint_load_memory(good, n, S, OS), "ad_checkpoint_load_memory", "made for");
    PBAD(A, ad_checkpoint_load_memory(junk, sizeof junk, A, NULL), "ad_checkpoint_load_memory", "magic");

    put_file("good.ckpt", good, n);
    put_file("cut.ckpt", good, n - 5);
    put_file("junk.bin", junk, sizeof junk);
    put_file("empty.bin", junk, 0);
    put_dir("folder.ckpt");
    PBAD(A, ad_checkpoint_load(at("missing.ckpt"), A, NULL), "ad_checkpoint_load", "missing.ckpt");
    PBAD(A, ad_checkpoint_load(at("folder.ckpt"), A, NULL), "ad_checkpoint_load", "folder|directory", "!bytes");
    PBAD(A, ad_checkpoint_load(NULL, A, NULL), "ad_checkpoint_load", "path is NULL");
    PBAD(A, ad_checkpoint_load(at("junk.bin"), A, NULL), "ad_checkpoint_load", "magic");
    PBAD(A, ad_checkpoint_load(at("empty.bin"), A, NULL), "ad_checkpoint_load", "truncated");
    PBAD(A, ad_checkpoint_load(at("cut.ckpt"), A, OA), "ad_checkpoint_load", "truncated");
    PBAD(A, ad_checkpoint_save(at("no/such/folder/x.ckpt"), A, NULL), "ad_checkpoint_save", "cannot create");
    PBAD(A, ad_checkpoint_save(at("folder.ckpt"), A, NULL), "ad_checkpoint_save", "folder.ckpt");
    PBAD(A, ad_checkpoint_save(NULL, A, NULL), "ad_checkpoint_save", "path is NULL");
    PLOAD_BAD(at("junk.bin"), "magic");
    PLOAD_BAD(at("folder.ckpt"), "folder|directory", "!bytes");
    PLOAD_BAD(at("missing.ckpt"), "missing.ckpt");
    PLOAD_BAD(NULL, "path is NULL");
    PLOAD_BAD(at("cut.ckpt"), "truncated");
    CASE("ad_params_load without a message buffer", {
        TH_CHECK(ad_params_load(at("junk.bin"), NULL, 0) == NULL, "ad_params_load without a message buffer");
    });

    free(bad);
    free(good);
    free(three);
    free(named);
    free(shaped);
    free(with_adam);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_optim_free(OS);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(A3);
    ad_params_free(Aname);
    ad_params_free(Ashape);
    ad_params_free(S);
}

/* ---- IDX files and MNIST folders ---------------------------------------------------------------- */
static void test_idx(void)
{
    static const uint32_t d322[3] = {3, 2, 2}, d2[1] = {2}, d3[1] = {3}, d0[3] = {3, 0, 2};
    static const uint32_t dhuge[3] = {65536, 65536, 65536};
    static const unsigned char gz_junk[24] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    unsigned char b[128], img[64], lab[16], cut[64];
    size_t n, ni, nl;
    ad_idx idx;
    ad_dataset ds;
    n = make_idx(b, 0x803, 3, d322, 12);
    EBAD(ad_idx_parse_memory(b, n, NULL, err, sizeof err), "ad_idx_parse_memory", "NULL");
    EBAD(ad_idx_parse_memory(NULL, 5, &idx, err, sizeof err), "ad_idx_parse_memory", "NULL");
    EBAD(ad_idx_parse_memory(b, 3, &idx, err, sizeof err), "ad_idx_parse_memory", "3 bytes");
    b[3] = 0x02;
    EBAD(ad_idx_parse_memory(b, n, &idx, err, sizeof err), "ad_idx_parse_memory", "magic");
    n = make_idx(b, 0x803, 3, d0, 0);
    EBAD(ad_idx_parse_memory(b, n, &idx, err, sizeof err), "ad_idx_parse_memory", "dimension 1 is 0");
    n = make_idx(b, 0x803, 3, d322, 12);
    EBAD(ad_idx_parse_memory(b, n - 1, &idx, err, sizeof err), "ad_idx_parse_memory", "truncated");
    EBAD(ad_idx_parse_memory(b, n + 1, &idx, err, sizeof err), "ad_idx_parse_memory", "trailing");
    EBAD(ad_idx_parse_memory(gz_junk, sizeof gz_junk, &idx, err, sizeof err), "ad_idx_parse_memory", "gzip");
    n = make_idx(b, 0x803, 3, dhuge, 0);
    EBAD(ad_idx_parse_memory(b, n, &idx, err, sizeof err), "ad_idx_parse_memory", "limit");
    CASE("a failed parse leaves idx empty", {
        memset(&idx, 0x55, sizeof idx);
        ad_idx_parse_memory(b, n - 1, &idx, err, sizeof err);
        TH_CHECK(idx.data == NULL && idx.size == 0 && idx.ndim == 0, "a failed parse leaves idx empty");
    });

    put_dir("idx.dir");
    put_file("junk.idx", "junk bytes here", 15);
    EBAD(ad_idx_load(at("missing.idx"), &idx, err, sizeof err), "ad_idx_load", "missing.idx");
    EBAD(ad_idx_load(at("idx.dir"), &idx, err, sizeof err), "ad_idx_load", "folder|directory", "!bytes");
    EBAD(ad_idx_load(at("junk.idx"), &idx, err, sizeof err), "ad_idx_load", "magic");
    EBAD(ad_idx_load(NULL, &idx, err, sizeof err), "ad_idx_load", "NULL");
    EBAD(ad_idx_load(at("junk.idx"), NULL, err, sizeof err), "ad_idx_load", "NULL");

    /* MNIST folders: three images but two labels; a damaged image file; no label file */
    ni = make_idx(img, 0x803, 3, d322, 12);
    nl = make_idx(lab, 0x801, 1, d2, 2);
    put_dir("mnist_counts");
    put_file("mnist_counts/train-images-idx3-ubyte", img, ni);
    put_file("mnist_counts/train-labels-idx1-ubyte", lab, nl);
    memcpy(cut, img, ni);
    cut[2] = 0x77;
    put_dir("mnist_damaged");
    put_file("mnist_damaged/train-images-idx3-ubyte", cut, ni);
    put_file("mnist_damaged/train-labels-idx1-ubyte", lab, nl);
    put_dir("mnist_nolabels");
    put_file("mnist_nolabels/t10k-images-idx3-ubyte", img, ni);
    EBAD(ad_mnist_load(at("no_such_mnist"), "train", &ds, err, sizeof err), "ad_mnist_load", "no_such_mnist");
    EBAD(ad_mnist_load(NULL, "train", &ds, err, sizeof err), "ad_mnist_load", "NULL");
    EBAD(ad_mnist_load(at("mnist_counts"), NULL, &ds, err, sizeof err), "ad_mnist_load", "NULL");
    EBAD(ad_mnist_load(at("mnist_counts"), "train", NULL, err, sizeof err), "ad_mnist_load", "NULL");
    EBAD(ad_mnist_load(at("mnist_counts"), "bogus", &ds, err, sizeof err), "ad_mnist_load", "bogus");
    EBAD(ad_mnist_load(at("mnist_counts"), "train", &ds, err, sizeof err), "ad_mnist_load", "3", "2", "label");
    EBAD(ad_mnist_load(at("mnist_damaged"), "train", &ds, err, sizeof err), "ad_mnist_load", "magic");
    EBAD(ad_mnist_load(at("mnist_nolabels"), "t10k", &ds, err, sizeof err), "ad_mnist_load", "labels");
    CASE("a failed ad_mnist_load leaves the dataset empty", {
        memset(&ds, 0x55, sizeof ds);
        ad_mnist_load(at("mnist_counts"), "train", &ds, err, sizeof err);
        TH_CHECK(ds.x == NULL && ds.labels == NULL && ds.count == 0,
                 "a failed ad_mnist_load leaves the dataset empty");
    });

    {
        ad_idx im, lb, lb3;
        TH_CHECK(ad_idx_parse_memory(img, ni, &im, err, sizeof err) == 0, "images: %s", err);
        TH_CHECK(ad_idx_parse_memory(lab, nl, &lb, err, sizeof err) == 0, "labels: %s", err);
        nl = make_idx(lab, 0x801, 1, d3, 3);
        TH_CHECK(ad_idx_parse_memory(lab, nl, &lb3, err, sizeof err) == 0, "labels: %s", err);
        EBAD(ad_dataset_from_idx(NULL, &lb3, &ds, err, sizeof err), "ad_dataset_from_idx", "images");
        EBAD(ad_dataset_from_idx(&im, &im, &ds, err, sizeof err), "ad_dataset_from_idx", "labels");
        EBAD(ad_dataset_from_idx(&lb3, NULL, &ds, err, sizeof err), "ad_dataset_from_idx", "images");
        EBAD(ad_dataset_from_idx(&im, &lb, &ds, err, sizeof err), "ad_dataset_from_idx", "3 images but 2 labels");
        EBAD(ad_dataset_from_idx(&im, &lb3, NULL, err, sizeof err), "ad_dataset_from_idx", "NULL");
        ad_idx_free(&im);
        ad_idx_free(&lb);
        ad_idx_free(&lb3);
    }
}

/* ---- images, image folders, batches --------------------------------------------------------------- */
static void test_images(void)
{
    unsigned char bmp[256], junk[64];
    size_t n = make_bmp(bmp, 3, 2), i;
    ad_image img, src, dst;
    ad_real pixels[12] = {0};
    for (i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 7 + 1);
    put_file("junk.png", junk, sizeof junk);
    put_file("ok.bmp", bmp, n);
    put_dir("image.png");
    EBAD(ad_image_load_memory(junk, sizeof junk, 3, &img, err, sizeof err), "ad_image_load_memory", "decode");
    EBAD(ad_image_load_memory(bmp, n, 0, &img, err, sizeof err), "ad_image_load_memory", "channels 0");
    EBAD(ad_image_load_memory(bmp, n, 5, &img, err, sizeof err), "ad_image_load_memory", "channels 5");
    EBAD(ad_image_load_memory(NULL, 10, 1, &img, err, sizeof err), "ad_image_load_memory", "no data|NULL");
    EBAD(ad_image_load_memory(bmp, 0, 1, &img, err, sizeof err), "ad_image_load_memory", "no data|0 bytes|empty");
    EBAD(ad_image_load_memory(bmp, n, 1, NULL, err, sizeof err), "ad_image_load_memory", "NULL");
    EBAD(ad_image_load_memory(bmp, 40, 3, &img, err, sizeof err), "ad_image_load_memory");
    CASE("a failed decode leaves the image empty", {
        memset(&img, 0x55, sizeof img);
        ad_image_load_memory(junk, sizeof junk, 3, &img, err, sizeof err);
        TH_CHECK(img.data == NULL && img.height == 0, "a failed decode leaves the image empty");
    });
    EBAD(ad_image_load(at("missing.png"), 1, &img, err, sizeof err), "ad_image_load", "missing.png");
    EBAD(ad_image_load(at("image.png"), 1, &img, err, sizeof err), "ad_image_load", "folder|directory", "!bytes");
    EBAD(ad_image_load(at("junk.png"), 1, &img, err, sizeof err), "ad_image_load", "junk.png");
    EBAD(ad_image_load(at("ok.bmp"), 7, &img, err, sizeof err), "ad_image_load", "channels 7");
    EBAD(ad_image_load(NULL, 1, &img, err, sizeof err), "ad_image_load", "NULL");
    EBAD(ad_image_load(at("ok.bmp"), 3, NULL, err, sizeof err), "ad_image_load", "NULL");

    src.channels = 1;
    src.height = 3;
    src.width = 4;
    src.data = pixels;
    EBAD(ad_image_resize(&src, 0, 2, &dst, err, sizeof err), "ad_image_resize", "0");
    EBAD(ad_image_resize(&src, 2, -1, &dst, err, sizeof err), "ad_image_resize", "-1");
    EBAD(ad_image_resize(NULL, 2, 2, &dst, err, sizeof err), "ad_image_resize", "source");
    EBAD(ad_image_resize(&src, 2, 2, NULL, err, sizeof err), "ad_image_resize", "NULL");
    EBAD(ad_image_resize(&src, INT_MAX, INT_MAX, &dst, err, sizeof err), "ad_image_resize", "limit");
    src.data = NULL;
    EBAD(ad_image_resize(&src, 2, 2, &dst, err, sizeof err), "ad_image_resize", "source");
    src.data = pixels;
    src.channels = 0;
    EBAD(ad_image_resize(&src, 2, 2, &dst, err, sizeof err), "ad_image_resize");
    src.channels = 1;
    src.height = -3;
    EBAD(ad_image_resize(&src, 2, 2, &dst, err, sizeof err), "ad_image_resize", "!out of memory");
    src.height = 3;
    src.width = -4;
    EBAD(ad_image_resize(&src, 2, 2, &dst, err, sizeof err), "ad_image_resize", "!out of memory");
}

static void test_folders(void)
{
    unsigned char b23[256], b33[256], junk[32];
    size_t n23 = make_bmp(b23, 2, 2), n33 = make_bmp(b33, 3, 3), i;
    ad_dataset ds;
    for (i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(200 - i);
    put_file("plain_file", junk, sizeof junk);
    put_dir("no_classes");
    put_dir("no_images");
    put_dir("no_images/cat");
    put_file("no_images/cat/notes.txt", junk, 4);
    put_dir("bad_image");
    put_dir("bad_image/cat");
    put_file("bad_image/cat/a.png", junk, sizeof junk);
    put_dir("mixed");
    put_dir("mixed/cat");
    put_file("mixed/cat/a.bmp", b23, n23);
    put_file("mixed/cat/b.bmp", b33, n33);
    EBAD(ad_folder_load(at("missing_root"), 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "missing_root");
    EBAD(ad_folder_load(at("plain_file"), 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "plain_file");
    EBAD(ad_folder_load(at("mixed"), 0, 0, 0, &ds, err, sizeof err), "ad_folder_load", "channels 0");
    EBAD(ad_folder_load(at("mixed"), 5, 0, 0, &ds, err, sizeof err), "ad_folder_load", "channels 5");
    EBAD(ad_folder_load(at("mixed"), 1, 8, 0, &ds, err, sizeof err), "ad_folder_load", "height 8, width 0");
    EBAD(ad_folder_load(at("mixed"), 1, -1, -1, &ds, err, sizeof err), "ad_folder_load", "height -1");
    EBAD(ad_folder_load(at("mixed"), 1, 0, 0, NULL, err, sizeof err), "ad_folder_load", "NULL");
    EBAD(ad_folder_load(NULL, 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "NULL");
    EBAD(ad_folder_load(at("no_classes"), 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "class");
    EBAD(ad_folder_load(at("no_images"), 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "no images");
    EBAD(ad_folder_load(at("bad_image"), 1, 0, 0, &ds, err, sizeof err), "ad_folder_load", "a.png");
    EBAD(ad_folder_load(at("mixed"), 3, 0, 0, &ds, err, sizeof err), "ad_folder_load", "b.bmp", "3x3");
    CASE("a failed ad_folder_load leaves the dataset empty", {
        memset(&ds, 0x55, sizeof ds);
        ad_folder_load(at("mixed"), 3, 0, 0, &ds, err, sizeof err);
        TH_CHECK(ds.x == NULL && ds.class_names == NULL && ds.count == 0,
                 "a failed ad_folder_load leaves the dataset empty");
    });
}

static void test_batcher(void)
{
    ad_real x[6] = {0};
    int labels[3] = {0, 1, 0};
    ad_dataset ds, hollow;
    ad_batcher b;
    memset(&ds, 0, sizeof ds);
    ds.count = 3;
    ds.ndim = 1;
    ds.shape[0] = 2;
    ds.sample_size = 2;
    ds.x = x;
    ds.labels = labels;
    ds.classes = 2;
    hollow = ds;
    hollow.x = NULL;
    EBAD(ad_batcher_init(&b, &ds, -5, 0, 1, err, sizeof err), "ad_batcher_init", "batch_size -5");
    EBAD(ad_batcher_init(&b, &ds, INT_MIN, AD_BATCH_SHUFFLE, 1, err, sizeof err), "ad_batcher_init", "batch_size");
    EBAD(ad_batcher_init(&b, &ds, 2, -1, 1, err, sizeof err), "ad_batcher_init", "flags");
    EBAD(ad_batcher_init(&b, &ds, 2, 16 | AD_BATCH_DROP_LAST, 1, err, sizeof err), "ad_batcher_init", "flags");
    EBAD(ad_batcher_init(&b, NULL, 2, 0, 1, err, sizeof err), "ad_batcher_init", "empty|NULL");
    EBAD(ad_batcher_init(NULL, &ds, 2, 0, 1, err, sizeof err), "ad_batcher_init", "NULL");
    EBAD(ad_batcher_init(&b, &hollow, 2, 0, 1, err, sizeof err), "ad_batcher_init", "empty");
    CASE("a failed batcher gives no batch", {
        memset(&b, 0x55, sizeof b);
        ad_batcher_init(&b, &ds, -5, 0, 1, err, sizeof err);
        TH_CHECK(ad_batcher_next(&b, x, labels) == 0, "a failed batcher gives no batch");
    });
}

int main(void)
{
    ad_tape *T = ad_tape_new(), *U = ad_tape_new();
    snprintf(root, sizeof root, "/tmp/ad_test_misuse_XXXXXX");
    if (!mkdtemp(root)) {
        printf("FAIL cannot make a folder under /tmp\n");
        return 1;
    }
    remember(root);
    test_creation(T);
    test_elementwise(T, U);
    test_binary(T, U);
    test_reduce(T, U);
    test_shape(T, U);
    test_linalg(T, U);
    test_softmax(T, U);
    test_conv(T, U);
    test_pool(T, U);
    test_layers(T, U);
    test_loss(T, U);
    test_backward(T, U);
    test_stale();
    test_params(T);
    test_optim();
    test_checkpoint();
    test_idx();
    test_images();
    test_folders();
    test_batcher();
    ad_tape_free(T);
    ad_tape_free(U);
    cleanup();
    printf("%d misuse cases\n", ncases);
    return th_summary();
}
