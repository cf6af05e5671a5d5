/*
 * This file contains the trace settings API (nereid_server_trace_settings,
 * nereid_server_update_trace_settings): global and per-model settings with
 * Triton's fallback and clearing rules, as its HTTP and gRPC trace
 * endpoints show and change them.
 */
#include "core/trace.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/core.h"
#include "core/otlp.h"
#include "core/util.h"
#include "core/trace_internal.h"

/* ---- Settings API ---- */

static nereid_error_t *check_model(nereid_server_t *s, const char *model)
{
    if (!model || !model[0]) return NULL;
    bool ready = false;
    nereid_error_t *err = nereid_server_model_is_ready(s, model, -1, &ready);
    nereid_error_free(err);
    if (ready) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Request for unknown model : %s", model);
}

static const char *mode_name(trace_mode_t m)
{
    return m == MODE_OPENTELEMETRY ? "opentelemetry" : "triton";
}

nereid_error_t *nereid_server_trace_settings(nereid_server_t *server, const char *model,
                                             char **json_out)
{
    *json_out = NULL;
    nereid_tracer_t *t = trace_server_tracer(server);
    if (!t)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "the server does not support tracing");
    nereid_error_t *err = check_model(server, model);
    if (err) return err;
    trace_setting_t *s = setting_for(t, model && model[0] ? model : NULL);
    pthread_mutex_lock(&s->lock);
    int32_t count = s->count;
    pthread_mutex_unlock(&s->lock);
    json_t *doc = json_object();
    json_t *levels = json_array();
    if (s->level == 0) json_array_append_new(levels, json_string("OFF"));
    if (s->level & TRACE_LEVEL_TIMESTAMPS) json_array_append_new(levels, json_string("TIMESTAMPS"));
    if (s->level & TRACE_LEVEL_TENSORS) json_array_append_new(levels, json_string("TENSORS"));
    json_object_set_new(doc, "trace_level", levels);
    char num[32];
    snprintf(num, sizeof num, "%u", s->rate);
    json_object_set_new(doc, "trace_rate", json_string(num));
    snprintf(num, sizeof num, "%d", count);
    json_object_set_new(doc, "trace_count", json_string(num));
    if (s->mode == MODE_TRITON) {
        snprintf(num, sizeof num, "%u", s->log_frequency);
        json_object_set_new(doc, "log_frequency", json_string(num));
        json_object_set_new(doc, "trace_file", json_string(s->file->name));
    }
    json_object_set_new(doc, "trace_mode", json_string(mode_name(s->mode)));
    for (size_t i = 0; i < t->n_config; i++)
        json_object_set_new(doc, t->config_keys[i], json_string(t->config_values[i]));
    setting_unref(s);
    *json_out = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (!*json_out) return nereid_error_new(NEREID_ERROR_INTERNAL, "unable to serialize JSON");
    return NULL;
}

/* Triton's TraceManager::NewSetting. */
typedef struct new_setting {
    bool clear_level, clear_rate, clear_count, clear_log_frequency;
    const uint32_t *level, *rate, *log_frequency;
    const int32_t *count;
} new_setting_t;

static bool fallback_has(nereid_tracer_t *t, const char *model, bool remove)
{
    for (name_node_t **p = &t->fallback_models; *p; p = &(*p)->next)
        if (!strcmp((*p)->name, model)) {
            if (remove) {
                name_node_t *n = *p;
                *p = n->next;
                free(n->name);
                free(n);
            }
            return true;
        }
    return false;
}

/* UpdateTraceSettingInternal; caller holds write_lock. */
static nereid_error_t *update_internal(nereid_tracer_t *t, const char *model,
                                       const new_setting_t *ns)
{
    const trace_setting_t *cur = NULL, *fb;
    model_setting_t *ms = NULL;
    if (model) {
        for (ms = t->models; ms && strcmp(ms->model, model); ms = ms->next)
            ;
        if (ms) cur = ms->setting;
        fb = t->global;
    } else {
        cur = t->global;
        fb = t->global_default;
    }
    uint32_t level = fb->level, rate = fb->rate, log_frequency = fb->log_frequency;
    int32_t count = fb->count;
    const char *file = fb->file->name;
    bool level_set = !ns->clear_level && ((cur && cur->level_set) || ns->level);
    bool rate_set = !ns->clear_rate && ((cur && cur->rate_set) || ns->rate);
    bool count_set = !ns->clear_count && ((cur && cur->count_set) || ns->count);
    bool logf_set =
        !ns->clear_log_frequency && ((cur && cur->log_frequency_set) || ns->log_frequency);
    bool file_set = cur && cur->file_set;
    if (level_set) level = ns->level ? *ns->level : cur->level;
    if (rate_set) rate = ns->rate ? *ns->rate : cur->rate;
    if (count_set) count = ns->count ? *ns->count : cur->count;
    if (logf_set) log_frequency = ns->log_frequency ? *ns->log_frequency : cur->log_frequency;
    if (file_set) file = cur->file->name;
    if (model) {
        bool all = level_set && rate_set && count_set && logf_set && file_set;
        bool none = !(level_set || rate_set || count_set || logf_set || file_set);
        if (all) {
            fallback_has(t, model, true);
        } else if (none) {
            if (ms) {
                pthread_mutex_lock(&t->read_lock);
                for (model_setting_t **p = &t->models; *p; p = &(*p)->next)
                    if (*p == ms) {
                        *p = ms->next;
                        break;
                    }
                pthread_mutex_unlock(&t->read_lock);
                setting_unref(ms->setting);
                free(ms->model);
                free(ms);
            }
            return NULL;
        } else if (!fallback_has(t, model, false)) {
            name_node_t *n = xcalloc(1, sizeof *n);
            n->name = xstrdup(model);
            n->next = t->fallback_models;
            t->fallback_models = n;
        }
    }
    trace_setting_t *s = setting_new(t, level, rate, count, log_frequency, file, fb->mode);
    s->level_set = level_set;
    s->rate_set = rate_set;
    s->count_set = count_set;
    s->log_frequency_set = logf_set;
    s->file_set = file_set;
    if (s->invalid && level != 0) {
        nereid_error_t *err = nereid_error_new(
            NEREID_ERROR_INVALID_ARG, "Attempting to set invalid trace setting :%s", s->invalid);
        setting_unref(s);
        return err;
    }
    trace_setting_t *old;
    pthread_mutex_lock(&t->read_lock);
    if (!model) {
        old = t->global;
        t->global = s;
    } else if (ms) {
        old = ms->setting;
        ms->setting = s;
    } else {
        old = NULL;
        ms = xcalloc(1, sizeof *ms);
        ms->model = xstrdup(model);
        ms->setting = s;
        ms->next = t->models;
        t->models = ms;
    }
    pthread_mutex_unlock(&t->read_lock);
    setting_unref(old);
    return NULL;
}

static nereid_error_t *update(nereid_tracer_t *t, const char *model, const new_setting_t *ns)
{
    pthread_mutex_lock(&t->write_lock);
    nereid_error_t *err = update_internal(t, model, ns);
    if (!err && !model) {
        /* Models that copy global values take the new ones. */
        new_setting_t none = {0};
        size_t n = 0;
        for (name_node_t *f = t->fallback_models; f; f = f->next)
            n++;
        char **names = xcalloc(n ? n : 1, sizeof *names);
        n = 0;
        for (name_node_t *f = t->fallback_models; f; f = f->next)
            names[n++] = xstrdup(f->name);
        for (size_t i = 0; i < n; i++) {
            if (!err) err = update_internal(t, names[i], &none);
            free(names[i]);
        }
        free(names);
    }
    update_active(t);
    pthread_mutex_unlock(&t->write_lock);
    return err;
}

static const nereid_trace_setting_t *find_key(const nereid_trace_setting_t *settings, size_t n,
                                              const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (settings[i].key && !strcmp(settings[i].key, key)) return &settings[i];
    return NULL;
}

/* One number setting: stoi, Triton's texts. */
static nereid_error_t *number_setting(const nereid_trace_setting_t *v, bool grpc, bool is_count,
                                      int *out)
{
    if (grpc && v->n_values > 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect only 1 value for '%s'", v->key);
    const char *text = v->values[0] ? v->values[0] : "";
    num_rc_t rc = cxx_stoi(text, out);
    if (rc == NUM_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Unable to parse '%s', got: %s", v->key,
                                text);
    if (rc == NUM_RANGE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Unable to parse '%s', value is out of range [ %s, %s ], got: %s",
                                v->key, is_count ? "-1" : "0",
                                is_count ? "2147483647" : "4294967295", text);
    if (is_count && *out < -1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Unable to parse 'trace_count'. Expecting value >= -1, got:%s%s",
                                grpc ? " " : "", text);
    return NULL;
}

nereid_error_t *nereid_server_update_trace_settings(nereid_server_t *server, const char *model,
                                                    const nereid_trace_setting_t *settings,
                                                    size_t n, bool grpc, char **json_out)
{
    *json_out = NULL;
    nereid_tracer_t *t = trace_server_tracer(server);
    if (!t)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "the server does not support tracing");
    nereid_error_t *err = check_model(server, model);
    if (err) return err;
    if (grpc && n == 0) return nereid_server_trace_settings(server, model, json_out);
    if (find_key(settings, n, "trace_file"))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "trace file location can not be updated through network protocol");
    new_setting_t ns = {0};
    uint32_t level = 0, rate, log_frequency;
    int32_t count;
    const nereid_trace_setting_t *v = find_key(settings, n, "trace_level");
    if (v) {
        if (v->type_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", v->type_error);
        if (!v->values) {
            ns.clear_level = true;
        } else {
            for (size_t i = 0; i < v->n_values; i++) {
                const char *l = v->values[i] ? v->values[i] : "";
                if (!strcmp(l, "OFF")) {
                    if (v->n_values != 1)
                        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                                "Expect only one trace level 'OFF' is specified");
                    level = 0;
                    ns.level = &level;
                } else if (!strcmp(l, "TIMESTAMPS")) {
                    level |= TRACE_LEVEL_TIMESTAMPS;
                    ns.level = &level;
                } else if (!strcmp(l, "TENSORS")) {
                    level |= TRACE_LEVEL_TENSORS;
                    ns.level = &level;
                }
            }
        }
    }
    static const char *const num_keys[3] = {"trace_rate", "trace_count", "log_frequency"};
    for (int k = 0; k < 3; k++) {
        v = find_key(settings, n, num_keys[k]);
        if (!v) continue;
        if (v->type_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", v->type_error);
        if (!v->values || (grpc && v->n_values == 0)) {
            if (k == 0) ns.clear_rate = true;
            if (k == 1) ns.clear_count = true;
            if (k == 2) ns.clear_log_frequency = true;
            continue;
        }
        int value = 0;
        if (v->n_values == 0) continue;
        if ((err = number_setting(v, grpc, k == 1, &value))) return err;
        if (k == 0) {
            rate = (uint32_t)value;
            ns.rate = &rate;
        } else if (k == 1) {
            count = value;
            ns.count = &count;
        } else {
            log_frequency = (uint32_t)value;
            ns.log_frequency = &log_frequency;
        }
    }
    err = update(t, model && model[0] ? model : NULL, &ns);
    if (err) return err;
    return nereid_server_trace_settings(server, model, json_out);
}
