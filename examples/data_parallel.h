/* data_parallel.h - data-parallel training of autodiff.h models over MPI.

   Every process (rank) holds the whole model in its own ad_params store, runs its own tape on
   its share of each global batch, and the ranks sum their gradients with MPI_Allreduce on the
   store's flat gradient buffer. The buffer is sent in buckets of neighbouring parameters, each
   started (MPI_Iallreduce) as soon as the backward sweep has finished the gradients in it
   (ad_params_set_grad_hook), so that the sums travel while the sweep goes on with the earlier
   layers. Every rank then takes the same optimizer step on the same sums, so the parameters
   stay bitwise the same on every rank.

   The sum of the ranks' gradients is the gradient of the global batch's mean loss when each
   rank's loss is the mean over its own rows times its share of the batch: dp_share gives a
   rank's rows and that factor. A rank whose share is empty still takes part (its gradient is
   zero), so every global batch size works on every number of ranks.

   Copy this file into your program and include it after autodiff.h and <mpi.h>; build with
   mpicc. Start MPI with MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...): autodiff.h's threads
   never call MPI, and the hook runs on the thread that called ad_backward.

       dp_group g;
       dp_init(&g, MPI_COMM_WORLD);
       dp_attach(&g, P, NULL);                          after the last ad_params_add
       dp_broadcast_parameters(&g);                     every rank takes rank 0's values
       for each global batch of n rows:
           double share = dp_share(&g, n, &lo, &hi);    this rank's rows lo .. hi-1
           ad_params_zero_grad(P);
           dp_begin(&g);
           loss = ad_mul_scalar(T, mean loss of rows lo .. hi-1, share);
           ad_backward(T, loss);                        (skipped when lo == hi)
           dp_end(&g);                                  the gradients now hold the sums
           ad_optim_step(opt);
       dp_detach(&g);

   Errors that every rank meets at the same point (setup) go through dp_agree, which lets every
   rank know and stop cleanly; an error one rank meets alone in the middle of collective work
   goes to dp_fail, which stops all ranks with MPI_Abort. Either way each failing rank names
   itself and the reason on stderr, and no rank is left waiting. */
#ifndef DATA_PARALLEL_H
#define DATA_PARALLEL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The functions are static, one copy per program; those a program does not call draw no
   warning. */
#if defined(__GNUC__) || defined(__clang__)
#define DP_FN static __attribute__((unused))
#else
#define DP_FN static
#endif

/* Default bucket size: big enough that each MPI_Iallreduce moves a useful amount, small
   enough that the last layers' gradients leave before the sweep reaches the first layer. */
#define DP_BUCKET_BYTES ((size_t)256 << 10)

typedef struct dp_options {
    size_t bucket_bytes; /* 0: DP_BUCKET_BYTES */
    int no_overlap;      /* 1: one MPI_Allreduce of the whole buffer in dp_end, after the sweep */
} dp_options;

/* A run of neighbouring parameters whose gradients are summed by one MPI_Iallreduce. */
typedef struct dp_bucket {
    size_t offset, count; /* in scalars of the flat gradient buffer */
    int params;           /* parameters in the bucket */
    int pending;          /* of them, those whose gradient this step has not completed */
} dp_bucket;

typedef struct dp_group {
    MPI_Comm comm;
    MPI_Datatype real;   /* MPI's type of ad_real */
    int rank, size;
    ad_params *P;
    int overlap;
    int nbuckets;
    dp_bucket *buckets;  /* in the order they are started: the last parameters first */
    MPI_Request *requests;
    int *bucket_of;      /* parameter id -> bucket */
    int started;         /* buckets started this step; always in bucket order on every rank */
    int in_step;         /* between dp_begin and dp_end */
    long steps;
    double wait_seconds; /* in dp_end, waiting for sums that the sweep did not hide */
} dp_group;

/* FNV-1a, 64 bits, of n bytes: the fingerprint that ranks compare. */
DP_FN uint64_t dp_fnv1a(const void *bytes, size_t n, uint64_t h)
{
    const unsigned char *p = (const unsigned char *)bytes;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}
#define DP_FNV_OFFSET 0xcbf29ce484222325ULL

/* An error this rank met alone: says so on stderr, naming the rank, and stops every rank. */
DP_FN void dp_fail(const dp_group *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: ", g->rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    MPI_Abort(g->comm, 1);
    exit(1); /* MPI_Abort does not return; this keeps compilers from assuming it may */
}

/* Collective: every rank says whether it is fine (ok 1) or why not (ok 0, message). Each rank
   that is not names itself and prints its message; returns 0 on every rank when all are fine,
   else the number of ranks that are not, on every rank. */
DP_FN int dp_agree(const dp_group *g, int ok, const char *message)
{
    int bad = !ok, total = 0;
    if (bad) {
        fprintf(stderr, "rank %d: %s\n", g->rank, message ? message : "failed");
        fflush(stderr);
    }
    MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, g->comm);
    return total;
}

/* Collective: whether n bytes (a fingerprint of them) are the same on every rank as on rank 0.
   Each rank whose bytes differ says "rank R: its WHAT differs from rank 0's". Returns 0 when
   all agree, else -1 on every rank. */
DP_FN int dp_same_bytes(const dp_group *g, const void *bytes, size_t n, const char *what)
{
    uint64_t mine = dp_fnv1a(bytes, n, DP_FNV_OFFSET), root = mine;
    char message[256];
    MPI_Bcast(&root, 1, MPI_UINT64_T, 0, g->comm);
    snprintf(message, sizeof message, "its %s differs from rank 0's", what);
    return dp_agree(g, mine == root, message) ? -1 : 0;
}

/* Collective: whether every rank was started with the same arguments (argv[1..]) as rank 0.
   Each rank whose arguments differ names the first one that does. Returns 0, or -1 on every
   rank. */
DP_FN int dp_same_arguments(const dp_group *g, int argc, char **argv)
{
    char *mine, *root, message[512];
    size_t len = 0, at = 0;
    unsigned long root_len;
    int i, ok;
    for (i = 1; i < argc; i++) len += strlen(argv[i]) + 1;
    mine = (char *)malloc(len + 1);
    if (!mine) dp_fail(g, "out of memory");
    for (i = 1; i < argc; i++) {
        size_t k = strlen(argv[i]);
        memcpy(mine + at, argv[i], k + 1); /* joined by their terminating zeros */
        at += k + 1;
    }
    root_len = (unsigned long)len;
    MPI_Bcast(&root_len, 1, MPI_UNSIGNED_LONG, 0, g->comm);
    root = (char *)malloc(root_len + 1);
    if (!root) dp_fail(g, "out of memory");
    if (g->rank == 0) memcpy(root, mine, len);
    MPI_Bcast(root, (int)root_len, MPI_CHAR, 0, g->comm);
    ok = root_len == len && memcmp(root, mine, len) == 0;
    if (!ok) {
        /* the first argument that differs, with the option it belongs to when there is one */
        const char *a = mine, *b = root, *option = "";
        int k = 1;
        while (a < mine + len && b < root + root_len && strcmp(a, b) == 0) {
            option = a[0] == '-' ? a : "";
            a += strlen(a) + 1;
            b += strlen(b) + 1;
            k++;
        }
        snprintf(message, sizeof message, "its arguments differ from rank 0's: argument %d is '%s%s%s' where rank 0's is '%s%s%s'",
                 k, option, *option ? " " : "", a < mine + len ? a : "(none)", option, *option ? " " : "",
                 b < root + root_len ? b : "(none)");
    }
    free(mine);
    free(root);
    return dp_agree(g, ok, message) ? -1 : 0;
}

/* This rank's rows of a global batch of n: lo .. hi-1, the shares of the ranks differing by at
   most one row. Returns the share's part of the batch, (hi - lo) / n, the factor of the rank's
   mean loss. */
DP_FN double dp_share(const dp_group *g, int n, int *lo, int *hi)
{
    *lo = (int)((long long)n * g->rank / g->size);
    *hi = (int)((long long)n * (g->rank + 1) / g->size);
    return n > 0 ? (double)(*hi - *lo) / n : 0;
}

/* Collective: sums n doubles over the ranks, in place, the same on every rank. */
DP_FN void dp_sum(const dp_group *g, double *v, int n)
{
    if (g->size > 1) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, g->comm);
}

/* Collective: every rank takes rank 0's parameter values. */
DP_FN void dp_broadcast_parameters(const dp_group *g)
{
    size_t n = ad_params_scalars(g->P), at;
    ad_real *v = ad_params_values(g->P);
    for (at = 0; at < n; at += (size_t)1 << 30) { /* counts are ints */
        size_t k = n - at < (size_t)1 << 30 ? n - at : (size_t)1 << 30;
        MPI_Bcast(v + at, (int)k, g->real, 0, g->comm);
    }
}

/* Collective: the ranks on this rank's machine (which share its cores). */
DP_FN int dp_local_ranks(const dp_group *g)
{
    MPI_Comm local;
    int n = 1;
    if (MPI_Comm_split_type(g->comm, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &n);
        MPI_Comm_free(&local);
    }
    return n;
}

DP_FN void dp_start_bucket(dp_group *g, int b)
{
    ad_real *grads = ad_params_grads(g->P) + g->buckets[b].offset;
    MPI_Iallreduce(MPI_IN_PLACE, grads, (int)g->buckets[b].count, g->real, MPI_SUM, g->comm, &g->requests[b]);
}

/* Starts, in bucket order, every bucket whose gradients are complete, up to the first that is
   not: all ranks start the same collectives in the same order, which MPI requires. */
DP_FN void dp_start_ready(dp_group *g)
{
    while (g->started < g->nbuckets && g->buckets[g->started].pending == 0) dp_start_bucket(g, g->started++);
}

/* The store's hook: parameter id's gradient is complete. */
DP_FN void dp_gradient_complete(ad_params *P, int id, void *ctx)
{
    dp_group *g = (dp_group *)ctx;
    int flag;
    (void)P;
    if (!g->in_step) return; /* an ad_backward outside dp_begin .. dp_end */
    g->buckets[g->bucket_of[id]].pending--;
    dp_start_ready(g);
    /* MPI moves non-blocking collectives along inside its calls: one here for those started */
    if (g->started) MPI_Testall(g->started, g->requests, &flag, MPI_STATUSES_IGNORE);
}

/* Sets g up for the ranks of comm (MPI_COMM_WORLD, say). */
DP_FN void dp_init(dp_group *g, MPI_Comm comm)
{
    memset(g, 0, sizeof *g);
    g->comm = comm;
    g->real = sizeof(ad_real) == sizeof(double) ? MPI_DOUBLE : MPI_FLOAT;
    MPI_Comm_rank(comm, &g->rank);
    MPI_Comm_size(comm, &g->size);
}

/* Collective: g is to sum the gradients of store P, whose parameters must all be added.
   Buckets hold neighbouring parameters, from the last to the first (the order in which a
   backward sweep completes a network built first layer first), of at least bucket_bytes each
   where the parameters allow. Sets P's gradient hook. Returns 0, or -1 on every rank (out of
   memory on some rank, which says so). */
DP_FN int dp_attach(dp_group *g, ad_params *P, const dp_options *options)
{
    size_t bucket_bytes = options && options->bucket_bytes ? options->bucket_bytes : DP_BUCKET_BYTES;
    int nparams = ad_params_count(P), id;
    g->P = P;
    g->overlap = !(options && options->no_overlap);
    g->buckets = (dp_bucket *)calloc((size_t)nparams + 1, sizeof *g->buckets);
    g->requests = (MPI_Request *)malloc(((size_t)nparams + 1) * sizeof *g->requests);
    g->bucket_of = (int *)malloc(((size_t)nparams + 1) * sizeof *g->bucket_of);
    if (dp_agree(g, g->buckets && g->requests && g->bucket_of, "out of memory") != 0) return -1;
    for (id = nparams - 1; id >= 0; id--) {
        ad_param_info info = ad_params_info(P, id);
        dp_bucket *b = &g->buckets[g->nbuckets];
        b->offset = info.offset; /* ids go down: the bucket grows towards the buffer's start */
        b->count += info.size;
        b->params++;
        g->bucket_of[id] = g->nbuckets;
        if (b->count * sizeof(ad_real) >= bucket_bytes || b->count >= (size_t)1 << 30) g->nbuckets++;
    }
    if (g->nbuckets < nparams + 1 && g->buckets[g->nbuckets].params) g->nbuckets++;
    if (g->overlap && g->size > 1) ad_params_set_grad_hook(P, dp_gradient_complete, g);
    return 0;
}

/* Frees what dp_attach made and removes the store's hook; g keeps its communicator. */
DP_FN void dp_detach(dp_group *g)
{
    if (g->P) ad_params_set_grad_hook(g->P, NULL, NULL);
    free(g->buckets);
    free(g->requests);
    free(g->bucket_of);
    g->P = NULL;
    g->buckets = NULL;
    g->requests = NULL;
    g->bucket_of = NULL;
    g->nbuckets = 0;
}

/* Before this step's ad_backward: every bucket waits for all its parameters again. */
DP_FN void dp_begin(dp_group *g)
{
    int b;
    for (b = 0; b < g->nbuckets; b++) g->buckets[b].pending = g->buckets[b].params;
    g->started = 0;
    g->in_step = 1;
}

/* Collective, after this step's ad_backward (or in its place, for an empty share: the
   gradients are then whatever the rank holds, zeros after a zero_grad): starts what is left and
   waits until every gradient holds its sum over the ranks. */
DP_FN void dp_end(dp_group *g)
{
    double t0 = MPI_Wtime();
    g->in_step = 0;
    g->steps++;
    if (g->size == 1) return;
    if (!g->overlap) {
        size_t n = ad_params_scalars(g->P), at;
        ad_real *grads = ad_params_grads(g->P);
        for (at = 0; at < n; at += (size_t)1 << 30) {
            size_t k = n - at < (size_t)1 << 30 ? n - at : (size_t)1 << 30;
            MPI_Allreduce(MPI_IN_PLACE, grads + at, (int)k, g->real, MPI_SUM, g->comm);
        }
    } else {
        while (g->started < g->nbuckets) dp_start_bucket(g, g->started++);
        MPI_Waitall(g->nbuckets, g->requests, MPI_STATUSES_IGNORE);
    }
    g->wait_seconds += MPI_Wtime() - t0;
}

/* FNV-1a 64 of the store's parameter values on this rank. */
DP_FN uint64_t dp_parameters_hash(const dp_group *g)
{
    return dp_fnv1a(ad_params_values(g->P), ad_params_scalars(g->P) * sizeof(ad_real), DP_FNV_OFFSET);
}

/* Collective: every rank's parameter hash, into hashes (g->size of them, on every rank).
   Returns 0 when they are all equal, else -1. */
DP_FN int dp_gather_parameter_hashes(const dp_group *g, uint64_t *hashes)
{
    uint64_t mine = dp_parameters_hash(g);
    int r;
    MPI_Allgather(&mine, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, g->comm);
    for (r = 1; r < g->size; r++)
        if (hashes[r] != hashes[0]) return -1;
    return 0;
}

#endif
