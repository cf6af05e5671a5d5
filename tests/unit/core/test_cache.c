/*
 * This file contains the response cache's in-process tests: the local
 * cache's configuration texts, hits through a client allocator (every buffer
 * released), and concurrent clients on a cache small enough to evict while
 * they run (every response right, every request either a hit or one
 * execution). Run under ASan/TSan too.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "core/cache.h"
#include "server_util.h"

#define CACHED_MODEL                                                                               \
    "name: \"cached\"\nbackend: \"identity\"\nmax_batch_size: 8\n"                                 \
    "instance_group [ { count: 2 kind: KIND_CPU } ]\n"                                             \
    "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"                          \
    "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"                        \
    "response_cache { enable: true }\n"

static void test_config_texts(void)
{
    static const struct {
        const char *name, *json;
        nereid_error_code_t code;
        const char *text;
    } cases[] = {
        {"local", "{\"size\":\"1048576\"}", 0, NULL},
        {"local", "{\"size\":4096}", 0, NULL},
        {"local", "{\"size\":\" 12abc\"}", 0, NULL}, /* std::stoull reads the prefix */
        {"local", "{\"size\":\"abc\"}", NEREID_ERROR_INTERNAL,
         "Failed to initialize LocalCache: stoull"},
        {"local", "{\"size\":\"99999999999999999999999\"}", NEREID_ERROR_INTERNAL,
         "Failed to initialize LocalCache: stoull"},
        {"local", "{\"size\":-1}", NEREID_ERROR_INVALID_ARG,
         "Failed to initialize LocalCache: 'size' config must be a string or uint type"},
        {"local", "{}", NEREID_ERROR_INVALID_ARG,
         "Failed to initialize LocalCache: config didn't contain a valid 'size' field."},
        {"redis", "{}", NEREID_ERROR_INVALID_ARG,
         "unable to find 'libtritoncache_redis.so' for cache. Searched: /opt/tritonserver/caches"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        response_cache_t *c = NULL;
        nereid_error_t *err = cache_create(cases[i].name, cases[i].json, &c);
        if (!cases[i].text) {
            CHECK_MSG(!err && c, "%s", cases[i].json);
        } else {
            CHECK_MSG(err && !c, "%s", cases[i].json);
            if (err) {
                CHECK(nereid_error_code(err) == cases[i].code);
                CHECK_STR(nereid_error_message(err), cases[i].text);
            }
        }
        if (c) {
            cache_counters_t k;
            cache_read_counters(c, &k);
            CHECK(k.size == (i == 0 ? 1048576u : i == 1 ? 4096u : 12u));
        }
        nereid_error_free(err);
        cache_destroy(c);
    }
}

/* ---- A client allocator ---- */

static atomic_int allocs, releases;

static nereid_error_t *counting_alloc(void *userp, const char *name, nereid_datatype_t dt,
                                      const int64_t *shape, size_t rank, size_t byte_size,
                                      void **buffer, void **buffer_userp)
{
    (void)userp, (void)name, (void)dt, (void)shape, (void)rank;
    *buffer = malloc(byte_size ? byte_size : 1);
    *buffer_userp = (void *)0x1;
    atomic_fetch_add(&allocs, 1);
    return NULL;
}

static void counting_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp, (void)byte_size;
    CHECK(buffer_userp == (void *)0x1);
    free(buffer);
    atomic_fetch_add(&releases, 1);
}

static nereid_response_t *infer_values(nereid_server_t *s, const int32_t *values, size_t n,
                                       const nereid_response_allocator_t *alloc)
{
    tensor_t in = {"INPUT0", NEREID_TYPE_INT32, {1, (int64_t)n}, 2, values, n * 4};
    nereid_request_t *req;
    nereid_error_t *err = request_with_inputs(s, "cached", &in, 1, &req);
    waiter_t w;
    waiter_init(&w);
    if (!err) err = nereid_server_infer_async(s, req, alloc, waiter_on_done, &w);
    if (err) {
        fprintf(stderr, "infer: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        waiter_destroy(&w);
        return NULL;
    }
    return waiter_take(&w);
}

static bool response_is(const nereid_response_t *resp, const int32_t *values, size_t n)
{
    const void *data;
    size_t bytes, rank;
    const int64_t *shape;
    if (!resp || nereid_response_error(resp) ||
        !find_output(resp, "OUTPUT0", NULL, &shape, &rank, &data, &bytes))
        return false;
    return rank == 2 && shape[0] == 1 && shape[1] == (int64_t)n && bytes == n * 4 &&
           memcmp(data, values, bytes) == 0;
}

static void test_hits_through_client_allocator(nereid_server_t *s)
{
    nereid_response_allocator_t alloc = {
        .alloc_fn = counting_alloc, .release_fn = counting_release, .userp = NULL};
    int32_t v[5] = {5, 4, 3, 2, 1};
    for (int i = 0; i < 3; i++) {
        nereid_response_t *resp = infer_values(s, v, 5, &alloc);
        CHECK(response_is(resp, v, 5));
        nereid_response_free(resp);
    }
    CHECK(atomic_load(&allocs) == 3 && atomic_load(&releases) == 3);
    CHECK(stat_value(s, "cached", 1, "inference_stats", "cache_hit") == 2);
    CHECK(stat_value(s, "cached", 1, "inference_stats", "cache_miss") == 1);
}

/* ---- Concurrent clients ---- */

#define THREADS 4
#define PER_THREAD 300
#define KEYS 12

static nereid_server_t *server;
static atomic_int wrong;

static void *client(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        seed = seed * 1103515245u + 12345u;
        int32_t k = (int32_t)((seed >> 16) % KEYS);
        int32_t v[64];
        for (int j = 0; j < 64; j++)
            v[j] = k * 1000 + j;
        nereid_response_t *resp = infer_values(server, v, 64, NULL);
        if (!response_is(resp, v, 64)) atomic_fetch_add(&wrong, 1);
        nereid_response_free(resp);
    }
    return NULL;
}

static void test_concurrent_clients_with_evictions(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, client, (void *)(i + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&wrong) == 0);
    long long hits = stat_value(server, "cached", 1, "inference_stats", "cache_hit");
    long long misses = stat_value(server, "cached", 1, "inference_stats", "cache_miss");
    long long execs = stat_value(server, "cached", 1, "execution_count", NULL);
    long long success = stat_value(server, "cached", 1, "inference_stats", "success");
    long long total = THREADS * PER_THREAD + 3; /* and test_hits_through_client_allocator's */
    CHECK_MSG(success == total, "%lld", success);
    /* Each request is a hit or one execution; a miss whose key another
     * request inserted first is not counted as a miss (Triton). */
    CHECK_MSG(hits + execs == total, "hits %lld execs %lld", hits, execs);
    CHECK(misses <= execs && hits > 0);
    char *text = NULL;
    nereid_error_t *err = nereid_server_metrics(server, &text);
    CHECK(!err && text);
    const char *ev = text ? strstr(text, "\nnv_cache_num_evictions ") : NULL;
    CHECK(ev && atoll(ev + strlen("\nnv_cache_num_evictions ")) > 0);
    free(text);
}

int main(void)
{
    test_config_texts();
    make_repo_dir("cache");
    write_model("cached", CACHED_MODEL);
    nereid_server_options_t o;
    repo_options(&o);
    /* About 4 of the 64-element entries fit: the 12 keys keep evicting. */
    o.cache_name = "local";
    o.cache_config_json = "{\"size\":\"3000\"}";
    nereid_error_t *err = nereid_server_new(&o, &server);
    CHECK(!err);
    if (!err) {
        test_hits_through_client_allocator(server);
        test_concurrent_clients_with_evictions();
        nereid_server_free(server);
    }
    nereid_error_free(err);
    remove_repo();
    return check_summary();
}
