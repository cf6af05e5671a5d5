/*
 * This file contains the readings of model statistics (counters live in
 * model_stats_t, core.h).
 */
#ifndef NEREID_STATS_H
#define NEREID_STATS_H

#include <jansson.h>
#include <stdio.h>

#include "core/core.h"

/* One model_stats entry of the statistics extension (new reference). */
json_t *stats_model_json(const model_t *m);
/* Appends Triton's per-model metric families for these models. */
void stats_metrics_text(FILE *out, const model_t *const *models, size_t n_models,
                        bool counter_latencies, bool histogram_latencies);
/* --metrics-config summary_latencies=true: gives m's request, queue and
 * compute durations (cache hit and miss durations instead of the request's
 * when m's responses are cached, as Triton) a Prometheus summary over the
 * last minute with these quantiles (copied; at most
 * NEREID_MAX_SUMMARY_QUANTILES). Before m serves requests. */
void stats_enable_summaries(model_t *m, const double *quantiles, size_t n_quantiles);
/* --metrics-config histogram_latencies=true: gives m's request, queue and
 * compute durations a Prometheus histogram in microseconds (Triton's core
 * PR #474 names and buckets, or the config's model_metrics; no request
 * histogram when m's responses are cached). Before m serves requests. */
void stats_enable_histograms(model_t *m);
/* nereid_model_progress_timeouts_total of these models' backend models
 * (--model-progress-timeout-secs). */
void stats_progress_text(FILE *out, const model_t *const *models, size_t n_models);
/* Observes one request's first response, ms after the request arrived
 * (nv_inference_first_response_histogram_ms). */
void stats_first_response(model_stats_t *s, uint64_t ms);

#endif
