/* shakespeare.c - a character-level language model of Tiny Shakespeare, trained with autodiff.h.

   Build:  cc -O2 examples/shakespeare.c -o shakespeare -lm
   Run:    ./shakespeare --data data/tinyshakespeare          (./shakespeare --help lists the options)

   The data is the text file input.txt of Tiny Shakespeare (or any text: --data names the file
   or its folder); its first 90% trains, the rest validates, and its sorted set of bytes is the
   vocabulary. The default model and recipe are nanoGPT's shakespeare_char for the CPU: a GPT of
   4 layers, 4 heads and 128-wide embeddings over a context of 64 characters, batches of 12,
   2000 steps of AdamW (lr 1e-3, betas 0.9 and 0.99, weight decay 0.1 on matrices, gradients
   clipped at norm 1) with 100 warm-up steps and cosine decay to 1e-4. --model lstm or gru
   trains a recurrent model instead, by truncated backpropagation through time: the batch's rows
   read the training text as consecutive streams, and each step carries its state into the next.

   While it trains it shows a progress bar on a terminal (plain lines otherwise), and every
   --eval-interval steps the mean loss of --eval-batches random batches of each split. After
   the last step it estimates both losses again on --final-batches batches, saves a checkpoint
   (the model, its configuration and vocabulary, the optimizer), writes an SVG plot of the
   losses, and prints 500 characters sampled from the model. --sample-only CKPT prints a sample
   of a saved model. The last line of a training run is "val loss: X.XXXX". */
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "shakespeare_train.h"

int main(int argc, char **argv) { return shakespeare_run(argc, argv, NULL); }
