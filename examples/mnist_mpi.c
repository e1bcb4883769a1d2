/* mnist_mpi.c - the multilayer perceptron of examples/mnist.c, trained data-parallel over MPI.

   Build:  mpicc -O2 examples/mnist_mpi.c -o mnist_mpi -lm
   Run:    mpirun -np 2 ./mnist_mpi --data data/mnist      (./mnist_mpi --help lists the options)

   The same options, defaults, output and checkpoint as examples/mnist.c; --batch is the global
   batch, shared out among the processes. Every process reads the data set, starts from rank 0's
   parameters, trains on its share of each batch and sums the gradients with the others through
   examples/data_parallel.h, while its backward sweep goes on; all of them then take the same
   step, so their parameters stay bitwise the same. The test set is measured in shares too.
   Rank 0 alone prints, writes the checkpoint (which examples/predict.c reads and examples/mnist.c
   resumes, as this program resumes one of mnist.c's, on any number of processes) and the plot.
   Before the last line, "test accuracy: NN.NN%", rank 0 prints one line per process,
   "rank R parameters: HEX", the FNV-1a 64 hash of its parameters.

   Each process runs --threads threads, by default the cores of its machine divided by the
   processes on that machine. On several machines: the same program and data on each, and a
   host file for mpirun (see README.md). A process that cannot read its data, or whose
   arguments, data or checkpoint differ from rank 0's, makes them all stop with a message that
   names it. */
#include <mpi.h>
#include <unistd.h>
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "mnist_model.h"
#include "mnist_train.h"
#include "data_parallel.h"

/* ---- the group of examples/mnist_train.h, on data_parallel.h ---- */

/* The one group of this program: its processes and how they sum gradients. */
static struct {
    dp_group dp;
    dp_options options;
} group;

static double group_share(void *ctx, int n, int *lo, int *hi) { return dp_share((dp_group *)ctx, n, lo, hi); }
static int group_agree(void *ctx, int ok, const char *why) { return dp_agree((dp_group *)ctx, ok, why); }
static void group_begin(void *ctx) { dp_begin((dp_group *)ctx); }
static void group_end(void *ctx) { dp_end((dp_group *)ctx); }
static void group_sum(void *ctx, double *v, int n) { dp_sum((dp_group *)ctx, v, n); }
static void group_fail(void *ctx, const char *why) { dp_fail((dp_group *)ctx, "%s", why); }

/* Every rank checks that it trains on the data rank 0 does, takes rank 0's parameters, then
   checks that its whole state (parameters, optimizer, the run) is rank 0's. */
static int group_start(void *ctx, const ad_dataset *train, const ad_dataset *test, ad_params *P,
                       const ad_optim *opt)
{
    dp_group *g = (dp_group *)ctx;
    size_t len = ad_checkpoint_size(P, opt);
    void *image;
    int rc;
    if (dp_attach(g, P, &group.options) != 0) return -1;
    if (dp_same_bytes(g, train->x, (size_t)train->count * train->sample_size * sizeof(ad_real), "training images") ||
        dp_same_bytes(g, train->labels, (size_t)train->count * sizeof(int), "training labels") ||
        dp_same_bytes(g, test->x, (size_t)test->count * test->sample_size * sizeof(ad_real), "test images") ||
        dp_same_bytes(g, test->labels, (size_t)test->count * sizeof(int), "test labels"))
        return -1;
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

static int group_check_parameters(void *ctx, ad_params *P, int print)
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
    free(hashes);
    return rc;
}

/* Takes this program's own options out of argv (leaving mnist_run's) into *o. Returns the new
   argc, or -1 after a bad value (said on rank 0). */
static int take_own_options(int argc, char **argv, dp_options *o, int speak)
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

int main(int argc, char **argv)
{
    mnist_group g;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int provided, local, rc, i, help = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    dp_init(&group.dp, MPI_COMM_WORLD);
    /* every option, this program's too, must be the same on every rank */
    if (dp_same_arguments(&group.dp, argc, argv) != 0) {
        MPI_Finalize();
        return 2;
    }
    for (i = 1; i < argc; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    argc = take_own_options(argc, argv, &group.options, group.dp.rank == 0);
    if (argc < 0) {
        MPI_Finalize();
        return 2;
    }
    local = dp_local_ranks(&group.dp);
    memset(&g, 0, sizeof g);
    g.rank = group.dp.rank;
    g.ranks = group.dp.size;
    g.threads = cores > local ? (int)(cores / local) : 1;
    g.ctx = &group.dp;
    g.share = group_share;
    g.agree = group_agree;
    g.start = group_start;
    g.begin_gradients = group_begin;
    g.end_gradients = group_end;
    g.sum = group_sum;
    g.fail = group_fail;
    g.check_parameters = group_check_parameters;
    rc = mnist_run(argc, argv, 0, &g);
    if (help && group.dp.rank == 0)
        printf("options of the data-parallel program:\n"
               "  --no-overlap       sum the gradients in one MPI_Allreduce after the backward sweep, rather\n"
               "                     than in buckets started while it runs\n"
               "  --bucket-kib N     the smallest bucket, in KiB (default %d)\n"
               "  --threads N        default here: the cores of the machine over the processes on it\n",
               (int)(DP_BUCKET_BYTES >> 10));
    dp_detach(&group.dp);
    MPI_Finalize();
    return rc;
}
