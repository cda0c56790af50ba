#include "aws/query_codec.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include "base/encoding.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

using Params = std::map<std::string, std::string>;

constexpr int kMaxDepth = 32;

const nlohmann::json* FindShape(const nlohmann::json& shapes, std::string_view name) {
  auto it = shapes.find(std::string(name));
  return it == shapes.end() || !it->is_object() ? nullptr : &*it;
}

std::string RefShape(const nlohmann::json& ref) { return ref.is_object() ? ref.value("shape", "") : ""; }

// The serialized name of a member/element reference: its locationName, else `fallback`.
std::string LocationName(const nlohmann::json& ref, std::string_view fallback) {
  if (ref.is_object()) {
    auto it = ref.find("locationName");
    if (it != ref.end() && it->is_string()) return it->get<std::string>();
  }
  return std::string(fallback);
}

std::string Join(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : std::string(prefix) + "." + std::string(name);
}

// Whether any parameter is `p` itself or below it (`p.`...).
bool HasAny(const Params& params, const std::string& p) {
  if (params.count(p) > 0) return true;
  std::string below = p + ".";
  auto it = params.lower_bound(below);
  return it != params.end() && StartsWith(it->first, below);
}

// The distinct numeric indexes N of parameters `<p>.N` / `<p>.N.…`, in numeric order.
Result<std::set<uint64_t>> Indexes(const Params& params, const std::string& p) {
  std::set<uint64_t> out;
  const std::string below = p + ".";
  for (auto it = params.lower_bound(below); it != params.end() && StartsWith(it->first, below); ++it) {
    std::string_view rest = std::string_view(it->first).substr(below.size());
    std::string_view index = rest.substr(0, rest.find('.'));
    auto n = ParseUint64(index);
    if (!n || *n == 0 || index.size() > 9) {
      return Status::InvalidArgument("The parameter " + it->first.substr(0, 256) +
                                     " has an invalid list index; list members are numbered from 1.");
    }
    out.insert(*n);
  }
  return out;
}

Status Invalid(const std::string& name, std::string_view value, std::string_view expected) {
  return Status::InvalidArgument("The value " + std::string(value.substr(0, 256)) + " for parameter " +
                                 name.substr(0, 256) + " is invalid: expected " + std::string(expected) + ".");
}

std::optional<double> ParseDouble(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

Result<nlohmann::json> Decode(const nlohmann::json& shapes, const std::string& shape_name, const Params& params,
                              const std::string& p, int depth) {
  const nlohmann::json* shape = FindShape(shapes, shape_name);
  if (shape == nullptr) return Status::InvalidArgument("the model has no shape " + shape_name);
  if (depth > kMaxDepth) return Status::InvalidArgument("The parameter " + p.substr(0, 256) + " is nested too deeply.");
  const std::string type = shape->value("type", "");
  if (type == "structure") {
    nlohmann::json out = nlohmann::json::object();
    auto members = shape->find("members");
    if (members == shape->end()) return out;
    for (auto it = members->begin(); it != members->end(); ++it) {
      std::string name = Join(p, LocationName(it.value(), it.key()));
      if (!HasAny(params, name)) continue;
      ASSIGN_OR_RETURN(nlohmann::json value, Decode(shapes, RefShape(it.value()), params, name, depth + 1));
      out[it.key()] = std::move(value);
    }
    return out;
  }
  if (type == "list") {
    nlohmann::json out = nlohmann::json::array();
    const nlohmann::json& member = shape->contains("member") ? (*shape)["member"] : nlohmann::json();
    const bool flattened = shape->value("flattened", false);
    const std::string list_prefix = flattened ? p : Join(p, LocationName(member, "member"));
    ASSIGN_OR_RETURN(std::set<uint64_t> indexes, Indexes(params, list_prefix));
    for (uint64_t i : indexes) {
      ASSIGN_OR_RETURN(nlohmann::json element,
                       Decode(shapes, RefShape(member), params, list_prefix + "." + std::to_string(i), depth + 1));
      out.push_back(std::move(element));
    }
    if (indexes.empty()) {
      auto exact = params.find(p);
      if (exact != params.end() && !exact->second.empty()) {
        return Invalid(p, exact->second, "a list (" + list_prefix + ".1, " + list_prefix + ".2, ...)");
      }
    }
    return out;
  }
  if (type == "map") {
    nlohmann::json out = nlohmann::json::object();
    const bool flattened = shape->value("flattened", false);
    const std::string entry_prefix = flattened ? p : Join(p, "entry");
    const nlohmann::json& key_ref = shape->contains("key") ? (*shape)["key"] : nlohmann::json();
    const nlohmann::json& value_ref = shape->contains("value") ? (*shape)["value"] : nlohmann::json();
    ASSIGN_OR_RETURN(std::set<uint64_t> indexes, Indexes(params, entry_prefix));
    for (uint64_t i : indexes) {
      std::string base = entry_prefix + "." + std::to_string(i);
      auto key = params.find(base + "." + LocationName(key_ref, "key"));
      if (key == params.end()) continue;
      ASSIGN_OR_RETURN(nlohmann::json value, Decode(shapes, RefShape(value_ref), params,
                                                    base + "." + LocationName(value_ref, "value"), depth + 1));
      out[key->second] = std::move(value);
    }
    return out;
  }
  // Scalars: the parameter itself (a scalar with only deeper parameters is absent → null).
  auto it = params.find(p);
  if (it == params.end()) return nlohmann::json();
  const std::string& text = it->second;
  if (type == "string" || type == "blob") return nlohmann::json(text);
  if (type == "boolean") {
    if (text == "true") return nlohmann::json(true);
    if (text == "false") return nlohmann::json(false);
    return Invalid(p, text, "true or false");
  }
  if (type == "integer" || type == "long") {
    if (auto n = ParseInt64(text)) return nlohmann::json(*n);
    auto d = ParseDouble(text);
    if (!d || !std::isfinite(*d) || std::fabs(*d) > 9.2e18) return Invalid(p, text, "an integer");
    return nlohmann::json(static_cast<int64_t>(*d));
  }
  if (type == "double" || type == "float") {
    auto d = ParseDouble(text);
    if (!d) return Invalid(p, text, "a number");
    return nlohmann::json(*d);
  }
  if (type == "timestamp") {
    if (auto millis = ParseIso8601(text)) return nlohmann::json(static_cast<double>(*millis) / 1000.0);
    auto d = ParseDouble(text);
    if (!d || !std::isfinite(*d)) return Invalid(p, text, "an ISO-8601 timestamp such as 2024-05-01T10:00:00Z");
    return nlohmann::json(*d);
  }
  return nlohmann::json(text);
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, result.ptr);
}

std::string FormatTimestamp(double epoch_seconds) {
  if (!std::isfinite(epoch_seconds)) return FormatDouble(epoch_seconds);
  auto millis = static_cast<int64_t>(std::llround(epoch_seconds * 1000.0));
  std::string text = FormatIso8601Millis(millis);
  // AWS writes whole seconds without a fraction ("2024-05-01T10:00:00Z").
  if (millis % 1000 == 0 && text.size() > 5 && EndsWith(text, ".000Z")) text = text.substr(0, text.size() - 5) + "Z";
  return text;
}

void Scalar(std::string& out, const std::string& type, const nlohmann::json& value) {
  if (value.is_string()) {
    out += XmlEscape(value.get_ref<const std::string&>());
  } else if (value.is_boolean()) {
    out += value.get<bool>() ? "true" : "false";
  } else if (value.is_number_integer() && type != "timestamp") {
    out += value.dump();
  } else if (value.is_number()) {
    out += type == "timestamp"                     ? FormatTimestamp(value.get<double>())
           : (type == "integer" || type == "long") ? std::to_string(static_cast<int64_t>(value.get<double>()))
                                                   : FormatDouble(value.get<double>());
  } else if (!value.is_null()) {
    out += XmlEscape(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
}

void Encode(std::string& out, const nlohmann::json& shapes, const std::string& shape_name, const nlohmann::json& value,
            int depth);

void Element(std::string& out, const std::string& name, const nlohmann::json& shapes, const std::string& shape_name,
             const nlohmann::json& value, int depth) {
  out += "<" + name + ">";
  Encode(out, shapes, shape_name, value, depth + 1);
  out += "</" + name + ">";
}

void Encode(std::string& out, const nlohmann::json& shapes, const std::string& shape_name, const nlohmann::json& value,
            int depth) {
  const nlohmann::json* shape = depth <= 64 ? FindShape(shapes, shape_name) : nullptr;
  const std::string type = shape == nullptr ? "" : shape->value("type", "");
  if (type == "structure" && value.is_object()) {
    const nlohmann::json& members = (*shape)["members"];
    std::vector<std::string> order;
    if (shape->contains("xmlOrder") && (*shape)["xmlOrder"].is_array()) {
      for (const auto& name : (*shape)["xmlOrder"]) order.push_back(name.get<std::string>());
    }
    for (auto it = members.begin(); it != members.end(); ++it) {
      if (std::find(order.begin(), order.end(), it.key()) == order.end()) order.push_back(it.key());
    }
    for (const std::string& member : order) {
      auto v = value.find(member);
      if (v == value.end() || v->is_null() || !members.contains(member)) continue;
      const nlohmann::json& ref = members[member];
      Element(out, LocationName(ref, member), shapes, RefShape(ref), *v, depth);
    }
  } else if (type == "list" && value.is_array()) {
    const nlohmann::json& member = (*shape)["member"];
    const std::string name = LocationName(member, "member");
    for (const auto& element : value) Element(out, name, shapes, RefShape(member), element, depth);
  } else if (type == "map" && value.is_object()) {
    const nlohmann::json& key_ref = (*shape)["key"];
    const nlohmann::json& value_ref = (*shape)["value"];
    for (auto it = value.begin(); it != value.end(); ++it) {
      out += "<entry><" + LocationName(key_ref, "key") + ">" + XmlEscape(it.key()) + "</" +
             LocationName(key_ref, "key") + ">";
      Element(out, LocationName(value_ref, "value"), shapes, RefShape(value_ref), it.value(), depth);
      out += "</entry>";
    }
  } else {
    Scalar(out, type, value);
  }
}

}  // namespace

Result<std::map<std::string, std::string>> ParseQueryForm(std::string_view text) {
  ASSIGN_OR_RETURN(std::vector<QueryParam> params,
                   ParseQueryString(text, {.plus_is_space = true, .bad_escape = QueryBadEscape::kRefuse}));
  return QueryParamMap(std::move(params));
}

Result<nlohmann::json> DecodeQueryInput(const nlohmann::json& shapes, std::string_view shape_name,
                                        const std::map<std::string, std::string>& params) {
  return Decode(shapes, std::string(shape_name), params, "", 0);
}

std::string EncodeQueryXml(const nlohmann::json& shapes, std::string_view shape_name, const nlohmann::json& value) {
  std::string out;
  Encode(out, shapes, std::string(shape_name), value, 0);
  return out;
}

WireResponse QueryResponse(std::string_view operation, std::string_view xmlns, bool with_result,
                           std::string_view result_xml, std::string_view request_id) {
  WireResponse response;
  response.status = 200;
  response.headers.emplace("x-amzn-RequestId", std::string(request_id));
  response.headers.emplace("Content-Type", "text/xml");
  std::string op(operation);
  std::string& body = response.body;
  body.reserve(result_xml.size() + 256);
  body += "<" + op + "Response xmlns=\"" + XmlEscape(xmlns) + "\">";
  if (with_result) {
    body += "<" + op + "Result>";
    body += result_xml;
    body += "</" + op + "Result>";
  }
  body += "<ResponseMetadata><RequestId>" + XmlEscape(request_id) + "</RequestId></ResponseMetadata>";
  body += "</" + op + "Response>\n";
  return response;
}

WireResponse QueryError(std::string_view xmlns, const AwsError& error, std::string_view request_id) {
  WireResponse response = SerializeError(Protocol::kQuery, error, request_id);
  std::string body = "<ErrorResponse xmlns=\"" + XmlEscape(xmlns) + "\"><Error><Type>";
  body += error.sender_fault ? "Sender" : "Receiver";
  body += "</Type><Code>" + XmlEscape(error.code) + "</Code><Message>" + XmlEscape(error.message) + "</Message>";
  for (const auto& [name, value] : error.fields) body += "<" + name + ">" + XmlEscape(value) + "</" + name + ">";
  body += "</Error><RequestId>" + XmlEscape(request_id) + "</RequestId></ErrorResponse>\n";
  response.body = std::move(body);
  return response;
}

}  // namespace kiln::aws
