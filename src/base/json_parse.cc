#include "base/json_parse.h"

#include <exception>
#include <string>

namespace kiln {

namespace {

// A SAX handler that builds the DOM through nlohmann's own DOM builder and counts depth on the
// way: returning false from start_object/start_array stops the parse at once.
template <typename Json>
class DepthLimitedBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  DepthLimitedBuilder(Json& result, const JsonLimits& limits)
      : dom_(result, /*allow_exceptions=*/false), max_depth_(limits.max_depth), max_values_(limits.max_values) {}

  bool null() { return Count() && dom_.null(); }
  bool boolean(bool v) { return Count() && dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return Count() && dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return Count() && dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return Count() && dom_.number_float(v, s); }
  bool string(string_t& v) { return Count() && dom_.string(v); }
  bool binary(binary_t& v) { return Count() && dom_.binary(v); }
  bool start_object(std::size_t n) { return Enter() && dom_.start_object(n); }
  bool key(string_t& k) { return dom_.key(k); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& ex) {
    error_ = ex.what();
    (void)position;
    (void)last_token;
    return false;
  }

  bool too_deep() const { return too_deep_; }
  bool too_many() const { return too_many_; }
  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return Count();
  }
  bool Count() {
    if (max_values_ != 0 && ++values_ > max_values_) {
      too_many_ = true;
      return false;
    }
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  size_t max_depth_;
  size_t max_values_;
  size_t depth_ = 0;
  size_t values_ = 0;
  bool too_deep_ = false;
  bool too_many_ = false;
  std::string error_;
};

template <typename Json>
Result<Json> ParseBounded(std::string_view text, const JsonLimits& limits) {
  if (limits.max_bytes != 0 && text.size() > limits.max_bytes) {
    return Status::ResourceExhausted("JSON text of " + std::to_string(text.size()) + " bytes is larger than the " +
                                     std::to_string(limits.max_bytes) + "-byte limit");
  }
  Json result;
  DepthLimitedBuilder<Json> builder(result, limits);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                         /*strict=*/true);
  } catch (const std::exception& e) {
    // The DOM builder does not throw with allow_exceptions=false; this is belt and braces.
    return Status(StatusCode::kInvalidArgument, std::string("malformed JSON: ") + e.what(), ErrorReason::kMalformed);
  }
  if (builder.too_deep()) {
    // Whatever was built so far is dropped here; its depth is bounded, so destruction is too.
    return Status::InvalidArgument("JSON nested deeper than " + std::to_string(limits.max_depth) + " levels");
  }
  if (builder.too_many()) {
    return Status::ResourceExhausted("JSON document holds more than " + std::to_string(limits.max_values) + " values");
  }
  if (!ok) {
    std::string detail = builder.error();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." → from "parse error".
    size_t at = detail.find("parse error");
    return Status(
        StatusCode::kInvalidArgument,
        "malformed JSON" + (detail.empty() ? std::string() : ": " + detail.substr(at == std::string::npos ? 0 : at)),
        ErrorReason::kMalformed);
  }
  return result;
}

}  // namespace

Result<nlohmann::json> ParseJsonBounded(std::string_view text, const JsonLimits& limits) {
  return ParseBounded<nlohmann::json>(text, limits);
}

Result<nlohmann::ordered_json> ParseOrderedJsonBounded(std::string_view text, const JsonLimits& limits) {
  return ParseBounded<nlohmann::ordered_json>(text, limits);
}

nlohmann::json WithoutNulls(const nlohmann::json& value) {
  if (value.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!it->is_null()) out[it.key()] = WithoutNulls(*it);
    }
    return out;
  }
  if (value.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const nlohmann::json& element : value) out.push_back(WithoutNulls(element));
    return out;
  }
  return value;
}

}  // namespace kiln
