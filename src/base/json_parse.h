#pragma once
// Bounded JSON parsing for untrusted input.
//
// nlohmann::json parses iteratively, but copying, comparing, dumping and walking a document are
// recursive: a body nested 55,000 levels deep parses fine and then overflows the stack in the
// first copy. ParseJsonBounded refuses such input *while parsing* (the SAX walk stops at the first
// level past the limit, before any DOM node below it exists), so every document that leaves here
// can be walked recursively by any code in Kiln.
//
//   auto doc = ParseJsonBounded(body, {.max_depth = 64});
//   if (!doc.ok()) return SerializationError(doc.status().message());
//
// Thread-safe (no shared state).

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln {

struct JsonLimits {
  // Deepest nesting of objects/arrays accepted (the top-level value is depth 1). The deepest
  // request shape in the SageMaker model (recursive SearchExpression aside) nests about 12
  // levels; 64 leaves room while keeping recursive walks a few KB of stack.
  size_t max_depth = 64;
  // Largest text accepted, in bytes. 0: no limit beyond what the caller already read.
  size_t max_bytes = 0;
  // Most values (objects, arrays, strings, numbers, booleans, nulls) in one document. A DOM node
  // costs 50-100 bytes whatever its text, so `[[],[],...]` grows ~20x in memory: this bounds the
  // DOM independently of the text. 0: no limit.
  size_t max_values = 0;
};

// Parses `text` as one JSON value (a document with anything but whitespace after it is malformed).
// Errors: InvalidArgument("JSON nested deeper than N levels") when the limit is passed,
// ResourceExhausted when `text` is larger than max_bytes or holds more than max_values values, InvalidArgument with the
// parser's position and ErrorReason::kMalformed for malformed text. Never throws.
Result<nlohmann::json> ParseJsonBounded(std::string_view text, const JsonLimits& limits = {});

// The same for nlohmann::ordered_json (documents whose member order matters).
Result<nlohmann::ordered_json> ParseOrderedJsonBounded(std::string_view text, const JsonLimits& limits = {});

// `value` without its null object members, at every depth (array elements are kept, nulls too).
// AWS JSON protocols treat a null member as an absent one; a request stored this way can be read
// with value()/contains() without a null ever reaching get<>. Recursive: for documents that left
// ParseJsonBounded (bounded depth).
nlohmann::json WithoutNulls(const nlohmann::json& value);

}  // namespace kiln
