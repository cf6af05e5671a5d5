/*
 * This file contains scheduler selection from the model config.
 */
#include <string.h>

#include "sched/scheduler.h"

nereid_error_t *scheduler_create(model_t *m, scheduler_t **out)
{
    *out = NULL;
    if (strcmp(m->config->platform, "ensemble") == 0) return ensemble_scheduler_create(m, out);
    return default_scheduler_create(m, out);
}
