/* tape_pictures.c - draws two tapes as Graphviz DOT files: the tutorial's sigmoid sigma(W x + b)
   built from primitive ops, and one training step of the MNIST MLP (examples/mnist.c's model).
   `make pictures` renders them to SVG with Graphviz's dot into examples/pictures/.

       cc -O2 examples/tape_pictures.c -lm && ./a.out [folder] */
#define AUTODIFF_IMPLEMENTATION
#include "../autodiff.h"

#include <stdio.h>

static int write_picture(ad_tape *T, ad_tensor *y, const char *folder, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.dot", folder, name);
    if (ad_tape_write_dot(T, y, path) != 0) {
        fprintf(stderr, "%s\n", ad_tape_error(T));
        return 1;
    }
    printf("wrote %s\n", path);
    return 0;
}

int main(int argc, char **argv)
{
    const char *folder = argc > 1 ? argv[1] : ".";
    ad_tape *T = ad_tape_new();
    ad_params *P = ad_params_new(1);
    ad_init kaiming = {AD_INIT_KAIMING_UNIFORM, 0, 0, 0};
    int W1, b1, W2, b2, labels[64] = {0}, failed = 0;
    ad_tensor *x, *W, *b, *z, *y, *h, *loss;
    if (!T || !P) return 1;

    /* sigma(W x + b) as the tutorial's nodes: z = W x + b, then 1 / (1 + exp(-z)) */
    x = ad_set_name(ad_tensor_new(T, AD_SHAPE(1, 2), (const ad_real[]){3, 1}, 0), "x");
    W = ad_set_name(ad_tensor_new(T, AD_SHAPE(2, 1), (const ad_real[]){1, 1}, 1), "W");
    b = ad_set_name(ad_tensor_new(T, AD_SHAPE(1), NULL, 1), "b");
    z = ad_set_name(ad_add(T, ad_matmul(T, x, W), b), "z");
    y = ad_div(T, ad_scalar(T, 1), ad_add_scalar(T, ad_exp(T, ad_neg(T, z)), 1));
    failed |= !y || write_picture(T, ad_set_name(y, "sigma"), folder, "sigmoid");
    ad_tape_reset(T);

    /* one step of the MLP: 784 -> 128 (ReLU) -> 10, cross-entropy over a batch of 64 */
    W1 = ad_params_add(P, "fc1.weight", AD_SHAPE(784, 128), &kaiming);
    b1 = ad_params_add(P, "fc1.bias", AD_SHAPE(128), NULL);
    W2 = ad_params_add(P, "fc2.weight", AD_SHAPE(128, 10), &kaiming);
    b2 = ad_params_add(P, "fc2.bias", AD_SHAPE(10), NULL);
    x = ad_set_name(ad_zeros(T, AD_SHAPE(64, 784)), "images");
    h = ad_relu(T, ad_linear(T, x, ad_param(T, P, W1), ad_param(T, P, b1)));
    loss = ad_cross_entropy(T, ad_linear(T, h, ad_param(T, P, W2), ad_param(T, P, b2)), labels);
    failed |= !loss || write_picture(T, ad_set_name(loss, "loss"), folder, "mlp_step");

    ad_tape_free(T);
    ad_params_free(P);
    return failed;
}
