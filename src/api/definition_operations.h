#pragma once
// Internal to api/: the Create/Describe/List/Delete operations of a definition resource (a name,
// an ARN and the request kept as given: models, endpoint configurations), written once and
// registered for each kind with its own names, AWS texts and rendering. Nothing outside api/
// includes it.

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/endpoints.h"
#include "api/json_service.h"
#include "aws/errors.h"
#include "store/endpoint_repository.h"

namespace kiln::api::inference {

struct DefinitionKind {
  store::DefinitionRepository::Kind kind;
  // The operations are Create<type>, Describe<type>, List<type>s and Delete<type>.
  const char* type;         // "Model"
  const char* name_member;  // "ModelName"
  const char* arn_member;   // "ModelArn"
  const char* list_member;  // "Models"
  // AWS's AlreadyExists text names it: Cannot create already existing <noun> "<name>".
  const char* noun;  // "model"
  std::string (*arn)(const EndpointsContext& context, const std::string& name);
  aws::AwsError (*not_found)(const EndpointsContext& context, const std::string& name);
  nlohmann::json (*render)(const store::DefinitionRecord& record);
};

// The checks of a Create request that the service model cannot express; the first failure.
using CreateCheck = std::function<std::optional<aws::AwsError>(const nlohmann::json& in)>;

// Registers the four operations of `kind`. Create runs `check_create`, keeps the request without
// its Tags (those go to the tag table) and answers {<arn_member>}; Describe answers render(record);
// Delete is allowed while endpoints use the definition (their deployments hold a copy, §8.3/§8.4).
void RegisterDefinitionOperations(JsonService* service, const EndpointsContext& context, const DefinitionKind& kind,
                                  CreateCheck check_create);

}  // namespace kiln::api::inference
