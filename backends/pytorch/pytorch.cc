/*
 * This file contains Nereid's PyTorch backend (Triton's pytorch_libtorch
 * platform): TorchScript models (model.pt) run on LibTorch behind the C
 * backend ABI of include/nereid/backend.h. Each instance loads its own
 * torch::jit::Module; inputs are wrapped with torch::from_blob (no copy) and
 * outputs are copied into the core's output buffers. Config inputs map to
 * forward() arguments by argument name, else by `<name>__<index>`, else by
 * config order, as Triton's backend does; outputs by `<name>__<index>`, else
 * config order. Every C++ exception stops at the ABI boundary and becomes a
 * nereid_error_t.
 */
#include <ATen/Parallel.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <jansson.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nereid/backend.h"

namespace
{

const char *const kDefaultFilename = "model.pt";

/* An error that crosses the boundary as nereid_error_t with this code. */
struct BackendError : std::exception {
    nereid_error_code_t code;
    std::string msg;
    BackendError(nereid_error_code_t c, std::string m) : code(c), msg(std::move(m)) {}
    const char *what() const noexcept override
    {
        return msg.c_str();
    }
};

[[noreturn]] void fail(nereid_error_code_t code, const std::string &msg)
{
    throw BackendError(code, msg);
}

void log_warning(const std::string &msg)
{
    std::fprintf(stderr, "W pytorch: %s\n", msg.c_str());
}

/* Runs fn, turning any exception into an error for the core. prefix is put
 * before the messages of exceptions that did not come from this file. */
template <typename Fn> nereid_error_t *boundary(const char *prefix, Fn &&fn)
{
    try {
        fn();
        return nullptr;
    } catch (const BackendError &e) {
        return nereid_error_new(e.code, "%s", e.msg.c_str());
    } catch (const c10::Error &e) {
        return nereid_error_new(NEREID_ERROR_INTERNAL, "%s%s", prefix, e.what_without_backtrace());
    } catch (const std::exception &e) {
        return nereid_error_new(NEREID_ERROR_INTERNAL, "%s%s", prefix, e.what());
    } catch (...) {
        return nereid_error_new(NEREID_ERROR_INTERNAL, "%sunknown C++ exception", prefix);
    }
}

/* ---- Datatypes ---- */

bool torch_type(nereid_datatype_t dt, c10::ScalarType *out)
{
    switch (dt) {
    case NEREID_TYPE_BOOL:
        *out = torch::kBool;
        return true;
    case NEREID_TYPE_UINT8:
        *out = torch::kByte;
        return true;
    case NEREID_TYPE_INT8:
        *out = torch::kChar;
        return true;
    case NEREID_TYPE_INT16:
        *out = torch::kShort;
        return true;
    case NEREID_TYPE_INT32:
        *out = torch::kInt;
        return true;
    case NEREID_TYPE_INT64:
        *out = torch::kLong;
        return true;
    case NEREID_TYPE_FP16:
        *out = torch::kHalf;
        return true;
    case NEREID_TYPE_FP32:
        *out = torch::kFloat;
        return true;
    case NEREID_TYPE_FP64:
        *out = torch::kDouble;
        return true;
    default:
        return false;
    }
}

nereid_datatype_t from_torch_type(c10::ScalarType t)
{
    switch (t) {
    case torch::kBool:
        return NEREID_TYPE_BOOL;
    case torch::kByte:
        return NEREID_TYPE_UINT8;
    case torch::kChar:
        return NEREID_TYPE_INT8;
    case torch::kShort:
        return NEREID_TYPE_INT16;
    case torch::kInt:
        return NEREID_TYPE_INT32;
    case torch::kLong:
        return NEREID_TYPE_INT64;
    case torch::kHalf:
        return NEREID_TYPE_FP16;
    case torch::kFloat:
        return NEREID_TYPE_FP32;
    case torch::kDouble:
        return NEREID_TYPE_FP64;
    default:
        return NEREID_TYPE_INVALID;
    }
}

/* Triton's spelling in messages: "TYPE_" + the protocol name. */
std::string type_string(nereid_datatype_t dt)
{
    return std::string("TYPE_") + nereid_datatype_name(dt);
}

/* Config spelling (TYPE_STRING for BYTES). */
std::string config_type_string(nereid_datatype_t dt)
{
    return dt == NEREID_TYPE_BYTES ? "TYPE_STRING" : type_string(dt);
}

/* ---- Naming convention ---- */

/* The index of `<name>__<index>`: digits after the first "__" (Triton takes
 * the first occurrence). -1 when the name does not follow the convention. */
long named_index(const std::string &name)
{
    size_t pos = name.find("__");
    if (pos == std::string::npos) return -1;
    std::string digits = name.substr(pos + 2);
    for (char c : digits)
        if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
    return digits.empty() ? 0 : std::atol(digits.c_str());
}

/* ---- Model state ---- */

struct TensorSpec {
    std::string name;
    nereid_datatype_t datatype = NEREID_TYPE_INVALID;
    std::vector<int64_t> dims; /* without the batch dimension; reshape dims if any */
};

struct StateSpec {
    std::string input_name, output_name;
    nereid_datatype_t datatype = NEREID_TYPE_INVALID;
};

/* An optional bool parameter: set = present in the config. */
struct OptBool {
    bool set = false;
    bool value = false;
};

struct ModelState {
    std::string name;
    int64_t max_batch_size = 0;
    std::vector<TensorSpec> inputs, outputs;
    std::vector<std::string> controls; /* sequence control input names */
    std::vector<StateSpec> states;
    std::vector<std::string> batch_inputs; /* batch_input targets: the core computes them */
    bool optimized_execution = true;
    bool inference_mode = true;
    OptBool tensor_fuser, jit_profiling, jit_executor;
};

std::once_flag intra_op_once, inter_op_once;

bool parse_bool(const std::string &key, const char *value)
{
    std::string v(value);
    for (char &c : v)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
    if (v == "false" || v == "0" || v == "no" || v == "off") return false;
    fail(NEREID_ERROR_INVALID_ARG,
         "failed to convert '" + std::string(value) + "' to boolean for parameter '" + key + "'");
}

long parse_int(const std::string &key, const char *value)
{
    char *end = nullptr;
    errno = 0;
    long v = std::strtol(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0')
        fail(NEREID_ERROR_INVALID_ARG, "failed to convert '" + std::string(value) +
                                           "' to integral number for parameter '" + key + "'");
    return v;
}

void parse_parameters(nereid_model_t *model, ModelState *ms)
{
    if (const char *v = nereid_model_parameter(model, "DISABLE_OPTIMIZED_EXECUTION"))
        ms->optimized_execution = !parse_bool("DISABLE_OPTIMIZED_EXECUTION", v);
    if (const char *v = nereid_model_parameter(model, "INFERENCE_MODE"))
        ms->inference_mode = parse_bool("INFERENCE_MODE", v);
    const std::pair<const char *, OptBool *> opts[] = {
        {"ENABLE_TENSOR_FUSER", &ms->tensor_fuser},
        {"ENABLE_JIT_PROFILING", &ms->jit_profiling},
        {"ENABLE_JIT_EXECUTOR", &ms->jit_executor},
    };
    for (const auto &o : opts) {
        if (const char *v = nereid_model_parameter(model, o.first)) {
            o.second->set = true;
            o.second->value = parse_bool(o.first, v);
        }
    }
    /* Accepted for compatibility; they only matter on GPUs or with shared
     * weights, which this CPU build does not have. */
    for (const char *key : {"DISABLE_CUDNN", "ENABLE_WEIGHT_SHARING", "ENABLE_CACHE_CLEANING"})
        if (const char *v = nereid_model_parameter(model, key)) (void)parse_bool(key, v);

    /* Thread counts are process-wide: the first model that sets one wins. */
    if (const char *v = nereid_model_parameter(model, "INTRA_OP_THREAD_COUNT")) {
        long n = parse_int("INTRA_OP_THREAD_COUNT", v);
        if (n > 0) std::call_once(intra_op_once, [n] { at::set_num_threads(static_cast<int>(n)); });
    }
    if (const char *v = nereid_model_parameter(model, "INTER_OP_THREAD_COUNT")) {
        long n = parse_int("INTER_OP_THREAD_COUNT", v);
        if (n > 0) {
            std::call_once(inter_op_once, [n] {
                try {
                    at::set_num_interop_threads(static_cast<int>(n));
                } catch (const c10::Error &e) {
                    log_warning(std::string("INTER_OP_THREAD_COUNT not applied: ") +
                                e.what_without_backtrace());
                }
            });
        }
    }
}

const char *json_str(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* Sequence controls and implicit state, from the config JSON. */
void read_config_json(nereid_model_t *model, ModelState *ms)
{
    const char *text = nereid_model_config_json(model);
    if (text == nullptr) return;
    json_error_t jerr;
    std::unique_ptr<json_t, void (*)(json_t *)> root(json_loads(text, 0, &jerr), json_decref);
    if (!root) fail(NEREID_ERROR_INTERNAL, std::string("model config JSON: ") + jerr.text);
    size_t i, k;
    json_t *bi, *target;
    json_array_foreach(json_object_get(root.get(), "batch_input"), i, bi)
    {
        json_array_foreach(json_object_get(bi, "target_name"), k, target)
        {
            if (json_is_string(target) && ms->max_batch_size > 0)
                ms->batch_inputs.push_back(json_string_value(target));
        }
    }
    json_t *seq = json_object_get(root.get(), "sequence_batching");
    if (!json_is_object(seq)) return;
    json_t *ci;
    json_array_foreach(json_object_get(seq, "control_input"), i, ci)
    {
        std::string name = json_str(ci, "name");
        if (!name.empty()) ms->controls.push_back(name);
    }
    json_t *st;
    json_array_foreach(json_object_get(seq, "state"), i, st)
    {
        StateSpec s;
        s.input_name = json_str(st, "input_name");
        s.output_name = json_str(st, "output_name");
        s.datatype = nereid_datatype_from_config_name(json_str(st, "data_type"));
        ms->states.push_back(s);
    }
}

void check_io_type(const ModelState *ms, const TensorSpec &s, const char *kind)
{
    c10::ScalarType t;
    if (s.datatype != NEREID_TYPE_BYTES && !torch_type(s.datatype, &t))
        fail(NEREID_ERROR_INTERNAL, "unsupported datatype " + config_type_string(s.datatype) +
                                        " for " + kind + " '" + s.name + "' for model '" +
                                        ms->name + "'");
    if (s.datatype == NEREID_TYPE_BYTES) {
        if (s.dims.size() + (ms->max_batch_size > 0 ? 1 : 0) > 1)
            fail(NEREID_ERROR_INTERNAL, std::string("Triton only supports 1 dimensional List of "
                                                    "String as ") +
                                            kind + " for '" + s.name + "' for model '" + ms->name +
                                            "'");
    }
}

void model_init(nereid_model_t *model)
{
    auto ms = std::make_unique<ModelState>();
    ms->name = nereid_model_name(model);
    ms->max_batch_size = nereid_model_max_batch_size(model);
    for (int pass = 0; pass < 2; pass++) {
        bool in = pass == 0;
        size_t n = in ? nereid_model_input_count(model) : nereid_model_output_count(model);
        for (size_t i = 0; i < n; i++) {
            const char *name = nullptr;
            const int64_t *dims = nullptr;
            size_t rank = 0;
            TensorSpec s;
            if (in)
                nereid_model_input(model, i, &name, &s.datatype, &dims, &rank);
            else
                nereid_model_output(model, i, &name, &s.datatype, &dims, &rank);
            s.name = name ? name : "";
            s.dims.assign(dims, dims + rank);
            (in ? ms->inputs : ms->outputs).push_back(s);
        }
    }
    /* No input in the config: the forward signature check says so, as in
     * Triton ("configuration expects 0 inputs, model provides N"). */
    if (ms->outputs.empty())
        fail(NEREID_ERROR_INTERNAL,
             "model configuration must contain at least one output, none were specified.");
    read_config_json(model, ms.get());
    for (const TensorSpec &s : ms->inputs)
        check_io_type(ms.get(), s, "input");
    for (const TensorSpec &s : ms->outputs)
        check_io_type(ms.get(), s, "output");
    for (const StateSpec &s : ms->states) {
        c10::ScalarType t;
        if (s.datatype != NEREID_TYPE_BYTES && !torch_type(s.datatype, &t))
            fail(NEREID_ERROR_INTERNAL, "unsupported datatype " + config_type_string(s.datatype) +
                                            " for state '" + s.output_name + "' for model '" +
                                            ms->name + "'");
    }
    parse_parameters(model, ms.get());
    nereid_model_set_state(model, ms.release());
}

/* ---- Instance state ---- */

struct OutputSlot {
    std::string name;
    size_t index = 0; /* position in the model's outputs */
    nereid_datatype_t datatype = NEREID_TYPE_INVALID;
};

struct InstanceState {
    ModelState *ms = nullptr;
    torch::jit::Module module;
    bool dict_input = false;
    size_t n_args = 0;
    std::unordered_map<std::string, size_t> input_index; /* name -> forward() position */
    std::vector<OutputSlot> outputs;
};

bool file_exists(const std::string &path)
{
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

/* `<name>__<index>` index of a control or state name, or an error. */
size_t required_named_index(const std::string &name)
{
    long idx = named_index(name);
    if (idx < 0)
        fail(NEREID_ERROR_INTERNAL,
             "input '" + name + "' does not follow <name>__<index> naming convention.");
    return static_cast<size_t>(idx);
}

void map_inputs(InstanceState *is)
{
    ModelState *ms = is->ms;
    const c10::FunctionSchema &schema = is->module.get_method("forward").function().getSchema();
    const std::vector<c10::Argument> &args = schema.arguments();
    size_t start = (!args.empty() && args[0].type()->kind() == c10::TypeKind::ClassType) ? 1 : 0;
    size_t expected =
        ms->inputs.size() + ms->controls.size() + ms->states.size() + ms->batch_inputs.size();
    std::vector<std::string> allowed;
    if (args.size() == start + 1 && args[start].type()->kind() == c10::TypeKind::DictType) {
        is->dict_input = true;
    } else {
        for (size_t i = start; i < args.size(); i++) {
            c10::TypeKind k = args[i].type()->kind();
            if (k == c10::TypeKind::DictType && i > start)
                fail(NEREID_ERROR_INTERNAL, "Multiple inputs of kind DictType were detected. Only "
                                            "a single input of type Dict(str, Tensor) is "
                                            "supported.");
            if (k != c10::TypeKind::TensorType && k != c10::TypeKind::ListType)
                fail(NEREID_ERROR_INTERNAL,
                     "An input of type '" + args[i].type()->str() +
                         "' was detected in the model. Only a single input of type Dict(str, "
                         "Tensor) or input(s) of type Tensor are supported.");
            allowed.push_back(args[i].name());
        }
        if (allowed.size() != expected)
            fail(NEREID_ERROR_INVALID_ARG,
                 "unable to load model '" + ms->name + "', configuration expects " +
                     std::to_string(expected) + " inputs, model provides " +
                     std::to_string(allowed.size()));
    }
    is->n_args = is->dict_input ? 1 : allowed.size();

    enum { FORWARD_ARGUMENT, NAMED_INDEX, CONFIG_ORDER } convention = FORWARD_ARGUMENT;
    for (const TensorSpec &s : ms->inputs) {
        bool found = false;
        for (const std::string &a : allowed)
            found = found || a == s.name;
        if (!found) convention = NAMED_INDEX;
    }
    /* Implicit state needs index names; forward() arguments that are
     * themselves called INPUT__0 etc. must not block that (Triton refuses). */
    if (!ms->states.empty()) {
        bool all_indexed = true;
        for (const TensorSpec &s : ms->inputs)
            all_indexed = all_indexed && named_index(s.name) >= 0;
        if (all_indexed) convention = NAMED_INDEX;
    }
    if (convention == NAMED_INDEX) {
        for (const TensorSpec &s : ms->inputs) {
            if (named_index(s.name) < 0) {
                if (!is->dict_input)
                    log_warning("input '" + s.name +
                                "' or previous input(s) are neither an input argument to the "
                                "model '" +
                                ms->name +
                                "' nor do they follow the <name>__<index> naming convention. "
                                "Falling back to enforcing strict ordering from model "
                                "configuration.");
                convention = CONFIG_ORDER;
                break;
            }
        }
    }
    if (!ms->states.empty() && convention != NAMED_INDEX && !is->dict_input)
        fail(NEREID_ERROR_INVALID_ARG, "PyTorch model '" + ms->name +
                                           "' is using sequence batching with state but not all "
                                           "inputs and outputs follow the <name>__<index> naming "
                                           "convention. ");

    for (size_t i = 0; i < ms->inputs.size(); i++) {
        const std::string &name = ms->inputs[i].name;
        size_t idx = i;
        if (!is->dict_input) {
            if (convention == FORWARD_ARGUMENT) {
                for (size_t a = 0; a < allowed.size(); a++)
                    if (allowed[a] == name) idx = a;
            } else if (convention == NAMED_INDEX) {
                idx = static_cast<size_t>(named_index(name));
            }
        }
        is->input_index[name] = idx;
    }
    for (size_t k = 0; k < ms->batch_inputs.size(); k++) {
        const std::string &name = ms->batch_inputs[k];
        size_t idx = ms->inputs.size() + k; /* CONFIG_ORDER: after the config's inputs */
        if (!is->dict_input) {
            if (convention == FORWARD_ARGUMENT) {
                for (size_t a = 0; a < allowed.size(); a++)
                    if (allowed[a] == name) idx = a;
            } else if (convention == NAMED_INDEX && named_index(name) >= 0) {
                idx = static_cast<size_t>(named_index(name));
            }
        }
        is->input_index[name] = idx;
    }
    for (const std::string &name : ms->controls)
        is->input_index[name] = required_named_index(name);
    for (const StateSpec &s : ms->states)
        is->input_index[s.input_name] = required_named_index(s.input_name);

    if (!is->dict_input) {
        for (const auto &kv : is->input_index)
            if (kv.second >= is->n_args)
                fail(NEREID_ERROR_INVALID_ARG,
                     "input '" + kv.first + "' of model '" + ms->name +
                         "' refers to forward() argument " + std::to_string(kv.second) +
                         " but the model has " + std::to_string(is->n_args) + " arguments");
        std::vector<bool> used(is->n_args, false);
        for (const auto &kv : is->input_index) {
            if (used[kv.second])
                fail(NEREID_ERROR_INVALID_ARG, "input '" + kv.first + "' of model '" + ms->name +
                                                   "' maps to forward() argument " +
                                                   std::to_string(kv.second) +
                                                   " which another input also uses");
            used[kv.second] = true;
        }
    }
}

void map_outputs(InstanceState *is)
{
    ModelState *ms = is->ms;
    bool named = true;
    for (const TensorSpec &s : ms->outputs) {
        if (named_index(s.name) < 0) {
            log_warning("output '" + s.name + "' or previous output(s) of the model '" + ms->name +
                        "' do not follow the <name>__<index> naming convention. Falling back to "
                        "enforcing strict ordering from model configuration.");
            named = false;
            break;
        }
    }
    if (!ms->states.empty() && !named)
        fail(NEREID_ERROR_INVALID_ARG, "PyTorch model '" + ms->name +
                                           "' is using sequence batching with state but not all "
                                           "inputs and outputs follow the <name>__<index> naming "
                                           "convention. ");
    for (size_t i = 0; i < ms->outputs.size(); i++) {
        OutputSlot o;
        o.name = ms->outputs[i].name;
        o.index = named ? static_cast<size_t>(named_index(o.name)) : i;
        o.datatype = ms->outputs[i].datatype;
        is->outputs.push_back(o);
    }
    for (const StateSpec &s : ms->states) {
        bool listed = false;
        for (const OutputSlot &o : is->outputs)
            listed = listed || o.name == s.output_name;
        if (listed) continue;
        OutputSlot o;
        o.name = s.output_name;
        o.index = required_named_index(s.output_name);
        o.datatype = s.datatype;
        is->outputs.push_back(o);
    }
}

void instance_init(nereid_instance_t *instance)
{
    nereid_model_t *model = nereid_instance_model(instance);
    auto *ms = static_cast<ModelState *>(nereid_model_state(model));
    if (ms == nullptr) fail(NEREID_ERROR_INTERNAL, "PyTorch model state missing");
    if (nereid_instance_kind(instance) == NEREID_INSTANCE_KIND_GPU)
        fail(NEREID_ERROR_INVALID_ARG,
             "instance group KIND_GPU is not supported for model '" + ms->name +
                 "': this PyTorch backend is built for CPU only; use KIND_CPU");

    char *raw_path = nereid_model_file_path(model, kDefaultFilename);
    if (raw_path == nullptr) fail(NEREID_ERROR_INTERNAL, "out of memory");
    std::string path(raw_path);
    free(raw_path);
    if (!file_exists(path))
        fail(NEREID_ERROR_UNAVAILABLE,
             "unable to find '" + path + "' for model instance '" + ms->name + "'");

    auto is = std::make_unique<InstanceState>();
    is->ms = ms;
    {
        torch::InferenceMode guard(ms->inference_mode);
        try {
            is->module = torch::jit::load(path, torch::kCPU);
        } catch (const c10::Error &e) {
            fail(NEREID_ERROR_INTERNAL,
                 "failed to load model '" + ms->name + "': " + e.what_without_backtrace());
        } catch (const std::exception &e) {
            fail(NEREID_ERROR_INTERNAL, "failed to load model '" + ms->name + "': " + e.what());
        }
    }
    map_inputs(is.get());
    map_outputs(is.get());
    nereid_instance_set_state(instance, is.release());
}

/* ---- Execute ---- */

int64_t element_count(const std::vector<int64_t> &shape)
{
    int64_t n = 1;
    for (int64_t d : shape)
        n *= d;
    return n;
}

c10::List<std::string> read_strings(const std::string &name, const int64_t *shape, size_t rank,
                                    const void *data, size_t byte_size)
{
    std::vector<int64_t> dims(shape, shape + rank);
    int64_t n = element_count(dims);
    const std::string bad = "incomplete or malformed string data for input '" + name + "'";
    c10::List<std::string> list;
    list.reserve(static_cast<size_t>(n));
    const char *p = static_cast<const char *>(data);
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t len; /* 4-byte little-endian length, as the protocol */
        if (byte_size - off < 4) fail(NEREID_ERROR_INVALID_ARG, bad);
        std::memcpy(&len, p + off, 4);
        off += 4;
        if (byte_size - off < len) fail(NEREID_ERROR_INVALID_ARG, bad);
        list.emplace_back(std::string(p + off, len));
        off += len;
    }
    if (off != byte_size) fail(NEREID_ERROR_INVALID_ARG, bad);
    return list;
}

std::vector<torch::jit::IValue> gather_inputs(InstanceState *is, nereid_batch_t *batch)
{
    ModelState *ms = is->ms;
    std::vector<torch::jit::IValue> args(is->n_args);
    std::vector<bool> set(is->n_args, false);
    c10::Dict<std::string, torch::Tensor> dict;
    size_t n_req = nereid_batch_input_count(batch), n = n_req + ms->batch_inputs.size();
    for (size_t i = 0; i < n; i++) {
        /* the requests' inputs, then the batch inputs the core computes */
        const char *name =
            i < n_req ? nereid_batch_input_name(batch, i) : ms->batch_inputs[i - n_req].c_str();
        auto it = is->input_index.find(name);
        if (it == is->input_index.end())
            fail(NEREID_ERROR_INVALID_ARG, std::string("unexpected inference input '") + name +
                                               "' for model '" + ms->name + "'");
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank;
        const void *data;
        size_t byte_size;
        if (nereid_error_t *err =
                nereid_batch_input(batch, name, &dt, &shape, &rank, &data, &byte_size)) {
            std::string msg = nereid_error_message(err);
            nereid_error_code_t code = nereid_error_code(err);
            nereid_error_free(err);
            fail(code, msg);
        }
        torch::jit::IValue value;
        if (dt == NEREID_TYPE_BYTES) {
            value = read_strings(name, shape, rank, data, byte_size);
        } else {
            c10::ScalarType t;
            if (!torch_type(dt, &t))
                fail(NEREID_ERROR_INVALID_ARG, std::string("unsupported datatype ") +
                                                   nereid_datatype_name(dt) + " for input '" +
                                                   name + "'");
            std::vector<int64_t> dims(shape, shape + rank);
            if (byte_size != static_cast<size_t>(element_count(dims)) * c10::elementSize(t))
                fail(NEREID_ERROR_INVALID_ARG, std::string("input byte size mismatch for input '") +
                                                   name + "' for model '" + ms->name + "'");
            auto options = torch::TensorOptions().dtype(t).device(torch::kCPU);
            torch::Tensor tensor = byte_size > 0
                                       ? torch::from_blob(const_cast<void *>(data), dims, options)
                                       : torch::zeros(dims, options);
            if (is->dict_input) {
                dict.insert(name, tensor);
                continue;
            }
            value = tensor;
        }
        if (is->dict_input)
            fail(NEREID_ERROR_INVALID_ARG, std::string("input '") + name +
                                               "' is a string but model '" + ms->name +
                                               "' takes Dict(str, Tensor)");
        args[it->second] = std::move(value);
        set[it->second] = true;
    }
    if (is->dict_input) return {torch::jit::IValue(dict)};
    for (size_t a = 0; a < is->n_args; a++) {
        if (set[a]) continue;
        for (const auto &kv : is->input_index)
            if (kv.second == a)
                fail(NEREID_ERROR_INVALID_ARG, "input '" + kv.first + "' for model '" + ms->name +
                                                   "' is missing from the batch");
        fail(NEREID_ERROR_INVALID_ARG, "forward() argument " + std::to_string(a) + " of model '" +
                                           ms->name + "' has no input");
    }
    return args;
}

std::vector<torch::jit::IValue> flatten_outputs(const torch::jit::IValue &result)
{
    std::vector<torch::jit::IValue> outs;
    auto check_list = [](const torch::jit::IValue &v, const std::string &where) {
        c10::List<c10::IValue> list = v.toList();
        if (list.elementType()->kind() != c10::TypeKind::StringType)
            throw std::invalid_argument(where +
                                        " must be of type Tensor or List[str], received "
                                        "List[" +
                                        list.elementType()->str() + "]");
    };
    if (result.isTuple()) {
        size_t i = 0;
        for (const torch::jit::IValue &e : result.toTupleRef().elements()) {
            if (e.isList())
                check_list(e, "output at index " + std::to_string(i));
            else if (!e.isTensor())
                throw std::invalid_argument("output at index " + std::to_string(i) +
                                            " must be of type Tensor or List[str]");
            outs.push_back(e);
            i++;
        }
    } else if (result.isTensor()) {
        outs.push_back(result);
    } else if (result.isList()) {
        check_list(result, "output");
        outs.push_back(result);
    } else {
        throw std::invalid_argument("output must be of type Tensor, List[str] or Tuple containing "
                                    "one of these two types. It should not be a List / Dictionary "
                                    "of Tensors or a Scalar");
    }
    return outs;
}

void *output_buffer(nereid_batch_t *batch, const std::string &name, nereid_datatype_t dt,
                    const std::vector<int64_t> &shape, size_t byte_size)
{
    void *buf = nullptr;
    if (nereid_error_t *err = nereid_batch_output(batch, name.c_str(), dt, shape.data(),
                                                  shape.size(), byte_size, &buf)) {
        std::string msg = nereid_error_message(err);
        nereid_error_code_t code = nereid_error_code(err);
        nereid_error_free(err);
        fail(code, msg);
    }
    return buf;
}

void write_outputs(InstanceState *is, nereid_batch_t *batch,
                   const std::vector<torch::jit::IValue> &outs)
{
    ModelState *ms = is->ms;
    bool batching = ms->max_batch_size > 0;
    for (const OutputSlot &o : is->outputs) {
        if (o.index >= outs.size())
            fail(NEREID_ERROR_INVALID_ARG,
                 "The output " + o.name +
                     " in the model configuration refers to an output index which doesn't "
                     "exist. This model has " +
                     std::to_string(outs.size()) + " outputs");
    }
    for (const OutputSlot &o : is->outputs) {
        if (!nereid_batch_output_requested(batch, o.name.c_str())) continue;
        const torch::jit::IValue &v = outs[o.index];
        if (v.isTensor()) {
            torch::Tensor t = v.toTensor().contiguous();
            nereid_datatype_t dt = from_torch_type(t.scalar_type());
            if (dt != o.datatype)
                fail(NEREID_ERROR_INVALID_ARG, "configuration expects datatype " +
                                                   type_string(o.datatype) + " for output '" +
                                                   o.name + "', model provides " + type_string(dt));
            if (t.dim() == 0)
                fail(NEREID_ERROR_INVALID_ARG,
                     "output '" + o.name + "' is a scalar which is not supported.");
            std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
            size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
            void *buf = output_buffer(batch, o.name, dt, shape, bytes);
            if (bytes > 0) std::memcpy(buf, t.data_ptr(), bytes);
        } else {
            c10::List<c10::IValue> list = v.toList();
            if (o.datatype != NEREID_TYPE_BYTES)
                fail(NEREID_ERROR_INVALID_ARG, "configuration expects datatype " +
                                                   type_string(o.datatype) + " for output '" +
                                                   o.name + "', model provides List[str]");
            int64_t count = static_cast<int64_t>(list.size());
            if (batching && count != nereid_batch_size(batch))
                fail(NEREID_ERROR_INVALID_ARG, "output '" + o.name + "' has " +
                                                   std::to_string(count) +
                                                   " strings but the batch size is " +
                                                   std::to_string(nereid_batch_size(batch)));
            size_t bytes = 0;
            for (size_t i = 0; i < list.size(); i++)
                bytes += 4 + list.get(i).toStringRef().size();
            std::vector<int64_t> shape{count};
            char *buf =
                static_cast<char *>(output_buffer(batch, o.name, NEREID_TYPE_BYTES, shape, bytes));
            size_t off = 0;
            for (size_t i = 0; i < list.size(); i++) {
                const std::string &s = list.get(i).toStringRef();
                uint32_t len = static_cast<uint32_t>(s.size());
                std::memcpy(buf + off, &len, 4);
                std::memcpy(buf + off + 4, s.data(), s.size());
                off += 4 + s.size();
            }
        }
    }
}

void execute(nereid_instance_t *instance, nereid_batch_t *batch)
{
    auto *is = static_cast<InstanceState *>(nereid_instance_state(instance));
    if (is == nullptr) fail(NEREID_ERROR_INTERNAL, "PyTorch instance state missing");
    ModelState *ms = is->ms;
    int64_t total = nereid_batch_size(batch);
    if (ms->max_batch_size > 0 && total > ms->max_batch_size)
        fail(NEREID_ERROR_INTERNAL, "batch size " + std::to_string(total) + " for '" + ms->name +
                                        "', max allowed is " + std::to_string(ms->max_batch_size));

    torch::InferenceMode infer_guard(ms->inference_mode);
    torch::NoGradGuard no_grad;
    std::vector<torch::jit::IValue> args = gather_inputs(is, batch);
    uint64_t input_end_ns = nereid_now_ns();

    std::vector<torch::jit::IValue> outs;
    try {
        torch::jit::GraphOptimizerEnabledGuard optimize(ms->optimized_execution);
        if (ms->jit_profiling.set) torch::jit::getProfilingMode() = ms->jit_profiling.value;
        if (ms->jit_executor.set) torch::jit::getExecutorMode() = ms->jit_executor.value;
        if (ms->tensor_fuser.set) torch::jit::setTensorExprFuserEnabled(ms->tensor_fuser.value);
        outs = flatten_outputs(is->module.forward(args));
    } catch (const c10::Error &e) {
        fail(NEREID_ERROR_INTERNAL,
             std::string("PyTorch execute failure: ") + e.what_without_backtrace());
    } catch (const std::exception &e) {
        fail(NEREID_ERROR_INTERNAL, std::string("PyTorch execute failure: ") + e.what());
    }
    uint64_t infer_end_ns = nereid_now_ns();
    write_outputs(is, batch, outs);
    nereid_batch_report_compute(batch, input_end_ns, infer_end_ns);
}

/* ---- Raw access for benchmarks ---- */

struct RawModel {
    torch::jit::Module module;
};

} // namespace

extern "C" {

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    return boundary("", [&] { model_init(model); });
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    return boundary("", [&] {
        delete static_cast<ModelState *>(nereid_model_state(model));
        nereid_model_set_state(model, nullptr);
    });
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    return boundary("", [&] { instance_init(instance); });
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    return boundary("", [&] {
        delete static_cast<InstanceState *>(nereid_instance_state(instance));
        nereid_instance_set_state(instance, nullptr);
    });
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    return boundary("PyTorch execute failure: ", [&] { execute(instance, batch); });
}

/* Benchmark helpers: the raw TorchScript call without the server, so
 * bench/bench_pytorch.c can compare both in one run. Not part of the ABI.
 * Loads path; NULL on failure with the reason in err. */
NEREID_EXPORT void *nereid_pytorch_raw_load(const char *path, char *err, size_t err_size)
{
    try {
        auto *m = new RawModel;
        try {
            m->module = torch::jit::load(path, torch::kCPU);
        } catch (...) {
            delete m;
            throw;
        }
        return m;
    } catch (const std::exception &e) {
        std::snprintf(err, err_size, "%s", e.what());
    } catch (...) {
        std::snprintf(err, err_size, "unknown C++ exception");
    }
    return nullptr;
}

/* forward() on n_inputs FP32 tensors of shape[rank] under InferenceMode;
 * copies each FP32 tensor of the (tuple) result, up to n_outputs, into
 * outputs[i] (each holds the input's element count). 0 on success. */
NEREID_EXPORT int nereid_pytorch_raw_forward(void *raw, const float *const *inputs, size_t n_inputs,
                                             const int64_t *shape, size_t rank,
                                             float *const *outputs, size_t n_outputs)
{
    try {
        auto *m = static_cast<RawModel *>(raw);
        torch::InferenceMode guard;
        std::vector<int64_t> dims(shape, shape + rank);
        std::vector<torch::jit::IValue> args;
        args.reserve(n_inputs);
        for (size_t i = 0; i < n_inputs; i++)
            args.emplace_back(
                torch::from_blob(const_cast<float *>(inputs[i]), dims, torch::kFloat));
        std::vector<torch::jit::IValue> outs = flatten_outputs(m->module.forward(args));
        for (size_t i = 0; i < n_outputs && i < outs.size(); i++) {
            torch::Tensor t = outs[i].toTensor().contiguous();
            std::memcpy(outputs[i], t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float));
        }
        return 0;
    } catch (...) {
        return -1;
    }
}

NEREID_EXPORT void nereid_pytorch_raw_free(void *raw)
{
    delete static_cast<RawModel *>(raw);
}

} // extern "C"
