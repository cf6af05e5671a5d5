/*
 * This file contains the contract between the backend loader
 * (src/backend/loader.c) and libtritonserver.so (src/tritonapi/): the
 * loader dlopens the library once, RTLD_GLOBAL so Triton backends resolve
 * their TRITONSERVER_* / TRITONBACKEND_* imports from it, and drives every
 * Triton backend library through the Nereid entry points below.
 */
#ifndef NEREID_TRITONAPI_ADAPTER_H
#define NEREID_TRITONAPI_ADAPTER_H

#include <stdio.h>

#include "nereid/backend.h"

#define TRITONAPI_ENTRY_SYMBOL "nereid_tritonapi_entry"
#define TRITONAPI_LIBRARY_NAME "libtritonserver.so"

typedef struct tritonapi_entry {
    /* Loads the Triton library at path for backend b (dlopen RTLD_NOW |
     * RTLD_LOCAL), resolves its entry points, runs TRITONBACKEND_Initialize.
     * On error nothing stays loaded. */
    nereid_error_t *(*open)(nereid_backend_t *b, const char *path);
    nereid_error_t *(*fini)(nereid_backend_t *b);
    nereid_error_t *(*model_init)(nereid_model_t *m);
    nereid_error_t *(*model_fini)(nereid_model_t *m);
    nereid_error_t *(*instance_init)(nereid_instance_t *i);
    nereid_error_t *(*instance_fini)(nereid_instance_t *i);
    nereid_error_t *(*execute)(nereid_instance_t *i, nereid_batch_t *batch);
} tritonapi_entry_t;

/* The one symbol libtritonserver.so exports for the loader. */
typedef const tritonapi_entry_t *(*tritonapi_entry_fn)(void);

#endif
