"""nanoGPT's shakespeare_char CPU recipe in PyTorch, as the reference for examples/shakespeare.c.

The model is bench/torch_bench.py's GPT (nanoGPT's model.py for torch 1.13); the loop is
nanoGPT's train.py with the README's CPU options: context 64, batch 12, 4 layers, 4 heads,
embedding 128, no dropout, 2000 iterations of AdamW (lr 1e-3, betas 0.9 and 0.99, weight decay
0.1 on matrices, gradient clipping at 1.0), 100 warm-up iterations (nanoGPT's get_lr) and cosine
decay to 1e-4, losses estimated every 250 iterations on 20 batches. At the end both losses are
estimated again on 200 batches, as examples/shakespeare.c does; the last line is
"val loss: X.XXXX".

Run: /usr/bin/python3 bench/torch_shakespeare.py [--data DIR] [--seed N] [--threads N] [--iters N]
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import GPT, adamw  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/tinyshakespeare")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    path = args.data if args.data.endswith(".txt") else os.path.join(args.data, "input.txt")
    text = open(path, "rb").read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}
    block, batch, warmup, lr0, min_lr = 64, 12, 100, 1e-3, 1e-4

    def get_batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - block, (batch,))
        x = torch.stack([d[i:i + block] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block] for i in ix])
        return x, y

    def get_lr(it):
        if it < warmup:
            return lr0 * (it + 1) / (warmup + 1)
        if it > args.iters:
            return min_lr
        ratio = (it - warmup) / (args.iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr0 - min_lr)

    @torch.no_grad()
    def estimate_loss(iters):
        out = {}
        model.eval()
        for split in ("train", "val"):
            out[split] = sum(model(*get_batch(split)).item() for _ in range(iters)) / iters
        model.train()
        return out

    model = GPT(len(chars), block, 4, 4, 128)
    opt = adamw(model)
    print(f"{sum(p.numel() for p in model.parameters())} parameters, {args.threads} thread(s)", flush=True)
    start, trained = time.time(), 0.0
    for it in range(args.iters):
        if it % 250 == 0:
            losses = estimate_loss(20)
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        t0 = time.time()
        for group in opt.param_groups:
            group["lr"] = get_lr(it)
        loss = model(*get_batch("train"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        trained += time.time() - t0
    losses = estimate_loss(20)
    print(f"step {args.iters}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} (20 batches)")
    losses = estimate_loss(200)
    print(f"step {args.iters}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} (200 batches)")
    print(f"trained in {trained:.1f}s: {args.iters * batch * block / trained:.0f} tokens/s "
          f"({time.time() - start:.1f}s with the estimates)")
    print(f"val loss: {losses['val']:.4f}")


if __name__ == "__main__":
    main()
