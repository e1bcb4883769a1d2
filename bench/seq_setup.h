/* The sequence models that bench/gpt.c times and their optimizer, defined once for it and for
   bench/pair_work.c, so that both time the same step. Include after autodiff.h and
   examples/char_model.h. */
#ifndef BENCH_SEQ_SETUP_H
#define BENCH_SEQ_SETUP_H

/* The GPT (gpt nonzero: nanoGPT's shakespeare_char recipe for a CPU) or the LSTM model, over the
   65 characters from ' ' on, and its batch of *B sequences of *L tokens. */
static void bench_seq_config(int gpt, char_config *cfg, int *B, int *L)
{
    int i;
    memset(cfg, 0, sizeof *cfg);
    cfg->vocab = 65;
    cfg->ctx = 64;
    if (gpt) {
        cfg->kind = CHAR_GPT;
        cfg->layers = 4;
        cfg->heads = 4;
        cfg->embd = 128;
        *B = 12;
    } else {
        cfg->kind = CHAR_LSTM;
        cfg->layers = 2;
        cfg->heads = 1;
        cfg->embd = 256;
        *B = 32;
    }
    *L = 64;
    for (i = 0; i < cfg->vocab; i++) cfg->chars[i] = (unsigned char)(' ' + i);
}

/* AdamW: lr 1e-3, betas 0.9 and 0.99, weight decay 0.1 (on the matrices: the store's groups). */
static ad_optim_desc bench_seq_adamw(void)
{
    ad_optim_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_ADAMW;
    desc.lr = 1e-3;
    desc.beta1 = 0.9;
    desc.beta2 = 0.99;
    desc.weight_decay = 0.1;
    return desc;
}

#endif
