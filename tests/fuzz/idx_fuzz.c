/* Fuzz target for the IDX loader: arbitrary bytes into ad_idx_parse_memory (raw IDX and gzip,
   inflated by stb_image), and parsed image files on into ad_dataset_from_idx.

   Besides "never crash", the target checks the loader's promises and aborts when one is broken:
   a refused file leaves the ad_idx (and ad_dataset) zeroed and a message in err; a parsed one has
   ndim 1 or 3, positive dimensions whose product is its size, and data; a dataset made from it
   has values within [0, 1]; nothing is left allocated. stb_image's and autodiff.h's allocations
   go through a counting allocator (fuzz_common.h) that aborts on one block above 64 MiB + 4200
   bytes per input byte (gzip inflates at most 1032:1, and a dataset holds 4-byte values).

   libFuzzer (tests/fuzz/run_libfuzzer.sh does this with the committed corpus):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DIDX_FUZZ_NO_MAIN -I. \
           tests/fuzz/idx_fuzz.c -o build/fuzz/idx_fuzz -lm -lpthread
       build/fuzz/idx_fuzz -rss_limit_mb=2048 CORPUS_DIR
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/idx_fuzz.c -o build/idx_fuzz_run -lm -lpthread
       build/idx_fuzz_run FILE...    runs each file once
       build/idx_fuzz_run            runs a built-in corpus (valid files and seeded mutations of them),
                                     then every file in tests/fuzz/corpus/idx_fuzz (or FUZZ_CORPUS_DIR)
       build/idx_fuzz_run --write-seeds DIR    writes the valid files into DIR (a libFuzzer corpus)
       build/idx_fuzz_run --write-corpus DIR   writes the hand-made part of the committed corpus:
                                               small valid files, hostile ones and damaged copies */
#include "fuzz_common.h"

#define STBI_MALLOC(sz) fuzz_malloc(sz)
#define STBI_REALLOC(p, sz) fuzz_realloc(p, sz)
#define STBI_FREE(p) fuzz_free(p)
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#ifndef IDX_FUZZ_NO_MAIN
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#endif
#define AUTODIFF_MALLOC(sz) fuzz_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) fuzz_realloc(p, sz)
#define AUTODIFF_FREE(p) fuzz_free(p)
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

static int idx_zeroed(const ad_idx *idx)
{
    return idx->ndim == 0 && idx->dims[0] == 0 && idx->dims[1] == 0 && idx->dims[2] == 0 && idx->size == 0 &&
           idx->data == NULL;
}

static int dataset_zeroed(const ad_dataset *ds)
{
    return ds->count == 0 && ds->ndim == 0 && ds->sample_size == 0 && ds->x == NULL && ds->labels == NULL &&
           ds->classes == 0 && ds->class_names == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ad_idx idx;
    ad_dataset ds;
    char err[256];
    unsigned char *file = (unsigned char *)malloc(size ? size : 1); /* its own block: overreads show */
    size_t live, i, count;
    int d;
    if (!file) return 0;
    memcpy(file, data, size);
    live = fuzz_alloc_caps(size, ((size_t)64 << 20) + 4200 * size, 2 * (((size_t)64 << 20) + 4200 * size));
    err[0] = 0;
    memset(&idx, 0xA5, sizeof idx); /* a refusal must zero it whatever it held */
    if (ad_idx_parse_memory(file, size, &idx, err, sizeof err) != 0) {
        if (!idx_zeroed(&idx)) fuzz_fail("ad_idx_parse_memory: refused (%s) but left the ad_idx set", err);
        if (!err[0]) fuzz_fail("ad_idx_parse_memory: refused without a message");
    } else {
        idx_fuzz_accepted++;
        if ((idx.ndim != 1 && idx.ndim != 3) || !idx.data)
            fuzz_fail("ad_idx_parse_memory: returned 0 with ndim %d, data %p", idx.ndim, (void *)idx.data);
        for (d = 0, count = 1; d < idx.ndim; d++) {
            if (idx.dims[d] < 1) fuzz_fail("ad_idx_parse_memory: dimension %d is %d", d, idx.dims[d]);
            count *= (size_t)idx.dims[d];
        }
        if (count != idx.size)
            fuzz_fail("ad_idx_parse_memory: dimensions multiply to %zu, size is %zu", count, idx.size);
        if (idx.ndim == 3) {
            memset(&ds, 0xA5, sizeof ds);
            if (ad_dataset_from_idx(&idx, NULL, &ds, err, sizeof err) == 0) {
                if (ds.count != idx.dims[0] || ds.sample_size != (size_t)idx.dims[1] * (size_t)idx.dims[2] || !ds.x)
                    fuzz_fail("ad_dataset_from_idx: %d samples of %zu values from %d images of %dx%d", ds.count,
                              ds.sample_size, idx.dims[0], idx.dims[1], idx.dims[2]);
                for (i = 0; i < idx.size; i++)
                    if (!(ds.x[i] >= 0 && ds.x[i] <= 1)) fuzz_fail("ad_dataset_from_idx: value %zu outside [0, 1]", i);
                ad_dataset_free(&ds);
            } else if (!dataset_zeroed(&ds) || !err[0]) {
                fuzz_fail("ad_dataset_from_idx: refused (%s) but left the dataset set or gave no message", err);
            }
        }
        ad_idx_free(&idx);
    }
    fuzz_alloc_leaked(live, "ad_idx_parse_memory");
    fuzz_alloc_nocaps();
    free(file);
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
        char label[96];
        snprintf(label, sizeof label, "built-in seed %d", s);
        fuzz_run_one(LLVMFuzzerTestOneInput, seeds[s].p, seeds[s].n, label), runs++;
        for (k = 0; k < per_seed; k++) {
            bytes m = mutate(seeds[s], &r);
            snprintf(label, sizeof label, "built-in mutation %d of seed %d", k, s);
            fuzz_run_one(LLVMFuzzerTestOneInput, m.p, m.n, label), runs++;
            if (s >= 2 && k % 2 == 0) {
                bytes inner = mutate(raw[s == 5 ? 2 : s == 4 ? 1 : 0], &r), g = gzip(inner, k % 4 == 0, 0);
                snprintf(label, sizeof label, "built-in gzip of mutation %d of seed %d's IDX", k, s);
                fuzz_run_one(LLVMFuzzerTestOneInput, g.p, g.n, label), runs++;
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

/* A gzip member as gzip() makes it, then edited: ISIZE, the CRC-32, or a header byte. */
static bytes gzip_with(bytes raw, int huffman, int flg, int field, uint32_t value)
{
    bytes g = gzip(raw, huffman, flg);
    if (field == 0) put_le(g.p + g.n - 4, value, 4);       /* ISIZE */
    else if (field == 1) put_le(g.p + g.n - 8, value, 4);  /* CRC-32 */
    else g.p[field] = (unsigned char)value;                /* a header byte */
    return g;
}

static bytes concat(bytes a, bytes b)
{
    bytes c = bytes_new(a.n + b.n);
    memcpy(c.p, a.p, a.n);
    memcpy(c.p + a.n, b.p, b.n);
    return c;
}

/* The committed corpus: small valid files (raw and gzip of each kind), hostile headers and
   gzip members, and cut and bit-flipped copies. Writes each bytes and frees it. */
static int write_corpus(const char *dir)
{
    static const uint32_t images[3] = {4, 5, 7}, labels[1] = {9}, mnist[3] = {60000, 28, 28}, zeros[3] = {1024, 32, 32};
    static const uint32_t huge_labels[1] = {0x7FFFFFFF}, zero_dim[3] = {3, 0, 2}, over[3] = {0x80000000u, 1, 1};
    struct {
        const char *name;
        bytes b;
    } f[32];
    bytes img = idx_file(0x803, 3, images, 140), lab = idx_file(0x801, 1, labels, 9), z, g;
    int n = 0, i, bad = 0;
    size_t k;
    z = idx_file(0x803, 3, zeros, 1024 * 32 * 32);
    memset(z.p + 16, 0, 1024 * 32 * 32);
    f[n].name = "ok_raw_images_4x5x7", f[n++].b = idx_file(0x803, 3, images, 140);
    f[n].name = "ok_raw_labels_9", f[n++].b = idx_file(0x801, 1, labels, 9);
    f[n].name = "ok_gzip_stored_images", f[n++].b = gzip(img, 0, 0);
    f[n].name = "ok_gzip_huffman_images_all_flags", f[n++].b = gzip(img, 1, 2 | 4 | 8 | 16);
    f[n].name = "ok_gzip_huffman_labels_fname", f[n++].b = gzip(lab, 1, 8);
    f[n].name = "ok_gzip_zeros_1024x32x32", f[n++].b = gzip(z, 1, 0); /* 1 MiB from 10 KB */
    f[n].name = "bad_raw_60000x28x28_header_only", f[n++].b = idx_file(0x803, 3, mnist, 0);
    f[n].name = "bad_raw_labels_2pow31_header_only", f[n++].b = idx_file(0x801, 1, huge_labels, 0);
    f[n].name = "bad_raw_dim_zero", f[n++].b = idx_file(0x803, 3, zero_dim, 4);
    f[n].name = "bad_raw_dim_2pow31", f[n++].b = idx_file(0x803, 3, over, 4);
    f[n].name = "bad_raw_trailing_bytes", f[n++].b = idx_file(0x801, 1, labels, 12);
    f[n].name = "bad_gzip_isize_1GiB", f[n++].b = gzip_with(lab, 1, 0, 0, 1u << 30);
    f[n].name = "bad_gzip_isize_4GiB_minus_1", f[n++].b = gzip_with(lab, 1, 0, 0, 0xFFFFFFFFu);
    f[n].name = "bad_gzip_isize_too_small", f[n++].b = gzip_with(img, 1, 0, 0, 100);
    f[n].name = "bad_gzip_isize_too_large", f[n++].b = gzip_with(img, 0, 0, 0, 200);
    f[n].name = "bad_gzip_crc", f[n++].b = gzip_with(img, 1, 0, 1, 0x12345678u);
    f[n].name = "bad_gzip_reserved_flag", f[n++].b = gzip_with(img, 1, 0, 3, 0x20);
    f[n].name = "bad_gzip_method_7", f[n++].b = gzip_with(img, 1, 0, 2, 7);
    g = gzip(img, 1, 2 | 8); /* FHCRC after FNAME: corrupt the name */
    g.p[10] ^= 1;
    f[n].name = "bad_gzip_header_crc", f[n++].b = g;
    g = gzip(lab, 1, 4); /* FEXTRA whose XLEN runs past the end */
    put_le(g.p + 10, 0xFFFF, 2);
    f[n].name = "bad_gzip_fextra_overrun", f[n++].b = g;
    {
        bytes a = gzip(lab, 1, 0), b = gzip(lab, 0, 0);
        f[n].name = "bad_gzip_two_members", f[n++].b = concat(a, b);
        free(a.p);
        free(b.p);
    }
    {
        bytes cut = resized(idx_file(0x803, 3, images, 140), 100); /* IDX cut short inside a valid gzip */
        f[n].name = "bad_gzip_of_truncated_idx", f[n++].b = gzip(cut, 1, 0);
        free(cut.p);
    }
    {
        static const char *const from[2] = {"ok_gzip_huffman_images_all_flags", "ok_raw_images_4x5x7"};
        ad_rng r;
        int j, m = n;
        ad_rng_seed(&r, 8);
        for (j = 0; j < 2; j++)
            for (i = 0; i < m; i++)
                if (strcmp(f[i].name, from[j]) == 0) {
                    bytes c = bytes_new(f[i].b.n);
                    memcpy(c.p, f[i].b.p, c.n);
                    f[n].name = j ? "cut_raw_images" : "cut_gzip_huffman_images", f[n++].b = resized(c, c.n / 2);
                    c = bytes_new(f[i].b.n);
                    memcpy(c.p, f[i].b.p, c.n);
                    for (k = 0; k < 3; k++) {
                        size_t at = (size_t)ad_rng_below(&r, c.n);
                        c.p[at] ^= (unsigned char)(1u << ad_rng_below(&r, 8));
                    }
                    f[n].name = j ? "flip_raw_images" : "flip_gzip_huffman_images", f[n++].b = c;
                }
    }
    for (i = 0; i < n; i++) {
        bad |= fuzz_write_file(dir, f[i].name, f[i].b.p, f[i].b.n);
        free(f[i].b.p);
    }
    free(img.p);
    free(lab.p);
    free(z.p);
    return bad;
}

static int run_file(const char *path)
{
    size_t n;
    unsigned char *data = fuzz_read_file(path, &n);
    if (!data) {
        fprintf(stderr, "idx_fuzz: cannot open %s\n", path);
        return 1;
    }
    fuzz_run_one(LLVMFuzzerTestOneInput, data, n, path);
    free(data);
    return 0;
}

int main(int argc, char **argv)
{
    int i, failed = 0;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    if (argc > 1) {
        for (i = 1; i < argc; i++) failed |= run_file(argv[i]);
        printf("idx_fuzz: ran %d files, %ld parsed\n", argc - 1 - failed, idx_fuzz_accepted);
        return failed;
    }
    {
        long runs = run_builtin(getenv("TH_QUICK") ? 300 : 3000), files;
        files = fuzz_run_corpus("idx_fuzz", LLVMFuzzerTestOneInput);
        if (files < 0) return 1;
        printf("idx_fuzz: ran %ld built-in inputs and %ld corpus files, %ld parsed\n", runs, files, idx_fuzz_accepted);
    }
    return 0;
}
#endif
