/*
 * This file contains helpers shared by the HTTP and metrics frontends:
 * address resolution, Triton's error-code to HTTP-status mapping and small
 * libmicrohttpd reply helpers.
 */
#ifndef NEREID_HTTP_COMMON_H
#define NEREID_HTTP_COMMON_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "nereid/server.h"

/* The first member of an HTTP connection's socket context (the metrics
 * frontend's connections have none): while the server drains, each reply
 * says "Connection: close" so the client ends the connection after it,
 * unless the request continues a sequence (its next request may follow). */
typedef struct http_conn_ctx {
    const atomic_bool *draining; /* the server's drain flag */
    atomic_bool keep_open;       /* the current request continues an open sequence (written
                                    by the connection's thread, read by the drain's) */
} http_conn_ctx_t;

/* MHD_queue_response with the drain rule above; every reply of the HTTP
 * and metrics frontends goes through it. */
enum MHD_Result http_queue_response(struct MHD_Connection *c, unsigned status,
                                    struct MHD_Response *r);

/* Resolves address:port into *ss. Returns 0, or -1 when it does not resolve. */
int http_resolve(const char *address, int port, struct sockaddr_storage *ss, bool *ipv6);

/* Triton's HttpCodeFromError. */
unsigned http_status_from_code(nereid_error_code_t code);

/* Queues {"error":"<message>"} with status. */
enum MHD_Result http_queue_error(struct MHD_Connection *c, unsigned status, const char *message);
/* The same, then the connection closes (a request whose body is not read). */
enum MHD_Result http_queue_error_close(struct MHD_Connection *c, unsigned status,
                                       const char *message);
/* Queues err (status from its code) and frees it. */
enum MHD_Result http_queue_nereid_error(struct MHD_Connection *c, nereid_error_t *err);
/* Queues body (copied; may be NULL for an empty body) with content_type. */
enum MHD_Result http_queue_text(struct MHD_Connection *c, unsigned status, const char *content_type,
                                const char *body, size_t len);
/* Queues a malloc'ed JSON document, taking ownership. */
enum MHD_Result http_queue_json_owned(struct MHD_Connection *c, unsigned status, char *json);

/* The port a daemon is bound to. */
int http_daemon_port(struct MHD_Daemon *d);

#endif
