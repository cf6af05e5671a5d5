/*
 * This file contains the model configuration module's shared plumbing: the
 * string buffer, the registry of source-position tables (keyed by the root
 * message so that configs parsed on different threads never meet), the
 * protobuf-c editing helpers, and config_copy / config_free.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

void cfg_buf_append(cfg_buf_t *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void cfg_buf_puts(cfg_buf_t *b, const char *s)
{
    cfg_buf_append(b, s, strlen(s));
}

void cfg_buf_vprintf(cfg_buf_t *b, const char *fmt, va_list ap)
{
    char small[256];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    if ((size_t)n < sizeof small) {
        cfg_buf_append(b, small, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            b->oom = true;
        } else {
            vsnprintf(big, (size_t)n + 1, fmt, ap2);
            cfg_buf_append(b, big, (size_t)n);
            free(big);
        }
    }
    va_end(ap2);
}

void cfg_buf_printf(cfg_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cfg_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

char *cfg_buf_take(cfg_buf_t *b)
{
    char *s = b->data;
    if (!s) s = strdup("");
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
    return s;
}

void cfg_buf_free(cfg_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- source positions ---- */

void cfg_pos_add(cfg_pos_table_t *t, const void *msg, uint32_t field_id, int32_t index,
                 uint32_t line, uint32_t col)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        cfg_pos_t *p = realloc(t->entries, cap * sizeof *p);
        if (!p) return; /* positions are best effort */
        t->entries = p;
        t->cap = cap;
    }
    t->entries[t->n++] = (cfg_pos_t){msg, field_id, index, line, col};
}

typedef struct pos_root {
    const void *root;
    cfg_pos_table_t table;
    struct pos_root *next;
} pos_root_t;

static pthread_mutex_t g_pos_lock = PTHREAD_MUTEX_INITIALIZER;
static pos_root_t *g_pos_roots;

void cfg_pos_attach(const void *root, cfg_pos_table_t *t)
{
    pos_root_t *r = malloc(sizeof *r);
    if (!r) {
        free(t->entries);
        return;
    }
    r->root = root;
    r->table = *t;
    *t = (cfg_pos_table_t){0};
    pthread_mutex_lock(&g_pos_lock);
    r->next = g_pos_roots;
    g_pos_roots = r;
    pthread_mutex_unlock(&g_pos_lock);
}

void cfg_pos_detach(const void *root)
{
    pthread_mutex_lock(&g_pos_lock);
    for (pos_root_t **pp = &g_pos_roots; *pp; pp = &(*pp)->next) {
        if ((*pp)->root == root) {
            pos_root_t *r = *pp;
            *pp = r->next;
            free(r->table.entries);
            free(r);
            break;
        }
    }
    pthread_mutex_unlock(&g_pos_lock);
}

bool cfg_pos_find(const void *root, const void *msg, uint32_t field_id, int32_t index,
                  uint32_t *line, uint32_t *col)
{
    bool found = false;
    pthread_mutex_lock(&g_pos_lock);
    const pos_root_t *r = g_pos_roots;
    while (r && r->root != root)
        r = r->next;
    if (r) {
        /* Best match: exact index, then the whole field, then the message. */
        int best = 0;
        for (size_t i = 0; i < r->table.n; i++) {
            const cfg_pos_t *p = &r->table.entries[i];
            if (p->msg != msg) continue;
            int score = 0;
            if (p->field_id == field_id && field_id != 0) {
                if (p->index == index && index >= 0)
                    score = 4;
                else if (p->index == -1)
                    score = 3;
                else if (index < 0)
                    score = 2;
            } else if (p->field_id == 0) {
                score = 1;
            }
            if (score > best) {
                best = score;
                *line = p->line;
                *col = p->col;
                found = true;
            }
        }
    }
    pthread_mutex_unlock(&g_pos_lock);
    return found;
}

/* ---- protobuf-c helpers ---- */

const ProtobufCFieldDescriptor *cfg_field_by_name(const ProtobufCMessageDescriptor *d,
                                                  const char *name, size_t len)
{
    for (unsigned i = 0; i < d->n_fields; i++) {
        const char *fn = d->fields[i].name;
        if (strlen(fn) == len && memcmp(fn, name, len) == 0) return &d->fields[i];
    }
    return NULL;
}

size_t cfg_scalar_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

void *cfg_repeated_append(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    size_t *n = (size_t *)((char *)m + f->quantifier_offset);
    void **arr = (void **)((char *)m + f->offset);
    size_t sz = cfg_scalar_size(f->type);
    char *p = realloc(*arr, (*n + 1) * sz);
    if (!p) return NULL;
    *arr = p;
    memset(p + *n * sz, 0, sz);
    return p + (*n)++ * sz;
}

int cfg_set_string(char **slot, const char *value)
{
    char *s = strdup(value);
    if (!s) return -1;
    if (*slot && *slot != protobuf_c_empty_string) free(*slot);
    *slot = s;
    return 0;
}

ProtobufCMessage *cfg_message_new(const ProtobufCMessageDescriptor *d)
{
    ProtobufCMessage *m = malloc(d->sizeof_message);
    if (m) protobuf_c_message_init(d, m);
    return m;
}

bool cfg_is_map_entry(const ProtobufCMessageDescriptor *d)
{
    size_t n = strlen(d->name);
    return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
           d->fields[0].id == 1 && strcmp(d->fields[0].name, "key") == 0 && d->fields[1].id == 2 &&
           strcmp(d->fields[1].name, "value") == 0;
}

/* ---- copy / free ---- */

model_config_t *config_copy(const model_config_t *cfg)
{
    if (!cfg) return NULL;
    size_t n = protobuf_c_message_get_packed_size(&cfg->base);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return NULL;
    protobuf_c_message_pack(&cfg->base, buf);
    model_config_t *copy = inference__model_config__unpack(NULL, n, buf);
    free(buf);
    return copy;
}

void config_free(model_config_t *cfg)
{
    if (!cfg) return;
    cfg_pos_detach(cfg);
    inference__model_config__free_unpacked(cfg, NULL);
}
