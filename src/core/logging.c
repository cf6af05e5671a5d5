/*
 * This file contains the runtime log settings API (Triton's logging
 * extension). The log flags themselves live in util.c as atomics; trace
 * settings are in trace.c.
 */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "core/core.h"
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
    out->log_file = log_file_path();
}

nereid_error_t *nereid_log_set_file(const char *path)
{
    return log_open_file(path);
}

void nereid_log_message(nereid_log_level_t level, const char *file, int line, const char *msg)
{
    static const char letters[] = {'I', 'W', 'E', 'V'};
    if ((unsigned)level >= sizeof letters) return;
    if (level == NEREID_LOG_VERBOSE && atomic_load(&log_verbose_level) <= 0) return;
    log_write(letters[level], file ? file : "", line, NULL, msg ? msg : "");
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
