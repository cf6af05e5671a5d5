/*
 * This file contains the reading of the TLS files (see tls.h). Triton reads
 * a missing file as empty and then fails to start with gRPC's own message;
 * Nereid names the file instead.
 */
#include "frontend/tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEM_MAX_BYTES (1 << 20)

static nereid_error_t *read_pem(const char *path, const char *flag, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s: unable to read '%s': %s", flag, path,
                                strerror(errno));
    char *buf = malloc(PEM_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, PEM_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    if (n == 0 || n > PEM_MAX_BYTES) {
        free(buf);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s: '%s' is %s", flag, path,
                                n ? "larger than 1 MiB" : "empty");
    }
    buf[n] = '\0';
    *out = buf;
    return NULL;
}

nereid_error_t *tls_pem_read(const tls_options_t *opts, const char *flag_prefix, tls_pem_t *out)
{
    memset(out, 0, sizeof *out);
    char flag[64];
    if (!opts->server_cert || !opts->server_key)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "%s-use-ssl needs %s-server-cert and %s-server-key", flag_prefix,
                                flag_prefix, flag_prefix);
    if (opts->mutual && !opts->root_cert)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s-use-ssl-mutual needs %s-root-cert",
                                flag_prefix, flag_prefix);
    snprintf(flag, sizeof flag, "%s-server-cert", flag_prefix);
    nereid_error_t *err = read_pem(opts->server_cert, flag, &out->cert);
    if (!err) {
        snprintf(flag, sizeof flag, "%s-server-key", flag_prefix);
        err = read_pem(opts->server_key, flag, &out->key);
    }
    if (!err && opts->root_cert) {
        snprintf(flag, sizeof flag, "%s-root-cert", flag_prefix);
        err = read_pem(opts->root_cert, flag, &out->root);
    }
    if (err) tls_pem_free(out);
    return err;
}

void tls_pem_free(tls_pem_t *pem)
{
    free(pem->cert);
    if (pem->key) memset(pem->key, 0, strlen(pem->key)); /* the private key */
    free(pem->key);
    free(pem->root);
    memset(pem, 0, sizeof *pem);
}
