/*
 * This file contains what the model configuration module's files share:
 * a growable string buffer for error lists and JSON, the side table of
 * source positions the text-format parser records (so that validation can
 * report file:line:col), and small helpers for editing protobuf-c messages
 * in place (appending to repeated fields, replacing strings).
 */
#ifndef NEREID_CONFIG_INTERNAL_H
#define NEREID_CONFIG_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "config/config.h"

/* Growable NUL-terminated string. A failed allocation sets oom and keeps
 * the text so far. */
typedef struct cfg_buf {
    char *data;
    size_t len;
    size_t cap;
    bool oom;
} cfg_buf_t;

void cfg_buf_append(cfg_buf_t *b, const char *s, size_t n);
void cfg_buf_puts(cfg_buf_t *b, const char *s);
void cfg_buf_printf(cfg_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cfg_buf_vprintf(cfg_buf_t *b, const char *fmt, va_list ap);
/* Returns the malloc'ed text (never NULL unless out of memory) and resets b. */
char *cfg_buf_take(cfg_buf_t *b);
void cfg_buf_free(cfg_buf_t *b);

/* Source positions: one entry per field occurrence the parser saw. msg is
 * the message holding the field, field_id its number (0 = the message value
 * itself, positioned at the field name that introduced it), index the
 * element of a repeated field (-1 = the field as a whole). */
typedef struct cfg_pos {
    const void *msg;
    uint32_t field_id;
    int32_t index;
    uint32_t line;
    uint32_t col;
} cfg_pos_t;

typedef struct cfg_pos_table {
    cfg_pos_t *entries;
    size_t n;
    size_t cap;
} cfg_pos_table_t;

void cfg_pos_add(cfg_pos_table_t *t, const void *msg, uint32_t field_id, int32_t index,
                 uint32_t line, uint32_t col);
/* Attaches t (ownership moves) to the root message root. */
void cfg_pos_attach(const void *root, cfg_pos_table_t *t);
/* Drops the table attached to root, if any. */
void cfg_pos_detach(const void *root);
/* Finds the position of msg's field (index, falling back to the whole field,
 * then to msg itself). Returns false when root has no table or nothing fits. */
bool cfg_pos_find(const void *root, const void *msg, uint32_t field_id, int32_t index,
                  uint32_t *line, uint32_t *col);

/* Field helpers over descriptors. */
const ProtobufCFieldDescriptor *cfg_field_by_name(const ProtobufCMessageDescriptor *d,
                                                  const char *name, size_t len);
/* Size in bytes of one element of a scalar field of type t. */
size_t cfg_scalar_size(ProtobufCType t);
/* Appends one zeroed element to a repeated field and returns its address
 * (for message fields: the slot for the pointer). NULL when out of memory. */
void *cfg_repeated_append(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);
/* Replaces the string at *slot (freeing the old one unless it is the
 * descriptor default). Returns -1 when out of memory. */
int cfg_set_string(char **slot, const char *value);
/* Allocates and initializes a message of descriptor d. */
ProtobufCMessage *cfg_message_new(const ProtobufCMessageDescriptor *d);
/* True when d is a map entry type (protobuf-c represents map<K,V> as a
 * repeated XxxEntry message with fields key = 1 and value = 2). */
bool cfg_is_map_entry(const ProtobufCMessageDescriptor *d);

/* Internal: parses text into a message of descriptor d (used by the tests
 * and the fuzzer for messages other than ModelConfig). */
ProtobufCMessage *cfg_parse_message(const ProtobufCMessageDescriptor *d, const char *text,
                                    size_t len, const char *filename, char **errors);

#endif
