#include "control/training_states.h"

#include <atomic>
#include <string>

#include "base/log.h"

namespace kiln::control {
namespace {

using store::TrainingJobStatus;
using store::TrainingPhase;

std::atomic<int64_t> illegal_transitions{0};

struct PhaseEdge {
  TrainingPhase from;
  TrainingPhase to;
};
constexpr PhaseEdge kPhaseEdges[] = {
    {TrainingPhase::kQueued, TrainingPhase::kStaging},     // granted
    {TrainingPhase::kQueued, TrainingPhase::kDone},        // stopped, MaxPendingTime, not schedulable
    {TrainingPhase::kStaging, TrainingPhase::kRunning},    // launched
    {TrainingPhase::kStaging, TrainingPhase::kDone},       // staging failed, or stopped
    {TrainingPhase::kStaging, TrainingPhase::kQueued},     // retried; re-queued by a restart
    {TrainingPhase::kRunning, TrainingPhase::kFinishing},  // every host exited
    {TrainingPhase::kRunning, TrainingPhase::kQueued},     // interrupted (managed spot): resumes later
    {TrainingPhase::kFinishing, TrainingPhase::kDone},     // uploaded, terminal status written
    {TrainingPhase::kFinishing, TrainingPhase::kQueued},   // retried (RetryStrategy)
};

struct StatusEdge {
  TrainingJobStatus from;
  TrainingJobStatus to;
};
constexpr StatusEdge kStatusEdges[] = {
    {TrainingJobStatus::kInProgress, TrainingJobStatus::kStopping},  // StopTrainingJob, MaxRuntime
    {TrainingJobStatus::kInProgress, TrainingJobStatus::kCompleted},
    {TrainingJobStatus::kInProgress, TrainingJobStatus::kFailed},
    {TrainingJobStatus::kInProgress, TrainingJobStatus::kStopped},  // MaxPendingTime
    {TrainingJobStatus::kStopping, TrainingJobStatus::kStopped},
    {TrainingJobStatus::kStopping, TrainingJobStatus::kFailed},  // failed before the stop took
};

void Illegal(const store::TrainingJobRecord& record, const char* what, std::string_view from, std::string_view to) {
  illegal_transitions.fetch_add(1);
  KLOG(error, "internal error: illegal training job transition",
       {{"job", record.name}, {"what", what}, {"from", std::string(from)}, {"to", std::string(to)}});
}

}  // namespace

bool IsLegal(TrainingPhase from, TrainingPhase to) {
  if (from == to) return true;
  for (const PhaseEdge& e : kPhaseEdges) {
    if (e.from == from && e.to == to) return true;
  }
  return false;
}

bool IsLegal(TrainingJobStatus from, TrainingJobStatus to) {
  if (from == to) return true;
  for (const StatusEdge& e : kStatusEdges) {
    if (e.from == from && e.to == to) return true;
  }
  return false;
}

void SetPhase(store::TrainingJobRecord& record, TrainingPhase to) {
  if (!IsLegal(record.state.phase, to)) Illegal(record, "phase", ToString(record.state.phase), ToString(to));
  record.state.phase = to;
}

void SetStatus(store::TrainingJobRecord& record, TrainingJobStatus to) {
  if (!IsLegal(record.status, to)) Illegal(record, "status", ToString(record.status), ToString(to));
  record.status = to;
}

int64_t IllegalTrainingTransitions() { return illegal_transitions.load(); }

}  // namespace kiln::control
