/*
 * This file contains what the object storage layer shares inside itself:
 * the remote repository, the interface each service (S3, Azure Blob)
 * implements, the listing it returns, and the pure helpers (URL encoding,
 * XML listings, key checks) that have unit tests of their own.
 */
#ifndef NEREID_STORAGE_INTERNAL_H
#define NEREID_STORAGE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/libcurl.h"
#include "storage/storage.h"

/* Bounds on what a service sends back. */
#define STORAGE_LIST_PAGE_MAX_BYTES ((size_t)16 << 20) /* one listing page */
#define STORAGE_MAX_OBJECTS 200000                     /* objects in one sync */
#define STORAGE_KEY_MAX_BYTES 1024                     /* S3's and Azure's key limit */
#define STORAGE_ERROR_BODY_MAX_BYTES 4096              /* error text kept */

typedef struct storage_object {
    char *key;     /* full object key (blob name) */
    char *etag;    /* without quotes */
    uint64_t size; /* bytes */
} storage_object_t;

typedef struct storage_listing {
    storage_object_t *objects;
    size_t n, cap;
} storage_listing_t;

/* One service. prepare_* set the URL, headers and signing of a request on
 * a reset curl handle and return the header list the caller frees after
 * the transfer. */
typedef struct storage_service {
    const char *scheme; /* "s3", "as" */
    struct curl_slist *(*prepare_list)(const storage_remote_t *r, const libcurl_api_t *lc, CURL *c,
                                       const char *prefix, const char *marker);
    struct curl_slist *(*prepare_get)(const storage_remote_t *r, const libcurl_api_t *lc, CURL *c,
                                      const char *key);
    /* Parses one listing page into out; *next is the marker of the next
     * page (caller frees) or NULL at the end. -1 when body is no listing. */
    int (*parse_list)(const char *body, size_t len, storage_listing_t *out, char **next);
} storage_service_t;

extern const storage_service_t storage_s3;
extern const storage_service_t storage_azure;

struct storage_remote {
    const storage_service_t *service;
    char *url;      /* as given */
    char *endpoint; /* scheme://host[:port][/path], no trailing slash */
    char *bucket;   /* S3 bucket, Azure container */
    char *prefix;   /* "" or "path/to/repository/" */
    /* S3 */
    char *key_id, *secret, *session_token, *region; /* NULL: anonymous */
    /* Azure */
    char *account;
    unsigned char *account_key; /* decoded; NULL: anonymous */
    size_t account_key_len;
    char *dir;                    /* the mirror */
    _Atomic bool cancel;          /* storage_remote_cancel: transfers under way end */
    pthread_mutex_t lock;         /* one sync at a time; guards the fields below */
    char **models;                /* models in the mirror, sorted */
    uint64_t *sigs;               /* each one's objects (keys, ETags, sizes) when downloaded */
    storage_listing_t *manifests; /* each one's objects, keys relative to the model directory */
    size_t n_models;
    char **failed;         /* models whose last download failed ... */
    uint64_t *failed_sigs; /* ... for these objects: the same failure again is logged verbose */
    size_t n_failed;
};

/* Opens the service-specific part of r from url (after the scheme) and
 * the credentials; NULL or the error. */
nereid_error_t *storage_s3_open(storage_remote_t *r, const char *rest);
nereid_error_t *storage_azure_open(storage_remote_t *r, const char *rest);

/* ---- Pure helpers (storage_util.c) ---- */

/* Percent-encodes s (RFC 3986: all but A-Z a-z 0-9 - . _ ~, and '/' when
 * keep_slash). Caller frees. */
char *storage_url_encode(const char *s, bool keep_slash);
/* The text of the first element <tag> in [p, end) (entities decoded), or
 * NULL when there is none or its text is not valid (a bad entity, a
 * control character). *after, when non-NULL, points past the element. A
 * self-closing <tag/> gives "". Caller frees. */
char *storage_xml_text(const char *p, const char *end, const char *tag, const char **after);
/* The inner span of the next element <tag>...</tag> in [*p, end): true
 * and *inner, *inner_end set, *p moved past it; false when there is none. */
bool storage_xml_next(const char **p, const char *end, const char *tag, const char **inner,
                      const char **inner_end);
/* "Code: Message" from a service's XML error body, else a bounded copy of
 * the body's start; "" when empty. Caller frees. */
char *storage_error_text(const char *body, size_t len);
/* Checks path, relative to a model directory (or a model name when
 * is_model), for the mirror: NULL when every '/'-separated component is
 * a plain name, else why not (static text): absolute, empty component,
 * ".", "..", a control character, too long. A model name also must not
 * start with '.' (the mirror's temporary directories do). */
const char *storage_check_key(const char *path, bool is_model);
/* Appends an object to a listing (takes key and etag). */
void storage_listing_add(storage_listing_t *l, char *key, char *etag, uint64_t size);
void storage_listing_clear(storage_listing_t *l);
/* Strips one pair of surrounding double quotes from s in place. */
void storage_unquote(char *s);
/* Credentials for url from TRITON_CLOUD_CREDENTIAL_PATH: the member of
 * section ("s3", "as") whose name is the longest prefix of url, as a
 * jansson object the caller releases with json_decref; NULL with *err
 * NULL when the variable is not set, NULL with *err when the file cannot
 * be read or no name matches (Triton's text). */
struct json_t *storage_credential_file(const char *section, const char *url, nereid_error_t **err);

#endif
