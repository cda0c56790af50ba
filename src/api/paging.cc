#include "api/paging.h"

#include "api/inference_common.h"

#include "base/encoding.h"
#include "base/hash.h"
#include "base/json_parse.h"

namespace kiln::api {

using inference::Has;
using inference::TimestampMember;

using nlohmann::json;

namespace {

constexpr int64_t kTokenLifetimeMillis = 24LL * 3600 * 1000;

std::string FilterHash(const json& in) {
  json filters = in;
  filters.erase("NextToken");
  filters.erase("MaxResults");
  return Sha256Hex(filters.dump()).substr(0, 16);
}

}  // namespace

std::string EncodeNextToken(const json& cursor, const json& in, int64_t now_millis) {
  json token = {{"c", cursor}, {"f", FilterHash(in)}, {"t", now_millis}};
  return Base64Encode(token.dump());
}

std::optional<json> DecodeNextToken(const std::string& token, const json& in, int64_t now_millis) {
  auto raw = Base64Decode(token);
  if (!raw) return std::nullopt;
  // A token is the client's to send: parsed with bounds, as any request body.
  json parsed = ParseJsonBounded(*raw, {.max_depth = 8}).value_or(json());
  if (!parsed.is_object() || !parsed.contains("c") || !parsed.contains("f") || !parsed["f"].is_string() ||
      parsed["f"].get<std::string>() != FilterHash(in)) {
    return std::nullopt;
  }
  const json& issued = parsed.contains("t") ? parsed["t"] : json(0);
  if (!issued.is_number_integer() || now_millis - issued.get<int64_t>() > kTokenLifetimeMillis) return std::nullopt;
  return parsed["c"];
}

aws::AwsError InvalidNextToken() { return aws::AwsError("ValidationException", "The provided NextToken is invalid."); }

std::variant<ListPaging, aws::AwsError> ParseListPaging(const json& in, store::ListSortKey sort_by, bool descending,
                                                        int64_t now_millis, size_t default_max) {
  ListPaging paging;
  paging.max_results = default_max;
  if (Has(in, "MaxResults") && in["MaxResults"].is_number_integer() && in["MaxResults"].get<int64_t>() >= 0) {
    paging.max_results = in["MaxResults"].get<size_t>();
  }
  paging.query.sort_by = sort_by;
  paging.query.descending = descending;
  paging.query.limit = paging.max_results + 1;
  if (Has(in, "NextToken") && in["NextToken"].is_string()) {
    auto cursor = DecodeNextToken(in["NextToken"].get<std::string>(), in, now_millis);
    if (!cursor || !cursor->is_object() || !cursor->contains("k") || !cursor->contains("n") ||
        !(*cursor)["n"].is_string()) {
      return InvalidNextToken();
    }
    const json& key = (*cursor)["k"];
    store::ListCursor after;
    after.name = (*cursor)["n"].get<std::string>();
    if (sort_by == store::ListSortKey::kCreationTime) {
      if (!key.is_number_integer()) return InvalidNextToken();
      after.key = key.get<int64_t>();
    } else {
      if (!key.is_string()) return InvalidNextToken();
      after.key = key.get<std::string>();
    }
    paging.query.after = std::move(after);
  }
  return paging;
}

store::ListFilter ListFilterFromRequest(const nlohmann::json& in) {
  store::ListFilter query;
  if (Has(in, "NameContains") && in["NameContains"].is_string()) query.name_contains = in["NameContains"];
  if (Has(in, "StatusEquals") && in["StatusEquals"].is_string()) query.status_equals = in["StatusEquals"];
  query.creation_after_millis = TimestampMember(in, "CreationTimeAfter");
  query.creation_before_millis = TimestampMember(in, "CreationTimeBefore");
  query.modified_after_millis = TimestampMember(in, "LastModifiedTimeAfter");
  query.modified_before_millis = TimestampMember(in, "LastModifiedTimeBefore");
  return query;
}

}  // namespace kiln::api
