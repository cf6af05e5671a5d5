/*
 * This file contains the objects behind Triton's opaque handles in
 * libtritonserver.so, shared by its translation units: a Triton error is a
 * nereid_error_t (same codes, same values), a Triton server is a
 * nereid_server_t, the others are defined here.
 */
#ifndef NEREID_TRITONAPI_H
#define NEREID_TRITONAPI_H

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>

#define TRITONSERVER_EXPORTING 1
#define TRITONBACKEND_EXPORTING 1
#include "nereid/backend.h"
#include "triton/core/tritonbackend.h"

typedef TRITONSERVER_Error *(*tb_backend_fn)(TRITONBACKEND_Backend *);
typedef TRITONSERVER_Error *(*tb_attr_fn)(TRITONBACKEND_Backend *,
                                          TRITONBACKEND_BackendAttribute *);
typedef TRITONSERVER_Error *(*tb_model_fn)(TRITONBACKEND_Model *);
typedef TRITONSERVER_Error *(*tb_instance_fn)(TRITONBACKEND_ModelInstance *);
typedef TRITONSERVER_Error *(*tb_execute_fn)(TRITONBACKEND_ModelInstance *,
                                             TRITONBACKEND_Request **, const uint32_t);

struct TRITONSERVER_Message {
    char *json; /* NUL-terminated */
    size_t byte_size;
};

struct TRITONSERVER_BufferAttributes {
    TRITONSERVER_MemoryType memory_type;
    int64_t memory_type_id;
    size_t byte_size;
    void *cuda_ipc_handle;
};

struct TRITONBACKEND_Backend {
    nereid_backend_t *nb;
    void *handle;
    char *path, *dir; /* the library and its directory */
    TRITONSERVER_Message config;
    void *state;
    TRITONBACKEND_ExecutionPolicy policy;
    tb_backend_fn initialize, finalize;
    tb_model_fn model_initialize, model_finalize;
    tb_instance_fn instance_initialize, instance_finalize;
    tb_execute_fn execute;
};

/* One sequence_batching state of a model's config. */
typedef struct tb_state_cfg {
    char *input_name, *output_name;
    bool single_buffer; /* use_same_buffer_for_input_output */
} tb_state_cfg_t;

struct TRITONBACKEND_Model {
    nereid_model_t *nm;
    TRITONBACKEND_Backend *backend;
    void *state;
    bool decoupled;
    int64_t max_batch_size;
    tb_state_cfg_t *states; /* read from the config after ModelInitialize */
    size_t n_states;
};

struct TRITONBACKEND_Request;

struct TRITONBACKEND_ModelInstance {
    nereid_instance_t *ni;
    TRITONBACKEND_Model *model;
    TRITONSERVER_Message host_policy;
    void *state;
    nereid_batch_t *batch;              /* during execute */
    struct TRITONBACKEND_Request *pool; /* free request objects */
    struct TRITONBACKEND_Request *kept; /* never released: freed at fini */
    TRITONBACKEND_Request **ptrs;       /* the array passed to execute */
    size_t n_ptrs;
};

/* ---- server_api.c ---- */

/* A copy of err (a Triton error the caller keeps). */
nereid_error_t *tritonapi_error_copy(const TRITONSERVER_Error *err);
/* A message owning a copy of json. */
void tritonapi_message_set(TRITONSERVER_Message *msg, const char *json);

#endif
