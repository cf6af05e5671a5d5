/*
 * This file contains a Triton backend with implicit state, for
 * tests/integration/test_triton_backend.py: OUTPUT = INPUT + INPUT_STATE
 * (INT32 [1]); the sum becomes the next state of the sequence through
 * TRITONBACKEND_StateNew("OUTPUT_STATE") / StateBuffer / StateUpdate. With
 * request parameter "skip_update" the state is left as it was; with
 * "bad_state" it asks for a state the model does not have; with "no_commit"
 * it writes the state buffer but does not call StateUpdate (Triton keeps the
 * old state, unless the state uses one buffer for input and output); with
 * "report_buffer" it first asks for the state buffer in GPU memory and adds
 * outputs SAME (1 when the state buffer is the INPUT_STATE buffer itself)
 * and MEMTYPE (the memory type answered to the GPU request).
 */
#include <string.h>

#include "triton/core/tritonbackend.h"

#include "tb_util.h"

#define RETURN_IF_ERROR(x)                                                                         \
    do {                                                                                           \
        TRITONSERVER_Error *e_ = (x);                                                              \
        if (e_) return e_;                                                                         \
    } while (0)

static TRITONSERVER_Error *read_int(TRITONBACKEND_Request *request, const char *name, int32_t *v,
                                    const void **where)
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
    if (where) *where = data;
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
    const void *state_at = NULL;
    RETURN_IF_ERROR(read_int(request, "INPUT", &in, NULL));
    RETURN_IF_ERROR(read_int(request, "INPUT_STATE", &state, &state_at));
    int32_t sum = in + state;
    const int64_t shape[1] = {1};
    void *buffer;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    RETURN_IF_ERROR(tb_add_int32(response, "OUTPUT", sum));
    if (has_param(request, "skip_update")) return NULL;
    const char *state_name = has_param(request, "bad_state") ? "NOPE" : "OUTPUT_STATE";
    TRITONBACKEND_State *st;
    RETURN_IF_ERROR(
        TRITONBACKEND_StateNew(&st, request, state_name, TRITONSERVER_TYPE_INT32, shape, 1));
    if (has_param(request, "report_buffer")) {
        TRITONSERVER_MemoryType gpu = TRITONSERVER_MEMORY_GPU;
        void *first;
        RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(st, &first, 4, &gpu, &type_id));
        RETURN_IF_ERROR(tb_add_int32(response, "MEMTYPE", (int32_t)gpu));
        RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(st, &buffer, 4, &type, &type_id));
        RETURN_IF_ERROR(tb_add_int32(response, "SAME", buffer == state_at && buffer == first));
    } else {
        RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(st, &buffer, 4, &type, &type_id));
    }
    memcpy(buffer, &sum, 4);
    if (has_param(request, "no_commit")) return NULL;
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
