/*
 * This file contains a helper the C test backends of tests/tritonbackends/
 * share (header only: each backend is a library of its own).
 */
#ifndef TB_UTIL_H
#define TB_UTIL_H

#include <string.h>

#include "triton/core/tritonbackend.h"

/* Adds output name = [v] (INT32, shape [1]) to response. */
static inline TRITONSERVER_Error *tb_add_int32(TRITONBACKEND_Response *response, const char *name,
                                               int32_t v)
{
    const int64_t shape[1] = {1};
    TRITONBACKEND_Output *output;
    void *buffer;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    TRITONSERVER_Error *err =
        TRITONBACKEND_ResponseOutput(response, &output, name, TRITONSERVER_TYPE_INT32, shape, 1);
    if (!err) err = TRITONBACKEND_OutputBuffer(output, &buffer, 4, &type, &type_id);
    if (!err) memcpy(buffer, &v, 4);
    return err;
}

#endif
