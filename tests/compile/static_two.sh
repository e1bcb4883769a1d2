#!/usr/bin/env bash
# AUTODIFF_STATIC: two files each hold a private copy of the implementation and are linked
# together without clashes, warning-free, with gcc and with clang.
# Usage: static_two.sh OUTPUT_DIR. Exits non-zero on any failure.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUTPUT_DIR}/static_two
mkdir -p "$OUT"

cat > "$OUT/first.c" <<'SRC'
#define AUTODIFF_STATIC
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"

/* d(x^3)/dx */
double first_derivative(double x)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *v = ad_var(T, (ad_real)x);
    double g = -1;
    if (ad_backward(T, ad_pow(T, v, 3)) == 0) g = ad_grad_item(v);
    ad_tape_free(T);
    return g;
}
SRC

cat > "$OUT/second.c" <<'SRC'
#define AUTODIFF_STATIC
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include <stdio.h>

double first_derivative(double x);

/* d(sin x)/dx */
static double second_derivative(double x)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *v = ad_var(T, (ad_real)x);
    double g = -1;
    if (ad_backward(T, ad_sin(T, v)) == 0) g = ad_grad_item(v);
    ad_tape_free(T);
    return g;
}

int main(void)
{
    double a = first_derivative(2), b = second_derivative(0);
    printf("d(x^3)/dx at 2 = %g, d(sin x)/dx at 0 = %g\n", a, b);
    return a > 11.999 && a < 12.001 && b > 0.999 && b < 1.001 ? 0 : 1;
}
SRC

built=0
for cc in gcc clang; do
    command -v $cc >/dev/null || continue
    for std in c99 c11; do
        flags="-std=$std -Wall -Wextra -pedantic -Werror -I$ROOT"
        $cc $flags -c "$OUT/first.c" -o "$OUT/first_$cc.o"
        $cc $flags -c "$OUT/second.c" -o "$OUT/second_$cc.o"
        $cc "$OUT/first_$cc.o" "$OUT/second_$cc.o" -o "$OUT/static_$cc" -lm -lpthread
        "$OUT/static_$cc"
        # nothing of the library is visible outside its file
        if nm "$OUT/first_$cc.o" | grep -E ' [TDB] ad_' >/dev/null; then
            echo "$cc: AUTODIFF_STATIC left external library symbols" >&2
            exit 1
        fi
        built=$((built + 1))
    done
done
[ "$built" -gt 0 ]
