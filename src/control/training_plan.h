#pragma once
// The pure decisions of the training controller: what a job's request and state say to do now,
// with no I/O, no threads and no clock of its own (the caller passes `now`). The controller and
// the per-job run (training_job_run.h) execute what these return; the tests are tables of cases.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/scheduler.h"

namespace kiln::control::training {

// Secondary status messages (training-contract.md §14).
inline constexpr char kMsgPreparing[] = "Preparing the instances for training";
inline constexpr char kMsgDownloading[] = "Downloading input data";
inline constexpr char kMsgTraining[] = "Training image download completed. Training in progress.";
inline constexpr char kMsgUploading[] = "Uploading generated training model";
inline constexpr char kMsgCompleted[] = "Training job completed";
inline constexpr char kMsgStopping[] = "Stopping the training job";
inline constexpr char kMsgStopped[] = "Training job stopped";
inline constexpr char kMsgMaxRuntime[] = "Job stopped because max runtime was exceeded";
inline constexpr char kMsgMaxPending[] = "Job stopped because max pending time was exceeded";
inline constexpr char kMsgWaiting[] = "Waiting for compute capacity";

// "; <what the scheduler gave instead of the full shape>" (the first note), or "".
std::string AllocationNote(const std::vector<Allocation>& allocations);

// `seconds` as milliseconds, saturating instead of overflowing.
int64_t SecondsToMillisSaturating(int64_t seconds);
// `at + millis` without overflow (a deadline far in the future stays in the far future).
int64_t AddSaturating(int64_t at, int64_t millis);

// A seconds member of the request's StoppingCondition: integers as sent, fractional numbers
// truncated (as the validator and AWS do), `fallback` when absent or not a number. (Rows written
// before the validator checked it, or by other paths, may hold anything.)
int64_t StoppingSeconds(const nlohmann::json& request, const char* member, int64_t fallback);
// StoppingCondition.MaxRuntimeInSeconds, 86400 when absent.
int64_t MaxRuntimeSeconds(const nlohmann::json& request);

}  // namespace kiln::control::training
