#!/usr/bin/env bash
# Declarations in one translation unit, the implementation in another: build both, link, run.
# Usage: two_units.sh OUTPUT_DIR. Exits non-zero on any failure.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUTPUT_DIR}/two_units
CC=${CC:-cc}
FLAGS="-std=c99 -Wall -Wextra -pedantic -Werror -I$ROOT"
mkdir -p "$OUT"

cat > "$OUT/impl.c" <<'SRC'
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
SRC

cat > "$OUT/user.c" <<'SRC'
/* uses the library through its declarations only */
#include "autodiff.h"
#include <stdio.h>

int main(void)
{
    ad_tape *T = ad_tape_new();
    ad_tensor *a = ad_var(T, 4), *b = ad_var(T, 3);
    ad_tensor *d = ad_mul(T, a, ad_add(T, a, b)); /* d = a (a + b) */
    int ok;
    if (ad_backward(T, d) != 0) {
        fprintf(stderr, "%s\n", ad_tape_error(T));
        return 1;
    }
    printf("d = %g, dd/da = %g, dd/db = %g\n", ad_item(d), ad_grad_item(a), ad_grad_item(b));
    ok = ad_item(d) == 28 && ad_grad_item(a) == 11 && ad_grad_item(b) == 4;
    ad_tape_free(T);
    return ok ? 0 : 1;
}
SRC

$CC $FLAGS -c "$OUT/impl.c" -o "$OUT/impl.o"
$CC $FLAGS -c "$OUT/user.c" -o "$OUT/user.o"
$CC "$OUT/user.o" "$OUT/impl.o" -o "$OUT/two_units" -lm -lpthread
"$OUT/two_units"
# the declarations alone must not define any library function
if nm "$OUT/user.o" | grep -E ' [TtDd] ad_' >/dev/null; then
    echo "user.o defines library symbols" >&2
    exit 1
fi
