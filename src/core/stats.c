/*
 * This file contains model statistics: lock-free counters updated on the
 * hot path, and their two readings — the statistics extension's JSON
 * (seed 003) and Prometheus metrics with Triton's names.
 */
#include "core/stats.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "core/util.h"

/* ---- Latency summaries ----
 *
 * Triton's summaries (prometheus-cpp Summary: quantiles over the last
 * minute, sum and count over all time). Each keeps the observations of the
 * last minute in a ring of SUMMARY_WINDOW (older ones drop out first when
 * more arrive), and computes exact quantiles of that window at scrape time.
 * Only models served with summary_latencies=true pay for it. */

#define SUMMARY_WINDOW 1024
#define SUMMARY_MAX_AGE_NS (60ull * 1000000000ull)

struct latency_summary {
    pthread_mutex_t mu;
    uint64_t count;
    double sum_us;
    size_t next, n; /* ring position and fill */
    uint64_t t_ns[SUMMARY_WINDOW];
    double v_us[SUMMARY_WINDOW];
    double quantiles[NEREID_MAX_SUMMARY_QUANTILES];
    size_t n_quantiles;
};

/* ---- Latency histograms ----
 *
 * prometheus-cpp's Histogram: a count per bucket (here not cumulative, one
 * atomic add per observation; summed into cumulative _bucket lines at
 * scrape time), the count and the sum. The time to first response always
 * has one (in ms); the five phases get one under histogram_latencies=true
 * (in µs), with the names and default buckets of Triton's core PR #474.
 * model_metrics in config.pbtxt may replace any family's buckets. */

#define MAX_HISTOGRAM_BUCKETS 64

static bool cache_metrics_for(const model_t *m);

struct latency_histogram {
    size_t n_le;
    double le[MAX_HISTOGRAM_BUCKETS];               /* upper bounds, as configured */
    _Atomic uint64_t in[MAX_HISTOGRAM_BUCKETS + 1]; /* observations per bucket; last: +Inf */
    _Atomic uint64_t count, sum;
};

typedef struct histogram_family {
    const char *name, *help;
    size_t offset;        /* of the stat_duration_t in model_stats_t */
    double default_le[5]; /* Triton's buckets */
} histogram_family_t;

#define FIRST_RESPONSE_FAMILY "nv_inference_first_response_histogram_ms"

/* Triton's default buckets of nv_inference_first_response_histogram_ms. */
static const double first_response_le_ms[4] = {100, 500, 2000, 5000};

static const histogram_family_t histogram_families[] = {
    {"nv_inference_request_duration_histogram_us",
     "Histogram of inference request duration in microseconds (includes cached requests)",
     offsetof(model_stats_t, success),
     {1000, 5000, 25000, 50000, 100000}},
    {"nv_inference_queue_duration_histogram_us",
     "Histogram of inference queuing duration in microseconds (includes cached requests)",
     offsetof(model_stats_t, queue),
     {100, 1000, 5000, 10000, 50000}},
    {"nv_inference_compute_input_duration_histogram_us",
     "Histogram of compute input duration in microseconds (does not include cached requests)",
     offsetof(model_stats_t, compute_input),
     {100, 500, 1000, 5000, 10000}},
    {"nv_inference_compute_infer_duration_histogram_us",
     "Histogram of compute inference duration in microseconds (does not include cached "
     "requests)",
     offsetof(model_stats_t, compute_infer),
     {1000, 5000, 25000, 50000, 100000}},
    {"nv_inference_compute_output_duration_histogram_us",
     "Histogram of compute output duration in microseconds (does not include cached requests)",
     offsetof(model_stats_t, compute_output),
     {100, 500, 1000, 5000, 10000}},
};

/* The buckets cfg's model_metrics gives family, or NULL (*n untouched). */
static const double *configured_buckets(const model_config_t *cfg, const char *family, size_t *n)
{
    const Inference__ModelMetrics *mm = cfg ? cfg->model_metrics : NULL;
    const double *le = NULL;
    for (size_t i = 0; mm && i < mm->n_metric_control; i++) {
        const Inference__ModelMetrics__MetricControl *mc = mm->metric_control[i];
        const char *name = mc->metric_identifier ? mc->metric_identifier->family : "";
        if (strcmp(name, family) == 0 && mc->histogram_options &&
            mc->histogram_options->n_buckets) {
            le = mc->histogram_options->buckets;
            *n = mc->histogram_options->n_buckets;
        }
    }
    return le;
}

static struct latency_histogram *histogram_new(const model_config_t *cfg, const char *family,
                                               const double *default_le, size_t n_default)
{
    size_t n = n_default;
    const double *le = configured_buckets(cfg, family, &n);
    if (!le) le = default_le;
    if (n > MAX_HISTOGRAM_BUCKETS) {
        LOG_WARN("Metric family '%s': only the first %d of its %zu buckets are kept", family,
                 MAX_HISTOGRAM_BUCKETS, n);
        n = MAX_HISTOGRAM_BUCKETS;
    }
    struct latency_histogram *h = xcalloc(1, sizeof *h);
    h->n_le = n;
    memcpy(h->le, le, n * sizeof *le);
    return h;
}

static void histogram_observe(struct latency_histogram *h, uint64_t v)
{
    size_t b = 0;
    while (b < h->n_le && !((double)v <= h->le[b]))
        b++;
    atomic_fetch_add_explicit(&h->in[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
}

/* True when cfg's model_metrics may name family (Triton's customizable
 * histograms). */
static bool customizable(const char *family)
{
    if (strcmp(family, FIRST_RESPONSE_FAMILY) == 0) return true;
    for (size_t f = 0; f < ARRAY_LEN(histogram_families); f++)
        if (strcmp(family, histogram_families[f].name) == 0) return true;
    return false;
}

void stats_init(model_stats_t *s, int64_t max_batch_size, const model_config_t *cfg)
{
    s->n_batch = (size_t)(max_batch_size > 0 ? max_batch_size : 1) + 1;
    s->batch = xcalloc(s->n_batch, sizeof *s->batch);
    pthread_mutex_init(&s->resp_mu, NULL);
    const Inference__ModelMetrics *mm = cfg ? cfg->model_metrics : NULL;
    for (size_t i = 0; mm && i < mm->n_metric_control; i++) {
        const Inference__ModelMetrics__MetricControl *mc = mm->metric_control[i];
        const char *family = mc->metric_identifier ? mc->metric_identifier->family : "";
        if (!customizable(family))
            LOG_WARN("Metric family '%s' in 'metric_identifier' is not a customizable metric in "
                     "Triton core.",
                     family);
    }
    s->first_response = histogram_new(cfg, FIRST_RESPONSE_FAMILY, first_response_le_ms,
                                      ARRAY_LEN(first_response_le_ms));
}

static stat_duration_t *histogram_stat(model_t *m, size_t f)
{
    return (stat_duration_t *)((char *)&m->stats + histogram_families[f].offset);
}

void stats_enable_histograms(model_t *m)
{
    /* As the summaries: no request histogram for a cached model. */
    bool cached = cache_metrics_for(m);
    for (size_t f = 0; f < ARRAY_LEN(histogram_families); f++) {
        if (f == 0 && cached) continue;
        const histogram_family_t *hf = &histogram_families[f];
        histogram_stat(m, f)->histogram =
            histogram_new(m->config, hf->name, hf->default_le, ARRAY_LEN(hf->default_le));
    }
}

static void summary_free(stat_duration_t *d)
{
    free(d->histogram);
    d->histogram = NULL;
    if (!d->summary) return;
    pthread_mutex_destroy(&d->summary->mu);
    free(d->summary);
    d->summary = NULL;
}

void stats_destroy(model_stats_t *s)
{
    stat_duration_t *with[] = {&s->success,       &s->queue,          &s->compute_input,
                               &s->compute_infer, &s->compute_output, &s->cache_hit,
                               &s->cache_miss};
    for (size_t i = 0; i < ARRAY_LEN(with); i++)
        summary_free(with[i]);
    free(s->first_response);
    s->first_response = NULL;
    free(s->batch);
    s->batch = NULL;
    for (size_t i = 0; i < s->n_resp_more; i++)
        free(s->resp_more[i]);
    free(s->resp_more);
    s->resp_more = NULL;
    s->n_resp_more = 0;
    pthread_mutex_destroy(&s->resp_mu);
}

response_stat_t *stats_response(model_stats_t *s, uint64_t index)
{
    if (index == 0) return &s->response0;
    pthread_mutex_lock(&s->resp_mu);
    while (s->n_resp_more < index) {
        s->resp_more = xrealloc(s->resp_more, (s->n_resp_more + 1) * sizeof *s->resp_more);
        s->resp_more[s->n_resp_more++] = xcalloc(1, sizeof **s->resp_more);
    }
    response_stat_t *r = s->resp_more[index - 1];
    pthread_mutex_unlock(&s->resp_mu);
    return r;
}

void stats_record_response(model_stats_t *s, uint64_t index, uint64_t start, uint64_t out,
                           uint64_t end, const nereid_error_t *err)
{
    response_stat_t *rs = stats_response(s, index);
    if (err && nereid_error_code(err) == NEREID_ERROR_CANCELLED) {
        stats_add(&rs->cancel, end - start);
    } else if (err) {
        stats_add(&rs->compute_infer, (out ? out : end) - start);
        if (out) stats_add(&rs->compute_output, end - out);
        stats_add(&rs->fail, end - start);
    } else if (out) {
        stats_add(&rs->compute_infer, out - start);
        stats_add(&rs->compute_output, end - out);
        stats_add(&rs->success, end - start);
    } else {
        stats_add(&rs->compute_infer, end - start);
        stats_add(&rs->empty_response, end - start);
    }
}

static void summary_observe(struct latency_summary *q, uint64_t ns)
{
    pthread_mutex_lock(&q->mu);
    q->count++;
    q->sum_us += (double)(ns / 1000);
    q->t_ns[q->next] = util_now_ns();
    q->v_us[q->next] = (double)(ns / 1000);
    q->next = (q->next + 1) % SUMMARY_WINDOW;
    if (q->n < SUMMARY_WINDOW) q->n++;
    pthread_mutex_unlock(&q->mu);
}

void stats_add(stat_duration_t *d, uint64_t ns)
{
    atomic_fetch_add_explicit(&d->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->ns, ns, memory_order_relaxed);
    if (d->summary) summary_observe(d->summary, ns);
    if (d->histogram) histogram_observe(d->histogram, ns / 1000);
}

static json_t *duration_json(const stat_duration_t *d)
{
    return json_pack("{s:I,s:I}", "count", (json_int_t)atomic_load(&d->count), "ns",
                     (json_int_t)atomic_load(&d->ns));
}

static void response_stat_json(json_t *obj, uint64_t index, const response_stat_t *r)
{
    if (!atomic_load(&r->success.count) && !atomic_load(&r->fail.count) &&
        !atomic_load(&r->empty_response.count) && !atomic_load(&r->cancel.count))
        return;
    char key[24];
    snprintf(key, sizeof key, "%llu", (unsigned long long)index);
    json_object_set_new(
        obj, key,
        json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "compute_infer", duration_json(&r->compute_infer),
                  "compute_output", duration_json(&r->compute_output), "success",
                  duration_json(&r->success), "fail", duration_json(&r->fail), "empty_response",
                  duration_json(&r->empty_response), "cancel", duration_json(&r->cancel)));
}

static int cmp_index_text(const void *a, const void *b)
{
    char x[24], y[24];
    snprintf(x, sizeof x, "%zu", *(const size_t *)a);
    snprintf(y, sizeof y, "%zu", *(const size_t *)b);
    return strcmp(x, y);
}

/* {"0": {...}, "1": {...}, ...}: every response index that was counted, in
 * the order of their keys as text (Triton's std::map: "0","1","10","2"). */
static json_t *response_stats_json(const model_stats_t *cs)
{
    model_stats_t *s = (model_stats_t *)cs; /* the lock only */
    json_t *obj = json_object();
    pthread_mutex_lock(&s->resp_mu);
    size_t n = s->n_resp_more + 1;
    size_t *order = xmalloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort(order, n, sizeof *order, cmp_index_text);
    for (size_t i = 0; i < n; i++)
        response_stat_json(obj, order[i], order[i] ? s->resp_more[order[i] - 1] : &s->response0);
    pthread_mutex_unlock(&s->resp_mu);
    free(order);
    return obj;
}

json_t *stats_model_json(const model_t *m)
{
    const model_stats_t *s = &m->stats;
    char version[32];
    snprintf(version, sizeof version, "%lld", (long long)m->version);
    json_t *batches = json_array();
    for (size_t b = 1; b < s->n_batch; b++) {
        const batch_stat_t *bs = &s->batch[b];
        if (!atomic_load(&bs->compute_infer.count)) continue;
        json_array_append_new(batches,
                              json_pack("{s:I,s:o,s:o,s:o}", "batch_size", (json_int_t)b,
                                        "compute_input", duration_json(&bs->compute_input),
                                        "compute_infer", duration_json(&bs->compute_infer),
                                        "compute_output", duration_json(&bs->compute_output)));
    }
    json_t *inf = json_pack(
        "{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "success", duration_json(&s->success), "fail",
        duration_json(&s->fail), "queue", duration_json(&s->queue), "compute_input",
        duration_json(&s->compute_input), "compute_infer", duration_json(&s->compute_infer),
        "compute_output", duration_json(&s->compute_output), "cache_hit",
        duration_json(&s->cache_hit), "cache_miss", duration_json(&s->cache_miss));
    return json_pack("{s:s,s:s,s:I,s:I,s:I,s:o,s:o,s:o,s:o}", "name", m->name, "version", version,
                     "last_inference", (json_int_t)atomic_load(&s->last_inference_ms),
                     "inference_count", (json_int_t)atomic_load(&s->inference_count),
                     "execution_count", (json_int_t)atomic_load(&s->execution_count),
                     "inference_stats", inf, "response_stats", response_stats_json(s),
                     "batch_stats", batches, "memory_usage", json_array());
}

void stats_summaries_text(FILE *out, const model_t *const *models, size_t n_models);

/* ---- Prometheus text ---- */

typedef struct metric_family {
    const char *name, *type, *help;
} metric_family_t;

static const metric_family_t families[] = {
    {"nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes"},
    {"nv_inference_request_failure", "counter",
     "Number of failed inference requests, all batch sizes"},
    {"nv_inference_count", "counter",
     "Number of inferences performed (does not include cached requests)"},
    {"nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)"},
    {"nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"},
    {"nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"},
    {"nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"},
    {"nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"},
    {"nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)"},
    {"nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."},
};

static const char *failure_names[FAILURE_N] = {"REJECTED", "CANCELED", "BACKEND", "OTHER"};

/* Appends text to buf at *n as a Prometheus label value (\\, \" and \n
 * escaped), never past cap. */
static void put_escaped(char *buf, size_t cap, size_t *n, const char *text)
{
    for (const char *p = text; *p && *n + 2 < cap; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n') buf[(*n)++] = '\\';
        buf[(*n)++] = *p == '\n' ? 'n' : *p;
    }
    buf[*n] = '\0';
}

static void put_label(char *buf, size_t cap, size_t *n, const char *prefix, const char *key,
                      const char *value)
{
    if (*n + 1 >= cap) return;
    int k = snprintf(buf + *n, cap - *n, "%s%s%s=\"", *n ? "," : "", prefix, key);
    if (k < 0 || (size_t)k >= cap - *n) {
        *n = cap - 1;
        return;
    }
    *n += (size_t)k;
    put_escaped(buf, cap, n, value);
    if (*n + 1 < cap) {
        buf[(*n)++] = '"';
        buf[*n] = '\0';
    }
}

static int cmp_tag(const void *a, const void *b)
{
    const Inference__ModelConfig__MetricTagsEntry *x = *(const void *const *)a;
    const Inference__ModelConfig__MetricTagsEntry *y = *(const void *const *)b;
    return strcmp(x->key, y->key);
}

/* A model's labels in Triton's order (prometheus-cpp keeps them in a sorted
 * map): metric tags as "_<key>" (a repeated key keeps its last value, as a
 * protobuf map does), model, the failure reason when given, version. */
static void labels(char *buf, size_t cap, const model_t *m, const char *reason)
{
    const model_config_t *c = m->config;
    size_t n = 0;
    buf[0] = '\0';
    if (c->n_metric_tags) {
        const Inference__ModelConfig__MetricTagsEntry **tags =
            xmalloc(c->n_metric_tags * sizeof *tags);
        size_t n_tags = 0;
        for (size_t i = c->n_metric_tags; i-- > 0;) { /* last occurrence first */
            bool seen = false;
            for (size_t j = 0; j < n_tags && !seen; j++)
                seen = strcmp(tags[j]->key, c->metric_tags[i]->key) == 0;
            if (!seen) tags[n_tags++] = c->metric_tags[i];
        }
        qsort(tags, n_tags, sizeof *tags, cmp_tag);
        for (size_t i = 0; i < n_tags; i++)
            put_label(buf, cap, &n, "_", tags[i]->key, tags[i]->value);
        free(tags);
    }
    char version[32];
    snprintf(version, sizeof version, "%lld", (long long)m->version);
    put_label(buf, cap, &n, "", "model", m->name);
    if (m->ns) put_label(buf, cap, &n, "", "namespace", m->ns);
    if (reason) put_label(buf, cap, &n, "", "reason", reason);
    put_label(buf, cap, &n, "", "version", version);
}

static uint64_t family_value(const model_t *m, size_t f)
{
    const model_stats_t *s = &m->stats;
    switch (f) {
    case 0:
        return atomic_load(&s->success.count);
    case 2:
        return atomic_load(&s->inference_count);
    case 3:
        return atomic_load(&s->execution_count);
    case 4:
        return (atomic_load(&s->success.ns) + atomic_load(&s->fail.ns)) / 1000;
    case 5:
        return atomic_load(&s->queue.ns) / 1000;
    case 6:
        return atomic_load(&s->compute_input.ns) / 1000;
    case 7:
        return atomic_load(&s->compute_infer.ns) / 1000;
    case 8:
        return atomic_load(&s->compute_output.ns) / 1000;
    default:
        return 0;
    }
}

/* Triton's load-time gauge: backend models only, so the family is left out
 * when only ensembles are loaded (prometheus-cpp omits empty families). */
static void load_duration_text(FILE *out, const model_t *const *models, size_t n_models)
{
    char lab[1024];
    bool any = false;
    for (size_t i = 0; i < n_models; i++) {
        if (!models[i]->backend) continue;
        if (!any)
            fputs("# HELP nv_model_load_duration_secs Model load time in seconds\n"
                  "# TYPE nv_model_load_duration_secs gauge\n",
                  out);
        any = true;
        labels(lab, sizeof lab, models[i], NULL);
        fprintf(out, "nv_model_load_duration_secs{%s} %.9g\n", lab,
                (double)models[i]->stats.load_ns / 1e9);
    }
}

/* Triton's per-model cache families: only for models whose requests go
 * through the cache (none at all when no model does). Ensembles have none:
 * Triton creates their metric reporter with the cache off. */
static bool cache_metrics_for(const model_t *m)
{
    return cache_enabled(m) && m->backend_name;
}

static void cache_metrics_per_model(FILE *out, const model_t *const *models, size_t n_models)
{
    static const char *const families[][2] = {
        {"nv_cache_num_hits_per_model", "Number of cache hits per model"},
        {"nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"},
        {"nv_cache_num_misses_per_model", "Number of cache misses per model"},
        {"nv_cache_miss_duration_per_model",
         "Total cache miss (insert+lookup) duration per model, in microseconds"},
    };
    bool any = false;
    for (size_t i = 0; i < n_models && !any; i++)
        any = cache_metrics_for(models[i]);
    if (!any) return;
    char lab[1024];
    for (size_t f = 0; f < ARRAY_LEN(families); f++) {
        fprintf(out, "# HELP %s %s\n# TYPE %s counter\n", families[f][0], families[f][1],
                families[f][0]);
        for (size_t i = 0; i < n_models; i++) {
            const model_t *m = models[i];
            if (!cache_metrics_for(m)) continue;
            const stat_duration_t *d = f < 2 ? &m->stats.cache_hit : &m->stats.cache_miss;
            uint64_t v = f % 2 ? atomic_load(&d->ns) / 1000 : atomic_load(&d->count);
            labels(lab, sizeof lab, m, NULL);
            fprintf(out, "%s{%s} %llu\n", families[f][0], lab, (unsigned long long)v);
        }
    }
}

void stats_first_response(model_stats_t *s, uint64_t ms)
{
    histogram_observe(s->first_response, ms);
}

/* prometheus-cpp's histogram text for one model: _count, _sum, then
 * cumulative _bucket lines with le. */
static void histogram_text(FILE *out, const char *name, const char *lab,
                           const struct latency_histogram *h)
{
    /* The buckets first: a scrape racing an observation then never shows
     * a bucket above the count. */
    uint64_t cumulative[MAX_HISTOGRAM_BUCKETS + 1], run = 0;
    for (size_t b = 0; b <= h->n_le; b++)
        cumulative[b] = run += atomic_load(&h->in[b]);
    uint64_t total = atomic_load(&h->count);
    if (total < run) total = run;
    fprintf(out, "%s_count{%s} %llu\n%s_sum{%s} %llu\n", name, lab, (unsigned long long)total, name,
            lab, (unsigned long long)atomic_load(&h->sum));
    for (size_t b = 0; b < h->n_le; b++)
        fprintf(out, "%s_bucket{%s,le=\"%.15g\"} %llu\n", name, lab, h->le[b],
                (unsigned long long)cumulative[b]);
    fprintf(out, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lab, (unsigned long long)total);
}

static void histograms_text(FILE *out, const model_t *const *models, size_t n_models)
{
    char lab[1024];
    fprintf(out,
            "# HELP %s Duration from request to first response in milliseconds\n"
            "# TYPE %s histogram\n",
            FIRST_RESPONSE_FAMILY, FIRST_RESPONSE_FAMILY);
    for (size_t i = 0; i < n_models; i++) {
        labels(lab, sizeof lab, models[i], NULL);
        histogram_text(out, FIRST_RESPONSE_FAMILY, lab, models[i]->stats.first_response);
    }
    for (size_t f = 0; f < ARRAY_LEN(histogram_families); f++) {
        const histogram_family_t *hf = &histogram_families[f];
        bool any = false;
        for (size_t i = 0; i < n_models && !any; i++)
            any = histogram_stat((model_t *)models[i], f)->histogram != NULL;
        if (!any) continue;
        fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", hf->name, hf->help, hf->name);
        for (size_t i = 0; i < n_models; i++) {
            const struct latency_histogram *h = histogram_stat((model_t *)models[i], f)->histogram;
            if (!h) continue;
            labels(lab, sizeof lab, models[i], NULL);
            histogram_text(out, hf->name, lab, h);
        }
    }
}

void stats_metrics_text(FILE *out, const model_t *const *models, size_t n_models,
                        bool counter_latencies, bool histogram_latencies)
{
    char lab[1024];
    for (size_t f = 0; f < ARRAY_LEN(families); f++) {
        /* Families 4..8 are the latency counters (--metrics-config
         * counter_latencies=false leaves them out). */
        if (!counter_latencies && f >= 4 && f <= 8) continue;
        fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", families[f].name, families[f].help,
                families[f].name, families[f].type);
        for (size_t i = 0; i < n_models; i++) {
            const model_t *m = models[i];
            labels(lab, sizeof lab, m, NULL);
            if (f == 1) {
                for (int r = 0; r < FAILURE_N; r++) {
                    labels(lab, sizeof lab, m, failure_names[r]);
                    fprintf(out, "%s{%s} %llu\n", families[f].name, lab,
                            (unsigned long long)atomic_load(&m->stats.failures[r]));
                }
            } else if (f == 9) {
                int64_t p = atomic_load(&m->stats.pending);
                fprintf(out, "%s{%s} %lld\n", families[f].name, lab, (long long)(p < 0 ? 0 : p));
            } else {
                fprintf(out, "%s{%s} %llu\n", families[f].name, lab,
                        (unsigned long long)family_value(m, f));
            }
        }
    }
    if (histogram_latencies) histograms_text(out, models, n_models);
    stats_summaries_text(out, models, n_models);
    load_duration_text(out, models, n_models);
    cache_metrics_per_model(out, models, n_models);
}

void stats_progress_text(FILE *out, const model_t *const *models, size_t n_models)
{
    char lab[1024];
    fputs("# HELP nereid_model_progress_timeouts_total Times the model was found not making "
          "progress (--model-progress-timeout-secs)\n"
          "# TYPE nereid_model_progress_timeouts_total counter\n",
          out);
    for (size_t i = 0; i < n_models; i++) {
        if (!models[i]->backend) continue;
        labels(lab, sizeof lab, models[i], NULL);
        fprintf(out, "nereid_model_progress_timeouts_total{%s} %llu\n", lab,
                (unsigned long long)atomic_load(&models[i]->stats.progress_timeouts));
    }
}

/* ---- Latency summaries: families ---- */

typedef struct summary_family {
    const char *name, *help;
    size_t offset; /* of the stat_duration_t in model_stats_t */
} summary_family_t;

static const summary_family_t summary_families[] = {
    {"nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)",
     offsetof(model_stats_t, success)},
    {"nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)",
     offsetof(model_stats_t, queue)},
    {"nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     offsetof(model_stats_t, compute_input)},
    {"nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     offsetof(model_stats_t, compute_infer)},
    {"nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)",
     offsetof(model_stats_t, compute_output)},
    {"nv_cache_hit_summary_per_model",
     "Summary of cache hit counts/durations per model, in "
     "microseconds.",
     offsetof(model_stats_t, cache_hit)},
    {"nv_cache_miss_summary_per_model",
     "Summary of cache miss counts/durations per model, in "
     "microseconds.",
     offsetof(model_stats_t, cache_miss)},
};

static stat_duration_t *family_stat(const model_t *m, size_t f)
{
    return (stat_duration_t *)((char *)&m->stats + summary_families[f].offset);
}

void stats_enable_summaries(model_t *m, const double *quantiles, size_t n_quantiles)
{
    /* Triton: no request summary for a cached model (its FIXME), cache
     * summaries only for one. */
    bool cached = cache_metrics_for(m);
    for (size_t f = 0; f < ARRAY_LEN(summary_families); f++) {
        if ((f == 0 && cached) || (f >= 5 && !cached)) continue;
        struct latency_summary *q = xcalloc(1, sizeof *q);
        pthread_mutex_init(&q->mu, NULL);
        q->n_quantiles =
            n_quantiles < NEREID_MAX_SUMMARY_QUANTILES ? n_quantiles : NEREID_MAX_SUMMARY_QUANTILES;
        memcpy(q->quantiles, quantiles, q->n_quantiles * sizeof *quantiles);
        family_stat(m, f)->summary = q;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* prometheus-cpp's number format: Nan for no observation. */
static void put_number(FILE *out, double v)
{
    if (isnan(v))
        fputs("Nan", out);
    else
        fprintf(out, "%.16g", v);
}

static void summary_text(FILE *out, const char *name, const char *lab, struct latency_summary *q)
{
    double window[SUMMARY_WINDOW];
    size_t n = 0;
    uint64_t now = util_now_ns();
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->n; i++)
        if (now - q->t_ns[i] <= SUMMARY_MAX_AGE_NS) window[n++] = q->v_us[i];
    uint64_t count = q->count;
    double sum = q->sum_us;
    pthread_mutex_unlock(&q->mu);
    qsort(window, n, sizeof *window, cmp_double);
    for (size_t k = 0; k < q->n_quantiles; k++) {
        double phi = q->quantiles[k], v = NAN;
        if (n) {
            double rank = phi * (double)n;
            size_t i = rank <= 1 ? 0 : (size_t)(rank + 0.5) - 1;
            v = window[i < n ? i : n - 1];
        }
        fprintf(out, "%s{%s,quantile=\"%.16g\"} ", name, lab, phi);
        put_number(out, v);
        fputc('\n', out);
    }
    fprintf(out, "%s_sum{%s} ", name, lab);
    put_number(out, sum);
    fprintf(out, "\n%s_count{%s} %llu\n", name, lab, (unsigned long long)count);
}

void stats_summaries_text(FILE *out, const model_t *const *models, size_t n_models)
{
    char lab[1024];
    for (size_t f = 0; f < ARRAY_LEN(summary_families); f++) {
        bool any = false;
        for (size_t i = 0; i < n_models && !any; i++)
            any = family_stat(models[i], f)->summary != NULL;
        if (!any) continue;
        const char *name = summary_families[f].name;
        fprintf(out, "# HELP %s %s\n# TYPE %s summary\n", name, summary_families[f].help, name);
        for (size_t i = 0; i < n_models; i++) {
            struct latency_summary *q = family_stat(models[i], f)->summary;
            if (!q) continue;
            labels(lab, sizeof lab, models[i], NULL);
            summary_text(out, name, lab, q);
        }
    }
}
