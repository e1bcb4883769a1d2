/* GEMM throughput: autodiff.h's ad__gemm (the routine behind ad_matmul, ad_matmul_t and
   ad_linear) against OpenBLAS's cblas_sgemm, both on AUTODIFF_THREADS threads (default 1), at
   square sizes and at the products of the 784-128-10 and 784-512-256-10 MLPs trained with batch
   64. Also measures one core's fp32 peak with an FMA loop on the widest vectors (AVX-512 or
   AVX2) and, on several threads, how much faster that loop runs on all of them at once than on
   one (the most any threaded code could gain on the machine at that moment), and the
   micro-kernel alone on packed panels in cache (what the products lose outside it), and checks that
   both libraries give the same product. Timed batches of the two libraries alternate, and with
   them batches of autodiff.h's products in bfloat16 (ad_set_matmul_precision), reported beside
   its float ones.

   Build: cc -O2 -I. bench/gemm.c -lm -lpthread                        (autodiff.h alone)
          cc -O2 -I. -DBENCH_CBLAS bench/gemm.c -lopenblas -lm -lpthread  (with OpenBLAS)
   Run:   bench/gemm [name ...]     (names as in shapes[] below; default: all)
          environment: AUTODIFF_THREADS (default 1), BENCH_CLOCK=cpu (see bench.h)
   Prints "@ key value" lines for bench/run.sh and a readable line per product. */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

#ifdef BENCH_CBLAS
#include <cblas.h>
/* OpenBLAS's own functions (not every cblas.h declares them) */
void openblas_set_num_threads(int num_threads);
char *openblas_get_config(void);
char *openblas_get_corename(void);
#endif

typedef struct gemm_shape {
    const char *name, *what;
    int ta, tb, M, N, K;
} gemm_shape;

static const gemm_shape shapes[] = {
    {"sq256", "256x256 . 256x256", 0, 0, 256, 256, 256},
    {"sq512", "512x512 . 512x512", 0, 0, 512, 512, 512},
    {"sq1024", "1024x1024 . 1024x1024", 0, 0, 1024, 1024, 1024},
    {"sq2048", "2048x2048 . 2048x2048", 0, 0, 2048, 2048, 2048},
    /* 784-128-10 MLP, batch 64: forward x.W1, h.W2; backward g2.W2^T, h^T.g2, x^T.g1 */
    {"mlp_fwd1", "x[64,784] . W1[784,128]", 0, 0, 64, 128, 784},
    {"mlp_fwd2", "h[64,128] . W2[128,10]", 0, 0, 64, 10, 128},
    {"mlp_gWt2", "g[64,10] . W2^T", 0, 1, 64, 128, 10},
    {"mlp_hTg2", "h^T . g[64,10]", 1, 0, 128, 10, 64},
    {"mlp_xTg1", "x^T . g[64,128]", 1, 0, 784, 128, 64},
    /* 784-512-256-10 MLP, batch 64: the products with the hidden layers */
    {"mlp2_fwd1", "x[64,784] . W1[784,512]", 0, 0, 64, 512, 784},
    {"mlp2_fwd2", "h1[64,512] . W2[512,256]", 0, 0, 64, 256, 512},
    {"mlp2_gWt2", "g[64,256] . W2^T", 0, 1, 64, 512, 256},
    {"mlp2_hTg2", "h1^T . g[64,256]", 1, 0, 512, 256, 64},
    {"mlp2_xTg1", "x^T . g[64,512]", 1, 0, 784, 512, 64},
    /* the GPT of bench/gpt.c (batch 12 x context 64 = 768 rows, embedding 128): forward x.W of
       the attention's input projection and of the MLP's two layers, the MLP layers' backward
       g.W^T and x^T.g, and the attention's scores for one block of 32 queries and 32 keys */
    {"gpt_attn", "x[768,128] . W[128,384]", 0, 0, 768, 384, 128},
    {"gpt_fc", "x[768,128] . W[128,512]", 0, 0, 768, 512, 128},
    {"gpt_proj", "h[768,512] . W[512,128]", 0, 0, 768, 128, 512},
    {"gpt_gWt_fc", "g[768,512] . W_fc[128,512]^T", 0, 1, 768, 128, 512},
    {"gpt_gWt_proj", "g[768,128] . W_proj[512,128]^T", 0, 1, 768, 512, 128},
    {"gpt_xTg_fc", "x^T . g[768,512]", 1, 0, 128, 512, 768},
    {"gpt_xTg_proj", "h^T . g[768,128]", 1, 0, 512, 128, 768},
    {"gpt_qkT", "q[32,32] . k[32,32]^T", 0, 1, 32, 32, 32},
    /* one row of C, which the thin kernels take: an LSTM step on one sequence (h.W_hh^T), the MLP
       on one image (x.W1, and its classifier h.W2, ten columns: fewer than a vector) */
    {"thin_hWt", "h[1,256] . W_hh[1024,256]^T", 0, 1, 1, 1024, 256},
    {"thin_xW", "x[1,784] . W1[784,128]", 0, 0, 1, 128, 784},
    {"thin_hW2", "h[1,128] . W2[128,10]", 0, 0, 1, 10, 128},
    /* one column of C, which the thin kernels take as the transposed product: a linear
       regression's forward x.w and its weight's gradient x^T.g, batch 64 */
    {"col_xw", "x[64,784] . w[784,1]", 0, 0, 64, 1, 784},
    {"col_xTg", "x^T . g[64,1]", 1, 0, 784, 1, 64},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* ---- peak: independent FMA chains on the widest vectors ------------------------------------ */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
/* NAME(iters, m, a): CHAINS independent chains of fused multiply-adds on vectors of VBYTES,
   enough to keep two FMA pipes busy through the FMA's latency, few enough to stay in the
   registers (16 of AVX2's 16 would spill two). Returns a sum, so that nothing is left out. */
#define BENCH_PEAK_LOOP(NAME, TARGET, VBYTES, CHAINS)                                            \
    typedef float NAME##_vec __attribute__((vector_size(VBYTES)));                            \
    __attribute__((target(TARGET), noinline)) static float NAME(long iters, float m, float a)  \
    {                                                                                          \
        NAME##_vec acc[CHAINS], vm, va, s;                                                     \
        int j;                                                                                 \
        long it;                                                                               \
        for (j = 0; j < CHAINS; j++) {                                                         \
            memset(&acc[j], 0, sizeof acc[j]);                                                 \
            acc[j] += (float)j;                                                                \
        }                                                                                      \
        memset(&vm, 0, sizeof vm);                                                             \
        vm += m;                                                                               \
        memset(&va, 0, sizeof va);                                                             \
        va += a;                                                                               \
        for (it = 0; it < iters; it++) {                                                       \
            _Pragma("GCC unroll 16") for (j = 0; j < CHAINS; j++) acc[j] = acc[j] * vm + va;   \
        }                                                                                      \
        s = acc[0];                                                                            \
        for (j = 1; j < CHAINS; j++) s += acc[j];                                              \
        return s[0] + s[1];                                                                    \
    }
BENCH_PEAK_LOOP(peak_loop_avx512, "avx512f,avx2,fma", 64, 16)
BENCH_PEAK_LOOP(peak_loop_avx2, "avx2,fma", 32, 12)

/* The widest FMA loop this CPU runs: its vector width in bits, 0 with neither AVX2 nor AVX-512. */
static int peak_bits(void)
{
    if (__builtin_cpu_supports("avx512f")) return 512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 256;
    return 0;
}

/* One run of the widest loop; its floating-point operations go to *flops. */
static float peak_loop(long iters, double *flops)
{
    if (peak_bits() == 512) {
        *flops = (double)iters * 16 * 16 * 2;
        return peak_loop_avx512(iters, 0.999f, 0.001f);
    }
    *flops = (double)iters * 12 * 8 * 2;
    return peak_loop_avx2(iters, 0.999f, 0.001f);
}

/* GFLOP/s of one short run of the FMA loop, in thread CPU time; 0 without AVX2 or AVX-512. */
static double peak_once(void)
{
    double flops, t;
    volatile float sink;
    if (!peak_bits()) return 0;
    t = bench_thread_cpu();
    sink = peak_loop(2000000, &flops);
    t = bench_thread_cpu() - t;
    (void)sink;
    return flops / t * 1e-9;
}

/* GFLOP/s of one core on fused multiply-adds on the widest vectors, or 0 without AVX2 or
   AVX-512: the best of a few short runs, in thread CPU time, so that other programs on the
   machine do not lower it. */
static double measure_peak(void)
{
    double best = 0, t, flops;
    long iters = 4000000;
    volatile float sink;
    int rep;
    if (!peak_bits()) return 0;
    sink = peak_loop(1000, &flops);
    for (rep = 0; rep < 7; rep++) {
        double gf;
        t = bench_thread_cpu();
        sink = peak_loop(iters, &flops);
        t = bench_thread_cpu() - t;
        gf = flops / t * 1e-9;
        if (gf > best) best = gf;
    }
    (void)sink;
    return best;
}

#include <pthread.h>

static void *peak_thread(void *iters)
{
    double flops;
    volatile float sink = peak_loop(*(const long *)iters, &flops);
    (void)sink;
    return NULL;
}

/* Wall seconds for `threads` threads each running the FMA loop `iters` times at once. */
static double peak_wall(int threads, long iters)
{
    pthread_t th[64];
    double t = bench_now();
    int i, started = 0;
    for (i = 1; i < threads && i < 64; i++, started++)
        if (pthread_create(&th[i], NULL, peak_thread, &iters) != 0) break;
    peak_thread(&iters);
    for (i = 1; i <= started; i++) pthread_join(th[i], NULL);
    return bench_now() - t;
}

/* How many times more FMA work `threads` threads finish per second than one: the median over
   pairs of runs, one thread then all, in wall time; 0 without AVX2 or AVX-512. A machine whose cores
   are shared with other work gives less than the thread count. */
static double measure_scaling(int threads)
{
    double ratios[9];
    long iters = 2000000;
    int rep;
    if (!peak_bits() || threads < 2) return 0;
    for (rep = 0; rep < 9; rep++) {
        double one = peak_wall(1, iters), all = peak_wall(threads, iters);
        ratios[rep] = threads * one / all;
    }
    return bench_median(ratios, 9);
}
#else
static int peak_bits(void) { return 0; }
static double peak_once(void) { return 0; }
static double measure_peak(void) { return 0; }
static double measure_scaling(int threads) { (void)threads; return 0; }
#endif

/* ---- the micro-kernel alone ----------------------------------------------------------------------- */
/* The micro-kernel the products use (ad__gemm_pick's), alone: panels packed as the products pack
   them, a block of AD__MC rows of A against 1024 columns of B, both as long as the products' K
   blocks (ad__gemm_kc_limit: 512 in float with an L2 of 576 KiB or more: 288 KiB and 2 MiB), in
   L2 and L3, taken in the products' order (each panel of B against every panel of A), each tile
   added into C. Beside the FMA loop, what the kernel itself leaves unused; beside the products,
   what they lose around it (packing, caches, edges). */
typedef struct kernel_bench {
    ad__gemm_kernel ker;
    int rows, kc;
    float *A, *B, *C;
} kernel_bench;

enum { KERNEL_COLS = 1024 };

/* GFLOP/s of one timed run, in thread CPU time. */
static double kernel_once(const kernel_bench *kb)
{
    enum { PASSES = 16 };
    int mr = kb->ker.mr, nr = kb->ker.nr, pass, ir, jr;
    double t = bench_thread_cpu();
    for (pass = 0; pass < PASSES; pass++)
        for (jr = 0; jr < KERNEL_COLS; jr += nr)
            for (ir = 0; ir < kb->rows; ir += mr)
                kb->ker.fn(kb->kc, kb->A + (size_t)ir * kb->kc, 1, mr, kb->B + (size_t)jr * kb->kc, nr,
                           kb->C + (size_t)ir * KERNEL_COLS + jr, KERNEL_COLS, mr, nr, 1);
    t = bench_thread_cpu() - t;
    return 2.0 * PASSES * kb->rows * KERNEL_COLS * kb->kc / t * 1e-9;
}

/* The kernel's GFLOP/s, and in *share its speed over the FMA loop's (0 without the loop): medians
   over nine pairs of runs, each of the kernel beside one of the loop, so that the share comes
   from one stretch of a busy machine's time. 0 when memory runs out. */
static double measure_kernel(double *share)
{
    enum { ROUNDS = 9 };
    kernel_bench kb;
    size_t na, nb, nc, i;
    void *pa = NULL, *pb = NULL, *pc = NULL;
    double gf[ROUNDS], shares[ROUNDS], result = 0;
    int r;
    kb.ker = ad__gemm_pick(KERNEL_COLS);
    kb.kc = ad__gemm_kc_limit();
    kb.rows = AD__MC / kb.ker.mr * kb.ker.mr;
    na = (size_t)kb.rows * kb.kc;
    nb = (size_t)kb.kc * KERNEL_COLS;
    nc = (size_t)kb.rows * KERNEL_COLS;
    *share = 0;
    if (!posix_memalign(&pa, 64, na * sizeof(float)) && !posix_memalign(&pb, 64, nb * sizeof(float)) &&
        !posix_memalign(&pc, 64, nc * sizeof(float))) {
        kb.A = (float *)pa;
        kb.B = (float *)pb;
        kb.C = (float *)pc;
        for (i = 0; i < na; i++) kb.A[i] = (float)(i % 7) * 1e-3f;
        for (i = 0; i < nb; i++) kb.B[i] = (float)(i % 5) * 1e-3f;
        memset(kb.C, 0, nc * sizeof(float));
        kernel_once(&kb);
        for (r = 0; r < ROUNDS; r++) {
            double loop = peak_once();
            gf[r] = kernel_once(&kb);
            shares[r] = loop > 0 ? gf[r] / loop : 0;
        }
        result = bench_median(gf, ROUNDS);
        *share = bench_median(shares, ROUNDS);
    }
    free(pa);
    free(pb);
    free(pc);
    return result;
}

/* ---- the two implementations ------------------------------------------------------------------- */
typedef struct gemm_job {
    const gemm_shape *s;
    const float *A, *B;
    float *C;
    ad_tape *T;
} gemm_job;

static void run_ours(const gemm_job *j)
{
    const gemm_shape *s = j->s;
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    if (ad__gemm(j->T, s->ta, s->tb, s->M, s->N, s->K, j->A, lda, j->B, ldb, j->C, s->N, 0) != 0) {
        fprintf(stderr, "gemm: out of memory\n");
        exit(1);
    }
}

#ifdef BENCH_CBLAS
static void run_blas(const gemm_job *j)
{
    const gemm_shape *s = j->s;
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                s->M, s->N, s->K, 1.0f, j->A, lda, j->B, ldb, 0.0f, j->C, s->N);
}
#endif

typedef void (*gemm_fn)(const gemm_job *j);

static double time_reps(gemm_fn fn, const gemm_job *j, int reps)
{
    double t = bench_time();
    int r;
    for (r = 0; r < reps; r++) fn(j);
    return bench_time() - t;
}

static void fill(float *x, size_t n, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)(2 * ad_rng_uniform(rng) - 1);
}

int main(int argc, char **argv)
{
    enum { BATCHES = 5 };
    const double batch_seconds = 0.06;
    ad_tape *T = ad_tape_new(), *Tb = ad_tape_new(); /* Tb: products in bfloat16 */
    ad_rng rng;
    double peak;
    int si;
#ifdef BENCH_CBLAS
    openblas_set_num_threads(bench_threads());
    printf("# OpenBLAS %s, kernels for %s\n", openblas_get_config(), openblas_get_corename());
#endif
    if (!T || !Tb) return 1;
    ad_set_threads(T, bench_threads());
    ad_set_threads(Tb, bench_threads());
    ad_set_matmul_precision(Tb, AD_MATMUL_BFLOAT16);
    ad_rng_seed(&rng, 42);
    peak = measure_peak();
    printf("# peak of one core (FMA loop on %d-bit vectors): %.1f GFLOP/s\n", peak_bits(), peak);
    if (peak > 0) bench_result("peak.gflops", peak);
    {
        double share, kernel = measure_kernel(&share);
        printf("# the micro-kernel alone, on packed panels in cache: %.1f GFLOP/s", kernel);
        if (share > 0) printf(" (%.0f%% of the FMA loop timed beside it)", 100 * share);
        printf("\n");
        if (kernel > 0) bench_result("kernel.gflops", kernel);
        if (share > 0) bench_result("kernel.share", share);
    }
    if (bench_threads() > 1) {
        double scaling = measure_scaling(bench_threads());
        printf("# the FMA loop on %d threads at once did %.2f times the work of one thread per second\n",
               bench_threads(), scaling);
        if (scaling > 0) bench_result("peak.scaling", scaling);
    }
    for (si = 0; si < NSHAPES; si++) {
        const gemm_shape *s = &shapes[si];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N, i;
        double flops = 2.0 * s->M * s->N * s->K, t_ours[BATCHES], t_blas[BATCHES], t_bf16[BATCHES], g_ours, g_bf16, t;
        gemm_job job;
        char key[128], line[512];
        int reps, b, wanted = argc < 2, a;
        float *A, *B, *C;
        for (a = 1; a < argc; a++)
            if (strcmp(argv[a], s->name) == 0) wanted = 1;
        if (!wanted) continue;
        A = (float *)malloc(na * sizeof(float));
        B = (float *)malloc(nb * sizeof(float));
        C = (float *)malloc(nc * sizeof(float));
        if (!A || !B || !C) return 1;
        fill(A, na, &rng);
        fill(B, nb, &rng);
        job.s = s;
        job.A = A;
        job.B = B;
        job.C = C;
        job.T = T;
        /* how many products make one timed batch */
        t = time_reps(run_ours, &job, 1);
        reps = 1;
        while (t * reps < batch_seconds && reps < 1 << 20) reps *= 2;
        for (b = 0; b < BATCHES; b++) {
            job.T = Tb;
            t_bf16[b] = time_reps(run_ours, &job, reps);
            job.T = T;
            t_ours[b] = time_reps(run_ours, &job, reps);
#ifdef BENCH_CBLAS
            t_blas[b] = time_reps(run_blas, &job, reps);
#endif
        }
        g_ours = flops * reps / bench_median(t_ours, BATCHES) * 1e-9;
        snprintf(key, sizeof key, "gemm.%s.ours", s->name);
        bench_result(key, g_ours);
        g_bf16 = flops * reps / bench_median(t_bf16, BATCHES) * 1e-9;
        snprintf(key, sizeof key, "bf16.gemm.%s.ours", s->name);
        bench_result(key, g_bf16);
        snprintf(line, sizeof line, "# %-9s %s%s %-24s autodiff.h %6.1f GFLOP/s", s->name,
                 s->ta ? "T" : "N", s->tb ? "T" : "N", s->what, g_ours);
        if (peak > 0)
            snprintf(line + strlen(line), sizeof line - strlen(line), " (%2.0f%% of peak)",
                     100 * g_ours / (peak * bench_threads()));
#ifdef BENCH_CBLAS
        {
            double g_blas = flops * reps / bench_median(t_blas, BATCHES) * 1e-9, diff = 0, big = 0;
            float *R = (float *)malloc(nc * sizeof(float));
            if (!R) return 1;
            run_ours(&job);
            memcpy(R, C, nc * sizeof(float));
            run_blas(&job);
            for (i = 0; i < nc; i++) {
                double d = fabs((double)R[i] - (double)C[i]);
                diff = d > diff ? d : diff;
                big = fabs((double)C[i]) > big ? fabs((double)C[i]) : big;
            }
            snprintf(key, sizeof key, "gemm.%s.openblas", s->name);
            bench_result(key, g_blas);
            snprintf(key, sizeof key, "gemm.%s.maxdiff", s->name);
            bench_result(key, diff);
            snprintf(line + strlen(line), sizeof line - strlen(line),
                     "  OpenBLAS %6.1f  ratio %.2f  max|diff| %.2g (max|C| %.3g)", g_blas, g_ours / g_blas,
                     diff, big);
            free(R);
        }
#else
        (void)t_blas;
        (void)i;
#endif
        snprintf(line + strlen(line), sizeof line - strlen(line), "  bfloat16 %6.1f", g_bf16);
        printf("%s\n", line);
        fflush(stdout);
        free(A);
        free(B);
        free(C);
    }
    ad_tape_free(T);
    ad_tape_free(Tb);
    return 0;
}
