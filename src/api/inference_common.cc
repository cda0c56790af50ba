#include "api/inference_common.h"

#include <algorithm>

#include "api/errors.h"
#include "api/paging.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::api::inference {

using nlohmann::json;

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

aws::AwsError Internal(const Status& status) { return AwsErrorFromStatus(status, ErrorService::kSageMaker); }

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

std::variant<nlohmann::json, aws::AwsError> ListDefinitions(store::DefinitionRepository& repository,
                                                            const EndpointsContext& context, const nlohmann::json& in,
                                                            const char* list_member, const char* name_member,
                                                            const char* arn_member) {
  using nlohmann::json;
  store::ListFilter filter;
  if (Has(in, "NameContains")) filter.name_contains = in["NameContains"].get<std::string>();
  filter.creation_after_millis = TimestampMember(in, "CreationTimeAfter");
  filter.creation_before_millis = TimestampMember(in, "CreationTimeBefore");
  const bool by_name = StringMember(in, "SortBy", "CreationTime") == "Name";
  const int64_t now = NowMillis(context);
  auto parsed = ParseListPaging(in, by_name ? store::ListSortKey::kName : store::ListSortKey::kCreationTime,
                                StringMember(in, "SortOrder", "Descending") == "Descending", now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = std::move(filter);
  auto rows = repository.ListPage(paging.query);
  if (!rows.ok()) return Internal(rows.status());
  std::optional<std::string> next_token = CutPage(*rows, paging, in, now);
  json summaries = json::array();
  for (const auto& r : *rows) {
    summaries.push_back({{name_member, r.name}, {arn_member, r.arn}, {"CreationTime", Seconds(r.creation_millis)}});
  }
  json out = {{list_member, summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

}  // namespace kiln::api::inference
