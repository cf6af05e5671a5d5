/*
 * This file contains the libFuzzer harness of the HTTP inference request
 * parser: the first byte picks the framing (whole body JSON, a header length
 * taken from the next two bytes, or a raw binary request), the rest is the
 * body. Every input must parse or fail with an error, never crash or leak.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/infer_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t mode = data[0];
    size_t header_len = (size_t)data[1] | (size_t)data[2] << 8;
    const char *body = (const char *)data + 3;
    size_t len = size - 3;
    infer_parsed_t parsed;
    nereid_error_t *err;
    if (mode % 3 == 0) {
        err = infer_parse(body, len, INFER_HEADER_LENGTH_NONE, "fuzz", 1 << 20, &parsed);
    } else if (mode % 3 == 1) {
        err = infer_parse(body, len, header_len, "fuzz", 1 << 20, &parsed);
    } else {
        int64_t dims[2] = {-1, (int64_t)(mode >> 2) - 8};
        infer_raw_model_t info = {.model = "fuzz",
                                  .n_inputs = 1 + (mode >> 7),
                                  .input_name = "INPUT0",
                                  .datatype = (nereid_datatype_t)(1 + (mode >> 2) % 14),
                                  .dims = dims,
                                  .n_dims = 1 + ((mode >> 6) & 1),
                                  .batching = (mode >> 5) & 1};
        err = infer_parse_raw(body, len, &info, &parsed);
    }
    if (err) {
        nereid_error_free(err);
        return 0;
    }
    /* Touch every borrowed tensor byte so ASan checks the bounds. */
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < parsed.n_inputs; i++) {
        const uint8_t *p = parsed.inputs[i].data;
        for (size_t b = 0; b < parsed.inputs[i].byte_size; b++)
            sink ^= p[b];
    }
    (void)sink;
    infer_parsed_free(&parsed);
    return 0;
}
