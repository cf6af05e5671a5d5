/* nereid-perf over KServe v2 gRPC with the gRPC core C API: one channel and
 * one completion queue per load thread, ModelInfer with raw_input_contents;
 * metadata, configuration and statistics through the same service. */
#include "perf.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

#define SERVICE "/inference.GRPCInferenceService/"

struct perf_conn {
    grpc_channel *channel;
    grpc_completion_queue *cq;
    const perf_request_t *req;
    Inference__ModelInferRequest msg; /* points into req's inputs */
    Inference__ModelInferRequest__InferInputTensor *tensors, **inputs;
    ProtobufCBinaryData *raw;
    /* sequence_id, sequence_start, sequence_end parameters */
    Inference__ModelInferRequest__ParametersEntry entries[3], *entry_ptrs[3];
    Inference__InferParameter values[3];
    grpc_slice request; /* the packed ModelInferRequest outside sequences */
};

static void strip_scheme(const char *url, char *out, size_t cap)
{
    const char *p = strstr(url, "://");
    snprintf(out, cap, "%s", p ? p + 3 : url);
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == '/')
        out[--len] = '\0';
}

static grpc_channel *open_channel(const char *url)
{
    char target[1024];
    strip_scheme(url, target, sizeof target);
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_arg arg = {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = -1}};
    grpc_channel_args args = {1, &arg};
    grpc_channel *ch = grpc_channel_create(target, creds, &args);
    grpc_channel_credentials_release(creds);
    return ch;
}

/* One unary call on ch; returns 0 and the reply bytes (caller unrefs), or
 * -1 with err set. */
static int unary(grpc_channel *ch, grpc_completion_queue *cq, const char *method,
                 grpc_slice request, const grpc_metadata *md, size_t n_md, grpc_slice *reply,
                 char *err)
{
    grpc_slice m = grpc_slice_from_static_string(method);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(300, GPR_TIMESPAN));
    grpc_call *c =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL, deadline, NULL);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&request, 1), *recv = NULL;
    grpc_metadata_array initial, trailing;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    int rc = -1;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = (grpc_metadata *)md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    if (grpc_call_start_batch(c, ops, 6, c, NULL) != GRPC_CALL_OK) {
        snprintf(err, PERF_ERR_LEN, "grpc_call_start_batch failed");
    } else {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, c, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
            snprintf(err, PERF_ERR_LEN, "gRPC call failed");
        } else if (status != GRPC_STATUS_OK) {
            char *text = grpc_slice_to_c_string(details);
            snprintf(err, PERF_ERR_LEN, "gRPC status %d: %s", (int)status, text);
            gpr_free(text);
        } else {
            grpc_byte_buffer_reader r;
            if (recv && grpc_byte_buffer_reader_init(&r, recv)) {
                *reply = grpc_byte_buffer_reader_readall(&r);
                grpc_byte_buffer_reader_destroy(&r);
                rc = 0;
            } else {
                snprintf(err, PERF_ERR_LEN, "gRPC reply has no message");
            }
        }
    }
    grpc_slice_unref(details);
    grpc_byte_buffer_destroy(send);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(c);
    return rc;
}

static grpc_slice pack(const ProtobufCMessage *msg)
{
    grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(msg));
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    return s;
}

/* A unary call on a fresh channel; returns the unpacked reply or NULL. */
static ProtobufCMessage *call_once(const char *url, const char *method, const ProtobufCMessage *msg,
                                   const ProtobufCMessageDescriptor *reply_type, char *err)
{
    grpc_channel *ch = open_channel(url);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice request = pack(msg), reply;
    ProtobufCMessage *out = NULL;
    if (unary(ch, cq, method, request, NULL, 0, &reply, err) == 0) {
        out = protobuf_c_message_unpack(reply_type, NULL, GRPC_SLICE_LENGTH(reply),
                                        GRPC_SLICE_START_PTR(reply));
        if (!out) snprintf(err, PERF_ERR_LEN, "cannot parse the reply to %s", method);
        grpc_slice_unref(reply);
    }
    grpc_slice_unref(request);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return out;
}

static int copy_tensors(Inference__ModelMetadataResponse__TensorMetadata **in, size_t n,
                        perf_tensor_meta_t **out, int *n_out, char *err)
{
    *out = calloc(n ? n : 1, sizeof **out);
    *n_out = (int)n;
    for (size_t i = 0; i < n; i++) {
        if (in[i]->n_shape > PERF_MAX_DIMS) {
            snprintf(err, PERF_ERR_LEN, "tensor '%s' has too many dimensions", in[i]->name);
            return -1;
        }
        snprintf((*out)[i].name, sizeof(*out)[i].name, "%s", in[i]->name);
        snprintf((*out)[i].datatype, sizeof(*out)[i].datatype, "%s", in[i]->datatype);
        (*out)[i].n_dims = (int)in[i]->n_shape;
        memcpy((*out)[i].shape, in[i]->shape, in[i]->n_shape * sizeof(int64_t));
    }
    return 0;
}

static int rpc_metadata(const perf_request_t *req, perf_model_meta_t *out, char *err)
{
    Inference__ModelMetadataRequest mreq = INFERENCE__MODEL_METADATA_REQUEST__INIT;
    Inference__ModelConfigRequest creq = INFERENCE__MODEL_CONFIG_REQUEST__INIT;
    char cerr[PERF_ERR_LEN];
    int rc;
    memset(out, 0, sizeof *out);
    mreq.name = creq.name = (char *)req->model;
    mreq.version = creq.version = (char *)req->version;
    Inference__ModelMetadataResponse *m = (Inference__ModelMetadataResponse *)call_once(
        req->url, SERVICE "ModelMetadata", &mreq.base,
        &inference__model_metadata_response__descriptor, err);
    if (!m) return -1;
    rc = copy_tensors(m->inputs, m->n_inputs, &out->inputs, &out->n_inputs, err);
    if (rc == 0) rc = copy_tensors(m->outputs, m->n_outputs, &out->outputs, &out->n_outputs, err);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    if (rc) return -1;
    /* max_batch_size from the configuration extension (absent: no batching) */
    Inference__ModelConfigResponse *c = (Inference__ModelConfigResponse *)call_once(
        req->url, SERVICE "ModelConfig", &creq.base, &inference__model_config_response__descriptor,
        cerr);
    if (c) {
        if (c->config) {
            out->max_batch_size = c->config->max_batch_size;
            out->is_sequence = c->config->sequence_batching != NULL;
        }
        protobuf_c_message_free_unpacked(&c->base, NULL);
    }
    return 0;
}

static uint64_t ns_of(const Inference__StatisticDuration *d)
{
    return d ? d->ns : 0;
}

static int rpc_stats(const char *url, const perf_request_t *req, perf_server_stats_t *out,
                     char *err)
{
    Inference__ModelStatisticsRequest sreq = INFERENCE__MODEL_STATISTICS_REQUEST__INIT;
    memset(out, 0, sizeof *out);
    sreq.name = (char *)req->model;
    sreq.version = (char *)req->version;
    Inference__ModelStatisticsResponse *r = (Inference__ModelStatisticsResponse *)call_once(
        url, SERVICE "ModelStatistics", &sreq.base,
        &inference__model_statistics_response__descriptor, err);
    if (!r) return -1;
    for (size_t i = 0; i < r->n_model_stats; i++) {
        const Inference__ModelStatistics *m = r->model_stats[i];
        const Inference__InferStatistics *s = m->inference_stats;
        out->inference_count += m->inference_count;
        out->execution_count += m->execution_count;
        if (!s) continue;
        out->success_count += s->success ? s->success->count : 0;
        out->fail_count += s->fail ? s->fail->count : 0;
        out->queue_ns += ns_of(s->queue);
        out->compute_input_ns += ns_of(s->compute_input);
        out->compute_infer_ns += ns_of(s->compute_infer);
        out->compute_output_ns += ns_of(s->compute_output);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return 0;
}

static perf_conn_t *rpc_connect(const perf_request_t *req, char *err)
{
    static const char *keys[3] = {"sequence_id", "sequence_start", "sequence_end"};
    Inference__ModelInferRequest init = INFERENCE__MODEL_INFER_REQUEST__INIT;
    perf_conn_t *c = calloc(1, sizeof *c);
    int n = req->n_inputs;
    (void)err;
    c->req = req;
    c->msg = init;
    c->tensors = calloc((size_t)n + 1, sizeof *c->tensors);
    c->inputs = calloc((size_t)n + 1, sizeof *c->inputs);
    c->raw = calloc((size_t)n + 1, sizeof *c->raw);
    c->msg.model_name = (char *)req->model;
    c->msg.model_version = (char *)req->version;
    for (int i = 0; i < n; i++) {
        Inference__ModelInferRequest__InferInputTensor t =
            INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
        t.name = req->inputs[i].name;
        t.datatype = (char *)req->inputs[i].datatype;
        t.n_shape = (size_t)req->inputs[i].n_dims;
        t.shape = (int64_t *)req->inputs[i].shape;
        c->tensors[i] = t;
        c->inputs[i] = &c->tensors[i];
        c->raw[i].data = req->inputs[i].data;
        c->raw[i].len = req->inputs[i].byte_size;
    }
    c->msg.n_inputs = c->msg.n_raw_input_contents = (size_t)n;
    c->msg.inputs = c->inputs;
    c->msg.raw_input_contents = c->raw;
    for (int i = 0; i < 3; i++) {
        Inference__ModelInferRequest__ParametersEntry e =
            INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT;
        Inference__InferParameter v = INFERENCE__INFER_PARAMETER__INIT;
        c->values[i] = v;
        e.key = (char *)keys[i];
        e.value = &c->values[i];
        c->entries[i] = e;
        c->entry_ptrs[i] = &c->entries[i];
    }
    c->request = pack(&c->msg.base);
    c->channel = open_channel(req->url);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    return c;
}

static int rpc_infer(perf_conn_t *c, const perf_sequence_t *seq, char *err)
{
    grpc_slice reply, request = c->request;
    grpc_metadata md[3] = {0};
    size_t n_md = 0;
    char id[32];
    if (seq) {
        c->values[0].parameter_choice_case =
            INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        c->values[0].int64_param = (int64_t)seq->id;
        c->values[1].parameter_choice_case =
            INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        c->values[1].bool_param = seq->start;
        c->values[2].parameter_choice_case =
            INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        c->values[2].bool_param = seq->end;
        c->msg.n_parameters = 3;
        c->msg.parameters = c->entry_ptrs;
        request = pack(&c->msg.base);
        if (c->req->sequence_header) {
            snprintf(id, sizeof id, "%" PRIu64, seq->id);
            md[0].key = grpc_slice_from_static_string("nereid-sequence-id");
            md[0].value = grpc_slice_from_static_string(id);
            md[1].key = grpc_slice_from_static_string("nereid-sequence-start");
            md[1].value = grpc_slice_from_static_string(seq->start ? "true" : "false");
            md[2].key = grpc_slice_from_static_string("nereid-sequence-end");
            md[2].value = grpc_slice_from_static_string(seq->end ? "true" : "false");
            n_md = 3;
        }
    }
    int rc = unary(c->channel, c->cq, SERVICE "ModelInfer", request, md, n_md, &reply, err);
    if (seq) grpc_slice_unref(request);
    if (rc) return -1;
    grpc_slice_unref(reply);
    return 0;
}

static void rpc_close(perf_conn_t *c)
{
    if (!c) return;
    grpc_slice_unref(c->request);
    grpc_completion_queue_shutdown(c->cq);
    grpc_completion_queue_destroy(c->cq);
    grpc_channel_destroy(c->channel);
    free(c->tensors);
    free(c->inputs);
    free(c->raw);
    free(c);
}

static void perf_grpc_init(void)
{
    grpc_init();
}

static void perf_grpc_shutdown(void)
{
    grpc_shutdown();
}

const perf_transport_t perf_grpc_transport = {
    "grpc",    perf_grpc_init, perf_grpc_shutdown, rpc_metadata,
    rpc_stats, rpc_connect,    rpc_infer,          rpc_close,
};
