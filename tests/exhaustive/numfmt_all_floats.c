/*
 * This file contains the exhaustive float check of the JSON number converters
 * (`make test-exhaustive`, not part of `make test`): every one of the 2^32
 * float bit patterns is widened to double and printed as Triton prints FP32,
 * then parsed back and rounded to float, which must give the same bits (NaN
 * and the infinities must print as "NaN", "Infinity", "-Infinity"), and the
 * text must be rapidjson's plain dtoa's (numfmt_double's short-decimal
 * shortcut prints exactly what Grisu2 prints). Runs on
 * NEREID_THREADS threads (default 2); a few minutes.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/numfmt.h"

typedef struct slice {
    uint64_t begin, end, failed;
} slice_t;

static void *run(void *arg)
{
    slice_t *s = arg;
    char text[64], grisu[64];
    for (uint64_t u = s->begin; u < s->end; u++) {
        uint32_t bits = (uint32_t)u;
        float f;
        memcpy(&f, &bits, 4);
        char *e = numfmt_double(text, (double)f);
        *e = '\0';
        *numfmt_double_grisu(grisu, (double)f) = '\0';
        bool ok = !strcmp(text, grisu);
        if ((bits & 0x7F800000U) == 0x7F800000U) {
            const char *want = bits & 0x007FFFFFU ? "NaN" : bits >> 31 ? "-Infinity" : "Infinity";
            ok = ok && !strcmp(text, want);
        } else {
            double d;
            const char *end = numfmt_parse_double(text, e, &d);
            float back = (float)d;
            ok = ok && end == e && !memcmp(&back, &f, 4);
        }
        if (!ok && s->failed++ < 10)
            fprintf(stderr, "float 0x%08" PRIx32 " printed as %s (Grisu2: %s) does not read back\n",
                    bits, text, grisu);
    }
    return NULL;
}

int main(void)
{
    const char *env = getenv("NEREID_THREADS");
    int n = env && atoi(env) > 0 ? atoi(env) : 2;
    if (n > 64) n = 64;
    pthread_t t[64];
    slice_t s[64];
    uint64_t total = 1ULL << 32;
    for (int i = 0; i < n; i++) {
        s[i] = (slice_t){total * (uint64_t)i / (uint64_t)n, total * (uint64_t)(i + 1) / (uint64_t)n,
                         0};
        if (pthread_create(&t[i], NULL, run, &s[i])) return 2;
    }
    uint64_t failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        failed += s[i].failed;
    }
    printf("%" PRIu64 " float bit patterns, %" PRIu64 " failed\n", total, failed);
    return failed ? 1 : 0;
}
