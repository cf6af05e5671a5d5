/*
 * This file contains request tracing as Triton does it (server/src/tracer.cc
 * and the core's trace activities): trace settings and trace files,
 * sampling by rate and count, activities and tensors, and the two outputs:
 * the JSON trace file of triton mode (written per setting, optionally every
 * log_frequency traces to <file>.<n>) and OpenTelemetry spans (otlp.c
 * exports them). The tracer is built from the --trace-config flags in
 * trace_flags.c; the settings API (global and per model, with Triton's
 * fallback and clearing rules) is trace_settings.c.
 *
 * A trace is a root (one per sampled request, holding the setting it was
 * sampled by) with one handle per traced request: the request itself and,
 * for an ensemble, each step's request (parent_id = the ensemble's id).
 * References: the frontend holds one, each request holding a handle holds
 * one; the last release writes the trace (or exports its spans).
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
#include "core/server_internal.h"
#include "core/util.h"
#include "core/trace_internal.h"

static void sb_add(sbuf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > b->cap)
            b->cap *= 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf_t *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void sb_fmt(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* A JSON string literal (quotes included). */
static void sb_json_str(sbuf_t *b, const char *s)
{
    sb_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_add(b, s, 1);
        }
    }
    sb_add(b, "\"", 1);
}

static _Atomic uint64_t next_trace_id = 1;

/* ---- C++ std::stoi / std::stoul, as Triton parses numbers ---- */

num_rc_t cxx_stoi(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s) return NUM_INVALID;
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX) return NUM_RANGE;
    *out = (int)v;
    return NUM_OK;
}

num_rc_t cxx_stoul(const char *s, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s) return NUM_INVALID;
    if (errno == ERANGE) return NUM_RANGE;
    *out = v;
    return NUM_OK;
}

char *dupn(const char *s, size_t n)
{
    char *r = xmalloc(n + 1);
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

/* ---- Files ---- */

static trace_file_t *file_get(nereid_tracer_t *t, const char *name)
{
    pthread_mutex_lock(&t->files_lock);
    trace_file_t *f = t->files;
    while (f && strcmp(f->name, name))
        f = f->next;
    if (!f) {
        f = xcalloc(1, sizeof *f);
        f->name = xstrdup(name);
        f->first_write = true;
        pthread_mutex_init(&f->lock, NULL);
        f->next = t->files;
        t->files = f;
    }
    f->refs++;
    pthread_mutex_unlock(&t->files_lock);
    return f;
}

static void file_put(nereid_tracer_t *t, trace_file_t *f)
{
    pthread_mutex_lock(&t->files_lock);
    if (--f->refs > 0) {
        pthread_mutex_unlock(&t->files_lock);
        return;
    }
    for (trace_file_t **p = &t->files; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&t->files_lock);
    if (f->f) {
        fputs("]", f->f);
        fclose(f->f);
    }
    pthread_mutex_destroy(&f->lock);
    free(f->name);
    free(f);
}

/* Appends traces (comma-separated entries) to the file, or writes them as
 * a JSON array of their own to <name>.<index>. */
static void file_save(trace_file_t *f, const sbuf_t *traces, bool to_index_file)
{
    const char *text = traces->p ? traces->p : "";
    if (to_index_file) {
        char *name = xasprintf("%s.%u", f->name, atomic_fetch_add(&f->index, 1));
        FILE *out = fopen(name, "w");
        if (!out) {
            LOG_ERROR("failed creating trace file: %s: %s", name, strerror(errno));
        } else {
            fprintf(out, "[%s]", text);
            fclose(out);
        }
        free(name);
        return;
    }
    pthread_mutex_lock(&f->lock);
    if (f->first_write) {
        f->f = fopen(f->name, "w");
        if (!f->f) {
            LOG_ERROR("failed creating trace file: %s: %s", f->name, strerror(errno));
            pthread_mutex_unlock(&f->lock);
            return;
        }
        fputs("[", f->f);
        f->first_write = false;
    } else if (f->f) {
        fputs(",", f->f);
    }
    if (f->f) {
        fputs(text, f->f);
        fflush(f->f);
    }
    pthread_mutex_unlock(&f->lock);
}

/* ---- Settings ---- */

trace_setting_t *setting_new(nereid_tracer_t *t, uint32_t level, uint32_t rate, int32_t count,
                             uint32_t log_frequency, const char *file, trace_mode_t mode)
{
    trace_setting_t *s = xcalloc(1, sizeof *s);
    atomic_init(&s->refs, 1);
    s->tracer = t;
    s->level = level;
    s->rate = rate;
    s->count = count;
    s->log_frequency = log_frequency;
    s->file = file_get(t, file);
    s->mode = mode;
    pthread_mutex_init(&s->lock, NULL);
    if (level == 0)
        s->invalid = "tracing is disabled";
    else if (rate == 0)
        s->invalid = "sample rate must be non-zero";
    else if (mode == MODE_TRITON && !file[0])
        s->invalid = "trace file name is not given";
    return s;
}

static void setting_ref(trace_setting_t *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void setting_unref(trace_setting_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (s->mode == MODE_TRITON && s->stream.len > 0)
        file_save(s->file, &s->stream, s->log_frequency != 0);
    file_put(s->tracer, s->file);
    free(s->stream.p);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Recomputes the tracer's active flag; caller holds write_lock. */
void update_active(nereid_tracer_t *t)
{
    int active = t->global->level != 0;
    for (model_setting_t *m = t->models; m; m = m->next)
        if (m->setting->level != 0) active = 1;
    atomic_store(&t->active, active);
}

/* The setting a request to model samples by, with a reference. */
trace_setting_t *setting_for(nereid_tracer_t *t, const char *model)
{
    pthread_mutex_lock(&t->read_lock);
    trace_setting_t *s = t->global;
    if (model)
        for (model_setting_t *m = t->models; m; m = m->next)
            if (!strcmp(m->model, model)) {
                s = m->setting;
                break;
            }
    setting_ref(s);
    pthread_mutex_unlock(&t->read_lock);
    return s;
}

void nereid_tracer_free(nereid_tracer_t *t)
{
    if (!t) return;
    while (t->models) {
        model_setting_t *m = t->models;
        t->models = m->next;
        setting_unref(m->setting);
        free(m->model);
        free(m);
    }
    while (t->fallback_models) {
        name_node_t *f = t->fallback_models;
        t->fallback_models = f->next;
        free(f->name);
        free(f);
    }
    setting_unref(t->global);
    setting_unref(t->global_default);
    otel_exporter_free(t->exporter);
    for (size_t i = 0; i < t->n_config; i++) {
        free(t->config_keys[i]);
        free(t->config_values[i]);
    }
    free(t->config_keys);
    free(t->config_values);
    pthread_mutex_destroy(&t->write_lock);
    pthread_mutex_destroy(&t->read_lock);
    pthread_mutex_destroy(&t->files_lock);
    free(t);
}

void nereid_server_set_tracer(nereid_server_t *server, nereid_tracer_t *tracer)
{
    server->tracer = tracer;
}

nereid_tracer_t *trace_server_tracer(nereid_server_t *server)
{
    return server->tracer;
}

bool nereid_server_tracing(nereid_server_t *server)
{
    nereid_tracer_t *t = server->tracer;
    return t && atomic_load_explicit(&t->active, memory_order_relaxed);
}

uint64_t nereid_trace_now_ns(void)
{
    return util_now_ns();
}

/* ---- Sampling ---- */

static int64_t unix_offset_ns(void)
{
    struct timespec rt, mono;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    return ((int64_t)rt.tv_sec - (int64_t)mono.tv_sec) * 1000000000ll +
           ((int64_t)rt.tv_nsec - (int64_t)mono.tv_nsec);
}

static nereid_trace_t *handle_new(trace_root_t *r, uint64_t parent_id)
{
    nereid_trace_t *h = xcalloc(1, sizeof *h);
    h->root = r;
    h->id = atomic_fetch_add(&next_trace_id, 1);
    h->parent_id = parent_id;
    if (r->last)
        r->last->next = h;
    else
        r->handles = h;
    r->last = h;
    return h;
}

nereid_trace_t *nereid_server_trace_start(nereid_server_t *server, const char *model,
                                          const char *traceparent, const char *tracestate)
{
    nereid_tracer_t *t = server->tracer;
    if (!t || !atomic_load_explicit(&t->active, memory_order_relaxed)) return NULL;
    trace_setting_t *s = setting_for(t, model);
    uint8_t remote_trace[16], remote_span[8];
    bool force = s->level != 0 && s->mode == MODE_OPENTELEMETRY &&
                 otel_parse_traceparent(traceparent, remote_trace, remote_span);
    bool hit = false;
    pthread_mutex_lock(&s->lock);
    if (s->rate != 0 && (s->invalid == NULL || force)) {
        hit = (++s->sample % s->rate) == 0;
        if (hit && s->count > 0) {
            s->count--;
            s->created++;
        } else if (hit && s->count == 0) {
            hit = false;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!hit && !force) {
        setting_unref(s);
        return NULL;
    }
    trace_root_t *r = xcalloc(1, sizeof *r);
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->lock, NULL);
    r->setting = s; /* the reference taken above */
    nereid_trace_t *h = handle_new(r, 0);
    if (s->mode == MODE_OPENTELEMETRY) {
        r->unix_offset_ns = unix_offset_ns();
        otel_span_t *span =
            otel_span_new("InferRequest", (uint64_t)((int64_t)util_now_ns() + r->unix_offset_ns));
        if (force) {
            memcpy(r->trace_id, remote_trace, 16);
            memcpy(span->parent_span_id, remote_span, 8);
            span->has_parent = true;
            if (tracestate && tracestate[0]) r->trace_state = xstrdup(tracestate);
        } else {
            otel_random_id(r->trace_id, 16);
        }
        memcpy(span->trace_id, r->trace_id, 16);
        otel_random_id(span->span_id, 8);
        if (r->trace_state) span->trace_state = xstrdup(r->trace_state);
        r->root_span = span;
        h->stack[h->depth++] = span;
    }
    return h;
}

/* ---- Activities ---- */

static nereid_trace_t *handle_by_id(trace_root_t *r, uint64_t id)
{
    for (nereid_trace_t *h = r->handles; h; h = h->next)
        if (h->id == id) return h;
    return NULL;
}

static void otel_start_span(nereid_trace_t *h, const char *name, bool request_span, uint64_t ns)
{
    trace_root_t *r = h->root;
    otel_span_t *parent = NULL;
    if (request_span && h->parent_id != 0) {
        nereid_trace_t *p = handle_by_id(r, h->parent_id);
        if (p && p->depth > 0) parent = p->stack[p->depth - 1];
    } else if (h->depth > 0) {
        parent = h->stack[h->depth - 1];
    }
    otel_span_t *span = otel_span_new(name, (uint64_t)((int64_t)ns + r->unix_offset_ns));
    memcpy(span->trace_id, r->trace_id, 16);
    otel_random_id(span->span_id, 8);
    if (parent) {
        memcpy(span->parent_span_id, parent->span_id, 8);
        span->has_parent = true;
    } else if (r->root_span && r->root_span->has_parent) {
        memcpy(span->parent_span_id, r->root_span->parent_span_id, 8);
        span->has_parent = true;
    }
    if (r->trace_state) span->trace_state = xstrdup(r->trace_state);
    if (h->depth < SPAN_STACK) {
        h->stack[h->depth++] = span;
    } else {
        otel_span_free(span);
    }
}

static void otel_end_span(nereid_trace_t *h, uint64_t unix_ns)
{
    if (h->depth == 0) return;
    otel_span_t *span = h->stack[--h->depth];
    span->end_unix_ns = unix_ns;
    span->next = h->root->ended;
    h->root->ended = span;
}

static const char *const activity_names[] = {
    "REQUEST_START",        "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"};
enum {
    ACT_REQUEST_START,
    ACT_QUEUE_START,
    ACT_COMPUTE_START,
    ACT_COMPUTE_INPUT_END,
    ACT_COMPUTE_OUTPUT_START,
    ACT_COMPUTE_END,
    ACT_REQUEST_END
};

/* A core activity of handle h; caller holds the root's lock. */
static void activity_locked(nereid_trace_t *h, int act, uint64_t ns, const char *request_id)
{
    trace_root_t *r = h->root;
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) return;
    const char *name = activity_names[act];
    if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (act == ACT_REQUEST_START) {
            otel_start_span(h, h->model_name, true, ns);
            otel_span_t *s = h->stack[h->depth - 1];
            otel_span_attr_str(s, "triton.model_name", h->model_name);
            otel_span_attr_int(s, "triton.model_version", h->model_version);
            otel_span_attr_int(s, "triton.trace_id", (int64_t)h->id);
            otel_span_attr_int(s, "triton.trace_parent_id", (int64_t)h->parent_id);
            if (request_id && request_id[0]) otel_span_attr_str(s, "triton.request_id", request_id);
        } else if (act == ACT_COMPUTE_START) {
            otel_start_span(h, "compute", false, ns);
        }
        uint64_t unix_ns = (uint64_t)((int64_t)ns + r->unix_offset_ns);
        if (h->depth > 0) otel_span_add_event(h->stack[h->depth - 1], name, unix_ns);
        if (act == ACT_REQUEST_END || act == ACT_COMPUTE_END) otel_end_span(h, unix_ns);
        return;
    }
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    if (act == ACT_REQUEST_START) {
        sb_fmt(b, "{\"id\":%llu,\"model_name\":", (unsigned long long)h->id);
        sb_json_str(b, h->model_name);
        sb_fmt(b, ",\"model_version\":%lld", (long long)h->model_version);
        if (request_id && request_id[0]) {
            sb_str(b, ",\"request_id\":");
            sb_json_str(b, request_id);
        }
        if (h->parent_id) sb_fmt(b, ",\"parent_id\":%llu", (unsigned long long)h->parent_id);
        sb_str(b, "},");
    }
    sb_fmt(b, "{\"id\":%llu,\"timestamps\":[{\"name\":\"%s\",\"ns\":%llu}]}",
           (unsigned long long)h->id, name, (unsigned long long)ns);
}

/* Triton mode: a named timestamp entry of handle h (root's lock held). */
static void stamp_locked(nereid_trace_t *h, const char *name, uint64_t ns)
{
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    sb_fmt(b, "{\"id\":%llu,\"timestamps\":[{\"name\":", (unsigned long long)h->id);
    sb_json_str(b, name);
    sb_fmt(b, ",\"ns\":%llu}]}", (unsigned long long)ns);
}

void nereid_trace_timestamp(nereid_trace_t *h, const char *name, uint64_t ns)
{
    if (!h) return;
    trace_root_t *r = h->root;
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) return;
    pthread_mutex_lock(&r->lock);
    if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (r->root_span)
            otel_span_add_event(r->root_span, name, (uint64_t)((int64_t)ns + r->unix_offset_ns));
    } else {
        /* Frontend timestamps go to the trace's own id (Triton's
         * Trace::CaptureTimestamp). */
        stamp_locked(r->handles, name, ns);
    }
    pthread_mutex_unlock(&r->lock);
}

void nereid_trace_activity(nereid_trace_t *h, const char *name, uint64_t ns)
{
    if (!h || !name) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) {
        /* not recorded */
    } else if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (h->depth > 0)
            otel_span_add_event(h->stack[h->depth - 1], name,
                                (uint64_t)((int64_t)ns + r->unix_offset_ns));
    } else {
        stamp_locked(h, name, ns);
    }
    pthread_mutex_unlock(&r->lock);
}

void nereid_trace_info(const nereid_trace_t *h, uint64_t *id, uint64_t *parent_id,
                       const char **model_name, int64_t *model_version, const char **request_id)
{
    if (id) *id = h ? h->id : 0;
    if (parent_id) *parent_id = h ? h->parent_id : 0;
    if (model_name) *model_name = h ? h->model_name : NULL;
    if (model_version) *model_version = h ? h->model_version : 0;
    if (request_id) *request_id = h && h->request_id ? h->request_id : "";
}

void trace_request_start(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    if (!h->model_name) {
        h->model_name = xstrdup(req->model->name);
        h->model_version = req->model->version;
    }
    h->started = true;
    if (!h->request_id) h->request_id = xstrdup(req->id ? req->id : "");
    activity_locked(h, ACT_REQUEST_START, req->t_request_ns, req->id);
    activity_locked(h, ACT_QUEUE_START, req->t_queue_start_ns, NULL);
    pthread_mutex_unlock(&r->lock);
}

void trace_compute(nereid_trace_t *h, uint64_t start_ns, uint64_t input_end_ns,
                   uint64_t output_start_ns, uint64_t end_ns)
{
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    activity_locked(h, ACT_COMPUTE_START, start_ns, NULL);
    activity_locked(h, ACT_COMPUTE_INPUT_END, input_end_ns, NULL);
    activity_locked(h, ACT_COMPUTE_OUTPUT_START, output_start_ns, NULL);
    activity_locked(h, ACT_COMPUTE_END, end_ns, NULL);
    pthread_mutex_unlock(&r->lock);
}

/* ---- Tensor activities ---- */

/* One element of a tensor as Triton's tracer writes it with a C++ stream:
 * integers in decimal, 8-bit integers as the character they hold, bools as
 * 0/1, floats with six significant digits (here JSON-escaped, so that a
 * quote byte does not break the file). */
static void sb_element(sbuf_t *b, nereid_datatype_t dt, const unsigned char *p)
{
    switch (dt) {
    case NEREID_TYPE_BOOL:
        sb_str(b, p[0] ? "1" : "0");
        break;
    case NEREID_TYPE_UINT8:
    case NEREID_TYPE_INT8: {
        char c[2] = {(char)p[0], 0};
        if (c[0] == '"' || c[0] == '\\' || (unsigned char)c[0] < 0x20)
            sb_fmt(b, "\\u%04x", (unsigned)p[0]);
        else
            sb_str(b, c);
        break;
    }
#define INT_CASE(T, ctype, fmt, cast)                                                              \
    case T: {                                                                                      \
        ctype v;                                                                                   \
        memcpy(&v, p, sizeof v);                                                                   \
        sb_fmt(b, fmt, (cast)v);                                                                   \
        break;                                                                                     \
    }
        INT_CASE(NEREID_TYPE_UINT16, uint16_t, "%u", unsigned)
        INT_CASE(NEREID_TYPE_UINT32, uint32_t, "%u", unsigned)
        INT_CASE(NEREID_TYPE_UINT64, uint64_t, "%llu", unsigned long long)
        INT_CASE(NEREID_TYPE_INT16, int16_t, "%d", int)
        INT_CASE(NEREID_TYPE_INT32, int32_t, "%d", int)
        INT_CASE(NEREID_TYPE_INT64, int64_t, "%lld", long long)
        INT_CASE(NEREID_TYPE_FP32, float, "%g", double)
        INT_CASE(NEREID_TYPE_FP64, double, "%g", double)
#undef INT_CASE
    default:
        break;
    }
}

/* One tensor activity entry on h's stream; caller holds the root's lock. */
static void tensor_locked(nereid_trace_t *h, const char *activity, const char *name,
                          nereid_datatype_t dt, const int64_t *shape, size_t rank, const void *data,
                          size_t byte_size)
{
    uint64_t count = 1;
    for (size_t i = 0; i < rank; i++)
        count *= (uint64_t)(shape[i] > 0 ? shape[i] : 0);
    size_t esize = nereid_datatype_byte_size(dt);
    if (esize && count * esize > byte_size) return; /* never read past the buffer */
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    sb_fmt(b, "{\"id\":%llu,\"activity\":\"%s\",\"tensor\":{\"name\":", (unsigned long long)h->id,
           activity);
    sb_json_str(b, name);
    sb_str(b, ",\"data\":\"");
    const unsigned char *p = data;
    if (dt == NEREID_TYPE_BYTES) {
        size_t off = 0;
        for (uint64_t e = 0; e < count; e++) {
            uint32_t len;
            if (off + 4 > byte_size) break;
            memcpy(&len, p + off, 4);
            off += 4;
            if (off + len > byte_size) break;
            /* Triton writes \"<element>\"; the element JSON-escaped */
            sbuf_t tmp = {0};
            char *s = dupn((const char *)p + off, len);
            sb_json_str(&tmp, s);
            free(s);
            sb_str(b, "\\\"");
            if (tmp.len >= 2) sb_add(b, tmp.p + 1, tmp.len - 2);
            sb_str(b, "\\\"");
            free(tmp.p);
            off += len;
            if (e + 1 < count) sb_add(b, ",", 1);
        }
    } else if (esize && dt != NEREID_TYPE_FP16 && dt != NEREID_TYPE_BF16) {
        for (uint64_t e = 0; e < count; e++) {
            sb_element(b, dt, p + e * esize);
            if (e + 1 < count) sb_add(b, ",", 1);
        }
    }
    sb_str(b, "\",\"shape\":\"");
    for (size_t i = 0; i < rank; i++)
        sb_fmt(b, "%s%lld", i ? "," : "", (long long)shape[i]);
    sb_fmt(b, "\",\"dtype\":\"%s\"}}", nereid_datatype_name(dt));
}

static bool tensors_traced(const nereid_trace_t *h)
{
    const trace_setting_t *s = h->root->setting;
    return (s->level & TRACE_LEVEL_TENSORS) && s->mode == MODE_TRITON;
}

void trace_queue_inputs(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    if (!h || !tensors_traced(h)) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < req->n_inputs; i++) {
        const req_input_t *in = &req->inputs[i];
        tensor_locked(h, "TENSOR_QUEUE_INPUT", in->name, in->datatype, in->shape, in->rank,
                      in->data, in->byte_size);
    }
    pthread_mutex_unlock(&r->lock);
}

void trace_response_outputs(nereid_trace_t *h, const nereid_response_t *resp)
{
    if (!h || !tensors_traced(h) || resp->error) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < resp->n_outputs; i++) {
        const resp_output_t *o = &resp->outputs[i];
        tensor_locked(h, "TENSOR_BACKEND_OUTPUT", o->name, o->datatype, o->shape, o->rank, o->data,
                      o->byte_size);
    }
    pthread_mutex_unlock(&r->lock);
}

/* ---- Release: writing and exporting ---- */

static void setting_write_trace(trace_setting_t *s, trace_root_t *r)
{
    pthread_mutex_lock(&s->lock);
    s->sample_in_stream++;
    s->collected++;
    for (nereid_trace_t *h = r->handles; h; h = h->next) {
        if (!h->stream.len) continue;
        if (s->stream.len) sb_add(&s->stream, ",", 1);
        sb_add(&s->stream, h->stream.p, h->stream.len);
    }
    if ((s->count == 0 && s->collected == s->sample) ||
        (s->log_frequency != 0 && s->sample_in_stream >= s->log_frequency)) {
        s->sample_in_stream = 0;
        sbuf_t out = s->stream;
        s->stream = (sbuf_t){0};
        pthread_mutex_unlock(&s->lock);
        file_save(s->file, &out, true);
        free(out.p);
        return;
    }
    pthread_mutex_unlock(&s->lock);
}

static void root_free(trace_root_t *r)
{
    trace_setting_t *s = r->setting;
    if (s->mode == MODE_OPENTELEMETRY) {
        uint64_t unix_now = (uint64_t)((int64_t)util_now_ns() + r->unix_offset_ns);
        for (nereid_trace_t *h = r->handles; h; h = h->next)
            while (h->depth > 0)
                otel_end_span(h, unix_now);
        if (s->tracer->exporter && r->ended)
            otel_exporter_submit(s->tracer->exporter, r->ended);
        else
            while (r->ended) {
                otel_span_t *n = r->ended->next;
                otel_span_free(r->ended);
                r->ended = n;
            }
        r->ended = NULL;
    } else {
        setting_write_trace(s, r);
    }
    while (r->handles) {
        nereid_trace_t *h = r->handles;
        r->handles = h->next;
        free(h->stream.p);
        free(h->model_name);
        free(h->request_id);
        free(h);
    }
    free(r->trace_state);
    pthread_mutex_destroy(&r->lock);
    setting_unref(s);
    free(r);
}

void nereid_trace_release(nereid_trace_t *h)
{
    if (!h) return;
    trace_root_t *r = h->root;
    if (atomic_fetch_sub(&r->refs, 1) == 1) root_free(r);
}

void nereid_request_set_trace(nereid_request_t *req, nereid_trace_t *h)
{
    if (req->trace) nereid_trace_release(req->trace);
    req->trace = NULL;
    if (!h) return;
    atomic_fetch_add(&h->root->refs, 1);
    req->trace = h;
}

void trace_request_end(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    req->trace = NULL;
    if (h->started) {
        trace_root_t *r = h->root;
        pthread_mutex_lock(&r->lock);
        activity_locked(h, ACT_REQUEST_END, util_now_ns(), NULL);
        pthread_mutex_unlock(&r->lock);
    }
    nereid_trace_release(h);
}

static nereid_trace_t *trace_spawn_child(nereid_trace_t *parent)
{
    trace_root_t *r = parent->root;
    atomic_fetch_add(&r->refs, 1);
    pthread_mutex_lock(&r->lock);
    nereid_trace_t *h = handle_new(r, parent->id);
    pthread_mutex_unlock(&r->lock);
    return h;
}

void request_inherit_trace(nereid_request_t *step, const nereid_request_t *parent)
{
    step->trace = trace_spawn_child(parent->trace);
}
