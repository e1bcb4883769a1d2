/* GEMM kernel experiments: a self-contained copy of autodiff.h's GEMM layout (packed panels,
   cache blocks, a register-tile micro-kernel written with vector extensions) with the kernel
   shape, the way A is broadcast and the block sizes as parameters, timed against the library's
   own ad__gemm and OpenBLAS in the same process. Not part of `make bench`; a tool for choosing
   the library's kernel:

       cc -O2 -I. -DBENCH_CBLAS bench/gemm_variants.c -o build/bench/gemm_variants -lopenblas -lm -lpthread
       build/bench/gemm_variants [variant ...]      (default: all; `list` prints the names)

   Single thread, timed in thread CPU time. Every result is checked against the library's product
   (a line is printed when the largest difference exceeds 1e-3). */
#define _POSIX_C_SOURCE 200809L
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "bench/bench.h"

#ifdef BENCH_CBLAS
#include <cblas.h>
void openblas_set_num_threads(int num_threads);
#endif

#if !(defined(__GNUC__) && defined(__x86_64__))
int main(void)
{
    printf("gemm_variants: x86-64 with GCC or Clang only\n");
    return 0;
}
#else

typedef void (*vk_fn)(int kc, const float *A, const float *B, float *C, ptrdiff_t ldc, int acc);

/* MR x (NV x 16) kernels. BCAST 0 broadcasts A as `zero + a` (a scalar add, then a broadcast from
   a register: how autodiff.h writes it), 1 as `a - zero` (folded to a broadcast load),
   UNROLL the k-loop unroll, PF 1 prefetches the C tile before the k loop. */
#define VK(NAME, MR, NV, BCAST, UNROLL) VKP(NAME, MR, NV, BCAST, UNROLL, 0)
#define VKP(NAME, MR, NV, BCAST, UNROLL, PF)                                                     \
    __attribute__((target("avx512f,avx2,fma"))) static void NAME(                               \
        int kc, const float *__restrict__ A, const float *__restrict__ B, float *C, ptrdiff_t ldc, \
        int acc)                                                                                \
    {                                                                                           \
        typedef float v16 __attribute__((vector_size(64)));                                     \
        v16 c[MR][NV], zero;                                                                    \
        int i, j, k;                                                                            \
        memset(&zero, 0, sizeof zero);                                                          \
        if (PF)                                                                                 \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                 \
                __builtin_prefetch(C + i * ldc, 1);                                             \
                __builtin_prefetch(C + i * ldc + NV * 16 - 1, 1);                               \
            }                                                                                   \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                       \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) c[i][j] = zero;                       \
        _Pragma(UNROLL) for (k = 0; k < kc; k++) {                                              \
            v16 b[NV];                                                                          \
            _Pragma("GCC unroll 16") for (j = 0; j < NV; j++)                                   \
                memcpy(&b[j], B + (size_t)k * (NV * 16) + j * 16, 64);                          \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                 \
                v16 a = BCAST ? A[(size_t)k * MR + i] - zero : zero + A[(size_t)k * MR + i];    \
                _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) c[i][j] += a * b[j];          \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                       \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) {                                     \
            float *dst = C + i * ldc + j * 16;                                                  \
            v16 t = c[i][j];                                                                    \
            if (acc) {                                                                          \
                v16 old;                                                                        \
                memcpy(&old, dst, 64);                                                          \
                t += old;                                                                       \
            }                                                                                   \
            memcpy(dst, &t, 64);                                                                \
        }                                                                                       \
    }

VK(k8x32_add, 8, 2, 0, "GCC unroll 1")
VK(k12x32_add, 12, 2, 0, "GCC unroll 1")
VK(k8x32_bc, 8, 2, 1, "GCC unroll 1")
VK(k12x32_bc, 12, 2, 1, "GCC unroll 1")
VK(k14x32_bc, 14, 2, 1, "GCC unroll 1")
VK(k6x64_bc, 6, 4, 1, "GCC unroll 1")
VK(k12x32_bc_u4, 12, 2, 1, "GCC unroll 4")
VK(k8x16_add, 8, 1, 0, "GCC unroll 1")
VK(k8x16_bc, 8, 1, 1, "GCC unroll 1")
VK(k16x16_bc, 16, 1, 1, "GCC unroll 1")
VK(k28x16_bc, 28, 1, 1, "GCC unroll 1")
VKP(k8x32_bc_pf, 8, 2, 1, "GCC unroll 1", 1)
VKP(k12x32_bc_pf, 12, 2, 1, "GCC unroll 1", 1)

typedef struct variant {
    const char *name;
    vk_fn fn;
    int mr, nr, mc, kc, nc;
    int pack; /* 0: autodiff.h's pack of A (row by row), 1: k outer, rows inner, 2: the same
                 with the row loop unrolled */
} variant;

static const variant variants[] = {
    {"8x32_add_mc144_kc256", k8x32_add, 8, 32, 144, 256, 2048, 0},
    {"12x32_add_mc144_kc256", k12x32_add, 12, 32, 144, 256, 2048, 0},
    {"8x32_bc_mc144_kc256", k8x32_bc, 8, 32, 144, 256, 2048, 0},
    {"12x32_bc_mc144_kc256", k12x32_bc, 12, 32, 144, 256, 2048, 0},
    {"14x32_bc_mc140_kc256", k14x32_bc, 14, 32, 140, 256, 2048, 0},
    {"6x64_bc_mc144_kc256", k6x64_bc, 6, 64, 144, 256, 2048, 0},
    {"12x32_bc_u4_mc144_kc256", k12x32_bc_u4, 12, 32, 144, 256, 2048, 0},
    {"12x32_bc_mc144_kc128", k12x32_bc, 12, 32, 144, 128, 2048, 0},
    {"12x32_bc_mc144_kc384", k12x32_bc, 12, 32, 144, 384, 2048, 0},
    {"12x32_bc_mc96_kc512", k12x32_bc, 12, 32, 96, 512, 2048, 0},
    {"12x32_bc_mc288_kc256", k12x32_bc, 12, 32, 288, 256, 2048, 0},
    {"12x32_bc_mc144_kc256_nc512", k12x32_bc, 12, 32, 144, 256, 512, 0},
    {"14x32_bc_mc280_kc384", k14x32_bc, 14, 32, 280, 384, 2048, 0},
    {"8x16_add_mc144_kc256", k8x16_add, 8, 16, 144, 256, 2048, 0},
    {"8x16_bc_mc144_kc256", k8x16_bc, 8, 16, 144, 256, 2048, 0},
    {"16x16_bc_mc144_kc256", k16x16_bc, 16, 16, 144, 256, 2048, 0},
    {"28x16_bc_mc140_kc256", k28x16_bc, 28, 16, 140, 256, 2048, 0},
    {"8x32_bc_pf_mc144_kc256", k8x32_bc_pf, 8, 32, 144, 256, 2048, 0},
    {"12x32_bc_pf_mc144_kc256", k12x32_bc_pf, 12, 32, 144, 256, 2048, 0},
    {"8x32_bc_pk1_mc144_kc256", k8x32_bc, 8, 32, 144, 256, 2048, 1},
    {"12x32_bc_pk1_mc144_kc256", k12x32_bc, 12, 32, 144, 256, 2048, 1},
    {"12x32_bc_pf_pk1_mc144_kc384", k12x32_bc_pf, 12, 32, 144, 384, 2048, 1},
    {"8x32_bc_pf_pk1_mc144_kc256", k8x32_bc_pf, 8, 32, 144, 256, 2048, 1},
    {"8x32_bc_pf_pk2_mc144_kc256", k8x32_bc_pf, 8, 32, 144, 256, 2048, 2},
    {"8x32_bc_pf_pk2_mc144_kc384", k8x32_bc_pf, 8, 32, 144, 384, 2048, 2},
    {"12x32_bc_pf_pk2_mc144_kc256", k12x32_bc_pf, 12, 32, 144, 256, 2048, 2},
    {"12x32_bc_pf_pk2_mc144_kc384", k12x32_bc_pf, 12, 32, 144, 384, 2048, 2},
};
#define NVARIANTS (int)(sizeof variants / sizeof variants[0])
#define VMR_MAX 28
#define VNR_MAX 64

static void vpack_a(int ta, const float *A, ptrdiff_t lda, int i0, int mc, int k0, int kc, int mr,
                    float *__restrict__ dst, int how)
{
    int p, r, k;
    for (p = 0; p < mc; p += mr, dst += (size_t)mr * kc) {
        int rows = mc - p < mr ? mc - p : mr;
        if (!ta && how == 2 && rows == mr && (mr == 8 || mr == 12)) {
            /* the same with the row loop unrolled for the kernel's MR */
            const float *src = A + (ptrdiff_t)(i0 + p) * lda + k0;
            if (mr == 8)
                for (k = 0; k < kc; k++) {
#pragma GCC unroll 8
                    for (r = 0; r < 8; r++) dst[(size_t)k * 8 + r] = src[(ptrdiff_t)r * lda + k];
                }
            else
                for (k = 0; k < kc; k++) {
#pragma GCC unroll 12
                    for (r = 0; r < 12; r++) dst[(size_t)k * 12 + r] = src[(ptrdiff_t)r * lda + k];
                }
            continue;
        }
        if (!ta && how >= 1 && rows == mr) {
            /* k outer: mr read streams, one contiguous write stream */
            const float *src = A + (ptrdiff_t)(i0 + p) * lda + k0;
            for (k = 0; k < kc; k++)
                for (r = 0; r < mr; r++) dst[(size_t)k * mr + r] = src[(ptrdiff_t)r * lda + k];
            continue;
        }
        if (!ta) {
            for (r = 0; r < rows; r++) {
                const float *src = A + (ptrdiff_t)(i0 + p + r) * lda + k0;
                for (k = 0; k < kc; k++) dst[(size_t)k * mr + r] = src[k];
            }
        } else {
            for (k = 0; k < kc; k++) {
                const float *src = A + (ptrdiff_t)(k0 + k) * lda + i0 + p;
                for (r = 0; r < rows; r++) dst[(size_t)k * mr + r] = src[r];
            }
        }
        for (r = rows; r < mr; r++)
            for (k = 0; k < kc; k++) dst[(size_t)k * mr + r] = 0;
    }
}

static void vpack_b(int tb, const float *B, ptrdiff_t ldb, int k0, int kc, int j0, int nc, int nr,
                    float *__restrict__ dst)
{
    int p, c, k;
    for (p = 0; p < nc; p += nr, dst += (size_t)nr * kc) {
        int cols = nc - p < nr ? nc - p : nr;
        if (!tb) {
            for (k = 0; k < kc; k++) {
                const float *src = B + (ptrdiff_t)(k0 + k) * ldb + j0 + p;
                float *d = dst + (size_t)k * nr;
                for (c = 0; c < cols; c++) d[c] = src[c];
                for (; c < nr; c++) d[c] = 0;
            }
        } else {
            for (c = 0; c < cols; c++) {
                const float *src = B + (ptrdiff_t)(j0 + p + c) * ldb + k0;
                for (k = 0; k < kc; k++) dst[(size_t)k * nr + c] = src[k];
            }
            for (; c < nr; c++)
                for (k = 0; k < kc; k++) dst[(size_t)k * nr + c] = 0;
        }
    }
}

/* C = op(A) op(B), the loop nest of autodiff.h's ad__gemm_serial with every panel packed. */
static void vgemm(const variant *v, float *pa, float *pb, int ta, int tb, int M, int N, int K,
                  const float *A, ptrdiff_t lda, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc)
{
    int jc, pc, ic, jr, ir;
    for (jc = 0; jc < N; jc += v->nc) {
        int nc = N - jc < v->nc ? N - jc : v->nc;
        for (pc = 0; pc < K; pc += v->kc) {
            int kc = K - pc < v->kc ? K - pc : v->kc, acc = pc > 0;
            vpack_b(tb, B, ldb, pc, kc, jc, nc, v->nr, pb);
            for (ic = 0; ic < M; ic += v->mc) {
                int mc = M - ic < v->mc ? M - ic : v->mc;
                vpack_a(ta, A, lda, ic, mc, pc, kc, v->mr, pa, v->pack);
                for (jr = 0; jr < nc; jr += v->nr) {
                    int nr = nc - jr < v->nr ? nc - jr : v->nr;
                    const float *bp = pb + (size_t)jr * kc;
                    for (ir = 0; ir < mc; ir += v->mr) {
                        int mr = mc - ir < v->mr ? mc - ir : v->mr;
                        float *c = C + (ptrdiff_t)(ic + ir) * ldc + jc + jr;
                        if (mr == v->mr && nr == v->nr) {
                            v->fn(kc, pa + (size_t)ir * kc, bp, c, ldc, acc);
                        } else {
                            float tile[VMR_MAX * VNR_MAX];
                            int i, j;
                            v->fn(kc, pa + (size_t)ir * kc, bp, tile, v->nr, 0);
                            for (i = 0; i < mr; i++)
                                for (j = 0; j < nr; j++)
                                    c[(ptrdiff_t)i * ldc + j] = (acc ? c[(ptrdiff_t)i * ldc + j] : 0) + tile[i * v->nr + j];
                        }
                    }
                }
            }
        }
    }
}

typedef struct vshape {
    const char *name;
    int ta, tb, M, N, K;
} vshape;

static const vshape vshapes[] = {
    {"sq256", 0, 0, 256, 256, 256},     {"sq512", 0, 0, 512, 512, 512},
    {"sq1024", 0, 0, 1024, 1024, 1024}, {"sq2048", 0, 0, 2048, 2048, 2048},
    {"mlp_fwd1", 0, 0, 64, 128, 784},   {"mlp_xTg1", 1, 0, 784, 128, 64},
    {"mlp_fwd2", 0, 0, 64, 10, 128},
};
#define NVSHAPES (int)(sizeof vshapes / sizeof vshapes[0])

/* Seconds of CPU time of this thread: on a shared machine, time spent descheduled does not
   count against whichever implementation was running. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs implementation vi (-2: autodiff.h, -1: OpenBLAS, else a variant) reps times. */
static void run_impl(int vi, ad_tape *T, float *pa, float *pb, const vshape *s, const float *A,
                     const float *B, float *C, int reps)
{
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N, r;
    for (r = 0; r < reps; r++) {
        if (vi == -2) ad__gemm(T, s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, C, s->N, 0);
#ifdef BENCH_CBLAS
        else if (vi == -1)
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                        s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
#endif
        else vgemm(&variants[vi], pa, pb, s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, C, s->N);
    }
}

/* For every shape, all chosen implementations are timed in turn, batch after batch, so that
   they share whatever else the machine is doing; the table shows the median GFLOP/s and, in
   brackets, the median over batches of the ratio to the first row (autodiff.h's ad__gemm). */
int main(int argc, char **argv)
{
    enum { BATCHES = 9, MAXI = NVARIANTS + 2 };
    ad_tape *T = ad_tape_new();
    ad_rng rng;
    float *pa, *pb;
    int chosen[MAXI], nchosen = 0, si, ci, a, b;
    static double gf[NVSHAPES][MAXI], rel[NVSHAPES][MAXI];
    if (argc > 1 && strcmp(argv[1], "list") == 0) {
        for (ci = 0; ci < NVARIANTS; ci++) printf("%s\n", variants[ci].name);
        return 0;
    }
    if (!T) return 1;
    ad_set_threads(T, 1);
    chosen[nchosen++] = -2;
#ifdef BENCH_CBLAS
    openblas_set_num_threads(1);
    chosen[nchosen++] = -1;
#endif
    for (ci = 0; ci < NVARIANTS; ci++) {
        int wanted = argc < 2;
        for (a = 1; a < argc; a++)
            if (strcmp(argv[a], variants[ci].name) == 0) wanted = 1;
        if (wanted) chosen[nchosen++] = ci;
    }
    {
        void *p1 = NULL, *p2 = NULL;
        if (posix_memalign(&p1, 64, (size_t)512 * 512 * sizeof(float)) != 0 ||
            posix_memalign(&p2, 64, (size_t)512 * (2048 + 64) * sizeof(float)) != 0)
            return 1;
        pa = (float *)p1;
        pb = (float *)p2;
    }
    ad_rng_seed(&rng, 42);
    for (si = 0; si < NVSHAPES; si++) {
        const vshape *s = &vshapes[si];
        size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N, i;
        float *A = (float *)malloc(na * 4), *B = (float *)malloc(nb * 4), *C = (float *)malloc(nc * 4),
              *R = (float *)malloc(nc * 4);
        double flops = 2.0 * s->M * s->N * s->K, t, times[MAXI][BATCHES], ratios[BATCHES];
        int reps[MAXI];
        if (!A || !B || !C || !R) return 1;
        for (i = 0; i < na; i++) A[i] = (float)(2 * ad_rng_uniform(&rng) - 1);
        for (i = 0; i < nb; i++) B[i] = (float)(2 * ad_rng_uniform(&rng) - 1);
        run_impl(-2, T, pa, pb, s, A, B, R, 1);
        for (ci = 0; ci < nchosen; ci++) {
            double diff = 0;
            run_impl(chosen[ci], T, pa, pb, s, A, B, C, 1);
            for (i = 0; i < nc; i++) {
                double d = fabs((double)C[i] - (double)R[i]);
                diff = d > diff ? d : diff;
            }
            if (diff > 1e-3) printf("# %s on %s: max |diff| %.3g from ad__gemm\n",
                                    chosen[ci] < 0 ? "OpenBLAS" : variants[chosen[ci]].name, s->name, diff);
            t = cpu_now();
            run_impl(chosen[ci], T, pa, pb, s, A, B, C, 1);
            t = cpu_now() - t;
            reps[ci] = 1;
            while (t * reps[ci] < 0.03 && reps[ci] < 1 << 20) reps[ci] *= 2;
        }
        for (b = 0; b < BATCHES; b++)
            for (ci = 0; ci < nchosen; ci++) {
                t = cpu_now();
                run_impl(chosen[ci], T, pa, pb, s, A, B, C, reps[ci]);
                times[ci][b] = (cpu_now() - t) / reps[ci];
            }
        for (ci = 0; ci < nchosen; ci++) {
            for (b = 0; b < BATCHES; b++) ratios[b] = times[0][b] / times[ci][b];
            rel[si][ci] = bench_median(ratios, BATCHES);
            gf[si][ci] = flops / bench_median(times[ci], BATCHES) * 1e-9;
        }
        free(A);
        free(B);
        free(C);
        free(R);
    }
    printf("%-28s", "GFLOP/s (ratio to ad__gemm)");
    for (si = 0; si < NVSHAPES; si++) printf(" %13s", vshapes[si].name);
    printf("\n");
    for (ci = 0; ci < nchosen; ci++) {
        printf("%-28s", chosen[ci] == -2 ? "autodiff.h ad__gemm" : chosen[ci] == -1 ? "OpenBLAS" : variants[chosen[ci]].name);
        for (si = 0; si < NVSHAPES; si++) printf(" %6.1f (%4.2f)", gf[si][ci], rel[si][ci]);
        printf("\n");
    }
    free(pa);
    free(pb);
    ad_tape_free(T);
    return 0;
}
#endif
