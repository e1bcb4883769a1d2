/* Fuzz target for the IDX loader: arbitrary bytes into ad_idx_parse_memory (raw IDX and gzip),
   and parsed image files on into ad_dataset_from_idx.

   libFuzzer:
       clang -g -O1 -fsanitize=fuzzer,address,undefined -DIDX_FUZZ_NO_MAIN -I. tests/fuzz/idx_fuzz.c \
           -o build/idx_fuzz -lm && build/idx_fuzz corpus/
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/idx_fuzz.c -o build/idx_fuzz_run -lm
       build/idx_fuzz_run FILE...    runs each file once
       build/idx_fuzz_run            runs a built-in corpus: valid files and seeded mutations of them
       build/idx_fuzz_run --write-seeds DIR   writes the valid files into DIR (a libFuzzer corpus) */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long idx_fuzz_accepted; /* inputs that parsed, for the standalone summary */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ad_idx idx;
    ad_dataset ds;
    char err[256];
    if (ad_idx_parse_memory(data, size, &idx, err, sizeof err) != 0) return 0;
    idx_fuzz_accepted++;
    if (idx.ndim == 3 && ad_dataset_from_idx(&idx, NULL, &ds, err, sizeof err) == 0) ad_dataset_free(&ds);
    ad_idx_free(&idx);
    return 0;
}

#ifndef IDX_FUZZ_NO_MAIN
typedef struct bytes {
    unsigned char *p;
    size_t n;
} bytes;

static bytes bytes_new(size_t n)
{
    bytes b;
    b.p = (unsigned char *)calloc(n ? n : 1, 1);
    b.n = n;
    return b;
}

static void put_le(unsigned char *p, uint32_t v, int n)
{
    int i;
    for (i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static bytes idx_file(uint32_t magic, int ndim, const uint32_t *dims, size_t payload)
{
    bytes b = bytes_new(4 + 4 * (size_t)ndim + payload);
    size_t i;
    int d;
    put_be32(b.p, magic);
    for (d = 0; d < ndim; d++) put_be32(b.p + 4 + 4 * d, dims[d]);
    for (i = 0; i < payload; i++) b.p[4 + 4 * ndim + i] = (unsigned char)(i * 31 + i / 5);
    return b;
}

/* gzip of raw: stored blocks or stb_image_write's Huffman coder; flags as in the FLG byte. */
static bytes gzip(bytes raw, int huffman, int flg)
{
    bytes g = bytes_new(raw.n + 5 * (raw.n / 65535 + 1) + 64);
    size_t o = 10, pos = 0;
    g.p[0] = 0x1f, g.p[1] = 0x8b, g.p[2] = 8, g.p[3] = (unsigned char)flg, g.p[9] = 255;
    if (flg & 4) put_le(g.p + o, 3, 2), memcpy(g.p + o + 2, "abc", 3), o += 5;
    if (flg & 8) memcpy(g.p + o, "name", 5), o += 5;
    if (flg & 16) memcpy(g.p + o, "comment", 8), o += 8;
    if (flg & 2) put_le(g.p + o, ad__crc32(g.p, o) & 0xFFFF, 2), o += 2;
    if (huffman) {
        int len = 0;
        unsigned char *z = stbi_zlib_compress(raw.p, (int)raw.n, &len, 8);
        bytes more = bytes_new(o + (size_t)len + 8);
        memcpy(more.p, g.p, o);
        memcpy(more.p + o, z + 2, (size_t)len - 6);
        o += (size_t)len - 6;
        STBIW_FREE(z);
        free(g.p);
        g = more;
    } else {
        do {
            size_t k = raw.n - pos < 65535 ? raw.n - pos : 65535;
            g.p[o] = (unsigned char)(pos + k == raw.n);
            put_le(g.p + o + 1, (uint32_t)k, 2);
            put_le(g.p + o + 3, (uint32_t)(~k & 0xFFFF), 2);
            memcpy(g.p + o + 5, raw.p + pos, k);
            o += 5 + k;
            pos += k;
        } while (pos < raw.n);
    }
    put_le(g.p + o, ad__crc32(raw.p, raw.n), 4);
    put_le(g.p + o + 4, (uint32_t)raw.n, 4);
    g.n = o + 8;
    return g;
}

/* b cut or zero-extended to exactly n bytes, so that AddressSanitizer sees any read past them. */
static bytes resized(bytes b, size_t n)
{
    bytes c = bytes_new(n);
    memcpy(c.p, b.p, n < b.n ? n : b.n);
    free(b.p);
    return c;
}

/* One random edit: a bit flip, a byte or big-endian word set to an edge value, a cut, or
   bytes appended. */
static bytes mutate_once(bytes b, ad_rng *r)
{
    static const uint32_t words[] = {0, 1, 2, 0x7F, 0x80, 0xFF, 0x801, 0x803, 0xFFFF, 0x10000,
                                     0x7FFFFFFF, 0x80000000u, 0xFFFFFFFFu};
    size_t at = b.n ? (size_t)ad_rng_below(r, b.n) : 0;
    switch (ad_rng_below(r, 5)) {
    case 0:
        if (b.n) b.p[at] ^= (unsigned char)(1u << ad_rng_below(r, 8));
        break;
    case 1:
        if (b.n) b.p[at] = (unsigned char)words[ad_rng_below(r, 6)];
        break;
    case 2:
        if (b.n >= 4) put_be32(b.p + (at < b.n - 4 ? at : b.n - 4), words[ad_rng_below(r, 13)]);
        break;
    case 3:
        b = resized(b, at);
        break;
    default: {
        size_t n = b.n, extra = 1 + (size_t)ad_rng_below(r, 16), i;
        b = resized(b, n + extra);
        for (i = 0; i < extra; i++) b.p[n + i] = (unsigned char)ad_rng_next(r);
    }
    }
    return b;
}

static bytes mutate(bytes seed, ad_rng *r)
{
    bytes b = bytes_new(seed.n);
    int k, edits = 1 + (int)ad_rng_below(r, 4);
    memcpy(b.p, seed.p, seed.n);
    for (k = 0; k < edits; k++) b = mutate_once(b, r);
    return b;
}

#define NSEEDS 6

static void make_seeds(bytes *raw, bytes *seeds)
{
    static const uint32_t images[3] = {4, 5, 7}, labels[1] = {9}, wide[3] = {2, 200, 180};
    raw[0] = idx_file(0x803, 3, images, 140);
    raw[1] = idx_file(0x801, 1, labels, 9);
    raw[2] = idx_file(0x803, 3, wide, 72000);
    seeds[0] = raw[0];
    seeds[1] = raw[1];
    seeds[2] = gzip(raw[0], 0, 0);
    seeds[3] = gzip(raw[0], 1, 2 | 4 | 8 | 16);
    seeds[4] = gzip(raw[1], 1, 8);
    seeds[5] = gzip(raw[2], 0, 0);
}

/* Every seed, then mutations of each: of its bytes, and (gzip seeds) of the IDX inside a valid
   gzip wrapper, so that the IDX checks behind the CRC are reached too. */
static long run_builtin(int per_seed)
{
    bytes raw[3], seeds[NSEEDS];
    ad_rng r;
    long runs = 0;
    int s, k;
    make_seeds(raw, seeds);
    ad_rng_seed(&r, 2026);
    for (s = 0; s < NSEEDS; s++) {
        LLVMFuzzerTestOneInput(seeds[s].p, seeds[s].n), runs++;
        for (k = 0; k < per_seed; k++) {
            bytes m = mutate(seeds[s], &r);
            LLVMFuzzerTestOneInput(m.p, m.n), runs++;
            if (s >= 2 && k % 2 == 0) {
                bytes inner = mutate(raw[s == 5 ? 2 : s == 4 ? 1 : 0], &r), g = gzip(inner, k % 4 == 0, 0);
                LLVMFuzzerTestOneInput(g.p, g.n), runs++;
                free(inner.p);
                free(g.p);
            }
            free(m.p);
        }
    }
    for (s = 2; s < NSEEDS; s++) free(seeds[s].p);
    for (s = 0; s < 3; s++) free(raw[s].p);
    return runs;
}

static int write_seeds(const char *dir)
{
    bytes raw[3], seeds[NSEEDS];
    int s, failed = 0;
    make_seeds(raw, seeds);
    for (s = 0; s < NSEEDS; s++) {
        char path[1024];
        FILE *f;
        snprintf(path, sizeof path, "%s/seed%d", dir, s);
        f = fopen(path, "wb");
        if (!f || fwrite(seeds[s].p, 1, seeds[s].n, f) != seeds[s].n) failed = 1;
        if (f) fclose(f);
    }
    for (s = 2; s < NSEEDS; s++) free(seeds[s].p);
    for (s = 0; s < 3; s++) free(raw[s].p);
    if (failed) fprintf(stderr, "idx_fuzz: cannot write the seeds into %s\n", dir);
    return failed;
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    bytes b = bytes_new(0);
    size_t cap = 0, got;
    if (!f) {
        fprintf(stderr, "idx_fuzz: cannot open %s\n", path);
        return 1;
    }
    do { /* read to the end without trusting the file's size */
        if (b.n == cap) {
            unsigned char *grown = (unsigned char *)realloc(b.p, cap = cap ? 2 * cap : 65536);
            if (!grown) break;
            b.p = grown;
        }
        got = fread(b.p + b.n, 1, cap - b.n, f);
        b.n += got;
    } while (got > 0);
    fclose(f);
    LLVMFuzzerTestOneInput(b.p, b.n);
    free(b.p);
    return 0;
}

int main(int argc, char **argv)
{
    int i, failed = 0;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    if (argc > 1) {
        for (i = 1; i < argc; i++) failed |= run_file(argv[i]);
        printf("idx_fuzz: ran %d files\n", argc - 1 - failed);
        return failed;
    }
    {
        long runs = run_builtin(getenv("TH_QUICK") ? 300 : 3000);
        printf("idx_fuzz: ran %ld built-in inputs, %ld parsed\n", runs, idx_fuzz_accepted);
    }
    return 0;
}
#endif
