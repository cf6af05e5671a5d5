/*
 * This file contains libcurl, opened at run time rather than linked: it and
 * the ~20 libraries it needs (Kerberos, LDAP, SSH, ...) would otherwise be
 * mapped and relocated at every start, a sizable part of the start-up of a
 * server that exports no traces and reads no remote repository. Users:
 * the OTLP exporter (core/otlp.c) and object storage (src/storage/).
 */
#ifndef NEREID_LIBCURL_H
#define NEREID_LIBCURL_H

#include <curl/curl.h>

typedef struct libcurl_api {
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *curl, CURLoption option, ...);
    CURLcode (*easy_perform)(CURL *curl);
    CURLcode (*easy_getinfo)(CURL *curl, CURLINFO info, ...);
    const char *(*easy_strerror)(CURLcode code);
    void (*easy_reset)(CURL *curl);
    void (*easy_cleanup)(CURL *curl);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *text);
    void (*slist_free_all)(struct curl_slist *list);
} libcurl_api_t;

/* libcurl's functions, opened (and curl_global_init run) by the first call;
 * NULL when libcurl.so.4 cannot be opened, with *why (static text) saying
 * why when why is non-NULL. Any thread. */
const libcurl_api_t *libcurl_get(const char **why);

#endif
