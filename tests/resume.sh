#!/usr/bin/env bash
# Exact resume of the MNIST examples: for the MLP and the CNN, with SGD and with Adam, and for the
# MLP with bfloat16 products, 2 epochs in one run and 1 epoch, stopped, then --resume to 2 epochs
# must write byte-identical checkpoints.
# Also: a resume whose options clash with the saved run, and one from a file without a run, are
# refused. Needs MNIST_DIR (skipped without it). Environment: CC (default cc); TEST_PROGRAMS, a
# folder where the examples are built already (tests/run.sh builds them once for every script).
set -u
cd "$(dirname "$0")/.."
if [ -z "${MNIST_DIR:-}" ] || [ ! -d "$MNIST_DIR" ]; then
    echo "resume: skipped (set MNIST_DIR to the MNIST folder)"
    exit 0
fi
CC=${CC:-cc}
OUT=build/tests/resume
mkdir -p "$OUT"
failed=0
BIN=${TEST_PROGRAMS:-$OUT}
if [ -z "${TEST_PROGRAMS:-}" ]; then
    for prog in mnist mnist_cnn; do
        $CC -O2 "examples/$prog.c" -o "$OUT/$prog" -lm || { echo "FAIL build $prog"; exit 1; }
    done
fi
run() { "$BIN/$1" --data "$MNIST_DIR" --limit 1500 --plot "$OUT/plot.svg" "${@:2}" >"$OUT/last.log" 2>&1; }
for prog in mnist mnist_cnn; do
    for optimizer in sgd adam; do
        name="$prog $optimizer"
        rm -f "$OUT/straight.ckpt" "$OUT/resumed.ckpt"
        if run "$prog" --optimizer "$optimizer" --epochs 2 --checkpoint "$OUT/straight.ckpt" &&
            run "$prog" --optimizer "$optimizer" --epochs 2 --stop-after 1 --checkpoint "$OUT/resumed.ckpt" &&
            grep -q 'stopped after epoch 1 of 2' "$OUT/last.log" &&
            run "$prog" --resume "$OUT/resumed.ckpt" --threads 1 &&
            grep -q 'resumed from .* after epoch 1' "$OUT/last.log" &&
            cmp -s "$OUT/straight.ckpt" "$OUT/resumed.ckpt"; then
            echo "resume $name: byte-identical checkpoints"
            cp "$OUT/straight.ckpt" "$OUT/$prog.ckpt"
        else
            echo "FAIL resume $name"; tail -5 "$OUT/last.log"; failed=$((failed + 1))
        fi
    done
done
# the MLP with bfloat16 products: resumed in bfloat16 from what the checkpoint says, and a
# resume of a float run with --bf16 refused
rm -f "$OUT/straight.ckpt" "$OUT/resumed.ckpt"
if run mnist --bf16 --epochs 2 --checkpoint "$OUT/straight.ckpt" &&
    run mnist --bf16 --epochs 2 --stop-after 1 --checkpoint "$OUT/resumed.ckpt" &&
    run mnist --resume "$OUT/resumed.ckpt" && grep -q 'bfloat16 products' "$OUT/last.log" &&
    cmp -s "$OUT/straight.ckpt" "$OUT/resumed.ckpt"; then
    echo "resume mnist --bf16: byte-identical checkpoints"
else
    echo "FAIL resume mnist --bf16"; tail -5 "$OUT/last.log"; failed=$((failed + 1))
fi
if run mnist --resume "$OUT/mnist.ckpt" --bf16; then
    echo "FAIL resume of a float run with --bf16 was accepted"; failed=$((failed + 1))
elif grep -q -- '--bf16 differs from the run saved in' "$OUT/last.log"; then
    echo "resume: --bf16 on a float run is refused"
else
    echo "FAIL resume: --bf16: $(tail -1 "$OUT/last.log")"; failed=$((failed + 1))
fi
if run mnist --resume "$OUT/mnist.ckpt" --batch 32; then
    echo "FAIL resume with a clashing --batch was accepted"; failed=$((failed + 1))
elif grep -q -- '--batch differs from the run saved in' "$OUT/last.log"; then
    echo "resume: a clashing option is refused"
else
    echo "FAIL resume: clashing option: $(tail -1 "$OUT/last.log")"; failed=$((failed + 1))
fi
if run mnist --resume "$OUT/mnist_cnn.ckpt"; then
    echo "FAIL resume of a CNN run by the MLP program was accepted"; failed=$((failed + 1))
elif grep -q 'holds a run of the CNN' "$OUT/last.log"; then
    echo "resume: a run of the other network is refused"
else
    echo "FAIL resume: other network: $(tail -1 "$OUT/last.log")"; failed=$((failed + 1))
fi
[ "$failed" -eq 0 ]
