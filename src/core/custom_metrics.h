/*
 * This file contains the core's side of the custom metrics registry whose
 * public half is backend.h's nereid_metric_* (ABI 1.7): the /metrics text
 * of every registered family, and the number writer it uses.
 */
#ifndef NEREID_CUSTOM_METRICS_H
#define NEREID_CUSTOM_METRICS_H

#include <stddef.h>
#include <stdio.h>

/* Writes every family that has a series, oldest family first, as
 * prometheus-cpp prints it (HELP, TYPE, then each series; histograms as
 * _count, _sum and cumulative _bucket lines ending with le="+Inf"). */
void custom_metrics_text(FILE *out);

/* v as prometheus-cpp writes a sample value (std::to_chars' shortest
 * round-trip form; "Nan", "+Inf", "-Inf"). cap >= 32. */
void custom_metrics_format_double(char *buf, size_t cap, double v);

#endif
