/*
 * This file contains Triton's gRPC-frontend test hooks and the handler log
 * lines its QA counts (qa/L0_request_cancellation): the delays
 * TRITONSERVER_DELAY_GRPC_PROCESS, _PROCESS_ENTRY, _NOTIFICATION, _ENQUEUE,
 * TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC and _RESPONSE_COMPLETION (in
 * milliseconds, read once when the frontend starts), each logged with
 * Triton's INFO text before it sleeps, and the verbose records "New request
 * handler for ModelInferHandler, <id>", "Cancellation notification received
 * for <handler>, ..." (level 1) and "StateRelease, <id> Step <step>"
 * (level 2). Unset, every hook is a load and a branch.
 */
#ifndef NEREID_GRPC_HOOKS_H
#define NEREID_GRPC_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include "nereid/server.h"

typedef enum gfe_hook {
    GFE_HOOK_PROCESS,                /* every step of a ModelInfer call */
    GFE_HOOK_PROCESS_ENTRY,          /* a ModelInfer call arrived or its status went out */
    GFE_HOOK_NOTIFICATION,           /* the call's close (cancellation) notification */
    GFE_HOOK_ENQUEUE,                /* the final response of a cancelled call */
    GFE_HOOK_RESPONSE_COMPLETE_EXEC, /* the response callback, on entry */
    GFE_HOOK_RESPONSE_COMPLETION,    /* the final response, before it is sent */
    GFE_HOOK_COUNT
} gfe_hook_t;

/* Reads the environment, once per process (Triton's std::stoi parse: an
 * unparsable value is logged as an error and counts as 0). */
void gfe_hooks_init(void);

/* Sleeps the hook's delay, after Triton's INFO line; no-op when unset. */
void gfe_hook_delay(gfe_hook_t hook);

struct gfe_unary_call;
/* ModelInfer's response callback (Triton's InferResponseComplete): the
 * RESPONSE_COMPLETE_EXEC delay, then ENQUEUE when the client cancelled the
 * call, else RESPONSE_COMPLETION. */
void gfe_hooks_infer_complete(struct gfe_unary_call *c);

/* Triton's per-state unique id, for the log lines. */
uint64_t gfe_hooks_next_id(void);

/* Whether verbose records of level (1 or 2) are written. */
bool gfe_hooks_verbose(nereid_server_t *server, uint32_t level);

/* A verbose record (printf format) when the level is on. */
void gfe_hooks_log(nereid_server_t *server, uint32_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
