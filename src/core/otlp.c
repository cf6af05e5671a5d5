/*
 * This file contains the OpenTelemetry span model and the OTLP/HTTP batch
 * exporter: a bounded queue of ended spans, drained by one thread that
 * encodes them as an ExportTraceServiceRequest (protobuf-c, the OTLP field
 * numbers in proto/otlp_trace.proto) and POSTs them with libcurl. It follows
 * the OpenTelemetry batch span processor that Triton configures: export when
 * max_export_batch_size spans wait or schedule_delay_ms has passed, drop
 * spans when max_queue_size are waiting, export everything at shutdown.
 */
#include "core/otlp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/libcurl.h"
#include "core/util.h"
#include "otlp_trace.pb-c.h"

/* ---- Spans ---- */

otel_span_t *otel_span_new(const char *name, uint64_t start_unix_ns)
{
    otel_span_t *s = xcalloc(1, sizeof *s);
    s->name = xstrdup(name);
    s->start_unix_ns = start_unix_ns;
    return s;
}

void otel_span_add_event(otel_span_t *s, const char *name, uint64_t time_unix_ns)
{
    if (s->n_events == s->cap_events) {
        s->cap_events = s->cap_events ? 2 * s->cap_events : 4;
        s->events = xrealloc(s->events, s->cap_events * sizeof *s->events);
    }
    s->events[s->n_events++] = (otel_event_t){xstrdup(name), time_unix_ns};
}

void otel_span_attr_int(otel_span_t *s, const char *key, int64_t value)
{
    if (s->n_attrs < OTEL_MAX_ATTRS) s->attrs[s->n_attrs++] = (otel_attr_t){key, true, value, NULL};
}

void otel_span_attr_str(otel_span_t *s, const char *key, const char *value)
{
    if (s->n_attrs < OTEL_MAX_ATTRS)
        s->attrs[s->n_attrs++] = (otel_attr_t){key, false, 0, xstrdup(value)};
}

void otel_span_free(otel_span_t *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_events; i++)
        free(s->events[i].name);
    free(s->events);
    for (size_t i = 0; i < s->n_attrs; i++)
        free(s->attrs[i].s);
    free(s->name);
    free(s->trace_state);
    free(s);
}

static _Thread_local uint64_t rng_state;

static uint64_t rng_next(void)
{
    if (rng_state == 0) {
        if (getrandom(&rng_state, sizeof rng_state, 0) != (ssize_t)sizeof rng_state ||
            rng_state == 0)
            rng_state = util_now_ns() | 1;
    }
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

void otel_random_id(uint8_t *out, size_t n)
{
    bool zero = true;
    while (zero) {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t r = rng_next();
            memcpy(out + i, &r, n - i < 8 ? n - i : 8);
        }
        for (size_t i = 0; i < n; i++)
            if (out[i]) zero = false;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static bool parse_hex(const char *s, uint8_t *out, size_t n)
{
    bool nonzero = false;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out[i] = (uint8_t)(hi << 4 | lo);
        if (out[i]) nonzero = true;
    }
    return nonzero;
}

bool otel_parse_traceparent(const char *v, uint8_t trace_id[16], uint8_t span_id[8])
{
    if (!v) return false;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t len = strlen(v);
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    /* version(2) - trace-id(32) - parent-id(16) - flags(2); a later version
     * may append fields after another '-'. */
    if (len < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
    int hi = hexval(v[0]), lo = hexval(v[1]);
    if (hi < 0 || lo < 0 || (hi == 15 && lo == 15)) return false;
    if (hi == 0 && lo == 0 && len != 55) return false;
    if (len > 55 && v[55] != '-') return false;
    if (hexval(v[53]) < 0 || hexval(v[54]) < 0) return false;
    return parse_hex(v + 3, trace_id, 16) && parse_hex(v + 36, span_id, 8);
}

/* ---- Exporter ---- */

struct otel_exporter {
    char *url;
    char **res_keys, **res_values;
    size_t n_res;
    uint32_t max_queue, delay_ms, batch;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    otel_span_t *head, *tail;
    size_t n_queued;
    bool stop;
    uint64_t dropped;
    pthread_t thread;
};

static void set_str_value(Nereid__Otlp__AnyValue *v, const char *s)
{
    v->value_case = NEREID__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
    v->string_value = (char *)s;
}

/* Encodes spans[0..n) as one ExportTraceServiceRequest; *out caller frees. */
static size_t encode(otel_exporter_t *e, otel_span_t **spans, size_t n, uint8_t **out)
{
    Nereid__Otlp__KeyValue *rkv = xcalloc(e->n_res ? e->n_res : 1, sizeof *rkv);
    Nereid__Otlp__AnyValue *rval = xcalloc(e->n_res ? e->n_res : 1, sizeof *rval);
    Nereid__Otlp__KeyValue **rkvp = xcalloc(e->n_res ? e->n_res : 1, sizeof *rkvp);
    for (size_t i = 0; i < e->n_res; i++) {
        nereid__otlp__key_value__init(&rkv[i]);
        nereid__otlp__any_value__init(&rval[i]);
        rkv[i].key = e->res_keys[i];
        set_str_value(&rval[i], e->res_values[i]);
        rkv[i].value = &rval[i];
        rkvp[i] = &rkv[i];
    }
    Nereid__Otlp__Resource resource = NEREID__OTLP__RESOURCE__INIT;
    resource.attributes = rkvp;
    resource.n_attributes = e->n_res;

    Nereid__Otlp__Span *ps = xcalloc(n, sizeof *ps);
    Nereid__Otlp__Span **psp = xcalloc(n, sizeof *psp);
    size_t n_events = 0;
    for (size_t i = 0; i < n; i++)
        n_events += spans[i]->n_events;
    Nereid__Otlp__Span__Event *ev = xcalloc(n_events ? n_events : 1, sizeof *ev);
    Nereid__Otlp__Span__Event **evp = xcalloc(n_events ? n_events : 1, sizeof *evp);
    Nereid__Otlp__KeyValue *akv = xcalloc(n * OTEL_MAX_ATTRS, sizeof *akv);
    Nereid__Otlp__AnyValue *aval = xcalloc(n * OTEL_MAX_ATTRS, sizeof *aval);
    Nereid__Otlp__KeyValue **akvp = xcalloc(n * OTEL_MAX_ATTRS, sizeof *akvp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        otel_span_t *s = spans[i];
        Nereid__Otlp__Span *p = &ps[i];
        nereid__otlp__span__init(p);
        p->trace_id = (ProtobufCBinaryData){16, s->trace_id};
        p->span_id = (ProtobufCBinaryData){8, s->span_id};
        if (s->has_parent) p->parent_span_id = (ProtobufCBinaryData){8, s->parent_span_id};
        if (s->trace_state) p->trace_state = s->trace_state;
        p->name = s->name;
        p->kind = NEREID__OTLP__SPAN__SPAN_KIND__SPAN_KIND_SERVER;
        p->start_time_unix_nano = s->start_unix_ns;
        p->end_time_unix_nano = s->end_unix_ns;
        p->events = &evp[k];
        p->n_events = s->n_events;
        for (size_t j = 0; j < s->n_events; j++, k++) {
            nereid__otlp__span__event__init(&ev[k]);
            ev[k].time_unix_nano = s->events[j].time_unix_ns;
            ev[k].name = s->events[j].name;
            evp[k] = &ev[k];
        }
        p->attributes = &akvp[i * OTEL_MAX_ATTRS];
        p->n_attributes = s->n_attrs;
        for (size_t j = 0; j < s->n_attrs; j++) {
            size_t a = i * OTEL_MAX_ATTRS + j;
            nereid__otlp__key_value__init(&akv[a]);
            nereid__otlp__any_value__init(&aval[a]);
            akv[a].key = (char *)s->attrs[j].key;
            if (s->attrs[j].is_int) {
                aval[a].value_case = NEREID__OTLP__ANY_VALUE__VALUE_INT_VALUE;
                aval[a].int_value = s->attrs[j].i;
            } else {
                set_str_value(&aval[a], s->attrs[j].s);
            }
            akv[a].value = &aval[a];
            akvp[a] = &akv[a];
        }
        psp[i] = p;
    }
    Nereid__Otlp__InstrumentationScope scope = NEREID__OTLP__INSTRUMENTATION_SCOPE__INIT;
    scope.name = (char *)"triton-server";
    Nereid__Otlp__ScopeSpans ss = NEREID__OTLP__SCOPE_SPANS__INIT;
    ss.scope = &scope;
    ss.spans = psp;
    ss.n_spans = n;
    Nereid__Otlp__ScopeSpans *ssp = &ss;
    Nereid__Otlp__ResourceSpans rs = NEREID__OTLP__RESOURCE_SPANS__INIT;
    rs.resource = &resource;
    rs.scope_spans = &ssp;
    rs.n_scope_spans = 1;
    Nereid__Otlp__ResourceSpans *rsp = &rs;
    Nereid__Otlp__ExportTraceServiceRequest req = NEREID__OTLP__EXPORT_TRACE_SERVICE_REQUEST__INIT;
    req.resource_spans = &rsp;
    req.n_resource_spans = 1;
    size_t len = nereid__otlp__export_trace_service_request__get_packed_size(&req);
    *out = xmalloc(len ? len : 1);
    nereid__otlp__export_trace_service_request__pack(&req, *out);
    free(rkv);
    free(rval);
    free(rkvp);
    free(ps);
    free(psp);
    free(ev);
    free(evp);
    free(akv);
    free(aval);
    free(akvp);
    return len;
}

static size_t discard_body(char *ptr, size_t size, size_t nmemb, void *userp)
{
    (void)ptr;
    (void)userp;
    return size * nmemb;
}

/* libcurl (core/libcurl.h), opened with the first exporter; NULL when it
 * cannot be opened: the exporter then drops its spans (logged once). */
static const libcurl_api_t *lcp;

static void post(otel_exporter_t *e, CURL *curl, otel_span_t **spans, size_t n)
{
    uint8_t *body;
    size_t len = encode(e, spans, n, &body);
    struct curl_slist *hdrs = lcp->slist_append(NULL, "Content-Type: application/x-protobuf");
    lcp->easy_setopt(curl, CURLOPT_URL, e->url);
    lcp->easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    lcp->easy_setopt(curl, CURLOPT_POSTFIELDS, (const char *)body);
    lcp->easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    lcp->easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
    lcp->easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
    lcp->easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = lcp->easy_perform(curl);
    long status = 0;
    if (rc == CURLE_OK) lcp->easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK)
        LOG_ERROR("OTLP export of %zu spans to %s failed: %s", n, e->url, lcp->easy_strerror(rc));
    else if (status < 200 || status >= 300)
        LOG_ERROR("OTLP export of %zu spans to %s failed: HTTP %ld", n, e->url, status);
    lcp->slist_free_all(hdrs);
    free(body);
}

static void *exporter_main(void *arg)
{
    otel_exporter_t *e = arg;
    CURL *curl = lcp ? lcp->easy_init() : NULL;
    otel_span_t **batch = xcalloc(e->batch ? e->batch : 1, sizeof *batch);
    pthread_mutex_lock(&e->lock);
    for (;;) {
        if (!e->stop && e->n_queued < e->batch) {
            struct timespec deadline;
            clock_gettime(CLOCK_MONOTONIC, &deadline);
            uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)e->delay_ms * 1000000ull;
            deadline.tv_sec += (time_t)(ns / 1000000000ull);
            deadline.tv_nsec = (long)(ns % 1000000000ull);
            while (!e->stop && e->n_queued < e->batch)
                if (pthread_cond_timedwait(&e->cond, &e->lock, &deadline) != 0) break;
        }
        if (e->n_queued == 0) {
            if (e->stop) break;
            continue;
        }
        size_t n = 0;
        while (e->head && n < e->batch) {
            batch[n++] = e->head;
            e->head = e->head->next;
            e->n_queued--;
        }
        if (!e->head) e->tail = NULL;
        pthread_mutex_unlock(&e->lock);
        if (curl) post(e, curl, batch, n);
        for (size_t i = 0; i < n; i++)
            otel_span_free(batch[i]);
        pthread_mutex_lock(&e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    free(batch);
    if (curl) lcp->easy_cleanup(curl);
    return NULL;
}

static void curl_init_once(void)
{
    const char *why = NULL;
    lcp = libcurl_get(&why);
    if (!lcp) LOG_ERROR("OTLP trace export disabled: %s", why);
}

otel_exporter_t *otel_exporter_new(const otel_exporter_options_t *o)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_init_once);
    otel_exporter_t *e = xcalloc(1, sizeof *e);
    e->url = xstrdup(o->url);
    e->res_keys = xcalloc(o->n_resource ? o->n_resource : 1, sizeof *e->res_keys);
    e->res_values = xcalloc(o->n_resource ? o->n_resource : 1, sizeof *e->res_values);
    /* One attribute per key: a later value replaces an earlier one. */
    for (size_t i = 0; i < o->n_resource; i++) {
        size_t j = 0;
        while (j < e->n_res && strcmp(e->res_keys[j], o->resource_keys[i]))
            j++;
        if (j == e->n_res) {
            e->res_keys[e->n_res++] = xstrdup(o->resource_keys[i]);
        } else {
            free(e->res_values[j]);
        }
        e->res_values[j] = xstrdup(o->resource_values[i]);
    }
    e->max_queue = o->max_queue_size;
    e->delay_ms = o->schedule_delay_ms;
    e->batch = o->max_export_batch_size ? o->max_export_batch_size : 1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&e->thread, NULL, exporter_main, e) != 0) {
        e->thread = 0;
        otel_exporter_free(e);
        return NULL;
    }
    return e;
}

void otel_exporter_submit(otel_exporter_t *e, otel_span_t *spans)
{
    pthread_mutex_lock(&e->lock);
    bool wake = false;
    while (spans) {
        otel_span_t *s = spans;
        spans = s->next;
        s->next = NULL;
        if (e->n_queued >= e->max_queue) {
            e->dropped++;
            otel_span_free(s);
            continue;
        }
        if (e->tail)
            e->tail->next = s;
        else
            e->head = s;
        e->tail = s;
        if (++e->n_queued >= e->batch) wake = true;
    }
    if (wake) pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->lock);
}

void otel_exporter_free(otel_exporter_t *e)
{
    if (!e) return;
    if (e->thread) {
        pthread_mutex_lock(&e->lock);
        e->stop = true;
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->thread, NULL);
    }
    if (e->dropped)
        LOG_WARN("%llu spans dropped: the export queue was full", (unsigned long long)e->dropped);
    while (e->head) {
        otel_span_t *s = e->head;
        e->head = s->next;
        otel_span_free(s);
    }
    for (size_t i = 0; i < e->n_res; i++) {
        free(e->res_keys[i]);
        free(e->res_values[i]);
    }
    free(e->res_keys);
    free(e->res_values);
    free(e->url);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
    free(e);
}
