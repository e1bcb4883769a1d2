/* Checkpoints: bitwise round trips, resuming training, and refusal of truncated, corrupt,
   foreign and mismatched files with nothing changed. Works with float and double ad_real. */
#define AUTODIFF_DOUBLE
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"
#include <time.h>

static int quick(void) { return getenv("TH_QUICK") != NULL; }

/* ---- the file format, written out independently of the library ---- */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void put_le(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(x >> (8 * i));
}

/* Rewrites the length field and the checksum after an edit. */
static void reseal(unsigned char *buf, size_t len)
{
    put_le(buf + 16, len, 8);
    put_le(buf + len - 8, fnv1a(buf, len - 8), 8);
}

/* ---- stores ---- */
#define NSC 113 /* scalars of make_store: [3,5,7], [7], a scalar */

/* "w" [3,5,7], "b" [7] (or "c", or shape [3,7,5] for w, as asked) and "s" [], from seed. */
static ad_params *make_store_as(uint64_t seed, const char *bname, int transposed)
{
    static const int sw[3] = {3, 5, 7}, swt[3] = {3, 7, 5}, sb[1] = {7};
    ad_params *P = ad_params_new(seed);
    ad_init init;
    memset(&init, 0, sizeof init);
    init.kind = AD_INIT_NORMAL;
    ad_params_add(P, "w", 3, transposed ? swt : sw, &init);
    ad_params_add(P, bname, 1, sb, &init);
    ad_params_add(P, "s", 0, NULL, &init);
    return P;
}

static ad_params *make_store(uint64_t seed) { return make_store_as(seed, "b", 0); }

static ad_optim *make_optim(ad_params *P, ad_optim_kind kind, double momentum)
{
    ad_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.lr = 0.01;
    d.momentum = momentum;
    return ad_optim_new(P, &d);
}

/* A few steps with random gradients, so that the optimizer has state. */
static void train_random(ad_params *P, ad_optim *O, int steps, uint64_t seed)
{
    ad_rng r;
    size_t i;
    ad_rng_seed(&r, seed);
    while (steps-- > 0) {
        for (i = 0; i < ad_params_scalars(P); i++) ad_params_grads(P)[i] = (ad_real)ad_rng_normal(&r);
        ad_optim_step(O);
    }
}

/* The store (and optimizer) as checkpoint bytes: two equal snapshots mean equal states. */
static unsigned char *snapshot(ad_params *P, const ad_optim *O, size_t *len)
{
    unsigned char *buf;
    *len = ad_checkpoint_size(P, O);
    buf = (unsigned char *)malloc(*len);
    if (ad_checkpoint_save_memory(buf, *len, P, O) != 0) {
        printf("FAIL snapshot: %s\n", th_params_error(P));
        exit(1);
    }
    return buf;
}

/* A file name in the temporary folder, unique to this run. */
static void temp_path(char *buf, size_t cap, const char *tag)
{
    const char *dir = getenv("TMPDIR");
    static int counter;
    snprintf(buf, cap, "%s/ad_test_ckpt_%lx_%lx_%d_%s.ckpt", dir && *dir ? dir : "/tmp", (unsigned long)time(NULL),
             (unsigned long)(uintptr_t)&counter ^ (unsigned long)clock(), ++counter, tag);
}

static int write_file(const char *path, const unsigned char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    return ok;
}

/* ---- tests ---- */
static void test_round_trip(void)
{
    ad_params *A = make_store(1), *B = make_store(2), *C = make_store(3);
    ad_params *E = ad_params_new(1), *E2 = ad_params_new(9);
    ad_optim *OA = make_optim(A, AD_OPTIM_ADAM, 0), *OB = make_optim(B, AD_OPTIM_ADAM, 0);
    unsigned char *a, *b;
    size_t la, lb;
    char path[512];
    train_random(A, OA, 3, 10);
    ad_optim_set_lr(OA, 0.125);
    a = snapshot(A, OA, &la);
    TH_CHECK(la == 32 + 55 + 3 * 8 + NSC * sizeof(ad_real) * 3 + 104 + 8 + 8, "checkpoint size %zu", la);
    TH_CHECK(memcmp(a, "\x89" "ADCK\r\n\x1a", 8) == 0 && a[8] == 3 && a[12] == sizeof(ad_real), "magic, version, type");
    TH_CHECK(a[16] + 256 * a[17] == (int)la && a[24] == 3 && a[28] == 2, "length, count, optimizer kind");
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, OB) == 0, "load: %s", th_params_error(B));
    b = snapshot(B, OB, &lb);
    TH_CHECK(la == lb && memcmp(a, b, la) == 0, "memory round trip is bitwise");
    TH_CHECK(ad_optim_steps(OB) == 3 && ad_optim_lr(OB) == 0.125, "step count and lr restored");
    free(b);
    temp_path(path, sizeof path, "rt");
    TH_CHECK(ad_checkpoint_save(path, A, OA) == 0, "save: %s", th_params_error(A));
    TH_CHECK(ad_checkpoint_load(path, C, NULL) == 0, "load without optimizer: %s", th_params_error(C));
    TH_CHECK(memcmp(ad_params_values(A), ad_params_values(C), NSC * sizeof(ad_real)) == 0,
             "file round trip is bitwise");
    remove(path);
    /* an empty store */
    a = (free(a), snapshot(E, NULL, &la));
    TH_CHECK(la == 48 && ad_checkpoint_load_memory(a, la, E2, NULL) == 0, "empty store: %zu bytes, %s", la, th_params_error(E2));
    free(a);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(C);
    ad_params_free(E);
    ad_params_free(E2);
}

/* A two-layer net on fixed data; the loss of each step goes to losses[]. Training runs from
   the optimizer's present step count up to `until`, on a warmup-cosine schedule of `total`
   steps. */
static void train_net(ad_params *P, ad_optim *O, int until, int total, double *losses)
{
    static const int sx[2] = {8, 4};
    static const int labels[8] = {0, 1, 2, 1, 0, 2, 2, 1};
    ad_tape *T = ad_tape_new();
    ad_real x[32];
    int i;
    for (i = 0; i < 32; i++) x[i] = (ad_real)sin(0.7 * i + 0.3);
    while ((int)ad_optim_steps(O) < until) {
        int step = (int)ad_optim_steps(O);
        ad_tensor *h = ad_tanh(T, ad_linear(T, ad_tensor_new(T, 2, sx, x, 0), ad_param(T, P, 0), ad_param(T, P, 1)));
        ad_tensor *loss = ad_cross_entropy(T, ad_linear(T, h, ad_param(T, P, 2), ad_param(T, P, 3)), labels);
        ad_params_zero_grad(P);
        if (!loss || ad_backward(T, loss) != 0) {
            printf("FAIL train_net: %s\n", ad_tape_error(T) ? ad_tape_error(T) : "backward failed");
            break;
        }
        losses[step] = ad_item(loss);
        ad_clip_grad_norm(P, 1.0);
        ad_optim_set_lr(O, ad_lr_cosine(0.05, 0.001, 3, total, step));
        ad_optim_step(O);
        ad_tape_reset(T);
    }
    ad_tape_free(T);
}

static ad_params *make_net(uint64_t seed)
{
    static const int s1[2] = {4, 6}, b1[1] = {6}, s2[2] = {6, 3}, b2[1] = {3};
    ad_params *P = ad_params_new(seed);
    ad_init k;
    memset(&k, 0, sizeof k);
    k.kind = AD_INIT_KAIMING_UNIFORM;
    ad_params_add(P, "fc1.weight", 2, s1, &k);
    ad_params_add(P, "fc1.bias", 1, b1, NULL);
    ad_params_add(P, "fc2.weight", 2, s2, &k);
    ad_params_add(P, "fc2.bias", 1, b2, NULL);
    return P;
}

/* Training resumed from a checkpoint goes on as if it had never stopped. The run has groups (the
   biases without weight decay, the second layer at half the lr) that the store it is loaded
   into lacks: they come back from the file. */
static void check_resume(const char *what, ad_optim_kind kind, double momentum, int nesterov)
{
    enum { STEPS = 12, CUT = 5 };
    ad_optim_desc d;
    double straight[STEPS], resumed[STEPS];
    ad_params *P = make_net(42), *Q = make_net(42), *R = make_net(4242);
    ad_optim *OP, *OQ, *OR;
    char path[512];
    int k;
    for (k = 0; k < 4; k++) {
        ad_params_set_group(P, k, k >= 2 ? 0.5 : 1, k % 2 == 0);
        ad_params_set_group(Q, k, k >= 2 ? 0.5 : 1, k % 2 == 0);
    }
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.momentum = momentum;
    d.nesterov = nesterov;
    d.weight_decay = 0.01;
    d.centered = kind == AD_OPTIM_RMSPROP;
    OP = ad_optim_new(P, &d);
    OQ = ad_optim_new(Q, &d);
    d.lr = 0.5; /* the checkpoint brings back the lr too */
    OR = ad_optim_new(R, &d);
    memset(resumed, 0, sizeof resumed);
    train_net(P, OP, STEPS, STEPS, straight);
    train_net(Q, OQ, CUT, STEPS, resumed);
    temp_path(path, sizeof path, "resume");
    TH_CHECK(ad_checkpoint_save(path, Q, OQ) == 0, "%s: save: %s", what, th_params_error(Q));
    ad_optim_free(OQ);
    ad_params_free(Q);
    TH_CHECK(ad_checkpoint_load(path, R, OR) == 0, "%s: load: %s", what, th_params_error(R));
    remove(path);
    train_net(R, OR, STEPS, STEPS, resumed);
    TH_CHECK(memcmp(straight, resumed, sizeof straight) == 0, "%s: resumed losses differ (%.17g vs %.17g at the end)",
             what, straight[STEPS - 1], resumed[STEPS - 1]);
    TH_CHECK(memcmp(ad_params_values(P), ad_params_values(R), ad_params_scalars(P) * sizeof(ad_real)) == 0,
             "%s: resumed parameters differ", what);
    TH_CHECK(straight[STEPS - 1] < straight[0], "%s: the net learns (%g -> %g)", what, straight[0],
             straight[STEPS - 1]);
    for (k = 0; k < 4; k++) {
        double scale = 0;
        int decay = -1;
        ad_params_group(R, k, &scale, &decay);
        TH_CHECK(scale == (k >= 2 ? 0.5 : 1) && decay == (k % 2 == 0), "%s: parameter %d's group: %g, %d", what, k,
                 scale, decay);
    }
    ad_optim_free(OP);
    ad_optim_free(OR);
    ad_params_free(P);
    ad_params_free(R);
}

static void test_resume(void)
{
    check_resume("Adam", AD_OPTIM_ADAM, 0, 0);
    check_resume("AdamW", AD_OPTIM_ADAMW, 0, 0);
    check_resume("SGD Nesterov", AD_OPTIM_SGD, 0.9, 1);
    check_resume("RMSprop with momentum", AD_OPTIM_RMSPROP, 0.5, 0);
    check_resume("Adagrad", AD_OPTIM_ADAGRAD, 0, 0);
}

/* Loads bad (len bytes) into a fresh store and optimizer, expects a refusal whose message
   contains needle, and checks that nothing changed. */
static void expect_refusal(const char *what, const unsigned char *bad, size_t len, const char *needle)
{
    ad_params *P = make_store(5);
    ad_optim *O = make_optim(P, AD_OPTIM_ADAM, 0);
    unsigned char *before, *after;
    size_t lb, la;
    const char *msg;
    train_random(P, O, 2, 77);
    before = snapshot(P, O, &lb);
    TH_CHECK(ad_checkpoint_load_memory(bad, len, P, O) != 0, "%s: accepted", what);
    msg = ad_params_error(P);
    TH_CHECK(msg && strstr(msg, needle), "%s: expected \"%s\", got \"%s\"", what, needle, msg ? msg : "(none)");
    ad_params_clear_error(P);
    after = snapshot(P, O, &la);
    TH_CHECK(la == lb && memcmp(before, after, la) == 0, "%s: the refusal changed the store or optimizer", what);
    free(before);
    free(after);
    ad_optim_free(O);
    ad_params_free(P);
}

/* Like expect_refusal, many times over, sharing one store: for loops over every length or byte. */
typedef struct victim {
    ad_params *P;
    ad_optim *O;
    unsigned char *before;
    size_t len;
    int bad;
} victim;

static void victim_init(victim *v)
{
    v->P = make_store(5);
    v->O = make_optim(v->P, AD_OPTIM_ADAM, 0);
    train_random(v->P, v->O, 2, 77);
    v->before = snapshot(v->P, v->O, &v->len);
    v->bad = 0;
}

/* Returns 1 when the load was refused with a message containing one of the needles (or any
   message when both are NULL) and nothing changed. */
static int victim_refuses(victim *v, const unsigned char *data, size_t len, const char *n1, const char *n2)
{
    unsigned char *after;
    size_t la;
    const char *msg;
    int ok = ad_checkpoint_load_memory(data, len, v->P, v->O) != 0;
    msg = ad_params_error(v->P);
    ok = ok && msg && ((!n1 && !n2) || (n1 && strstr(msg, n1)) || (n2 && strstr(msg, n2)));
    if (!ok && v->bad == 0) printf("refusal message: %s\n", msg ? msg : "(none)");
    ad_params_clear_error(v->P);
    after = snapshot(v->P, v->O, &la);
    ok = ok && la == v->len && memcmp(after, v->before, la) == 0;
    free(after);
    if (!ok) v->bad++;
    return ok;
}

static void victim_free(victim *v)
{
    free(v->before);
    ad_optim_free(v->O);
    ad_params_free(v->P);
}

static unsigned char *good_file(size_t *len)
{
    ad_params *P = make_store(6);
    ad_optim *O = make_optim(P, AD_OPTIM_ADAM, 0);
    unsigned char *buf;
    train_random(P, O, 3, 11);
    buf = snapshot(P, O, len);
    ad_optim_free(O);
    ad_params_free(P);
    return buf;
}

static void test_truncated(void)
{
    victim v;
    size_t len, n, tried = 0;
    unsigned char *good = good_file(&len), *longer = (unsigned char *)malloc(len + 1);
    char path[512];
    victim_init(&v);
    for (n = 0; n < len; n += quick() && n > 40 ? 13 : 1, tried++) {
        unsigned char *cut = (unsigned char *)malloc(n ? n : 1); /* its own block, so ASan sees overreads */
        memcpy(cut, good, n);
        victim_refuses(&v, cut, n, "truncated", NULL);
        free(cut);
    }
    TH_CHECK(v.bad == 0, "%d of %zu truncated lengths not refused as truncated, or changed the store", v.bad, tried);
    memcpy(longer, good, len);
    longer[len] = 0;
    TH_CHECK(victim_refuses(&v, longer, len + 1, "trailing bytes", NULL), "an extra byte at the end refused");
    /* truncated files on disk */
    temp_path(path, sizeof path, "cut");
    for (n = 0; n < len; n += len / 5) {
        TH_CHECK(write_file(path, good, n), "write %s", path);
        TH_CHECK(ad_checkpoint_load(path, v.P, v.O) != 0, "truncated file of %zu bytes accepted", n);
        TH_CHECK_PERROR(v.P, "truncated");
    }
    remove(path);
    victim_free(&v);
    free(good);
    free(longer);
}

static void test_flipped_bytes(void)
{
    victim v;
    size_t len, i;
    unsigned char *good = good_file(&len), *bad = (unsigned char *)malloc(len);
    int wrong[5] = {0, 0, 0, 0, 0};
    victim_init(&v);
    for (i = 0; i < len; i++) {
        memcpy(bad, good, len);
        bad[i] ^= (unsigned char)(1u << (i % 8));
        if (i < 8) wrong[0] += !victim_refuses(&v, bad, len, "not an autodiff.h checkpoint", NULL);
        else if (i < 12) wrong[1] += !victim_refuses(&v, bad, len, "format version", "checksum mismatch");
        else if (i < 16) wrong[2] += !victim_refuses(&v, bad, len, "element type", NULL);
        else if (i < 24) wrong[3] += !victim_refuses(&v, bad, len, "truncated", "trailing bytes");
        else wrong[4] += !victim_refuses(&v, bad, len, "checksum mismatch", NULL);
    }
    TH_CHECK(wrong[0] + wrong[1] + wrong[2] + wrong[3] + wrong[4] == 0,
             "flipped bits not refused for the right reason: magic %d, version %d, type %d, length %d, rest %d",
             wrong[0], wrong[1], wrong[2], wrong[3], wrong[4]);
    victim_free(&v);
    free(good);
    free(bad);
}

static void test_foreign(void)
{
    size_t len;
    unsigned char *good = good_file(&len), *bad = (unsigned char *)malloc(len);
    char msg[128];
    memcpy(bad, good, len);
    memcpy(bad, "PK\003\004abcd", 8);
    expect_refusal("zip file", bad, len, "not an autodiff.h checkpoint (wrong magic bytes)");
    expect_refusal("text", (const unsigned char *)"hello, world\n", 13, "not an autodiff.h checkpoint");
    expect_refusal("empty", good, 0, "truncated");
    memcpy(bad, good, len);
    put_le(bad + 8, 4, 4);
    reseal(bad, len);
    expect_refusal("version 4", bad, len, "format version 4; this build reads versions 1 to 3");
    put_le(bad + 8, 0, 4);
    reseal(bad, len);
    expect_refusal("version 0", bad, len, "format version 0");
    memcpy(bad, good, len);
    put_le(bad + 12, sizeof(ad_real) == 8 ? 4 : 8, 4);
    reseal(bad, len);
    snprintf(msg, sizeof msg, "element type float%d in the file, float%d in this build", sizeof(ad_real) == 8 ? 32 : 64,
             (int)(8 * sizeof(ad_real)));
    expect_refusal("other element type", bad, len, msg);
    put_le(bad + 12, 3, 4);
    reseal(bad, len);
    expect_refusal("unknown element type", bad, len, "element type unknown 3");
    free(good);
    free(bad);
}

/* Files that pass the checksum but whose structure is wrong or hostile. */
static void test_malformed(void)
{
    size_t len, opt = 32 + 55 + 3 * 8 + NSC * sizeof(ad_real);
    unsigned char *good = good_file(&len), *bad = (unsigned char *)malloc(len);
    double nan = NAN;
    uint64_t bits;
    memcpy(bad, good, len);
    put_le(bad + 32, 0xFFFFFFFFu, 4);
    reseal(bad, len);
    expect_refusal("name length 2^32-1", bad, len, "parameter 0: malformed name");
    memcpy(bad, good, len);
    put_le(bad + 37, 0xFFFFFFFFu, 4);
    reseal(bad, len);
    expect_refusal("ndim 2^32-1", bad, len, "malformed shape");
    memcpy(bad, good, len);
    put_le(bad + 41, 0x80000003u, 4);
    reseal(bad, len);
    expect_refusal("huge dimension", bad, len, "shape [2147483651,5,7] in the file, [3,5,7] in the store");
    memcpy(bad, good, len);
    put_le(bad + 28, 9, 4);
    reseal(bad, len);
    expect_refusal("optimizer kind 9", bad, len, "unknown optimizer kind 9");
    memcpy(bad, good, len);
    memcpy(&bits, &nan, 8);
    put_le(bad + opt + 8, bits, 8);
    reseal(bad, len);
    expect_refusal("NaN lr", bad, len, "optimizer settings: lr must be finite");
    memcpy(bad, good, len);
    put_le(bad + opt + 24, bits, 8);
    reseal(bad, len);
    expect_refusal("NaN dampening in an Adam file", bad, len, "must be finite, even where unused");
    memcpy(bad, good, len);
    put_le(bad + opt + 100, 3, 4);
    reseal(bad, len);
    expect_refusal("3 state buffers", bad, len, "wrong number of state buffers");
    memcpy(bad, good, len);
    put_le(bad + opt + 96, 2, 4);
    reseal(bad, len);
    expect_refusal("centered 2", bad, len, "centered is not 0 or 1");
    memcpy(bad, good, len);
    put_le(bad + opt + 72, bits, 8);
    reseal(bad, len);
    expect_refusal("NaN alpha in an Adam file", bad, len, "must be finite, even where unused");
    memcpy(bad, good, len);
    put_le(bad + 28, 6, 4);
    reseal(bad, len);
    expect_refusal("optimizer kind 6", bad, len, "unknown optimizer kind 6");
    memcpy(bad, good, len);
    put_le(bad + 32 + 25, bits, 8);
    reseal(bad, len);
    expect_refusal("NaN lr scale", bad, len, "parameter 0: lr scale nan");
    {
        double minus = -0.5;
        memcpy(&bits, &minus, 8);
        memcpy(bad, good, len);
        put_le(bad + 32 + 25, bits, 8);
        reseal(bad, len);
        expect_refusal("negative lr scale", bad, len, "parameter 0: lr scale -0.5; it must be finite and >= 0");
        memcpy(&bits, &nan, 8);
    }
    memcpy(bad, good, len);
    put_le(bad + opt + 68, 7, 4);
    reseal(bad, len);
    expect_refusal("zero_grad 7", bad, len, "zero_grad is not 0 or 1");
    memcpy(bad, good, len);
    put_le(bad + 32 + 21, 4, 4);
    reseal(bad, len);
    expect_refusal("unknown parameter flag", bad, len, "parameter 0: malformed flags");
    memcpy(bad, good, len);
    put_le(bad + len - 16, 1, 8);
    reseal(bad, len);
    expect_refusal("extra bytes past the end", bad, len, "the extra bytes are cut short");
    memcpy(bad, good, len);
    put_le(bad + opt + 64, 2, 4);
    reseal(bad, len);
    expect_refusal("nesterov 2", bad, len, "nesterov is not 0 or 1");
    /* the optimizer section cut off, with length and checksum made to agree */
    memcpy(bad, good, opt + 40);
    reseal(bad, opt + 40);
    expect_refusal("short optimizer section", bad, opt + 40, "malformed optimizer section");
    memcpy(bad, good, opt + 200);
    reseal(bad, opt + 200);
    expect_refusal("short optimizer state", bad, opt + 200, "malformed optimizer state");
    memcpy(bad, good, len);
    put_le(bad + 28, 0, 4);
    reseal(bad, len);
    expect_refusal("optimizer state missing", bad, len, "the file holds no optimizer state");
    {
        ad_params *P = make_store(1);
        TH_CHECK(ad_checkpoint_load_memory(bad, len, P, NULL) != 0, "leftover bytes accepted");
        TH_CHECK_PERROR(P, "bytes left over before the checksum");
        ad_params_free(P);
    }
    free(good);
    free(bad);
}

static void test_mismatch(void)
{
    ad_params *A = make_store(1), *B = make_store_as(2, "c", 0), *C = make_store_as(3, "b", 1), *D = ad_params_new(4);
    ad_params *E = make_store(5), *F = make_store(6);
    ad_optim *OA = make_optim(A, AD_OPTIM_ADAM, 0), *OE = make_optim(E, AD_OPTIM_SGD, 0),
             *OS = make_optim(F, AD_OPTIM_SGD, 0.9);
    static const int s[1] = {7};
    unsigned char *a, *plain, *before;
    size_t la, lp, lb;
    train_random(A, OA, 2, 3);
    a = snapshot(A, OA, &la);
    plain = snapshot(A, NULL, &lp);
    before = snapshot(B, NULL, &lb);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, NULL) != 0, "name mismatch accepted");
    TH_CHECK_PERROR(B, "parameter 1: name \"b\" in the file, \"c\" in the store");
    TH_CHECK(ad_checkpoint_load_memory(a, la, C, NULL) != 0, "shape mismatch accepted");
    TH_CHECK_PERROR(C, "parameter 0 (\"w\"): shape [3,5,7] in the file, [3,7,5] in the store");
    ad_params_add(D, "w", 1, s, NULL);
    TH_CHECK(ad_checkpoint_load_memory(a, la, D, NULL) != 0, "count mismatch accepted");
    TH_CHECK_PERROR(D, "3 parameters in the file, 1 in the store");
    TH_CHECK(ad_checkpoint_load_memory(a, la, E, OE) != 0, "optimizer kind mismatch accepted");
    TH_CHECK_PERROR(E, "optimizer Adam in the file, SGD here");
    TH_CHECK(ad_checkpoint_load_memory(plain, lp, E, OE) != 0, "file without optimizer state accepted");
    TH_CHECK_PERROR(E, "the file holds no optimizer state");
    TH_CHECK(ad_checkpoint_load_memory(a, la, E, OA) != 0, "optimizer of another store accepted");
    TH_CHECK_PERROR(E, "the optimizer belongs to another parameter store");
    free(a);
    a = snapshot(E, OE, &la);
    TH_CHECK(ad_checkpoint_load_memory(a, la, F, OS) != 0, "plain SGD state loaded into momentum SGD");
    TH_CHECK_PERROR(F, "momentum is on in one of file and optimizer, off in the other");
    free(a);
    a = snapshot(B, NULL, &la);
    TH_CHECK(la == lb && memcmp(a, before, la) == 0, "refusals left the store alone");
    free(a);
    free(plain);
    free(before);
    ad_optim_free(OA);
    ad_optim_free(OE);
    ad_optim_free(OS);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(C);
    ad_params_free(D);
    ad_params_free(E);
    ad_params_free(F);
}

static void test_files(void)
{
    ad_params *A = make_store(1), *B = make_store(2), *Big = make_store_as(3, "b", 0);
    ad_optim *OA = make_optim(A, AD_OPTIM_SGD, 0.5), *OB;
    static const int s[2] = {AD_PARAMS_EXTRA_MAX / 1024 / (int)sizeof(ad_real) + 1, 1024};
    char path[512], bad_dir[600];
    unsigned char *small, *a;
    size_t ls, la;
    temp_path(path, sizeof path, "files");
    TH_CHECK(ad_checkpoint_load(path, B, NULL) != 0, "missing file accepted");
    TH_CHECK_PERROR(B, "cannot be opened");
    snprintf(bad_dir, sizeof bad_dir, "%s.no-such-dir/x.ckpt", path);
    TH_CHECK(ad_checkpoint_save(bad_dir, A, OA) != 0, "save into a missing folder succeeded");
    TH_CHECK_PERROR(A, "cannot create");
    /* saving replaces the old file */
    TH_CHECK(ad_checkpoint_save(path, B, NULL) == 0, "first save: %s", th_params_error(B));
    train_random(A, OA, 2, 5);
    TH_CHECK(ad_checkpoint_save(path, A, OA) == 0, "second save: %s", th_params_error(A));
    OB = make_optim(B, AD_OPTIM_SGD, 0.5);
    TH_CHECK(ad_checkpoint_load(path, B, OB) == 0, "load: %s", th_params_error(B));
    a = snapshot(A, OA, &la);
    small = snapshot(B, OB, &ls);
    TH_CHECK(la == ls && memcmp(a, small, la) == 0, "the second save replaced the first");
    free(a);
    free(small);
    /* a file larger than any checkpoint of the store (with the most extra bytes a store keeps)
       is refused before reading it all */
    ad_params_add(Big, "big", 2, s, NULL);
    TH_CHECK(ad_checkpoint_save(path, Big, NULL) == 0, "save big: %s", th_params_error(Big));
    TH_CHECK(ad_checkpoint_load(path, B, NULL) != 0, "oversized file accepted");
    TH_CHECK_PERROR(B, "larger than any checkpoint of this store");
    remove(path);
    small = (unsigned char *)malloc(16);
    TH_CHECK(ad_checkpoint_save_memory(small, 16, A, OA) != 0, "save into a small buffer");
    TH_CHECK_PERROR(A, "the buffer holds 16 bytes, the checkpoint needs");
    free(small);
    TH_CHECK(ad_checkpoint_save(NULL, A, NULL) != 0 && ad_checkpoint_load(NULL, A, NULL) != 0, "NULL paths");
    TH_CHECK_PERROR(A, "path is NULL");
    TH_CHECK(ad_checkpoint_load_memory(NULL, 10, A, NULL) != 0, "NULL data");
    TH_CHECK_PERROR(A, "data is NULL");
    TH_CHECK(ad_checkpoint_save("x", NULL, NULL) != 0 && ad_checkpoint_load_memory("x", 1, NULL, NULL) != 0 &&
                 ad_checkpoint_size(NULL, NULL) == 0,
             "NULL stores");
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(Big);
}

/* Random edits anywhere, resealed so that the structure behind the checksum is exercised:
   every load must either succeed or refuse with nothing changed. */
static void test_random_edits(void)
{
    victim v;
    size_t len, i;
    unsigned char *good = good_file(&len), *bad = (unsigned char *)malloc(len + 64);
    int n = quick() ? 300 : 3000, accepted = 0, refused = 0, k;
    ad_rng r;
    victim_init(&v);
    ad_rng_seed(&r, 2026);
    for (k = 0; k < n; k++) {
        size_t blen = len, edits = 1 + ad_rng_below(&r, 4);
        memcpy(bad, good, len);
        for (i = 0; i < edits; i++) {
            size_t at = 24 + ad_rng_below(&r, len - 32);
            switch (ad_rng_below(&r, 4)) {
            case 0: /* one byte */
                bad[at] ^= (unsigned char)(1 + ad_rng_below(&r, 255));
                break;
            case 1: { /* a u32 field somewhere: small and huge numbers */
                uint64_t x = ad_rng_next(&r);
                put_le(bad + (at < len - 12 ? at : len - 12), x >> ad_rng_below(&r, 64), 4);
                break;
            }
            case 2: /* cut short */
                blen = 40 + ad_rng_below(&r, len - 40);
                break;
            default: /* bytes added */
                blen = len + ad_rng_below(&r, 64);
                memset(bad + len, 0x5a, blen - len);
            }
        }
        reseal(bad, blen);
        if (ad_checkpoint_load_memory(bad, blen, v.P, v.O) == 0) {
            size_t l2;
            unsigned char *now = snapshot(v.P, v.O, &l2);
            accepted++;
            /* what loaded must be what the file said: saving it again gives the same bytes */
            if (l2 != blen || memcmp(now, bad, blen) != 0) v.bad++;
            free(now);
            /* back to the state the other checks compare against */
            ad_checkpoint_load_memory(v.before, v.len, v.P, v.O);
        } else {
            refused++;
            ad_params_clear_error(v.P);
            victim_refuses(&v, bad, blen, NULL, NULL);
        }
    }
    TH_CHECK(v.bad == 0, "random edits: %d loads changed state on refusal or loaded wrongly", v.bad);
    TH_CHECK(refused > 0, "random edits: %d accepted, %d refused", accepted, refused);
    victim_free(&v);
    free(good);
    free(bad);
}

/* ad_params_load: a new store with the file's names, shapes and values; refusals leave no store. */
static void test_params_load(void)
{
    ad_params *A = make_store(11), *L;
    ad_optim *O = make_optim(A, AD_OPTIM_ADAM, 0);
    char path[512], err[512];
    unsigned char *bytes;
    size_t len, i;
    int id;
    train_random(A, O, 3, 5);
    temp_path(path, sizeof path, "adopt");
    TH_CHECK(ad_checkpoint_save(path, A, O) == 0, "save: %s", th_params_error(A));
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L != NULL, "ad_params_load: %s", err);
    if (L) {
        TH_CHECK(ad_params_count(L) == ad_params_count(A), "count %d vs %d", ad_params_count(L), ad_params_count(A));
        for (id = 0; id < ad_params_count(A) && id < ad_params_count(L); id++) {
            ad_param_info a = ad_params_info(A, id), l = ad_params_info(L, id);
            TH_CHECK(strcmp(a.name, l.name) == 0 && a.ndim == l.ndim && a.size == l.size, "parameter %d differs", id);
            TH_CHECK(memcmp(a.shape, l.shape, (size_t)a.ndim * sizeof(int)) == 0, "shape of %d differs", id);
        }
        TH_CHECK(ad_params_scalars(L) == ad_params_scalars(A) &&
                     memcmp(ad_params_values(L), ad_params_values(A), ad_params_scalars(A) * sizeof(ad_real)) == 0,
                 "values differ");
        ad_params_free(L);
    }
    /* a corrupt copy: one flipped byte in the values */
    bytes = snapshot(A, O, &len);
    bytes[len / 2] ^= 0x10;
    TH_CHECK(write_file(path, bytes, len), "write");
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L == NULL && strstr(err, "checksum"), "corrupt file: %s", L ? "accepted" : err);
    ad_params_free(L);
    /* truncated at every length of the table */
    for (i = 0; i < 80 && i < len; i++) {
        TH_CHECK(write_file(path, bytes, i), "write");
        L = ad_params_load(path, err, sizeof err);
        TH_CHECK(L == NULL && err[0], "truncated to %zu bytes: accepted", i);
        ad_params_free(L);
    }
    remove(path);
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L == NULL && strstr(err, path), "missing file: %s", err);
    free(bytes);
    ad_optim_free(O);
    ad_params_free(A);
}

/* Frozen parameters keep their values through optimizer steps and through checkpoints. */
static void test_frozen(void)
{
    ad_optim_kind kinds[5] = {AD_OPTIM_SGD, AD_OPTIM_ADAM, AD_OPTIM_ADAMW, AD_OPTIM_RMSPROP, AD_OPTIM_ADAGRAD};
    int k;
    for (k = 0; k < 5; k++) {
        ad_params *A = make_store(21);
        ad_optim *O;
        ad_param_info b;
        ad_real before[7];
        ad_real w0, s0;
        ad_optim_desc d;
        memset(&d, 0, sizeof d);
        d.kind = kinds[k];
        d.lr = 0.1;
        d.momentum = kinds[k] == AD_OPTIM_SGD || kinds[k] == AD_OPTIM_RMSPROP ? 0.9 : 0;
        d.weight_decay = 0.1;
        TH_CHECK(ad_params_set_trainable(A, 1, 0) == 0, "freeze: %s", th_params_error(A));
        TH_CHECK(ad_params_set_trainable(A, 9, 0) != 0, "freezing a missing parameter was accepted");
        ad_params_clear_error(A);
        O = ad_optim_new(A, &d);
        b = ad_params_info(A, 1);
        memcpy(before, b.value, sizeof before);
        w0 = ad_params_values(A)[0];
        s0 = ad_params_info(A, 2).value[0];
        train_random(A, O, 3, 9);
        TH_CHECK(memcmp(before, ad_params_info(A, 1).value, sizeof before) == 0, "optimizer %d changed a frozen parameter", k);
        TH_CHECK(ad_params_values(A)[0] != w0, "optimizer %d left a trained parameter alone", k);
        TH_CHECK(ad_params_info(A, 2).value[0] != s0, "optimizer %d skipped the parameter after a frozen one", k);
        ad_optim_free(O);
        ad_params_free(A);
    }
}

/* Everything about the optimizer comes back from the file, zero_grad included: a loop that
   leaves the zeroing to the step keeps working after a resume. */
static void test_settings_restored(void)
{
    ad_params *A = make_store(31), *B = make_store(32), *C = make_store(33);
    ad_optim_desc d, got;
    ad_optim *OA, *OB, *OC;
    unsigned char *a;
    size_t la, i;
    int zero = 1;
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_SGD;
    d.lr = 0.02;
    d.momentum = 0.9;
    d.dampening = 0.1;
    d.weight_decay = 0.003;
    d.zero_grad = 1;
    OA = ad_optim_new(A, &d);
    OB = ad_optim_new(B, &d);
    d.zero_grad = 0;
    d.lr = 0.5;
    d.dampening = 0;
    d.nesterov = 1;
    OC = ad_optim_new(C, &d);
    train_random(A, OA, 4, 3);
    a = snapshot(A, OA, &la);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, OB) == 0, "load into the same settings: %s", th_params_error(B));
    TH_CHECK(ad_optim_settings(OB).zero_grad == 1, "zero_grad lost in the load");
    for (i = 0; i < ad_params_scalars(B); i++) ad_params_grads(B)[i] = 1;
    ad_optim_step(OB);
    for (i = 0; i < ad_params_scalars(B); i++) zero = zero && ad_params_grads(B)[i] == 0;
    TH_CHECK(zero, "the step after a load did not zero the gradients");
    TH_CHECK(ad_checkpoint_load_memory(a, la, C, OC) == 0, "load into other settings: %s", th_params_error(C));
    got = ad_optim_settings(OC);
    TH_CHECK(got.zero_grad == 1 && got.lr == 0.02 && got.dampening == 0.1 && got.nesterov == 0 &&
                 got.momentum == 0.9 && got.weight_decay == 0.003,
             "the file's settings win: zero_grad %d lr %g dampening %g nesterov %d", got.zero_grad, got.lr,
             got.dampening, got.nesterov);
    free(a);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_optim_free(OC);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(C);
}

/* A version 2 file, made from a version 3 one by this test's own writer: no lr scales (and no
   flag but bit 0), no alpha, lr_decay, initial_accumulator_value or centered. */
static size_t to_version2(const unsigned char *v3, size_t len, int nparams, int with_optim, unsigned char *out)
{
    const unsigned char *p = v3 + 32, *end = v3 + len - 8;
    unsigned char *q = out;
    int i;
    memcpy(q, v3, 32);
    put_le(q + 8, 2, 4);
    q += 32;
    for (i = 0; i < nparams; i++) { /* name length, name, ndim, dims, flags: copied; lr scale: dropped */
        size_t namelen = p[0] | (size_t)p[1] << 8, ndim = p[4 + namelen], entry = 12 + namelen + 4 * ndim;
        memcpy(q, p, entry);
        q[entry - 4] &= 1;
        q += entry;
        p += entry + 8;
    }
    memcpy(q, p, NSC * sizeof(ad_real)); /* values */
    q += NSC * sizeof(ad_real);
    p += NSC * sizeof(ad_real);
    if (with_optim) { /* step, seven settings, nesterov, zero_grad: copied; the version 3 settings dropped */
        memcpy(q, p, 72);
        q += 72;
        p += 72 + 28;
    }
    memcpy(q, p, (size_t)(end - p)); /* state buffers, extra bytes */
    q += end - p;
    q += 8;
    reseal(out, (size_t)(q - out));
    return (size_t)(q - out);
}

/* A version 1 file, made from a version 2 one by this test's own writer: no parameter flags, no
   zero_grad, no extra bytes. */
static size_t to_version1(const unsigned char *v2, size_t len, int nparams, int with_optim, unsigned char *out)
{
    const unsigned char *p = v2 + 32, *end = v2 + len - 8;
    unsigned char *q = out;
    int i;
    memcpy(q, v2, 32);
    put_le(q + 8, 1, 4);
    q += 32;
    for (i = 0; i < nparams; i++) { /* name length, name, ndim, dims: copied; flags: dropped */
        size_t namelen = p[0] | (size_t)p[1] << 8, ndim = p[4 + namelen], entry = 8 + namelen + 4 * ndim;
        memcpy(q, p, entry);
        q += entry;
        p += entry + 4;
    }
    if (with_optim) { /* values, step, seven settings, nesterov: copied; zero_grad: dropped */
        size_t upto = (size_t)(end - p) - 8, state = upto - (size_t)NSC * sizeof(ad_real) - 76;
        memcpy(q, p, NSC * sizeof(ad_real) + 68);
        q += NSC * sizeof(ad_real) + 68;
        p += NSC * sizeof(ad_real) + 72;
        memcpy(q, p, 4 + state);
        q += 4 + state;
        p += 4 + state;
    } else {
        memcpy(q, p, NSC * sizeof(ad_real));
        q += NSC * sizeof(ad_real);
        p += NSC * sizeof(ad_real);
    }
    p += 8; /* the extra bytes' length, 0 */
    q += 8;
    reseal(out, (size_t)(q - out));
    return (size_t)(q - out);
}

static void test_version1(void)
{
    ad_params *A = make_store(41), *B = make_store(42), *C = make_store(43);
    ad_optim *OA, *OB;
    ad_optim_desc d;
    unsigned char *a, *v1, *v2, *b;
    size_t la, l1, l2, lb;
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_ADAM;
    d.lr = 0.01;
    d.zero_grad = 1;
    OA = ad_optim_new(A, &d);
    train_random(A, OA, 3, 8);
    a = snapshot(A, OA, &la);
    v1 = (unsigned char *)malloc(la);
    v2 = (unsigned char *)malloc(la);
    d.lr = 0.3;
    OB = ad_optim_new(B, &d);
    l2 = to_version2(a, la, 3, 1, v2);
    TH_CHECK(l2 == la - 3 * 8 - 28, "version 2 size %zu", l2);
    l1 = to_version1(v2, l2, 3, 1, v1);
    TH_CHECK(l1 == l2 - 3 * 4 - 4 - 8, "version 1 size %zu", l1);
    TH_CHECK(ad_checkpoint_load_memory(v1, l1, B, OB) == 0, "version 1 file: %s", th_params_error(B));
    b = snapshot(B, OB, &lb);
    TH_CHECK(la == lb && memcmp(a, b, la) == 0, "version 1 load differs from version 3's");
    TH_CHECK(ad_optim_settings(OB).zero_grad == 1 && ad_optim_steps(OB) == 3,
             "a version 1 file leaves zero_grad to the optimizer (%d), steps %d", ad_optim_settings(OB).zero_grad,
             (int)ad_optim_steps(OB));
    free(a);
    a = snapshot(A, NULL, &la);
    l2 = to_version2(a, la, 3, 0, v2);
    l1 = to_version1(v2, l2, 3, 0, v1);
    TH_CHECK(ad_checkpoint_load_memory(v1, l1, C, NULL) == 0 &&
                 memcmp(ad_params_values(A), ad_params_values(C), NSC * sizeof(ad_real)) == 0,
             "version 1 without optimizer: %s", th_params_error(C));
    free(a);
    free(b);
    free(v1);
    free(v2);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(C);
}

/* Version 2 files: read as before; they hold no groups (the store's stay), no RMSprop or
   Adagrad, no flag but bit 0. */
static void test_version2(void)
{
    ad_params *A = make_store(44), *B = make_store(45), *C = make_store(46);
    ad_optim *OA, *OB;
    ad_optim_desc d;
    unsigned char *a, *v2, *b, *bad;
    size_t la, l2, lb;
    double scale;
    int decay;
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_SGD;
    d.lr = 0.01;
    d.momentum = 0.9;
    d.zero_grad = 1;
    ad_params_set_trainable(A, 2, 0);
    OA = ad_optim_new(A, &d);
    train_random(A, OA, 3, 18);
    a = snapshot(A, OA, &la);
    v2 = (unsigned char *)malloc(la);
    bad = (unsigned char *)malloc(la);
    d.zero_grad = 0;
    d.lr = 0.3;
    OB = ad_optim_new(B, &d);
    ad_params_set_group(B, 1, 3, 0);
    l2 = to_version2(a, la, 3, 1, v2);
    TH_CHECK(ad_checkpoint_load_memory(v2, l2, B, OB) == 0, "version 2 file: %s", th_params_error(B));
    TH_CHECK(ad_params_group(B, 1, &scale, &decay) == 0 && scale == 3 && decay == 0,
             "a version 2 file leaves the store's groups: %g %d", scale, decay);
    ad_params_set_group(B, 1, 1, 1);
    ad_params_set_trainable(B, 2, 0); /* the store's own setting, which loading leaves */
    b = snapshot(B, OB, &lb);
    TH_CHECK(la == lb && memcmp(a, b, la) == 0 && ad_optim_settings(OB).zero_grad == 1 && ad_optim_lr(OB) == 0.01,
             "version 2 load differs from version 3's");
    memcpy(bad, v2, l2);
    put_le(bad + 28, 4, 4);
    reseal(bad, l2);
    TH_CHECK(ad_checkpoint_load_memory(bad, l2, C, NULL) != 0, "optimizer kind 4 in a version 2 file accepted");
    TH_CHECK_PERROR(C, "unknown optimizer kind 4");
    memcpy(bad, v2, l2);
    put_le(bad + 32 + 21, 2, 4);
    reseal(bad, l2);
    TH_CHECK(ad_checkpoint_load_memory(bad, l2, C, NULL) != 0, "flag bit 1 in a version 2 file accepted");
    TH_CHECK_PERROR(C, "parameter 0: malformed flags");
    free(a);
    free(b);
    free(v2);
    free(bad);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_params_free(A);
    ad_params_free(B);
    ad_params_free(C);
}

/* Groups and the RMSprop and Adagrad settings travel with the checkpoint: the file's win over
   the store's and the optimizer's, frozen flags stay the store's, and ad_params_load brings
   the groups back. */
static void test_groups_and_settings(void)
{
    ad_params *A = make_store(81), *B = make_store(82), *L;
    ad_optim_desc d, got;
    ad_optim *OA, *OB, *OC;
    unsigned char *a, *b;
    size_t la, lb;
    double scale;
    int decay, k;
    char path[512], err[512];
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_RMSPROP;
    d.lr = 0.02;
    d.alpha = 0.9;
    d.momentum = 0.5;
    d.centered = 1;
    d.weight_decay = 0.1;
    ad_params_set_group(A, 0, 0.5, 1);
    ad_params_set_group(A, 1, 2, 0);
    ad_params_set_group(A, 2, 0, 0);
    ad_params_set_trainable(B, 1, 0);
    OA = ad_optim_new(A, &d);
    d.alpha = 0.5;
    d.lr = 1;
    OB = ad_optim_new(B, &d);
    train_random(A, OA, 3, 4);
    a = snapshot(A, OA, &la);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, OB) == 0, "load: %s", th_params_error(B));
    got = ad_optim_settings(OB);
    TH_CHECK(got.alpha == 0.9 && got.lr == 0.02 && got.centered == 1 && got.momentum == 0.5,
             "the file's RMSprop settings win: alpha %g lr %g", got.alpha, got.lr);
    TH_CHECK(ad_params_group(B, 1, &scale, &decay) == 0 && scale == 2 && decay == 0, "group 1 restored: %g %d", scale,
             decay);
    TH_CHECK(ad_params_group(B, 2, &scale, &decay) == 0 && scale == 0 && decay == 0, "group 2 restored: %g %d", scale,
             decay);
    ad_params_set_trainable(B, 1, 1);
    b = snapshot(B, OB, &lb);
    TH_CHECK(la == lb && memcmp(a, b, la) == 0, "round trip with groups and RMSprop is bitwise");
    free(b);
    ad_params_set_trainable(B, 1, 0);
    train_random(B, OB, 1, 5);
    TH_CHECK(ad_params_info(B, 1).value[0] == ad_params_info(A, 1).value[0], "the store's frozen flag stayed");
    d.centered = 0;
    OC = ad_optim_new(B, &d);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, OC) != 0, "centered file loaded into an RMSprop without");
    TH_CHECK_PERROR(B, "the file's momentum and centered need 3 state buffers, the optimizer has 2");
    ad_optim_free(OC);
    temp_path(path, sizeof path, "groups");
    TH_CHECK(ad_checkpoint_save(path, A, OA) == 0, "save: %s", th_params_error(A));
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L != NULL, "ad_params_load: %s", err);
    for (k = 0; L && k < 3; k++) {
        double want_scale = k == 0 ? 0.5 : k == 1 ? 2 : 0;
        TH_CHECK(ad_params_group(L, k, &scale, &decay) == 0 && scale == want_scale && decay == (k == 0),
                 "ad_params_load: parameter %d's group %g %d", k, scale, decay);
    }
    ad_params_free(L);
    remove(path);
    /* Adagrad's settings and sums */
    ad_optim_free(OA);
    ad_optim_free(OB);
    memset(&d, 0, sizeof d);
    d.kind = AD_OPTIM_ADAGRAD;
    d.lr_decay = 0.1;
    d.initial_accumulator_value = 0.25;
    OA = ad_optim_new(A, &d);
    d.lr_decay = 0;
    d.initial_accumulator_value = 0;
    OB = ad_optim_new(B, &d);
    train_random(A, OA, 2, 6);
    free(a);
    a = snapshot(A, OA, &la);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, OB) == 0, "Adagrad load: %s", th_params_error(B));
    got = ad_optim_settings(OB);
    TH_CHECK(got.lr_decay == 0.1 && got.initial_accumulator_value == 0.25 && ad_optim_steps(OB) == 2,
             "the file's Adagrad settings win");
    ad_params_set_trainable(B, 1, 1);
    b = snapshot(B, OB, &lb);
    TH_CHECK(la == lb && memcmp(a, b, la) == 0, "Adagrad round trip is bitwise");
    free(a);
    free(b);
    ad_optim_free(OA);
    ad_optim_free(OB);
    ad_params_free(A);
    ad_params_free(B);
}

/* The program's extra bytes travel with the checkpoint and are replaced on every load. */
static void test_extra(void)
{
    ad_params *A = make_store(51), *B = make_store(52);
    const char *text = "epoch 7, batcher state, rng";
    const void *got;
    unsigned char *a, *plain, *big;
    size_t la, lp, n;
    plain = snapshot(A, NULL, &lp);
    TH_CHECK(ad_params_extra(A, &n) == NULL && n == 0, "a new store has no extra bytes");
    TH_CHECK(ad_params_set_extra(A, text, strlen(text) + 1) == 0, "set: %s", th_params_error(A));
    a = snapshot(A, NULL, &la);
    TH_CHECK(la == lp + strlen(text) + 1, "the extra bytes are in the file: %zu vs %zu", la, lp);
    TH_CHECK(ad_checkpoint_load_memory(a, la, B, NULL) == 0, "load: %s", th_params_error(B));
    got = ad_params_extra(B, &n);
    TH_CHECK(got && n == strlen(text) + 1 && strcmp((const char *)got, text) == 0, "extra bytes come back");
    TH_CHECK(ad_checkpoint_load_memory(plain, lp, B, NULL) == 0 && ad_params_extra(B, &n) == NULL && n == 0,
             "a file without extra bytes clears them");
    TH_CHECK(ad_params_set_extra(A, NULL, 0) == 0 && ad_params_extra(A, NULL) == NULL, "removed");
    TH_CHECK(ad_params_set_extra(A, NULL, 3) != 0, "NULL data with a length accepted");
    TH_CHECK_PERROR(A, "ad_params_set_extra: 3 bytes at NULL");
    big = (unsigned char *)calloc(1, (size_t)AD_PARAMS_EXTRA_MAX + 1);
    TH_CHECK(ad_params_set_extra(A, big, (size_t)AD_PARAMS_EXTRA_MAX + 1) != 0, "too many extra bytes accepted");
    TH_CHECK_PERROR(A, "at most AD_PARAMS_EXTRA_MAX");
    TH_CHECK(ad_params_set_extra(A, big, AD_PARAMS_EXTRA_MAX) == 0, "the largest extra: %s", th_params_error(A));
    free(big);
    free(a);
    free(plain);
    ad_params_free(A);
    ad_params_free(B);
}

/* ad_params_load: frozen flags come back; a table that declares more values than the file
   holds is refused before the store grows. */
static void test_params_load_checks(void)
{
    ad_params *A = make_store(61), *L;
    ad_optim *O;
    ad_optim_desc d;
    char path[512], err[512];
    unsigned char head[128];
    size_t n, i;
    ad_real b0;
    ad_params_set_trainable(A, 1, 0);
    temp_path(path, sizeof path, "frozen");
    TH_CHECK(ad_checkpoint_save(path, A, NULL) == 0, "save: %s", th_params_error(A));
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L != NULL, "load: %s", err);
    if (L) {
        memset(&d, 0, sizeof d);
        d.lr = 0.1;
        O = ad_optim_new(L, &d);
        b0 = ad_params_info(L, 1).value[0];
        for (i = 0; i < ad_params_scalars(L); i++) ad_params_grads(L)[i] = 1;
        ad_optim_step(O);
        TH_CHECK(ad_params_info(L, 1).value[0] == b0 && ad_params_info(L, 0).value[0] != ad_params_info(A, 0).value[0],
                 "the frozen flag came back with ad_params_load");
        ad_optim_free(O);
        ad_params_free(L);
    }
    /* a version 1 file of one parameter "w" [65536, 8192] and nothing behind it: 57 bytes */
    memset(head, 0, sizeof head);
    memcpy(head, "\x89" "ADCK\r\n\x1a", 8);
    put_le(head + 8, 1, 4);
    put_le(head + 12, sizeof(ad_real), 4);
    put_le(head + 24, 1, 4);
    put_le(head + 32, 1, 4);
    head[36] = 'w';
    put_le(head + 37, 2, 4);
    put_le(head + 41, 65536, 4);
    put_le(head + 45, 8192, 4);
    n = 57;
    reseal(head, n);
    TH_CHECK(write_file(path, head, n), "write");
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L == NULL && strstr(err, "ad_params_load") && strstr(err, "the table declares 536870912 values"),
             "a 57-byte file declaring 2^29 values: %s", L ? "accepted" : err);
    ad_params_free(L);
    put_le(head + 45, 0, 4); /* [65536, 0] */
    reseal(head, n);
    TH_CHECK(write_file(path, head, n), "write");
    L = ad_params_load(path, err, sizeof err);
    TH_CHECK(L == NULL && strstr(err, "shape [65536,0]: dimensions must be positive"), "a zero dimension: %s",
             L ? "accepted" : err);
    ad_params_free(L);
    remove(path);
    ad_params_free(A);
}

/* Temporary files of killed saves are removed by the next save of the same path, and nothing
   else is. */
static void test_leftovers(void)
{
    ad_params *A = make_store(71), *B = make_store(72);
    const char *names[5] = {".tmp-0123456789abcdef", ".tmp-fedcba9876543210", ".tmp-0123456789ABCDEF",
                            ".tmp-0123456789abcde", ".tmpx"};
    int kept[5] = {0, 0, 1, 1, 1}, k;
    char path[512], other[600], name[600];
    FILE *f;
    temp_path(path, sizeof path, "litter");
    snprintf(other, sizeof other, "%s2.tmp-0123456789abcdef", path);
    for (k = 0; k < 5; k++) {
        snprintf(name, sizeof name, "%s%s", path, names[k]);
        TH_CHECK(write_file(name, (const unsigned char *)"partial", 7), "write %s", name);
    }
    TH_CHECK(write_file(other, (const unsigned char *)"partial", 7), "write %s", other);
    TH_CHECK(ad_checkpoint_save(path, A, NULL) == 0, "save: %s", th_params_error(A));
    for (k = 0; k < 5; k++) {
        snprintf(name, sizeof name, "%s%s", path, names[k]);
        f = fopen(name, "rb");
        TH_CHECK((f != NULL) == kept[k], "%s: %s", names[k], f ? "left behind" : "removed");
        if (f) fclose(f);
        remove(name);
    }
    f = fopen(other, "rb");
    TH_CHECK(f != NULL, "a leftover of another path was removed");
    if (f) fclose(f);
    remove(other);
    TH_CHECK(ad_checkpoint_load(path, B, NULL) == 0, "the saved file loads: %s", th_params_error(B));
    remove(path);
    /* a folder where a file is expected */
    {
        const char *dir = getenv("TMPDIR");
        char err[512];
        ad_params *L;
        TH_CHECK(ad_checkpoint_load(dir && *dir ? dir : "/tmp", B, NULL) != 0, "a folder loaded");
        TH_CHECK_PERROR(B, "is a folder, not a file");
        L = ad_params_load(dir && *dir ? dir : "/tmp", err, sizeof err);
        TH_CHECK(L == NULL && strstr(err, "ad_params_load") && strstr(err, "is a folder, not a file"), "ad_params_load of a folder: %s", err);
        ad_params_free(L);
    }
    ad_params_free(A);
    ad_params_free(B);
}

int main(void)
{
#ifdef AUTODIFF_DOUBLE
    (void)th_gradcheck; /* harness helpers this program does not use */
    (void)th_gradgradcheck;
    (void)th_in;
#endif
    test_round_trip();
    test_resume();
    test_truncated();
    test_flipped_bytes();
    test_foreign();
    test_malformed();
    test_mismatch();
    test_files();
    test_random_edits();
    test_params_load();
    test_frozen();
    test_settings_restored();
    test_version1();
    test_version2();
    test_groups_and_settings();
    test_extra();
    test_params_load_checks();
    test_leftovers();
    return th_summary();
}
