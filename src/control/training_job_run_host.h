#pragma once
// Private to control/training_job_run*.cc: one host of a TrainingJobRun, with what the run keeps
// for it (its instance, exit, log pump, Pipe feeder, checkpoint and output syncs).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/checkpoints.h"
#include "agent/pipe_feeder.h"
#include "control/log_pump.h"
#include "control/training_job_run.h"

namespace kiln::control {

struct TrainingJobRun::Host {
  std::string host;     // algo-<n>
  int shard_index = 0;  // position in the sorted hosts list (ShardedByS3Key)
  std::string instance_id;
  std::string root;    // <work_dir>/<job>/algo-<n>
  std::string opt_ml;  // root/opt_ml
  std::string log_stream;
  int64_t started_millis = 0;
  bool exited = false;
  int exit_code = -1;
  int term_signal = 0;
  bool oom_killed = false;       // the runtime says the kernel's OOM killer ended it
  std::string lost_reason;       // lost: why, as the runtime says it ("" when it does not know)
  bool stopped_by_kiln = false;  // it ended after Kiln stopped it (a stop, MaxRuntime, a peer's failure)
  std::unique_ptr<LogPump> pump;
  std::unique_ptr<agent::PipeFeeder> feeder;
  std::unique_ptr<agent::CheckpointSync> checkpoints;
  // Debugger tensors, TensorBoard and profiler output: LocalPath synced to S3 during the run.
  std::vector<std::unique_ptr<agent::CheckpointSync>> output_syncs;
  // What Launch gave the runtime (empty for an adopted host): the hold after exit starts its
  // post-mortem instance from it (training_hold.h).
  std::optional<runtime::InstanceSpec> spec;
  std::string held_instance_id;  // the post-mortem instance while one runs
};

}  // namespace kiln::control
