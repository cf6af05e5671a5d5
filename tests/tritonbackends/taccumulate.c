/*
 * This file contains a Triton backend with implicit state, for
 * tests/integration/test_triton_backend.py: OUTPUT = INPUT + INPUT_STATE
 * (INT32 [1]); the sum becomes the next state of the sequence through
 * TRITONBACKEND_StateNew("OUTPUT_STATE") / StateBuffer / StateUpdate. With
 * request parameter "skip_update" the state is left as it was; with
 * "bad_state" it asks for a state the model does not have.
 */
#include <string.h>

#include "triton/core/tritonbackend.h"

#define RETURN_IF_ERROR(x)                                                                         \
    do {                                                                                           \
        TRITONSERVER_Error *e_ = (x);                                                              \
        if (e_) return e_;                                                                         \
    } while (0)

static TRITONSERVER_Error *read_int(TRITONBACKEND_Request *request, const char *name, int32_t *v)
{
    TRITONBACKEND_Input *input;
    const void *data;
    uint64_t size;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, name, &input));
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id));
    if (size != 4) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "expected 1 INT32");
    memcpy(v, data, 4);
    return NULL;
}

static bool has_param(TRITONBACKEND_Request *request, const char *name)
{
    uint32_t n = 0;
    TRITONBACKEND_RequestParameterCount(request, &n);
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        TRITONSERVER_ParameterType type;
        const void *value;
        if (!TRITONBACKEND_RequestParameter(request, i, &key, &type, &value) && !strcmp(key, name))
            return true;
    }
    return false;
}

static TRITONSERVER_Error *run(TRITONBACKEND_Request *request, TRITONBACKEND_Response *response)
{
    int32_t in = 0, state = 0;
    RETURN_IF_ERROR(read_int(request, "INPUT", &in));
    RETURN_IF_ERROR(read_int(request, "INPUT_STATE", &state));
    int32_t sum = in + state;
    const int64_t shape[1] = {1};
    TRITONBACKEND_Output *output;
    void *buffer;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT",
                                                 TRITONSERVER_TYPE_INT32, shape, 1));
    RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, 4, &type, &type_id));
    memcpy(buffer, &sum, 4);
    if (has_param(request, "skip_update")) return NULL;
    const char *state_name = has_param(request, "bad_state") ? "NOPE" : "OUTPUT_STATE";
    TRITONBACKEND_State *st;
    RETURN_IF_ERROR(
        TRITONBACKEND_StateNew(&st, request, state_name, TRITONSERVER_TYPE_INT32, shape, 1));
    RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(st, &buffer, 4, &type, &type_id));
    memcpy(buffer, &sum, 4);
    return TRITONBACKEND_StateUpdate(st);
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests,
                                                       const uint32_t count)
{
    (void)instance;
    for (uint32_t r = 0; r < count; r++) {
        TRITONBACKEND_Response *response;
        TRITONSERVER_Error *err = TRITONBACKEND_ResponseNew(&response, requests[r]);
        if (!err) {
            TRITONSERVER_Error *run_err = run(requests[r], response);
            err =
                TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, run_err);
            TRITONSERVER_ErrorDelete(run_err);
        }
        TRITONSERVER_ErrorDelete(err);
        TRITONSERVER_ErrorDelete(
            TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
    }
    return NULL;
}
