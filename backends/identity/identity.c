/*
 * This file contains the identity backend: output i is a copy of input i
 * (by config position), for every datatype and any shape. It is also the
 * smallest example of the backend ABI: only execute is exported.
 */
#include "../common/copy_io.h"
#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    return copy_inputs_to_outputs(model, batch);
}
