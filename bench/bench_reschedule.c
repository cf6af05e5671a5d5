/*
 * This file contains the cost of rescheduling a request
 * (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, backend ABI 1.7
 * nereid_batch_request_reschedule) against a new request: the Triton-API
 * test backend tests/tritonbackends/titerate.c under the sequence batcher
 * with iterative_sequence, one client thread in process
 * (nereid_server_infer_stream). "rescheduled" is one request run N times
 * (N-1 reschedules, one response each); "new requests" is N requests run
 * once each, one after another. Both give N executions and N responses;
 * the mean time per execution is printed for each of three alternating
 * rounds.
 *
 *   build/bench/bench_reschedule [N]   (default 20000; from the repo root)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tests/unit/test_util.h"
#include "nereid/server.h"

static _Atomic uint64_t n_responses;
static atomic_bool finished, failed;

static void on_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    (void)userp;
    if (resp) {
        if (nereid_response_error(resp)) atomic_store(&failed, true);
        atomic_fetch_add(&n_responses, 1);
        nereid_response_free(resp);
    }
    if (flags & NEREID_RESPONSE_FINAL) atomic_store_explicit(&finished, true, memory_order_release);
}

/* One request with INPUT = [times], waited for to its final response. */
static int run(nereid_server_t *server, int32_t times)
{
    static const int64_t shape[1] = {1};
    static int32_t value;
    value = times;
    nereid_request_t *req = NULL;
    atomic_store(&finished, false);
    nereid_error_t *err = nereid_request_new(server, "iterate", -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT", NEREID_TYPE_INT32, shape, 1, &value, 4);
    if (!err) err = nereid_server_infer_stream(server, req, NULL, on_response, NULL);
    if (err) {
        fprintf(stderr, "bench_reschedule: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    while (!atomic_load_explicit(&finished, memory_order_acquire))
        ;
    return atomic_load(&failed) ? -1 : 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    if (n < 1 || n > 1000000000) n = 20000;
    char repo[] = "/tmp/nereid-bench-reschedule-XXXXXX";
    if (!mkdtemp(repo)) return 1;
    char path[4200], link[4200];
    snprintf(path, sizeof path, "%s/iterate", repo);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/iterate/1", repo);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/iterate/config.pbtxt", repo);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs("backend: \"titerate\"\nmax_batch_size: 0\n"
          "model_transaction_policy { decoupled: true }\n"
          "sequence_batching { iterative_sequence: true }\n"
          "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
          "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] },\n"
          "         { name: \"FLAGS\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n",
          f);
    fclose(f);
    snprintf(link, sizeof link, "%s/iterate/libtriton_titerate.so", repo);
    if (symlink(NEREID_DEFAULT_BACKEND_DIR "/../tritonbackends/titerate/libtriton_titerate.so",
                link) != 0)
        return 1;
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    const char *repos[] = {repo};
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    opts.log_info = false;
    nereid_server_t *server = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    int rc = 0;
    if (err) {
        fprintf(stderr, "bench_reschedule: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        rc = 1;
    }
    enum { ROUNDS = 3 };
    double resched[ROUNDS], fresh[ROUNDS];
    for (int round = 0; round < ROUNDS && !rc; round++) {
        atomic_store(&n_responses, 0);
        uint64_t t0 = now_ns();
        rc = run(server, (int32_t)n);
        resched[round] = (double)(now_ns() - t0) / 1e3 / (double)n;
        if (!rc && atomic_load(&n_responses) != (uint64_t)n) rc = -1;
        atomic_store(&n_responses, 0);
        t0 = now_ns();
        for (long i = 0; i < n && !rc; i++)
            rc = run(server, 1);
        fresh[round] = (double)(now_ns() - t0) / 1e3 / (double)n;
        if (!rc && atomic_load(&n_responses) != (uint64_t)n) rc = -1;
    }
    if (!rc) {
        printf(
            "iterative sequence, %ld executions per run, one client thread, mean per execution\n",
            n);
        printf("  rescheduled (1 request)  %7.2f %7.2f %7.2f us\n", resched[0], resched[1],
               resched[2]);
        printf("  new requests (%ld)       %7.2f %7.2f %7.2f us\n", n, fresh[0], fresh[1],
               fresh[2]);
    } else {
        fprintf(stderr, "bench_reschedule: a run failed\n");
    }
    if (server) nereid_server_free(server);
    unlink(link);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) != 0) rc = 1;
    return rc ? 1 : 0;
}
