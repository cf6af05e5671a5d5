/*
 * This file contains the Python backend's environment manager: a model's
 * EXECUTION_ENV_PATH that names a conda-pack archive (.tar.gz) is extracted,
 * as Triton's python backend extracts it, into a directory of its own under
 * one /tmp/python_env_XXXXXX per server, once per archive and again when the
 * archive's modification time changes.
 */
#ifndef NEREID_PYTHON_ENV_H
#define NEREID_PYTHON_ENV_H

#include "nereid/backend.h"

/* Extracts the archive at path (a regular file) unless the same archive,
 * unchanged, was extracted before; *dir is the directory it is in (caller
 * frees). Members that would land outside that directory (a '..', an
 * absolute path, a write through a symbolic link) fail the extraction with
 * libarchive's text, as in Triton. Any thread; serialised inside. */
nereid_error_t *python_env_extract(const char *path, char **dir);

/* Removes every extracted environment (backend fini). */
void python_env_cleanup(void);

#endif
