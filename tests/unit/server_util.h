/*
 * This file contains helpers for unit tests that drive a server through the
 * in-process API on top of test_util.h: a millisecond clock and JSON
 * document lookups (repository index rows, statistics counters).
 */
#ifndef NEREID_SERVER_UTIL_H
#define NEREID_SERVER_UTIL_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The repository index row for name (and version, NULL = the model row),
 * as a new JSON object, or NULL. */
static inline json_t *index_row(nereid_server_t *s, const char *name, const char *version)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_repository_index(s, false, &text);
    if (err) {
        nereid_error_free(err);
        return NULL;
    }
    json_t *arr = json_loads(text, 0, NULL);
    free(text);
    json_t *found = NULL;
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row)
    {
        const char *n = json_string_value(json_object_get(row, "name"));
        const char *v = json_string_value(json_object_get(row, "version"));
        if (!n || strcmp(n, name) != 0) continue;
        if (version && (!v || strcmp(v, version) != 0)) continue;
        found = json_incref(row);
        break;
    }
    json_decref(arr);
    return found;
}

static inline const char *row_str(json_t *row, const char *key)
{
    const char *v = row ? json_string_value(json_object_get(row, key)) : NULL;
    return v ? v : "";
}

/* A statistics counter: model_stats[0].<path> for model/version. */
static inline long long stat_value(nereid_server_t *s, const char *model, int64_t version,
                                   const char *field, const char *sub)
{
    json_t *st = model_stats_json(s, model, version);
    json_t *v = json_object_get(st, field);
    if (sub) v = json_object_get(json_object_get(v, sub), "count");
    long long r = v ? json_integer_value(v) : -1;
    json_decref(st);
    return r;
}

/* An inference's outcome as text: NULL when it succeeded, else the error
 * message of err (its submission) or of resp (static buffer); frees both. */
static inline const char *outcome_text(nereid_error_t *err, nereid_response_t *resp)
{
    static char msg[512];
    const char *r = NULL;
    if (err) {
        snprintf(msg, sizeof msg, "%s", nereid_error_message(err));
        r = msg;
    } else if (resp && nereid_response_error(resp)) {
        snprintf(msg, sizeof msg, "%s", nereid_error_message(nereid_response_error(resp)));
        r = msg;
    }
    nereid_error_free(err);
    nereid_response_free(resp);
    return r;
}

#endif
