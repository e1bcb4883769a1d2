/* Character-level language models of examples/shakespeare.c: a GPT (nanoGPT's architecture)
   and LSTM or GRU stacks. A model is its parameters plus a small header (char_config) that
   travels in a checkpoint's extra bytes, so that a saved model can be rebuilt and sampled.

   GPT   wte [V, C] token embedding, wpe [ctx, C] position embedding; per block k:
         hK.ln1 [C], hK.attn [C, 3C], hK.attn_proj [C, C], hK.ln2 [C], hK.fc [C, 4C],
         hK.fc_proj [4C, C]; ln_f [C]. Pre-norm blocks x += attn(ln1(x)), x += mlp(ln2(x)) with
         causal multi-head self-attention and a GELU MLP, no biases, and logits = ln_f(x) wte^T
         (the output layer is the token embedding, as nanoGPT ties them). Weights are x W as
         ad_linear takes them ([in, out]).
   LSTM/ emb [V, C]; per layer k: rK.w_ih [G, in], rK.w_hh [G, C], rK.b_ih [G], rK.b_hh [G] with
   GRU   G = 4C (LSTM) or 3C (GRU), PyTorch's layout; head.weight [C, V], head.bias [V].

   Include after autodiff.h. */
#ifndef CHAR_MODEL_H
#define CHAR_MODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAR_MAX_LAYERS 16
#define CHAR_MAX_VOCAB 256

typedef enum char_kind { CHAR_GPT = 0, CHAR_LSTM = 1, CHAR_GRU = 2 } char_kind;

/* What defines a model: saved with it. */
typedef struct char_config {
    int kind;     /* char_kind */
    int vocab;    /* number of distinct characters */
    int ctx;      /* GPT: longest context (rows of wpe); RNN: steps of one truncated sequence */
    int layers, heads, embd;
    unsigned char chars[CHAR_MAX_VOCAB]; /* the vocabulary, sorted */
} char_config;

typedef struct char_block { int ln1, attn, attn_proj, ln2, fc, fc_proj; } char_block;
typedef struct char_rnn_layer { int w_ih, w_hh, b_ih, b_hh; } char_rnn_layer;

typedef struct char_model {
    char_config cfg;
    ad_params *P;
    int wte, wpe, ln_f;               /* GPT */
    char_block block[CHAR_MAX_LAYERS];
    int emb, head_w, head_b;          /* RNN */
    char_rnn_layer rnn[CHAR_MAX_LAYERS];
    ad_real *state;                   /* RNN: h (and c) of each layer for each row, carried */
    int state_rows;
    int *positions;                   /* GPT: 0, 1, ..., ctx - 1, the rows of wpe */
} char_model;

static const char *const char_kind_names[] = {"gpt", "lstm", "gru"};

/* ---- vocabulary ---- */

/* The sorted set of bytes in text into cfg->chars and cfg->vocab. */
static inline void char_vocab_from_text(char_config *cfg, const unsigned char *text, size_t n)
{
    int seen[CHAR_MAX_VOCAB] = {0}, c;
    size_t i;
    for (i = 0; i < n; i++) seen[text[i]] = 1;
    cfg->vocab = 0;
    for (c = 0; c < CHAR_MAX_VOCAB; c++)
        if (seen[c]) cfg->chars[cfg->vocab++] = (unsigned char)c;
}

/* text -> token ids by cfg's vocabulary (ids may be NULL: only the check). Returns the index
   of the first byte not in it, or -1. */
static inline long char_encode(const char_config *cfg, const unsigned char *text, size_t n, int *ids)
{
    int map[CHAR_MAX_VOCAB], c;
    size_t i;
    for (c = 0; c < CHAR_MAX_VOCAB; c++) map[c] = -1;
    for (c = 0; c < cfg->vocab; c++) map[cfg->chars[c]] = c;
    for (i = 0; i < n; i++) {
        if (map[text[i]] < 0) return (long)i;
        if (ids) ids[i] = map[text[i]];
    }
    return -1;
}

/* ---- the configuration in a checkpoint's extra bytes: "CHARLM1\0", 6 x u32 LE, vocab bytes ---- */

static inline size_t char_config_bytes(const char_config *cfg) { return 8 + 6 * 4 + (size_t)cfg->vocab; }

static inline void char_config_pack(const char_config *cfg, unsigned char *p)
{
    uint32_t v[6];
    int i, j;
    v[0] = (uint32_t)cfg->kind;
    v[1] = (uint32_t)cfg->vocab;
    v[2] = (uint32_t)cfg->ctx;
    v[3] = (uint32_t)cfg->layers;
    v[4] = (uint32_t)cfg->heads;
    v[5] = (uint32_t)cfg->embd;
    memcpy(p, "CHARLM1", 8);
    for (i = 0; i < 6; i++)
        for (j = 0; j < 4; j++) p[8 + 4 * i + j] = (unsigned char)(v[i] >> (8 * j));
    memcpy(p + 32, cfg->chars, (size_t)cfg->vocab);
}

/* Reads a configuration from the start of len bytes. Returns the bytes it takes, or -1 when
   they do not start with a configuration this program wrote. */
static inline long char_config_unpack(char_config *cfg, const unsigned char *p, size_t len)
{
    uint32_t v[6];
    int i, j;
    if (len < 32 || memcmp(p, "CHARLM1", 8) != 0) return -1;
    for (i = 0; i < 6; i++) {
        v[i] = 0;
        for (j = 3; j >= 0; j--) v[i] = v[i] << 8 | p[8 + 4 * i + j];
    }
    if (v[0] > CHAR_GRU || v[1] < 1 || v[1] > CHAR_MAX_VOCAB || len < 32 + v[1] || v[2] < 1 || v[3] < 1 ||
        v[3] > CHAR_MAX_LAYERS || v[4] < 1 || v[5] < 1 || v[5] % v[4] != 0)
        return -1;
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = (int)v[0];
    cfg->vocab = (int)v[1];
    cfg->ctx = (int)v[2];
    cfg->layers = (int)v[3];
    cfg->heads = (int)v[4];
    cfg->embd = (int)v[5];
    memcpy(cfg->chars, p + 32, (size_t)cfg->vocab);
    return 32 + (long)cfg->vocab;
}

/* ---- building ---- */

static inline int char_add(ad_params *P, const char *name, int rows, int cols, const ad_init *init, int decayed)
{
    int shape[2], id;
    shape[0] = rows;
    shape[1] = cols;
    id = ad_params_add(P, name, cols ? 2 : 1, shape, init);
    if (id >= 0 && !decayed) ad_params_set_group(P, id, 1, 0);
    return id;
}

/* nanoGPT's initialisation: every weight normal with std 0.02, the projections that end a
   residual branch (attn_proj, fc_proj) with 0.02 / sqrt(2 layers), layer norm weights 1.
   As nanoGPT's optimizer groups, matrices are decayed and vectors are not. */
static inline int char_build_gpt(char_model *m)
{
    const char_config *c = &m->cfg;
    ad_init normal, residual, one;
    char name[AD_PARAM_NAME_MAX + 1];
    int k, C = c->embd, ok = 1;
    memset(&normal, 0, sizeof normal);
    normal.kind = AD_INIT_NORMAL;
    normal.b = 0.02;
    residual = normal;
    residual.b = 0.02 / sqrt(2.0 * c->layers);
    memset(&one, 0, sizeof one);
    one.kind = AD_INIT_CONSTANT;
    one.a = 1;
    m->wte = char_add(m->P, "wte", c->vocab, C, &normal, 1);
    m->wpe = char_add(m->P, "wpe", c->ctx, C, &normal, 1);
    ok = m->wte >= 0 && m->wpe >= 0;
    for (k = 0; ok && k < c->layers; k++) {
        char_block *b = &m->block[k];
#define CHAR_PARAM(field, suffix, rows, cols, init, decayed)                                         \
    snprintf(name, sizeof name, "h%d." suffix, k);                                                  \
    b->field = char_add(m->P, name, rows, cols, init, decayed);                                     \
    ok = ok && b->field >= 0;
        CHAR_PARAM(ln1, "ln1", C, 0, &one, 0)
        CHAR_PARAM(attn, "attn", C, 3 * C, &normal, 1)
        CHAR_PARAM(attn_proj, "attn_proj", C, C, &residual, 1)
        CHAR_PARAM(ln2, "ln2", C, 0, &one, 0)
        CHAR_PARAM(fc, "fc", C, 4 * C, &normal, 1)
        CHAR_PARAM(fc_proj, "fc_proj", 4 * C, C, &residual, 1)
#undef CHAR_PARAM
    }
    m->ln_f = ok ? char_add(m->P, "ln_f", C, 0, &one, 0) : -1;
    return m->ln_f >= 0 ? 0 : -1;
}

/* PyTorch's initialisation of nn.LSTM / nn.GRU (every weight and bias uniform in +-1/sqrt(C)),
   nn.Embedding (normal) and nn.Linear for the head (uniform in +-1/sqrt(C)). */
static inline int char_build_rnn(char_model *m)
{
    const char_config *c = &m->cfg;
    ad_init normal, uniform;
    char name[AD_PARAM_NAME_MAX + 1];
    int k, C = c->embd, G = (c->kind == CHAR_LSTM ? 4 : 3) * C, ok;
    memset(&normal, 0, sizeof normal);
    normal.kind = AD_INIT_NORMAL;
    memset(&uniform, 0, sizeof uniform);
    uniform.kind = AD_INIT_UNIFORM;
    uniform.a = -1 / sqrt((double)C);
    uniform.b = -uniform.a;
    m->emb = char_add(m->P, "emb", c->vocab, C, &normal, 1);
    ok = m->emb >= 0;
    for (k = 0; ok && k < c->layers; k++) {
        char_rnn_layer *r = &m->rnn[k];
#define CHAR_PARAM(field, suffix, rows, cols, decayed)                                               \
    snprintf(name, sizeof name, "r%d." suffix, k);                                                  \
    r->field = char_add(m->P, name, rows, cols, &uniform, decayed);                                 \
    ok = ok && r->field >= 0;
        CHAR_PARAM(w_ih, "w_ih", G, C, 1)
        CHAR_PARAM(w_hh, "w_hh", G, C, 1)
        CHAR_PARAM(b_ih, "b_ih", G, 0, 0)
        CHAR_PARAM(b_hh, "b_hh", G, 0, 0)
#undef CHAR_PARAM
    }
    m->head_w = ok ? char_add(m->P, "head.weight", C, c->vocab, &uniform, 1) : -1;
    m->head_b = m->head_w >= 0 ? char_add(m->P, "head.bias", c->vocab, 0, &uniform, 0) : -1;
    return m->head_b >= 0 ? 0 : -1;
}

/* A new model of configuration cfg in the empty store P (or, when P already holds a model of
   this configuration, as from ad_params_load, one that uses it). Returns 0, or -1 with P's
   error set. */
static inline int char_model_init(char_model *m, const char_config *cfg, ad_params *P)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->P = P;
    if (cfg->layers < 1 || cfg->layers > CHAR_MAX_LAYERS || cfg->embd % cfg->heads != 0) return -1;
    if (cfg->kind == CHAR_GPT) {
        int k;
        m->positions = (int *)malloc((size_t)cfg->ctx * sizeof(int));
        if (!m->positions) return -1;
        for (k = 0; k < cfg->ctx; k++) m->positions[k] = k;
    }
    if (ad_params_count(P) == 0) return cfg->kind == CHAR_GPT ? char_build_gpt(m) : char_build_rnn(m);
    {
        /* Rebuild the handles from a loaded store: build into a scratch store of the same
           layout, then check that every name and size agrees, in order. */
        ad_params *shape_of = ad_params_new(0);
        char_model scratch;
        int id, n, rc = shape_of ? 0 : -1;
        memset(&scratch, 0, sizeof scratch);
        if (rc == 0) rc = char_model_init(&scratch, cfg, shape_of);
        n = rc == 0 ? ad_params_count(shape_of) : 0;
        if (rc == 0 && n != ad_params_count(P)) rc = -1;
        for (id = 0; rc == 0 && id < n; id++) {
            ad_param_info want = ad_params_info(shape_of, id), have = ad_params_info(P, id);
            if (strcmp(want.name, have.name) != 0 || want.size != have.size) rc = -1;
        }
        free(m->positions);
        m->positions = NULL;
        if (rc == 0) {
            scratch.P = P;
            *m = scratch;
        } else free(scratch.positions);
        ad_params_free(shape_of);
        return rc;
    }
}

/* Frees a recurrent model's carried state (the next forward starts from zeros). */
static inline void char_state_free(char_model *m)
{
    free(m->state);
    m->state = NULL;
    m->state_rows = 0;
}

static inline void char_model_free(char_model *m)
{
    char_state_free(m);
    free(m->positions);
    m->positions = NULL;
}

/* ---- the GPT ---- */

static inline ad_tensor *char_use(ad_tape *T, const char_model *m, int id) { return ad_param(T, m->P, id); }

/* Causal self-attention of x [B*L, C]: qkv = x W_attn [B, L, 3C], attention over H heads of
   C / H read where they lie in qkv (ad_self_attention), the heads' outputs side by side
   [B*L, C], projected. */
static inline ad_tensor *char_attention(ad_tape *T, const char_model *m, const char_block *b, ad_tensor *x, int B,
                                        int L)
{
    int C = m->cfg.embd, rows[3], flat[2];
    ad_tensor *y;
    rows[0] = B, rows[1] = L, rows[2] = 3 * C;
    flat[0] = B * L, flat[1] = C;
    y = ad_self_attention(T, ad_reshape(T, ad_matmul(T, x, char_use(T, m, b->attn)), 3, rows), m->cfg.heads, 1, 0);
    return ad_matmul(T, ad_reshape(T, y, 2, flat), char_use(T, m, b->attn_proj));
}

/* Logits [B*L, V] for ids [B, L] (row-major), L <= ctx. */
static inline ad_tensor *char_gpt_forward(ad_tape *T, const char_model *m, const int *ids, int B, int L)
{
    int C = m->cfg.embd, k, shape[3];
    ad_tensor *x, *h;
    shape[0] = B, shape[1] = L, shape[2] = C;
    x = ad_reshape(T, ad_embedding(T, char_use(T, m, m->wte), ids, B * L), 3, shape);
    x = ad_add(T, x, ad_embedding(T, char_use(T, m, m->wpe), m->positions, L));
    shape[0] = B * L, shape[1] = C;
    x = ad_reshape(T, x, 2, shape);
    for (k = 0; k < m->cfg.layers; k++) {
        const char_block *b = &m->block[k];
        h = ad_layer_norm(T, x, 1, char_use(T, m, b->ln1), NULL, (ad_real)1e-5);
        x = ad_add(T, x, char_attention(T, m, b, h, B, L));
        h = ad_layer_norm(T, x, 1, char_use(T, m, b->ln2), NULL, (ad_real)1e-5);
        h = ad_gelu(T, ad_matmul(T, h, char_use(T, m, b->fc)));
        x = ad_add(T, x, ad_matmul(T, h, char_use(T, m, b->fc_proj)));
    }
    x = ad_layer_norm(T, x, 1, char_use(T, m, m->ln_f), NULL, (ad_real)1e-5);
    return ad_matmul_t(T, x, char_use(T, m, m->wte), 0, 1);
}

/* ---- the recurrent models ---- */

/* Floats of carried state per row: h, and for an LSTM c, of each layer. */
static inline size_t char_state_per_row(const char_model *m)
{
    return (size_t)m->cfg.layers * (m->cfg.kind == CHAR_LSTM ? 2 : 1) * (size_t)m->cfg.embd;
}

/* Sets the carried state of `rows` rows to zero (allocating it). Returns 0, or -1. */
static inline int char_state_reset(char_model *m, int rows)
{
    size_t n = (size_t)rows * char_state_per_row(m);
    if (rows != m->state_rows) {
        free(m->state);
        m->state = (ad_real *)malloc(n * sizeof(ad_real));
        m->state_rows = m->state ? rows : 0;
        if (!m->state) return -1;
    }
    memset(m->state, 0, n * sizeof(ad_real));
    return 0;
}

/* Logits [B*L, V] for ids [B, L], starting from the carried state and leaving the state after
   the last step in it. The state enters as a constant: gradients stop at the sequence's start
   (truncated backpropagation through time). Each layer runs over the whole sequence (ad_lstm or
   ad_gru, time-major: [L, B, C]). */
static inline ad_tensor *char_rnn_forward(ad_tape *T, char_model *m, const int *ids, int B, int L)
{
    int C = m->cfg.embd, lstm = m->cfg.kind == CHAR_LSTM, layers = m->cfg.layers, k, t, b, shape[3];
    ad_tensor *h[CHAR_MAX_LAYERS], *c[CHAR_MAX_LAYERS], *y;
    int *column = (int *)malloc((size_t)B * L * sizeof(int)); /* ids in time-major order */
    size_t plane = (size_t)B * C;
    if (!column || (m->state_rows != B && char_state_reset(m, B) != 0)) {
        free(column);
        return NULL;
    }
    for (t = 0; t < L; t++)
        for (b = 0; b < B; b++) column[(size_t)t * B + b] = ids[(size_t)b * L + t];
    shape[0] = L, shape[1] = B, shape[2] = C;
    y = ad_reshape(T, ad_embedding(T, char_use(T, m, m->emb), column, L * B), 3, shape);
    free(column);
    for (k = 0; k < layers; k++) {
        ad_tensor *w_ih = char_use(T, m, m->rnn[k].w_ih), *w_hh = char_use(T, m, m->rnn[k].w_hh);
        ad_tensor *b_ih = char_use(T, m, m->rnn[k].b_ih), *b_hh = char_use(T, m, m->rnn[k].b_hh);
        shape[0] = B, shape[1] = C;
        h[k] = ad_tensor_new(T, 2, shape, m->state + (size_t)k * (lstm ? 2 : 1) * plane, 0);
        c[k] = lstm ? ad_tensor_new(T, 2, shape, m->state + (2 * (size_t)k + 1) * plane, 0) : NULL;
        if (lstm) y = ad_lstm(T, y, h[k], c[k], w_ih, w_hh, b_ih, b_hh, &h[k], &c[k]);
        else y = ad_gru(T, y, h[k], w_ih, w_hh, b_ih, b_hh, &h[k]);
    }
    for (k = 0; k < layers && y && h[k] && (!lstm || c[k]); k++) {
        memcpy(m->state + (size_t)k * (lstm ? 2 : 1) * plane, h[k]->data, plane * sizeof(ad_real));
        if (lstm) memcpy(m->state + (2 * (size_t)k + 1) * plane, c[k]->data, plane * sizeof(ad_real));
    }
    shape[0] = B * L, shape[1] = C;
    return ad_linear(T, ad_reshape(T, ad_transpose(T, y, 0, 1), 2, shape), char_use(T, m, m->head_w),
                     char_use(T, m, m->head_b));
}

/* Logits [B*L, V] for ids [B, L]. */
static inline ad_tensor *char_forward(ad_tape *T, char_model *m, const int *ids, int B, int L)
{
    return m->cfg.kind == CHAR_GPT ? char_gpt_forward(T, m, ids, B, L) : char_rnn_forward(T, m, ids, B, L);
}

#endif
