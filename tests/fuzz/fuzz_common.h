/* Helpers shared by the fuzz targets in this folder (a header, so tests/run.sh does not build it
   as a target of its own):

   - fuzz_fail: prints what went wrong, the call stack under AddressSanitizer, and aborts, so that
     a broken promise reads like a sanitizer report, in libFuzzer and standalone alike;
   - a counting allocator (fuzz_malloc, fuzz_realloc, fuzz_free) for AUTODIFF_MALLOC/REALLOC/FREE
     and STBI_MALLOC/REALLOC/FREE: it keeps the bytes live and aborts through fuzz_fail when one
     block or all live blocks together exceed the caps a target sets for the input at hand
     (fuzz_alloc_caps), and fuzz_alloc_leaked tells whether an input left blocks behind;
   - the standalone runner's helpers: fuzz_run_one runs one input under a watchdog (an input
     that runs longer than FUZZ_HANG_SECONDS aborts as a hang) and, when it crashes, hangs or
     breaks a promise, names it and saves it to $TMPDIR (or /tmp) for a rerun; fuzz_read_file
     reads a file into a block of exactly its size (so that AddressSanitizer sees a read past its
     end); fuzz_run_corpus runs every file of a target's committed corpus folder;
     fuzz_write_file writes one corpus file.

   The corpus folder of target T is tests/fuzz/corpus/T, relative to the working directory (the
   repository root, where tests/run.sh runs). The environment variable FUZZ_CORPUS_DIR overrides
   it: when FUZZ_CORPUS_DIR/T is a folder that one is run, else FUZZ_CORPUS_DIR itself. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_HAVE_ASAN 1
#endif
#endif
#ifdef FUZZ_HAVE_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define FUZZ_STR2(x) #x
#define FUZZ_STR(x) FUZZ_STR2(x)

#if defined(__GNUC__) || defined(__clang__)
#define FUZZ_UNUSED __attribute__((unused))
#define FUZZ_NORETURN __attribute__((noreturn))
#define FUZZ_FORMAT(a, b) __attribute__((format(printf, a, b)))
#else
#define FUZZ_UNUSED
#define FUZZ_NORETURN
#define FUZZ_FORMAT(a, b)
#endif

/* The input the standalone runner is running (fuzz_run_one), for the messages on a crash. */
static const char *volatile fuzz_label;
static const unsigned char *volatile fuzz_input;
static volatile size_t fuzz_input_len;


#ifndef FUZZ_HANG_SECONDS
#define FUZZ_HANG_SECONDS 30
#endif

static void fuzz_say(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

/* Names the input being run and saves it, with async-signal-safe calls only (it runs from the
   watchdog's signal handler and from the sanitizers' death callback). */
static void fuzz_report_input(void)
{
    static char path[512];
    const char *tmp = getenv("TMPDIR");
    char pid[24];
    unsigned long v = (unsigned long)getpid();
    int i = (int)sizeof pid - 1, fd;
    if (!fuzz_label) return;
    pid[i] = 0;
    do pid[--i] = (char)('0' + v % 10), v /= 10;
    while (v && i > 0);
    path[0] = 0;
    strncat(path, tmp && *tmp ? tmp : "/tmp", 400);
    strcat(path, "/fuzz-input-");
    strcat(path, pid + i);
    fuzz_say("fuzz: the input was ");
    fuzz_say(fuzz_label);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        ssize_t r = write(fd, (const void *)fuzz_input, fuzz_input_len);
        (void)r;
        close(fd);
        fuzz_say(", saved as ");
        fuzz_say(path);
    }
    fuzz_say("\n");
}

static void fuzz_on_alarm(int sig)
{
    (void)sig;
    fuzz_say("fuzz: an input ran for more than " FUZZ_STR(FUZZ_HANG_SECONDS) " seconds (a hang or a very slow "
             "decode)\n");
    fuzz_report_input();
#ifdef FUZZ_HAVE_ASAN
    __sanitizer_print_stack_trace();
#endif
    abort();
}

/* Prints "fuzz: <message>" and the stack, then aborts: the fuzzer saves the input as a crash. */
FUZZ_UNUSED FUZZ_NORETURN FUZZ_FORMAT(1, 2) static void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("fuzz: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    fuzz_report_input();
#ifdef FUZZ_HAVE_ASAN
    __sanitizer_print_stack_trace();
#endif
    abort();
}

/* The counting allocator. Each block carries its size in a 16-byte head in front of it, so the
   end of the block the caller sees is the end of the malloc'd block: overreads stay visible. */
#define FUZZ_HEAD 16

static size_t fuzz_live_bytes;                    /* bytes in blocks not yet freed */
static size_t fuzz_peak_bytes;                    /* most bytes live at once since the caps were set */
static size_t fuzz_cap_block = (size_t)-1;        /* largest block an input may ask for */
static size_t fuzz_cap_live = (size_t)-1;         /* most bytes an input may hold at once */
static size_t fuzz_cap_input;                     /* the input's length, for the messages */

/* Sets the caps for the next input of `input` bytes; returns the bytes live now, for
   fuzz_alloc_leaked. */
FUZZ_UNUSED static size_t fuzz_alloc_caps(size_t input, size_t block, size_t live)
{
    fuzz_cap_input = input;
    fuzz_cap_block = block;
    fuzz_cap_live = fuzz_live_bytes + live;
    fuzz_peak_bytes = fuzz_live_bytes;
    return fuzz_live_bytes;
}

/* Lifts the caps (for the target's own work between loads). */
FUZZ_UNUSED static void fuzz_alloc_nocaps(void)
{
    fuzz_cap_block = (size_t)-1;
    fuzz_cap_live = (size_t)-1;
}

/* Aborts when blocks allocated since fuzz_alloc_caps returned `before` are still live. */
FUZZ_UNUSED static void fuzz_alloc_leaked(size_t before, const char *what)
{
    if (fuzz_live_bytes != before)
        fuzz_fail("%s: %zu bytes still allocated after a %zu-byte input (leak)", what,
                  fuzz_live_bytes - before, fuzz_cap_input);
}

FUZZ_UNUSED static void fuzz_alloc_check(size_t n, size_t freed)
{
    if (n > fuzz_cap_block)
        fuzz_fail("allocation of %zu bytes for a %zu-byte input: above the cap of %zu bytes for one block", n,
                  fuzz_cap_input, fuzz_cap_block);
    if (fuzz_live_bytes - freed + n > fuzz_cap_live)
        fuzz_fail("allocation of %zu bytes for a %zu-byte input brings the live bytes to %zu: above the cap of %zu",
                  n, fuzz_cap_input, fuzz_live_bytes - freed + n, fuzz_cap_live);
}

FUZZ_UNUSED static void *fuzz_malloc(size_t n)
{
    unsigned char *p;
    fuzz_alloc_check(n, 0);
    if (n > (size_t)-1 - FUZZ_HEAD) return NULL;
    p = (unsigned char *)malloc(n + FUZZ_HEAD);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    fuzz_live_bytes += n;
    if (fuzz_live_bytes > fuzz_peak_bytes) fuzz_peak_bytes = fuzz_live_bytes;
    return p + FUZZ_HEAD;
}

FUZZ_UNUSED static void fuzz_free(void *q)
{
    unsigned char *p = (unsigned char *)q;
    size_t n;
    if (!p) return;
    p -= FUZZ_HEAD;
    memcpy(&n, p, sizeof n);
    fuzz_live_bytes -= n;
    free(p);
}

FUZZ_UNUSED static void *fuzz_realloc(void *q, size_t n)
{
    unsigned char *p = (unsigned char *)q, *grown;
    size_t old;
    if (!p) return fuzz_malloc(n);
    p -= FUZZ_HEAD;
    memcpy(&old, p, sizeof old);
    fuzz_alloc_check(n, old);
    if (n > (size_t)-1 - FUZZ_HEAD) return NULL;
    grown = (unsigned char *)realloc(p, n + FUZZ_HEAD);
    if (!grown) return NULL;
    memcpy(grown, &n, sizeof n);
    fuzz_live_bytes = fuzz_live_bytes - old + n;
    if (fuzz_live_bytes > fuzz_peak_bytes) fuzz_peak_bytes = fuzz_live_bytes;
    return grown + FUZZ_HEAD;
}


/* The whole file in a malloc'd block of exactly its length (one byte when empty), or NULL. */
FUZZ_UNUSED static unsigned char *fuzz_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL, *exact;
    size_t n = 0, cap = 0, got;
    *len = 0;
    if (!f) return NULL;
    do { /* to the end, without trusting a size from the file system */
        if (n == cap) {
            unsigned char *grown = (unsigned char *)realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!grown) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    exact = (unsigned char *)malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    *len = n;
    return exact;
}

/* Writes n bytes to dir/name; returns 0, or 1 with a message. */
FUZZ_UNUSED static int fuzz_write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[1024];
    FILE *f;
    int ok;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    ok = f && fwrite(p, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "fuzz: cannot write %s\n", path);
    return !ok;
}

/* Runs one input of the standalone runner: labelled for the reports, under the watchdog. */
FUZZ_UNUSED static int fuzz_run_one(int (*run)(const uint8_t *, size_t), const uint8_t *data, size_t len,
                                    const char *label)
{
    static int ready;
    int rc;
    if (!ready) {
        signal(SIGALRM, fuzz_on_alarm);
#ifdef FUZZ_HAVE_ASAN
        __sanitizer_set_death_callback(fuzz_report_input);
#endif
        ready = 1;
    }
    fuzz_label = label;
    fuzz_input = data;
    fuzz_input_len = len;
    alarm(FUZZ_HANG_SECONDS);
    rc = run(data, len);
    alarm(0);
    fuzz_label = NULL;
    return rc;
}

FUZZ_UNUSED static int fuzz_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

FUZZ_UNUSED static int fuzz_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs run(data, len) on every regular file of target's corpus folder, in name order, after
   naming it on stderr (so that a sanitizer report follows the name of its input). Returns the
   number of files run, or -1 (with a message) when the folder cannot be read. */
FUZZ_UNUSED static long fuzz_run_corpus(const char *target, int (*run)(const uint8_t *, size_t))
{
    const char *env = getenv("FUZZ_CORPUS_DIR");
    char dir[1024], path[2048];
    char **names = NULL;
    size_t count = 0, cap = 0, i;
    struct dirent *e;
    DIR *d;
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s/%s", env, target);
        if (!fuzz_is_dir(dir)) snprintf(dir, sizeof dir, "%s", env);
    } else {
        snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", target);
    }
    d = opendir(dir);
    if (!d) {
        fprintf(stderr, "%s: cannot open the corpus folder %s (run from the repository root, or set "
                "FUZZ_CORPUS_DIR)\n", target, dir);
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (count == cap) {
            char **grown = (char **)realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!grown) abort();
            names = grown;
        }
        names[count] = (char *)malloc(strlen(e->d_name) + 1);
        if (!names[count]) abort();
        strcpy(names[count++], e->d_name);
    }
    closedir(d);
    if (count) qsort(names, count, sizeof *names, fuzz_cmp_names);
    for (i = 0; i < count; i++) {
        unsigned char *data;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        fprintf(stderr, "%s: %s\n", target, path);
        data = fuzz_read_file(path, &len);
        if (!data) {
            fprintf(stderr, "%s: cannot read %s\n", target, path);
            abort();
        }
        fuzz_run_one(run, data, len, path);
        free(data);
        free(names[i]);
    }
    free(names);
    return (long)count;
}
#endif /* FUZZ_COMMON_H */
