/* nereid-perf over KServe v2 HTTP/REST with libcurl: one easy handle (one
 * keep-alive connection) per load thread; JSON or binary tensor data. */
#include "perf.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct perf_conn {
    CURL *curl;
    struct curl_slist *headers;
    const perf_request_t *req;
    char *json_prefix;  /* the JSON header without its request parameters and closing brace */
    unsigned char *raw; /* binary inputs: the tensors, concatenated */
    size_t raw_bytes;
    char *body;
    size_t body_bytes;
    char *reply; /* response body (kept only up to reply_cap) */
    size_t reply_bytes, reply_cap;
};

typedef struct {
    char *data;
    size_t n, cap;
} buf_t;

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    buf_t *b = arg;
    size_t len = size * n;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + len + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->n, p, len);
    b->n += len;
    b->data[b->n] = '\0';
    return len;
}

static void base_url(const char *url, char *out, size_t cap)
{
    const char *scheme = strstr(url, "://") ? "" : "http://";
    size_t len = strlen(url);
    while (len > 0 && url[len - 1] == '/')
        len--;
    snprintf(out, cap, "%s%.*s", scheme, (int)len, url);
}

static void model_path(const perf_request_t *req, const char *url, const char *suffix, char *out,
                       size_t cap)
{
    char base[1024];
    base_url(url, base, sizeof base);
    if (req->version[0])
        snprintf(out, cap, "%s/v2/models/%s/versions/%s%s", base, req->model, req->version, suffix);
    else
        snprintf(out, cap, "%s/v2/models/%s%s", base, req->model, suffix);
}

/* The server's "error" text, or the raw body. */
static void error_text(long status, const char *body, char *err)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(j, "error"));
    snprintf(err, PERF_ERR_LEN, "HTTP %ld: %s", status, msg ? msg : body ? body : "");
    json_decref(j);
}

/* GET url; returns the parsed JSON object, or NULL with err set. */
static json_t *get_json(const char *url, char *err)
{
    CURL *c = curl_easy_init();
    buf_t b = {0};
    json_t *j = NULL;
    if (!c) {
        snprintf(err, PERF_ERR_LEN, "curl_easy_init failed");
        return NULL;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK)
        snprintf(err, PERF_ERR_LEN, "GET %s: %s", url, curl_easy_strerror(rc));
    else if (status != 200)
        error_text(status, b.data, err);
    else if (!(j = json_loads(b.data ? b.data : "", 0, NULL)) || !json_is_object(j)) {
        snprintf(err, PERF_ERR_LEN, "GET %s: the reply is not a JSON object", url);
        json_decref(j);
        j = NULL;
    }
    free(b.data);
    curl_easy_cleanup(c);
    return j;
}

static int parse_tensors(json_t *arr, perf_tensor_meta_t **out, int *n_out, char *err)
{
    size_t i, n = json_array_size(arr);
    *out = calloc(n ? n : 1, sizeof **out);
    *n_out = (int)n;
    for (i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i), *shape = json_object_get(t, "shape");
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *dt = json_string_value(json_object_get(t, "datatype"));
        perf_tensor_meta_t *m = &(*out)[i];
        if (!name || !dt || json_array_size(shape) > PERF_MAX_DIMS) {
            snprintf(err, PERF_ERR_LEN, "unexpected tensor metadata");
            return -1;
        }
        snprintf(m->name, sizeof m->name, "%s", name);
        snprintf(m->datatype, sizeof m->datatype, "%s", dt);
        m->n_dims = (int)json_array_size(shape);
        for (int d = 0; d < m->n_dims; d++)
            m->shape[d] = json_integer_value(json_array_get(shape, d));
    }
    return 0;
}

static int http_metadata(const perf_request_t *req, perf_model_meta_t *out, char *err)
{
    char url[2048];
    memset(out, 0, sizeof *out);
    model_path(req, req->url, "", url, sizeof url);
    json_t *j = get_json(url, err);
    if (!j) return -1;
    int rc = parse_tensors(json_object_get(j, "inputs"), &out->inputs, &out->n_inputs, err);
    if (rc == 0)
        rc = parse_tensors(json_object_get(j, "outputs"), &out->outputs, &out->n_outputs, err);
    json_decref(j);
    if (rc) return -1;
    /* max_batch_size from the configuration extension (absent: no batching) */
    char cerr[PERF_ERR_LEN];
    model_path(req, req->url, "/config", url, sizeof url);
    json_t *cfg = get_json(url, cerr);
    out->max_batch_size = (int)json_integer_value(json_object_get(cfg, "max_batch_size"));
    out->is_sequence = json_is_object(json_object_get(cfg, "sequence_batching"));
    json_decref(cfg);
    return 0;
}

static uint64_t stat_field(json_t *stats, const char *name, const char *what)
{
    return (uint64_t)json_integer_value(json_object_get(json_object_get(stats, name), what));
}

static int http_stats(const char *server, const perf_request_t *req, perf_server_stats_t *out,
                      char *err)
{
    char url[2048];
    memset(out, 0, sizeof *out);
    model_path(req, server, "/stats", url, sizeof url);
    json_t *j = get_json(url, err);
    if (!j) return -1;
    json_t *arr = json_object_get(j, "model_stats"), *m;
    size_t i;
    json_array_foreach(arr, i, m)
    {
        json_t *s = json_object_get(m, "inference_stats");
        out->success_count += stat_field(s, "success", "count");
        out->fail_count += stat_field(s, "fail", "count");
        out->queue_ns += stat_field(s, "queue", "ns");
        out->compute_input_ns += stat_field(s, "compute_input", "ns");
        out->compute_infer_ns += stat_field(s, "compute_infer", "ns");
        out->compute_output_ns += stat_field(s, "compute_output", "ns");
        out->inference_count += (uint64_t)json_integer_value(json_object_get(m, "inference_count"));
        out->execution_count += (uint64_t)json_integer_value(json_object_get(m, "execution_count"));
    }
    json_decref(j);
    return 0;
}

/* One element of a tensor as JSON. */
static json_t *element_json(const perf_input_t *in, const unsigned char **p)
{
    const char *dt = in->datatype;
    json_t *v;
#define TAKE(type, make)                                                                           \
    do {                                                                                           \
        type x;                                                                                    \
        memcpy(&x, *p, sizeof x);                                                                  \
        *p += sizeof x;                                                                            \
        v = make;                                                                                  \
    } while (0)
    if (!strcmp(dt, "BOOL"))
        TAKE(uint8_t, json_boolean(x));
    else if (!strcmp(dt, "INT8"))
        TAKE(int8_t, json_integer(x));
    else if (!strcmp(dt, "INT16"))
        TAKE(int16_t, json_integer(x));
    else if (!strcmp(dt, "INT32"))
        TAKE(int32_t, json_integer(x));
    else if (!strcmp(dt, "INT64"))
        TAKE(int64_t, json_integer(x));
    else if (!strcmp(dt, "UINT8"))
        TAKE(uint8_t, json_integer(x));
    else if (!strcmp(dt, "UINT16"))
        TAKE(uint16_t, json_integer(x));
    else if (!strcmp(dt, "UINT32"))
        TAKE(uint32_t, json_integer(x));
    else if (!strcmp(dt, "UINT64"))
        TAKE(uint64_t, json_integer((json_int_t)x));
    else if (!strcmp(dt, "FP32"))
        TAKE(float, json_real(x));
    else if (!strcmp(dt, "FP64"))
        TAKE(double, json_real(x));
    else if (!strcmp(dt, "BYTES")) {
        uint32_t len;
        memcpy(&len, *p, 4);
        v = json_stringn((const char *)*p + 4, len);
        *p += 4 + len;
    } else
        return NULL;
#undef TAKE
    return v;
}

/* The parts of a request body that never change: the JSON header's inputs,
 * and for binary inputs the raw tensors that follow it (Triton's binary
 * tensor data extension). Returns -1 with err set if a datatype has no JSON
 * form. */
static int build_parts(perf_conn_t *c, char *err)
{
    const perf_request_t *req = c->req;
    json_t *root = json_object(), *inputs = json_array();
    json_object_set_new(root, "inputs", inputs);
    for (int i = 0; i < req->n_inputs; i++) {
        const perf_input_t *in = &req->inputs[i];
        json_t *t = json_object(), *shape = json_array();
        json_object_set_new(t, "name", json_string(in->name));
        for (int d = 0; d < in->n_dims; d++)
            json_array_append_new(shape, json_integer(in->shape[d]));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "datatype", json_string(in->datatype));
        if (req->binary_input) {
            json_object_set_new(t, "parameters",
                                json_pack("{s:I}", "binary_data_size", (json_int_t)in->byte_size));
        } else {
            json_t *data = json_array();
            const unsigned char *p = in->data;
            for (int64_t e = 0; e < in->n_elements; e++) {
                json_t *v = element_json(in, &p);
                if (!v) {
                    snprintf(err, PERF_ERR_LEN, "%s data cannot be sent as JSON; use binary",
                             in->datatype);
                    json_decref(data);
                    json_decref(t);
                    json_decref(root);
                    return -1;
                }
                json_array_append_new(data, v);
            }
            json_object_set_new(t, "data", data);
        }
        json_array_append_new(inputs, t);
    }
    c->json_prefix = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    c->json_prefix[strlen(c->json_prefix) - 1] = '\0'; /* the closing brace */
    if (req->binary_input) {
        for (int i = 0; i < req->n_inputs; i++)
            c->raw_bytes += req->inputs[i].byte_size;
        c->raw = malloc(c->raw_bytes ? c->raw_bytes : 1);
        unsigned char *p = c->raw;
        for (int i = 0; i < req->n_inputs; i++) {
            memcpy(p, req->inputs[i].data, req->inputs[i].byte_size);
            p += req->inputs[i].byte_size;
        }
    }
    return 0;
}

/* The whole request for seq (NULL outside sequences): body and headers. */
static void compose(perf_conn_t *c, const perf_sequence_t *seq)
{
    const perf_request_t *req = c->req;
    char params[256] = "", line[128];
    size_t n = 0;
    if (req->binary_output)
        n += (size_t)snprintf(params + n, sizeof params - n, "\"binary_data_output\":true");
    if (seq)
        n += (size_t)snprintf(
            params + n, sizeof params - n,
            "%s\"sequence_id\":%" PRIu64 ",\"sequence_start\":%s,\"sequence_end\":%s", n ? "," : "",
            seq->id, seq->start ? "true" : "false", seq->end ? "true" : "false");
    size_t prefix_bytes = strlen(c->json_prefix);
    size_t header_bytes = prefix_bytes + (n ? n + 16 : 0) + 1;
    free(c->body);
    c->body = malloc(header_bytes + c->raw_bytes + 1);
    if (n)
        snprintf(c->body, header_bytes + 1, "%s,\"parameters\":{%s}}", c->json_prefix, params);
    else
        snprintf(c->body, header_bytes + 1, "%s}", c->json_prefix);
    header_bytes = strlen(c->body);
    if (c->raw_bytes) memcpy(c->body + header_bytes, c->raw, c->raw_bytes);
    c->body_bytes = header_bytes + c->raw_bytes;

    curl_slist_free_all(c->headers);
    c->headers = NULL;
    if (req->binary_input) {
        snprintf(line, sizeof line, "Inference-Header-Content-Length: %zu", header_bytes);
        c->headers = curl_slist_append(c->headers, line);
        c->headers = curl_slist_append(c->headers, "Content-Type: application/octet-stream");
    } else {
        c->headers = curl_slist_append(c->headers, "Content-Type: application/json");
    }
    c->headers = curl_slist_append(c->headers, "Expect:");
    if (seq && req->sequence_header) {
        snprintf(line, sizeof line, "Nereid-Sequence-Id: %" PRIu64, seq->id);
        c->headers = curl_slist_append(c->headers, line);
        c->headers = curl_slist_append(c->headers, seq->start ? "Nereid-Sequence-Start: true"
                                                              : "Nereid-Sequence-Start: false");
        c->headers = curl_slist_append(c->headers, seq->end ? "Nereid-Sequence-End: true"
                                                            : "Nereid-Sequence-End: false");
    }
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body_bytes);
}

static size_t on_reply(char *p, size_t size, size_t n, void *arg)
{
    perf_conn_t *c = arg;
    size_t len = size * n;
    /* keep the start of the reply for error messages; count the rest */
    if (c->reply_bytes + 1 < c->reply_cap) {
        size_t keep = c->reply_cap - 1 - c->reply_bytes;
        if (keep > len) keep = len;
        memcpy(c->reply + c->reply_bytes, p, keep);
        c->reply[c->reply_bytes + keep] = '\0';
    }
    c->reply_bytes += len;
    return len;
}

static perf_conn_t *http_connect(const perf_request_t *req, char *err)
{
    perf_conn_t *c = calloc(1, sizeof *c);
    char url[2048];
    c->req = req;
    if (build_parts(c, err) || !(c->curl = curl_easy_init())) {
        if (c->json_prefix) snprintf(err, PERF_ERR_LEN, "curl_easy_init failed");
        free(c->json_prefix);
        free(c->raw);
        free(c);
        return NULL;
    }
    c->reply_cap = 4096;
    c->reply = malloc(c->reply_cap);
    model_path(req, req->url, "/infer", url, sizeof url);
    curl_easy_setopt(c->curl, CURLOPT_URL, url);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_reply);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->curl, CURLOPT_TCP_NODELAY, 1L);
    compose(c, NULL);
    return c;
}

static int http_infer(perf_conn_t *c, const perf_sequence_t *seq, char *err)
{
    long status = 0;
    if (seq) compose(c, seq);
    c->reply_bytes = 0;
    c->reply[0] = '\0';
    CURLcode rc = curl_easy_perform(c->curl);
    if (rc != CURLE_OK) {
        snprintf(err, PERF_ERR_LEN, "%s", curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
        error_text(status, c->reply, err);
        return -1;
    }
    return 0;
}

static void http_close(perf_conn_t *c)
{
    if (!c) return;
    curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->headers);
    free(c->json_prefix);
    free(c->raw);
    free(c->body);
    free(c->reply);
    free(c);
}

static void http_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void http_shutdown(void)
{
    curl_global_cleanup();
}

const perf_transport_t perf_http_transport = {
    "http",     http_init,    http_shutdown, http_metadata,
    http_stats, http_connect, http_infer,    http_close,
};
