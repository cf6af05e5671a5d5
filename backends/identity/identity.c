/*
 * This file contains the identity backend: output i is a copy of input i
 * (by config position), for every datatype and any shape. It is also the
 * smallest example of the backend ABI: only execute is exported.
 */
#include <string.h>

#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    size_t n = nereid_model_input_count(model);
    if (nereid_model_output_count(model) < n) n = nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *in_name, *out_name;
        nereid_model_input(model, i, &in_name, NULL, NULL, NULL);
        nereid_model_output(model, i, &out_name, NULL, NULL, NULL);
        if (!nereid_batch_output_requested(batch, out_name)) continue;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, size;
        const void *data;
        void *out;
        nereid_error_t *err = nereid_batch_input(batch, in_name, &dt, &shape, &rank, &data, &size);
        if (err) return err;
        err = nereid_batch_output(batch, out_name, dt, shape, rank, size, &out);
        if (err) return err;
        if (size) memcpy(out, data, size);
    }
    return NULL;
}
