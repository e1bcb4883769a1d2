/* shakespeare_mpi.c - the character-level GPT of examples/shakespeare.c, trained data-parallel
   over MPI.

   Build:  mpicc -O2 examples/shakespeare_mpi.c -o shakespeare_mpi -lm
   Run:    mpirun -np 2 ./shakespeare_mpi --data data/tinyshakespeare   (--help lists the options)

   The same options, defaults, output and checkpoint as examples/shakespeare.c, for the GPT (the
   recurrent models, whose carried state belongs to the whole batch, train on one process);
   --batch is the global batch, whose sequences are shared out among the processes. Every
   process reads the text, starts from rank 0's parameters, trains on its share of each batch
   and sums the gradients with the others through examples/data_parallel.h while its backward
   sweep goes on; the gradients are clipped and all take the same step, so their parameters stay
   bitwise the same. The loss estimates are shared out too. Rank 0 alone prints, writes the
   checkpoint (which examples/shakespeare.c samples from and resumes, as this program resumes
   one of shakespeare.c's GPT runs, on any number of processes) and the plot, and samples.
   After the plot rank 0 prints one line per process, "rank R parameters: HEX", the FNV-1a 64
   hash of its parameters; the last line is "val loss: X.XXXX". */
#include <mpi.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "shakespeare_train.h"
#include "data_parallel.h"
#include "train_group_mpi.h"

int main(int argc, char **argv) { return train_mpi_main(argc, argv, shakespeare_run); }
