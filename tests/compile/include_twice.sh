#!/usr/bin/env bash
# One file includes autodiff.h for its declarations, uses them, and further down defines
# AUTODIFF_IMPLEMENTATION and includes it again (the stb pattern).
# Usage: include_twice.sh OUTPUT_DIR. Exits non-zero on any failure.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUTPUT_DIR}/include_twice
CC=${CC:-cc}
mkdir -p "$OUT"

cat > "$OUT/twice.c" <<'SRC'
#include "autodiff.h"
#include "autodiff.h" /* a second plain include is harmless */
#include <stdio.h>

static double slope(double x)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *v = ad_var(T, (ad_real)x);
    double g = -1;
    if (ad_backward(T, ad_mul(T, v, ad_exp(T, v))) == 0) g = ad_grad_item(v); /* (1 + x) e^x */
    ad_tape_free(T);
    return g;
}

int main(void)
{
    double g = slope(0);
    printf("d(x e^x)/dx at 0 = %g\n", g);
    return g > 0.999 && g < 1.001 ? 0 : 1;
}

#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include "autodiff.h" /* and so is a second implementation include */
SRC

for std in c99 c11; do
    $CC -std=$std -Wall -Wextra -pedantic -Werror -I"$ROOT" "$OUT/twice.c" -o "$OUT/twice_$std" -lm -lpthread
    "$OUT/twice_$std"
done
