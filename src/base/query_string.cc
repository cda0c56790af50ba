#include "base/query_string.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "base/encoding.h"
#include "base/strings.h"

namespace kiln {

Result<std::vector<QueryParam>> ParseQueryString(std::string_view text, const QueryStringOptions& options) {
  std::vector<QueryParam> params;
  if (text.empty()) return params;
  for (std::string_view pair : Split(text, '&')) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string_view raw_name = pair.substr(0, eq);
    const std::string_view raw_value = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    std::optional<std::string> name =
        options.decode_names ? UriDecode(raw_name, options.plus_is_space) : std::string(raw_name);
    std::optional<std::string> value = UriDecode(raw_value, options.plus_is_space);
    if (!name || !value) {
      switch (options.bad_escape) {
        case QueryBadEscape::kKeepRaw:
          if (!name) name = std::string(raw_name);
          if (!value) value = std::string(raw_value);
          break;
        case QueryBadEscape::kDropPair: continue;
        case QueryBadEscape::kRefuse:
          return Status::InvalidArgument("The parameter " + std::string(raw_name.substr(0, 128)) +
                                         " is not correctly percent-encoded.");
      }
    }
    params.push_back({std::move(*name), std::move(*value)});
  }
  return params;
}

const std::string* FindQueryParam(const std::vector<QueryParam>& params, std::string_view name) {
  auto it = std::find_if(params.begin(), params.end(), [&](const QueryParam& p) { return p.name == name; });
  return it == params.end() ? nullptr : &it->value;
}

std::map<std::string, std::string> QueryParamMap(std::vector<QueryParam> params) {
  std::map<std::string, std::string> out;
  for (QueryParam& p : params) out[std::move(p.name)] = std::move(p.value);
  return out;
}

}  // namespace kiln
