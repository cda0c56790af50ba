#pragma once

// Readers of one member of a stored JSON state document, with a type check. Module-private to
// store/: the state mappings (training_job_state.cc, endpoint_state.cc) read their documents
// through these so the absent/null/wrong-type rules live in one place.
//
// Contract shared by every reader:
//   - member absent or null: Ok, `out` untouched (callers pre-set their defaults);
//   - member of the wrong type: InvalidArgument built by the caller's `wrong_type` from the member's
//     path (`prefix + member`) and what was expected ("a string", "an integer", ...), so each
//     document keeps its own wording;
//   - never throws: every type is checked before nlohmann's get<>.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::store::json_member {

// Builds the error for "the value at `path` is not `expected`".
using WrongTypeFn = Status (*)(std::string_view path, std::string_view expected);

Status ReadString(const nlohmann::json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                  std::string& out);

// An integer, signed or unsigned; unsigned values above INT64_MAX are "not an int64".
Status ReadInt64(const nlohmann::json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                 int64_t& out);

// Any JSON number (integers convert).
Status ReadDouble(const nlohmann::json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                  double& out);

Status ReadBool(const nlohmann::json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                bool& out);

// As the reader for T, into an optional: set only when the member is present and not null.
// T is one of std::string, int64_t, double, bool.
template <typename T>
Status ReadOptional(const nlohmann::json& object, const char* member, std::string_view prefix, WrongTypeFn wrong_type,
                    std::optional<T>& out) {
  auto it = object.find(member);
  if (it == object.end() || it->is_null()) return Status::Ok();
  T value{};
  Status status = Status::Ok();
  if constexpr (std::is_same_v<T, std::string>) {
    status = ReadString(object, member, prefix, wrong_type, value);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    status = ReadInt64(object, member, prefix, wrong_type, value);
  } else if constexpr (std::is_same_v<T, double>) {
    status = ReadDouble(object, member, prefix, wrong_type, value);
  } else {
    static_assert(std::is_same_v<T, bool>, "ReadOptional reads std::string, int64_t, double or bool");
    status = ReadBool(object, member, prefix, wrong_type, value);
  }
  if (!status.ok()) return status;
  out = std::move(value);
  return Status::Ok();
}

// The array at object[member]; absent or null reads as a (static) empty array.
Result<const nlohmann::json*> ArrayMember(const nlohmann::json& object, const char* member, std::string_view prefix,
                                          WrongTypeFn wrong_type);

// Ok when `value` is an object; else wrong_type(path, "an object").
Status RequireObject(const nlohmann::json& value, std::string_view path, WrongTypeFn wrong_type);

// Ok when object[member] exists (even null); else InvalidArgument "<where> has no <member>".
Status RequirePresent(const nlohmann::json& object, const char* member, std::string_view where);

}  // namespace kiln::store::json_member
