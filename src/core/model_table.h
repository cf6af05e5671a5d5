/*
 * This file declares the startup model table: Triton's
 * PrintBackendAndModelSummary models table, logged once when the server
 * has loaded its repositories (QA suites grep its status texts).
 */
#ifndef NEREID_MODEL_TABLE_H
#define NEREID_MODEL_TABLE_H

#include "core/core.h"
#include "core/model.h"

/* The table's text: a newline, then "+---+" borders around the header
 * "| Model | Version | Status |" and one row per model version (name order,
 * then version order); the status is READY / UNAVAILABLE / ... followed by
 * ": <reason>" when the version has one. A model with no version has the
 * row "-" / "Not loaded: No model version was found" (or its reason), a
 * model never loaded (explicit mode) none. Caller frees. Takes s->lock. */
char *model_table_text(nereid_server_t *s);

/* Triton's ModelReadyStateString: "READY", "UNAVAILABLE", "LOADING",
 * "UNLOADING", else "UNKNOWN". */
const char *model_state_text(model_state_t st);

/* Logs model_table_text as one unescaped INFO record, as Triton's
 * LOG_TABLE_INFO. */
void model_table_log(nereid_server_t *s);

#endif
