/* Fuzz target for the image loader: arbitrary bytes into ad_image_load_memory (stb_image: PNG,
   JPEG, BMP, GIF, TGA, PSD, HDR, PNM, ...), and the decoded image on into ad_image_resize.

   Input: one mode byte, then the file. Mode bits 0-1 pick the channels asked for (1 + bits: gray,
   gray+alpha, RGB, RGBA); bit 2 resizes a decoded image, bit 3 in place (dst == src), to a height
   picked by bits 4-5 (1, 3, 8, 29) and a width picked by bits 6-7 (1, 4, 11, 32).
   Besides "never crash", the target checks the loader's promises and aborts when one is broken:
   a refused image leaves the ad_image zeroed and a message in err; a decoded one has the channels
   asked for, at most AUTODIFF_DATA_MAX_BYTES values, all within [0, 1]; a resize of it succeeds
   with values within [0, 1]; nothing is left allocated. stb_image's and autodiff.h's allocations
   go through a counting allocator (fuzz_common.h) that aborts on one block above 16 times
   AUTODIFF_DATA_MAX_BYTES (16 MiB here) or on 32 times that live at once: a decoder must not
   allocate what a file's header declares before the size is checked against the limit.

   libFuzzer (tests/fuzz/run_libfuzzer.sh does this with the committed corpus):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DIMAGE_FUZZ_NO_MAIN \
           -I. tests/fuzz/image_fuzz.c -o build/fuzz/image_fuzz -lm -lpthread
       build/fuzz/image_fuzz -rss_limit_mb=2048 CORPUS_DIR
   Standalone (any compiler, e.g. under AddressSanitizer):
       cc -g -O1 -fsanitize=address,undefined -I. tests/fuzz/image_fuzz.c -o build/image_fuzz -lm -lpthread
       build/image_fuzz FILE...             runs each file once
       build/image_fuzz                     runs a built-in corpus (valid images of every format and
                                            seeded mutations of them), then every file in
                                            tests/fuzz/corpus/image_fuzz (or FUZZ_CORPUS_DIR)
       build/image_fuzz --write-seeds DIR   writes the valid images into DIR (a libFuzzer corpus)
       build/image_fuzz --write-corpus DIR  writes the hand-made part of the committed corpus: the
                                            valid images, hostile headers and damaged copies */
#include "fuzz_common.h"

#define STBI_MALLOC(sz) fuzz_malloc(sz)
#define STBI_REALLOC(p, sz) fuzz_realloc(p, sz)
#define STBI_FREE(p) fuzz_free(p)
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#ifndef IMAGE_FUZZ_NO_MAIN
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#endif

#define IMAGE_FUZZ_LIMIT ((size_t)16 << 20)
#define AUTODIFF_DATA_MAX_BYTES IMAGE_FUZZ_LIMIT
#define AUTODIFF_MALLOC(sz) fuzz_malloc(sz)
#define AUTODIFF_REALLOC(p, sz) fuzz_realloc(p, sz)
#define AUTODIFF_FREE(p) fuzz_free(p)
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long image_fuzz_decoded; /* inputs that decoded, for the standalone summary */

static const int image_fuzz_heights[4] = {1, 3, 8, 29}, image_fuzz_widths[4] = {1, 4, 11, 32};

static int image_zeroed(const ad_image *img)
{
    return img->channels == 0 && img->height == 0 && img->width == 0 && img->data == NULL;
}

/* A successful result: the expected channels (and size, when h and w are not 0), at most the
   limit in values, every value within [0, 1]. */
static void image_check(const ad_image *img, int c, int h, int w, const char *what)
{
    size_t i, n;
    if (!img->data || img->channels != c || img->height < 1 || img->width < 1 || (h && img->height != h) ||
        (w && img->width != w))
        fuzz_fail("%s: returned 0 with channels %d, height %d, width %d, data %p; asked for %d channels, %dx%d",
                  what, img->channels, img->height, img->width, (void *)img->data, c, h, w);
    n = (size_t)c * (size_t)img->height * (size_t)img->width;
    if (n > IMAGE_FUZZ_LIMIT)
        fuzz_fail("%s: a %dx%dx%d image, more values than AUTODIFF_DATA_MAX_BYTES (%zu)", what, c, img->height,
                  img->width, IMAGE_FUZZ_LIMIT);
    for (i = 0; i < n; i++)
        if (!(img->data[i] >= 0 && img->data[i] <= 1))
            fuzz_fail("%s: %dx%dx%d image: value %zu is %.9g, outside [0, 1]", what, c, img->height, img->width, i,
                      (double)img->data[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ad_image img, out;
    char err[256];
    unsigned char *file;
    size_t n, before;
    int mode, channels;
    if (size == 0) return 0;
    mode = data[0];
    channels = 1 + (mode & 3);
    n = size - 1;
    file = (unsigned char *)malloc(n ? n : 1); /* its own block, so that overreads are caught */
    if (!file) return 0;
    memcpy(file, data + 1, n);
    before = fuzz_alloc_caps(n, 16 * IMAGE_FUZZ_LIMIT, 32 * IMAGE_FUZZ_LIMIT);
    err[0] = 0;
    memset(&img, 0xA5, sizeof img); /* a failure must zero it whatever it held */
    if (ad_image_load_memory(file, n, channels, &img, err, sizeof err) != 0) {
        if (!image_zeroed(&img))
            fuzz_fail("ad_image_load_memory: refused (%s) but left channels %d, height %d, width %d, data %p", err,
                      img.channels, img.height, img.width, (void *)img.data);
        if (!err[0]) fuzz_fail("ad_image_load_memory: refused without a message");
    } else {
        image_fuzz_decoded++;
        image_check(&img, channels, 0, 0, "ad_image_load_memory");
        if (mode & 4) {
            int oh = image_fuzz_heights[(mode >> 4) & 3], ow = image_fuzz_widths[(mode >> 6) & 3];
            int h = img.height, w = img.width;
            if (mode & 8) {
                if (ad_image_resize(&img, oh, ow, &img, err, sizeof err) != 0)
                    fuzz_fail("ad_image_resize: %dx%dx%d to %dx%d in place failed: %s", channels, h, w, oh, ow, err);
                image_check(&img, channels, oh, ow, "ad_image_resize in place");
            } else {
                memset(&out, 0xA5, sizeof out);
                if (ad_image_resize(&img, oh, ow, &out, err, sizeof err) != 0)
                    fuzz_fail("ad_image_resize: %dx%dx%d to %dx%d failed: %s", channels, h, w, oh, ow, err);
                image_check(&out, channels, oh, ow, "ad_image_resize");
                ad_image_free(&out);
            }
        }
        ad_image_free(&img);
    }
    fuzz_alloc_leaked(before, "ad_image_load_memory");
    fuzz_alloc_nocaps();
    free(file);
    return 0;
}

#ifndef IMAGE_FUZZ_NO_MAIN
/* A growing byte buffer. */
typedef struct fz_buf {
    unsigned char *p;
    size_t n, cap;
} fz_buf;

static void buf_put(fz_buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = (unsigned char *)realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void buf_u8(fz_buf *b, unsigned x)
{
    unsigned char c = (unsigned char)x;
    buf_put(b, &c, 1);
}

static void buf_le16(fz_buf *b, unsigned x) { buf_u8(b, x), buf_u8(b, x >> 8); }
static void buf_le32(fz_buf *b, uint32_t x) { buf_le16(b, x & 0xFFFF), buf_le16(b, x >> 16); }
static void buf_be16(fz_buf *b, unsigned x) { buf_u8(b, x >> 8), buf_u8(b, x); }
static void buf_be32(fz_buf *b, uint32_t x) { buf_be16(b, x >> 16), buf_be16(b, x & 0xFFFF); }
static void buf_str(fz_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_write_cb(void *ctx, void *data, int size) { buf_put((fz_buf *)ctx, data, (size_t)size); }

/* Pixel bytes with some structure, so that filters and compressors have something to do. */
static unsigned char pat(size_t i) { return (unsigned char)(i * 37 + (i / 7) * 11 + 3); }

static unsigned char *pattern(size_t n, size_t salt)
{
    unsigned char *p = (unsigned char *)malloc(n);
    size_t i;
    if (!p) abort();
    for (i = 0; i < n; i++) p[i] = pat(i + salt);
    return p;
}

enum { W_PNG, W_BMP, W_TGA, W_TGA_RAW, W_HDR };

/* An image written by stb_image_write. */
static fz_buf stbiw_image(int kind, int w, int h, int c)
{
    fz_buf b = {NULL, 0, 0};
    unsigned char *px = pattern((size_t)w * h * c, (size_t)kind * 101);
    int ok = 0;
    switch (kind) {
    case W_PNG: ok = stbi_write_png_to_func(buf_write_cb, &b, w, h, c, px, w * c); break;
    case W_BMP: ok = stbi_write_bmp_to_func(buf_write_cb, &b, w, h, c, px); break;
    case W_TGA: ok = stbi_write_tga_to_func(buf_write_cb, &b, w, h, c, px); break;
    case W_TGA_RAW:
        stbi_write_tga_with_rle = 0;
        ok = stbi_write_tga_to_func(buf_write_cb, &b, w, h, c, px);
        stbi_write_tga_with_rle = 1;
        break;
    default: {
        float *f = (float *)malloc((size_t)w * h * c * sizeof(float));
        size_t i;
        if (!f) abort();
        for (i = 0; i < (size_t)w * h * c; i++) f[i] = (float)px[i] / 100.0f; /* some above 1 */
        ok = stbi_write_hdr_to_func(buf_write_cb, &b, w, h, c, f);
        free(f);
    }
    }
    free(px);
    if (!ok) abort();
    return b;
}

static void png_chunk(fz_buf *b, const char *type, const unsigned char *data, size_t n)
{
    size_t at;
    buf_be32(b, (uint32_t)n);
    at = b->n;
    buf_put(b, type, 4);
    buf_put(b, data, n);
    buf_be32(b, ad__crc32(b->p + at, n + 4));
}

/* A PNG made by hand, for what stb_image_write does not write: any bit depth and colour type,
   palettes with tRNS, Adam7 interlacing, rows filtered with all five filters in turn, the image
   data in two IDAT chunks. zero_idat puts an empty IDAT chunk (allowed by the PNG standard) first. */
static fz_buf png_make(int w, int h, int depth, int ctype, int interlace, int zero_idat)
{
    static const int chans[7] = {1, 0, 3, 1, 2, 0, 4};
    static const int xo[7] = {0, 4, 0, 2, 0, 1, 0}, yo[7] = {0, 0, 4, 0, 2, 0, 1};
    static const int xs[7] = {8, 8, 4, 4, 2, 2, 1}, ys[7] = {8, 8, 8, 4, 4, 2, 2};
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    fz_buf raw = {NULL, 0, 0}, out = {NULL, 0, 0}, hdr = {NULL, 0, 0};
    unsigned char *z;
    int pass, passes = interlace ? 7 : 1, y, zlen = 0, bits = depth * chans[ctype];
    size_t k = 0, i;
    for (pass = 0; pass < passes; pass++) {
        int pw = interlace ? (w - xo[pass] + xs[pass] - 1) / xs[pass] : w;
        int ph = interlace ? (h - yo[pass] + ys[pass] - 1) / ys[pass] : h;
        size_t rowbytes = ((size_t)pw * bits + 7) / 8;
        if (pw <= 0 || ph <= 0) continue;
        for (y = 0; y < ph; y++) {
            buf_u8(&raw, (unsigned)(y + pass) % 5);
            for (i = 0; i < rowbytes; i++) buf_u8(&raw, pat(k++));
        }
    }
    z = stbi_zlib_compress(raw.p, (int)raw.n, &zlen, 8);
    buf_put(&out, sig, 8);
    buf_be32(&hdr, (uint32_t)w);
    buf_be32(&hdr, (uint32_t)h);
    buf_u8(&hdr, (unsigned)depth);
    buf_u8(&hdr, (unsigned)ctype);
    buf_u8(&hdr, 0);
    buf_u8(&hdr, 0);
    buf_u8(&hdr, (unsigned)interlace);
    png_chunk(&out, "IHDR", hdr.p, hdr.n);
    if (ctype == 3) {
        unsigned char plte[768], trns[16];
        int entries = 1 << depth;
        for (i = 0; i < (size_t)entries * 3; i++) plte[i] = pat(i * 5);
        for (i = 0; i < sizeof trns; i++) trns[i] = (unsigned char)(i * 17);
        png_chunk(&out, "PLTE", plte, (size_t)entries * 3);
        png_chunk(&out, "tRNS", trns, entries < 16 ? (size_t)entries : sizeof trns);
    }
    if (zero_idat) png_chunk(&out, "IDAT", NULL, 0);
    png_chunk(&out, "IDAT", z, (size_t)zlen / 2);
    png_chunk(&out, "IDAT", z + zlen / 2, (size_t)zlen - (size_t)zlen / 2);
    png_chunk(&out, "IEND", NULL, 0);
    STBIW_FREE(z);
    free(raw.p);
    free(hdr.p);
    return out;
}

/* A one-frame GIF made by hand: 4 colours in a global or local table, optional transparency and
   interlacing. The LZW codes are 3 bits wide throughout: a clear code before every two pixels
   keeps the decoder's table from growing. */
static fz_buf gif_make(int w, int h, int interlaced, int local, int transparent)
{
    fz_buf b = {NULL, 0, 0}, codes = {NULL, 0, 0};
    uint32_t acc = 0;
    int nbits = 0, i, npix = w * h;
    size_t at;
    buf_str(&b, "GIF89a");
    buf_le16(&b, (unsigned)w);
    buf_le16(&b, (unsigned)h);
    buf_u8(&b, local ? 0x70 : 0xF1);
    buf_u8(&b, 0);
    buf_u8(&b, 0);
    if (!local)
        for (i = 0; i < 12; i++) buf_u8(&b, pat((size_t)i * 3));
    if (transparent) {
        static const unsigned char gce[8] = {0x21, 0xF9, 4, 1, 0, 0, 2, 0};
        buf_put(&b, gce, sizeof gce);
    }
    buf_u8(&b, 0x2C);
    buf_le16(&b, 0);
    buf_le16(&b, 0);
    buf_le16(&b, (unsigned)w);
    buf_le16(&b, (unsigned)h);
    buf_u8(&b, (interlaced ? 0x40u : 0u) | (local ? 0x81u : 0u));
    if (local)
        for (i = 0; i < 12; i++) buf_u8(&b, pat((size_t)i * 7));
    buf_u8(&b, 2); /* LZW minimum code size: codes 0-3 are colours, 4 clears, 5 ends */
    for (i = 0; i <= npix; i++) {
        unsigned code = i == npix ? 5u : pat((size_t)i) & 3u;
        if (i % 2 == 0) { /* a clear code before every second pixel, and before the end */
            acc |= 4u << nbits;
            nbits += 3;
        }
        acc |= code << nbits;
        nbits += 3;
        while (nbits >= 8) {
            buf_u8(&codes, acc & 0xFF);
            acc >>= 8;
            nbits -= 8;
        }
    }
    if (nbits > 0) buf_u8(&codes, acc & 0xFF);
    for (at = 0; at < codes.n; at += 255) {
        size_t len = codes.n - at < 255 ? codes.n - at : 255;
        buf_u8(&b, (unsigned)len);
        buf_put(&b, codes.p + at, len);
    }
    buf_u8(&b, 0);
    buf_u8(&b, 0x3B);
    free(codes.p);
    return b;
}

/* A Photoshop file, 8 bits per channel, RGB colour mode: raw planes, or PackBits rows of one
   literal run each (w <= 128). */
static fz_buf psd_make(int w, int h, int channels, int rle)
{
    fz_buf b = {NULL, 0, 0};
    int c, y, x;
    size_t k = 0;
    buf_str(&b, "8BPS");
    buf_be16(&b, 1);
    buf_put(&b, "\0\0\0\0\0\0", 6);
    buf_be16(&b, (unsigned)channels);
    buf_be32(&b, (uint32_t)h);
    buf_be32(&b, (uint32_t)w);
    buf_be16(&b, 8);
    buf_be16(&b, 3);
    buf_be32(&b, 0); /* colour mode data */
    buf_be32(&b, 0); /* image resources */
    buf_be32(&b, 0); /* layers and masks */
    buf_be16(&b, (unsigned)rle);
    if (rle)
        for (c = 0; c < channels * h; c++) buf_be16(&b, (unsigned)w + 1);
    for (c = 0; c < channels; c++)
        for (y = 0; y < h; y++) {
            if (rle) buf_u8(&b, (unsigned)w - 1);
            for (x = 0; x < w; x++) buf_u8(&b, pat(k++));
        }
    return b;
}

/* Binary PGM (P5) or PPM (P6), 8 or 16 bits per sample. */
static fz_buf pnm_make(int w, int h, int channels, int maxval)
{
    fz_buf b = {NULL, 0, 0};
    char head[64];
    size_t i, n = (size_t)w * h * channels * (maxval > 255 ? 2 : 1);
    snprintf(head, sizeof head, "P%d\n%d %d\n%d\n", channels == 1 ? 5 : 6, w, h, maxval);
    buf_str(&b, head);
    for (i = 0; i < n; i++) buf_u8(&b, pat(i));
    return b;
}

/* JPEG made by hand (stb_image_write's JPEG writer shifts signed ints past their range, which
   UBSan refuses): baseline or progressive, gray or YCbCr with 4:4:4 or 4:2:0 sampling, optional
   restart intervals (baseline). One quantisation table; Huffman tables with all codes of one
   length (DC: categories 0-11 in 4 bits; AC: 7 symbols in 3 bits). Each block has a DC value and
   a few AC coefficients from the pattern. */
typedef struct jpeg_bits {
    fz_buf *b;
    uint32_t acc;
    int n;
} jpeg_bits;

static void jpeg_put(jpeg_bits *w, uint32_t code, int len)
{
    w->acc = (w->acc << len) | (code & ((1u << len) - 1));
    w->n += len;
    while (w->n >= 8) {
        unsigned c = (w->acc >> (w->n - 8)) & 0xFF;
        buf_u8(w->b, c);
        if (c == 0xFF) buf_u8(w->b, 0); /* byte stuffing */
        w->n -= 8;
    }
    w->acc &= (1u << w->n) - 1;
}

static void jpeg_flush(jpeg_bits *w)
{
    if (w->n > 0) jpeg_put(w, 0x7F, 8 - w->n); /* pad with 1 bits */
}

static const unsigned char jpeg_ac_syms[7] = {0x00, 0x01, 0x02, 0x03, 0x11, 0x21, 0xF0};

static int jpeg_ac_code(unsigned sym)
{
    int i;
    for (i = 0; i < 7; i++)
        if (jpeg_ac_syms[i] == sym) return i;
    abort();
}

/* A value in its category's bits, after the category's code (DC) or run/size code (AC). */
static int jpeg_category(int v)
{
    int c = 0, a = v < 0 ? -v : v;
    while (a) c++, a >>= 1;
    return c;
}

static void jpeg_value_bits(jpeg_bits *w, int v, int c)
{
    if (c) jpeg_put(w, (uint32_t)(v > 0 ? v : v + (1 << c) - 1), c);
}

static void jpeg_dc(jpeg_bits *w, int diff)
{
    int c = jpeg_category(diff);
    jpeg_put(w, (uint32_t)c, 4);
    jpeg_value_bits(w, diff, c);
}

/* The AC part of block number `blk`: up to four coefficients (one run of 16 zeros), then EOB;
   `progressive` keeps it to one coefficient, as the band's first scan. */
static void jpeg_ac(jpeg_bits *w, size_t blk, int progressive)
{
    unsigned char p = pat(blk * 3 + 1);
    int v1 = (p & 1) ? 1 : -1, v2 = (p & 2) ? 3 : -2;
    jpeg_put(w, (uint32_t)jpeg_ac_code(0x01), 3); /* run 0, size 1 */
    jpeg_value_bits(w, v1, 1);
    if (!progressive && (p & 4)) {
        jpeg_put(w, (uint32_t)jpeg_ac_code(0x11), 3);
        jpeg_value_bits(w, -v1, 1);
        jpeg_put(w, (uint32_t)jpeg_ac_code(0xF0), 3); /* 16 zeros */
        jpeg_put(w, (uint32_t)jpeg_ac_code(0x02), 3);
        jpeg_value_bits(w, v2, 2);
    }
    jpeg_put(w, (uint32_t)jpeg_ac_code(0x00), 3); /* end of block */
}

static void jpeg_marker(fz_buf *b, unsigned m, unsigned len)
{
    buf_u8(b, 0xFF), buf_u8(b, m);
    buf_be16(b, len);
}

static fz_buf jpeg_make(int w, int h, int nc, int sub420, int progressive, int restart)
{
    fz_buf b = {NULL, 0, 0};
    jpeg_bits bw;
    int hs[3], vs[3], c, i, hmax = sub420 ? 2 : 1, vmax = hmax, mx, my, bx, by, pred[3] = {0, 0, 0};
    int mcus_x = (w + 8 * hmax - 1) / (8 * hmax), mcus_y = (h + 8 * vmax - 1) / (8 * vmax), mcu = 0, rst = 0;
    size_t blk = 0;
    for (c = 0; c < nc; c++) hs[c] = vs[c] = (c == 0 && sub420) ? 2 : 1;
    buf_u8(&b, 0xFF), buf_u8(&b, 0xD8);
    jpeg_marker(&b, 0xDB, 2 + 65); /* DQT */
    buf_u8(&b, 0);
    for (i = 0; i < 64; i++) buf_u8(&b, 1u + (unsigned)(i % 8) * 2u);
    jpeg_marker(&b, progressive ? 0xC2 : 0xC0, 8 + 3 * (unsigned)nc); /* SOF */
    buf_u8(&b, 8);
    buf_be16(&b, (unsigned)h), buf_be16(&b, (unsigned)w);
    buf_u8(&b, (unsigned)nc);
    for (c = 0; c < nc; c++) buf_u8(&b, 1u + (unsigned)c), buf_u8(&b, (unsigned)(hs[c] << 4 | vs[c])), buf_u8(&b, 0);
    jpeg_marker(&b, 0xC4, 2 + 17 + 12 + 17 + 7); /* DHT: DC table 0, AC table 0 */
    buf_u8(&b, 0x00);
    for (i = 0; i < 16; i++) buf_u8(&b, i == 3 ? 12u : 0u);
    for (i = 0; i < 12; i++) buf_u8(&b, (unsigned)i);
    buf_u8(&b, 0x10);
    for (i = 0; i < 16; i++) buf_u8(&b, i == 2 ? 7u : 0u);
    buf_put(&b, jpeg_ac_syms, 7);
    if (restart && !progressive) {
        jpeg_marker(&b, 0xDD, 4);
        buf_be16(&b, (unsigned)restart);
    }
    /* the first scan: every component interleaved (baseline: whole blocks; progressive: DC only) */
    jpeg_marker(&b, 0xDA, 6 + 2 * (unsigned)nc);
    buf_u8(&b, (unsigned)nc);
    for (c = 0; c < nc; c++) buf_u8(&b, 1u + (unsigned)c), buf_u8(&b, 0x00);
    buf_u8(&b, 0), buf_u8(&b, progressive ? 0 : 63), buf_u8(&b, 0);
    bw.b = &b, bw.acc = 0, bw.n = 0;
    for (my = 0; my < mcus_y; my++)
        for (mx = 0; mx < mcus_x; mx++, mcu++) {
            if (restart && !progressive && mcu > 0 && mcu % restart == 0) {
                jpeg_flush(&bw);
                buf_u8(&b, 0xFF), buf_u8(&b, 0xD0u + (unsigned)(rst++ & 7));
                pred[0] = pred[1] = pred[2] = 0;
            }
            for (c = 0; c < nc; c++)
                for (by = 0; by < vs[c]; by++)
                    for (bx = 0; bx < hs[c]; bx++, blk++) {
                        int dc = (int)(pat(blk) % 64) - 32 + (c ? 0 : 40);
                        jpeg_dc(&bw, dc - pred[c]);
                        pred[c] = dc;
                        if (!progressive) jpeg_ac(&bw, blk, 0);
                    }
        }
    jpeg_flush(&bw);
    /* progressive: then one AC scan per component, over that component's own blocks */
    for (c = 0; progressive && c < nc; c++) {
        int cw = (w * hs[c] + hmax - 1) / hmax, ch = (h * vs[c] + vmax - 1) / vmax;
        int nbx = (cw + 7) / 8, nby = (ch + 7) / 8;
        jpeg_marker(&b, 0xDA, 8);
        buf_u8(&b, 1), buf_u8(&b, 1u + (unsigned)c), buf_u8(&b, 0x00);
        buf_u8(&b, 1), buf_u8(&b, 63), buf_u8(&b, 0);
        for (i = 0; i < nbx * nby; i++) jpeg_ac(&bw, (size_t)i + (size_t)c * 1000, 1);
        jpeg_flush(&bw);
    }
    buf_u8(&b, 0xFF), buf_u8(&b, 0xD9);
    return b;
}

/* A JPEG whose first DHT segment declares 510 Huffman codes (255 of 15 bits and 255 of 16 bits;
   the code lengths are consistent, so the table is built), more than the 256 a table can hold,
   followed by a valid JPEG's segments. */
static fz_buf jpeg_big_dht(const fz_buf *valid)
{
    fz_buf b = {NULL, 0, 0};
    int i;
    buf_u8(&b, 0xFF), buf_u8(&b, 0xD8);
    buf_u8(&b, 0xFF), buf_u8(&b, 0xC4);
    buf_be16(&b, 2 + 1 + 16 + 510);
    buf_u8(&b, 0x11); /* AC table 1 */
    for (i = 0; i < 14; i++) buf_u8(&b, 0);
    buf_u8(&b, 255), buf_u8(&b, 255);
    for (i = 0; i < 510; i++) buf_u8(&b, pat((size_t)i));
    buf_put(&b, valid->p + 2, valid->n - 2);
    return b;
}

/* Headers that declare a large image (about 1.6 GB decoded) over a few bytes of data. */
static fz_buf bmp_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    buf_str(&b, "BM");
    buf_le32(&b, 54);
    buf_le32(&b, 0);
    buf_le32(&b, 54);    /* pixel data offset */
    buf_le32(&b, 40);    /* BITMAPINFOHEADER */
    buf_le32(&b, 20000); /* width */
    buf_le32(&b, 20000); /* height */
    buf_le16(&b, 1);
    buf_le16(&b, 24);
    buf_le32(&b, 0);     /* BI_RGB */
    buf_le32(&b, 0);
    buf_le32(&b, 2835);
    buf_le32(&b, 2835);
    buf_le32(&b, 0);
    buf_le32(&b, 0);
    return b; /* 54 bytes */
}

static fz_buf tga_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    int i;
    buf_u8(&b, 0), buf_u8(&b, 0), buf_u8(&b, 10); /* no id, no colour map, run-length true colour */
    for (i = 0; i < 5; i++) buf_u8(&b, 0);
    buf_le16(&b, 0), buf_le16(&b, 0);
    buf_le16(&b, 20000), buf_le16(&b, 20000);
    buf_u8(&b, 32), buf_u8(&b, 0x28);
    for (i = 0; i < 22; i++) { /* run-length packets of 128 pixels each */
        buf_u8(&b, 0xFF);
        buf_le32(&b, 0x80FF4020u + (uint32_t)i);
    }
    buf_le32(&b, 0);
    return b; /* 132 bytes */
}

static fz_buf gif_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    buf_str(&b, "GIF89a");
    buf_le16(&b, 20000), buf_le16(&b, 20000);
    buf_u8(&b, 0), buf_u8(&b, 0), buf_u8(&b, 0);
    buf_u8(&b, 0x3B);
    return b;
}

static fz_buf psd_huge(void)
{
    fz_buf b = psd_make(1, 1, 3, 0);
    b.n = 26; /* the header alone, made 20000 x 20000 */
    b.p[14] = 0, b.p[15] = 0, b.p[16] = 0x4E, b.p[17] = 0x20;
    b.p[18] = 0, b.p[19] = 0, b.p[20] = 0x4E, b.p[21] = 0x20;
    buf_be32(&b, 0), buf_be32(&b, 0), buf_be32(&b, 0), buf_be16(&b, 0);
    return b;
}

static fz_buf pnm_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    buf_str(&b, "P6\n20000 20000\n255\n");
    return b;
}

/* A 64 x 64 PGM with 10 of its 4096 pixel bytes: stb_image 2.27 ignores the short read and
   returns the rest of its pixel block as it found it (memory left over from earlier use). */
static fz_buf pgm_truncated(void)
{
    fz_buf b = {NULL, 0, 0};
    int i;
    buf_str(&b, "P5\n64 64\n255\n");
    for (i = 0; i < 10; i++) buf_u8(&b, pat((size_t)i));
    return b;
}

static fz_buf hdr_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    buf_str(&b, "#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 10000 +X 10000\n");
    buf_le32(&b, 0x02020000u);
    return b;
}

static fz_buf jpeg_huge(void)
{
    fz_buf b = {NULL, 0, 0};
    int i;
    buf_u8(&b, 0xFF), buf_u8(&b, 0xD8);
    buf_u8(&b, 0xFF), buf_u8(&b, 0xC0); /* baseline frame header */
    buf_be16(&b, 8 + 3 * 3);
    buf_u8(&b, 8);
    buf_be16(&b, 20000), buf_be16(&b, 20000);
    buf_u8(&b, 3);
    for (i = 1; i <= 3; i++) buf_u8(&b, (unsigned)i), buf_u8(&b, 0x11), buf_u8(&b, 0);
    buf_u8(&b, 0xFF), buf_u8(&b, 0xD9);
    return b;
}

/* 16000 x 16000 RGBA: just inside stb_image's own PNG limit (2^30 bytes of pixels), with a few
   bytes of image data. */
static fz_buf png_huge(void)
{
    fz_buf b = png_make(1, 1, 8, 6, 0, 0), out = {NULL, 0, 0};
    unsigned char hdr[13];
    memcpy(hdr, b.p + 16, 13);
    hdr[0] = 0, hdr[1] = 0, hdr[2] = 0x3E, hdr[3] = 0x80;
    hdr[4] = 0, hdr[5] = 0, hdr[6] = 0x3E, hdr[7] = 0x80;
    buf_put(&out, b.p, 8);
    png_chunk(&out, "IHDR", hdr, 13);
    buf_put(&out, b.p + 8 + 25, b.n - 8 - 25); /* the 1x1 image's IDAT and IEND */
    free(b.p);
    return out;
}

typedef struct image_seed {
    const char *name;
    unsigned char mode;
    fz_buf bytes;
} image_seed;

#define RS(h, w, in_place) (4 | ((in_place) ? 8 : 0) | ((h) << 4) | ((w) << 6)) /* resize mode bits */
#define MAX_SEEDS 32

/* The valid images: every format stb_image reads that can be made here, each with a mode. */
static int make_seeds(image_seed *s)
{
    int n = 0;
#define SEED(nm, md, expr) (s[n].name = (nm), s[n].mode = (unsigned char)(md), s[n].bytes = (expr), n++)
    SEED("png_gray_7x5", 0, stbiw_image(W_PNG, 7, 5, 1));
    SEED("png_rgb_6x4", 2 | RS(1, 2, 0), stbiw_image(W_PNG, 6, 4, 3));
    SEED("png_rgba_9x3", 3 | RS(3, 3, 1), stbiw_image(W_PNG, 9, 3, 4));
    SEED("png_gray_alpha_5x5", 1, stbiw_image(W_PNG, 5, 5, 2));
    SEED("png_palette4_trns_11x5", 3, png_make(11, 5, 4, 3, 0, 0));
    SEED("png_rgb16_adam7_9x9", 2 | RS(2, 2, 0), png_make(9, 9, 16, 2, 1, 0));
    SEED("png_gray1_13x3", 0, png_make(13, 3, 1, 0, 0, 0));
    SEED("png_gray_alpha16_4x4", 1, png_make(4, 4, 16, 4, 0, 0));
    SEED("png_gray2_adam7_10x10", 0 | RS(1, 1, 1), png_make(10, 10, 2, 0, 1, 0));
    SEED("bmp_rgb_7x5", 2 | RS(2, 1, 0), stbiw_image(W_BMP, 7, 5, 3));
    SEED("bmp_rgba_4x4", 3, stbiw_image(W_BMP, 4, 4, 4));
    SEED("tga_rgb_rle_8x6", 0 | RS(1, 1, 0), stbiw_image(W_TGA, 8, 6, 3));
    SEED("tga_rgba_raw_5x3", 3, stbiw_image(W_TGA_RAW, 5, 3, 4));
    SEED("tga_gray_rle_6x2", 0, stbiw_image(W_TGA, 6, 2, 1));
    SEED("jpg_ycc444_16x16", 2 | RS(2, 2, 1), jpeg_make(16, 16, 3, 0, 0, 0));
    SEED("jpg_gray_9x7", 0, jpeg_make(9, 7, 1, 0, 0, 0));
    SEED("jpg_ycc420_33x17_restart2", 3, jpeg_make(33, 17, 3, 1, 0, 2));
    SEED("jpg_ycc444_progressive_12x10", 2, jpeg_make(12, 10, 3, 0, 1, 0));
    SEED("jpg_ycc420_progressive_21x13", 2 | RS(1, 3, 0), jpeg_make(21, 13, 3, 1, 1, 0));
    SEED("jpg_gray_progressive_17x9", 0, jpeg_make(17, 9, 1, 0, 1, 0));
    SEED("hdr_rgb_4x3", 2, stbiw_image(W_HDR, 4, 3, 3));
    SEED("hdr_rgb_rle_20x4", 2 | RS(3, 0, 0), stbiw_image(W_HDR, 20, 4, 3));
    SEED("pgm_7x5", 0, pnm_make(7, 5, 1, 255));
    SEED("ppm_6x4", 2 | RS(2, 3, 0), pnm_make(6, 4, 3, 255));
    SEED("pgm16_5x3", 1, pnm_make(5, 3, 1, 65535));
    SEED("gif_8x6_transparent", 3, gif_make(8, 6, 0, 0, 1));
    SEED("gif_7x9_interlaced_local", 2 | RS(1, 0, 0), gif_make(7, 9, 1, 1, 0));
    SEED("psd_rgb_raw_5x4", 2, psd_make(5, 4, 3, 0));
    SEED("psd_rgba_rle_6x3", 3 | RS(1, 2, 0), psd_make(6, 3, 4, 1));
#undef SEED
    return n;
}

static void free_seeds(image_seed *s, int n)
{
    int i;
    for (i = 0; i < n; i++) free(s[i].bytes.p);
}

/* The input for an image: the mode byte, then the file (malloc'd, *len bytes). */
static unsigned char *with_mode(unsigned mode, const fz_buf *b, size_t *len)
{
    unsigned char *p = (unsigned char *)malloc(b->n + 1);
    if (!p) abort();
    p[0] = (unsigned char)mode;
    memcpy(p + 1, b->p, b->n);
    *len = b->n + 1;
    return p;
}

/* One to four random edits of the file part: a bit flipped, a byte or a 16/32-bit field (either
   byte order) set to an edge value, the end cut off, or bytes appended; the mode is kept or
   replaced. Returns an exact-size copy. */
static unsigned char *mutate(const unsigned char *seed, size_t n, ad_rng *r, size_t *len)
{
    static const uint32_t words[] = {0, 1, 2, 3, 7, 8, 15, 16, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF,
                                     0x80000000u, 0xFFFFFFFFu};
    unsigned char *m = (unsigned char *)malloc(n + 64);
    size_t size = n;
    int edits = 1 + (int)ad_rng_below(r, 4), k;
    if (!m) abort();
    memcpy(m, seed, n);
    if (ad_rng_below(r, 4) == 0) m[0] = (unsigned char)ad_rng_next(r);
    for (k = 0; k < edits && size > 1; k++) {
        size_t at = 1 + (size_t)ad_rng_below(r, size - 1);
        uint32_t x = words[ad_rng_below(r, sizeof words / sizeof words[0])];
        int i;
        switch (ad_rng_below(r, 6)) {
        case 0: m[at] ^= (unsigned char)(1u << ad_rng_below(r, 8)); break;
        case 1: m[at] = (unsigned char)x; break;
        case 2: /* big-endian word */
            for (i = 0; i < 4 && at + (size_t)i < size; i++) m[at + (size_t)i] = (unsigned char)(x >> (24 - 8 * i));
            break;
        case 3: /* little-endian 16-bit field */
            for (i = 0; i < 2 && at + (size_t)i < size; i++) m[at + (size_t)i] = (unsigned char)(x >> (8 * i));
            break;
        case 4: size = at; break;
        default: {
            size_t extra = 1 + (size_t)ad_rng_below(r, 32), i2;
            if (size + extra > n + 64) break;
            for (i2 = 0; i2 < extra; i2++) m[size + i2] = (unsigned char)ad_rng_next(r);
            size += extra;
        }
        }
    }
    {
        unsigned char *exact = (unsigned char *)malloc(size);
        if (!exact) abort();
        memcpy(exact, m, size);
        free(m);
        *len = size;
        return exact;
    }
}

static long run_builtin(int per_seed)
{
    image_seed s[MAX_SEEDS];
    int n = make_seeds(s), i, k;
    long runs = 0;
    ad_rng r;
    ad_rng_seed(&r, 4242);
    for (i = 0; i < n; i++) {
        size_t len, mlen;
        unsigned char *in = with_mode(s[i].mode, &s[i].bytes, &len);
        char label[128];
        snprintf(label, sizeof label, "built-in seed %s", s[i].name);
        fuzz_run_one(LLVMFuzzerTestOneInput, in, len, label), runs++;
        for (k = 0; k < per_seed; k++, runs++) {
            unsigned char *m = mutate(in, len, &r, &mlen);
            snprintf(label, sizeof label, "built-in mutation %d of seed %s", k, s[i].name);
            fuzz_run_one(LLVMFuzzerTestOneInput, m, mlen, label);
            free(m);
        }
        free(in);
    }
    free_seeds(s, n);
    return runs;
}

static int write_input(const char *dir, const char *prefix, const char *name, unsigned mode, const fz_buf *b)
{
    char file[256];
    size_t len;
    unsigned char *in = with_mode(mode, b, &len);
    int bad;
    snprintf(file, sizeof file, "%s%s", prefix, name);
    bad = fuzz_write_file(dir, file, in, len);
    free(in);
    return bad;
}

/* --write-seeds: the valid images. --write-corpus: those, the hostile inputs, and a cut and a
   bit-flipped copy of some valid ones. */
static int write_corpus(const char *dir, int all)
{
    static const char *const damaged[] = {"png_rgb_6x4", "png_palette4_trns_11x5", "bmp_rgb_7x5", "tga_rgb_rle_8x6",
                                          "jpg_ycc420_33x17_restart2", "jpg_ycc444_progressive_12x10",
                                          "gif_8x6_transparent", "psd_rgba_rle_6x3", "hdr_rgb_rle_20x4"};
    image_seed s[MAX_SEEDS];
    int n = make_seeds(s), i, bad = 0;
    size_t d;
    ad_rng r;
    for (i = 0; i < n; i++) bad |= write_input(dir, "ok_", s[i].name, s[i].mode, &s[i].bytes);
    if (all) {
        struct {
            const char *name;
            unsigned mode;
            fz_buf b;
        } h[12];
        int nh = 0, j;
        h[nh].name = "bmp_20000x20000_header", h[nh].mode = 3, h[nh++].b = bmp_huge();
        h[nh].name = "tga_20000x20000_rle", h[nh].mode = 3, h[nh++].b = tga_huge();
        h[nh].name = "gif_20000x20000_header", h[nh].mode = 3, h[nh++].b = gif_huge();
        h[nh].name = "psd_20000x20000_header", h[nh].mode = 3, h[nh++].b = psd_huge();
        h[nh].name = "ppm_20000x20000_header", h[nh].mode = 2, h[nh++].b = pnm_huge();
        h[nh].name = "hdr_10000x10000_header", h[nh].mode = 2, h[nh++].b = hdr_huge();
        h[nh].name = "jpg_20000x20000_sof", h[nh].mode = 2, h[nh++].b = jpeg_huge();
        h[nh].name = "png_16000x16000_ihdr", h[nh].mode = 3, h[nh++].b = png_huge();
        for (i = 0; i < n; i++)
            if (strcmp(s[i].name, "jpg_ycc444_16x16") == 0)
                h[nh].name = "jpg_dht_510_codes", h[nh].mode = 2, h[nh++].b = jpeg_big_dht(&s[i].bytes);
        h[nh].name = "png_zero_length_idat", h[nh].mode = 2, h[nh++].b = png_make(6, 5, 8, 2, 0, 1);
        h[nh].name = "pgm_64x64_truncated", h[nh].mode = 0, h[nh++].b = pgm_truncated();
        for (j = 0; j < nh; j++) {
            bad |= write_input(dir, "bad_", h[j].name, h[j].mode, &h[j].b);
            free(h[j].b.p);
        }
        ad_rng_seed(&r, 77);
        for (d = 0; d < sizeof damaged / sizeof damaged[0]; d++)
            for (i = 0; i < n; i++)
                if (strcmp(s[i].name, damaged[d]) == 0) {
                    fz_buf c = s[i].bytes;
                    unsigned char *copy = (unsigned char *)malloc(c.n);
                    int f;
                    if (!copy) abort();
                    c.n = s[i].bytes.n / 2;
                    bad |= write_input(dir, "cut_", s[i].name, s[i].mode, &c);
                    memcpy(copy, s[i].bytes.p, s[i].bytes.n);
                    c.p = copy;
                    c.n = s[i].bytes.n;
                    for (f = 0; f < 3; f++) {
                        size_t at = (size_t)ad_rng_below(&r, c.n);
                        copy[at] ^= (unsigned char)(1u << ad_rng_below(&r, 8));
                    }
                    bad |= write_input(dir, "flip_", s[i].name, s[i].mode, &c);
                    free(copy);
                }
    }
    free_seeds(s, n);
    return bad;
}

int main(int argc, char **argv)
{
    long runs, files;
    int i;
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_corpus(argv[2], 0);
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2], 1);
    if (argc > 1) {
        for (i = 1; i < argc; i++) {
            size_t len;
            unsigned char *data = fuzz_read_file(argv[i], &len);
            if (!data) {
                fprintf(stderr, "image_fuzz: cannot read %s\n", argv[i]);
                return 1;
            }
            fuzz_run_one(LLVMFuzzerTestOneInput, data, len, argv[i]);
            free(data);
        }
        printf("image_fuzz: %d files, %ld decoded\n", argc - 1, image_fuzz_decoded);
        return 0;
    }
    runs = run_builtin(getenv("TH_QUICK") ? 40 : 200);
    files = fuzz_run_corpus("image_fuzz", LLVMFuzzerTestOneInput);
    if (files < 0) return 1;
    printf("image_fuzz: %ld built-in inputs and %ld corpus files, %ld decoded, no crash\n", runs, files,
           image_fuzz_decoded);
    return 0;
}
#endif
