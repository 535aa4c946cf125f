// The little JSON megazero's data tools need, and no more: GPT-2's encoder.json
// (one flat object of string -> integer) and JSON-lines corpora where only the
// "text" string of each object matters. Strings are decoded in full (every
// escape, \uXXXX surrogate pairs to UTF-8); other values are skipped, not built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace megazero::data {

// Parse errors are std::runtime_error with a byte offset; callers wrap them in a
// ConfigError that names the file or line.
std::unordered_map<std::string, std::int64_t> parse_json_string_int_map(std::string_view json);

// The string value of `key` in the top-level object `json`; false if the key is
// absent. Throws if the object is malformed or the value is not a string.
bool json_object_string_field(std::string_view json, std::string_view key, std::string& out);

// Appends the UTF-8 encoding of code point cp to out.
void append_utf8(std::string& out, char32_t cp);

}  // namespace megazero::data
