#!/usr/bin/env bash
# Benchmarks autodiff.h side by side with OpenBLAS (GEMM) and PyTorch (GEMM, scalar tape,
# optimizer steps, elementwise functions, MLP and CNN epochs, training steps of a small GPT and
# of an LSTM language model), where installed, its fused recurrent cells against the same cells
# written with its other ops, and its products and epochs in bfloat16 against float32. Where MPI
# is installed (mpicc, mpirun), also MLP epochs trained data-parallel on 2 processes against 1
# process of 1 and of 2 threads. Builds the programs, runs each several times, interleaving ours
# and the peer's, and prints one table of medians, also written to build/bench.md. Raw results go
# to build/bench/results.txt, the programs' commentary (the training steps' arena peak among it)
# to build/bench/log.txt.
#
# Environment:
#   CC                compiler (default cc); programs are built with -O2 and no -march flags
#   MNIST_DIR         folder with MNIST's train-* files (raw or .gz); else ../shared/data/mnist
#                     when it has them; else the MLP runs on random data of the same size
#   BENCH_THREADS     thread counts to measure, one column group each (default "1"; "1 2" adds
#                     two-thread columns); each count is given to autodiff.h (AUTODIFF_THREADS
#                     and ad_set_threads), OpenBLAS (OPENBLAS_NUM_THREADS; 1 inside PyTorch's
#                     training runs, see below) and PyTorch (torch.set_num_threads). Several
#                     threads need otherwise idle cores.
#   BENCH_RUNS        runs of the GEMM, tape, optimizer and elementwise benchmarks (default 5)
#   BENCH_EPOCH_RUNS  runs of the MLP and CNN epochs (default 3)
#   BENCH_SEQ_RUNS    runs of the GPT and LSTM training steps (default 3; each run times 20 steps
#                     of ours and, PyTorch's being slower, 8 of its GPT and 4 of its LSTM)
#   BENCH_PEAK_GFLOPS the peak of one core in GFLOP/s, for the GPT step's share of it; default
#                     32 FLOP per cycle (two 256-bit FMA pipes of fp32) times the CPU's max MHz
#                     from lscpu; where lscpu gives none, the FMA loop of the GEMM runs, else
#                     32 FLOP per cycle at the "cpu MHz" of /proc/cpuinfo (the table says which)
#   BENCH_SKIP        programs to leave out, of: gemm tape optim unary rnn mlp cnn gpt lstm mpi
#                     (default none; "mlp cnn mpi" leaves out the epochs, the longest part)
#   BENCH_CLOCK       wall (default) or cpu: time single-thread rows in CPU time of the working
#                     thread, which a busy machine disturbs less (rows with more threads always
#                     use wall time)
#   PYTHON            a Python with torch (default: /usr/bin/python3 or python3, whichever has it)
set -u
cd "$(dirname "$0")/.." || exit 1
CC=${CC:-cc}
OUT=build/bench
RUNS=${BENCH_RUNS:-5}
EPOCH_RUNS=${BENCH_EPOCH_RUNS:-3}
SEQ_RUNS=${BENCH_SEQ_RUNS:-3}
SKIP=${BENCH_SKIP:-}
NPROC=$(nproc 2>/dev/null || echo 1)
THREADS=${BENCH_THREADS:-1}
mkdir -p "$OUT"
RAW=$OUT/results.txt
LOG=$OUT/log.txt
: > "$RAW"
: > "$LOG"
start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
CLOCK=${BENCH_CLOCK:-wall}

# ---- build ---------------------------------------------------------------------------------------
CFLAGS="-O2 -Wall -Wextra -I."
LIBS="-lm -lpthread"
for p in tape optim unary rnn mlp cnn gpt; do
    $CC $CFLAGS "bench/$p.c" -o "$OUT/$p" $LIBS || { echo "bench: cannot build bench/$p.c"; exit 1; }
done
BLAS=0
for dir in /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu /usr/include/openblas \
           /usr/include /usr/local/include /opt/homebrew/opt/openblas/include; do
    [ -e "$dir/cblas.h" ] || continue
    if $CC $CFLAGS -I"$dir" -DBENCH_CBLAS bench/gemm.c -o "$OUT/gemm" -lopenblas $LIBS >"$OUT/build_blas.log" 2>&1; then
        BLAS=1
        break
    fi
done
if [ $BLAS = 0 ]; then
    echo "bench: OpenBLAS not found (cblas.h and -lopenblas); GEMM runs without a peer"
    $CC $CFLAGS bench/gemm.c -o "$OUT/gemm" $LIBS || { echo "bench: cannot build bench/gemm.c"; exit 1; }
fi
# OpenBLAS picks its kernels by the CPU's model number, and one newer than its release falls back
# to the SSE3 kernels of a Pentium 4 ("Prescott"; OpenBLAS 0.3.21 on an Intel family 6 model 207
# ran its products at a fifth of its speed with kernels of the CPU's kind). PyTorch's products run
# on the same library. Then the peers get the kernels the CPU's features call for, through
# OPENBLAS_CORETYPE, and the table says so.
CORETYPE_NOTE=
if [ $BLAS = 1 ] && [ -z "${OPENBLAS_CORETYPE:-}" ] &&
    "$OUT/gemm" none 2>/dev/null | grep -q 'kernels for \(Prescott\|Core2\|Nehalem\|Katmai\|Banias\)'; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
    case " $flags " in
        *" avx512_bf16 "*) OPENBLAS_CORETYPE=Cooperlake ;;
        *" avx512f "*) OPENBLAS_CORETYPE=SkylakeX ;;
        *" avx2 "*) OPENBLAS_CORETYPE=Haswell ;;
    esac
    if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
        export OPENBLAS_CORETYPE
        CORETYPE_NOTE="OpenBLAS took this CPU for a Prescott (SSE3); its kernels for $OPENBLAS_CORETYPE were chosen with OPENBLAS_CORETYPE, for OpenBLAS and for PyTorch."
        echo "bench: $CORETYPE_NOTE"
    fi
fi
MPI=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    if mpicc $CFLAGS -DBENCH_MPI bench/mlp.c -o "$OUT/mlp_mpi" -lm >"$OUT/build_mpi.log" 2>&1; then
        MPI=1
    else
        echo "bench: cannot build bench/mlp.c with mpicc -DBENCH_MPI (see $OUT/build_mpi.log); no MPI rows"
    fi
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for cand in /usr/bin/python3 python3; do
        if command -v "$cand" >/dev/null && "$cand" -c 'import torch' >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi
if [ -n "$PY" ] && ! "$PY" -c 'import torch' >/dev/null 2>&1; then PY=; fi
[ -z "$PY" ] && echo "bench: no Python with torch; PyTorch columns stay empty"

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

# ---- runs ----------------------------------------------------------------------------------------
# one THREADS RUN NAME COMMAND...: runs a program, keeps its "@ key value" lines as
# "threads run key value" in $RAW and everything else in $LOG; nothing when the first word of
# NAME is in BENCH_SKIP
one() {
    local t=$1 r=$2 name=$3
    shift 3
    case " $SKIP " in *" ${name%% *} "*) return 0 ;; esac
    printf '  %-28s' "$name" >&2
    local t0
    t0=$(date +%s.%N)
    echo "== threads $t, run $r: $name" >>"$LOG"
    if ! "$@" >"$OUT/last.txt" 2>>"$LOG"; then
        echo "bench: $name failed (see $LOG)" >&2
    fi
    cat "$OUT/last.txt" >>"$LOG"
    awk -v t="$t" -v r="$r" '$1 == "@" { print t, r, $2, $3 }' "$OUT/last.txt" >>"$RAW"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%6.1f s\n", b - a }' >&2
}

for t in $THREADS; do
    export AUTODIFF_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t
    if [ "$CLOCK" = cpu ] && [ "$t" = 1 ]; then export BENCH_CLOCK=cpu; else export BENCH_CLOCK=wall; fi
    for r in $(seq 1 "$RUNS"); do
        echo "threads $t, run $r of $RUNS: GEMM, tape, optimizer steps, elementwise functions" >&2
        # alternate who goes first, so neither side always gets the quieter moment
        if [ $((r % 2)) = 1 ]; then order="ours torch"; else order="torch ours"; fi
        for who in $order; do
            if [ $who = ours ]; then
                # OpenBLAS's idle threads spin for about 2^28 cycles after each of its calls and
                # take a core from our next batch in the same process (our 2-thread products fell
                # from 185-195 to 120-160 GFLOP/s now and then); at its shortest timeout its own
                # figures were unchanged
                one "$t" "$r" "gemm (autodiff.h, OpenBLAS)" env OPENBLAS_THREAD_TIMEOUT=4 "$OUT/gemm"
                one "$t" "$r" "tape (autodiff.h)" "$OUT/tape"
                one "$t" "$r" "optim (autodiff.h)" "$OUT/optim"
                one "$t" "$r" "unary (autodiff.h)" "$OUT/unary"
                one "$t" "$r" "rnn lstm (autodiff.h)" "$OUT/rnn" lstm
                one "$t" "$r" "rnn gru (autodiff.h)" "$OUT/rnn" gru
                one "$t" "$r" "rnn lstm-layer (autodiff.h)" "$OUT/rnn" lstm-layer 32 256 256 64
                one "$t" "$r" "rnn gru-layer (autodiff.h)" "$OUT/rnn" gru-layer 32 256 256 64
            elif [ -n "$PY" ]; then
                one "$t" "$r" "gemm (torch.mm)" "$PY" bench/torch_bench.py gemm
                one "$t" "$r" "tape (PyTorch)" "$PY" bench/torch_bench.py tape
                one "$t" "$r" "optim (PyTorch)" "$PY" bench/torch_bench.py optim
                one "$t" "$r" "unary (PyTorch)" "$PY" bench/torch_bench.py unary
            fi
        done
    done
    # PyTorch trains with its own pool of $t threads, whose products call OpenBLAS from inside
    # that pool: OpenBLAS threads on top oversubscribe the cores (with 2 and 2 here, its epochs
    # took 3 times as long), so its training runs keep OpenBLAS to one thread.
    for r in $(seq 1 "$EPOCH_RUNS"); do
        echo "threads $t, run $r of $EPOCH_RUNS: MLP epochs" >&2
        if [ $((r % 2)) = 1 ]; then order="ours torch"; else order="torch ours"; fi
        for cfg in 784,128,10 784,512,256,10; do
            for who in $order; do
                if [ $who = ours ]; then
                    one "$t" "$r" "mlp $cfg (autodiff.h)" "$OUT/mlp" "$cfg"
                    one "$t" "$r" "mlp $cfg (autodiff.h, bfloat16)" env BENCH_BF16=1 "$OUT/mlp" "$cfg"
                elif [ -n "$PY" ]; then
                    one "$t" "$r" "mlp $cfg (PyTorch)" env OPENBLAS_NUM_THREADS=1 "$PY" bench/torch_bench.py mlp "$cfg"
                fi
            done
        done
        for who in $order; do
            if [ $who = ours ]; then
                one "$t" "$r" "cnn (autodiff.h)" "$OUT/cnn"
                one "$t" "$r" "cnn (autodiff.h, bfloat16)" env BENCH_BF16=1 "$OUT/cnn"
            elif [ -n "$PY" ]; then
                one "$t" "$r" "cnn (PyTorch)" env OPENBLAS_NUM_THREADS=1 "$PY" bench/torch_bench.py cnn
            fi
        done
    done
    # training steps of the character-level GPT and LSTM (bench/gpt.c), PyTorch's OpenBLAS kept
    # to one thread as in its epochs
    for r in $(seq 1 "$SEQ_RUNS"); do
        echo "threads $t, run $r of $SEQ_RUNS: GPT and LSTM training steps" >&2
        if [ $((r % 2)) = 1 ]; then order="ours torch"; else order="torch ours"; fi
        for model in gpt:8 lstm:4; do
            for who in $order; do
                if [ $who = ours ]; then
                    one "$t" "$r" "${model%:*} (autodiff.h)" "$OUT/gpt" "${model%:*}" 20
                elif [ -n "$PY" ]; then
                    one "$t" "$r" "${model%:*} (PyTorch)" env OPENBLAS_NUM_THREADS=1 "$PY" bench/torch_bench.py "${model%:*}" "${model#*:}"
                fi
            done
        done
    done
done

# data-parallel MLP epochs over MPI (bench/mlp.c built with -DBENCH_MPI), kept under the thread
# label "mpi": 1 process of 1 thread, of 2 threads, and 2 processes of 1 thread, whose gradients
# are summed in buckets during the sweep or in one all-reduce after it; before each run the FMA
# loop measures what 2 threads could gain at that moment
if [ $MPI = 1 ]; then
    for r in $(seq 1 "$EPOCH_RUNS"); do
        echo "run $r of $EPOCH_RUNS: MLP epochs over MPI" >&2
        one mpi "$r" "mpi ceiling (FMA loop, 2 threads)" env AUTODIFF_THREADS=2 "$OUT/gemm" peak
        for cfg in 784,128,10 784,512,256,10; do
            for how in 1:1 1:2 2:1 2:1:blocking; do
                IFS=: read -r np t blocking <<<"$how"
                one mpi "$r" "mpi $cfg ${np}x$t${blocking:+ $blocking}" env AUTODIFF_THREADS="$t" BENCH_CLOCK=wall \
                    BENCH_DP_OVERLAP=$([ -n "$blocking" ] && echo 0 || echo 1) \
                    bash scripts/mpirun.sh "$np" "$OUT/mlp_mpi" "$cfg"
            done
        done
    done
fi

# ---- table ---------------------------------------------------------------------------------------
# rows: label | our key | peer key | peer | hi (bigger is better), lo (smaller is better) or -
ROWS=$OUT/rows.txt
{
    for s in "sq256 256x256x256" "sq512 512x512x512" "sq1024 1024x1024x1024" "sq2048 2048x2048x2048" \
             "mlp_fwd1 MLP fwd x.W1 64x784.784x128" "mlp_fwd2 MLP fwd h.W2 64x128.128x10" \
             "mlp_gWt2 MLP bwd g.W2^T 64x10.10x128" "mlp_hTg2 MLP bwd h^T.g 128x64.64x10" \
             "mlp_xTg1 MLP bwd x^T.g 784x64.64x128" \
             "mlp2_fwd1 MLP2 fwd x.W1 64x784.784x512" "mlp2_fwd2 MLP2 fwd h1.W2 64x512.512x256" \
             "mlp2_gWt2 MLP2 bwd g.W2^T 64x256.256x512" "mlp2_hTg2 MLP2 bwd h1^T.g 512x64.64x256" \
             "mlp2_xTg1 MLP2 bwd x^T.g 784x64.64x512" \
             "gpt_attn GPT fwd x.W_attn 768x128.128x384" "gpt_fc GPT fwd x.W_fc 768x128.128x512" \
             "gpt_proj GPT fwd h.W_proj 768x512.512x128" "gpt_gWt_fc GPT bwd g.W_fc^T 768x512.512x128" \
             "gpt_gWt_proj GPT bwd g.W_proj^T 768x128.128x512" "gpt_xTg_fc GPT bwd x^T.g 128x768.768x512" \
             "gpt_xTg_proj GPT bwd h^T.g 512x768.768x128" "gpt_qkT GPT attention block q.k^T 32x32.32x32" \
             "thin_hWt one row h.W_hh^T 1x256.256x1024" "thin_xW one row x.W1 1x784.784x128" \
             "thin_hW2 one row h.W2 1x128.128x10" \
             "col_xw one column x.w 64x784.784x1" "col_xTg one column x^T.g 784x64.64x1"; do
        set -- $s
        key=$1; shift
        echo "GEMM $*, GFLOP/s|gemm.$key.ours|gemm.$key.openblas|OpenBLAS|hi"
    done
    for s in "sq256 256x256x256" "sq512 512x512x512" "sq1024 1024x1024x1024" "sq2048 2048x2048x2048" \
             "mlp_fwd1 MLP fwd 64x784.784x128" "mlp_fwd2 MLP fwd 64x128.128x10" \
             "mlp_gWt2 MLP bwd 64x10.10x128^T" "mlp_hTg2 MLP bwd 128x64^T.64x10" \
             "mlp_xTg1 MLP bwd 784x64^T.64x128" \
             "mlp2_fwd1 MLP2 fwd 64x784.784x512" "mlp2_fwd2 MLP2 fwd 64x512.512x256" \
             "mlp2_gWt2 MLP2 bwd 64x256.256x512^T" "mlp2_hTg2 MLP2 bwd 512x64^T.64x256" \
             "mlp2_xTg1 MLP2 bwd 784x64^T.64x512" \
             "gpt_attn GPT fwd 768x128.128x384" "gpt_fc GPT fwd 768x128.128x512" \
             "gpt_proj GPT fwd 768x512.512x128" "gpt_gWt_fc GPT bwd 768x512.512x128^T" \
             "gpt_gWt_proj GPT bwd 768x128.128x512^T" "gpt_xTg_fc GPT bwd 128x768^T.768x512" \
             "gpt_xTg_proj GPT bwd 512x768^T.768x128" "gpt_qkT GPT attention block 32x32.32x32^T" \
             "thin_hWt one row 1x256.1024x256^T" "thin_xW one row 1x784.784x128" \
             "thin_hW2 one row 1x128.128x10" \
             "col_xw one column 64x784.784x1" "col_xTg one column 784x64^T.64x1"; do
        set -- $s
        key=$1; shift
        echo "GEMM $*, GFLOP/s|gemm.$key.ours|gemm.$key.torch|torch.mm|hi"
    done
    for s in "sq512 512x512x512" "sq1024 1024x1024x1024" "sq2048 2048x2048x2048" \
             "mlp2_fwd1 MLP2 fwd x.W1 64x784.784x512" "mlp2_gWt2 MLP2 bwd g.W2^T 64x256.256x512" \
             "mlp2_xTg1 MLP2 bwd x^T.g 784x64.64x512" "thin_xW one row x.W1 1x784.784x128" \
             "col_xw one column x.w 64x784.784x1"; do
        set -- $s
        key=$1; shift
        echo "GEMM $*, bfloat16 products against float32, GFLOP/s|bf16.gemm.$key.ours|gemm.$key.ours|autodiff.h float32|hi"
    done
    echo "scalar tape f(a,b) on numbers (ad_num): record+backward+reset, ns/op|tape.ns_op.ours|tape.ns_op.torch|PyTorch|lo"
    echo "scalar tape f(a,b) on one-element tensors (ad_var), ns/op|tape.tensors.ns_op.ours|tape.ns_op.torch|PyTorch|lo"
    echo "SGD step, 535818 parameters (MLP 784-512-256-10), us|optim.sgd.us.ours|optim.sgd.us.torch|PyTorch|lo"
    echo "SGD momentum 0.9 step, same parameters, us|optim.momentum.us.ours|optim.momentum.us.torch|PyTorch|lo"
    echo "Adam step, same parameters, us|optim.adam.us.ours|optim.adam.us.torch|PyTorch|lo"
    echo "gradient norm (ad_clip_grad_norm, clip_grad_norm_), same parameters, us|optim.clip.us.ours|optim.clip.us.torch|PyTorch|lo"
    for f in exp log sigmoid tanh sin softmax; do
        echo "$f of 256x1024 floats, forward, us|unary.$f.fwd.us.ours|unary.$f.fwd.us.torch|PyTorch|lo"
        echo "$f of 256x1024 floats, forward+sum+backward, us|unary.$f.train.us.ours|unary.$f.train.us.torch|PyTorch|lo"
    done
    echo "MNIST MLP 784-128-10 epoch, s|mlp.784-128-10.s_epoch.ours|mlp.784-128-10.s_epoch.torch|PyTorch|lo"
    echo "MNIST MLP 784-512-256-10 epoch, s|mlp.784-512-256-10.s_epoch.ours|mlp.784-512-256-10.s_epoch.torch|PyTorch|lo"
    echo "MLP 784-128-10 last-epoch train loss|mlp.784-128-10.loss.ours|mlp.784-128-10.loss.torch|PyTorch|-"
    echo "MNIST CNN conv5x5(1-8)-pool-conv5x5(8-16)-pool-fc epoch, s|cnn.s_epoch.ours|cnn.s_epoch.torch|PyTorch|lo"
    echo "MLP 784-512-256-10 last-epoch train loss|mlp.784-512-256-10.loss.ours|mlp.784-512-256-10.loss.torch|PyTorch|-"
    echo "CNN last-epoch train loss|cnn.loss.ours|cnn.loss.torch|PyTorch|-"
    echo "MNIST MLP 784-128-10 epoch, bfloat16 products against float32, s|bf16.mlp.784-128-10.s_epoch.ours|mlp.784-128-10.s_epoch.ours|autodiff.h float32|lo"
    echo "MNIST MLP 784-512-256-10 epoch, bfloat16 products against float32, s|bf16.mlp.784-512-256-10.s_epoch.ours|mlp.784-512-256-10.s_epoch.ours|autodiff.h float32|lo"
    echo "MNIST CNN epoch, bfloat16 products against float32, s|bf16.cnn.s_epoch.ours|cnn.s_epoch.ours|autodiff.h float32|lo"
    echo "MLP 784-512-256-10 last-epoch train loss, bfloat16 against float32|bf16.mlp.784-512-256-10.loss.ours|mlp.784-512-256-10.loss.ours|autodiff.h float32|-"
    echo "GPT step (4L 4H 128, B12 T64), tokens/s|gpt.tok_s.ours|gpt.tok_s.torch|PyTorch|hi"
    echo "GPT step, GFLOP/s of its matrix products (share of the FMA peak)|gpt.gflops.ours|gpt.gflops.torch|PyTorch|-"
    echo "GPT step, first loss (ln 65 = 4.1744)|gpt.loss0.ours|gpt.loss0.torch|PyTorch|-"
    echo "LSTM step (2x256, B32 T64), tokens/s|lstm.tok_s.ours|lstm.tok_s.torch|PyTorch|hi"
    echo "LSTM step, first loss|lstm.loss0.ours|lstm.loss0.torch|PyTorch|-"
    echo "LSTM cell N12 I128 H128, forward+backward, us|rnn.lstm.12-128-128-1.us_step.fused|rnn.lstm.12-128-128-1.us_step.composition|composition|lo"
    echo "GRU cell N12 I128 H128, forward+backward, us|rnn.gru.12-128-128-1.us_step.fused|rnn.gru.12-128-128-1.us_step.composition|composition|lo"
    echo "LSTM layer N32 I256 H256 over 64 steps, forward+backward, us per step|rnn.lstm-layer.32-256-256-64.us_step.fused|rnn.lstm-layer.32-256-256-64.us_step.composition|unrolled cells|lo"
    echo "GRU layer N32 I256 H256 over 64 steps, forward+backward, us per step|rnn.gru-layer.32-256-256-64.us_step.fused|rnn.gru-layer.32-256-256-64.us_step.composition|unrolled cells|lo"
} >"$ROWS"

# The peak of one core for the GPT step's share: BENCH_PEAK_GFLOPS; else 32 FLOP per cycle (two
# 256-bit FMA pipes, 8 fp32 lanes, 2 FLOP per FMA) at the CPU's max MHz from lscpu; where lscpu
# gives none (as in many virtual machines), the FMA loop of bench/gemm.c when it ran (the table's
# awk takes it), else 32 FLOP per cycle at the "cpu MHz" of /proc/cpuinfo, often the nominal
# clock, below what the cores reach.
fma_peak=${BENCH_PEAK_GFLOPS:-}
fma_note=
nominal_mhz=
if [ -n "$fma_peak" ]; then
    fma_note="BENCH_PEAK_GFLOPS = $fma_peak GFLOP/s per core"
else
    mhz=$(LC_ALL=C lscpu 2>/dev/null | awk -F: '/^CPU max MHz/ { gsub(/ /, "", $2); print $2; exit }')
    if [ -n "$mhz" ]; then
        fma_peak=$(awk -v m="$mhz" 'BEGIN { printf "%.1f", 32 * m / 1000 }')
        fma_note="32 FLOP/cycle/core (two 256-bit FMA pipes of fp32) x $(printf '%.0f' "$mhz") MHz (the CPU's max MHz from lscpu) = $fma_peak GFLOP/s per core"
    else
        nominal_mhz=$(awk -F: '/^cpu MHz/ { gsub(/ /, "", $2); print $2; exit }' /proc/cpuinfo 2>/dev/null)
    fi
fi

model=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: *//')
family=$(grep -m1 '^cpu family' /proc/cpuinfo 2>/dev/null | sed 's/.*: *//')
cpumodel=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo 2>/dev/null | sed 's/.*: *//')
blasinfo=$(grep -m1 '^# OpenBLAS' "$LOG" | sed 's/^# OpenBLAS OpenBLAS /# OpenBLAS /; s/^# //')
torchver=$([ -n "$PY" ] && "$PY" -c 'import re, torch; m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show()); print("%s (BLAS_INFO=%s)" % (torch.__version__, m.group(1) if m else "?"))' 2>/dev/null)
# Debian's PyTorch is built against the generic BLAS interface: its products run on whatever
# libblas.so.3 resolves to (OpenBLAS when libopenblas0 is installed, else the reference BLAS)
libblas=$(ldconfig -p 2>/dev/null | awk '/libblas\.so\.3 / { print $NF; exit }')
[ -n "$torchver" ] && [ -n "$libblas" ] && torchver="$torchver, libblas.so.3 -> $(readlink -f "$libblas")"
data=$(awk '$3 == "mlp.real_data" { print ($4 == 1 ? "MNIST from " ENVIRON["MNIST_DIR"] : "random data (MNIST_DIR not set)"); exit }' "$RAW")
{
    echo "## autodiff.h benchmarks, $(date '+%Y-%m-%d %H:%M %Z')"
    echo
    echo "Machine: ${model:-unknown CPU} (family ${family:-?} model ${cpumodel:-?}), $NPROC online CPUs, $(uname -sr)."
    echo "Compiler: $($CC --version | head -1), -O2, no -march. Peers: ${blasinfo:-no OpenBLAS}; PyTorch ${torchver:-not installed}. $CORETYPE_NOTE"
    echo "MLP data: ${data:-not run}. Batch 64, SGD lr 0.1, 1 epoch per run."
    echo
    awk -F'|' -v threads="$THREADS" -v runs="$RUNS" -v eruns="$EPOCH_RUNS" -v sruns="$SEQ_RUNS" \
        -v fmapeak="${fma_peak:-0}" -v fmanote="$fma_note" -v nominal="${nominal_mhz:-0}" '
    function median(arr, n,    i, j, x) {
        for (i = 2; i <= n; i++) { x = arr[i]; for (j = i - 1; j >= 1 && arr[j] > x; j--) arr[j + 1] = arr[j]; arr[j + 1] = x }
        return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
    }
    # median over runs of key at thread count t; sets found
    function med(t, key,    r, n, v) {
        n = 0
        for (r = 1; r <= maxrun; r++) if ((t, r, key) in val) v[++n] = val[t, r, key]
        found = n
        return n ? median(v, n) : 0
    }
    # median over runs of the per-run ratio (our speed / peer speed)
    function ratio(t, a, b, dir,    r, n, v) {
        n = 0
        for (r = 1; r <= maxrun; r++)
            if ((t, r, a) in val && (t, r, b) in val && val[t, r, a] > 0 && val[t, r, b] > 0)
                v[++n] = dir == "hi" ? val[t, r, a] / val[t, r, b] : val[t, r, b] / val[t, r, a]
        return n ? sprintf("%.2f", median(v, n)) : "-"
    }
    function fmt(x, key) {
        if (key ~ /loss/) return sprintf("%.4f", x)
        if (key ~ /s_epoch/) return sprintf("%.2f", x)
        if (key ~ /tok_s/) return sprintf("%.0f", x)
        return sprintf("%.1f", x)
    }
    FILENAME == ARGV[1] {
        split($0, f, " ")
        val[f[1], f[2], f[3]] = f[4]
        if (f[2] > maxrun) maxrun = f[2]
        next
    }
    {
        rows[++nrows] = $0
    }
    END {
        nt = split(threads, tl, " ")
        peak = med(tl[1], "peak.gflops")
        if (fmapeak == 0 && peak > 0) {
            fmapeak = peak
            fmanote = sprintf("%.1f GFLOP/s per core, the FMA loop of the GEMM rows (lscpu gives no max MHz; the loop'"'"'s rate is 32 FLOP/cycle at %.0f MHz)", peak, peak * 1000 / 32)
        } else if (fmapeak == 0 && nominal > 0) {
            fmapeak = 32 * nominal / 1000
            fmanote = sprintf("32 FLOP/cycle/core (two 256-bit FMA pipes of fp32) x %.0f MHz = %.1f GFLOP/s per core, where %.0f MHz is the cpu MHz of /proc/cpuinfo (lscpu gives no max MHz; cores that boost above it make the share too high)", nominal, fmapeak, nominal)
        }
        head = "| work |"; rule = "|---|"
        for (i = 1; i <= nt; i++) {
            head = head " autodiff.h, " tl[i] " thr | peer, " tl[i] " thr | ratio |"
            rule = rule "---:|---:|---:|"
        }
        print head; print rule
        for (k = 1; k <= nrows; k++) {
            split(rows[k], f, "|")
            line = "| " f[1] " |"
            shown = 0
            for (i = 1; i <= nt; i++) {
                t = tl[i]
                o = med(t, f[2]); fo = found
                p = med(t, f[3]); fp = found
                cell = fo ? fmt(o, f[2]) : "-"
                if (fo && f[2] ~ /^gemm/ && peak > 0) cell = cell sprintf(" (%.0f%%)", 100 * o / (peak * t))
                pcell = fp ? fmt(p, f[3]) " " f[4] : "-"
                if (f[2] ~ /\.gflops\.ours$/ && fmapeak > 0) {
                    if (fo) cell = cell sprintf(" (%.0f%%)", 100 * o / (fmapeak * t))
                    if (fp) pcell = fmt(p, f[3]) sprintf(" (%.0f%%) ", 100 * p / (fmapeak * t)) f[4]
                }
                rc = (f[5] == "-" || !fo || !fp) ? "-" : ratio(t, f[2], f[3], f[5])
                line = line " " cell " | " pcell " | " rc " |"
                shown += fo + fp
            }
            if (shown) print line
        }
        print ""
        printf "ratio = autodiff.h speed / peer speed (above 1: autodiff.h is faster), the median of per-run ratios; "
        printf "values are medians of %d runs (%d for epochs, %d for the GPT and LSTM steps). GEMM vs OpenBLAS: both in one process, batches interleaved; ", runs, eruns, sruns
        printf "vs PyTorch: separate processes run back to back, order alternating. "
        if (peak > 0) printf "(%%) = share of the measured peak, %.1f GFLOP/s per core (an FMA loop on the widest vectors), times the threads.\n", peak
        else printf "\n"
        kernel = med(tl[1], "kernel.gflops")
        kshare = med(tl[1], "kernel.share")
        if (found)
            printf "\nThe GEMM micro-kernel alone, on packed panels in cache in the products'"'"' order: %.1f GFLOP/s, %.0f%% of the FMA loop timed beside it (what a product falls short of that share is lost around the kernel: packing, caches, edges).\n", kernel, 100 * kshare
        gf = med(tl[1], "gpt.gflop_step")
        if (found) {
            printf "\nGPT and LSTM steps: random token ids (fixed seed), AdamW lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the matrices, gradients clipped at 1.0; "
            printf "tokens/s = batch x length / the median time of a step, after 3 warm-up steps. "
            printf "The GPT step counts %.3f GFLOP: 2 M N K for every matrix product, forward and backward (twice the forward), ", gf
            printf "the attention'"'"'s Q K^T and P V over the whole T x T square (the causal half that is skipped counted all the same, as nanoGPT'"'"'s estimate_mfu does); "
            printf "layer norms, GELU, softmax, loss and optimizer not counted. "
            if (fmapeak > 0) printf "(%%) = share of the FMA peak, %s, times the threads.\n", fmanote
            else printf "\n"
        }
        med(tl[1], "rnn.lstm.12-128-128-1.us_step.fused")
        if (found)
            printf "\nRecurrent cells (bench/rnn.c): one step of ad_lstm_cell / ad_gru_cell forward and backward against the same cell composed of autodiff.h'"'"'s other ops (ratio above 1: the fused cell is faster); the layers ad_lstm / ad_gru over 64 steps against 64 unrolled cells.\n"
        # speedups of the training epochs over one thread in wall time for both (a 1-thread row in
        # CPU time leaves out the moments the machine takes the core, which a 2-thread wall time
        # includes), beside what the FMA loop gained
        for (i = 2; i <= nt && tl[1] == 1; i++) {
            t = tl[i]
            line = ""
            split("mlp.784-128-10 mlp.784-512-256-10 cnn", work, " ")
            for (w = 1; w <= 3; w++) {
                one = med(1, work[w] ".s_epoch_wall.ours"); f1 = found
                more = med(t, work[w] ".s_epoch_wall.ours")
                if (f1 && found && more > 0) line = line sprintf("%s%s %.2f", line == "" ? "" : ", ", work[w], one / more)
            }
            if (line != "") printf "\nEpochs on %d threads, speedup over one (ratio of medians, wall time for both): %s.\n", t, line
            line = ""
            split("gpt.ours lstm.ours gpt.torch lstm.torch", work, " ")
            for (w = 1; w <= 4; w++) {
                split(work[w], kw, ".")
                one = med(1, kw[1] ".tok_s_wall." kw[2]); f1 = found
                more = med(t, kw[1] ".tok_s_wall." kw[2])
                if (f1 && found && one > 0) line = line sprintf("%s%s %s %.2f", line == "" ? "" : ", ", kw[1], kw[2] == "ours" ? "autodiff.h" : "PyTorch", more / one)
            }
            if (line != "") printf "Training steps on %d threads, speedup over one (wall time for both): %s.\n", t, line
            m = med(t, "peak.scaling")
            if (found) {
                lo = hi = m
                for (r = 1; r <= maxrun; r++)
                    if ((t, r, "peak.scaling") in val) {
                        if (val[t, r, "peak.scaling"] < lo) lo = val[t, r, "peak.scaling"]
                        if (val[t, r, "peak.scaling"] > hi) hi = val[t, r, "peak.scaling"]
                    }
                printf "The machine: an FMA loop on registers did %.2f times the work per second on %d threads as on one (median of %d runs, %.2f to %.2f), the most any %d-thread speedup could reach then.\n", m, t, found, lo, hi, t
            }
        }
    }' "$RAW" "$ROWS"
    # data-parallel epochs: samples/s, ratios of 2 processes to 1, the wait for the sums
    awk -v runs="$EPOCH_RUNS" '
    function median(arr, n,    i, j, x) {
        for (i = 2; i <= n; i++) { x = arr[i]; for (j = i - 1; j >= 1 && arr[j] > x; j--) arr[j + 1] = arr[j]; arr[j + 1] = x }
        return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
    }
    function med(key,    r, n, v) {
        n = 0
        for (r = 1; r <= maxrun; r++) if ((r, key) in val) v[++n] = val[r, key]
        found = n
        return n ? median(v, n) : 0
    }
    function ratio(a, b,    r, n, v) { # median over runs of a / b
        n = 0
        for (r = 1; r <= maxrun; r++) if ((r, a) in val && (r, b) in val && val[r, b] > 0) v[++n] = val[r, a] / val[r, b]
        return n ? sprintf("%.2f", median(v, n)) : "-"
    }
    $1 == "mpi" { val[$2, $3] = $4; if ($2 > maxrun) maxrun = $2 }
    END {
        med("mpi.784-128-10.samples_s.np1t1")
        if (!found) exit
        print ""
        print "Data-parallel MLP epochs over MPI (bench/mlp.c built with mpicc -DBENCH_MPI, examples/data_parallel.h), global batch 64 shared out, samples/s in wall time:"
        print ""
        print "| MLP | 1 process x 1 thread | 1 x 2 threads | 2 processes x 1 thread | 2 x 1, one all-reduce after the sweep | 2x1 / 1x1 | 2x1 / 1x2 | 2x1 after the sweep / 1x1 |"
        print "|---|---:|---:|---:|---:|---:|---:|---:|"
        split("784-128-10 784-512-256-10", cfgs, " ")
        for (c = 1; c <= 2; c++) {
            k = "mpi." cfgs[c] ".samples_s."
            printf "| %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s |\n", cfgs[c], med(k "np1t1"), med(k "np1t2"), med(k "np2t1"),
                   med(k "np2t1.blocking"), ratio(k "np2t1", k "np1t1"), ratio(k "np2t1", k "np1t2"), ratio(k "np2t1.blocking", k "np1t1")
        }
        print ""
        for (c = 1; c <= 2; c++) {
            k = "mpi." cfgs[c] ".wait_us.np2t1"
            w = med(k); wb = med(k ".blocking")
            if (wb > 0)
                printf "%s: rank 0 waited %.0f us per step for the sums when the buckets start during the sweep, %.0f us for one all-reduce after it: the overlap hides %.0f%% of that wait.\n", cfgs[c], w, wb, 100 * (1 - w / wb)
        }
        c = med("peak.scaling"); n = found
        lo = hi = c
        for (r = 1; r <= maxrun; r++) if ((r, "peak.scaling") in val) { if (val[r, "peak.scaling"] < lo) lo = val[r, "peak.scaling"]; if (val[r, "peak.scaling"] > hi) hi = val[r, "peak.scaling"] }
        if (n) printf "The FMA loop on 2 threads did %.2f times the work of one (median of %d runs before these, %.2f to %.2f): the ceiling of any 2-process or 2-thread speedup then.\n", c, n, lo, hi
        printf "Medians of %d runs; ratios are medians of per-run ratios.\n", runs
    }' "$RAW"
    echo
    awk '$3 ~ /^gemm\..*\.maxdiff$/ { if ($4 > m) m = $4; n++ }
         END { if (n) printf "GEMM check: largest |autodiff.h - OpenBLAS| over all products and runs: %.3g (inputs uniform in [-1, 1]).\n", m }' "$RAW"
    awk '$3 ~ /^tape\.df/ { split($3, k, "."); v[k[2] "." k[3]] = $4 }
         END { if (("dfda.ours" in v) && ("dfda.torch" in v))
                   printf "Tape check: df/da, df/db at (1.5, 0.7): autodiff.h %.6g, %.6g; PyTorch %.6g, %.6g.\n",
                          v["dfda.ours"], v["dfdb.ours"], v["dfda.torch"], v["dfdb.torch"] }' "$RAW"
    awk '$3 ~ /^(gpt|lstm)\.(params|arena_mib)\./ { split($3, k, "."); v[k[1] "." k[2] "." k[3]] = $4 }
         END { for (i = 1; i <= 2; i++) {
                   m = i == 1 ? "gpt" : "lstm"
                   if (!((m ".params.ours") in v)) continue
                   printf "%s check: parameters autodiff.h %d, PyTorch %s; arena peak of one step (ad_tape_bytes_peak) %.1f MiB.\n",
                          i == 1 ? "GPT" : "LSTM", v[m ".params.ours"],
                          (m ".params.torch") in v ? sprintf("%d", v[m ".params.torch"]) : "-", v[m ".arena_mib.ours"] }
         }' "$RAW"
    if [ "$CLOCK" = cpu ]; then
        echo "Clock: CPU time of the working thread for 1-thread rows, wall time for the others."
    else
        echo "Clock: wall time."
    fi
    echo "Load average (1, 5, 15 min) at the start: ${load_start:-?}; at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null). Total benchmark time: $(( $(date +%s) - start )) s."
} >build/bench.md
echo
cat build/bench.md
