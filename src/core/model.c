/*
 * This file contains a loaded model version: picking and initializing its
 * backend, its input/output tables, its instances (one execution thread
 * each) and its scheduler; and the model/instance functions the core exports
 * to backends (nereid_model_*, nereid_instance_*).
 */
#include "core/core.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/loader.h"
#include "core/rate_limiter.h"
#include "core/util.h"
#include "sched/scheduler.h"

_Static_assert((int)NEREID_TYPE_BYTES == (int)INFERENCE__DATA_TYPE__TYPE_STRING &&
                   (int)NEREID_TYPE_FP32 == (int)INFERENCE__DATA_TYPE__TYPE_FP32 &&
                   (int)NEREID_TYPE_BF16 == (int)INFERENCE__DATA_TYPE__TYPE_BF16,
               "datatype enums must agree");

const char *model_backend_for(const model_config_t *cfg)
{
    if (strcmp(cfg->platform, "onnxruntime_onnx") == 0) return "onnxruntime";
    if (strcmp(cfg->platform, "pytorch_libtorch") == 0) return "pytorch";
    if (strcmp(cfg->platform, "ensemble") == 0) return NULL;
    return cfg->backend[0] ? cfg->backend : NULL;
}

static void free_io(model_io_t *ios, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ios[i].name);
        free(ios[i].labels);
        free(ios[i].label_text);
    }
    free(ios);
}

static void copy_dims(int64_t *dst, size_t *rank, const int64_t *src, size_t n)
{
    *rank = n < NEREID_MAX_RANK ? n : NEREID_MAX_RANK;
    if (*rank) memcpy(dst, src, *rank * sizeof *src);
}

/* Reads label_filename (relative to the model directory, confined to it)
 * into io's labels: one per line, a trailing "\r" dropped. */
static nereid_error_t *read_labels(model_t *m, model_io_t *io, const char *file)
{
    char *subject = xasprintf("label file path '%s/%s' for output '%s' in model '%s'", m->dir, file,
                              io->name, m->name);
    size_t len;
    nereid_error_t *err = util_read_confined(m->dir, file, UTIL_LABEL_FILE_MAX_BYTES,
                                             UTIL_READ_TEXT, subject, &io->label_text, &len);
    free(subject);
    if (err) return err;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += io->label_text[i] == '\n';
    if (len && io->label_text[len - 1] != '\n') n++;
    io->labels = xcalloc(n, sizeof *io->labels);
    for (char *line = io->label_text; io->n_labels < n;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[l - 1] = 0;
        io->labels[io->n_labels++] = line;
        line = nl ? nl + 1 : line + l;
    }
    return NULL;
}

/* (Re)builds the io tables from m->config. */
static nereid_error_t *build_io(model_t *m)
{
    model_config_t *c = m->config;
    free_io(m->inputs, m->n_inputs);
    free_io(m->outputs, m->n_outputs);
    m->inputs = xcalloc(c->n_input, sizeof *m->inputs);
    m->n_inputs = c->n_input;
    for (size_t i = 0; i < c->n_input; i++) {
        Inference__ModelInput *in = c->input[i];
        model_io_t *io = &m->inputs[i];
        io->name = xstrdup(in->name);
        io->datatype = (nereid_datatype_t)in->data_type;
        copy_dims(io->dims, &io->rank, in->dims, in->n_dims);
        io->optional = in->optional;
        if (in->reshape) {
            io->has_reshape = true;
            copy_dims(io->reshape, &io->reshape_rank, in->reshape->shape, in->reshape->n_shape);
        }
    }
    m->outputs = xcalloc(c->n_output, sizeof *m->outputs);
    m->n_outputs = c->n_output;
    for (size_t i = 0; i < c->n_output; i++) {
        Inference__ModelOutput *out = c->output[i];
        model_io_t *io = &m->outputs[i];
        io->name = xstrdup(out->name);
        io->datatype = (nereid_datatype_t)out->data_type;
        copy_dims(io->dims, &io->rank, out->dims, out->n_dims);
        if (out->reshape) {
            io->has_reshape = true;
            copy_dims(io->reshape, &io->reshape_rank, out->reshape->shape, out->reshape->n_shape);
        }
        if (out->label_filename && out->label_filename[0]) {
            nereid_error_t *err = read_labels(m, io, out->label_filename);
            if (err) return err;
        }
    }
    m->max_batch_size = c->max_batch_size;
    return NULL;
}

/* What the core hands every scheduler (sched/scheduler.h). */
static const sched_core_t sched_core = {
    .execute = batch_execute,
    .complete = batch_complete,
    .hold_model = server_hold_model,
    .release_model = model_release,
    .ref_model = model_ref,
    .unref_model = model_unref,
    .submit = server_infer_held,
    .submit_stream = server_infer_held_stream,
    .acquire_turn = batch_acquire_turn,
    .release_turn = batch_release_turn,
};

/* ---- Instances ---- */

static void *instance_main(void *arg)
{
    model_instance_t *inst = arg;
    model_t *m = inst->model; /* its instance was initialized at load (create_instances) */
    if (inst->group && inst->group->passive) {
        /* Triton's passive instance: loaded and initialized, never given
         * work by the scheduler (the backend uses it from its own). */
        pthread_mutex_lock(&m->lock);
        while (!m->passive_stop && !atomic_load(&inst->retired))
            pthread_cond_wait(&m->cond, &m->lock);
        pthread_mutex_unlock(&m->lock);
    } else {
        scheduler_t *s = m->sched;
        batch_t batch = {0};
        while (s->ops->next_batch(s, inst, &batch)) {
            batch_execute(inst, &batch);
            if (s->ops->batch_done)
                s->ops->batch_done(s, inst, &batch);
            else
                batch_complete(&batch, true);
        }
        batch_destroy(&batch);
    }
    if (m->backend->instance_fini)
        nereid_error_free(m->backend->instance_fini((nereid_instance_t *)inst));
    inst->fini_done = true;
    if (atomic_load(&inst->lingering)) { /* removed by an update, its sequences ended */
        rate_limiter_unregister(inst->rate_limit);
        inst->rate_limit = NULL;
        LOG_VERBOSE("Removed model instance named '%s'", inst->name);
        atomic_store(&inst->lingering, false); /* last: the next update joins it */
    }
    return NULL;
}

/* Initializes one of several instances at load (create_instances). */
static void *instance_init_main(void *arg)
{
    model_instance_t *inst = arg;
    model_t *m = inst->model;
    nereid_error_t *err = NULL;
    load_op_act_for(m); /* the init's own model control is the load's */
    if (m->backend->instance_init) err = m->backend->instance_init((nereid_instance_t *)inst);
    load_op_act_end();
    inst->init_error = err;
    inst->init_ok = !err;
    inst->init_done = true;
    return NULL;
}

/* Instance i of group grp (NULL: the model has none), at index k. */
static model_instance_t *instance_new(model_t *m, const Inference__ModelInstanceGroup *grp,
                                      size_t i, size_t k)
{
    model_instance_t *inst = xcalloc(1, sizeof *inst);
    inst->model = m;
    inst->index = k;
    inst->name = xasprintf("%s_%zu", grp && grp->name[0] ? grp->name : m->name, i);
    inst->kind = grp && grp->kind == INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_MODEL
                     ? NEREID_INSTANCE_KIND_MODEL
                     : NEREID_INSTANCE_KIND_CPU;
    inst->device_id = grp && grp->n_gpus ? grp->gpus[0] : 0;
    inst->group = grp;
    return inst;
}

/* Triton's "no GPUs" refusal of a KIND_GPU group. */
static nereid_error_t *check_group_kind(const model_t *m, const Inference__ModelInstanceGroup *grp)
{
    if (grp->kind != INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_GPU) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "instance group %s of model %s specifies KIND_GPU but no GPUs "
                            "are available",
                            grp->name, m->name);
}

size_t model_active_instances(const model_t *m);

static nereid_error_t *create_instances(model_t *m)
{
    model_config_t *c = m->config;
    size_t total = 0;
    for (size_t g = 0; g < c->n_instance_group; g++) {
        Inference__ModelInstanceGroup *grp = c->instance_group[g];
        nereid_error_t *kerr = check_group_kind(m, grp);
        if (kerr) return kerr;
        total += grp->count > 0 ? (size_t)grp->count : 1;
    }
    if (total == 0) total = 1;
    m->instances = xcalloc(total, sizeof *m->instances);
    size_t k = 0;
    for (size_t g = 0; g < c->n_instance_group || (g == 0 && c->n_instance_group == 0); g++) {
        Inference__ModelInstanceGroup *grp = c->n_instance_group ? c->instance_group[g] : NULL;
        size_t count = grp && grp->count > 0 ? (size_t)grp->count : 1;
        for (size_t i = 0; i < count; i++, k++)
            m->instances[k] = instance_new(m, grp, i, k);
    }
    m->n_instances = k;
    nereid_error_t *rl_err = rate_limiter_add_model(m);
    if (rl_err) return rl_err;
    if (k == 1) {
        /* One instance: initialize it here, as Triton initializes instances
         * on the loading thread, and start its thread with the first request. */
        model_instance_t *inst = m->instances[0];
        nereid_error_t *err = NULL;
        if (m->backend->instance_init) err = m->backend->instance_init((nereid_instance_t *)inst);
        inst->init_done = true;
        m->lazy_thread = !err;
        return err;
    }
    /* Several: initialize them in parallel, each on a thread that ends
     * after its init; their execution threads start with the first request
     * (model_start_instances), all of them, so the model serves with every
     * instance from then on. An idle model costs no thread. */
    pthread_t *init_threads = xcalloc(k, sizeof *init_threads);
    bool *started = xcalloc(k, sizeof *started);
    for (size_t i = 0; i < k; i++)
        started[i] =
            pthread_create(&init_threads[i], NULL, instance_init_main, m->instances[i]) == 0;
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < k; i++) {
        model_instance_t *inst = m->instances[i];
        if (started[i])
            pthread_join(init_threads[i], NULL);
        else
            inst->init_error =
                nereid_error_new(NEREID_ERROR_INTERNAL, "unable to start instance thread");
        if (inst->init_error && !err) {
            err = inst->init_error;
            inst->init_error = NULL;
        }
        nereid_error_free(inst->init_error);
        inst->init_error = NULL;
    }
    free(init_threads);
    free(started);
    if (err) { /* the instances that did initialize are finalized now */
        for (size_t i = 0; i < k; i++)
            if (m->instances[i]->init_ok && m->backend->instance_fini)
                nereid_error_free(m->backend->instance_fini((nereid_instance_t *)m->instances[i]));
        return err;
    }
    m->lazy_thread = true;
    return NULL;
}

/* Stops the scheduler (which joins its own threads, e.g. timeout reapers)
 * and joins every instance thread (they drain first). Runs before the
 * loader's reference is dropped: see "Ownership" below. */
nereid_error_t *model_start_instances(model_t *m)
{
    if (!m->lazy_thread || atomic_load_explicit(&m->thread_running, memory_order_acquire))
        return NULL;
    nereid_error_t *err = NULL;
    pthread_mutex_lock(&m->lock);
    if (!atomic_load(&m->thread_running)) {
        size_t n_started = 0;
        for (size_t i = 0; i < m->n_instances; i++) {
            model_instance_t *inst = m->instances[i];
            if (atomic_load(&inst->retired)) continue;
            if (pthread_create(&inst->thread, NULL, instance_main, inst) == 0) {
                inst->thread_started = true;
                n_started++;
            }
        }
        if (n_started == 0)
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "unable to start instance thread");
        else if (n_started < model_active_instances(m))
            LOG_WARN("model '%s' serves with %zu of its %zu instances: unable to start the "
                     "others' threads",
                     m->name, n_started, model_active_instances(m));
        if (!err) atomic_store_explicit(&m->thread_running, true, memory_order_release);
    }
    pthread_mutex_unlock(&m->lock);
    return err;
}

static void stop_instances(model_t *m)
{
    if (m->sched) m->sched->ops->stop(m->sched);
    pthread_mutex_lock(&m->lock);
    m->passive_stop = true;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    if (m->lazy_thread) {
        /* No start after this; an instance whose thread never started owes
         * the fini (its init ran at load). */
        pthread_mutex_lock(&m->lock);
        atomic_store(&m->thread_running, true);
        pthread_mutex_unlock(&m->lock);
        for (size_t i = 0; i < m->n_instances; i++) {
            model_instance_t *inst = m->instances[i];
            if (inst->thread_started || inst->fini_done) continue; /* its thread finalizes */
            if (m->backend->instance_fini)
                nereid_error_free(m->backend->instance_fini((nereid_instance_t *)inst));
            inst->fini_done = true;
        }
    }
    for (size_t i = 0; i < m->n_instances; i++) {
        model_instance_t *inst = m->instances[i];
        if (inst->thread_started) pthread_join(inst->thread, NULL);
        inst->thread_started = false;
    }
}

/* ---- In-place instance updates (Triton's UpdateInstanceGroup) ---- */

size_t model_active_instances(const model_t *m)
{
    size_t n = m->n_instances, active = 0;
    model_instance_t **v = m->instances;
    for (size_t i = 0; i < n; i++)
        active += !atomic_load(&v[i]->retired);
    return active;
}

bool model_can_update_instances(const model_t *m)
{
    return m->backend && m->sched && m->sched->ops->wake;
}

/* Packs g with its name and count cleared: Triton's instance signature
 * (InstanceConfigSignature) without the device. */
static uint8_t *group_signature(const Inference__ModelInstanceGroup *g, size_t *len)
{
    Inference__ModelInstanceGroup c = *g;
    c.name = (char *)"";
    c.count = 1;
    *len = inference__model_instance_group__get_packed_size(&c);
    uint8_t *buf = xmalloc(*len ? *len : 1);
    inference__model_instance_group__pack(&c, buf);
    return buf;
}

static bool same_signature(const Inference__ModelInstanceGroup *a,
                           const Inference__ModelInstanceGroup *b)
{
    if (!a || !b) return a == b;
    size_t la, lb;
    uint8_t *pa = group_signature(a, &la), *pb = group_signature(b, &lb);
    bool same = la == lb && memcmp(pa, pb, la) == 0;
    free(pa);
    free(pb);
    return same;
}

/* A copy of m's config with the instance groups of cfg (Triton replaces
 * only instance_group in the model's config). */
static model_config_t *config_with_groups(const model_t *m, const model_config_t *cfg)
{
    model_config_t *c = config_copy(m->config);
    for (size_t g = 0; g < c->n_instance_group; g++)
        inference__model_instance_group__free_unpacked(c->instance_group[g], NULL);
    free(c->instance_group);
    c->n_instance_group = cfg->n_instance_group;
    c->instance_group =
        xcalloc(cfg->n_instance_group ? cfg->n_instance_group : 1, sizeof *c->instance_group);
    for (size_t g = 0; g < cfg->n_instance_group; g++) {
        size_t len = inference__model_instance_group__get_packed_size(cfg->instance_group[g]);
        uint8_t *buf = xmalloc(len ? len : 1);
        inference__model_instance_group__pack(cfg->instance_group[g], buf);
        c->instance_group[g] = inference__model_instance_group__unpack(NULL, len, buf);
        free(buf);
    }
    return c;
}

static void keep_old(model_t *m, void *p)
{
    m->old_mem = xrealloc(m->old_mem, (m->n_old_mem + 1) * sizeof *m->old_mem);
    m->old_mem[m->n_old_mem++] = p;
}

/* Finalizes and frees instances that never served (a failed update). */
static void drop_new_instances(model_t *m, model_instance_t **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rate_limiter_unregister(v[i]->rate_limit);
        if (v[i]->init_ok && m->backend->instance_fini)
            nereid_error_free(m->backend->instance_fini((nereid_instance_t *)v[i]));
        nereid_error_free(v[i]->init_error);
        free(v[i]->name);
        free(v[i]);
    }
    free(v);
}

/* Joins the threads of instances that lingered after an earlier update
 * and have since exited (their sequences ended). */
static void join_gone(model_t *m)
{
    for (size_t i = 0; i < m->n_instances; i++) {
        model_instance_t *inst = m->instances[i];
        if (!atomic_load(&inst->retired) || !inst->thread_started || atomic_load(&inst->lingering))
            continue;
        pthread_join(inst->thread, NULL);
        inst->thread_started = false;
    }
}

static nereid_error_t *update_instances(model_t *m, const model_config_t *cfg);

nereid_error_t *model_update_instances(model_t *m, const model_config_t *cfg)
{
    load_op_mark_loading(m, true);
    nereid_error_t *err = update_instances(m, cfg);
    load_op_mark_loading(m, false);
    return err;
}

static nereid_error_t *update_instances(model_t *m, const model_config_t *cfg)
{
    if (!model_can_update_instances(m))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "model '%s' cannot update its instances",
                                m->name);
    for (size_t g = 0; g < cfg->n_instance_group; g++) {
        nereid_error_t *err = check_group_kind(m, cfg->instance_group[g]);
        if (err) return err;
    }
    join_gone(m);
    model_config_t *nc = config_with_groups(m, cfg);
    size_t n_old = m->n_instances;
    model_instance_t **old = m->instances;
    bool *kept = xcalloc(n_old ? n_old : 1, sizeof *kept);
    model_instance_t **added = NULL;
    size_t n_added = 0;
    nereid_error_t *err = NULL;
    /* Each requested instance reuses a serving one of the same signature
     * (the last one first, as Triton), or is created. */
    for (size_t g = 0; g < nc->n_instance_group || (g == 0 && nc->n_instance_group == 0); g++) {
        const Inference__ModelInstanceGroup *grp =
            nc->n_instance_group ? nc->instance_group[g] : NULL;
        size_t count = grp && grp->count > 0 ? (size_t)grp->count : 1;
        int device = grp && grp->n_gpus ? grp->gpus[0] : 0;
        for (size_t i = 0; i < count && !err; i++) {
            /* The one of the same name first, so that names stay unique. */
            char *want = xasprintf("%s_%zu", grp && grp->name[0] ? grp->name : m->name, i);
            size_t j = n_old, named = n_old;
            for (size_t o = n_old; o-- > 0;)
                if (!kept[o] && !atomic_load(&old[o]->retired) && old[o]->device_id == device &&
                    same_signature(old[o]->group, grp)) {
                    if (j == n_old) j = o;
                    if (strcmp(old[o]->name, want) == 0) named = o;
                }
            free(want);
            if (named < n_old) j = named;
            if (j < n_old) {
                kept[j] = true;
                continue;
            }
            model_instance_t *inst = instance_new(m, grp, i, n_old + n_added);
            added = xrealloc(added, (n_added + 1) * sizeof *added);
            added[n_added++] = inst;
            err = rate_limiter_add_instance(m, inst);
            if (!err && m->backend->instance_init)
                err = m->backend->instance_init((nereid_instance_t *)inst);
            inst->init_ok = !err;
            inst->init_done = true;
            /* Triton warms up each instance it creates before the
             * scheduler gets it; a failure fails the update. */
            if (!err && !(grp && grp->passive)) err = model_warmup_instance(m, inst);
            if (!err) LOG_VERBOSE("Created model instance named '%s'", inst->name);
        }
    }
    if (err) {
        drop_new_instances(m, added, n_added);
        free(kept);
        config_free(nc);
        return err;
    }
    /* The scheduler stops giving the leaving ones work; one that still
     * serves live sequences lingers until they end (not waited for). */
    model_instance_t **leaving = xcalloc(n_old ? n_old : 1, sizeof *leaving);
    size_t n_leaving = 0;
    for (size_t j = 0; j < n_old; j++)
        if (!kept[j] && !atomic_load(&old[j]->retired)) leaving[n_leaving++] = old[j];
    if (n_leaving && m->sched->ops->retire) m->sched->ops->retire(m->sched, leaving, n_leaving);
    /* Commit: publish the longer array before its count, retire what is
     * not kept, start the new threads if the model's are running. */
    model_instance_t **v = xcalloc(n_old + n_added ? n_old + n_added : 1, sizeof *v);
    if (n_old) memcpy(v, old, n_old * sizeof *v);
    if (n_added) memcpy(v + n_old, added, n_added * sizeof *v);
    free(added);
    char *json = config_to_json(nc);
    pthread_mutex_lock(&m->lock);
    atomic_store(&m->instances, v);
    atomic_store(&m->n_instances, n_old + n_added);
    keep_old(m, old);
    m->old_configs = xrealloc(m->old_configs, (m->n_old_configs + 1) * sizeof *m->old_configs);
    m->old_configs[m->n_old_configs++] = m->config;
    keep_old(m, m->config_json);
    __atomic_store_n(&m->config, nc, __ATOMIC_RELEASE);
    __atomic_store_n(&m->config_json, json, __ATOMIC_RELEASE);
    size_t n_retired = 0;
    for (size_t j = 0; j < n_old; j++)
        if (!kept[j] && !atomic_load(&old[j]->retired)) {
            atomic_store(&old[j]->retired, true);
            n_retired++;
        }
    if (atomic_load(&m->thread_running))
        for (size_t i = n_old; i < n_old + n_added; i++)
            v[i]->thread_started = pthread_create(&v[i]->thread, NULL, instance_main, v[i]) == 0;
    pthread_cond_broadcast(&m->cond); /* retired passive instances */
    pthread_mutex_unlock(&m->lock);
    if (n_retired) m->sched->ops->wake(m->sched);
    /* The retired ones finish their batch and are finalized now. */
    for (size_t j = 0; j < n_leaving; j++) {
        model_instance_t *inst = leaving[j];
        /* lingering first: once its thread cleared it, fini_done is seen */
        if (atomic_load(&inst->lingering) || inst->fini_done) continue;
        if (inst->thread_started) {
            pthread_join(inst->thread, NULL);
            inst->thread_started = false;
        } else if (m->backend->instance_fini) {
            nereid_error_free(m->backend->instance_fini((nereid_instance_t *)inst));
        }
        inst->fini_done = true;
        rate_limiter_unregister(inst->rate_limit);
        inst->rate_limit = NULL;
        LOG_VERBOSE("Removed model instance named '%s'", inst->name);
    }
    free(leaving);
    free(kept);
    LOG_INFO("updated instances of '%s' version %" PRId64 ": %zu added, %zu removed, %zu serving",
             m->name, m->version, n_added, n_retired, model_active_instances(m));
    return NULL;
}

/* ---- Files the config names for the backend ---- */

/* The model files (default_model_filename, cc_model_filenames) live in the
 * version directory and must resolve inside the model directory. */
static nereid_error_t *check_model_files(const model_t *m)
{
    const model_config_t *c = m->config;
    for (size_t i = 0; i <= c->n_cc_model_filenames; i++) {
        const char *field = i == 0 ? "default_model_filename" : "cc_model_filenames";
        const char *file = i == 0 ? c->default_model_filename : c->cc_model_filenames[i - 1]->value;
        if (!file || !file[0]) continue;
        char *rel = xasprintf("%lld/%s", (long long)m->version, file);
        util_path_status_t st = util_confine_path(m->dir, rel, NULL);
        free(rel);
        if (st == UTIL_PATH_OUTSIDE)
            return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                    "%s '%s' for model '%s' is outside model directory", field,
                                    file, m->name);
    }
    return NULL;
}

/* Triton's `runtime`: a library name looked up in the version directory,
 * the model directory and the backend's directory, which must not escape
 * the directory it is found in. A name whose text climbs out is refused
 * against the first directory without looking at the disk (so the answer
 * never tells whether a file outside exists). Nereid's backends are its own
 * libraries, so a runtime that passes (or names this backend's library the
 * Triton or the Nereid way) loads the backend the config selects. */
static nereid_error_t *check_runtime(const model_t *m, const char *backend_dir, const char *bname)
{
    const char *rt = m->config->runtime;
    if (!rt || !rt[0]) return NULL;
    char *dirs[3] = {xasprintf("%s/%lld", m->dir, (long long)m->version), xstrdup(m->dir),
                     xasprintf("%s/%s", backend_dir ? backend_dir : "", bname)};
    nereid_error_t *err = NULL;
    util_path_status_t st = UTIL_PATH_MISSING;
    size_t i = 0;
    while (i < ARRAY_LEN(dirs) && (st = util_confine_path(dirs[i], rt, NULL)) == UTIL_PATH_MISSING)
        i++;
    char *triton_name = xasprintf("libtriton_%s.so", bname);
    char *nereid_name = xasprintf("libnereid_%s.so", bname);
    if (st == UTIL_PATH_OUTSIDE)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "backend library name '%s' escapes backend directory '%s', for "
                               "model '%s', check model config runtime field",
                               rt, dirs[i], m->name);
    else if (st == UTIL_PATH_MISSING && strcmp(rt, triton_name) != 0 &&
             strcmp(rt, nereid_name) != 0)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "unable to find backend library '%s' for model '%s', searched: "
                               "'%s' '%s' '%s' ",
                               rt, m->name, dirs[0], dirs[1], dirs[2]);
    free(triton_name);
    free(nereid_name);
    for (i = 0; i < ARRAY_LEN(dirs); i++)
        free(dirs[i]);
    return err;
}

/* ---- Lifecycle ----
 *
 * Ownership: a model_t is freed by whoever drops its last reference. The
 * loader holds one from model_load until model_unload; every request holds
 * one from its lookup until its response is freed (usually by the
 * frontend, inside or after the completion callback); an ensemble request
 * holds one per composing model (model_hold) until it ends. The threads a model
 * owns (instances, scheduler reapers) hold none of their own: the loader's
 * reference covers them, because model_unload -- and a failed model_load --
 * stops the scheduler and joins them all before dropping it. So a
 * completion that runs on one of the model's own threads never drops the
 * last reference, and those threads may touch the model after it. Any other
 * thread that keeps using a model after running a completion (an inline
 * run) takes its own reference first and drops it as the last thing it
 * does with the model.
 */

nereid_error_t *model_load(nereid_server_t *server, const model_load_args_t *args, model_t **out)
{
    *out = NULL;
    uint64_t load_start_ns = util_now_ns();
    model_t *m = xcalloc(1, sizeof *m);
    m->server = server;
    m->name = xstrdup(args->name);
    m->ns = args->model_namespace ? xstrdup(args->model_namespace) : NULL;
    m->version = args->version;
    m->dir = xstrdup(args->dir);
    m->config = config_copy(args->config);
    m->config_json = config_to_json(m->config);
    m->autocomplete_allowed = args->autocomplete_allowed;
    atomic_store(&m->refcount, 1); /* the loader's: dropped by model_unload */
    atomic_store(&m->exec_avg_ns, UINT64_MAX);
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    load_op_mark_loading(m, true); /* until its init is done */
    nereid_error_t *err = NULL;
    const char *bname = model_backend_for(m->config);
    if (!bname && strcmp(m->config->platform, "ensemble") != 0) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unexpected platform type '%s' for %s",
                               m->config->platform, m->name);
        goto fail;
    }
    if (bname) {
        m->backend_name = xstrdup(bname);
        /* The loader refuses a backend name that is not a plain name, so
         * the runtime search below stays in the backend's directory. */
        backend_search_t search = {args->backend_dir ? args->backend_dir : "",
                                   m->dir,
                                   m->version,
                                   m->config->runtime,
                                   args->backend_settings,
                                   args->n_backend_settings};
        err = backend_acquire(&search, bname, &m->backend);
        if (!err) err = check_model_files(m);
        if (!err) err = check_runtime(m, args->backend_dir, bname);
        if (err) goto fail;
        if (m->backend->model_init) {
            m->in_model_init = true;
            err = m->backend->model_init((nereid_model_t *)m);
            m->in_model_init = false;
            if (err) goto fail;
        }
        m->model_initialized = true;
        if (m->config_replaced) {
            free(m->config_json);
            m->config_json = config_to_json(m->config);
        }
    }
    err = build_io(m);
    if (err) goto fail;
    stats_init(&m->stats, m->max_batch_size, m->config);
    server_enable_latency_metrics(m);
    err = scheduler_create(m, &sched_core, &m->sched);
    if (err) goto fail;
    if (m->sched->decoupled) model_set_decoupled(m);
    if (m->backend) {
        err = create_instances(m);
        if (!err) err = model_warmup(m);
        if (err) goto fail;
        m->stats.load_ns = util_now_ns() - load_start_ns;
    }
    load_op_mark_loading(m, false);
    *out = m;
    return NULL;
fail:
    load_op_mark_loading(m, false);
    /* Not model_unref alone: instance threads (which may have run warmup
     * completions) must be joined before the loader's reference goes. */
    model_unload(m);
    return err;
}

/* Drains like a plain unload: requests the model accepted run (the
 * instances drain the queue), and so do the steps of ensemble requests that
 * hold the model (they were accepted by the ensemble while this model was
 * served). Holds are taken only through a lookup, and the repository
 * removes the model from the table before it unloads it, so their count
 * only falls here. At shutdown the server does not wait: steps then fail
 * with "Server not ready". */
void model_unload(model_t *m)
{
    atomic_store(&m->unloading, true);
    pthread_mutex_lock(&m->lock);
    while (atomic_load(&m->holds) > 0 && !server_is_stopping(m->server))
        pthread_cond_wait(&m->cond, &m->lock);
    pthread_mutex_unlock(&m->lock);
    stop_instances(m);
    rate_limiter_remove_model(m);
    model_unref(m);
}

void model_hold(model_t *m)
{
    atomic_fetch_add(&m->holds, 1);
}

void model_release(model_t *m)
{
    /* A waiting unload set unloading before it reads holds (both seq_cst):
     * either it sees this decrement, or this sees its flag and wakes it. */
    if (atomic_fetch_sub(&m->holds, 1) == 1 && atomic_load(&m->unloading)) {
        pthread_mutex_lock(&m->lock);
        pthread_cond_broadcast(&m->cond);
        pthread_mutex_unlock(&m->lock);
    }
    model_unref(m); /* the hold's reference, last */
}

void model_ref(model_t *m)
{
    atomic_fetch_add(&m->refcount, 1);
}

static void model_free(model_t *m)
{
    /* model_unload joined every thread the model owns before it dropped the
     * loader's reference; one of them freeing the model would be the bug
     * this rule exists to prevent (it would read the model after this). */
    for (size_t i = 0; i < m->n_instances; i++)
        assert(!m->instances[i]->thread_started);
    if (m->sched) m->sched->ops->destroy(m->sched);
    for (size_t i = 0; i < m->n_instances; i++) {
        nereid_error_free(m->instances[i]->init_error);
        free(m->instances[i]->name);
        free(m->instances[i]);
    }
    free(m->instances);
    for (size_t i = 0; i < m->n_old_mem; i++)
        free(m->old_mem[i]);
    free(m->old_mem);
    for (size_t i = 0; i < m->n_old_configs; i++)
        config_free(m->old_configs[i]);
    free(m->old_configs);
    if (m->backend) {
        if (m->backend->model_fini && m->model_initialized)
            nereid_error_free(m->backend->model_fini((nereid_model_t *)m));
        backend_release(m->backend);
    }
    free_io(m->inputs, m->n_inputs);
    free_io(m->outputs, m->n_outputs);
    stats_destroy(&m->stats);
    config_free(m->config);
    free(m->config_json);
    free(m->backend_name);
    free(m->name);
    free(m->ns);
    free(m->dir);
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    free(m);
}

void model_unref(model_t *m)
{
    if (atomic_fetch_sub(&m->refcount, 1) == 1) model_free(m);
}

/* ---- Exported to backends ---- */

nereid_backend_t *nereid_model_backend(const nereid_model_t *model)
{
    const model_t *m = (const model_t *)model;
    return (nereid_backend_t *)m->backend;
}

nereid_server_t *nereid_model_server(const nereid_model_t *model)
{
    return ((const model_t *)model)->server;
}

const char *nereid_model_name(const nereid_model_t *model)
{
    return ((const model_t *)model)->name;
}

int64_t nereid_model_version(const nereid_model_t *model)
{
    return ((const model_t *)model)->version;
}

const char *nereid_model_directory(const nereid_model_t *model)
{
    return ((const model_t *)model)->dir;
}

char *nereid_model_file_path(const nereid_model_t *model, const char *backend_default_filename)
{
    const model_t *m = (const model_t *)model;
    const char *file = m->config->default_model_filename[0] ? m->config->default_model_filename
                                                            : backend_default_filename;
    return xasprintf("%s/%lld/%s", m->dir, (long long)m->version, file ? file : "");
}

const char *nereid_model_config_json(const nereid_model_t *model)
{
    return ((const model_t *)model)->config_json;
}

const char *nereid_model_parameter(const nereid_model_t *model, const char *key)
{
    const model_config_t *c = ((const model_t *)model)->config;
    for (size_t i = 0; i < c->n_parameters; i++)
        if (strcmp(c->parameters[i]->key, key) == 0 && c->parameters[i]->value)
            return c->parameters[i]->value->string_value;
    return NULL;
}

int64_t nereid_model_max_batch_size(const nereid_model_t *model)
{
    return ((const model_t *)model)->config->max_batch_size;
}

size_t nereid_model_input_count(const nereid_model_t *model)
{
    return ((const model_t *)model)->config->n_input;
}

size_t nereid_model_output_count(const nereid_model_t *model)
{
    return ((const model_t *)model)->config->n_output;
}

void nereid_model_input(const nereid_model_t *model, size_t i, const char **name,
                        nereid_datatype_t *datatype, const int64_t **dims, size_t *rank)
{
    const Inference__ModelInput *in = ((const model_t *)model)->config->input[i];
    bool reshape = in->reshape != NULL;
    if (name) *name = in->name;
    if (datatype) *datatype = (nereid_datatype_t)in->data_type;
    if (dims) *dims = reshape ? in->reshape->shape : in->dims;
    if (rank) *rank = reshape ? in->reshape->n_shape : in->n_dims;
}

void nereid_model_output(const nereid_model_t *model, size_t i, const char **name,
                         nereid_datatype_t *datatype, const int64_t **dims, size_t *rank)
{
    const Inference__ModelOutput *out = ((const model_t *)model)->config->output[i];
    bool reshape = out->reshape != NULL;
    if (name) *name = out->name;
    if (datatype) *datatype = (nereid_datatype_t)out->data_type;
    if (dims) *dims = reshape ? out->reshape->shape : out->dims;
    if (rank) *rank = reshape ? out->reshape->n_shape : out->n_dims;
}

bool nereid_model_autocomplete_allowed(const nereid_model_t *model)
{
    return ((const model_t *)model)->autocomplete_allowed;
}

void nereid_model_set_inline_max_us(nereid_model_t *model, uint64_t max_us)
{
    atomic_store(&((model_t *)model)->inline_max_ns, max_us * 1000u);
}

void nereid_model_set_backend_response_stats(nereid_model_t *model)
{
    atomic_store(&((model_t *)model)->backend_response_stats, true);
}

nereid_error_t *nereid_model_report_response(nereid_model_t *model, uint64_t index,
                                             uint64_t start_ns, uint64_t output_start_ns,
                                             uint64_t end_ns, const nereid_error_t *err)
{
    if (!model) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "model is NULL");
    /* Triton's InferenceStatsAggregator::UpdateResponse* checks */
    bool cancelled = err && nereid_error_code(err) == NEREID_ERROR_CANCELLED;
    if (output_start_ns && !cancelled) {
        if (start_ns > output_start_ns)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Response start cannot happen after compute output start");
        if (output_start_ns > end_ns)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Compute output start cannot happen after response end");
    } else if (start_ns > end_ns) {
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Response start cannot happen after response end");
    }
    stats_record_response(&((model_t *)model)->stats, index, start_ns,
                          cancelled ? 0 : output_start_ns, end_ns, err);
    return NULL;
}

nereid_error_t *nereid_model_set_config(nereid_model_t *model, const char *config_json)
{
    model_t *m = (model_t *)model;
    if (!m->in_model_init)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "model config can only be set during model initialization");
    char *errors = NULL;
    model_config_t *cfg = config_from_json(config_json, strlen(config_json), &errors);
    config_options_t opts = {.gpus_available = false, .allow_missing_io = false};
    char *filename = xasprintf("%s/config.pbtxt", m->dir);
    if (cfg && config_normalize(cfg, m->name, filename, &opts, &errors) != 0) {
        config_free(cfg);
        cfg = NULL;
    }
    free(filename);
    if (!cfg) {
        nereid_error_t *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                               "autofilled config for model '%s' is invalid: %s",
                                               m->name, errors ? errors : "");
        free(errors);
        return err;
    }
    config_free(m->config);
    free(m->config_json);
    m->config = cfg;
    m->config_json = config_to_json(cfg);
    m->config_replaced = true;
    return NULL;
}

void nereid_model_set_state(nereid_model_t *model, void *state)
{
    ((model_t *)model)->backend_state = state;
}

void *nereid_model_state(const nereid_model_t *model)
{
    return ((const model_t *)model)->backend_state;
}

nereid_model_t *nereid_instance_model(const nereid_instance_t *instance)
{
    return (nereid_model_t *)((const model_instance_t *)instance)->model;
}

const char *nereid_instance_name(const nereid_instance_t *instance)
{
    return ((const model_instance_t *)instance)->name;
}

bool nereid_instance_is_passive(const nereid_instance_t *instance)
{
    const model_instance_t *inst = (const model_instance_t *)instance;
    return inst->group && inst->group->passive;
}

nereid_instance_kind_t nereid_instance_kind(const nereid_instance_t *instance)
{
    return ((const model_instance_t *)instance)->kind;
}

int nereid_instance_device_id(const nereid_instance_t *instance)
{
    return ((const model_instance_t *)instance)->device_id;
}

void nereid_instance_set_state(nereid_instance_t *instance, void *state)
{
    ((model_instance_t *)instance)->backend_state = state;
}

void *nereid_instance_state(const nereid_instance_t *instance)
{
    return ((const model_instance_t *)instance)->backend_state;
}
