/*
 * This file contains header forwarding (see header_forward.h): a C wrapper
 * over RE2, the regex engine Triton matches header names with, so patterns
 * mean exactly what they mean there; and the forwarding of one header into
 * a request's parameters with Triton's reserved-name rule.
 */
#include "frontend/header_forward.h"

#include <re2/re2.h>

#include <cstdlib>
#include <cstring>
#include <string>

struct header_forward {
    re2::RE2 regex;
    explicit header_forward(const std::string &p) : regex(p, re2::RE2::Quiet) {}
};

extern "C" header_forward_t *header_forward_new(const char *pattern, char **error)
{
    *error = nullptr;
    auto *hf = new (std::nothrow) header_forward(std::string("(?i)") + pattern);
    if (!hf) {
        *error = strdup("out of memory");
        return nullptr;
    }
    if (!hf->regex.ok()) {
        *error = strdup(hf->regex.error().c_str());
        delete hf;
        return nullptr;
    }
    return hf;
}

extern "C" bool header_forward_match(const header_forward_t *hf, const char *name, size_t len)
{
    return re2::RE2::PartialMatch(re2::StringPiece(name, len), hf->regex);
}

static const char *const kReserved[] = {"sequence_id",       "sequence_start", "sequence_end",
                                        "priority",          "timeout",        "headers",
                                        "binary_data_output"};

extern "C" nereid_error_t *header_forward_apply(nereid_request_t *req, const char *name,
                                                size_t name_len, const char *value,
                                                size_t value_len)
{
    std::string key(name, name_len);
    bool reserved = key.rfind("triton_", 0) == 0;
    for (const char *r : kReserved)
        reserved = reserved || key == r;
    if (reserved)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Header '%s' is reserved for Triton usage and cannot be forwarded.",
                                key.c_str());
    return nereid_request_set_parameter_string(req, key.c_str(),
                                               std::string(value, value_len).c_str());
}

extern "C" void header_forward_free(header_forward_t *hf)
{
    delete hf;
}
