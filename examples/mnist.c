/* mnist.c - trains a multilayer perceptron on MNIST (or Fashion-MNIST) with autodiff.h.

   Build:  cc -O2 examples/mnist.c -o mnist -lm
   Run:    ./mnist --data data/mnist          (./mnist --help lists the options)

   The data folder holds the four IDX files of MNIST, raw or gzipped:
   train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
   The default network is 784-512-10 with ReLU, trained by SGD with Nesterov momentum and a
   cosine learning-rate schedule. While it trains it shows a progress bar on a terminal (plain
   lines otherwise). At the end it prints the test accuracy and a confusion matrix, saves a
   checkpoint (parameters and optimizer state; examples/predict.c classifies image files with
   it) and writes an SVG plot of loss and accuracy per epoch. The last line is
   "test accuracy: NN.NN%". */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "mnist_model.h"
#include "mnist_train.h"

int main(int argc, char **argv) { return mnist_run(argc, argv, 0, NULL); }
