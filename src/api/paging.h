#pragma once
// Internal to api/: the one NextToken and keyset-paging helper of the SageMaker List*
// operations (ListTrainingJobs, ListModels, ListEndpointConfigs, ListEndpoints) and ListTags.
//
// A NextToken is base64 of {"c": cursor, "f": filter hash, "t": issue time (ms)}: opaque to
// clients, bound to the request's other members (a hash of everything but NextToken and
// MaxResults) and valid for 24 h. A token that does not decode, was issued for other filters,
// is older than 24 h or carries a cursor of the wrong shape is AWS's ValidationException
// "The provided NextToken is invalid." (spec/control-plane-api.md §4).
//
// List* cursors are the last row's {"k": sort key, "n": name}; the store reads the next page
// from an index, strictly after that row (store/list_query.h), so a page costs the same however
// many rows exist and stays correct while rows are created between pages.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "aws/errors.h"
#include "base/strings.h"
#include "store/list_query.h"

namespace kiln::api {

// A token for `cursor`, bound to `in`'s filters, issued at `now_millis`.
std::string EncodeNextToken(const nlohmann::json& cursor, const nlohmann::json& in, int64_t now_millis);
// The cursor of `in`'s NextToken when it is valid for `in` at `now_millis`; nullopt otherwise.
std::optional<nlohmann::json> DecodeNextToken(const std::string& token, const nlohmann::json& in, int64_t now_millis);

// "The provided NextToken is invalid." (ValidationException, 400).
aws::AwsError InvalidNextToken();

// The filters the List* operations of every job and resource kind share: NameContains and
// StatusEquals (string members only), CreationTimeAfter/Before, LastModifiedTimeAfter/Before.
store::ListFilter ListFilterFromRequest(const nlohmann::json& in);

// The paging of one List* request.
struct ListPaging {
  // sort_by, descending, after (from NextToken) and limit = max_results + 1: the one extra row
  // tells whether a next page exists. Callers fill query.filter.
  store::ListPageQuery query;
  size_t max_results = 10;
};

// Reads MaxResults (absent or null: `default_max`), NextToken (absent, null or not a string:
// the first page) of `in`, with the order the caller mapped from SortBy/SortOrder.
std::variant<ListPaging, aws::AwsError> ParseListPaging(const nlohmann::json& in, store::ListSortKey sort_by,
                                                        bool descending, int64_t now_millis, size_t default_max = 10);

// Cuts `rows` (read with paging.query) to the page and returns the NextToken of the next page
// when there is one. Row: any summary with `name`, `creation_millis` and, to sort by status,
// `status`.
template <class Row>
std::optional<std::string> CutPage(std::vector<Row>& rows, const ListPaging& paging, const nlohmann::json& in,
                                   int64_t now_millis) {
  if (rows.size() <= paging.max_results) return std::nullopt;
  rows.resize(paging.max_results);
  if (rows.empty()) return std::nullopt;
  const Row& last = rows.back();
  nlohmann::json key;
  switch (paging.query.sort_by) {
    case store::ListSortKey::kName: key = ToLower(last.name); break;
    case store::ListSortKey::kStatus:
      if constexpr (requires { last.status; }) key = last.status;
      break;
    case store::ListSortKey::kCreationTime: key = last.creation_millis; break;
  }
  return EncodeNextToken({{"k", std::move(key)}, {"n", last.name}}, in, now_millis);
}

}  // namespace kiln::api
