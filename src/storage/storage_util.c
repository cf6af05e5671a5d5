/*
 * This file contains the object storage layer's pure helpers: URL
 * encoding, the little XML that S3 and Azure Blob listings and errors
 * use, object key checks for the mirror, listings, and the matching of
 * TRITON_CLOUD_CREDENTIAL_PATH's credential names. Every input here came
 * from the network or the environment: bounded and checked.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "storage/storage_internal.h"

char *storage_url_encode(const char *s, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = xmalloc(3 * n + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
        if (plain) {
            *o++ = (char)c;
        } else {
            *o++ = '%';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o = 0;
    return out;
}

/* Finds the start of element <tag> (followed by '>', '/' or a space) in
 * [p, end); NULL when none. */
static const char *find_open(const char *p, const char *end, const char *tag)
{
    size_t tl = strlen(tag);
    while (p < end) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (!lt) return NULL;
        if ((size_t)(end - lt) > tl + 1 && memcmp(lt + 1, tag, tl) == 0) {
            char c = lt[1 + tl];
            if (c == '>' || c == '/' || c == ' ' || c == '\t' || c == '\r' || c == '\n') return lt;
        }
        p = lt + 1;
    }
    return NULL;
}

static const char *find_bytes(const char *p, const char *end, const char *s, size_t n)
{
    while ((size_t)(end - p) >= n) {
        const char *c = memchr(p, s[0], (size_t)(end - p) - n + 1);
        if (!c) return NULL;
        if (memcmp(c, s, n) == 0) return c;
        p = c + 1;
    }
    return NULL;
}

bool storage_xml_next(const char **p, const char *end, const char *tag, const char **inner,
                      const char **inner_end)
{
    const char *lt = find_open(*p, end, tag);
    if (!lt) return false;
    const char *gt = memchr(lt, '>', (size_t)(end - lt));
    if (!gt) return false;
    if (gt[-1] == '/') { /* <tag/> */
        *inner = *inner_end = gt + 1;
        *p = gt + 1;
        return true;
    }
    char close[80];
    int cl = snprintf(close, sizeof close, "</%s>", tag);
    if (cl < 0 || (size_t)cl >= sizeof close) return false;
    const char *c = find_bytes(gt + 1, end, close, (size_t)cl);
    if (!c) return false;
    *inner = gt + 1;
    *inner_end = c;
    *p = c + cl;
    return true;
}

/* Appends code point cp as UTF-8; false for 0, surrogates and > U+10FFFF. */
static bool put_utf8(char **o, unsigned long cp)
{
    if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    char *q = *o;
    if (cp < 0x80) {
        *q++ = (char)cp;
    } else if (cp < 0x800) {
        *q++ = (char)(0xC0 | (cp >> 6));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *q++ = (char)(0xE0 | (cp >> 12));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *q++ = (char)(0xF0 | (cp >> 18));
        *q++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    }
    *o = q;
    return true;
}

/* Decodes XML text [p, end): the five named entities and character
 * references; NULL on anything else or a control character but tab/newline. */
static char *xml_decode(const char *p, const char *end)
{
    char *out = xmalloc((size_t)(end - p) + 1), *o = out;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c != '&') {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') goto bad;
            *o++ = (char)c;
            p++;
            continue;
        }
        const char *semi = memchr(p, ';', (size_t)(end - p) < 12 ? (size_t)(end - p) : 12);
        if (!semi) goto bad;
        size_t n = (size_t)(semi - p - 1);
        const char *name = p + 1;
        static const struct {
            const char *name;
            char c;
        } named[] = {{"lt", '<'}, {"gt", '>'}, {"amp", '&'}, {"quot", '"'}, {"apos", '\''}};
        bool done = false;
        for (size_t i = 0; i < ARRAY_LEN(named) && !done; i++)
            if (strlen(named[i].name) == n && memcmp(name, named[i].name, n) == 0) {
                *o++ = named[i].c;
                done = true;
            }
        if (!done) {
            if (n < 2 || name[0] != '#') goto bad;
            bool hexa = name[1] == 'x' || name[1] == 'X';
            const char *d = name + (hexa ? 2 : 1);
            if (d == semi) goto bad;
            unsigned long cp = 0;
            for (; d < semi; d++) {
                int v = *d >= '0' && *d <= '9'           ? *d - '0'
                        : hexa && *d >= 'a' && *d <= 'f' ? *d - 'a' + 10
                        : hexa && *d >= 'A' && *d <= 'F' ? *d - 'A' + 10
                                                         : -1;
                if (v < 0) goto bad;
                cp = cp * (hexa ? 16 : 10) + (unsigned long)v;
                if (cp > 0x10FFFF) goto bad;
            }
            if (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') goto bad;
            if (!put_utf8(&o, cp)) goto bad;
        }
        p = semi + 1;
    }
    *o = 0;
    return out;
bad:
    free(out);
    return NULL;
}

char *storage_xml_text(const char *p, const char *end, const char *tag, const char **after)
{
    const char *in, *in_end;
    if (!storage_xml_next(&p, end, tag, &in, &in_end)) return NULL;
    if (after) *after = p;
    return xml_decode(in, in_end);
}

char *storage_error_text(const char *body, size_t len)
{
    if (!body || !len) return xstrdup("");
    const char *end = body + len;
    char *code = storage_xml_text(body, end, "Code", NULL);
    char *msg = storage_xml_text(body, end, "Message", NULL);
    char *out;
    if (code && msg) {
        /* Azure's messages carry a RequestId and Time on later lines. */
        msg[strcspn(msg, "\r\n")] = 0;
        out = xasprintf("%s: %s", code, msg);
    } else if (code) {
        out = xstrdup(code);
    } else {
        size_t n = len < 200 ? len : 200;
        out = xmalloc(n + 1);
        for (size_t i = 0; i < n; i++)
            out[i] = body[i] >= 0x20 && body[i] < 0x7f ? body[i] : ' ';
        out[n] = 0;
    }
    free(code);
    free(msg);
    return out;
}

const char *storage_check_key(const char *path, bool is_model)
{
    size_t n = strlen(path);
    if (n == 0) return "an empty path component";
    if (n > STORAGE_KEY_MAX_BYTES) return "too long";
    if (path[0] == '/') return "an absolute path";
    const char *p = path;
    for (;;) {
        size_t c = strcspn(p, "/");
        if (c == 0) return "an empty path component";
        if (c > 255) return "a path component longer than 255 bytes";
        if (c == 1 && p[0] == '.') return "a '.' path component";
        if (c == 2 && p[0] == '.' && p[1] == '.') return "a '..' path component";
        for (size_t i = 0; i < c; i++)
            if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f) return "a control character";
        if (is_model && p[c] == '/') return "a '/' in a model name";
        if (!p[c]) break;
        p += c + 1;
    }
    if (is_model && path[0] == '.') return "a model name starting with '.'";
    return NULL;
}

void storage_listing_add(storage_listing_t *l, char *key, char *etag, uint64_t size)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->objects = xrealloc(l->objects, l->cap * sizeof *l->objects);
    }
    l->objects[l->n++] = (storage_object_t){key, etag, size};
}

void storage_listing_clear(storage_listing_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->objects[i].key);
        free(l->objects[i].etag);
    }
    free(l->objects);
    *l = (storage_listing_t){0};
}

void storage_unquote(char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
        memmove(s, s + 1, n - 2);
        s[n - 2] = 0;
    }
}

json_t *storage_credential_file(const char *section, const char *url, nereid_error_t **err)
{
    *err = NULL;
    const char *path = getenv("TRITON_CLOUD_CREDENTIAL_PATH");
    if (!path) return NULL;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to read TRITON_CLOUD_CREDENTIAL_PATH '%s': %s", path,
                                jerr.text);
        return NULL;
    }
    json_t *sec = json_object_get(root, section), *best = NULL;
    size_t best_len = 0;
    const char *name;
    json_t *v;
    if (json_is_object(sec)) json_object_foreach(sec, name, v)
        {
            size_t n = strlen(name);
            if (json_is_object(v) && strncmp(url, name, n) == 0 && (!best || n > best_len)) {
                best = v;
                best_len = n;
            }
        }
    if (!best) {
        *err =
            nereid_error_new(NEREID_ERROR_NOT_FOUND, "Cannot match credential for path  %s", url);
        json_decref(root);
        return NULL;
    }
    json_incref(best);
    json_decref(root);
    return best;
}
