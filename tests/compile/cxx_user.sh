#!/usr/bin/env bash
# C++ user code calls the API from a .cpp file and links with the implementation compiled as C.
# Usage: cxx_user.sh OUTPUT_DIR. Exits non-zero on any failure (skips when g++ is missing).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUTPUT_DIR}/cxx_user
CC=${CC:-cc}
CXX=${CXX:-g++}
mkdir -p "$OUT"
if ! command -v "$CXX" >/dev/null; then
    echo "no C++ compiler ($CXX): skipped"
    exit 0
fi

cat > "$OUT/impl.c" <<'SRC'
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
SRC

cat > "$OUT/user.cpp" <<'SRC'
#include "autodiff.h"
#include <cmath>
#include <cstdio>
#include <vector>

int main()
{
    ad_tape *T = ad_tape_new();
    const int shape[2] = {2, 3};
    std::vector<ad_real> values = {0.5f, -1.0f, 2.0f, 1.5f, 0.0f, -0.5f};
    ad_tensor *x = ad_tensor_new(T, 2, shape, values.data(), 1);
    ad_tensor *loss = ad_sum(T, ad_square(T, ad_tanh(T, x)));
    if (!loss || ad_backward(T, loss) != 0) {
        std::fprintf(stderr, "%s\n", ad_tape_error(T));
        return 1;
    }
    int bad = 0;
    for (size_t i = 0; i < values.size(); i++) {
        double t = std::tanh((double)values[i]), want = 2 * t * (1 - t * t);
        if (std::fabs(x->grad[i] - want) > 1e-5) bad++;
    }
    std::printf("C++: loss %g, d loss / d x[0] = %g\n", (double)ad_item(loss), (double)x->grad[0]);
    ad_tape_free(T);
    return bad ? 1 : 0;
}
SRC

$CC -std=c99 -Wall -Wextra -pedantic -Werror -I"$ROOT" -c "$OUT/impl.c" -o "$OUT/impl.o"
$CXX -std=c++11 -Wall -Wextra -pedantic -Werror -I"$ROOT" -c "$OUT/user.cpp" -o "$OUT/user.o"
$CXX "$OUT/user.o" "$OUT/impl.o" -o "$OUT/cxx_user" -lm -lpthread
"$OUT/cxx_user"
