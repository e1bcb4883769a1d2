#!/usr/bin/env bash
# Compares the speed of autodiff.h in the working tree with autodiff.h at a git revision, to show
# whether a change lost speed. Builds every benchmark program in bench/ twice, once against each
# header, runs the two builds alternately on one thread and prints one markdown table of the
# autodiff.h rows: the median of each side, new/old, and each side's spread over its runs, also
# written to build/compare.md. Only autodiff.h differs between the two builds: both use the
# working tree's bench/*.c and bench/bench.h.
#
# Usage: bash bench/compare.sh [REV]    (REV: any git revision, default HEAD~1)
#
# The header at REV goes to build/compare/old/, the working tree's to build/compare/new/, each
# with its programs; the raw results go to build/compare/results.txt, the programs' commentary
# and the compiler's messages to build/compare/log.txt. A program that does not compile against
# one of the headers (the old one may lack API it uses) is left out with a note.
#
# Environment:
#   CC              compiler (default cc); programs are built as bench/run.sh builds them: -O2,
#                   no -march flags, autodiff.h alone (GEMM without OpenBLAS)
#   COMPARE_RUNS    runs of each build of each program (default 5); run r of the old and the new
#                   build follow each other, the old first in odd runs, the new first in even ones
#   COMPARE_SKIP    programs to leave out, of: gemm tape optim unary mlp cnn gpt (default none;
#                   "mlp cnn" leaves out the training epochs, about a third of the time)
#   COMPARE_CLOCK   cpu (default) or wall: cpu times the work in CPU time of the working thread
#                   (BENCH_CLOCK=cpu, see bench/bench.h), which a busy machine disturbs less
#   MNIST_DIR       folder with MNIST's train-* files (raw or .gz); else ../shared/data/mnist when
#                   it has them; else the MLP and CNN run on random data of the same size
# Every program runs with AUTODIFF_THREADS=1 and the arguments bench/run.sh gives it. With the
# defaults the whole comparison takes about 4 minutes on a 2-core machine (one of them building).
set -u
cd "$(dirname "$0")/.." || exit 1
CC=${CC:-cc}
REV=${1:-HEAD~1}
RUNS=${COMPARE_RUNS:-5}
SKIP=${COMPARE_SKIP:-}
CLOCK=${COMPARE_CLOCK:-cpu}
OUT=build/compare
RAW=$OUT/results.txt
LOG=$OUT/log.txt
NPROC=$(nproc 2>/dev/null || echo 1)
PROGRAMS="gemm tape optim unary mlp cnn gpt"
start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)

case $RUNS in ''|*[!0-9]*|0) echo "compare: COMPARE_RUNS must be a positive number" >&2; exit 1 ;; esac
case $CLOCK in cpu|wall) ;; *) echo "compare: COMPARE_CLOCK must be cpu or wall" >&2; exit 1 ;; esac
for p in $SKIP; do
    case " $PROGRAMS " in *" $p "*) ;; *) echo "compare: COMPARE_SKIP: no program $p (of: $PROGRAMS)" >&2; exit 1 ;; esac
done
if ! git rev-parse --verify -q "$REV^{commit}" >/dev/null; then
    echo "compare: $REV is not a revision of this repository" >&2
    exit 1
fi
rev_name=$(git rev-parse --short "$REV^{commit}")

# ---- headers -------------------------------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT/old" "$OUT/new"
: >"$RAW"
: >"$LOG"
if ! git show "$REV:autodiff.h" >"$OUT/old/autodiff.h" 2>>"$LOG"; then
    echo "compare: $REV has no autodiff.h" >&2
    exit 1
fi
# one copy taken now, so that edits made while the benchmarks run do not reach half the builds
cp autodiff.h "$OUT/new/autodiff.h" || exit 1
if cmp -s "$OUT/old/autodiff.h" "$OUT/new/autodiff.h"; then
    echo "compare: autodiff.h at $REV and in the working tree are the same; the table shows the noise" >&2
fi

# ---- build ---------------------------------------------------------------------------------------
# The programs include "autodiff.h" and "bench/bench.h": -I$OUT/old (or new) comes first, so it
# gives autodiff.h, and -I. after it gives bench/bench.h from the working tree.
CFLAGS="-O2 -Wall -Wextra"
LIBS="-lm -lpthread"
build() {
    local side=$1 p=$2
    $CC $CFLAGS -I"$OUT/$side" -I. "bench/$p.c" -o "$OUT/$side/$p" $LIBS >"$OUT/$side/$p.build.txt" 2>&1
}
BUILT=
NOTES=
for p in $PROGRAMS; do
    case " $SKIP " in *" $p "*) NOTES="$NOTES- $p: left out (COMPARE_SKIP).\n"; continue ;; esac
    echo "building $p against both headers" >&2
    if [ "$NPROC" -gt 1 ]; then
        build old "$p" & pid_old=$!
        build new "$p"; rc_new=$?
        wait $pid_old; rc_old=$?
    else
        build old "$p"; rc_old=$?
        build new "$p"; rc_new=$?
    fi
    for side in old new; do
        echo "== build $side/$p" >>"$LOG"
        cat "$OUT/$side/$p.build.txt" >>"$LOG"
        rm -f "$OUT/$side/$p.build.txt"
    done
    if [ $rc_old != 0 ] || [ $rc_new != 0 ]; then
        if [ $rc_old != 0 ] && [ $rc_new != 0 ]; then which="either header"
        elif [ $rc_old != 0 ]; then which="autodiff.h at $rev_name"
        else which="the working tree's autodiff.h"; fi
        echo "compare: bench/$p.c does not compile against $which; left out (see $LOG)" >&2
        NOTES="$NOTES- $p: left out, bench/$p.c does not compile against $which (see $LOG).\n"
        continue
    fi
    BUILT="$BUILT $p"
done
[ -n "$BUILT" ] || { echo "compare: no program to run" >&2; exit 1; }

# ---- data ----------------------------------------------------------------------------------------
has_mnist() { [ -e "$1/train-images-idx3-ubyte" ] || [ -e "$1/train-images-idx3-ubyte.gz" ]; }
if [ -z "${MNIST_DIR:-}" ] || ! has_mnist "$MNIST_DIR"; then
    if has_mnist ../shared/data/mnist; then
        MNIST_DIR=$(cd ../shared/data/mnist && pwd)
    else
        MNIST_DIR=
    fi
fi
export MNIST_DIR
export AUTODIFF_THREADS=1 BENCH_CLOCK=$CLOCK

# ---- runs ----------------------------------------------------------------------------------------
# one SIDE RUN NAME COMMAND...: runs a program, keeps its "@ key value" lines as
# "side run key value" in $RAW and everything else in $LOG
one() {
    local side=$1 r=$2 name=$3
    shift 3
    printf '  %-4s %-24s' "$side" "$name" >&2
    local t0
    t0=$(date +%s.%N)
    echo "== $side, run $r: $name" >>"$LOG"
    if ! "$@" >"$OUT/last.txt" 2>>"$LOG"; then
        echo "compare: $side $name failed (see $LOG)" >&2
    fi
    cat "$OUT/last.txt" >>"$LOG"
    awk -v s="$side" -v r="$r" '$1 == "@" { print s, r, $2, $3 }' "$OUT/last.txt" >>"$RAW"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%6.1f s\n", b - a }' >&2
}

for r in $(seq 1 "$RUNS"); do
    echo "run $r of $RUNS:$BUILT" >&2
    # the old build goes first in odd runs and second in even ones, so that neither side always
    # gets the moment after the other
    if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for p in $BUILT; do
        for side in $order; do
            case $p in
            mlp)
                one "$side" "$r" "mlp 784,128,10" "$OUT/$side/mlp" 784,128,10
                one "$side" "$r" "mlp 784,512,256,10" "$OUT/$side/mlp" 784,512,256,10
                ;;
            gpt)
                one "$side" "$r" "gpt step" "$OUT/$side/gpt" gpt 20
                one "$side" "$r" "lstm step" "$OUT/$side/gpt" lstm 20
                ;;
            *)
                one "$side" "$r" "$p" "$OUT/$side/$p"
                ;;
            esac
        done
    done
done

# ---- table ---------------------------------------------------------------------------------------
{
    [ "$REV" = "$rev_name" ] && old_name=$REV || old_name="$REV ($rev_name)"
    if git show HEAD:autodiff.h 2>/dev/null | cmp -s - "$OUT/new/autodiff.h"; then new_name="the working tree (as HEAD)"
    else new_name="the working tree (with changes not committed)"; fi
    echo "Speed of autodiff.h: old = $old_name, new = $new_name; one thread, $RUNS run(s) of each build."
    echo
    awk -v runs="$RUNS" '
    function sortv(a, n,    i, j, x) {
        for (i = 2; i <= n; i++) {
            x = a[i]
            for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]
            a[j + 1] = x
        }
    }
    # median, minimum and maximum of key k on side s, into m, lo, hi; returns the number of runs
    function stats(s, k,    n, v, r) {
        n = 0
        for (r = 1; r <= maxrun; r++) if ((s, r, k) in val) v[++n] = val[s, r, k]
        if (n == 0) return 0
        sortv(v, n)
        m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        lo = v[1]; hi = v[n]
        return n
    }
    function fmt(x) { return sprintf(x >= 100 ? "%.1f" : x >= 10 ? "%.2f" : x >= 1 ? "%.3f" : "%.4f", x) }
    function spread(n) { return n < 2 ? "-" : m > 0 ? sprintf("%.1f%%", 100 * (hi - lo) / m) : "-" }
    # unit and direction of a key: "GFLOP/s" bigger is better, times smaller is better
    function unit(k) {
        if (k ~ /^gemm\./) return "GFLOP/s"
        if (k ~ /\.tok_s\./) return "tokens/s"
        if (k ~ /\.us\./) return "us"
        if (k ~ /\.ns_op\./) return "ns/op"
        if (k ~ /\.ns_iter\./) return "ns/iter"
        if (k ~ /\.s_epoch\./) return "s/epoch"
        return ""
    }
    {
        val[$1, $2, $3] = $4
        if ($2 > maxrun) maxrun = $2
        if (!($3 in seen)) { seen[$3] = 1; keys[++nk] = $3 }
    }
    END {
        print "| benchmark | unit | old | new | new/old | old spread | new spread | verdict |"
        print "|---|---|---:|---:|---:|---:|---:|---|"
        for (i = 1; i <= nk; i++) {
            k = keys[i]
            u = unit(k)
            if (u == "" || k !~ /\.ours$/) continue
            label = k
            sub(/\.ours$/, "", label)
            no = stats("old", k); mo = m; lo_o = lo; hi_o = hi; so = spread(no)
            nn = stats("new", k); mn = m; lo_n = lo; hi_n = hi; sn = spread(nn)
            cell_o = no ? fmt(mo) : "-"
            cell_n = nn ? fmt(mn) : "-"
            ratio = (no && nn && mo > 0) ? sprintf("%.3f", mn / mo) : "-"
            verdict = "-"
            if (no >= 3 && nn >= 3) {
                # a verdict only where the ranges of the runs do not overlap
                if (lo_n > hi_o) verdict = (u == "GFLOP/s" || u == "tokens/s") ? "faster" : "slower"
                else if (hi_n < lo_o) verdict = (u == "GFLOP/s" || u == "tokens/s") ? "slower" : "faster"
                else verdict = "~"
            }
            printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, u, cell_o, cell_n, ratio, so, sn, verdict
        }
        print ""
        print "old, new: medians over the runs. new/old: ratio of the medians (GFLOP/s and tokens/s: above 1 is faster; times: below 1 is faster)."
        print "spread: (max - min) / median of that side'"'"'s runs."
        if (runs >= 3) {
            # with no change at all, the 2n runs fall in either order with equal chance, and the
            # ranges come apart in 2 of the C(2n, n) ways to share out the places
            p = 2
            for (i = 1; i <= runs; i++) p = p * i / (runs + i)
            printf "verdict: slower or faster where the ranges of the two sides do not overlap, ~ where they do; with no change a row gets a verdict by chance %.1f%% of the time.\n", 100 * p
        } else print "verdict: needs 3 runs or more (COMPARE_RUNS)."
        # the FMA loop of bench/gemm.c does not use autodiff.h: its drift between the two sides
        # shows what the machine did during the runs
        no = stats("old", "peak.gflops"); mo = m
        nn = stats("new", "peak.gflops"); mn = m
        if (no && nn && mo > 0)
            printf "Control: the FMA loop of bench/gemm.c (no autodiff.h code) ran at %.1f GFLOP/s in the old runs, %.1f in the new (new/old %.3f).\n", mo, mn, mn / mo
        # values that are not times but should agree between the builds
        split("tape.ops tape.dfda.ours tape.dfdb.ours", chk, " ")
        line = ""
        for (i = 1; i <= nk; i++) if (keys[i] ~ /\.(loss|loss0|params)\.ours$/) chk[4 + n4++] = keys[i]
        for (i = 1; i <= 3 + n4; i++) {
            if (!stats("old", chk[i])) continue
            mo = m
            if (!stats("new", chk[i])) continue
            if (mo != m) line = line sprintf("%s%s %g -> %g", line == "" ? "" : "; ", chk[i], mo, m)
        }
        if (line != "") print "Values that differ between the builds (old -> new): " line "."
    }' "$RAW"
    if [ -n "$NOTES" ]; then
        echo
        printf 'Left out:\n%b' "$NOTES"
    fi
    echo
    if [ "$CLOCK" = cpu ]; then echo "Clock: CPU time of the working thread."; else echo "Clock: wall time."; fi
    if [ -n "$MNIST_DIR" ]; then echo "MLP and CNN data: MNIST from $MNIST_DIR."
    else echo "MLP and CNN data: random, of MNIST's size (no MNIST_DIR)."; fi
    echo "Load average (1, 5, 15 min) at the start: ${load_start:-?}; at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null). Total time: $(( $(date +%s) - start )) s."
} >build/compare.md
echo
cat build/compare.md
