/*
 * This file contains Triton's gRPC-frontend test hooks and handler log lines
 * (see grpc_hooks.h).
 */
#include "grpc/grpc_hooks.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "grpc/grpc_internal.h"

static const struct {
    const char *env;
    const char *text; /* Triton's LOG_INFO before the sleep */
} hook_info[GFE_HOOK_COUNT] = {
    [GFE_HOOK_PROCESS] = {"TRITONSERVER_DELAY_GRPC_PROCESS", "Delaying the Process execution by"},
    [GFE_HOOK_PROCESS_ENTRY] = {"TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY",
                                "Delaying the entry to Process thread by"},
    [GFE_HOOK_NOTIFICATION] = {"TRITONSERVER_DELAY_GRPC_NOTIFICATION",
                               "Delaying the entry to Process for notification thread by"},
    [GFE_HOOK_ENQUEUE] = {"TRITONSERVER_DELAY_GRPC_ENQUEUE", "Delaying PutTaskBackToQueue by"},
    [GFE_HOOK_RESPONSE_COMPLETE_EXEC] = {"TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC",
                                         "Delaying InferResponseComplete execution by"},
    [GFE_HOOK_RESPONSE_COMPLETION] = {"TRITONSERVER_DELAY_RESPONSE_COMPLETION",
                                      "Delaying InferResponseComplete by"},
};

static int hook_ms[GFE_HOOK_COUNT]; /* written once, before any queue thread reads it */
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t next_id;

static void log_error(const char *fmt, const char *env, const char *value)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, env, value);
    nereid_log_message(NEREID_LOG_ERROR, __FILE__, __LINE__, msg);
}

/* std::stoi: leading blanks, a sign and digits; what follows is ignored. */
static int parse_ms(const char *env)
{
    const char *s = getenv(env);
    if (s == NULL) return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s) {
        log_error("Unable to parse the debug variable %s. Value provided: '%s' is not a valid "
                  "integer. Error: stoi",
                  env, s);
        return 0;
    }
    if (errno == ERANGE || v > INT_MAX || v < INT_MIN) {
        log_error("Unable to parse the debug variable %s. Value provided: '%s' is out of range "
                  "for an integer. Error: stoi",
                  env, s);
        return 0;
    }
    return (int)v;
}

static void hooks_read(void)
{
    for (int h = 0; h < GFE_HOOK_COUNT; h++)
        hook_ms[h] = parse_ms(hook_info[h].env);
}

void gfe_hooks_init(void)
{
    pthread_once(&hooks_once, hooks_read);
}

void gfe_hook_delay(gfe_hook_t hook)
{
    int ms = hook_ms[hook];
    if (ms == 0) return;
    char msg[160];
    snprintf(msg, sizeof msg, "%s %d ms...", hook_info[hook].text, ms);
    nereid_log_message(NEREID_LOG_INFO, __FILE__, __LINE__, msg);
    if (ms < 0) return; /* sleep_for of a negative duration returns at once */
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

uint64_t gfe_hooks_next_id(void)
{
    return atomic_fetch_add(&next_id, 1) + 1;
}

bool gfe_hooks_verbose(nereid_server_t *server, uint32_t level)
{
    nereid_log_settings_t st;
    nereid_server_log_settings(server, &st);
    return st.log_verbose_level >= level;
}

void gfe_hooks_log(nereid_server_t *server, uint32_t level, const char *fmt, ...)
{
    if (!gfe_hooks_verbose(server, level)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nereid_log_message(NEREID_LOG_VERBOSE, __FILE__, __LINE__, msg);
}

void gfe_hooks_infer_complete(gfe_unary_call_t *c)
{
    gfe_hook_delay(GFE_HOOK_RESPONSE_COMPLETE_EXEC);
    bool cancelled = atomic_load(&c->client_cancelled);
    gfe_hooks_log(c->fe->server, 1, "ModelInferHandler::InferResponseComplete, %" PRIu64 " step %s",
                  c->log_id, cancelled ? "CANCELLED" : "ISSUED");
    gfe_hook_delay(cancelled ? GFE_HOOK_ENQUEUE : GFE_HOOK_RESPONSE_COMPLETION);
}
