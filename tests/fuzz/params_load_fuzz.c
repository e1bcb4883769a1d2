/* Fuzz target for the checkpoint file loaders: arbitrary bytes written to a temporary file, then
   ad_params_load (a new store from the file) and ad_checkpoint_load (into a fixed store).

   Input: the file itself. When its length field or checksum does not match (a mutated file), it
   is also run resealed (the true length and checksum written into it), so that mutations reach
   the structure behind the checksum instead of all failing there.
   Besides "never crash", the target checks the loaders' promises and aborts when one is broken:
   ad_params_load returns NULL with a message, or a store that ad_checkpoint_save_memory saves
   back to the same bytes (a file of the version this build writes; with its optimizer section
   loaded into an optimizer of its kind when it has one); ad_checkpoint_load into the fixed store
   ("w" [2,3], "b" [3], a scalar "s"; with an optimizer of the kind the file names, and without
   one) leaves a refused store and optimizer bit for bit as they were, and an accepted file is
   one that ad_params_load accepts too, with the same values and optimizer settings; nothing is
   left allocated. autodiff.h allocates through a counting allocator (fuzz_common.h) that aborts
   on one block above 64 MiB + 64 bytes per input byte, or on twice that live at once: nothing a
   file declares may be allocated before it is checked against the bytes that back it.

   libFuzzer (tests/fuzz/run_libfuzzer.sh does this with the committed corpus):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DPARAMS_LOAD_FUZZ_NO_MAIN \
           -I. tests/fuzz/params_load_fuzz.c -o build/fuzz/params_load_fuzz -lm -lpthread
       build/fuzz/params_load_fuzz -rss_limit_mb=2048 CORPUS_DIR
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/params_load_fuzz.c -o build/params_load_fuzz \
           -lm -lpthread
       build/params_load_fuzz FILE...             runs each file once
       build/params_load_fuzz                     runs a built-in corpus (checkpoints of several stores
                                                  and seeded mutations of them), then every file in
                                                  tests/fuzz/corpus/params_load_fuzz (or FUZZ_CORPUS_DIR)
       build/params_load_fuzz --write-seeds DIR   writes the valid checkpoints into DIR
       build/params_load_fuzz --write-corpus DIR  writes the hand-made part of the committed corpus:
                                                  valid checkpoints, hostile ones and damaged copies
   Temporary files go to $TMPDIR (default /tmp) and are removed after each input (an input that
   crashes the target leaves its file behind). */
#include "fuzz_common.h"

#define AUTODIFF_MALLOC(sz) fuzz_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) fuzz_realloc(p, sz)
#define AUTODIFF_FREE(p) fuzz_free(p)
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long params_fuzz_loaded;   /* files ad_params_load accepted */
static long params_fuzz_restored; /* loads into the fixed store that succeeded */

#define PARAMS_FUZZ_HEADER 32 /* the checkpoint header, as >>impl:checkpoint describes it */

static uint64_t pf_get_le(const unsigned char *p, int bytes)
{
    uint64_t x = 0;
    int i;
    for (i = bytes - 1; i >= 0; i--) x = x << 8 | p[i];
    return x;
}

static void pf_put_le(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(x >> (8 * i));
}

/* FNV-1a 64, the checkpoint's checksum. */
static uint64_t pf_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int pf_sealed(const unsigned char *p, size_t n)
{
    return n >= 40 && pf_get_le(p + 16, 8) == n && pf_get_le(p + n - 8, 8) == pf_hash(p, n - 8);
}

static void pf_seal(unsigned char *p, size_t n)
{
    pf_put_le(p + 16, n, 8);
    pf_put_le(p + n - 8, pf_hash(p, n - 8), 8);
}

/* The optimizer field of the header (0 none, 1 SGD, 2 Adam, 3 AdamW, 4 RMSprop, 5 Adagrad), or 0
   when too short. */
static unsigned pf_optim_field(const unsigned char *p, size_t n)
{
    return n >= PARAMS_FUZZ_HEADER ? (unsigned)pf_get_le(p + 28, 4) : 0;
}

/* The store every file is also loaded into: "w" [2,3], "b" [3] and a scalar "s". */
static ad_params *pf_store(void)
{
    static const int sw[2] = {2, 3}, sb[1] = {3};
    ad_params *P = ad_params_new(1);
    ad_init init;
    memset(&init, 0, sizeof init);
    init.kind = AD_INIT_NORMAL;
    ad_params_add(P, "w", 2, sw, &init);
    ad_params_add(P, "b", 1, sb, &init);
    ad_params_add(P, "s", 0, NULL, &init);
    return P;
}

/* The settings of an optimizer of the kind a checkpoint's optimizer field names; variant 0 has
   every state buffer the kind may have (SGD and RMSprop with momentum, RMSprop centered), the
   others fewer: SGD 1 variant more, RMSprop 3. Returns 0 when there is no such variant. */
static int pf_desc(unsigned field, int variant, ad_optim_desc *d)
{
    static const ad_optim_kind kinds[5] = {AD_OPTIM_SGD, AD_OPTIM_ADAM, AD_OPTIM_ADAMW, AD_OPTIM_RMSPROP,
                                           AD_OPTIM_ADAGRAD};
    int variants = field == 1 ? 2 : field == 4 ? 4 : 1;
    if (field < 1 || field > 5 || variant >= variants) return 0;
    memset(d, 0, sizeof *d);
    d->kind = kinds[field - 1];
    d->momentum = (field == 1 || field == 4) && !(variant & 1) ? 0.9 : 0;
    d->centered = field == 4 && !(variant & 2);
    return 1;
}

/* An optimizer of the kind a checkpoint's optimizer field names (variant 0), or NULL. */
static ad_optim *pf_optim(ad_params *P, unsigned field)
{
    ad_optim_desc d;
    return pf_desc(field, 0, &d) ? ad_optim_new(P, &d) : NULL;
}

/* The store (and optimizer) as checkpoint bytes, in a malloc'd block. */
static unsigned char *pf_snapshot(ad_params *P, ad_optim *O, size_t *len, const char *what)
{
    unsigned char *buf;
    *len = ad_checkpoint_size(P, O);
    buf = (unsigned char *)malloc(*len ? *len : 1);
    if (!buf) abort();
    if (ad_checkpoint_save_memory(buf, *len, P, O) != 0)
        fuzz_fail("%s: ad_checkpoint_save_memory of a %zu-byte checkpoint failed: %s", what, *len,
                  ad_params_error(P) ? ad_params_error(P) : "(no message)");
    return buf;
}

/* The format version this build writes (read from a checkpoint of an empty store). */
static uint32_t pf_version(void)
{
    static uint32_t version;
    if (!version) {
        ad_params *P = ad_params_new(0);
        size_t n;
        unsigned char *b = pf_snapshot(P, NULL, &n, "empty store");
        version = (uint32_t)pf_get_le(b + 8, 4);
        free(b);
        ad_params_free(P);
    }
    return version;
}

/* Whether a file is of the version this build writes: only those can save back to the same bytes. */
static int pf_current(const unsigned char *p, size_t n)
{
    return n >= PARAMS_FUZZ_HEADER && pf_get_le(p + 8, 4) == pf_version();
}

/* The file in a new temporary file; its path goes into path. */
static void pf_temp_file(const unsigned char *p, size_t n, char *path, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    int fd;
    size_t done = 0;
    snprintf(path, cap, "%s/params_load_fuzz-XXXXXX", dir && *dir ? dir : "/tmp");
    fd = mkstemp(path);
    if (fd < 0) fuzz_fail("cannot create a temporary file %s", path);
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w <= 0) fuzz_fail("cannot write the temporary file %s", path);
        done += (size_t)w;
    }
    if (close(fd) != 0) fuzz_fail("cannot write the temporary file %s", path);
}

/* The caps on what a load of an n-byte file may allocate. */
static void pf_caps(size_t n)
{
    size_t block = ((size_t)64 << 20) + 64 * n;
    fuzz_alloc_caps(n, block, 2 * block);
}

/* What ad_params_load made of the file: the store, and with it an optimizer of the file's kind
   loaded by ad_checkpoint_load, when the file has an optimizer section (else NULL). */
typedef struct pf_loaded {
    ad_params *P;
    ad_optim *O;
} pf_loaded;

/* ad_params_load: NULL with a message, or a store that saves back to the file's bytes (with the
   file's optimizer loaded into an optimizer of its kind, when it has one). */
static pf_loaded pf_params_load(const char *path, const unsigned char *file, size_t n)
{
    char err[512];
    pf_loaded r;
    unsigned field = pf_optim_field(file, n);
    size_t sn;
    unsigned char *saved;
    r.P = NULL;
    r.O = NULL;
    memset(err, 0, sizeof err);
    pf_caps(n);
    r.P = ad_params_load(path, err, sizeof err);
    if (!r.P) {
        fuzz_alloc_nocaps();
        if (!err[0]) fuzz_fail("ad_params_load refused a %zu-byte file without a message", n);
        return r;
    }
    fuzz_alloc_nocaps();
    params_fuzz_loaded++;
    if (ad_params_error(r.P)) fuzz_fail("ad_params_load returned a store with an error: %s", ad_params_error(r.P));
    if (field != 0) { /* the optimizer section, into an optimizer of the file's kind */
        int tries;
        ad_optim_desc d;
        for (tries = 0; !r.O && pf_desc(field, tries, &d); tries++) { /* each number of state buffers */
            r.O = ad_optim_new(r.P, &d);
            if (!r.O) break;
            pf_caps(n);
            if (ad_checkpoint_load(path, r.P, r.O) != 0) {
                ad_optim_free(r.O);
                r.O = NULL;
            }
            fuzz_alloc_nocaps();
            ad_params_clear_error(r.P);
        }
        if (!r.O && field <= 5 && ad_params_count(r.P) > 0)
            fuzz_fail("ad_params_load accepted a %zu-byte file with an optimizer section (kind %u), but "
                      "ad_checkpoint_load into that store refuses it with every optimizer of the kind", n, field);
    }
    saved = pf_snapshot(r.P, r.O, &sn, "the store of ad_params_load");
    if (pf_current(file, n) && (field == 0 || r.O) && (sn != n || memcmp(saved, file, n) != 0))
        fuzz_fail("ad_params_load accepted a %zu-byte file whose store saves back %zu other bytes", n, sn);
    free(saved);
    return r;
}

/* Bit for bit: fields an optimizer does not use may hold anything, NaN included. */
static int pf_same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ad_checkpoint_load of the file into the fixed store F, with optimizer O (may be NULL): a
   refusal leaves both as they were; an acceptance gives what ad_params_load gave (ref). */
static void pf_load_fixed(const char *path, size_t n, ad_params *F, ad_optim *O, const pf_loaded *ref)
{
    unsigned char *before, *after;
    size_t lb, la;
    before = pf_snapshot(F, O, &lb, "fixed store");
    pf_caps(n);
    if (ad_checkpoint_load(path, F, O) == 0) {
        fuzz_alloc_nocaps();
        params_fuzz_restored++;
        if (!ref->P) fuzz_fail("ad_checkpoint_load accepted a %zu-byte file that ad_params_load refuses", n);
        if (ad_params_scalars(F) != ad_params_scalars(ref->P) ||
            memcmp(ad_params_values(F), ad_params_values(ref->P), ad_params_scalars(F) * sizeof(ad_real)) != 0)
            fuzz_fail("ad_checkpoint_load and ad_params_load read other values from the same %zu-byte file", n);
        if (O && ref->O) {
            ad_optim_desc a = ad_optim_settings(O), b = ad_optim_settings(ref->O);
            if (ad_optim_steps(O) != ad_optim_steps(ref->O) || a.kind != b.kind || a.nesterov != b.nesterov ||
                !pf_same_double(a.lr, b.lr) || !pf_same_double(a.momentum, b.momentum) ||
                !pf_same_double(a.dampening, b.dampening) || !pf_same_double(a.weight_decay, b.weight_decay) ||
                !pf_same_double(a.beta1, b.beta1) || !pf_same_double(a.beta2, b.beta2) ||
                !pf_same_double(a.eps, b.eps) || !pf_same_double(a.alpha, b.alpha) || a.centered != b.centered ||
                !pf_same_double(a.lr_decay, b.lr_decay) ||
                !pf_same_double(a.initial_accumulator_value, b.initial_accumulator_value))
                fuzz_fail("ad_checkpoint_load into two stores read other optimizer settings from one %zu-byte file",
                          n);
        }
    } else {
        fuzz_alloc_nocaps();
        if (!ad_params_error(F)) fuzz_fail("ad_checkpoint_load refused a %zu-byte file without a message", n);
        ad_params_clear_error(F);
        after = pf_snapshot(F, O, &la, "fixed store");
        if (la != lb || memcmp(after, before, la) != 0)
            fuzz_fail("ad_checkpoint_load (%s optimizer) refused a %zu-byte file but changed the store",
                      O ? "with an" : "without an", n);
        free(after);
    }
    free(before);
}

static void pf_run(const unsigned char *file, size_t n)
{
    char path[1024];
    pf_loaded ref;
    ad_params *F;
    ad_optim *O;
    size_t live = fuzz_alloc_caps(n, (size_t)-1, (size_t)-1);
    pf_temp_file(file, n, path, sizeof path);
    ref = pf_params_load(path, file, n);
    F = pf_store();
    O = pf_optim(F, pf_optim_field(file, n));
    if (O) pf_load_fixed(path, n, F, O, &ref);
    pf_load_fixed(path, n, F, NULL, &ref);
    ad_optim_free(O);
    ad_params_free(F);
    ad_optim_free(ref.O);
    ad_params_free(ref.P);
    fuzz_alloc_leaked(live, "ad_params_load and ad_checkpoint_load"); /* a load may replace what a store holds */
    if (remove(path) != 0) fuzz_fail("cannot remove the temporary file %s", path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *file = (unsigned char *)malloc(size ? size : 1);
    if (!file) return 0;
    memcpy(file, data, size);
    pf_run(file, size);
    if (size >= 40 && !pf_sealed(file, size)) {
        pf_seal(file, size);
        pf_run(file, size);
    }
    free(file);
    return 0;
}

#ifndef PARAMS_LOAD_FUZZ_NO_MAIN
/* A checkpoint in a malloc'd block. */
typedef struct pf_bytes {
    unsigned char *p;
    size_t n;
} pf_bytes;

static pf_bytes pf_checkpoint(ad_params *P, ad_optim *O)
{
    pf_bytes b;
    size_t i;
    for (i = 0; O && i < ad_params_scalars(P); i++) ad_params_grads(P)[i] = (ad_real)(0.1 * (double)i - 0.3);
    if (O) ad_optim_step(O);
    b.p = pf_snapshot(P, O, &b.n, "seed");
    ad_optim_free(O);
    ad_params_free(P);
    return b;
}

/* A store of many shapes: a convolution, eight dimensions, a name of the longest length. */
static ad_params *pf_store_wide(void)
{
    static const int conv[4] = {4, 3, 3, 3}, bias[1] = {4}, eight[8] = {2, 1, 2, 1, 1, 2, 1, 2}, row[2] = {1, 7};
    char name[AD_PARAM_NAME_MAX + 1];
    ad_params *P = ad_params_new(7);
    ad_init init;
    memset(&init, 0, sizeof init);
    init.kind = AD_INIT_UNIFORM;
    init.a = -1, init.b = 1;
    ad_params_add(P, "conv1.weight", 4, conv, &init);
    ad_params_add(P, "conv1.bias", 1, bias, &init);
    ad_params_add(P, "eight.dims", 8, eight, &init);
    memset(name, 'n', AD_PARAM_NAME_MAX);
    name[AD_PARAM_NAME_MAX] = 0;
    ad_params_add(P, name, 2, row, &init);
    ad_params_add(P, "scalar", 0, NULL, &init);
    return P;
}

#define PF_SEEDS 10

static const char *const pf_seed_names[PF_SEEDS] = {"fixed_store", "fixed_store_sgd_momentum", "fixed_store_adam",
                                                    "fixed_store_adamw", "wide_store", "wide_store_adam",
                                                    "empty_store", "fixed_store_rmsprop_groups",
                                                    "fixed_store_adagrad", "wide_store_groups"};

static void pf_make_seeds(pf_bytes *s)
{
    ad_params *P;
    s[0] = pf_checkpoint(pf_store(), NULL);
    P = pf_store();
    s[1] = pf_checkpoint(P, pf_optim(P, 1));
    P = pf_store();
    s[2] = pf_checkpoint(P, pf_optim(P, 2));
    P = pf_store();
    s[3] = pf_checkpoint(P, pf_optim(P, 3));
    s[4] = pf_checkpoint(pf_store_wide(), NULL);
    P = pf_store_wide();
    s[5] = pf_checkpoint(P, pf_optim(P, 2));
    s[6] = pf_checkpoint(ad_params_new(0), NULL);
    P = pf_store();
    ad_params_set_group(P, 0, 0.25, 1);
    ad_params_set_group(P, 1, 1, 0);
    s[7] = pf_checkpoint(P, pf_optim(P, 4));
    P = pf_store();
    s[8] = pf_checkpoint(P, pf_optim(P, 5));
    P = pf_store_wide();
    ad_params_set_group(P, 1, 2, 0);
    ad_params_set_trainable(P, 4, 0);
    s[9] = pf_checkpoint(P, NULL);
}

/* A checkpoint that declares nparams parameters ("w", or "p000", "p001", ... when several) of
   one shape, with count in the header's parameter field and no values behind them, resealed so
   that it passes the length and checksum checks. Version 1 is the layout of >>impl:checkpoint
   without flags (57 bytes for one 2-D "w"); version 2 adds each parameter's flags and the length
   of the extra bytes; version 3 each parameter's lr scale (here 0.0, all zero bytes). */
static pf_bytes pf_shapes_only(uint32_t version, uint32_t count, int nparams, int ndim, const uint32_t *dims)
{
    static const unsigned char magic[8] = {0x89, 'A', 'D', 'C', 'K', '\r', '\n', 0x1a};
    size_t namelen = nparams == 1 ? 1 : 4, at;
    size_t entry = 4 + namelen + 4 + 4 * (size_t)ndim + (version >= 2 ? 4 : 0) + (version >= 3 ? 8 : 0);
    pf_bytes b;
    int i, d;
    b.n = PARAMS_FUZZ_HEADER + (size_t)nparams * entry + (version >= 2 ? 8 : 0) + 8;
    b.p = (unsigned char *)calloc(b.n, 1);
    if (!b.p) abort();
    memcpy(b.p, magic, 8);
    pf_put_le(b.p + 8, version, 4);
    pf_put_le(b.p + 12, sizeof(ad_real), 4); /* element type */
    pf_put_le(b.p + 24, count, 4);           /* parameters */
    pf_put_le(b.p + 28, 0, 4);               /* no optimizer */
    for (i = 0, at = PARAMS_FUZZ_HEADER; i < nparams; i++, at += entry) {
        char name[8];
        snprintf(name, sizeof name, nparams == 1 ? "w" : "p%03d", i);
        pf_put_le(b.p + at, namelen, 4);
        memcpy(b.p + at + 4, name, namelen);
        pf_put_le(b.p + at + 4 + namelen, (uint32_t)ndim, 4);
        for (d = 0; d < ndim; d++) pf_put_le(b.p + at + 8 + namelen + 4 * (size_t)d, dims[d], 4);
    }
    pf_seal(b.p, b.n);
    return b;
}

/* One to three random edits: a byte changed, a u32 field overwritten with a small or huge
   number, the end cut off, or bytes appended. Returns an exact-size copy. */
static unsigned char *pf_mutate(const pf_bytes *seed, ad_rng *r, size_t *len)
{
    unsigned char *m = (unsigned char *)malloc(seed->n + 64);
    size_t size = seed->n;
    int edits = 1 + (int)ad_rng_below(r, 3);
    if (!m) abort();
    memcpy(m, seed->p, seed->n);
    while (edits-- > 0 && size > 8) {
        size_t at = (size_t)ad_rng_below(r, size - 4);
        switch (ad_rng_below(r, 4)) {
        case 0: m[at] ^= (unsigned char)(1 + ad_rng_below(r, 255)); break;
        case 1: { /* two statements: a fixed order of draws */
            uint64_t x = ad_rng_next(r);
            pf_put_le(m + at, x >> ad_rng_below(r, 64), 4);
            break;
        }
        case 2: size = (size_t)ad_rng_below(r, size); break;
        default: {
            size_t extra = (size_t)ad_rng_below(r, 64);
            if (size + extra > seed->n + 64) break;
            memset(m + size, (int)ad_rng_below(r, 256), extra);
            size += extra;
        }
        }
    }
    {
        unsigned char *exact = (unsigned char *)malloc(size ? size : 1);
        if (!exact) abort();
        memcpy(exact, m, size);
        free(m);
        *len = size;
        return exact;
    }
}

static long pf_builtin(int per_seed)
{
    pf_bytes s[PF_SEEDS];
    long runs = 0;
    ad_rng r;
    int i, k;
    pf_make_seeds(s);
    ad_rng_seed(&r, 99);
    for (i = 0; i < PF_SEEDS; i++) {
        char label[128];
        snprintf(label, sizeof label, "built-in seed %s", pf_seed_names[i]);
        fuzz_run_one(LLVMFuzzerTestOneInput, s[i].p, s[i].n, label), runs++;
        for (k = 0; k < per_seed; k++, runs++) {
            size_t len;
            unsigned char *m = pf_mutate(&s[i], &r, &len);
            snprintf(label, sizeof label, "built-in mutation %d of seed %s", k, pf_seed_names[i]);
            fuzz_run_one(LLVMFuzzerTestOneInput, m, len, label);
            free(m);
        }
    }
    for (i = 0; i < PF_SEEDS; i++) free(s[i].p);
    return runs;
}

static int pf_write_corpus(const char *dir, int all)
{
    static const uint32_t huge[2] = {65536, 8192}, huger[2] = {65536, 65536};
    static const uint32_t eight[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    static const uint32_t mega[2] = {1024, 1024}, zero[2] = {3, 0}, sign[1] = {0x80000000u};
    pf_bytes s[PF_SEEDS];
    char name[128];
    int i, bad = 0;
    ad_rng r;
    pf_make_seeds(s);
    for (i = 0; i < PF_SEEDS; i++) {
        snprintf(name, sizeof name, "ok_%s", pf_seed_names[i]);
        bad |= fuzz_write_file(dir, name, s[i].p, s[i].n);
    }
    if (all) {
        struct {
            const char *name;
            pf_bytes b;
        } h[12];
        int nh = 0, j;
        h[nh].name = "bad_v1_shape_65536x8192_no_values", h[nh++].b = pf_shapes_only(1, 1, 1, 2, huge);
        h[nh].name = "bad_v2_shape_65536x8192_no_values", h[nh++].b = pf_shapes_only(2, 1, 1, 2, huge);
        h[nh].name = "bad_v1_shape_65536x65536_no_values", h[nh++].b = pf_shapes_only(1, 1, 1, 2, huger);
        h[nh].name = "bad_v2_shape_8x64_no_values", h[nh++].b = pf_shapes_only(2, 1, 1, 8, eight);
        h[nh].name = "bad_v1_200_params_1024x1024_no_values", h[nh++].b = pf_shapes_only(1, 200, 200, 2, mega);
        h[nh].name = "bad_v2_200_params_1024x1024_no_values", h[nh++].b = pf_shapes_only(2, 200, 200, 2, mega);
        h[nh].name = "bad_v1_count_16M_one_entry", h[nh++].b = pf_shapes_only(1, 1u << 24, 1, 2, huge);
        h[nh].name = "bad_v1_shape_zero_dim", h[nh++].b = pf_shapes_only(1, 1, 1, 2, zero);
        h[nh].name = "bad_v1_shape_dim_2pow31", h[nh++].b = pf_shapes_only(1, 1, 1, 1, sign);
        h[nh].name = "bad_v3_shape_65536x8192_no_values", h[nh++].b = pf_shapes_only(3, 1, 1, 2, huge);
        h[nh].name = "bad_v3_200_params_1024x1024_no_values", h[nh++].b = pf_shapes_only(3, 200, 200, 2, mega);
        for (j = 0; j < nh; j++) {
            bad |= fuzz_write_file(dir, h[j].name, h[j].b.p, h[j].b.n);
            free(h[j].b.p);
        }
        ad_rng_seed(&r, 5);
        for (i = 0; i < PF_SEEDS; i += 2) { /* cut (not resealed), and bit-flipped (resealed) */
            unsigned char *c = (unsigned char *)malloc(s[i].n);
            int f;
            if (!c) abort();
            snprintf(name, sizeof name, "cut_%s", pf_seed_names[i]);
            bad |= fuzz_write_file(dir, name, s[i].p, s[i].n * 2 / 3);
            memcpy(c, s[i].p, s[i].n);
            for (f = 0; f < 2; f++) {
                size_t at = PARAMS_FUZZ_HEADER + (size_t)ad_rng_below(&r, s[i].n - 40);
                c[at] ^= (unsigned char)(1u << ad_rng_below(&r, 8));
            }
            pf_seal(c, s[i].n);
            snprintf(name, sizeof name, "flip_%s", pf_seed_names[i]);
            bad |= fuzz_write_file(dir, name, c, s[i].n);
            free(c);
        }
    }
    for (i = 0; i < PF_SEEDS; i++) free(s[i].p);
    return bad;
}

int main(int argc, char **argv)
{
    long runs, files;
    int i;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return pf_write_corpus(argv[2], 0);
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return pf_write_corpus(argv[2], 1);
    if (argc > 1) {
        for (i = 1; i < argc; i++) {
            size_t len;
            unsigned char *data = fuzz_read_file(argv[i], &len);
            if (!data) {
                fprintf(stderr, "params_load_fuzz: cannot read %s\n", argv[i]);
                return 1;
            }
            fuzz_run_one(LLVMFuzzerTestOneInput, data, len, argv[i]);
            free(data);
        }
        printf("params_load_fuzz: %d files, %ld loaded by ad_params_load, %ld into the fixed store\n", argc - 1,
               params_fuzz_loaded, params_fuzz_restored);
        return 0;
    }
    runs = pf_builtin(getenv("TH_QUICK") ? 60 : 400);
    files = fuzz_run_corpus("params_load_fuzz", LLVMFuzzerTestOneInput);
    if (files < 0) return 1;
    printf("params_load_fuzz: %ld built-in inputs and %ld corpus files, %ld loaded by ad_params_load, %ld into the "
           "fixed store, no crash\n", runs, files, params_fuzz_loaded, params_fuzz_restored);
    return 0;
}
#endif
