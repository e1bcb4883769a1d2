/* params_compare.c - how far apart the parameters of two checkpoints are.

   Usage: params_compare A.ckpt B.ckpt [BOUND]
   Both must hold the same parameters (names and shapes). For each parameter it takes the
   largest |a - b| over its elements, relative to the largest |a| of that parameter, and prints
   the largest of these over all parameters, with the parameter's name:
       largest relative difference: 3.1e-07 (fc1.weight)
   Exits 0 when that is at most BOUND (default 0: identical values), 1 when it is above, 2 when
   a file cannot be read or the parameters do not match. */
#define AUTODIFF_IMPLEMENTATION
#include "autodiff.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    char err[512];
    ad_params *A, *B;
    double bound = argc > 3 ? atof(argv[3]) : 0, worst = 0;
    const char *worst_name = "-";
    int id, n, rc;
    if (argc < 3) {
        fprintf(stderr, "usage: %s A.ckpt B.ckpt [BOUND]\n", argv[0]);
        return 2;
    }
    A = ad_params_load(argv[1], err, sizeof err);
    if (!A) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    B = ad_params_load(argv[2], err, sizeof err);
    if (!B) {
        fprintf(stderr, "%s\n", err);
        ad_params_free(A);
        return 2;
    }
    n = ad_params_count(A);
    if (n != ad_params_count(B)) {
        fprintf(stderr, "%s holds %d parameters, %s %d\n", argv[1], n, argv[2], ad_params_count(B));
        return 2;
    }
    for (id = 0; id < n; id++) {
        ad_param_info a = ad_params_info(A, id), b = ad_params_info(B, id);
        double largest = 0, diff = 0;
        size_t i;
        if (strcmp(a.name, b.name) != 0 || a.size != b.size) {
            fprintf(stderr, "parameter %d: %s of %zu values in %s, %s of %zu in %s\n", id, a.name, a.size, argv[1],
                    b.name, b.size, argv[2]);
            return 2;
        }
        for (i = 0; i < a.size; i++) {
            largest = fmax(largest, fabs((double)a.value[i]));
            diff = fmax(diff, fabs((double)a.value[i] - (double)b.value[i]));
        }
        if (largest > 0) diff /= largest;
        if (diff > worst) {
            worst = diff;
            worst_name = a.name;
        }
    }
    printf("largest relative difference: %.3g (%s)\n", worst, worst_name);
    rc = worst <= bound ? 0 : 1;
    ad_params_free(A);
    ad_params_free(B);
    return rc;
}
