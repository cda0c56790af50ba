#include "api/definition_operations.h"

#include <memory>

#include "api/inference_common.h"
#include "store/training_job_repository.h"

namespace kiln::api::inference {
namespace {

using nlohmann::json;

// The state every operation of one kind shares.
struct Definitions {
  EndpointsContext context;
  DefinitionKind kind;
  store::DefinitionRepository repository;
  store::TagRepository tags;
  CreateCheck check_create;
};

JsonOutcome Create(Definitions& d, const json& in) {
  if (auto error = d.check_create(in)) return *error;
  store::DefinitionRecord record;
  record.name = in[d.kind.name_member].get<std::string>();
  record.arn = d.kind.arn(d.context, record.name);
  record.request = in;
  record.request.erase("Tags");  // kept in the tag table
  record.creation_millis = NowMillis(d.context);
  Status inserted = d.repository.Insert(record);
  if (inserted.IsAlreadyExists()) {
    // AWS's text: the SageMaker SDK tests for it and reuses the model (§7).
    return Validation("Cannot create already existing " + std::string(d.kind.noun) + " \"" + inserted.message() +
                      "\".");
  }
  if (!inserted.ok()) return Internal(inserted);
  StoreCreateTags(d.tags, record.arn, in);
  return json{{d.kind.arn_member, record.arn}};
}

JsonOutcome Describe(Definitions& d, const json& in) {
  const std::string name = in[d.kind.name_member].get<std::string>();
  auto record = d.repository.Get(name);
  if (record.status().IsNotFound()) return d.kind.not_found(d.context, name);
  if (!record.ok()) return Internal(record.status());
  return d.kind.render(*record);
}

JsonOutcome List(Definitions& d, const json& in) {
  auto listed = ListDefinitions(d.repository, d.context, in, d.kind.list_member, d.kind.name_member, d.kind.arn_member);
  if (auto* error = std::get_if<aws::AwsError>(&listed)) return *error;
  return std::get<json>(std::move(listed));
}

JsonOutcome Delete(Definitions& d, const json& in) {
  const std::string name = in[d.kind.name_member].get<std::string>();
  Status deleted = d.repository.Delete(name);
  if (deleted.IsNotFound()) return d.kind.not_found(d.context, name);
  if (!deleted.ok()) return Internal(deleted);
  return json::object();
}

}  // namespace

void RegisterDefinitionOperations(JsonService* service, const EndpointsContext& context, const DefinitionKind& kind,
                                  CreateCheck check_create) {
  auto d =
      std::make_shared<Definitions>(Definitions{context, kind, store::DefinitionRepository(context.database, kind.kind),
                                                store::TagRepository(context.database), std::move(check_create)});
  auto add = [&](std::string operation, JsonOutcome (*op)(Definitions&, const json&)) {
    service->Register(std::move(operation), [d, op](const aws::RequestContext&, const json& in) { return op(*d, in); });
  };
  const std::string type = kind.type;
  add("Create" + type, Create);
  add("Describe" + type, Describe);
  add("List" + type + "s", List);
  add("Delete" + type, Delete);
}

}  // namespace kiln::api::inference
