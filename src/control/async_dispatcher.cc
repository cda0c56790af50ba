#include "control/async_dispatcher.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "serving/router.h"

namespace kiln::control {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kNamespace = "AWS/SageMaker";
constexpr size_t kMaxNotifiedBody = 128 * 1024;

bool SplitS3(std::string_view uri, std::string* bucket, std::string* key) {
  if (!StartsWith(uri, "s3://")) return false;
  uri.remove_prefix(5);
  size_t slash = uri.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= uri.size()) return false;
  *bucket = std::string(uri.substr(0, slash));
  *key = std::string(uri.substr(slash + 1));
  return true;
}

// "http://host[:port]/path" → host, port, path; false otherwise.
bool SplitHttpUrl(std::string_view url, std::string* host, uint16_t* port, std::string* path) {
  if (!StartsWith(url, "http://")) return false;
  url.remove_prefix(7);
  size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  *path = slash == std::string_view::npos ? "/" : std::string(url.substr(slash));
  size_t colon = authority.rfind(':');
  *port = 80;
  if (colon != std::string_view::npos) {
    std::optional<int64_t> n = ParseInt64(authority.substr(colon + 1));
    if (!n || *n <= 0 || *n > 65535) return false;
    *port = static_cast<uint16_t>(*n);
    authority = authority.substr(0, colon);
  }
  *host = std::string(authority);
  return !host->empty();
}

bool IsUtf8Text(std::string_view s) {
  try {
    (void)json(std::string(s)).dump();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

struct AsyncDispatcher::Outcome {
  bool success = false;
  bool expired = false;
  bool answered = false;  // the container sent an HTTP answer
  int status = 0;         // its status
  std::string content_type;
  std::string body;  // the container's answer (success: output; failure: error body)
  std::string failure_reason;
  std::string failure_location;  // written
  int64_t model_micros = -1;
  int64_t backlog_millis = 0;
  int64_t total_millis = 0;
  bool download_failed = false;
  bool upload_failed = false;
};

struct AsyncDispatcher::Cell {
  std::map<std::string, double> counts;
  struct Stat {
    double n = 0, sum = 0, min = 0, max = 0;
    void Add(double v) {
      if (n == 0 || v < min) min = v;
      if (n == 0 || v > max) max = v;
      ++n;
      sum += v;
    }
  };
  std::map<std::string, Stat> stats;
};

AsyncDispatcher::AsyncDispatcher(AsyncDispatcherOptions options, AsyncDispatcherDeps deps)
    : options_(std::move(options)),
      deps_(deps),
      client_(net::HttpClientOptions{.max_idle_per_target = 64,
                                     .max_idle_ms = 20000,
                                     .max_response_body_bytes = options_.max_response_body_bytes,
                                     .max_response_header_bytes = 64 * 1024}) {}

AsyncDispatcher::~AsyncDispatcher() { Stop(); }

void AsyncDispatcher::Start() {
  if (loop_.joinable()) return;
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
  loop_ = std::thread([this] { Loop(); });
}

void AsyncDispatcher::Stop() {
  if (!loop_.joinable() && workers_.empty()) return;
  stop_.store(true);
  stopping_.Cancel("server stopping");
  deps_.queue->Wake();
  if (loop_.joinable()) loop_.join();
  {
    MutexLock lock(tasks_mu_);
    // Not started: back to the queue's head (still journaled either way).
    while (!tasks_.empty()) {
      Task& task = tasks_.back();
      task.instance->outstanding.fetch_sub(1);
      deps_.queue->Untake(task.request);
      tasks_.pop_back();
    }
  }
  tasks_cv_.NotifyAll();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
  FlushDataLog();
}

void AsyncDispatcher::Loop() {
  Clock::time_point last_metrics = Clock::now() - options_.metrics_interval;
  Clock::time_point last_gc = Clock::now();
  Clock::time_point last_flush = Clock::now();
  while (!stop_.load()) {
    deps_.queue->WaitForWork(std::chrono::milliseconds(50));
    if (stop_.load()) break;
    DispatchAll();
    if (Clock::now() - last_flush >= std::chrono::milliseconds(100)) {
      last_flush = Clock::now();
      FlushDataLog();
    }
    if (Clock::now() - last_gc >= std::chrono::seconds(5)) {
      last_gc = Clock::now();
      DropDeleted();
    }
    if (Clock::now() - last_metrics >= options_.metrics_interval) {
      last_metrics = Clock::now();
      PublishMetrics();
    }
  }
}

void AsyncDispatcher::DispatchAll() {
  for (const auto& [endpoint, backlog] : deps_.queue->Backlogs()) {
    if (backlog.waiting == 0) continue;
    std::shared_ptr<const serving::EndpointRoute> route = deps_.routes->Find(endpoint);
    if (route == nullptr || !route->async) continue;
    const json config = json::parse(route->async_config, nullptr, false);
    int max_concurrency = options_.default_max_concurrency;
    if (config.is_object() && config.contains("ClientConfig") &&
        config["ClientConfig"].contains("MaxConcurrentInvocationsPerInstance")) {
      max_concurrency = config["ClientConfig"]["MaxConcurrentInvocationsPerInstance"].get<int>();
    }
    for (;;) {
      const serving::InstanceTarget* best = nullptr;
      std::shared_ptr<const serving::InstanceTarget> best_ptr;
      std::string best_variant;
      // The least busy instance below the concurrency bound among a fleet's variants with traffic
      // (all of them when every weight is 0).
      auto pick = [&](const std::vector<serving::VariantRoute>& variants) {
        bool any_weight = false;
        for (const auto& v : variants) any_weight = any_weight || (v.weight > 0 && !v.instances.empty());
        for (const auto& v : variants) {
          if (any_weight && v.weight <= 0) continue;
          for (const auto& instance : v.instances) {
            if (instance->failure.cancelled()) continue;
            const int64_t n = instance->outstanding.load();
            if (n >= max_concurrency) continue;
            if (best == nullptr || n < best->outstanding.load()) {
              best = instance.get();
              best_ptr = instance;
              best_variant = v.name;
            }
          }
        }
      };
      // An UpdateEndpoint shifting traffic (DeploymentConfig, serving-contract §9): the new fleet
      // gets its share of the requests; a fleet without room leaves the request to the other.
      const bool shifting = !route->new_variants.empty() && route->new_fleet_fraction > 0;
      const bool to_new = shifting && serving::ThreadUniform() < route->new_fleet_fraction;
      pick(to_new ? route->new_variants : route->variants);
      if (best == nullptr && shifting) pick(to_new ? route->variants : route->new_variants);
      if (best == nullptr) break;
      std::optional<serving::AsyncRequest> request = deps_.queue->Take(endpoint);
      if (!request) break;
      best->outstanding.fetch_add(1);
      {
        MutexLock lock(tasks_mu_);
        tasks_.push_back(Task{std::move(*request), std::move(best_ptr), best_variant, route->async_config});
      }
      tasks_cv_.NotifyOne();
    }
  }
}

void AsyncDispatcher::DropDeleted() {
  if (!deps_.endpoint_gone) return;
  for (const auto& [endpoint, backlog] : deps_.queue->Backlogs()) {
    if (deps_.routes->Find(endpoint) != nullptr || !deps_.endpoint_gone(endpoint)) continue;
    KLOG(info, "async queue of a deleted endpoint dropped",
         {{"endpoint", endpoint}, {"requests", std::to_string(backlog.waiting + backlog.in_flight)}});
    deps_.queue->Drop(endpoint);
  }
}

void AsyncDispatcher::WorkerLoop() {
  for (;;) {
    Task task;
    {
      MutexLock lock(tasks_mu_);
      while (tasks_.empty() && !stop_.load()) tasks_cv_.Wait(tasks_mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    Run(task);
    task.instance->outstanding.fetch_sub(1);
    task.instance.reset();  // the route's target is not kept beyond the request
    deps_.queue->Wake();
  }
}

void AsyncDispatcher::Run(Task& task) {
  const serving::AsyncRequest& r = task.request;
  const Clock::time_point start = Clock::now();
  Outcome outcome;
  outcome.backlog_millis = std::max<int64_t>(0, NowMillis() - r.received_millis);
  std::string out_bucket, out_key, fail_bucket, fail_key, in_bucket, in_key;
  SplitS3(r.output_location, &out_bucket, &out_key);
  const bool has_failure = SplitS3(r.failure_location, &fail_bucket, &fail_key);

  // 1. Already done before a restart: never run twice.
  if (r.recovered) {
    if (deps_.objects->HeadObject(out_bucket, out_key).ok() ||
        (has_failure && deps_.objects->HeadObject(fail_bucket, fail_key).ok())) {
      KLOG(info, "async request already done before the restart",
           {{"endpoint", r.endpoint}, {"inference_id", r.inference_id}});
      deps_.queue->Complete(r.endpoint, r.seq);
      finished_.fetch_add(1);
      return;
    }
  }
  auto attempt = [&](auto&& call) {
    Status status;
    for (int i = 0; i < std::max(1, options_.max_attempts); ++i) {
      if (stop_.load()) return Status::Aborted("server stopping");
      status = call();
      if (status.ok() || status.code() == StatusCode::kNotFound) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * (i + 1)));
    }
    return status;
  };

  // 2. Expired while waiting.
  if (outcome.backlog_millis > int64_t{r.ttl_seconds} * 1000) {
    outcome.expired = true;
    outcome.failure_reason = "Request expired: it waited " + std::to_string(outcome.backlog_millis / 1000) +
                             " s, longer than its RequestTTLSeconds of " + std::to_string(r.ttl_seconds) + ".";
  } else {
    // 3. The input, then the container.
    std::string input;
    std::string content_type = r.content_type;
    SplitS3(r.input_location, &in_bucket, &in_key);
    Status read = attempt([&]() -> Status {
      auto reader = deps_.objects->GetObject(in_bucket, in_key, std::nullopt);
      if (!reader.ok()) return reader.status();
      if (content_type.empty()) {
        auto ct = (*reader)->info().headers.find("Content-Type");
        if (ct != (*reader)->info().headers.end()) content_type = ct->second;
      }
      auto data = ReadAll(**reader, options_.max_response_body_bytes);
      if (!data.ok()) return data.status();
      input = std::move(*data);
      return Status::Ok();
    });
    if (stop_.load()) return;  // left in the journal: runs after the restart
    if (!read.ok()) {
      outcome.download_failed = true;
      outcome.failure_reason = "The input " + r.input_location + " could not be read: " + read.message();
    } else {
      HeaderMap headers;
      headers.emplace("Content-Type", content_type.empty() ? "application/octet-stream" : content_type);
      if (!r.accept.empty()) headers.emplace("Accept", r.accept);
      if (!r.custom_attributes.empty()) headers.emplace("X-Amzn-SageMaker-Custom-Attributes", r.custom_attributes);
      headers.emplace("X-Amzn-SageMaker-Inference-Id", r.inference_id);
      net::ClientRequest call;
      call.method = "POST";
      call.target = "/invocations";
      call.headers = &headers;
      call.body = input;
      call.cancel = &stopping_;
      net::ClientTimeouts timeouts;
      timeouts.connect_ms = 1000;
      timeouts.response_ms = r.invocation_timeout_seconds * 1000;
      Result<net::ClientResponse> answer = Status::Unavailable("not sent");
      for (int i = 0; i < std::max(1, options_.max_attempts); ++i) {
        const Clock::time_point sent = Clock::now();
        answer = client_.Send(task.instance->host, task.instance->port, call, timeouts);
        outcome.model_micros = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent).count();
        // Only "could not connect" (nothing was sent) is a platform error worth another try.
        if (answer.ok() || answer.status().code() != StatusCode::kUnavailable || stop_.load()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * (i + 1)));
      }
      if (stop_.load()) return;  // interrupted by the stop: runs again after the restart
      if (!answer.ok()) {
        outcome.failure_reason = answer.status().code() == StatusCode::kDeadlineExceeded
                                     ? "The model did not answer within InvocationTimeoutSeconds (" +
                                           std::to_string(r.invocation_timeout_seconds) + " s)."
                                     : "The model container failed to answer: " + answer.status().message();
      } else {
        outcome.answered = true;
        outcome.status = answer->status;
        const std::string* ct = FindHeader(answer->headers, "Content-Type");
        outcome.content_type = ct ? *ct : "application/octet-stream";
        outcome.body = std::move(answer->body);
        if (answer->status >= 200 && answer->status <= 299) {
          // 4. The output object.
          Status written = attempt([&]() -> Status {
            StringByteSource source(outcome.body);
            objects::PutOptions put;
            put.headers["Content-Type"] = outcome.content_type;
            return deps_.objects->PutObject(out_bucket, out_key, source, put).status();
          });
          if (stop_.load() && !written.ok()) return;
          if (written.ok()) {
            outcome.success = true;
          } else {
            outcome.upload_failed = true;
            outcome.failure_reason =
                "The output could not be written to " + r.output_location + ": " + written.message();
          }
        } else {
          outcome.failure_reason =
              "Received server error (" + std::to_string(answer->status) + ") from the model container.";
        }
      }
    }
  }
  if (!outcome.success && has_failure) {
    std::string document =
        outcome.answered && !outcome.success && !outcome.upload_failed
            ? outcome.body
            : json{{"errorMessage", outcome.failure_reason}, {"statusCode", outcome.answered ? outcome.status : 500}}
                  .dump();
    std::string type = outcome.answered && !outcome.upload_failed ? outcome.content_type : "application/json";
    Status written = attempt([&]() -> Status {
      StringByteSource source(document);
      objects::PutOptions put;
      put.headers["Content-Type"] = type;
      return deps_.objects->PutObject(fail_bucket, fail_key, source, put).status();
    });
    if (written.ok()) {
      outcome.failure_location = r.failure_location;
    } else {
      outcome.upload_failed = true;
      KLOG(warn, "async failure object not written",
           {{"endpoint", r.endpoint}, {"inference_id", r.inference_id}, {"error", written.ToString()}});
    }
  }
  outcome.total_millis = MillisSince(start) + outcome.backlog_millis;
  Finish(task, outcome);
}

void AsyncDispatcher::Finish(const Task& task, const Outcome& outcome) {
  const serving::AsyncRequest& r = task.request;
  // 5. Notification and the data-log line, then the queue.
  const json config = json::parse(task.async_config, nullptr, false);
  json notification =
      config.is_object() && config.contains("OutputConfig") && config["OutputConfig"].contains("NotificationConfig")
          ? config["OutputConfig"]["NotificationConfig"]
          : json::object();
  const std::string topic = notification.value(outcome.success ? "SuccessTopic" : "ErrorTopic", "");
  bool include = false;
  if (notification.contains("IncludeInferenceResponseIn") && notification["IncludeInferenceResponseIn"].is_array()) {
    for (const json& t : notification["IncludeInferenceResponseIn"]) {
      if (t == (outcome.success ? "SUCCESS_NOTIFICATION_TOPIC" : "ERROR_NOTIFICATION_TOPIC")) include = true;
    }
  }
  if (!topic.empty()) Notify(task, outcome, topic, include);
  DataLog(task, outcome);
  {
    MutexLock lock(metrics_mu_);
    Cell& cell = CellFor(r.endpoint, task.variant);
    auto count = [&](const char* name, bool yes) { cell.counts[name] += yes ? 1 : 0; };
    count("InvocationsProcesssed", outcome.success);
    count("InvocationFailures", !outcome.success && !outcome.expired);
    count("ExpiredRequests", outcome.expired);
    count("Invocation4XXErrors", outcome.answered && outcome.status >= 400 && outcome.status < 500);
    count("Invocation5XXErrors", outcome.answered && outcome.status >= 500);
    count("RequestDownloadFailures", outcome.download_failed);
    count("ResponseUploadFailures", outcome.upload_failed);
    if (outcome.model_micros >= 0) cell.stats["ModelLatency"].Add(static_cast<double>(outcome.model_micros));
    cell.stats["TimeInBacklog"].Add(static_cast<double>(outcome.backlog_millis));
    cell.stats["TotalProcessingTime"].Add(static_cast<double>(outcome.total_millis));
  }
  deps_.queue->Complete(r.endpoint, r.seq);
  finished_.fetch_add(1);
}

void AsyncDispatcher::Notify(const Task& task, const Outcome& outcome, const std::string& topic, bool include_body) {
  const serving::AsyncRequest& r = task.request;
  auto webhook = options_.notification_webhooks.find(topic);
  if (webhook == options_.notification_webhooks.end()) return;
  json response = json::object();
  if (outcome.success) {
    response["contentType"] = outcome.content_type;
    response["outputLocation"] = r.output_location;
  } else {
    response["failureReason"] = outcome.failure_reason;
    if (!outcome.failure_location.empty()) response["failureLocation"] = outcome.failure_location;
    if (outcome.answered) response["contentType"] = outcome.content_type;
  }
  json event = {{"awsRegion", options_.region},
                {"eventTime", FormatIso8601Millis(NowMillis())},
                {"receivedTime", FormatIso8601Millis(r.received_millis)},
                {"invocationStatus", outcome.success ? "Completed" : "Failed"},
                {"requestParameters",
                 {{"contentType", r.content_type.empty() ? "application/octet-stream" : r.content_type},
                  {"endpointName", r.endpoint},
                  {"inputLocation", r.input_location}}},
                {"responseParameters", response},
                {"inferenceId", r.inference_id},
                {"eventVersion", "1.0"},
                {"eventSource", "aws:sagemaker"},
                {"eventName", "InferenceResult"}};
  if (include_body && outcome.answered && outcome.body.size() <= kMaxNotifiedBody) {
    const bool text = IsUtf8Text(outcome.body);
    event["responseBody"] = {{"content", text ? outcome.body : Base64Encode(outcome.body)},
                             {"encoding", text ? "STRING" : "BASE64"}};
  }
  std::string host, path;
  uint16_t port = 0;
  Status sent = Status::InvalidArgument("the webhook URL " + webhook->second + " is not http://host:port/path");
  if (SplitHttpUrl(webhook->second, &host, &port, &path)) {
    const std::string body = event.dump();
    HeaderMap headers;
    headers.emplace("Content-Type", "application/json");
    headers.emplace("X-Kiln-Topic-Arn", topic);
    net::ClientRequest call;
    call.method = "POST";
    call.target = path;
    call.headers = &headers;
    call.body = body;
    for (int i = 0; i < std::max(1, options_.max_attempts); ++i) {
      auto answer = client_.Send(host, port, call, {.connect_ms = 1000, .response_ms = 10000});
      sent = !answer.ok() ? answer.status()
             : answer->status >= 200 && answer->status <= 299
                 ? Status::Ok()
                 : Status::Unavailable("the webhook answered " + std::to_string(answer->status));
      if (sent.ok() || stop_.load()) break;
    }
  }
  if (!sent.ok()) {
    KLOG(warn, "async notification not delivered",
         {{"endpoint", r.endpoint}, {"topic", topic}, {"error", sent.ToString()}});
    MutexLock lock(metrics_mu_);
    CellFor(r.endpoint, task.variant).counts["NotificationFailures"] += 1;
  } else {
    MutexLock lock(metrics_mu_);
    CellFor(r.endpoint, task.variant).counts["NotificationFailures"] += 0;
  }
}

void AsyncDispatcher::DataLog(const Task& task, const Outcome& outcome) {
  if (deps_.logs == nullptr) return;
  const serving::AsyncRequest& r = task.request;
  const std::string group = "/aws/sagemaker/Endpoints/" + r.endpoint;
  const std::string stream = task.variant + "/" + task.instance->instance_id + "/data-log";
  {
    MutexLock lock(streams_mu_);
    if (streams_.insert(group + "|" + stream).second) {
      (void)deps_.logs->CreateGroup(group);  // AlreadyExists is fine
      (void)deps_.logs->CreateStream(group, stream);
    }
  }
  json line = {{"inferenceId", r.inference_id},
               {"invocationStatus", outcome.success   ? "Completed"
                                    : outcome.expired ? "Expired"
                                                      : "Failed"},
               {"inputLocation", r.input_location},
               {"timeInBacklogMs", outcome.backlog_millis},
               {"totalProcessingTimeMs", outcome.total_millis}};
  if (outcome.success) line["outputLocation"] = r.output_location;
  if (!outcome.success) line["failureReason"] = outcome.failure_reason;
  if (!outcome.failure_location.empty()) line["failureLocation"] = outcome.failure_location;
  if (outcome.answered) line["statusCode"] = outcome.status;
  MutexLock lock(streams_mu_);
  pending_lines_[{group, stream}].push_back({.timestamp = NowMillis(), .message = line.dump()});
}

void AsyncDispatcher::FlushDataLog() {
  std::map<std::pair<std::string, std::string>, std::vector<observe::InputEvent>> lines;
  {
    MutexLock lock(streams_mu_);
    lines.swap(pending_lines_);
  }
  for (auto& [where, events] : lines) {
    const auto& [group, stream] = where;
    std::stable_sort(events.begin(), events.end(), [](const observe::InputEvent& a, const observe::InputEvent& b) {
      return a.timestamp < b.timestamp;
    });
    // One fdatasync per batch (LogStore::Append syncs), at most 1,000 lines each.
    for (size_t i = 0; i < events.size(); i += 1000) {
      std::vector<observe::InputEvent> batch(
          events.begin() + static_cast<std::ptrdiff_t>(i),
          events.begin() + static_cast<std::ptrdiff_t>(std::min(events.size(), i + 1000)));
      if (deps_.logs->Append(group, stream, batch).ok()) continue;
      // The group went with a deleted endpoint, or the stream is new to a restarted log store.
      (void)deps_.logs->CreateGroup(group);
      (void)deps_.logs->CreateStream(group, stream);
      (void)deps_.logs->Append(group, stream, batch);
    }
  }
}

AsyncDispatcher::Cell& AsyncDispatcher::CellFor(const std::string& endpoint, const std::string& variant) {
  auto& cell = cells_[{endpoint, variant}];
  if (!cell) cell = std::make_unique<Cell>();
  return *cell;
}

void AsyncDispatcher::PublishMetrics() {
  if (deps_.metrics == nullptr) return;
  const int64_t now = NowMillis();
  std::vector<observe::MetricDatum> batch;
  const std::map<std::string, serving::AsyncBacklog> backlogs = deps_.queue->Backlogs();
  std::shared_ptr<const serving::RoutingTable::Map> routes = deps_.routes->All();
  for (const auto& [name, route] : *routes) {
    if (!route->async) continue;
    size_t instances = 0;
    for (const auto& v : route->variants) instances += v.instances.size();
    serving::AsyncBacklog backlog;
    if (auto it = backlogs.find(name); it != backlogs.end()) backlog = it->second;
    const double size = static_cast<double>(backlog.waiting + backlog.in_flight);
    const observe::Dimensions dims = {{"EndpointName", name}};
    auto put = [&](const char* metric, double value, const char* unit) {
      batch.push_back({.name = metric, .dimensions = dims, .timestamp_millis = now, .value = value, .unit = unit});
    };
    put("ApproximateBacklogSize", size, "Count");
    put("ApproximateBacklogSizePerInstance", instances ? size / static_cast<double>(instances) : size, "Count");
    put("ApproximateAgeOfOldestRequest",
        backlog.oldest_received_millis
            ? static_cast<double>(std::max<int64_t>(0, now - backlog.oldest_received_millis)) / 1000.0
            : 0.0,
        "Seconds");
    put("HasBacklogWithoutCapacity", size > 0 && instances == 0 ? 1.0 : 0.0, "Count");
  }
  {
    MutexLock lock(metrics_mu_);
    for (auto it = cells_.begin(); it != cells_.end();) {
      const auto& [key, cell] = *it;
      const observe::Dimensions dims = {{"EndpointName", key.first}, {"VariantName", key.second}};
      for (const auto& [metric, value] : cell->counts) {
        batch.push_back({.name = metric, .dimensions = dims, .timestamp_millis = now, .value = value, .unit = "Count"});
      }
      for (const auto& [metric, stat] : cell->stats) {
        batch.push_back({.name = metric,
                         .dimensions = dims,
                         .timestamp_millis = now,
                         .statistics = observe::StatisticSet{stat.n, stat.sum, stat.min, stat.max},
                         .unit = metric == std::string("ModelLatency") ? "Microseconds" : "Milliseconds"});
      }
      it = cells_.erase(it);
    }
  }
  if (batch.empty()) return;
  Status put = deps_.metrics->Put(kNamespace, batch);
  if (!put.ok()) KLOG(warn, "async metrics not written", {{"error", put.ToString()}});
}

}  // namespace kiln::control
