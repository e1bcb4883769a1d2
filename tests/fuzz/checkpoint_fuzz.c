/* Fuzz target for the checkpoint loader: arbitrary bytes into ad_checkpoint_load_memory.

   Input: one mode byte, then the file. Mode bits 0-1, with bit 3 above them, pick the optimizer
   loaded alongside the store (0 none, 1 Adam, 2 SGD with momentum, 3 AdamW, 4 centered RMSprop
   with momentum, 5 Adagrad, 6 RMSprop, 7 SGD); bit 2 reseals the file first (writes the true
   length and checksum into it), so that mutations reach the structure behind the checksum
   instead of all failing there. Besides "never crash", the target checks the loader's
   promises and aborts when one is broken: a refused file leaves the store and optimizer bit for
   bit as they were, and an accepted one, saved again with the optimizer, gives back the same
   bytes (for a file of the version this build writes, with the parameters' frozen flags, which
   stay the store's own, as the store has them).

   libFuzzer (tests/fuzz/run_libfuzzer.sh does this with the committed corpus):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DCHECKPOINT_FUZZ_NO_MAIN -I. \
           tests/fuzz/checkpoint_fuzz.c -o build/fuzz/checkpoint_fuzz -lm -lpthread
       build/fuzz/checkpoint_fuzz -rss_limit_mb=2048 CORPUS_DIR
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/checkpoint_fuzz.c -o build/ckpt_fuzz_run -lm -lpthread
       build/ckpt_fuzz_run FILE...             runs each file once
       build/ckpt_fuzz_run                     runs a built-in corpus (valid checkpoints and seeded
                                               mutations of them), then every file in
                                               tests/fuzz/corpus/checkpoint_fuzz (or FUZZ_CORPUS_DIR)
       build/ckpt_fuzz_run --write-seeds DIR   writes the valid inputs into DIR (a libFuzzer corpus)
       build/ckpt_fuzz_run --write-corpus DIR  writes the hand-made part of the committed corpus:
                                               valid inputs, hostile ones and damaged copies */
#include "fuzz_common.h"

#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long ckpt_fuzz_accepted; /* inputs that loaded, for the standalone summary */

/* The store every input is loaded into: "w" [2,3], "b" [3] and a scalar "s". */
static ad_params *fuzz_store(void)
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

/* The optimizer of a mode byte: see the top of this file. */
static int fuzz_which(int mode) { return (mode & 3) | (mode >> 1 & 4); }

static ad_optim *fuzz_optim(ad_params *P, int which)
{
    static const ad_optim_kind kinds[8] = {AD_OPTIM_SGD, AD_OPTIM_ADAM, AD_OPTIM_SGD, AD_OPTIM_ADAMW,
                                           AD_OPTIM_RMSPROP, AD_OPTIM_ADAGRAD, AD_OPTIM_RMSPROP, AD_OPTIM_SGD};
    ad_optim_desc d;
    if (which == 0) return NULL;
    memset(&d, 0, sizeof d);
    d.kind = kinds[which & 7];
    d.momentum = which == 2 || which == 4 ? 0.9 : 0;
    d.centered = which == 4;
    d.initial_accumulator_value = which == 5 ? 0.1 : 0;
    return ad_optim_new(P, &d);
}

static uint64_t fuzz_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void fuzz_put_le(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(x >> (8 * i));
}

/* A copy of an accepted file (n bytes) with each parameter's frozen flag (bit 0) cleared, as the
   fuzz store has it (loading leaves it the store's own), and its checksum updated. NULL when
   the file is not of version 3, whose table layout (>>impl:checkpoint) this walks: u32 name
   length, the name, u32 ndim, the dimensions, u32 flags, f64 lr scale. */
static unsigned char *fuzz_clear_flags(const unsigned char *file, size_t n)
{
    unsigned char *c;
    size_t at = 32, count, i;
    if (n < 40 || file[8] != 3 || file[9] || file[10] || file[11]) return NULL;
    c = (unsigned char *)malloc(n);
    if (!c) abort();
    memcpy(c, file, n);
    count = (size_t)c[24] | (size_t)c[25] << 8 | (size_t)c[26] << 16 | (size_t)c[27] << 24;
    for (i = 0; i < count; i++) {
        size_t len, ndim;
        if (at + 4 > n) break;
        len = (size_t)c[at] | (size_t)c[at + 1] << 8 | (size_t)c[at + 2] << 16 | (size_t)c[at + 3] << 24;
        at += 4 + len;
        if (at + 4 > n) break;
        ndim = (size_t)c[at] | (size_t)c[at + 1] << 8 | (size_t)c[at + 2] << 16 | (size_t)c[at + 3] << 24;
        at += 4 + 4 * ndim;
        if (at + 4 > n) break;
        c[at] &= (unsigned char)~1u;
        at += 12;
    }
    fuzz_put_le(c + n - 8, fuzz_hash(c, n - 8), 8);
    return c;
}

/* The store and optimizer as checkpoint bytes (malloc'd). */
static unsigned char *fuzz_snapshot(ad_params *P, ad_optim *O, size_t *len)
{
    unsigned char *buf;
    *len = ad_checkpoint_size(P, O);
    buf = (unsigned char *)malloc(*len);
    if (!buf) abort();
    if (ad_checkpoint_save_memory(buf, *len, P, O) != 0)
        fuzz_fail("ad_checkpoint_save_memory failed: %s", ad_params_error(P) ? ad_params_error(P) : "(no message)");
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ad_params *P;
    ad_optim *O;
    unsigned char *file, *before, *after;
    size_t n, lb, la;
    int mode;
    if (size == 0) return 0;
    mode = data[0];
    n = size - 1;
    file = (unsigned char *)malloc(n ? n : 1); /* its own block, so that overreads are caught */
    if (!file) return 0;
    memcpy(file, data + 1, n);
    if ((mode & 4) && n >= 40) {
        fuzz_put_le(file + 16, n, 8);
        fuzz_put_le(file + n - 8, fuzz_hash(file, n - 8), 8);
    }
    P = fuzz_store();
    O = fuzz_optim(P, fuzz_which(mode));
    before = fuzz_snapshot(P, O, &lb);
    if (ad_checkpoint_load_memory(file, n, P, O) == 0) {
        ckpt_fuzz_accepted++;
        after = fuzz_snapshot(P, O, &la);
        if (O && n >= 12 && memcmp(file + 8, before + 8, 4) == 0) { /* a file of the version written here */
            unsigned char *expect = fuzz_clear_flags(file, n);
            if (expect && (la != n || memcmp(after, expect, n) != 0))
                fuzz_fail("ad_checkpoint_load_memory accepted a %zu-byte file but saves back %zu other bytes", n, la);
            free(expect);
        }
    } else {
        if (!ad_params_error(P)) fuzz_fail("ad_checkpoint_load_memory refused a %zu-byte file without a message", n);
        after = fuzz_snapshot(P, O, &la);
        if (la != lb || memcmp(after, before, la) != 0)
            fuzz_fail("ad_checkpoint_load_memory refused a %zu-byte file (%s) but changed the store", n,
                      ad_params_error(P));
    }
    free(before);
    free(after);
    free(file);
    ad_optim_free(O);
    ad_params_free(P);
    return 0;
}

#ifndef CHECKPOINT_FUZZ_NO_MAIN
/* A valid input: the mode byte, then a checkpoint of the fuzz store (trained a little, so that
   values and optimizer state are not zero) with optimizer `which`; with an optimizer, "b" is in
   a group of its own (lr scale 0.5, no weight decay). */
static unsigned char *fuzz_seed(int which, int mode, size_t *size)
{
    ad_params *P = fuzz_store();
    ad_optim *O = fuzz_optim(P, which);
    if (O) ad_params_set_group(P, 1, 0.5, 0);
    unsigned char *ckpt, *seed;
    size_t len, i;
    for (i = 0; O && i < ad_params_scalars(P); i++) ad_params_grads(P)[i] = (ad_real)(0.1 * (double)i - 0.3);
    if (O) ad_optim_step(O);
    ckpt = fuzz_snapshot(P, O, &len);
    seed = (unsigned char *)malloc(len + 1);
    if (!seed) abort();
    seed[0] = (unsigned char)mode;
    memcpy(seed + 1, ckpt, len);
    *size = len + 1;
    free(ckpt);
    ad_optim_free(O);
    ad_params_free(P);
    return seed;
}

/* Runs the seeds and `count` mutations of each: bytes flipped, u32 fields overwritten, cut
   short or extended; half of them with the reseal bit set. */
static long fuzz_builtin(int count)
{
    static const int modes[9] = {0, 1, 2, 3, 5, 6, 8, 9, 14};
    unsigned char *m = NULL;
    long runs = 0;
    ad_rng r;
    int s, k;
    ad_rng_seed(&r, 12345);
    for (s = 0; s < 9; s++) {
        size_t size, msize, at;
        unsigned char *seed = fuzz_seed(fuzz_which(modes[s]), modes[s], &size);
        char label[96];
        snprintf(label, sizeof label, "built-in seed with mode %d", modes[s]);
        fuzz_run_one(LLVMFuzzerTestOneInput, seed, size, label);
        runs++;
        m = (unsigned char *)realloc(m, size + 64);
        if (!m) abort();
        for (k = 0; k < count; k++, runs++) {
            int edits = 1 + (int)ad_rng_below(&r, 3);
            memcpy(m, seed, size);
            msize = size;
            m[0] = (unsigned char)(modes[s] | (ad_rng_below(&r, 2) ? 4 : 0));
            while (edits-- > 0) {
                at = 1 + ad_rng_below(&r, size - 5);
                switch (ad_rng_below(&r, 4)) {
                case 0: /* one byte */
                    m[at] ^= (unsigned char)(1 + ad_rng_below(&r, 255));
                    break;
                case 1: { /* a u32 field: small and huge numbers */
                    uint64_t x = ad_rng_next(&r);
                    fuzz_put_le(m + at, x >> ad_rng_below(&r, 64), 4);
                    break;
                }
                case 2: /* cut short */
                    msize = ad_rng_below(&r, size);
                    break;
                default: /* bytes added */
                    msize = size + ad_rng_below(&r, 64);
                    memset(m + size, (int)ad_rng_below(&r, 256), msize - size);
                }
            }
            snprintf(label, sizeof label, "built-in mutation %d of the seed with mode %d", k, modes[s]);
            fuzz_run_one(LLVMFuzzerTestOneInput, m, msize, label);
        }
        free(seed);
    }
    free(m);
    return runs;
}

static int fuzz_file(const char *path)
{
    size_t n;
    unsigned char *buf = fuzz_read_file(path, &n);
    if (!buf) {
        fprintf(stderr, "checkpoint_fuzz: cannot open %s\n", path);
        return 1;
    }
    fuzz_run_one(LLVMFuzzerTestOneInput, buf, n, path);
    free(buf);
    return 0;
}

static int fuzz_write_seeds(const char *dir)
{
    static const int modes[8] = {0, 1, 2, 3, 8, 9, 10, 11};
    int s, bad = 0;
    for (s = 0; s < 8; s++) {
        char name[64];
        size_t size;
        unsigned char *seed = fuzz_seed(fuzz_which(modes[s]), modes[s], &size);
        snprintf(name, sizeof name, "seed%d.bin", s);
        bad |= fuzz_write_file(dir, name, seed, size);
        free(seed);
    }
    return bad;
}

/* A version 1 checkpoint (the layout of >>impl:checkpoint without flags) of one parameter "w" of
   shape [65536, 8192] and no values behind it, with a true length and checksum: 57 bytes, after
   the mode byte. */
static unsigned char *fuzz_huge_shape(int mode, size_t *size)
{
    static const unsigned char magic[8] = {0x89, 'A', 'D', 'C', 'K', '\r', '\n', 0x1a};
    unsigned char *b = (unsigned char *)calloc(58, 1), *f = b + 1;
    if (!b) abort();
    b[0] = (unsigned char)mode;
    memcpy(f, magic, 8);
    fuzz_put_le(f + 8, 1, 4);
    fuzz_put_le(f + 12, sizeof(ad_real), 4);
    fuzz_put_le(f + 16, 57, 8);
    fuzz_put_le(f + 24, 1, 4);
    fuzz_put_le(f + 32, 1, 4);
    f[36] = 'w';
    fuzz_put_le(f + 37, 2, 4);
    fuzz_put_le(f + 41, 65536, 4);
    fuzz_put_le(f + 45, 8192, 4);
    fuzz_put_le(f + 49, fuzz_hash(f, 49), 8);
    *size = 58;
    return b;
}

/* The committed corpus: the seeds with and without the reseal bit, the hostile file with each
   optimizer, and cut and bit-flipped copies of the seeds. */
static int fuzz_write_corpus(const char *dir)
{
    int s, bad = 0;
    ad_rng r;
    ad_rng_seed(&r, 31);
    for (s = 0; s < 8; s++) {
        char name[64];
        size_t size, at;
        int mode = (s & 3) | (s & 4) << 1;
        unsigned char *seed = fuzz_seed(s, mode, &size), *huge;
        snprintf(name, sizeof name, "ok_optim%d", s);
        bad |= fuzz_write_file(dir, name, seed, size);
        seed[0] |= 4;
        snprintf(name, sizeof name, "ok_optim%d_resealed", s);
        bad |= fuzz_write_file(dir, name, seed, size);
        seed[0] = (unsigned char)mode;
        snprintf(name, sizeof name, "cut_optim%d", s);
        bad |= fuzz_write_file(dir, name, seed, size * 3 / 5);
        at = 1 + 32 + (size_t)ad_rng_below(&r, size - 41); /* two statements: a fixed order of draws */
        seed[at] ^= (unsigned char)(1u << ad_rng_below(&r, 8));
        snprintf(name, sizeof name, "flip_optim%d", s);
        bad |= fuzz_write_file(dir, name, seed, size);
        seed[0] |= 4;
        snprintf(name, sizeof name, "flip_optim%d_resealed", s);
        bad |= fuzz_write_file(dir, name, seed, size);
        free(seed);
        huge = fuzz_huge_shape(mode, &size);
        snprintf(name, sizeof name, "bad_v1_shape_65536x8192_optim%d", s);
        bad |= fuzz_write_file(dir, name, huge, size);
        free(huge);
    }
    return bad;
}

int main(int argc, char **argv)
{
    int i, bad = 0;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return fuzz_write_seeds(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return fuzz_write_corpus(argv[2]);
    if (argc == 1) {
        long runs = fuzz_builtin(getenv("TH_QUICK") ? 500 : 5000), files;
        files = fuzz_run_corpus("checkpoint_fuzz", LLVMFuzzerTestOneInput);
        if (files < 0) return 1;
        printf("checkpoint_fuzz: %ld inputs and %ld corpus files, %ld loaded, no crash\n", runs, files,
               ckpt_fuzz_accepted);
        return 0;
    }
    for (i = 1; i < argc; i++) bad |= fuzz_file(argv[i]);
    printf("checkpoint_fuzz: %d files, %ld loaded\n", argc - 1, ckpt_fuzz_accepted);
    return bad;
}
#endif
