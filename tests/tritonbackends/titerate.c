/*
 * This file contains an iterative Triton backend (as Triton's QA
 * iterative_sequence backend), for tests/integration/test_triton_backend.py:
 * a decoupled model whose request INPUT (INT32 [1], n) is run n times. Each
 * execution sends one response OUTPUT = [times left] and FLAGS = [the
 * request's sequence flags], then releases the request with
 * TRITONSERVER_REQUEST_RELEASE_RESCHEDULE while times are left (the last
 * response carries the FINAL flag and the request is released with
 * RELEASE_ALL). The count left lives in the instance, per correlation id.
 * When the reschedule is refused, the request is released with RELEASE_ALL
 * and the refusal is the final response's error.
 */
#include <stdlib.h>
#include <string.h>

#include "tb_util.h"

#define N_SLOTS 64

typedef struct counts {
    uint64_t corr_id[N_SLOTS];
    int32_t left[N_SLOTS];
} counts_t;

static int32_t *count_for(counts_t *c, uint64_t corr_id, int32_t start)
{
    int free_slot = -1;
    for (int i = 0; i < N_SLOTS; i++) {
        if (c->left[i] > 0 && c->corr_id[i] == corr_id) return &c->left[i];
        if (c->left[i] <= 0 && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0) return NULL;
    c->corr_id[free_slot] = corr_id;
    c->left[free_slot] = start;
    return &c->left[free_slot];
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance *instance)
{
    counts_t *c = calloc(1, sizeof *c);
    if (!c) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    return TRITONBACKEND_ModelInstanceSetState(instance, c);
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance *instance)
{
    void *c = NULL;
    TRITONSERVER_Error *err = TRITONBACKEND_ModelInstanceState(instance, &c);
    free(c);
    return err;
}

/* The count left after this execution of request (-1 on error, *err set). */
static int32_t step(counts_t *c, TRITONBACKEND_Request *request, TRITONBACKEND_Response *response,
                    TRITONSERVER_Error **err)
{
    uint64_t corr_id = 0;
    uint32_t flags = 0;
    TRITONBACKEND_Input *input;
    const void *data;
    uint64_t size;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    *err = TRITONBACKEND_RequestCorrelationId(request, &corr_id);
    if (!*err) *err = TRITONBACKEND_RequestFlags(request, &flags);
    if (!*err) *err = TRITONBACKEND_RequestInput(request, "INPUT", &input);
    if (!*err) *err = TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id);
    if (!*err && size != 4)
        *err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "expected 1 INT32");
    if (*err) return -1;
    int32_t start;
    memcpy(&start, data, 4);
    int32_t *left = count_for(c, corr_id, start);
    if (!left) {
        *err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, "too many sequences");
        return -1;
    }
    int32_t now = --*left;
    *err = tb_add_int32(response, "OUTPUT", now);
    if (!*err) *err = tb_add_int32(response, "FLAGS", (int32_t)flags);
    return *err ? -1 : now;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests,
                                                       const uint32_t count)
{
    counts_t *c = NULL;
    TRITONSERVER_Error *err = TRITONBACKEND_ModelInstanceState(instance, (void **)&c);
    if (err) return err;
    for (uint32_t r = 0; r < count; r++) {
        TRITONBACKEND_Response *response;
        err = TRITONBACKEND_ResponseNew(&response, requests[r]);
        if (err) {
            TRITONSERVER_ErrorDelete(err);
            TRITONSERVER_ErrorDelete(
                TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
            continue;
        }
        int32_t left = step(c, requests[r], response, &err);
        uint32_t send_flags = TRITONSERVER_RESPONSE_COMPLETE_FINAL;
        if (left > 0) {
            /* released first, answered after, as Triton's iterative_sequence */
            err =
                TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_RESCHEDULE);
            if (!err) send_flags = 0;
        }
        if (send_flags)
            TRITONSERVER_ErrorDelete(
                TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
        TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(response, send_flags, err));
        TRITONSERVER_ErrorDelete(err);
    }
    return NULL;
}
