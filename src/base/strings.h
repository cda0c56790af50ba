#pragma once
// Small string helpers shared by every module.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

std::string ToLower(std::string_view s);
bool EqualsIgnoreCase(std::string_view a, std::string_view b);
bool StartsWith(std::string_view s, std::string_view prefix);
bool EndsWith(std::string_view s, std::string_view suffix);
// Removes leading and trailing spaces, tabs, CR and LF.
std::string_view Trim(std::string_view s);
// Splits on every occurrence of `sep`; empty fields are kept ("a,,b" -> {"a","","b"}).
std::vector<std::string_view> Split(std::string_view s, char sep);
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
// Parses a full base-10 unsigned integer; nullopt on empty input, junk or overflow.
std::optional<uint64_t> ParseUint64(std::string_view s);
std::optional<int64_t> ParseInt64(std::string_view s);

// Case-insensitive ordering for header maps.
struct CaseInsensitiveLess {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const;
};

}  // namespace kiln
