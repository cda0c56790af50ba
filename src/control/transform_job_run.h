#pragma once
// TransformJobRun: one batch transform job from Submit (or a restart) to its terminal status, on a
// thread of its own (control/transform_controller.h creates and joins it). serving-contract.md §13:
//
//   1. Launch   TransformResources.InstanceCount instances of the model's container with `serve`
//               (StandaloneInstances) and the environment of §4.1: the model's Environment, the
//               job's Environment over it, SAGEMAKER_BATCH=true, and SAGEMAKER_MAX_PAYLOAD_IN_MB /
//               SAGEMAKER_BATCH_STRATEGY (SINGLE_RECORD/MULTI_RECORD) /
//               SAGEMAKER_MAX_CONCURRENT_TRANSFORMS when the request set them. Container output
//               goes to /aws/sagemaker/TransformJobs, stream <job>/<instance-id>-<epoch seconds>;
//               metrics to /aws/sagemaker/TransformJobs with Host=<job>/<instance-id>.
//   2. Gate     every instance passes /ping (the instance's startup budget); one that fails
//               first fails the job with its reason.
//   3. Params   per instance: request → GET /execution-parameters → defaults
//               (serving::ResolveTransformParameters).
//   4. Inputs   S3Prefix or ManifestFile (agent::SelectChannelObjects: sorted keys, relative
//               paths as in File mode); object i goes to instance i mod InstanceCount. An empty
//               selection fails the job (ClientError, as a training channel's).
//   5. Objects  each instance takes its objects in order: read whole (Gzip decompressed), split,
//               InputFilter, batch, send with MaxConcurrentTransforms requests in flight (across
//               object boundaries) (ModelClientConfig: InvocationsTimeoutInSeconds per request, default 600;
//               InvocationsMaxRetries retries on non-2xx, timeouts and connection errors, default
//               3), responses kept in record order, joined/filtered, assembled, and written to
//               <S3OutputPath>/<rel>.out only when the whole object succeeded. Each object and each
//               failed request gets a line in <job>/<instance-id>-<epoch>/data-log.
//   6. End      Stopped after a stop; else Completed when every object succeeded, else Failed
//               with "ClientError: <object URI>: <why>" for the first object that failed (and how
//               many failed when several did). Instances are stopped, the network removed, the
//               credentials revoked.
//
// Threads: Run() on the run's thread; RequestStop() and Shutdown() from any thread (atomics, and
// a CancelSignal that cuts requests in flight). The row is written only through Mutate.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/staging.h"
#include "aws/credentials.h"
#include "control/endpoint_instance.h"
#include "control/transform_controller.h"
#include "net/http_client.h"
#include "serving/transform_records.h"
#include "store/transform_job_repository.h"

namespace kiln::control {

class TransformJobRun {
 public:
  struct Context {
    const TransformControllerOptions* options = nullptr;  // outlive the run
    const TransformControllerDeps* deps = nullptr;
    store::TransformJobRepository* jobs = nullptr;
    net::HttpClient* client = nullptr;
  };

  TransformJobRun(Context context, std::string name);
  ~TransformJobRun();  // Join()
  TransformJobRun(const TransformJobRun&) = delete;
  TransformJobRun& operator=(const TransformJobRun&) = delete;

  void Start();
  // StopTransformJob: cut requests, stop instances, end Stopped.
  void RequestStop();
  // The server is going: detach the instances, write nothing more.
  void Shutdown();
  void Join();
  bool finished() const { return finished_.load(); }

 private:
  struct Worker;
  struct Pending;

  int64_t Now() const;
  void Run();
  // Steps 1-2; an error is the job's FailureReason.
  Status LaunchInstances(const store::TransformJobRecord& record);
  Status WaitHealthy();
  // Step 5 for one instance: MaxConcurrentTransforms sender threads over its objects (see the .cc).
  void Transform(Worker& worker);
  void SendLoop(Worker& worker);
  // Reads, splits, filters and batches one object; a failed Pending carries the reason.
  std::shared_ptr<Pending> Prepare(Worker& worker, const agent::SelectedObject& object);
  // The object's end: assembled and written, or failed; a data-log line either way.
  void Complete(Worker& worker, Pending& pending);
  std::string Assemble(Pending& pending);
  // One request with retries; the response body, or the error after the last try.
  Result<std::string> Send(Worker& worker, const std::string& body, size_t first_record, size_t count);
  void DataLog(Worker& worker, const std::string& line);
  void StopInstances(bool detach);
  void Finish(const std::string& failure_reason);

  const Context context_;
  const std::string name_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> finished_{false};
  net::CancelSignal cancel_;  // cut every request in flight (stop, shutdown)

  // Owned by the run's thread (workers read them, constant once they start).
  nlohmann::json request_;
  nlohmann::json container_;
  std::string role_arn_;
  aws::Credential credential_;
  std::string network_;
  std::vector<std::unique_ptr<Worker>> workers_;
  serving::SplitType split_ = serving::SplitType::kNone;
  serving::AssembleWith assemble_ = serving::AssembleWith::kNone;
  serving::RecordFormat input_format_ = serving::RecordFormat::kOther;
  serving::RecordFormat output_format_ = serving::RecordFormat::kOther;
  std::optional<serving::JsonPath> input_filter_, output_filter_;
  bool join_ = false;
  bool gzip_ = false;
  std::string content_type_, accept_;
  int timeout_seconds_ = 600;
  int max_retries_ = 3;
  std::string output_bucket_, output_prefix_;
};

}  // namespace kiln::control
