/*
 * This file contains the libFuzzer harness of request validation after
 * parsing: the bytes are read as a small program that builds a
 * nereid_request_t (model, inputs with any name, datatype, shape and byte
 * size, requested outputs, sequence flags, correlation id, priority) and the
 * request is run against in-process models with different io tables (fixed
 * and variable dims, batching, reshape, optional inputs, BYTES and BOOL,
 * sequence control inputs, an ensemble, dynamic batching). Every request must
 * either be refused with an error or complete; nothing may crash or leak.
 *
 * Layout: byte 0 model, byte 1 flags, byte 2 correlation id, then records
 * until the input ends: a tag byte (low 2 bits: 0-2 input, 3 requested
 * output; the rest picks the name), for inputs a datatype byte, a rank byte
 * (0-7), one signed byte per dim, a length byte, then that many data bytes.
 */
#include "../tests/unit/test_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nereid_server_t *server;

static const char *const models[] = {"fixed", "bytes",  "reshape", "opt",
                                     "seq",   "bool2d", "ens",     "add_sub"};
static const char *const names[] = {"INPUT0",  "INPUT1",  "INPUT",  "IN",  "START",
                                    "END",     "READY",   "CORRID", "x",   "",
                                    "OUTPUT0", "OUTPUT1", "OUTPUT", "OUT", "INPUT0 "};

static const struct {
    const char *name, *config;
} configs[] = {
    {"fixed", "backend: \"identity\" max_batch_size: 4\n"
              "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]\n"
              "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]\n"
              "dynamic_batching { max_queue_delay_microseconds: 100 }\n"},
    {"bytes", "backend: \"identity\" max_batch_size: 0\n"
              "input [ { name: \"INPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n"
              "output [ { name: \"OUTPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n"},
    {"reshape", "backend: \"identity\" max_batch_size: 8\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ "
                "2, 2 ] } } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ 2, 2 ] reshape: { "
                "shape: [ 4 ] } } ]\n"},
    {"opt", "backend: \"identity\" max_batch_size: 2\n"
            "input [ { name: \"INPUT0\" data_type: TYPE_UINT8 dims: [ -1 ] },\n"
            "        { name: \"INPUT1\" data_type: TYPE_INT64 dims: [ 3 ] optional: true } ]\n"
            "output [ { name: \"OUTPUT0\" data_type: TYPE_UINT8 dims: [ -1 ] },\n"
            "         { name: \"OUTPUT1\" data_type: TYPE_INT64 dims: [ 3 ] } ]\n"},
    {"seq", "backend: \"accumulator\" max_batch_size: 4\n"
            "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
            "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
            "sequence_batching { max_sequence_idle_microseconds: 100000 direct { }\n"
            "  control_input [\n"
            "    { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, "
            "1 ] } ] },\n"
            "    { name: \"END\" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 "
            "] } ] },\n"
            "    { name: \"READY\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ "
            "0, 1 ] } ] },\n"
            "    { name: \"CORRID\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: "
            "TYPE_UINT64 } ] } ] }\n"},
    {"bool2d", "backend: \"identity\" max_batch_size: 0\n"
               "input [ { name: \"INPUT0\" data_type: TYPE_BOOL dims: [ -1, -1 ] } ]\n"
               "output [ { name: \"OUTPUT0\" data_type: TYPE_BOOL dims: [ -1, -1 ] } ]\n"},
    {"ens", "platform: \"ensemble\" max_batch_size: 4\n"
            "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]\n"
            "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]\n"
            "ensemble_scheduling { step [ { model_name: \"fixed\" model_version: -1\n"
            "  input_map { key: \"INPUT0\" value: \"IN\" }\n"
            "  output_map { key: \"OUTPUT0\" value: \"OUT\" } } ] }\n"},
    {"add_sub", "backend: \"add_sub\" max_batch_size: 8\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
                "        { name: \"INPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
                "         { name: \"OUTPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"},
};

static void remove_repo_at_exit(void)
{
    remove_repo();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    make_repo_dir("fuzz-validate");
    atexit(remove_repo_at_exit);
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++)
        write_model(configs[i].name, configs[i].config);
    nereid_server_options_t opts;
    repo_options(&opts);
    opts.log_info = opts.log_warning = false;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err != NULL) {
        fprintf(stderr, "fuzz_validate: %s\n", nereid_error_message(err));
        abort();
    }
    return 0;
}

/* Reads every output byte so ASan checks the sizes the server reports, and
 * formats classification outputs. */
static void touch_outputs(const nereid_response_t *resp)
{
    volatile uint8_t sink = 0;
    for (size_t i = 0;
         nereid_response_error(resp) == NULL && i < nereid_response_output_count(resp); i++) {
        const char *name;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *base;
        void *userp;
        nereid_response_output(resp, i, &name, &dt, &shape, &rank, &base, &byte_size, &userp);
        for (size_t b = 0; b < byte_size; b++)
            sink ^= ((const uint8_t *)base)[b];
        uint32_t k = nereid_response_output_class_count(resp, i);
        if (k > 0) {
            char *bytes = NULL;
            size_t n;
            int64_t cshape[2];
            size_t crank;
            nereid_error_free(nereid_response_classify(resp, i, k, &bytes, &n, cshape, &crank));
            free(bytes);
        }
    }
    (void)sink;
}

/* Adds the records of data to req; returns the first error. */
static nereid_error_t *add_records(nereid_request_t *req, const uint8_t *p, const uint8_t *end)
{
    nereid_error_t *err = NULL;
    while (err == NULL && p < end) {
        uint8_t tag = *p++;
        const char *name = names[(tag >> 2) % (sizeof(names) / sizeof(names[0]))];
        if ((tag & 3) == 3) {
            err = nereid_request_add_requested_output(req, name, (uint32_t)(tag >> 6));
            continue;
        }
        if (end - p < 2) break;
        nereid_datatype_t dt = (nereid_datatype_t)(*p++ % 16);
        size_t rank = *p++ % 8;
        if ((size_t)(end - p) < rank + 1) break;
        int64_t shape[8];
        for (size_t d = 0; d < rank; d++)
            shape[d] = (int8_t)*p++;
        size_t len = *p++;
        if ((size_t)(end - p) < len) len = (size_t)(end - p);
        err = nereid_request_add_input(req, name, dt, shape, rank, p, len);
        p += len;
    }
    return err;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    const char *model = models[data[0] % (sizeof(models) / sizeof(models[0]))];
    uint8_t flags = data[1];
    nereid_request_t *req;
    nereid_error_t *err = nereid_request_new(server, model, (flags & 0x80) ? 2 : -1, &req);
    if (err != NULL) {
        nereid_error_free(err);
        return 0;
    }
    nereid_request_set_sequence_flags(req, flags & 1, (flags & 2) != 0);
    if (flags & 4) nereid_request_set_correlation_id(req, data[2] % 4);
    if (flags & 8) nereid_request_set_priority(req, data[2]);
    if (flags & 16) err = nereid_request_set_correlation_id_string(req, (data[2] & 1) ? "c" : "");
    if (err == NULL) err = add_records(req, data + 3, data + size);
    if (err != NULL) {
        nereid_error_free(err);
        nereid_request_free(req);
        return 0;
    }
    nereid_response_t *resp = infer_sync(server, req, &err);
    if (resp != NULL) touch_outputs(resp);
    nereid_response_free(resp);
    nereid_error_free(err);
    return 0;
}
