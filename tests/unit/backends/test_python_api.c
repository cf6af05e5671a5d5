/*
 * This file contains unit tests of the python backend's pb_utils calls
 * besides inference (backends/python/python_api.c, included here): what a
 * buggy or hostile worker can send — missing and mistyped fields, unknown,
 * stale and out-of-range handles, too many labels or buckets, numbers JSON
 * cannot carry, load_model files outside the message — gets an error
 * answer, and the metrics it made leave /metrics when it is reset.
 */
#include "../../../backends/python/python_api.c"

#include "check.h"
#include "core/custom_metrics.h"

static char *page(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    custom_metrics_text(out);
    fclose(out);
    return buf;
}

/* The answer to call (JSON text); error text or NULL, handle in *handle. */
static char *ask(python_api_t *api, const char *call, json_int_t *handle)
{
    json_t *c = json_loads(call, 0, NULL);
    if (!c) abort();
    json_t *a = python_api_metrics(api, c);
    json_decref(c);
    const char *msg = json_string_value(json_object_get(json_object_get(a, "error"), "message"));
    char *out = msg ? strdup(msg) : NULL;
    if (handle) *handle = json_integer_value(json_object_get(a, "handle"));
    json_decref(a);
    return out;
}

#define CHECK_ANSWER(api, call, want)                                                              \
    do {                                                                                           \
        char *e_ = ask(api, call, NULL);                                                           \
        CHECK_MSG(e_ &&strstr(e_, want), "%s -> %s", call, e_ ? e_ : "(ok)");                      \
        free(e_);                                                                                  \
    } while (0)

static void test_hostile_metric_calls(void)
{
    python_api_t *api = python_api_new();
    CHECK_ANSWER(api, "{}", "a call without an op");
    CHECK_ANSWER(api, "{\"op\": 7}", "a call without an op");
    CHECK_ANSWER(api, "{\"op\": \"nope\"}", "unknown call");
    CHECK_ANSWER(api, "{\"op\": \"family_new\", \"name\": 1}", "name, description and kind");
    CHECK_ANSWER(api,
                 "{\"op\": \"family_new\", \"name\": \"a\", \"description\": \"\", \"kind\": 9}",
                 "Unsupported kind");
    json_int_t fam = 0, met = 0;
    char *e = ask(api,
                  "{\"op\": \"family_new\", \"name\": \"h_total\", \"description\": \"d\", "
                  "\"kind\": 0}",
                  &fam);
    CHECK(e == NULL && fam == 1);
    free(e);
    /* handles: unknown, of the wrong sort, out of range, not integers */
    static const char *const bad_handles[] = {"0",   "-1",    "99",
                                              "1.0", "\"1\"", "9223372036854775807"};
    for (size_t i = 0; i < sizeof bad_handles / sizeof *bad_handles; i++) {
        char call[256];
        snprintf(call, sizeof call,
                 "{\"op\": \"metric_new\", \"family\": %s, \"labels\": {}, \"buckets\": null}",
                 bad_handles[i]);
        CHECK_ANSWER(api, call, "has been deleted");
        snprintf(call, sizeof call,
                 "{\"op\": \"metric\", \"handle\": %s, \"action\": \"value\", \"value\": \"0\"}",
                 bad_handles[i]);
        CHECK_ANSWER(api, call, "has been deleted");
    }
    CHECK_ANSWER(api, "{\"op\": \"metric_new\", \"family\": 1, \"labels\": [], \"buckets\": null}",
                 "labels must be a dictionary");
    CHECK_ANSWER(api,
                 "{\"op\": \"metric_new\", \"family\": 1, \"labels\": {\"a\": 1}, "
                 "\"buckets\": null}",
                 "label values must be strings");
    CHECK_ANSWER(api, "{\"op\": \"metric_new\", \"family\": 1, \"labels\": {}, \"buckets\": 3}",
                 "buckets must be a list");
    CHECK_ANSWER(api,
                 "{\"op\": \"metric_new\", \"family\": 1, \"labels\": {}, \"buckets\": [\"x\"]}",
                 "buckets must be numbers");
    /* too many labels */
    char *big = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&big, &len);
    fputs("{\"op\": \"metric_new\", \"family\": 1, \"buckets\": null, \"labels\": {", out);
    for (int i = 0; i < 300; i++)
        fprintf(out, "%s\"l%d\": \"v\"", i ? "," : "", i);
    fputs("}}", out);
    fclose(out);
    CHECK_ANSWER(api, big, "at most 256");
    free(big);
    /* a family handle is not a metric handle */
    CHECK_ANSWER(api,
                 "{\"op\": \"metric\", \"handle\": 1, \"action\": \"increment\", \"value\": \"1\"}",
                 "has been deleted");
    e = ask(
        api,
        "{\"op\": \"metric_new\", \"family\": 1, \"labels\": {\"m\": \"x\"}, \"buckets\": null}",
        &met);
    CHECK(e == NULL && met == 2);
    free(e);
    CHECK_ANSWER(api, "{\"op\": \"metric\", \"handle\": 2, \"action\": \"grow\", \"value\": \"1\"}",
                 "Unknown metric operation");
    CHECK_ANSWER(api, "{\"op\": \"metric\", \"handle\": 2, \"action\": \"increment\"}",
                 "the value must be a number");
    CHECK_ANSWER(
        api, "{\"op\": \"metric\", \"handle\": 2, \"action\": \"increment\", \"value\": \"1x\"}",
        "the value must be a number");
    CHECK_ANSWER(
        api, "{\"op\": \"metric\", \"handle\": 2, \"action\": \"increment\", \"value\": \"nan\"}",
        "non-negative");
    e = ask(api,
            "{\"op\": \"metric\", \"handle\": 2, \"action\": \"increment\", \"value\": \"inf\"}",
            NULL);
    CHECK(e == NULL);
    free(e);
    char *t = page();
    CHECK_STR_CONTAINS(t, "h_total{m=\"x\"} +Inf\n");
    free(t);
    /* deleting the family deletes the worker's metrics of it; junk handles
     * in a delete batch are ignored */
    e = ask(api, "{\"op\": \"family_delete\", \"handles\": [1, 1, 0, -5, \"x\", 1000]}", NULL);
    CHECK(e == NULL);
    free(e);
    CHECK_ANSWER(api, "{\"op\": \"metric\", \"handle\": 2, \"action\": \"value\"}",
                 "has been deleted");
    t = page();
    CHECK_STR(t, "");
    free(t);
    /* what a worker leaves behind goes with it */
    e = ask(api, "{\"op\": \"family_new\", \"name\": \"g\", \"description\": \"\", \"kind\": 1}",
            &fam);
    free(e);
    char call[256];
    snprintf(call, sizeof call,
             "{\"op\": \"metric_new\", \"family\": %lld, \"labels\": {}, \"buckets\": null}",
             (long long)fam);
    e = ask(api, call, &met);
    CHECK(e == NULL);
    free(e);
    t = page();
    CHECK_STR(t, "# TYPE g gauge\ng 0\n");
    free(t);
    python_api_free(api);
    t = page();
    CHECK_STR(t, "");
    free(t);
}

static void test_hostile_load_files(void)
{
    static const char *const calls[] = {
        "{\"op\": \"load_model\", \"model\": \"m\"}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": 5}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": [{\"name\": "
        "\"file:a\", \"offset\": 4, \"size\": 1}]}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": [{\"name\": "
        "\"file:a\", \"offset\": 1, \"size\": 9223372036854775807}]}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": [{\"name\": "
        "\"file:a\", \"offset\": -1, \"size\": 1}]}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": [{\"name\": 3, "
        "\"offset\": 0, \"size\": 1}]}",
        "{\"op\": \"load_model\", \"model\": \"m\", \"config\": \"\", \"tensors\": [{\"name\": "
        "\"1/model.py\", \"offset\": 0, \"size\": 1}]}",
        "{\"op\": \"is_model_ready\", \"model\": \"m\", \"version\": \"x1\"}",
        "{\"op\": \"is_model_ready\", \"model\": \"m\"}",
        "{\"op\": \"unload_model\"}",
    };
    static const char *const want[] = {
        "malformed load_model call",
        "malformed load_model call",
        "malformed load_model file",
        "malformed load_model file",
        "malformed load_model file",
        "malformed load_model file",
        "Unrecognized load parameter '1/model.py'.",
        "version should be an integral value > 0",
        "malformed is_model_ready call",
        "malformed model control call",
    };
    const uint8_t blob[4] = {0};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        json_t *c = json_loads(calls[i], 0, NULL);
        CHECK(python_api_blocks(c));
        /* a NULL server: every one of these must fail before using it */
        json_t *a = python_api_model_control(NULL, c, blob, sizeof blob);
        const char *msg =
            json_string_value(json_object_get(json_object_get(a, "error"), "message"));
        CHECK_MSG(msg && strstr(msg, want[i]), "%s -> %s", calls[i], msg ? msg : "(ok)");
        json_decref(a);
        json_decref(c);
    }
}

int main(void)
{
    test_hostile_metric_calls();
    test_hostile_load_files();
    return check_summary();
}
