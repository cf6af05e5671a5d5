/*
 * This file contains a Triton backend that needs a newer backend API than
 * any server has, for tests/integration/test_triton_backend.py: its
 * TRITONBACKEND_Initialize refuses to run as Triton's backends do.
 */
#include "triton/core/tritonbackend.h"

TRITONSERVER_Error *TRITONBACKEND_Initialize(TRITONBACKEND_Backend *backend)
{
    (void)backend;
    uint32_t major, minor;
    TRITONSERVER_Error *err = TRITONBACKEND_ApiVersion(&major, &minor);
    if (err) return err;
    if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < 999)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "triton backend API version does not support this backend");
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests,
                                                       const uint32_t count)
{
    (void)instance, (void)requests, (void)count;
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "never runs");
}
