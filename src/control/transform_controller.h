#pragma once
// TransformController: runs SageMaker batch transform jobs on this node (serving-contract.md §13,
// control-plane-api.md §8.6). The API validates CreateTransformJob, inserts the row (InProgress,
// with the model's snapshot) and calls Submit(); from then on the controller owns the job: one
// TransformJobRun (control/transform_job_run.h) per job on a thread of its own.
//
// Instances are serving instances like an endpoint's (StandaloneInstances, control/
// transform_instances.h: capacity from the shared Scheduler, the process runtime or the engine,
// model data, `<image> serve`, the /ping gate), under runtime ids "transform-<job>-<instance-id>"
// and on network "transform-<job>" in namespaced mode.
//
// Restart: a job's work is not resumable piecemeal (its output objects are written whole, at the
// end of each input object), so Start() removes the instances a previous server left running
// (runtime ids "transform-...") and runs every InProgress job again from the start — outputs it
// writes again replace the earlier ones — and ends Stopping jobs Stopped. Shutdown() detaches the
// runs' instances (no SIGTERM grace to wait out) for the next Start() to remove.
//
// Thread model: callers' threads (API handlers) call Submit / RequestStop; each run has its own
// thread plus one worker per instance and MaxConcurrentTransforms request threads per object being
// transformed. `mutex_` guards only the map of runs and is never held across a run's calls.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "control/endpoint_controller.h"
#include "control/instance_credentials.h"
#include "net/http_client.h"
#include "objects/object_store.h"
#include "observe/log_store.h"
#include "runtime/runtime.h"
#include "store/database.h"
#include "store/transform_job_repository.h"

namespace kiln::control {

inline constexpr char kTransformLogGroup[] = "/aws/sagemaker/TransformJobs";
inline constexpr char kTransformMetricsNamespace[] = "/aws/sagemaker/TransformJobs";

struct TransformControllerOptions {
  std::string work_dir;  // instance directories: <work_dir>/<job>/<instance-id>
  // Connect budget per request (the container accepts at once on a healthy instance).
  std::chrono::milliseconds connect_timeout{2000};
  // The first retry of a failed request waits this long, each later one twice as long.
  std::chrono::milliseconds retry_backoff{200};
  // A response body longer than this fails its request (the output of one mini-batch).
  size_t max_response_bytes = 256u << 20;
};

struct TransformControllerDeps {
  store::Database* database = nullptr;
  objects::ObjectStore* object_store = nullptr;
  observe::LogStore* log_store = nullptr;
  runtime::Runtime* runtime = nullptr;      // Start() removes leftover "transform-" instances
  EndpointController* endpoints = nullptr;  // launches the instances (StandaloneInstances)
  InstanceCredentials* credentials = nullptr;
  const Clock* clock = nullptr;  // nullptr: the system clock
};

class TransformJobRun;  // control/transform_job_run.h

class TransformController {
 public:
  TransformController(TransformControllerOptions options, TransformControllerDeps deps);
  ~TransformController();  // Shutdown()
  TransformController(const TransformController&) = delete;
  TransformController& operator=(const TransformController&) = delete;

  // Removes leftover instances, ends Stopping jobs Stopped and runs InProgress ones (see above).
  Status Start() EXCLUDES(mutex_);
  // Ends every run; their instances are detached (left for the next Start to remove).
  void Shutdown() EXCLUDES(mutex_);

  // A job row was inserted (InProgress): run it. Rows that are not active are ignored.
  void Submit(const std::string& name) EXCLUDES(mutex_);
  // The API marked the job Stopping: its requests are cut, its instances stopped, and it ends
  // Stopped (objects already written stay).
  void RequestStop(const std::string& name) EXCLUDES(mutex_);

 private:
  void StartRun(const std::string& name) EXCLUDES(mutex_);
  void JoinFinished() EXCLUDES(mutex_);

  const TransformControllerOptions options_;
  const TransformControllerDeps deps_;
  store::TransformJobRepository jobs_;
  net::HttpClient client_;

  Mutex mutex_;
  bool shutting_down_ GUARDED_BY(mutex_) = false;
  std::map<std::string, std::shared_ptr<TransformJobRun>> runs_ GUARDED_BY(mutex_);  // by lower-case name
};

}  // namespace kiln::control
