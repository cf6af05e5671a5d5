/*
 * This file contains nereid's entry point: Triton-compatible command-line
 * flags, creating the server, starting the frontends, and waiting for a
 * signal to shut down. Subcommand: `nereid check-config <path>...`.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "frontend/restricted.h"
#include "frontend/tls.h"
#include "grpc/grpc_server.h"
#include "http/http_server.h"
#include "metrics/metrics_server.h"
#include "nereid/server.h"

#define MAX_LIST 64

typedef struct cli {
    nereid_server_options_t server;
    const char *repos[MAX_LIST];
    size_t n_repos;
    const char *load_models[MAX_LIST];
    size_t n_load_models;
    bool allow_http, allow_grpc, allow_metrics, allow_cpu_metrics;
    const char *http_address, *grpc_address, *metrics_address;
    const char *http_header_forward_pattern, *grpc_header_forward_pattern;
    int http_port, grpc_port, metrics_port, metrics_interval_ms;
    int http_thread_count, grpc_infer_thread_count, grpc_max_response_pool_size;
    long long http_max_input_size;
    int http_max_connections, http_idle_timeout_secs;
    int exit_timeout_secs;
    nereid_rate_limit_resource_t rate_limit_resources[MAX_LIST];
    char rate_limit_names[MAX_LIST][256];
    const char *trace_names[MAX_LIST], *trace_values[MAX_LIST]; /* tracing flags in order */
    size_t n_trace;
    restricted_apis_t http_restricted, grpc_restricted;
    tls_options_t http_tls, grpc_tls;
    const char *cache_configs[MAX_LIST]; /* --cache-config values */
    size_t n_cache_configs;
    const char *cache_byte_size;                         /* --response-cache-byte-size */
    nereid_backend_setting_t backend_settings[MAX_LIST]; /* --backend-config */
    char *backend_setting_text[MAX_LIST];                /* their strings, split in place */
    bool allow_client_shm;
    const char *log_file; /* --log-file; NULL/"" = stderr */
    long long pinned_memory_pool_byte_size;
    bool http_reuse_port;         /* --reuse-http-port */
    grpc_options_t grpc;          /* the gRPC socket flags (keepalive, reuse, compression) */
    const char *grpc_compression; /* --grpc-infer-response-compression-level */
} cli_t;

typedef enum flag_kind {
    FLAG_STR,
    FLAG_INT,
    FLAG_BOOL,
    FLAG_SWITCH,
    FLAG_LIST,
    FLAG_MODE,
    FLAG_LLONG,
    FLAG_LOG_FORMAT,
    FLAG_RATE_LIMIT,
    FLAG_RATE_LIMIT_RESOURCE,
    FLAG_TRACE,          /* tracing flags, parsed together by nereid_tracer_new */
    FLAG_RESTRICTED,     /* Triton's "<groups>:<key>=<value>", repeatable */
    FLAG_SSL_MUTUAL,     /* a bool that also turns use_ssl on (Triton's rule) */
    FLAG_CACHE_CONFIG,   /* --cache-config <name>,<setting>=<value> (repeatable) */
    FLAG_CACHE_BYTES,    /* --response-cache-byte-size: Triton's deprecated local cache size */
    FLAG_BACKEND_CONFIG, /* --backend-config [<backend>,]<setting>=<value> (repeatable) */
    FLAG_METRICS_CONFIG, /* --metrics-config <setting>=<value> (repeatable) */
    FLAG_IGNORED,        /* Triton tuning knob with no effect here: accepted with a warning */
    FLAG_UNSUPPORTED /* Triton feature whose absence would surprise (TLS, restrictions): error */
} flag_kind_t;

typedef struct flag {
    const char *name;
    flag_kind_t kind;
    size_t offset;
    const char *help;
} flag_t;

#define F(name, kind, field, help)                                                                 \
    {                                                                                              \
        name, kind, offsetof(cli_t, field), help                                                   \
    }
static const flag_t flags[] = {
    F("model-repository", FLAG_LIST, repos, "Path to a model repository (repeatable)."),
    F("model-store", FLAG_LIST, repos, "Alias of --model-repository."),
    F("model-control-mode", FLAG_MODE, server.model_control_mode,
      "none|poll|explicit (default none)."),
    F("load-model", FLAG_LIST, load_models,
      "Model to load at start-up in explicit mode; '*' = all."),
    F("repository-poll-secs", FLAG_INT, server.repository_poll_secs,
      "Poll period in poll mode (15)."),
    F("strict-model-config", FLAG_BOOL, server.strict_model_config,
      "Require complete config.pbtxt (false)."),
    F("disable-auto-complete-config", FLAG_SWITCH, server.disable_auto_complete_config,
      "Turn off backend autofill."),
    F("exit-on-error", FLAG_BOOL, server.exit_on_error,
      "Fail start-up if a model fails to load (true)."),
    F("strict-readiness", FLAG_BOOL, server.strict_readiness,
      "Ready only when every model is ready (true)."),
    F("model-progress-timeout-secs", FLAG_INT, server.model_progress_timeout_secs,
      "A model with an execution running this long while none of its instances completed one "
      "is not ready and refuses requests; Python workers are restarted (0: off)."),
    F("model-config-name", FLAG_STR, server.model_config_name,
      "Configure each model by its configs/<name>.pbtxt when it has one (else config.pbtxt)."),
    F("model-load-thread-count", FLAG_INT, server.model_load_thread_count,
      "Models loaded in parallel (4)."),
    F("model-namespacing", FLAG_BOOL, server.model_namespacing,
      "Allow the same model name in several repositories, each in its repository's "
      "namespace (false)."),
    F("model-load-retry-count", FLAG_INT, server.model_load_retry_count,
      "Times a failed model load is tried again before it counts as failed (0)."),
    F("metrics-config", FLAG_METRICS_CONFIG, server,
      "<setting>=<value>: counter_latencies=true|false (true), histogram_latencies=true|false "
      "(false; nv_inference_first_response_histogram_ms and the phase histograms "
      "nv_inference_*_duration_histogram_us), summary_latencies=true|false (false; "
      "nv_inference_*_summary_us), summary_quantiles=<q>:<error>,... (0.5, 0.9, 0.95, 0.99, "
      "0.999)."),
    F("reuse-http-port", FLAG_BOOL, http_reuse_port,
      "Let several servers listen on the HTTP port (SO_REUSEPORT) (false)."),
    F("reuse-grpc-port", FLAG_BOOL, grpc.reuse_port,
      "Let several servers listen on the gRPC port (SO_REUSEPORT) (false)."),
    F("grpc-infer-response-compression-level", FLAG_STR, grpc_compression,
      "none|low|medium|high: compression of inference responses (none)."),
    F("grpc-keepalive-time", FLAG_INT, grpc.keepalive_time_ms,
      "Milliseconds after which a keepalive ping is sent (7200000)."),
    F("grpc-keepalive-timeout", FLAG_INT, grpc.keepalive_timeout_ms,
      "Milliseconds a keepalive ping waits for its acknowledgement (20000)."),
    F("grpc-keepalive-permit-without-calls", FLAG_BOOL, grpc.keepalive_permit_without_calls,
      "Allow keepalive pings with no call in flight (false)."),
    F("grpc-http2-max-pings-without-data", FLAG_INT, grpc.http2_max_pings_without_data,
      "Pings sent with no data before one must be sent (2; 0 = no limit)."),
    F("grpc-http2-min-recv-ping-interval-without-data", FLAG_INT,
      grpc.http2_min_recv_ping_interval_without_data_ms,
      "Milliseconds between pings below which a ping is a strike (300000)."),
    F("grpc-http2-max-ping-strikes", FLAG_INT, grpc.http2_max_ping_strikes,
      "Bad pings tolerated before the connection is closed (2; 0 = any)."),
    F("model-load-on-demand", FLAG_BOOL, server.model_load_on_demand,
      "Explicit or poll mode: load a model on its first request (false)."),
    F("model-memory-budget", FLAG_LLONG, server.model_memory_budget_bytes,
      "With --model-load-on-demand: while loaded models (those loaded by --load-model or the "
      "load API included, never unloaded) use more than these bytes, unload the least "
      "recently used."),
    F("backend-directory", FLAG_STR, server.backend_directory,
      "Where libnereid_<name>.so backends live."),
    F("log-verbose", FLAG_INT, server.log_verbose, "Verbose logging level (0)."),
    F("id", FLAG_STR, server.server_id, "Server name in metadata (triton)."),
    F("allow-http", FLAG_BOOL, allow_http, "Serve HTTP/REST (true)."),
    F("http-port", FLAG_INT, http_port, "HTTP port (8000)."),
    F("http-address", FLAG_STR, http_address, "HTTP address (0.0.0.0)."),
    F("http-thread-count", FLAG_INT, http_thread_count, "HTTP threads (8)."),
    F("http-max-input-size", FLAG_LLONG, http_max_input_size,
      "Maximum HTTP request input size in bytes (67108864)."),
    F("http-max-connections", FLAG_INT, http_max_connections,
      "Open HTTP connections at most; at the limit a new one closes the longest-idle "
      "keep-alive connection (4096)."),
    F("http-idle-timeout-secs", FLAG_INT, http_idle_timeout_secs,
      "Close an HTTP connection idle this long; 0 = never (60)."),
    F("http-restricted-api", FLAG_RESTRICTED, http_restricted,
      "<api>[,<api>...]:<key>=<value>: these API groups need header <key> with <value> "
      "(health, metadata, inference, shared-memory, model-config, model-repository, "
      "statistics, trace, logging)."),
    F("http-use-ssl", FLAG_BOOL, http_tls.use_ssl,
      "Serve HTTPS (GnuTLS) with --http-server-cert/--http-server-key (false)."),
    F("http-use-ssl-mutual", FLAG_SSL_MUTUAL, http_tls.mutual,
      "HTTPS that requires a client certificate signed by --http-root-cert; implies "
      "--http-use-ssl (false)."),
    F("http-server-cert", FLAG_STR, http_tls.server_cert, "PEM file of the HTTPS certificate."),
    F("http-server-key", FLAG_STR, http_tls.server_key, "PEM file of the HTTPS private key."),
    F("http-root-cert", FLAG_STR, http_tls.root_cert,
      "PEM file of the CAs that sign HTTPS client certificates."),
    F("http-header-forward-pattern", FLAG_STR, http_header_forward_pattern,
      "Regex (RE2, case-insensitive): matching HTTP headers become inference request "
      "parameters."),
    F("allow-grpc", FLAG_BOOL, allow_grpc, "Serve gRPC (true)."),
    F("grpc-port", FLAG_INT, grpc_port, "gRPC port (8001)."),
    F("grpc-address", FLAG_STR, grpc_address, "gRPC address (0.0.0.0)."),
    F("grpc-infer-thread-count", FLAG_INT, grpc_infer_thread_count,
      "gRPC completion-queue threads (2)."),
    F("grpc-max-response-pool-size", FLAG_INT, grpc_max_response_pool_size,
      "Decoupled responses a gRPC stream holds queued for writing; the model waits beyond it "
      "(2147483647)."),
    F("grpc-restricted-protocol", FLAG_RESTRICTED, grpc_restricted,
      "<protocol>[,<protocol>...]:<key>=<value>: these RPC groups need metadata "
      "triton-grpc-protocol-<key> with <value> (groups as --http-restricted-api)."),
    F("grpc-header-forward-pattern", FLAG_STR, grpc_header_forward_pattern,
      "Regex (RE2, case-insensitive): matching gRPC metadata become inference request "
      "parameters."),
    F("grpc-use-ssl", FLAG_BOOL, grpc_tls.use_ssl,
      "Serve gRPC over TLS with --grpc-server-cert/--grpc-server-key (false)."),
    F("grpc-use-ssl-mutual", FLAG_SSL_MUTUAL, grpc_tls.mutual,
      "gRPC TLS that requires a client certificate signed by --grpc-root-cert; implies "
      "--grpc-use-ssl (false)."),
    F("grpc-server-cert", FLAG_STR, grpc_tls.server_cert, "PEM file of the gRPC certificate."),
    F("grpc-server-key", FLAG_STR, grpc_tls.server_key, "PEM file of the gRPC private key."),
    F("grpc-root-cert", FLAG_STR, grpc_tls.root_cert,
      "PEM file of the CAs that sign gRPC client certificates."),
    F("allow-metrics", FLAG_BOOL, allow_metrics, "Serve Prometheus metrics (true)."),
    F("metrics-port", FLAG_INT, metrics_port, "Metrics port (8002)."),
    F("metrics-address", FLAG_STR, metrics_address, "Metrics address (the HTTP address)."),
    F("allow-cpu-metrics", FLAG_BOOL, allow_cpu_metrics,
      "Serve the nv_cpu_* host metrics; ignored unless --allow-metrics (true)."),
    F("metrics-interval-ms", FLAG_INT, metrics_interval_ms,
      "Host metrics are refreshed every <metrics-interval-ms> (2000)."),
    F("exit-timeout-secs", FLAG_INT, exit_timeout_secs,
      "On SIGINT/SIGTERM, how long in-flight requests may take before models are stopped "
      "under them (30)."),
    F("log-info", FLAG_BOOL, server.log_info, "Log informational messages (true)."),
    F("log-warning", FLAG_BOOL, server.log_warning, "Log warnings (true)."),
    F("log-error", FLAG_BOOL, server.log_error, "Log errors (true)."),
    F("log-format", FLAG_LOG_FORMAT, server.log_format, "default|ISO8601 (default)."),
    F("log-file", FLAG_STR, log_file, "Write log records to this file (appended), not stderr."),
    F("rate-limit", FLAG_RATE_LIMIT, server.rate_limit,
      "execution_count|off (off): run instances only when their rate_limiter resources are "
      "free, in turn by execution count and priority."),
    F("rate-limit-resource", FLAG_RATE_LIMIT_RESOURCE, rate_limit_resources,
      "<name>:<count>[:<device>] copies of a resource (repeatable; default: the most any "
      "instance needs)."),
    F("trace-config", FLAG_TRACE, trace_names,
      "[<mode>,]<setting>=<value>: tracing (Triton's; modes triton and opentelemetry)."),
#define TRACE_DEPRECATED(name) F(name, FLAG_TRACE, trace_names, "Deprecated: use --trace-config.")
    TRACE_DEPRECATED("trace-file"),
    TRACE_DEPRECATED("trace-level"),
    TRACE_DEPRECATED("trace-rate"),
    TRACE_DEPRECATED("trace-count"),
    TRACE_DEPRECATED("trace-log-frequency"),
#undef TRACE_DEPRECATED
    F("cache-config", FLAG_CACHE_CONFIG, cache_configs,
      "Response cache: <cache_name>,<setting>=<value>, e.g. local,size=1048576 (repeatable)."),
    F("backend-config", FLAG_BACKEND_CONFIG, backend_settings,
      "<backend>,<setting>=<value>: a setting the backend reads; <setting>=<value> sets it "
      "for every backend (repeatable)."),
    F("response-cache-byte-size", FLAG_CACHE_BYTES, cache_byte_size,
      "DEPRECATED: Please use --cache-config instead."),
    F("pinned-memory-pool-byte-size", FLAG_LLONG, pinned_memory_pool_byte_size,
      "Reported as nv_pinned_memory_pool_total_bytes; no pinned pool without CUDA (268435456)."),
    F("allow-client-shm", FLAG_BOOL, allow_client_shm,
      "Allow clients to register/unregister and use system shared memory regions (false)."),
#define IGNORED(name) F(name, FLAG_IGNORED, repos, "Accepted for Triton compatibility; no effect.")
    IGNORED("cache-directory"),
    IGNORED("repoagent-directory"),
    IGNORED("cuda-memory-pool-byte-size"),
    IGNORED("min-supported-compute-capability"),
    IGNORED("buffer-manager-thread-count"),
    IGNORED("allow-gpu-metrics"),
    IGNORED("grpc-infer-allocation-pool-size"),
#undef IGNORED
#define UNSUPPORTED(name) F(name, FLAG_UNSUPPORTED, repos, "Not supported by Nereid (refused).")
    UNSUPPORTED("host-policy"),
#undef UNSUPPORTED
};
#undef F

static void usage(FILE *out)
{
    fprintf(out, "Usage: nereid [--flag=value ...]\n       nereid check-config "
                 "<model-dir-or-repository>...\n\n");
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        fprintf(out, "  --%-30s %s\n", flags[i].name, flags[i].help);
    fprintf(out, "  --%-30s %s\n", "help", "Show this help.");
}

static int parse_bool(const char *v, bool *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no"))
        *out = false;
    else
        return -1;
    return 0;
}

/* std::stoi as Triton's ParseOption<int> uses it: leading space and a
 * trailing rest are accepted. Prints Triton's text and returns -2 on error. */
static int parse_triton_int(const char *text, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text) {
        fprintf(stderr, "nereid: Invalid option value. Got %s\n", text);
        return -2;
    }
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX) {
        fprintf(stderr, "nereid: Provided option value is out of bound. Got %s\n", text);
        return -2;
    }
    *out = (int)v;
    return 0;
}

/* --rate-limit-resource=<name>:<count>[:<device>] (Triton's format and texts). */
/* --backend-config=[<backend>,]<setting>=<value>, split as Triton splits it:
 * the first ',' ends the backend name, the first '=' after it the setting.
 * Returns 0, or -2 with Triton's message printed. */
static int parse_backend_config(cli_t *cli, const char *value)
{
    size_t n = cli->server.n_backend_settings;
    if (n >= MAX_LIST) return -1;
    const char *comma = strchr(value, ',');
    if (comma == value) {
        fprintf(stderr,
                "No backend specified. --backend-config option format is <backend "
                "name>,<setting>=<value> or <setting>=<value>. Got %s\n",
                value);
        return -2;
    }
    const char *setting = comma ? comma + 1 : value;
    const char *eq = strchr(setting, '=');
    if (!eq || eq == setting || !eq[1]) {
        fprintf(stderr,
                "--backend-config option format is '<backend name>,<setting>=<value>'. Got %s\n",
                value);
        return -2;
    }
    char *text = strdup(value);
    if (!text) return -1;
    char *set = text;
    if (comma) {
        text[comma - value] = '\0';
        set = text + (comma - value) + 1;
    }
    char *q = strchr(set, '=');
    *q = '\0';
    cli->backend_setting_text[n] = text;
    cli->backend_settings[n] = (nereid_backend_setting_t){comma ? text : "", set, q + 1};
    cli->server.n_backend_settings = n + 1;
    return 0;
}

/* summary_quantiles=<q>:<error>,... as Triton's ParseQuantiles: a pair
 * without ':' or whose numbers do not parse is reported and skipped; no
 * valid pair keeps the default quantiles (the error bounds are not used:
 * Nereid's quantiles are exact over the window). */
static void parse_summary_quantiles(cli_t *cli, const char *list)
{
    size_t n = 0;
    double q[NEREID_MAX_SUMMARY_QUANTILES];
    while (*list) {
        size_t len = strcspn(list, ",");
        char pair[128];
        snprintf(pair, sizeof pair, "%.*s", (int)(len < sizeof pair ? len : sizeof pair - 1), list);
        char *colon = strchr(pair, ':'), *end = NULL;
        double v = colon ? strtod(pair, &end) : 0;
        if (!colon)
            fprintf(stderr,
                    "Invalid option: [%s]. No ':' delimiter found. Expected format is "
                    "<quantile>:<error>\n",
                    pair);
        else if (end == pair)
            fprintf(stderr, "Invalid option: [%s]. Error: stod\n", pair);
        else if (n < NEREID_MAX_SUMMARY_QUANTILES)
            q[n++] = v;
        list += len + (list[len] == ',');
    }
    if (n == 0) return;
    memcpy(cli->server.metrics_summary_quantiles, q, n * sizeof *q);
    cli->server.n_metrics_summary_quantiles = n;
}

/* Triton's --metrics-config <setting>=<value> (its format errors): the
 * latency families. Triton reads counter_latencies "false" and
 * histogram_latencies "true" only; other settings have no effect there
 * either. */
static int parse_metrics_config(cli_t *cli, const char *value)
{
    const char *eq = strchr(value, '=');
    size_t n = eq ? (size_t)(eq - value) : 0;
    if (!eq || n == 0 || !eq[1] || memchr(value, ',', n)) {
        fprintf(stderr, "--metrics-config option format is <setting>=<value>. Got %s\n", value);
        return -2;
    }
    if (n == strlen("counter_latencies") && !strncmp(value, "counter_latencies", n))
        cli->server.metrics_counter_latencies = strcmp(eq + 1, "false") != 0;
    else if (n == strlen("histogram_latencies") && !strncmp(value, "histogram_latencies", n))
        cli->server.metrics_histogram_latencies = strcmp(eq + 1, "true") == 0;
    else if (n == strlen("summary_latencies") && !strncmp(value, "summary_latencies", n))
        cli->server.metrics_summary_latencies = strcmp(eq + 1, "true") == 0;
    else if (n == strlen("model_memory") && !strncmp(value, "model_memory", n))
        cli->server.metrics_model_memory = strcmp(eq + 1, "true") == 0;
    else if (n == strlen("summary_quantiles") && !strncmp(value, "summary_quantiles", n))
        parse_summary_quantiles(cli, eq + 1);
    return 0;
}

static int parse_rate_limit_resource(cli_t *cli, const char *value)
{
    const char *c1 = strchr(value, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || (c2 && strchr(c2 + 1, ':'))) {
        fprintf(stderr,
                "nereid: --rate-limit-resource option format is "
                "'<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got %s\n",
                value);
        return -2;
    }
    size_t n = cli->server.n_rate_limit_resources, name_len = (size_t)(c1 - value);
    char count_text[32];
    size_t count_len = c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);
    if (n >= MAX_LIST || name_len >= sizeof cli->rate_limit_names[n] ||
        count_len >= sizeof count_text)
        return -1;
    memcpy(count_text, c1 + 1, count_len);
    count_text[count_len] = 0;
    int count, device = -1;
    int rc = parse_triton_int(count_text, &count);
    if (rc == 0 && c2) rc = parse_triton_int(c2 + 1, &device);
    if (rc) return rc;
    if (count < 0) {
        fprintf(stderr, "nereid: Invalid option value. Got %s\n", count_text);
        return -2;
    }
    memcpy(cli->rate_limit_names[n], value, name_len);
    cli->rate_limit_names[n][name_len] = 0;
    cli->rate_limit_resources[n] = (nereid_rate_limit_resource_t){
        .name = cli->rate_limit_names[n], .count = (size_t)count, .device = device};
    cli->server.n_rate_limit_resources = n + 1;
    return 0;
}

static int apply_flag(cli_t *cli, const flag_t *f, const char *value)
{
    char *field = (char *)cli + f->offset;
    switch (f->kind) {
    case FLAG_STR:
        if (f->offset == offsetof(cli_t, server.model_config_name) &&
            (!*value || strchr(value, '/'))) {
            fprintf(stderr, "%s\n",
                    *value ? "Error: --model-config-name must not contain '/'"
                           : "Error: empty argument for --model-config-name");
            return -2;
        }
        *(const char **)field = value;
        return 0;
    case FLAG_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || *end || end == value || v < INT_MIN || v > INT_MAX) return -1;
        *(int *)field = (int)v;
        return 0;
    }
    case FLAG_LLONG: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        bool zero_ok = f->offset == offsetof(cli_t, pinned_memory_pool_byte_size);
        if (errno || *end || end == value || v < 0 || (v == 0 && !zero_ok)) return -1;
        *(long long *)field = v;
        return 0;
    }
    case FLAG_BOOL:
        return parse_bool(value, (bool *)field);
    case FLAG_SSL_MUTUAL: {
        /* Triton: --grpc-use-ssl-mutual sets use_ssl whatever its value. */
        tls_options_t *tls = (tls_options_t *)(field - offsetof(tls_options_t, mutual));
        tls->use_ssl = true;
        return parse_bool(value, &tls->mutual);
    }
    case FLAG_LOG_FORMAT: {
        nereid_log_format_t format;
        nereid_error_t *err = nereid_log_format_parse(value, &format);
        if (!err) {
            *(int *)field = (int)format;
            return 0;
        }
        fprintf(stderr, "nereid: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        return -2;
    }
    case FLAG_RATE_LIMIT:
        if (!strcasecmp(value, "execution_count"))
            cli->server.rate_limit = NEREID_RATE_LIMIT_EXECUTION_COUNT;
        else if (!strcasecmp(value, "off"))
            cli->server.rate_limit = NEREID_RATE_LIMIT_OFF;
        else
            return -1;
        return 0;
    case FLAG_RATE_LIMIT_RESOURCE:
        return parse_rate_limit_resource(cli, value);
    case FLAG_RESTRICTED: {
        bool grpc = strncmp(f->name, "grpc", 4) == 0;
        char *msg =
            restricted_parse((restricted_apis_t *)field, value, f->name,
                             grpc ? "triton-grpc-protocol-" : "", grpc ? "protocol" : "api");
        if (!msg) return 0;
        fprintf(stderr, "%s\n", msg);
        free(msg);
        return -2;
    }
    case FLAG_CACHE_CONFIG:
        if (cli->n_cache_configs >= MAX_LIST) return -1;
        cli->cache_configs[cli->n_cache_configs++] = value;
        return 0;
    case FLAG_BACKEND_CONFIG:
        return parse_backend_config(cli, value);
    case FLAG_METRICS_CONFIG:
        return parse_metrics_config(cli, value);
    case FLAG_CACHE_BYTES: {
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || *end || end == value) return -1;
        (void)v;
        cli->cache_byte_size = value;
        fprintf(stderr,
                "Warning: '--response-cache-byte-size' has been deprecated! This will default to "
                "the 'local' cache implementation with the provided byte size for its config. "
                "Please use '--cache-config' instead. The equivalent --cache-config CLI args "
                "would be: '--cache-config=local,size=%s'\n",
                value);
        return 0;
    }
    case FLAG_IGNORED:
        fprintf(stderr,
                "nereid: warning: --%s is accepted for Triton compatibility and has no "
                "effect\n",
                f->name);
        return 0;
    case FLAG_UNSUPPORTED: {
        bool off;
        /* Turning a feature off is what Nereid does anyway. */
        if (parse_bool(value, &off) == 0 && !off) return 0;
        fprintf(stderr, "nereid: --%s is not supported\n", f->name);
        return -2;
    }
    case FLAG_SWITCH:
        *(bool *)field = true;
        return 0;
    case FLAG_TRACE:
        if (cli->n_trace >= MAX_LIST) return -1;
        cli->trace_names[cli->n_trace] = f->name;
        cli->trace_values[cli->n_trace++] = value;
        return 0;
    case FLAG_LIST: {
        const char **list = (const char **)field;
        size_t *n = f->offset == offsetof(cli_t, repos) ? &cli->n_repos : &cli->n_load_models;
        if (*n >= MAX_LIST) return -1;
        list[(*n)++] = value;
        return 0;
    }
    case FLAG_MODE:
        if (!strcasecmp(value, "none"))
            cli->server.model_control_mode = NEREID_MODEL_CONTROL_NONE;
        else if (!strcasecmp(value, "poll"))
            cli->server.model_control_mode = NEREID_MODEL_CONTROL_POLL;
        else if (!strcasecmp(value, "explicit"))
            cli->server.model_control_mode = NEREID_MODEL_CONTROL_EXPLICIT;
        else
            return -1;
        return 0;
    }
    return -1;
}

/* Returns 0 to run, 1 for --help (exit 0), -1 on a bad flag (message printed). */
static int parse_args(cli_t *cli, int argc, char **argv)
{
    bool strict_given = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) return 1;
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "nereid: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag_t *f = NULL;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (strlen(flags[k].name) == len && !strncmp(flags[k].name, name, len)) f = &flags[k];
        if (!f) {
            fprintf(stderr, "nereid: unrecognized flag '--%.*s' (see --help)\n", (int)len, name);
            return -1;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (f->kind == FLAG_SWITCH) {
            if (value) {
                fprintf(stderr, "nereid: --%s takes no value\n", f->name);
                return -1;
            }
        } else if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "nereid: --%s needs a value\n", f->name);
                return -1;
            }
            value = argv[++i];
        }
        int rc = apply_flag(cli, f, value);
        if (rc == -2) return -1;
        if (rc != 0) {
            fprintf(stderr, "nereid: invalid argument for --%s: '%s'\n", f->name, value);
            return -1;
        }
        if (!strcmp(f->name, "strict-model-config")) {
            fprintf(stderr, "Warning: '--strict-model-config' has been deprecated! Please use "
                            "'--disable-auto-complete-config' instead.\n");
            strict_given = true;
        }
    }
    /* Triton: --disable-auto-complete-config implies --strict-model-config. */
    if (cli->server.disable_auto_complete_config) {
        if (strict_given && !cli->server.strict_model_config)
            fprintf(stderr, "Warning: Overriding deprecated '--strict-model-config' from False to "
                            "True in favor of '--disable-auto-complete-config'!\n");
        cli->server.strict_model_config = true;
    }
    return 0;
}

/* Turns the cache flags into the server's cache options as Triton does
 * (its texts). *json_out is the settings object (caller frees). Returns 0,
 * -1 for a malformed flag (exit 2) or 1 for a configuration the server
 * would refuse (message printed, exit 1). */
static int cache_options(cli_t *cli, char **json_out)
{
    *json_out = NULL;
    if (cli->cache_byte_size && cli->n_cache_configs) {
        fprintf(stderr, "Error: Incompatible flags --response-cache-byte-size and --cache-config "
                        "both provided. Please provide one or the other.\n");
        return -1;
    }
    const char *name = NULL;
    size_t name_len = 0;
    bool multiple = false;
    json_t *settings = json_object();
    if (cli->cache_byte_size) {
        name = "local";
        name_len = 5;
        json_object_set_new(settings, "size", json_string(cli->cache_byte_size));
    }
    for (size_t i = 0; i < cli->n_cache_configs; i++) {
        const char *arg = cli->cache_configs[i], *comma = strchr(arg, ',');
        if (!comma || comma == arg) {
            fprintf(stderr,
                    "No cache specified. --cache-config option format is <cache "
                    "name>,<setting>=<value>. Got %s\n",
                    arg);
            json_decref(settings);
            return -1;
        }
        const char *eq = strchr(comma + 1, '=');
        if (!eq || eq == comma + 1 || !eq[1]) {
            fprintf(stderr,
                    "--cache-config option format is '<cache name>,<setting>=<value>'. "
                    "Got %s\n",
                    arg);
            json_decref(settings);
            return -1;
        }
        size_t len = (size_t)(comma - arg);
        if (!name) {
            name = arg;
            name_len = len;
        } else if (len != name_len || strncmp(name, arg, len) != 0) {
            multiple = true;
        }
        char *key = strndup(comma + 1, (size_t)(eq - comma - 1));
        /* Triton's local cache reads the first of repeated settings. */
        if (!multiple && !json_object_get(settings, key))
            json_object_set_new(settings, key, json_string(eq + 1));
        free(key);
    }
    if (multiple) {
        fprintf(stderr, "error: creating server: Invalid argument - found multiple cache "
                        "configurations, but only a single cache is currently supported\n");
        json_decref(settings);
        return 1;
    }
    if (name) {
        *json_out = json_dumps(settings, JSON_COMPACT | JSON_PRESERVE_ORDER);
        cli->server.cache_name = strndup(name, name_len);
        cli->server.cache_config_json = *json_out;
    }
    json_decref(settings);
    return 0;
}

typedef struct frontends {
    http_server_t *http;
    metrics_server_t *metrics;
    grpc_frontend_t *grpc;
    bool idle_grace_over; /* DRAIN_IDLE_GRACE_SECS have passed since the signal */
} frontends_t;

/* How many of what a drain phase waits for are left; with log, also logs
 * Triton's countdown line ("Timeout <left>: Found ...") when any is. */
typedef size_t (*drain_count_fn)(frontends_t *fe, nereid_server_t *server, int left, bool log);

static void log_countdown(int left, const char *what)
{
    char msg[200];
    snprintf(msg, sizeof msg, "Timeout %d: %s", left, what);
    nereid_log_message(NEREID_LOG_INFO, __FILE__, __LINE__, msg);
}

/* Seconds a drain keeps idle HTTP keep-alive connections open for requests
 * their clients may still send (Triton keeps them until the exit timeout). */
#define DRAIN_IDLE_GRACE_SECS 5

static size_t http_left(frontends_t *fe, nereid_server_t *server, int left, bool log)
{
    (void)server;
    if (fe->idle_grace_over) http_server_close_idle(fe->http);
    size_t n_inflight;
    size_t n = http_server_open_connections(fe->http, &n_inflight);
    if (log && n + n_inflight > 0) {
        char what[100];
        snprintf(what, sizeof what, "Found %zu HTTP service connections", n);
        log_countdown(left, what);
    }
    return n + n_inflight;
}

static size_t grpc_left(frontends_t *fe, nereid_server_t *server, int left, bool log)
{
    (void)server;
    long n = grpc_frontend_calls(fe->grpc);
    if (log && n > 0) {
        char what[100];
        snprintf(what, sizeof what, "Found %ld gRPC service connections and inference handlers", n);
        log_countdown(left, what);
    }
    return n > 0 ? (size_t)n : 0;
}

/* Requests queued in the models (Triton's in-flight inferences); the core
 * logs its countdown lines, so it is asked once a second. */
static size_t models_left(frontends_t *fe, nereid_server_t *server, int left, bool log)
{
    (void)fe;
    return log ? nereid_server_log_inflight(server, left) : 1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* One phase of the graceful exit (Triton's order: HTTP connections, gRPC
 * calls, then requests queued in the models), against the deadline all
 * phases share, t0 + timeout_secs: logs the countdown when the phase
 * starts and once a second while something is left, and looks every
 * 20 ms so the exit is not late. Returns false when the deadline passed
 * first. */
static bool drain_phase(frontends_t *fe, nereid_server_t *server, drain_count_fn count, double t0,
                        int timeout_secs)
{
    for (int logged = -1;;) {
        int elapsed = (int)(now_s() - t0);
        int left = timeout_secs > elapsed ? timeout_secs - elapsed : 0;
        fe->idle_grace_over = elapsed >= DRAIN_IDLE_GRACE_SECS;
        size_t n = count(fe, server, left, elapsed != logged);
        if (elapsed != logged) logged = elapsed;
        if (n == 0) return true;
        if (left == 0) return false;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}

/* Graceful exit on SIGINT/SIGTERM (Triton 25.05+'s, in one countdown of
 * --exit-timeout-secs): at once the server turns not ready (still live)
 * and no new connection or call is accepted; what is in flight completes,
 * and live HTTP connections and open gRPC streams are answered until they
 * end (see http_server_drain, grpc_frontend_drain). When the timeout
 * expires first, the models are stopped under what is left, which fails
 * it, and the remaining calls are cancelled. */
static void drain_and_stop(frontends_t *fe, nereid_server_t *server, int timeout_secs)
{
    double t0 = now_s();
    nereid_server_begin_exit(server);
    http_server_drain(fe->http);
    grpc_frontend_drain(fe->grpc);
    bool done = drain_phase(fe, server, http_left, t0, timeout_secs) &&
                drain_phase(fe, server, grpc_left, t0, timeout_secs);
    if (done) {
        nereid_log_message(NEREID_LOG_INFO, __FILE__, __LINE__,
                           "Waiting for in-flight requests to complete.");
        done = drain_phase(fe, server, models_left, t0, timeout_secs);
    }
    int left = timeout_secs - (int)(now_s() - t0);
    if (!done) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "Exit timeout (%d s) expired with requests in flight: stopping models, "
                 "failing what they hold.",
                 timeout_secs);
        nereid_log_message(NEREID_LOG_ERROR, __FILE__, __LINE__, msg);
    } else {
        nereid_log_message(NEREID_LOG_INFO, __FILE__, __LINE__,
                           "All models are stopped, unloading models");
        nereid_server_log_live_models(server, left > 0 ? left : 0);
    }
    nereid_server_stop(server); /* fails what is still queued; in-flight callbacks run */
    grpc_frontend_stop(fe->grpc);
    http_server_stop(fe->http);
    metrics_server_stop(fe->metrics);
}

/* Whether address:port is taken by another listener (bind fails with
 * EADDRINUSE). */
static bool port_in_use(const char *address, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(address, service, &hints, &ai) != 0 || !ai) return false;
    bool in_use = false;
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        in_use = bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno == EADDRINUSE;
        close(fd);
    }
    freeaddrinfo(ai);
    return in_use;
}

/* A frontend that did not start: Triton's record, "failed to start <name>
 * service: Unavailable - Socket '<address>:<port>' already in use" when
 * another process holds the port, else the frontend's own message. */
static void log_start_failure(const char *name, const char *address, int port,
                              const nereid_error_t *err)
{
    char msg[1024];
    if (port > 0 && port_in_use(address, port))
        snprintf(msg, sizeof msg,
                 "failed to start %s service: Unavailable - Socket '%s:%d' already in use", name,
                 address, port);
    else
        snprintf(msg, sizeof msg, "%s", nereid_error_message(err));
    nereid_log_message(NEREID_LOG_ERROR, __FILE__, __LINE__, msg);
}

/* Triton's "Started <service> at <address>:<port>" log record. */
static void log_started(const char *service, const char *address, int port)
{
    char msg[512];
    snprintf(msg, sizeof msg, "Started %s at %s:%d", service, address, port);
    nereid_log_message(NEREID_LOG_INFO, __FILE__, __LINE__, msg);
}

/* Triton's defaults for the flags that have one other than zero. */
static void cli_defaults(cli_t *cli)
{
    nereid_server_options_init(&cli->server);
    cli->allow_http = cli->allow_grpc = cli->allow_metrics = cli->allow_cpu_metrics = true;
    cli->http_address = cli->grpc_address = "0.0.0.0";
    cli->http_port = 8000;
    cli->grpc_port = 8001;
    cli->metrics_port = 8002;
    cli->metrics_interval_ms = 2000;
    cli->http_thread_count = 8;
    cli->grpc_infer_thread_count = 2;
    cli->grpc_max_response_pool_size = INT_MAX;
    cli->http_max_input_size = 67108864;
    cli->http_max_connections = 4096;
    cli->http_idle_timeout_secs = 60;
    cli->exit_timeout_secs = 30;
    cli->pinned_memory_pool_byte_size = 268435456;
    grpc_options_init(&cli->grpc);
}

/* Checks the flags that depend on each other or have ranges; returns 0, or
 * the exit status after printing the reason. */
static int check_cli(cli_t *cli)
{
    if (cli->n_repos == 0) {
        fprintf(stderr, "nereid: --model-repository must be specified\n");
        return 2;
    }
    if (cli->http_max_connections < 1 || cli->http_idle_timeout_secs < 0) {
        fprintf(stderr, "nereid: --http-max-connections must be >= 1 and "
                        "--http-idle-timeout-secs >= 0\n");
        return 2;
    }
    if (cli->grpc_compression) {
        static const char *const levels[] = {"none", "low", "medium", "high"};
        int level = -1;
        for (int i = 0; i < 4; i++)
            if (!strcasecmp(cli->grpc_compression, levels[i])) level = i;
        if (level < 0) {
            fprintf(stderr, "invalid argument for --grpc_infer_response_compression_level\n");
            return 2;
        }
        cli->grpc.infer_compression_level = level; /* grpc_compression_level's order */
    }
    if (cli->metrics_interval_ms < 0) {
        fprintf(stderr, "nereid: --metrics-interval-ms must be >= 0\n");
        return 2;
    }
    if (cli->grpc_infer_thread_count < 2 || cli->grpc_infer_thread_count > 128) {
        /* Triton's command_line_parser.cc check and text */
        fprintf(stderr, "invalid argument for --grpc_infer_thread_count. Must be in the range 2 "
                        "to 128.\n");
        return 2;
    }
    if (cli->grpc_max_response_pool_size <= 0) {
        /* Triton's command_line_parser.cc check and text */
        fprintf(stderr, "Error: --grpc-max-response-pool-size must be greater than 0.\n");
        return 2;
    }
    return 0;
}

/* The server options the lists and tables of the flags fill. */
static void cli_to_server_options(cli_t *cli)
{
    if (!cli->metrics_address) cli->metrics_address = cli->http_address;
    cli->server.model_repositories = cli->repos;
    cli->server.n_model_repositories = cli->n_repos;
    cli->server.load_models = cli->load_models;
    cli->server.n_load_models = cli->n_load_models;
    cli->server.rate_limit_resources = cli->rate_limit_resources;
    cli->server.backend_settings = cli->backend_settings;
    cli->server.pinned_memory_pool_byte_size = (uint64_t)cli->pinned_memory_pool_byte_size;
}

static nereid_error_t *start_grpc(cli_t *cli, nereid_server_t *server, nereid_shm_registry_t *shm,
                                  frontends_t *fe)
{
    grpc_options_t gopts = cli->grpc; /* defaults and the socket flags */
    gopts.address = cli->grpc_address;
    gopts.port = cli->grpc_port;
    gopts.infer_thread_count = cli->grpc_infer_thread_count;
    gopts.max_response_pool_size = cli->grpc_max_response_pool_size;
    gopts.restricted = &cli->grpc_restricted;
    gopts.tls = cli->grpc_tls;
    gopts.header_forward_pattern = cli->grpc_header_forward_pattern;
    gopts.shm = shm;
    nereid_error_t *err = grpc_frontend_start(server, &gopts, &fe->grpc);
    grpc_frontend_prestart_end();
    if (err) {
        log_start_failure("GRPC", cli->grpc_address, cli->grpc_port, err);
        return err;
    }
    log_started("GRPCInferenceService", cli->grpc_address, grpc_frontend_port(fe->grpc));
    return NULL;
}

static nereid_error_t *start_metrics(cli_t *cli, nereid_server_t *server, frontends_t *fe)
{
    metrics_options_t mo;
    metrics_options_init(&mo);
    mo.address = cli->metrics_address;
    mo.port = cli->metrics_port;
    mo.cpu_metrics = cli->allow_cpu_metrics;
    mo.interval_ms = cli->metrics_interval_ms;
    nereid_error_t *err = metrics_server_start(server, &mo, &fe->metrics);
    if (err) {
        log_start_failure("Metrics", mo.address, mo.port, err);
        return err;
    }
    log_started("Metrics Service", mo.address, metrics_server_port(fe->metrics));
    return NULL;
}

static nereid_error_t *start_http(cli_t *cli, nereid_server_t *server, nereid_shm_registry_t *shm,
                                  frontends_t *fe)
{
    http_options_t ho;
    http_options_init(&ho);
    ho.address = cli->http_address;
    ho.port = cli->http_port;
    ho.thread_count = cli->http_thread_count;
    ho.max_input_size = (size_t)cli->http_max_input_size;
    ho.max_connections = cli->http_max_connections;
    ho.idle_timeout_secs = cli->http_idle_timeout_secs;
    ho.restricted = &cli->http_restricted;
    ho.tls = cli->http_tls;
    ho.header_forward_pattern = cli->http_header_forward_pattern;
    ho.shm = shm;
    ho.reuse_port = cli->http_reuse_port;
    nereid_error_t *err = http_server_start(server, &ho, &fe->http);
    if (err) {
        log_start_failure("HTTP", ho.address, ho.port, err);
        return err;
    }
    log_started("HTTPService", ho.address, http_server_port(fe->http));
    return NULL;
}

/* Starts the enabled frontends; HTTP last: once its port answers, every
 * frontend is up. */
static nereid_error_t *start_frontends(cli_t *cli, nereid_server_t *server,
                                       nereid_shm_registry_t *shm, frontends_t *fe)
{
    nereid_error_t *err = NULL;
    if (cli->allow_grpc && (err = start_grpc(cli, server, shm, fe))) return err;
    if (cli->allow_metrics && (err = start_metrics(cli, server, fe))) return err;
    if (cli->allow_http && (err = start_http(cli, server, shm, fe))) return err;
    return NULL;
}

int main(int argc, char **argv)
{
    /* The ONNX Runtime library Nereid ships (the onnxruntime-node build)
     * records usage telemetry: an SQLite store under
     * ~/.cache/Microsoft/DeveloperTools written and fsynced at every start,
     * and a client that a few seconds after load starts threads resolving
     * its collector's host name (~0.7 MiB). A server keeps its hosts' data
     * to itself and Triton's ONNX Runtime builds have none. Off unless the
     * user set ORT_DISABLE_TELEMETRY=0; set here, before any thread exists
     * (setenv is not thread-safe). */
    setenv("ORT_DISABLE_TELEMETRY", "1", 0);
    if (argc > 1 && strcmp(argv[1], "check-config") == 0)
        return config_check_main(argc - 1, argv + 1);
    static cli_t cli; /* static: what the flags allocate stays reachable on early exits */
    cli_defaults(&cli);
    int rc = parse_args(&cli, argc, argv);
    if (rc == 1) {
        usage(stdout);
        return 0;
    }
    if (rc < 0) return 2;
    if ((rc = check_cli(&cli))) return rc;
    char *cache_json;
    rc = cache_options(&cli, &cache_json);
    if (rc) return rc < 0 ? 2 : 1;
    cli_to_server_options(&cli);

    if (cli.log_file && *cli.log_file) {
        nereid_error_t *lerr = nereid_log_set_file(cli.log_file);
        if (lerr) {
            fprintf(stderr, "nereid: %s\n", nereid_error_message(lerr));
            nereid_error_free(lerr);
            return 1;
        }
    }

    nereid_tracer_t *tracer;
    nereid_error_t *terr =
        nereid_tracer_new(cli.trace_names, cli.trace_values, cli.n_trace, &tracer);
    if (terr) {
        fprintf(stderr, "%s\n", nereid_error_message(terr));
        nereid_error_free(terr);
        return 2;
    }

    /* Block the shutdown signals in every thread; main waits for them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* gRPC's library starts while the models load (after the signal mask:
     * its threads inherit it). */
    if (cli.allow_grpc) grpc_frontend_prestart();
    nereid_server_t *server;
    nereid_error_t *err = nereid_server_new(&cli.server, &server);
    free((char *)cli.server.cache_name);
    for (size_t i = 0; i < cli.server.n_backend_settings; i++)
        free(cli.backend_setting_text[i]);
    free(cache_json);
    nereid_shm_registry_t *shm = nereid_shm_registry_new(cli.allow_client_shm);
    if (err) {
        grpc_frontend_prestart_end();
        fprintf(stderr, "error: creating server: %s - %s\n",
                nereid_error_code_name(nereid_error_code(err)), nereid_error_message(err));
        nereid_error_free(err);
        nereid_tracer_free(tracer);
        nereid_shm_registry_free(shm);
        return 1;
    }
    nereid_server_set_tracer(server, tracer);
    frontends_t fe = {0};
    if ((err = start_frontends(&cli, server, shm, &fe))) {
        fprintf(stderr, "error: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        http_server_stop(fe.http);
        metrics_server_stop(fe.metrics);
        grpc_frontend_stop(fe.grpc);
        nereid_server_free(server);
        nereid_tracer_free(tracer);
        nereid_shm_registry_free(shm);
        return 1;
    }
    fprintf(stderr, "nereid ready\n");
    int sig;
    sigwait(&sigs, &sig);
    fprintf(stderr, "Signal (%d) received.\n", sig);
    drain_and_stop(&fe, server, cli.exit_timeout_secs);
    nereid_server_free(server);
    nereid_tracer_free(tracer);
    restricted_free(&cli.http_restricted);
    restricted_free(&cli.grpc_restricted);
    nereid_shm_registry_free(shm);
    return 0;
}
