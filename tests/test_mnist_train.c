/* End to end on the real MNIST (folder from the environment variable MNIST_DIR; skipped without
   it): load the gzipped IDX files, train a 784-128-10 MLP for one epoch on 20000 images with SGD,
   and require a test accuracy well above chance. Also checks that training is reproducible: the
   same seed gives bitwise the same parameters, whatever the thread count.
   no-sanitizer-run: this trains for real; the loaders run under the sanitizers in test_data. */
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"

#define TRAIN_IMAGES 20000
#define BATCH 64

/* Trains one epoch and returns the parameters' final values (caller frees) and the test
   accuracy. */
static ad_real *train(const ad_dataset *tr, const ad_dataset *te, int threads, double *accuracy)
{
    ad_params *P = ad_params_new(42);
    ad_optim_desc desc;
    ad_optim *opt;
    ad_batcher b;
    ad_tape *T = ad_tape_new();
    ad_init kaiming;
    ad_real *x = (ad_real *)malloc((size_t)BATCH * 784 * sizeof(ad_real)), *values;
    int y[BATCH], n, correct = 0, i, j, shape[2], w1[2] = {784, 128}, w2[2] = {128, 10};
    char err[256];
    memset(&kaiming, 0, sizeof kaiming);
    kaiming.kind = AD_INIT_KAIMING_UNIFORM;
    ad_params_add(P, "fc1.weight", 2, w1, &kaiming);
    ad_params_add(P, "fc1.bias", 1, w1 + 1, NULL);
    ad_params_add(P, "fc2.weight", 2, w2, &kaiming);
    ad_params_add(P, "fc2.bias", 1, w2 + 1, NULL);
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_SGD;
    desc.lr = 0.05;
    desc.momentum = 0.9;
    opt = ad_optim_new(P, &desc);
    ad_set_threads(T, threads);
    TH_CHECK(opt && ad_batcher_init(&b, tr, BATCH, AD_BATCH_SHUFFLE, 7, err, sizeof err) == 0, "setup: %s", err);
    while ((n = ad_batcher_next(&b, x, y)) > 0) {
        ad_tensor *h, *loss;
        shape[0] = n;
        shape[1] = 784;
        h = ad_relu(T, ad_linear(T, ad_tensor_view(T, 2, shape, x, NULL, 0), ad_param(T, P, 0), ad_param(T, P, 1)));
        loss = ad_cross_entropy(T, ad_linear(T, h, ad_param(T, P, 2), ad_param(T, P, 3)), y);
        ad_params_zero_grad_on(P, T);
        if (!loss || ad_backward(T, loss) != 0 || ad_optim_step_on(opt, T) != 0) {
            const char *why = ad_tape_error(T) ? ad_tape_error(T) : ad_params_error(P);
            TH_CHECK(0, "training step: %s", why ? why : "unknown");
            break;
        }
        ad_tape_reset(T);
    }
    ad_set_grad_enabled(T, 0);
    shape[0] = te->count;
    shape[1] = 784;
    {
        ad_tensor *h = ad_relu(T, ad_linear(T, ad_tensor_view(T, 2, shape, te->x, NULL, 0), ad_param(T, P, 0),
                                            ad_param(T, P, 1)));
        ad_tensor *logits = ad_linear(T, h, ad_param(T, P, 2), ad_param(T, P, 3));
        TH_CHECK(logits != NULL, "evaluation: %s", ad_tape_error(T));
        for (i = 0; logits && i < te->count; i++) {
            const ad_real *row = logits->data + (size_t)i * 10;
            int best = 0;
            for (j = 1; j < 10; j++)
                if (row[j] > row[best]) best = j;
            correct += best == te->labels[i];
        }
    }
    *accuracy = (double)correct / te->count;
    values = (ad_real *)malloc(ad_params_scalars(P) * sizeof(ad_real));
    memcpy(values, ad_params_values(P), ad_params_scalars(P) * sizeof(ad_real));
    ad_batcher_free(&b);
    ad_optim_free(opt);
    ad_params_free(P);
    ad_tape_free(T);
    free(x);
    return values;
}

int main(void)
{
    const char *dir = getenv("MNIST_DIR");
    ad_dataset tr, te;
    char err[512];
    double acc1, acc2;
    ad_real *v1, *v2;
    size_t scalars = 784 * 128 + 128 + 128 * 10 + 10;
    if (!dir) {
        printf("MNIST_DIR is not set: skipping the end-to-end MNIST test\n");
        return th_summary();
    }
    TH_CHECK(ad_mnist_load(dir, "train", &tr, err, sizeof err) == 0, "%s", err);
    TH_CHECK(ad_mnist_load(dir, "t10k", &te, err, sizeof err) == 0, "%s", err);
    if (th_failed) return th_summary();
    tr.count = TRAIN_IMAGES;
    v1 = train(&tr, &te, 1, &acc1);
    v2 = train(&tr, &te, 2, &acc2);
    printf("one epoch on %d images: test accuracy %.2f%% (1 thread), %.2f%% (2 threads)\n", TRAIN_IMAGES,
           100 * acc1, 100 * acc2);
    TH_CHECK(acc1 >= 0.90, "test accuracy %.4f is below 0.90", acc1);
    TH_CHECK(memcmp(v1, v2, scalars * sizeof(ad_real)) == 0, "1 and 2 threads trained different parameters");
    free(v1);
    free(v2);
    ad_dataset_free(&tr);
    ad_dataset_free(&te);
    return th_summary();
}
