/*
 * This file contains the restricted API groups (see restricted.h): Triton's
 * "<groups>:<key>=<value>" split (first ':' then the first '=' after it,
 * every part non-empty), its group names, and its messages.
 */
#include "frontend/restricted.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const group_names[RESTRICTED_N] = {
#define X(e, name) name,
    RESTRICTED_GROUP_MAP(X)
#undef X
};

static char *text(const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, a, b);
    return s;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

char *restricted_parse(restricted_apis_t *r, const char *arg, const char *option_name,
                       const char *key_prefix, const char *feature_type)
{
    const char *colon = strchr(arg, ':');
    const char *eq = colon ? strchr(colon + 1, '=') : NULL;
    if (!colon || !eq || colon == arg || eq == colon + 1 || !eq[1]) {
        size_t n = strlen(option_name) + strlen(arg) + 64;
        char *msg = malloc(n);
        if (msg)
            snprintf(msg, n, "--%s option format is '<config name>:<setting>=<value>'. Got %s",
                     option_name, arg);
        return msg;
    }
    size_t prefix_len = strlen(key_prefix), key_len = (size_t)(eq - colon - 1);
    /* Check every group before changing r, so a refused flag leaves it as it was. */
    restricted_group_t found[RESTRICTED_N];
    size_t n_found = 0;
    for (const char *p = arg;;) {
        const char *end = memchr(p, ',', (size_t)(colon - p));
        if (!end) end = colon;
        size_t len = (size_t)(end - p);
        restricted_group_t g = RESTRICTED_NONE;
        for (int i = 0; i < RESTRICTED_N; i++)
            if (strlen(group_names[i]) == len && !memcmp(group_names[i], p, len))
                g = (restricted_group_t)i;
        char *name = dup_n(p, len);
        if (!name) return NULL;
        char *msg = NULL;
        bool repeated = false;
        for (size_t k = 0; k < n_found && g != RESTRICTED_NONE; k++)
            repeated |= found[k] == g;
        if (g == RESTRICTED_NONE)
            msg = text("unknown restricted %s '%s' ", feature_type, name);
        else if (r->header[g] || repeated)
            msg = text("restricted %s '%s' can not be specified in multiple config groups",
                       feature_type, name);
        free(name);
        if (msg) return msg;
        found[n_found++] = g;
        if (end == colon) break;
        p = end + 1;
    }
    for (size_t k = 0; k < n_found; k++) {
        restricted_group_t g = found[k];
        char *header = malloc(prefix_len + key_len + 1);
        char *value = strdup(eq + 1);
        if (!header || !value) {
            free(header);
            free(value);
            return NULL;
        }
        memcpy(header, key_prefix, prefix_len);
        memcpy(header + prefix_len, colon + 1, key_len);
        header[prefix_len + key_len] = '\0';
        r->header[g] = header;
        r->value[g] = value;
    }
    return NULL;
}

const char *restricted_header(const restricted_apis_t *r, restricted_group_t g)
{
    if (!r || g < 0 || g >= RESTRICTED_N) return NULL;
    return r->header[g];
}

bool restricted_allows(const restricted_apis_t *r, restricted_group_t g, const char *value)
{
    if (!restricted_header(r, g)) return true;
    return value && strcmp(value, r->value[g]) == 0;
}

void restricted_free(restricted_apis_t *r)
{
    for (int i = 0; i < RESTRICTED_N; i++) {
        free(r->header[i]);
        free(r->value[i]);
        r->header[i] = r->value[i] = NULL;
    }
}
