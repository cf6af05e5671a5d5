/*
 * This file contains the add_sub backend: OUTPUT0 = INPUT0 + INPUT1 and
 * OUTPUT1 = INPUT0 - INPUT1, element-wise, for integer and floating-point
 * types (the two inputs share datatype and shape). It shows batch-level
 * input/output access: one contiguous buffer per tensor over the batch.
 */
#include <string.h>

#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

#define ADD_SUB(T)                                                                                 \
    do {                                                                                           \
        T *s = sum, *d = diff;                                                                     \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x, y; /* inputs may be unaligned */                                                  \
            memcpy(&x, (const char *)a + i * sizeof(T), sizeof(T));                                \
            memcpy(&y, (const char *)b + i * sizeof(T), sizeof(T));                                \
            if (s) s[i] = (T)(x + y);                                                              \
            if (d) d[i] = (T)(x - y);                                                              \
        }                                                                                          \
    } while (0)

static int compute(nereid_datatype_t dt, const void *a, const void *b, void *sum, void *diff,
                   size_t n)
{
    switch (dt) {
    case NEREID_TYPE_INT8:
        ADD_SUB(int8_t);
        return 0;
    case NEREID_TYPE_INT16:
        ADD_SUB(int16_t);
        return 0;
    case NEREID_TYPE_INT32:
        ADD_SUB(int32_t);
        return 0;
    case NEREID_TYPE_INT64:
        ADD_SUB(int64_t);
        return 0;
    case NEREID_TYPE_UINT8:
        ADD_SUB(uint8_t);
        return 0;
    case NEREID_TYPE_UINT16:
        ADD_SUB(uint16_t);
        return 0;
    case NEREID_TYPE_UINT32:
        ADD_SUB(uint32_t);
        return 0;
    case NEREID_TYPE_UINT64:
        ADD_SUB(uint64_t);
        return 0;
    case NEREID_TYPE_FP32:
        ADD_SUB(float);
        return 0;
    case NEREID_TYPE_FP64:
        ADD_SUB(double);
        return 0;
    default:
        return -1;
    }
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    (void)instance;
    nereid_datatype_t dt0, dt1;
    const int64_t *shape0, *shape1;
    size_t rank0, rank1, size0, size1;
    const void *in0, *in1;
    nereid_error_t *err = nereid_batch_input(batch, "INPUT0", &dt0, &shape0, &rank0, &in0, &size0);
    if (!err) err = nereid_batch_input(batch, "INPUT1", &dt1, &shape1, &rank1, &in1, &size1);
    if (err) return err;
    if (dt0 != dt1 || size0 != size1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "add_sub: INPUT0 and INPUT1 must have the same datatype and size");
    size_t esize = nereid_datatype_byte_size(dt0);
    if (esize == 0 || compute(dt0, in0, in1, NULL, NULL, 0) != 0)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, "add_sub: unsupported datatype %s",
                                nereid_datatype_name(dt0));
    void *sum = NULL, *diff = NULL;
    if (nereid_batch_output_requested(batch, "OUTPUT0"))
        err = nereid_batch_output(batch, "OUTPUT0", dt0, shape0, rank0, size0, &sum);
    if (!err && nereid_batch_output_requested(batch, "OUTPUT1"))
        err = nereid_batch_output(batch, "OUTPUT1", dt0, shape0, rank0, size0, &diff);
    if (err) return err;
    compute(dt0, in0, in1, sum, diff, size0 / esize);
    return NULL;
}
