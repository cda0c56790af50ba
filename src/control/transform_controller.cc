#include "control/transform_controller.h"

#include <algorithm>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "control/transform_job_run.h"

namespace kiln::control {

namespace {

constexpr std::string_view kRuntimePrefix = "transform-";

net::HttpClientOptions ClientOptions(const TransformControllerOptions& options) {
  net::HttpClientOptions client;
  client.max_response_body_bytes = options.max_response_bytes;
  return client;
}

}  // namespace

TransformController::TransformController(TransformControllerOptions options, TransformControllerDeps deps)
    : options_(std::move(options)), deps_(deps), jobs_(deps.database), client_(ClientOptions(options_)) {}

TransformController::~TransformController() { Shutdown(); }

Status TransformController::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.work_dir, 0755).WithPrefix("transform work dir"));
  // Instances a previous server left: their jobs run again from the start.
  if (auto ids = deps_.runtime->List(); ids.ok()) {
    for (const std::string& id : *ids) {
      if (!StartsWith(id, kRuntimePrefix)) continue;
      KLOG(info, "removing a transform instance of a previous server", {{"runtime_id", id}});
      (void)deps_.runtime->Stop(id, std::chrono::seconds(0));
      (void)deps_.runtime->Wait(id, std::chrono::seconds(5));
      (void)deps_.runtime->Remove(id);
    }
  }
  ASSIGN_OR_RETURN(auto active, jobs_.ListActive());
  for (const store::TransformJobRecord& record : active) {
    (void)RemoveAll(options_.work_dir + "/" + record.name);
    if (record.status == store::TransformJobStatus::kStopping) {
      const int64_t now = deps_.clock ? deps_.clock->NowMillis() : Clock::System().NowMillis();
      (void)jobs_.Mutate(record.name, [&](store::TransformJobRecord& r) {
        r.status = store::TransformJobStatus::kStopped;
        r.end_millis = now;
        r.last_modified_millis = now;
        return Status::Ok();
      });
      continue;
    }
    KLOG(info, "transform job runs again after a restart", {{"job", record.name}});
    StartRun(record.name);
  }
  return Status::Ok();
}

void TransformController::Shutdown() {
  std::map<std::string, std::shared_ptr<TransformJobRun>> runs;
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;
    shutting_down_ = true;
    runs.swap(runs_);
  }
  for (auto& [name, run] : runs) run->Shutdown();
  for (auto& [name, run] : runs) run->Join();
}

void TransformController::Submit(const std::string& name) {
  JoinFinished();
  StartRun(name);
}

void TransformController::RequestStop(const std::string& name) {
  std::shared_ptr<TransformJobRun> run;
  {
    MutexLock lock(mutex_);
    auto it = runs_.find(ToLower(name));
    if (it != runs_.end()) run = it->second;
  }
  if (run) run->RequestStop();
}

void TransformController::StartRun(const std::string& name) {
  auto run = std::make_shared<TransformJobRun>(
      TransformJobRun::Context{.options = &options_, .deps = &deps_, .jobs = &jobs_, .client = &client_}, name);
  {
    MutexLock lock(mutex_);
    if (shutting_down_) return;
    auto [it, inserted] = runs_.emplace(ToLower(name), run);
    if (!inserted) return;  // already running
  }
  run->Start();
}

// Joins the runs that ended (their threads are done or about to be).
void TransformController::JoinFinished() {
  std::vector<std::shared_ptr<TransformJobRun>> finished;
  {
    MutexLock lock(mutex_);
    for (auto it = runs_.begin(); it != runs_.end();) {
      if (it->second->finished()) {
        finished.push_back(it->second);
        it = runs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& run : finished) run->Join();
}

}  // namespace kiln::control
