#!/usr/bin/env bash
# Compares the working tree's autodiff.h with the one at a git revision in one process: both
# implementations are built into one program (bench/pair_work.c twice, with AUTODIFF_STATIC) and
# bench/pair.c times them alternately, round by round, so that the noise of a shared machine
# falls on both alike. Finer than bench/compare.sh, which runs the two builds as separate
# processes: differences of a few percent show here when they drown there. Run the same header
# against itself (REV = HEAD on a clean tree) to see the noise floor of the moment.
#
# Usage: bash bench/pair.sh [REV [WORK...]]   (REV default HEAD~1; WORK of tape, cnn, conv, mlp,
#                                              gemm, gpt, clip, norm; default the first six)
# Prints one line per work: the best round of each side per step, the median over rounds of old
# time / new time (above 1: the working tree is faster) with its quartiles, and whether the two
# computed the same bits.
# Environment: CC (default cc), built with -O2 as bench/run.sh builds; PAIR_STEPS and PAIR_ROUNDS
# (defaults: per work, and 30); PAIR_GEMM_SIZE (default 1024), or PAIR_GEMM_SHAPE="M,N,K,ta,tb" for
# a product of another shape; PAIR_THREADS (default 1): the threads of each build's tape, timed
# in wall-clock time when more than one.
set -u
cd "$(dirname "$0")/.." || exit 1
CC=${CC:-cc}
REV=${1:-HEAD~1}
shift $(($# > 0 ? 1 : 0))
WORKS=${*:-tape cnn conv mlp gemm gpt}
OUT=build/pair
mkdir -p "$OUT/old" "$OUT/new"
git show "$REV:autodiff.h" > "$OUT/old/autodiff.h" || { echo "pair: no autodiff.h at $REV"; exit 1; }
cp autodiff.h "$OUT/new/autodiff.h"
for side in old new; do
    # the side's header first: bench/pair_work.c includes "autodiff.h" from the include path
    $CC -O2 -Wall -Wextra -iquote "$OUT/$side" -DPAIR_ENTRY="pair_$side" -c bench/pair_work.c \
        -o "$OUT/$side/pair_work.o" || { echo "pair: cannot build against the $side header"; exit 1; }
done
$CC -O2 -Wall -Wextra bench/pair.c "$OUT/old/pair_work.o" "$OUT/new/pair_work.o" -o "$OUT/pair" -lm -lpthread ||
    exit 1
echo "autodiff.h at $REV (old) against the working tree (new), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null |
    cut -d: -f2 | sed 's/^ *//')"
status=0
for work in $WORKS; do
    AUTODIFF_THREADS=${PAIR_THREADS:-1} "$OUT/pair" "$work" "${PAIR_STEPS:-0}" "${PAIR_ROUNDS:-30}" || status=1
done
exit $status
