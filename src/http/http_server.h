/*
 * This file contains the HTTP/REST frontend's interface: a KServe v2 server
 * with Triton's extensions on libmicrohttpd, calling only nereid/server.h.
 */
#ifndef NEREID_HTTP_SERVER_H
#define NEREID_HTTP_SERVER_H

#include <stddef.h>

#include "frontend/restricted.h"
#include "frontend/tls.h"
#include "nereid/server.h"
#include "nereid/shm.h"

typedef struct http_options {
    const char *address;                 /* "0.0.0.0", "127.0.0.1", "::" ... */
    int port;                            /* 0 = any free port (see http_server_port) */
    int thread_count;                    /* MHD worker threads; capped at the online CPUs */
    size_t max_input_size;               /* --http-max-input-size, bytes */
    int max_connections;                 /* --http-max-connections: open connections at most */
    int idle_timeout_secs;               /* --http-idle-timeout-secs: 0 = never time out */
    const restricted_apis_t *restricted; /* --http-restricted-api (borrowed); NULL = none */
    tls_options_t tls; /* HTTPS: --http-use-ssl, --http-use-ssl-mutual, --http-*-cert/key */
    const char *header_forward_pattern; /* --http-header-forward-pattern (RE2); NULL = off */
    /* client shared memory (borrowed); NULL = none registered */
    nereid_shm_registry_t *shm;
    bool reuse_port; /* --reuse-http-port: SO_REUSEPORT, several servers on one port (false) */
} http_options_t;

typedef struct http_server http_server_t;

/* Fills opts with Triton's defaults (0.0.0.0:8000, 8 threads, 64 MiB) and
 * ours for what Triton does not bound (4096 connections, 60 s idle). */
void http_options_init(http_options_t *opts);

/* Starts serving core (borrowed until http_server_stop returns). Raises the
 * soft RLIMIT_NOFILE towards the hard one when the connection limit needs
 * it, and lowers the limit (with a warning) when even that is too few. At
 * the limit, a new connection closes the longest-idle keep-alive connection,
 * or is itself closed when every connection has a request in progress.
 * With opts->tls.use_ssl it serves HTTPS (GnuTLS); with tls.mutual the TLS
 * handshake fails unless the client presents a certificate that root_cert
 * signed. On success *out is the running server; on failure (e.g. the port
 * is taken) an UNAVAILABLE error, or INVALID_ARG for unreadable TLS files
 * or a header forwarding pattern RE2 refuses, and *out is NULL. */
nereid_error_t *http_server_start(nereid_server_t *core, const http_options_t *opts,
                                  http_server_t **out);

/* The bound port (useful with port 0). */
int http_server_port(const http_server_t *server);

/* Graceful exit (Triton's HTTPServer::Stop with an exit timeout): closes
 * the listening socket, so new connections are refused, and from now on
 * every reply says "Connection: close" unless its request continues a
 * sequence. Live connections are still served: a request already sent on
 * one is answered. Any thread; NULL is fine. */
void http_server_drain(http_server_t *server);
/* During a drain: closes the keep-alive connections that are idle (except
 * those whose last reply continued a sequence) and those still receiving a
 * request; returns how many. */
size_t http_server_close_idle(http_server_t *server);
/* What a drain waits for: the open connections (first) and the inferences
 * still running whose connection is gone (*n_inflight, may be NULL). */
size_t http_server_open_connections(http_server_t *server, size_t *n_inflight);

/* Stops accepting work, waits until every suspended inference has completed
 * (the core must still be running or have been stopped, which completes
 * them), stops the daemon and frees the server. NULL is fine. */
void http_server_stop(http_server_t *server);

#endif
