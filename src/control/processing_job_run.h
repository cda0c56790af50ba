#pragma once
// ProcessingJobRun: one processing job from its grant (or its adoption after a restart) to its
// terminal status, on a thread of its own (processing_controller.h says who creates and joins it).
//
//   granted:  grant recorded → Prepare (job network, host directories, /opt/ml layout with
//             processingjobconfig.json and resourceconfig.json) → Stage (image check and pull,
//             File inputs downloaded, Pipe FIFOs and feeders) → Launch (one instance per host,
//             credentials, log pumps, Continuous output syncs) → Monitor → Finish.
//   adopted:  Adopt (pumps resumed at their offsets, feeders and Continuous syncs restarted; a host
//             whose instance is gone counts as lost) → Monitor → Finish.
//   Monitor:  until every host exited: a stop (RequestStop, or MaxRuntimeInSeconds counted from
//             ProcessingStartTime, recorded as Stopping / MaxRuntimeExceeded first) stops every
//             host (Runtime::Stop: SIGTERM, stop_grace, SIGKILL); a host that fails stops the
//             others the same way (the job fails with that host's reason).
//   Finish:   pumps drained, feeders stopped, outputs uploaded (Continuous: a final pass;
//             EndOfJob: every file now — after failures and stops too), ExitMessage read, then the
//             terminal status: Stopped for a stop; otherwise Completed iff every host exited 0 and
//             the outputs and the message could be handled, else Failed with FailureReason
//             (training_plan.h's FailureReason over the hosts: /opt/ml/output/failure,
//             "AlgorithmError: <last stderr line>, exit code: N", OutOfMemory, lost), or the
//             output/message error. A failure before launch fails the job with its reason
//             ("ClientError: ..." / "InternalServerError: ...") and uploads nothing; a stop
//             before launch ends Stopped.
//   Cleanup:  credentials revoked, instances removed, the job network removed, host directories
//             deleted (unless keep_host_dirs); the grant is released by the controller
//             (Context::on_finished).
//
// Threads: Run() executes on the run's own thread; RequestStop() and Shutdown() may be called
// from any thread (atomics plus a cancel of the staging transfers; the monitor notices within one
// Runtime::Wait of 250 ms). The row is written only through ProcessingJobRepository::Mutate. A
// shutting-down run leaves its instances running and writes nothing more.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkpoints.h"
#include "agent/transfer.h"
#include "base/status.h"
#include "control/processing_controller.h"
#include "control/scheduler.h"
#include "control/training_plan.h"
#include "store/processing_job_repository.h"

namespace kiln::control {

class ProcessingJobRun {
 public:
  struct Context {
    const ProcessingControllerOptions* options = nullptr;  // outlive the run
    const ProcessingControllerDeps* deps = nullptr;
    store::ProcessingJobRepository* jobs = nullptr;
    // Called on the run's thread as its last step: release the grant, mark the run joinable.
    std::function<void(const std::string& name)> on_finished;
  };

  // `adopt`: the job was launched under a previous server (its allocations re-reserved).
  ProcessingJobRun(Context context, std::string name, std::vector<Allocation> allocations, bool adopt);
  // Join() must have returned (or Start() never been called) before destruction.
  ~ProcessingJobRun();
  ProcessingJobRun(const ProcessingJobRun&) = delete;
  ProcessingJobRun& operator=(const ProcessingJobRun&) = delete;

  void Start();
  // The row says Stopping (StopProcessingJob): stop the hosts (or abandon staging), end Stopped.
  void RequestStop();
  // The server is going: leave the instances running, write nothing more, return soon.
  void Shutdown();
  void Join();

 private:
  struct Host;

  const ProcessingControllerOptions& options() const { return *context_.options; }
  const ProcessingControllerDeps& deps() const { return *context_.deps; }
  int64_t Now() const;

  void Run();
  void RunSteps();
  // Writes the grant to the row; false when the job is no longer active (stopped meanwhile).
  bool RecordGrant();
  Status Prepare(const store::ProcessingJobRecord& record);
  Status Stage();
  Status Launch(const store::ProcessingJobRecord& record);
  void Adopt(const store::ProcessingJobRecord& record);
  void Monitor();
  void ObserveHosts();
  void StopHosts();
  void StartPump(Host& host, int64_t offset);
  void StopPumps(bool drain);
  // Pipe inputs of `host`: a feeder whose FIFOs are <LocalPath>_<epoch> (see the .cc).
  Status StartFeeder(Host& host, bool resume);
  Result<std::vector<std::unique_ptr<agent::CheckpointSync>>> MakeOutputSyncs(const Host& host,
                                                                              const std::string& mode);
  void StopAgents();
  // Uploads the outputs of every host (the final Continuous pass, then EndOfJob); the first error.
  Status UploadOutputs();
  void Finish(bool ran);
  void Fail(const training::JobFailure& failure);
  void Cleanup();

  const Context context_;
  const std::string name_;
  const std::vector<Allocation> allocations_;
  const bool adopt_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> shutting_down_{false};
  agent::CancelFlag cancel_;

  // Owned by the run's thread.
  nlohmann::json request_;
  std::string arn_;
  std::string job_dir_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::optional<runtime::ImageResolution> image_;  // resolved in Stage
  int64_t start_millis_ = 0;                       // ProcessingStartTime
};

}  // namespace kiln::control
