/*
 * This file contains the libFuzzer harness for the gRPC inference codec:
 * bytes are parsed as an inference.ModelInferRequest, converted to a Nereid
 * request (typed contents, raw contents, parameters, requested outputs),
 * run on in-process identity models, and the response is serialized back
 * as the gRPC frontend would.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "grpc/infer_codec.h"
#include "nereid/server.h"

static nereid_server_t *server;

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} waiter_t;

static void write_model(const char *repo, const char *name, const char *type, int max_batch)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", repo, name);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/1", repo, name);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/config.pbtxt", repo, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) abort();
    fprintf(f,
            "backend: \"identity\"\nmax_batch_size: %d\n"
            "input [ { name: \"INPUT0\" data_type: %s dims: [ -1 ] } ]\n"
            "output [ { name: \"OUTPUT0\" data_type: %s dims: [ -1 ] } ]\n",
            max_batch, type, type);
    fclose(f);
}

static char repo[] = "/tmp/nereid-fuzz-grpc-XXXXXX";

static void remove_repo(void)
{
    char cmd[sizeof(repo) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", repo);
    if (system(cmd) != 0) fprintf(stderr, "fuzz_grpc_infer: could not remove %s\n", repo);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    grpc_init();
    if (mkdtemp(repo) == NULL) abort();
    atexit(remove_repo);
    write_model(repo, "f", "TYPE_FP32", 0);
    write_model(repo, "b", "TYPE_STRING", 0);
    write_model(repo, "i8", "TYPE_INT8", 0);
    write_model(repo, "u16", "TYPE_UINT16", 4);
    write_model(repo, "bool", "TYPE_BOOL", 0);
    const char *repos[] = {repo};
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err != NULL) {
        fprintf(stderr, "fuzz_grpc_infer: %s\n", nereid_error_message(err));
        abort();
    }
    return 0;
}

static void on_done(nereid_response_t *resp, void *userp)
{
    waiter_t *w = userp;
    if (nereid_response_error(resp) == NULL) {
        nereid_error_t *err;
        grpc_byte_buffer *bb = infer_codec_response(resp, true, &err);
        if (bb != NULL)
            grpc_byte_buffer_destroy(bb);
        else
            nereid_error_free(err);
    } else {
        nereid_response_free(resp);
    }
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nereid_error_t *err;
    Inference__ModelInferRequest *msg = infer_codec_parse(data, size, &err);
    if (msg == NULL) {
        nereid_error_free(err);
        return 0;
    }
    infer_scratch_t scratch = {0};
    nereid_request_t *req;
    err = infer_codec_request(server, msg, &scratch, &req);
    if (err == NULL) {
        waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
        err = nereid_server_infer_async(server, req, NULL, on_done, &w);
        if (err == NULL) {
            pthread_mutex_lock(&w.mu);
            while (!w.done)
                pthread_cond_wait(&w.cv, &w.mu);
            pthread_mutex_unlock(&w.mu);
        } else {
            nereid_request_free(req);
        }
    }
    nereid_error_free(err);
    infer_scratch_free(&scratch);
    inference__model_infer_request__free_unpacked(msg, NULL);
    return 0;
}
