/*
 * This file contains nereid_error_t: a Triton error code plus a message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nereid/server.h"

struct nereid_error {
    nereid_error_code_t code;
    char *message;
};

/* Returned when even the error cannot be allocated; never freed. */
static struct nereid_error oom_error = {NEREID_ERROR_INTERNAL, "out of memory"};

nereid_error_t *nereid_error_new(nereid_error_code_t code, const char *fmt, ...)
{
    nereid_error_t *err = malloc(sizeof *err);
    if (!err) return &oom_error;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&err->message, fmt, ap);
    va_end(ap);
    if (n < 0) {
        free(err);
        return &oom_error;
    }
    err->code = code;
    return err;
}

nereid_error_code_t nereid_error_code(const nereid_error_t *err)
{
    return err->code;
}

const char *nereid_error_message(const nereid_error_t *err)
{
    return err->message;
}

const char *nereid_error_code_name(nereid_error_code_t code)
{
    switch (code) {
#define X(e, s)                                                                                    \
    case NEREID_ERROR_##e:                                                                         \
        return s;
        NEREID_ERROR_CODE_MAP(X)
#undef X
    }
    return "Unknown";
}

void nereid_error_free(nereid_error_t *err)
{
    if (!err || err == &oom_error) return;
    free(err->message);
    free(err);
}
