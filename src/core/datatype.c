/*
 * This file contains the datatype table: protocol names, config names and
 * element sizes, generated from NEREID_DATATYPE_MAP.
 */
#include <string.h>

#include "nereid/server.h"

static const struct {
    const char *name;
    size_t size;
    const char *config_name;
} types[] = {[NEREID_TYPE_INVALID] = {"INVALID", 0, "TYPE_INVALID"},
#define X(e, name, size, cfg) [NEREID_TYPE_##e] = {name, size, cfg},
             NEREID_DATATYPE_MAP(X)
#undef X
};

#define N_TYPES (sizeof types / sizeof types[0])

const char *nereid_datatype_name(nereid_datatype_t dt)
{
    return (size_t)dt < N_TYPES ? types[dt].name : "INVALID";
}

nereid_datatype_t nereid_datatype_from_name(const char *name)
{
    for (size_t i = 1; name && i < N_TYPES; i++)
        if (strcmp(types[i].name, name) == 0) return (nereid_datatype_t)i;
    return NEREID_TYPE_INVALID;
}

nereid_datatype_t nereid_datatype_from_config_name(const char *name)
{
    for (size_t i = 1; name && i < N_TYPES; i++)
        if (strcmp(types[i].config_name, name) == 0) return (nereid_datatype_t)i;
    return NEREID_TYPE_INVALID;
}

size_t nereid_datatype_byte_size(nereid_datatype_t dt)
{
    return (size_t)dt < N_TYPES ? types[dt].size : 0;
}
