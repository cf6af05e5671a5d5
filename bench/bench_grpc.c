/*
 * This file contains the gRPC frontend benchmark: a small load client on the
 * gRPC core C API that keeps 1 or 64 unary calls in flight on one channel
 * and measures completed calls per second for ServerLive (the transport
 * floor), ModelInfer on identity_fp32 with FP32[1], and ModelInfer on
 * add_sub_onnx with two FP32[1,16] inputs. It prints each rate and its ratio
 * to ServerLive at the same concurrency.
 *
 *   build/bench/bench_grpc [seconds per round] [host:port]
 *
 * Without host:port it starts Nereid in-process on examples/models (run from
 * the repository root after `make models`) with the gRPC frontend on a free
 * loopback port and 2 completion-queue threads.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/grpc_server.h"
#include "grpc_service.pb-c.h"
#include "../tests/unit/test_util.h"

typedef struct call_slot {
    grpc_call *call;
    grpc_metadata_array initial_md, trailing_md;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
} call_slot_t;

typedef struct bench_case {
    const char *label;
    const char *method;
    grpc_slice body;
} bench_case_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static grpc_slice packed(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    return s;
}

/* A ModelInferRequest with n_inputs FP32 inputs INPUT<i> of the given shape. */
static grpc_slice infer_body(const char *model, int n_inputs, const int64_t *shape, size_t rank)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor inputs[2], *ptrs[2];
    ProtobufCBinaryData raw[2];
    static float data[2][16];
    char names[2][8];
    size_t elems = 1;
    for (size_t d = 0; d < rank; d++)
        elems *= (size_t)shape[d];
    for (int i = 0; i < n_inputs; i++) {
        Inference__ModelInferRequest__InferInputTensor init =
            INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
        inputs[i] = init;
        snprintf(names[i], sizeof(names[i]), "INPUT%d", i);
        inputs[i].name = names[i];
        inputs[i].datatype = "FP32";
        inputs[i].shape = (int64_t *)shape;
        inputs[i].n_shape = rank;
        ptrs[i] = &inputs[i];
        for (size_t k = 0; k < elems; k++)
            data[i][k] = (float)k;
        raw[i].data = (uint8_t *)data[i];
        raw[i].len = elems * sizeof(float);
    }
    req.model_name = (char *)model;
    req.n_inputs = (size_t)n_inputs;
    req.inputs = ptrs;
    req.n_raw_input_contents = (size_t)n_inputs;
    req.raw_input_contents = raw;
    return packed(&req.base);
}

static bool start_call(grpc_channel *ch, grpc_completion_queue *cq, const bench_case_t *bc,
                       grpc_slice method, call_slot_t *s)
{
    memset(s, 0, sizeof(*s));
    s->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->send = grpc_raw_byte_buffer_create((grpc_slice *)&bc->body, 1);
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->details;
    return grpc_call_start_batch(s->call, ops, 6, s, NULL) == GRPC_CALL_OK;
}

static void end_call(call_slot_t *s)
{
    grpc_call_unref(s->call);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_byte_buffer_destroy(s->send);
    if (s->recv != NULL) grpc_byte_buffer_destroy(s->recv);
    grpc_slice_unref(s->details);
}

/* Completed calls per second with `window` calls in flight; -1 on error. */
static double run_case(grpc_channel *ch, const bench_case_t *bc, int window, double seconds)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice method = grpc_slice_from_static_string(bc->method);
    call_slot_t *slots = calloc((size_t)window, sizeof(*slots));
    long done = 0, counted = 0, failed = 0;
    int in_flight = 0;
    double t0 = now_s(), warm_end = t0 + 0.3, end = warm_end + seconds, t_start = 0;
    for (int i = 0; i < window; i++)
        if (start_call(ch, cq, bc, method, &slots[i])) in_flight++;
    bool stopping = false;
    while (in_flight > 0) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) break;
        call_slot_t *s = ev.tag;
        in_flight--;
        if (!ev.success || s->status != GRPC_STATUS_OK) {
            if (failed++ == 0) {
                char *msg = grpc_slice_to_c_string(s->details);
                fprintf(stderr, "bench_grpc: %s failed: status %d %s\n", bc->label, s->status, msg);
                gpr_free(msg);
            }
        }
        end_call(s);
        done++;
        double t = now_s();
        if (t >= warm_end && t_start == 0) {
            t_start = t;
            counted = done;
        }
        if (t >= end) stopping = true;
        if (!stopping && start_call(ch, cq, bc, method, s)) in_flight++;
    }
    double elapsed = now_s() - t_start;
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    free(slots);
    if (failed > 0 || t_start == 0) return -1;
    return (double)(done - counted) / elapsed;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const char *target = argc > 2 ? argv[2] : NULL;
    nereid_server_t *server = NULL;
    nereid_tracer_t *tracer = NULL;
    grpc_frontend_t *fe = NULL;
    char addr[128];
    if (seconds <= 0) seconds = 3.0;

    grpc_init();
    if (target == NULL) {
        nereid_server_options_t opts;
        repo_options_for(&opts, "examples/models");
        opts.exit_on_error = false;
        nereid_error_t *err = nereid_server_new(&opts, &server);
        /* As the binary runs: a tracer with tracing off (Triton's default). */
        if (err == NULL && (err = nereid_tracer_new(NULL, NULL, 0, &tracer)) == NULL)
            nereid_server_set_tracer(server, tracer);
        grpc_options_t gopts;
        grpc_options_init(&gopts);
        gopts.address = "127.0.0.1", gopts.port = 0, gopts.infer_thread_count = 2;
        if (err == NULL) err = grpc_frontend_start(server, &gopts, &fe);
        if (err != NULL) {
            fprintf(stderr, "bench_grpc: %s\n", nereid_error_message(err));
            nereid_error_free(err);
            nereid_server_free(server);
            grpc_shutdown();
            return 1;
        }
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", grpc_frontend_port(fe));
        target = addr;
    }

    grpc_arg args[2];
    memset(args, 0, sizeof(args));
    args[0].type = args[1].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[0].value.integer = args[1].value.integer = -1;
    grpc_channel_args chargs = {2, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &chargs);
    grpc_channel_credentials_release(creds);

    Inference__ServerLiveRequest live = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    const int64_t shape1[] = {1, 1}, shape16[] = {1, 16};
    bench_case_t cases[] = {
        {"ServerLive", "/inference.GRPCInferenceService/ServerLive", packed(&live.base)},
        {"ModelInfer identity_fp32 FP32[1,1]", "/inference.GRPCInferenceService/ModelInfer",
         infer_body("identity_fp32", 1, shape1, 2)},
        {"ModelInfer add_sub_onnx FP32[1,16]x2", "/inference.GRPCInferenceService/ModelInfer",
         infer_body("add_sub_onnx", 2, shape16, 2)},
    };
    enum { N_CASES = sizeof(cases) / sizeof(cases[0]), ROUNDS = 3 };
    const int windows[] = {1, 64};
    int rc = 0;
    printf("gRPC unary calls/s against %s (median of %d rounds of %.1f s per case, cases "
           "interleaved, one client thread)\n",
           target, ROUNDS, seconds);
    for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++) {
        double rates[N_CASES][ROUNDS];
        for (int r = 0; r < ROUNDS; r++)
            for (size_t c = 0; c < N_CASES; c++)
                rates[c][r] = run_case(ch, &cases[c], windows[w], seconds);
        double floor_rate = 0;
        for (size_t c = 0; c < N_CASES; c++) {
            qsort(rates[c], ROUNDS, sizeof(double), cmp_double);
            double rate = rates[c][ROUNDS / 2];
            if (rates[c][0] < 0) {
                printf("  in flight %2d  %-38s  failed\n", windows[w], cases[c].label);
                rc = 1;
                continue;
            }
            if (c == 0) floor_rate = rate;
            printf("  in flight %2d  %-38s %9.0f/s  %5.1f%% of ServerLive\n", windows[w],
                   cases[c].label, rate, floor_rate > 0 ? 100.0 * rate / floor_rate : 0.0);
        }
    }
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        grpc_slice_unref(cases[c].body);
    grpc_channel_destroy(ch);
    grpc_frontend_stop(fe);
    nereid_server_free(server);
    nereid_tracer_free(tracer);
    grpc_shutdown();
    return rc;
}
