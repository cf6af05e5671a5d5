/*
 * This file contains the startup model table (see model_table.h): Triton's
 * TablePrinter layout, each column as wide as its widest cell (the 500
 * columns Triton assumes off a terminal are never reached by these rows).
 */
#include "core/model_table.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "core/repository.h"
#include "core/server_internal.h"
#include "core/util.h"

#define N_COLS 3

typedef struct table {
    char **cells; /* rows * N_COLS, row 0 the header */
    size_t rows;
} table_t;

static char *clean(char *cell);

static void add_row(table_t *t, char *model, char *version, char *status)
{
    t->cells = xrealloc(t->cells, (t->rows + 1) * N_COLS * sizeof *t->cells);
    char **cells = t->cells + t->rows * N_COLS;
    cells[0] = clean(model);
    cells[1] = clean(version);
    cells[2] = clean(status);
    t->rows++;
}

const char *model_state_text(model_state_t st)
{
    switch (st) {
    case MODEL_READY:
        return "READY";
    case MODEL_UNAVAILABLE:
        return "UNAVAILABLE";
    case MODEL_LOADING:
        return "LOADING";
    case MODEL_UNLOADING:
        return "UNLOADING";
    default:
        return "UNKNOWN";
    }
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(model_entry_t *const *)a)->name, (*(model_entry_t *const *)b)->name);
}

static void divider(FILE *f, const size_t *width)
{
    fputc('+', f);
    for (int c = 0; c < N_COLS; c++) {
        for (size_t i = 0; i < width[c] + 2; i++)
            fputc('-', f);
        fputc('+', f);
    }
    fputc('\n', f);
}

/* Length of line `k` of a cell ('\n' separates lines), or -1 past its end. */
static long cell_line(const char *cell, size_t k, const char **start)
{
    for (; k > 0; k--) {
        cell = strchr(cell, '\n');
        if (!cell) return -1;
        cell++;
    }
    *start = cell;
    const char *nl = strchr(cell, '\n');
    return nl ? nl - cell : (long)strlen(cell);
}

/* One record; a cell of several lines takes as many table lines (Triton's
 * TablePrinter), so every line of the table starts with '|' or '+'. */
static void row(FILE *f, char *const *cells, const size_t *width)
{
    for (size_t k = 0;; k++) {
        bool any = false;
        for (int c = 0; c < N_COLS; c++) {
            const char *p;
            any |= cell_line(cells[c], k, &p) >= 0;
        }
        if (!any) break;
        fputc('|', f);
        for (int c = 0; c < N_COLS; c++) {
            const char *p = "";
            long n = cell_line(cells[c], k, &p);
            if (n < 0) n = 0;
            fprintf(f, " %-*.*s%*s |", (int)n, (int)n, p, (int)(width[c] - (size_t)n), "");
        }
        fputc('\n', f);
    }
}

/* Control characters other than '\n' (a reason quoting a file) become
 * spaces: nothing in the table can look like a record of its own. */
static char *clean(char *cell)
{
    for (char *p = cell; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\n') *p = ' ';
    return cell;
}

char *model_table_text(nereid_server_t *s)
{
    table_t t = {0};
    add_row(&t, xstrdup("Model"), xstrdup("Version"), xstrdup("Status"));
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t **sorted = xmalloc((s->n_models ? s->n_models : 1) * sizeof *sorted);
    if (s->n_models) memcpy(sorted, s->models, s->n_models * sizeof *sorted);
    qsort(sorted, s->n_models, sizeof *sorted, by_name);
    for (size_t i = 0; i < s->n_models; i++) {
        const model_entry_t *e = sorted[i];
        if (e->n_versions == 0) {
            if (e->state == MODEL_UNKNOWN_STATE && !e->reason) continue;
            add_row(&t, xstrdup(e->name), xstrdup("-"),
                    e->reason ? xasprintf("%s: %s", model_state_text(e->state), e->reason)
                              : xstrdup("Not loaded: No model version was found"));
            continue;
        }
        for (size_t v = 0; v < e->n_versions; v++) {
            const version_entry_t *ve = &e->versions[v];
            add_row(&t, xstrdup(e->name), xasprintf("%" PRId64, ve->version),
                    ve->reason && ve->reason[0]
                        ? xasprintf("%s: %s", model_state_text(ve->state), ve->reason)
                        : xstrdup(model_state_text(ve->state)));
        }
    }
    pthread_rwlock_unlock(&s->lock);
    free(sorted);
    size_t width[N_COLS] = {0};
    for (size_t r = 0; r < t.rows; r++)
        for (int c = 0; c < N_COLS; c++) {
            const char *p;
            long n;
            for (size_t k = 0; (n = cell_line(t.cells[r * N_COLS + c], k, &p)) >= 0; k++)
                if ((size_t)n > width[c]) width[c] = (size_t)n;
        }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) abort();
    fputc('\n', f);
    divider(f, width);
    row(f, t.cells, width);
    divider(f, width);
    for (size_t r = 1; r < t.rows; r++)
        row(f, t.cells + r * N_COLS, width);
    divider(f, width);
    fclose(f);
    for (size_t i = 0; i < t.rows * N_COLS; i++)
        free(t.cells[i]);
    free(t.cells);
    return text;
}

void model_table_log(nereid_server_t *s)
{
    char *text = model_table_text(s);
    size_t n = strlen(text);
    if (n && text[n - 1] == '\n') text[n - 1] = '\0'; /* the record ends the line */
    log_write_raw('I', __FILE__, __LINE__, text);
    free(text);
}
