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
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "mnist_model.h"
#include "mnist_train.h"
#include "data_parallel.h"
#include "train_group_mpi.h"

static int run_mlp(int argc, char **argv, const train_group *g) { return mnist_run(argc, argv, 0, g); }

int main(int argc, char **argv) { return train_mpi_main(argc, argv, run_mlp); }
