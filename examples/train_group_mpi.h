/* train_group_mpi.h - the train_group of training_util.h over MPI, on data_parallel.h: the main
   of a training program whose run is shared by the processes of MPI_COMM_WORLD
   (examples/mnist_mpi.c, examples/shakespeare_mpi.c).

   train_mpi_main checks that every process was started with the same arguments, takes the
   options of data-parallel training out of them (--no-overlap, --bucket-kib N) and calls the
   program's run function with the group. Each process's default thread count is the cores of
   its machine divided by the processes on that machine.

   Include after autodiff.h, <mpi.h>, training_util.h and data_parallel.h. */
#ifndef TRAIN_GROUP_MPI_H
#define TRAIN_GROUP_MPI_H

#include <unistd.h>

/* The one group of a program: its processes and how they sum gradients. */
static struct {
    dp_group dp;
    dp_options options;
} train_mpi;

static double train_mpi_share(void *ctx, int n, int *lo, int *hi) { return dp_share((dp_group *)ctx, n, lo, hi); }
static int train_mpi_agree(void *ctx, int ok, const char *why) { return dp_agree((dp_group *)ctx, ok, why); }
static void train_mpi_begin(void *ctx) { dp_begin((dp_group *)ctx); }
static void train_mpi_end(void *ctx) { dp_end((dp_group *)ctx); }
static void train_mpi_sum(void *ctx, double *v, int n) { dp_sum((dp_group *)ctx, v, n); }
static void train_mpi_fail(void *ctx, const char *why) { dp_fail((dp_group *)ctx, "%s", why); }

static int train_mpi_same(void *ctx, const void *bytes, size_t n, const char *what)
{
    return dp_same_bytes((dp_group *)ctx, bytes, n, what);
}

/* Every process takes rank 0's parameters, then checks that its whole state (parameters,
   optimizer, the run in the store's extra bytes) is rank 0's. */
static int train_mpi_start(void *ctx, ad_params *P, const ad_optim *opt)
{
    dp_group *g = (dp_group *)ctx;
    size_t len = ad_checkpoint_size(P, opt);
    void *image;
    int rc;
    if (dp_attach(g, P, &train_mpi.options) != 0) return -1;
    dp_broadcast_parameters(g);
    image = malloc(len);
    rc = image && ad_checkpoint_save_memory(image, len, P, opt) == 0;
    if (dp_agree(g, rc, "cannot take a picture of the model's state") == 0)
        rc = dp_same_bytes(g, image, len, "model, optimizer and run state");
    else
        rc = -1;
    free(image);
    return rc;
}

static int train_mpi_check_parameters(void *ctx, ad_params *P, int print)
{
    dp_group *g = (dp_group *)ctx;
    uint64_t *hashes = (uint64_t *)malloc((size_t)g->size * sizeof *hashes);
    int rc, r;
    (void)P;
    if (!hashes) dp_fail(g, "out of memory");
    rc = dp_gather_parameter_hashes(g, hashes);
    for (r = 0; g->rank == 0 && r < g->size; r++) {
        if (print) printf("rank %d parameters: %016llx\n", r, (unsigned long long)hashes[r]);
        if (hashes[r] != hashes[0])
            fprintf(stderr, "rank %d's parameters differ from rank 0's: the ranks no longer train one model\n", r);
    }
    fflush(stdout);
    free(hashes);
    return rc;
}

/* Takes the options of data-parallel training out of argv (leaving the program's) into *o.
   Returns the new argc, or -1 after a bad value (said when speak is 1). */
static int train_mpi_take_options(int argc, char **argv, dp_options *o, int speak)
{
    int i, kept = 1;
    memset(o, 0, sizeof *o);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-overlap")) {
            o->no_overlap = 1;
        } else if (!strcmp(argv[i], "--bucket-kib")) {
            long kib = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 0;
            if (kib < 1 || kib > (1L << 20)) {
                if (speak) fprintf(stderr, "%s: --bucket-kib takes a size from 1 to 1048576\n", argv[0]);
                return -1;
            }
            o->bucket_bytes = (size_t)kib << 10;
            i++;
        } else {
            argv[kept++] = argv[i];
        }
    }
    argv[kept] = NULL;
    return kept;
}

/* The main of a program whose run is run(argc, argv, group), on every process. Returns its exit
   status. */
static int train_mpi_main(int argc, char **argv, int (*run)(int argc, char **argv, const train_group *g))
{
    train_group g;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int provided, local, rc, i, help = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    dp_init(&train_mpi.dp, MPI_COMM_WORLD);
    /* every option, those of data-parallel training too, must be the same on every rank */
    if (dp_same_arguments(&train_mpi.dp, argc, argv) != 0) {
        MPI_Finalize();
        return 2;
    }
    for (i = 1; i < argc; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    argc = train_mpi_take_options(argc, argv, &train_mpi.options, train_mpi.dp.rank == 0);
    if (argc < 0) {
        MPI_Finalize();
        return 2;
    }
    local = dp_local_ranks(&train_mpi.dp);
    memset(&g, 0, sizeof g);
    g.rank = train_mpi.dp.rank;
    g.ranks = train_mpi.dp.size;
    g.threads = cores > local ? (int)(cores / local) : 1;
    g.ctx = &train_mpi.dp;
    g.share = train_mpi_share;
    g.agree = train_mpi_agree;
    g.same = train_mpi_same;
    g.start = train_mpi_start;
    g.begin_gradients = train_mpi_begin;
    g.end_gradients = train_mpi_end;
    g.sum = train_mpi_sum;
    g.fail = train_mpi_fail;
    g.check_parameters = train_mpi_check_parameters;
    rc = run(argc, argv, &g);
    if (help && train_mpi.dp.rank == 0)
        printf("options of data-parallel training:\n"
               "  --no-overlap       sum the gradients in one MPI_Allreduce after the backward sweep, rather\n"
               "                     than in buckets started while it runs\n"
               "  --bucket-kib N     the smallest bucket, in KiB (default %d)\n"
               "  --threads N        default here: the cores of the machine over the processes on it\n",
               (int)(DP_BUCKET_BYTES >> 10));
    dp_detach(&train_mpi.dp);
    MPI_Finalize();
    return rc;
}

#endif
