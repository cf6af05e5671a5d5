/*
 * This file contains a Triton backend without the required entry point
 * TRITONBACKEND_ModelInstanceExecute, for
 * tests/integration/test_triton_backend.py: its models must fail to load.
 */
#include "triton/core/tritonbackend.h"

TRITONSERVER_Error *TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model *model)
{
    (void)model;
    return NULL;
}
