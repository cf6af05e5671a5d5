/*
 * This file contains the server side of a Python model's pb_utils calls
 * besides inference: custom metrics and model control (python_api.h).
 *
 * Metrics: the worker's MetricFamily and Metric objects are handles into a
 * per-worker table of the core's nereid_metric_family_t / nereid_metric_t
 * (backend.h, ABI 1.7), so Python models and Triton backends share one
 * registry and one /metrics text. A handle is a table index + 1; freed
 * slots are reused; a worker holds at most MAX_HANDLES. Deleting a family
 * first deletes the worker's metrics of it, as Triton's stub does. Numbers
 * travel as decimal strings ("inf" and "nan" included: JSON has neither).
 *
 * Model control runs Triton's rules through server.h: load and unload are
 * refused unless the server is in explicit mode, with the server's text.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "python_api.h"

#define MAX_HANDLES 65536
#define MAX_LABELS 256
#define MAX_BUCKETS 4096
#define MAX_FILES 4096
#define MAX_PARAMETERS 1024

typedef struct handle {
    nereid_metric_family_t *family; /* a family slot, or NULL */
    nereid_metric_t *metric;        /* a metric slot, or NULL (both NULL: free) */
    size_t family_slot;             /* a metric's family */
} handle_t;

struct python_api {
    pthread_mutex_t mu;
    handle_t *slots;
    size_t n_slots;
};

python_api_t *python_api_new(void)
{
    python_api_t *api = calloc(1, sizeof *api);
    if (!api) abort();
    pthread_mutex_init(&api->mu, NULL);
    return api;
}

static void delete_metrics_of(python_api_t *api, size_t family_slot)
{
    for (size_t i = 0; i < api->n_slots; i++)
        if (api->slots[i].metric && api->slots[i].family_slot == family_slot) {
            nereid_error_free(nereid_metric_delete(api->slots[i].metric));
            api->slots[i].metric = NULL;
        }
}

void python_api_reset(python_api_t *api)
{
    pthread_mutex_lock(&api->mu);
    for (size_t i = 0; i < api->n_slots; i++)
        if (api->slots[i].metric) nereid_error_free(nereid_metric_delete(api->slots[i].metric));
    for (size_t i = 0; i < api->n_slots; i++)
        if (api->slots[i].family)
            nereid_error_free(nereid_metric_family_delete(api->slots[i].family));
    free(api->slots);
    api->slots = NULL;
    api->n_slots = 0;
    pthread_mutex_unlock(&api->mu);
}

void python_api_free(python_api_t *api)
{
    if (!api) return;
    python_api_reset(api);
    pthread_mutex_destroy(&api->mu);
    free(api);
}

static json_t *error_answer(const char *prefix, const char *text)
{
    char msg[4096];
    snprintf(msg, sizeof msg, "%s%s", prefix, text);
    return json_pack("{s:{s:s, s:i}}", "error", "message", msg, "code", (int)NEREID_ERROR_INTERNAL);
}

static json_t *error_from(const char *prefix, nereid_error_t *err)
{
    json_t *a = error_answer(prefix, nereid_error_message(err));
    nereid_error_free(err);
    return a;
}

/* A number the worker sent as a decimal string (strtod's syntax). */
static bool number(json_t *j, double *out)
{
    const char *s = json_string_value(j);
    if (!s || !*s || strlen(s) > 64) return false;
    char *end;
    *out = strtod(s, &end);
    return *end == '\0';
}

/* The slot of a live handle of the wanted sort, or -1. Caller holds mu. */
static long slot_of(python_api_t *api, json_t *jh, bool family)
{
    if (!json_is_integer(jh)) return -1;
    json_int_t h = json_integer_value(jh);
    if (h < 1 || (size_t)h > api->n_slots) return -1;
    handle_t *s = &api->slots[h - 1];
    return (family ? s->family != NULL : s->metric != NULL) ? (long)(h - 1) : -1;
}

/* A free slot (grown on demand), or -1 at MAX_HANDLES. Caller holds mu. */
static long free_slot(python_api_t *api)
{
    for (size_t i = 0; i < api->n_slots; i++)
        if (!api->slots[i].family && !api->slots[i].metric) return (long)i;
    if (api->n_slots == MAX_HANDLES) return -1;
    size_t n = api->n_slots ? api->n_slots * 2 : 8;
    if (n > MAX_HANDLES) n = MAX_HANDLES;
    handle_t *grown = realloc(api->slots, n * sizeof *grown);
    if (!grown) abort();
    memset(grown + api->n_slots, 0, (n - api->n_slots) * sizeof *grown);
    api->slots = grown;
    long i = (long)api->n_slots;
    api->n_slots = n;
    return i;
}

static json_t *family_new(python_api_t *api, json_t *call)
{
    static const char *const prefix = "Error when creating MetricFamily: ";
    const char *name = json_string_value(json_object_get(call, "name"));
    const char *desc = json_string_value(json_object_get(call, "description"));
    json_t *jk = json_object_get(call, "kind");
    if (!name || !desc || !json_is_integer(jk))
        return error_answer(prefix, "name, description and kind are required");
    nereid_metric_family_t *f = NULL;
    nereid_error_t *err =
        nereid_metric_family_new((nereid_metric_kind_t)json_integer_value(jk), name, desc, &f);
    if (err) return error_from(prefix, err);
    long i = free_slot(api);
    if (i < 0) {
        nereid_error_free(nereid_metric_family_delete(f));
        return error_answer(prefix, "too many metric families and metrics in one model instance");
    }
    api->slots[i] = (handle_t){.family = f};
    return json_pack("{s:I}", "handle", (json_int_t)i + 1);
}

static json_t *metric_new(python_api_t *api, json_t *call)
{
    static const char *const prefix = "Error when creating Metric: ";
    long fs = slot_of(api, json_object_get(call, "family"), true);
    json_t *jl = json_object_get(call, "labels"), *jb = json_object_get(call, "buckets");
    if (fs < 0)
        return error_answer(prefix, "Invalid metric operation as the corresponding "
                                    "'MetricFamily' has been deleted.");
    if (!json_is_object(jl) || json_object_size(jl) > MAX_LABELS)
        return error_answer(prefix, "labels must be a dictionary of at most 256 strings");
    if (!json_is_null(jb) && !(json_is_array(jb) && json_array_size(jb) <= MAX_BUCKETS))
        return error_answer(prefix, "buckets must be a list of at most 4096 numbers");
    size_t n_labels = json_object_size(jl), n_buckets = json_is_array(jb) ? json_array_size(jb) : 0;
    const char **names = calloc(2 * n_labels + 1, sizeof *names);
    double *buckets = calloc(n_buckets + 1, sizeof *buckets);
    if (!names || !buckets) abort();
    const char **values = names + n_labels;
    json_t *answer = NULL;
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(jl, key, val)
    {
        if (!json_is_string(val)) {
            answer = error_answer(prefix, "label values must be strings");
            break;
        }
        names[k] = key;
        values[k++] = json_string_value(val);
    }
    for (size_t i = 0; !answer && i < n_buckets; i++)
        if (!number(json_array_get(jb, i), &buckets[i]))
            answer = error_answer(prefix, "buckets must be numbers");
    if (!answer) {
        nereid_metric_t *m = NULL;
        nereid_error_t *err = nereid_metric_new(api->slots[fs].family, names, values, n_labels,
                                                json_is_array(jb) ? buckets : NULL, n_buckets, &m);
        long i = err ? -1 : free_slot(api);
        if (err) {
            answer = error_from(prefix, err);
        } else if (i < 0) {
            nereid_error_free(nereid_metric_delete(m));
            answer = error_answer(prefix, "too many metric families and metrics in one model "
                                          "instance");
        } else {
            api->slots[i] = (handle_t){.metric = m, .family_slot = (size_t)fs};
            answer = json_pack("{s:I}", "handle", (json_int_t)i + 1);
        }
    }
    free(names);
    free(buckets);
    return answer;
}

static json_t *metric_op(python_api_t *api, json_t *call)
{
    const char *action = json_string_value(json_object_get(call, "action"));
    static const struct {
        const char *action, *prefix;
    } ops[] = {{"increment", "Failed to increment metric value: "},
               {"set", "Failed to set metric value: "},
               {"observe", "Failed to observe metric value: "},
               {"value", "Failed to get metric value: "}};
    size_t op = 0;
    while (op < 4 && !(action && strcmp(action, ops[op].action) == 0))
        op++;
    if (op == 4) return error_answer("", "Unknown metric operation");
    long ms = slot_of(api, json_object_get(call, "handle"), false);
    if (ms < 0)
        return error_answer(ops[op].prefix, "Invalid metric operation as the corresponding "
                                            "'MetricFamily' has been deleted.");
    nereid_metric_t *m = api->slots[ms].metric;
    double v = 0;
    if (op < 3 && !number(json_object_get(call, "value"), &v))
        return error_answer(ops[op].prefix, "the value must be a number");
    nereid_error_t *err = op == 0   ? nereid_metric_increment(m, v)
                          : op == 1 ? nereid_metric_set(m, v)
                          : op == 2 ? nereid_metric_observe(m, v)
                                    : nereid_metric_value(m, &v);
    if (err) return error_from(ops[op].prefix, err);
    if (op < 3) return json_object();
    char text[64];
    snprintf(text, sizeof text, "%.17g", v);
    return json_pack("{s:s}", "value", text);
}

json_t *python_api_metrics(python_api_t *api, json_t *call)
{
    const char *op = json_string_value(json_object_get(call, "op"));
    if (!op) return error_answer("", "a call without an op");
    pthread_mutex_lock(&api->mu);
    json_t *answer;
    if (!strcmp(op, "family_new")) {
        answer = family_new(api, call);
    } else if (!strcmp(op, "metric_new")) {
        answer = metric_new(api, call);
    } else if (!strcmp(op, "metric")) {
        answer = metric_op(api, call);
    } else if (!strcmp(op, "family_delete") || !strcmp(op, "metric_delete")) {
        /* a batch of handles the worker's objects gave up */
        bool family = op[0] == 'f';
        size_t i;
        json_t *jh;
        json_array_foreach(json_object_get(call, "handles"), i, jh)
        {
            long s = slot_of(api, jh, family);
            if (s < 0) continue;
            if (family) {
                delete_metrics_of(api, (size_t)s);
                nereid_error_free(nereid_metric_family_delete(api->slots[s].family));
                api->slots[s].family = NULL;
            } else {
                nereid_error_free(nereid_metric_delete(api->slots[s].metric));
                api->slots[s].metric = NULL;
            }
        }
        answer = json_object();
    } else {
        answer = error_answer("", "unknown call");
    }
    pthread_mutex_unlock(&api->mu);
    return answer;
}

bool python_api_blocks(json_t *call)
{
    const char *op = json_string_value(json_object_get(call, "op"));
    return op && (!strcmp(op, "load_model") || !strcmp(op, "unload_model") ||
                  !strcmp(op, "is_model_ready"));
}

static json_t *load_model(nereid_server_t *server, json_t *call, const char *model,
                          const uint8_t *blob, size_t blob_len)
{
    static const char *const prefix = "Failed to load model: ";
    const char *config = json_string_value(json_object_get(call, "config"));
    json_t *files = json_object_get(call, "tensors"); /* UINT8 tensors named by path */
    if (!files)
        files = json_array();
    else
        json_incref(files);
    if (!config || !json_is_array(files) || json_array_size(files) > MAX_FILES) {
        json_decref(files);
        return error_answer(prefix, "malformed load_model call");
    }
    size_t n = json_array_size(files);
    const char **paths = calloc(n + 1, sizeof *paths);
    const void **contents = calloc(n + 1, sizeof *contents);
    size_t *sizes = calloc(n + 1, sizeof *sizes);
    if (!paths || !contents || !sizes) abort();
    json_t *answer = NULL;
    for (size_t i = 0; i < n && !answer; i++) {
        json_t *f = json_array_get(files, i);
        const char *path = json_string_value(json_object_get(f, "name"));
        json_t *jo = json_object_get(f, "offset"), *js = json_object_get(f, "size");
        if (!path || !json_is_integer(jo) || !json_is_integer(js) || json_integer_value(jo) < 0 ||
            json_integer_value(js) < 0 || (uint64_t)json_integer_value(jo) > blob_len ||
            (uint64_t)json_integer_value(js) > blob_len - (uint64_t)json_integer_value(jo)) {
            answer = error_answer(prefix, "malformed load_model file");
            break;
        }
        if (strncmp(path, "file:", 5) != 0) {
            char text[1024];
            snprintf(text, sizeof text, "Unrecognized load parameter '%.900s'.", path);
            answer = error_answer(prefix, text);
            break;
        }
        paths[i] = path + 5;
        contents[i] = blob + json_integer_value(jo);
        sizes[i] = (size_t)json_integer_value(js);
    }
    if (!answer) {
        nereid_error_t *err = nereid_server_load_model(server, model, *config ? config : NULL,
                                                       paths, contents, sizes, n);
        answer = err ? error_from(prefix, err) : json_object();
    }
    free(paths);
    free(contents);
    free(sizes);
    json_decref(files);
    return answer;
}

json_t *python_api_model_control(nereid_server_t *server, json_t *call, const uint8_t *blob,
                                 size_t blob_len)
{
    const char *op = json_string_value(json_object_get(call, "op"));
    const char *model = json_string_value(json_object_get(call, "model"));
    if (!op || !model) return error_answer("", "malformed model control call");
    if (!strcmp(op, "load_model")) return load_model(server, call, model, blob, blob_len);
    if (!strcmp(op, "unload_model")) {
        /* Triton's: returns once the model is out of service; its drain
         * may wait for the request that made this call. */
        nereid_error_t *err = nereid_server_unload_model_async(
            server, model, json_is_true(json_object_get(call, "unload_dependents")));
        return err ? error_from("Failed to unload model: ", err) : json_object();
    }
    static const char *const prefix = "Failed to check model readiness: ";
    const char *version = json_string_value(json_object_get(call, "version"));
    if (!version) return error_answer(prefix, "malformed is_model_ready call");
    long long v = -1;
    if (*version) {
        char *end;
        v = strtoll(version, &end, 10);
        if (*end || v < 0) {
            char text[512];
            snprintf(text, sizeof text,
                     "failed to get model version from specified version string '%.200s', "
                     "version should be an integral value > 0",
                     version);
            return error_answer(prefix, text);
        }
    }
    bool ready = false;
    nereid_error_t *err = nereid_server_model_is_ready(server, model, v, &ready);
    nereid_error_free(err); /* an unknown model is not ready */
    return json_pack("{s:b}", "ready", ready && !err);
}

nereid_error_t *python_api_response_parameters(json_t *params, nereid_batch_t *batch, size_t r,
                                               nereid_response_sender_t *sender)
{
    if (!params) return NULL;
    if (!json_is_object(params) || json_object_size(params) > MAX_PARAMETERS)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "response parameters must be a dictionary of at most %d entries",
                                MAX_PARAMETERS);
    const char *key;
    json_t *val;
    json_object_foreach(params, key, val)
    {
        nereid_parameter_type_t type;
        const void *value;
        int64_t i;
        bool b;
        if (json_is_string(val)) {
            type = NEREID_PARAMETER_STRING;
            value = json_string_value(val);
        } else if (json_is_boolean(val)) {
            type = NEREID_PARAMETER_BOOL;
            b = json_is_true(val);
            value = &b;
        } else if (json_is_integer(val)) {
            type = NEREID_PARAMETER_INT;
            i = json_integer_value(val);
            value = &i;
        } else {
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "Expect parameters values to have type bool/int/str");
        }
        nereid_error_t *err =
            sender ? nereid_sender_set_parameter(sender, key, type, value)
                   : nereid_batch_request_set_response_parameter(batch, r, key, type, value);
        if (err) return err;
    }
    return NULL;
}

json_t *python_api_parameter_json(int type, const void *value)
{
    return type == NEREID_PARAMETER_STRING ? json_string(value)
           : type == NEREID_PARAMETER_INT  ? json_integer(*(const int64_t *)value)
           : type == NEREID_PARAMETER_BOOL ? json_boolean(*(const bool *)value)
                                           : json_real(*(const double *)value);
}

json_t *python_api_response_parameters_json(const nereid_response_t *resp)
{
    size_t n = nereid_response_parameter_count(resp);
    if (!n) return NULL;
    json_t *o = json_object();
    for (size_t i = 0; i < n; i++) {
        const char *name;
        int type;
        const void *value;
        nereid_response_parameter(resp, i, &name, &type, &value);
        json_object_set_new(o, name, python_api_parameter_json(type, value));
    }
    return o;
}
