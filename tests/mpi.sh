#!/usr/bin/env bash
# Data-parallel training over MPI (examples/mnist_mpi.c with examples/data_parallel.h), on the
# first 12,800 MNIST images:
#   - 2 processes train 200 steps with bitwise the same parameters (the hashes each prints
#     agree), and the same command run again prints the same hashes; summing the gradients in
#     buckets during the sweep or in one all-reduce after it gives the same parameters; with
#     bfloat16 products (--bf16) the ranks stay equal too;
#   - after 100 steps at global batch 64, the parameters of 2 and of 3 processes agree with
#     those of examples/mnist.c at batch 64 within a relative 4e-6 (float rounding: the sum of
#     the shares' weighted means is not computed in the one-process order; 3.9e-7 and 3.1e-7
#     on the machine this was written on), and 1 process writes the one-process checkpoint
#     byte for byte;
#   - a run of 2 processes stopped after an epoch and resumed ends with the checkpoint of one
#     that was not stopped, and examples/mnist.c resumes the same checkpoint;
#   - faults stop every process within the time limit, with a message that names the rank: a
#     rank that cannot read its data, one started with other arguments, and one that resumes
#     from a different checkpoint.
#   - the character-level GPT trains the same way (5. below; needs SHAKESPEARE_DIR).
# Needs MNIST_DIR, mpicc and mpirun (skipped without them). Environment: CC (default cc),
# MPICC (default mpicc), TEST_PROGRAMS (a folder where the programs are built already:
# tests/run.sh builds them once for every script).
set -u
cd "$(dirname "$0")/.."
if [ -z "${MNIST_DIR:-}" ] || [ ! -d "$MNIST_DIR" ]; then
    echo "mpi: skipped (set MNIST_DIR to the MNIST folder)"
    exit 0
fi
CC=${CC:-cc}
MPICC=${MPICC:-mpicc}
if ! command -v "$MPICC" >/dev/null || ! command -v mpirun >/dev/null; then
    echo "mpi: skipped (no $MPICC or mpirun; Debian: apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
OUT=$(pwd)/build/tests/mpi
mkdir -p "$OUT"
MNIST_DIR=$(cd "$MNIST_DIR" && pwd)
failed=0
fail() { echo "FAIL $1"; tail -8 "$OUT/last.log"; failed=$((failed + 1)); }

BIN=${TEST_PROGRAMS:-$OUT}
if [ -z "${TEST_PROGRAMS:-}" ]; then
    "$MPICC" -O2 -Wall -Wextra -pedantic -Werror examples/mnist_mpi.c -o "$OUT/mnist_mpi" -lm ||
        { echo "FAIL build examples/mnist_mpi.c with $MPICC"; exit 1; }
    $CC -O2 examples/mnist.c -o "$OUT/mnist" -lm || { echo "FAIL build examples/mnist.c"; exit 1; }
    $CC -O2 -I. tests/params_compare.c -o "$OUT/params_compare" -lm -lpthread ||
        { echo "FAIL build tests/params_compare.c"; exit 1; }
fi

LIMIT=120
read -ra FLAGS <<<"$(bash scripts/mpirun.sh --flags 3)"
# mpi NP ARGS...: the program on NP processes, its output in last.log, at most LIMIT seconds
mpi() {
    local np=$1; shift
    timeout "$LIMIT" mpirun "${FLAGS[@]}" -np "$np" "$BIN/mnist_mpi" --plot "$OUT/plot.svg" "$@" >"$OUT/last.log" 2>&1
}
one() { "$BIN/mnist" --data "$MNIST_DIR" --plot "$OUT/plot.svg" "$@" >"$OUT/last.log" 2>&1; }
# the parameter hashes of the last run, one line
hashes() { grep -E '^rank [0-9]+ parameters: ' "$OUT/last.log" | awk '{ print $4 }' | tr '\n' ' '; }
# same_hashes N [LAST]: the last run printed N hash lines, all equal, and its last line matches
# LAST (default: the accuracy)
same_hashes() {
    local n=$1 last=${2:-'^test accuracy: '} h
    h=$(hashes)
    [ "$(echo $h | wc -w)" = "$n" ] && [ "$(echo $h | tr ' ' '\n' | sort -u | wc -l)" = 1 ] &&
        tail -1 "$OUT/last.log" | grep -q "$last"
}

# 1. bitwise the same on every rank, run after run, bucketed or not
if mpi 2 --data "$MNIST_DIR" --limit 12800 --epochs 1 --checkpoint "$OUT/a.ckpt" && same_hashes 2; then
    first=$(hashes)
    if mpi 2 --data "$MNIST_DIR" --limit 12800 --epochs 1 --checkpoint "$OUT/b.ckpt" && [ "$(hashes)" = "$first" ]; then
        echo "mpi: 2 ranks, 200 steps: parameters bitwise equal on both ranks and in a second run ($first)"
    else
        fail "mpi: a second run printed other hashes: $(hashes), first $first"
    fi
    if mpi 2 --data "$MNIST_DIR" --limit 12800 --epochs 1 --checkpoint "$OUT/b.ckpt" --no-overlap &&
        [ "$(hashes)" = "$first" ]; then
        echo "mpi: one all-reduce after the sweep gives the parameters of the buckets started during it"
    else
        fail "mpi: --no-overlap printed other hashes: $(hashes), buckets $first"
    fi
    if mpi 2 --data "$MNIST_DIR" --limit 12800 --epochs 1 --checkpoint "$OUT/b.ckpt" --bf16 && same_hashes 2; then
        echo "mpi: with bfloat16 products too: $(hashes)"
    else
        fail "mpi: --bf16 on 2 ranks did not end with equal parameters"
    fi
else
    fail "mpi: 2 ranks did not end with equal parameters"
fi

# 2. the same training as one process
one --limit 6400 --epochs 1 --checkpoint "$OUT/one.ckpt" || fail "mpi: examples/mnist.c --limit 6400"
for np in 2 3; do
    if mpi "$np" --data "$MNIST_DIR" --limit 6400 --epochs 1 --checkpoint "$OUT/np$np.ckpt" && same_hashes "$np" &&
        "$BIN/params_compare" "$OUT/one.ckpt" "$OUT/np$np.ckpt" 4e-6 >"$OUT/compare.log"; then
        echo "mpi: $np ranks against one process after 100 steps: $(cat "$OUT/compare.log")"
    else
        cat "$OUT/compare.log" 2>/dev/null
        fail "mpi: $np ranks do not train as one process does"
    fi
done
if mpi 1 --data "$MNIST_DIR" --limit 6400 --epochs 1 --checkpoint "$OUT/np1.ckpt" && cmp -s "$OUT/one.ckpt" "$OUT/np1.ckpt"; then
    echo "mpi: 1 rank writes the checkpoint of examples/mnist.c byte for byte"
else
    fail "mpi: 1 rank and examples/mnist.c wrote different checkpoints"
fi

# 3. stopped and resumed on 2 ranks; resumed by the one-process program
if mpi 2 --data "$MNIST_DIR" --limit 3200 --epochs 2 --checkpoint "$OUT/straight.ckpt" &&
    mpi 2 --data "$MNIST_DIR" --limit 3200 --epochs 2 --stop-after 1 --checkpoint "$OUT/resumed.ckpt" &&
    grep -q 'stopped after epoch 1 of 2' "$OUT/last.log" &&
    mpi 2 --data "$MNIST_DIR" --resume "$OUT/resumed.ckpt" && grep -q 'resumed from .* after epoch 1' "$OUT/last.log" &&
    same_hashes 2 && cmp -s "$OUT/straight.ckpt" "$OUT/resumed.ckpt"; then
    echo "mpi: a run of 2 ranks stopped and resumed ends byte-identical to one that was not"
else
    fail "mpi: stop and resume on 2 ranks"
fi
if one --resume "$OUT/resumed.ckpt" --epochs 3 --checkpoint "$OUT/by_one.ckpt" &&
    grep -q 'resumed from .* after epoch 2' "$OUT/last.log" && tail -1 "$OUT/last.log" | grep -q '^test accuracy: '; then
    echo "mpi: examples/mnist.c resumes the checkpoint of 2 ranks"
else
    fail "mpi: examples/mnist.c could not resume the checkpoint of 2 ranks"
fi

# 4. faults: every rank stops, within the limit, and the failing rank says who it is and why.
# Rank 1 runs in a folder of its own, so that a relative path names something else there.
mkdir -p "$OUT/rank0" "$OUT/rank1"
ln -sfn "$MNIST_DIR" "$OUT/rank0/mnist"
rm -f "$OUT/rank1/mnist"
one --limit 640 --epochs 1 --seed 1 --checkpoint "$OUT/rank0/run.ckpt" &&
    one --limit 640 --epochs 1 --seed 2 --checkpoint "$OUT/rank1/run.ckpt" || fail "mpi: examples/mnist.c --limit 640"
ln -sfn "$MNIST_DIR" "$OUT/rank1/data"
ln -sfn "$MNIST_DIR" "$OUT/rank0/data"
# mpmd "ARGS OF RANK 0" "ARGS OF RANK 1": two ranks with arguments of their own, in their folders
mpmd() {
    local t0=$SECONDS rc
    timeout "$LIMIT" mpirun "${FLAGS[@]}" -np 1 -wdir "$OUT/rank0" "$BIN/mnist_mpi" --plot plot.svg $1 \
        : -np 1 -wdir "$OUT/rank1" "$BIN/mnist_mpi" --plot plot.svg $2 >"$OUT/last.log" 2>&1
    rc=$?
    elapsed=$((SECONDS - t0))
    return $rc
}
# check_fault NAME PATTERN STATUS: the last mpmd failed before the limit, saying PATTERN
check_fault() {
    local name=$1 pattern=$2 rc=$3
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q -- "$pattern" "$OUT/last.log"; then
        echo "mpi: $name: every rank stopped after ${elapsed} s: $(grep -m1 -- "$pattern" "$OUT/last.log")"
    else
        fail "mpi: $name (status $rc, ${elapsed} s; expected a message like '$pattern')"
    fi
}
mpmd "--data mnist --limit 640 --epochs 1 --checkpoint c.ckpt" "--data mnist --limit 640 --epochs 1 --checkpoint c.ckpt"
check_fault "a rank without its data" "^rank 1: .*mnist/train-images-idx3-ubyte" $?
mpmd "--data data --limit 640 --epochs 1 --lr 0.05" "--data data --limit 640 --epochs 1 --lr 0.1"
check_fault "a rank with other arguments" "^rank 1: its arguments differ from rank 0's: argument [0-9]* is '--lr 0.1' where rank 0's is '--lr 0.05'" $?
mpmd "--data data --resume run.ckpt --epochs 3" "--data data --resume run.ckpt --epochs 3"
check_fault "a rank that resumes another checkpoint" "^rank 1: its model, optimizer and run state differs from rank 0's" $?

# 5. the character-level GPT of examples/shakespeare.c, 30 steps on the first 200,000
#    characters: bitwise equal parameters on 2 ranks, within a relative 5e-5 of one process
#    (AdamW divides by the gradients' running scale, so their rounding weighs more than under
#    SGD: 5.2e-6 on the machine this was written on), the one-process checkpoint from 1 rank,
#    a stop and resume byte-identical to a run that did not stop, and the recurrent models
#    refused (needs SHAKESPEARE_DIR)
if [ -n "${SHAKESPEARE_DIR:-}" ] && [ -f "$SHAKESPEARE_DIR/input.txt" ]; then
    if [ -z "${TEST_PROGRAMS:-}" ]; then
        "$MPICC" -O2 -Wall -Wextra -pedantic -Werror examples/shakespeare_mpi.c -o "$OUT/shakespeare_mpi" -lm ||
            { echo "FAIL build examples/shakespeare_mpi.c with $MPICC"; exit 1; }
        $CC -O2 examples/shakespeare.c -o "$OUT/shakespeare" -lm || { echo "FAIL build examples/shakespeare.c"; exit 1; }
    fi
    GPT=(--data "$SHAKESPEARE_DIR" --limit 200000 --iters 30 --eval-interval 10 --eval-batches 4 --final-batches 8
         --sample-chars 40 --quiet --plot "$OUT/plot.svg")
    gpt() {
        local np=$1; shift
        timeout "$LIMIT" mpirun "${FLAGS[@]}" -np "$np" "$BIN/shakespeare_mpi" "$@" >"$OUT/last.log" 2>&1
    }
    "$BIN/shakespeare" "${GPT[@]}" --checkpoint "$OUT/gpt_one.ckpt" >"$OUT/last.log" 2>&1 || fail "mpi: examples/shakespeare.c"
    if gpt 2 "${GPT[@]}" --checkpoint "$OUT/gpt_np2.ckpt" && same_hashes 2 '^val loss: '; then
        if "$BIN/params_compare" "$OUT/gpt_one.ckpt" "$OUT/gpt_np2.ckpt" 5e-5 >"$OUT/compare.log"; then
            echo "mpi: GPT, 2 ranks against one process after 30 steps: $(cat "$OUT/compare.log")"
        else
            cat "$OUT/compare.log"; fail "mpi: the GPT on 2 ranks does not train as on one process"
        fi
    else
        fail "mpi: the GPT on 2 ranks did not end with equal parameters"
    fi
    if gpt 1 "${GPT[@]}" --checkpoint "$OUT/gpt_np1.ckpt" && cmp -s "$OUT/gpt_one.ckpt" "$OUT/gpt_np1.ckpt"; then
        echo "mpi: GPT, 1 rank writes the checkpoint of examples/shakespeare.c byte for byte"
    else
        fail "mpi: GPT, 1 rank and examples/shakespeare.c wrote different checkpoints"
    fi
    if gpt 2 "${GPT[@]}" --checkpoint "$OUT/gpt_stopped.ckpt" --stop-after 20 &&
        gpt 2 --data "$SHAKESPEARE_DIR" --quiet --plot "$OUT/plot.svg" --sample-chars 40 --resume "$OUT/gpt_stopped.ckpt" &&
        cmp -s "$OUT/gpt_np2.ckpt" "$OUT/gpt_stopped.ckpt"; then
        echo "mpi: GPT, a run of 2 ranks stopped and resumed ends byte-identical to one that was not"
    else
        fail "mpi: GPT, stop and resume on 2 ranks"
    fi
    if ! gpt 2 "${GPT[@]}" --model lstm && grep -q -- '--model lstm trains on one process' "$OUT/last.log"; then
        echo "mpi: GPT, the recurrent models are refused: $(grep -m1 -- '--model lstm' "$OUT/last.log")"
    else
        fail "mpi: GPT, --model lstm on 2 ranks was not refused"
    fi
else
    echo "mpi: the GPT's checks skipped (set SHAKESPEARE_DIR to the folder of Tiny Shakespeare's input.txt)"
fi

[ "$failed" -eq 0 ]
