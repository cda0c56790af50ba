#include "api/service_model.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "base/encoding.h"
#include "base/log.h"
#include "base/regex.h"
#include "base/time.h"

namespace kiln::api {

using nlohmann::json;

enum class ShapeType {
  kStructure,
  kList,
  kMap,
  kString,
  kInteger,
  kLong,
  kFloat,
  kDouble,
  kBoolean,
  kTimestamp,
  kBlob
};

struct ServiceModel::Shape {
  struct Member {
    std::string name;       // as sent on the wire ("TrainingJobName")
    std::string path_name;  // as AWS reports it ("trainingJobName")
    const Shape* shape = nullptr;
    bool required = false;
  };

  std::string name;
  ShapeType type = ShapeType::kString;
  bool is_union = false;
  // Length (strings, blobs, lists, maps) or value (numbers) bounds, as in the model.
  std::optional<json> min;
  std::optional<json> max;
  std::string pattern;
  std::vector<std::string> enum_values;
  std::unordered_set<std::string> enum_set;
  std::string enum_text;  // "[a, b, c]"
  std::vector<Member> members;
  const Shape* member = nullptr;  // list
  const Shape* key = nullptr;     // map
  const Shape* value = nullptr;   // map
  // Every constraint of this shape in AWS's words, for "Member must satisfy constraint: [...]".
  std::string constraint_list;

  // The pattern compiles on first use; a pattern PCRE2 rejects is skipped (regex stays empty).
  mutable std::once_flag regex_once;
  mutable std::optional<Regex> regex;

  bool IsScalar() const { return type != ShapeType::kStructure && type != ShapeType::kList && type != ShapeType::kMap; }
  bool IsNumber() const {
    return type == ShapeType::kInteger || type == ShapeType::kLong || type == ShapeType::kFloat ||
           type == ShapeType::kDouble;
  }
  const Regex* GetRegex() const;
};

namespace {

std::string LowerFirst(std::string_view name) {
  std::string out(name);
  if (!out.empty() && out[0] >= 'A' && out[0] <= 'Z') {
    out[0] = static_cast<char>(out[0] - 'A' + 'a');
  }
  return out;
}

// Java's POSIX classes (\p{Alnum} ...) are ASCII-only; PCRE2 has no \p{..} names for them.
const char* JavaPosixClass(std::string_view name) {
  static const std::pair<std::string_view, const char*> kClasses[] = {
      {"Lower", "a-z"},
      {"Upper", "A-Z"},
      {"ASCII", "\\x00-\\x7F"},
      {"Alpha", "a-zA-Z"},
      {"Digit", "0-9"},
      {"Alnum", "a-zA-Z0-9"},
      {"Punct", "!-/:-@\\[-`{-~"},
      {"Graph", "!-~"},
      {"Print", "\\x20-\\x7E"},
      {"Blank", " \\t"},
      {"Cntrl", "\\x00-\\x1F\\x7F"},
      {"XDigit", "0-9a-fA-F"},
      {"Space", " \\t\\n\\x0B\\f\\r"},
  };
  for (const auto& [java, ranges] : kClasses) {
    if (java == name) {
      return ranges;
    }
  }
  return nullptr;
}

int HexValue(std::string_view hex) {
  int value = 0;
  for (char c : hex) {
    int digit = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
    if (digit < 0) {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

// Rewrites the Java-only parts of an AWS model pattern into PCRE2 syntax: \uXXXX escapes (a
// surrogate pair becomes one code point) and the ASCII POSIX classes. Everything else
// (lookarounds, \p{L}, \w ...) means the same in both.
std::string JavaPatternToPcre(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 8);
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      if (next == 'u' && i + 5 < pattern.size() && HexValue(pattern.substr(i + 2, 4)) >= 0) {
        int code = HexValue(pattern.substr(i + 2, 4));
        size_t consumed = 6;
        if (code >= 0xD800 && code <= 0xDBFF && i + 12 <= pattern.size() && pattern.substr(i + 6, 2) == "\\u") {
          int low = HexValue(pattern.substr(i + 8, 4));
          if (low >= 0xDC00 && low <= 0xDFFF) {
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            consumed = 12;
          }
        }
        if (code >= 0xD800 && code <= 0xDFFF) {
          // A lone surrogate cannot occur in UTF-8 text; the nearest valid bound keeps ranges sane.
          code = code <= 0xDBFF ? 0xD7FF : 0xE000;
        }
        char buffer[16];
        std::snprintf(buffer, sizeof(buffer), "\\x{%X}", code);
        out += buffer;
        i += consumed - 1;
        continue;
      }
      if (next == 'p' && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        size_t close = pattern.find('}', i + 3);
        if (close != std::string_view::npos) {
          if (const char* ranges = JavaPosixClass(pattern.substr(i + 3, close - i - 3))) {
            out += class_depth > 0 ? std::string(ranges) : "[" + std::string(ranges) + "]";
            i = close;
            continue;
          }
        }
      }
      out += c;
      out += next;
      ++i;
      continue;
    }
    if (c == '$' && class_depth == 0 && i + 1 < pattern.size() &&
        (pattern[i + 1] == '{' || pattern[i + 1] == '+' || pattern[i + 1] == '*' || pattern[i + 1] == '?')) {
      // Java lets an anchor carry a quantifier ("...]*${1,128}"); PCRE2 wants it in a group.
      out += "(?:$)";
      continue;
    }
    if (c == '[') {
      ++class_depth;
    } else if (c == ']' && class_depth > 0) {
      --class_depth;
    }
    out += c;
  }
  return out;
}

// A bound as AWS prints it: integers as integers; float/double shapes as Java doubles ("1.0").
std::string BoundText(const json& bound, bool floating) {
  if (floating) {
    return json(bound.get<double>()).dump();
  }
  return bound.dump();
}

std::string Utf8Truncate(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) {
    return std::string(s);
  }
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) {
    --end;
  }
  return std::string(s.substr(0, end));
}

size_t CodePoints(std::string_view s) {
  size_t count = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
      ++count;
    }
  }
  return count;
}

// Longest rendering of one value in a validation message. A 10 MB member would otherwise be
// quoted whole (and the message is built once more around it); the prefix is what a person reads.
constexpr size_t kMaxRenderedValueBytes = 1024;

// Renders a value the way AWS (Java) prints it in validation messages: strings as is, lists as
// "[a, b]", maps and structures as "{k=v, k2=v2}". Stops once `out` passes `end` bytes and then
// ends the rendering with "..." (cut on a UTF-8 boundary). Returns false once cut.
bool RenderValueUpTo(const json& value, std::string& out, size_t end) {
  auto append = [&](std::string_view text) {
    if (out.size() + text.size() <= end) {
      out += text;
      return true;
    }
    out += Utf8Truncate(text, end > out.size() ? end - out.size() : 0);
    out += "...";
    return false;
  };
  switch (value.type()) {
    case json::value_t::null: return append("null");
    case json::value_t::string: return append(value.get_ref<const std::string&>());
    case json::value_t::array: {
      if (!append("[")) return false;
      bool first = true;
      for (const auto& element : value) {
        if (!first && !append(", ")) return false;
        first = false;
        if (!RenderValueUpTo(element, out, end)) return false;
      }
      return append("]");
    }
    case json::value_t::object: {
      if (!append("{")) return false;
      bool first = true;
      for (const auto& [key, element] : value.items()) {
        if (!first && !append(", ")) return false;
        first = false;
        if (!append(key) || !append("=")) return false;
        if (!RenderValueUpTo(element, out, end)) return false;
      }
      return append("}");
    }
    default: return append(value.dump());
  }
}

void RenderValue(const json& value, std::string& out) {
  RenderValueUpTo(value, out, out.size() + kMaxRenderedValueBytes);
}

const char* JavaTypeName(ShapeType type) {
  switch (type) {
    case ShapeType::kInteger: return "Integer";
    case ShapeType::kLong: return "Long";
    case ShapeType::kFloat: return "Float";
    case ShapeType::kDouble: return "Double";
    case ShapeType::kBoolean: return "Boolean";
    default: return "String";
  }
}

// The validation walk over one request. Holds the path being visited (appended and truncated,
// so visiting costs no allocation per member) and the errors found.
class Validator {
 public:
  using Shape = ServiceModel::Shape;

  void Structure(const Shape& shape, const json& value);
  void Value(const Shape& shape, const json& value);

  std::optional<aws::AwsError> Outcome() const {
    if (serialization_) {
      return serialization_;
    }
    if (errors_.empty()) {
      return std::nullopt;
    }
    std::string message = std::to_string(errors_.size()) +
                          (errors_.size() == 1 ? " validation error detected: " : " validation errors detected: ");
    for (size_t i = 0; i < errors_.size(); ++i) {
      if (i > 0) {
        message += "; ";
      }
      message += errors_[i];
    }
    return aws::AwsError("ValidationException", std::move(message));
  }

 private:
  // Appends ".name" (or "name" at the root); returns the length to truncate back to.
  size_t Push(std::string_view name) {
    size_t mark = path_.size();
    if (!path_.empty()) {
      path_ += '.';
    }
    path_ += name;
    return mark;
  }
  void Pop(size_t mark) { path_.resize(mark); }
  // The path as quoted in a message: map keys are the caller's text, so it is bounded like values.
  std::string BoundedPath() const {
    return path_.size() <= kMaxRenderedValueBytes ? path_ : Utf8Truncate(path_, kMaxRenderedValueBytes) + "...";
  }

  bool Failed() const { return serialization_.has_value(); }

  void TypeError(std::string message) {
    if (!serialization_) {
      // AWS's text names no member; the path tells the user which one it was.
      serialization_ = aws::AwsError("SerializationException", message + " (at '" + BoundedPath() + "')");
    }
  }

  void AddError(const json* value, std::string_view constraint) {
    if (errors_.size() >= static_cast<size_t>(ServiceModel::kMaxReportedErrors)) {
      return;
    }
    std::string error = "Value ";
    if (value == nullptr || value->is_null()) {
      error += "null";
    } else {
      error += '\'';
      RenderValue(*value, error);
      error += '\'';
    }
    error += " at '";
    error += BoundedPath();
    error += "' failed to satisfy constraint: ";
    error += constraint;
    errors_.push_back(std::move(error));
  }

  // Type-checks a scalar; false (with the SerializationException recorded) when it does not fit.
  bool ScalarTypeFits(const Shape& shape, const json& value);
  // Checks a scalar's constraints; reports each violation when `report`, else only answers.
  bool ScalarConstraints(const Shape& shape, const json& value, bool report);
  bool SizeConstraints(const Shape& shape, const json& value, size_t size, bool report);
  void List(const Shape& shape, const json& value);
  void Map(const Shape& shape, const json& value);

  std::string path_;
  std::vector<std::string> errors_;
  std::optional<aws::AwsError> serialization_;
};

bool Validator::ScalarTypeFits(const Shape& shape, const json& value) {
  if (value.is_array()) {
    TypeError("Start of list found where not expected");
    return false;
  }
  if (value.is_object()) {
    TypeError("Start of structure or map found where not expected.");
    return false;
  }
  switch (shape.type) {
    case ShapeType::kString:
      if (value.is_string()) return true;
      TypeError(std::string(value.is_boolean() ? "class java.lang.Boolean"
                                               : "class com.amazon.coral.value.json.numbers.TruncatingBigNumber") +
                " can not be converted to an String");
      return false;
    case ShapeType::kInteger:
    case ShapeType::kLong:
      if (value.is_number()) {
        // The model's integer is a Java int and its long a Java long: a number outside the range
        // cannot be deserialized (AWS answers SerializationException; Kiln would otherwise let a
        // 2^62 MaxRuntimeInSeconds overflow a deadline).
        const bool is_int = shape.type == ShapeType::kInteger;
        const double low = is_int ? -2147483648.0 : -9223372036854775808.0;
        const double high = is_int ? 2147483647.0 : 9223372036854775807.0;
        bool fits;
        if (value.is_number_unsigned()) {
          fits = value.get<uint64_t>() <= (is_int ? uint64_t{2147483647} : uint64_t{9223372036854775807});
        } else if (value.is_number_integer()) {
          fits = !is_int || (value.get<int64_t>() >= -2147483648LL && value.get<int64_t>() <= 2147483647LL);
        } else {
          double truncated = std::trunc(value.get<double>());
          // 2^63 itself is not a long: compare strictly against the next double up.
          fits = std::isfinite(truncated) && truncated >= low && (is_int ? truncated <= high : truncated < high);
        }
        if (fits) return true;
        TypeError("Numeric value (" + Utf8Truncate(value.dump(), 64) + ") out of range of " +
                  (is_int ? "int (-2147483648 - 2147483647)" : "long (-9223372036854775808 - 9223372036854775807)"));
        return false;
      }
      TypeError(std::string(value.is_boolean() ? "class java.lang.Boolean" : "class java.lang.String") +
                " can not be converted to an " + JavaTypeName(shape.type));
      return false;
    case ShapeType::kFloat:
    case ShapeType::kDouble:
      if (value.is_number()) return true;
      TypeError(std::string(value.is_boolean() ? "class java.lang.Boolean" : "class java.lang.String") +
                " can not be converted to an " + JavaTypeName(shape.type));
      return false;
    case ShapeType::kBoolean:
      if (value.is_boolean()) return true;
      if (value.is_string()) {
        TypeError("'" + Utf8Truncate(value.get_ref<const std::string&>(), 64) + "' can not be converted to an Boolean");
      } else {
        TypeError("class com.amazon.coral.value.json.numbers.TruncatingBigNumber can not be converted to an Boolean");
      }
      return false;
    case ShapeType::kTimestamp:
      if (value.is_number()) return true;
      if (value.is_string() && ParseIso8601(value.get_ref<const std::string&>()).has_value()) return true;
      TypeError(std::string(value.is_boolean() ? "class java.lang.Boolean" : "class java.lang.String") +
                " can not be converted to milliseconds since epoch");
      return false;
    case ShapeType::kBlob:
      if (!value.is_string()) {
        TypeError(std::string(value.is_boolean() ? "class java.lang.Boolean"
                                                 : "class com.amazon.coral.value.json.numbers.TruncatingBigNumber") +
                  " can not be converted to a Blob");
        return false;
      }
      if (!Base64Decode(value.get_ref<const std::string&>()).has_value()) {
        TypeError("'" + Utf8Truncate(value.get_ref<const std::string&>(), 64) +
                  "' can not be converted to a Blob: not valid Base64");
        return false;
      }
      return true;
    default: return true;
  }
}

bool Validator::SizeConstraints(const Shape& shape, const json& value, size_t size, bool report) {
  bool ok = true;
  if (shape.max && size > shape.max->get<uint64_t>()) {
    ok = false;
    if (report) AddError(&value, "Member must have length less than or equal to " + shape.max->dump());
  }
  if (shape.min && size < shape.min->get<uint64_t>()) {
    ok = false;
    if (report) AddError(&value, "Member must have length greater than or equal to " + shape.min->dump());
  }
  return ok;
}

bool Validator::ScalarConstraints(const Shape& shape, const json& value, bool report) {
  switch (shape.type) {
    case ShapeType::kString: {
      const std::string& text = value.get_ref<const std::string&>();
      bool ok = true;
      if (shape.min || shape.max) {
        ok = SizeConstraints(shape, value, CodePoints(text), report);
      }
      if (!shape.pattern.empty()) {
        const Regex* regex = shape.GetRegex();
        if (regex != nullptr && !regex->Match(text)) {
          ok = false;
          if (report) AddError(&value, "Member must satisfy regular expression pattern: " + shape.pattern);
        }
      }
      if (!shape.enum_set.empty() && shape.enum_set.count(text) == 0) {
        ok = false;
        if (report) AddError(&value, "Member must satisfy enum value set: " + shape.enum_text);
      }
      return ok;
    }
    case ShapeType::kBlob: {
      if (!shape.min && !shape.max) return true;
      auto bytes = Base64Decode(value.get_ref<const std::string&>());
      size_t size = bytes ? bytes->size() : 0;
      if (!SizeConstraints(shape, value, size, false)) {
        // AWS prints the ByteBuffer, not the bytes.
        json rendered =
            "java.nio.HeapByteBuffer[pos=0 lim=" + std::to_string(size) + " cap=" + std::to_string(size) + "]";
        if (report) SizeConstraints(shape, rendered, size, true);
        return false;
      }
      return true;
    }
    case ShapeType::kInteger:
    case ShapeType::kLong:
    case ShapeType::kFloat:
    case ShapeType::kDouble: {
      bool floating = shape.type == ShapeType::kFloat || shape.type == ShapeType::kDouble;
      double number = value.get<double>();
      if (!floating) {
        number = std::trunc(number);  // AWS truncates a fractional number sent for an integer
      }
      bool ok = true;
      if (shape.max && number > shape.max->get<double>()) {
        ok = false;
        if (report) AddError(&value, "Member must have value less than or equal to " + BoundText(*shape.max, floating));
      }
      if (shape.min && number < shape.min->get<double>()) {
        ok = false;
        if (report)
          AddError(&value, "Member must have value greater than or equal to " + BoundText(*shape.min, floating));
      }
      return ok;
    }
    default: return true;
  }
}

void Validator::Value(const Shape& shape, const json& value) {
  if (Failed()) {
    return;
  }
  switch (shape.type) {
    case ShapeType::kStructure:
      if (value.is_object()) {
        Structure(shape, value);
      } else if (value.is_array()) {
        TypeError("Start of list found where not expected");
      } else {
        TypeError("Expected null");
      }
      return;
    case ShapeType::kList: List(shape, value); return;
    case ShapeType::kMap: Map(shape, value); return;
    default:
      if (ScalarTypeFits(shape, value)) {
        ScalarConstraints(shape, value, /*report=*/true);
      }
      return;
  }
}

void Validator::Structure(const Shape& shape, const json& value) {
  if (shape.is_union) {
    int set = 0;
    for (const auto& member : shape.members) {
      auto it = value.find(member.name);
      if (it != value.end() && !it->is_null()) {
        ++set;
      }
    }
    if (set != 1) {
      AddError(&value, "Member must have exactly one member set");
    }
  }
  for (const auto& member : shape.members) {
    if (Failed()) {
      return;
    }
    auto it = value.find(member.name);
    bool absent = it == value.end() || it->is_null();
    if (absent && !member.required) {
      continue;
    }
    size_t mark = Push(member.path_name);
    if (absent) {
      AddError(nullptr, "Member must not be null");
    } else {
      Value(*member.shape, *it);
    }
    Pop(mark);
  }
}

void Validator::List(const Shape& shape, const json& value) {
  if (!value.is_array()) {
    TypeError(value.is_object() ? "Start of structure or map found where not expected." : "Expected list or null");
    return;
  }
  SizeConstraints(shape, value, value.size(), /*report=*/true);
  const Shape& element = *shape.member;
  if (element.IsScalar()) {
    // AWS reports a list of scalars once, with every constraint of the element shape.
    bool all_ok = true;
    for (const auto& item : value) {
      if (item.is_null()) continue;
      if (!ScalarTypeFits(element, item)) return;
      if (all_ok && !ScalarConstraints(element, item, /*report=*/false)) all_ok = false;
    }
    if (!all_ok) {
      AddError(&value, "Member must satisfy constraint: " + element.constraint_list);
    }
    return;
  }
  for (size_t index = 0; index < value.size() && !Failed(); ++index) {
    const json& item = value[index];
    if (item.is_null()) continue;
    size_t mark = Push(std::to_string(index + 1));
    path_ += ".member";
    Value(element, item);
    Pop(mark);
  }
}

void Validator::Map(const Shape& shape, const json& value) {
  if (!value.is_object()) {
    TypeError(value.is_array() ? "Start of list found where not expected" : "Expected map or null");
    return;
  }
  SizeConstraints(shape, value, value.size(), /*report=*/true);
  if (shape.key != nullptr && !shape.key->constraint_list.empty()) {
    bool keys_ok = true;
    for (const auto& [key, item] : value.items()) {
      if (!ScalarConstraints(*shape.key, json(key), /*report=*/false)) {
        keys_ok = false;
        break;
      }
    }
    if (!keys_ok) {
      AddError(&value, "Map keys must satisfy constraint: " + shape.key->constraint_list);
    }
  }
  const Shape& element = *shape.value;
  if (element.IsScalar()) {
    bool values_ok = true;
    bool has_null = false;
    for (const auto& [key, item] : value.items()) {
      if (item.is_null()) {
        has_null = true;
        continue;
      }
      if (!ScalarTypeFits(element, item)) return;
      if (values_ok && !ScalarConstraints(element, item, /*report=*/false)) values_ok = false;
    }
    if (!values_ok || has_null) {
      std::string list = element.constraint_list;
      if (has_null) {
        list = list.size() > 2 ? list.substr(0, list.size() - 1) + ", Member must not be null]"
                               : "[Member must not be null]";
      }
      AddError(&value, "Map value must satisfy constraint: " + list);
    }
    return;
  }
  for (const auto& [key, item] : value.items()) {
    if (Failed()) return;
    if (item.is_null()) continue;
    size_t mark = Push(key);
    path_ += ".member";
    Value(element, item);
    Pop(mark);
  }
}

using ojson = nlohmann::ordered_json;

json ToJson(const ojson& number) {
  if (number.is_number_unsigned()) return json(number.get<uint64_t>());
  if (number.is_number_integer()) return json(number.get<int64_t>());
  return json(number.get<double>());
}

Result<ShapeType> ParseType(std::string_view type) {
  static const std::pair<std::string_view, ShapeType> kTypes[] = {
      {"structure", ShapeType::kStructure}, {"list", ShapeType::kList},         {"map", ShapeType::kMap},
      {"string", ShapeType::kString},       {"integer", ShapeType::kInteger},   {"long", ShapeType::kLong},
      {"float", ShapeType::kFloat},         {"double", ShapeType::kDouble},     {"boolean", ShapeType::kBoolean},
      {"timestamp", ShapeType::kTimestamp}, {"blob", ShapeType::kBlob},         {"byte", ShapeType::kInteger},
      {"short", ShapeType::kInteger},       {"bigdecimal", ShapeType::kDouble}, {"biginteger", ShapeType::kLong},
  };
  for (const auto& [name, value] : kTypes) {
    if (name == type) return value;
  }
  return Status::InvalidArgument("unknown shape type \"" + std::string(type) + "\"");
}

std::string BuildConstraintList(const ServiceModel::Shape& shape) {
  std::vector<std::string> parts;
  bool floating = shape.type == ShapeType::kFloat || shape.type == ShapeType::kDouble;
  if (shape.IsNumber()) {
    if (shape.max) parts.push_back("Member must have value less than or equal to " + BoundText(*shape.max, floating));
    if (shape.min)
      parts.push_back("Member must have value greater than or equal to " + BoundText(*shape.min, floating));
  } else {
    if (shape.max) parts.push_back("Member must have length less than or equal to " + shape.max->dump());
    if (shape.min) parts.push_back("Member must have length greater than or equal to " + shape.min->dump());
  }
  if (!shape.pattern.empty()) parts.push_back("Member must satisfy regular expression pattern: " + shape.pattern);
  if (!shape.enum_values.empty()) parts.push_back("Member must satisfy enum value set: " + shape.enum_text);
  if (parts.empty()) return "";
  std::string out = "[";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += ", ";
    out += parts[i];
  }
  return out + "]";
}

}  // namespace

const Regex* ServiceModel::Shape::GetRegex() const {
  std::call_once(regex_once, [this] {
    auto compiled = Regex::Compile(JavaPatternToPcre(pattern), {.mode = Regex::Mode::kFullMatch, .ucp = false});
    if (compiled.ok()) {
      regex = std::move(compiled).value();
    } else {
      KLOG(warn, "model pattern skipped",
           {{"shape", name}, {"pattern", pattern}, {"error", compiled.status().message()}});
    }
  });
  return regex ? &*regex : nullptr;
}

ServiceModel::ServiceModel() = default;
ServiceModel::~ServiceModel() = default;

Result<std::shared_ptr<const ServiceModel>> ServiceModel::Parse(std::string_view text) {
  // ordered_json keeps members in model order: AWS reports errors in that order.
  ojson document = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object()) {
    return Status::InvalidArgument("service model is not a JSON object");
  }
  auto shapes_it = document.find("shapes");
  if (shapes_it == document.end() || !shapes_it->is_object()) {
    return Status::InvalidArgument("service model has no shapes");
  }
  std::shared_ptr<ServiceModel> model(new ServiceModel());
  // Pass 1: create every shape so that references resolve regardless of order.
  for (const auto& [name, definition] : shapes_it->items()) {
    auto shape = std::make_unique<Shape>();
    shape->name = name;
    model->shapes_.emplace(name, std::move(shape));
  }
  auto resolve = [&](const ojson& reference, std::string_view context) -> Result<const Shape*> {
    auto it = reference.find("shape");
    if (it == reference.end() || !it->is_string()) {
      return Status::InvalidArgument(std::string(context) + ": reference without a shape");
    }
    auto found = model->shapes_.find(it->get<std::string>());
    if (found == model->shapes_.end()) {
      return Status::InvalidArgument(std::string(context) + ": unknown shape " + it->get<std::string>());
    }
    return static_cast<const Shape*>(found->second.get());
  };
  // Pass 2: fill them in.
  for (const auto& [name, definition] : shapes_it->items()) {
    Shape& shape = *model->shapes_[name];
    if (!definition.is_object() || !definition.contains("type") || !definition["type"].is_string()) {
      return Status::InvalidArgument("shape " + name + " has no type");
    }
    ASSIGN_OR_RETURN(shape.type, ParseType(definition["type"].get<std::string>()));
    if (auto it = definition.find("min"); it != definition.end() && it->is_number()) shape.min = ToJson(*it);
    if (auto it = definition.find("max"); it != definition.end() && it->is_number()) shape.max = ToJson(*it);
    if (auto it = definition.find("pattern"); it != definition.end() && it->is_string())
      shape.pattern = it->get<std::string>();
    if (auto it = definition.find("enum"); it != definition.end() && it->is_array()) {
      shape.enum_text = "[";
      for (const auto& value : *it) {
        if (!value.is_string()) continue;
        if (!shape.enum_values.empty()) shape.enum_text += ", ";
        shape.enum_text += value.get<std::string>();
        shape.enum_values.push_back(value.get<std::string>());
        shape.enum_set.insert(value.get<std::string>());
      }
      shape.enum_text += "]";
    }
    shape.is_union = definition.value("union", false);
    if (shape.type == ShapeType::kStructure) {
      std::unordered_set<std::string> required;
      if (auto it = definition.find("required"); it != definition.end() && it->is_array()) {
        for (const auto& member : *it) {
          if (member.is_string()) required.insert(member.get<std::string>());
        }
      }
      if (auto it = definition.find("members"); it != definition.end() && it->is_object()) {
        for (const auto& [member_name, reference] : it->items()) {
          Shape::Member member;
          member.name = member_name;
          member.path_name = LowerFirst(member_name);
          ASSIGN_OR_RETURN(member.shape, resolve(reference, name + "." + member_name));
          member.required = required.count(member_name) > 0;
          shape.members.push_back(std::move(member));
        }
      }
    } else if (shape.type == ShapeType::kList) {
      ASSIGN_OR_RETURN(shape.member, resolve(definition.value("member", ojson::object()), name + ".member"));
    } else if (shape.type == ShapeType::kMap) {
      ASSIGN_OR_RETURN(shape.key, resolve(definition.value("key", ojson::object()), name + ".key"));
      ASSIGN_OR_RETURN(shape.value, resolve(definition.value("value", ojson::object()), name + ".value"));
    }
    shape.constraint_list = BuildConstraintList(shape);
  }
  if (auto ops = document.find("operations"); ops != document.end() && ops->is_object()) {
    for (const auto& [name, operation] : ops->items()) {
      const Shape* input = nullptr;
      if (auto it = operation.find("input"); it != operation.end() && it->is_object()) {
        ASSIGN_OR_RETURN(input, resolve(*it, name + ".input"));
      }
      model->operations_.emplace(name, input);
    }
  }
  return std::shared_ptr<const ServiceModel>(std::move(model));
}

std::shared_ptr<const ServiceModel> ServiceModel::SageMaker() {
  static const std::shared_ptr<const ServiceModel> model = [] {
    auto parsed = Parse(EmbeddedSageMakerModelJson());
    if (!parsed.ok()) {
      KLOG(error, "embedded SageMaker model does not parse", {{"error", parsed.status().message()}});
      std::abort();
    }
    return std::move(parsed).value();
  }();
  return model;
}

bool ServiceModel::HasOperation(std::string_view operation) const {
  return operations_.count(std::string(operation)) > 0;
}

std::optional<aws::AwsError> ServiceModel::ValidateInput(std::string_view operation, const json& input) const {
  auto it = operations_.find(std::string(operation));
  if (it == operations_.end() || it->second == nullptr) {
    return std::nullopt;
  }
  if (!input.is_object()) {
    return aws::AwsError("SerializationException", "The request body is not a valid JSON object.");
  }
  Validator validator;
  validator.Structure(*it->second, input);
  return validator.Outcome();
}

Status ServiceModel::TEST_CompileAllPatterns() const {
  for (const auto& [name, shape] : shapes_) {
    if (shape->pattern.empty()) continue;
    auto compiled = Regex::Compile(JavaPatternToPcre(shape->pattern), {.mode = Regex::Mode::kFullMatch, .ucp = false});
    if (!compiled.ok()) {
      return Status::InvalidArgument(name + ": " + compiled.status().message() + " in " + shape->pattern);
    }
  }
  return Status::Ok();
}

}  // namespace kiln::api
