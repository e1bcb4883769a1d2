#!/usr/bin/env bash
# The character-level models of examples/shakespeare.c on a slice of Tiny Shakespeare:
#   - the GPT (nanoGPT's shape, 4 layers, 4 heads, 128 wide) learns: 300 steps on the first
#     200,000 characters bring the validation loss (40 batches) below 2.55 nats per character,
#     from ln 61 = 4.11 for a model that knows nothing (the slice has 61 distinct characters)
#     and 3.3 for one that knows only how often each character occurs (2.42 on the machine
#     this was written on);
#   - the LSTM and the GRU learn too: 150 steps of a 2 x 128 model end below 2.65 (2.44 and
#     2.25 there);
#   - training is deterministic: 1 and 2 threads write byte-identical checkpoints, for the GPT
#     and for the LSTM;
#   - a run stopped (--stop-after) and continued (--resume) ends with the checkpoint, byte for
#     byte, of a run that never stopped, for the GPT and for the LSTM (whose carried state is
#     part of the run); a resume with an option that defines the run, with another text, or
#     from a file without a run is refused, and one of a run that has ended changes nothing;
#   - --sample-only rebuilds a saved model and prints the characters asked for;
#   - a damaged checkpoint is refused with the reason.
# Needs SHAKESPEARE_DIR (the folder of input.txt; skipped without it). Environment: CC (default cc);
# TEST_PROGRAMS, a folder where the examples are built already (tests/run.sh builds them once).
set -u
cd "$(dirname "$0")/.."
if [ -z "${SHAKESPEARE_DIR:-}" ] || [ ! -f "$SHAKESPEARE_DIR/input.txt" ]; then
    echo "shakespeare: skipped (set SHAKESPEARE_DIR to the folder of Tiny Shakespeare's input.txt)"
    exit 0
fi
CC=${CC:-cc}
OUT=build/tests/shakespeare
mkdir -p "$OUT"
failed=0
BIN=${TEST_PROGRAMS:-$OUT}
if [ -z "${TEST_PROGRAMS:-}" ]; then
    $CC -O2 examples/shakespeare.c -o "$OUT/shakespeare" -lm || { echo "FAIL build examples/shakespeare.c"; exit 1; }
fi
run() { "$BIN/shakespeare" --data "$SHAKESPEARE_DIR" --limit 200000 --quiet --plot "$OUT/plot.svg" "$@" >"$OUT/last.log" 2>&1; }
# a resumed run takes its options from the checkpoint: only the data, the plot and the sample
resume() { "$BIN/shakespeare" --data "$SHAKESPEARE_DIR" --quiet --plot "$OUT/plot.svg" "$@" >"$OUT/last.log" 2>&1; }
fail() { echo "FAIL $1"; tail -5 "$OUT/last.log"; failed=$((failed + 1)); }

# "val loss: X" of the last run is below $1
below() { awk -v bound="$1" '/^val loss: / { v = $3 } END { exit !(v != "" && v < bound) }' "$OUT/last.log"; }
last_loss() { awk '/^val loss: / { print $3 }' "$OUT/last.log"; }

if run --iters 300 --warmup 30 --eval-interval 100 --eval-batches 10 --final-batches 40 --sample-chars 0 \
       --checkpoint "$OUT/gpt.ckpt" && below 2.55; then
    echo "shakespeare: GPT, 300 steps: val loss $(last_loss) < 2.55"
else
    fail "GPT training: val loss $(last_loss), bound 2.55"
fi
for model in lstm gru; do
    if run --model "$model" --embd 128 --iters 150 --warmup 15 --eval-interval 150 --eval-batches 5 \
           --final-batches 40 --sample-chars 0 --checkpoint "$OUT/$model.ckpt" && below 2.65; then
        echo "shakespeare: $model, 150 steps: val loss $(last_loss) < 2.65"
    else
        fail "$model training: val loss $(last_loss), bound 2.65"
    fi
done

for model in gpt lstm; do
    for threads in 1 2; do
        run --model "$model" --embd 64 --heads 2 --layers 2 --iters 12 --eval-interval 6 --eval-batches 2 \
            --final-batches 2 --sample-chars 20 --threads "$threads" --checkpoint "$OUT/$model.t$threads.ckpt" ||
            fail "$model with $threads threads"
    done
    if cmp -s "$OUT/$model.t1.ckpt" "$OUT/$model.t2.ckpt"; then
        echo "shakespeare: $model: 1 and 2 threads write byte-identical checkpoints"
    else
        fail "$model: 1 and 2 threads trained differently"
    fi
done

for model in gpt lstm; do
    small=(--model "$model" --embd 64 --heads 2 --layers 2 --iters 40 --eval-interval 15 --eval-batches 2
           --final-batches 3 --sample-chars 30)
    if run "${small[@]}" --checkpoint "$OUT/straight.ckpt" && cp "$OUT/last.log" "$OUT/straight.log" &&
        run "${small[@]}" --checkpoint "$OUT/resumed.ckpt" --stop-after 22 &&
        grep -q 'stopped after step 22 of 40' "$OUT/last.log" && cp "$OUT/resumed.ckpt" "$OUT/stopped_$model.ckpt" &&
        resume --resume "$OUT/resumed.ckpt" --sample-chars 30 && grep -q 'resumed from .* after step 22' "$OUT/last.log" &&
        cmp -s "$OUT/straight.ckpt" "$OUT/resumed.ckpt" && [ "$(tail -1 "$OUT/last.log")" = "$(tail -1 "$OUT/straight.log")" ]; then
        echo "shakespeare: $model stopped at step 22 and resumed: byte-identical checkpoint, same $(tail -1 "$OUT/last.log")"
    else
        fail "$model resume"
    fi
done
if resume --resume "$OUT/resumed.ckpt" --lr 0.01; then
    fail "a resume with --lr was accepted"
elif grep -q -- '--resume continues the saved run with its own options; leave out --lr' "$OUT/last.log"; then
    echo "shakespeare: a resume with an option of its own is refused"
else
    fail "resume with --lr: $(tail -1 "$OUT/last.log")"
fi
sed '1s/First/Frist/' "$SHAKESPEARE_DIR/input.txt" >"$OUT/other.txt"
if "$BIN/shakespeare" --data "$OUT/other.txt" --quiet --resume "$OUT/stopped_gpt.ckpt" >"$OUT/last.log" 2>&1; then
    fail "a resume on another text was accepted"
elif grep -q 'is not the text the run in' "$OUT/last.log"; then
    echo "shakespeare: a resume on another text is refused"
else
    fail "resume on another text: $(tail -1 "$OUT/last.log")"
fi
cp "$OUT/resumed.ckpt" "$OUT/ended.ckpt"
if resume --resume "$OUT/ended.ckpt" && grep -q 'has ended (step 40 of 40)' "$OUT/last.log" &&
    [ "$(tail -1 "$OUT/last.log")" = "$(tail -1 "$OUT/straight.log")" ] && cmp -s "$OUT/ended.ckpt" "$OUT/resumed.ckpt"; then
    echo "shakespeare: a resume of a run that has ended reports its last estimate and leaves the checkpoint alone"
else
    fail "resume of an ended run"
fi
printf 'not a checkpoint' >"$OUT/junk.ckpt"
if resume --resume "$OUT/junk.ckpt"; then
    fail "a resume from a file that is no checkpoint was accepted"
elif grep -q 'cannot resume' "$OUT/last.log"; then
    echo "shakespeare: a resume from a file that is no checkpoint is refused: $(head -1 "$OUT/last.log")"
else
    fail "resume from junk: $(tail -1 "$OUT/last.log")"
fi

if "$BIN/shakespeare" --sample-only "$OUT/gpt.ckpt" --sample-chars 200 --start "ROMEO:" >"$OUT/last.log" 2>&1 &&
    [ "$(tail -n +2 "$OUT/last.log" | wc -c)" -eq 207 ]; then
    echo "shakespeare: --sample-only prints the start and 200 characters"
else
    fail "--sample-only"
fi
head -c 3000 "$OUT/gpt.ckpt" >"$OUT/cut.ckpt"
if "$BIN/shakespeare" --sample-only "$OUT/cut.ckpt" >"$OUT/last.log" 2>&1; then
    fail "a truncated checkpoint was accepted"
elif grep -q 'cannot load' "$OUT/last.log"; then
    echo "shakespeare: a truncated checkpoint is refused: $(head -1 "$OUT/last.log")"
else
    fail "truncated checkpoint: $(head -1 "$OUT/last.log")"
fi
[ "$failed" -eq 0 ]
