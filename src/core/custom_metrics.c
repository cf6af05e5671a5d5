/*
 * This file contains the custom metrics registry (backend.h, ABI 1.7): the
 * counters, gauges and histograms that backends create — Triton backends
 * through TRITONSERVER_Metric* (src/tritonapi/) and Python models through
 * pb_utils.MetricFamily (backends/python/) — printed on /metrics after
 * Nereid's own families in prometheus-cpp's text format, which is what
 * Triton prints them with.
 *
 * Shape, as prometheus-cpp's registry with Triton's merge behaviour: one
 * registered family per name (kind fixed by the first), each holding series
 * keyed by their canonical label text (names sorted, values escaped). A
 * family handle and a metric handle are the caller's objects; a series is
 * shared by every metric handle with the same labels and lives until the
 * last of them is deleted; a registered family lives while a handle or a
 * series refers to it. The workload assumed: a few families of a few
 * series each, updated on the request path — so one mutex and linked lists.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "core/custom_metrics.h"
#include "core/util.h"
#include "nereid/backend.h"

typedef struct series series_t;
typedef struct registered registered_t;

struct series {
    series_t *next;
    char *labels;    /* k="v",... sorted by name; "" for none */
    size_t n_refs;   /* metric handles sharing this series (>= 1) */
    double value;    /* counter / gauge */
    size_t n_bounds; /* histogram: bucket upper bounds, ascending */
    double *bounds;
    uint64_t *counts; /* histogram: n_bounds + 1 per-bucket counts (last: +Inf) */
    uint64_t count;
    double sum;
};

struct registered {
    registered_t *next;
    nereid_metric_kind_t kind;
    char *name, *help;
    size_t n_refs; /* family handles + series */
    series_t *series;
};

struct nereid_metric_family {
    registered_t *reg;
    size_t n_metrics; /* metric handles made from this handle */
};

struct nereid_metric {
    nereid_metric_family_t *family;
    series_t *series;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static registered_t *registry; /* newest first; printed oldest first */

static nereid_error_t *invalid(const char *msg)
{
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s", msg);
}

/* Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names the same
 * without ':' and not starting with "__" (reserved). */
static bool name_ok(const char *name, bool label)
{
    if (!name || !name[0] || (name[0] >= '0' && name[0] <= '9')) return false;
    if (label && name[0] == '_' && name[1] == '_') return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || (*p == ':' && !label)))
            return false;
    return true;
}

/* Caller holds lock. */
static void registered_unref(registered_t *r)
{
    if (--r->n_refs) return;
    for (registered_t **p = &registry; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    free(r->name);
    free(r->help);
    free(r);
}

nereid_error_t *nereid_metric_family_new(nereid_metric_kind_t kind, const char *name,
                                         const char *description, nereid_metric_family_t **out)
{
    if (!out) return invalid("metric family must not be NULL");
    *out = NULL;
    if (kind != NEREID_METRIC_COUNTER && kind != NEREID_METRIC_GAUGE &&
        kind != NEREID_METRIC_HISTOGRAM)
        return invalid("Unsupported kind passed to MetricFamily constructor.");
    if (!name_ok(name, false)) return invalid("Invalid metric name");
    pthread_mutex_lock(&lock);
    registered_t *r = registry;
    while (r && strcmp(r->name, name) != 0)
        r = r->next;
    if (r && r->kind != kind) {
        pthread_mutex_unlock(&lock);
        return invalid("Family name already exists with different type");
    }
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->kind = kind;
        r->name = xstrdup(name);
        r->help = xstrdup(description ? description : "");
        r->next = registry;
        registry = r;
    }
    r->n_refs++;
    pthread_mutex_unlock(&lock);
    nereid_metric_family_t *f = xcalloc(1, sizeof *f);
    f->reg = r;
    *out = f;
    return NULL;
}

nereid_error_t *nereid_metric_family_delete(nereid_metric_family_t *family)
{
    if (!family) return invalid("metric family must not be NULL");
    pthread_mutex_lock(&lock);
    if (family->n_metrics) {
        pthread_mutex_unlock(&lock);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Must call MetricDelete on all dependent metrics before calling "
                                "MetricFamilyDelete.");
    }
    registered_unref(family->reg);
    pthread_mutex_unlock(&lock);
    free(family);
    return NULL;
}

nereid_metric_kind_t nereid_metric_family_kind(const nereid_metric_family_t *family)
{
    return family->reg->kind; /* fixed at registration: no lock needed */
}

/* Writes a label value with Prometheus' escapes. */
static void put_escaped(FILE *out, const char *s)
{
    for (; *s; s++)
        if (*s == '\\' || *s == '"')
            fprintf(out, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", out);
        else
            fputc(*s, out);
}

/* The canonical label text (names sorted, last value of a repeated name
 * wins), or NULL with *err set. */
static char *label_text(const char *const *names, const char *const *values, size_t n,
                        nereid_error_t **err)
{
    size_t *order = xcalloc(n ? n : 1, sizeof *order);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!names || !values || !names[i] || !values[i]) {
            *err = invalid("metric labels must have a name and a value");
            free(order);
            return NULL;
        }
        if (!name_ok(names[i], true)) {
            *err = invalid("Invalid label name");
            free(order);
            return NULL;
        }
        size_t j = 0;
        while (j < k && strcmp(names[order[j]], names[i]) != 0)
            j++;
        if (j < k) { /* repeated: the later value replaces the earlier */
            order[j] = i;
            continue;
        }
        j = k++;
        while (j > 0 && strcmp(names[order[j - 1]], names[i]) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    if (!out) abort();
    for (size_t j = 0; j < k; j++) {
        fprintf(out, "%s%s=\"", j ? "," : "", names[order[j]]);
        put_escaped(out, values[order[j]]);
        fputc('"', out);
    }
    fclose(out);
    free(order);
    return buf;
}

nereid_error_t *nereid_metric_new(nereid_metric_family_t *family, const char *const *label_names,
                                  const char *const *label_values, size_t n_labels,
                                  const double *buckets, size_t n_buckets, nereid_metric_t **out)
{
    if (!out) return invalid("metric must not be NULL");
    *out = NULL;
    if (!family) return invalid("metric family must not be NULL");
    nereid_metric_kind_t kind = family->reg->kind;
    if (kind == NEREID_METRIC_HISTOGRAM) {
        if (!buckets) return invalid("Bucket boundaries not found in Metric args.");
        for (size_t i = 0; i < n_buckets; i++)
            if (isnan(buckets[i]) || (i && !(buckets[i - 1] < buckets[i])))
                return invalid("Bucket Boundaries must be strictly sorted");
    } else if (buckets) {
        return invalid(kind == NEREID_METRIC_COUNTER
                           ? "Unexpected args found in counter Metric constructor."
                           : "Unexpected args found in gauge Metric constructor.");
    }
    nereid_error_t *err = NULL;
    char *labels = label_text(label_names, label_values, n_labels, &err);
    if (!labels) return err;
    pthread_mutex_lock(&lock);
    registered_t *r = family->reg;
    series_t *s = r->series;
    while (s && strcmp(s->labels, labels) != 0)
        s = s->next;
    if (s) { /* prometheus-cpp hands back the existing series (its buckets) */
        free(labels);
        s->n_refs++;
    } else {
        s = xcalloc(1, sizeof *s);
        s->labels = labels;
        s->n_refs = 1;
        if (kind == NEREID_METRIC_HISTOGRAM) {
            s->n_bounds = n_buckets;
            s->bounds = xcalloc(n_buckets ? n_buckets : 1, sizeof *s->bounds);
            if (n_buckets) memcpy(s->bounds, buckets, n_buckets * sizeof *buckets);
            s->counts = xcalloc(n_buckets + 1, sizeof *s->counts);
        }
        series_t **tail = &r->series; /* printed in creation order */
        while (*tail)
            tail = &(*tail)->next;
        *tail = s;
        r->n_refs++;
    }
    family->n_metrics++;
    pthread_mutex_unlock(&lock);
    nereid_metric_t *m = xcalloc(1, sizeof *m);
    m->family = family;
    m->series = s;
    *out = m;
    return NULL;
}

nereid_error_t *nereid_metric_delete(nereid_metric_t *metric)
{
    if (!metric) return invalid("metric must not be NULL");
    pthread_mutex_lock(&lock);
    registered_t *r = metric->family->reg;
    metric->family->n_metrics--;
    series_t *s = metric->series;
    if (--s->n_refs == 0) {
        for (series_t **p = &r->series; *p; p = &(*p)->next)
            if (*p == s) {
                *p = s->next;
                break;
            }
        free(s->labels);
        free(s->bounds);
        free(s->counts);
        free(s);
        registered_unref(r);
    }
    pthread_mutex_unlock(&lock);
    free(metric);
    return NULL;
}

nereid_metric_kind_t nereid_metric_kind(const nereid_metric_t *metric)
{
    return metric->family->reg->kind;
}

static const char *kind_upper(nereid_metric_kind_t k)
{
    return k == NEREID_METRIC_COUNTER ? "COUNTER"
           : k == NEREID_METRIC_GAUGE ? "GAUGE"
                                      : "HISTOGRAM";
}

static nereid_error_t *unsupported(nereid_metric_kind_t k, const char *op)
{
    return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                            "TRITONSERVER_METRIC_KIND_%s does not support %s", kind_upper(k), op);
}

nereid_error_t *nereid_metric_value(nereid_metric_t *metric, double *value)
{
    if (!metric || !value) return invalid("metric and value must not be NULL");
    nereid_metric_kind_t k = nereid_metric_kind(metric);
    if (k == NEREID_METRIC_HISTOGRAM) return unsupported(k, "Value");
    pthread_mutex_lock(&lock);
    *value = metric->series->value;
    pthread_mutex_unlock(&lock);
    return NULL;
}

nereid_error_t *nereid_metric_increment(nereid_metric_t *metric, double value)
{
    if (!metric) return invalid("metric must not be NULL");
    nereid_metric_kind_t k = nereid_metric_kind(metric);
    if (k == NEREID_METRIC_HISTOGRAM) return unsupported(k, "Increment");
    if (k == NEREID_METRIC_COUNTER && !(value >= 0.0))
        return invalid("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                       "non-negative values.");
    pthread_mutex_lock(&lock);
    metric->series->value += value;
    pthread_mutex_unlock(&lock);
    return NULL;
}

nereid_error_t *nereid_metric_set(nereid_metric_t *metric, double value)
{
    if (!metric) return invalid("metric must not be NULL");
    nereid_metric_kind_t k = nereid_metric_kind(metric);
    if (k != NEREID_METRIC_GAUGE) return unsupported(k, "Set");
    pthread_mutex_lock(&lock);
    metric->series->value = value;
    pthread_mutex_unlock(&lock);
    return NULL;
}

nereid_error_t *nereid_metric_observe(nereid_metric_t *metric, double value)
{
    if (!metric) return invalid("metric must not be NULL");
    nereid_metric_kind_t k = nereid_metric_kind(metric);
    if (k != NEREID_METRIC_HISTOGRAM) return unsupported(k, "Observe");
    pthread_mutex_lock(&lock);
    series_t *s = metric->series;
    size_t b = 0; /* prometheus-cpp: the first bucket whose bound is >= value */
    while (b < s->n_bounds && !(value <= s->bounds[b]))
        b++;
    s->counts[b]++;
    s->count++;
    s->sum += value;
    pthread_mutex_unlock(&lock);
    return NULL;
}

void custom_metrics_format_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "Nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, "%s", v < 0 ? "-Inf" : "+Inf");
        return;
    }
    /* std::to_chars' shortest form: the fewest significant digits that read
     * back as v, in fixed or scientific notation, whichever is shorter
     * (fixed on a tie). */
    char sci[40];
    int digits = 1;
    for (; digits <= 17; digits++) {
        snprintf(sci, sizeof sci, "%.*e", digits - 1, v);
        if (strtod(sci, NULL) == v) break;
    }
    int exp10 = atoi(strchr(sci, 'e') + 1);
    char fixed[400];
    int decimals = digits - 1 - exp10;
    snprintf(fixed, sizeof fixed, "%.*f", decimals > 0 ? decimals : 0, v);
    /* scientific as to_chars writes it: at least two exponent digits */
    snprintf(sci, sizeof sci, "%.*e", digits - 1, v);
    snprintf(buf, cap, "%s", strlen(fixed) <= strlen(sci) ? fixed : sci);
}

void custom_metrics_text(FILE *out)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    for (registered_t *r = registry; r; r = r->next)
        n++;
    registered_t **order = xcalloc(n ? n : 1, sizeof *order);
    size_t i = n;
    for (registered_t *r = registry; r; r = r->next)
        order[--i] = r;
    static const char *const type[] = {"counter", "gauge", "histogram"};
    char v[64], le[64];
    for (i = 0; i < n; i++) {
        registered_t *r = order[i];
        if (!r->series) continue; /* prometheus-cpp skips empty families */
        if (r->help[0]) {
            fprintf(out, "# HELP %s ", r->name);
            for (const char *c = r->help; *c; c++)
                if (*c == '\\')
                    fputs("\\\\", out);
                else if (*c == '\n')
                    fputs("\\n", out);
                else
                    fputc(*c, out);
            fputc('\n', out);
        }
        fprintf(out, "# TYPE %s %s\n", r->name, type[r->kind]);
        for (series_t *s = r->series; s; s = s->next) {
            const char *open = s->labels[0] ? "{" : "", *close = s->labels[0] ? "}" : "";
            if (r->kind != NEREID_METRIC_HISTOGRAM) {
                custom_metrics_format_double(v, sizeof v, s->value);
                fprintf(out, "%s%s%s%s %s\n", r->name, open, s->labels, close, v);
                continue;
            }
            custom_metrics_format_double(v, sizeof v, s->sum);
            fprintf(out, "%s_count%s%s%s %llu\n%s_sum%s%s%s %s\n", r->name, open, s->labels, close,
                    (unsigned long long)s->count, r->name, open, s->labels, close, v);
            const char *sep = s->labels[0] ? "," : "";
            uint64_t cumulative = 0;
            for (size_t b = 0; b <= s->n_bounds; b++) {
                cumulative += s->counts[b];
                if (b < s->n_bounds)
                    custom_metrics_format_double(le, sizeof le, s->bounds[b]);
                else if (s->n_bounds && isinf(s->bounds[s->n_bounds - 1]))
                    break; /* the last bound was +Inf already */
                else
                    snprintf(le, sizeof le, "+Inf");
                fprintf(out, "%s_bucket{%s%sle=\"%s\"} %llu\n", r->name, s->labels, sep, le,
                        (unsigned long long)cumulative);
            }
        }
    }
    pthread_mutex_unlock(&lock);
    free(order);
}
