/*
 * This file contains unit tests of the sequence batcher through the
 * in-process API with the accumulator backend: routing by correlation id,
 * control tensors and their encodings, the direct strategy's slots, backlog
 * and idle timeout, the oldest strategy, implicit state, Triton's error
 * texts, and a stress of 64 concurrent sequences.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "test_util.h"

#define IO_CONTROLS                                                                                \
    "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                            \
    "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] },\n"                           \
    "         { name: \"CONTROLS\" data_type: TYPE_FP32 dims: [ 4 ] },\n"                          \
    "         { name: \"BATCH\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"

#define CTL(name, kind, values) "{ name: \"" name "\" control [ { kind: " kind " " values " } ] }"

#define CTLS_INT32                                                                                                                     \
    "control_input [ " CTL(                                                                                                            \
        "START", "CONTROL_SEQUENCE_START",                                                                                             \
        "int32_false_true: [ 0, 1 ]") ",\n" CTL("END", "CONTROL_SEQUENCE_END",                                                         \
                                                "int32_false_true: [ 0, 1 ]") ",\n" CTL("READY",                                       \
                                                                                        "CONTROL_"                                     \
                                                                                        "SEQUENCE"                                     \
                                                                                        "_READY",                                      \
                                                                                        "int32_"                                       \
                                                                                        "false_"                                       \
                                                                                        "true: [ "                                     \
                                                                                        "0, 1 ]") ",\n" CTL("CORRID",                  \
                                                                                                            "CONTROL_SEQUENCE_CORRID", \
                                                                                                            "data_type: TYPE_UINT64") " ]\n"

static void make_repo(void)
{
    make_repo_dir("sequence");
    /* direct, 1 instance x 4 slots, explicit controls */
    write_model("acc_direct", "backend: \"accumulator\" max_batch_size: 4\n" IO_CONTROLS
                              "sequence_batching { direct { } " CTLS_INT32 " }\n");
    /* one slot: backlog and reuse */
    write_model("acc_one", "backend: \"accumulator\" max_batch_size: 1\n" IO_CONTROLS
                           "sequence_batching { " CTLS_INT32 " }\n");
    /* one slot, 200 ms idle timeout */
    write_model("acc_idle",
                "backend: \"accumulator\" max_batch_size: 1\n" IO_CONTROLS
                "sequence_batching { max_sequence_idle_microseconds: 200000 " CTLS_INT32 " }\n");
    /* encodings: fp32 START, bool READY, int32 END with non-zero false, uint32 CORRID */
    write_model(
        "acc_enc",
        "backend: \"accumulator\" max_batch_size: 2\n" IO_CONTROLS
        "sequence_batching { control_input [\n" CTL("START", "CONTROL_SEQUENCE_START", "fp32_false_true: [ 0, 2.5 ]") ",\n" CTL(
            "READY", "CONTROL_SEQUENCE_READY",
            "bool_false_true: [ false, true ]") ",\n" CTL("END", "CONTROL_SEQUENCE_END",
                                                          "int32_false_true: [ "
                                                          "3, 9 ]") ",\n" CTL("C"
                                                                              "O"
                                                                              "R"
                                                                              "R"
                                                                              "I"
                                                                              "D",
                                                                              "C"
                                                                              "O"
                                                                              "N"
                                                                              "T"
                                                                              "R"
                                                                              "O"
                                                                              "L"
                                                                              "_"
                                                                              "S"
                                                                              "E"
                                                                              "Q"
                                                                              "U"
                                                                              "E"
                                                                              "N"
                                                                              "C"
                                                                              "E"
                                                                              "_"
                                                                              "C"
                                                                              "O"
                                                                              "R"
                                                                              "R"
                                                                              "I"
                                                                              "D",
                                                                              "d"
                                                                              "a"
                                                                              "t"
                                                                              "a"
                                                                              "_"
                                                                              "t"
                                                                              "y"
                                                                              "p"
                                                                              "e"
                                                                              ":"
                                                                              " "
                                                                              "T"
                                                                              "Y"
                                                                              "P"
                                                                              "E"
                                                                              "_"
                                                                              "U"
                                                                              "I"
                                                                              "N"
                                                                              "T"
                                                                              "3"
                                                                              "2") " ] }\n");
    /* non-batching model, INT64 CORRID */
    write_model("acc_nobatch",
                "backend: \"accumulator\" max_batch_size: 0\n" IO_CONTROLS
                "sequence_batching { control_input [\n" CTL(
                    "START", "CONTROL_SEQUENCE_START",
                    "int32_false_true: [ 0, 1 ]") ",\n" CTL("CORRID", "CONTROL_SEQUENCE_CORRID",
                                                            "data_type: TYPE_INT64") " ] }\n");
    /* string correlation ids, oldest, keyed by CORRID */
    write_model(
        "acc_str",
        "backend: \"accumulator\" max_batch_size: 4\n" IO_CONTROLS
        "parameters { key: \"key\" value { string_value: \"corrid\" } }\n"
        "sequence_batching { oldest { max_candidate_sequences: 4 }\n control_input [\n" CTL(
            "START", "CONTROL_SEQUENCE_START",
            "int32_false_true: [ 0, 1 ]") ",\n" CTL("END", "CONTROL_SEQUENCE_END",
                                                    "int32_false_true: [ 0, 1 ]") ",\n" CTL("CORRI"
                                                                                            "D",
                                                                                            "CONTRO"
                                                                                            "L_"
                                                                                            "SEQUEN"
                                                                                            "CE_"
                                                                                            "CORRI"
                                                                                            "D",
                                                                                            "data_"
                                                                                            "type: "
                                                                                            "TYPE_"
                                                                                            "STRIN"
                                                                                            "G") " "
                                                                                                 "]"
                                                                                                 " "
                                                                                                 "}"
                                                                                                 "\n");
    /* oldest: 2 candidates per instance, slow execute so requests pile up */
    write_model("acc_oldest",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_CONTROLS
                "parameters [ { key: \"key\" value { string_value: \"corrid\" } },\n"
                "  { key: \"execute_delay_ms\" value { string_value: \"5\" } } ]\n"
                "sequence_batching { oldest { max_candidate_sequences: 3 "
                "preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 2000 }\n" CTLS_INT32
                " }\n");
    /* 2 slots, for filler rows in statistics */
    write_model("acc_fill", "backend: \"accumulator\" max_batch_size: 2\n" IO_CONTROLS
                            "sequence_batching { direct { } " CTLS_INT32 " }\n");
    /* warmup through the sequence batcher */
    write_model("acc_warm", "backend: \"accumulator\" max_batch_size: 4\n" IO_CONTROLS
                            "sequence_batching { " CTLS_INT32 " }\n"
                            "model_warmup [ { name: \"w\" batch_size: 1 count: 2 inputs { key: "
                            "\"INPUT\" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true "
                            "} } } ]\n");
    /* stress: 2 instances x 8 slots (direct) */
    write_model("acc_stress", "backend: \"accumulator\" max_batch_size: 8\n" IO_CONTROLS
                              "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                              "sequence_batching { direct { } " CTLS_INT32 " }\n");
    write_model("acc_stress_oldest",
                "backend: \"accumulator\" max_batch_size: 8\n" IO_CONTROLS
                "parameters { key: \"key\" value { string_value: \"corrid\" } }\n"
                "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                "sequence_batching { oldest { max_candidate_sequences: 6 } " CTLS_INT32 " }\n");
    /* implicit state */
#define IO_STATE                                                                                   \
    "parameters { key: \"mode\" value { string_value: \"state\" } }\n"                             \
    "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"                            \
    "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] },\n"                           \
    "         { name: \"OUTPUT_STATE\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
    write_model("acc_state",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "sequence_batching { control_input [ " CTL(
                    "READY", "CONTROL_SEQUENCE_READY",
                    "int32_false_true: [ 0, 1 ]") " ]\n"
                                                  "state [ { input_name: \"INPUT_STATE\" "
                                                  "output_name: \"OUTPUT_STATE\" "
                                                  "data_type: TYPE_INT32 dims: [ -1 ]\n"
                                                  "  initial_state: { data_type: TYPE_INT32 dims: "
                                                  "[ 1 ] zero_data: true "
                                                  "name: \"zeros\" } } ] }\n");
    write_model("acc_state_file",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "sequence_batching { oldest { max_candidate_sequences: 4 }\n"
                "state [ { input_name: \"INPUT_STATE\" output_name: \"OUTPUT_STATE\" "
                "data_type: TYPE_INT32 dims: [ -1 ]\n"
                "  initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: \"init\" "
                "name: \"from file\" } } ] }\n");
    int32_t init = 100;
    write_bytes("acc_state_file/initial_state/init", &init, sizeof init);
    write_model("acc_state_grow",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "parameters { key: \"state_op\" value { string_value: \"append\" } }\n"
                "sequence_batching { control_input [ " CTL(
                    "READY", "CONTROL_SEQUENCE_READY",
                    "int32_false_true: [ 0, 1 ]") " ]\n"
                                                  "state [ { input_name: \"INPUT_STATE\" "
                                                  "output_name: \"OUTPUT_STATE\" "
                                                  "data_type: TYPE_INT32 dims: [ -1 ] } ] }\n");
    write_model("acc_state_slow",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "parameters [ { key: \"state_op\" value { string_value: \"append\" } },\n"
                "  { key: \"execute_delay_ms\" value { string_value: \"20\" } } ]\n"
                "sequence_batching { control_input [ " CTL(
                    "READY", "CONTROL_SEQUENCE_READY",
                    "int32_false_true: [ 0, 1 ]") " ]\n"
                                                  "state [ { input_name: \"INPUT_STATE\" "
                                                  "output_name: \"OUTPUT_STATE\" "
                                                  "data_type: TYPE_INT32 dims: [ -1 ] } ] }\n");
    /* an initial state file of the wrong size fails the load */
    write_model("acc_state_badfile",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "sequence_batching { state [ { input_name: \"INPUT_STATE\" "
                "output_name: \"OUTPUT_STATE\" data_type: TYPE_INT32 dims: [ -1 ]\n"
                "  initial_state: { data_type: TYPE_INT32 dims: [ 2 ] data_file: \"init\" "
                "name: \"short\" } } ] }\n");
    write_bytes("acc_state_badfile/initial_state/init", &init, sizeof init);
    write_model("acc_state_badtype",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "sequence_batching { state [ { input_name: \"INPUT_STATE\" "
                "output_name: \"OUTPUT_STATE\" data_type: TYPE_INT32 dims: [ -1 ]\n"
                "  initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true "
                "name: \"fp\" } } ] }\n");
    write_model("acc_state_baddims",
                "backend: \"accumulator\" max_batch_size: 4\n" IO_STATE
                "sequence_batching { state [ { input_name: \"INPUT_STATE\" "
                "output_name: \"OUTPUT_STATE\" data_type: TYPE_INT32 dims: [ 3 ]\n"
                "  initial_state: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true "
                "name: \"two\" } } ] }\n");
}

/* ---- Asynchronous calls ---- */

typedef struct call {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    nereid_response_t *resp;
    char err[600];
    int32_t value[2];
} call_t;

static void on_done(nereid_response_t *resp, void *userp)
{
    call_t *c = userp;
    pthread_mutex_lock(&c->lock);
    c->resp = resp;
    c->done = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

typedef struct seq_req {
    const char *model;
    uint64_t id;
    const char *sid;
    bool start, end;
    int32_t value;
    int64_t batch;       /* 0: one row */
    int64_t width;       /* 0: one element per row (at most 2 elements in all) */
    const char *outputs; /* comma-free list of up to 3 names separated by '|', or NULL */
} seq_req_t;

static call_t *submit(nereid_server_t *s, const seq_req_t *r)
{
    call_t *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->value[0] = c->value[1] = r->value;
    nereid_request_t *req;
    nereid_request_new(s, r->model, 0, &req);
    if (r->sid)
        nereid_request_set_correlation_id_string(req, r->sid);
    else
        nereid_request_set_correlation_id(req, r->id);
    nereid_request_set_sequence_flags(req, r->start, r->end);
    int64_t shape[2] = {r->batch ? r->batch : 1, r->width ? r->width : 1};
    bool nobatch = strcmp(r->model, "acc_nobatch") == 0;
    nereid_request_add_input(req, "INPUT", NEREID_TYPE_INT32, nobatch ? shape + 1 : shape,
                             nobatch ? 1 : 2, c->value, (size_t)(shape[0] * shape[1]) * 4);
    if (r->outputs) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", r->outputs);
        for (char *tok = strtok(buf, "|"); tok; tok = strtok(NULL, "|"))
            nereid_request_add_requested_output(req, tok, 0);
    }
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, on_done, c);
    if (err) {
        snprintf(c->err, sizeof c->err, "%s", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        c->done = true;
    }
    return c;
}

static void call_wait(call_t *c)
{
    pthread_mutex_lock(&c->lock);
    while (!c->done)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    if (c->resp && nereid_response_error(c->resp) && !c->err[0])
        snprintf(c->err, sizeof c->err, "%s", nereid_error_message(nereid_response_error(c->resp)));
}

static bool call_done(call_t *c)
{
    pthread_mutex_lock(&c->lock);
    bool d = c->done;
    pthread_mutex_unlock(&c->lock);
    return d;
}

/* The named output's data (NULL if absent), after call_wait. */
static const void *call_output(call_t *c, const char *name, const int64_t **shape, size_t *rank)
{
    if (!c->resp || nereid_response_error(c->resp)) return NULL;
    const void *data;
    return find_output(c->resp, name, NULL, shape, rank, &data, NULL) ? data : NULL;
}

/* OUTPUT[0], or INT32_MIN on error (message in c->err). */
static int32_t call_result(call_t *c)
{
    call_wait(c);
    const int32_t *o = call_output(c, "OUTPUT", NULL, NULL);
    return o ? o[0] : INT32_MIN;
}

static void call_free(call_t *c)
{
    if (c->resp) nereid_response_free(c->resp);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

/* Synchronous call returning OUTPUT[0]; err (may be NULL) gets the error text. */
static int32_t call(nereid_server_t *s, const seq_req_t *r, char *err, size_t err_len)
{
    call_t *c = submit(s, r);
    int32_t v = call_result(c);
    if (err) snprintf(err, err_len, "%s", c->err);
    call_free(c);
    return v;
}

/* ---- Tests ---- */

static void test_direct_interleaved(nereid_server_t *s)
{
    /* 4 sequences, one request at a time: each execution is slot rows 0..k with fillers */
    int32_t sum[4] = {0};
    for (int step = 0; step < 5; step++) {
        for (int q = 0; q < 4; q++) {
            int32_t v = (q + 1) * 100 + step;
            sum[q] += v;
            seq_req_t r = {.model = "acc_direct",
                           .id = 1000 + q,
                           .start = step == 0,
                           .end = step == 4,
                           .value = v};
            CHECK(call(s, &r, NULL, 0) == sum[q]);
        }
    }
    /* the same, all four sequences submitted together at every step */
    memset(sum, 0, sizeof sum);
    for (int step = 0; step < 5; step++) {
        call_t *c[4];
        for (int q = 0; q < 4; q++) {
            int32_t v = (q + 1) * 7 + step * 3;
            sum[q] += v;
            seq_req_t r = {.model = "acc_direct",
                           .id = 2000 + q,
                           .start = step == 0,
                           .end = step == 4,
                           .value = v};
            c[q] = submit(s, &r);
        }
        for (int q = 0; q < 4; q++) {
            CHECK(call_result(c[q]) == sum[q]);
            call_free(c[q]);
        }
    }
}

static void test_ready_and_fillers(nereid_server_t *s)
{
    /* A takes slot 0, B slot 1; B alone runs as rows [filler, B]. */
    seq_req_t a = {.model = "acc_direct", .id = 31, .start = true, .value = 5};
    seq_req_t b = {.model = "acc_direct",
                   .id = 32,
                   .start = true,
                   .value = 7,
                   .outputs = "OUTPUT|CONTROLS|BATCH"};
    CHECK(call(s, &a, NULL, 0) == 5);
    call_t *c = submit(s, &b);
    CHECK(call_result(c) == 7);
    const float *ctl = call_output(c, "CONTROLS", NULL, NULL);
    const int32_t *batch = call_output(c, "BATCH", NULL, NULL);
    CHECK(ctl && ctl[0] == 1 && ctl[1] == 0 && ctl[2] == 1 && ctl[3] == 32);
    CHECK(batch && batch[0] == 2);
    call_free(c);
    /* A's slot was not disturbed by the filler row */
    a.start = false;
    a.end = true;
    a.value = 1;
    CHECK(call(s, &a, NULL, 0) == 6);
    b.start = false;
    b.end = true;
    b.value = 3;
    c = submit(s, &b);
    CHECK(call_result(c) == 10);
    ctl = call_output(c, "CONTROLS", NULL, NULL);
    CHECK(ctl && ctl[0] == 0 && ctl[1] == 1 && ctl[2] == 1);
    call_free(c);
}

/* The model's batch_stats as "size:count,..." (ascending sizes), and its
 * execution and inference counts. */
static void batch_stats(nereid_server_t *s, const char *model, char *buf, size_t len, long *exec,
                        long *infer)
{
    json_t *st = model_stats_json(s, model, 0);
    size_t n = 0, i;
    buf[0] = 0;
    json_t *b;
    json_array_foreach(json_object_get(st, "batch_stats"), i, b)
    {
        n += (size_t)snprintf(buf + n, len - n, "%s%lld:%lld", n ? "," : "",
                              (long long)json_integer_value(json_object_get(b, "batch_size")),
                              (long long)json_integer_value(
                                  json_object_get(json_object_get(b, "compute_infer"), "count")));
        if (n >= len) break;
    }
    *exec = (long)json_integer_value(json_object_get(st, "execution_count"));
    *infer = (long)json_integer_value(json_object_get(st, "inference_count"));
    json_decref(st);
}

/* Filler rows count in the execution's batch size (Triton's backends report
 * the whole batch), not in inference_count. */
static void test_fillers_in_statistics(nereid_server_t *s)
{
    seq_req_t x = {.model = "acc_fill", .id = 41, .start = true, .value = 1};
    seq_req_t y = {.model = "acc_fill", .id = 42, .start = true, .value = 2};
    CHECK(call(s, &x, NULL, 0) == 1); /* slot 0: rows [x] */
    CHECK(call(s, &y, NULL, 0) == 2); /* slot 1: rows [filler, y] */
    char stats[128];
    long exec, infer;
    batch_stats(s, "acc_fill", stats, sizeof stats, &exec, &infer);
    CHECK_STR(stats, "1:1,2:1");
    CHECK(exec == 2);
    CHECK(infer == 2);
    x.start = false;
    x.end = true;
    y.start = false;
    y.end = true;
    CHECK(call(s, &x, NULL, 0) == 2);
    CHECK(call(s, &y, NULL, 0) == 4);
}

static void test_encodings(nereid_server_t *s)
{
    uint64_t id = 0x100000005ull; /* UINT32 CORRID keeps the low 32 bits */
    seq_req_t r = {
        .model = "acc_enc", .id = id, .start = true, .value = 4, .outputs = "OUTPUT|CONTROLS"};
    call_t *c = submit(s, &r);
    CHECK(call_result(c) == 4);
    const float *ctl = call_output(c, "CONTROLS", NULL, NULL);
    CHECK(ctl && ctl[0] == 2.5f && ctl[1] == 3 && ctl[2] == 1 && ctl[3] == 5);
    call_free(c);
    r.start = false;
    r.end = true;
    r.value = 6;
    c = submit(s, &r);
    CHECK(call_result(c) == 10);
    ctl = call_output(c, "CONTROLS", NULL, NULL);
    CHECK(ctl && ctl[0] == 0 && ctl[1] == 9 && ctl[2] == 1 && ctl[3] == 5);
    call_free(c);
    /* non-batching model: controls have shape [1]; INT64 CORRID */
    seq_req_t n = {
        .model = "acc_nobatch", .id = 77, .start = true, .value = 2, .outputs = "OUTPUT|CONTROLS"};
    c = submit(s, &n);
    CHECK(call_result(c) == 2);
    ctl = call_output(c, "CONTROLS", NULL, NULL);
    CHECK(ctl && ctl[0] == 1 && ctl[3] == 77);
    call_free(c);
    n.start = false;
    n.end = true;
    n.outputs = NULL;
    CHECK(call(s, &n, NULL, 0) == 4);
}

static void test_string_ids(nereid_server_t *s)
{
    const char *ids[3] = {"alpha", "beta", "gamma-with-a-longer-name"};
    int32_t sum[3] = {0};
    for (int step = 0; step < 4; step++) {
        call_t *c[3];
        for (int q = 0; q < 3; q++) {
            int32_t v = (q + 1) * 11 + step;
            sum[q] += v;
            seq_req_t r = {.model = "acc_str",
                           .sid = ids[q],
                           .start = step == 0,
                           .end = step == 3,
                           .value = v};
            c[q] = submit(s, &r);
        }
        for (int q = 0; q < 3; q++) {
            CHECK(call_result(c[q]) == sum[q]);
            call_free(c[q]);
        }
    }
    char err[600];
    seq_req_t r = {.model = "acc_str", .id = 5, .start = true, .value = 1};
    CHECK(call(s, &r, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "[request id: <id_unknown>] sequence batching control 'CORRID' "
                            "data-type is 'UINT64', but model 'acc_str' expects 'BYTES'");
    seq_req_t u = {.model = "acc_direct", .sid = "abc", .start = true, .value = 1};
    CHECK(call(s, &u, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "sequence batching control 'CORRID' data-type is 'BYTES', but model "
                            "'acc_direct' expects 'UINT64'");
    seq_req_t e = {.model = "acc_str", .sid = "", .start = true, .value = 1};
    CHECK(call(s, &e, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request to model 'acc_str' must specify a non-zero or "
                            "non-empty correlation ID");
    seq_req_t nostart = {.model = "acc_str", .sid = "delta", .value = 1};
    CHECK(call(s, &nostart, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request for sequence delta to model 'acc_str' must "
                            "specify the START flag on the first request of the sequence");
}

static void test_errors(nereid_server_t *s)
{
    char err[600];
    seq_req_t r = {.model = "acc_direct", .id = 0, .start = true, .value = 1};
    CHECK(call(s, &r, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request to model 'acc_direct' must specify a non-zero or "
                            "non-empty correlation ID");
    r.id = 4242;
    r.start = false;
    CHECK(call(s, &r, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request for sequence 4242 to model 'acc_direct' must "
                            "specify the START flag on the first request of the sequence");
    r.start = true;
    r.batch = 2;
    CHECK(call(s, &r, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request to model 'acc_direct' must specify batch-size 1 "
                            "due to requirements of sequence batcher");
    /* after END the sequence is gone */
    r.batch = 0;
    r.end = true;
    CHECK(call(s, &r, NULL, 0) == 1);
    r.start = false;
    r.end = false;
    CHECK(call(s, &r, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "must specify the START flag on the first request of the sequence");
    /* START on a running sequence restarts it in the same slot */
    seq_req_t a = {.model = "acc_direct", .id = 51, .start = true, .value = 10};
    CHECK(call(s, &a, NULL, 0) == 10);
    a.start = false;
    CHECK(call(s, &a, NULL, 0) == 20);
    a.start = true;
    a.value = 3;
    CHECK(call(s, &a, NULL, 0) == 3);
    a.start = false;
    a.end = true;
    CHECK(call(s, &a, NULL, 0) == 6);
}

static void test_backlog(nereid_server_t *s)
{
    /* one slot: B waits in the backlog until A ends, then takes the slot */
    seq_req_t a = {.model = "acc_one", .id = 61, .start = true, .value = 1};
    CHECK(call(s, &a, NULL, 0) == 1);
    seq_req_t b = {.model = "acc_one", .id = 62, .start = true, .value = 50};
    call_t *cb = submit(s, &b);
    seq_req_t b2 = b;
    b2.start = false;
    b2.value = 5;
    call_t *cb2 = submit(s, &b2); /* backlogged sequences queue further requests */
    a.start = false;
    a.value = 2;
    CHECK(call(s, &a, NULL, 0) == 3);
    CHECK(!call_done(cb) && !call_done(cb2));
    a.end = true;
    a.value = 3;
    CHECK(call(s, &a, NULL, 0) == 6);
    CHECK(call_result(cb) == 50);
    CHECK(call_result(cb2) == 55);
    call_free(cb);
    call_free(cb2);
    /* a third sequence now waits for B */
    seq_req_t c = {.model = "acc_one", .id = 63, .start = true, .end = true, .value = 9};
    call_t *cc = submit(s, &c);
    b.start = false;
    b.end = true;
    b.value = 1;
    CHECK(call(s, &b, NULL, 0) == 56);
    CHECK(call_result(cc) == 9);
    call_free(cc);
}

static void test_backlog_timeout(nereid_server_t *s)
{
    /* a backlogged sequence whose request timeout expires is rejected */
    seq_req_t a = {.model = "acc_one", .id = 81, .start = true, .value = 2};
    CHECK(call(s, &a, NULL, 0) == 2);
    nereid_request_t *req;
    nereid_request_new(s, "acc_one", 0, &req);
    nereid_request_set_correlation_id(req, 82);
    nereid_request_set_sequence_flags(req, true, false);
    nereid_request_set_timeout_us(req, 50000);
    int32_t v = 1;
    int64_t shape[2] = {1, 1};
    nereid_request_add_input(req, "INPUT", NEREID_TYPE_INT32, shape, 2, &v, 4);
    call_t *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, on_done, c);
    CHECK(err == NULL);
    call_wait(c);
    CHECK_STR_CONTAINS(c->err, "timeout of the corresponding sequence has been expired");
    call_free(c);
    char msg[600];
    seq_req_t b = {.model = "acc_one", .id = 82, .value = 1};
    CHECK(call(s, &b, msg, sizeof msg) == INT32_MIN);
    CHECK_STR_CONTAINS(msg, "must specify the START flag");
    a.start = false;
    a.end = true;
    CHECK(call(s, &a, NULL, 0) == 4);
}

static void test_idle_timeout(nereid_server_t *s)
{
    /* A holds the only slot and goes idle; 200 ms after its last request
     * arrived it is aborted and B (backlogged) gets the slot; A's next
     * request is then unknown */
    seq_req_t a = {.model = "acc_idle", .id = 71, .start = true, .value = 4};
    CHECK(call(s, &a, NULL, 0) == 4);
    seq_req_t b = {.model = "acc_idle", .id = 72, .start = true, .value = 8};
    CHECK(call(s, &b, NULL, 0) == 8);
    char err[600];
    a.start = false;
    CHECK(call(s, &a, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request for sequence 71 to model 'acc_idle' must specify "
                            "the START flag");
    /* As in Triton, idle time counts from a request's arrival: B's only
     * request arrived 200 ms before B got the slot, so B is ended as soon as
     * the reaper sees it there (Triton's reaper does the same). */
    usleep(300000);
    b.start = false;
    b.end = true;
    b.value = 2;
    CHECK(call(s, &b, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request for sequence 72 to model 'acc_idle' must specify "
                            "the START flag");
    /* a live sequence is not ended while its requests keep arriving */
    seq_req_t c = {.model = "acc_idle", .id = 73, .start = true, .value = 1};
    CHECK(call(s, &c, NULL, 0) == 1);
    c.start = false;
    CHECK(call(s, &c, NULL, 0) == 2);
    c.end = true;
    CHECK(call(s, &c, NULL, 0) == 3);
}

static void test_oldest(nereid_server_t *s)
{
    /* 6 sequences of 4 requests, all submitted at once: 3 candidates, the
     * rest backlogged; the backend fails a batch holding one sequence twice */
    enum { NS = 6, NR = 4 };
    call_t *c[NS][NR];
    int32_t sum[NS][NR];
    for (int q = 0; q < NS; q++) {
        int32_t acc = 0;
        for (int k = 0; k < NR; k++) {
            int32_t v = q * 10 + k + 1;
            acc += v;
            sum[q][k] = acc;
            seq_req_t r = {.model = "acc_oldest",
                           .id = 300 + q,
                           .start = k == 0,
                           .end = k == NR - 1,
                           .value = v,
                           .outputs = "OUTPUT|BATCH"};
            c[q][k] = submit(s, &r);
        }
    }
    int max_batch = 0;
    for (int q = 0; q < NS; q++)
        for (int k = 0; k < NR; k++) {
            CHECK(call_result(c[q][k]) == sum[q][k]);
            if (c[q][k]->err[0]) fprintf(stderr, "oldest: %s\n", c[q][k]->err);
            const int32_t *b = call_output(c[q][k], "BATCH", NULL, NULL);
            if (b && b[0] > max_batch) max_batch = b[0];
            call_free(c[q][k]);
        }
    CHECK(max_batch > 1 && max_batch <= 3);
}

static void test_state(nereid_server_t *s)
{
    /* zero_data initial state; two interleaved sequences; state requested */
    int32_t sum[2] = {0};
    for (int step = 0; step < 4; step++) {
        call_t *c[2];
        for (int q = 0; q < 2; q++) {
            int32_t v = (q + 1) * 5 + step;
            sum[q] += v;
            seq_req_t r = {.model = "acc_state",
                           .id = 400 + q,
                           .start = step == 0,
                           .end = step == 3,
                           .value = v,
                           .outputs = q == 0 ? "OUTPUT|OUTPUT_STATE" : "OUTPUT"};
            c[q] = submit(s, &r);
        }
        for (int q = 0; q < 2; q++) {
            CHECK(call_result(c[q]) == sum[q]);
            const int32_t *st = call_output(c[q], "OUTPUT_STATE", NULL, NULL);
            if (q == 0)
                CHECK(st && st[0] == sum[q]);
            else
                CHECK(st == NULL && c[q]->resp && nereid_response_output_count(c[q]->resp) == 1);
            call_free(c[q]);
        }
    }
    /* data_file initial state (100) */
    seq_req_t f = {.model = "acc_state_file", .id = 9, .start = true, .value = 1};
    CHECK(call(s, &f, NULL, 0) == 101);
    f.start = false;
    f.value = 2;
    CHECK(call(s, &f, NULL, 0) == 103);
    f.start = true; /* restart: back to the initial state */
    f.value = 5;
    CHECK(call(s, &f, NULL, 0) == 105);
    f.start = false;
    f.end = true;
    CHECK(call(s, &f, NULL, 0) == 110);
    /* variable dims: the state starts as [1] (one zero) and grows by one per request */
    seq_req_t g = {.model = "acc_state_grow",
                   .id = 11,
                   .start = true,
                   .value = 3,
                   .outputs = "OUTPUT|OUTPUT_STATE"};
    int32_t total = 0;
    for (int k = 0; k < 4; k++) {
        g.start = k == 0;
        g.end = k == 3;
        g.value = 3 + k;
        total += g.value;
        call_t *c = submit(s, &g);
        CHECK(call_result(c) == total);
        const int64_t *shape = NULL;
        size_t rank = 0;
        const int32_t *st = call_output(c, "OUTPUT_STATE", &shape, &rank);
        CHECK(st && rank == 2 && shape[0] == 1 && shape[1] == k + 2);
        if (st) CHECK(st[0] == 0 && st[k + 1] == g.value);
        call_free(c);
    }
}

static void test_state_mixed_shapes(nereid_server_t *s)
{
    /* Growing states of different lengths are never gathered into one batch
     * tensor (the backend fails such a batch). Each step a blocker sequence
     * keeps the instance busy for 20 ms while the two others queue up. */
    int32_t total[3] = {0, 1, 0};
    /* sequence 21 starts one step earlier, so its state is longer */
    seq_req_t pre = {.model = "acc_state_slow", .id = 21, .start = true, .value = 1};
    CHECK(call(s, &pre, NULL, 0) == 1);
    for (int k = 0; k < 4; k++) {
        call_t *c[3];
        for (int q = 0; q < 3; q++) {
            int id = q == 0 ? 23 : 20 + q; /* blocker first */
            int32_t v = 10 * (q + 1) + k;
            seq_req_t r = {.model = "acc_state_slow",
                           .id = (uint64_t)id,
                           .start = k == 0 && q != 1,
                           .end = k == 3,
                           .value = v};
            total[q] += v;
            c[q] = submit(s, &r);
        }
        for (int q = 0; q < 3; q++) {
            CHECK(call_result(c[q]) == total[q]);
            if (c[q]->err[0]) fprintf(stderr, "mixed: %s\n", c[q]->err);
            call_free(c[q]);
        }
    }
}

/* 64 sequences of random length (1..8) submitted at once over 2 instances. */
static void stress(nereid_server_t *s, const char *model)
{
    enum { NS = 64, MAXLEN = 8 };
    static call_t *c[NS][MAXLEN];
    static int32_t want[NS][MAXLEN];
    int len[NS];
    unsigned seed = 12345;
    for (int q = 0; q < NS; q++) {
        seed = seed * 1103515245u + 12345u;
        len[q] = 1 + (int)((seed >> 16) % MAXLEN);
    }
    /* interleave submissions: step k of every sequence, then step k+1 */
    int32_t acc[NS] = {0};
    for (int k = 0; k < MAXLEN; k++)
        for (int q = 0; q < NS; q++) {
            if (k >= len[q]) continue;
            seed = seed * 1103515245u + 12345u;
            int32_t v = (int32_t)((seed >> 16) % 1000);
            acc[q] += v;
            want[q][k] = acc[q];
            seq_req_t r = {.model = model,
                           .id = 5000 + q,
                           .start = k == 0,
                           .end = k == len[q] - 1,
                           .value = v};
            c[q][k] = submit(s, &r);
        }
    int bad = 0;
    for (int q = 0; q < NS; q++)
        for (int k = 0; k < len[q]; k++) {
            if (call_result(c[q][k]) != want[q][k]) {
                if (!bad++)
                    fprintf(stderr, "%s: sequence %d step %d: got %d want %d (%s)\n", model, q, k,
                            call_result(c[q][k]), want[q][k], c[q][k]->err);
            }
            call_free(c[q][k]);
        }
    CHECK(bad == 0);
}

/* Triton's scheduler test hooks, by Triton's names: the instance holds its
 * first batch until 6 requests are queued in its slots and 2 in the backlog.
 * A (id 10) takes slot 0, B (id 20) slot 1; after B's END is queued, a START
 * with id 20 is a new sequence C (as in Triton), backlogged since both slots
 * are taken, and it takes slot 0 when A ends: every execution has 2 rows. */
/* Starts a server on a one-model repository with Triton's scheduler test
 * hooks set (TRITONSERVER_DELAY_SCHEDULER, TRITONSERVER_BACKLOG_DELAY_SCHEDULER). */
static nereid_server_t *start_held(const char *model, const char *config, const char *delay,
                                   const char *backlog)
{
    make_repo_dir("sequence_hooks");
    write_model(model, config);
    setenv("TRITONSERVER_DELAY_SCHEDULER", delay, 1);
    setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", backlog, 1);
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, false, &err);
    unsetenv("TRITONSERVER_DELAY_SCHEDULER");
    unsetenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER");
    CHECK(s != NULL);
    nereid_error_free(err);
    if (!s) remove_repo();
    return s;
}

static void test_hooks_and_reused_id(void)
{
    nereid_server_t *s = start_held("acc_hold",
                                    "backend: \"accumulator\" max_batch_size: 2\n" IO_CONTROLS
                                    "sequence_batching { direct { } " CTLS_INT32 " }\n",
                                    "6", "2");
    if (!s) return;
    seq_req_t reqs[] = {
        {.model = "acc_hold", .id = 10, .start = true, .value = 1},
        {.model = "acc_hold", .id = 10, .end = true, .value = 2},
        {.model = "acc_hold", .id = 20, .start = true, .value = 10},
        {.model = "acc_hold", .id = 20, .value = 20},
        {.model = "acc_hold", .id = 20, .value = 30},
        {.model = "acc_hold", .id = 20, .end = true, .value = 40},
        {.model = "acc_hold", .id = 20, .start = true, .value = 100},
        {.model = "acc_hold", .id = 20, .end = true, .value = 200},
    };
    int32_t want[] = {1, 3, 10, 30, 60, 100, 100, 300};
    call_t *c[8];
    for (int i = 0; i < 6; i++)
        c[i] = submit(s, &reqs[i]);
    /* 6 queued, nothing backlogged: still held (a released hold would run
     * now; the correct code cannot fail here) */
    usleep(100000);
    for (int i = 0; i < 6; i++)
        CHECK(!call_done(c[i]));
    for (int i = 6; i < 8; i++)
        c[i] = submit(s, &reqs[i]);
    for (int i = 0; i < 8; i++) {
        CHECK(call_result(c[i]) == want[i]);
        call_free(c[i]);
    }
    char stats[128];
    long exec, infer;
    batch_stats(s, "acc_hold", stats, sizeof stats, &exec, &infer);
    CHECK_STR(stats, "2:4");
    CHECK(exec == 4);
    CHECK(infer == 8);
    nereid_server_free(s);
    remove_repo();
}

/* A request whose shapes differ from the batch's first one waits for a
 * later batch, but as in Triton the batch still spans its slot (a filler
 * row stands in): A (slot 0, 2 elements) runs as [A, filler], then B
 * (slot 1, 1 element) as [filler, B]. */
static void test_unbatchable_slot_spanned(void)
{
    nereid_server_t *s =
        start_held("acc_var",
                   "backend: \"accumulator\" max_batch_size: 2\n"
                   "parameters [ { key: \"mode\" value { string_value: \"state\" } },\n"
                   "  { key: \"state_op\" value { string_value: \"append\" } } ]\n"
                   "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
                   "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ -1 ] },\n"
                   "         { name: \"OUTPUT_STATE\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
                   "sequence_batching { direct { } control_input [ " CTL(
                       "READY", "CONTROL_SEQUENCE_READY",
                       "int32_false_true: [ 0, 1 ]") " ]\n"
                                                     "state [ { input_name: \"INPUT_STATE\" "
                                                     "output_name: \"OUTPUT_STATE\" "
                                                     "data_type: TYPE_INT32 dims: [ -1 ] } ] }\n",
                   "2", "0");
    if (!s) return;
    seq_req_t a = {.model = "acc_var", .id = 1, .start = true, .end = true, .value = 3, .width = 2};
    seq_req_t b = {.model = "acc_var", .id = 2, .start = true, .end = true, .value = 5};
    call_t *ca = submit(s, &a);
    call_t *cb = submit(s, &b);
    CHECK(call_result(ca) == 6);
    CHECK(call_result(cb) == 5);
    call_free(ca);
    call_free(cb);
    char stats[128];
    long exec, infer;
    batch_stats(s, "acc_var", stats, sizeof stats, &exec, &infer);
    CHECK_STR(stats, "2:2");
    CHECK(exec == 2);
    CHECK(infer == 2);
    nereid_server_free(s);
    remove_repo();
}

/* Oldest: Triton's dynamic batcher rule under it sends a batch as soon as
 * it has a preferred size (here 1), without waiting for the largest (3) or
 * the queue delay. */
static void test_oldest_smaller_preferred(void)
{
    nereid_server_t *s = start_held(
        "acc_pref",
        "backend: \"accumulator\" max_batch_size: 4\n" IO_CONTROLS
        "parameters { key: \"key\" value { string_value: \"corrid\" } }\n"
        "sequence_batching { oldest { max_candidate_sequences: 3 "
        "preferred_batch_size: [ 1, 3 ] max_queue_delay_microseconds: 20000000 }\n" CTLS_INT32
        " }\n",
        "2", "0");
    if (!s) return;
    seq_req_t a = {.model = "acc_pref", .id = 1, .start = true, .end = true, .value = 3};
    seq_req_t b = {.model = "acc_pref", .id = 2, .start = true, .end = true, .value = 5};
    call_t *ca = submit(s, &a);
    call_t *cb = submit(s, &b);
    CHECK(call_result(ca) == 3);
    CHECK(call_result(cb) == 5);
    call_free(ca);
    call_free(cb);
    char stats[128];
    long exec, infer;
    batch_stats(s, "acc_pref", stats, sizeof stats, &exec, &infer);
    CHECK_STR(stats, "1:2");
    nereid_server_free(s);
    remove_repo();
}

/* Idle time counts from a request's arrival, as in Triton: A's request is
 * held (test hook) longer than max_sequence_idle_microseconds, so the reaper
 * ends A while the request waits; the request still runs, and A's next
 * request is refused. */
static void test_idle_from_arrival(void)
{
    nereid_server_t *s = start_held(
        "acc_arrival",
        "backend: \"accumulator\" max_batch_size: 2\n" IO_CONTROLS
        "sequence_batching { max_sequence_idle_microseconds: 200000 direct { } " CTLS_INT32 " }\n",
        "2", "0");
    if (!s) return;
    seq_req_t a = {.model = "acc_arrival", .id = 1, .start = true, .value = 3};
    seq_req_t b = {.model = "acc_arrival", .id = 2, .start = true, .value = 5};
    call_t *ca = submit(s, &a);
    usleep(400000); /* A waits, held, past its idle time */
    call_t *cb = submit(s, &b);
    CHECK(call_result(ca) == 3);
    CHECK(call_result(cb) == 5);
    call_free(ca);
    call_free(cb);
    char err[600];
    a.start = false;
    a.end = true;
    CHECK(call(s, &a, err, sizeof err) == INT32_MIN);
    CHECK_STR_CONTAINS(err, "inference request for sequence 1 to model 'acc_arrival' must "
                            "specify the START flag");
    nereid_server_free(s);
    remove_repo();
}

int main(void)
{
    make_repo();
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, false, &err);
    CHECK(s != NULL);
    nereid_error_free(err);
    if (!s) return check_summary();
    bool ready = false;
    CHECK(nereid_server_model_is_ready(s, "acc_direct", 0, &ready) == NULL && ready);
    ready = false;
    CHECK(nereid_server_model_is_ready(s, "acc_warm", 0, &ready) == NULL && ready);
    char *json = NULL;
    CHECK(nereid_server_repository_index(s, false, &json) == NULL);
    CHECK_STR_CONTAINS(json, "initial_state setting expects 8 bytes, but the data provided from "
                             "initonly has 4 bytes.");
    /* (config validation rejects these before the scheduler sees them) */
    CHECK_STR_CONTAINS(json, "\"name\":\"acc_state_badtype\",\"state\":\"UNAVAILABLE\"");
    CHECK_STR_CONTAINS(json, "\"name\":\"acc_state_baddims\",\"state\":\"UNAVAILABLE\"");
    free(json);
    test_direct_interleaved(s);
    test_ready_and_fillers(s);
    test_fillers_in_statistics(s);
    test_encodings(s);
    test_string_ids(s);
    test_errors(s);
    test_backlog(s);
    test_backlog_timeout(s);
    test_idle_timeout(s);
    test_oldest(s);
    test_state(s);
    test_state_mixed_shapes(s);
    stress(s, "acc_stress");
    stress(s, "acc_stress_oldest");
    /* shutdown with a live sequence holding state, and one in the backlog:
     * the backlogged request fails, state is freed (LSan checks) */
    seq_req_t live = {.model = "acc_state", .id = 990, .start = true, .value = 1};
    CHECK(call(s, &live, NULL, 0) == 1);
    seq_req_t a = {.model = "acc_one", .id = 991, .start = true, .value = 1};
    CHECK(call(s, &a, NULL, 0) == 1);
    seq_req_t b = {.model = "acc_one", .id = 992, .start = true, .value = 1};
    call_t *cb = submit(s, &b);
    nereid_server_stop(s);
    call_wait(cb);
    CHECK_STR_CONTAINS(cb->err, "Server is stopping, scheduler for model has stopped accepting "
                                "new inference requests");
    call_free(cb);
    nereid_server_free(s);
    remove_repo();
    test_hooks_and_reused_id();
    test_unbatchable_slot_spanned();
    test_oldest_smaller_preferred();
    test_idle_from_arrival();
    return check_summary();
}
