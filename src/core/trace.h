/*
 * This file contains the core's tracing hooks (trace.c): the few calls the
 * request path makes when a request carries a trace (req->trace non-NULL),
 * each next to the statistics timestamp it reports.
 */
#ifndef NEREID_TRACE_H
#define NEREID_TRACE_H

#include <stdint.h>

#include "nereid/server.h"

/* REQUEST_START and QUEUE_START at req->t_request_ns (req->model set). */
void trace_request_start(nereid_request_t *req);
/* COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END. */
void trace_compute(nereid_trace_t *trace, uint64_t start_ns, uint64_t input_end_ns,
                   uint64_t output_start_ns, uint64_t end_ns);
/* TENSORS level (Triton's tensor activities, triton mode only):
 * TENSOR_QUEUE_INPUT for each input of req as a scheduler that is not a
 * sequence batcher takes it, and TENSOR_BACKEND_OUTPUT for each output of
 * a response as it is sent. Do nothing unless the trace's level has
 * TENSORS. */
void trace_queue_inputs(nereid_request_t *req);
void trace_response_outputs(nereid_trace_t *trace, const nereid_response_t *resp);
/* REQUEST_END now (if it started), then drops the request's reference. */
void trace_request_end(nereid_request_t *req);
/* (request_inherit_trace, in request.h, gives an ensemble step's request
 * a child trace.) */

#endif
