/*
 * This file contains scheduler selection from the model config.
 */
#include <string.h>

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
