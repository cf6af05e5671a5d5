/*
 * This file contains the model configuration module's interface: reading
 * config.pbtxt (protobuf text format) into inference.ModelConfig, filling
 * Triton's defaults, validating, and converting to and from Triton's JSON
 * form. The parser and the JSON codec walk protobuf-c descriptors, so they
 * work for every message in proto/model_config.proto.
 *
 * Errors are returned as one malloc'ed string, one error per line, each line
 * "path:line:col: message" when a position is known ("path: message"
 * otherwise). Caller frees errors with free().
 */
#ifndef NEREID_CONFIG_H
#define NEREID_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model_config.pb-c.h"

typedef Inference__ModelConfig model_config_t;

/* Most execution instances a model may have, over all its instance groups
 * (each instance is one thread). */
#define CONFIG_MAX_INSTANCES 256

/* Largest tensor a config makes the server allocate by itself (a warmup
 * input, a sequence's zero or initial state): 1 GiB. */
#define CONFIG_MAX_TENSOR_BYTES ((uint64_t)1 << 30)

/* Options that change defaults and validation. */
typedef struct config_options {
    bool gpus_available;   /* false on this machine: KIND_AUTO -> KIND_CPU, KIND_GPU is an error */
    bool allow_missing_io; /* true when the backend may autofill inputs/outputs */
    const char *model_dir; /* the model directory whose files say the backend when the
                            * config does not; NULL: the directory of the config file */
} config_options_t;

/* Parses text-format text of length len; filename is used in error lines.
 * Returns the message (free with config_free) or NULL with *errors set. */
model_config_t *config_parse_text(const char *text, size_t len, const char *filename,
                                  char **errors);
/* Reads and parses a config.pbtxt file. */
model_config_t *config_parse_file(const char *path, char **errors);

/* Fills Triton's defaults and validates cfg in place for the model directory
 * named model_name. filename is used in error lines (positions are given for
 * errors the parser recorded a location for). A config without platform or
 * backend gets them from the model's files, as Triton's
 * AutoCompleteBackendFields does: the first subdirectory by name of the
 * model directory (opts->model_dir, else the directory of filename) is the
 * one inspected, for model.plan, model.onnx, model.pt, model.py, ...; this
 * is the only place the server guesses a backend. Returns 0 or -1 with
 * *errors (every error found, one per line). */
int config_normalize(model_config_t *cfg, const char *model_name, const char *filename,
                     const config_options_t *opts, char **errors);

/* Triton's model-config JSON (protobuf JSON with original field names, enum
 * names, 64-bit integers as numbers where Triton rewrites them). Caller frees
 * with free(). */
char *config_to_json(const model_config_t *cfg);
/* Parses Triton's JSON form (also accepts lowerCamel names and 64-bit values
 * as strings). NULL with *errors on failure. */
model_config_t *config_from_json(const char *json, size_t len, char **errors);

/* Deep copy; free with config_free. */
model_config_t *config_copy(const model_config_t *cfg);
void config_free(model_config_t *cfg);

/* nereid check-config <model-dir-or-repository>...: validates every config,
 * prints normalized JSON to stdout and errors to stderr; returns the process
 * exit code. */
int config_check_main(int argc, char **argv);

#endif
