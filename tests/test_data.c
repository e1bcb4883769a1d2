/* Tests of the data helpers: IDX files raw and gzipped (valid and damaged), MNIST-style folders,
   images through stb_image, resizing, image-folder datasets and the mini-batch iterator.
   Files are written into a fresh folder under /tmp. With MNIST_DIR set the real MNIST files are
   checked too, and with MNIST_PNG_DIR the folder of MNIST PNG digits. */
#define _POSIX_C_SOURCE 200809L
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#define AUTODIFF_DOUBLE
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "tests/harness.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- scratch files ---------------------------------------------------------------------- */
static char tmp_root[64];
static char *made[256]; /* paths made, removed in reverse order at the end */
static int nmade;

static const char *remember(const char *path)
{
    if (nmade < (int)(sizeof made / sizeof made[0])) {
        made[nmade] = (char *)malloc(strlen(path) + 1);
        strcpy(made[nmade], path);
        nmade++;
    }
    return path;
}

static void cleanup(void)
{
    while (nmade > 0) {
        nmade--;
        remove(made[nmade]);
        free(made[nmade]);
    }
}

static const char *path_of(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, 512, "%s/%s", tmp_root, name);
    return p;
}

static void make_dir(const char *name)
{
    const char *p = path_of(name);
    if (mkdir(p, 0700) == 0) remember(p);
}

static void write_file(const char *name, const unsigned char *bytes, size_t n)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    TH_CHECK(f != NULL, "cannot write %s", p);
    if (!f) return;
    if (n) fwrite(bytes, 1, n, f);
    fclose(f);
    remember(p);
}

/* ---- byte buffers and file builders ---------------------------------------------------------- */
typedef struct buf {
    unsigned char *p;
    size_t n;
} buf;

static buf buf_new(size_t n)
{
    buf b;
    b.p = (unsigned char *)calloc(n ? n : 1, 1);
    b.n = n;
    return b;
}

static buf buf_copy(buf a, size_t n) /* the first n bytes of a (n may exceed a.n: zero padded) */
{
    buf b = buf_new(n);
    memcpy(b.p, a.p, n < a.n ? n : a.n);
    return b;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_le(unsigned char *p, uint32_t v, int bytes)
{
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* An IDX file: magic, the dims as given, then npay payload bytes (pattern seeded by seed). */
static buf make_idx(uint32_t magic, int ndim, const uint32_t *dims, size_t npay, unsigned seed)
{
    buf b = buf_new(4 + 4 * (size_t)ndim + npay);
    size_t i;
    int d;
    put_be32(b.p, magic);
    for (d = 0; d < ndim; d++) put_be32(b.p + 4 + 4 * d, dims[d]);
    for (i = 0; i < npay; i++) b.p[4 + 4 * ndim + i] = (unsigned char)((i * 37 + seed * 11 + (i >> 7)) & 255);
    return b;
}

static buf make_labels(int count, int classes)
{
    uint32_t dims[1];
    buf b;
    int i;
    dims[0] = (uint32_t)count;
    b = make_idx(0x801, 1, dims, (size_t)count, 0);
    for (i = 0; i < count; i++) b.p[8 + i] = (unsigned char)((i * 7 + 3) % classes);
    return b;
}

/* gzip header options */
enum { GZ_NAME = 1, GZ_EXTRA = 2, GZ_COMMENT = 4, GZ_HCRC = 8, GZ_HUFFMAN = 16 };

/* Deflate data: stored blocks of at most 65535 bytes, or stb_image_write's compressor (its
   zlib stream without the 2-byte header and 4-byte Adler-32). */
static buf deflate(const unsigned char *raw, size_t n, int huffman)
{
    buf b;
    size_t pos = 0, o = 0;
    if (huffman) {
        int len = 0;
        unsigned char *z = stbi_zlib_compress((unsigned char *)raw, (int)n, &len, 8);
        b = buf_new((size_t)len - 6);
        memcpy(b.p, z + 2, b.n);
        STBIW_FREE(z);
        return b;
    }
    b = buf_new(n + 5 * (n / 65535 + 1));
    do {
        size_t k = n - pos < 65535 ? n - pos : 65535;
        b.p[o] = (unsigned char)(pos + k == n); /* BFINAL, BTYPE 00 */
        put_le(b.p + o + 1, (uint32_t)k, 2);
        put_le(b.p + o + 3, (uint32_t)(~k & 0xFFFF), 2);
        memcpy(b.p + o + 5, raw + pos, k);
        o += 5 + k;
        pos += k;
    } while (pos < n);
    b.n = o;
    return b;
}

static buf gzip(buf raw, int opts)
{
    static const char extra[] = "XY\3\0abc", name[] = "file.idx", comment[] = "made by test_data";
    buf z = deflate(raw.p, raw.n, opts & GZ_HUFFMAN), g = buf_new(64 + z.n);
    size_t o = 10;
    g.p[0] = 0x1f, g.p[1] = 0x8b, g.p[2] = 8;
    g.p[3] = (unsigned char)((opts & GZ_HCRC ? 2 : 0) | (opts & GZ_EXTRA ? 4 : 0) | (opts & GZ_NAME ? 8 : 0) |
                             (opts & GZ_COMMENT ? 16 : 0));
    put_le(g.p + 4, 1700000000u, 4);
    g.p[9] = 3;
    if (opts & GZ_EXTRA) {
        put_le(g.p + o, sizeof extra - 1, 2);
        memcpy(g.p + o + 2, extra, sizeof extra - 1);
        o += 2 + sizeof extra - 1;
    }
    if (opts & GZ_NAME) memcpy(g.p + o, name, sizeof name), o += sizeof name;
    if (opts & GZ_COMMENT) memcpy(g.p + o, comment, sizeof comment), o += sizeof comment;
    if (opts & GZ_HCRC) put_le(g.p + o, ad__crc32(g.p, o) & 0xFFFF, 2), o += 2;
    memcpy(g.p + o, z.p, z.n);
    o += z.n;
    put_le(g.p + o, ad__crc32(raw.p, raw.n), 4);
    put_le(g.p + o + 4, (uint32_t)raw.n, 4);
    g.n = o + 8;
    free(z.p);
    return g;
}

/* ---- checks -------------------------------------------------------------------------------- */
static void expect_refused(const char *what, buf b, const char *needle)
{
    ad_idx idx;
    char err[300] = "";
    int rc = ad_idx_parse_memory(b.p, b.n, &idx, err, sizeof err);
    TH_CHECK(rc == -1 && strstr(err, needle) && idx.data == NULL && idx.ndim == 0,
             "%s: expected a refusal containing \"%s\", got rc %d, \"%s\"", what, needle, rc, err);
    if (rc == 0) ad_idx_free(&idx);
}

/* b must parse to the given dims with payload equal to raw's bytes after the header. */
static void expect_parsed(const char *what, buf b, buf raw, int ndim, const uint32_t *dims)
{
    ad_idx idx;
    char err[300] = "";
    size_t header = 4 + 4 * (size_t)ndim;
    int rc = ad_idx_parse_memory(b.p, b.n, &idx, err, sizeof err), d, same = rc == 0 && idx.ndim == ndim;
    for (d = 0; same && d < ndim; d++) same = idx.dims[d] == (int)dims[d];
    same = same && idx.size == raw.n - header && memcmp(idx.data, raw.p + header, idx.size) == 0;
    TH_CHECK(same, "%s: rc %d \"%s\", ndim %d, size %zu", what, rc, err, idx.ndim, idx.size);
    ad_idx_free(&idx);
}

static void test_crc32(void)
{
    TH_CHECK(ad__crc32((const unsigned char *)"123456789", 9) == 0xCBF43926u, "CRC-32 check value");
    TH_CHECK(ad__crc32((const unsigned char *)"", 0) == 0, "CRC-32 of nothing");
}

static const uint32_t img_dims[3] = {3, 5, 7};

static void test_idx_valid(void)
{
    static const int opts[] = {0, GZ_NAME, GZ_EXTRA, GZ_COMMENT | GZ_HCRC,
                               GZ_EXTRA | GZ_NAME | GZ_COMMENT | GZ_HCRC, GZ_HUFFMAN, GZ_HUFFMAN | GZ_EXTRA,
                               GZ_HUFFMAN | GZ_HCRC | GZ_COMMENT};
    uint32_t big[3] = {20, 61, 59}, lab[1] = {11};
    buf im = make_idx(0x803, 3, img_dims, 105, 1), bigim = make_idx(0x803, 3, big, 20 * 61 * 59, 2);
    buf lb = make_labels(11, 10);
    ad_idx idx;
    char err[300] = "";
    size_t i;
    expect_parsed("raw images", im, im, 3, img_dims);
    expect_parsed("raw labels", lb, lb, 1, lab);
    for (i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        buf g = gzip(im, opts[i]), gb = gzip(bigim, opts[i]);
        char what[64];
        snprintf(what, sizeof what, "gzip options %d", opts[i]);
        expect_parsed(what, g, im, 3, img_dims);
        snprintf(what, sizeof what, "gzip options %d, several blocks", opts[i]);
        expect_parsed(what, gb, bigim, 3, big);
        free(g.p);
        free(gb.p);
    }
    {
        buf g = gzip(lb, GZ_HUFFMAN);
        write_file("labels-named-raw", g.p, g.n); /* gzip found by its magic, not the name */
        free(g.p);
    }
    TH_CHECK(ad_idx_load(path_of("labels-named-raw"), &idx, err, sizeof err) == 0 && idx.ndim == 1 &&
                 idx.dims[0] == 11 && memcmp(idx.data, lb.p + 8, 11) == 0,
             "gzip file without .gz in its name: %s", err);
    ad_idx_free(&idx);
    write_file("images.idx", im.p, im.n);
    TH_CHECK(ad_idx_load(path_of("images.idx"), &idx, err, sizeof err) == 0 && idx.dims[2] == 7 &&
                 memcmp(idx.data, im.p + 16, 105) == 0,
             "raw file: %s", err);
    ad_idx_free(&idx);
    TH_CHECK(ad_idx_load(path_of("missing"), &idx, err, sizeof err) == -1 && strstr(err, "cannot be opened") &&
                 strstr(err, "missing"),
             "missing file: %s", err);
    TH_CHECK(ad_idx_parse_memory(im.p, im.n, &idx, NULL, 0) == 0, "err may be NULL");
    ad_idx_free(&idx);
    TH_CHECK(ad_idx_parse_memory(im.p, 3, &idx, NULL, 0) == -1, "err may be NULL on failure too");
    free(im.p);
    free(bigim.p);
    free(lb.p);
}

static void test_idx_damaged(void)
{
    static const size_t cuts[] = {0, 1, 3, 4, 7, 8, 15, 16, 17, 60, 120};
    uint32_t dims[3];
    buf im = make_idx(0x803, 3, img_dims, 105, 3), b;
    size_t i;
    for (i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *needle = cuts[i] < 4 ? "too short for the 4-byte magic"
                             : cuts[i] < 16 ? "too short for the 16-byte header" : "truncated";
        char what[64];
        snprintf(what, sizeof what, "raw IDX cut to %zu bytes", cuts[i]);
        b = buf_copy(im, cuts[i]);
        expect_refused(what, b, needle);
        free(b.p);
    }
    b = make_labels(5, 10);
    b.n = 8;
    expect_refused("labels without data", b, "truncated");
    b.n = 6;
    expect_refused("labels cut in the header", b, "too short for the 8-byte header");
    free(b.p);
    b = buf_copy(im, im.n + 3);
    expect_refused("raw IDX with trailing garbage", b, "3 bytes of trailing garbage");
    free(b.p);

    b = buf_copy(im, im.n);
    put_be32(b.p, 0x802);
    expect_refused("magic 0x802", b, "magic 0x00000802");
    put_be32(b.p, 0x903);
    expect_refused("signed-byte IDX", b, "magic 0x00000903");
    put_be32(b.p, 0x03080000);
    expect_refused("little-endian magic", b, "magic 0x03080000");
    put_be32(b.p, 0x803);
    put_be32(b.p + 4, 4);
    expect_refused("count larger than the file", b, "the header promises 140 data bytes, the file has 105");
    put_be32(b.p + 4, 3);
    put_be32(b.p + 12, 0);
    expect_refused("zero columns", b, "dimension 2 is 0");
    put_be32(b.p + 12, 0x80000000u);
    expect_refused("columns above INT_MAX", b, "dimension 2 is 2147483648");
    free(b.p);

    dims[0] = 0x10000, dims[1] = 0x10000, dims[2] = 0x10000; /* 2^48 bytes: overflows 32 bits */
    b = make_idx(0x803, 3, dims, 16, 0);
    expect_refused("count*rows*cols overflow", b, "dimensions [65536,65536,65536] multiply to more than");
    free(b.p);
    dims[0] = 0x7FFFFFFF, dims[1] = 0x7FFFFFFF, dims[2] = 0x7FFFFFFF; /* 2^93 bytes: overflows 64 bits */
    b = make_idx(0x803, 3, dims, 16, 0);
    expect_refused("largest dimensions", b, "dimensions [2147483647,2147483647,2147483647] multiply");
    free(b.p);
    dims[0] = 60000, dims[1] = 200, dims[2] = 200; /* 2.4e9 bytes: above the 1 GiB limit */
    b = make_idx(0x803, 3, dims, 16, 0);
    expect_refused("above the size limit", b, "[60000,200,200] multiply to more than the limit of 1073741824");
    free(b.p);
    free(im.p);
}

static void test_gzip_damaged(void)
{
    buf im = make_idx(0x803, 3, img_dims, 105, 4), g = gzip(im, 0), h = gzip(im, GZ_HUFFMAN), b;
    buf named = gzip(im, GZ_NAME | GZ_HCRC);
    static const size_t cuts[] = {2, 10, 17, 18, 30, 60};
    size_t i, hdr = 10;
    for (i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "gzip cut to %zu bytes", cuts[i]);
        b = buf_copy(g, cuts[i]);
        expect_refused(what, b, "gzip");
        free(b.p);
    }
    b = buf_copy(g, g.n - 1);
    expect_refused("gzip without its last byte", b, "gzip");
    free(b.p);

    b = buf_copy(g, g.n);
    b.p[2] = 7;
    expect_refused("compression method 7", b, "compression method 7");
    b.p[2] = 8, b.p[3] = 0x20;
    expect_refused("reserved flag", b, "reserved flag bits");
    free(b.p);
    b = buf_copy(named, named.n);
    b.p[14] ^= 1; /* a letter of FNAME: the header CRC no longer matches */
    expect_refused("header CRC", b, "header CRC mismatch");
    free(b.p);
    b = buf_copy(named, 20); /* FNAME never terminated */
    memset(b.p + hdr, 'a', b.n - hdr);
    expect_refused("unterminated FNAME", b, "FNAME");
    free(b.p);

    b = buf_copy(g, g.n);
    b.p[hdr] = 1 | 3 << 1; /* BTYPE 11 is reserved */
    expect_refused("reserved block type", b, "deflate data is corrupt");
    b.p[hdr] = 1;
    b.p[hdr + 3] ^= 0xFF; /* NLEN no longer the complement of LEN */
    expect_refused("stored block LEN/NLEN", b, "deflate data is corrupt");
    free(b.p);
    b = buf_copy(h, h.n);
    b.p[hdr] ^= 0x06; /* fixed or dynamic Huffman switched */
    expect_refused("Huffman data damaged", b, "gzip:");
    free(b.p);

    b = buf_copy(g, g.n);
    put_le(b.p + b.n - 4, (uint32_t)im.n + 1, 4);
    expect_refused("ISIZE one too large", b, "ISIZE says 122 bytes but the deflate data holds 121");
    put_le(b.p + b.n - 4, (uint32_t)im.n - 1, 4);
    expect_refused("ISIZE one too small", b, "longer than ISIZE = 120");
    put_le(b.p + b.n - 4, 0x7FFFFFF0u, 4);
    expect_refused("ISIZE impossible", b, "ISIZE");
    put_le(b.p + b.n - 4, (uint32_t)im.n, 4);
    b.p[b.n - 8] ^= 0x10;
    expect_refused("CRC-32 wrong", b, "CRC-32 mismatch");
    free(b.p);
    b = buf_copy(h, h.n + 4);
    expect_refused("bytes after the gzip member", b, "gzip:");
    free(b.p);

    b = buf_copy(im, im.n + 2); /* the inflated IDX itself has trailing bytes */
    free(g.p);
    g = gzip(b, GZ_HUFFMAN);
    expect_refused("gzipped IDX with trailing garbage", g, "2 bytes of trailing garbage");
    free(b.p);
    b = buf_copy(im, 50);
    free(g.p);
    g = gzip(b, 0);
    expect_refused("gzipped IDX cut short", g, "truncated");
    free(b.p);
    free(g.p);
    free(h.p);
    free(named.p);
    free(im.p);
}

/* ---- MNIST-style folders --------------------------------------------------------------------- */
static void test_mnist_folder(void)
{
    uint32_t dims[3] = {6, 4, 3};
    buf im = make_idx(0x803, 3, dims, 72, 5), lb = make_labels(6, 4), g = gzip(im, GZ_HUFFMAN), other;
    ad_dataset ds;
    char err[300] = "";
    int i, ok;
    make_dir("mn");
    write_file("mn/train-images-idx3-ubyte.gz", g.p, g.n);
    write_file("mn/train-labels-idx1-ubyte", lb.p, lb.n);
    TH_CHECK(ad_mnist_load(path_of("mn"), "train", &ds, err, sizeof err) == 0, "mnist folder: %s", err);
    ok = ds.count == 6 && ds.ndim == 3 && ds.shape[0] == 1 && ds.shape[1] == 4 && ds.shape[2] == 3 &&
         ds.sample_size == 12 && ds.classes == 4 && ds.class_names == NULL;
    for (i = 0; ok && i < 72; i++) ok = ds.x[i] == (ad_real)(im.p[16 + i] / 255.0);
    for (i = 0; ok && i < 6; i++) ok = ds.labels[i] == lb.p[8 + i];
    TH_CHECK(ok, "mnist folder: dataset contents");
    ad_dataset_free(&ds);
    TH_CHECK(ds.x == NULL && ds.count == 0, "ad_dataset_free zeroes");

    /* the raw file is preferred over the .gz one */
    other = make_idx(0x803, 3, dims, 72, 9);
    write_file("mn/train-images-idx3-ubyte", other.p, other.n);
    TH_CHECK(ad_mnist_load(path_of("mn"), "train", &ds, err, sizeof err) == 0 &&
                 ds.x[5] == (ad_real)(other.p[21] / 255.0) && other.p[21] != im.p[21],
             "raw preferred: %s", err);
    ad_dataset_free(&ds);

    TH_CHECK(ad_mnist_load(path_of("mn"), "t10k", &ds, err, sizeof err) == -1 && strstr(err, "neither") &&
                 strstr(err, "t10k-images-idx3-ubyte.gz") && ds.x == NULL,
             "missing split: %s", err);
    free(lb.p);
    lb = make_labels(5, 4);
    write_file("mn/t10k-images-idx3-ubyte", im.p, im.n);
    write_file("mn/t10k-labels-idx1-ubyte", lb.p, lb.n);
    TH_CHECK(ad_mnist_load(path_of("mn"), "t10k", &ds, err, sizeof err) == -1 &&
                 strstr(err, "6 images but 5 labels"),
             "count mismatch: %s", err);
    write_file("mn/t10k-labels-idx1-ubyte", im.p, im.n);
    TH_CHECK(ad_mnist_load(path_of("mn"), "t10k", &ds, err, sizeof err) == -1 && strstr(err, "labels must be"),
             "images given as labels: %s", err);
    write_file("mn/t10k-images-idx3-ubyte", g.p, g.n - 1);
    TH_CHECK(ad_mnist_load(path_of("mn"), "t10k", &ds, err, sizeof err) == -1 && strstr(err, "gzip") &&
                 strstr(err, "t10k-images-idx3-ubyte"),
             "damaged file named in the error: %s", err);
    free(im.p);
    free(lb.p);
    free(g.p);
    free(other.p);
}

static void check_real_split(const char *dir, const char *split, int count, const int *first)
{
    ad_dataset ds;
    char err[300] = "";
    ad_real lo = 1, hi = 0;
    size_t i;
    int ok, k, counts[10] = {0};
    TH_CHECK(ad_mnist_load(dir, split, &ds, err, sizeof err) == 0, "real MNIST %s: %s", split, err);
    if (!ds.x) return;
    ok = ds.count == count && ds.shape[0] == 1 && ds.shape[1] == 28 && ds.shape[2] == 28 && ds.classes == 10;
    TH_CHECK(ok, "real MNIST %s: count %d, shape [%d,%d,%d], classes %d", split, ds.count, ds.shape[0],
             ds.shape[1], ds.shape[2], ds.classes);
    for (k = 0; k < 5; k++)
        TH_CHECK(ds.labels[k] == first[k], "real MNIST %s: label %d is %d", split, k, ds.labels[k]);
    for (i = 0; i < (size_t)ds.count * ds.sample_size; i++) {
        if (ds.x[i] < lo) lo = ds.x[i];
        if (ds.x[i] > hi) hi = ds.x[i];
    }
    TH_CHECK(lo == 0 && hi == 1, "real MNIST %s: pixel range [%g, %g]", split, (double)lo, (double)hi);
    for (k = 0; k < ds.count; k++) counts[ds.labels[k]]++;
    for (k = 0, ok = 1; k < 10; k++) ok = ok && counts[k] > ds.count / 20;
    TH_CHECK(ok, "real MNIST %s: every digit is common", split);
    ad_dataset_free(&ds);
}

/* Whether dir holds MNIST's test images (raw or gzipped): make exports a default MNIST_DIR that
   need not exist yet. */
static int has_mnist(const char *dir)
{
    char path[600];
    FILE *f;
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte", dir);
    f = fopen(path, "rb");
    if (!f) {
        strcat(path, ".gz");
        f = fopen(path, "rb");
    }
    if (f) fclose(f);
    return f != NULL;
}

static void test_real_mnist(void)
{
    static const int train_first[5] = {5, 0, 4, 1, 9}, test_first[5] = {7, 2, 1, 0, 4};
    const char *dir = getenv("MNIST_DIR");
    if (!dir || !*dir || !has_mnist(dir)) {
        printf("real MNIST: skipped (set MNIST_DIR to a folder with the MNIST files)\n");
        return;
    }
    check_real_split(dir, "t10k", 10000, test_first);
    if (getenv("TH_QUICK")) printf("real MNIST train: skipped under TH_QUICK\n");
    else check_real_split(dir, "train", 60000, train_first);
}

/* ---- images -------------------------------------------------------------------------------- */
/* h x w x c bytes with a fixed pattern */
static unsigned char *pattern(int h, int w, int c, int seed)
{
    unsigned char *p = (unsigned char *)malloc((size_t)h * w * c);
    int i;
    for (i = 0; i < h * w * c; i++) p[i] = (unsigned char)((i * 53 + seed * 29 + i / 7) & 255);
    return p;
}

/* img must hold pix (interleaved h x w x c) as planes */
static int same_planes(const ad_image *img, const unsigned char *pix, int h, int w, int c)
{
    int ch, i;
    if (!img->data || img->channels != c || img->height != h || img->width != w) return 0;
    for (ch = 0; ch < c; ch++)
        for (i = 0; i < h * w; i++)
            if (img->data[ch * h * w + i] != (ad_real)(pix[i * c + ch] / 255.0)) return 0;
    return 1;
}

static buf read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    buf b = buf_new(1 << 16);
    b.n = f ? fread(b.p, 1, b.n, f) : 0;
    if (f) fclose(f);
    return b;
}

static void test_images(void)
{
    unsigned char *gray = pattern(5, 7, 1, 1), *rgb = pattern(5, 7, 3, 2);
    ad_image img;
    char err[300] = "";
    buf b;
    remember(path_of("g.png"));
    remember(path_of("c.png"));
    remember(path_of("c.bmp"));
    stbi_write_png(path_of("g.png"), 7, 5, 1, gray, 7);
    stbi_write_png(path_of("c.png"), 7, 5, 3, rgb, 21);
    stbi_write_bmp(path_of("c.bmp"), 7, 5, 3, rgb);
    TH_CHECK(ad_image_load(path_of("g.png"), 1, &img, err, sizeof err) == 0 && same_planes(&img, gray, 5, 7, 1),
             "gray PNG: %s", err);
    ad_image_free(&img);
    TH_CHECK(ad_image_load(path_of("c.png"), 3, &img, err, sizeof err) == 0 && same_planes(&img, rgb, 5, 7, 3),
             "RGB PNG as [3,5,7]: %s", err);
    ad_image_free(&img);
    TH_CHECK(ad_image_load(path_of("c.bmp"), 3, &img, err, sizeof err) == 0 && same_planes(&img, rgb, 5, 7, 3),
             "RGB BMP: %s", err);
    ad_image_free(&img);
    TH_CHECK(ad_image_load(path_of("c.png"), 1, &img, err, sizeof err) == 0 && img.channels == 1 &&
                 img.height == 5 && img.width == 7,
             "RGB PNG as gray: %s", err);
    ad_image_free(&img);
    b = read_all(path_of("c.png"));
    TH_CHECK(ad_image_load_memory(b.p, b.n, 3, &img, err, sizeof err) == 0 && same_planes(&img, rgb, 5, 7, 3),
             "PNG from memory: %s", err);
    ad_image_free(&img);
    TH_CHECK(ad_image_load_memory(b.p, b.n / 2, 3, &img, err, sizeof err) == -1 &&
                 strstr(err, "ad_image_load_memory: corrupt PNG: a chunk is longer than the file") && img.data == NULL,
             "half a PNG: %s", err);
    TH_CHECK(ad_image_load_memory(b.p, 40, 3, &img, err, sizeof err) == -1 && strstr(err, "cannot decode") &&
                 img.data == NULL,
             "a PNG cut after its header: %s", err);
    TH_CHECK(ad_image_load_memory(b.p, b.n, 5, &img, err, sizeof err) == -1 && strstr(err, "channels 5"),
             "5 channels: %s", err);
    TH_CHECK(ad_image_load(path_of("nothing.png"), 1, &img, err, sizeof err) == -1 && strstr(err, "cannot be opened"),
             "missing image: %s", err);
    free(b.p);
    free(gray);
    free(rgb);
}

static ad_image image_of(int c, int h, int w, const ad_real *values)
{
    ad_image img;
    img.channels = c, img.height = h, img.width = w;
    img.data = (ad_real *)malloc(sizeof(ad_real) * (size_t)(c * h * w));
    memcpy(img.data, values, sizeof(ad_real) * (size_t)(c * h * w));
    return img;
}

static int close_to(ad_real a, double b) { return fabs((double)a - b) < 1e-6; }

static void test_resize(void)
{
    static const ad_real ramp[2] = {0, 1}, five[5] = {0, 0.25f, 0.5f, 0.75f, 1};
    ad_real block[4 * 6], values[3 * 5 * 7];
    ad_image src, dst;
    char err[300] = "";
    int i, ok;
    ad_rng r;
    for (i = 0; i < 24; i++) block[i] = (ad_real)(((i / 6) / 2 * 3 + (i % 6) / 2) / 8.0); /* 2x2 blocks */
    src = image_of(1, 4, 6, block);
    TH_CHECK(ad_image_resize(&src, 2, 3, &dst, err, sizeof err) == 0, "resize: %s", err);
    for (i = 0, ok = dst.height == 2 && dst.width == 3; ok && i < 6; i++) ok = close_to(dst.data[i], i / 8.0);
    TH_CHECK(ok, "4x6 -> 2x3 averages the 2x2 blocks");
    ad_image_free(&dst);
    TH_CHECK(ad_image_resize(&src, 4, 6, &dst, err, sizeof err) == 0 &&
                 memcmp(dst.data, src.data, sizeof block) == 0,
             "same size is a copy");
    ad_image_free(&dst);
    free(src.data);

    src = image_of(1, 1, 2, ramp);
    TH_CHECK(ad_image_resize(&src, 1, 4, &dst, err, sizeof err) == 0 && close_to(dst.data[0], 0) &&
                 close_to(dst.data[1], 0.25) && close_to(dst.data[2], 0.75) && close_to(dst.data[3], 1),
             "1x2 -> 1x4 interpolates between pixel centres");
    ad_image_free(&dst);
    free(src.data);
    src = image_of(1, 1, 5, five);
    TH_CHECK(ad_image_resize(&src, 1, 2, &dst, err, sizeof err) == 0 &&
                 close_to(dst.data[0], (0 + 0.25 + 0.5 * 0.5) / 2.5) &&
                 close_to(dst.data[1], (0.5 * 0.5 + 0.75 + 1) / 2.5),
             "1x5 -> 1x2 averages fractional cells");
    ad_image_free(&dst);
    free(src.data);

    ad_rng_seed(&r, 7);
    for (i = 0; i < 3 * 5 * 7; i++) values[i] = (ad_real)ad_rng_uniform(&r);
    values[0] = 0, values[1] = 1;
    src = image_of(3, 5, 7, values);
    TH_CHECK(ad_image_resize(&src, 9, 3, &src, err, sizeof err) == 0 && src.channels == 3 && src.height == 9 &&
                 src.width == 3,
             "in-place resize of [3,5,7] to [3,9,3]: %s", err);
    for (i = 0, ok = 1; i < 3 * 9 * 3; i++) ok = ok && src.data[i] >= 0 && src.data[i] <= 1;
    TH_CHECK(ok, "resized values stay in [0, 1]");
    for (i = 0; i < 3 * 9 * 3; i++) src.data[i] = (ad_real)0.375;
    TH_CHECK(ad_image_resize(&src, 2, 11, &dst, err, sizeof err) == 0, "resize: %s", err);
    for (i = 0, ok = 1; i < 3 * 2 * 11; i++) ok = ok && close_to(dst.data[i], 0.375);
    TH_CHECK(ok, "a constant image stays constant");
    ad_image_free(&dst);
    TH_CHECK(ad_image_resize(&src, 0, 3, &dst, err, sizeof err) == -1 && strstr(err, "empty") && dst.data == NULL,
             "size 0 refused: %s", err);
    ad_image_free(&src);
}

/* ---- image folders ------------------------------------------------------------------------- */
static void write_png(const char *name, int h, int w, int c, int seed)
{
    unsigned char *p = pattern(h, w, c, seed);
    remember(path_of(name));
    stbi_write_png(path_of(name), w, h, c, p, w * c);
    free(p);
}

static void test_folder(void)
{
    ad_dataset ds;
    ad_image img;
    char err[300] = "";
    unsigned char *p;
    int i, ok;
    make_dir("f");
    make_dir("f/cat");
    make_dir("f/dog");
    make_dir("f/ant");
    make_dir("f/empty");
    write_png("f/cat/b.png", 5, 7, 1, 10);
    write_png("f/cat/a.PNG", 5, 7, 1, 11);
    write_png("f/ant/z.png", 5, 7, 1, 12);
    write_png("f/ant/y.png", 5, 7, 3, 13);
    write_png("f/ant/.hidden.png", 5, 7, 1, 14);
    write_file("f/ant/notes.txt", (const unsigned char *)"x", 1);
    p = pattern(5, 7, 1, 15);
    remember(path_of("f/dog/c.bmp"));
    stbi_write_bmp(path_of("f/dog/c.bmp"), 7, 5, 1, p);
    free(p);
    TH_CHECK(ad_folder_load(path_of("f"), 1, 0, 0, &ds, err, sizeof err) == 0, "folder: %s", err);
    ok = ds.count == 5 && ds.classes == 4 && ds.ndim == 3 && ds.shape[0] == 1 && ds.shape[1] == 5 &&
         ds.shape[2] == 7;
    TH_CHECK(ok, "folder: %d samples, %d classes", ds.count, ds.classes);
    if (ok) {
        static const int labels[5] = {0, 0, 1, 1, 2}; /* ant: y z, cat: a.PNG b, dog: c */
        static const char *const names[4] = {"ant", "cat", "dog", "empty"};
        for (i = 0; i < 5; i++) TH_CHECK(ds.labels[i] == labels[i], "folder: label %d is %d", i, ds.labels[i]);
        for (i = 0; i < 4; i++) TH_CHECK(strcmp(ds.class_names[i], names[i]) == 0, "folder: class %d", i);
        p = pattern(5, 7, 1, 11); /* sample 2 is cat/a.PNG */
        for (i = 0, ok = 1; i < 35; i++) ok = ok && ds.x[2 * 35 + i] == (ad_real)(p[i] / 255.0);
        TH_CHECK(ok, "folder: pixels of cat/a.PNG");
        free(p);
    }
    ad_dataset_free(&ds);
    TH_CHECK(ad_folder_load(path_of("f"), 3, 0, 0, &ds, err, sizeof err) == 0 && ds.shape[0] == 3 &&
                 ds.sample_size == 105,
             "folder as RGB: %s", err);
    ad_dataset_free(&ds);

    write_png("f/dog/d.png", 8, 4, 1, 16);
    TH_CHECK(ad_folder_load(path_of("f"), 1, 0, 0, &ds, err, sizeof err) == -1 &&
                 strstr(err, "d.png: 8x4 pixels") && ds.x == NULL,
             "different size refused: %s", err);
    TH_CHECK(ad_folder_load(path_of("f"), 1, 5, 7, &ds, err, sizeof err) == 0 && ds.count == 6, "resize: %s", err);
    if (ds.count == 6) {
        ad_image resized;
        ad_image_load(path_of("f/dog/d.png"), 1, &img, err, sizeof err);
        ad_image_resize(&img, 5, 7, &resized, err, sizeof err);
        TH_CHECK(resized.data && memcmp(resized.data, ds.x + 5 * 35, 35 * sizeof(ad_real)) == 0,
                 "folder: d.png resized to 5x7");
        ad_image_free(&img);
        ad_image_free(&resized);
    }
    ad_dataset_free(&ds);
    TH_CHECK(ad_folder_load(path_of("f"), 1, 5, 0, &ds, err, sizeof err) == -1 && strstr(err, "give both"),
             "height without width: %s", err);
    TH_CHECK(ad_folder_load(path_of("f/empty"), 1, 0, 0, &ds, err, sizeof err) == -1 &&
                 strstr(err, "no class folders"),
             "no classes: %s", err);
    make_dir("g");
    make_dir("g/only");
    TH_CHECK(ad_folder_load(path_of("g"), 1, 0, 0, &ds, err, sizeof err) == -1 && strstr(err, "no images"),
             "no images: %s", err);
    write_file("g/only/broken.png", (const unsigned char *)"\x89PNG\r\n\x1a\n....", 12);
    TH_CHECK(ad_folder_load(path_of("g"), 1, 0, 0, &ds, err, sizeof err) == -1 && strstr(err, "broken.png") &&
                 strstr(err, "cannot decode"),
             "broken image named: %s", err);
    TH_CHECK(ad_folder_load(path_of("nowhere"), 1, 0, 0, &ds, err, sizeof err) == -1 &&
                 strstr(err, "cannot open folder"),
             "missing root: %s", err);
}

/* The first file (in name order) of class folder dir/<label>, as a number; -1 if none. */
static long first_index(const char *dir, int label)
{
    char path[600];
    DIR *d;
    struct dirent *e;
    long best = -1;
    snprintf(path, sizeof path, "%s/%d", dir, label);
    d = opendir(path);
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) {
        long v = strtol(e->d_name, NULL, 10);
        if (e->d_name[0] != '.' && (best < 0 || v < best)) best = v; /* equal lengths: name order */
    }
    closedir(d);
    return best;
}

static void test_png_mnist(void)
{
    const char *dir = getenv("MNIST_PNG_DIR"), *mnist = getenv("MNIST_DIR");
    ad_dataset ds, ref;
    char err[300] = "";
    int c, i, counts[10] = {0}, ok;
    if (!dir || !*dir) {
        printf("MNIST PNG folder: skipped (set MNIST_PNG_DIR to use it)\n");
        return;
    }
    TH_CHECK(ad_folder_load(dir, 1, 0, 0, &ds, err, sizeof err) == 0, "MNIST PNG folder: %s", err);
    if (!ds.x) return;
    TH_CHECK(ds.count == 1000 && ds.classes == 10 && ds.shape[1] == 28 && ds.shape[2] == 28,
             "MNIST PNG folder: %d samples, %d classes", ds.count, ds.classes);
    for (i = 0; i < ds.count; i++) counts[ds.labels[i]]++;
    for (c = 0, ok = 1; c < 10; c++) ok = ok && counts[c] == 100 && ds.class_names[c][0] == '0' + c;
    TH_CHECK(ok, "MNIST PNG folder: 100 per class, names 0..9");
    if (mnist && *mnist && has_mnist(mnist) && ad_mnist_load(mnist, "t10k", &ref, err, sizeof err) == 0) {
        for (c = 0; c < 10; c++) { /* the first PNG of each class is t10k image (its number - 60000) */
            long k = first_index(dir, c) - 60000;
            const ad_real *png = ds.x + (size_t)(100 * c) * ds.sample_size;
            ok = k >= 0 && k < ref.count && ref.labels[k] == c &&
                 memcmp(png, ref.x + (size_t)k * ref.sample_size, 784 * sizeof(ad_real)) == 0;
            TH_CHECK(ok, "MNIST PNG class %d matches t10k image %ld", c, k);
        }
        ad_dataset_free(&ref);
    }
    ad_dataset_free(&ds);
}

/* ---- batches ------------------------------------------------------------------------------- */
/* count samples of shape [2,3]; every value of sample i is i / 1000 + j / 10^5 */
static ad_dataset toy_dataset(int count)
{
    ad_dataset ds;
    int shape[2] = {2, 3}, i, j;
    ad__dataset_alloc(&ds, count, 2, shape, 1, NULL, 0);
    for (i = 0; i < count; i++) {
        ds.labels[i] = i;
        for (j = 0; j < 6; j++) ds.x[i * 6 + j] = (ad_real)(i / 1000.0 + j / 100000.0);
    }
    ds.classes = count;
    return ds;
}

/* Runs one epoch; order receives the sample indices. Returns the number of samples seen, or -1
   when a batch's x rows do not match its labels or a batch size is wrong. */
static int epoch(ad_batcher *b, int batch, int count, int drop_last, int *order)
{
    ad_real x[64 * 6];
    int labels[64], n, seen = 0, i, j;
    while ((n = ad_batcher_next(b, x, labels)) > 0) {
        int expected = count - seen < batch ? count - seen : batch;
        if (n != expected || (drop_last && n != batch)) return -1;
        for (i = 0; i < n; i++) {
            for (j = 0; j < 6; j++)
                if (x[i * 6 + j] != (ad_real)(labels[i] / 1000.0 + j / 100000.0)) return -1;
            order[seen + i] = labels[i];
        }
        seen += n;
    }
    return seen;
}

static int is_permutation(const int *order, int n)
{
    int seen[64] = {0}, i;
    for (i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= n || seen[order[i]]) return 0;
        seen[order[i]] = 1;
    }
    return 1;
}

static void test_batcher(void)
{
    ad_dataset ds = toy_dataset(23), small = toy_dataset(4);
    ad_batcher a, b, c;
    char err[300] = "";
    int oa[3][23], ob[23], oc[23], i, e, ok, distinct, counts[256] = {0};
    TH_CHECK(ad_batcher_init(&a, &ds, 5, AD_BATCH_SHUFFLE, 42, err, sizeof err) == 0, "batcher: %s", err);
    ad_batcher_init(&b, &ds, 5, AD_BATCH_SHUFFLE, 42, err, sizeof err);
    ad_batcher_init(&c, &ds, 5, AD_BATCH_SHUFFLE, 43, err, sizeof err);
    for (e = 0; e < 3; e++) {
        TH_CHECK(epoch(&a, 5, 23, 0, oa[e]) == 23 && is_permutation(oa[e], 23), "epoch %d: every sample once", e);
        TH_CHECK(epoch(&b, 5, 23, 0, ob) == 23 && memcmp(oa[e], ob, sizeof ob) == 0, "epoch %d: same seed", e);
        TH_CHECK(epoch(&c, 5, 23, 0, oc) == 23 && memcmp(oa[e], oc, sizeof oc) != 0, "epoch %d: other seed", e);
        TH_CHECK(ad_batcher_next(&a, NULL, NULL) == 0, "epoch %d is over", e);
        ad_batcher_reset(&a);
        ad_batcher_reset(&b);
        ad_batcher_reset(&c);
    }
    TH_CHECK(memcmp(oa[0], oa[1], sizeof oa[0]) != 0 && memcmp(oa[1], oa[2], sizeof oa[0]) != 0,
             "each epoch has a new order");
    for (i = 0, ok = 1; i < 23; i++) ok = ok && oa[0][i] == i;
    TH_CHECK(!ok, "shuffled order is not the identity");
    ad_batcher_free(&a);
    ad_batcher_free(&b);
    ad_batcher_free(&c);

    ad_batcher_init(&a, &ds, 5, 0, 1, err, sizeof err);
    TH_CHECK(epoch(&a, 5, 23, 0, ob) == 23, "unshuffled epoch");
    for (i = 0, ok = 1; i < 23; i++) ok = ok && ob[i] == i;
    TH_CHECK(ok, "unshuffled order is 0..count-1");
    ad_batcher_free(&a);
    ad_batcher_init(&a, &ds, 5, AD_BATCH_SHUFFLE | AD_BATCH_DROP_LAST, 1, err, sizeof err);
    TH_CHECK(epoch(&a, 5, 23, 1, ob) == 20, "drop_last: four full batches");
    ad_batcher_free(&a);
    ad_batcher_init(&a, &ds, 64, 0, 1, err, sizeof err);
    TH_CHECK(epoch(&a, 64, 23, 0, ob) == 23, "one batch larger than the dataset");
    ad_batcher_free(&a);

    /* every permutation of 4 samples about equally often: 24000 epochs, 1000 expected each
       (standard deviation 31; the bound is 7 of them) */
    ad_batcher_init(&a, &small, 4, AD_BATCH_SHUFFLE, 5, err, sizeof err);
    for (e = 0; e < 24000; e++) {
        int o[4];
        epoch(&a, 4, 4, 0, o);
        counts[((o[0] * 4 + o[1]) * 4 + o[2]) * 4 + o[3]]++;
        ad_batcher_reset(&a);
    }
    for (i = 0, ok = 1, distinct = 0; i < 256; i++)
        if (counts[i]) distinct++, ok = ok && abs(counts[i] - 1000) < 220;
    TH_CHECK(ok && distinct == 24, "Fisher-Yates gives each of the 24 orders equally often (%d seen)", distinct);
    ad_batcher_free(&a);

    TH_CHECK(ad_batcher_init(&a, &ds, 0, 0, 1, err, sizeof err) == -1 && strstr(err, "batch_size 0"), "%s", err);
    TH_CHECK(ad_batcher_init(&a, &ds, 4, 8, 1, err, sizeof err) == -1 && strstr(err, "unknown flags"), "%s", err);
    ad_dataset_free(&small);
    TH_CHECK(ad_batcher_init(&a, &small, 4, 0, 1, err, sizeof err) == -1 && strstr(err, "empty"), "%s", err);
    TH_CHECK(ad_batcher_next(&a, NULL, NULL) == 0, "a failed batcher gives nothing");
    ad_dataset_free(&ds);
}

/* A batcher put back at a saved position gives the batches that came next then, in this epoch
   and the ones after; a state of another batcher is refused with the batcher unchanged. */
static void test_batcher_state(void)
{
    ad_dataset ds = toy_dataset(23), other = toy_dataset(22);
    ad_batcher a, b, c;
    unsigned char state[AD_BATCHER_STATE_BYTES], mid[AD_BATCHER_STATE_BYTES], zero[AD_BATCHER_STATE_BYTES];
    char err[300] = "";
    int oa[23], ob[23], flags, e, i, ok;
    for (flags = 0; flags <= 3; flags++) {
        ad_batcher_init(&a, &ds, 5, flags, 42, err, sizeof err);
        ad_batcher_init(&b, &ds, 5, flags, 7, err, sizeof err); /* another seed: the state decides */
        epoch(&a, 5, 23, flags & AD_BATCH_DROP_LAST, oa);
        ad_batcher_reset(&a);
        ad_batcher_next(&a, NULL, NULL); /* one batch into the second epoch */
        ad_batcher_get_state(&a, mid);
        TH_CHECK(ad_batcher_set_state(&b, mid, sizeof mid, err, sizeof err) == 0, "flags %d: set: %s", flags, err);
        for (e = 0, ok = 1; e < 3; e++) {
            int na = epoch(&a, 5, e ? 23 : 18, flags & AD_BATCH_DROP_LAST, oa);
            int nb = epoch(&b, 5, e ? 23 : 18, flags & AD_BATCH_DROP_LAST, ob);
            ok = ok && na == nb && na > 0 && memcmp(oa, ob, (size_t)na * sizeof(int)) == 0;
            ad_batcher_reset(&a);
            ad_batcher_reset(&b);
        }
        TH_CHECK(ok, "flags %d: the restored batcher gives the same batches for three epochs", flags);
        ad_batcher_free(&a);
        ad_batcher_free(&b);
    }
    ad_batcher_init(&a, &ds, 5, AD_BATCH_SHUFFLE, 42, err, sizeof err);
    ad_batcher_get_state(&a, state);
    ad_batcher_init(&b, &ds, 4, AD_BATCH_SHUFFLE, 42, err, sizeof err);
    ad_batcher_init(&c, &other, 5, AD_BATCH_SHUFFLE, 42, err, sizeof err);
    ad_batcher_get_state(&b, mid);
    TH_CHECK(ad_batcher_set_state(&b, state, sizeof state, err, sizeof err) == -1 &&
                 strstr(err, "ad_batcher_set_state: the state is of a batcher over 23 samples in batches of 5"),
             "another batch size: %s", err);
    ad_batcher_get_state(&b, zero);
    TH_CHECK(memcmp(mid, zero, sizeof mid) == 0, "a refused state left the batcher as it was");
    TH_CHECK(ad_batcher_set_state(&c, state, sizeof state, err, sizeof err) == -1 && strstr(err, "22"),
             "another dataset size: %s", err);
    TH_CHECK(ad_batcher_set_state(&a, state, 10, err, sizeof err) == -1 && strstr(err, "not a batcher state"),
             "short state: %s", err);
    memcpy(mid, state, sizeof state);
    mid[16] = 24; /* position past the end */
    TH_CHECK(ad_batcher_set_state(&a, mid, sizeof mid, err, sizeof err) == -1 && strstr(err, "position 24"),
             "position past the end: %s", err);
    memset(zero, 0, sizeof zero);
    TH_CHECK(ad_batcher_set_state(&a, zero, sizeof zero, err, sizeof err) == -1 && strstr(err, "not a batcher state"),
             "zeros: %s", err);
    for (i = 0; i < 4; i++) state[i] = 0xFF;
    ad_batcher_free(&c);
    TH_CHECK(ad_batcher_set_state(&c, state, sizeof state, err, sizeof err) == -1 && strstr(err, "not initialised"),
             "freed batcher: %s", err);
    ad_batcher_free(&a);
    ad_batcher_free(&b);
    ad_dataset_free(&ds);
    ad_dataset_free(&other);
}

/* Small files that declare huge images, or that stb_image 2.27 cannot read safely, are refused
   from their headers. */
static void test_hostile_images(void)
{
    unsigned char bmp[54], jpeg[64];
    ad_image img;
    char err[300] = "";
    int i;
    /* a BMP header of 20000 x 20000 pixels, 24 bits, and no pixels */
    memset(bmp, 0, sizeof bmp);
    bmp[0] = 'B', bmp[1] = 'M';
    bmp[2] = 54, bmp[10] = 54, bmp[14] = 40;
    bmp[18] = 0x20, bmp[19] = 0x4E, bmp[22] = 0x20, bmp[23] = 0x4E; /* 20000 */
    bmp[26] = 1, bmp[28] = 24;
    TH_CHECK(ad_image_load_memory(bmp, sizeof bmp, 3, &img, err, sizeof err) == -1 && img.data == NULL &&
                 strstr(err, "ad_image_load_memory: the file declares 20000x20000 pixels"),
             "a 54-byte BMP of 20000x20000 pixels: %s", err);
    /* SOI, then a DHT segment whose table declares 16 * 255 codes */
    memset(jpeg, 0, sizeof jpeg);
    jpeg[0] = 0xFF, jpeg[1] = 0xD8, jpeg[2] = 0xFF, jpeg[3] = 0xC4, jpeg[4] = 0, jpeg[5] = 19;
    for (i = 0; i < 16; i++) jpeg[7 + i] = 0xFF;
    TH_CHECK(ad_image_load_memory(jpeg, sizeof jpeg, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "Huffman table declares more than 256 codes"),
             "a JPEG Huffman table of 4080 codes: %s", err);
    /* the same table after padding and inside a scan's data, where stb_image also looks */
    memset(jpeg, 0, sizeof jpeg);
    jpeg[0] = 0xFF, jpeg[1] = 0xD8, jpeg[2] = 0xFF, jpeg[3] = 0xDA, jpeg[4] = 0, jpeg[5] = 2;
    jpeg[6] = 0x12, jpeg[7] = 0xFF, jpeg[8] = 0x00, jpeg[9] = 0xFF, jpeg[10] = 0xFF, jpeg[11] = 0xC4;
    jpeg[12] = 0, jpeg[13] = 19;
    for (i = 0; i < 16; i++) jpeg[15 + i] = 0x20;
    TH_CHECK(ad_image_load_memory(jpeg, sizeof jpeg, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "more than 256 codes"),
             "a large table after a scan: %s", err);
    /* the same with fill bytes before the start marker, and with counts cut off by the end */
    memmove(jpeg + 3, jpeg, sizeof jpeg - 3);
    jpeg[0] = jpeg[1] = jpeg[2] = 0xFF;
    TH_CHECK(ad_image_load_memory(jpeg, sizeof jpeg, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "more than 256 codes"),
             "fill bytes before the start of the image: %s", err);
    TH_CHECK(ad_image_load_memory(jpeg, 3 + 15 + 12, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "more than 256 codes"),
             "counts cut off by the end of the data: %s", err);
}

/* Files that stb_image 2.27 reads wrongly are mended, converted here, or refused. */
static void test_stb_guards(void)
{
    static const unsigned char empty_idat[12] = {0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xAF, 0x06, 0x1E};
    unsigned char pgm[64] = {0}, gray[6] = {0, 51, 102, 153, 204, 255}, *png, *mended;
    ad_image img, ref;
    char err[300] = "";
    int len, i, ok;
    size_t at;
    /* an 8-bit PGM, whole and one byte short; a 16-bit one */
    len = snprintf((char *)pgm, sizeof pgm, "P5\n# a comment\n3 2\n255\n");
    memcpy(pgm + len, gray, 6);
    TH_CHECK(ad_image_load_memory(pgm, (size_t)len + 6, 3, &img, err, sizeof err) == 0 && img.channels == 3 &&
                 img.height == 2 && img.width == 3,
             "PGM as RGB: %s", err);
    for (i = 0, ok = img.data != NULL; ok && i < 18; i++) ok = close_to(img.data[i], gray[i % 6] / 255.0);
    TH_CHECK(ok, "PGM as RGB: the gray in every plane");
    ad_image_free(&img);
    TH_CHECK(ad_image_load_memory(pgm, (size_t)len + 5, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "fewer pixels than it declares") && img.data == NULL,
             "a PGM one byte short: %s", err);
    len = snprintf((char *)pgm, sizeof pgm, "P5\n3 2\n65535\n");
    TH_CHECK(ad_image_load_memory(pgm, (size_t)len + 12, 1, &img, err, sizeof err) == -1 &&
                 strstr(err, "16-bit samples (not read)"),
             "a 16-bit PGM: %s", err);
    len = snprintf((char *)pgm, sizeof pgm, "P5 99999999999 2 255 ");
    TH_CHECK(ad_image_load_memory(pgm, (size_t)len, 1, &img, err, sizeof err) == -1 && strstr(err, "PGM/PPM"),
             "a PGM width of 11 digits: %s", err);
    TH_CHECK(ad_image_load_memory("8BPS\0\1\0\0\0\0\0\0\0\4", 14, 3, &img, err, sizeof err) == -1 &&
                 strstr(err, "PSD, HDR and PIC files are not read"),
             "PSD: %s", err);
    TH_CHECK(ad_image_load_memory("#?RADIANCE\n", 11, 3, &img, err, sizeof err) == -1 && strstr(err, "PSD, HDR"),
             "HDR: %s", err);
    /* a PNG with an empty IDAT chunk before its data decodes as the same PNG without it */
    {
        unsigned char pixels[5 * 6 * 3];
        int n;
        for (i = 0; i < (int)sizeof pixels; i++) pixels[i] = (unsigned char)(i * 7);
        png = stbi_write_png_to_mem(pixels, 18, 6, 5, 3, &n);
        for (at = 8; memcmp(png + at + 4, "IDAT", 4) != 0; at += 12 + ((size_t)png[at + 2] << 8 | png[at + 3])) {
        }
        mended = (unsigned char *)malloc((size_t)n + 12);
        memcpy(mended, png, at);
        memcpy(mended + at, empty_idat, 12);
        memcpy(mended + at + 12, png + at, (size_t)n - at);
        TH_CHECK(ad_image_load_memory(png, (size_t)n, 3, &ref, err, sizeof err) == 0, "PNG: %s", err);
        TH_CHECK(ad_image_load_memory(mended, (size_t)n + 12, 3, &img, err, sizeof err) == 0 && ref.data &&
                     img.data && memcmp(img.data, ref.data, sizeof pixels * sizeof(ad_real)) == 0,
                 "a PNG with an empty IDAT chunk: %s", err);
        ad_image_free(&img);
        ad_image_free(&ref);
        mended[at + 3] = 0x7F; /* the empty chunk now says it is 127 bytes long, past the end */
        TH_CHECK(ad_image_load_memory(mended, at + 20, 3, &img, err, sizeof err) == -1 &&
                     strstr(err, "a chunk is longer than the file"),
                 "a PNG chunk longer than the file: %s", err);
        free(mended);
        STBIW_FREE(png);
    }
}

int main(void)
{
    strcpy(tmp_root, "/tmp/ad_test_data_XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("FAIL cannot make a folder under /tmp\n");
        return 1;
    }
    remember(tmp_root);
    test_crc32();
    test_idx_valid();
    test_idx_damaged();
    test_gzip_damaged();
    test_mnist_folder();
    test_real_mnist();
    test_images();
    test_resize();
    test_folder();
    test_png_mnist();
    test_batcher();
    test_batcher_state();
    test_hostile_images();
    test_stb_guards();
    cleanup();
    return th_summary();
}
