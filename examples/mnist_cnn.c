/* mnist_cnn.c - trains a small convolutional network on MNIST with autodiff.h.

   Build:  cc -O2 examples/mnist_cnn.c -o mnist_cnn -lm
   Run:    ./mnist_cnn --data data/mnist      (./mnist_cnn --help lists the options)

   LeNet-style: two blocks of 5x5 convolution, batch norm, ReLU and 2x2 max pooling (16 and 32
   channels by default), dropout, and a linear head; SGD with Nesterov momentum and a cosine
   schedule. Batch norm and dropout run in training mode while it trains and in evaluation mode
   when it measures. Same options, progress display, checkpoint and plot as examples/mnist.c;
   examples/predict.c reads its checkpoints too. The last line is "test accuracy: NN.NN%". */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "mnist_model.h"
#include "mnist_train.h"

int main(int argc, char **argv) { return mnist_run(argc, argv, 1, NULL); }
