/* The training program behind examples/mnist.c (MLP) and examples/mnist_cnn.c (CNN): options,
   data, training with a progress display, evaluation, confusion matrix, checkpoint and SVG plot.
   A checkpoint is written after every epoch. It holds, besides the parameters and the
   optimizer, the run itself (its options, the epochs done, the batcher's position, the dropout
   generator and the history for the plot) as the store's extra bytes, so that --resume
   continues a run exactly where it stopped: the checkpoint it ends with is byte for byte the
   one an uninterrupted run writes.
   Include after autodiff.h (with stb_image) and mnist_model.h. */
#ifndef MNIST_TRAIN_H
#define MNIST_TRAIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "training_util.h"

#define CLASSES 10
#define MAX_EPOCHS 1000

/* Options that define a run: given again with --resume, they must agree with the checkpoint. */
enum { GIVEN_EPOCHS = 1, GIVEN_BATCH = 2, GIVEN_LR = 4, GIVEN_OPTIMIZER = 8, GIVEN_WEIGHT_DECAY = 16,
       GIVEN_HIDDEN = 32, GIVEN_SEED = 64, GIVEN_LIMIT = 128, GIVEN_CHECKPOINT = 256, GIVEN_BF16 = 512 };

typedef struct options {
    const char *data, *checkpoint, *plot, *optimizer, *resume;
    int cnn, epochs, batch, threads, limit, stop_after, fashion, bf16, given;
    double lr, weight_decay;
    unsigned long long seed;
    int sizes[MNIST_MAX_LAYERS + 1], nsizes; /* MLP: 784, hidden..., 10; CNN: channels c1, c2 */
} options;

/* Loss and accuracy of one pass over a dataset, per epoch, for the plot. */
typedef struct history {
    double train_loss[MAX_EPOCHS], train_acc[MAX_EPOCHS], test_loss[MAX_EPOCHS], test_acc[MAX_EPOCHS];
    int epochs;
} history;

static void usage(const char *argv0, const options *d)
{
    printf("usage: %s [options]\n"
           "  --data DIR         folder with the MNIST IDX files (default %s)\n"
           "  --epochs N         passes over the training set (default %d)\n"
           "  --batch N          mini-batch size (default %d)\n"
           "  --lr X             peak learning rate (default 0.05 for sgd, 0.001 for adam)\n"
           "  --optimizer NAME   sgd (momentum 0.9, Nesterov) or adam (default %s)\n"
           "  --weight-decay X   L2 penalty (default %g)\n"
           "  --hidden LIST      %s, comma-separated (default %s)\n"
           "  --seed N           seed of initialisation, shuffling and dropout (default 1)\n"
           "  --threads N        threads for matrix products (default: all cores)\n"
           "  --limit N          train on the first N training images only\n"
           "  --checkpoint PATH  where to save the model and the run after every epoch (default %s;\n"
           "                     with --resume, the checkpoint resumed from)\n"
           "  --resume PATH      continue the run saved in checkpoint PATH where it stopped, with its\n"
           "                     options; --epochs may change the planned length (the learning-rate\n"
           "                     schedule then follows the new length from the present step)\n"
           "  --stop-after N     stop after epoch N, as an interrupted run would (--resume goes on)\n"
           "  --bf16             matrix products in bfloat16, summed in float (mixed precision)\n"
           "  --fashion          the data is Fashion-MNIST: name its classes in the report\n"
           "  --plot PATH        where to write the SVG plot (default %s)\n"
           "  --help             this text\n",
           argv0, d->data, d->epochs, d->batch, d->optimizer, d->weight_decay,
           d->cnn ? "channels of the two convolutions" : "hidden layer widths", d->cnn ? "16,32" : "512",
           d->checkpoint, d->plot);
}

/* "512,256" -> the layer widths (MLP: with 784 in front and 10 behind) or the two channels. */
static int parse_sizes(const char *list, options *o)
{
    const char *p = list;
    int first = o->nsizes = 0;
    if (!o->cnn) o->sizes[o->nsizes++] = 784;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || o->nsizes >= MNIST_MAX_LAYERS) return -1;
        o->sizes[o->nsizes++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    if (o->cnn) return o->nsizes - first == 2 ? 0 : -1;
    o->sizes[o->nsizes++] = CLASSES;
    return 0;
}

/* Fills o from the command line. Returns 0, 1 after --help, or -1 after a bad option. Messages
   and the help text are printed only when speak is 1 (on one process of a group). */
static int parse_options(int argc, char **argv, int cnn, options *o, int speak)
{
    options defaults;
    int i;
    memset(o, 0, sizeof *o);
    o->cnn = cnn;
    o->data = "data/mnist";
    o->checkpoint = cnn ? "mnist_cnn.ckpt" : "mnist.ckpt";
    o->plot = cnn ? "mnist_cnn.svg" : "mnist.svg";
    o->optimizer = "sgd";
    o->epochs = cnn ? 8 : 15;
    o->batch = 64;
    o->weight_decay = cnn ? 5e-4 : 1e-4;
    o->seed = 1;
    parse_sizes(cnn ? "16,32" : "512", o);
    defaults = *o;
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            if (speak) usage(argv[0], &defaults);
            return 1;
        }
        if (!strcmp(arg, "--fashion")) {
            o->fashion = 1;
            continue;
        }
        if (!strcmp(arg, "--bf16")) {
            o->bf16 = 1;
            o->given |= GIVEN_BF16;
            continue;
        }
        if (!val) {
            if (speak) fprintf(stderr, "%s: %s needs a value (see --help)\n", argv[0], arg);
            return -1;
        }
        i++;
        if (!strcmp(arg, "--data")) o->data = val;
        else if (!strcmp(arg, "--epochs")) o->epochs = atoi(val), o->given |= GIVEN_EPOCHS;
        else if (!strcmp(arg, "--batch")) o->batch = atoi(val), o->given |= GIVEN_BATCH;
        else if (!strcmp(arg, "--lr")) o->lr = atof(val), o->given |= GIVEN_LR;
        else if (!strcmp(arg, "--optimizer")) o->optimizer = val, o->given |= GIVEN_OPTIMIZER;
        else if (!strcmp(arg, "--weight-decay")) o->weight_decay = atof(val), o->given |= GIVEN_WEIGHT_DECAY;
        else if (!strcmp(arg, "--seed")) o->seed = strtoull(val, NULL, 10), o->given |= GIVEN_SEED;
        else if (!strcmp(arg, "--threads")) o->threads = atoi(val);
        else if (!strcmp(arg, "--limit")) o->limit = atoi(val), o->given |= GIVEN_LIMIT;
        else if (!strcmp(arg, "--checkpoint")) o->checkpoint = val, o->given |= GIVEN_CHECKPOINT;
        else if (!strcmp(arg, "--resume")) o->resume = val;
        else if (!strcmp(arg, "--stop-after")) o->stop_after = atoi(val);
        else if (!strcmp(arg, "--plot")) o->plot = val;
        else if (!strcmp(arg, "--hidden")) {
            o->given |= GIVEN_HIDDEN;
            if (parse_sizes(val, o) != 0) {
                if (speak)
                fprintf(stderr, "%s: --hidden takes %s\n", argv[0],
                        cnn ? "two channel counts like 16,32" : "widths like 512 or 512,256");
                return -1;
            }
        } else {
            if (speak) fprintf(stderr, "%s: unknown option %s (see --help)\n", argv[0], arg);
            return -1;
        }
    }
    if (o->epochs < 1 || o->epochs > MAX_EPOCHS || o->batch < 1 || o->threads < 0 || o->limit < 0 ||
        o->stop_after < 0) {
        if (speak)
            fprintf(stderr, "%s: epochs must be 1..%d, batch positive, limit and stop-after not negative\n",
                    argv[0], MAX_EPOCHS);
        return -1;
    }
    if (o->resume && !(o->given & GIVEN_CHECKPOINT)) o->checkpoint = o->resume;
    if (strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam")) {
        if (speak) fprintf(stderr, "%s: --optimizer is sgd or adam\n", argv[0]);
        return -1;
    }
    if (o->lr <= 0) o->lr = strcmp(o->optimizer, "adam") ? 0.05 : 0.001;
    return 0;
}

static int argmax(const ad_real *row, int n)
{
    int best = 0, j;
    for (j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return best;
}

/* Progress of one epoch: a bar redrawn in place on a terminal, otherwise a plain line every
   five seconds. */
static void progress(int epoch, int epochs, int done, int total, double loss, double acc, double t0,
                     int final)
{
    static double last_line;
    double elapsed = seconds() - t0, rate = elapsed > 0 ? done / elapsed : 0;
    double eta = rate > 0 ? (total - done) / rate : 0;
    if (STDERR_IS_TERMINAL()) {
        char bar[31];
        if (done == 0) return;
        int filled = (int)(30.0 * done / total), i;
        for (i = 0; i < 30; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
        bar[30] = 0;
        fprintf(stderr, "\repoch %d/%d [%s] %3d%% loss %.4f acc %6.2f%% %7.0f samples/s ETA %3.0fs%s",
                epoch, epochs, bar, 100 * done / total, loss, 100 * acc, rate, eta, final ? "\n" : "");
    } else if (final) {
        last_line = 0; /* the epoch's line on stdout says the rest */
    } else if (elapsed - last_line >= 5) {
        last_line = elapsed;
        fprintf(stderr, "epoch %d/%d %d/%d loss %.4f acc %.2f%% %.0f samples/s ETA %.0fs\n", epoch, epochs,
                done, total, loss, 100 * acc, rate, eta);
    }
}

/* Mean loss and accuracy over ds in evaluation mode (no gradients); fills confusion[true][pred]
   when it is not NULL. In a group each process measures its share of ds and the sums are
   shared, so that every process gets the figures of the whole set. Returns 0, or -1 with why
   filled in. */
static int evaluate(ad_tape *T, mnist_model *m, const ad_dataset *ds, const train_group *g, double *loss,
                    double *acc, int confusion[CLASSES][CLASSES], char *why, size_t cap)
{
    enum { CHUNK = 1000, SUMS = 2 + CLASSES * CLASSES };
    double sums[SUMS]; /* loss, correct predictions, the confusion matrix */
    int first = 0, end = ds->count, start, i, shape[2];
    int was = ad_set_grad_enabled(T, 0), training = ad_set_training(T, 0);
    if (g) g->share(g->ctx, ds->count, &first, &end);
    memset(sums, 0, sizeof sums);
    for (start = first; start < end; start += CHUNK) {
        int n = end - start < CHUNK ? end - start : CHUNK;
        ad_tensor *x, *logits, *l;
        shape[0] = n;
        shape[1] = (int)ds->sample_size;
        x = ad_tensor_view(T, 2, shape, ds->x + (size_t)start * ds->sample_size, NULL, 0);
        logits = model_forward(T, m, x);
        l = ad_cross_entropy(T, logits, ds->labels + start);
        if (!l) {
            snprintf(why, cap, "evaluation failed: %s", tape_error(T));
            ad_set_grad_enabled(T, was);
            ad_set_training(T, training);
            return -1;
        }
        sums[0] += ad_item(l) * n;
        for (i = 0; i < n; i++) {
            int pred = argmax(logits->data + (size_t)i * CLASSES, CLASSES), truth = ds->labels[start + i];
            sums[1] += pred == truth;
            sums[2 + truth * CLASSES + pred]++;
        }
        ad_tape_reset(T);
    }
    ad_set_grad_enabled(T, was);
    ad_set_training(T, training);
    if (g) g->sum(g->ctx, sums, SUMS);
    *loss = sums[0] / ds->count;
    *acc = sums[1] / ds->count;
    if (confusion)
        for (i = 0; i < CLASSES * CLASSES; i++) confusion[i / CLASSES][i % CLASSES] = (int)sums[2 + i];
    return 0;
}

static const char *const fashion_names[CLASSES] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

static void print_confusion(int confusion[CLASSES][CLASSES], int fashion)
{
    int i, j;
    if (fashion) {
        printf("classes:");
        for (j = 0; j < CLASSES; j++) printf(" %d %s%s", j, fashion_names[j], j + 1 < CLASSES ? "," : "\n");
    }
    printf("confusion matrix (rows: true %s, columns: predicted)\n     ", fashion ? "class" : "digit");
    for (j = 0; j < CLASSES; j++) printf("%6d", j);
    printf("\n");
    for (i = 0; i < CLASSES; i++) {
        printf("%4d ", i);
        for (j = 0; j < CLASSES; j++) printf("%6d", confusion[i][j]);
        printf("\n");
    }
}

/* One panel of the plot: two series over the epochs, scaled to [lo, hi]. */
static void svg_panel(FILE *f, int x0, const char *title, const double *a, const double *b, int n, double lo,
                      double hi, const char *fmt)
{
    const int w = 360, h = 260, y0 = 40;
    const double *series[2];
    const char *colors[2] = {"#1f77b4", "#d62728"};
    int s, i, t;
    series[0] = a;
    series[1] = b;
    if (hi <= lo) hi = lo + 1;
    fprintf(f, "<text x='%d' y='25' font-size='15' text-anchor='middle'>%s</text>\n", x0 + w / 2, title);
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#888'/>\n", x0, y0, w, h);
    for (t = 0; t <= 4; t++) {
        double v = lo + (hi - lo) * t / 4;
        int y = y0 + h - h * t / 4;
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#ddd'/>\n", x0, y, x0 + w, y);
        fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='end'>", x0 - 4, y + 4);
        fprintf(f, fmt, v);
        fprintf(f, "</text>\n");
    }
    for (i = 0; i < n; i++)
        if (n <= 20 || i % (n / 10) == 0 || i == n - 1)
            fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='middle'>%d</text>\n",
                    x0 + (n > 1 ? w * i / (n - 1) : w / 2), y0 + h + 15, i + 1);
    fprintf(f, "<text x='%d' y='%d' font-size='12' text-anchor='middle'>epoch</text>\n", x0 + w / 2, y0 + h + 32);
    for (s = 0; s < 2; s++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colors[s]);
        for (i = 0; i < n; i++) {
            double v = (series[s][i] - lo) / (hi - lo);
            fprintf(f, "%.1f,%.1f ", x0 + (n > 1 ? (double)w * i / (n - 1) : w / 2.0), y0 + h - h * v);
        }
        fprintf(f, "'/>\n");
    }
}

static int write_plot(const char *path, const history *hist)
{
    static double train_pct[MAX_EPOCHS], test_pct[MAX_EPOCHS];
    FILE *f = fopen(path, "w");
    double lmax = 0, amin = 100;
    int i, n = hist->epochs;
    if (!f) return -1;
    for (i = 0; i < n; i++) {
        train_pct[i] = 100 * hist->train_acc[i];
        test_pct[i] = 100 * hist->test_acc[i];
        if (hist->train_loss[i] > lmax) lmax = hist->train_loss[i];
        if (hist->test_loss[i] > lmax) lmax = hist->test_loss[i];
        if (train_pct[i] < amin) amin = train_pct[i];
        if (test_pct[i] < amin) amin = test_pct[i];
    }
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='860' height='360' font-family='sans-serif'>\n"
               "<rect width='100%%' height='100%%' fill='white'/>\n");
    svg_panel(f, 60, "loss", hist->train_loss, hist->test_loss, n, 0, lmax * 1.05, "%.2f");
    svg_panel(f, 480, "accuracy (%)", train_pct, test_pct, n, amin - (100 - amin) * 0.1, 100, "%.1f");
    fprintf(f, "<text x='430' y='352' font-size='12' text-anchor='middle'>"
               "<tspan fill='#1f77b4'>&#9632; train</tspan>  <tspan fill='#d62728'>&#9632; test</tspan></text>\n"
               "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- the run, kept in the checkpoint's extra bytes ----
   "MNISTRUN", u32 version, then u32: cnn, the layer sizes (count, then MNIST_MAX_LAYERS + 1
   slots), batch, limit, optimizer (0 SGD, 1 Adam), products (0 float, 1 bfloat16; not in
   version 1, whose runs are in float), planned epochs, epochs done; u64: seed, step; f64: lr,
   weight decay; the batcher's state; the dropout generator (4 x u64); per epoch done, f64 train
   loss, train accuracy, test loss, test accuracy. All little-endian. */
#define RUN_VERSION 2
#define RUN_FIXED_BYTES_V1 (8 + 4 * (3 + MNIST_MAX_LAYERS + 1 + 5) + 4 * 8 + AD_BATCHER_STATE_BYTES + 4 * 8)
#define RUN_FIXED_BYTES (RUN_FIXED_BYTES_V1 + 4)
#define RUN_BYTES(epochs) (RUN_FIXED_BYTES + 4 * 8 * (size_t)(epochs))

/* Where a run stands between two epochs. */
typedef struct run_state {
    int epochs_done;
    long step;
    unsigned char batcher[AD_BATCHER_STATE_BYTES];
    ad_rng dropout;
} run_state;

/* Writes the run into buf (RUN_BYTES(r->epochs_done) bytes); returns the bytes written. */
static size_t pack_run(unsigned char *buf, const options *o, const history *h, const run_state *r)
{
    unsigned char *p = buf;
    int i;
    memcpy(p, "MNISTRUN", 8);
    p = put_u32(p + 8, RUN_VERSION);
    p = put_u32(p, (uint32_t)o->cnn);
    p = put_u32(p, (uint32_t)o->nsizes);
    for (i = 0; i <= MNIST_MAX_LAYERS; i++) p = put_u32(p, i < o->nsizes ? (uint32_t)o->sizes[i] : 0);
    p = put_u32(p, (uint32_t)o->batch);
    p = put_u32(p, (uint32_t)o->limit);
    p = put_u32(p, strcmp(o->optimizer, "adam") == 0);
    p = put_u32(p, (uint32_t)o->bf16);
    p = put_u32(p, (uint32_t)o->epochs);
    p = put_u32(p, (uint32_t)r->epochs_done);
    p = put_u64(p, o->seed);
    p = put_u64(p, (uint64_t)r->step);
    p = put_f64(p, o->lr);
    p = put_f64(p, o->weight_decay);
    memcpy(p, r->batcher, AD_BATCHER_STATE_BYTES);
    p += AD_BATCHER_STATE_BYTES;
    for (i = 0; i < 4; i++) p = put_u64(p, r->dropout.s[i]);
    for (i = 0; i < r->epochs_done; i++) {
        p = put_f64(p, h->train_loss[i]);
        p = put_f64(p, h->train_acc[i]);
        p = put_f64(p, h->test_loss[i]);
        p = put_f64(p, h->test_acc[i]);
    }
    return (size_t)(p - buf);
}

/* Reads a run written by pack_run into *saved (its options), h and r. Returns 0, or -1 with
   why filled in. */
static int unpack_run(const unsigned char *buf, size_t len, options *saved, history *h, run_state *r, char *why,
                      size_t cap)
{
    const unsigned char *p = buf;
    size_t fixed;
    uint32_t version;
    int i;
    if (len < RUN_FIXED_BYTES_V1 || memcmp(buf, "MNISTRUN", 8) != 0) {
        snprintf(why, cap, "it holds no run of this program (a model saved otherwise can be used by predict)");
        return -1;
    }
    p += 8;
    version = get_u32(&p);
    if (version != 1 && version != RUN_VERSION) {
        snprintf(why, cap, "its run was saved by another version of this program");
        return -1;
    }
    fixed = version == 1 ? RUN_FIXED_BYTES_V1 : RUN_FIXED_BYTES;
    if (len < fixed) {
        snprintf(why, cap, "its run is malformed");
        return -1;
    }
    saved->cnn = (int)get_u32(&p);
    saved->nsizes = (int)get_u32(&p);
    for (i = 0; i <= MNIST_MAX_LAYERS; i++) saved->sizes[i] = (int)get_u32(&p);
    saved->batch = (int)get_u32(&p);
    saved->limit = (int)get_u32(&p);
    saved->optimizer = get_u32(&p) ? "adam" : "sgd";
    saved->bf16 = version == 1 ? 0 : (int)get_u32(&p);
    saved->epochs = (int)get_u32(&p);
    r->epochs_done = (int)get_u32(&p);
    saved->seed = get_u64(&p);
    r->step = (long)get_u64(&p);
    saved->lr = get_f64(&p);
    saved->weight_decay = get_f64(&p);
    memcpy(r->batcher, p, AD_BATCHER_STATE_BYTES);
    p += AD_BATCHER_STATE_BYTES;
    for (i = 0; i < 4; i++) r->dropout.s[i] = get_u64(&p);
    if (saved->nsizes < 2 || saved->nsizes > MNIST_MAX_LAYERS + 1 || r->epochs_done < 0 ||
        r->epochs_done > MAX_EPOCHS || saved->bf16 < 0 || saved->bf16 > 1 ||
        len != fixed + 4 * 8 * (size_t)r->epochs_done) {
        snprintf(why, cap, "its run is malformed");
        return -1;
    }
    for (i = 0; i < r->epochs_done; i++) {
        h->train_loss[i] = get_f64(&p);
        h->train_acc[i] = get_f64(&p);
        h->test_loss[i] = get_f64(&p);
        h->test_acc[i] = get_f64(&p);
    }
    h->epochs = r->epochs_done;
    return 0;
}

/* Takes the run's options from the saved ones; an option given on the command line must agree
   with them, except --epochs, which changes the plan. Returns 0, or -1 with why filled in. */
static int adopt_run(options *o, const options *saved, const char *argv0, char *why, size_t cap)
{
    const char *clash = NULL;
    if (saved->cnn != o->cnn) {
        snprintf(why, cap, "%s: %s holds a run of the %s; train it on with %s", argv0, o->resume,
                 saved->cnn ? "CNN" : "MLP", saved->cnn ? "mnist_cnn" : "mnist");
        return -1;
    }
    if ((o->given & GIVEN_BATCH) && o->batch != saved->batch) clash = "--batch";
    else if ((o->given & GIVEN_LR) && o->lr != saved->lr) clash = "--lr";
    else if ((o->given & GIVEN_OPTIMIZER) && strcmp(o->optimizer, saved->optimizer) != 0) clash = "--optimizer";
    else if ((o->given & GIVEN_WEIGHT_DECAY) && o->weight_decay != saved->weight_decay) clash = "--weight-decay";
    else if ((o->given & GIVEN_SEED) && o->seed != saved->seed) clash = "--seed";
    else if ((o->given & GIVEN_LIMIT) && o->limit != saved->limit) clash = "--limit";
    else if ((o->given & GIVEN_BF16) && o->bf16 != saved->bf16) clash = "--bf16";
    else if ((o->given & GIVEN_HIDDEN) &&
             (o->nsizes != saved->nsizes || memcmp(o->sizes, saved->sizes, (size_t)o->nsizes * sizeof(int)) != 0))
        clash = "--hidden";
    if (clash) {
        snprintf(why, cap, "%s: %s differs from the run saved in %s; leave it out to resume, or start a new run",
                 argv0, clash, o->resume);
        return -1;
    }
    o->batch = saved->batch;
    o->lr = saved->lr;
    o->optimizer = saved->optimizer;
    o->weight_decay = saved->weight_decay;
    o->seed = saved->seed;
    o->limit = saved->limit;
    o->bf16 = saved->bf16;
    o->nsizes = saved->nsizes;
    memcpy(o->sizes, saved->sizes, sizeof o->sizes);
    if (!(o->given & GIVEN_EPOCHS)) o->epochs = saved->epochs;
    return 0;
}

/* Reads the run saved in o->resume (and its options into o). Returns 0, or -1 with why filled
   in. */
static int read_run(options *o, history *h, run_state *r, const char *argv0, char *why, size_t cap)
{
    options saved = *o;
    char err[512], reason[160];
    ad_params *P = ad_params_load(o->resume, err, sizeof err);
    const void *extra;
    size_t len;
    int rc;
    if (!P) {
        snprintf(why, cap, "%s: cannot resume: %s", argv0, err);
        return -1;
    }
    extra = ad_params_extra(P, &len);
    rc = extra ? unpack_run((const unsigned char *)extra, len, &saved, h, r, reason, sizeof reason) : -1;
    if (!extra) snprintf(reason, sizeof reason, "it holds no run of this program (a model saved otherwise can be used by predict)");
    ad_params_free(P);
    if (rc != 0) {
        snprintf(why, cap, "%s: cannot resume from %s: %s", argv0, o->resume, reason);
        return -1;
    }
    return adopt_run(o, &saved, argv0, why, cap);
}

/* Saves the model, the optimizer and the run after an epoch. Returns 0, or -1 with why filled
   in. */
static int save_run(const options *o, ad_params *P, ad_optim *opt, const history *h, run_state *r,
                    const ad_batcher *b, const mnist_model *m, char *why, size_t cap)
{
    unsigned char *buf = (unsigned char *)malloc(RUN_BYTES(r->epochs_done));
    int rc;
    if (!buf) {
        snprintf(why, cap, "could not save the checkpoint: out of memory");
        return -1;
    }
    ad_batcher_get_state(b, r->batcher);
    r->dropout = m->rng;
    rc = ad_params_set_extra(P, buf, pack_run(buf, o, h, r)) == 0 ? ad_checkpoint_save(o->checkpoint, P, opt) : -1;
    free(buf);
    if (rc != 0) snprintf(why, cap, "could not save the checkpoint: %s", ad_params_error(P));
    return rc;
}

/* The whole program: options, data, model, training, report. cnn selects the network; g shares
   the run among processes (NULL: one process; see training_util.h), which then print from rank 0
   alone. */
static int mnist_run(int argc, char **argv, int cnn, const train_group *g)
{
    options o;
    mnist_model model;
    ad_dataset train, test;
    ad_batcher batcher;
    ad_params *P;
    ad_optim *opt;
    ad_optim_desc desc;
    ad_tape *T;
    history *hist;
    run_state run;
    ad_real *xb;
    int *yb, confusion[CLASSES][CLASSES], epoch, shape[2], stopped = 0, i, rc;
    int root = !g || g->rank == 0;
    char err[512], why[1024];
    long total_steps;
    double test_loss = 0, test_acc = 0, t_start;

    rc = parse_options(argc, argv, cnn, &o, root);
    if (rc != 0) return rc > 0 ? 0 : 2; /* the same on every process, whose arguments agree */
    hist = (history *)calloc(1, sizeof *hist);
    memset(&run, 0, sizeof run);
    if (setup_step(g, hist != NULL, "out of memory") != 0) return 1;
    rc = o.resume ? read_run(&o, hist, &run, argv[0], why, sizeof why) : 0;
    if (setup_step(g, rc == 0, why) != 0) return 1;
    rc = ad_mnist_load(o.data, "train", &train, err, sizeof err) == 0 &&
         ad_mnist_load(o.data, "t10k", &test, err, sizeof err) == 0;
    snprintf(why, sizeof why, "%s\n(make mnist downloads MNIST; or pass --data DIR with the four IDX files)", err);
    if (setup_step(g, rc, why) != 0) return 1;
    if (o.limit > 0 && o.limit < train.count) train.count = o.limit;
    snprintf(why, sizeof why, "%s: images of %d values; this model takes %dx%d", o.data, (int)train.sample_size,
             MNIST_SIDE, MNIST_SIDE);
    if (setup_step(g, train.sample_size == MNIST_SIDE * MNIST_SIDE, why) != 0) return 1;
    if (root) {
        printf("%s: %d training and %d test images of %dx%d; ", o.fashion ? "Fashion-MNIST" : "MNIST", train.count,
               test.count, MNIST_SIDE, MNIST_SIDE);
        if (o.cnn) {
            printf("CNN conv5x5(1-%d)-bn-pool-conv5x5(%d-%d)-bn-pool-dropout-fc", o.sizes[0], o.sizes[0], o.sizes[1]);
        } else {
            printf("MLP");
            for (i = 0; i < o.nsizes; i++) printf("%s%d", i ? "-" : " ", o.sizes[i]);
        }
        printf(", %s, lr %g, batch %d, %d epochs%s", o.optimizer, o.lr, o.batch, o.epochs,
               o.bf16 ? ", bfloat16 products" : "");
        if (g) printf(", %d processes", g->ranks);
        printf("\n");
    }

    P = ad_params_new(o.seed);
    rc = P && (o.cnn ? model_create_cnn(&model, P, o.sizes[0], o.sizes[1], o.seed)
                     : model_create_mlp(&model, P, o.nsizes, o.sizes)) == 0;
    snprintf(why, sizeof why, "cannot create the model: %s", P ? ad_params_error(P) : "out of memory");
    if (setup_step(g, rc, why) != 0) return 1;
    memset(&desc, 0, sizeof desc);
    desc.kind = strcmp(o.optimizer, "adam") ? AD_OPTIM_SGD : AD_OPTIM_ADAM;
    desc.lr = o.lr;
    desc.momentum = desc.kind == AD_OPTIM_SGD ? 0.9 : 0;
    desc.nesterov = desc.kind == AD_OPTIM_SGD;
    desc.weight_decay = o.weight_decay;
    opt = ad_optim_new(P, &desc);
    T = ad_tape_new();
    xb = (ad_real *)malloc((size_t)o.batch * train.sample_size * sizeof(ad_real));
    yb = (int *)malloc((size_t)o.batch * sizeof(int));
    snprintf(err, sizeof err, "out of memory");
    rc = opt && T && xb && yb &&
         ad_batcher_init(&batcher, &train, o.batch, AD_BATCH_SHUFFLE, o.seed, err, sizeof err) == 0;
    snprintf(why, sizeof why, "setup failed: %s", opt ? err : ad_params_error(P));
    if (setup_step(g, rc, why) != 0) return 1;
    rc = !o.bf16 || ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) >= 0;
    snprintf(why, sizeof why, "--bf16: %s", tape_error(T));
    if (setup_step(g, rc, why) != 0) return 1;
    if (o.resume) {
        rc = ad_checkpoint_load(o.resume, P, opt) == 0 &&
             ad_batcher_set_state(&batcher, run.batcher, sizeof run.batcher, err, sizeof err) == 0;
        snprintf(why, sizeof why, "cannot resume: %s", ad_params_error(P) ? ad_params_error(P) : err);
        if (setup_step(g, rc, why) != 0) return 1;
        model.rng = run.dropout;
        if (root) printf("resumed from %s after epoch %d (step %ld)\n", o.resume, run.epochs_done, run.step);
    }
    if (g && (g->same(g->ctx, train.x, (size_t)train.count * train.sample_size * sizeof(ad_real), "training images") ||
              g->same(g->ctx, train.labels, (size_t)train.count * sizeof(int), "training labels") ||
              g->same(g->ctx, test.x, (size_t)test.count * test.sample_size * sizeof(ad_real), "test images") ||
              g->same(g->ctx, test.labels, (size_t)test.count * sizeof(int), "test labels") ||
              g->start(g->ctx, P, opt)))
        return 1;
    fflush(stdout);
    if (o.threads || (g && g->threads)) ad_set_threads(T, o.threads ? o.threads : g->threads);
    total_steps = (long)o.epochs * ((train.count + o.batch - 1) / o.batch);
    t_start = seconds();

    for (epoch = run.epochs_done + 1; epoch <= o.epochs; epoch++) {
        double sums[3] = {0, 0, 0}, t0 = seconds(); /* this process's loss, correct predictions, samples */
        int seen = 0, n;
        if (epoch > 1) ad_batcher_reset(&batcher);
        while ((n = ad_batcher_next(&batcher, xb, yb)) > 0) {
            ad_tensor *x, *logits, *loss;
            int lo = 0, hi = n;
            double share = g ? g->share(g->ctx, n, &lo, &hi) : 1;
            /* a short linear warm-up, then cosine decay to zero over the whole run */
            ad_optim_set_lr(opt, ad_lr_cosine(o.lr, 0, total_steps / 50, total_steps, run.step++));
            ad_params_zero_grad_on(P, T);
            if (g) g->begin_gradients(g->ctx);
            if (hi > lo) { /* a process whose share is empty adds zeros to the gradients */
                shape[0] = hi - lo;
                shape[1] = (int)train.sample_size;
                x = ad_tensor_view(T, 2, shape, xb + (size_t)lo * train.sample_size, NULL, 0);
                logits = model_forward(T, &model, x);
                loss = ad_cross_entropy(T, logits, yb + lo);
                /* in a group each process's mean is weighted by its share: the gradients' sum
                   over the processes is then the gradient of the whole batch's mean */
                if (!loss || ad_backward(T, share != 1 ? ad_mul_scalar(T, loss, (ad_real)share) : loss) != 0) {
                    snprintf(why, sizeof why, "\ntraining step failed: %s", tape_error(T));
                    return training_error(g, why);
                }
                sums[0] += ad_item(loss) * (hi - lo);
                for (i = lo; i < hi; i++)
                    sums[1] += argmax(logits->data + (size_t)(i - lo) * CLASSES, CLASSES) == yb[i];
                sums[2] += hi - lo;
            }
            if (g) g->end_gradients(g->ctx);
            if (ad_optim_step_on(opt, T) != 0) {
                snprintf(why, sizeof why, "\ntraining step failed: %s", ad_params_error(P));
                return training_error(g, why);
            }
            seen += n;
            ad_tape_reset(T);
            if ((run.step & 31) == 0 && root && sums[2] > 0)
                progress(epoch, o.epochs, seen, train.count, sums[0] / sums[2], sums[1] / sums[2], t0, 0);
        }
        if (g) g->sum(g->ctx, sums, 3);
        if (root) progress(epoch, o.epochs, seen, train.count, sums[0] / sums[2], sums[1] / sums[2], t0, 1);
        if (evaluate(T, &model, &test, g, &test_loss, &test_acc, NULL, why, sizeof why) != 0)
            return training_error(g, why);
        hist->train_loss[epoch - 1] = sums[0] / sums[2];
        hist->train_acc[epoch - 1] = sums[1] / sums[2];
        hist->test_loss[epoch - 1] = test_loss;
        hist->test_acc[epoch - 1] = test_acc;
        hist->epochs = run.epochs_done = epoch;
        if (root) {
            printf("epoch %2d  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  (%.1fs)\n", epoch,
                   sums[0] / sums[2], 100 * sums[1] / sums[2], test_loss, 100 * test_acc, seconds() - t0);
            fflush(stdout);
        }
        if (g && g->check_parameters(g->ctx, P, 0) != 0) return 1;
        if (root && save_run(&o, P, opt, hist, &run, &batcher, &model, why, sizeof why) != 0)
            return training_error(g, why);
        if (o.stop_after && epoch == o.stop_after && epoch < o.epochs) {
            stopped = 1;
            break;
        }
    }

    memset(confusion, 0, sizeof confusion);
    if (evaluate(T, &model, &test, g, &test_loss, &test_acc, confusion, why, sizeof why) != 0)
        return training_error(g, why);
    if (root) {
        print_confusion(confusion, o.fashion);
        printf("trained in %.1fs\n", seconds() - t_start);
        printf("checkpoint: %s\n", o.checkpoint);
        if (stopped)
            printf("stopped after epoch %d of %d; continue with --resume %s\n", run.epochs_done, o.epochs,
                   o.checkpoint);
        if (write_plot(o.plot, hist) != 0) fprintf(stderr, "could not write the plot %s\n", o.plot);
        else printf("plot: %s\n", o.plot);
        fflush(stdout);
    }
    if (g && g->check_parameters(g->ctx, P, 1) != 0) return 1;
    if (root) printf("test accuracy: %.2f%%\n", 100 * test_acc);

    ad_batcher_free(&batcher);
    ad_dataset_free(&train);
    ad_dataset_free(&test);
    ad_optim_free(opt);
    model_free(&model);
    ad_params_free(P);
    ad_tape_free(T);
    free(hist);
    free(xb);
    free(yb);
    return 0;
}

#endif
