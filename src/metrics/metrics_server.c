/*
 * This file contains the metrics frontend: a small libmicrohttpd daemon on
 * the metrics port that serves nereid_server_metrics as Triton does — GET
 * only (405 otherwise), /metrics and /metrics/ with Prometheus text, and an
 * empty 200 for any other path.
 */
#include "metrics/metrics_server.h"

#include <stdlib.h>
#include <string.h>

#include "http/http_common.h"
#include "metrics/host_metrics.h"

struct metrics_server {
    nereid_server_t *core;
    struct MHD_Daemon *daemon;
    host_metrics_t *host; /* NULL with --allow-cpu-metrics=false */
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version, (void)upload_data;
    metrics_server_t *srv = cls;
    if (!*con_cls) { /* never reply on the first call (keeps keep-alive) */
        *con_cls = srv;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET")) return http_queue_error(mc, 405, "Method Not Allowed");
    if (strcmp(url, "/metrics") && strcmp(url, "/metrics/"))
        return http_queue_text(mc, 200, NULL, NULL, 0);
    char *core_text = NULL;
    nereid_error_t *err = nereid_server_metrics(srv->core, &core_text);
    if (err) {
        free(core_text);
        return http_queue_nereid_error(mc, err);
    }
    char *text = core_text;
    if (srv->host) {
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);
        if (!out) {
            free(core_text);
            return http_queue_error(mc, 500, "unable to build metrics");
        }
        fputs(core_text, out);
        host_metrics_text(srv->host, out);
        fclose(out);
        free(core_text);
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result ret = http_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

void metrics_options_init(metrics_options_t *opts)
{
    opts->address = "0.0.0.0";
    opts->port = 8002;
    opts->cpu_metrics = true;
    opts->interval_ms = 2000;
}

nereid_error_t *metrics_server_start(nereid_server_t *core, const metrics_options_t *opts,
                                     metrics_server_t **out)
{
    *out = NULL;
    struct sockaddr_storage ss;
    bool ipv6 = false;
    if (http_resolve(opts->address, opts->port, &ss, &ipv6))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid metrics address '%s'",
                                opts->address);
    metrics_server_t *srv = calloc(1, sizeof *srv);
    if (!srv) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    srv->core = core;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    srv->daemon = MHD_start_daemon(flags, (uint16_t)opts->port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_END);
    if (srv->daemon && opts->cpu_metrics && !(srv->host = host_metrics_start(opts->interval_ms))) {
        MHD_stop_daemon(srv->daemon);
        srv->daemon = NULL;
    }
    if (!srv->daemon) {
        free(srv);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "failed to start Metrics Service at %s:%d", opts->address,
                                opts->port);
    }
    *out = srv;
    return NULL;
}

int metrics_server_port(const metrics_server_t *srv)
{
    return http_daemon_port(srv->daemon);
}

void metrics_server_stop(metrics_server_t *srv)
{
    if (!srv) return;
    MHD_stop_daemon(srv->daemon);
    host_metrics_stop(srv->host);
    free(srv);
}
