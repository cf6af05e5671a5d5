/*
 * This file contains the TLS settings the HTTP and gRPC frontends share,
 * named after Triton's gRPC flags (--grpc-use-ssl, --grpc-use-ssl-mutual,
 * --grpc-server-cert, --grpc-server-key, --grpc-root-cert; HTTP has the
 * same set as --http-*), and the reading of their PEM files.
 */
#ifndef NEREID_TLS_H
#define NEREID_TLS_H

#include <stdbool.h>

#include "nereid/server.h"

typedef struct tls_options {
    bool use_ssl;            /* serve TLS instead of plaintext */
    bool mutual;             /* require a client certificate signed by root_cert */
    const char *server_cert; /* PEM file: the server's certificate (chain) */
    const char *server_key;  /* PEM file: its private key */
    const char *root_cert;   /* PEM file: CAs that sign client certificates */
} tls_options_t;

/* The PEM texts of opts' files (each NUL-terminated; root NULL when no root
 * certificate is given). Owned; free with tls_pem_free. */
typedef struct tls_pem {
    char *cert, *key, *root;
} tls_pem_t;

/* Reads the files opts names. Errors (INVALID_ARG) name the flag prefix
 * ("--grpc" or "--http") and the file: a missing certificate or key, a
 * mutual setup without a root certificate, an unreadable or empty file. On
 * failure *out is zeroed. */
nereid_error_t *tls_pem_read(const tls_options_t *opts, const char *flag_prefix, tls_pem_t *out);

void tls_pem_free(tls_pem_t *pem);

#endif
