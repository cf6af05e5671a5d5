/*
 * This file contains the onnxruntime backend's view of a model's config
 * against its session: the session's inputs and outputs, autofill of the
 * config from them, validation of the config against them, and binding the
 * config's inputs and outputs (and sequence tensors) to the session.
 */
#include "onnxruntime.h"

/* ---- model: reading the session's inputs and outputs --------------------- */

void tensors_free(ort_tensor_t *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++) {
        free(t[i].name);
        free(t[i].dims);
    }
    free(t);
}

static nereid_error_t *type_info_read(const ort_api_t *api, OrtTypeInfo *ti, ort_tensor_t *t)
{
    int onnx_type = 0;
    ORT_TRY(api, api->GetOnnxTypeFromTypeInfo(ti, &onnx_type));
    if (onnx_type != ORT_TYPE_TENSOR)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "model input/output '%s' is not a tensor (ONNX type %d)", t->name,
                                onnx_type);
    const OrtTensorTypeAndShapeInfo *info;
    ORT_TRY(api, api->CastTypeInfoToTensorInfo(ti, &info));
    ORT_TRY(api, api->GetTensorElementType(info, &t->elem_type));
    ORT_TRY(api, api->GetDimensionsCount(info, &t->rank));
    t->dims = calloc(t->rank + 1, sizeof(int64_t));
    if (!t->dims) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    ORT_TRY(api, api->GetDimensions(info, t->dims, t->rank));
    for (size_t i = 0; i < t->rank; i++)
        if (t->dims[i] < 0) t->dims[i] = -1;
    return NULL;
}

/* Reads the session's inputs, outputs or overridable initializers (graph
 * inputs that have an initializer: a request may feed them, Triton lists
 * them as optional config inputs). */
nereid_error_t *session_tensors(ort_backend_t *b, OrtSession *session, int kind, ort_tensor_t **out,
                                size_t *n_out)
{
    const ort_api_t *api = &b->api;
    size_t n = 0;
    *out = NULL;
    *n_out = 0;
    bool is_output = kind == TENSORS_OUTPUTS, is_init = kind == TENSORS_INITIALIZERS;
    ORT_TRY(api, is_output ? api->SessionGetOutputCount(session, &n)
                 : is_init ? api->SessionGetOverridableInitializerCount(session, &n)
                           : api->SessionGetInputCount(session, &n));
    ort_tensor_t *t = calloc(n + 1, sizeof(*t));
    if (!t) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < n && !err; i++) {
        char *name = NULL;
        err = ort_error(api, is_output ? api->SessionGetOutputName(session, i, b->allocator, &name)
                             : is_init ? api->SessionGetOverridableInitializerName(
                                             session, i, b->allocator, &name)
                                       : api->SessionGetInputName(session, i, b->allocator, &name));
        if (err) break;
        t[i].name = strdup(name);
        OrtStatus *st = api->AllocatorFree(b->allocator, name);
        if (st) api->ReleaseStatus(st);
        if (!t[i].name) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            break;
        }
        OrtTypeInfo *ti = NULL;
        err = ort_error(api, is_output ? api->SessionGetOutputTypeInfo(session, i, &ti)
                             : is_init
                                 ? api->SessionGetOverridableInitializerTypeInfo(session, i, &ti)
                                 : api->SessionGetInputTypeInfo(session, i, &ti));
        if (!err) err = type_info_read(api, ti, &t[i]);
        if (ti) api->ReleaseTypeInfo(ti);
    }
    if (err) {
        tensors_free(t, n);
        return err;
    }
    *out = t;
    *n_out = n;
    return NULL;
}

static const ort_tensor_t *tensor_find(const ort_tensor_t *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* ---- model: autofill ------------------------------------------------------ */

static bool batching_supported(const ort_tensor_t *in, size_t n_in, const ort_tensor_t *out,
                               size_t n_out)
{
    for (size_t i = 0; i < n_in; i++)
        if (in[i].rank == 0 || in[i].dims[0] != -1) return false;
    for (size_t i = 0; i < n_out; i++)
        if (out[i].rank == 0 || out[i].dims[0] != -1) return false;
    return true;
}

/* Whether name is a sequence control or state input of cfg (JSON): the
 * sequence batcher feeds those, so autofill does not list them as inputs. */
static bool sequence_input(json_t *cfg, const char *name)
{
    json_t *sb = json_object_get(cfg, "sequence_batching"), *v;
    size_t i;
    for (int pass = 0; pass < 2; pass++)
        json_array_foreach(json_object_get(sb, pass ? "state" : "control_input"), i, v)
        {
            const char *n = json_string_value(json_object_get(v, pass ? "input_name" : "name"));
            if (n && strcmp(n, name) == 0) return true;
        }
    return false;
}

/* The config entries of tensors t, without the sequence inputs of cfg
 * (when cfg is non-NULL). */
static json_t *io_json(const ort_tensor_t *t, size_t n, bool batching, json_t *cfg)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (cfg && sequence_input(cfg, t[i].name)) continue;
        json_t *io = json_object();
        json_object_set_new(io, "name", json_string(t[i].name));
        json_object_set_new(io, "data_type", json_string(config_type_name(t[i].elem_type)));
        json_t *dims = json_array();
        for (size_t d = batching ? 1 : 0; d < t[i].rank; d++)
            json_array_append_new(dims, json_integer(t[i].dims[d]));
        if (json_array_size(dims) == 0) {
            json_array_append_new(dims, json_integer(1));
            if (batching) {
                json_t *reshape = json_object();
                json_object_set_new(reshape, "shape", json_array());
                json_object_set_new(io, "reshape", reshape);
            }
        }
        json_object_set_new(io, "dims", dims);
        json_array_append_new(arr, io);
    }
    return arr;
}

/* --backend-config=[onnxruntime,]default-max-batch-size=N (the core passes
 * Triton's 4 when unset): the max_batch_size auto-complete gives a model
 * that can batch; 0 leaves it unbatched. */
static int64_t default_max_batch_size(const nereid_model_t *model)
{
    const char *v = nereid_backend_config(nereid_model_backend(model), "default-max-batch-size");
    char *end;
    long long n = v ? strtoll(v, &end, 10) : ORT_DEFAULT_MAX_BATCH_SIZE;
    if (v && (*end || end == v || n < 0)) n = ORT_DEFAULT_MAX_BATCH_SIZE;
    return n;
}

/* Triton's onnxruntime auto-complete: fills max_batch_size and missing
 * inputs/outputs from the model. */
nereid_error_t *autofill(nereid_model_t *model, const ort_tensor_t *in, size_t n_in,
                         const ort_tensor_t *out, size_t n_out)
{
    const char *name = nereid_model_name(model);
    const char *text = nereid_model_config_json(model);
    json_error_t jerr;
    json_t *cfg = json_loads(text ? text : "{}", 0, &jerr);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "autofill failed for model '%s': %s", name,
                                "cannot parse the model configuration");
    }
    int64_t mbs = nereid_model_max_batch_size(model);
    if (batching_supported(in, n_in, out, n_out)) {
        if (mbs == 0 && (mbs = default_max_batch_size(model)) > 0) {
            json_object_set_new(cfg, "max_batch_size", json_integer(mbs));
            fprintf(stderr,
                    "W onnxruntime: autofilled max_batch_size to %lld for model '%s' since "
                    "batching is supporrted but no max_batch_size is specified in model "
                    "configuration. Must specify max_batch_size to utilize autofill with a "
                    "larger max batch size\n",
                    (long long)mbs, name);
            if (mbs > 1 && !json_object_get(cfg, "dynamic_batching") &&
                !json_object_get(cfg, "sequence_batching"))
                json_object_set_new(cfg, "dynamic_batching", json_object());
        }
    } else if (mbs != 0) {
        json_decref(cfg);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "autofill failed for model '%s': model does not support batching "
                                "while non-zero max_batch_size is specified",
                                name);
    }
    if (json_array_size(json_object_get(cfg, "input")) == 0)
        json_object_set_new(cfg, "input", io_json(in, n_in, mbs > 0, cfg));
    if (json_array_size(json_object_get(cfg, "output")) == 0)
        json_object_set_new(cfg, "output", io_json(out, n_out, mbs > 0, NULL));
    char *new_text = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    if (!new_text) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    nereid_error_t *err = nereid_model_set_config(model, new_text);
    free(new_text);
    return err;
}

/* ---- model: validation against the session ------------------------------- */

static nereid_error_t *not_allowed(const char *what, const char *name, const ort_tensor_t *t,
                                   size_t n)
{
    char list[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof(list); i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", i ? ", " : "", t[i].name);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "unexpected inference %s '%s', allowed %ss are: %s", what, name, what,
                            list);
}

/* Triton's CompareDimsSupported. */
static nereid_error_t *compare_dims(const char *model_name, const char *name, const ort_tensor_t *t,
                                    const int64_t *dims, size_t rank, int64_t mbs, bool exact)
{
    char model_shape[256], config_shape[256];
    shape_string(model_shape, sizeof(model_shape), t->dims, t->rank);
    if (t->rank == 0) { /* scalar in the model: config dims must all be 1 */
        for (size_t i = 0; i < rank; i++) {
            if (dims[i] != 1) {
                shape_string(config_shape, sizeof(config_shape), dims, rank);
                return nereid_error_new(
                    NEREID_ERROR_INVALID_ARG,
                    "unable to load model '%s', scalar tensor '%s', should only provide 1 in the "
                    "model configuration when the model doesn't support batching. Model "
                    "configuration provided: %s.",
                    model_name, name, config_shape);
            }
        }
        return NULL;
    }
    int64_t full[65] = {0};
    size_t full_rank = 0;
    if (rank > 63) rank = 63;
    if (mbs > 0) {
        if (t->dims[0] != -1)
            return nereid_error_new(
                NEREID_ERROR_INVALID_ARG,
                "model '%s', tensor '%s': for the model to support batching the shape should have "
                "at least 1 dimension and the first dimension must be -1; but shape expected by "
                "the model is %s",
                model_name, name, model_shape);
        full[full_rank++] = -1;
    }
    for (size_t i = 0; i < rank; i++)
        full[full_rank++] = dims[i];
    bool ok = t->rank == full_rank;
    for (size_t i = 0; ok && i < full_rank; i++)
        if (exact || t->dims[i] != -1) ok = t->dims[i] == full[i];
    if (ok) return NULL;
    shape_string(config_shape, sizeof(config_shape), full, full_rank);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "model '%s', tensor '%s': the model expects %zu dimensions (shape %s) "
                            "but the model configuration specifies %zu dimensions (%s%s)",
                            model_name, name, t->rank, model_shape, full_rank,
                            mbs > 0 ? "an initial batch dimension because max_batch_size > 0 "
                                      "followed by the explicit tensor shape, making complete "
                                      "shape "
                                    : "shape ",
                            config_shape);
}

/* Triton's ragged batching in a batching config: an input with
 * allow_ragged_batch must be [-1] in the model (the core feeds it flat), and
 * the dims of a BATCH_SCATTER_WITH_INPUT_SHAPE target are not compared (the
 * core shapes it per request). */
enum { DIMS_COMPARE, DIMS_RAGGED, DIMS_SKIP };

static int dims_mode(ort_model_t *m, const nereid_model_t *model, bool input, const char *name)
{
    if (nereid_model_max_batch_size(model) <= 0) return DIMS_COMPARE;
    json_t *root = config_of(m, model);
    int mode = DIMS_COMPARE;
    size_t i, k;
    json_t *io, *target;
    json_array_foreach(json_object_get(root, input ? "input" : "batch_output"), i, io)
    {
        const char *io_name = json_string_value(json_object_get(io, "name"));
        const char *kind = json_string_value(json_object_get(io, "kind"));
        if (input && io_name && strcmp(io_name, name) == 0 &&
            json_is_true(json_object_get(io, "allow_ragged_batch")))
            mode = DIMS_RAGGED;
        if (input || !kind || strcmp(kind, "BATCH_SCATTER_WITH_INPUT_SHAPE") != 0) continue;
        json_array_foreach(json_object_get(io, "target_name"), k, target)
        {
            if (json_is_string(target) && strcmp(json_string_value(target), name) == 0)
                mode = DIMS_SKIP;
        }
    }
    return mode;
}

static nereid_error_t *check_io(const char *model_name, const char *what, const char *name,
                                nereid_datatype_t dt, const int64_t *dims, size_t rank, int64_t mbs,
                                const ort_tensor_t *all, size_t n_all, int mode)
{
    const ort_tensor_t *t = tensor_find(all, n_all, name);
    if (!t) return not_allowed(what, name, all, n_all);
    int elem = elem_from_datatype(dt);
    if (elem == ORT_ELEM_UNDEFINED)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "unsupported datatype %s for %s '%s' for model '%s'",
                                nereid_datatype_name(dt), what, name, model_name);
    if (elem != t->elem_type) {
        const char *cfg_name = config_type_name(elem);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects datatype %s for "
                                "%s '%s', model provides %s",
                                model_name, cfg_name, what, name, config_type_name(t->elem_type));
    }
    if (mode == DIMS_SKIP) return NULL;
    if (mode == DIMS_RAGGED) {
        if (t->rank == 1 && t->dims[0] == -1) return NULL;
        char model_shape[256];
        shape_string(model_shape, sizeof(model_shape), t->dims, t->rank);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects model provides "
                                "input with shape [-1]  for ragged input '%s', model provides %s",
                                model_name, name, model_shape);
    }
    return compare_dims(model_name, name, t, dims, rank, mbs, !strcmp(what, "output"));
}

static bool config_has_io(const nereid_model_t *model, bool input, const char *name)
{
    size_t n = input ? nereid_model_input_count(model) : nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *io;
        if (input)
            nereid_model_input(model, i, &io, NULL, NULL, NULL);
        else
            nereid_model_output(model, i, &io, NULL, NULL, NULL);
        if (strcmp(io, name) == 0) return true;
    }
    return false;
}

static int add_seq_name(ort_model_t *m, const char *name)
{
    for (size_t i = 0; i < m->n_seq_names; i++)
        if (strcmp(m->seq_names[i], name) == 0) return 0;
    char **v = realloc(m->seq_names, (m->n_seq_names + 1) * sizeof(*v));
    if (!v) return -1;
    m->seq_names = v;
    if (!(v[m->n_seq_names] = strdup(name))) return -1;
    m->n_seq_names++;
    return 0;
}

/* Sequence batching: the control inputs and implicit state inputs the core
 * injects into every request (and the state outputs it captures) are model
 * tensors that config.pbtxt does not list as input/output; so are the
 * targets of batch_input (the core computes them per batch). Collects those
 * the session has into m->seq_names: *n_seq_in inputs, then outputs. */
static int sequence_names(ort_model_t *m, const nereid_model_t *model, const ort_tensor_t *in,
                          size_t n_in, const ort_tensor_t *out, size_t n_out, size_t *n_seq_in)
{
    *n_seq_in = 0;
    json_t *cfg = config_of(m, model);
    json_t *sb = json_object_get(cfg, "sequence_batching");
    int rc = 0;
    for (int pass = 0; pass < 2 && sb && rc == 0; pass++) {
        size_t i;
        json_t *v;
        if (pass == 0) {
            json_array_foreach(json_object_get(sb, "control_input"), i, v)
            {
                const char *n = json_string_value(json_object_get(v, "name"));
                if (n && tensor_find(in, n_in, n) && !config_has_io(model, true, n))
                    rc |= add_seq_name(m, n);
            }
        }
        json_array_foreach(json_object_get(sb, "state"), i, v)
        {
            const char *n =
                json_string_value(json_object_get(v, pass == 0 ? "input_name" : "output_name"));
            if (!n) continue;
            if (pass == 0 && tensor_find(in, n_in, n) && !config_has_io(model, true, n))
                rc |= add_seq_name(m, n);
            if (pass == 1 && tensor_find(out, n_out, n) && !config_has_io(model, false, n))
                rc |= add_seq_name(m, n);
        }
        if (pass == 0) *n_seq_in = m->n_seq_names;
    }
    json_t *bis = json_object_get(cfg, "batch_input"), *bi, *target;
    size_t i, k;
    json_array_foreach(bis, i, bi)
    {
        json_array_foreach(json_object_get(bi, "target_name"), k, target)
        {
            const char *n = json_string_value(target);
            if (n && tensor_find(in, n_in, n) && !config_has_io(model, true, n)) {
                size_t before = m->n_seq_names;
                rc |= add_seq_name(m, n);
                /* inputs first: move it in front of the state outputs */
                if (m->n_seq_names > before && before > *n_seq_in) {
                    char *name = m->seq_names[before];
                    memmove(&m->seq_names[*n_seq_in + 1], &m->seq_names[*n_seq_in],
                            (before - *n_seq_in) * sizeof(*m->seq_names));
                    m->seq_names[*n_seq_in] = name;
                }
                if (m->n_seq_names > before) (*n_seq_in)++;
            }
        }
    }
    return rc;
}

/* Binds the (possibly autofilled) config's inputs and outputs to the model.
 * A config input may also name an overridable initializer (Triton's
 * L0_initializer_as_input): it is not counted against the model's inputs. */
nereid_error_t *bind_config(ort_model_t *m, nereid_model_t *model, const ort_tensor_t *in,
                            size_t n_in, const ort_tensor_t *inits, size_t n_inits,
                            const ort_tensor_t *out, size_t n_out)
{
    const char *name = nereid_model_name(model);
    m->max_batch_size = nereid_model_max_batch_size(model);
    m->n_inputs = nereid_model_input_count(model);
    m->n_outputs = nereid_model_output_count(model);
    size_t n_cfg_in = m->n_inputs, n_cfg_out = m->n_outputs, n_seq_in = 0, n_init_in = 0;
    m->n_cfg_inputs = n_cfg_in;
    for (size_t i = 0; i < n_cfg_in; i++) {
        const char *io;
        nereid_model_input(model, i, &io, NULL, NULL, NULL);
        if (!tensor_find(in, n_in, io) && tensor_find(inits, n_inits, io)) n_init_in++;
    }
    if (sequence_names(m, model, in, n_in, out, n_out, &n_seq_in) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    m->n_inputs += n_seq_in;
    m->n_outputs += m->n_seq_names - n_seq_in;
    if (m->n_inputs - n_init_in != n_in)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects %zu inputs, "
                                "model provides %zu",
                                name, m->n_inputs, n_in);
    m->input_names = calloc(m->n_inputs + 1, sizeof(*m->input_names));
    m->input_datatypes = calloc(m->n_inputs + 1, sizeof(*m->input_datatypes));
    m->input_elem_types = calloc(m->n_inputs + 1, sizeof(*m->input_elem_types));
    m->outputs = calloc(m->n_outputs + 1, sizeof(*m->outputs));
    if (!m->input_names || !m->input_datatypes || !m->input_elem_types || !m->outputs)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    for (size_t i = 0; i < m->n_inputs; i++) {
        const int64_t *dims;
        size_t rank;
        if (i >= n_cfg_in) { /* injected by the sequence batcher */
            const ort_tensor_t *t = tensor_find(in, n_in, m->seq_names[i - n_cfg_in]);
            m->input_names[i] = m->seq_names[i - n_cfg_in];
            m->input_elem_types[i] = t->elem_type;
            m->input_datatypes[i] = datatype_from_elem(t->elem_type);
            continue;
        }
        nereid_model_input(model, i, &m->input_names[i], &m->input_datatypes[i], &dims, &rank);
        bool init = !tensor_find(in, n_in, m->input_names[i]) &&
                    tensor_find(inits, n_inits, m->input_names[i]);
        nereid_error_t *err = check_io(
            name, "input", m->input_names[i], m->input_datatypes[i], dims, rank, m->max_batch_size,
            init ? inits : in, init ? n_inits : n_in, dims_mode(m, model, true, m->input_names[i]));
        if (err) return err;
        m->input_elem_types[i] = elem_from_datatype(m->input_datatypes[i]);
    }
    for (size_t i = 0; i < m->n_outputs; i++) {
        ort_output_t *o = &m->outputs[i];
        const ort_tensor_t *t;
        if (i >= n_cfg_out) { /* an implicit state output the core captures */
            o->name = m->seq_names[n_seq_in + i - n_cfg_out];
            t = tensor_find(out, n_out, o->name);
            o->datatype = datatype_from_elem(t->elem_type);
        } else {
            nereid_model_output(model, i, &o->name, &o->datatype, &o->config_dims, &o->config_rank);
            int mode = dims_mode(m, model, false, o->name);
            nereid_error_t *err = check_io(name, "output", o->name, o->datatype, o->config_dims,
                                           o->config_rank, m->max_batch_size, out, n_out, mode);
            if (err) return err;
            t = tensor_find(out, n_out, o->name);
            o->flat = mode == DIMS_SKIP;
        }
        o->elem_type = t->elem_type;
        o->rank = t->rank;
        o->dims = calloc(t->rank + 1, sizeof(int64_t));
        if (!o->dims) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        memcpy(o->dims, t->dims, t->rank * sizeof(int64_t));
        o->shape_known = o->elem_type != ORT_ELEM_STRING && t->rank > 0 && !o->flat;
        for (size_t d = m->max_batch_size > 0 ? 1 : 0; d < t->rank; d++)
            if (t->dims[d] < 0) o->shape_known = false;
    }
    return NULL;
}
