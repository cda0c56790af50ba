#pragma once
// Internal to api/: helpers shared by models.cc, endpoint_configs.cc and endpoints.cc (ARNs,
// AWS's "not found" texts, timestamps, ListModels/ListEndpointConfigs; the NextToken paging they
// use is api/paging.h). Not a public interface; nothing outside api/ includes it.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "api/endpoints.h"
#include "aws/errors.h"
#include "base/status.h"
#include "store/endpoint_repository.h"
#include "store/training_job_repository.h"

namespace kiln::api::inference {

aws::AwsError Validation(std::string message);
// InternalFailure (500) carrying a store error.
aws::AwsError Internal(const Status& status);

int64_t NowMillis(const EndpointsContext& context);
// Epoch seconds with millisecond fraction, as AWS JSON timestamps are sent (§2.2).
nlohmann::json Seconds(int64_t millis);
// Request timestamps: epoch seconds (integer or fractional) or ISO-8601 (§2.1).
std::optional<int64_t> TimestampMillis(const nlohmann::json& value);
// The value of `member` in `in` as a timestamp, when present.
std::optional<int64_t> TimestampMember(const nlohmann::json& in, const char* member);

// "arn:aws:sagemaker:<region>:<account>:<kind>/<name>", the name as given.
std::string Arn(const EndpointsContext& context, const std::string& kind, const std::string& name);
std::string ModelArn(const EndpointsContext& context, const std::string& name);
std::string EndpointConfigArn(const EndpointsContext& context, const std::string& name);
std::string EndpointArn(const EndpointsContext& context, const std::string& name);

// AWS's texts (§7): Could not find model "<arn>". / endpoint configuration / endpoint.
aws::AwsError ModelNotFound(const EndpointsContext& context, const std::string& name);
aws::AwsError EndpointConfigNotFound(const EndpointsContext& context, const std::string& name);
aws::AwsError EndpointNotFound(const EndpointsContext& context, const std::string& name);

// True when `in[member]` is present and not null (absent and null mean the same, §2.1).
bool Has(const nlohmann::json& in, const char* member);
// `in[member]` when it is a string, else `fallback`.
std::string StringMember(const nlohmann::json& in, const char* member, const std::string& fallback);

// Create* Tags → the tag table (a failure is logged: the resource exists either way).
void StoreCreateTags(store::TagRepository& tags, const std::string& arn, const nlohmann::json& in);

// ListModels / ListEndpointConfigs: NameContains and CreationTime filters, SortBy Name or
// CreationTime (default), SortOrder (default Descending), paging; each summary is
// {<name_member>, <arn_member>, CreationTime} under `list_member`.
std::variant<nlohmann::json, aws::AwsError> ListDefinitions(store::DefinitionRepository& repository,
                                                            const EndpointsContext& context, const nlohmann::json& in,
                                                            const char* list_member, const char* name_member,
                                                            const char* arn_member);

}  // namespace kiln::api::inference
