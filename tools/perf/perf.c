/* nereid-perf: measures latency and throughput of a model on any KServe v2
 * server, over HTTP or gRPC, sweeping concurrency or request rate the way
 * Triton's perf_analyzer does (same flag names where perf_analyzer has
 * them). Per level: client p50/p90/p95/p99 and average latency, throughput,
 * and the server's own queue and compute times from the delta of the
 * statistics extension over the level. */
#include "perf.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STATS_URLS 16

typedef struct {
    const char *name;
    int64_t dims[PERF_MAX_DIMS];
    int n_dims;
} shape_opt_t;

typedef struct {
    perf_request_t req;
    const perf_transport_t *transport;
    int batch_size;
    int64_t range[3]; /* start, end, step */
    int rate_mode;    /* --request-rate-range given */
    int poisson;
    int64_t interval_ms;
    int count_mode; /* --measurement-mode count_windows */
    int64_t request_count;
    int max_threads;
    const char *input_data; /* zero, random, or a directory */
    int string_length;
    const char *csv_path;
    shape_opt_t shapes[32];
    int n_shapes;
    const char *stats_urls[MAX_STATS_URLS];
    int n_stats_urls;
    int is_sequence; /* the model is stateful: requests go in sequences */
    int64_t sequence_length;
    uint64_t sequence_ids[2]; /* first and last id to use */
} perf_opts_t;

static atomic_ullong next_sequence; /* sequences started so far, over all levels */

/* One sweep level in flight. */
typedef struct {
    const perf_opts_t *opts;
    double level; /* concurrency or requests/s */
    int64_t start_ns, end_ns;
    atomic_llong tickets;   /* requests claimed */
    pthread_mutex_t lock;   /* rate mode: schedule; results */
    double next_send_s;     /* rate mode: next scheduled send, seconds from start */
    uint64_t rng;           /* rate mode: poisson gaps */
    uint64_t *latencies_ns; /* successful requests */
    int64_t n_ok, cap, n_err, n_delayed;
    int64_t last_done_ns;
    char first_error[PERF_ERR_LEN];
} level_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s)
{ /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

size_t perf_datatype_size(const char *dt)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"BOOL", 1},  {"INT8", 1},   {"UINT8", 1}, {"INT16", 2},  {"UINT16", 2},
                 {"FP16", 2},  {"BF16", 2},   {"INT32", 4}, {"UINT32", 4}, {"FP32", 4},
                 {"INT64", 8}, {"UINT64", 8}, {"FP64", 8}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (!strcmp(dt, sizes[i].name)) return sizes[i].size;
    return 0;
}

void perf_model_meta_free(perf_model_meta_t *meta)
{
    free(meta->inputs);
    free(meta->outputs);
    memset(meta, 0, sizeof *meta);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: nereid-perf -m MODEL [options]\n"
            "  -m MODEL                      model name\n"
            "  -x VERSION                    model version (default: the server's choice)\n"
            "  -u URL                        server (default localhost:8000, gRPC localhost:8001)\n"
            "  -i http|grpc                  protocol (default http)\n"
            "  -b N                          batch size (default 1)\n"
            "  --concurrency-range S[:E[:T]] concurrent requests, S to E step T (default 1)\n"
            "  --request-rate-range S[:E[:T]] requests per second instead of concurrency\n"
            "  --request-distribution constant|poisson   gaps in request-rate mode\n"
            "  --max-threads N               senders in request-rate mode (default 16)\n"
            "  -p MS                         measurement interval (default 5000)\n"
            "  --measurement-mode time_windows|count_windows\n"
            "  --measurement-request-count N requests per level in count_windows (default 50)\n"
            "  --input-data zero|random|DIR  DIR/<input> holds raw tensor bytes, BYTES one\n"
            "                                element per line (default random)\n"
            "  --shape NAME:D1,D2,...        dimensions of a variable input (no batch dim)\n"
            "  --string-length N             random BYTES element length (default 128)\n"
            "  --input-tensor-format binary|json, --output-tensor-format binary|json (HTTP)\n"
            "  --sequence-length N           requests per sequence, stateful models (default 20)\n"
            "  --sequence-id-range S[:E]     sequence ids to use, cycling (default 1:2^63-1)\n"
            "  --sequence-header             also send the sequence in Nereid-Sequence-* headers\n"
            "                                (gRPC metadata), for a sequence-affine proxy\n"
            "  --stats-url URL               where to read server statistics; repeat to sum\n"
            "                                replicas (default: -u)\n"
            "  -f FILE                       write the results as CSV\n");
}

static int parse_range(const char *s, int64_t out[3])
{
    char *end;
    out[0] = strtoll(s, &end, 10);
    out[1] = out[0];
    out[2] = 1;
    if (*end == ':') out[1] = strtoll(end + 1, &end, 10);
    if (*end == ':') out[2] = strtoll(end + 1, &end, 10);
    return *end || out[0] <= 0 || out[1] < out[0] || out[2] <= 0 ? -1 : 0;
}

static int parse_shape(const char *s, shape_opt_t *out)
{
    const char *colon = strrchr(s, ':');
    if (!colon) return -1;
    out->name = strndup(s, (size_t)(colon - s));
    out->n_dims = 0;
    for (const char *p = colon + 1; *p;) {
        char *end;
        if (out->n_dims == PERF_MAX_DIMS) return -1;
        out->dims[out->n_dims++] = strtoll(p, &end, 10);
        if (end == p || out->dims[out->n_dims - 1] < 0) return -1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return 0;
}

enum {
    OPT_CONC = 256,
    OPT_RATE,
    OPT_DIST,
    OPT_MAX_THREADS,
    OPT_MODE,
    OPT_COUNT,
    OPT_INPUT_DATA,
    OPT_SHAPE,
    OPT_STRLEN,
    OPT_IN_FMT,
    OPT_OUT_FMT,
    OPT_STATS_URL,
    OPT_SEQ_LEN,
    OPT_SEQ_IDS,
    OPT_SEQ_HEADER,
};

static int parse_args(int argc, char **argv, perf_opts_t *o)
{
    static const struct option longs[] = {
        {"concurrency-range", required_argument, 0, OPT_CONC},
        {"request-rate-range", required_argument, 0, OPT_RATE},
        {"request-distribution", required_argument, 0, OPT_DIST},
        {"max-threads", required_argument, 0, OPT_MAX_THREADS},
        {"measurement-mode", required_argument, 0, OPT_MODE},
        {"measurement-request-count", required_argument, 0, OPT_COUNT},
        {"input-data", required_argument, 0, OPT_INPUT_DATA},
        {"shape", required_argument, 0, OPT_SHAPE},
        {"string-length", required_argument, 0, OPT_STRLEN},
        {"input-tensor-format", required_argument, 0, OPT_IN_FMT},
        {"output-tensor-format", required_argument, 0, OPT_OUT_FMT},
        {"stats-url", required_argument, 0, OPT_STATS_URL},
        {"sequence-length", required_argument, 0, OPT_SEQ_LEN},
        {"sequence-id-range", required_argument, 0, OPT_SEQ_IDS},
        {"sequence-header", no_argument, 0, OPT_SEQ_HEADER},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *protocol = "http";
    int c;
    memset(o, 0, sizeof *o);
    o->req.version = "";
    o->req.binary_input = o->req.binary_output = 1;
    o->batch_size = 1;
    o->range[0] = o->range[1] = o->range[2] = 1;
    o->interval_ms = 5000;
    o->request_count = 50;
    o->max_threads = 16;
    o->input_data = "random";
    o->string_length = 128;
    o->sequence_length = 20;
    o->sequence_ids[0] = 1;
    o->sequence_ids[1] = INT64_MAX;
    while ((c = getopt_long(argc, argv, "m:x:u:i:b:p:f:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm':
            o->req.model = optarg;
            break;
        case 'x':
            o->req.version = optarg;
            break;
        case 'u':
            o->req.url = optarg;
            break;
        case 'i':
            protocol = optarg;
            break;
        case 'b':
            o->batch_size = atoi(optarg);
            break;
        case 'p':
            o->interval_ms = atoll(optarg);
            break;
        case 'f':
            o->csv_path = optarg;
            break;
        case OPT_CONC:
        case OPT_RATE:
            if (parse_range(optarg, o->range)) {
                fprintf(stderr, "nereid-perf: bad range '%s' (START[:END[:STEP]])\n", optarg);
                return -1;
            }
            o->rate_mode = c == OPT_RATE;
            break;
        case OPT_DIST:
            o->poisson = !strcmp(optarg, "poisson");
            break;
        case OPT_MAX_THREADS:
            o->max_threads = atoi(optarg);
            break;
        case OPT_MODE:
            o->count_mode = !strcmp(optarg, "count_windows");
            break;
        case OPT_COUNT:
            o->request_count = atoll(optarg);
            break;
        case OPT_INPUT_DATA:
            o->input_data = optarg;
            break;
        case OPT_SHAPE:
            if (o->n_shapes == 32 || parse_shape(optarg, &o->shapes[o->n_shapes++])) {
                fprintf(stderr, "nereid-perf: bad --shape '%s' (NAME:D1,D2,...)\n", optarg);
                return -1;
            }
            break;
        case OPT_STRLEN:
            o->string_length = atoi(optarg);
            break;
        case OPT_IN_FMT:
            o->req.binary_input = strcmp(optarg, "json") != 0;
            break;
        case OPT_OUT_FMT:
            o->req.binary_output = strcmp(optarg, "json") != 0;
            break;
        case OPT_SEQ_LEN:
            o->sequence_length = atoll(optarg);
            break;
        case OPT_SEQ_IDS: {
            char *end;
            o->sequence_ids[0] = strtoull(optarg, &end, 10);
            if (*end == ':') o->sequence_ids[1] = strtoull(end + 1, &end, 10);
            if (*end || !o->sequence_ids[0] || o->sequence_ids[1] < o->sequence_ids[0]) {
                fprintf(stderr, "nereid-perf: bad --sequence-id-range '%s' (START[:END])\n",
                        optarg);
                return -1;
            }
            break;
        }
        case OPT_SEQ_HEADER:
            o->req.sequence_header = 1;
            break;
        case OPT_STATS_URL:
            if (o->n_stats_urls == MAX_STATS_URLS) return -1;
            o->stats_urls[o->n_stats_urls++] = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (!o->req.model || optind != argc) {
        usage(stderr);
        return -1;
    }
    if (!strcmp(protocol, "http")) {
        o->transport = &perf_http_transport;
        if (!o->req.url) o->req.url = "localhost:8000";
    } else if (!strcmp(protocol, "grpc")) {
        o->transport = &perf_grpc_transport;
        if (!o->req.url) o->req.url = "localhost:8001";
    } else {
        fprintf(stderr, "nereid-perf: -i must be http or grpc\n");
        return -1;
    }
    if (o->batch_size < 1 || o->interval_ms < 1 || o->request_count < 1 || o->max_threads < 1 ||
        o->string_length < 0 || o->sequence_length < 1) {
        fprintf(stderr, "nereid-perf: -b, -p, --measurement-request-count and --max-threads "
                        "must be positive\n");
        return -1;
    }
    if (!o->n_stats_urls) o->stats_urls[o->n_stats_urls++] = o->req.url;
    return 0;
}

static const shape_opt_t *find_shape(const perf_opts_t *o, const char *name)
{
    for (int i = 0; i < o->n_shapes; i++)
        if (!strcmp(o->shapes[i].name, name)) return &o->shapes[i];
    return NULL;
}

/* Reads DIR/<name>; returns its bytes (NUL-terminated) or NULL. */
static unsigned char *read_file(const char *dir, const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0, got;
    unsigned char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* BYTES elements one per line of text -> length-prefixed elements. */
static unsigned char *lines_to_bytes(const unsigned char *text, size_t len, int64_t *n_elements,
                                     size_t *out_len)
{
    unsigned char *out = malloc(len * 5 + 4), *p = out;
    const unsigned char *s = text, *end = text + len;
    *n_elements = 0;
    while (s < end) {
        const unsigned char *nl = memchr(s, '\n', (size_t)(end - s));
        uint32_t l = (uint32_t)((nl ? nl : end) - s);
        memcpy(p, &l, 4);
        memcpy(p + 4, s, l);
        p += 4 + l;
        (*n_elements)++;
        s += l + 1;
    }
    *out_len = (size_t)(p - out);
    return out;
}

static void fill_random(unsigned char *p, const char *dt, int64_t n, uint64_t *rng)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = next_rand(rng);
        if (!strcmp(dt, "FP32")) {
            float v = (float)(r >> 40) / (float)(1 << 24);
            memcpy(p + 4 * i, &v, 4);
        } else if (!strcmp(dt, "FP64")) {
            double v = (double)(r >> 11) / 9007199254740992.0;
            memcpy(p + 8 * i, &v, 8);
        } else if (!strcmp(dt, "FP16") || !strcmp(dt, "BF16")) {
            uint16_t v = !strcmp(dt, "FP16") ? (uint16_t)(0x3800 | (r & 0x3ff)) /* [0.5, 1) */
                                             : (uint16_t)(0x3f00 | (r & 0x7f));
            memcpy(p + 2 * i, &v, 2);
        } else if (!strcmp(dt, "BOOL")) {
            p[i] = (unsigned char)(r & 1);
        } else { /* integers: small non-negative values fit every type */
            size_t size = perf_datatype_size(dt);
            uint64_t v = r % 100;
            memcpy(p + size * i, &v, size); /* little-endian */
        }
    }
}

/* Builds the inputs from the model metadata, --shape, -b and --input-data. */
static int build_inputs(perf_opts_t *o, const perf_model_meta_t *meta)
{
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    int batching = meta->max_batch_size > 0;
    if (!batching && o->batch_size > 1) {
        fprintf(stderr, "nereid-perf: model '%s' does not support batching; -b must be 1\n",
                o->req.model);
        return -1;
    }
    o->req.n_inputs = meta->n_inputs;
    o->req.inputs = calloc((size_t)meta->n_inputs + 1, sizeof *o->req.inputs);
    for (int i = 0; i < meta->n_inputs; i++) {
        const perf_tensor_meta_t *m = &meta->inputs[i];
        perf_input_t *in = &o->req.inputs[i];
        const shape_opt_t *s = find_shape(o, m->name);
        int skip = batching ? 1 : 0; /* the metadata's batch dimension */
        in->name = strdup(m->name);
        snprintf(in->datatype, sizeof in->datatype, "%s", m->datatype);
        in->n_dims = 0;
        if (batching) in->shape[in->n_dims++] = o->batch_size;
        if (s) {
            if (s->n_dims + in->n_dims > PERF_MAX_DIMS) return -1;
            for (int d = 0; d < s->n_dims; d++)
                in->shape[in->n_dims++] = s->dims[d];
        } else {
            for (int d = skip; d < m->n_dims; d++) {
                if (m->shape[d] < 0) {
                    fprintf(stderr,
                            "nereid-perf: input '%s' has a variable dimension; give its "
                            "shape with --shape %s:D1,D2,...\n",
                            m->name, m->name);
                    return -1;
                }
                in->shape[in->n_dims++] = m->shape[d];
            }
        }
        int64_t per_item = 1;
        for (int d = batching ? 1 : 0; d < in->n_dims; d++)
            per_item *= in->shape[d];
        in->n_elements = per_item * (batching ? o->batch_size : 1);
        size_t size = perf_datatype_size(m->datatype);
        int is_bytes = !strcmp(m->datatype, "BYTES");
        if (!size && !is_bytes) {
            fprintf(stderr, "nereid-perf: input '%s' has unsupported datatype %s\n", m->name,
                    m->datatype);
            return -1;
        }
        if (strcmp(o->input_data, "zero") && strcmp(o->input_data, "random")) {
            size_t len;
            unsigned char *file = read_file(o->input_data, m->name, &len), *item;
            int64_t n_file = 0;
            size_t item_bytes;
            if (!file) {
                fprintf(stderr, "nereid-perf: cannot read %s/%s: %s\n", o->input_data, m->name,
                        strerror(errno));
                return -1;
            }
            if (is_bytes) {
                item = lines_to_bytes(file, len, &n_file, &item_bytes);
                free(file);
            } else {
                item = file;
                item_bytes = len;
                n_file = (int64_t)(len / size);
            }
            /* the file holds one batch item (repeated -b times) or the whole tensor */
            int copies = n_file == in->n_elements ? 1 : o->batch_size;
            if (n_file * copies != in->n_elements || (!is_bytes && len % size)) {
                fprintf(stderr,
                        "nereid-perf: %s/%s holds %" PRId64 " elements; input '%s' needs %" PRId64
                        " per batch item\n",
                        o->input_data, m->name, n_file, m->name, per_item);
                return -1;
            }
            in->byte_size = item_bytes * (size_t)copies;
            in->data = malloc(in->byte_size ? in->byte_size : 1);
            for (int c = 0; c < copies; c++)
                memcpy(in->data + item_bytes * c, item, item_bytes);
            free(item);
        } else if (is_bytes) {
            uint32_t l = (uint32_t)o->string_length;
            in->byte_size = (size_t)in->n_elements * (4 + l);
            in->data = malloc(in->byte_size ? in->byte_size : 1);
            for (int64_t e = 0; e < in->n_elements; e++) {
                unsigned char *p = in->data + e * (4 + l);
                memcpy(p, &l, 4);
                for (uint32_t k = 0; k < l; k++)
                    p[4 + k] = !strcmp(o->input_data, "zero")
                                   ? '0'
                                   : (unsigned char)('a' + next_rand(&rng) % 26);
            }
        } else {
            in->byte_size = (size_t)in->n_elements * size;
            in->data = calloc(in->byte_size ? in->byte_size : 1, 1);
            if (!strcmp(o->input_data, "random"))
                fill_random(in->data, m->datatype, in->n_elements, &rng);
        }
    }
    o->req.n_outputs = meta->n_outputs;
    o->req.outputs = calloc((size_t)meta->n_outputs + 1, sizeof *o->req.outputs);
    for (int i = 0; i < meta->n_outputs; i++)
        o->req.outputs[i] = strdup(meta->outputs[i].name);
    return 0;
}

static int read_stats(const perf_opts_t *o, perf_server_stats_t *sum, char *err)
{
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < o->n_stats_urls; i++) {
        perf_server_stats_t s;
        if (o->transport->stats(o->stats_urls[i], &o->req, &s, err)) return -1;
        sum->success_count += s.success_count;
        sum->fail_count += s.fail_count;
        sum->inference_count += s.inference_count;
        sum->execution_count += s.execution_count;
        sum->queue_ns += s.queue_ns;
        sum->compute_input_ns += s.compute_input_ns;
        sum->compute_infer_ns += s.compute_infer_ns;
        sum->compute_output_ns += s.compute_output_ns;
    }
    return 0;
}

static void record(level_t *lv, int ok, uint64_t latency_ns, const char *err)
{
    pthread_mutex_lock(&lv->lock);
    if (ok) {
        if (lv->n_ok == lv->cap) {
            lv->cap = lv->cap ? lv->cap * 2 : 1024;
            lv->latencies_ns = realloc(lv->latencies_ns, (size_t)lv->cap * sizeof(uint64_t));
        }
        lv->latencies_ns[lv->n_ok++] = latency_ns;
    } else {
        if (!lv->n_err) snprintf(lv->first_error, sizeof lv->first_error, "%s", err);
        lv->n_err++;
    }
    int64_t t = now_ns();
    if (t > lv->last_done_ns) lv->last_done_ns = t;
    pthread_mutex_unlock(&lv->lock);
}

/* Claims the next request; in rate mode also its send time. 0: stop. */
static int claim(level_t *lv, int64_t *send_at_ns)
{
    const perf_opts_t *o = lv->opts;
    long long ticket = atomic_fetch_add(&lv->tickets, 1);
    if (o->count_mode && ticket >= o->request_count) return 0;
    if (!o->rate_mode) {
        *send_at_ns = 0;
        return o->count_mode || now_ns() < lv->end_ns;
    }
    pthread_mutex_lock(&lv->lock);
    double gap = 1.0 / lv->level;
    if (o->poisson) {
        double u = (double)(next_rand(&lv->rng) >> 11) / 9007199254740992.0;
        gap = -log(1.0 - u) / lv->level;
    }
    double at = lv->next_send_s;
    lv->next_send_s += gap;
    pthread_mutex_unlock(&lv->lock);
    *send_at_ns = lv->start_ns + (int64_t)(at * 1e9);
    return o->count_mode || *send_at_ns < lv->end_ns;
}

typedef struct {
    level_t *lv;
    perf_conn_t *conn;
    perf_sequence_t seq; /* stateful models: the sequence this sender is in */
    int64_t step;        /* its next request's index; 0: start a new one */
} worker_t;

/* Sends one request and records it. For a stateful model the request
 * belongs to the sender's current sequence (START on its first request, END
 * on its last); a failed request abandons the sequence. */
static void send_one(worker_t *w)
{
    level_t *lv = w->lv;
    const perf_opts_t *o = lv->opts;
    char err[PERF_ERR_LEN];
    const perf_sequence_t *seq = NULL;
    if (o->is_sequence) {
        if (w->step == 0) {
            uint64_t span = o->sequence_ids[1] - o->sequence_ids[0] + 1;
            uint64_t n = atomic_fetch_add(&next_sequence, 1);
            w->seq.id = o->sequence_ids[0] + (span ? n % span : n);
        }
        w->seq.start = w->step == 0;
        w->seq.end = w->step == o->sequence_length - 1;
        seq = &w->seq;
    }
    err[0] = '\0';
    int64_t t0 = now_ns();
    int rc = o->transport->infer(w->conn, seq, err);
    record(lv, rc == 0, (uint64_t)(now_ns() - t0), err);
    if (seq) w->step = rc || w->seq.end ? 0 : w->step + 1;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    level_t *lv = w->lv;
    int64_t send_at;
    while (claim(lv, &send_at)) {
        if (send_at) {
            struct timespec ts = {send_at / 1000000000, send_at % 1000000000};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
            }
            if (now_ns() - send_at > 1000000) {
                pthread_mutex_lock(&lv->lock);
                lv->n_delayed++;
                pthread_mutex_unlock(&lv->lock);
            }
        }
        send_one(w);
    }
    while (w->step != 0) /* end the open sequence: the server would hold its slot */
        send_one(w);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double percentile_us(const level_t *lv, int pct)
{
    if (!lv->n_ok) return 0;
    int64_t rank = (lv->n_ok * pct + 99) / 100; /* nearest rank */
    if (rank < 1) rank = 1;
    return (double)lv->latencies_ns[rank - 1] / 1000.0;
}

typedef struct {
    double level, throughput, p50, p90, p95, p99, avg;
    int64_t requests, errors, delayed;
    perf_server_stats_t server;
} result_t;

static int run_level(perf_opts_t *o, double level, result_t *res)
{
    char err[PERF_ERR_LEN];
    perf_server_stats_t before, after;
    level_t lv;
    int n_threads = o->rate_mode ? o->max_threads : (int)level;
    worker_t *workers = calloc((size_t)n_threads, sizeof *workers);
    pthread_t *threads = calloc((size_t)n_threads, sizeof *threads);
    int n_started = 0, rc = 0;

    memset(&lv, 0, sizeof lv);
    lv.opts = o;
    lv.level = level;
    lv.rng = 0x2545f4914f6cdd1dULL;
    pthread_mutex_init(&lv.lock, NULL);
    for (int i = 0; i < n_threads; i++) {
        workers[i].lv = &lv;
        if (!(workers[i].conn = o->transport->connect(&o->req, err))) {
            fprintf(stderr, "nereid-perf: %s\n", err);
            rc = -1;
            goto done;
        }
    }
    if (read_stats(o, &before, err)) {
        fprintf(stderr, "nereid-perf: statistics: %s\n", err);
        rc = -1;
        goto done;
    }
    lv.start_ns = now_ns();
    lv.end_ns = lv.start_ns + o->interval_ms * 1000000;
    for (; n_started < n_threads; n_started++)
        if (pthread_create(&threads[n_started], NULL, worker_main, &workers[n_started])) break;
    for (int i = 0; i < n_started; i++)
        pthread_join(threads[i], NULL);
    if (read_stats(o, &after, err)) {
        fprintf(stderr, "nereid-perf: statistics: %s\n", err);
        rc = -1;
        goto done;
    }
    if (lv.n_ok) qsort(lv.latencies_ns, (size_t)lv.n_ok, sizeof(uint64_t), cmp_u64);
    memset(res, 0, sizeof *res);
    res->level = level;
    res->requests = lv.n_ok + lv.n_err;
    res->errors = lv.n_err;
    res->delayed = lv.n_delayed;
    double elapsed_s = (double)((lv.last_done_ns ? lv.last_done_ns : now_ns()) - lv.start_ns) / 1e9;
    res->throughput = elapsed_s > 0 ? (double)(lv.n_ok * o->batch_size) / elapsed_s : 0;
    res->p50 = percentile_us(&lv, 50);
    res->p90 = percentile_us(&lv, 90);
    res->p95 = percentile_us(&lv, 95);
    res->p99 = percentile_us(&lv, 99);
    double sum = 0;
    for (int64_t i = 0; i < lv.n_ok; i++)
        sum += (double)lv.latencies_ns[i];
    res->avg = lv.n_ok ? sum / (double)lv.n_ok / 1000.0 : 0;
#define DELTA(f) res->server.f = after.f - before.f
    DELTA(success_count);
    DELTA(fail_count);
    DELTA(inference_count);
    DELTA(execution_count);
    DELTA(queue_ns);
    DELTA(compute_input_ns);
    DELTA(compute_infer_ns);
    DELTA(compute_output_ns);
#undef DELTA
    if (lv.n_err)
        fprintf(stderr, "nereid-perf: %" PRId64 " failed requests, first: %s\n", lv.n_err,
                lv.first_error);
done:
    for (int i = 0; i < n_threads; i++)
        o->transport->close(workers[i].conn);
    free(workers);
    free(threads);
    free(lv.latencies_ns);
    pthread_mutex_destroy(&lv.lock);
    return rc;
}

static double per_request_us(uint64_t ns, uint64_t count)
{
    return count ? (double)ns / (double)count / 1000.0 : 0;
}

static void print_result(const perf_opts_t *o, const result_t *r)
{
    const perf_server_stats_t *s = &r->server;
    uint64_t n = s->success_count;
    if (o->rate_mode)
        printf("Request rate: %g\n", r->level);
    else
        printf("Concurrency: %g\n", r->level);
    printf("  Client: %" PRId64 " requests, %" PRId64 " failed", r->requests, r->errors);
    if (o->rate_mode) printf(", %" PRId64 " sent more than 1 ms late", r->delayed);
    printf("\n  Throughput: %.1f infer/sec\n", r->throughput);
    printf("  Latency: avg %.0f usec, p50 %.0f, p90 %.0f, p95 %.0f, p99 %.0f usec\n", r->avg,
           r->p50, r->p90, r->p95, r->p99);
    printf("  Server: %" PRIu64 " requests, %" PRIu64 " inferences, %" PRIu64
           " executions; per request: queue %.0f usec, compute input %.0f, infer %.0f, "
           "output %.0f usec\n",
           n, s->inference_count, s->execution_count, per_request_us(s->queue_ns, n),
           per_request_us(s->compute_input_ns, n), per_request_us(s->compute_infer_ns, n),
           per_request_us(s->compute_output_ns, n));
}

static int write_csv(const perf_opts_t *o, const result_t *r, int n)
{
    FILE *f = fopen(o->csv_path, "w");
    if (!f) {
        fprintf(stderr, "nereid-perf: cannot write %s: %s\n", o->csv_path, strerror(errno));
        return -1;
    }
    fprintf(f,
            "%s,Inferences/Second,Client Requests,Client Failures,p50 latency,p90 latency,"
            "p95 latency,p99 latency,Avg latency,Server Requests,Server Failures,"
            "Server Inferences,Server Executions,Server Queue,Server Compute Input,"
            "Server Compute Infer,Server Compute Output\n",
            o->rate_mode ? "Request Rate" : "Concurrency");
    for (int i = 0; i < n; i++) {
        const perf_server_stats_t *s = &r[i].server;
        uint64_t c = s->success_count;
        fprintf(f,
                "%g,%.1f,%" PRId64 ",%" PRId64 ",%.0f,%.0f,%.0f,%.0f,%.0f,%" PRIu64 ",%" PRIu64
                ",%" PRIu64 ",%" PRIu64 ",%.0f,%.0f,%.0f,%.0f\n",
                r[i].level, r[i].throughput, r[i].requests, r[i].errors, r[i].p50, r[i].p90,
                r[i].p95, r[i].p99, r[i].avg, c, s->fail_count, s->inference_count,
                s->execution_count, per_request_us(s->queue_ns, c),
                per_request_us(s->compute_input_ns, c), per_request_us(s->compute_infer_ns, c),
                per_request_us(s->compute_output_ns, c));
    }
    return fclose(f) ? -1 : 0;
}

static void free_opts(perf_opts_t *o)
{
    for (int i = 0; i < o->req.n_inputs; i++) {
        free(o->req.inputs[i].name);
        free(o->req.inputs[i].data);
    }
    free(o->req.inputs);
    for (int i = 0; i < o->req.n_outputs; i++)
        free(o->req.outputs[i]);
    free(o->req.outputs);
    for (int i = 0; i < o->n_shapes; i++)
        free((char *)o->shapes[i].name);
}

int main(int argc, char **argv)
{
    perf_opts_t o;
    perf_model_meta_t meta;
    char err[PERF_ERR_LEN];
    if (parse_args(argc, argv, &o)) return 2;
    o.transport->init();
    if (o.transport->metadata(&o.req, &meta, err)) {
        fprintf(stderr, "nereid-perf: model '%s' metadata: %s\n", o.req.model, err);
        perf_model_meta_free(&meta);
        o.transport->shutdown();
        return 1;
    }
    int rc = build_inputs(&o, &meta);
    o.is_sequence = meta.is_sequence;
    perf_model_meta_free(&meta);
    if (rc) {
        free_opts(&o);
        o.transport->shutdown();
        return 1;
    }
    printf("*** nereid-perf: model %s, %s at %s, batch size %d, %s inputs", o.req.model,
           o.transport->name, o.req.url, o.batch_size,
           strcmp(o.transport->name, "http") ? "raw"
           : o.req.binary_input              ? "binary"
                                             : "JSON");
    if (o.is_sequence)
        printf(", sequences of %" PRId64 " requests%s", o.sequence_length,
               o.req.sequence_header ? " (ids also in headers)" : "");
    printf("\n");
    int n_levels = (int)((o.range[1] - o.range[0]) / o.range[2]) + 1, n_done = 0, failed = 0;
    result_t *results = calloc((size_t)n_levels, sizeof *results);
    for (; n_done < n_levels; n_done++) {
        double level = (double)(o.range[0] + o.range[2] * n_done);
        if (run_level(&o, level, &results[n_done])) {
            failed = 1;
            break;
        }
        print_result(&o, &results[n_done]);
        failed |= results[n_done].errors > 0;
    }
    if (o.csv_path && write_csv(&o, results, n_done)) failed = 1;
    free(results);
    free_opts(&o);
    o.transport->shutdown();
    return failed ? 1 : 0;
}
