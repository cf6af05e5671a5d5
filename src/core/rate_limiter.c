/*
 * This file contains the rate limiter: the resource pools, the registered
 * instances and the choice of which staged instance executes next (see
 * rate_limiter.h for the rules). Everything runs under the limiter's one
 * mutex; waiters sleep on its condition variable, which is broadcast
 * whenever an instance is started.
 */
#include "core/rate_limiter.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/model.h"
#include "core/server_internal.h"
#include "core/util.h"

#define GLOBAL_DEVICE RATE_LIMITER_GLOBAL_DEVICE
/* The device of an explicit count that applies to every device. */
#define EVERY_DEVICE (-1)

/* A pool: one resource name on one device (or the global pool). Pools are
 * created on first need and kept for the limiter's life. */
typedef struct pool {
    char *name;
    int device;        /* GLOBAL_DEVICE or a device id */
    uint64_t capacity; /* explicit count, or the largest registered need */
    uint64_t in_use;   /* held by running instances; <= capacity when taken */
} pool_t;

typedef struct need {
    size_t pool; /* index into rl->pools */
    uint32_t count;
} need_t;

typedef enum inst_state { INST_IDLE, INST_STAGED, INST_RUNNING } inst_state_t;

struct rate_limiter_instance {
    rate_limiter_t *rl;
    const void *owner;   /* the model: its instances share deferrals */
    uint64_t priority;   /* >= 1 */
    uint64_t exec_count; /* executions finished, from RATE_LIMITER_STARTUP_TURNS */
    need_t *needs;
    size_t n_needs;
    inst_state_t state;
    uint64_t staged_seq; /* order of staging (deferred: of release), for ties */
    bool deferred;       /* released with more work, not asked again yet */
};

typedef struct explicit_count {
    char *name;
    int device; /* EVERY_DEVICE or a device id */
    size_t count;
} explicit_count_t;

struct rate_limiter {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* broadcast when an instance starts running */
    pool_t *pools;
    size_t n_pools;
    rate_limiter_instance_t **insts;
    size_t n_insts;
    explicit_count_t *explicit;
    size_t n_explicit;
    size_t n_deferred; /* instances with deferred set */
    uint64_t next_seq;
};

rate_limiter_t *rate_limiter_new(const nereid_rate_limit_resource_t *explicit, size_t n_explicit)
{
    rate_limiter_t *rl = xcalloc(1, sizeof *rl);
    pthread_mutex_init(&rl->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&rl->cond, &attr);
    pthread_condattr_destroy(&attr);
    rl->explicit = xcalloc(n_explicit ? n_explicit : 1, sizeof *rl->explicit);
    for (size_t i = 0; i < n_explicit; i++) {
        int device = explicit[i].device < 0 ? EVERY_DEVICE : explicit[i].device;
        explicit_count_t *e = NULL;
        for (size_t k = 0; k < rl->n_explicit && !e; k++)
            if (rl->explicit[k].device == device && !strcmp(rl->explicit[k].name, explicit[i].name))
                e = &rl->explicit[k];
        if (e) {
            if (explicit[i].count < e->count) e->count = explicit[i].count;
            continue;
        }
        e = &rl->explicit[rl->n_explicit++];
        e->name = xstrdup(explicit[i].name);
        e->device = device;
        e->count = explicit[i].count;
    }
    return rl;
}

void rate_limiter_free(rate_limiter_t *rl)
{
    if (!rl) return;
    assert(rl->n_insts == 0);
    for (size_t i = 0; i < rl->n_pools; i++)
        free(rl->pools[i].name);
    for (size_t i = 0; i < rl->n_explicit; i++)
        free(rl->explicit[i].name);
    free(rl->pools);
    free(rl->insts);
    free(rl->explicit);
    pthread_mutex_destroy(&rl->lock);
    pthread_cond_destroy(&rl->cond);
    free(rl);
}

/* ---- Pools and their counts ---- */

static size_t find_or_add_pool(rate_limiter_t *rl, const char *name, int device)
{
    for (size_t i = 0; i < rl->n_pools; i++)
        if (rl->pools[i].device == device && !strcmp(rl->pools[i].name, name)) return i;
    rl->pools = xrealloc(rl->pools, (rl->n_pools + 1) * sizeof *rl->pools);
    rl->pools[rl->n_pools] = (pool_t){.name = xstrdup(name), .device = device};
    return rl->n_pools++;
}

/* Largest count any registered instance needs from pool p (0: none). */
static uint64_t max_need(const rate_limiter_t *rl, size_t p)
{
    uint64_t max = 0;
    for (size_t i = 0; i < rl->n_insts; i++)
        for (size_t k = 0; k < rl->insts[i]->n_needs; k++)
            if (rl->insts[i]->needs[k].pool == p && rl->insts[i]->needs[k].count > max)
                max = rl->insts[i]->needs[k].count;
    return max;
}

/* The explicit count for a pool (Triton's ParseAndValidateExplicitResources):
 * a global pool takes the largest count given for its name on any device;
 * a device pool the largest of its device's and every device's. */
static uint64_t explicit_count(const rate_limiter_t *rl, const pool_t *p)
{
    uint64_t count = 0;
    for (size_t i = 0; i < rl->n_explicit; i++) {
        const explicit_count_t *e = &rl->explicit[i];
        if (strcmp(e->name, p->name) != 0) continue;
        if (p->device == GLOBAL_DEVICE || e->device == EVERY_DEVICE || e->device == p->device)
            if (e->count > count) count = e->count;
    }
    return count;
}

/* Recomputes every pool's capacity after a registration change; returns an
 * error (Triton's texts) when the registered instances cannot all run. */
static nereid_error_t *update_capacities(rate_limiter_t *rl)
{
    for (size_t i = 0; i < rl->n_pools; i++) {
        pool_t *p = &rl->pools[i];
        uint64_t need = max_need(rl, i);
        p->capacity = need;
        if (need == 0) continue;
        if (p->device == GLOBAL_DEVICE) {
            for (size_t k = 0; k < rl->n_pools; k++)
                if (rl->pools[k].device != GLOBAL_DEVICE && !strcmp(rl->pools[k].name, p->name) &&
                    max_need(rl, k) > 0)
                    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                            "Resource \"%s\" is present as both global and "
                                            "device-specific resource in the model configuration.",
                                            p->name);
        }
        if (rl->n_explicit) {
            uint64_t given = explicit_count(rl, p);
            if (given < need)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "Resource count for \"%s\" is limited to %llu which will "
                                        "prevent scheduling of one or more model instances, the "
                                        "minimum required count is %llu",
                                        p->name, (unsigned long long)given,
                                        (unsigned long long)need);
            p->capacity = given;
        }
    }
    return NULL;
}

/* Triton's verbose "Max Resource Map" after each change of the counts
 * (ResourceManager::ParseAndValidateResources); L0_model_update reads it
 * back. Lock held. */
static void log_resource_map(const rate_limiter_t *rl)
{
    if (log_verbose_level < 1) return;
    char *text = xstrdup("\nMax Resource Map===>\n");
    for (size_t i = 0; i < rl->n_pools; i++) {
        const pool_t *p = &rl->pools[i];
        bool first = true;
        for (size_t k = 0; k < i && first; k++)
            first = rl->pools[k].device != p->device || !rl->pools[k].capacity;
        if (!p->capacity || !first) continue;
        char dev[24];
        if (p->device == GLOBAL_DEVICE)
            snprintf(dev, sizeof dev, "GLOBAL");
        else
            snprintf(dev, sizeof dev, "%d", p->device);
        char *t = xasprintf("%s\tDevice: %s\n", text, dev);
        free(text);
        text = t;
        for (size_t k = i; k < rl->n_pools; k++) {
            const pool_t *q = &rl->pools[k];
            if (q->device != p->device || !q->capacity) continue;
            t = xasprintf("%s\t\tResource: %s\t Count: %llu\n", text, q->name,
                          (unsigned long long)q->capacity);
            free(text);
            text = t;
        }
    }
    LOG_VERBOSE("%s", text);
    free(text);
}

nereid_error_t *rate_limiter_register(rate_limiter_t *rl, const void *owner, int device,
                                      const rate_limiter_need_t *needs, size_t n_needs,
                                      uint32_t priority, rate_limiter_instance_t **out)
{
    *out = NULL;
    rate_limiter_instance_t *inst = xcalloc(1, sizeof *inst);
    inst->rl = rl;
    inst->owner = owner;
    inst->priority = priority ? priority : 1;
    inst->exec_count = RATE_LIMITER_STARTUP_TURNS;
    inst->needs = xcalloc(n_needs ? n_needs : 1, sizeof *inst->needs);
    pthread_mutex_lock(&rl->lock);
    for (size_t i = 0; i < n_needs; i++) {
        size_t p = find_or_add_pool(rl, needs[i].name, needs[i].global ? GLOBAL_DEVICE : device);
        size_t k = 0;
        while (k < inst->n_needs && inst->needs[k].pool != p)
            k++;
        inst->needs[k] = (need_t){.pool = p, .count = needs[i].count};
        if (k == inst->n_needs) inst->n_needs++;
    }
    rl->insts = xrealloc(rl->insts, (rl->n_insts + 1) * sizeof *rl->insts);
    rl->insts[rl->n_insts++] = inst;
    nereid_error_t *err = update_capacities(rl);
    if (err) {
        rl->n_insts--;
        nereid_error_free(update_capacities(rl)); /* back to the state before */
    } else {
        log_resource_map(rl);
    }
    pthread_mutex_unlock(&rl->lock);
    if (err) {
        free(inst->needs);
        free(inst);
        return err;
    }
    *out = inst;
    return NULL;
}

/* ---- Choosing who runs ---- */

static bool before(const rate_limiter_instance_t *a, const rate_limiter_instance_t *b)
{
    uint64_t sa = a->exec_count * a->priority, sb = b->exec_count * b->priority;
    return sa != sb ? sa < sb : a->staged_seq < b->staged_seq;
}

static rate_limiter_instance_t *first_staged(const rate_limiter_t *rl)
{
    rate_limiter_instance_t *best = NULL;
    for (size_t i = 0; i < rl->n_insts; i++)
        if (rl->insts[i]->state == INST_STAGED && (!best || before(rl->insts[i], best)))
            best = rl->insts[i];
    return best;
}

static bool fits(const rate_limiter_t *rl, const rate_limiter_instance_t *inst)
{
    for (size_t k = 0; k < inst->n_needs; k++) {
        const pool_t *p = &rl->pools[inst->needs[k].pool];
        if (p->in_use + inst->needs[k].count > p->capacity) return false;
    }
    return true;
}

/* Whether a deferred instance (staged, for Triton, when it was released
 * with more work) comes before inst: the choice waits for it. */
static bool deferred_before(const rate_limiter_t *rl, const rate_limiter_instance_t *inst)
{
    for (size_t i = 0; i < rl->n_insts && rl->n_deferred; i++)
        if (rl->insts[i]->deferred && before(rl->insts[i], inst)) return true;
    return false;
}

/* Starts staged instances in order while the first fits and no deferred
 * instance comes before it. Called with the lock held. */
static void start_staged(rate_limiter_t *rl)
{
    bool started = false;
    rate_limiter_instance_t *inst;
    while ((inst = first_staged(rl)) && !deferred_before(rl, inst) && fits(rl, inst)) {
        for (size_t k = 0; k < inst->n_needs; k++)
            rl->pools[inst->needs[k].pool].in_use += inst->needs[k].count;
        inst->state = INST_RUNNING;
        started = true;
    }
    if (started) pthread_cond_broadcast(&rl->cond);
}

static void clear_deferral(rate_limiter_t *rl, rate_limiter_instance_t *inst)
{
    inst->deferred = false;
    rl->n_deferred--;
}

/* Stages inst: it (or, when it has none, a sibling of the same model) ends
 * its model's deferral; its own keeps its place (staged_seq of its
 * release). Called with the lock held. */
static void stage(rate_limiter_t *rl, rate_limiter_instance_t *inst)
{
    assert(inst->state == INST_IDLE);
    inst->state = INST_STAGED;
    if (inst->deferred) {
        clear_deferral(rl, inst);
    } else {
        for (size_t i = 0; i < rl->n_insts; i++)
            if (rl->insts[i]->deferred && rl->insts[i]->owner == inst->owner) {
                clear_deferral(rl, rl->insts[i]);
                break;
            }
        inst->staged_seq = rl->next_seq++;
    }
    start_staged(rl);
}

bool rate_limiter_try_acquire(rate_limiter_instance_t *inst)
{
    rate_limiter_t *rl = inst->rl;
    pthread_mutex_lock(&rl->lock);
    stage(rl, inst);
    bool running = inst->state == INST_RUNNING;
    pthread_mutex_unlock(&rl->lock);
    return running;
}

static bool in_state(rate_limiter_instance_t *inst, inst_state_t state)
{
    pthread_mutex_lock(&inst->rl->lock);
    bool yes = inst->state == state;
    pthread_mutex_unlock(&inst->rl->lock);
    return yes;
}

bool rate_limiter_running(rate_limiter_instance_t *inst)
{
    return in_state(inst, INST_RUNNING);
}

bool rate_limiter_staged(rate_limiter_instance_t *inst)
{
    return in_state(inst, INST_STAGED);
}

static void expire_deferrals(rate_limiter_t *rl)
{
    for (size_t i = 0; i < rl->n_insts && rl->n_deferred; i++)
        if (rl->insts[i]->deferred) clear_deferral(rl, rl->insts[i]);
    start_staged(rl);
}

void rate_limiter_expire_deferrals(rate_limiter_t *rl)
{
    pthread_mutex_lock(&rl->lock);
    expire_deferrals(rl);
    pthread_mutex_unlock(&rl->lock);
}

void rate_limiter_acquire(rate_limiter_instance_t *inst)
{
    rate_limiter_t *rl = inst->rl;
    pthread_mutex_lock(&rl->lock);
    stage(rl, inst);
    while (inst->state != INST_RUNNING) {
        if (rl->n_deferred == 0) {
            pthread_cond_wait(&rl->cond, &rl->lock);
            continue;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_nsec += RATE_LIMITER_DEFER_NS;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&rl->cond, &rl->lock, &deadline) == ETIMEDOUT &&
            inst->state != INST_RUNNING)
            expire_deferrals(rl);
    }
    pthread_mutex_unlock(&rl->lock);
}

void rate_limiter_release(rate_limiter_instance_t *inst, bool more_work, bool warmup)
{
    rate_limiter_t *rl = inst->rl;
    pthread_mutex_lock(&rl->lock);
    assert(inst->state == INST_RUNNING);
    for (size_t k = 0; k < inst->n_needs; k++)
        rl->pools[inst->needs[k].pool].in_use -= inst->needs[k].count;
    inst->state = INST_IDLE;
    if (!warmup) inst->exec_count++;
    /* Triton stages the instance again, now, when its model has work: it
     * takes its place in the order at once (start_staged waits for it when
     * it comes first), though its thread asks a moment later. */
    if (more_work) {
        inst->deferred = true;
        inst->staged_seq = rl->next_seq++;
        rl->n_deferred++;
        pthread_cond_broadcast(&rl->cond); /* waiters now time the deferral */
    }
    start_staged(rl);
    pthread_mutex_unlock(&rl->lock);
}

void rate_limiter_unregister(rate_limiter_instance_t *inst)
{
    if (!inst) return;
    rate_limiter_t *rl = inst->rl;
    pthread_mutex_lock(&rl->lock);
    assert(inst->state == INST_IDLE);
    if (inst->deferred) clear_deferral(rl, inst);
    for (size_t i = 0; i < rl->n_insts; i++)
        if (rl->insts[i] == inst) {
            rl->insts[i] = rl->insts[--rl->n_insts];
            break;
        }
    /* Fewer needs never fail the checks that passed with more. */
    nereid_error_free(update_capacities(rl));
    log_resource_map(rl);
    start_staged(rl);
    pthread_mutex_unlock(&rl->lock);
    free(inst->needs);
    free(inst);
}

long rate_limiter_capacity(rate_limiter_t *rl, const char *name, int device)
{
    long count = -1;
    pthread_mutex_lock(&rl->lock);
    for (size_t i = 0; i < rl->n_pools; i++)
        if (rl->pools[i].device == device && !strcmp(rl->pools[i].name, name) &&
            max_need(rl, i) > 0)
            count = (long)rl->pools[i].capacity;
    pthread_mutex_unlock(&rl->lock);
    return count;
}

/* ---- Models ---- */

nereid_error_t *rate_limiter_add_instance(model_t *m, model_instance_t *inst)
{
    rate_limiter_t *rl = m->server->rate_limiter;
    const Inference__ModelRateLimiter *cfg = inst->group ? inst->group->rate_limiter : NULL;
    if (!rl || !cfg || cfg->n_resources == 0) return NULL;
    rate_limiter_need_t *needs = xcalloc(cfg->n_resources, sizeof *needs);
    for (size_t k = 0; k < cfg->n_resources; k++)
        needs[k] = (rate_limiter_need_t){.name = cfg->resources[k]->name,
                                         .global = cfg->resources[k]->global,
                                         .count = cfg->resources[k]->count};
    nereid_error_t *err = rate_limiter_register(rl, m, inst->device_id, needs, cfg->n_resources,
                                                cfg->priority, &inst->rate_limit);
    free(needs);
    if (!err) m->rate_limited = true;
    return err;
}

nereid_error_t *rate_limiter_add_model(model_t *m)
{
    for (size_t i = 0; i < m->n_instances; i++) {
        nereid_error_t *err = rate_limiter_add_instance(m, m->instances[i]);
        if (err) return err;
    }
    return NULL;
}

void rate_limiter_remove_model(model_t *m)
{
    for (size_t i = 0; i < m->n_instances; i++) {
        rate_limiter_unregister(m->instances[i]->rate_limit);
        m->instances[i]->rate_limit = NULL;
    }
}
