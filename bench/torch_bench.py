"""The PyTorch side of bench/run.sh: the same work as bench/gemm.c, bench/tape.c, bench/optim.c,
bench/unary.c, bench/mlp.c, bench/cnn.c and bench/gpt.c.

    python3 bench/torch_bench.py gemm [name ...]
    python3 bench/torch_bench.py tape
    python3 bench/torch_bench.py optim
    python3 bench/torch_bench.py unary
    python3 bench/torch_bench.py mlp 784,128,10
    python3 bench/torch_bench.py cnn
    python3 bench/torch_bench.py gpt [steps]
    python3 bench/torch_bench.py lstm [steps]

gpt is nanoGPT's model.py as torch 1.13 runs it (attention written out, since
scaled_dot_product_attention came with torch 2.0) in its shakespeare_char CPU configuration;
lstm is nn.Embedding -> nn.LSTM (2 layers) -> nn.Linear. Both train a step at a time as
bench/gpt.c does.

Threads: torch.set_num_threads(AUTODIFF_THREADS, default 1); the caller also sets
OPENBLAS_NUM_THREADS (and OMP_NUM_THREADS) in the environment, since the BLAS that torch.mm
calls may read them when it is loaded. Data: MNIST_DIR as in bench/mlp.c, else random data of
the same size. Prints "@ key value" lines (the keys of the C programs, with .torch for .ours)
and "#" commentary.
"""
import gzip
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F

THREADS = max(1, int(os.environ.get("AUTODIFF_THREADS", "1") or 1))
torch.set_num_threads(THREADS)
# BENCH_CLOCK=cpu: CPU time of this thread, as in bench/bench.h (single-thread runs only)
now = time.thread_time if os.environ.get("BENCH_CLOCK") == "cpu" else time.perf_counter


def result(key, value):
    print("@ %s %.6g" % (key, value), flush=True)


# name, description, trans_a, trans_b, M, N, K: as in bench/gemm.c
SHAPES = [
    ("sq256", "256x256 . 256x256", 0, 0, 256, 256, 256),
    ("sq512", "512x512 . 512x512", 0, 0, 512, 512, 512),
    ("sq1024", "1024x1024 . 1024x1024", 0, 0, 1024, 1024, 1024),
    ("sq2048", "2048x2048 . 2048x2048", 0, 0, 2048, 2048, 2048),
    ("mlp_fwd1", "x[64,784] . W1[784,128]", 0, 0, 64, 128, 784),
    ("mlp_fwd2", "h[64,128] . W2[128,10]", 0, 0, 64, 10, 128),
    ("mlp_gWt2", "g[64,10] . W2^T", 0, 1, 64, 128, 10),
    ("mlp_hTg2", "h^T . g[64,10]", 1, 0, 128, 10, 64),
    ("mlp_xTg1", "x^T . g[64,128]", 1, 0, 784, 128, 64),
    ("mlp2_fwd1", "x[64,784] . W1[784,512]", 0, 0, 64, 512, 784),
    ("mlp2_fwd2", "h1[64,512] . W2[512,256]", 0, 0, 64, 256, 512),
    ("mlp2_gWt2", "g[64,256] . W2^T", 0, 1, 64, 512, 256),
    ("mlp2_hTg2", "h1^T . g[64,256]", 1, 0, 512, 256, 64),
    ("mlp2_xTg1", "x^T . g[64,512]", 1, 0, 784, 512, 64),
    ("gpt_attn", "x[768,128] . W[128,384]", 0, 0, 768, 384, 128),
    ("gpt_fc", "x[768,128] . W[128,512]", 0, 0, 768, 512, 128),
    ("gpt_proj", "h[768,512] . W[512,128]", 0, 0, 768, 128, 512),
    ("gpt_gWt_fc", "g[768,512] . W_fc[128,512]^T", 0, 1, 768, 128, 512),
    ("gpt_gWt_proj", "g[768,128] . W_proj[512,128]^T", 0, 1, 768, 512, 128),
    ("gpt_xTg_fc", "x^T . g[768,512]", 1, 0, 128, 512, 768),
    ("gpt_xTg_proj", "h^T . g[768,128]", 1, 0, 512, 128, 768),
    ("gpt_qkT", "q[32,32] . k[32,32]^T", 0, 1, 32, 32, 32),
    # one row: an LSTM step on one sequence (h . W_hh^T), an MLP on one image (x . W1, h . W2)
    ("thin_hWt", "h[1,256] . W_hh[1024,256]^T", 0, 1, 1, 1024, 256),
    ("thin_xW", "x[1,784] . W1[784,128]", 0, 0, 1, 128, 784),
    ("thin_hW2", "h[1,128] . W2[128,10]", 0, 0, 1, 10, 128),
    # one column: a linear regression's forward (x . w) and its weight's gradient (x^T . g)
    ("col_xw", "x[64,784] . w[784,1]", 0, 0, 64, 1, 784),
    ("col_xTg", "x^T . g[64,1]", 1, 0, 784, 1, 64),
]


def bench_gemm(names):
    torch.manual_seed(42)
    for name, what, ta, tb, m, n, k in SHAPES:
        if names and name not in names:
            continue
        a = (torch.rand(k, m) * 2 - 1).t() if ta else torch.rand(m, k) * 2 - 1
        b = (torch.rand(n, k) * 2 - 1).t() if tb else torch.rand(k, n) * 2 - 1
        c = torch.empty(m, n)
        torch.mm(a, b, out=c)
        t = now()
        torch.mm(a, b, out=c)
        t = now() - t
        reps = 1
        while t * reps < 0.06 and reps < 1 << 20:
            reps *= 2
        times = []
        for _ in range(5):
            t = now()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            times.append(now() - t)
        gflops = 2.0 * m * n * k * reps / statistics.median(times) * 1e-9
        result("gemm.%s.torch" % name, gflops)
        print("# %-9s %s%s %-24s torch.mm %6.1f GFLOP/s" % (name, "T" if ta else "N", "T" if tb else "N", what, gflops))


def tutorial_f(a, b):
    return (a / b - a) * (b / a + a + b) * (a - b)


def bench_tape():
    ops = 8  # div, sub, div, add, add, sub, mul, mul: the entries bench/tape.c records

    def step(av, bv):
        a = torch.tensor(av, requires_grad=True)
        b = torch.tensor(bv, requires_grad=True)
        y = tutorial_f(a, b)
        y.backward()
        return y, a.grad, b.grad

    for _ in range(500):
        step(1.5, 0.7)
    iters = 256
    while True:
        t = now()
        for _ in range(iters):
            step(1.5, 0.7)
        t = now() - t
        if t > 0.1 or iters >= 1 << 22:
            break
        iters *= 2
    times = []
    for _ in range(7):
        t = now()
        for _ in range(iters):
            step(1.5, 0.7)
        times.append(now() - t)
    y, ga, gb = step(1.5, 0.7)
    ns_iter = statistics.median(times) / iters * 1e9
    print("# f(1.5, 0.7) = %.6f  df/da = %.6f  df/db = %.6f" % (y.item(), ga.item(), gb.item()))
    print("# %.1f ns per iteration, %.1f ns per op (%d iterations per batch)" % (ns_iter, ns_iter / ops, iters))
    result("tape.ns_iter.torch", ns_iter)
    result("tape.ns_op.torch", ns_iter / ops)
    result("tape.dfda.torch", ga.item())
    result("tape.dfdb.torch", gb.item())


def bench_optim():
    widths = [784, 512, 256, 10]
    kinds = [("sgd", "SGD", lambda ps: torch.optim.SGD(ps, lr=0.01)),
             ("momentum", "SGD, momentum 0.9", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)),
             ("adam", "Adam", lambda ps: torch.optim.Adam(ps, lr=1e-3))]
    steps = 64
    for key, what, make in kinds:
        gen = torch.Generator().manual_seed(5)
        params = []
        for i in range(3):
            for shape in ((widths[i], widths[i + 1]), (widths[i + 1],)):
                p = torch.rand(shape, generator=gen) - 0.5
                p.requires_grad_(True)
                p.grad = 1e-3 * (torch.rand(shape, generator=gen) - 0.5)
                params.append(p)
        opt = make(params)
        n = sum(p.numel() for p in params)
        for _ in range(steps):
            opt.step()
        times = []
        for _ in range(7):
            t = now()
            for _ in range(steps):
                opt.step()
            times.append(now() - t)
        us = statistics.median(times) / steps * 1e6
        print("# %-18s %d scalars: %8.1f us per step" % (what, n, us))
        result("optim.%s.us.torch" % key, us)
        if key == "sgd":  # the norm of the same gradients, as clip_grad_norm_ takes it
            times = []
            for _ in range(7):
                t = now()
                for _ in range(steps):
                    torch.nn.utils.clip_grad_norm_(params, 1e30)
                times.append(now() - t)
            us = statistics.median(times) / steps * 1e6
            print("# %-18s %d scalars: %8.1f us per norm" % ("gradient norm", n, us))
            result("optim.clip.us.torch", us)


def bench_unary():
    rows, cols, iters = 256, 1024, 32
    x0 = 0.5 + (torch.arange(rows * cols) % 1000).float().reshape(rows, cols) * 0.001
    for name, f in (("exp", torch.exp), ("log", torch.log), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                    ("sin", torch.sin), ("softmax", lambda a: torch.softmax(a, 1))):
        for backward in (0, 1):
            def iteration():
                a = x0.detach().requires_grad_(True)
                y = f(a)
                if backward:
                    (y * a if name == "softmax" else y).sum().backward()
                return y

            for _ in range(iters):
                iteration()
            times = []
            for _ in range(7):
                t = now()
                for _ in range(iters):
                    iteration()
                times.append(now() - t)
            us = statistics.median(times) / iters * 1e6
            print("# %-8s %s: %8.1f us per iteration" % (name, "forward+backward" if backward else "forward", us))
            result("unary.%s.%s.us.torch" % (name, "train" if backward else "fwd"), us)


def read_idx(d, name):
    """The bytes of d/name, or of d/name.gz decompressed."""
    path = os.path.join(d, name)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    with gzip.open(path + ".gz", "rb") as f:
        return f.read()


def load_mnist():
    """(images [n, 784] float32 in [0, 1], labels [n] int64) from MNIST_DIR, or None."""
    d = os.environ.get("MNIST_DIR")
    if not d:
        return None
    try:
        img = read_idx(d, "train-images-idx3-ubyte")
        lab = read_idx(d, "train-labels-idx1-ubyte")
    except OSError:
        return None
    magic, count, rows, cols = struct.unpack(">IIII", img[:16])
    lmagic, lcount = struct.unpack(">II", lab[:8])
    if (magic != 0x803 or lmagic != 0x801 or rows != 28 or cols != 28 or lcount != count
            or len(img) < 16 + count * 784 or len(lab) < 8 + count):
        print("# %s: not MNIST IDX files" % d, file=sys.stderr)
        return None
    x = torch.frombuffer(bytearray(img[16:16 + count * 784]), dtype=torch.uint8).reshape(count, 784)
    y = torch.frombuffer(bytearray(lab[8:8 + count]), dtype=torch.uint8).long()
    return x.float() / 255.0, y


def bench_mlp(spec):
    widths = [int(w) for w in spec.split(",")]
    epochs = max(1, min(64, int(os.environ.get("BENCH_EPOCHS", "1"))))
    batch, lr = 64, 0.1
    data = load_mnist()
    real = data is not None
    torch.manual_seed(7)
    if data is None:
        data = (torch.rand(60000, 784), torch.randint(0, 10, (60000,)))
    x, y = data
    n = x.shape[0]
    torch.manual_seed(1)
    layers = []
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        bound = math.sqrt(6.0 / widths[i])
        torch.nn.init.uniform_(lin.weight, -bound, bound)
        torch.nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    print("# MLP %s, %s (%d images), batch %d, SGD lr %g, %d epoch(s), %d thread(s)"
          % (spec, "MNIST" if real else "synthetic data", n, batch, lr, epochs, THREADS))
    times, loss_sum = [], 0.0
    for e in range(epochs):
        perm = torch.randperm(n)
        loss_sum = 0.0
        t0 = now()
        for s in range(0, n, batch):
            idx = perm[s:s + batch]
            xb, yb = x[idx], y[idx]
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
        times.append(now() - t0)
        print("# epoch %d: %.3f s, mean train loss %.4f" % (e + 1, times[-1], loss_sum / n), flush=True)
    name = spec.replace(",", "-")
    result("mlp.%s.loss.torch" % name, loss_sum / n)
    result("mlp.%s.s_epoch.torch" % name, statistics.median(times))


def bench_cnn():
    """The CNN of bench/cnn.c: conv5x5(1-8)-ReLU-pool-conv5x5(8-16)-ReLU-pool-linear, SGD 0.05."""
    epochs = max(1, min(64, int(os.environ.get("BENCH_EPOCHS", "1"))))
    batch, lr = 64, 0.05
    data = load_mnist()
    real = data is not None
    torch.manual_seed(7)
    if data is None:
        data = (torch.rand(60000, 784), torch.randint(0, 10, (60000,)))
    x, y = data
    x = x.reshape(-1, 1, 28, 28)
    n = x.shape[0]
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    print("# CNN, %s (%d images), batch %d, SGD lr %g, %d epoch(s), %d thread(s)"
          % ("MNIST" if real else "synthetic data", n, batch, lr, epochs, THREADS))
    times, loss_sum = [], 0.0
    for e in range(epochs):
        perm = torch.randperm(n)
        loss_sum = 0.0
        t0 = now()
        for s in range(0, n, batch):
            idx = perm[s:s + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
        times.append(now() - t0)
        print("# epoch %d: %.3f s, mean train loss %.4f" % (e + 1, times[-1], loss_sum / n), flush=True)
    result("cnn.loss.torch", loss_sum / n)
    result("cnn.s_epoch.torch", statistics.median(times))


# ---- character-level language models (bench/gpt.c) ----------------------------------------------
# nanoGPT's model.py as it runs on torch 1.13, in the configuration of bench/gpt.c: no biases, and
# no dropout modules (the CPU recipe of shakespeare_char sets dropout 0).


class LayerNorm(torch.nn.Module):
    """nanoGPT's LayerNorm: a weight and an optional bias (none here)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(ndim))
        self.bias = torch.nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = torch.nn.Linear(n_embd, n_embd, bias=False)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # torch 1.13 has no scaled_dot_product_attention: nanoGPT's "slow attention"
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(torch.nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = torch.nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.gelu = torch.nn.GELU()
        self.c_proj = torch.nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(torch.nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=False)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = LayerNorm(n_embd, bias=False)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(torch.nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab_size, n_embd),
            wpe=torch.nn.Embedding(block_size, n_embd),
            h=torch.nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias=False)))
        self.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class CharLSTM(torch.nn.Module):
    def __init__(self, vocab_size, n_embd, n_layer):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, n_embd)
        self.lstm = torch.nn.LSTM(n_embd, n_embd, num_layers=n_layer, batch_first=True)
        self.head = torch.nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets, state):
        y, state = self.lstm(self.emb(idx), state)
        logits = self.head(y)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)), state


def adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1):
    """nanoGPT's configure_optimizers: matrices decayed, vectors not."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def flop_gpt_step(vocab, n_layer, n_embd, batch, length):
    """Floating-point operations of a GPT step as bench/gpt.c counts them: 2 M N K per matrix
    product (weights, Q K^T and P V over the whole L x L square, the output layer), times 3 for
    forward and backward."""
    n, c = batch * length, n_embd
    return 3 * (n_layer * (24 * n * c * c + 4 * batch * length * length * c) + 2 * n * c * vocab)


def bench_charlm(kind, steps):
    """A training step of the GPT or the LSTM of bench/gpt.c on random tokens (fixed seed, the same
    batch every step): forward, cross-entropy, backward, clip at 1.0, AdamW step, zero_grad."""
    warmup = 3
    vocab = 65
    torch.manual_seed(1337)
    if kind == "gpt":
        batch, length, n_layer, n_head, n_embd = 12, 64, 4, 4, 128
        model = GPT(vocab, length, n_layer, n_head, n_embd)
        what = "GPT %d layers, %d heads, embedding %d" % (n_layer, n_head, n_embd)
    else:
        batch, length, n_layer, n_embd = 32, 64, 2, 256
        model = CharLSTM(vocab, n_embd, n_layer)
        what = "LSTM %d layers of %d" % (n_layer, n_embd)
    model.train()
    opt = adamw(model)
    gen = torch.Generator().manual_seed(42)
    x = torch.randint(0, vocab, (batch, length), generator=gen)
    y = torch.randint(0, vocab, (batch, length), generator=gen)
    nparams = sum(p.numel() for p in model.parameters())
    print("# %s, vocabulary %d, batch %d, length %d, %d parameters, %d thread(s)"
          % (what, vocab, batch, length, nparams, THREADS))
    state = None
    if kind == "lstm":
        state = (torch.zeros(n_layer, batch, n_embd), torch.zeros(n_layer, batch, n_embd))
    times, walls, loss0 = [], [], 0.0
    for s in range(warmup + steps):
        t0, w0 = now(), time.perf_counter()
        if kind == "gpt":
            loss = model(x, y)
        else:
            # truncated backpropagation through time: the state enters as a constant
            loss, state = model(x, y, (state[0].detach(), state[1].detach()))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s == 0:
            loss0 = loss.item()
        if s >= warmup:
            times.append(now() - t0)
            walls.append(time.perf_counter() - w0)
    tok = batch * length / statistics.median(times)
    print("# first loss %.4f (ln %d = %.4f), %.1f ms per step, %.0f tokens/s"
          % (loss0, vocab, math.log(vocab), 1e3 * batch * length / tok, tok))
    result("%s.tok_s.torch" % kind, tok)
    result("%s.tok_s_wall.torch" % kind, batch * length / statistics.median(walls))
    result("%s.loss0.torch" % kind, loss0)
    print("@ %s.params.torch %d" % (kind, nparams), flush=True)  # exact, where result keeps 6 digits
    if kind == "gpt":
        flop = flop_gpt_step(vocab, n_layer, n_embd, batch, length)
        print("# %.3f GFLOP per step (matrix products, forward and backward): %.1f GFLOP/s"
              % (flop * 1e-9, flop * tok / (batch * length) * 1e-9))
        result("gpt.gflops.torch", flop * tok / (batch * length) * 1e-9)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("gemm", "tape", "optim", "unary", "mlp", "cnn", "gpt", "lstm"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "gemm":
        bench_gemm(sys.argv[2:])
    elif sys.argv[1] == "tape":
        bench_tape()
    elif sys.argv[1] == "optim":
        bench_optim()
    elif sys.argv[1] == "unary":
        bench_unary()
    elif sys.argv[1] == "cnn":
        bench_cnn()
    elif sys.argv[1] in ("gpt", "lstm"):
        bench_charlm(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
    else:
        bench_mlp(sys.argv[2] if len(sys.argv) > 2 else "784,128,10")
    return 0


if __name__ == "__main__":
    sys.exit(main())
