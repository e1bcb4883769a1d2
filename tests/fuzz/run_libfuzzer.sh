#!/usr/bin/env bash
# Runs the fuzz targets of tests/fuzz under libFuzzer.
#   tests/fuzz/run_libfuzzer.sh [SECONDS] [TARGET...]
# SECONDS (default 60) per target; TARGET is a file name in tests/fuzz without .c (default: every
# target). Each target is built with clang, -fsanitize=fuzzer,address,undefined, into build/fuzz/;
# its committed corpus (tests/fuzz/corpus/TARGET) is copied into a scratch corpus,
# build/fuzz/corpus/TARGET, which keeps what libFuzzer adds from run to run; then libFuzzer runs on
# it with -rss_limit_mb=2048. Prints the executions per target and exits non-zero when a target
# failed to build or libFuzzer found a crash, leak, timeout or out-of-memory (its input is saved in
# build/fuzz/artifacts/TARGET/ and the log in build/fuzz/TARGET.log).
# Environment: CLANG (default clang), FUZZ_TIMEOUT (seconds one input may take, default 25),
# FUZZ_JOBS (targets run at once, default 1), FUZZ_KEEP_GOING=1 (libFuzzer's fork mode: go on
# after a crash and collect every one found in the time; exits non-zero when any was found).
# Needs clang's libFuzzer runtime (Debian: libclang-rt-14-dev, or libclang-rt-dev).
set -u
cd "$(dirname "$0")/../.."

secs=60
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for src in tests/fuzz/*.c; do targets+=("$(basename "$src" .c)"); done
fi
CLANG=${CLANG:-clang}
timeout_s=${FUZZ_TIMEOUT:-25}
jobs=${FUZZ_JOBS:-1}
OUT=build/fuzz
mkdir -p "$OUT"

if ! command -v "$CLANG" >/dev/null; then
    echo "run_libfuzzer.sh: $CLANG not found (set CLANG)" >&2
    exit 2
fi

# build NAME: the libFuzzer binary build/fuzz/NAME
build() {
    local name=$1 macro
    macro=$(echo "$name" | tr 'a-z' 'A-Z')_NO_MAIN
    if ! "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D"$macro" -I. \
        "tests/fuzz/$name.c" -o "$OUT/$name" -lm -lpthread >"$OUT/$name.build.log" 2>&1; then
        echo "$name: build failed (libFuzzer needs clang's runtime: Debian libclang-rt-14-dev)"
        sed -n '1,20p' "$OUT/$name.build.log"
        return 1
    fi
}

# fuzz NAME: runs libFuzzer on NAME's scratch corpus; writes the result line to build/fuzz/NAME.result
fuzz() {
    local name=$1 corpus="$OUT/corpus/$1" art="$OUT/artifacts/$1/" log="$OUT/$1.log" rc execs found
    local extra=()
    mkdir -p "$corpus" "$art"
    if [ -d "tests/fuzz/corpus/$name" ]; then cp tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null; fi
    [ "${FUZZ_KEEP_GOING:-0}" = 1 ] && extra=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    touch "$OUT/$name.start"
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$OUT/$name" "${extra[@]}" -max_total_time="$secs" \
        -rss_limit_mb=2048 -timeout="$timeout_s" -print_final_stats=1 -artifact_prefix="$art" "$corpus" \
        >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    [ -z "$execs" ] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    found=$(find "$art" -type f -newer "$OUT/$name.start" | sort)
    if [ $rc -eq 0 ] && [ -z "$found" ]; then
        echo "$name: ${execs:-0} executions in ${secs} s, no crash" >"$OUT/$name.result"
    else
        {
            echo "$name: ${execs:-0} executions, FAILED (libFuzzer exit status $rc); log $log"
            grep -m5 -E 'ERROR: |runtime error|^fuzz: |==[0-9]+== ?ERROR' "$log" | sed 's/^/    /'
            for f in $found; do echo "    input: $f"; done
        } >"$OUT/$name.result"
    fi
}

failed=0
built=()
for name in "${targets[@]}"; do
    if [ ! -e "tests/fuzz/$name.c" ]; then
        echo "$name: no tests/fuzz/$name.c"; failed=1; continue
    fi
    if build "$name"; then built+=("$name"); else failed=1; fi
done

running=0
for name in "${built[@]}"; do
    echo "fuzzing $name for $secs s"
    fuzz "$name" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

for name in "${built[@]}"; do
    cat "$OUT/$name.result"
    grep -q FAILED "$OUT/$name.result" && failed=1
done
exit $failed
