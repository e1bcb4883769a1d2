/* Fuzz target for the checkpoint loader: arbitrary bytes into ad_checkpoint_load_memory.

   Input: one mode byte, then the file. Mode bits 0-1 pick the optimizer loaded alongside the
   store (0 none, 1 Adam, 2 SGD with momentum, 3 AdamW); bit 2 reseals the file first (writes
   the true length and checksum into it), so that mutations reach the structure behind the
   checksum instead of all failing there. Besides "never crash", the target checks the loader's
   promises and aborts when one is broken: a refused file leaves the store and optimizer bit for
   bit as they were, and an accepted one, saved again, gives back the same bytes.

   libFuzzer (seed the corpus with the standalone build's --write-seeds):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -DCHECKPOINT_FUZZ_NO_MAIN -I. \
           tests/fuzz/checkpoint_fuzz.c -o build/checkpoint_fuzz -lm && build/checkpoint_fuzz corpus/
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/checkpoint_fuzz.c -o build/ckpt_fuzz_run -lm
       build/ckpt_fuzz_run FILE...            runs each file once
       build/ckpt_fuzz_run                    runs a built-in corpus: valid checkpoints and seeded
                                              mutations of them
       build/ckpt_fuzz_run --write-seeds DIR  writes the valid inputs into DIR (a libFuzzer corpus) */
#define AUTODIFF_IMPLEMENTATION
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

static ad_optim *fuzz_optim(ad_params *P, int which)
{
    ad_optim_desc d;
    if (which == 0) return NULL;
    memset(&d, 0, sizeof d);
    d.kind = which == 1 ? AD_OPTIM_ADAM : which == 2 ? AD_OPTIM_SGD : AD_OPTIM_ADAMW;
    d.momentum = which == 2 ? 0.9 : 0;
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

/* The store and optimizer as checkpoint bytes (malloc'd). */
static unsigned char *fuzz_snapshot(ad_params *P, ad_optim *O, size_t *len)
{
    unsigned char *buf;
    *len = ad_checkpoint_size(P, O);
    buf = (unsigned char *)malloc(*len);
    if (!buf || ad_checkpoint_save_memory(buf, *len, P, O) != 0) abort();
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
    O = fuzz_optim(P, mode & 3);
    before = fuzz_snapshot(P, O, &lb);
    if (ad_checkpoint_load_memory(file, n, P, O) == 0) {
        ckpt_fuzz_accepted++;
        after = fuzz_snapshot(P, O, &la);
        if (O && (la != n || memcmp(after, file, n) != 0)) abort(); /* loaded something else than the file */
    } else {
        if (!ad_params_error(P)) abort(); /* refused without a reason */
        after = fuzz_snapshot(P, O, &la);
        if (la != lb || memcmp(after, before, la) != 0) abort(); /* a refusal changed the state */
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
   values and optimizer state are not zero) with optimizer `which`. */
static unsigned char *fuzz_seed(int which, int mode, size_t *size)
{
    ad_params *P = fuzz_store();
    ad_optim *O = fuzz_optim(P, which);
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
    static const int modes[6] = {0, 1, 2, 3, 5, 6};
    unsigned char *m = NULL;
    long runs = 0;
    ad_rng r;
    int s, k;
    ad_rng_seed(&r, 12345);
    for (s = 0; s < 6; s++) {
        size_t size, msize, at;
        unsigned char *seed = fuzz_seed(modes[s] & 3, modes[s], &size);
        LLVMFuzzerTestOneInput(seed, size);
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
            LLVMFuzzerTestOneInput(m, msize);
        }
        free(seed);
    }
    free(m);
    return runs;
}

static int fuzz_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0, got;
    if (!f) {
        fprintf(stderr, "checkpoint_fuzz: cannot open %s\n", path);
        return 1;
    }
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            buf = (unsigned char *)realloc(buf, cap);
            if (!buf) abort();
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int fuzz_write_seeds(const char *dir)
{
    static const int modes[4] = {0, 1, 2, 3};
    int s, bad = 0;
    for (s = 0; s < 4; s++) {
        char path[1024];
        size_t size;
        unsigned char *seed = fuzz_seed(modes[s], modes[s], &size);
        FILE *f;
        snprintf(path, sizeof path, "%s/seed%d.bin", dir, s);
        f = fopen(path, "wb");
        if (!f || fwrite(seed, 1, size, f) != size || fclose(f) != 0) {
            fprintf(stderr, "checkpoint_fuzz: cannot write %s\n", path);
            bad = 1;
        }
        free(seed);
    }
    return bad;
}

int main(int argc, char **argv)
{
    int i, bad = 0;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return fuzz_write_seeds(argv[2]);
    if (argc == 1) {
        long runs = fuzz_builtin(getenv("TH_QUICK") ? 500 : 5000);
        printf("checkpoint_fuzz: %ld inputs, %ld loaded, no crash\n", runs, ckpt_fuzz_accepted);
        return 0;
    }
    for (i = 1; i < argc; i++) bad |= fuzz_file(argv[i]);
    printf("checkpoint_fuzz: %d files, %ld loaded\n", argc - 1, ckpt_fuzz_accepted);
    return bad;
}
#endif
