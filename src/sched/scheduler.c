/*
 * This file contains scheduler selection from the model config and the
 * inline run: a request that finds an idle instance of a fast model runs on
 * the submitting thread (see default.c for when).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "sched/scheduler.h"
#include "sched/sequence.h"

nereid_error_t *scheduler_create(model_t *m, scheduler_t **out)
{
    *out = NULL;
    if (strcmp(m->config->platform, "ensemble") == 0) return ensemble_scheduler_create(m, out);
    if (m->config->scheduling_choice_case ==
            INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING &&
        m->config->sequence_batching)
        return sequence_batcher_create(m, out);
    if (m->config->scheduling_choice_case ==
            INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING &&
        m->config->dynamic_batching)
        return dynamic_batcher_create(m, out);
    return default_scheduler_create(m, out);
}

size_t scheduler_env_count(const char *nereid_name, const char *triton_name)
{
    const char *name = nereid_name;
    const char *v = getenv(name);
    if (!v || !*v) v = getenv(name = triton_name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-') {
        LOG_WARN("scheduler", "ignoring %s='%s' (not a count)", name, v);
        return 0;
    }
    return (size_t)n;
}

/* Queued requests an inline caller runs after its own before it hands the
 * instance back to its thread: bounds how long a frontend thread is kept. */
#define INLINE_TAKE_MAX 4

void scheduler_run_inline(scheduler_t *s, model_instance_t *inst, nereid_request_t *req)
{
    model_t *m = s->model;
    /* The request's model reference ends with its completion, and this
     * thread is none of the model's own (model.c, Ownership): the release
     * below still needs the scheduler, so the run holds a reference of its
     * own and drops it last. */
    model_ref(m);
    nereid_request_t *slot[1];
    batch_t batch = {.reqs = slot, .cap_reqs = 1};
    for (int taken = 0; req; taken++) {
        batch_add(&batch, req);
        batch_execute(inst, &batch);
        batch_finish(&batch);
        req = s->ops->release(s, inst, taken < INLINE_TAKE_MAX);
    }
    model_unref(m);
}
