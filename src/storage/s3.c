/*
 * This file contains Amazon S3 (and S3-compatible servers): Triton's
 * s3://[http(s)://host:port/]bucket/path syntax, credentials, ListObjectsV2
 * and GetObject requests signed by libcurl (CURLOPT_AWS_SIGV4, path-style
 * addressing as Triton's client), and the listing's XML.
 */
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "storage/storage_internal.h"

/* SHA-256 of the empty body: a GET's x-amz-content-sha256. */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static bool all_of(const char *s, const char *set, bool alnum)
{
    for (; *s; s++)
        if (!(alnum && isalnum((unsigned char)*s)) && !strchr(set, *s)) return false;
    return true;
}

/* "host:port" with Triton's character sets ([0-9a-zA-Z-.]+:[0-9]+). */
static bool is_host_port(const char *s, size_t n)
{
    const char *colon = memchr(s, ':', n);
    if (!colon || colon == s || colon == s + n - 1) return false;
    for (const char *p = s; p < colon; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.') return false;
    for (const char *p = colon + 1; p < s + n; p++)
        if (!isdigit((unsigned char)*p)) return false;
    return colon + 1 + 5 >= s + n; /* at most 5 digits */
}

static char *cred_string(json_t *o, const char *name)
{
    const char *v = json_string_value(json_object_get(o, name));
    return v && v[0] ? xstrdup(v) : NULL;
}

static char *env_string(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? xstrdup(v) : NULL;
}

static bool header_safe(const char *s)
{
    for (; s && *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return false;
    return true;
}

nereid_error_t *storage_s3_open(storage_remote_t *r, const char *rest)
{
    /* Triton's CleanPath: an optional http(s):// before the host, then
     * leading, trailing and repeated slashes dropped. */
    const char *scheme = NULL;
    if (strncmp(rest, "https://", 8) == 0) {
        scheme = "https";
        rest += 8;
    } else if (strncmp(rest, "http://", 7) == 0) {
        scheme = "http";
        rest += 7;
    }
    char *clean = xmalloc(strlen(rest) + 1), *o = clean;
    for (const char *p = rest; *p; p++)
        if (*p != '/' || (o > clean && o[-1] != '/')) *o++ = *p;
    if (o > clean && o[-1] == '/') o--;
    *o = 0;
    if (!clean[0]) {
        free(clean);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Invalid bucket name: '%s'", rest);
    }
    char *first_end = strchr(clean, '/');
    size_t first_len = first_end ? (size_t)(first_end - clean) : strlen(clean);
    const char *bucket = clean, *path = first_end ? first_end + 1 : "";
    char *host = NULL;
    if (first_end && is_host_port(clean, first_len)) { /* s3://host:port/bucket/path */
        host = xasprintf("%.*s", (int)first_len, clean);
        bucket = first_end + 1;
        char *b_end = strchr(bucket, '/');
        path = b_end ? b_end + 1 : "";
        if (b_end) *b_end = 0;
    } else if (first_end) {
        *first_end = 0;
    }
    nereid_error_t *err = NULL;
    if (!bucket[0])
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "No bucket name found in path: %s", r->url);
    else if (!all_of(bucket, ".-_", true))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "Invalid bucket name: '%s'", bucket);
    if (err) {
        free(host);
        free(clean);
        return err;
    }
    r->bucket = xstrdup(bucket);
    r->prefix = path[0] ? xasprintf("%s/", path) : xstrdup("");
    free(clean);

    /* Credentials: TRITON_CLOUD_CREDENTIAL_PATH's longest match, else the
     * environment. Without a key pair requests go unsigned (a public bucket). */
    json_t *cred = storage_credential_file("s3", r->url, &err);
    if (err) {
        free(host);
        return err;
    }
    if (cred) {
        r->key_id = cred_string(cred, "key_id");
        r->secret = cred_string(cred, "secret_key");
        r->session_token = cred_string(cred, "session_token");
        r->region = cred_string(cred, "region");
        json_decref(cred);
    } else {
        r->key_id = env_string("AWS_ACCESS_KEY_ID");
        r->secret = env_string("AWS_SECRET_ACCESS_KEY");
        r->session_token = env_string("AWS_SESSION_TOKEN");
        r->region = env_string("AWS_DEFAULT_REGION");
    }
    if (!r->key_id || !r->secret) {
        free(r->key_id);
        free(r->secret);
        r->key_id = r->secret = NULL;
    }
    if (!r->region) r->region = xstrdup("us-east-1");
    if (!all_of(r->region, "-", true))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid AWS region '%s'", r->region);
    else if (!header_safe(r->key_id) || !header_safe(r->secret) || !header_safe(r->session_token))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "AWS credentials contain a control character");
    if (err) {
        free(host);
        return err;
    }
    if (host)
        r->endpoint = xasprintf("%s://%s", scheme ? scheme : "http", host);
    else
        r->endpoint = xasprintf("https://s3.%s.amazonaws.com", r->region);
    free(host);
    return NULL;
}

static struct curl_slist *sign(const storage_remote_t *r, const libcurl_api_t *lc, CURL *c)
{
    struct curl_slist *h = lc->slist_append(NULL, "x-amz-content-sha256: " EMPTY_SHA256);
    if (!r->key_id) return h;
    if (r->session_token) {
        char *t = xasprintf("x-amz-security-token: %s", r->session_token);
        h = lc->slist_append(h, t);
        free(t);
    }
    char *sigv4 = xasprintf("aws:amz:%s:s3", r->region);
    lc->easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
    lc->easy_setopt(c, CURLOPT_USERNAME, r->key_id);
    lc->easy_setopt(c, CURLOPT_PASSWORD, r->secret);
    free(sigv4); /* libcurl copies string options */
    return h;
}

static struct curl_slist *s3_prepare_list(const storage_remote_t *r, const libcurl_api_t *lc,
                                          CURL *c, const char *prefix, const char *marker)
{
    /* Query parameters in SigV4's canonical (sorted, encoded) order. */
    char *p = storage_url_encode(prefix, false);
    char *m = marker ? storage_url_encode(marker, false) : NULL;
    char *url = xasprintf("%s/%s?%s%s%slist-type=2&prefix=%s", r->endpoint, r->bucket,
                          m ? "continuation-token=" : "", m ? m : "", m ? "&" : "", p);
    lc->easy_setopt(c, CURLOPT_URL, url);
    free(url);
    free(p);
    free(m);
    return sign(r, lc, c);
}

static struct curl_slist *s3_prepare_get(const storage_remote_t *r, const libcurl_api_t *lc,
                                         CURL *c, const char *key)
{
    char *k = storage_url_encode(key, true);
    char *url = xasprintf("%s/%s/%s", r->endpoint, r->bucket, k);
    lc->easy_setopt(c, CURLOPT_URL, url);
    free(url);
    free(k);
    return sign(r, lc, c);
}

static int s3_parse_list(const char *body, size_t len, storage_listing_t *out, char **next)
{
    const char *p = body, *end = body + len, *in, *in_end;
    *next = NULL;
    if (!storage_xml_next(&p, end, "ListBucketResult", &in, &in_end)) return -1;
    const char *q = in, *b, *b_end;
    while (storage_xml_next(&q, in_end, "Contents", &b, &b_end)) {
        char *key = storage_xml_text(b, b_end, "Key", NULL);
        char *etag = storage_xml_text(b, b_end, "ETag", NULL);
        char *size = storage_xml_text(b, b_end, "Size", NULL);
        char *num_end = NULL;
        unsigned long long n = size ? strtoull(size, &num_end, 10) : 0;
        bool ok = key && etag && size && size[0] && !*num_end && size[0] != '-';
        free(size);
        if (!ok) {
            free(key);
            free(etag);
            return -1;
        }
        storage_unquote(etag);
        storage_listing_add(out, key, etag, n);
    }
    char *trunc = storage_xml_text(in, in_end, "IsTruncated", NULL);
    bool more = trunc && strcmp(trunc, "true") == 0;
    free(trunc);
    if (more) {
        *next = storage_xml_text(in, in_end, "NextContinuationToken", NULL);
        if (!*next || !(*next)[0]) {
            free(*next);
            *next = NULL;
            return -1;
        }
    }
    return 0;
}

const storage_service_t storage_s3 = {
    .scheme = "s3",
    .prepare_list = s3_prepare_list,
    .prepare_get = s3_prepare_get,
    .parse_list = s3_parse_list,
};
