/*
 * Unit tests of the text-format parser and the JSON codec details:
 * escapes, lists, repeated entries, maps, <>, oneofs, comments, number
 * forms and ranges, error positions, JSON forms (field order checked
 * against proto/model_config.proto, 64-bit fields, lowerCamel input).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config/config.h"
#include "config/config_internal.h"

static model_config_t *parse(const char *text)
{
    char *err = NULL;
    model_config_t *cfg = config_parse_text(text, strlen(text), "t.pbtxt", &err);
    if (!cfg) fprintf(stderr, "unexpected parse error: %s", err ? err : "?");
    free(err);
    return cfg;
}

/* Returns the (first line of the) error for text, or "" if it parsed. */
static char g_err[512];
static const char *parse_error(const char *text)
{
    char *err = NULL;
    model_config_t *cfg = config_parse_text(text, strlen(text), "t.pbtxt", &err);
    g_err[0] = '\0';
    if (cfg) {
        config_free(cfg);
        return g_err;
    }
    snprintf(g_err, sizeof g_err, "%s", err ? err : "");
    char *nl = strchr(g_err, '\n');
    if (nl) *nl = '\0';
    free(err);
    return g_err;
}

static void test_strings(void)
{
    model_config_t *cfg =
        parse("name: \"a\\tb\\n\\\\\\\"\\'\\x41\\101\\u00e9\\U0001F600\" 'c' \"d\"");
    CHECK(cfg);
    if (cfg)
        CHECK_STR(cfg->name, "a\tb\n\\\"'AA\xc3\xa9\xf0\x9f\x98\x80"
                             "cd");
    config_free(cfg);
    cfg = parse("name: 'single \"quoted\"'");
    if (cfg) CHECK_STR(cfg->name, "single \"quoted\"");
    config_free(cfg);
    CHECK_STR(parse_error("name: \"\\z\""), "t.pbtxt:1:8: invalid escape sequence '\\z'");
    CHECK_STR(parse_error("name: \"abc"), "t.pbtxt:1:7: unterminated string literal");
    CHECK_STR(parse_error("name: \"a\\0b\""),
              "t.pbtxt:1:7: String field \"name\" contains a NUL character");
    CHECK_STR(parse_error("name: \"\\uD800\""),
              "t.pbtxt:1:8: invalid unicode code point in escape sequence");
}

static void test_lists_and_repeats(void)
{
    model_config_t *cfg = parse("input [ { name: \"a\" dims: [1, 2, -1] }, { name: \"b\" dims: 3 "
                                "dims: 4 } ]\ninput { name: \"c\" dims: [] }\n"
                                "input < name: \"d\" >");
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->n_input == 4);
        CHECK(cfg->input[0]->n_dims == 3 && cfg->input[0]->dims[2] == -1);
        CHECK(cfg->input[1]->n_dims == 2 && cfg->input[1]->dims[1] == 4);
        CHECK(cfg->input[2]->n_dims == 0);
        CHECK_STR(cfg->input[3]->name, "d");
    }
    config_free(cfg);
    /* separators, comments, optional colon before messages */
    cfg = parse("# header\nname: \"x\"; max_batch_size: 2, # trailing\n"
                "optimization: { graph: { level: -1 } }");
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->max_batch_size == 2);
        CHECK(cfg->optimization && cfg->optimization->graph &&
              cfg->optimization->graph->level == -1);
    }
    config_free(cfg);
    CHECK_STR(parse_error("input [ { name: \"a\" } { name: \"b\" } ]"),
              "t.pbtxt:1:23: Expected \",\" or \"]\", got: {");
    CHECK_STR(parse_error("max_batch_size: [1]"),
              "t.pbtxt:1:17: Field \"max_batch_size\" is not repeated and cannot take a list "
              "value [...]");
}

static void test_maps_and_oneofs(void)
{
    model_config_t *cfg =
        parse("parameters { key: \"k1\" value { string_value: \"v1\" } }\n"
              "parameters [ { key: \"k2\" value: < string_value: \"v2\" > } ]\n"
              "metric_tags { value: \"only value\" }\n"
              "dynamic_batching { priority_queue_policy { key: 18446744073709551615 } }\n"
              "version_policy { specific { versions: 0x10 versions: 010 } }");
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->n_parameters == 2);
        CHECK_STR(cfg->parameters[1]->key, "k2");
        CHECK_STR(cfg->parameters[1]->value->string_value, "v2");
        CHECK_STR(cfg->metric_tags[0]->key, "");
        CHECK(cfg->scheduling_choice_case ==
              INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING);
        CHECK(cfg->dynamic_batching->priority_queue_policy[0]->key == UINT64_MAX);
        CHECK(cfg->dynamic_batching->priority_queue_policy[0]->value == NULL);
        CHECK(cfg->version_policy->specific->versions[0] == 16);
        CHECK(cfg->version_policy->specific->versions[1] == 8);
    }
    char *json = cfg ? config_to_json(cfg) : NULL;
    CHECK(json && strstr(json, "\"priority_queue_policy\":{\"18446744073709551615\":{"));
    CHECK(json && strstr(json, "\"parameters\":{\"k1\":{\"string_value\":\"v1\"}"));
    free(json);
    config_free(cfg);
    CHECK_STR(parse_error("version_policy { latest {} all {} }"),
              "t.pbtxt:1:28: Field \"all\" is specified along with field \"latest\", another "
              "member of the same oneof.");
}

static void test_numbers(void)
{
    model_config_t *cfg =
        parse("max_batch_size: -0x7fffffff\n"
              "sequence_batching { direct { minimum_slot_utilization: .5f } "
              "control_input [ { control [ { fp32_false_true: [ -inf, nan ] int32_false_true: "
              "[-2147483648, 2147483647] bool_false_true: [ t, f, 1, 0, True, False ] } ] } ] "
              "max_sequence_idle_microseconds: 18446744073709551615 }\n"
              "instance_group [ { kind: 2 secondary_devices [ { device_id: "
              "-9223372036854775808 } ] } ]");
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->max_batch_size == -0x7fffffff);
        Inference__ModelSequenceBatching *sb = cfg->sequence_batching;
        CHECK(sb->direct->minimum_slot_utilization == 0.5f);
        const Inference__ModelSequenceBatching__Control *c = sb->control_input[0]->control[0];
        CHECK(isinf(c->fp32_false_true[0]) && c->fp32_false_true[0] < 0);
        CHECK(isnan(c->fp32_false_true[1]));
        CHECK(c->int32_false_true[0] == INT32_MIN && c->int32_false_true[1] == INT32_MAX);
        CHECK(c->n_bool_false_true == 6 && c->bool_false_true[0] && !c->bool_false_true[1] &&
              c->bool_false_true[4] && !c->bool_false_true[5]);
        CHECK(sb->max_sequence_idle_microseconds == UINT64_MAX);
        CHECK(cfg->instance_group[0]->kind == INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU);
        CHECK(cfg->instance_group[0]->secondary_devices[0]->device_id == INT64_MIN);
    }
    char *json = cfg ? config_to_json(cfg) : NULL;
    CHECK(json && strstr(json, "\"fp32_false_true\":[\"-Infinity\",\"NaN\"]"));
    CHECK(json && strstr(json, "\"max_sequence_idle_microseconds\":18446744073709551615"));
    CHECK(json && strstr(json, "\"device_id\":-9223372036854775808"));
    CHECK(json && strstr(json, "\"minimum_slot_utilization\":0.5"));
    free(json);
    config_free(cfg);
    CHECK_STR(parse_error("max_batch_size: 2147483648"),
              "t.pbtxt:1:17: Integer out of range (2147483648) for int32 field \"max_batch_size\"");
    CHECK_STR(parse_error("optimization { gather_kernel_buffer_threshold: 4294967296 }"),
              "t.pbtxt:1:48: Integer out of range (4294967296) for uint32 field "
              "\"gather_kernel_buffer_threshold\"");
    CHECK_STR(parse_error("dynamic_batching { priority_levels: 18446744073709551616 }"),
              "t.pbtxt:1:37: Integer out of range (18446744073709551616) for uint64 field "
              "\"priority_levels\"");
    CHECK_STR(parse_error("max_batch_size: 08"), "t.pbtxt:1:17: Expected integer, got: 08");
    CHECK_STR(parse_error("max_batch_size: true"), "t.pbtxt:1:17: Expected integer, got: true");
    CHECK_STR(parse_error("input [ { data_type: 99999999999 } ]"),
              "t.pbtxt:1:22: Expected integer, got: 99999999999");
    CHECK_STR(parse_error("sequence_batching { direct { minimum_slot_utilization: abc } }"),
              "t.pbtxt:1:56: Expected double, got: abc");
}

static void test_errors_and_positions(void)
{
    CHECK_STR(parse_error("name: \"a\"\n  bogus: 1"),
              "t.pbtxt:2:3: Message type \"inference.ModelConfig\" has no field named \"bogus\"");
    CHECK_STR(parse_error("input [ { nam: \"x\" } ]"),
              "t.pbtxt:1:11: Message type \"inference.ModelInput\" has no field named \"nam\" "
              "(did you mean \"name\"?)");
    CHECK_STR(parse_error("name \"x\""), "t.pbtxt:1:6: Expected \":\" after field \"name\"");
    CHECK_STR(parse_error("name: x"), "t.pbtxt:1:7: Expected string, got: x");
    CHECK_STR(parse_error("optimization: 3"), "t.pbtxt:1:15: Expected \"{\", got: 3");
    CHECK_STR(parse_error("optimization { "), "t.pbtxt:1:16: Expected \"}\", got: end of file");
    CHECK_STR(parse_error("optimization < priority: PRIORITY_MAX }"),
              "t.pbtxt:1:39: Expected identifier, got: }");
    CHECK_STR(parse_error("}"), "t.pbtxt:1:1: Expected identifier, got: }");
    CHECK_STR(parse_error("name: \"a\" name: \"b\""),
              "t.pbtxt:1:11: Non-repeated field \"name\" is specified multiple times.");
    CHECK_STR(parse_error("input [ { data_type: TYPE_FP33 } ]"),
              "t.pbtxt:1:22: Unknown enumeration value of \"TYPE_FP33\" for field \"data_type\".");
    CHECK_STR(parse_error(""), "");
    CHECK_STR(parse_error("   # only a comment"), "");

    /* positions recorded for validation errors */
    const char *text = "name: \"m\"\nbackend: \"identity\"\ninput [\n  { name: \"a\" "
                       "data_type: TYPE_FP32 dims: [ 4, 0 ] }\n]\n";
    char *err = NULL;
    model_config_t *cfg = config_parse_text(text, strlen(text), "m/config.pbtxt", &err);
    CHECK(cfg);
    config_options_t opts = {.allow_missing_io = true};
    CHECK(cfg && config_normalize(cfg, "m", "m/config.pbtxt", &opts, &err) == -1);
    CHECK_STR(err, "m/config.pbtxt:4:47: model input 'a' dimension must be integer >= 1, or -1 "
                   "to indicate a variable-size dimension for m\n");
    free(err);
    /* a copy has no positions */
    err = NULL;
    model_config_t *copy = cfg ? config_copy(cfg) : NULL;
    CHECK(copy && config_normalize(copy, "m", "m/config.pbtxt", &opts, &err) == -1);
    CHECK_STR(err, "m/config.pbtxt: model input 'a' dimension must be integer >= 1, or -1 to "
                   "indicate a variable-size dimension for m\n");
    free(err);
    config_free(copy);
    config_free(cfg);
}

static void test_missing_io_option(void)
{
    model_config_t *cfg = parse("name: \"m\" backend: \"identity\"");
    char *err = NULL;
    config_options_t strict = {.allow_missing_io = false};
    CHECK(cfg && config_normalize(cfg, "m", "cfg", &strict, &err) == -1);
    CHECK(err && strstr(err, "must specify at least one 'input'"));
    free(err);
    config_free(cfg);
    cfg = parse("name: \"m\" backend: \"identity\" instance_group [ { kind: KIND_AUTO } ]");
    config_options_t gpus = {.gpus_available = true, .allow_missing_io = true};
    err = NULL;
    CHECK(cfg && config_normalize(cfg, "m", "cfg", &gpus, &err) == 0);
    CHECK(cfg && cfg->instance_group[0]->kind == INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_GPU);
    free(err);
    config_free(cfg);
}

unsigned cfg_json_field_order(const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor **order);

/* Collects the field names of message `short_name` declared in the .proto
 * (one declaration per line, as proto/model_config.proto is written), in
 * declaration order, from the block starting at *pos. Returns the count or
 * -1 when no further block with that name exists. */
static int proto_fields(const char **pos, const char *short_name, char names[][64], int max)
{
    char head[128];
    snprintf(head, sizeof head, "message %s {", short_name);
    const char *p = strstr(*pos, head);
    if (!p) return -1;
    *pos = p + strlen(head);
    const char *q = strchr(p, '\n');
    if (q && memchr(p, '}', (size_t)(q - p))) return 0; /* message X {} */
    char stack[32];                                     /* 'o' oneof, 's' nested message/enum */
    int depth = 0, n = 0;
    while (q && *q) {
        q++;
        const char *eol = strchr(q, '\n');
        size_t len = eol ? (size_t)(eol - q) : strlen(q);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)(len < 255 ? len : 255), q);
        bool opens = strchr(line, '{') && !strchr(line, '}');
        bool closes = strchr(line, '}') && !strchr(line, '{');
        if (opens) {
            if (depth < 32) stack[depth] = strstr(line, "oneof ") ? 'o' : 's';
            depth++;
        } else if (closes) {
            if (depth == 0) break;
            depth--;
        } else if (strstr(line, " = ") && strchr(line, ';') && !strchr(line, '{')) {
            bool direct = true;
            for (int i = 0; i < depth && i < 32; i++)
                direct &= stack[i] == 'o';
            const char *eq = strstr(line, " = ");
            const char *nb = eq;
            while (nb > line && nb[-1] != ' ')
                nb--;
            bool is_field = strchr(line, ' ') < eq; /* "type name = N;" */
            if (direct && is_field && n < max) snprintf(names[n++], 64, "%.*s", (int)(eq - nb), nb);
        }
        q = eol;
    }
    return n;
}

static void check_message_order(const ProtobufCMessageDescriptor *d, const char *proto)
{
    const ProtobufCFieldDescriptor *order[64];
    unsigned n = cfg_json_field_order(d, order);
    CHECK(n == d->n_fields);
    const char *pos = proto;
    char names[64][64];
    int k;
    while ((k = proto_fields(&pos, d->short_name, names, 64)) >= 0) {
        if ((unsigned)k != n) continue; /* another message with the same short name */
        bool ok = true;
        for (unsigned i = 0; i < n; i++)
            ok &= strcmp(names[i], order[i]->name) == 0;
        if (!ok) continue;
        return;
    }
    fprintf(stderr, "JSON field order of %s does not match the .proto\n", d->name);
    check_failed++;
}

static void check_all_messages(const ProtobufCMessageDescriptor *d, const char *proto,
                               const ProtobufCMessageDescriptor **seen, size_t *n_seen)
{
    for (size_t i = 0; i < *n_seen; i++)
        if (seen[i] == d) return;
    if (*n_seen < 128) seen[(*n_seen)++] = d;
    if (!cfg_is_map_entry(d)) check_message_order(d, proto);
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE)
            check_all_messages(d->fields[i].descriptor, proto, seen, n_seen);
}

static void test_json_field_order(void)
{
    FILE *fp = fopen("proto/model_config.proto", "rb");
    CHECK(fp);
    if (!fp) return;
    static char proto[65536];
    size_t n = fread(proto, 1, sizeof proto - 1, fp);
    proto[n] = '\0';
    fclose(fp);
    const ProtobufCMessageDescriptor *seen[128];
    size_t n_seen = 0;
    check_all_messages(&inference__model_config__descriptor, proto, seen, &n_seen);
    CHECK(n_seen > 30);
}

static void test_json_input(void)
{
    const char *j = "{\"name\":\"m\",\"maxBatchSize\":4,\"input\":[{\"name\":\"a\",\"dataType\":"
                    "\"type_fp32\",\"dims\":[\"1\",-1]}],\"dynamicBatching\":{"
                    "\"maxQueueDelayMicroseconds\":\"100\",\"priorityQueuePolicy\":{\"2\":{"
                    "\"timeoutAction\":1}}},\"parameters\":{\"p\":{\"string_value\":\"v\"}},"
                    "\"version_policy\":null}";
    char *err = NULL;
    model_config_t *cfg = config_from_json(j, strlen(j), &err);
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->max_batch_size == 4);
        CHECK(cfg->input[0]->data_type == INFERENCE__DATA_TYPE__TYPE_FP32);
        CHECK(cfg->input[0]->dims[0] == 1 && cfg->input[0]->dims[1] == -1);
        CHECK(cfg->dynamic_batching->max_queue_delay_microseconds == 100);
        CHECK(cfg->dynamic_batching->priority_queue_policy[0]->key == 2);
        CHECK(cfg->dynamic_batching->priority_queue_policy[0]->value->timeout_action == 1);
        CHECK_STR(cfg->parameters[0]->value->string_value, "v");
        CHECK(cfg->version_policy == NULL);
    }
    config_free(cfg);
    free(err);
    err = NULL;
    CHECK(!config_from_json("{\"nope\":1}", 10, &err));
    CHECK(err && strstr(err, "has no field named \"nope\""));
    free(err);
    err = NULL;
    CHECK(!config_from_json("{\"max_batch_size\":\"x\"}", 22, &err));
    free(err);
    err = NULL;
    CHECK(!config_from_json("{\"max_batch_size\":3000000000}", 29, &err));
    free(err);
    err = NULL;
    CHECK(!config_from_json("[1", 2, &err));
    CHECK(err && strncmp(err, "<json>:", 7) == 0);
    free(err);
    /* bare keys, as protobuf's JSON parser (Triton's) accepts; strings untouched */
    const char *bare = "{\"max_batch_size\": 2, sequence_batching : { iterative_sequence: true, "
                       "direct: {max_queue_delay_microseconds: 5}}, "
                       "\"parameters\": {\"k\": {string_value: \"a, b: {c\"}}}";
    err = NULL;
    cfg = config_from_json(bare, strlen(bare), &err);
    CHECK(cfg && cfg->sequence_batching && cfg->sequence_batching->iterative_sequence);
    CHECK(cfg && cfg->sequence_batching->direct->max_queue_delay_microseconds == 5);
    if (cfg) CHECK_STR(cfg->parameters[0]->value->string_value, "a, b: {c");
    config_free(cfg);
    free(err);
    err = NULL;
    CHECK(!config_from_json("{nope: 1}", 9, &err));
    CHECK(err && strstr(err, "has no field named \"nope\""));
    free(err);
    /* an all-default config prints as an empty body, like Triton */
    cfg = config_from_json("{}", 2, NULL);
    char *json = cfg ? config_to_json(cfg) : NULL;
    CHECK_STR(json, "");
    free(json);
    config_free(cfg);
}

/* Triton's parser (protobuf's JsonStringToMessage) takes a single value for
 * a repeated field as a list of one: L0_lifecycle's instance-load test
 * loads with "instance_group": {"kind": "KIND_CPU", "count": 3}. */
static void test_json_single_value_for_repeated(void)
{
    const char *j = "{\"instance_group\":{\"kind\":\"KIND_CPU\",\"count\":3},"
                    "\"input\":{\"name\":\"a\",\"data_type\":\"TYPE_FP32\",\"dims\":4}}";
    char *err = NULL;
    model_config_t *cfg = config_from_json(j, strlen(j), &err);
    CHECK(cfg);
    if (cfg) {
        CHECK(cfg->n_instance_group == 1 && cfg->instance_group[0]->count == 3);
        CHECK(cfg->n_input == 1 && cfg->input[0]->n_dims == 1 && cfg->input[0]->dims[0] == 4);
    }
    config_free(cfg);
    free(err);
}

int main(void)
{
    test_json_single_value_for_repeated();
    test_strings();
    test_lists_and_repeats();
    test_maps_and_oneofs();
    test_numbers();
    test_errors_and_positions();
    test_missing_io_option();
    test_json_field_order();
    test_json_input();
    return check_summary();
}
