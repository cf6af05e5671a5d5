/*
 * This file contains a protobuf text-format parser that works over
 * protobuf-c descriptors, so it reads any message of model_config.proto:
 * scalars of every width (decimal, hex, octal; floats with inf/nan), enums
 * by name or number, bools, strings with C escapes (adjacent literals
 * concatenate), repeated fields as [a, b] lists or repeated entries, nested
 * messages in {} or <> with an optional ':', maps as repeated
 * { key: .. value: .. } entries, oneofs, '#' comments, ',' or ';' between
 * fields. Every error carries file:line:col. The position of each field it
 * reads is recorded in a side table so validation can point at it later.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

#define MAX_DEPTH 64

typedef enum tok_kind {
    TOK_EOF,
    TOK_IDENT,
    TOK_NUMBER, /* text includes a leading '-' if any */
    TOK_STRING, /* value decoded into str */
    TOK_PUNCT,
    TOK_ERROR,
} tok_kind_t;

typedef struct token {
    tok_kind_t kind;
    const char *text; /* into the source; for TOK_STRING the raw text */
    size_t len;
    uint32_t line, col;
    char punct;
} token_t;

typedef struct parser {
    const char *src;
    size_t len;
    size_t pos;
    uint32_t line, col;
    const char *filename;
    token_t tok; /* current (lookahead) token */
    cfg_buf_t err;
    bool failed;
    cfg_pos_table_t positions;
    cfg_buf_t strval; /* decoded value of the current TOK_STRING */
} parser_t;

static void fail_at(parser_t *p, uint32_t line, uint32_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_at(parser_t *p, uint32_t line, uint32_t col, const char *fmt, ...)
{
    if (p->failed) return;
    p->failed = true;
    cfg_buf_printf(&p->err, "%s:%u:%u: ", p->filename, line, col);
    va_list ap;
    va_start(ap, fmt);
    cfg_buf_vprintf(&p->err, fmt, ap);
    va_end(ap);
    cfg_buf_puts(&p->err, "\n");
}

/* ---- lexer ---- */

static int peekc(const parser_t *p, size_t ahead)
{
    return p->pos + ahead < p->len ? (unsigned char)p->src[p->pos + ahead] : -1;
}

static void advance(parser_t *p)
{
    if (p->src[p->pos] == '\n') {
        p->line++;
        p->col = 1;
    } else {
        p->col++;
    }
    p->pos++;
}

static bool is_ident_start(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(int c)
{
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

static bool is_hex(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int hex_val(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

static void skip_space(parser_t *p)
{
    for (;;) {
        int c = peekc(p, 0);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            advance(p);
        } else if (c == '#') {
            while (peekc(p, 0) != -1 && peekc(p, 0) != '\n')
                advance(p);
        } else {
            return;
        }
    }
}

static void put_utf8(cfg_buf_t *b, uint32_t cp)
{
    char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    cfg_buf_append(b, out, n);
}

/* Lexes one quoted literal (the opening quote is current) and appends its
 * decoded bytes to p->strval. */
static bool lex_string_literal(parser_t *p)
{
    uint32_t line = p->line, col = p->col;
    int quote = peekc(p, 0);
    advance(p);
    for (;;) {
        int c = peekc(p, 0);
        if (c == -1 || c == '\n') {
            fail_at(p, line, col, "unterminated string literal");
            return false;
        }
        if (c == quote) {
            advance(p);
            return true;
        }
        if (c != '\\') {
            char ch = (char)c;
            cfg_buf_append(&p->strval, &ch, 1);
            advance(p);
            continue;
        }
        uint32_t eline = p->line, ecol = p->col;
        advance(p);
        c = peekc(p, 0);
        char ch;
        switch (c) {
        case 'n':
            ch = '\n';
            break;
        case 't':
            ch = '\t';
            break;
        case 'r':
            ch = '\r';
            break;
        case 'a':
            ch = '\a';
            break;
        case 'b':
            ch = '\b';
            break;
        case 'f':
            ch = '\f';
            break;
        case 'v':
            ch = '\v';
            break;
        case '\\':
            ch = '\\';
            break;
        case '\'':
            ch = '\'';
            break;
        case '"':
            ch = '"';
            break;
        case '?':
            ch = '?';
            break;
        case 'x':
        case 'X': {
            advance(p);
            if (!is_hex(peekc(p, 0))) {
                fail_at(p, eline, ecol, "invalid escape sequence: \\x needs a hex digit");
                return false;
            }
            unsigned v = 0;
            for (int i = 0; i < 2 && is_hex(peekc(p, 0)); i++) {
                v = v * 16 + (unsigned)hex_val(peekc(p, 0));
                advance(p);
            }
            ch = (char)v;
            cfg_buf_append(&p->strval, &ch, 1);
            continue;
        }
        case 'u':
        case 'U': {
            int digits = c == 'u' ? 4 : 8;
            advance(p);
            uint32_t cp = 0;
            for (int i = 0; i < digits; i++) {
                if (!is_hex(peekc(p, 0))) {
                    fail_at(p, eline, ecol, "invalid escape sequence: \\%c needs %d hex digits", c,
                            digits);
                    return false;
                }
                cp = cp * 16 + (uint32_t)hex_val(peekc(p, 0));
                advance(p);
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                fail_at(p, eline, ecol, "invalid unicode code point in escape sequence");
                return false;
            }
            put_utf8(&p->strval, cp);
            continue;
        }
        default:
            if (c >= '0' && c <= '7') {
                unsigned v = 0;
                for (int i = 0; i < 3 && peekc(p, 0) >= '0' && peekc(p, 0) <= '7'; i++) {
                    v = v * 8 + (unsigned)(peekc(p, 0) - '0');
                    advance(p);
                }
                ch = (char)(v & 0xFF);
                cfg_buf_append(&p->strval, &ch, 1);
                continue;
            }
            if (c == -1) {
                fail_at(p, line, col, "unterminated string literal");
            } else {
                fail_at(p, eline, ecol, "invalid escape sequence '\\%c'", c);
            }
            return false;
        }
        cfg_buf_append(&p->strval, &ch, 1);
        advance(p);
    }
}

static void next_token(parser_t *p)
{
    skip_space(p);
    token_t *t = &p->tok;
    t->line = p->line;
    t->col = p->col;
    t->text = p->src + p->pos;
    t->len = 0;
    int c = peekc(p, 0);
    if (c == -1) {
        t->kind = TOK_EOF;
        return;
    }
    size_t start = p->pos;
    if (is_ident_start(c)) {
        while (is_ident_char(peekc(p, 0)))
            advance(p);
        t->kind = TOK_IDENT;
    } else if ((c >= '0' && c <= '9') || c == '.' ||
               (c == '-' && (is_ident_char(peekc(p, 1)) || peekc(p, 1) == '.'))) {
        /* Numbers: digits, letters (hex digits, exponents, suffixes, inf),
         * '.', and a sign right after an exponent. */
        if (c == '-') advance(p);
        int prev = 0;
        for (;;) {
            int d = peekc(p, 0);
            if (is_ident_char(d) || d == '.' ||
                ((d == '-' || d == '+') && (prev == 'e' || prev == 'E') &&
                 !(p->src[start] == '0' && p->pos > start + 1 &&
                   (p->src[start + 1] == 'x' || p->src[start + 1] == 'X')))) {
                prev = d;
                advance(p);
            } else {
                break;
            }
        }
        t->kind = TOK_NUMBER;
    } else if (c == '"' || c == '\'') {
        p->strval.len = 0;
        if (p->strval.data) p->strval.data[0] = '\0';
        for (;;) {
            if (!lex_string_literal(p)) {
                t->kind = TOK_ERROR;
                return;
            }
            skip_space(p);
            if (peekc(p, 0) != '"' && peekc(p, 0) != '\'') break;
        }
        t->kind = TOK_STRING;
    } else if (strchr(":{}<>[],;", c)) {
        advance(p);
        t->kind = TOK_PUNCT;
        t->punct = (char)c;
    } else {
        fail_at(p, t->line, t->col, "unexpected character '%c'", c);
        t->kind = TOK_ERROR;
        return;
    }
    t->len = p->pos - start;
}

static bool tok_is(const parser_t *p, char punct)
{
    return p->tok.kind == TOK_PUNCT && p->tok.punct == punct;
}

/* Describes the current token for "Expected X, got: Y" messages. */
static void describe_token(const parser_t *p, char *out, size_t n)
{
    const token_t *t = &p->tok;
    if (t->kind == TOK_EOF) {
        snprintf(out, n, "end of file");
    } else {
        size_t len = t->len > 40 ? 40 : t->len;
        snprintf(out, n, "%.*s%s", (int)len, t->text, t->len > 40 ? "..." : "");
    }
}

static void expected(parser_t *p, const char *what)
{
    char got[64];
    describe_token(p, got, sizeof got);
    fail_at(p, p->tok.line, p->tok.col, "Expected %s, got: %s", what, got);
}

/* ---- values ---- */

/* Parses an integer token (optional '-', decimal / 0x hex / 0 octal). */
static bool parse_integer_text(const char *s, size_t len, bool *neg, uint64_t *mag)
{
    *neg = false;
    size_t i = 0;
    if (i < len && s[i] == '-') {
        *neg = true;
        i++;
    }
    if (i >= len) return false;
    unsigned base = 10;
    if (s[i] == '0' && i + 1 < len && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        base = 16;
        i += 2;
        if (i >= len) return false;
    } else if (s[i] == '0' && i + 1 < len) {
        base = 8;
        i++;
    }
    uint64_t v = 0;
    for (; i < len; i++) {
        int c = (unsigned char)s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (base == 16 && is_hex(c))
            d = (unsigned)hex_val(c);
        else
            return false;
        if (d >= base) return false;
        if (v > (UINT64_MAX - d) / base) {
            *mag = UINT64_MAX;
            return false;
        }
        v = v * base + d;
    }
    *mag = v;
    return true;
}

static bool ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen) return false;
    for (size_t i = 0; i < alen; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
        if (x != y) return false;
    }
    return true;
}

static bool parse_float_text(const char *s, size_t len, double *out)
{
    bool neg = len > 0 && s[0] == '-';
    const char *b = s + (neg ? 1 : 0);
    size_t blen = len - (neg ? 1 : 0);
    if (ieq(b, blen, "inf") || ieq(b, blen, "infinity") || ieq(b, blen, "inff") ||
        ieq(b, blen, "infinityf")) {
        *out = neg ? -INFINITY : INFINITY;
        return true;
    }
    if (ieq(b, blen, "nan") || ieq(b, blen, "nanf")) {
        *out = NAN;
        return true;
    }
    if (len == 0 || len > 128) return false;
    char tmp[130];
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    if (len > 1 && (tmp[len - 1] == 'f' || tmp[len - 1] == 'F') &&
        !(len > 2 && tmp[0] == '0' && (tmp[1] == 'x' || tmp[1] == 'X')))
        tmp[--len] = '\0';
    /* Hex and octal integers are allowed for floats; decimals go to strtod. */
    bool ineg;
    uint64_t mag;
    if (parse_integer_text(tmp, len, &ineg, &mag)) {
        *out = ineg ? -(double)mag : (double)mag;
        return true;
    }
    for (size_t i = 0; i < len; i++) {
        char c = tmp[i];
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+'))
            return false;
    }
    char *end;
    errno = 0;
    *out = strtod(tmp, &end);
    return end == tmp + len && end != tmp;
}

static const char *type_name(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
        return "int32";
    case PROTOBUF_C_TYPE_SINT32:
        return "sint32";
    case PROTOBUF_C_TYPE_SFIXED32:
        return "sfixed32";
    case PROTOBUF_C_TYPE_UINT32:
        return "uint32";
    case PROTOBUF_C_TYPE_FIXED32:
        return "fixed32";
    case PROTOBUF_C_TYPE_INT64:
        return "int64";
    case PROTOBUF_C_TYPE_SINT64:
        return "sint64";
    case PROTOBUF_C_TYPE_SFIXED64:
        return "sfixed64";
    case PROTOBUF_C_TYPE_UINT64:
        return "uint64";
    case PROTOBUF_C_TYPE_FIXED64:
        return "fixed64";
    case PROTOBUF_C_TYPE_FLOAT:
        return "float";
    case PROTOBUF_C_TYPE_DOUBLE:
        return "double";
    case PROTOBUF_C_TYPE_BOOL:
        return "bool";
    case PROTOBUF_C_TYPE_ENUM:
        return "enum";
    case PROTOBUF_C_TYPE_STRING:
        return "string";
    case PROTOBUF_C_TYPE_BYTES:
        return "bytes";
    case PROTOBUF_C_TYPE_MESSAGE:
        return "message";
    }
    return "?";
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

/* An integer field of any width and signedness, range-checked. */
static bool parse_integer_field(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    token_t *t = &p->tok;
    bool neg;
    uint64_t mag = 0;
    if (t->kind != TOK_NUMBER) {
        expected(p, "integer");
        return false;
    }
    if (!parse_integer_text(t->text, t->len, &neg, &mag)) {
        if (mag == UINT64_MAX) {
            fail_at(p, t->line, t->col, "Integer out of range (%.*s) for %s field \"%s\"",
                    (int)t->len, t->text, type_name(f->type), f->name);
        } else {
            expected(p, "integer");
        }
        return false;
    }
    bool is64 = cfg_scalar_size(f->type) == 8;
    bool is_unsigned = f->type == PROTOBUF_C_TYPE_UINT32 || f->type == PROTOBUF_C_TYPE_FIXED32 ||
                       f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_FIXED64;
    uint64_t max_pos = is_unsigned ? (is64 ? UINT64_MAX : UINT32_MAX)
                                   : (is64 ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX);
    uint64_t max_neg = is_unsigned ? 0 : (is64 ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT32_MAX + 1);
    if ((neg && mag > max_neg) || (!neg && mag > max_pos)) {
        fail_at(p, t->line, t->col, "Integer out of range (%.*s) for %s field \"%s\"", (int)t->len,
                t->text, type_name(f->type), f->name);
        return false;
    }
    if (neg && mag == 0) neg = false;
    if (is64) {
        uint64_t v = neg ? (uint64_t)0 - mag : mag;
        memcpy(dst, &v, 8);
    } else {
        uint32_t v = neg ? (uint32_t)0 - (uint32_t)mag : (uint32_t)mag;
        memcpy(dst, &v, 4);
    }
    return true;
}

/* A float or double field (inf, nan and their spellings included). */
static bool parse_float_field(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    token_t *t = &p->tok;
    double d;
    if ((t->kind != TOK_NUMBER && t->kind != TOK_IDENT) || !parse_float_text(t->text, t->len, &d)) {
        expected(p, "double");
        return false;
    }
    if (f->type == PROTOBUF_C_TYPE_FLOAT) {
        float v = (float)d;
        memcpy(dst, &v, 4);
    } else {
        memcpy(dst, &d, 8);
    }
    return true;
}

/* A bool field: true/True/t/1 or false/False/f/0. */
static bool parse_bool_field(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    token_t *t = &p->tok;
    protobuf_c_boolean v;
    if (t->kind == TOK_IDENT &&
        ((t->len == 4 && memcmp(t->text, "true", 4) == 0) ||
         (t->len == 4 && memcmp(t->text, "True", 4) == 0) || (t->len == 1 && t->text[0] == 't'))) {
        v = 1;
    } else if (t->kind == TOK_IDENT && ((t->len == 5 && memcmp(t->text, "false", 5) == 0) ||
                                        (t->len == 5 && memcmp(t->text, "False", 5) == 0) ||
                                        (t->len == 1 && t->text[0] == 'f'))) {
        v = 0;
    } else if (t->kind == TOK_NUMBER && t->len == 1 && (t->text[0] == '0' || t->text[0] == '1')) {
        v = t->text[0] == '1';
    } else {
        char got[64];
        describe_token(p, got, sizeof got);
        fail_at(p, t->line, t->col, "Invalid value for boolean field \"%s\". Value: \"%s\".",
                f->name, got);
        return false;
    }
    memcpy(dst, &v, sizeof v);
    return true;
}

/* An enum field by value name or number. */
static bool parse_enum_field(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    token_t *t = &p->tok;
    const ProtobufCEnumDescriptor *ed = f->descriptor;
    int32_t v;
    if (t->kind == TOK_IDENT) {
        const ProtobufCEnumValue *ev = NULL;
        for (unsigned i = 0; i < ed->n_values; i++) {
            if (strlen(ed->values[i].name) == t->len &&
                memcmp(ed->values[i].name, t->text, t->len) == 0) {
                ev = &ed->values[i];
                break;
            }
        }
        if (!ev) {
            fail_at(p, t->line, t->col, "Unknown enumeration value of \"%.*s\" for field \"%s\".",
                    (int)t->len, t->text, f->name);
            return false;
        }
        v = ev->value;
    } else if (t->kind == TOK_NUMBER) {
        bool neg;
        uint64_t mag;
        if (!parse_integer_text(t->text, t->len, &neg, &mag) ||
            mag > (neg ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT32_MAX)) {
            expected(p, "integer");
            return false;
        }
        v = neg ? (int32_t)(0 - (int64_t)mag) : (int32_t)mag;
    } else {
        expected(p, "identifier");
        return false;
    }
    memcpy(dst, &v, 4);
    return true;
}

/* A string field: UTF-8 without NUL; replaces the old value. */
static bool parse_string_field(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    token_t *t = &p->tok;
    if (t->kind != TOK_STRING) {
        expected(p, "string");
        return false;
    }
    if (p->strval.len && memchr(p->strval.data, '\0', p->strval.len)) {
        fail_at(p, t->line, t->col, "String field \"%s\" contains a NUL character", f->name);
        return false;
    }
    if (!valid_utf8((const unsigned char *)p->strval.data, p->strval.len)) {
        fail_at(p, t->line, t->col, "String field \"%s\" contains invalid UTF-8 data", f->name);
        return false;
    }
    char *s = malloc(p->strval.len + 1);
    if (!s) {
        fail_at(p, t->line, t->col, "out of memory");
        return false;
    }
    if (p->strval.len) memcpy(s, p->strval.data, p->strval.len);
    s[p->strval.len] = '\0';
    char **slot = dst;
    if (*slot && *slot != (const char *)f->default_value && *slot != protobuf_c_empty_string)
        free(*slot);
    *slot = s;
    return true;
}

/* A bytes field; replaces the old value. */
static bool parse_bytes_field(parser_t *p, void *dst)
{
    token_t *t = &p->tok;
    if (t->kind != TOK_STRING) {
        expected(p, "string");
        return false;
    }
    ProtobufCBinaryData *bd = dst;
    uint8_t *d = malloc(p->strval.len + 1);
    if (!d) return false;
    if (p->strval.len) memcpy(d, p->strval.data, p->strval.len);
    free(bd->data);
    bd->data = d;
    bd->len = p->strval.len;
    return true;
}

/* Parses the current token as a scalar of field f and stores it at dst. */
static bool parse_scalar(parser_t *p, const ProtobufCFieldDescriptor *f, void *dst)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return parse_integer_field(p, f, dst);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
        return parse_float_field(p, f, dst);
    case PROTOBUF_C_TYPE_BOOL:
        return parse_bool_field(p, f, dst);
    case PROTOBUF_C_TYPE_ENUM:
        return parse_enum_field(p, f, dst);
    case PROTOBUF_C_TYPE_STRING:
        return parse_string_field(p, f, dst);
    case PROTOBUF_C_TYPE_BYTES:
        return parse_bytes_field(p, dst);
    case PROTOBUF_C_TYPE_MESSAGE:
        break;
    }
    return false;
}

/* ---- messages ---- */

static bool parse_fields(parser_t *p, ProtobufCMessage *m, char close, int depth);

/* Edit distance for "did you mean" hints. */
static size_t edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

static void unknown_field(parser_t *p, const ProtobufCMessageDescriptor *d, const token_t *t)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (unsigned i = 0; i < d->n_fields; i++) {
        size_t dist = edit_distance(t->text, t->len, d->fields[i].name);
        size_t fl = strlen(d->fields[i].name);
        if (t->len >= 3 && dist >= best_d &&
            ((fl > t->len && memcmp(d->fields[i].name, t->text, t->len) == 0) ||
             (t->len > fl && memcmp(t->text, d->fields[i].name, fl) == 0)))
            dist = best_d - 1; /* a prefix of the real name (or the reverse) */
        if (dist < best_d) {
            best_d = dist;
            best = d->fields[i].name;
        }
    }
    if (best) {
        fail_at(p, t->line, t->col,
                "Message type \"%s\" has no field named \"%.*s\" (did you mean \"%s\"?)", d->name,
                (int)t->len, t->text, best);
    } else {
        fail_at(p, t->line, t->col, "Message type \"%s\" has no field named \"%.*s\"", d->name,
                (int)t->len, t->text);
    }
}

/* Parses one message value: the current token is '{' or '<'. */
static bool parse_message_value(parser_t *p, ProtobufCMessage *sub, int depth)
{
    if (depth >= MAX_DEPTH) {
        fail_at(p, p->tok.line, p->tok.col, "Message is too deep (more than %d levels)", MAX_DEPTH);
        return false;
    }
    char close;
    if (tok_is(p, '{'))
        close = '}';
    else if (tok_is(p, '<'))
        close = '>';
    else {
        expected(p, "\"{\"");
        return false;
    }
    next_token(p);
    return parse_fields(p, sub, close, depth + 1);
}

/* Returns the message slot for a singular message field, creating it. */
static ProtobufCMessage *singular_message(parser_t *p, ProtobufCMessage *m,
                                          const ProtobufCFieldDescriptor *f)
{
    ProtobufCMessage **slot = (ProtobufCMessage **)((char *)m + f->offset);
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        uint32_t *qcase = (uint32_t *)((char *)m + f->quantifier_offset);
        if (*qcase != f->id) *slot = NULL; /* another member's value was cleared already */
    }
    if (!*slot) {
        *slot = cfg_message_new(f->descriptor);
        if (!*slot) fail_at(p, p->tok.line, p->tok.col, "out of memory");
    }
    return *slot;
}

/* Clears the value of the oneof member currently set in m's oneof of f. */
static void clear_oneof(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    uint32_t cur = *(uint32_t *)((char *)m + f->quantifier_offset);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *o = &d->fields[i];
        if (o->id != cur || o->quantifier_offset != f->quantifier_offset) continue;
        void *val = (char *)m + o->offset;
        if (o->type == PROTOBUF_C_TYPE_MESSAGE) {
            ProtobufCMessage **sm = val;
            if (*sm) protobuf_c_message_free_unpacked(*sm, NULL);
            *sm = NULL;
        } else if (o->type == PROTOBUF_C_TYPE_STRING) {
            char **s = val;
            if (*s && *s != protobuf_c_empty_string && *s != (const char *)o->default_value)
                free(*s);
            *s = NULL;
        } else if (o->type == PROTOBUF_C_TYPE_BYTES) {
            ProtobufCBinaryData *bd = val;
            free(bd->data);
            bd->data = NULL;
            bd->len = 0;
        }
    }
}

/* Finds the oneof member currently set alongside f, if it is not f. */
static const ProtobufCFieldDescriptor *other_oneof_member(const ProtobufCMessage *m,
                                                          const ProtobufCFieldDescriptor *f)
{
    uint32_t cur = *(const uint32_t *)((const char *)m + f->quantifier_offset);
    if (cur == 0 || cur == f->id) return NULL;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == cur && d->fields[i].quantifier_offset == f->quantifier_offset)
            return &d->fields[i];
    return NULL;
}

/* Tracks which singular fields were already given in one message body. */
typedef struct seen_set {
    uint32_t ids[64];
    size_t n;
} seen_set_t;

static bool seen_check_add(seen_set_t *s, uint32_t id)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->ids[i] == id) return true;
    if (s->n < 64) s->ids[s->n++] = id;
    return false;
}

static bool parse_one_value(parser_t *p, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                            int32_t index, int depth)
{
    uint32_t line = p->tok.line, col = p->tok.col;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        ProtobufCMessage *sub;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            ProtobufCMessage **slot = cfg_repeated_append(m, f);
            if (!slot) {
                fail_at(p, line, col, "out of memory");
                return false;
            }
            *slot = cfg_message_new(f->descriptor);
            if (!*slot) {
                size_t *n = (size_t *)((char *)m + f->quantifier_offset);
                (*n)--;
                fail_at(p, line, col, "out of memory");
                return false;
            }
            sub = *slot;
        } else {
            sub = singular_message(p, m, f);
            if (!sub) return false;
        }
        cfg_pos_add(&p->positions, sub, 0, -1, line, col);
        if (index >= 0) cfg_pos_add(&p->positions, m, f->id, index, line, col);
        return parse_message_value(p, sub, depth);
    }
    void *dst;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        dst = cfg_repeated_append(m, f);
        if (!dst) {
            fail_at(p, line, col, "out of memory");
            return false;
        }
        if (f->type == PROTOBUF_C_TYPE_STRING) *(char **)dst = NULL;
        cfg_pos_add(&p->positions, m, f->id, index, line, col);
    } else {
        dst = (char *)m + f->offset;
    }
    if (!parse_scalar(p, f, dst)) {
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            /* keep the array consistent for free_unpacked: drop the slot */
            size_t *n = (size_t *)((char *)m + f->quantifier_offset);
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                char **arr = *(char ***)((char *)m + f->offset);
                free(arr[*n - 1]);
            }
            (*n)--;
        }
        return false;
    }
    next_token(p);
    return true;
}

static bool parse_fields(parser_t *p, ProtobufCMessage *m, char close, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    seen_set_t seen = {.n = 0};
    for (;;) {
        if (p->failed) return false;
        if (close && tok_is(p, close)) {
            next_token(p);
            return true;
        }
        if (p->tok.kind == TOK_EOF) {
            if (!close) return true;
            fail_at(p, p->tok.line, p->tok.col, "Expected \"%c\", got: end of file", close);
            return false;
        }
        if (p->tok.kind == TOK_ERROR) return false;
        if (tok_is(p, '[')) {
            fail_at(p, p->tok.line, p->tok.col,
                    "extensions and Any expansions are not supported in model configurations");
            return false;
        }
        if (p->tok.kind != TOK_IDENT) {
            expected(p, "identifier");
            return false;
        }
        token_t name = p->tok;
        const ProtobufCFieldDescriptor *f = cfg_field_by_name(d, name.text, name.len);
        if (!f) {
            unknown_field(p, d, &name);
            return false;
        }
        next_token(p);
        bool colon = false;
        if (tok_is(p, ':')) {
            colon = true;
            next_token(p);
        }
        bool repeated = f->label == PROTOBUF_C_LABEL_REPEATED;
        if (!repeated && seen_check_add(&seen, f->id)) {
            fail_at(p, name.line, name.col,
                    "Non-repeated field \"%s\" is specified multiple times.", f->name);
            return false;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            const ProtobufCFieldDescriptor *other = other_oneof_member(m, f);
            if (other) {
                fail_at(p, name.line, name.col,
                        "Field \"%s\" is specified along with field \"%s\", another member of the "
                        "same oneof.",
                        f->name, other->name);
                return false;
            }
        }
        if (f->type != PROTOBUF_C_TYPE_MESSAGE && !colon) {
            fail_at(p, p->tok.line, p->tok.col, "Expected \":\" after field \"%s\"", f->name);
            return false;
        }
        cfg_pos_add(&p->positions, m, f->id, -1, name.line, name.col);
        size_t *count = repeated ? (size_t *)((char *)m + f->quantifier_offset) : NULL;
        if (tok_is(p, '[')) {
            if (!repeated) {
                fail_at(p, p->tok.line, p->tok.col,
                        "Field \"%s\" is not repeated and cannot take a list value [...]", f->name);
                return false;
            }
            if (f->type != PROTOBUF_C_TYPE_MESSAGE && !colon) {
                expected(p, "\":\"");
                return false;
            }
            next_token(p);
            if (tok_is(p, ']')) {
                next_token(p);
            } else {
                for (;;) {
                    if (!parse_one_value(p, m, f, (int32_t)*count, depth)) return false;
                    if (tok_is(p, ',')) {
                        next_token(p);
                        continue;
                    }
                    if (tok_is(p, ']')) {
                        next_token(p);
                        break;
                    }
                    expected(p, "\",\" or \"]\"");
                    return false;
                }
            }
        } else {
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                clear_oneof(m, f);
                *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
                if (f->type == PROTOBUF_C_TYPE_STRING) *(char **)((char *)m + f->offset) = NULL;
            }
            if (!parse_one_value(p, m, f, repeated ? (int32_t)*count : -1, depth)) {
                if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && f->type == PROTOBUF_C_TYPE_STRING &&
                    !*(char **)((char *)m + f->offset))
                    *(uint32_t *)((char *)m + f->quantifier_offset) = 0;
                return false;
            }
        }
        if (tok_is(p, ',') || tok_is(p, ';')) next_token(p);
    }
}

ProtobufCMessage *cfg_parse_message(const ProtobufCMessageDescriptor *d, const char *text,
                                    size_t len, const char *filename, char **errors)
{
    if (errors) *errors = NULL;
    parser_t p = {
        .src = text ? text : "",
        .len = text ? len : 0,
        .line = 1,
        .col = 1,
        .filename = filename ? filename : "<config>",
    };
    ProtobufCMessage *m = cfg_message_new(d);
    if (!m) {
        if (errors) *errors = strdup("out of memory\n");
        return NULL;
    }
    next_token(&p);
    bool ok = p.tok.kind != TOK_ERROR && parse_fields(&p, m, 0, 0) && !p.failed;
    cfg_buf_free(&p.strval);
    if (!ok) {
        protobuf_c_message_free_unpacked(m, NULL);
        free(p.positions.entries);
        if (errors)
            *errors = cfg_buf_take(&p.err);
        else
            cfg_buf_free(&p.err);
        return NULL;
    }
    cfg_buf_free(&p.err);
    cfg_pos_attach(m, &p.positions);
    return m;
}

model_config_t *config_parse_text(const char *text, size_t len, const char *filename, char **errors)
{
    return (model_config_t *)cfg_parse_message(&inference__model_config__descriptor, text, len,
                                               filename, errors);
}

model_config_t *config_parse_file(const char *path, char **errors)
{
    if (errors) *errors = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (errors) {
            cfg_buf_t b = {0};
            cfg_buf_printf(&b, "%s: unable to open file: %s\n", path, strerror(errno));
            *errors = cfg_buf_take(&b);
        }
        return NULL;
    }
    cfg_buf_t b = {0};
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, fp)) > 0)
        cfg_buf_append(&b, chunk, n);
    bool read_error = ferror(fp);
    fclose(fp);
    if (read_error || b.oom) {
        cfg_buf_free(&b);
        if (errors) {
            cfg_buf_t e = {0};
            cfg_buf_printf(&e, "%s: unable to read file\n", path);
            *errors = cfg_buf_take(&e);
        }
        return NULL;
    }
    model_config_t *cfg = config_parse_text(b.data, b.len, path, errors);
    cfg_buf_free(&b);
    return cfg;
}
