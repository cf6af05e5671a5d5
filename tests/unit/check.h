/*
 * This file contains the unit tests' tiny assertion helpers: CHECK records a
 * failure and continues (CHECK_MSG adds a note, CHECK_STR compares strings,
 * CHECK_STR_CONTAINS looks for a substring, CHECK_ERROR checks a
 * nereid_error_t's code and text); check_summary prints
 * "N passed, N failed".
 */
#ifndef NEREID_CHECK_H
#define NEREID_CHECK_H

#include <stdio.h>
#include <string.h>

/* Atomic: checks run on several threads in the concurrency tests. */
static _Atomic int check_passed, check_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

/* CHECK with a printf-style note (format and arguments) printed on failure. */
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (h_ && strstr(h_, n_)) {                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: expected '%s' to contain '%s'\n", __FILE__, __LINE__,          \
                    h_ ? h_ : "(null)", n_);                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_STR(got, want)                                                                       \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        if (g_ && strcmp(g_, w_) == 0) {                                                           \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: got \"%s\", want \"%s\"\n", __FILE__, __LINE__,                \
                    g_ ? g_ : "(null)", w_);                                                       \
        }                                                                                          \
    } while (0)

/* err (a nereid_error_t *, freed here) is an error with this code whose
 * message contains text. */
#define CHECK_ERROR(err, code, text)                                                               \
    do {                                                                                           \
        nereid_error_t *e_ = (err);                                                                \
        CHECK(e_ != NULL);                                                                         \
        if (e_) {                                                                                  \
            CHECK(nereid_error_code(e_) == (code));                                                \
            CHECK_STR_CONTAINS(nereid_error_message(e_), text);                                    \
            nereid_error_free(e_);                                                                 \
        }                                                                                          \
    } while (0)

/* err (a nereid_error_t *, freed here) is NULL; else its message is shown. */
#define CHECK_OK(err)                                                                              \
    do {                                                                                           \
        nereid_error_t *o_ = (err);                                                                \
        CHECK_MSG(o_ == NULL, "unexpected error: %s", o_ ? nereid_error_message(o_) : "");         \
        if (o_) nereid_error_free(o_);                                                             \
    } while (0)

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
