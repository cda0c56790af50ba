// Fuzzes the JSON protocol path through the front door (src/api/front_door.cc → JsonService →
// ServiceModel validation → the real handlers): one api::FrontDoor::Handle call per input, on a
// front door wired like the server's (SageMaker with the embedded service model and the
// training-job, tag, model, endpoint-config and endpoint operations; CloudWatch Logs), over a
// SQLite database and a log store restored before every input to hold training job "job-1",
// model "model-1", endpoint configuration "config-1", endpoint "endpoint-1" and the log stream
// "job-1/algo-1-1714557600" so that Describe/Update/Delete/tag requests reach existing rows.
//
// Input layout: first line = the X-Amz-Target header ("SageMaker.ListTrainingJobs",
// "Logs_20140328.PutLogEvents"); the rest = the request body. POST /, unsigned (listener auth
// "off"), Content-Type application/x-amz-json-1.1. Seeds in corpus/json_protocol_fuzzer/ are
// written by make_api_seeds.py; json_protocol_fuzzer.dict lists operation and member names.
//
// Not reached: CreateTrainingJob and StopTrainingJob hand the job to the training controller,
// which launches processes; here they are replaced by handlers that answer {} once the model has
// validated the request (so the validation, not the controller, is fuzzed for those two).
//
// Checks besides "no crash, no sanitizer report":
//   - a response is always finished, with a status in 200..599 and never 500 (InternalFailure
//     means a handler threw or nothing answered: a Kiln bug, whatever the input);
//   - the body is a JSON object; an error carries a string __type and its status is 4xx;
//   - a SageMaker request answered 200 re-validates after a parse → dump → parse round trip.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/endpoints.h"
#include "api/front_door.h"
#include "api/json_service.h"
#include "api/logs.h"
#include "api/service_model.h"
#include "api/training_jobs.h"
#include "aws/credentials.h"
#include "base/io.h"
#include "base/json_parse.h"
#include "base/time.h"
#include "control/endpoint_notifier.h"
#include "control/instance_catalog.h"
#include "fuzz_support.h"
#include "net/test_util/fake_response_writer.h"
#include "objects/s3api/s3_api.h"
#include "objects/s3api/test_util/fake_object_store.h"
#include "observe/log_store.h"
#include "store/database.h"
#include "store/training_job_repository.h"

namespace {

using kiln::fuzz::Check;
using nlohmann::json;

class NoCredentials : public kiln::aws::CredentialProvider {
 public:
  std::optional<kiln::aws::Credential> Lookup(std::string_view) const override { return std::nullopt; }
};

class NullNotifier : public kiln::control::EndpointNotifier {
 public:
  void EndpointChanged(const std::string&) override {}
};

class FixedClock : public kiln::Clock {
 public:
  int64_t NowMillis() const override { return 1714557600000; }
};

const kiln::control::InstanceCatalog& Catalog() {
  static const kiln::control::InstanceCatalog catalog = [] {
    auto c = kiln::control::InstanceCatalog::FromJson(json::parse(R"([
      {"type": "ml.m5.large", "vcpus": 2, "memory_gib": 8, "hosting": true},
      {"type": "ml.t2.medium", "vcpus": 2, "memory_gib": 4, "hosting": true}])"));
    Check(c.ok());
    return std::move(c).value();
  }();
  return catalog;
}

// Everything one input runs against; the same state at the start of every input, so that a crash
// replays from its input alone.
struct World {
  kiln::fuzz::ScratchDir dir;
  kiln::store::Database* db = &kiln::fuzz::SharedDatabase();
  std::unique_ptr<kiln::observe::LogStore> logs;
  kiln::objects::FakeObjectStore objects;
  std::unique_ptr<kiln::objects::S3Api> s3;
  NoCredentials credentials;
  NullNotifier notifier;
  FixedClock clock;
  std::unique_ptr<kiln::api::FrontDoor> door;

  World() {
    s3 = std::make_unique<kiln::objects::S3Api>(kiln::objects::S3ApiOptions{}, &objects);
    kiln::api::FrontDoorOptions options;
    options.auth_enabled = false;
    door = std::make_unique<kiln::api::FrontDoor>(options, &credentials, s3.get());

    auto sagemaker = std::make_unique<kiln::api::JsonService>("SageMaker", "sagemaker", kiln::aws::Protocol::kJson11);
    sagemaker->SetModel(kiln::api::ServiceModel::SageMaker());
    kiln::api::TrainingJobsContext training;
    training.database = db;
    training.account_id = "000000000000";
    training.region = "us-east-1";
    training.clock = &clock;
    kiln::api::RegisterTrainingJobOperations(sagemaker.get(), training);
    // These two call the training controller (see the header comment).
    auto validated_only = [](const kiln::aws::RequestContext&, const json&) -> kiln::api::JsonOutcome {
      return json::object();
    };
    sagemaker->Register("CreateTrainingJob", validated_only);
    sagemaker->Register("StopTrainingJob", validated_only);
    kiln::api::EndpointsContext endpoints;
    endpoints.database = db;
    endpoints.notifier = &notifier;
    endpoints.catalog = &Catalog();
    endpoints.account_id = "000000000000";
    endpoints.region = "us-east-1";
    endpoints.clock = &clock;
    kiln::api::RegisterInferenceOperations(sagemaker.get(), endpoints);
    // The database and the log files start as Populate left them the first time.
    static kiln::fuzz::ScratchDir* logs_template = new kiln::fuzz::ScratchDir();
    kiln::fuzz::RestoreDatabase([&](kiln::store::Database&) {
      Populate(*sagemaker);
      auto store = kiln::observe::LogStore::Open({logs_template->path() + "/logs", db, &clock});
      Check(store.ok());
      Check((*store)->CreateGroup("/aws/sagemaker/TrainingJobs").ok());
      Check((*store)->CreateStream("/aws/sagemaker/TrainingJobs", "job-1/algo-1-1714557600").ok());
      Check(
          (*store)
              ->Append("/aws/sagemaker/TrainingJobs", "job-1/algo-1-1714557600", {{1714557600000, "epoch 1 loss=0.5"}})
              .ok());
    });
    std::filesystem::copy(logs_template->path() + "/logs", dir.path() + "/logs",
                          std::filesystem::copy_options::recursive);
    auto opened = kiln::observe::LogStore::Open({dir.path() + "/logs", db, &clock});
    Check(opened.ok());
    logs = std::move(opened).value();
    door->AddJsonService(std::move(sagemaker));

    auto logs_service = std::make_unique<kiln::api::JsonService>("Logs_20140328", "logs", kiln::aws::Protocol::kJson11);
    kiln::api::RegisterLogsOperations(logs_service.get(), logs.get(), "000000000000", "us-east-1");
    door->AddJsonService(std::move(logs_service));
  }

  // Resources the requests can name: training job "job-1" (a row as the API writes it), model
  // "model-1", endpoint configuration "config-1", endpoint "endpoint-1".
  void Populate(const kiln::api::JsonService& sagemaker) {
    kiln::store::TrainingJobRecord job;
    job.name = "job-1";
    job.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/job-1";
    job.request = json::parse(R"({
      "TrainingJobName": "job-1", "RoleArn": "arn:aws:iam::000000000000:role/r",
      "AlgorithmSpecification": {"TrainingImage": "local:/bin/true", "TrainingInputMode": "File"},
      "OutputDataConfig": {"S3OutputPath": "s3://b/out/"},
      "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
      "StoppingCondition": {"MaxRuntimeInSeconds": 3600}})");
    job.status = kiln::store::TrainingJobStatus::kInProgress;
    job.secondary_status = kiln::store::SecondaryStatus::kTraining;
    job.creation_millis = job.last_modified_millis = 1714557600000;
    job.state.phase = kiln::store::TrainingPhase::kRunning;
    kiln::store::TrainingJobRepository jobs(db);
    Check(jobs.Insert(job).ok());
    kiln::aws::RequestContext context;
    context.request_id = "populate";
    auto call = [&](std::string_view operation, std::string_view body) {
      Check(sagemaker.Handle(context, operation, body).status == 200);
    };
    call("CreateModel", R"({"ModelName": "model-1", "ExecutionRoleArn": "arn:aws:iam::000000000000:role/r",
                            "PrimaryContainer": {"Image": "local:/bin/serve", "ModelDataUrl": "s3://b/model.tar.gz"}})");
    call("CreateEndpointConfig", R"({"EndpointConfigName": "config-1", "ProductionVariants": [
                                     {"VariantName": "v1", "ModelName": "model-1", "InstanceType": "ml.m5.large",
                                      "InitialInstanceCount": 1}]})");
    call("CreateEndpoint", R"({"EndpointName": "endpoint-1", "EndpointConfigName": "config-1"})");
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::QuietLogs();
  (void)kiln::api::ServiceModel::SageMaker();  // parse the embedded model once, outside the runs
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto [target, body] = kiln::fuzz::FirstLine(input);

  kiln::net::HttpRequest request;
  request.method = "POST";
  request.target = request.raw_path = "/";
  request.headers.emplace("Host", "localhost:5456");
  request.headers.emplace("X-Amz-Target", std::string(target));
  request.headers.emplace("Content-Type", "application/x-amz-json-1.1");
  request.headers.emplace("Content-Length", std::to_string(body.size()));
  request.remote_address = "127.0.0.1:40000";
  kiln::StringByteSource source(body);
  request.body = &source;

  World world;
  kiln::net::FakeResponseWriter writer;
  world.door->Handle(request, writer);

  if (kiln::fuzz::Debug()) std::fprintf(stderr, "%d %s\n", writer.status(), writer.body().substr(0, 2000).c_str());
  Check(writer.finished());
  Check(writer.status() >= 200 && writer.status() <= 599);
  Check(writer.status() != 500);
  json answer = json::parse(writer.body(), nullptr, /*allow_exceptions=*/false);
  Check(answer.is_object());
  if (writer.status() != 200) {
    Check(writer.status() >= 400 && writer.status() < 500);
    Check(answer.contains("__type") && answer["__type"].is_string());
    return 0;
  }

  // An accepted SageMaker request is still valid after a round trip through the DOM.
  size_t dot = target.rfind('.');
  if (dot == std::string_view::npos || target.substr(0, dot) != "SageMaker") return 0;
  std::string_view operation = target.substr(dot + 1);
  if (body.empty()) return 0;
  auto parsed = kiln::ParseJsonBounded(body);
  if (!parsed.ok()) return 0;  // the service's own limits may differ from the defaults
  auto reparsed = kiln::ParseJsonBounded(parsed->dump());
  Check(reparsed.ok());
  if (*reparsed != *parsed) return 0;  // e.g. 1e999 parses to inf and dumps as null
  Check(!kiln::api::ServiceModel::SageMaker()->ValidateInput(operation, *reparsed).has_value());
  return 0;
}
