/*
 * This file contains the objects behind the TRITONBACKEND_* handles that
 * backend.c, backend_request.c, backend_response.c and backend_state.c share,
 * and the small helpers they all use.
 */
#ifndef NEREID_TRITONAPI_BACKEND_OBJECTS_H
#define NEREID_TRITONAPI_BACKEND_OBJECTS_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tritonapi/tritonapi.h"

/* ---- Channels ---- */

typedef struct tb_channel {
    atomic_int refs;
    pthread_mutex_t mu;
    TRITONBACKEND_Model *model;
    nereid_batch_t *batch; /* while executing, else NULL */
    size_t r;
    nereid_response_sender_t *sender; /* streamed decoupled request, until FINAL */
    bool final_sent;
    bool rescheduled; /* the request runs again: a later execution sends the final */
    uint32_t n_sent;
    uint64_t stats_index; /* the next reported response's index (response_stats) */
    uint32_t n_factories; /* live response factories */
    pthread_cond_t done;  /* broadcast at the final flag and when no factory is left */
} tb_channel_t;

struct TRITONBACKEND_ResponseFactory {
    tb_channel_t *chan;
};

struct TRITONBACKEND_Output {
    struct TRITONBACKEND_Output *next;
    TRITONBACKEND_Response *resp;
    TRITONSERVER_BufferAttributes attrs;
    void *discard; /* the buffer of a response that will be dropped */
    nereid_datatype_t datatype;
    uint32_t rank;
    bool allocated;
    int64_t *shape;
    char name[]; /* shape follows the name */
};

typedef struct tb_param {
    struct tb_param *next;
    nereid_parameter_type_t type;
    union {
        int64_t i;
        bool b;
        double d;
    } v;
    char *s;
    char key[];
} tb_param_t;

struct TRITONBACKEND_Response {
    tb_channel_t *chan;
    struct TRITONBACKEND_Output *outputs;
    tb_param_t *params, **params_tail; /* in the order set */
};

typedef struct tb_input {
    const char *name;
    nereid_datatype_t datatype;
    const int64_t *shape;
    size_t rank;
    const void *data;
    size_t byte_size;
} tb_input_t;

struct TRITONBACKEND_Input {
    tb_input_t in;
};

struct TRITONBACKEND_State {
    struct TRITONBACKEND_State *next;
    TRITONBACKEND_Request *request;
    const tb_state_cfg_t *cfg;
    TRITONSERVER_BufferAttributes attrs;
    void *buffer;    /* own, or the request's input state (single buffer) */
    void *own;       /* malloc'ed here; committed by StateUpdate, freed with the state */
    void *committed; /* the request's output the last StateUpdate copied into */
    size_t committed_bytes;
    nereid_datatype_t datatype;
    uint32_t rank;
    bool allocated;
    int64_t *shape;
    char name[];
};

enum { REQ_FREE, REQ_LIVE, REQ_RELEASED };

struct TRITONBACKEND_Request {
    struct TRITONBACKEND_Request *next;
    TRITONBACKEND_ModelInstance *inst;
    nereid_batch_t *batch;
    size_t r;
    int status;
    tb_channel_t *chan;
    struct TRITONBACKEND_Input *inputs; /* sorted by name, built on first use */
    uint32_t n_inputs, cap_inputs;
    bool inputs_ready;
    struct TRITONBACKEND_State *states; /* freed when execute returns */
    const char **outputs;               /* requested outputs, sorted */
    uint32_t n_outputs, cap_outputs;
    bool outputs_ready;
    bool rescheduled; /* released with RELEASE_RESCHEDULE: back to its scheduler */
};

static inline TRITONSERVER_Error *terr(TRITONSERVER_Error_Code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline TRITONSERVER_Error *terr(TRITONSERVER_Error_Code code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return TRITONSERVER_ErrorNew(code, msg);
}

static inline TRITONSERVER_Error *null_arg(const char *what)
{
    return terr(TRITONSERVER_ERROR_INVALID_ARG, "%s must not be NULL", what);
}

static inline const char *model_name(const TRITONBACKEND_Model *m)
{
    return nereid_model_name(m->nm);
}

static inline const char *backend_name(const TRITONBACKEND_Backend *b)
{
    return nereid_backend_name(b->nb);
}

static inline TRITONSERVER_Error *live(TRITONBACKEND_Request *req)
{
    if (!req) return null_arg("request");
    if (req->status != REQ_LIVE || !req->batch)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "request was already released");
    return NULL;
}

/* Drops a reference to a response channel (backend_response.c). */
void channel_unref(tb_channel_t *c);

#endif
