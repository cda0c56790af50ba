#include "api/inference_common.h"

#include <algorithm>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::api::inference {

using nlohmann::json;

namespace {
constexpr int64_t kTokenLifetimeMillis = 24LL * 3600 * 1000;
}  // namespace

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

aws::AwsError Internal(const Status& status) { return aws::AwsError("InternalFailure", status.ToString(), 500); }

int64_t NowMillis(const EndpointsContext& context) {
  return context.clock ? context.clock->NowMillis() : Clock::System().NowMillis();
}

json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

std::optional<int64_t> TimestampMillis(const json& value) {
  if (value.is_number()) return static_cast<int64_t>(value.get<double>() * 1000.0);
  if (value.is_string()) return ParseIso8601(value.get<std::string>());
  return std::nullopt;
}

std::optional<int64_t> TimestampMember(const json& in, const char* member) {
  if (!Has(in, member)) return std::nullopt;
  return TimestampMillis(in[member]);
}

std::string Arn(const EndpointsContext& context, const std::string& kind, const std::string& name) {
  return "arn:aws:sagemaker:" + context.region + ":" + context.account_id + ":" + kind + "/" + name;
}
std::string ModelArn(const EndpointsContext& context, const std::string& name) { return Arn(context, "model", name); }
std::string EndpointConfigArn(const EndpointsContext& context, const std::string& name) {
  return Arn(context, "endpoint-config", name);
}
std::string EndpointArn(const EndpointsContext& context, const std::string& name) {
  return Arn(context, "endpoint", name);
}

aws::AwsError ModelNotFound(const EndpointsContext& context, const std::string& name) {
  return Validation("Could not find model \"" + ModelArn(context, name) + "\".");
}
aws::AwsError EndpointConfigNotFound(const EndpointsContext& context, const std::string& name) {
  return Validation("Could not find endpoint configuration \"" + EndpointConfigArn(context, name) + "\".");
}
aws::AwsError EndpointNotFound(const EndpointsContext& context, const std::string& name) {
  return Validation("Could not find endpoint \"" + EndpointArn(context, name) + "\".");
}

bool Has(const json& in, const char* member) { return in.is_object() && in.contains(member) && !in[member].is_null(); }

std::string StringMember(const json& in, const char* member, const std::string& fallback) {
  return Has(in, member) && in[member].is_string() ? in[member].get<std::string>() : fallback;
}

void StoreCreateTags(store::TagRepository& tags, const std::string& arn, const json& in) {
  if (!Has(in, "Tags") || !in["Tags"].is_array() || in["Tags"].empty()) return;
  std::vector<store::Tag> list;
  for (const json& t : in["Tags"]) list.push_back({t.value("Key", ""), t.value("Value", "")});
  Status tagged = tags.Add(arn, list);
  if (!tagged.ok()) KLOG(warn, "tags not stored", {{"arn", arn}, {"error", tagged.ToString()}});
}

namespace {

std::string FilterHash(const json& in) {
  json filters = in;
  filters.erase("NextToken");
  filters.erase("MaxResults");
  return Sha256Hex(filters.dump()).substr(0, 16);
}

}  // namespace

std::variant<Page, aws::AwsError> Paginate(std::vector<ListItem> items, const json& in, bool descending,
                                           int64_t now_millis) {
  auto less = [descending](const json& ka, const std::string& na, const json& kb, const std::string& nb) {
    if (ka != kb) return descending ? kb < ka : ka < kb;
    return descending ? ToLower(nb) < ToLower(na) : ToLower(na) < ToLower(nb);
  };
  std::sort(items.begin(), items.end(),
            [&](const ListItem& a, const ListItem& b) { return less(a.key, a.name, b.key, b.name); });
  const std::string filter_hash = FilterHash(in);
  size_t start = 0;
  if (Has(in, "NextToken") && in["NextToken"].is_string()) {
    auto raw = Base64Decode(in["NextToken"].get<std::string>());
    json token = raw ? ParseJsonBounded(*raw, {.max_depth = 8}).value_or(json()) : json();
    if (!token.is_object() || token.value("f", "") != filter_hash || !token.contains("c") ||
        !token["c"].is_object() || !token["c"].contains("k") || !token["c"].contains("n") ||
        !token["c"]["n"].is_string() || now_millis - token.value("t", int64_t{0}) > kTokenLifetimeMillis) {
      return Validation("The provided NextToken is invalid.");
    }
    const json key = token["c"]["k"];
    const std::string last = token["c"]["n"];
    while (start < items.size() && !less(key, last, items[start].key, items[start].name)) ++start;
  }
  const size_t max_results = Has(in, "MaxResults") ? in["MaxResults"].get<size_t>() : 10;
  const size_t end = std::min(items.size(), start + max_results);
  Page page;
  for (size_t i = start; i < end; ++i) page.indices.push_back(items[i].index);
  if (end < items.size() && end > start) {
    json token = {{"c", {{"k", items[end - 1].key}, {"n", items[end - 1].name}}}, {"f", filter_hash}, {"t", now_millis}};
    page.next_token = Base64Encode(token.dump());
  }
  return page;
}

std::variant<nlohmann::json, aws::AwsError> ListDefinitions(store::DefinitionRepository& repository,
                                                            const EndpointsContext& context,
                                                            const nlohmann::json& in, const char* list_member,
                                                            const char* name_member, const char* arn_member) {
  using nlohmann::json;
  store::DefinitionListQuery query;
  if (Has(in, "NameContains")) query.name_contains = in["NameContains"].get<std::string>();
  query.creation_after_millis = TimestampMember(in, "CreationTimeAfter");
  query.creation_before_millis = TimestampMember(in, "CreationTimeBefore");
  auto rows = repository.List(query);
  if (!rows.ok()) return Internal(rows.status());
  const bool by_name = StringMember(in, "SortBy", "CreationTime") == "Name";
  std::vector<ListItem> items;
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& r = (*rows)[i];
    items.push_back({by_name ? json(ToLower(r.name)) : json(r.creation_millis), r.name, i});
  }
  auto paged = Paginate(std::move(items), in, StringMember(in, "SortOrder", "Descending") == "Descending",
                        NowMillis(context));
  if (auto* error = std::get_if<aws::AwsError>(&paged)) return *error;
  const Page& page = std::get<Page>(paged);
  json summaries = json::array();
  for (size_t i : page.indices) {
    const auto& r = (*rows)[i];
    summaries.push_back({{name_member, r.name}, {arn_member, r.arn}, {"CreationTime", Seconds(r.creation_millis)}});
  }
  json out = {{list_member, summaries}};
  if (page.next_token) out["NextToken"] = *page.next_token;
  return out;
}

}  // namespace kiln::api::inference
