/* The MNIST classifiers of the examples. A model is defined by its parameters alone, so that a
   program that loads a checkpoint (examples/predict.c) rebuilds the network from the names and
   shapes it finds:

   MLP  fc1.weight [784, h1], fc1.bias [h1], fc2.weight [h1, h2], ... fcN: each layer is x W + b,
        with ReLU between layers and none after the last.
   CNN  conv1 5x5 (1 -> c1) - batch norm - ReLU - max pool 2 - conv2 5x5 (c1 -> c2) - batch
        norm - ReLU - max pool 2 - dropout - fc [c2*4*4, 10]. The batch norm layers' running
        statistics are frozen entries of the store (bnK.running_mean, bnK.running_var), so that
        checkpoints carry them.

   Include after autodiff.h. */
#ifndef MNIST_MODEL_H
#define MNIST_MODEL_H

#include <stdio.h>
#include <string.h>

#define MNIST_MAX_LAYERS 8
#define MNIST_SIDE 28

typedef struct mnist_model {
    ad_params *P;
    int cnn;                    /* 0: MLP, 1: CNN */
    int layers;                 /* MLP: linear layers */
    ad_batch_norm_state bn[2];  /* CNN */
    ad_real dropout;            /* CNN: probability before the head */
    ad_rng rng;                 /* CNN: dropout masks */
} mnist_model;

static inline int model_param(const mnist_model *m, const char *name) { return ad_params_find(m->P, name); }

static inline ad_tensor *model_use(ad_tape *T, const mnist_model *m, const char *name)
{
    return ad_param(T, m->P, model_param(m, name));
}

/* An MLP with the given layer widths (sizes[0] inputs ... sizes[n-1] outputs) in P: Kaiming-
   uniform weights, zero biases. Returns 0, or -1 with P's error set. */
static inline int model_create_mlp(mnist_model *m, ad_params *P, int n, const int *sizes)
{
    ad_init kaiming;
    char name[32];
    int i, shape[2];
    memset(m, 0, sizeof *m);
    memset(&kaiming, 0, sizeof kaiming);
    kaiming.kind = AD_INIT_KAIMING_UNIFORM;
    m->P = P;
    m->layers = n - 1;
    for (i = 0; i + 1 < n; i++) {
        shape[0] = sizes[i];
        shape[1] = sizes[i + 1];
        snprintf(name, sizeof name, "fc%d.weight", i + 1);
        if (ad_params_add(P, name, 2, shape, &kaiming) < 0) return -1;
        snprintf(name, sizeof name, "fc%d.bias", i + 1);
        if (ad_params_add(P, name, 1, shape + 1, NULL) < 0) return -1;
    }
    return 0;
}

/* Points batch norm layer k at its running statistics in the store, keeping their values. */
static inline int model_attach_bn(mnist_model *m, int k)
{
    char mean_name[32], var_name[32];
    ad_param_info mean, var;
    ad_real *keep;
    int c;
    snprintf(mean_name, sizeof mean_name, "bn%d.running_mean", k + 1);
    snprintf(var_name, sizeof var_name, "bn%d.running_var", k + 1);
    if (model_param(m, mean_name) < 0 || model_param(m, var_name) < 0) return -1;
    mean = ad_params_info(m->P, model_param(m, mean_name));
    var = ad_params_info(m->P, model_param(m, var_name));
    c = (int)mean.size;
    keep = (ad_real *)malloc(2 * (size_t)c * sizeof(ad_real));
    if (!keep) return -1;
    memcpy(keep, mean.value, (size_t)c * sizeof(ad_real));
    memcpy(keep + c, var.value, (size_t)c * sizeof(ad_real));
    if (ad_batch_norm_init(&m->bn[k], c, mean.value, var.value, NULL, 0) != 0) {
        free(keep);
        return -1;
    }
    memcpy(mean.value, keep, (size_t)c * sizeof(ad_real));
    memcpy(var.value, keep + c, (size_t)c * sizeof(ad_real));
    free(keep);
    return 0;
}

/* The CNN in P with c1 and c2 channels. Returns 0, or -1 with P's error set. */
static inline int model_create_cnn(mnist_model *m, ad_params *P, int c1, int c2, uint64_t seed)
{
    ad_init kaiming, one, zero;
    int k, channels[2], w1[4] = {0, 1, 5, 5}, w2[4] = {0, 0, 5, 5}, fc[2] = {0, 10};
    char name[32];
    memset(m, 0, sizeof *m);
    memset(&kaiming, 0, sizeof kaiming);
    memset(&one, 0, sizeof one);
    memset(&zero, 0, sizeof zero);
    kaiming.kind = AD_INIT_KAIMING_UNIFORM;
    one.kind = AD_INIT_CONSTANT;
    one.a = 1;
    m->P = P;
    m->cnn = 1;
    m->dropout = (ad_real)0.25;
    ad_rng_seed(&m->rng, seed ^ 0x5eedull);
    w1[0] = channels[0] = c1;
    w2[0] = channels[1] = c2;
    w2[1] = c1;
    fc[0] = c2 * 4 * 4;
    if (ad_params_add(P, "conv1.weight", 4, w1, &kaiming) < 0 || ad_params_add(P, "conv2.weight", 4, w2, &kaiming) < 0 ||
        ad_params_add(P, "fc.weight", 2, fc, &kaiming) < 0 || ad_params_add(P, "fc.bias", 1, fc + 1, &zero) < 0)
        return -1;
    for (k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "bn%d.weight", k + 1);
        if (ad_params_add(P, name, 1, &channels[k], &one) < 0) return -1;
        snprintf(name, sizeof name, "bn%d.bias", k + 1);
        if (ad_params_add(P, name, 1, &channels[k], &zero) < 0) return -1;
        snprintf(name, sizeof name, "bn%d.running_mean", k + 1);
        if (ad_params_add(P, name, 1, &channels[k], &zero) < 0 ||
            ad_params_set_trainable(P, ad_params_count(P) - 1, 0) != 0)
            return -1;
        snprintf(name, sizeof name, "bn%d.running_var", k + 1);
        if (ad_params_add(P, name, 1, &channels[k], &one) < 0 ||
            ad_params_set_trainable(P, ad_params_count(P) - 1, 0) != 0)
            return -1;
    }
    /* the store's buffers are final now: the running statistics can be pointed at */
    for (k = 0; k < 2; k++)
        if (model_attach_bn(m, k) != 0) return -1;
    return 0;
}

/* Recognises the model held in a store loaded from a checkpoint. Returns 0, or -1 when P holds
   neither network. */
static inline int model_attach(mnist_model *m, ad_params *P)
{
    char name[32];
    memset(m, 0, sizeof *m);
    m->P = P;
    if (model_param(m, "conv1.weight") >= 0) {
        m->cnn = 1;
        ad_params_set_trainable(P, model_param(m, "bn1.running_mean"), 0);
        ad_params_set_trainable(P, model_param(m, "bn1.running_var"), 0);
        ad_params_set_trainable(P, model_param(m, "bn2.running_mean"), 0);
        ad_params_set_trainable(P, model_param(m, "bn2.running_var"), 0);
        return model_attach_bn(m, 0) == 0 && model_attach_bn(m, 1) == 0 ? 0 : -1;
    }
    for (;;) {
        snprintf(name, sizeof name, "fc%d.weight", m->layers + 1);
        if (model_param(m, name) < 0) break;
        m->layers++;
    }
    return m->layers > 0 ? 0 : -1;
}

static inline void model_free(mnist_model *m)
{
    ad_batch_norm_free(&m->bn[0]);
    ad_batch_norm_free(&m->bn[1]);
}

static inline ad_tensor *mlp_forward(ad_tape *T, mnist_model *m, ad_tensor *x)
{
    ad_tensor *h = ad_flatten(T, x);
    char wname[32], bname[32];
    int i;
    for (i = 1; i <= m->layers; i++) {
        snprintf(wname, sizeof wname, "fc%d.weight", i);
        snprintf(bname, sizeof bname, "fc%d.bias", i);
        h = ad_linear(T, h, model_use(T, m, wname), model_use(T, m, bname));
        if (i < m->layers) h = ad_relu(T, h);
    }
    return h;
}

/* conv (no bias: batch norm follows) - batch norm - ReLU - 2x2 max pool */
static inline ad_tensor *cnn_block(ad_tape *T, mnist_model *m, ad_tensor *x, int k)
{
    char w[32], g[32], b[32];
    snprintf(w, sizeof w, "conv%d.weight", k + 1);
    snprintf(g, sizeof g, "bn%d.weight", k + 1);
    snprintf(b, sizeof b, "bn%d.bias", k + 1);
    x = ad_conv2d(T, x, model_use(T, m, w), NULL, NULL);
    x = ad_batch_norm(T, x, &m->bn[k], model_use(T, m, g), model_use(T, m, b));
    return ad_max_pool2d(T, ad_relu(T, x), 2, 2, NULL);
}

static inline ad_tensor *cnn_forward(ad_tape *T, mnist_model *m, ad_tensor *x)
{
    int shape[4];
    shape[0] = x ? x->shape[0] : 0;
    shape[1] = 1;
    shape[2] = shape[3] = MNIST_SIDE;
    x = cnn_block(T, m, ad_reshape(T, x, 4, shape), 0);
    x = ad_flatten(T, cnn_block(T, m, x, 1));
    x = ad_dropout(T, x, m->dropout, &m->rng);
    return ad_linear(T, x, model_use(T, m, "fc.weight"), model_use(T, m, "fc.bias"));
}

/* Logits [N, 10] for a batch of images x ([N, 784] or [N, 1, 28, 28]). Dropout and batch norm
   follow the tape's training mode. */
static inline ad_tensor *model_forward(ad_tape *T, mnist_model *m, ad_tensor *x)
{
    return m->cnn ? cnn_forward(T, m, x) : mlp_forward(T, m, x);
}

#endif
