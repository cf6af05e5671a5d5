/*
 * This file contains model warmup (ModelWarmup in the config): before a
 * model version is served, each warmup sample is run `count` times through
 * the model's own scheduler and instances; any failure fails the load.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/decoupled.h"
#include "core/util.h"
#include "sched/scheduler.h"

typedef struct warmup_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    nereid_error_t *err;
} warmup_wait_t;

/* Runs on an instance thread. Freeing the response drops the warmup
 * request's model reference last; it is never the model's last one, since
 * the loader keeps its own until the instance threads are joined (model.c,
 * Ownership), even when warmup fails. */
static void on_warmup_done(nereid_response_t *resp, void *userp)
{
    warmup_wait_t *w = userp;
    pthread_mutex_lock(&w->lock);
    const nereid_error_t *e = nereid_response_error(resp);
    if (e) w->err = nereid_error_new(nereid_error_code(e), "%s", nereid_error_message(e));
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    nereid_response_free(resp);
}

/* A decoupled model's warmup responses: errors are collected (Triton's
 * "<error>; " list), the final flag ends the sample. */
static void on_warmup_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    warmup_wait_t *w = userp;
    pthread_mutex_lock(&w->lock);
    const nereid_error_t *e = resp ? nereid_response_error(resp) : NULL;
    if (e) {
        nereid_error_t *prev = w->err;
        w->err =
            nereid_error_new(nereid_error_code(e), "%s%s%s", prev ? nereid_error_message(prev) : "",
                             prev ? "; " : "", nereid_error_message(e));
        nereid_error_free(prev);
    }
    if (flags & NEREID_RESPONSE_FINAL) {
        w->done = true;
        pthread_cond_signal(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    if (resp) nereid_response_free(resp);
}

/* Reads input_data_file (Triton's <model>/warmup/ folder). */
static nereid_error_t *read_data_file(model_t *m, const char *input, const char *file, size_t want,
                                      bool bytes, void **out, size_t *size)
{
    char *subject = xasprintf("warmup input_data_file '%s/warmup/%s' for input '%s' in model '%s'",
                              m->dir, file, input, m->name);
    char *buf;
    size_t len;
    nereid_error_t *err =
        util_read_tensor_file(m->dir, "warmup", file, want, bytes, subject, &buf, &len);
    free(subject);
    if (err) return err;
    if (!bytes && len < want) {
        free(buf);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "warmup setting expects %zu bytes, but the data provided from "
                                "%sonly has %zu bytes",
                                want, file, len);
    }
    *out = buf;
    *size = bytes ? len : want;
    return NULL;
}

/* Whether name is one of the sequence batcher's control tensors (START,
 * READY, ...): a warmup sample may list them, as Triton runs its samples on
 * the instances directly; here the sequence batcher adds them to the
 * warmup request (a sequence of one request). */
static bool is_sequence(const model_t *m)
{
    return m->config->scheduling_choice_case ==
           INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING;
}

static bool is_control_input(const model_t *m, const char *name)
{
    const Inference__ModelSequenceBatching *sb =
        is_sequence(m) ? m->config->sequence_batching : NULL;
    for (size_t i = 0; sb && i < sb->n_control_input; i++)
        if (strcmp(sb->control_input[i]->name, name) == 0) return true;
    return false;
}

static bool is_config_input(const model_t *m, const char *name)
{
    for (size_t i = 0; i < m->n_inputs; i++)
        if (strcmp(m->inputs[i].name, name) == 0) return true;
    return false;
}

/* Adds the inputs of sample w to req (owned by the request): the model's
 * own inputs (config) when config is true, else the others. Triton
 * (TritonModelInstance::GenerateWarmupData) adds a sample input the config
 * does not list as an override input, after the request is normalized: it
 * is not checked against the config, its batch dimension is 1 (none when
 * the model does not batch), and it reaches the backend with the others
 * (L0_backend_python bls: a warmup sample with INPUT0/INPUT1 for a Python
 * model whose config lists no input). */
static nereid_error_t *add_inputs(model_t *m, const Inference__ModelWarmup *w,
                                  nereid_request_t *req, bool config)
{
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < w->n_inputs && !err; i++) {
        const Inference__ModelWarmup__Input *in = w->inputs[i]->value;
        if (!in || is_control_input(m, w->inputs[i]->key)) continue;
        bool original = is_config_input(m, w->inputs[i]->key);
        if (original != config) continue;
        int64_t shape[NEREID_MAX_RANK];
        size_t rank = 0;
        /* A sequence model takes one row per request: its sample's batch
         * goes as that many one-row requests (model_warmup). */
        if (m->max_batch_size > 0)
            shape[rank++] = original && w->batch_size && !is_sequence(m) ? w->batch_size : 1;
        int64_t count = rank ? shape[0] : 1;
        for (size_t d = 0; d < in->n_dims && rank < NEREID_MAX_RANK; d++) {
            shape[rank++] = in->dims[d];
            count *= in->dims[d] > 0 ? in->dims[d] : 0;
        }
        nereid_datatype_t dt = (nereid_datatype_t)in->data_type;
        size_t esize = nereid_datatype_byte_size(dt);
        bool bytes = dt == NEREID_TYPE_BYTES;
        size_t size = bytes ? (size_t)count * 4 : (size_t)count * esize;
        void *data = NULL;
        if (in->input_data_type_case ==
            INFERENCE__MODEL_WARMUP__INPUT__INPUT_DATA_TYPE_INPUT_DATA_FILE) {
            err = read_data_file(m, w->inputs[i]->key, in->input_data_file, size, bytes, &data,
                                 &size);
            if (err) break;
        } else {
            data = xcalloc(1, size ? size : 1);
            if (in->input_data_type_case ==
                    INFERENCE__MODEL_WARMUP__INPUT__INPUT_DATA_TYPE_RANDOM_DATA &&
                !bytes && dt != NEREID_TYPE_BOOL)
                for (size_t b = 0; b < size; b++)
                    ((uint8_t *)data)[b] = (uint8_t)rand();
        }
        request_add_owned_input(req, w->inputs[i]->key, dt, shape, rank, data, size);
    }
    return err;
}

/* Builds one warmup request for sample w with the model's own inputs; the
 * others are added after validation (add_inputs). */
static nereid_error_t *build_request(model_t *m, const Inference__ModelWarmup *w,
                                     nereid_request_t **out)
{
    nereid_request_t *req;
    nereid_error_t *err = nereid_request_new(m->server, m->name, m->version, &req);
    if (err) return err;
    char *id = xasprintf("warmup_%s", w->name);
    nereid_request_set_id(req, id);
    free(id);
    err = add_inputs(m, w, req, true);
    if (err) {
        nereid_request_free(req);
        return err;
    }
    *out = req;
    return NULL;
}

/* Waits until the warmup request's last response (or its failure). */
static nereid_error_t *wait_done(warmup_wait_t *wait)
{
    pthread_mutex_lock(&wait->lock);
    while (!wait->done)
        pthread_cond_wait(&wait->cond, &wait->lock);
    pthread_mutex_unlock(&wait->lock);
    return wait->err;
}

/* Runs req on inst directly, on the calling thread, as Triton's
 * TritonModelInstance::WarmUp does: an instance an in-place update adds is
 * warmed up before the scheduler knows it. */
static void run_on_instance(model_t *m, model_instance_t *inst, nereid_request_t *req)
{
    if (m->sched->ops->prepare_direct) m->sched->ops->prepare_direct(m->sched, req);
    batch_t batch = {0};
    batch_add(&batch, req);
    batch_execute(inst, &batch);
    batch_complete(&batch, true);
    batch_destroy(&batch);
}

/* Iteration c of sample w: through the scheduler, or on inst when given. */
static nereid_error_t *run_sample(model_t *m, model_instance_t *inst,
                                  const Inference__ModelWarmup *w, uint32_t c)
{
    nereid_request_t *req;
    nereid_error_t *err = build_request(m, w, &req);
    if (err) return err;
    if (m->sched->ops->prepare_warmup) m->sched->ops->prepare_warmup(m->sched, req);
    model_ref(m); /* the request's, dropped when its response is freed */
    req->model = m;
    err = request_validate(req, m);
    if (!err) err = add_inputs(m, w, req, false);
    warmup_wait_t wait = {.done = false, .err = NULL};
    pthread_mutex_init(&wait.lock, NULL);
    pthread_cond_init(&wait.cond, NULL);
    if (!err) {
        uint64_t now = util_now_ns();
        req->t_request_ns = req->t_queue_start_ns = now;
        if (model_is_decoupled(m)) {
            request_set_streamed(req, on_warmup_response, &wait);
        } else {
            req->done_fn = on_warmup_done;
            req->done_userp = &wait;
        }
        req->warmup = true;
        const char *iname = inst ? inst->name : m->n_instances ? m->instances[0]->name : "";
        LOG_VERBOSE("model '%s' instance %s is running warmup sample '%s' for iteration %u",
                    m->name, iname, w->name, c + 1);
        request_prepare_response(req);
        if (inst) {
            run_on_instance(m, inst, req);
        } else {
            err = model_start_instances(m);
            if (!err) err = m->sched->ops->enqueue(m->sched, req);
        }
    }
    if (err)
        request_free(req);
    else
        err = wait_done(&wait);
    pthread_mutex_destroy(&wait.lock);
    pthread_cond_destroy(&wait.cond);
    if (err) { /* Triton's text (TritonModelInstance::WarmUp) and code */
        if (inst)
            LOG_VERBOSE("model '%s' instance %s failed to run warmup sample '%s'", m->name,
                        inst->name, w->name);
        nereid_error_t *wrapped =
            nereid_error_new(NEREID_ERROR_INVALID_ARG, "failed to run warmup sample '%s': %s; ",
                             w->name, nereid_error_message(err));
        nereid_error_free(err);
        return wrapped;
    }
    return NULL;
}

static nereid_error_t *run_samples(model_t *m, model_instance_t *inst)
{
    for (size_t i = 0; i < m->config->n_model_warmup; i++) {
        const Inference__ModelWarmup *w = m->config->model_warmup[i];
        uint32_t count = w->count ? w->count : 1;
        if (is_sequence(m) && m->max_batch_size > 0 && w->batch_size > 1) count *= w->batch_size;
        for (uint32_t c = 0; c < count; c++) {
            nereid_error_t *err = run_sample(m, inst, w, c);
            if (err) return err;
        }
    }
    return NULL;
}

nereid_error_t *model_warmup(model_t *m)
{
    return run_samples(m, NULL);
}

nereid_error_t *model_warmup_instance(model_t *m, model_instance_t *inst)
{
    return run_samples(m, inst);
}
