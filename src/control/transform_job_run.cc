#include "control/transform_job_run.h"

#include "serving/pipeline.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>

#include "agent/transfer.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/transform_instances.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using serving::BatchStrategy;

// The ContainerDefinition the job runs (the API admits one container).
json ContainerOf(const json& model) {
  if (model.contains("PrimaryContainer")) return model["PrimaryContainer"];
  if (model.contains("Containers") && model["Containers"].is_array() && !model["Containers"].empty()) {
    return model["Containers"][0];
  }
  return json::object();
}

std::string StringOf(const json& object, const char* member, const std::string& fallback = "") {
  auto it = object.find(member);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

Result<std::string> ReadAll(ByteSource& source) {
  std::string out;
  if (auto size = source.size_hint()) out.reserve(*size);
  char buffer[1 << 16];
  while (true) {
    ASSIGN_OR_RETURN(size_t n, source.Read(buffer, sizeof(buffer)));
    if (n == 0) break;
    out.append(buffer, n);
  }
  return out;
}

std::string Truncated(std::string text, size_t limit) {
  if (text.size() > limit) text = text.substr(0, limit) + "...";
  return text;
}

}  // namespace

// One instance and the objects it transforms.
struct TransformJobRun::Worker {
  std::shared_ptr<EndpointInstance> instance;
  std::string host;
  uint16_t port = 0;
  // An inference pipeline's containers in order (serving-contract.md §8.2, §13): each record batch
  // goes through all of them. Empty for a single-container model.
  std::vector<serving::ContainerTarget> chain;
  std::string log_stream;  // <job>/<instance-id>-<epoch seconds>
  serving::TransformParameters params;
  std::vector<agent::SelectedObject> objects;
  std::thread thread;
  // Shared by its sender threads (Transform).
  std::mutex mutex;
  std::condition_variable changed;                            // an object was read, or reading one ended
  size_t next_object = 0;                                     // GUARDED_BY(mutex)
  bool preparing = false;                                     // a sender is reading an object; GUARDED_BY(mutex)
  std::deque<std::shared_ptr<Pending>> open;                  // objects with batches to send; GUARDED_BY(mutex)
  std::vector<std::pair<std::string, std::string>> failures;  // (object URI, why); GUARDED_BY(mutex)
  size_t succeeded = 0;                                       // GUARDED_BY(mutex)
};

TransformJobRun::TransformJobRun(Context context, std::string name) : context_(context), name_(std::move(name)) {}

TransformJobRun::~TransformJobRun() { Join(); }

void TransformJobRun::Start() {
  thread_ = std::thread([this] { Run(); });
}

void TransformJobRun::RequestStop() {
  stop_requested_ = true;
  cancel_.Cancel("the transform job was stopped");
}

void TransformJobRun::Shutdown() {
  shutting_down_ = true;
  cancel_.Cancel("the server is shutting down");
}

void TransformJobRun::Join() {
  if (thread_.joinable()) thread_.join();
}

int64_t TransformJobRun::Now() const {
  return context_.deps->clock ? context_.deps->clock->NowMillis() : Clock::System().NowMillis();
}

void TransformJobRun::Run() {
  auto record = context_.jobs->Get(name_);
  if (!record.ok() || !store::IsActive(record->status)) {
    finished_ = true;
    return;
  }
  if (record->status == store::TransformJobStatus::kStopping) stop_requested_ = true;
  request_ = record->request;
  const int64_t start = Now();
  (void)context_.jobs->Mutate(name_, [&](store::TransformJobRecord& r) {
    r.state.start_millis = start;
    r.last_modified_millis = start;
    return Status::Ok();
  });

  std::string failure;
  Status launched = LaunchInstances(*record);
  if (!launched.ok()) failure = launched.message();
  if (failure.empty() && !stop_requested_ && !shutting_down_) {
    Status healthy = WaitHealthy();
    if (!healthy.ok()) failure = healthy.message();
  }
  if (failure.empty() && !stop_requested_ && !shutting_down_) {
    // Inputs, assigned round-robin in key order.
    json channel = {{"ChannelName", "TransformInput"}, {"DataSource", request_["TransformInput"]["DataSource"]}};
    auto selected = agent::SelectChannelObjects(*context_.deps->object_store, channel, role_arn_);
    if (!selected.ok()) {
      failure = selected.status().message();
    } else {
      for (size_t i = 0; i < selected->size(); ++i) {
        workers_[i % workers_.size()]->objects.push_back((*selected)[i]);
      }
      for (auto& worker : workers_) {
        Worker* w = worker.get();
        w->thread = std::thread([this, w] { Transform(*w); });
      }
      size_t failed = 0;
      std::string first;
      for (auto& worker : workers_) {
        worker->thread.join();
        failed += worker->failures.size();
      }
      // The first failure in input order (object i is on worker i mod N, at position i / N).
      for (size_t i = 0; i < selected->size() && first.empty(); ++i) {
        const Worker& w = *workers_[i % workers_.size()];
        const std::string uri = "s3://" + (*selected)[i].bucket + "/" + (*selected)[i].key;
        for (const auto& [object, why] : w.failures) {
          if (object == uri) {
            first = "ClientError: " + uri + ": " + why;
            break;
          }
        }
      }
      if (failed > 0) {
        failure = first.empty() ? "ClientError: an input object failed" : first;
        if (failed > 1) {
          failure += " (" + std::to_string(failed) + " of " + std::to_string(selected->size()) +
                     " input objects failed; see the data-log streams)";
        }
      }
    }
  }
  if (shutting_down_) {
    StopInstances(/*detach=*/true);
    finished_ = true;
    return;
  }
  StopInstances(/*detach=*/false);
  Finish(failure);
  finished_ = true;
}

Status TransformJobRun::LaunchInstances(const store::TransformJobRecord& record) {
  const json& model = record.state.model;
  container_ = ContainerOf(model);
  // An inference pipeline (a Serial model with several containers, §8.2's last line): every
  // container on every instance, the job's environment in each.
  std::vector<json> pipeline;
  if (model.contains("Containers") && model["Containers"].is_array() && model["Containers"].size() > 1) {
    for (const json& c : model["Containers"]) pipeline.push_back(c);
  }
  role_arn_ = StringOf(model, "ExecutionRoleArn");
  // §4.1: the job's Environment over the model's, then the batch variables.
  json env = container_.contains("Environment") && container_["Environment"].is_object() ? container_["Environment"]
                                                                                         : json::object();
  if (request_.contains("Environment") && request_["Environment"].is_object()) {
    for (const auto& [key, value] : request_["Environment"].items()) env[key] = value;
  }
  env["SAGEMAKER_BATCH"] = "true";
  if (request_.contains("MaxPayloadInMB")) env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] = request_["MaxPayloadInMB"].dump();
  if (request_.contains("BatchStrategy")) {
    env["SAGEMAKER_BATCH_STRATEGY"] =
        StringOf(request_, "BatchStrategy") == "SingleRecord" ? "SINGLE_RECORD" : "MULTI_RECORD";
  }
  if (request_.contains("MaxConcurrentTransforms")) {
    env["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] = request_["MaxConcurrentTransforms"].dump();
  }
  container_["Environment"] = env;
  for (json& c : pipeline) {
    // Each container's own variables, then (winning) the job's and the batch variables.
    json merged = c.contains("Environment") && c["Environment"].is_object() ? c["Environment"] : json::object();
    if (request_.contains("Environment") && request_["Environment"].is_object()) {
      for (const auto& [key, value] : request_["Environment"].items()) merged[key] = value;
    }
    for (const char* key : {"SAGEMAKER_BATCH", "SAGEMAKER_MAX_PAYLOAD_IN_MB", "SAGEMAKER_BATCH_STRATEGY",
                            "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"}) {
      if (env.contains(key)) merged[key] = env[key];
    }
    c["Environment"] = merged;
  }

  // What the requests need (read by the workers).
  const json& input = request_["TransformInput"];
  const json output = request_.value("TransformOutput", json::object());
  split_ = serving::ParseSplitType(StringOf(input, "SplitType", "None")).value_or(serving::SplitType::kNone);
  gzip_ = StringOf(input, "CompressionType", "None") == "Gzip";
  content_type_ = StringOf(input, "ContentType");
  accept_ = StringOf(output, "Accept");
  assemble_ =
      StringOf(output, "AssembleWith", "None") == "Line" ? serving::AssembleWith::kLine : serving::AssembleWith::kNone;
  input_format_ = serving::FormatOfContentType(content_type_);
  output_format_ = serving::FormatOfContentType(accept_);
  const json processing = request_.value("DataProcessing", json::object());
  if (auto f = serving::JsonPath::Parse(StringOf(processing, "InputFilter", "$")); f.ok() && !f->identity()) {
    input_filter_ = std::move(*f);
  }
  if (auto f = serving::JsonPath::Parse(StringOf(processing, "OutputFilter", "$")); f.ok() && !f->identity()) {
    output_filter_ = std::move(*f);
  }
  join_ = StringOf(processing, "JoinSource", "None") == "Input";
  const json client_config = request_.value("ModelClientConfig", json::object());
  timeout_seconds_ = client_config.value("InvocationsTimeoutInSeconds", 600);
  max_retries_ = client_config.value("InvocationsMaxRetries", 3);
  auto out_location = agent::ParseS3Uri(StringOf(output, "S3OutputPath"));
  if (!out_location.ok()) return out_location.status();
  output_bucket_ = out_location->bucket;
  output_prefix_ = out_location->key;

  credential_ = context_.deps->credentials->Issue(role_arn_, name_);
  context_.deps->credentials->Register(credential_);
  const json& resources = request_["TransformResources"];
  const int count = resources.value("InstanceCount", 1);
  network_ = "transform-" + name_;
  const bool isolated = model.value("EnableNetworkIsolation", false);
  const std::string epoch = std::to_string(Now() / 1000);
  for (int i = 0; i < count; ++i) {
    EndpointInstance::Spec spec;
    spec.endpoint_name = name_;
    spec.instance_id = "i-" + RandomHex(9).substr(0, 17);
    spec.runtime_id = "transform-" + name_ + "-" + spec.instance_id;
    spec.variant = name_;
    spec.model_name = StringOf(model, "ModelName", StringOf(request_, "ModelName"));
    spec.instance_type = StringOf(resources, "InstanceType");
    spec.container = pipeline.empty() ? container_ : pipeline[0];
    spec.containers = pipeline;
    spec.credential = credential_;
    spec.dir = context_.options->work_dir + "/" + name_ + "/" + spec.instance_id;
    spec.log_group = kTransformLogGroup;
    spec.log_stream = name_ + "/" + spec.instance_id + "-" + epoch;
    spec.metrics = InstanceMetricsTarget{spec.runtime_id,
                                         kTransformMetricsNamespace,
                                         {{{"Host", name_ + "/" + spec.instance_id}}},
                                         spec.dir + "/opt_ml"};
    auto worker = std::make_unique<Worker>();
    worker->log_stream = spec.log_stream;
    worker->instance = StandaloneInstances::New(*context_.deps->endpoints, std::move(spec), network_, isolated, [] {});
    if (!worker->instance) {
      return Status::Unavailable("InternalServerError: no free port block for a transform instance");
    }
    // Started at once: a created instance holds a port block or a lease until its thread ends.
    worker->instance->Start();
    worker->host = worker->instance->target()->host;
    worker->port = worker->instance->target()->port;
    worker->chain = worker->instance->target()->containers;
    (void)context_.deps->log_store->CreateGroup(kTransformLogGroup);
    (void)context_.deps->log_store->CreateStream(kTransformLogGroup, worker->log_stream + "/data-log");
    workers_.push_back(std::move(worker));
  }
  KLOG(info, "transform job launched", {{"job", name_}, {"instances", std::to_string(count)}});
  return Status::Ok();
}

Status TransformJobRun::WaitHealthy() {
  while (!stop_requested_ && !shutting_down_) {
    bool all = true;
    for (auto& worker : workers_) {
      if (worker->instance->failed()) return Status::FailedPrecondition(worker->instance->failure_reason());
      all = all && worker->instance->healthy();
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // §13.1 step 2, per container.
  for (auto& worker : workers_) {
    if (stop_requested_ || shutting_down_) break;
    net::ClientRequest request;
    request.method = "GET";
    request.target = "/execution-parameters";
    request.cancel = &cancel_;
    json answer;
    auto response =
        context_.client->Send(worker->host, worker->port, request, {.connect_ms = 2000, .response_ms = 5000});
    if (response.ok() && response->status == 200) answer = json::parse(response->body, nullptr, false);
    if (answer.is_discarded()) answer = json();
    worker->params = serving::ResolveTransformParameters(request_, answer);
    KLOG(info, "transform instance parameters",
         {{"job", name_},
          {"instance", worker->instance->spec().instance_id},
          {"max_concurrent", std::to_string(worker->params.max_concurrent)},
          {"max_payload_mb", std::to_string(worker->params.max_payload_mb)},
          {"strategy", worker->params.strategy == BatchStrategy::kMultiRecord ? "MultiRecord" : "SingleRecord"}});
  }
  return Status::Ok();
}

void TransformJobRun::DataLog(Worker& worker, const std::string& line) {
  (void)context_.deps->log_store->Append(kTransformLogGroup, worker.log_stream + "/data-log", {{Now(), line}});
}

// One input object between its read and its output: its bytes, records, batches and responses.
// `next_batch`, `remaining`, `failed` and `error` are guarded by the worker's mutex; the rest is
// written before the object is shared and read-only after (responses: each slot by its sender).
struct TransformJobRun::Pending {
  const agent::SelectedObject* object = nullptr;
  std::string uri;
  std::string data;  // decompressed; the records view it
  std::vector<serving::Record> records;
  std::vector<std::string> filtered;  // InputFilter results (with their line break), when filtering
  std::vector<serving::BatchRange> batches;
  std::vector<std::string> responses;
  bool binary_single = false;  // SingleRecord of RecordIO/TFRecord: payloads, not frames
  size_t next_batch = 0;
  size_t remaining = 0;
  bool failed = false;
  std::string error;

  std::string_view Piece(size_t i) const {
    if (!filtered.empty()) return filtered[i];
    return binary_single ? records[i].payload() : records[i].framed;
  }
};

// MaxConcurrentTransforms sender threads per instance share its objects: each takes the next batch
// of the oldest object that has one, reading the next object itself when none has (so at most
// that many objects plus one are held at once), and the thread that finishes an object's last
// batch assembles and writes it. Requests stay in flight across object boundaries.
void TransformJobRun::Transform(Worker& worker) {
  const size_t threads = std::max(1, worker.params.max_concurrent);
  std::vector<std::thread> senders;
  for (size_t t = 1; t < threads; ++t) senders.emplace_back([this, &worker] { SendLoop(worker); });
  SendLoop(worker);
  for (auto& t : senders) t.join();
}

void TransformJobRun::SendLoop(Worker& worker) {
  std::unique_lock<std::mutex> lock(worker.mutex);
  while (true) {
    if (stop_requested_ || shutting_down_) return;
    // The next batch of the oldest open object.
    std::shared_ptr<Pending> pending;
    size_t batch = 0;
    while (!worker.open.empty()) {
      auto& front = worker.open.front();
      if (front->failed || front->next_batch >= front->batches.size()) {
        worker.open.pop_front();
        continue;
      }
      pending = front;
      batch = front->next_batch++;
      break;
    }
    if (!pending) {
      if (worker.next_object < worker.objects.size() && !worker.preparing) {
        worker.preparing = true;
        const agent::SelectedObject& object = worker.objects[worker.next_object++];
        lock.unlock();
        std::shared_ptr<Pending> prepared = Prepare(worker, object);
        const bool finished = prepared->failed || prepared->batches.empty();
        if (finished) Complete(worker, *prepared);
        lock.lock();
        worker.preparing = false;
        if (!finished) worker.open.push_back(std::move(prepared));
        worker.changed.notify_all();
        continue;
      }
      if (worker.next_object >= worker.objects.size() && !worker.preparing) return;  // nothing left
      worker.changed.wait(lock);
      continue;
    }
    lock.unlock();
    const serving::BatchRange range = pending->batches[batch];
    std::string body;
    for (size_t i = range.first; i < range.first + range.count; ++i) body.append(pending->Piece(i));
    auto response = Send(worker, body, range.first, range.count);
    lock.lock();
    if (response.ok()) {
      pending->responses[batch] = std::move(*response);
    } else if (!pending->failed) {
      // No more of its batches go out; the ones in flight still count down.
      pending->failed = true;
      pending->error = response.status().message();
      pending->remaining -= pending->batches.size() - pending->next_batch;
      pending->next_batch = pending->batches.size();
    }
    if (--pending->remaining == 0) {
      lock.unlock();
      Complete(worker, *pending);
      lock.lock();
    }
  }
}

std::shared_ptr<TransformJobRun::Pending> TransformJobRun::Prepare(Worker& worker,
                                                                   const agent::SelectedObject& object) {
  auto out = std::make_shared<Pending>();
  out->object = &object;
  out->uri = "s3://" + object.bucket + "/" + object.key;
  const auto fail = [&](std::string why) {
    out->failed = true;
    out->error = std::move(why);
    return out;
  };
  if (worker.instance->failed()) {
    return fail("the instance " + worker.instance->spec().instance_id +
                " failed: " + worker.instance->failure_reason());
  }
  // The whole object, decompressed (records and responses are held in memory while in flight).
  auto reader = context_.deps->object_store->GetObject(object.bucket, object.key, std::nullopt);
  if (!reader.ok()) {
    return fail(agent::ObjectError(reader.status(), "Reading the input object", object.bucket, object.key).message());
  }
  const auto read = [&]() -> Result<std::string> {
    if (!gzip_) return ReadAll(**reader);
    agent::GzipSource gunzip(**reader, out->uri);
    return ReadAll(gunzip);
  };
  Result<std::string> data = read();
  if (!data.ok()) return fail("reading it failed: " + data.status().message());
  out->data = std::move(*data);
  auto split = serving::SplitRecords(out->data, split_);
  if (!split.ok()) return fail(split.status().message());
  out->records = std::move(*split);
  if (join_ && split_ != serving::SplitType::kLine) {
    return fail("JoinSource Input requires SplitType Line (each output record is joined with its input line)");
  }
  // What each record adds to a request body: its framing kept for MultiRecord and for lines, the
  // binary framing removed for SingleRecord; an InputFilter rewrites a record's text.
  const bool binary = split_ == serving::SplitType::kRecordIO || split_ == serving::SplitType::kTFRecord;
  out->binary_single = binary && worker.params.strategy == BatchStrategy::kSingleRecord;
  std::vector<size_t> sizes;
  sizes.reserve(out->records.size());
  if (input_filter_) {
    out->filtered.reserve(out->records.size());
    for (size_t i = 0; i < out->records.size(); ++i) {
      const serving::Record& r = out->records[i];
      auto text = serving::ApplyFilter(*input_filter_, r.payload(), input_format_);
      if (!text.ok()) return fail("record " + std::to_string(i + 1) + ": " + text.status().message());
      if (split_ == serving::SplitType::kLine && r.framed.size() > r.payload().size()) text->push_back('\n');
      out->filtered.push_back(std::move(*text));
      sizes.push_back(out->filtered.back().size());
    }
  } else {
    for (size_t i = 0; i < out->records.size(); ++i) sizes.push_back(out->Piece(i).size());
  }
  auto batches = serving::PlanBatches(sizes, worker.params.strategy, worker.params.max_payload_bytes());
  if (!batches.ok()) return fail(batches.status().message());
  out->batches = std::move(*batches);
  out->responses.resize(out->batches.size());
  out->remaining = out->batches.size();
  return out;
}

void TransformJobRun::Complete(Worker& worker, Pending& pending) {
  if (stop_requested_ || shutting_down_) return;  // a stopped job's objects are neither done nor failed
  std::string error = pending.failed ? pending.error : "";
  if (error.empty()) error = Assemble(pending);
  std::lock_guard<std::mutex> lock(worker.mutex);
  if (error.empty()) {
    ++worker.succeeded;
    DataLog(worker, pending.uri + ": Completed, written to s3://" + output_bucket_ + "/" +
                        serving::TransformOutputKey(output_prefix_, pending.object->rel_path));
  } else {
    worker.failures.emplace_back(pending.uri, error);
    DataLog(worker, pending.uri + ": Failed: " + error);
  }
}

// Joins/filters and assembles the responses, then writes the output object. "" or the error.
std::string TransformJobRun::Assemble(Pending& pending) {
  std::string assembled;
  if (join_ || output_filter_) {
    const serving::RecordFormat joined_format = join_ ? input_format_ : output_format_;
    for (size_t b = 0; b < pending.batches.size(); ++b) {
      const serving::BatchRange& range = pending.batches[b];
      auto outputs = serving::SplitResponse(pending.responses[b], range.count);
      if (!outputs.ok()) {
        return "records " + std::to_string(range.first + 1) + "-" + std::to_string(range.first + range.count) + ": " +
               outputs.status().message();
      }
      for (size_t k = 0; k < range.count; ++k) {
        std::string record = std::move((*outputs)[k]);
        if (join_) {
          auto joined = serving::JoinRecord(pending.records[range.first + k].payload(), record, input_format_);
          if (!joined.ok()) return "record " + std::to_string(range.first + k + 1) + ": " + joined.status().message();
          record = std::move(*joined);
        }
        if (output_filter_) {
          auto kept = serving::ApplyFilter(*output_filter_, record, joined_format);
          if (!kept.ok()) return "record " + std::to_string(range.first + k + 1) + ": " + kept.status().message();
          record = std::move(*kept);
        }
        assembled += record;
        assembled.push_back('\n');
      }
    }
  } else {
    for (const std::string& body : pending.responses) serving::AppendAssembled(assembled, body, assemble_);
  }
  const std::string key = serving::TransformOutputKey(output_prefix_, pending.object->rel_path);
  StringByteSource source(assembled);
  objects::PutOptions put;
  if (!accept_.empty()) put.headers["content-type"] = accept_;
  auto written = context_.deps->object_store->PutObject(output_bucket_, key, source, put);
  if (!written.ok()) {
    return agent::ObjectError(written.status(), "Writing the output object", output_bucket_, key).message();
  }
  return "";
}

Result<std::string> TransformJobRun::Send(Worker& worker, const std::string& body, size_t first_record, size_t count) {
  HeaderMap headers;
  if (!content_type_.empty()) headers.emplace("Content-Type", content_type_);
  if (!accept_.empty()) headers.emplace("Accept", accept_);
  net::ClientRequest request;
  request.method = "POST";
  request.target = "/invocations";
  request.headers = &headers;
  request.body = body;
  request.cancel = &cancel_;
  net::ClientTimeouts timeouts;
  timeouts.connect_ms = static_cast<int>(context_.options->connect_timeout.count());
  timeouts.response_ms = timeout_seconds_ * 1000;
  const std::string what =
      count == 1 ? "record " + std::to_string(first_record + 1)
                 : "records " + std::to_string(first_record + 1) + "-" + std::to_string(first_record + count);
  std::string last_error;
  auto backoff = context_.options->retry_backoff;
  for (int attempt = 0; attempt <= max_retries_; ++attempt) {
    if (stop_requested_ || shutting_down_) return Status::Aborted("stopped");
    // A pipeline (§8.2): each container's answer is the next one's request; the whole chain is
    // one attempt, and a failing container is named.
    std::string who = "the model";
    Result<net::ClientResponse> response = Status::Internal("no container");
    if (worker.chain.empty()) {
      response = context_.client->Send(worker.host, worker.port, request, timeouts);
    } else {
      net::ClientResponse previous;
      for (size_t i = 0; i < worker.chain.size(); ++i) {
        const serving::ContainerTarget& c = worker.chain[i];
        HeaderMap hop_headers = serving::PipelineHopHeaders(
            headers, i, worker.chain.size(), i > 0 ? FindHeader(previous.headers, "Content-Type") : nullptr);
        net::ClientRequest hop = request;
        hop.headers = &hop_headers;
        if (i > 0) hop.body = previous.body;
        response = context_.client->Send(c.host, c.port, hop, timeouts);
        if (!response.ok() || response->status < 200 || response->status >= 300) {
          who = "container " + c.hostname + " of the inference pipeline";
          break;
        }
        if (i + 1 < worker.chain.size()) previous = std::move(*response);
      }
    }
    if (response.ok() && response->status >= 200 && response->status < 300) return std::move(response->body);
    if (!response.ok()) {
      last_error =
          response.status().code() == StatusCode::kDeadlineExceeded
              ? who + " did not answer within InvocationsTimeoutInSeconds (" + std::to_string(timeout_seconds_) + " s)"
              : "the request to " + who + " failed: " + response.status().message();
    } else {
      last_error = who + " answered " + std::to_string(response->status) + ": " + Truncated(response->body, 512);
    }
    DataLog(worker, "request of " + what + " (attempt " + std::to_string(attempt + 1) + " of " +
                        std::to_string(max_retries_ + 1) + ") failed: " + last_error);
    if (attempt < max_retries_) {
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
  }
  return Status::InvalidArgument(what + ": " + last_error +
                                 (max_retries_ > 0 ? " (after " + std::to_string(max_retries_) + " retries)" : ""));
}

void TransformJobRun::StopInstances(bool detach) {
  for (auto& worker : workers_) {
    if (detach) {
      worker->instance->Detach();
    } else {
      worker->instance->RequestStop();
    }
  }
  for (auto& worker : workers_) {
    worker->instance->Join();
    context_.client->Forget(worker->host, worker->port);  // its idle connections
  }
  if (!detach) {
    if (!workers_.empty()) StandaloneInstances::RemoveNetwork(*context_.deps->endpoints, network_);
    if (!credential_.access_key_id.empty()) context_.deps->credentials->Revoke(credential_.access_key_id);
  }
}

void TransformJobRun::Finish(const std::string& failure_reason) {
  const int64_t now = Now();
  auto written = context_.jobs->Mutate(name_, [&](store::TransformJobRecord& r) {
    if (r.state.stop_requested || stop_requested_) {
      r.status = store::TransformJobStatus::kStopped;
    } else if (!failure_reason.empty()) {
      r.status = store::TransformJobStatus::kFailed;
      r.state.failure_reason = failure_reason;
    } else {
      r.status = store::TransformJobStatus::kCompleted;
    }
    r.end_millis = now;
    r.last_modified_millis = now;
    return Status::Ok();
  });
  if (!written.ok()) {
    KLOG(error, "transform job end not recorded", {{"job", name_}, {"error", written.status().ToString()}});
    return;
  }
  KLOG(info, "transform job ended",
       {{"job", name_},
        {"status", std::string(store::TransformJobStatusName(written->status))},
        {"reason", written->state.failure_reason}});
}

}  // namespace kiln::control
