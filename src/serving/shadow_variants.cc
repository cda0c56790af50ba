#include "serving/shadow_variants.h"

#include <chrono>

#include "serving/data_capture.h"
#include "serving/router.h"

namespace kiln::serving {

namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t EpochMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ShadowVariants::ShadowVariants(ShadowVariantsOptions options, net::HttpClient* client, InvocationMetrics* metrics,
                               DataCapture* capture)
    : options_(std::move(options)), client_(client), metrics_(metrics), capture_(capture) {}

ShadowVariants::~ShadowVariants() { Stop(); }

void ShadowVariants::Start() {
  if (!workers_.empty()) return;
  for (int i = 0; i < std::max(1, options_.threads); ++i) workers_.emplace_back([this] { Work(); });
}

void ShadowVariants::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    stats_.dropped += queue_.size();
    queue_.clear();
    queued_bytes_ = 0;
    cv_.NotifyAll();
  }
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

ShadowVariants::Stats ShadowVariants::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

bool ShadowVariants::Copy(const std::shared_ptr<const EndpointRoute>& route, const HeaderMap& forward,
                          std::string_view body) {
  const size_t shadows = route->shadow_variants.size();
  if (shadows == 0) return false;
  MutexLock lock(mu_);
  if (stop_ || queued_bytes_ + body.size() * shadows > options_.max_pending_bytes) {
    stats_.dropped += shadows;
    return false;
  }
  for (size_t i = 0; i < shadows; ++i) {
    Job& job = queue_.emplace_back();
    job.route = route;
    job.shadow = i;
    job.headers = forward;
    job.body = body;
    job.queued_steady_ns = SteadyNanos();
    queued_bytes_ += body.size();
  }
  cv_.NotifyOne();
  return true;
}

void ShadowVariants::Work() {
  while (true) {
    Job job;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stop_) cv_.Wait(mu_);
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= job.body.size();
      if (!queue_.empty()) cv_.NotifyOne();
    }
    Send(job);
  }
}

void ShadowVariants::Send(Job& job) {
  const EndpointRoute& route = *job.route;
  const VariantRoute& variant = route.shadow_variants[job.shadow];
  InvocationSample sample;
  sample.per_instance = variant.instances.empty() ? 0.0 : 1.0 / static_cast<double>(variant.instances.size());
  const InstanceTarget* instance = Router::PickInstance(variant, nullptr);
  bool failed = true;
  if (instance == nullptr) {
    sample.reached_model = false;  // counted as `unavailable`, as the router does
  } else {
    net::ClientRequest request;
    request.method = "POST";
    request.target = "/invocations";
    request.headers = &job.headers;
    request.body = job.body;
    request.cancel = &instance->failure;
    net::ClientTimeouts timeouts;
    timeouts.connect_ms = options_.connect_timeout_ms;
    timeouts.response_ms = options_.invocation_timeout_ms;
    const int64_t model_start = SteadyNanos();
    instance->outstanding.fetch_add(1, std::memory_order_relaxed);
    Result<net::ClientResponse> answer = client_->Send(instance->host, instance->port, request, timeouts);
    instance->outstanding.fetch_sub(1, std::memory_order_relaxed);
    const int64_t end = SteadyNanos();
    sample.model_micros = (end - model_start) / 1000;
    sample.overhead_micros = std::max<int64_t>(0, (end - job.queued_steady_ns) / 1000 - sample.model_micros);
    if (!answer.ok()) {
      sample.model_error = true;
    } else {
      sample.model_status = answer->status;
      failed = answer->status < 200 || answer->status > 299;
      sample.model_error = failed;
      if (!failed && capture_ != nullptr && route.data_capture != nullptr) {
        const std::string* input_type = FindHeader(job.headers, "Content-Type");
        const std::string* output_type = FindHeader(answer->headers, "Content-Type");
        const std::string* inference_id = FindHeader(job.headers, "X-Amzn-SageMaker-Inference-Id");
        CaptureInput input;
        input.endpoint = route.name;
        input.variant = variant.name;
        input.input = job.body;
        input.input_content_type = input_type != nullptr ? std::string_view(*input_type) : "application/octet-stream";
        input.output = answer->body;
        input.output_content_type =
            output_type != nullptr ? std::string_view(*output_type) : "application/octet-stream";
        input.inference_id = inference_id != nullptr ? std::string_view(*inference_id) : std::string_view();
        input.epoch_millis = EpochMillis();
        capture_->Capture(route.data_capture, input);
      }
    }
  }
  sample.epoch_second = EpochMillis() / 1000;
  if (metrics_ != nullptr) metrics_->Record(route.name, variant.name, sample);
  MutexLock lock(mu_);
  ++stats_.sent;
  if (failed) ++stats_.failed;
}

}  // namespace kiln::serving
