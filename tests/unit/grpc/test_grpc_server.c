/*
 * This file contains unit tests of the gRPC frontend's lifecycle through a
 * gRPC core client in the same process: start on port 0, ServerLive and
 * ModelInfer round trips, an unknown method answered UNIMPLEMENTED, a port
 * clash failing start-up, and repeated start/stop (leak-checked under ASan).
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "check.h"
#include "grpc/grpc_server.h"
#include "grpc_service.pb-c.h"
#include "test_util.h"

static void make_repo(void)
{
    make_repo_dir("grpc");
    write_model("id", "backend: \"identity\" max_batch_size: 0\n"
                      "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                      "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n");
}

/* One unary call; returns the status and fills *reply (caller frees). */
static grpc_status_code call(grpc_channel *ch, const char *method, const ProtobufCMessage *msg,
                             grpc_byte_buffer **reply)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(10, GPR_TIMESPAN));
    grpc_call *c =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL, deadline, NULL);
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice body = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(body));
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details;
    *reply = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = reply;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    CHECK(grpc_call_start_batch(c, ops, 6, (void *)1, NULL) == GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    CHECK(ev.type == GRPC_OP_COMPLETE && ev.success);
    grpc_slice_unref(details);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(c);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return status;
}

static grpc_slice reply_bytes(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return s;
}

static void test_round_trips(nereid_server_t *server)
{
    grpc_options_t opts;
    grpc_options_init(&opts);
    opts.address = "127.0.0.1", opts.port = 0, opts.infer_thread_count = 2;
    grpc_frontend_t *fe;
    nereid_error_t *err = grpc_frontend_start(server, &opts, &fe);
    CHECK(err == NULL);
    if (err) return;
    CHECK(grpc_frontend_port(fe) > 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", grpc_frontend_port(fe));
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, NULL);
    grpc_channel_credentials_release(creds);

    grpc_byte_buffer *reply;
    Inference__ServerLiveRequest live = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    CHECK(call(ch, "/inference.GRPCInferenceService/ServerLive", &live.base, &reply) ==
          GRPC_STATUS_OK);
    CHECK(reply != NULL);
    if (reply) {
        grpc_slice s = reply_bytes(reply);
        Inference__ServerLiveResponse *r = inference__server_live_response__unpack(
            NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        CHECK(r != NULL && r->live);
        if (r) inference__server_live_response__free_unpacked(r, NULL);
        grpc_slice_unref(s);
        grpc_byte_buffer_destroy(reply);
    }

    /* ModelInfer: FP32[3] through identity, output 0 equal to the input. */
    float data[3] = {1.5f, -2.0f, 3.25f};
    int64_t shape[1] = {3};
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in =
        INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    Inference__ModelInferRequest__InferInputTensor *ins[1] = {&in};
    ProtobufCBinaryData raw = {sizeof data, (uint8_t *)data};
    in.name = "INPUT0";
    in.datatype = "FP32";
    in.shape = shape;
    in.n_shape = 1;
    req.model_name = "id";
    req.id = "unit";
    req.inputs = ins;
    req.n_inputs = 1;
    req.raw_input_contents = &raw;
    req.n_raw_input_contents = 1;
    CHECK(call(ch, "/inference.GRPCInferenceService/ModelInfer", &req.base, &reply) ==
          GRPC_STATUS_OK);
    if (reply) {
        grpc_slice s = reply_bytes(reply);
        Inference__ModelInferResponse *r = inference__model_infer_response__unpack(
            NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        CHECK(r != NULL);
        if (r) {
            CHECK(strcmp(r->id, "unit") == 0 && strcmp(r->model_version, "1") == 0);
            CHECK(r->n_outputs == 1 && r->n_raw_output_contents == 1);
            CHECK(r->n_raw_output_contents == 1 && r->raw_output_contents[0].len == sizeof data &&
                  memcmp(r->raw_output_contents[0].data, data, sizeof data) == 0);
            inference__model_infer_response__free_unpacked(r, NULL);
        }
        grpc_slice_unref(s);
        grpc_byte_buffer_destroy(reply);
    }

    /* An unknown method is answered, not left to the deadline. */
    CHECK(call(ch, "/inference.GRPCInferenceService/Nope", &live.base, &reply) ==
          GRPC_STATUS_UNIMPLEMENTED);
    if (reply) grpc_byte_buffer_destroy(reply);

    /* A second frontend on the same port fails. */
    grpc_options_t clash;
    grpc_options_init(&clash);
    clash.address = "127.0.0.1", clash.port = grpc_frontend_port(fe), clash.infer_thread_count = 1;
    grpc_frontend_t *fe2 = NULL;
    err = grpc_frontend_start(server, &clash, &fe2);
    CHECK(err != NULL && fe2 == NULL);
    if (err) {
        CHECK(nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE);
        CHECK_STR_CONTAINS(nereid_error_message(err), target);
        nereid_error_free(err);
    }
    grpc_frontend_stop(fe2);

    grpc_channel_destroy(ch);
    grpc_frontend_stop(fe);
}

int main(void)
{
    make_repo();
    nereid_server_options_t opts;
    repo_options(&opts);
    nereid_server_t *server;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    CHECK(err == NULL);
    if (err) {
        fprintf(stderr, "%s\n", nereid_error_message(err));
        return 1;
    }
    grpc_init();
    test_round_trips(server);
    for (int i = 0; i < 5; i++) { /* start/stop cycles, with and without calls */
        grpc_options_t o;
        grpc_options_init(&o);
        o.address = "127.0.0.1", o.port = 0, o.infer_thread_count = 1 + i % 2;
        grpc_frontend_t *fe;
        err = grpc_frontend_start(server, &o, &fe);
        CHECK(err == NULL);
        if (!err) grpc_frontend_stop(fe);
        nereid_error_free(err);
    }
    test_round_trips(server);
    grpc_shutdown();
    nereid_server_free(server);
    if (!remove_repo()) return 1;
    return check_summary();
}
