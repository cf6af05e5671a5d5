/*
 * This file contains the libFuzzer harness of the HTTP inference request
 * parser: the first byte picks the framing (whole body JSON, a header length
 * taken from the next two bytes, or a raw binary request), the rest is the
 * body. Every input must parse or fail with an error, never crash or leak.
 * The JSON header is also parsed with and without the one-pass conversion of
 * "data" arrays (in this build read in two parts from 2 elements on, with
 * one helper thread): the outcome (error text, or tensor bytes) must be the
 * same.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/infer_parse.h"
#include "http/json_reader.h"
#include "http/par.h"

/* json_reader_parse_infer's one-pass tensors equal json_reader_fill_data's
 * conversion of the same text; errors are the same. */
static void check_one_pass(const char *text, size_t len)
{
    jarena_t a, b;
    jarena_init(&a);
    jarena_init(&b);
    jv_t *ra, *rb;
    nereid_error_t *ea = json_reader_parse_infer(text, len, &a, 1 << 20, &ra);
    nereid_error_t *eb = json_reader_parse(text, len, &b, &rb);
    if ((ea == NULL) != (eb == NULL)) abort();
    if (ea && strcmp(nereid_error_message(ea), nereid_error_message(eb))) abort();
    const jv_t *ia = ea ? NULL : jv_get(ra, "inputs"), *ib = ea ? NULL : jv_get(rb, "inputs");
    if (ia && ia->type == JV_ARRAY) {
        for (const jv_t *x = ia->v.child, *y = ib->v.child; x; x = x->next, y = y->next) {
            const jv_span_t *span = jv_span(x->type == JV_OBJECT ? jv_get(x, "data") : x);
            if (!span || !span->data) continue;
            size_t es = nereid_datatype_byte_size(span->datatype);
            char *slow = malloc(span->count * es + 1);
            jfill_t f = {.datatype = span->datatype,
                         .field = "data",
                         .base = text,
                         .out = slow,
                         .element_size = es,
                         .n_expected = span->count};
            nereid_error_t *err = json_reader_fill_data(jv_get(y, "data"), &f);
            if (err || f.n_seen != span->count || memcmp(slow, span->data, span->count * es))
                abort();
            free(slow);
        }
    }
    if (ea) nereid_error_free(ea);
    if (eb) nereid_error_free(eb);
    jarena_free(&a);
    jarena_free(&b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

/* One helper: arrays (of 2 elements and more in this build) are read in
 * two parts, checked against the one-run conversion below. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    par_start(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    uint8_t mode = data[0];
    size_t header_len = (size_t)data[1] | (size_t)data[2] << 8;
    const char *body = (const char *)data + 3;
    size_t len = size - 3;
    infer_parsed_t parsed;
    nereid_error_t *err;
    if (mode % 3 != 2)
        check_one_pass(body, mode % 3 == 0 ? len : header_len < len ? header_len : len);
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
