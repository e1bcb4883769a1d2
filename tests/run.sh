#!/usr/bin/env bash
# Builds and runs every test program (the float ones also without vector functions and without
# threads), the compile matrix, the examples and a sanitizer build, then prints one line
# "N passed, N failed". Exits non-zero when anything failed.
# Environment: CC (default cc), MNIST_DIR (tests that need MNIST skip themselves without it).
set -u
cd "$(dirname "$0")/.."
CC=${CC:-cc}
OUT=build/tests
mkdir -p "$OUT"
passed=0
failed=0
failures=()

pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "FAIL $1"; }

# check NAME COMMAND...: one check that passes when the command succeeds
check() {
    local name=$1; shift
    local log="$OUT/$(echo "$name" | tr ' /' '__').log"
    if "$@" >"$log" 2>&1; then pass; else fail "$name"; sed -n '1,40p' "$log"; fi
}

# run_counted NAME BINARY: runs a test program and adds its own "N passed, N failed" line
run_counted() {
    local name=$1 bin=$2 log="$OUT/$1.run.log" line p f
    "$bin" >"$log" 2>&1
    local rc=$?
    grep '^FAIL' "$log" | head -20
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
    if [ -n "$line" ]; then
        p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
        passed=$((passed + p)); failed=$((failed + f))
        [ "$f" -gt 0 ] && failures+=("$name ($f)")
    fi
    if [ $rc -ne 0 ] && { [ -z "$line" ] || [ "${f:-0}" -eq 0 ]; }; then
        fail "$name exited with status $rc"; tail -20 "$log"
    fi
    echo "$name: ${line:-no summary}"
}

WARN="-Wall -Wextra -pedantic -Werror"
LIBS="-lm -lpthread"

# 1. the header alone, in every configuration it promises to compile in
printf '#define AUTODIFF_IMPLEMENTATION\n#include "autodiff.h"\nint main(void){ad_tape *T = ad_tape_new(); ad_tape_free(T); return 0;}\n' > "$OUT/impl.c"
for cc in gcc clang; do
    command -v $cc >/dev/null || continue
    for std in c99 c11; do
        check "compile $cc -std=$std" $cc -std=$std $WARN -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_$std" $LIBS
        check "compile $cc -std=$std double" $cc -std=$std $WARN -DAUTODIFF_DOUBLE -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_${std}_d" $LIBS
    done
done
command -v g++ >/dev/null && check "compile g++ -fno-exceptions" g++ -x c++ -std=c++11 $WARN -fno-exceptions -I. "$OUT/impl.c" -o "$OUT/impl_cxx" $LIBS
command -v clang++ >/dev/null && check "compile clang++" clang++ -x c++ -std=c++11 $WARN -I. "$OUT/impl.c" -o "$OUT/impl_clangxx" $LIBS
for f in tests/compile/*.sh; do
    [ -e "$f" ] || continue
    check "$(basename "$f" .sh)" bash "$f" "$OUT"
done

# 2. test programs, optimised, then under AddressSanitizer + UBSan
for src in tests/test_*.c; do
    name=$(basename "$src" .c)
    if $CC -O2 -g -std=c99 -Wall -Wextra -I. "$src" -o "$OUT/$name" $LIBS >"$OUT/$name.build.log" 2>&1; then
        run_counted "$name" "$OUT/$name"
    else
        fail "build $name"; sed -n '1,30p' "$OUT/$name.build.log"
    fi
done
# the float tests again with the C library's functions in place of the vector ones, and
# without threads
for opt in AUTODIFF_NO_DISPATCH AUTODIFF_NO_THREADS; do
    if $CC -O2 -g -std=c99 -Wall -Wextra -D$opt -I. tests/test_tape.c -o "$OUT/test_tape_$opt" $LIBS \
        >"$OUT/test_tape_$opt.build.log" 2>&1; then
        run_counted "test_tape_$opt" "$OUT/test_tape_$opt"
    else
        fail "build test_tape -D$opt"; sed -n '1,30p' "$OUT/test_tape_$opt.build.log"
    fi
done
if [ "${SANITIZE:-1}" = 1 ]; then
    for src in tests/test_*.c; do
        name=$(basename "$src" .c)
        grep -q 'no-sanitizer-run' "$src" && continue
        if $CC -O1 -g -std=c99 -fsanitize=address,undefined -fno-sanitize-recover=undefined \
            -I. "$src" -o "$OUT/$name.asan" $LIBS >"$OUT/$name.asan.build.log" 2>&1; then
            check "asan+ubsan $name" env ASAN_OPTIONS=detect_leaks=1 TH_QUICK=1 "$OUT/$name.asan"
        else
            fail "build asan $name"; sed -n '1,30p' "$OUT/$name.asan.build.log"
        fi
    done
fi

# 3. fuzz targets: each file builds standalone (its own main runs a built-in corpus of valid and
#    mutated inputs) and must get through it without a sanitizer report
for src in tests/fuzz/*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    if $CC -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I. "$src" \
        -o "$OUT/$name" $LIBS >"$OUT/$name.build.log" 2>&1; then
        check "fuzz corpus $name" "$OUT/$name"
    else
        fail "build $name"; sed -n '1,30p' "$OUT/$name.build.log"
    fi
done

# 4. examples: each builds with plain cc; the quick ones run
for src in examples/*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    grep -q 'MPI_Init' "$src" && continue
    check "build example $name" $CC -O2 -Wall -Wextra -I. "$src" -o "$OUT/example_$name" $LIBS
done
for name in scalar sigmoid hessian; do
    [ -x "$OUT/example_$name" ] && check "run example $name" "$OUT/example_$name"
done

if [ ${#failures[@]} -gt 0 ]; then
    echo "failures:"; printf '  %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
