/*
 * This file contains the sequence batcher benchmark: 32 concurrent sequences
 * of 1000 requests each on the ONNX accumulator (implicit state, START
 * control), under the direct strategy (1 instance x 8 slots, the other 24
 * sequences backlogged) and the oldest strategy (32 candidates, batches of up
 * to 8), and the same on the C-backend accumulator (explicit controls).
 * Each sequence is a closed loop: its next request is submitted from the
 * previous one's completion callback. Every response is checked.
 *
 *   build/bench/bench_sequence [requests per sequence]   (run from the repo
 *                                                         root after `make models`)
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/test_util.h"

#define N_SEQ 32

static int copy_file(const char *src, const char *rel)
{
    char dst[512];
    snprintf(dst, sizeof dst, "%s/%s", repo, rel);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) {
        if (in) fclose(in);
        if (out) fclose(out);
        return -1;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, out);
    fclose(in);
    fclose(out);
    return 0;
}

#define ONNX_CFG(strategy)                                                                         \
    "platform: \"onnxruntime_onnx\" max_batch_size: 8\n"                                           \
    "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                            \
    "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                          \
    "sequence_batching { " strategy "\n"                                                           \
    "  control_input [ { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START "                \
    "int32_false_true: [ 0, 1 ] } ] } ]\n"                                                         \
    "  state [ { input_name: \"INPUT_STATE\" output_name: \"OUTPUT_STATE\" "                       \
    "data_type: TYPE_INT32 dims: [ -1 ] } ] }\n"                                                   \
    "instance_group [ { count: 1 kind: KIND_CPU } ]\n"                                             \
    "parameters { key: \"intra_op_thread_count\" value: { string_value: \"1\" } }\n"

#define C_CFG(strategy, key)                                                                       \
    "backend: \"accumulator\" max_batch_size: 8\n"                                                 \
    "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                            \
    "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                          \
    "parameters { key: \"key\" value: { string_value: \"" key "\" } }\n"                           \
    "sequence_batching { " strategy "\n"                                                           \
    "  control_input [\n"                                                                          \
    "  { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] " \
    "},\n"                                                                                         \
    "  { name: \"END\" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },\n" \
    "  { name: \"READY\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] " \
    "},\n"                                                                                         \
    "  { name: \"CORRID\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] "   \
    "} ] }\n"                                                                                      \
    "instance_group [ { count: 1 kind: KIND_CPU } ]\n"

/* ---- Closed-loop sequences ---- */

typedef struct run run_t;

typedef struct bseq {
    run_t *run;
    uint64_t id;
    int step;
    int32_t value;
    int64_t sum;
} bseq_t;

struct run {
    nereid_server_t *server;
    const char *model;
    int length;
    bseq_t seqs[N_SEQ];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int finished;
    _Atomic int errors;
};

static void submit(bseq_t *q);

static void on_done(nereid_response_t *resp, void *userp)
{
    bseq_t *q = userp;
    run_t *r = q->run;
    bool ok = !nereid_response_error(resp) && nereid_response_output_count(resp) >= 1;
    if (ok) {
        const char *name;
        const void *data;
        nereid_response_output(resp, 0, &name, NULL, NULL, NULL, &data, NULL, NULL);
        ok = *(const int32_t *)data == (int32_t)q->sum;
    } else if (nereid_response_error(resp) && atomic_load(&r->errors) == 0) {
        fprintf(stderr, "%s: %s\n", r->model, nereid_error_message(nereid_response_error(resp)));
    }
    if (!ok) atomic_fetch_add(&r->errors, 1);
    nereid_response_free(resp);
    if (++q->step < r->length) {
        submit(q);
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->finished++;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

static void submit(bseq_t *q)
{
    run_t *r = q->run;
    q->value = (int32_t)(q->id * 3 + (uint64_t)q->step) % 100;
    q->sum += q->value;
    nereid_request_t *req;
    nereid_request_new(r->server, r->model, 0, &req);
    nereid_request_set_correlation_id(req, q->id);
    nereid_request_set_sequence_flags(req, q->step == 0, q->step == r->length - 1);
    int64_t shape[2] = {1, 1};
    nereid_request_add_input(req, "INPUT", NEREID_TYPE_INT32, shape, 2, &q->value, 4);
    nereid_error_t *err = nereid_server_infer_async(r->server, req, NULL, on_done, q);
    if (err) {
        fprintf(stderr, "%s: %s\n", r->model, nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        atomic_fetch_add(&r->errors, 1);
        pthread_mutex_lock(&r->lock);
        r->finished++;
        pthread_cond_signal(&r->cond);
        pthread_mutex_unlock(&r->lock);
    }
}

static void average_batch(nereid_server_t *s, const char *model, double *avg)
{
    json_t *st = model_stats_json(s, model, 0);
    double inf = (double)json_integer_value(json_object_get(st, "inference_count"));
    double exe = (double)json_integer_value(json_object_get(st, "execution_count"));
    *avg = exe > 0 ? inf / exe : 0;
    json_decref(st);
}

static int bench(nereid_server_t *s, const char *model, int length)
{
    static run_t r;
    memset(&r, 0, sizeof r);
    r.server = s;
    r.model = model;
    r.length = length;
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.cond, NULL);
    uint64_t t0 = now_ns();
    for (int i = 0; i < N_SEQ; i++) {
        r.seqs[i] = (bseq_t){.run = &r, .id = 1000 + (uint64_t)i};
        submit(&r.seqs[i]);
    }
    pthread_mutex_lock(&r.lock);
    while (r.finished < N_SEQ)
        pthread_cond_wait(&r.cond, &r.lock);
    pthread_mutex_unlock(&r.lock);
    double secs = (double)(now_ns() - t0) / 1e9;
    double avg;
    average_batch(s, model, &avg);
    int errors = atomic_load(&r.errors);
    printf("%-14s %8.0f infer/s  %6.3f s  avg batch %.2f  errors %d\n", model,
           N_SEQ * (double)length / secs, secs, avg, errors);
    pthread_mutex_destroy(&r.lock);
    pthread_cond_destroy(&r.cond);
    return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
    int length = argc > 1 ? atoi(argv[1]) : 1000;
    if (length < 1) length = 1;
    make_repo_dir("bench-sequence");
    const char *onnx = "examples/models/accumulator_onnx/1/model.onnx";
    bool have_onnx = access(onnx, R_OK) == 0;
    if (have_onnx) {
        write_model("onnx_direct", ONNX_CFG("direct { }"));
        write_model("onnx_oldest", ONNX_CFG("oldest { max_candidate_sequences: 32 }"));
        if (copy_file(onnx, "onnx_direct/1/model.onnx") ||
            copy_file(onnx, "onnx_oldest/1/model.onnx"))
            return 1;
    } else {
        fprintf(stderr, "%s missing (run `make models`): ONNX runs skipped\n", onnx);
    }
    write_model("c_direct", C_CFG("direct { }", "slot"));
    write_model("c_oldest", C_CFG("oldest { max_candidate_sequences: 32 }", "corrid"));

    nereid_server_options_t o;
    repo_options(&o);
    nereid_server_t *s = NULL;
    nereid_error_t *err = nereid_server_new(&o, &s);
    int rc = 0;
    if (err) {
        fprintf(stderr, "%s\n", nereid_error_message(err));
        nereid_error_free(err);
        rc = 1;
    } else {
        printf("%d sequences x %d requests, max_batch_size 8, 1 instance\n", N_SEQ, length);
        if (have_onnx) {
            rc |= bench(s, "onnx_direct", length);
            rc |= bench(s, "onnx_oldest", length);
        }
        rc |= bench(s, "c_direct", length);
        rc |= bench(s, "c_oldest", length);
    }
    if (s) {
        nereid_server_stop(s);
        nereid_server_free(s);
    }
    remove_repo();
    return rc;
}
