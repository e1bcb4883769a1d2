#!/usr/bin/env bash
# Builds and runs every test program (test_tape also without vector functions and without
# threads, test_lbfgs and test_numbers in both precisions), the compile matrix, the test
# programs and fuzz corpora under AddressSanitizer + UBSan with gcc and with clang, the examples,
# tests/resume.sh, tests/mpi.sh and tests/shakespeare.sh, then prints one line "N passed, N
# failed". Exits non-zero when anything failed. Says which stage it is in as it goes ("== NAME"),
# and each stage's count and time when it ends.
# Builds run in the background, JOBS at a time, while the tests already built run. Compiling the
# implementation takes 13-40 s, most of this script's time, so it is compiled once per precision
# and build, and linked with each test program marked TH_LINKED_IMPLEMENTATION (those that use
# only the public API and the default options); the examples are built once for every stage.
# Environment: CC (default cc) for the optimised test programs and the examples; MPICC (default
# mpicc) for the examples over MPI; JOBS (default: the number of processors); SANITIZE (default
# 1: gcc and clang; 0: no sanitizer builds; or the compilers to use, e.g. SANITIZE=clang);
# MNIST_DIR and SHAKESPEARE_DIR (tests that need MNIST or Tiny Shakespeare skip themselves
# without them; those over MPI without mpicc and mpirun).
set -u
cd "$(dirname "$0")/.."
CC=${CC:-cc}
JOBS=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
OUT=build/tests
mkdir -p "$OUT"
passed=0
failed=0
failures=()

pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "FAIL $1"; }
slug() { echo "$1" | tr ' /=' '___'; }

# show LOG: the part of a log that says what went wrong: a sanitizer's report from its first
# line, else the first lines (a compiler's first error)
show() {
    local at
    at=$(grep -n -m1 -E 'runtime error|ERROR: (Address|Leak)Sanitizer' "$1" | cut -d: -f1)
    if [ -n "$at" ]; then sed -n "${at},$((at + 12))p" "$1"; else sed -n '1,30p' "$1"; fi
}

# check NAME COMMAND...: one check that passes when the command succeeds
check() {
    local name=$1; shift
    local log="$OUT/$(slug "$name").log"
    if "$@" >"$log" 2>&1; then pass; else fail "$name"; show "$log"; return 1; fi
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

# Builds: `queue NAME COMMAND...` adds one, start_builds runs them all in the background in the
# order queued, JOBS at a time, and `built NAME` waits for one and succeeds when it did (its
# output is in $OUT/NAME.build.log).
build_names=()
build_cmds=()
builder=
queue() {
    local name=$1; shift
    build_names+=("$name")
    build_cmds+=("$(printf '%q ' "$@")")
    rm -f "$OUT/$name.build.log" "$OUT/$name.build.rc"
}
start_builds() {
    (
        trap 'kill $(jobs -pr) 2>/dev/null; exit 1' TERM
        for i in "${!build_names[@]}"; do
            while [ "$(jobs -pr | wc -l)" -ge "$JOBS" ]; do wait -n; done
            (
                eval "${build_cmds[$i]}" >"$OUT/${build_names[$i]}.build.log" 2>&1
                echo $? >"$OUT/${build_names[$i]}.build.rc.tmp"
                mv "$OUT/${build_names[$i]}.build.rc.tmp" "$OUT/${build_names[$i]}.build.rc"
            ) &
        done
        wait
    ) &
    builder=$!
}
built() {
    local rc="$OUT/$1.build.rc"
    while [ ! -e "$rc" ] && kill -0 "$builder" 2>/dev/null; do sleep 0.2; done
    [ "$(cat "$rc" 2>/dev/null)" = 0 ]
}
trap '[ -n "$builder" ] && kill "$builder" 2>/dev/null' EXIT

# stage NAME: announces a stage and ends the one before with its count and time
stage_name=
stage() {
    if [ -n "$stage_name" ]; then
        echo "   $stage_name: $((passed - stage_passed)) passed, $((failed - stage_failed)) failed, $((SECONDS - stage_start)) s"
    fi
    stage_name=$1; stage_passed=$passed; stage_failed=$failed; stage_start=$SECONDS
    [ -n "$1" ] && echo "== $1"
}

WARN="-Wall -Wextra -pedantic -Werror"
LIBS="-lm -lpthread"
SAN="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all"
have() { command -v "$1" >/dev/null; }
case ${SANITIZE:-1} in 0) wanted=() ;; 1) wanted=(gcc clang) ;; *) read -ra wanted <<<"$SANITIZE" ;; esac
sanitizers=()
for cc in "${wanted[@]}"; do have "$cc" && sanitizers+=("$cc"); done
tests=(); for src in tests/test_*.c; do [ -e "$src" ] && tests+=("$(basename "$src" .c)"); done
fuzzers=(); for src in tests/fuzz/*.c; do [ -e "$src" ] && fuzzers+=("$(basename "$src" .c)"); done
examples=(); for src in examples/*.c; do [ -e "$src" ] && examples+=("$(basename "$src" .c)"); done
PROGRAMS=$OUT/programs
rm -rf "$PROGRAMS" # so that a stage never runs a program left from an earlier run
mkdir -p "$PROGRAMS"

# 1. the header alone, in every configuration it promises to compile in; some optimised, since
#    GCC warns of what it finds only through inlining (maybe-uninitialized, format-truncation)
printf '#define AUTODIFF_IMPLEMENTATION\n#include "autodiff.h"\nint main(void){ad_tape *T = ad_tape_new(); ad_tape_free(T); return 0;}\n' > "$OUT/impl.c"
matrix=()
for cc in gcc clang; do
    have $cc || continue
    for std in c99 c11; do
        matrix+=("compile $cc -std=$std")
        queue "compile_${cc}_$std" $cc -std=$std $WARN -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_$std" $LIBS
        matrix+=("compile $cc -std=$std double")
        queue "compile_${cc}_${std}_double" $cc -std=$std $WARN -DAUTODIFF_DOUBLE -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_${std}_d" $LIBS
    done
    matrix+=("compile $cc -O3 double")
    queue "compile_${cc}_O3_double" $cc -std=c99 -O3 $WARN -DAUTODIFF_DOUBLE -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_O3_d" $LIBS
    for opt in AUTODIFF_NO_THREADS AUTODIFF_NO_DISPATCH AUTODIFF_NO_STDIO; do
        matrix+=("compile $cc -D$opt")
        queue "compile_${cc}_$opt" $cc -std=c99 $WARN -D$opt -I. "$OUT/impl.c" -o "$OUT/impl_${cc}_$opt" $LIBS
    done
done
if have g++; then
    matrix+=("compile g++ -O2 -fno-exceptions")
    queue "compile_gxx" g++ -x c++ -std=c++11 -O2 $WARN -fno-exceptions -I. "$OUT/impl.c" -o "$OUT/impl_cxx" $LIBS
fi
if have clang++; then
    matrix+=("compile clang++ -O2")
    queue "compile_clangxx" clang++ -x c++ -std=c++11 -O2 $WARN -I. "$OUT/impl.c" -o "$OUT/impl_clangxx" $LIBS
fi
for f in tests/compile/*.sh; do
    [ -e "$f" ] || continue
    matrix+=("$(basename "$f" .sh)")
    queue "compile_$(basename "$f" .sh)" bash "$f" "$OUT"
done

# the builds of the later stages, queued in the order they run; first the implementation alone,
# in each precision, optimised (cc "") and then for each sanitizer
printf '#define STB_IMAGE_IMPLEMENTATION\n#include <stb/stb_image.h>\n#define AUTODIFF_IMPLEMENTATION\n#include "autodiff.h"\n' \
    > "$OUT/implementation.c"
OPT="-O2 -g -std=c99 -Wall -Wextra"
for cc in "" "${sanitizers[@]}"; do
    for precision in float double; do
        name=impl_$precision${cc:+.san_$cc} define=
        [ $precision = double ] && define=-DAUTODIFF_DOUBLE
        if [ -z "$cc" ]; then flags=($CC $OPT); else flags=($cc $SAN -std=c99); fi
        queue "$name" "${flags[@]}" $define -I. -c "$OUT/implementation.c" -o "$OUT/$name.o"
    done
done
# queue_program NAME SOURCE BUILD COMPILER FLAGS...: queues the build of one test program; a
# source marked TH_LINKED_IMPLEMENTATION is compiled alone, and `ready` links it with the
# implementation of its precision and BUILD ("" optimised, ".san_CC" for a sanitizer), unless it
# or the flags set an option of the library other than AUTODIFF_DOUBLE (then it is built whole)
declare -A link_with link_flags
queue_program() {
    local name=$1 src=$2 build=$3; shift 3
    local macros others precision=float
    # the library's options the source defines or the flags set, one a line
    macros=$( { grep -oE '^[[:space:]]*#[[:space:]]*define[[:space:]]+AUTODIFF_[A-Z_]+' "$src" | grep -oE 'AUTODIFF_[A-Z_]+'
                printf '%s\n' "$@" | grep -oE '^-DAUTODIFF_[A-Z_]+' | cut -c3-; } | sort -u)
    others=$(grep -vxE 'AUTODIFF_(DOUBLE|IMPLEMENTATION)' <<<"$macros")
    grep -qx AUTODIFF_DOUBLE <<<"$macros" && precision=double
    if grep -q TH_LINKED_IMPLEMENTATION "$src" && [ -z "$others" ]; then
        queue "$name" "$@" -DTH_LINKED_IMPLEMENTATION -I. -c "$src" -o "$OUT/$name.o"
        link_with[$name]=impl_$precision$build
        link_flags[$name]="$*"
    else
        queue "$name" "$@" -I. "$src" -o "$OUT/$name" $LIBS
    fi
}
# ready NAME: waits for a test program's build, links it when it is linked with the
# implementation, and succeeds when the program is there
ready() {
    local name=$1 impl=${link_with[$1]:-}
    built "$name" || return 1
    [ -z "$impl" ] && return 0
    built "$impl" || { cat "$OUT/$impl.build.log" >>"$OUT/$name.build.log"; return 1; }
    # shellcheck disable=SC2086 # the flags are words
    ${link_flags[$name]} "$OUT/$name.o" "$OUT/$impl.o" -o "$OUT/$name" $LIBS >>"$OUT/$name.build.log" 2>&1
}
for name in "${tests[@]}"; do
    queue_program "$name" "tests/$name.c" "" $CC $OPT
done
# test programs built once more with an option: NAME:MACRO
variants=()
for v in test_tape:AUTODIFF_NO_DISPATCH test_tape:AUTODIFF_NO_THREADS test_lbfgs:AUTODIFF_DOUBLE \
         test_numbers:AUTODIFF_DOUBLE; do
    name=${v%%:*} opt=${v#*:}
    [ -e "tests/$name.c" ] || continue
    variants+=("${name}_$opt")
    queue_program "${name}_$opt" "tests/$name.c" "" $CC $OPT -D$opt
done
for cc in "${sanitizers[@]}"; do
    for name in "${tests[@]}"; do
        grep -q 'no-sanitizer-run' "tests/$name.c" && continue
        queue_program "$name.san_$cc" "tests/$name.c" ".san_$cc" $cc $SAN -std=c99
    done
done
for cc in "${sanitizers[@]}"; do
    for name in "${fuzzers[@]}"; do
        queue_program "$name.san_$cc" "tests/fuzz/$name.c" ".san_$cc" $cc $SAN
    done
done
# the examples as a user builds them (plain cc and -lm), into PROGRAMS for the later stages too
# (TEST_PROGRAMS in tests/resume.sh, mpi.sh and shakespeare.sh), with the programs those stages
# build besides: over MPI, and the checkpoints' comparison
for name in "${examples[@]}"; do
    grep -q '#include <mpi.h>' "examples/$name.c" && continue
    queue "example_$name" $CC -O2 -Wall -Wextra "examples/$name.c" -o "$PROGRAMS/$name" -lm
done
MPICC=${MPICC:-mpicc}
if have "$MPICC" && have mpirun; then
    for name in "${examples[@]}"; do
        grep -q '#include <mpi.h>' "examples/$name.c" || continue
        queue "example_$name" "$MPICC" -O2 -Wall -Wextra -pedantic -Werror "examples/$name.c" -o "$PROGRAMS/$name" -lm
    done
fi
queue params_compare $CC -O2 -I. tests/params_compare.c -o "$PROGRAMS/params_compare" $LIBS
start_builds

stage "compile matrix"
i=0
for name in "${build_names[@]}"; do
    case $name in compile_*) ;; *) continue ;; esac
    if built "$name"; then pass; else fail "${matrix[$i]}"; show "$OUT/$name.build.log"; fi
    i=$((i + 1))
done

# 2. test programs, optimised; test_tape (float) again with the C library's functions in place
#    of the vector ones, and without threads; test_lbfgs again in double precision
stage "test programs ($CC -O2)"
for name in "${tests[@]}" "${variants[@]}"; do
    if ready "$name"; then
        run_counted "$name" "$OUT/$name"
    else
        fail "build $name"; show "$OUT/$name.build.log"
    fi
done

# 3. the same under AddressSanitizer + UBSan, with each compiler, the dispatching kernels on
for cc in "${wanted[@]}"; do
    stage "sanitizers ($cc)"
    if ! have "$cc"; then echo "no $cc: skipped"; continue; fi
    for name in "${tests[@]}"; do
        grep -q 'no-sanitizer-run' "tests/$name.c" && continue
        if ready "$name.san_$cc"; then
            check "asan+ubsan $cc $name" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
                TH_QUICK=1 "$OUT/$name.san_$cc" && echo "$name: ok"
        else
            fail "build asan+ubsan $cc $name"; show "$OUT/$name.san_$cc.build.log"
        fi
    done
done

# 4. fuzz targets: each file builds standalone (its own main runs a built-in corpus of valid and
#    mutated inputs) and must get through it without a sanitizer report, with each compiler
stage "fuzz corpora"
[ ${#sanitizers[@]} -gt 0 ] || echo "no sanitizer build (SANITIZE=${SANITIZE:-}): skipped"
for cc in "${sanitizers[@]}"; do
    for name in "${fuzzers[@]}"; do
        if ready "$name.san_$cc"; then
            check "fuzz corpus $cc $name" env UBSAN_OPTIONS=print_stacktrace=1 "$OUT/$name.san_$cc"
        else
            fail "build $cc $name"; show "$OUT/$name.san_$cc.build.log"
        fi
    done
done

# 5. examples: each builds with plain cc (those over MPI with mpicc, where it is installed); the
#    quick ones run
stage "examples"
for name in "${examples[@]}" params_compare; do
    build=example_$name; [ $name = params_compare ] && build=$name
    [[ " ${build_names[*]} " == *" $build "* ]] || continue
    if built "$build"; then pass; else fail "build $name"; show "$OUT/$build.build.log"; fi
done
for name in scalar sigmoid hessian lbfgs_fit newton custom_op; do
    [ -x "$PROGRAMS/$name" ] && check "run example $name" "$PROGRAMS/$name"
done

# 6. training stopped and resumed from its checkpoint (skips itself without MNIST_DIR)
if [ -e tests/resume.sh ]; then
    stage "resume (tests/resume.sh)"
    check "resume" env TEST_PROGRAMS="$(pwd)/$PROGRAMS" bash tests/resume.sh && tail -1 "$OUT/resume.log"
fi

# 7. data-parallel training over MPI (skips itself without MNIST_DIR, mpicc or mpirun)
if [ -e tests/mpi.sh ]; then
    stage "mpi (tests/mpi.sh)"
    check "mpi" env TEST_PROGRAMS="$(pwd)/$PROGRAMS" bash tests/mpi.sh && grep '^mpi' "$OUT/mpi.log"
fi

# 8. the character-level models on a slice of Tiny Shakespeare (skips itself without SHAKESPEARE_DIR)
if [ -e tests/shakespeare.sh ]; then
    stage "shakespeare (tests/shakespeare.sh)"
    check "shakespeare" env TEST_PROGRAMS="$(pwd)/$PROGRAMS" bash tests/shakespeare.sh && cat "$OUT/shakespeare.log" 2>/dev/null
fi
stage ""

if [ ${#failures[@]} -gt 0 ]; then
    echo "failures:"; printf '  %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
