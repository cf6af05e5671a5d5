/*
 * This file contains the helpers shared by the HTTP and metrics frontends.
 */
#include "http/http_common.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/infer_reply.h"

int http_resolve(const char *address, int port, struct sockaddr_storage *ss, bool *ipv6)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(address && address[0] ? address : NULL, service, &hints, &res) != 0 || !res)
        return -1;
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *ipv6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

unsigned http_status_from_code(nereid_error_code_t code)
{
    switch (code) {
    case NEREID_ERROR_INTERNAL:
        return 500;
    case NEREID_ERROR_NOT_FOUND:
        return 404;
    case NEREID_ERROR_UNAVAILABLE:
        return 503;
    case NEREID_ERROR_UNSUPPORTED:
        return 501;
    default:
        return 400;
    }
}

enum MHD_Result http_queue_response(struct MHD_Connection *c, unsigned status,
                                    struct MHD_Response *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const http_conn_ctx_t *ctx = ci ? ci->socket_context : NULL;
    if (ctx && ctx->draining && atomic_load(ctx->draining) && !atomic_load(&ctx->keep_open) &&
        !MHD_get_response_header(r, MHD_HTTP_HEADER_CONNECTION))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    return MHD_queue_response(c, status, r);
}

enum MHD_Result http_queue_text(struct MHD_Connection *c, unsigned status, const char *content_type,
                                const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (content_type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result ret = http_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result queue_json(struct MHD_Connection *c, unsigned status, char *json, bool close)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = http_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result http_queue_json_owned(struct MHD_Connection *c, unsigned status, char *json)
{
    return queue_json(c, status, json, false);
}

static enum MHD_Result queue_error(struct MHD_Connection *c, unsigned status, const char *message,
                                   bool close)
{
    sbuf_t b = {0};
    if (sbuf_append_str(&b, "{\"error\":") ||
        sbuf_append_json_string(&b, message, strlen(message)) || sbuf_append_str(&b, "}")) {
        free(b.data);
        return MHD_NO;
    }
    return queue_json(c, status, b.data, close);
}

enum MHD_Result http_queue_error(struct MHD_Connection *c, unsigned status, const char *message)
{
    return queue_error(c, status, message, false);
}

enum MHD_Result http_queue_error_close(struct MHD_Connection *c, unsigned status,
                                       const char *message)
{
    return queue_error(c, status, message, true);
}

enum MHD_Result http_queue_nereid_error(struct MHD_Connection *c, nereid_error_t *err)
{
    enum MHD_Result ret = http_queue_error(c, http_status_from_code(nereid_error_code(err)),
                                           nereid_error_message(err));
    nereid_error_free(err);
    return ret;
}

int http_daemon_port(struct MHD_Daemon *d)
{
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? (int)info->port : -1;
}
