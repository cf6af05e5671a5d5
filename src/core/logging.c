/*
 * This file contains the runtime log and trace settings API (Triton's logging
 * extension and a trace-settings surface that truthfully reports tracing as
 * off). The log flags themselves live in util.c as atomics.
 */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/util.h"
#include "nereid/server.h"

const char *nereid_log_format_name(nereid_log_format_t format)
{
    return format == NEREID_LOG_FORMAT_ISO8601 ? "ISO8601" : "default";
}

nereid_error_t *nereid_log_format_parse(const char *s, nereid_log_format_t *out)
{
    if (s && !strcmp(s, "default")) {
        *out = NEREID_LOG_FORMAT_DEFAULT;
        return NULL;
    }
    if (s && !strcmp(s, "ISO8601")) {
        *out = NEREID_LOG_FORMAT_ISO8601;
        return NULL;
    }
    return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "invalid argument for --log_format, got: %s",
                            s ? s : "");
}

void nereid_server_log_settings(nereid_server_t *server, nereid_log_settings_t *out)
{
    (void)server;
    out->log_info = atomic_load(&log_info_enabled);
    out->log_warning = atomic_load(&log_warning_enabled);
    out->log_error = atomic_load(&log_error_enabled);
    int v = atomic_load(&log_verbose_level);
    out->log_verbose_level = v < 0 ? 0 : (uint32_t)v;
    out->log_format =
        atomic_load(&log_format_iso8601) ? NEREID_LOG_FORMAT_ISO8601 : NEREID_LOG_FORMAT_DEFAULT;
}

nereid_error_t *nereid_server_update_log_settings(nereid_server_t *server, const bool *log_info,
                                                  const bool *log_warning, const bool *log_error,
                                                  const uint32_t *log_verbose_level_in,
                                                  const char *log_format)
{
    (void)server;
    nereid_log_format_t format = NEREID_LOG_FORMAT_DEFAULT;
    if (log_format) {
        nereid_error_t *err = nereid_log_format_parse(log_format, &format);
        if (err) return err;
    }
    if (log_verbose_level_in && *log_verbose_level_in > INT32_MAX)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "log_verbose_level is out of range");
    if (log_info) atomic_store(&log_info_enabled, *log_info);
    if (log_warning) atomic_store(&log_warning_enabled, *log_warning);
    if (log_error) atomic_store(&log_error_enabled, *log_error);
    if (log_verbose_level_in) atomic_store(&log_verbose_level, (int)*log_verbose_level_in);
    if (log_format) atomic_store(&log_format_iso8601, format == NEREID_LOG_FORMAT_ISO8601);
    return NULL;
}

/* ---- Trace settings (tracing is not implemented: always off) ---- */

/* X(key, fixed value) for the string-valued settings, in Triton's order. */
#define TRACE_FIXED_MAP(X)                                                                         \
    X("trace_rate", "1000")                                                                        \
    X("trace_count", "-1")                                                                         \
    X("log_frequency", "0")                                                                        \
    X("trace_file", "")                                                                            \
    X("trace_mode", "triton")

static nereid_error_t *check_model(nereid_server_t *s, const char *model)
{
    if (!model || !model[0]) return NULL;
    pthread_rwlock_rdlock(&s->lock);
    bool known = repository_find(s, model) != NULL;
    pthread_rwlock_unlock(&s->lock);
    if (known) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Request for unknown model : %s", model);
}

nereid_error_t *nereid_server_trace_settings(nereid_server_t *server, const char *model,
                                             char **json_out)
{
    *json_out = NULL;
    nereid_error_t *err = check_model(server, model);
    if (err) return err;
    json_t *doc = json_object();
    json_t *levels = json_array();
    json_array_append_new(levels, json_string("OFF"));
    json_object_set_new(doc, "trace_level", levels);
#define X(key, value) json_object_set_new(doc, key, json_string(value));
    TRACE_FIXED_MAP(X)
#undef X
    *json_out = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (!*json_out) return nereid_error_new(NEREID_ERROR_INTERNAL, "unable to serialize JSON");
    return NULL;
}

static nereid_error_t *check_trace_level(const nereid_trace_setting_t *t)
{
    for (size_t i = 0; i < t->n_values; i++) {
        const char *v = t->values[i] ? t->values[i] : "";
        if (!strcmp(v, "TIMESTAMPS") || !strcmp(v, "TENSORS"))
            return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                    "tracing is not supported by this server: trace_level '%s' "
                                    "can not be enabled",
                                    v);
        if (strcmp(v, "OFF"))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Unsupported trace level specified: %s", v);
    }
    return NULL;
}

static nereid_error_t *check_fixed(const nereid_trace_setting_t *t, const char *fixed)
{
    if (t->n_values == 0) return NULL;
    if (t->n_values > 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect only 1 value for '%s'", t->key);
    const char *v = t->values[0] ? t->values[0] : "";
    if (!strcmp(v, fixed)) return NULL;
    return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                            "tracing is not supported by this server: '%s' can not be changed "
                            "from '%s'",
                            t->key, fixed);
}

nereid_error_t *nereid_server_update_trace_settings(nereid_server_t *server, const char *model,
                                                    const nereid_trace_setting_t *settings,
                                                    size_t n_settings, char **json_out)
{
    *json_out = NULL;
    nereid_error_t *err = check_model(server, model);
    for (size_t i = 0; !err && i < n_settings; i++) {
        const nereid_trace_setting_t *t = &settings[i];
        const char *key = t->key ? t->key : "";
        if (!strcmp(key, "trace_level")) {
            err = check_trace_level(t);
            continue;
        }
#define X(k, value)                                                                                \
    if (!strcmp(key, k)) {                                                                         \
        err = check_fixed(t, value);                                                               \
        continue;                                                                                  \
    }
        TRACE_FIXED_MAP(X)
#undef X
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unknown trace setting '%s'", key);
    }
    if (err) return err;
    return nereid_server_trace_settings(server, model, json_out);
}
