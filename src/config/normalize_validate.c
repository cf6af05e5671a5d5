/*
 * This file contains config_normalize's validation rules but the
 * ensemble's, with Triton's error texts: the platform/backend pair and
 * version policy (ValidateModelConfig), inputs and outputs, sequence and
 * dynamic batching, instance groups, model metrics and warmup.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/normalize_internal.h"
#include "nereid/server.h"

#define WILDCARD_DIM (-1)

static const char *enum_name(const ProtobufCEnumDescriptor *d, int v)
{
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);
    return ev ? ev->name : "<unknown>";
}

static bool valid_datatype(int v)
{
    return protobuf_c_enum_descriptor_get_value(&inference__data_type__descriptor, v) != NULL;
}

/* ---- validation ---- */

/* Element count of dims: -1 when any dimension is variable. */
static int64_t element_count(const int64_t *dims, size_t n)
{
    int64_t cnt = 1;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] == WILDCARD_DIM) return -1;
        if (dims[i] > 0 && cnt > INT64_MAX / dims[i]) return -2; /* overflow */
        cnt *= dims[i];
    }
    return cnt;
}

/* Triton's ValidateIOShape. prefix is "model input " or "model output ". */
static bool validate_io_shape(nctx_t *c, const ProtobufCMessage *io, const char *name, int dtype,
                              const int64_t *dims, size_t n_dims,
                              const Inference__ModelTensorReshape *reshape, const char *prefix)
{
    const char *mn = c->name;
    if (empty(name)) {
        nerr(c, io, "name", -1, "%smust specify 'name' for %s", prefix, mn);
        return false;
    }
    if (dtype == INFERENCE__DATA_TYPE__TYPE_INVALID) {
        nerr(c, io, "data_type", -1, "%s'%s' must specify 'data_type' for %s", prefix, name, mn);
        return false;
    }
    if (!valid_datatype(dtype)) {
        nerr(c, io, "data_type", -1, "%s'%s' has unknown data type %d for %s", prefix, name, dtype,
             mn);
        return false;
    }
    if (n_dims == 0) {
        nerr(c, io, "dims", -1, "%s'%s' must specify 'dims' for %s", prefix, name, mn);
        return false;
    }
    if (reshape && reshape->n_shape == 0 && c->cfg->max_batch_size == 0) {
        nerr(c, io, "reshape", -1,
             "%s'%s' cannot have empty reshape for non-batching model as scalar tensors are not "
             "supported for %s",
             prefix, name, mn);
        return false;
    }
    for (size_t i = 0; i < n_dims; i++) {
        if (dims[i] < 1 && dims[i] != WILDCARD_DIM) {
            nerr(c, io, "dims", (int)i,
                 "%s'%s' dimension must be integer >= 1, or -1 to indicate a variable-size "
                 "dimension for %s",
                 prefix, name, mn);
            return false;
        }
    }
    if (!reshape) return true;
    for (size_t i = 0; i < reshape->n_shape; i++) {
        if (reshape->shape[i] < 1 && reshape->shape[i] != WILDCARD_DIM) {
            nerr(c, reshape, "shape", (int)i,
                 "%s'%s' reshape dimensions must be integer >= 1, or -1 to indicate a "
                 "variable-size dimension for %s",
                 prefix, name, mn);
            return false;
        }
    }
    int64_t dims_size = element_count(dims, n_dims);
    int64_t reshape_size = element_count(reshape->shape, reshape->n_shape);
    if (dims_size == -2 || reshape_size == -2) {
        nerr(c, io, "reshape", -1, "%s'%s' has too many elements in dims or reshape for %s", prefix,
             name, mn);
        return false;
    }
    if (reshape->n_shape == 0) reshape_size = 0;
    if (dims_size != reshape_size && (reshape_size != 0 || dims_size != 1)) {
        nerr(c, io, "reshape", -1, "%s'%s' has different size for dims and reshape for %s", prefix,
             name, mn);
        return false;
    }
    if (dims_size == -1) {
        /* compare the element counts of the runs between variable dims */
        int64_t a[64], b[64];
        size_t na = 0, nb = 0;
        int64_t cur = 1;
        for (size_t i = 0; i < n_dims && na < 63; i++) {
            if (dims[i] != WILDCARD_DIM)
                cur *= dims[i];
            else {
                a[na++] = cur;
                cur = 1;
            }
        }
        a[na++] = cur;
        cur = 1;
        for (size_t i = 0; i < reshape->n_shape && nb < 63; i++) {
            if (reshape->shape[i] != WILDCARD_DIM)
                cur *= reshape->shape[i];
            else {
                b[nb++] = cur;
                cur = 1;
            }
        }
        b[nb++] = cur;
        if (na != nb) {
            nerr(c, io, "reshape", -1,
                 "%s'%s' has different number of variable-size dimensions for dims and reshape "
                 "for %s",
                 prefix, name, mn);
            return false;
        }
        for (size_t i = 0; i < na; i++) {
            if (a[i] != b[i]) {
                nerr(c, io, "reshape", -1, "%s'%s' has different size for dims and reshape for %s",
                     prefix, name, mn);
                return false;
            }
        }
    }
    return true;
}

void validate_io(nctx_t *c, const config_options_t *opts)
{
    model_config_t *cfg = c->cfg;
    bool is_trt = streq(cfg->platform, "tensorrt_plan");
    for (size_t i = 0; i < cfg->n_input; i++) {
        Inference__ModelInput *io = cfg->input[i];
        if (!validate_io_shape(c, &io->base, io->name, io->data_type, io->dims, io->n_dims,
                               io->reshape, "model input "))
            continue;
        if ((io->format == INFERENCE__MODEL_INPUT__FORMAT__FORMAT_NHWC ||
             io->format == INFERENCE__MODEL_INPUT__FORMAT__FORMAT_NCHW) &&
            io->n_dims != 3) {
            nerr(c, io, "format", -1, "model input NHWC/NCHW require 3 dims for %s", c->name);
            continue;
        }
        if (!is_trt && io->is_shape_tensor) {
            nerr(c, io, "is_shape_tensor", -1,
                 "shape tensors are only supported for TensorRT platform for %s", c->name);
            continue;
        }
        if (io->is_non_linear_format_io && !is_trt) {
            nerr(c, io, "is_non_linear_format_io", -1,
                 "Non-linear IO format is only supported for the TensorRT platform for %s",
                 c->name);
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            if (streq(cfg->input[j]->name, io->name)) {
                nerr(c, io, "name", -1, "model input '%s' is specified more than once for %s",
                     io->name, c->name);
                break;
            }
        }
    }
    for (size_t i = 0; i < cfg->n_output; i++) {
        Inference__ModelOutput *io = cfg->output[i];
        if (!validate_io_shape(c, &io->base, io->name, io->data_type, io->dims, io->n_dims,
                               io->reshape, "model output "))
            continue;
        if (!is_trt && io->is_shape_tensor) {
            nerr(c, io, "is_shape_tensor", -1,
                 "shape tensors are only supported for TensorRT platform for %s", c->name);
            continue;
        }
        if (io->is_non_linear_format_io && !is_trt) {
            nerr(c, io, "is_non_linear_format_io", -1,
                 "Non-linear IO format is only supported for the TensorRT platform for %s",
                 c->name);
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            if (streq(cfg->output[j]->name, io->name)) {
                nerr(c, io, "name", -1, "model output '%s' is specified more than once for %s",
                     io->name, c->name);
                break;
            }
        }
    }
    if (!(opts && opts->allow_missing_io)) {
        if (cfg->n_input == 0)
            nerr(c, cfg, NULL, -1, "model configuration must specify at least one 'input' for %s",
                 c->name);
        if (cfg->n_output == 0)
            nerr(c, cfg, NULL, -1, "model configuration must specify at least one 'output' for %s",
                 c->name);
    }
    /* batch inputs and outputs */
    for (size_t i = 0; i < cfg->n_batch_input; i++) {
        Inference__BatchInput *bi = cfg->batch_input[i];
        if (!protobuf_c_enum_descriptor_get_value(&inference__batch_input__kind__descriptor,
                                                  bi->kind)) {
            nerr(c, bi, "kind", -1, "unknown batch input kind '%d' for %s", bi->kind, c->name);
            return;
        }
        if (bi->n_source_input != 1) {
            nerr(c, bi, "source_input", -1,
                 "batch input kind '%s' expects 1 source input, got %zu for %s",
                 enum_name(&inference__batch_input__kind__descriptor, bi->kind), bi->n_source_input,
                 c->name);
            return;
        }
        if (bi->data_type != INFERENCE__DATA_TYPE__TYPE_INT32 &&
            bi->data_type != INFERENCE__DATA_TYPE__TYPE_FP32) {
            nerr(c, bi, "data_type", -1,
                 "batch input data type must be TYPE_INT32 or TYPE_FP32 for %s", c->name);
            return;
        }
        for (size_t k = 0; k < bi->n_source_input; k++) {
            bool found = false;
            for (size_t j = 0; j < cfg->n_input && !found; j++)
                found = streq(cfg->input[j]->name, bi->source_input[k]);
            if (!found) {
                nerr(c, bi, "source_input", (int)k, "unknown source input name '%s' for %s",
                     bi->source_input[k], c->name);
                return;
            }
        }
    }
    for (size_t i = 0; i < cfg->n_batch_output; i++) {
        Inference__BatchOutput *bo = cfg->batch_output[i];
        if (bo->kind != INFERENCE__BATCH_OUTPUT__KIND__BATCH_SCATTER_WITH_INPUT_SHAPE) {
            nerr(c, bo, "kind", -1, "unknown batch output kind '%d' for %s", bo->kind, c->name);
            return;
        }
        if (bo->n_source_input != 1) {
            nerr(c, bo, "source_input", -1,
                 "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got "
                 "%zu for %s",
                 bo->n_source_input, c->name);
            return;
        }
        for (size_t k = 0; k < bo->n_source_input; k++) {
            bool found = false;
            for (size_t j = 0; j < cfg->n_input && !found; j++)
                found = streq(cfg->input[j]->name, bo->source_input[k]);
            if (!found) {
                nerr(c, bo, "source_input", (int)k, "unknown source input name '%s' for %s",
                     bo->source_input[k], c->name);
                return;
            }
        }
        for (size_t k = 0; k < bo->n_target_name; k++) {
            bool found = false;
            for (size_t j = 0; j < cfg->n_output && !found; j++)
                found = streq(cfg->output[j]->name, bo->target_name[k]);
            if (!found) {
                nerr(c, bo, "target_name", (int)k, "unknown target output name '%s' for %s",
                     bo->target_name[k], c->name);
                return;
            }
            for (size_t j = 0; j < k; j++) {
                if (streq(bo->target_name[j], bo->target_name[k])) {
                    nerr(c, bo, "target_name", (int)k,
                         "target output name '%s' can only be specified once for %s",
                         bo->target_name[k], c->name);
                    return;
                }
            }
        }
    }
}

static const char *control_kind_name(int kind)
{
    return enum_name(&inference__model_sequence_batching__control__kind__descriptor, kind);
}

/* Triton's Get{Boolean,Typed}SequenceControlProperties checks for one kind. */
static bool validate_control_kind(nctx_t *c, const Inference__ModelSequenceBatching *sb, int kind,
                                  bool typed, int *corrid_type, const void **corrid_at)
{
    bool seen = false;
    for (size_t i = 0; i < sb->n_control_input; i++) {
        const Inference__ModelSequenceBatching__ControlInput *ci = sb->control_input[i];
        if (empty(ci->name)) {
            nerr(c, ci, "name", -1, "sequence batching control tensor must have a name for %s",
                 c->name);
            return false;
        }
        for (size_t j = 0; j < i; j++) {
            if (streq(sb->control_input[j]->name, ci->name)) {
                nerr(c, ci, "name", -1,
                     "sequence batching control tensor '%s' is specified for multiple control "
                     "kinds for %s",
                     ci->name, c->name);
                return false;
            }
        }
        for (size_t k = 0; k < ci->n_control; k++) {
            const Inference__ModelSequenceBatching__Control *ctl = ci->control[k];
            if ((int)ctl->kind != kind) continue;
            if (seen) {
                nerr(c, ctl, "kind", -1, "sequence batching specifies multiple %s tensors for %s",
                     control_kind_name(kind), c->name);
                return false;
            }
            seen = true;
            size_t ni = ctl->n_int32_false_true, nf = ctl->n_fp32_false_true,
                   nb = ctl->n_bool_false_true;
            if (typed) {
                if (ni || nf || nb) {
                    nerr(c, ctl,
                         ni   ? "int32_false_true"
                         : nf ? "fp32_false_true"
                              : "bool_false_true",
                         -1,
                         "sequence batching must not specify either 'int32_false_true', "
                         "'fp32_false_true' or 'bool_false_true' for %s for %s",
                         control_kind_name(kind), c->name);
                    return false;
                }
                *corrid_type = ctl->data_type;
                *corrid_at = ctl;
                continue;
            }
            if (!ni && !nf && !nb) {
                nerr(c, ctl, NULL, -1,
                     "sequence batching must specify either 'int32_false_true', "
                     "'fp32_false_true' or 'bool_false_true' for %s for %s",
                     control_kind_name(kind), c->name);
                return false;
            }
            if ((ni && nf) || (ni && nb) || (nf && nb)) {
                nerr(c, ctl, nf ? "fp32_false_true" : "bool_false_true", -1,
                     "sequence batching specifies more than one from 'int32_false_true', "
                     "'fp32_false_true' and 'bool_false_true' for %s for %s",
                     control_kind_name(kind), c->name);
                return false;
            }
            const char *which = ni   ? "int32_false_true"
                                : nf ? "fp32_false_true"
                                     : "bool_false_true";
            size_t cnt = ni ? ni : nf ? nf : nb;
            if (cnt != 2) {
                nerr(c, ctl, which, -1,
                     "sequence batching control '%s' must have exactly 2 entries for %s for %s",
                     which, control_kind_name(kind), c->name);
                return false;
            }
        }
    }
    return true;
}

/* Whether a tensor the server makes itself, rows x dims of dtype (a
 * variable or unset dim counts as 1; TYPE_STRING as 4 bytes an element),
 * stays within CONFIG_MAX_TENSOR_BYTES; if not, reports "<what> needs more
 * than the limit of N bytes". */
static bool tensor_within_limit(nctx_t *c, const void *msg, const char *field, int dtype,
                                uint64_t rows, const int64_t *dims, size_t n_dims, const char *what)
{
    uint64_t esize = dtype == INFERENCE__DATA_TYPE__TYPE_STRING
                         ? 4
                         : nereid_datatype_byte_size((nereid_datatype_t)dtype);
    uint64_t total = rows * (esize ? esize : 1);
    for (size_t i = 0; i <= n_dims; i++) {
        uint64_t d = i < n_dims && dims[i] > 0 ? (uint64_t)dims[i] : 1;
        if (total > CONFIG_MAX_TENSOR_BYTES / d) {
            nerr(c, msg, field, -1, "%s needs more than the limit of %llu bytes for %s", what,
                 (unsigned long long)CONFIG_MAX_TENSOR_BYTES, c->name);
            return false;
        }
        total *= d;
    }
    return true;
}

/* Whether name is one of the config's inputs. */
static bool is_model_input(const model_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_input; i++)
        if (streq(cfg->input[i]->name, name)) return true;
    return false;
}

/* Control and state input tensors are set by the sequence batcher on every
 * request: one named like a model input would replace the client's tensor. */
static void validate_sequence_tensor_names(nctx_t *c, const Inference__ModelSequenceBatching *sb)
{
    for (size_t i = 0; i < sb->n_control_input; i++) {
        const Inference__ModelSequenceBatching__ControlInput *ci = sb->control_input[i];
        if (is_model_input(c->cfg, ci->name))
            nerr(c, ci, "name", -1,
                 "sequence batching control tensor '%s' has the name of a model input for %s; "
                 "control tensors are set by the sequence batcher and must not be listed in "
                 "'input'",
                 ci->name, c->name);
    }
    for (size_t i = 0; i < sb->n_state; i++) {
        const Inference__ModelSequenceBatching__State *st = sb->state[i];
        if (is_model_input(c->cfg, st->input_name))
            nerr(c, st, "input_name", -1,
                 "sequence batching state input name '%s' has the name of a model input for %s; "
                 "state tensors are set by the sequence batcher and must not be listed in 'input'",
                 st->input_name, c->name);
        for (size_t k = 0; k < sb->n_control_input; k++)
            if (streq(sb->control_input[k]->name, st->input_name))
                nerr(c, st, "input_name", -1,
                     "sequence batching state input name '%s' is also a control tensor for %s",
                     st->input_name, c->name);
    }
}

/* The oldest and direct strategies' settings; false (error recorded) when
 * one is not valid. */
static bool validate_sequence_strategy(nctx_t *c, Inference__ModelSequenceBatching *sb)
{
    model_config_t *cfg = c->cfg;
    if (sb->strategy_choice_case == INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_OLDEST &&
        sb->oldest) {
        for (size_t i = 0; i < sb->oldest->n_preferred_batch_size; i++) {
            int32_t size = sb->oldest->preferred_batch_size[i];
            if (size <= 0) {
                nerr(c, sb->oldest, "preferred_batch_size", (int)i,
                     "sequence batching preferred batch size must be positive for %s", c->name);
                return false;
            }
            if (size > cfg->max_batch_size) {
                nerr(c, sb->oldest, "preferred_batch_size", (int)i,
                     "sequence batching preferred batch size must be <= max batch size for %s",
                     c->name);
                return false;
            }
        }
    }
    if (sb->strategy_choice_case == INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_DIRECT &&
        sb->direct) {
        float u = sb->direct->minimum_slot_utilization;
        if (!(u >= 0.0f && u <= 1.0f)) {
            nerr(c, sb->direct, "minimum_slot_utilization", -1,
                 "sequence batching minimum slot utilization must be in range (0.0, 1.0] for %s",
                 c->name);
            return false;
        }
    }
    return true;
}

/* Initial state `is` of state st; false (error recorded) when it is not
 * valid. */
static bool validate_initial_state(nctx_t *c, const Inference__ModelSequenceBatching__State *st,
                                   const Inference__ModelSequenceBatching__InitialState *is)
{
    if (empty(is->name)) {
        nerr(c, is, "name", -1,
             "initial state of sequence batching state '%s' must specify 'name' for %s",
             st->input_name, c->name);
        return false;
    }
    if (is->state_data_case ==
        INFERENCE__MODEL_SEQUENCE_BATCHING__INITIAL_STATE__STATE_DATA__NOT_SET) {
        nerr(c, is, NULL, -1,
             "initial state '%s' must specify either 'zero_data' or 'data_file' for %s", is->name,
             c->name);
        return false;
    }
    if (is->state_data_case ==
            INFERENCE__MODEL_SEQUENCE_BATCHING__INITIAL_STATE__STATE_DATA_DATA_FILE &&
        empty(is->data_file)) {
        nerr(c, is, "data_file", -1, "initial state '%s' has an empty 'data_file' for %s", is->name,
             c->name);
        return false;
    }
    if (is->data_type != st->data_type) {
        nerr(c, is, "data_type", -1,
             "initial state '%s' data type %s does not match the state data type %s for "
             "%s",
             is->name, enum_name(&inference__data_type__descriptor, is->data_type),
             enum_name(&inference__data_type__descriptor, st->data_type), c->name);
        return false;
    }
    bool dims_ok = is->n_dims == st->n_dims;
    for (size_t d = 0; d < is->n_dims && dims_ok; d++) {
        if (is->dims[d] < 1)
            dims_ok = false;
        else if (st->dims[d] != WILDCARD_DIM && st->dims[d] != is->dims[d])
            dims_ok = false;
    }
    if (!dims_ok) {
        nerr(c, is, "dims", -1,
             "initial state '%s' dims must be fixed (>= 1) and match the dims of state "
             "'%s' for %s",
             is->name, st->input_name, c->name);
        return false;
    }
    char what[512];
    snprintf(what, sizeof what, "initial state '%s'", is->name);
    return tensor_within_limit(c, is, "dims", is->data_type, 1, is->dims, is->n_dims, what);
}

/* Implicit state i of the sequence batcher (Triton's state rules). */
static void validate_sequence_state(nctx_t *c, Inference__ModelSequenceBatching *sb, size_t i)
{
    const Inference__ModelSequenceBatching__State *st = sb->state[i];
    if (empty(st->input_name)) {
        nerr(c, st, "input_name", -1, "sequence batching state must specify 'input_name' for %s",
             c->name);
        return;
    }
    if (empty(st->output_name)) {
        nerr(c, st, "output_name", -1,
             "sequence batching state '%s' must specify 'output_name' for %s", st->input_name,
             c->name);
        return;
    }
    if (st->data_type == INFERENCE__DATA_TYPE__TYPE_INVALID || !valid_datatype(st->data_type)) {
        nerr(c, st, "data_type", -1,
             "sequence batching state '%s' must specify a valid 'data_type' for %s", st->input_name,
             c->name);
        return;
    }
    if (st->n_dims == 0) {
        nerr(c, st, "dims", -1, "sequence batching state '%s' must specify 'dims' for %s",
             st->input_name, c->name);
        return;
    }
    bool bad = false;
    for (size_t d = 0; d < st->n_dims && !bad; d++) {
        if (st->dims[d] < 1 && st->dims[d] != WILDCARD_DIM) {
            nerr(c, st, "dims", (int)d,
                 "sequence batching state '%s' dimension must be integer >= 1, or -1 to "
                 "indicate a variable-size dimension for %s",
                 st->input_name, c->name);
            bad = true;
        }
    }
    for (size_t j = 0; j < i && !bad; j++) {
        if (streq(sb->state[j]->input_name, st->input_name)) {
            nerr(c, st, "input_name", -1,
                 "sequence batching state input name '%s' is specified more than once for %s",
                 st->input_name, c->name);
            bad = true;
        } else if (streq(sb->state[j]->output_name, st->output_name)) {
            nerr(c, st, "output_name", -1,
                 "sequence batching state output name '%s' is specified more than once for %s",
                 st->output_name, c->name);
            bad = true;
        }
    }
    if (bad) return;
    char what[512];
    snprintf(what, sizeof what, "sequence batching state '%s'", st->input_name);
    if (!tensor_within_limit(c, st, "dims", st->data_type, 1, st->dims, st->n_dims, what)) return;
    if (st->use_growable_memory && !st->use_same_buffer_for_input_output) {
        nerr(c, st, "use_growable_memory", -1,
             "sequence batching state '%s' can only use growable memory together with "
             "'use_same_buffer_for_input_output' for %s",
             st->input_name, c->name);
        return;
    }
    for (size_t k = 0; k < st->n_initial_state; k++)
        if (!validate_initial_state(c, st, st->initial_state[k])) break;
}

static void validate_sequence_batching(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    Inference__ModelSequenceBatching *sb = cfg->sequence_batching;
    if (cfg->response_cache && cfg->response_cache->enable) {
        nerr(c, cfg->response_cache, "enable", -1,
             "Response Cache does not currently support model %s with sequence batching "
             "scheduler. Please disable the response cache.",
             c->name);
        return;
    }
    int corrid_type = 0;
    const void *corrid_at = NULL;
    if (!validate_control_kind(
            c, sb, INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_START, false,
            &corrid_type, &corrid_at) ||
        !validate_control_kind(
            c, sb, INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_END, false,
            &corrid_type, &corrid_at) ||
        !validate_control_kind(
            c, sb, INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_READY, false,
            &corrid_type, &corrid_at) ||
        !validate_control_kind(
            c, sb, INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_CORRID, true,
            &corrid_type, &corrid_at))
        return;
    if (corrid_at && corrid_type != INFERENCE__DATA_TYPE__TYPE_UINT64 &&
        corrid_type != INFERENCE__DATA_TYPE__TYPE_INT64 &&
        corrid_type != INFERENCE__DATA_TYPE__TYPE_UINT32 &&
        corrid_type != INFERENCE__DATA_TYPE__TYPE_INT32 &&
        corrid_type != INFERENCE__DATA_TYPE__TYPE_STRING) {
        nerr(c, corrid_at, "data_type", -1,
             "unexpected data type for control CONTROL_SEQUENCE_CORRID for %s. Allowed data "
             "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
             c->name);
        return;
    }
    validate_sequence_tensor_names(c, sb);
    for (size_t i = 0; i < sb->n_control_input; i++) {
        const Inference__ModelSequenceBatching__ControlInput *ci = sb->control_input[i];
        for (size_t k = 0; k < ci->n_control; k++) {
            if (!protobuf_c_enum_descriptor_get_value(
                    &inference__model_sequence_batching__control__kind__descriptor,
                    ci->control[k]->kind)) {
                nerr(c, ci->control[k], "kind", -1,
                     "unknown sequence batching control kind %d for %s", ci->control[k]->kind,
                     c->name);
                return;
            }
        }
    }
    if (!validate_sequence_strategy(c, sb)) return;
    for (size_t i = 0; i < sb->n_state; i++) /* implicit state */
        validate_sequence_state(c, sb, i);
}

static void validate_dynamic_batching(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    Inference__ModelDynamicBatching *db = cfg->dynamic_batching;
    for (size_t i = 0; i < db->n_preferred_batch_size; i++) {
        int32_t size = db->preferred_batch_size[i];
        if (size <= 0) {
            nerr(c, db, "preferred_batch_size", (int)i,
                 "dynamic batching preferred size must be positive for %s", c->name);
            return;
        }
        if (size > cfg->max_batch_size) {
            nerr(c, db, "preferred_batch_size", (int)i,
                 "dynamic batching preferred size must be <= max batch size for %s", c->name);
            return;
        }
    }
    uint64_t levels = db->priority_levels;
    if (levels != 0) {
        if (db->default_priority_level == 0 || db->default_priority_level > levels) {
            nerr(c, db, "default_priority_level", -1,
                 "default priority level must be in range [1, %llu] for %s",
                 (unsigned long long)levels, c->name);
            return;
        }
        for (size_t i = 0; i < db->n_priority_queue_policy; i++) {
            uint64_t key = db->priority_queue_policy[i]->key;
            if (key == 0 || key > levels) {
                nerr(c, db, "priority_queue_policy", (int)i,
                     "priority queue policy must have priority level in range [1, %llu] for %s",
                     (unsigned long long)levels, c->name);
                return;
            }
        }
    } /* no priority levels: Triton accepts policies and ignores them */
    for (size_t i = 0; i < db->n_priority_queue_policy; i++) {
        for (size_t j = 0; j < i; j++) {
            if (db->priority_queue_policy[j]->key == db->priority_queue_policy[i]->key) {
                nerr(c, db, "priority_queue_policy", (int)i,
                     "priority queue policy for priority level %llu is specified more than once "
                     "for %s",
                     (unsigned long long)db->priority_queue_policy[i]->key, c->name);
                return;
            }
        }
    }
    if (db->preserve_ordering) {
        if (levels > 1) {
            nerr(c, db, "preserve_ordering", -1,
                 "Only one priority level is allowed when 'preserve_ordering' is true for %s",
                 c->name);
            return;
        }
        const Inference__ModelQueuePolicy *dp = db->default_queue_policy;
        if (dp && dp->default_timeout_microseconds != 0 &&
            dp->timeout_action == INFERENCE__MODEL_QUEUE_POLICY__TIMEOUT_ACTION__DELAY) {
            nerr(c, dp, "timeout_action", -1,
                 "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                 "true for %s",
                 c->name);
            return;
        }
        for (size_t i = 0; i < db->n_priority_queue_policy; i++) {
            const Inference__ModelQueuePolicy *qp = db->priority_queue_policy[i]->value;
            if (qp && qp->default_timeout_microseconds != 0 &&
                qp->timeout_action == INFERENCE__MODEL_QUEUE_POLICY__TIMEOUT_ACTION__DELAY) {
                nerr(c, qp, "timeout_action", -1,
                     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' "
                     "is true for %s",
                     c->name);
                return;
            }
        }
    }
}
void validate_instance_groups(nctx_t *c, const config_options_t *opts)
{
    model_config_t *cfg = c->cfg;
    if (cfg->scheduling_choice_case ==
        INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING)
        return;
    int64_t total = 0; /* instances so far, each group within the limit */
    for (size_t i = 0; i < cfg->n_instance_group; i++) {
        const Inference__ModelInstanceGroup *g = cfg->instance_group[i];
        if (g->count < 1 || g->count > CONFIG_MAX_INSTANCES) {
            nerr(c, g, "count", -1,
                 "instance group %s of model %s has count %d, expected a count from 1 to %d",
                 g->name, c->name, g->count, CONFIG_MAX_INSTANCES);
            continue;
        }
        if (total <= CONFIG_MAX_INSTANCES && (total += g->count) > CONFIG_MAX_INSTANCES) {
            nerr(c, g, "count", -1,
                 "instance group %s of model %s brings the model to %lld instances, more than "
                 "the limit of %d",
                 g->name, c->name, (long long)total, CONFIG_MAX_INSTANCES);
        }
        switch (g->kind) {
        case INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_MODEL:
            if (g->n_gpus > 0) {
                nerr(c, g, "gpus", -1,
                     "instance group %s of model %s has kind KIND_MODEL but specifies one or more "
                     "GPUs",
                     g->name, c->name);
                continue;
            }
            break;
        case INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_GPU:
            if (!(opts && opts->gpus_available)) {
                nerr(c, g, "kind", -1,
                     "instance group %s of model %s has kind KIND_GPU but server does not "
                     "support GPUs",
                     g->name, c->name);
                continue;
            }
            break;
        case INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU:
            if (g->n_gpus > 0) {
                nerr(c, g, "gpus", -1,
                     "instance group %s of model %s has kind KIND_CPU but specifies one or more "
                     "GPUs",
                     g->name, c->name);
                continue;
            }
            break;
        default:
            nerr(c, g, "kind", -1, "instance group %s of model %s has unexpected kind %d", g->name,
                 c->name, g->kind);
            continue;
        }
        if (!streq(cfg->platform, "tensorrt_plan") && g->n_profile > 0) {
            nerr(c, g, "profile", -1,
                 "instance group %s of model %s and platform %s specifies profile field which is "
                 "only supported for TensorRT models",
                 g->name, c->name, cfg->platform);
            continue;
        }
        for (size_t k = 0; k < g->n_secondary_devices; k++) {
            if (g->secondary_devices[k]->kind !=
                INFERENCE__MODEL_INSTANCE_GROUP__SECONDARY_DEVICE__SECONDARY_DEVICE_KIND__KIND_NVDLA) {
                nerr(c, g->secondary_devices[k], "kind", -1,
                     "instance group %s of model %s has unknown secondary device kind", g->name,
                     c->name);
                break;
            }
        }
    }
}

static void validate_model_metrics(nctx_t *c)
{
    const Inference__ModelMetrics *mm = c->cfg->model_metrics;
    for (size_t i = 0; i < mm->n_metric_control; i++) {
        const Inference__ModelMetrics__MetricControl *mc = mm->metric_control[i];
        if (!mc->metric_identifier) {
            nerr(c, mc, NULL, -1, "metric control must specify 'metric_identifier'");
            return;
        }
        if (empty(mc->metric_identifier->family)) {
            nerr(c, mc->metric_identifier, "family", -1,
                 "metric identifier must specify non-empty 'family'");
            return;
        }
        if (mc->metric_options_case !=
                INFERENCE__MODEL_METRICS__METRIC_CONTROL__METRIC_OPTIONS_HISTOGRAM_OPTIONS ||
            !mc->histogram_options) {
            nerr(c, mc, NULL, -1, "metric control must specify 'histogram_options'");
            return;
        }
        if (mc->histogram_options->n_buckets == 0) {
            nerr(c, mc->histogram_options, NULL, -1,
                 "histogram options must specify non-empty 'buckets'");
            return;
        }
    }
}

void validate_warmup(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    for (size_t i = 0; i < cfg->n_model_warmup; i++) {
        const Inference__ModelWarmup *w = cfg->model_warmup[i];
        if (w->batch_size == 0) {
            nerr(c, w, "batch_size", -1,
                 "model warmup setting '%s' must specify a 'batch_size' >= 1 for %s", w->name,
                 c->name);
            continue;
        }
        if ((cfg->max_batch_size == 0 && w->batch_size != 1) ||
            (cfg->max_batch_size > 0 && w->batch_size > (uint32_t)cfg->max_batch_size)) {
            nerr(c, w, "batch_size", -1,
                 "model warmup setting '%s' has 'batch_size' %u larger than the model allows "
                 "for %s",
                 w->name, w->batch_size, c->name);
            continue;
        }
        for (size_t k = 0; k < w->n_inputs; k++) {
            const Inference__ModelWarmup__Input *in = w->inputs[k]->value;
            if (!in || in->input_data_type_case ==
                           INFERENCE__MODEL_WARMUP__INPUT__INPUT_DATA_TYPE__NOT_SET) {
                nerr(c, w, "inputs", (int)k,
                     "model warmup input '%s' of setting '%s' must specify one of 'zero_data', "
                     "'random_data' or 'input_data_file' for %s",
                     w->inputs[k]->key, w->name, c->name);
                break;
            }
            if (in->data_type == INFERENCE__DATA_TYPE__TYPE_INVALID ||
                !valid_datatype(in->data_type)) {
                nerr(c, w, "inputs", (int)k,
                     "model warmup input '%s' of setting '%s' must specify a valid 'data_type' "
                     "for %s",
                     w->inputs[k]->key, w->name, c->name);
                break;
            }
            char what[512];
            snprintf(what, sizeof what, "model warmup input '%s' of setting '%s'",
                     w->inputs[k]->key, w->name);
            if (!tensor_within_limit(c, in, "dims", in->data_type,
                                     cfg->max_batch_size > 0 ? w->batch_size : 1, in->dims,
                                     in->n_dims, what))
                break;
        }
    }
}

/* Triton's ValidateModelConfig (and the checks that go with it). */
void validate_model_config(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    if (empty(cfg->backend)) {
        if (!streq(cfg->platform, "ensemble")) {
            nerr(c, cfg, "platform", -1, "unexpected platform type '%s' for %s", cfg->platform,
                 c->name);
            return;
        }
    } else if (streq(cfg->platform, "ensemble")) {
        nerr(c, cfg, "backend", -1,
             "Ensemble model '%s' must have platform type '%s' and empty backend type", c->name,
             cfg->platform);
        return;
    }
    /* a known backend must be paired with its own platform */
    static const struct {
        const char *backend;
        const char *platforms[3];
    } known[] = {
        {"tensorflow", {"tensorflow_graphdef", "tensorflow_savedmodel", NULL}},
        {"tensorrt", {"tensorrt_plan", NULL, NULL}},
        {"onnxruntime", {"onnxruntime_onnx", NULL, NULL}},
        {"pytorch", {"pytorch_libtorch", "libtorch", "torch_aoti"}},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!streq(cfg->backend, known[i].backend)) continue;
        bool match = false;
        for (size_t k = 0; k < 3 && known[i].platforms[k]; k++)
            match |= streq(cfg->platform, known[i].platforms[k]);
        if (!match)
            nerr(c, cfg, "platform", -1, "unexpected 'platform' and 'backend' pair, got:%s, %s",
                 cfg->platform, cfg->backend);
        break;
    }
    if (cfg->max_batch_size < 0)
        nerr(c, cfg, "max_batch_size", -1, "'max_batch_size' must be non-negative value for %s",
             c->name);
    if (cfg->version_policy) {
        const Inference__ModelVersionPolicy *vp = cfg->version_policy;
        if (vp->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE__NOT_SET)
            nerr(c, vp, NULL, -1,
                 "version_policy must specify one of 'latest', 'all' or 'specific' for %s",
                 c->name);
        else if (vp->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST &&
                 vp->latest && vp->latest->num_versions == 0)
            nerr(c, vp->latest, "num_versions", -1,
                 "version_policy latest 'num_versions' must be >= 1 for %s", c->name);
        else if (vp->policy_choice_case ==
                     INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_SPECIFIC &&
                 vp->specific) {
            for (size_t i = 0; i < vp->specific->n_versions; i++) {
                if (vp->specific->versions[i] < 0) {
                    nerr(c, vp->specific, "versions", (int)i,
                         "version_policy specific versions must be non-negative for %s", c->name);
                    break;
                }
            }
        }
    }
    switch (cfg->scheduling_choice_case) {
    case INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING:
        if (cfg->dynamic_batching) validate_dynamic_batching(c);
        break;
    case INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING:
        if (cfg->sequence_batching) validate_sequence_batching(c);
        break;
    case INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING:
        if (cfg->ensemble_scheduling) validate_ensemble(c);
        break;
    default:
        if (streq(cfg->platform, "ensemble"))
            nerr(c, cfg, "platform", -1,
                 "ensemble scheduling must be set for ensemble %s whose platform is ensemble",
                 c->name);
        break;
    }
    if (cfg->model_transaction_policy && cfg->model_transaction_policy->decoupled &&
        cfg->response_cache && cfg->response_cache->enable)
        nerr(c, cfg->response_cache, "enable", -1,
             "Response Cache does not currently support model %s with 'decoupled' transaction "
             "policy. Please disable the response cache.",
             c->name);
    if (cfg->model_metrics) validate_model_metrics(c);
}
