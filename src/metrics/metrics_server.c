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

struct metrics_server {
    nereid_server_t *core;
    struct MHD_Daemon *daemon;
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
    char *text = NULL;
    nereid_error_t *err = nereid_server_metrics(srv->core, &text);
    if (err) {
        free(text);
        return http_queue_nereid_error(mc, err);
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

void metrics_options_init(metrics_options_t *opts)
{
    opts->address = "0.0.0.0";
    opts->port = 8002;
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
    free(srv);
}
