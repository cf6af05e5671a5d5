/*
 * This file contains the helpers request.c and request_validate.c share.
 */
#ifndef NEREID_CORE_REQUEST_INTERNAL_H
#define NEREID_CORE_REQUEST_INTERNAL_H

#include <string.h>

#include "core/core.h"

/* The id in Triton's "[request id: %s] " prefix of request errors. */
static inline const char *req_id(const nereid_request_t *req)
{
    return req->id ? req->id : "<id_unknown>";
}

static inline const model_io_t *find_io(const model_io_t *ios, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ios[i].name, name) == 0) return &ios[i];
    return NULL;
}

#endif
