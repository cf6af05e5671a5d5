/*
 * libFuzzer harness for the model configuration module: text-format
 * parsing, then normalization/validation, JSON output, JSON input of that
 * output, and copying. Must never crash, leak or hang on any input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *errors = NULL;
    model_config_t *cfg = config_parse_text((const char *)data, size, "fuzz.pbtxt", &errors);
    free(errors);
    if (!cfg) return 0;
    char *json = config_to_json(cfg);
    if (json) {
        model_config_t *back = config_from_json(json, strlen(json), &errors);
        free(errors);
        config_free(back);
        free(json);
    }
    config_options_t opts = {.gpus_available = (size & 1) != 0, .allow_missing_io = true};
    errors = NULL;
    if (config_normalize(cfg, "fuzz", "/nonexistent/fuzz/config.pbtxt", &opts, &errors) == 0) {
        model_config_t *copy = config_copy(cfg);
        char *j2 = config_to_json(copy);
        free(j2);
        config_free(copy);
    }
    free(errors);
    json = config_to_json(cfg);
    free(json);
    config_free(cfg);
    return 0;
}
