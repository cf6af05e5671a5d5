/*
 * This file contains scheduler selection from the model config and the
 * scheduler test hooks' environment counts.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "sched/scheduler.h"

nereid_error_t *scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out)
{
    *out = NULL;
    nereid_error_t *err;
    if (strcmp(m->config->platform, "ensemble") == 0)
        err = ensemble_scheduler_create(m, core, out);
    else if (m->config->scheduling_choice_case ==
                 INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING &&
             m->config->sequence_batching)
        err = sequence_batcher_create(m, core, out);
    else if (m->config->scheduling_choice_case ==
                 INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING &&
             m->config->dynamic_batching)
        err = dynamic_batcher_create(m, core, out);
    else
        err = default_scheduler_create(m, core, out);
    return err;
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
        LOG_WARN("ignoring %s='%s' (not a count)", name, v);
        return 0;
    }
    return (size_t)n;
}
