/* End to end on a slice of the real MNIST (folder from MNIST_DIR; skipped without it): the
   CNN of examples/mnist_cnn.c and the MLP of examples/mnist.c, trained the same way on the same
   5000 images, evaluated on the same 2000 test images. The CNN must do better, batch norm must
   have learned running statistics, and evaluation mode must be deterministic (dropout off).
   no-sanitizer-run: this trains for real; the ops run under the sanitizers in test_nn. */
#ifndef TH_LINKED_IMPLEMENTATION /* tests/run.sh links the implementation, compiled once */
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#define AUTODIFF_IMPLEMENTATION
#endif
#include "autodiff.h"
#include "tests/harness.h"
#include "examples/mnist_model.h"

#define TRAIN_IMAGES 10000
#define TEST_IMAGES 2000
#define BATCH 32
#define EPOCHS 3

/* Test accuracy in evaluation mode, with the logits of the first image in first_logits. */
static double accuracy(ad_tape *T, mnist_model *m, const ad_dataset *te, ad_real *first_logits)
{
    int shape[2] = {TEST_IMAGES, 784}, correct = 0, i, j;
    ad_tensor *logits;
    ad_set_grad_enabled(T, 0);
    ad_set_training(T, 0);
    logits = model_forward(T, m, ad_tensor_view(T, 2, shape, te->x, NULL, 0));
    TH_CHECK(logits != NULL, "evaluation: %s", ad_tape_error(T) ? ad_tape_error(T) : "?");
    for (i = 0; logits && i < TEST_IMAGES; i++) {
        const ad_real *row = logits->data + (size_t)i * 10;
        int best = 0;
        for (j = 1; j < 10; j++)
            if (row[j] > row[best]) best = j;
        correct += best == te->labels[i];
    }
    if (logits) memcpy(first_logits, logits->data, 10 * sizeof(ad_real));
    ad_tape_reset(T);
    return (double)correct / TEST_IMAGES;
}

static double train_and_test(const ad_dataset *tr, const ad_dataset *te, int cnn, ad_real *first_logits)
{
    ad_params *P = ad_params_new(3);
    mnist_model m;
    ad_optim_desc desc;
    ad_optim *opt;
    ad_batcher b;
    ad_tape *T = ad_tape_new();
    ad_real *x = (ad_real *)malloc((size_t)BATCH * 784 * sizeof(ad_real)), again[10];
    int y[BATCH], n, epoch, shape[2], sizes[3] = {784, 128, 10};
    double acc;
    char err[256];
    TH_CHECK((cnn ? model_create_cnn(&m, P, 8, 16, 3) : model_create_mlp(&m, P, 3, sizes)) == 0, "model: %s",
             ad_params_error(P) ? ad_params_error(P) : "?");
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_SGD;
    desc.lr = 0.05;
    desc.momentum = 0.9;
    opt = ad_optim_new(P, &desc);
    TH_CHECK(ad_batcher_init(&b, tr, BATCH, AD_BATCH_SHUFFLE, 5, err, sizeof err) == 0, "batcher: %s", err);
    for (epoch = 0; epoch < EPOCHS; epoch++) {
        if (epoch) ad_batcher_reset(&b);
        while ((n = ad_batcher_next(&b, x, y)) > 0) {
            ad_tensor *loss;
            shape[0] = n;
            shape[1] = 784;
            loss = ad_cross_entropy(T, model_forward(T, &m, ad_tensor_view(T, 2, shape, x, NULL, 0)), y);
            ad_params_zero_grad(P);
            if (!loss || ad_backward(T, loss) != 0 || ad_optim_step(opt) != 0) {
                TH_CHECK(0, "training step: %s", ad_tape_error(T) ? ad_tape_error(T) : "?");
                epoch = EPOCHS;
                break;
            }
            ad_tape_reset(T);
        }
    }
    if (cnn) {
        /* the running statistics moved away from their initial 0 and 1 */
        ad_param_info mean = ad_params_info(P, ad_params_find(P, "bn1.running_mean"));
        ad_param_info var = ad_params_info(P, ad_params_find(P, "bn2.running_var"));
        TH_CHECK(mean.value[0] != 0 && var.value[0] != 1, "batch norm running statistics were not updated");
    }
    acc = accuracy(T, &m, te, first_logits);
    accuracy(T, &m, te, again);
    TH_CHECK(memcmp(first_logits, again, sizeof again) == 0, "evaluation mode is not deterministic");
    ad_batcher_free(&b);
    ad_optim_free(opt);
    model_free(&m);
    ad_params_free(P);
    ad_tape_free(T);
    free(x);
    return acc;
}

int main(void)
{
    const char *dir = getenv("MNIST_DIR");
    ad_dataset tr, te;
    ad_real logits[10];
    char err[512];
    double mlp, cnn;
    if (!dir) {
        printf("MNIST_DIR is not set: skipping the end-to-end CNN test\n");
        return th_summary();
    }
    TH_CHECK(ad_mnist_load(dir, "train", &tr, err, sizeof err) == 0, "%s", err);
    TH_CHECK(ad_mnist_load(dir, "t10k", &te, err, sizeof err) == 0, "%s", err);
    if (th_failed) return th_summary();
    tr.count = TRAIN_IMAGES;
    mlp = train_and_test(&tr, &te, 0, logits);
    cnn = train_and_test(&tr, &te, 1, logits);
    printf("%d epochs on %d images, %d test images: MLP %.2f%%, CNN %.2f%%\n", EPOCHS, TRAIN_IMAGES, TEST_IMAGES,
           100 * mlp, 100 * cnn);
    TH_CHECK(cnn > mlp, "the CNN (%.4f) does not beat the MLP (%.4f)", cnn, mlp);
    TH_CHECK(cnn >= 0.95, "CNN accuracy %.4f is below 0.95", cnn);
    ad_dataset_free(&tr);
    ad_dataset_free(&te);
    return th_summary();
}
