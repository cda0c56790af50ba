#include "store/json_member.h"

namespace kiln::store::json_member {

using nlohmann::json;

namespace {

// The member's value when present and not null; nullptr otherwise (the reader then leaves `out`).
const json* Present(const json& object, const char* member) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(member);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

Status Wrong(WrongTypeFn wrong_type, std::string_view prefix, const char* member, std::string_view expected) {
  return wrong_type(std::string(prefix) + member, expected);
}

}  // namespace

Status ReadString(const json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                  std::string& out) {
  const json* value = Present(object, member);
  if (value == nullptr) return Status::Ok();
  if (!value->is_string()) return Wrong(wrong_type, prefix, member, "a string");
  out = value->get<std::string>();
  return Status::Ok();
}

Status ReadInt64(const json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                 int64_t& out) {
  const json* value = Present(object, member);
  if (value == nullptr) return Status::Ok();
  if (value->is_number_unsigned()) {
    const uint64_t u = value->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Wrong(wrong_type, prefix, member, "an int64");
    out = static_cast<int64_t>(u);
    return Status::Ok();
  }
  if (!value->is_number_integer()) return Wrong(wrong_type, prefix, member, "an integer");
  out = value->get<int64_t>();
  return Status::Ok();
}

Status ReadDouble(const json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                  double& out) {
  const json* value = Present(object, member);
  if (value == nullptr) return Status::Ok();
  if (!value->is_number()) return Wrong(wrong_type, prefix, member, "a number");
  out = value->get<double>();
  return Status::Ok();
}

Status ReadBool(const json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type, bool& out) {
  const json* value = Present(object, member);
  if (value == nullptr) return Status::Ok();
  if (!value->is_boolean()) return Wrong(wrong_type, prefix, member, "a boolean");
  out = value->get<bool>();
  return Status::Ok();
}

Result<const json*> ArrayMember(const json& object, const char* member, std::string_view prefix,
                                WrongTypeFn wrong_type) {
  static const json kEmpty = json::array();
  const json* value = Present(object, member);
  if (value == nullptr) return &kEmpty;
  if (!value->is_array()) return Wrong(wrong_type, prefix, member, "an array");
  return value;
}

Status RequireObject(const json& value, std::string_view path, WrongTypeFn wrong_type) {
  if (!value.is_object()) return wrong_type(path, "an object");
  return Status::Ok();
}

Status RequirePresent(const json& object, const char* member, std::string_view where) {
  if (!object.is_object() || !object.contains(member)) {
    return Status::InvalidArgument(std::string(where) + " has no " + member);
  }
  return Status::Ok();
}

}  // namespace kiln::store::json_member
