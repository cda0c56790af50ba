#pragma once
// TrainingQueueView: what the API may read of the training queue, and nothing else.
//
// A queued job's place in line changes with every grant, so it is never written to the job's row
// (with 2,000 jobs queued, rewriting every row after every pass was ~1.9 million fsync'd writes
// to drain the queue: issue 11). The row records Pending once, with what the job waits for; the
// API asks this view for the live message when it renders the job (DescribeTrainingJob).
//
// Thread-safety: implementations answer from any thread.

#include <string>

namespace kiln::control {

class TrainingQueueView {
 public:
  virtual ~TrainingQueueView() = default;
  // The StatusMessage of a job waiting for capacity, read from the live queue: what it waits for
  // and its place in line, e.g. "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and
  // 8 GiB; 0 of 2 vCPUs free (2 jobs ahead)". Empty when the job is not queued (granted,
  // finished, unknown): the row's own message stands.
  virtual std::string PendingMessage(const std::string& job_name) const = 0;
};

}  // namespace kiln::control
