/* predict.c - classifies image files with a network trained by examples/mnist.c or
   examples/mnist_cnn.c.

   Build:  cc -O2 examples/predict.c -o predict -lm     (or: make predict, which writes build/predict)
   Run:    ./predict --checkpoint build/mnist.ckpt digit.png photo.jpg ...

   Without --checkpoint it takes mnist.ckpt in the current folder, else build/mnist.ckpt (where
   `make mnist` saves it), and says which one it used.

   Any image stb_image reads (PNG, JPEG, BMP, ...) of any size: it is converted to gray, resized
   to 28x28 when it has another size, and inverted when its background is light (MNIST digits are
   light on dark). For each file it prints the predicted digit and its probability. When a file
   sits in a folder named after a digit (as in mnist-png/<label>/<file>.png), that digit is taken as
   the true label and the accuracy is reported at the end. */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"
#include "mnist_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The checkpoints tried, in this order, when no --checkpoint is given: one saved by
   `./mnist` in the current folder, then the one `make mnist` writes. */
static const char *const default_checkpoints[] = {"mnist.ckpt", "build/mnist.ckpt"};

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG;
}

static int is_folder(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR;
}


/* The digit named by the folder that holds path ("x/7/a.png" -> 7), or -1. */
static int label_from_path(const char *path)
{
    const char *end = strrchr(path, '/'), *start;
    if (!end || end == path) return -1;
    start = end - 1;
    while (start > path && start[-1] != '/') start--;
    if (end - start == 1 && start[0] >= '0' && start[0] <= '9') return start[0] - '0';
    return -1;
}

/* Loads path as a 28x28 gray image with a dark background into pixels. Returns 0, or -1 with a
   message printed. */
static int load_digit(const char *path, ad_real *pixels)
{
    ad_image img;
    char err[512];
    double mean = 0;
    int i;
    if (ad_image_load(path, 1, &img, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    if ((img.height != MNIST_SIDE || img.width != MNIST_SIDE) &&
        ad_image_resize(&img, MNIST_SIDE, MNIST_SIDE, &img, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", path, err);
        ad_image_free(&img);
        return -1;
    }
    for (i = 0; i < MNIST_SIDE * MNIST_SIDE; i++) mean += img.data[i];
    mean /= MNIST_SIDE * MNIST_SIDE;
    for (i = 0; i < MNIST_SIDE * MNIST_SIDE; i++) pixels[i] = mean > 0.5 ? 1 - img.data[i] : img.data[i];
    ad_image_free(&img);
    return 0;
}

int main(int argc, char **argv)
{
    const char *checkpoint = NULL;
    mnist_model model;
    ad_params *P;
    ad_tape *T;
    ad_real pixels[MNIST_SIDE * MNIST_SIDE];
    char err[512];
    int i, files = 0, labelled = 0, correct = 0, failed = 0, shape[2] = {1, MNIST_SIDE * MNIST_SIDE};

    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
            checkpoint = argv[++i];
        } else {
            printf("usage: %s [--checkpoint PATH] image...\n"
                   "  --checkpoint PATH  a model saved by examples/mnist.c or mnist_cnn.c (make mnist saves\n"
                   "                     build/mnist.ckpt, make mnist-cnn build/mnist_cnn.ckpt); without it,\n"
                   "                     mnist.ckpt in the current folder, else build/mnist.ckpt\n"
                   "  image...           PNG, JPEG, BMP, ... files of any size, e.g. mnist-png/7/*.png; a file\n"
                   "                     in a folder named after a digit counts towards the accuracy\n",
                   argv[0]);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (i == argc) {
        fprintf(stderr, "%s: no image files given (see --help)\n", argv[0]);
        return 2;
    }
    if (!checkpoint) {
        size_t k;
        for (k = 0; k < sizeof default_checkpoints / sizeof *default_checkpoints && !checkpoint; k++)
            if (is_file(default_checkpoints[k])) checkpoint = default_checkpoints[k];
        if (!checkpoint) {
            fprintf(stderr, "%s: no checkpoint: neither mnist.ckpt nor build/mnist.ckpt exists; train one with\n"
                            "`make mnist` (it saves build/mnist.ckpt) or give --checkpoint PATH\n", argv[0]);
            return 1;
        }
        fprintf(stderr, "using the checkpoint %s (no --checkpoint given)\n", checkpoint);
    }
    if (is_folder(checkpoint)) {
        char inside[1024];
        size_t n = strlen(checkpoint);
        while (n > 1 && checkpoint[n - 1] == '/') n--;
        snprintf(inside, sizeof inside, "%.*s/mnist.ckpt", (int)(n < 1000 ? n : 1000), checkpoint);
        fprintf(stderr, "%s: %s is a folder; give the checkpoint file, e.g. %s\n", argv[0], checkpoint,
                is_file(inside) ? inside : "build/mnist.ckpt");
        return 1;
    }
    P = ad_params_load(checkpoint, err, sizeof err);
    if (!P) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (model_attach(&model, P) != 0) {
        fprintf(stderr, "%s: not a model of examples/mnist.c or mnist_cnn.c\n", checkpoint);
        return 1;
    }
    T = ad_tape_new();
    ad_set_grad_enabled(T, 0);
    ad_set_training(T, 0);
    for (; i < argc; i++) {
        ad_tensor *probs;
        int best, j, truth = label_from_path(argv[i]);
        files++;
        if (is_folder(argv[i])) {
            fprintf(stderr, "%s is a folder; give the image files in it, e.g. %s/*.png\n", argv[i], argv[i]);
            failed++;
            continue;
        }
        if (load_digit(argv[i], pixels) != 0) {
            failed++;
            continue;
        }
        probs = ad_softmax(T, model_forward(T, &model, ad_tensor_view(T, 2, shape, pixels, NULL, 0)), 1);
        if (!probs) {
            fprintf(stderr, "%s: %s\n", argv[i], ad_tape_error(T) ? ad_tape_error(T) : "failed");
            return 1;
        }
        for (best = 0, j = 1; j < probs->shape[1]; j++)
            if (probs->data[j] > probs->data[best]) best = j;
        printf("%s: %d (%.1f%%)%s\n", argv[i], best, 100 * probs->data[best],
               truth < 0 ? "" : (truth == best ? "" : "  wrong"));
        if (truth >= 0) {
            labelled++;
            correct += truth == best;
        }
        ad_tape_reset(T);
    }
    if (labelled)
        printf("%d of %d labelled images right: %.2f%%\n", correct, labelled, 100.0 * correct / labelled);
    if (failed) printf("%d of %d files could not be read\n", failed, files);
    ad_tape_free(T);
    model_free(&model);
    ad_params_free(P);
    return failed ? 1 : 0;
}
