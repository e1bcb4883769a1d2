/* The training program behind examples/shakespeare.c and examples/shakespeare_mpi.c: options,
   text, model, training with progress display and loss estimates, checkpoint with the run,
   SVG plot and sampling. shakespeare_run is the whole program; a group of processes
   (training_util.h) shares a GPT's run out, each process training on its share of every batch.
   Include after autodiff.h. */
#ifndef SHAKESPEARE_TRAIN_H
#define SHAKESPEARE_TRAIN_H

#include "char_model.h"
#include "training_util.h"

enum { GIVEN_BATCH = 1, GIVEN_LAYERS = 2, GIVEN_EMBD = 4, GIVEN_LR = 8, GIVEN_MIN_LR = 16, GIVEN_STOP = 32,
       GIVEN_START = 64 };

typedef struct options {
    const char *data, *checkpoint, *plot, *sample_only, *start, *resume;
    const char *defining; /* the last option given that defines the run (refused with --resume) */
    int model, iters, batch, ctx, layers, heads, embd, warmup, eval_interval, eval_batches, final_batches;
    int threads, sample_chars, limit, quiet, stop_after, checkpoint_given;
    int given; /* GIVEN_*: options whose defaults depend on the model, or that have no default */
    double lr, min_lr, beta1, beta2, weight_decay, clip, temperature;
    unsigned long long seed;
} options;

static void usage(const char *argv0)
{
    printf("usage: %s [options]\n"
           "  --data PATH          the text, or the folder with input.txt (default data/tinyshakespeare)\n"
           "  --model NAME         gpt, lstm or gru (default gpt)\n"
           "  --iters N            optimizer steps (default 2000)\n"
           "  --batch N            sequences per step (default 12 for gpt, 32 for lstm and gru)\n"
           "  --context N          characters per sequence (default 64)\n"
           "  --layers N           blocks or recurrent layers (default 4 for gpt, 2 otherwise)\n"
           "  --heads N            attention heads (gpt; default 4)\n"
           "  --embd N             embedding width, the hidden size of a recurrent model (default 128\n"
           "                       for gpt, 256 otherwise)\n"
           "  --lr X               peak learning rate (default 1e-3 for gpt, 2e-3 otherwise)\n"
           "  --min-lr X           learning rate at the end of the cosine decay (default lr / 10)\n"
           "  --warmup N           steps of linear warm-up (default 100)\n"
           "  --beta1 X, --beta2 X AdamW's betas (default 0.9, 0.99)\n"
           "  --weight-decay X     AdamW's weight decay of the matrices (default 0.1)\n"
           "  --clip X             largest gradient norm, 0 for none (default 1.0)\n"
           "  --eval-interval N    steps between loss estimates (default 250)\n"
           "  --eval-batches N     batches of each split per estimate (default 20)\n"
           "  --final-batches N    batches of each split for the final estimate (default 200)\n"
           "  --limit N            use the first N characters of the text only\n"
           "  --seed N             seed of initialisation, batches and sampling (default 1)\n"
           "  --threads N          threads (default: all cores, or AUTODIFF_THREADS)\n"
           "  --checkpoint PATH    where to save the model and the run, at every loss estimate and at\n"
           "                       the end (default shakespeare.ckpt; with --resume, the file resumed)\n"
           "  --resume PATH        continue the run saved in PATH where it stopped, with its options\n"
           "  --stop-after N       stop after step N (saving the run), as an interrupted run would\n"
           "  --plot PATH          where to write the SVG plot of the losses (default shakespeare.svg)\n"
           "  --sample-chars N     characters to sample at the end (default 500)\n"
           "  --temperature X      sampling temperature (default 1.0)\n"
           "  --start TEXT         the text the sample continues (default a newline, or the text's\n"
           "                       first character when it has none)\n"
           "  --sample-only CKPT   print a sample of the model saved in CKPT and stop\n"
           "  --quiet              no progress bar\n"
           "  --help               this text\n",
           argv0);
}

/* Fills o from the command line. Returns 0, 1 after --help, or -1 after a bad option. Messages
   and the help text are printed only when speak is 1 (on one process of a group). */
static int parse_options(int argc, char **argv, options *o, int speak)
{
    int i;
    memset(o, 0, sizeof *o);
    o->data = "data/tinyshakespeare";
    o->checkpoint = "shakespeare.ckpt";
    o->plot = "shakespeare.svg";
    o->start = "\n";
    o->model = CHAR_GPT;
    o->iters = 2000;
    o->ctx = 64;
    o->heads = 4;
    o->warmup = 100;
    o->eval_interval = 250;
    o->eval_batches = 20;
    o->final_batches = 200;
    o->sample_chars = 500;
    o->beta1 = 0.9;
    o->beta2 = 0.99;
    o->weight_decay = 0.1;
    o->clip = 1.0;
    o->temperature = 1.0;
    o->seed = 1;
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            if (speak) usage(argv[0]);
            return 1;
        }
        if (!strcmp(arg, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!val) {
            if (speak) fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], arg);
            return -1;
        }
        i++;
        if (strcmp(arg, "--data") && strcmp(arg, "--threads") && strcmp(arg, "--checkpoint") && strcmp(arg, "--plot") &&
            strcmp(arg, "--sample-chars") && strcmp(arg, "--temperature") && strcmp(arg, "--start") &&
            strcmp(arg, "--sample-only") && strcmp(arg, "--resume") && strcmp(arg, "--stop-after"))
            o->defining = arg;
        if (!strcmp(arg, "--data")) o->data = val;
        else if (!strcmp(arg, "--model")) {
            for (o->model = 0; o->model < 3 && strcmp(val, char_kind_names[o->model]); o->model++) continue;
            if (o->model == 3) {
                if (speak) fprintf(stderr, "%s: --model is gpt, lstm or gru\n", argv[0]);
                return -1;
            }
        } else if (!strcmp(arg, "--iters")) o->iters = atoi(val);
        else if (!strcmp(arg, "--batch")) o->batch = atoi(val), o->given |= GIVEN_BATCH;
        else if (!strcmp(arg, "--context")) o->ctx = atoi(val);
        else if (!strcmp(arg, "--layers")) o->layers = atoi(val), o->given |= GIVEN_LAYERS;
        else if (!strcmp(arg, "--heads")) o->heads = atoi(val);
        else if (!strcmp(arg, "--embd")) o->embd = atoi(val), o->given |= GIVEN_EMBD;
        else if (!strcmp(arg, "--lr")) o->lr = atof(val), o->given |= GIVEN_LR;
        else if (!strcmp(arg, "--min-lr")) o->min_lr = atof(val), o->given |= GIVEN_MIN_LR;
        else if (!strcmp(arg, "--warmup")) o->warmup = atoi(val);
        else if (!strcmp(arg, "--beta1")) o->beta1 = atof(val);
        else if (!strcmp(arg, "--beta2")) o->beta2 = atof(val);
        else if (!strcmp(arg, "--weight-decay")) o->weight_decay = atof(val);
        else if (!strcmp(arg, "--clip")) o->clip = atof(val);
        else if (!strcmp(arg, "--eval-interval")) o->eval_interval = atoi(val);
        else if (!strcmp(arg, "--eval-batches")) o->eval_batches = atoi(val);
        else if (!strcmp(arg, "--final-batches")) o->final_batches = atoi(val);
        else if (!strcmp(arg, "--limit")) o->limit = atoi(val);
        else if (!strcmp(arg, "--seed")) o->seed = strtoull(val, NULL, 10);
        else if (!strcmp(arg, "--threads")) o->threads = atoi(val);
        else if (!strcmp(arg, "--checkpoint")) o->checkpoint = val, o->checkpoint_given = 1;
        else if (!strcmp(arg, "--plot")) o->plot = val;
        else if (!strcmp(arg, "--sample-chars")) o->sample_chars = atoi(val);
        else if (!strcmp(arg, "--temperature")) o->temperature = atof(val);
        else if (!strcmp(arg, "--start")) o->start = val, o->given |= GIVEN_START;
        else if (!strcmp(arg, "--sample-only")) o->sample_only = val;
        else if (!strcmp(arg, "--resume")) o->resume = val;
        else if (!strcmp(arg, "--stop-after")) o->stop_after = atoi(val), o->given |= GIVEN_STOP;
        else {
            if (speak) fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], arg);
            return -1;
        }
    }
    if (o->resume && o->defining) {
        if (speak)
            fprintf(stderr, "%s: --resume continues the saved run with its own options; leave out %s\n", argv[0],
                    o->defining);
        return -1;
    }
    if (o->resume && !o->checkpoint_given) o->checkpoint = o->resume;
    if (!(o->given & GIVEN_BATCH)) o->batch = o->model == CHAR_GPT ? 12 : 32;
    if (!(o->given & GIVEN_LAYERS)) o->layers = o->model == CHAR_GPT ? 4 : 2;
    if (!(o->given & GIVEN_EMBD)) o->embd = o->model == CHAR_GPT ? 128 : 256;
    if (!(o->given & GIVEN_LR)) o->lr = o->model == CHAR_GPT ? 1e-3 : 2e-3;
    if (!(o->given & GIVEN_MIN_LR)) o->min_lr = o->lr / 10;
    if (o->iters < 1 || o->batch < 1 || o->ctx < 1 || o->layers < 1 || o->layers > CHAR_MAX_LAYERS ||
        o->heads < 1 || o->embd < 1 || (o->model == CHAR_GPT && o->embd % o->heads != 0) || o->warmup < 0 ||
        o->eval_interval < 1 || o->eval_batches < 1 || o->final_batches < 1 || o->threads < 0 || o->limit < 0 ||
        o->sample_chars < 0 || ((o->given & GIVEN_STOP) && o->stop_after < 1) || !(o->lr > 0) ||
        !(o->min_lr >= 0) || !(o->temperature > 0) || !(o->clip >= 0) || !(o->beta1 >= 0) || o->beta1 >= 1 ||
        !(o->beta2 >= 0) || o->beta2 >= 1 || !(o->weight_decay >= 0)) {
        if (speak)
            fprintf(stderr, "%s: an option is out of range: counts must be positive, layers at most %d, the GPT's "
                            "embd a multiple of heads, lr and temperature positive, betas in [0, 1) (see --help)\n",
                    argv[0], CHAR_MAX_LAYERS);
        return -1;
    }
    return 0;
}

/* ---- the text ---- */

/* Reads the file at path (or path/input.txt when path is a folder) into *text. Returns its
   length, or -1 with why filled in. */
static long read_text(const char *path, unsigned char **text, char *why, size_t cap)
{
    char name[4096];
    FILE *f = NULL;
    long n = -1;
    size_t len = strlen(path);
    if (len + 12 < sizeof name) {
        snprintf(name, sizeof name, "%s%sinput.txt", path, len && path[len - 1] == '/' ? "" : "/");
        f = fopen(name, "rb");
    }
    if (!f) f = fopen(path, "rb");
    /* a folder opens on some systems, but does not read */
    if (f && getc(f) == EOF && ferror(f)) {
        fclose(f);
        f = NULL;
    }
    if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(why, cap, "cannot read %s (nor %s/input.txt)\n(make shakespeare finds or downloads Tiny Shakespeare; "
                           "or pass --data with a text file or its folder)", path, path);
        if (f) fclose(f);
        return -1;
    }
    *text = (unsigned char *)malloc((size_t)n + 1);
    if (!*text || fread(*text, 1, (size_t)n, f) != (size_t)n) {
        snprintf(why, cap, "cannot read %s: %s", path, *text ? "short read" : "out of memory");
        fclose(f);
        return -1;
    }
    fclose(f);
    return n;
}

/* A split of the encoded text. */
typedef struct split {
    const int *ids;
    long n;
} split;

/* ---- batches ---- */

/* GPT: B windows of L + 1 characters at random places of s, as nanoGPT's get_batch: inputs
   x[b][t] and targets y[b][t] = the next character. */
static void random_batch(const split *s, int B, int L, ad_rng *rng, int *x, int *y)
{
    int b;
    for (b = 0; b < B; b++) {
        long at = (long)ad_rng_below(rng, (uint64_t)(s->n - L));
        memcpy(x + (size_t)b * L, s->ids + at, (size_t)L * sizeof(int));
        memcpy(y + (size_t)b * L, s->ids + at + 1, (size_t)L * sizeof(int));
    }
}

/* Recurrent models: row b reads the b-th of B equal stretches of s, L characters per step;
   when a stretch is used up every row starts again at the beginning of its own, with a zero
   state. */
typedef struct streams {
    long len, pos; /* stretch length; characters of each stretch read so far */
} streams;

/* Returns 1 when the rows started again (the caller zeroes the state). */
static int stream_batch(const split *s, streams *st, int B, int L, int *x, int *y)
{
    int b, restarted = 0;
    if (st->pos + L + 1 > st->len) {
        st->pos = 0;
        restarted = 1;
    }
    for (b = 0; b < B; b++) {
        const int *from = s->ids + (size_t)b * st->len + st->pos;
        memcpy(x + (size_t)b * L, from, (size_t)L * sizeof(int));
        memcpy(y + (size_t)b * L, from + 1, (size_t)L * sizeof(int));
    }
    st->pos += L;
    return restarted;
}

/* ---- loss estimates ---- */

/* Mean loss over `batches` random batches of s, without gradients. A recurrent model starts
   each batch from a zero state (its training state is set aside meanwhile). The batches come
   from rng, which only estimates draw from, so that estimates do not change training. In a
   group every process draws the same batches and measures its share of each one's rows.
   Returns the loss, or -1 with why filled in. */
static double estimate_loss(ad_tape *T, char_model *m, const split *s, int batches, int B, int L, ad_rng *rng,
                            int *x, int *y, const train_group *g, char *why, size_t cap)
{
    double total = 0;
    ad_real *training_state = m->state;
    int training_rows = m->state_rows, i, was = ad_set_grad_enabled(T, 0), lo = 0, hi = B;
    double share = g ? g->share(g->ctx, B, &lo, &hi) : 1;
    m->state = NULL;
    m->state_rows = 0;
    for (i = 0; i < batches; i++) {
        ad_tensor *loss;
        random_batch(s, B, L, rng, x, y);
        if (hi == lo) continue; /* a process whose share is empty */
        if (m->cfg.kind != CHAR_GPT && char_state_reset(m, hi - lo) != 0) break;
        loss = ad_cross_entropy(T, char_forward(T, m, x + (size_t)lo * L, hi - lo, L), y + (size_t)lo * L);
        if (!loss) break;
        total += share * ad_item(loss);
        ad_tape_reset(T);
    }
    ad_set_grad_enabled(T, was);
    char_state_free(m);
    m->state = training_state;
    m->state_rows = training_rows;
    if (i < batches) {
        snprintf(why, cap, "\nloss estimate failed: %s", tape_error(T));
        ad_tape_reset(T);
        return -1;
    }
    if (g) g->sum(g->ctx, &total, 1);
    return total / batches;
}

/* ---- sampling ---- */

/* Index drawn from softmax(logits / temperature), computed in double. */
static int sample_index(const ad_real *logits, int V, double temperature, ad_rng *rng)
{
    double p[CHAR_MAX_VOCAB], top = -HUGE_VAL, sum = 0, u;
    int i;
    for (i = 0; i < V; i++)
        if (logits[i] > top) top = logits[i];
    for (i = 0; i < V; i++) sum += p[i] = exp(((double)logits[i] - top) / temperature);
    u = ad_rng_uniform(rng) * sum;
    for (i = 0; i < V - 1; i++) {
        u -= p[i];
        if (u < 0) break;
    }
    return i;
}

/* Prints `start` and n characters that the model continues it with. Returns 0, or -1 with a
   message. */
static int sample(ad_tape *T, char_model *m, const char *start, int n, double temperature, ad_rng *rng)
{
    const char_config *c = &m->cfg;
    int len = (int)strlen(start), keep = c->kind == CHAR_GPT ? c->ctx : 1, *ids, count, i, was;
    ad_real *saved_state = m->state;
    int saved_rows = m->state_rows, rc = 0;
    ids = (int *)malloc(((size_t)len + (size_t)n + 1) * sizeof(int));
    if (!ids) return -1;
    if (len == 0 || char_encode(c, (const unsigned char *)start, (size_t)len, ids) >= 0) {
        fprintf(stderr, "the start text must be characters of the vocabulary\n");
        free(ids);
        return -1;
    }
    fputs(start, stdout);
    was = ad_set_grad_enabled(T, 0);
    m->state = NULL;
    m->state_rows = 0;
    if (c->kind != CHAR_GPT && char_state_reset(m, 1) != 0) rc = -1;
    /* A recurrent model reads the start text once; then one character per step. The GPT reads
       the last ctx characters each time. */
    if (rc == 0 && c->kind != CHAR_GPT && len > 1) {
        rc = char_forward(T, m, ids, 1, len - 1) ? 0 : -1;
        ad_tape_reset(T);
    }
    for (count = len, i = 0; rc == 0 && i < n; i++, count++) {
        int from = c->kind == CHAR_GPT ? (count > keep ? count - keep : 0) : count - 1;
        ad_tensor *logits = char_forward(T, m, ids + from, 1, count - from);
        if (!logits) {
            rc = -1;
            break;
        }
        ids[count] = sample_index(logits->data + (size_t)(count - from - 1) * c->vocab, c->vocab, temperature, rng);
        putchar(c->chars[ids[count]]);
        ad_tape_reset(T);
    }
    putchar('\n');
    if (rc != 0) fprintf(stderr, "sampling failed: %s\n", tape_error(T));
    ad_set_grad_enabled(T, was);
    char_state_free(m);
    m->state = saved_state;
    m->state_rows = saved_rows;
    free(ids);
    return rc;
}

/* ---- the plot ---- */

typedef struct history {
    double *step_loss; /* per step */
    int steps;
    double *eval_step, *eval_train, *eval_val;
    int evals;
} history;

static void svg_polyline(FILE *f, const double *xs, const double *ys, int n, double xmax, double lo, double hi,
                         const char *color, double width)
{
    const int x0 = 60, y0 = 30, w = 640, h = 300;
    int i;
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='%.1f' points='", color, width);
    for (i = 0; i < n; i++) {
        double y = ys[i] < lo ? lo : ys[i] > hi ? hi : ys[i];
        fprintf(f, "%.1f,%.1f ", x0 + w * (xs ? xs[i] : i + 1) / xmax, y0 + h - h * (y - lo) / (hi - lo));
    }
    fprintf(f, "'/>\n");
}

/* Training loss per step (light), and the estimates of train and validation loss. */
static int write_plot(const char *path, const history *hist, int iters)
{
    const int x0 = 60, y0 = 30, w = 640, h = 300;
    double lo = 1e9, hi = 0;
    FILE *f = fopen(path, "w");
    int i;
    if (!f) return -1;
    for (i = 0; i < hist->evals; i++) {
        if (hist->eval_val[i] > hi) hi = hist->eval_val[i];
        if (hist->eval_train[i] > hi) hi = hist->eval_train[i];
        if (hist->eval_train[i] < lo) lo = hist->eval_train[i];
    }
    for (i = 0; i < hist->steps; i++)
        if (hist->step_loss[i] < lo) lo = hist->step_loss[i];
    lo = floor(lo * 2) / 2;
    hi = ceil(hi * 2) / 2;
    if (hi <= lo) hi = lo + 1;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='740' height='390' font-family='sans-serif'>\n"
               "<rect width='100%%' height='100%%' fill='white'/>\n"
               "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#888'/>\n", x0, y0, w, h);
    for (i = 0; i <= 4; i++) {
        int y = y0 + h - h * i / 4;
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#ddd'/>\n", x0, y, x0 + w, y);
        fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='end'>%.2f</text>\n", x0 - 4, y + 4,
                lo + (hi - lo) * i / 4);
        fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='middle'>%d</text>\n", x0 + w * i / 4,
                y0 + h + 15, iters * i / 4);
    }
    fprintf(f, "<text x='%d' y='%d' font-size='12' text-anchor='middle'>step</text>\n", x0 + w / 2, y0 + h + 32);
    fprintf(f, "<text x='%d' y='18' font-size='14' text-anchor='middle'>cross-entropy loss (nats per character)</text>\n",
            x0 + w / 2);
    svg_polyline(f, NULL, hist->step_loss, hist->steps, iters, lo, hi, "#aec7e8", 1);
    svg_polyline(f, hist->eval_step, hist->eval_train, hist->evals, iters, lo, hi, "#1f77b4", 2);
    svg_polyline(f, hist->eval_step, hist->eval_val, hist->evals, iters, lo, hi, "#d62728", 2);
    fprintf(f, "<text x='%d' y='382' font-size='12' text-anchor='middle'><tspan fill='#aec7e8'>&#9632; batch</tspan>  "
               "<tspan fill='#1f77b4'>&#9632; train</tspan>  <tspan fill='#d62728'>&#9632; validation</tspan></text>\n"
               "</svg>\n", x0 + w / 2);
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- progress ---- */

/* A bar redrawn in place on a terminal, otherwise a plain line every ten seconds. */
static void progress(int step, int iters, double loss, double lr, double tokens_per_s, double eta, int final)
{
    static double last_line;
    double now = seconds();
    if (STDERR_IS_TERMINAL()) {
        char bar[31];
        int filled = (int)(30.0 * step / iters), i;
        for (i = 0; i < 30; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
        bar[30] = 0;
        fprintf(stderr, "\rstep %d/%d [%s] loss %.4f lr %.2e %6.0f tokens/s ETA %4.0fs%s", step, iters, bar, loss,
                lr, tokens_per_s, eta, final ? "\n" : "");
    } else if (!final && now - last_line >= 10) {
        last_line = now;
        fprintf(stderr, "step %d/%d loss %.4f lr %.2e %.0f tokens/s ETA %.0fs\n", step, iters, loss, lr,
                tokens_per_s, eta);
    }
}

/* ---- checkpoint: the model's configuration, then the run, in the store's extra bytes ----
   The run: "CHARRUN1"; u32: batch, steps planned, warm-up steps, estimate interval, batches per
   estimate, final batches, limit, steps done, estimates done; u64: seed, characters used and
   the FNV-1a hash of them; f64: lr, min lr, beta1, beta2, weight decay, clip; the batch,
   estimate and sample generators (3 x 4 u64); u64: the streams' position; f64: the loss of
   each step done, then the step, train and validation loss of each estimate; u32: rows of a
   recurrent model's carried state, then its values as f64. All little-endian. With the
   parameters and the optimizer this is everything a run needs to go on exactly as if it had
   not stopped. */
typedef struct run_state {
    int step;                 /* steps done */
    ad_rng batch, eval, sample;
    streams st;
    long chars;               /* characters of the text used */
    uint64_t text_hash;
} run_state;

#define RUN_FIXED_BYTES (8 + 9 * 4 + 3 * 8 + 6 * 8 + 12 * 8 + 8 + 4)

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static size_t run_bytes(const run_state *r, const history *h, const char_model *m)
{
    return RUN_FIXED_BYTES + 8 * ((size_t)r->step + 3 * (size_t)h->evals) +
           8 * (size_t)m->state_rows * char_state_per_row(m);
}

static unsigned char *put_rng(unsigned char *p, const ad_rng *g)
{
    int i;
    for (i = 0; i < 4; i++) p = put_u64(p, g->s[i]);
    return p;
}

static void get_rng(const unsigned char **p, ad_rng *g)
{
    int i;
    for (i = 0; i < 4; i++) g->s[i] = get_u64(p);
}

static void pack_run(unsigned char *p, const options *o, const run_state *r, const history *h, const char_model *m)
{
    size_t i, n = (size_t)m->state_rows * char_state_per_row(m);
    uint32_t u[9];
    double f[6];
    int k;
    u[0] = (uint32_t)o->batch, u[1] = (uint32_t)o->iters, u[2] = (uint32_t)o->warmup;
    u[3] = (uint32_t)o->eval_interval, u[4] = (uint32_t)o->eval_batches, u[5] = (uint32_t)o->final_batches;
    u[6] = (uint32_t)o->limit, u[7] = (uint32_t)r->step, u[8] = (uint32_t)h->evals;
    f[0] = o->lr, f[1] = o->min_lr, f[2] = o->beta1, f[3] = o->beta2, f[4] = o->weight_decay, f[5] = o->clip;
    memcpy(p, "CHARRUN1", 8);
    p += 8;
    for (k = 0; k < 9; k++) p = put_u32(p, u[k]);
    p = put_u64(p, o->seed);
    p = put_u64(p, (uint64_t)r->chars);
    p = put_u64(p, r->text_hash);
    for (k = 0; k < 6; k++) p = put_f64(p, f[k]);
    p = put_rng(put_rng(put_rng(p, &r->batch), &r->eval), &r->sample);
    p = put_u64(p, (uint64_t)r->st.pos);
    for (k = 0; k < r->step; k++) p = put_f64(p, h->step_loss[k]);
    for (k = 0; k < h->evals; k++) {
        p = put_f64(p, h->eval_step[k]);
        p = put_f64(p, h->eval_train[k]);
        p = put_f64(p, h->eval_val[k]);
    }
    p = put_u32(p, (uint32_t)m->state_rows);
    for (i = 0; i < n; i++) p = put_f64(p, m->state[i]);
}

/* Saves the parameters, the optimizer, the model's configuration and the run. Returns 0, or -1
   with why filled in. */
static int save_run(const options *o, const run_state *r, const history *h, char_model *m, ad_optim *opt, char *why,
                    size_t cap)
{
    size_t head = char_config_bytes(&m->cfg), len = head + run_bytes(r, h, m);
    unsigned char *buf = (unsigned char *)malloc(len);
    int rc = -1;
    if (buf) {
        char_config_pack(&m->cfg, buf);
        pack_run(buf + head, o, r, h, m);
        rc = ad_params_set_extra(m->P, buf, len) == 0 && ad_checkpoint_save(o->checkpoint, m->P, opt) == 0 ? 0 : -1;
        free(buf);
    }
    if (rc != 0) snprintf(why, cap, "could not save the checkpoint: %s", buf ? ad_params_error(m->P) : "out of memory");
    return rc;
}

/* The run saved in o->resume: its options into o, the model's configuration into cfg, the
   history into h (whose arrays it allocates) and the rest into r; a recurrent model's carried
   state into *state (malloc'd; *rows rows). Returns 0, or -1 with why filled in. */
static int read_run(options *o, char_config *cfg, run_state *r, history *h, ad_real **state, int *rows, char *why,
                    size_t cap)
{
    char err[512];
    ad_params *P = ad_params_load(o->resume, err, sizeof err);
    const unsigned char *p, *end;
    size_t len = 0, per_row, i, n_evals;
    long head;
    uint32_t u[9];
    double f[6];
    int k, ok;
    if (!P) {
        snprintf(why, cap, "cannot resume: %s", err);
        return -1;
    }
    p = (const unsigned char *)ad_params_extra(P, &len);
    end = p ? p + len : NULL;
    head = p ? char_config_unpack(cfg, p, len) : -1;
    ok = head > 0 && len - (size_t)head >= RUN_FIXED_BYTES && memcmp(p + head, "CHARRUN1", 8) == 0;
    if (ok) {
        p += head + 8;
        for (k = 0; k < 9; k++) u[k] = get_u32(&p);
        o->seed = get_u64(&p);
        r->chars = (long)get_u64(&p);
        r->text_hash = get_u64(&p);
        for (k = 0; k < 6; k++) f[k] = get_f64(&p);
        get_rng(&p, &r->batch);
        get_rng(&p, &r->eval);
        get_rng(&p, &r->sample);
        r->st.pos = (long)get_u64(&p);
        o->batch = (int)u[0], o->iters = (int)u[1], o->warmup = (int)u[2], o->eval_interval = (int)u[3];
        o->eval_batches = (int)u[4], o->final_batches = (int)u[5], o->limit = (int)u[6];
        r->step = (int)u[7];
        h->evals = (int)u[8];
        o->lr = f[0], o->min_lr = f[1], o->beta1 = f[2], o->beta2 = f[3], o->weight_decay = f[4], o->clip = f[5];
        n_evals = (size_t)o->iters / (size_t)(o->eval_interval ? o->eval_interval : 1) + 2;
        /* what the rest of the program relies on: counts in range, and no more estimates than
           the steps done allow (the history's arrays are sized by the plan) */
        ok = o->batch > 0 && o->iters > 0 && o->eval_interval > 0 && o->eval_batches > 0 && o->final_batches > 0 &&
             o->warmup >= 0 && o->limit >= 0 && r->step >= 0 && r->step <= o->iters && r->st.pos >= 0 &&
             h->evals >= 0 && h->evals <= r->step / o->eval_interval + (r->step == o->iters ? 2 : 1) &&
             o->lr > 0 && o->min_lr >= 0 && o->clip >= 0 && o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 &&
             o->beta2 < 1 && o->weight_decay >= 0 && (size_t)(end - p) >= 8 * ((size_t)r->step + 3 * (size_t)h->evals) + 4;
    }
    if (ok) {
        h->steps = r->step;
        h->step_loss = (double *)malloc((size_t)o->iters * sizeof(double));
        h->eval_step = (double *)malloc(n_evals * 3 * sizeof(double));
        ok = h->step_loss && h->eval_step;
    }
    if (ok) {
        h->eval_train = h->eval_step + n_evals;
        h->eval_val = h->eval_train + n_evals;
        for (k = 0; k < r->step; k++) h->step_loss[k] = get_f64(&p);
        for (k = 0; k < h->evals; k++) {
            h->eval_step[k] = get_f64(&p);
            h->eval_train[k] = get_f64(&p);
            h->eval_val[k] = get_f64(&p);
        }
        *rows = (int)get_u32(&p);
        per_row = (size_t)cfg->layers * (cfg->kind == CHAR_LSTM ? 2 : 1) * (size_t)cfg->embd;
        ok = *rows >= 0 && (cfg->kind != CHAR_GPT || *rows == 0) &&
             (size_t)(end - p) == 8 * (size_t)*rows * per_row;
        *state = NULL;
        if (ok && *rows > 0) {
            *state = (ad_real *)malloc((size_t)*rows * per_row * sizeof(ad_real));
            ok = *state != NULL;
            for (i = 0; ok && i < (size_t)*rows * per_row; i++) (*state)[i] = (ad_real)get_f64(&p);
        }
    }
    ad_params_free(P);
    if (!ok) snprintf(why, cap, "cannot resume from %s: it holds no run of this program, or a damaged one", o->resume);
    else {
        o->model = cfg->kind;
        o->ctx = cfg->ctx;
        o->layers = cfg->layers;
        o->heads = cfg->heads;
        o->embd = cfg->embd;
    }
    return ok ? 0 : -1;
}

/* --sample-only: rebuilds the model saved in o->sample_only and prints a sample. */
static int sample_from_checkpoint(const options *o)
{
    char err[512];
    ad_params *P = ad_params_load(o->sample_only, err, sizeof err);
    const void *extra;
    size_t len = 0;
    char_config cfg;
    char_model m;
    ad_tape *T;
    ad_rng rng;
    int rc;
    if (!P) {
        fprintf(stderr, "cannot load %s: %s\n", o->sample_only, err);
        return 1;
    }
    extra = ad_params_extra(P, &len);
    if (!extra || char_config_unpack(&cfg, (const unsigned char *)extra, len) < 0 || char_model_init(&m, &cfg, P) != 0) {
        fprintf(stderr, "%s holds no model of this program\n", o->sample_only);
        ad_params_free(P);
        return 1;
    }
    T = ad_tape_new();
    if (!T) return 1;
    if (o->threads) ad_set_threads(T, o->threads);
    ad_rng_seed(&rng, o->seed);
    printf("%s: %s, %d layers, embedding %d, vocabulary of %d characters\n", o->sample_only,
           char_kind_names[cfg.kind], cfg.layers, cfg.embd, cfg.vocab);
    rc = sample(T, &m, o->start, o->sample_chars, o->temperature, &rng);
    char_model_free(&m);
    ad_tape_free(T);
    ad_params_free(P);
    return rc == 0 ? 0 : 1;
}

/* ---- training ---- */

/* One estimate of both losses after `step` steps, kept for the plot and printed (on rank 0 of a
   group). Returns 0, or -1 with why filled in. */
static int report_losses(ad_tape *T, char_model *m, const split *train, const split *val, int batches, int B, int L,
                         ad_rng *rng, int *x, int *y, int step, history *hist, const train_group *g, char *why,
                         size_t cap)
{
    double tl = estimate_loss(T, m, train, batches, B, L, rng, x, y, g, why, cap), vl;
    if (tl < 0 || (vl = estimate_loss(T, m, val, batches, B, L, rng, x, y, g, why, cap)) < 0) return -1;
    hist->eval_step[hist->evals] = step;
    hist->eval_train[hist->evals] = tl;
    hist->eval_val[hist->evals++] = vl;
    if (!g || g->rank == 0) {
        printf("step %d: train loss %.4f, val loss %.4f\n", step, tl, vl);
        fflush(stdout);
    }
    return 0;
}

/* The run's last estimate, for a resume of a run that has ended: nothing left to train. */
static int report_finished(const options *o, const history *h)
{
    if (h->evals == 0) return 1;
    printf("the run in %s has ended (step %d of %d); its last estimate:\n", o->resume, o->iters, o->iters);
    printf("step %d: train loss %.4f, val loss %.4f (%d batches each)\n", o->iters, h->eval_train[h->evals - 1],
           h->eval_val[h->evals - 1], o->final_batches);
    printf("val loss: %.4f\n", h->eval_val[h->evals - 1]);
    return 0;
}

/* The text a sample starts from, checked against the vocabulary before any training: --start,
   or by default a newline (nanoGPT's start), or the text's first character when it has none. */
static int pick_start(options *o, const char_config *cfg, const unsigned char *text, char *first, char *why,
                      size_t cap)
{
    size_t len = strlen(o->start);
    int *ids;
    long bad;
    if (!(o->given & GIVEN_START) && char_encode(cfg, (const unsigned char *)o->start, len, NULL) >= 0) {
        first[0] = (char)text[0];
        first[1] = 0;
        o->start = first;
        return 0;
    }
    if (len == 0) {
        snprintf(why, cap, "--start: the start text is empty");
        return -1;
    }
    ids = (int *)malloc(len * sizeof(int));
    if (!ids) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    bad = char_encode(cfg, (const unsigned char *)o->start, len, ids);
    free(ids);
    if (bad >= 0) {
        snprintf(why, cap, "--start: its character %ld does not occur in the training text", bad + 1);
        return -1;
    }
    return 0;
}

/* The whole program. g shares a GPT's run among processes (NULL: one process; see
   training_util.h): each trains on its share of every batch and measures its share of each
   estimate, and rank 0 alone prints, saves and samples. */
static int shakespeare_run(int argc, char **argv, const train_group *g)
{
    options o;
    unsigned char *text = NULL;
    int *ids = NULL, *x = NULL, *y = NULL, step, B, L, n_evals, saved_rows = 0, resumed_at, ok, lo, hi;
    int root = !g || g->rank == 0, rc;
    long n = 0;
    split train, val;
    char_config cfg;
    char_model m;
    ad_params *P = NULL;
    ad_optim *opt = NULL;
    ad_optim_desc desc;
    ad_tape *T = NULL;
    run_state run;
    history hist;
    ad_real *saved_state = NULL;
    double t_train = 0, train_loss = 0, val_loss = 0, share = 1;
    size_t step_peak = 0;
    char first[2], why[1024];

    rc = parse_options(argc, argv, &o, root);
    if (rc != 0) return rc > 0 ? 0 : 2; /* the same on every process, whose arguments agree */
    if (o.sample_only) return root ? sample_from_checkpoint(&o) : 0;
    if (g && o.model != CHAR_GPT) {
        if (root)
            fprintf(stderr, "%s: --model %s trains on one process: its carried state belongs to the whole batch "
                            "(use shakespeare)\n", argv[0], char_kind_names[o.model]);
        return 2;
    }
    rc = 1;
    memset(&run, 0, sizeof run);
    memset(&hist, 0, sizeof hist);
    memset(&cfg, 0, sizeof cfg);
    memset(&m, 0, sizeof m);
    why[0] = 0;
    ok = !o.resume || read_run(&o, &cfg, &run, &hist, &saved_state, &saved_rows, why, sizeof why) == 0;
    if (setup_step(g, ok, why) != 0) goto done;
    if (o.resume && run.step == o.iters) {
        rc = root ? report_finished(&o, &hist) : 0;
        goto done;
    }
    ok = !(o.resume && (o.given & GIVEN_STOP) && o.stop_after <= run.step);
    if (!ok)
        snprintf(why, sizeof why, "--stop-after %d: the run in %s is already past step %d", o.stop_after, o.resume,
                 run.step);
    if (setup_step(g, ok, why) != 0) goto done;
    ok = (n = read_text(o.data, &text, why, sizeof why)) >= 0;
    if (setup_step(g, ok, why) != 0) goto done;
    if (o.limit > 0 && o.limit < n) n = o.limit;
    if (g && g->same(g->ctx, text, (size_t)n, "text") != 0) goto done;
    ok = !(o.resume && (n != run.chars || fnv1a(text, (size_t)n) != run.text_hash));
    if (!ok) snprintf(why, sizeof why, "cannot resume: %s is not the text the run in %s was trained on", o.data, o.resume);
    if (setup_step(g, ok, why) != 0) goto done;
    run.chars = n;
    run.text_hash = fnv1a(text, (size_t)n);
    B = o.batch;
    L = o.ctx;
    if (!o.resume) char_vocab_from_text(&cfg, text, (size_t)n);
    ids = (int *)malloc((size_t)n * sizeof(int) + 1);
    x = (int *)malloc((size_t)B * L * sizeof(int));
    y = (int *)malloc((size_t)B * L * sizeof(int));
    if (setup_step(g, ids && x && y, "out of memory") != 0) goto done;
    char_encode(&cfg, text, (size_t)n, ids);
    ok = o.sample_chars == 0 || pick_start(&o, &cfg, text, first, why, sizeof why) == 0;
    if (setup_step(g, ok, why) != 0) goto done;
    train.ids = ids;
    train.n = n * 9 / 10;
    val.ids = ids + train.n;
    val.n = n - train.n;
    run.st.len = train.n / B;
    /* the GPT reads windows of L + 1 characters anywhere in a split; a recurrent model reads B
       stretches of the training split, L + 1 at a time */
    snprintf(why, sizeof why, "%s: %ld characters are too few for sequences of %d (each split needs more than %d%s)",
             o.data, n, L, L + 1, o.model != CHAR_GPT ? ", and each of the batch's stretches of the training split too" : "");
    if (setup_step(g, !(val.n <= L + 1 || train.n <= L + 1 || (o.model != CHAR_GPT && run.st.len <= L + 1)), why) != 0)
        goto done;
    ok = run.st.pos <= run.st.len;
    if (!ok) snprintf(why, sizeof why, "cannot resume from %s: its streams' position is past their end", o.resume);
    if (setup_step(g, ok, why) != 0) goto done;
    if (!o.resume) {
        cfg.kind = o.model;
        cfg.ctx = L;
        cfg.layers = o.layers;
        cfg.heads = o.model == CHAR_GPT ? o.heads : 1;
        cfg.embd = o.embd;
    }

    P = ad_params_new(o.seed);
    ok = P && char_model_init(&m, &cfg, P) == 0;
    snprintf(why, sizeof why, "cannot create the model: %s", P ? ad_params_error(P) : "out of memory");
    if (setup_step(g, ok, why) != 0) goto done;
    memset(&desc, 0, sizeof desc);
    desc.kind = AD_OPTIM_ADAMW;
    desc.lr = o.lr;
    desc.beta1 = o.beta1;
    desc.beta2 = o.beta2;
    desc.weight_decay = o.weight_decay;
    opt = ad_optim_new(P, &desc);
    T = ad_tape_new();
    if (!o.resume) {
        n_evals = o.iters / o.eval_interval + 2;
        hist.step_loss = (double *)malloc((size_t)o.iters * sizeof(double));
        hist.eval_step = (double *)malloc((size_t)n_evals * 3 * sizeof(double));
        hist.eval_train = hist.eval_step + n_evals;
        hist.eval_val = hist.eval_train + n_evals;
        ad_rng_seed(&run.batch, o.seed);
        ad_rng_seed(&run.eval, o.seed + 1);
        ad_rng_seed(&run.sample, o.seed + 2);
    }
    snprintf(why, sizeof why, "setup failed: %s", opt ? "out of memory" : ad_params_error(P));
    if (setup_step(g, opt && T && hist.step_loss && hist.eval_step, why) != 0) goto done;
    if (o.threads || (g && g->threads)) ad_set_threads(T, o.threads ? o.threads : g->threads);
    if (o.resume) {
        ok = ad_checkpoint_load(o.resume, P, opt) == 0;
        snprintf(why, sizeof why, "cannot resume: %s", ad_params_error(P));
        if (setup_step(g, ok, why) != 0) goto done;
        if (saved_rows > 0) {
            if (char_state_reset(&m, saved_rows) != 0) goto done;
            memcpy(m.state, saved_state, (size_t)saved_rows * char_state_per_row(&m) * sizeof(ad_real));
        }
    }
    if (g && g->start(g->ctx, P, opt) != 0) goto done;

    if (root) {
        printf("%s: %ld characters, %d distinct; %ld to train, %ld to validate\n", o.data, n, cfg.vocab, train.n, val.n);
        if (o.model == CHAR_GPT)
            printf("GPT: %d layers, %d heads, embedding %d, context %d: %zu parameters\n", o.layers, o.heads, o.embd, L,
                   ad_params_scalars(P));
        else
            printf("%s: %d layers of %d, sequences of %d: %zu parameters\n", o.model == CHAR_LSTM ? "LSTM" : "GRU",
                   o.layers, o.embd, L, ad_params_scalars(P));
        printf("AdamW lr %g to %g (%d warm-up steps, cosine), betas %g %g, weight decay %g, clip %g; batch %d, %d "
               "steps, %d thread%s", o.lr, o.min_lr, o.warmup, o.beta1, o.beta2, o.weight_decay, o.clip, B, o.iters,
               ad_get_threads(T), ad_get_threads(T) == 1 ? "" : "s");
        if (g) printf(" on each of %d processes", g->ranks);
        printf("\n");
        if (o.resume) printf("resumed from %s after step %d\n", o.resume, run.step);
        fflush(stdout);
    }
    if (run.step == 0 &&
        report_losses(T, &m, &train, &val, o.eval_batches, B, L, &run.eval, x, y, 0, &hist, g, why, sizeof why) != 0) {
        rc = training_error(g, why);
        goto done;
    }

    resumed_at = run.step;
    lo = 0;
    hi = B;
    if (g) share = g->share(g->ctx, B, &lo, &hi);
    for (step = run.step + 1; step <= o.iters; step++) {
        double t0 = seconds(), lr = ad_lr_cosine(o.lr, o.min_lr, o.warmup, o.iters, step - 1), tokens_per_s;
        double step_loss = 0;
        int done_here = step - resumed_at, stop = step < o.iters && step == o.stop_after;
        ad_tensor *loss;
        if (o.model == CHAR_GPT) random_batch(&train, B, L, &run.batch, x, y);
        else if (stream_batch(&train, &run.st, B, L, x, y)) char_state_reset(&m, B);
        ad_optim_set_lr(opt, lr);
        ad_params_zero_grad_on(P, T);
        if (g) g->begin_gradients(g->ctx);
        if (hi > lo) { /* a process whose share is empty adds zeros to the gradients */
            loss = ad_cross_entropy(T, char_forward(T, &m, x + (size_t)lo * L, hi - lo, L), y + (size_t)lo * L);
            /* in a group each process's mean is weighted by its share: the gradients' sum over
               the processes is then the gradient of the whole batch's mean */
            if (!loss || ad_backward(T, share != 1 ? ad_mul_scalar(T, loss, (ad_real)share) : loss) != 0) {
                snprintf(why, sizeof why, "\ntraining step %d failed: %s", step, tape_error(T));
                rc = training_error(g, why);
                goto done;
            }
            step_loss = share * ad_item(loss);
        }
        if (g) {
            g->end_gradients(g->ctx);
            g->sum(g->ctx, &step_loss, 1);
        }
        if (o.clip > 0) ad_clip_grad_norm_on(P, o.clip, T);
        if (ad_optim_step_on(opt, T) != 0) {
            snprintf(why, sizeof why, "\noptimizer step %d failed: %s", step, ad_params_error(P));
            rc = training_error(g, why);
            goto done;
        }
        hist.step_loss[hist.steps++] = step_loss;
        if (ad_tape_bytes_peak(T) > step_peak) step_peak = ad_tape_bytes_peak(T);
        ad_tape_reset(T);
        t_train += seconds() - t0;
        tokens_per_s = (double)done_here * B * L / t_train;
        if (!o.quiet && root)
            progress(step, o.iters, hist.step_loss[step - 1], lr, tokens_per_s,
                     (o.iters - step) * (t_train / done_here), step % o.eval_interval == 0 || step == o.iters || stop);
        if (step < o.iters && step % o.eval_interval == 0 &&
            report_losses(T, &m, &train, &val, o.eval_batches, B, L, &run.eval, x, y, step, &hist, g, why,
                          sizeof why) != 0) {
            rc = training_error(g, why);
            goto done;
        }
        run.step = step;
        if (step < o.iters && (step % o.eval_interval == 0 || stop) && root &&
            save_run(&o, &run, &hist, &m, opt, why, sizeof why) != 0) {
            rc = training_error(g, why);
            goto done;
        }
        if (stop) {
            if (root) printf("stopped after step %d of %d; continue with --resume %s\n", step, o.iters, o.checkpoint);
            rc = 0;
            goto done;
        }
    }

    train_loss = estimate_loss(T, &m, &train, o.final_batches, B, L, &run.eval, x, y, g, why, sizeof why);
    val_loss = train_loss < 0 ? -1 : estimate_loss(T, &m, &val, o.final_batches, B, L, &run.eval, x, y, g, why, sizeof why);
    if (val_loss < 0) {
        rc = training_error(g, why);
        goto done;
    }
    hist.eval_step[hist.evals] = o.iters;
    hist.eval_train[hist.evals] = train_loss;
    hist.eval_val[hist.evals++] = val_loss;
    if (root) {
        printf("step %d: train loss %.4f, val loss %.4f (%d batches each)\n", o.iters, train_loss, val_loss,
               o.final_batches);
        printf("trained %d steps in %.1fs: %.0f tokens/s; the tape's peak in a step: %.1f MiB\n", o.iters - resumed_at,
               t_train, (double)(o.iters - resumed_at) * B * L / t_train, (double)step_peak / (1 << 20));
        if (save_run(&o, &run, &hist, &m, opt, why, sizeof why) != 0) {
            rc = training_error(g, why);
            goto done;
        }
        printf("checkpoint: %s\n", o.checkpoint);
        if (write_plot(o.plot, &hist, o.iters) != 0) fprintf(stderr, "could not write the plot %s\n", o.plot);
        else printf("plot: %s\n", o.plot);
        fflush(stdout);
    }
    if (g && g->check_parameters(g->ctx, P, 1) != 0) goto done;
    if (root && o.sample_chars > 0) {
        printf("sample (temperature %g):\n", o.temperature);
        if (sample(T, &m, o.start, o.sample_chars, o.temperature, &run.sample) != 0) goto done;
    }
    if (root) printf("val loss: %.4f\n", val_loss);
    rc = 0;

done:
    free(text);
    free(saved_state);
    free(hist.step_loss);
    free(hist.eval_step);
    free(ids);
    free(x);
    free(y);
    char_model_free(&m);
    ad_optim_free(opt);
    ad_params_free(P);
    ad_tape_free(T);
    return rc;
}

#endif
