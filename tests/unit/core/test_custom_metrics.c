/*
 * This file contains unit tests of the custom metrics registry
 * (backend.h's nereid_metric_*, src/core/custom_metrics.c): the /metrics
 * text of counters, gauges and histograms as prometheus-cpp prints it,
 * families merged by name, series shared by labels, the kind rules and
 * Triton's error texts, deletion order, and the number writer.
 */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "core/custom_metrics.h"
#include "nereid/backend.h"

static char *text(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    custom_metrics_text(out);
    fclose(out);
    return buf;
}

static void test_numbers(void)
{
    static const struct {
        double v;
        const char *want;
    } cases[] = {{0, "0"},           {1, "1"},
                 {-2.5, "-2.5"},     {0.1, "0.1"},
                 {100, "100"},       {1e6, "1e+06"},
                 {123456, "123456"}, {1e-7, "1e-07"},
                 {0.001, "0.001"},   {1.0 / 3, "0.3333333333333333"},
                 {NAN, "Nan"},       {INFINITY, "+Inf"},
                 {-INFINITY, "-Inf"}};
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        custom_metrics_format_double(buf, sizeof buf, cases[i].v);
        CHECK_STR(buf, cases[i].want);
    }
}

static void test_counter_gauge(void)
{
    nereid_metric_family_t *c = NULL, *g = NULL, *c2 = NULL;
    CHECK(!nereid_metric_family_new(NEREID_METRIC_COUNTER, "reqs_total", "Requests seen", &c));
    CHECK(!nereid_metric_family_new(NEREID_METRIC_GAUGE, "temp", "", &g));
    /* an empty family prints nothing */
    char *t = text();
    CHECK_STR(t, "");
    free(t);

    const char *names[] = {"model", "a", "model"};
    const char *values[] = {"x", "q\"\\\n", "m1"};
    nereid_metric_t *m1 = NULL, *m2 = NULL, *shared = NULL, *gm = NULL;
    CHECK(!nereid_metric_new(c, names, values, 3, NULL, 0, &m1));
    CHECK(!nereid_metric_new(c, NULL, NULL, 0, NULL, 0, &m2));
    CHECK(!nereid_metric_increment(m1, 2));
    CHECK(!nereid_metric_increment(m1, 0.5));
    CHECK_ERROR(nereid_metric_increment(m1, -1), NEREID_ERROR_INVALID_ARG,
                "can only be incremented monotonically by non-negative values");
    CHECK_ERROR(nereid_metric_set(m1, 3), NEREID_ERROR_UNSUPPORTED,
                "TRITONSERVER_METRIC_KIND_COUNTER does not support Set");
    CHECK_ERROR(nereid_metric_observe(m1, 3), NEREID_ERROR_UNSUPPORTED,
                "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe");
    /* a second family of the same name shares the series */
    CHECK(!nereid_metric_family_new(NEREID_METRIC_COUNTER, "reqs_total", "other", &c2));
    CHECK(!nereid_metric_new(c2, names, values, 3, NULL, 0, &shared));
    double v = 0;
    CHECK(!nereid_metric_value(shared, &v) && v == 2.5);
    CHECK(!nereid_metric_new(g, NULL, NULL, 0, NULL, 0, &gm));
    CHECK(!nereid_metric_set(gm, -4));
    CHECK(!nereid_metric_increment(gm, 1.25));
    t = text();
    CHECK_STR(t, "# HELP reqs_total Requests seen\n"
                 "# TYPE reqs_total counter\n"
                 "reqs_total{a=\"q\\\"\\\\\\n\",model=\"m1\"} 2.5\n"
                 "reqs_total 0\n"
                 "# TYPE temp gauge\n"
                 "temp -2.75\n");
    free(t);

    CHECK_ERROR(nereid_metric_family_delete(c), NEREID_ERROR_INTERNAL,
                "Must call MetricDelete on all dependent metrics before calling "
                "MetricFamilyDelete.");
    CHECK(!nereid_metric_delete(m1));
    /* the series lives on through the other family's metric */
    t = text();
    CHECK_STR_CONTAINS(t, "reqs_total{a=");
    free(t);
    CHECK(!nereid_metric_delete(m2));
    CHECK(!nereid_metric_family_delete(c));
    CHECK(!nereid_metric_delete(shared));
    CHECK(!nereid_metric_family_delete(c2));
    CHECK(!nereid_metric_delete(gm));
    CHECK(!nereid_metric_family_delete(g));
    t = text();
    CHECK_STR(t, "");
    free(t);
}

static void test_histogram(void)
{
    nereid_metric_family_t *h = NULL;
    CHECK(!nereid_metric_family_new(NEREID_METRIC_HISTOGRAM, "lat", "Latency", &h));
    const double buckets[] = {0.5, 1, 2.5};
    const char *names[] = {"model"}, *values[] = {"m"};
    nereid_metric_t *m = NULL, *bare = NULL;
    CHECK_ERROR(nereid_metric_new(h, names, values, 1, NULL, 0, &m), NEREID_ERROR_INVALID_ARG,
                "Bucket boundaries not found");
    const double unsorted[] = {1, 1};
    CHECK_ERROR(nereid_metric_new(h, names, values, 1, unsorted, 2, &m), NEREID_ERROR_INVALID_ARG,
                "Bucket Boundaries must be strictly sorted");
    CHECK(m == NULL);
    CHECK(!nereid_metric_new(h, names, values, 1, buckets, 3, &m));
    CHECK(!nereid_metric_new(h, NULL, NULL, 0, buckets, 0, &bare));
    CHECK(!nereid_metric_observe(m, 0.5));
    CHECK(!nereid_metric_observe(m, 2));
    CHECK(!nereid_metric_observe(m, 7));
    CHECK(!nereid_metric_observe(bare, 1));
    double v;
    CHECK_ERROR(nereid_metric_value(m, &v), NEREID_ERROR_UNSUPPORTED,
                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value");
    CHECK_ERROR(nereid_metric_increment(m, 1), NEREID_ERROR_UNSUPPORTED,
                "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment");
    char *t = text();
    CHECK_STR(t, "# HELP lat Latency\n"
                 "# TYPE lat histogram\n"
                 "lat_count{model=\"m\"} 3\n"
                 "lat_sum{model=\"m\"} 9.5\n"
                 "lat_bucket{model=\"m\",le=\"0.5\"} 1\n"
                 "lat_bucket{model=\"m\",le=\"1\"} 1\n"
                 "lat_bucket{model=\"m\",le=\"2.5\"} 2\n"
                 "lat_bucket{model=\"m\",le=\"+Inf\"} 3\n"
                 "lat_count 1\n"
                 "lat_sum 1\n"
                 "lat_bucket{le=\"+Inf\"} 1\n");
    free(t);
    CHECK(!nereid_metric_delete(m));
    CHECK(!nereid_metric_delete(bare));
    CHECK(!nereid_metric_family_delete(h));
}

static void test_errors(void)
{
    nereid_metric_family_t *f = NULL, *other = NULL;
    CHECK_ERROR(nereid_metric_family_new(NEREID_METRIC_COUNTER, "9bad", "", &f),
                NEREID_ERROR_INVALID_ARG, "Invalid metric name");
    CHECK_ERROR(nereid_metric_family_new(NEREID_METRIC_COUNTER, "a b", "", &f),
                NEREID_ERROR_INVALID_ARG, "Invalid metric name");
    CHECK_ERROR(nereid_metric_family_new((nereid_metric_kind_t)7, "k", "", &f),
                NEREID_ERROR_INVALID_ARG, "Unsupported kind");
    CHECK(f == NULL);
    CHECK(!nereid_metric_family_new(NEREID_METRIC_GAUGE, "g", "", &f));
    CHECK_ERROR(nereid_metric_family_new(NEREID_METRIC_COUNTER, "g", "", &other),
                NEREID_ERROR_INVALID_ARG, "Family name already exists with different type");
    nereid_metric_t *m = NULL;
    const char *bad_names[] = {"__reserved"}, *values[] = {"v"};
    CHECK_ERROR(nereid_metric_new(f, bad_names, values, 1, NULL, 0, &m), NEREID_ERROR_INVALID_ARG,
                "Invalid label name");
    const double b[] = {1};
    CHECK_ERROR(nereid_metric_new(f, NULL, NULL, 0, b, 1, &m), NEREID_ERROR_INVALID_ARG,
                "Unexpected args found in gauge Metric constructor.");
    CHECK(m == NULL);
    CHECK(!nereid_metric_family_delete(f));
    /* once the last handle is gone the name is free for another kind */
    CHECK(!nereid_metric_family_new(NEREID_METRIC_COUNTER, "g", "", &f));
    CHECK(nereid_metric_family_kind(f) == NEREID_METRIC_COUNTER);
    CHECK(!nereid_metric_family_delete(f));
}

int main(void)
{
    test_numbers();
    test_counter_gauge();
    test_histogram();
    test_errors();
    return check_summary();
}
