/*
 * This file contains the server side of the pb_utils calls a Python model
 * makes besides inference (python_api.c): custom metrics
 * (pb_utils.MetricFamily / Metric) and model control (load_model,
 * unload_model, is_model_ready). The worker sends them as API_CALL
 * messages ({"op": ..., ...}); python.c hands the JSON here and sends the
 * answer back. Everything from the worker is validated here: a bad call
 * gets an error answer, never a crash.
 */
#ifndef NEREID_PYTHON_API_H
#define NEREID_PYTHON_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nereid/backend.h"

/* One worker's metric families and metrics, by the handles it was given.
 * Calls on one table are serialised by its own mutex. */
typedef struct python_api python_api_t;

python_api_t *python_api_new(void);
/* Deletes every metric, then every family, the worker still held (it died
 * or was replaced): their series leave /metrics unless shared. */
void python_api_reset(python_api_t *api);
/* python_api_reset, then frees the table. NULL is ignored. */
void python_api_free(python_api_t *api);

/* True for the calls that may block on the server (model control): run
 * them with python_api_model_control off the socket's reader thread. */
bool python_api_blocks(json_t *call);

/* Answers a metric call: a new JSON object, {"error": {"message", "code"}}
 * or the result ({"handle": n}, {"value": "<double>"}, {}). */
json_t *python_api_metrics(python_api_t *api, json_t *call);

/* Answers a model control call against server ({"ready": b} or {}). blob
 * holds the bytes of load_model's files (as tensors: {"tensors": [{"name":
 * "file:<path>", "offset", "size"}]}), checked against blob_len. */
json_t *python_api_model_control(nereid_server_t *server, json_t *call, const uint8_t *blob,
                                 size_t blob_len);

/* Sets a response's parameters ({"key": string | int | bool}, as
 * InferenceResponse(parameters=...) gives them) on request r of batch, or
 * on sender's next response when sender is not NULL. NULL params: none. */
nereid_error_t *python_api_response_parameters(json_t *params, nereid_batch_t *batch, size_t r,
                                               nereid_response_sender_t *sender);

/* A parameter's value (nereid_parameter_type_t type, value as
 * backend.h gives it) as JSON; NULL for a double JSON cannot carry. */
json_t *python_api_parameter_json(int type, const void *value);

/* A BLS response's parameters as a JSON object for the worker
 * (InferenceResponse.parameters()); NULL when it has none. */
json_t *python_api_response_parameters_json(const nereid_response_t *resp);

#endif
