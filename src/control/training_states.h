#pragma once
// The legal changes of a training job's phase and status: one table each, consulted whenever the
// controller (or the API's stop request) changes them.
//
//   phase:   queued ──► staging ──► running ──► finishing ──► done
//              │          │  ▲        │            │
//              │          ▼  │        ▼            ▼
//              └──────► done └──── queued ◄────────┘        (queued again: a retry, or a
//                                                            restart re-queueing a staging job)
//   status:  InProgress ──► Stopping ──► Stopped | Failed
//            InProgress ──► Completed | Failed | Stopped
//
// Staying in the same phase or status is always legal (an idempotent write, e.g. an adopted
// finishing job finishing again). Completed, Failed and Stopped are terminal, and so is done.
//
// An illegal change is a bug in Kiln, not a user error: SetPhase/SetStatus log it as an internal
// error and count it (the controller tests assert the count stays 0), and still make the change,
// so that a job is never left stuck by the check itself.

#include <cstdint>

#include "store/training_job_repository.h"
#include "store/training_job_state.h"

namespace kiln::control {

bool IsLegal(store::TrainingPhase from, store::TrainingPhase to);
bool IsLegal(store::TrainingJobStatus from, store::TrainingJobStatus to);

// Sets record.state.phase / record.status to `to`, logging (and counting) an illegal change.
void SetPhase(store::TrainingJobRecord& record, store::TrainingPhase to);
void SetStatus(store::TrainingJobRecord& record, store::TrainingJobStatus to);

// Illegal changes seen by this process so far (thread-safe).
int64_t IllegalTrainingTransitions();

}  // namespace kiln::control
