/*
 * This file contains Azure Blob Storage: Triton's as://account/container/path
 * syntax, credentials (Triton's AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY,
 * the Azure SDKs' AZURE_STORAGE_CONNECTION_STRING, whose BlobEndpoint may
 * point at an emulator or a private endpoint), List Blobs and Get Blob
 * requests signed with Shared Key (one HMAC-SHA256 by GnuTLS over the
 * canonical string), and the listing's XML.
 */
#include <ctype.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "storage/storage_internal.h"

#define AZURE_API_VERSION "2021-08-06"
/* The storage emulator's documented well-known account (UseDevelopmentStorage=true). */
#define DEV_ACCOUNT "devstoreaccount1"
#define DEV_KEY                                                                                    \
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#define DEV_ENDPOINT "http://127.0.0.1:10000/" DEV_ACCOUNT

/* The value of name=... in a connection string (';'-separated, names
 * case-insensitive), or NULL. Caller frees. */
static char *conn_value(const char *cs, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = cs; *p;) {
        size_t n = strcspn(p, ";");
        if (n > nl && p[nl] == '=' && strncasecmp(p, name, nl) == 0)
            return xasprintf("%.*s", (int)(n - nl - 1), p + nl + 1);
        p += n;
        if (*p) p++;
    }
    return NULL;
}

static void set_str(char **dst, char *v)
{
    if (!v) return;
    if (!v[0]) {
        free(v);
        return;
    }
    free(*dst);
    *dst = v;
}

nereid_error_t *storage_azure_open(storage_remote_t *r, const char *rest)
{
    /* Triton's pattern: as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)? */
    size_t host_len = strcspn(rest, "/");
    const char *cont = rest + host_len + (rest[host_len] == '/');
    size_t cont_len = strcspn(cont, "/?");
    if (host_len == 0 || rest[host_len] != '/' || cont_len == 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Invalid azure storage path: %s", r->url);
    const char *path = cont + cont_len;
    size_t path_len = 0;
    if (*path == '/') {
        path++;
        path_len = strcspn(path, "?");
    }
    while (path_len && path[path_len - 1] == '/')
        path_len--;
    r->bucket = xasprintf("%.*s", (int)cont_len, cont);
    r->prefix = path_len ? xasprintf("%.*s/", (int)path_len, path) : xstrdup("");
    for (const char *p = r->bucket; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-._$", *p))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Invalid container name: '%s'",
                                    r->bucket);
    char *host = xasprintf("%.*s", (int)host_len, rest);
    char *dot = strstr(host, ".blob.core.windows.net");
    if (dot) *dot = 0;

    char *account = NULL, *key = NULL, *endpoint = NULL;
    nereid_error_t *err = NULL;
    json_t *cred = storage_credential_file("as", r->url, &err);
    if (err) {
        free(host);
        return err;
    }
    if (cred) {
        const char *a = json_string_value(json_object_get(cred, "account_str"));
        const char *k = json_string_value(json_object_get(cred, "account_key"));
        set_str(&account, a ? xstrdup(a) : NULL);
        set_str(&key, k ? xstrdup(k) : NULL);
        json_decref(cred);
    } else {
        const char *cs = getenv("AZURE_STORAGE_CONNECTION_STRING");
        if (cs && cs[0]) {
            char *dev = conn_value(cs, "UseDevelopmentStorage");
            if (dev && strcasecmp(dev, "true") == 0) {
                account = xstrdup(DEV_ACCOUNT);
                key = xstrdup(DEV_KEY);
                endpoint = xstrdup(DEV_ENDPOINT);
            }
            free(dev);
            set_str(&account, conn_value(cs, "AccountName"));
            set_str(&key, conn_value(cs, "AccountKey"));
            set_str(&endpoint, conn_value(cs, "BlobEndpoint"));
            if (!endpoint) {
                char *proto = conn_value(cs, "DefaultEndpointsProtocol");
                char *suffix = conn_value(cs, "EndpointSuffix");
                if (proto || suffix)
                    endpoint =
                        xasprintf("%s://%s.blob.%s", proto ? proto : "https",
                                  account ? account : host, suffix ? suffix : "core.windows.net");
                free(proto);
                free(suffix);
            }
        }
        set_str(&account,
                getenv("AZURE_STORAGE_ACCOUNT") ? xstrdup(getenv("AZURE_STORAGE_ACCOUNT")) : NULL);
        set_str(&key, getenv("AZURE_STORAGE_KEY") ? xstrdup(getenv("AZURE_STORAGE_KEY")) : NULL);
    }
    r->account = account ? account : xstrdup(host);
    if (!endpoint) endpoint = xasprintf("https://%s.blob.core.windows.net", r->account);
    size_t el = strlen(endpoint);
    while (el && endpoint[el - 1] == '/')
        endpoint[--el] = 0;
    r->endpoint = endpoint;
    free(host);
    for (const char *p = r->account; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_') {
            free(key);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid Azure storage account name '%s'", r->account);
        }
    if (strncmp(r->endpoint, "http://", 7) != 0 && strncmp(r->endpoint, "https://", 8) != 0) {
        free(key);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Azure BlobEndpoint '%s' is not an http:// or https:// URL",
                                r->endpoint);
    }
    if (key) {
        gnutls_datum_t in = {(unsigned char *)key, (unsigned)strlen(key)}, out = {0};
        int rc = gnutls_base64_decode2(&in, &out);
        free(key);
        if (rc < 0 || out.size == 0) {
            gnutls_free(out.data);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "the Azure storage account key is not base64: %s",
                                    gnutls_strerror(rc));
        }
        r->account_key = xmalloc(out.size);
        memcpy(r->account_key, out.data, out.size);
        r->account_key_len = out.size;
        gnutls_free(out.data);
    }
    return NULL;
}

/* The path part of r's endpoint ("" or "/account" for an emulator). */
static const char *endpoint_path(const storage_remote_t *r)
{
    const char *p = strstr(r->endpoint, "://");
    p = p ? p + 3 : r->endpoint;
    const char *slash = strchr(p, '/');
    return slash ? slash : "";
}

typedef struct {
    const char *name, *value; /* value as sent before encoding */
} qparam_t;

/* Sets URL and headers of a GET of path (encoded, from the container on)
 * with query parameters q (sorted by name, NULL values left out), signed
 * with Shared Key when r has a key. */
static struct curl_slist *azure_request(const storage_remote_t *r, const libcurl_api_t *lc, CURL *c,
                                        const char *path, const qparam_t *q, size_t n_q)
{
    char *query = xstrdup(""), *canon_q = xstrdup("");
    for (size_t i = 0; i < n_q; i++) {
        if (!q[i].value) continue;
        char *v = storage_url_encode(q[i].value, false);
        char *nq = xasprintf("%s%s%s=%s", query, query[0] ? "&" : "?", q[i].name, v);
        char *nc = xasprintf("%s\n%s:%s", canon_q, q[i].name, q[i].value);
        free(v);
        free(query);
        free(canon_q);
        query = nq;
        canon_q = nc;
    }
    char *url = xasprintf("%s/%s%s", r->endpoint, path, query);
    lc->easy_setopt(c, CURLOPT_URL, url);
    free(url);
    free(query);
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    char *h_date = xasprintf("x-ms-date: %s", date);
    struct curl_slist *h = lc->slist_append(NULL, h_date);
    h = lc->slist_append(h, "x-ms-version: " AZURE_API_VERSION);
    free(h_date);
    if (r->account_key) {
        /* Shared Key: VERB, eleven standard headers (all empty for a GET),
         * the x-ms- headers sorted, then /account/path and the query. */
        char *to_sign =
            xasprintf("GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:%s\nx-ms-version:%s\n/%s%s/%s%s", date,
                      AZURE_API_VERSION, r->account, endpoint_path(r), path, canon_q);
        unsigned char mac[32];
        gnutls_hmac_fast(GNUTLS_MAC_SHA256, r->account_key, r->account_key_len, to_sign,
                         strlen(to_sign), mac);
        gnutls_datum_t in = {mac, sizeof mac}, b64 = {0};
        gnutls_base64_encode2(&in, &b64);
        char *auth = xasprintf("Authorization: SharedKey %s:%.*s", r->account, (int)b64.size,
                               (const char *)b64.data);
        h = lc->slist_append(h, auth);
        free(auth);
        gnutls_free(b64.data);
        free(to_sign);
    }
    free(canon_q);
    return h;
}

static struct curl_slist *azure_prepare_list(const storage_remote_t *r, const libcurl_api_t *lc,
                                             CURL *c, const char *prefix, const char *marker)
{
    qparam_t q[] = {{"comp", "list"},
                    {"marker", marker},
                    {"maxresults", "5000"},
                    {"prefix", prefix},
                    {"restype", "container"}};
    char *path = storage_url_encode(r->bucket, false);
    struct curl_slist *h = azure_request(r, lc, c, path, q, ARRAY_LEN(q));
    free(path);
    return h;
}

static struct curl_slist *azure_prepare_get(const storage_remote_t *r, const libcurl_api_t *lc,
                                            CURL *c, const char *key)
{
    char *b = storage_url_encode(r->bucket, false), *k = storage_url_encode(key, true);
    char *path = xasprintf("%s/%s", b, k);
    struct curl_slist *h = azure_request(r, lc, c, path, NULL, 0);
    free(path);
    free(b);
    free(k);
    return h;
}

static int azure_parse_list(const char *body, size_t len, storage_listing_t *out, char **next)
{
    const char *p = body, *end = body + len, *in, *in_end, *b, *b_end;
    *next = NULL;
    if (!storage_xml_next(&p, end, "EnumerationResults", &in, &in_end)) return -1;
    const char *q = in;
    while (storage_xml_next(&q, in_end, "Blob", &b, &b_end)) {
        char *name = storage_xml_text(b, b_end, "Name", NULL);
        char *etag = storage_xml_text(b, b_end, "Etag", NULL);
        char *size = storage_xml_text(b, b_end, "Content-Length", NULL);
        char *num_end = NULL;
        unsigned long long n = size ? strtoull(size, &num_end, 10) : 0;
        bool ok = name && etag && size && size[0] && !*num_end && size[0] != '-';
        free(size);
        if (!ok) {
            free(name);
            free(etag);
            return -1;
        }
        storage_unquote(etag);
        storage_listing_add(out, name, etag, n);
    }
    *next = storage_xml_text(in, in_end, "NextMarker", NULL);
    if (*next && !(*next)[0]) {
        free(*next);
        *next = NULL;
    }
    return 0;
}

const storage_service_t storage_azure = {
    .scheme = "as",
    .prepare_list = azure_prepare_list,
    .prepare_get = azure_prepare_get,
    .parse_list = azure_parse_list,
};
