#include "control/training_states.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace kiln::control {
namespace {

using store::TrainingJobStatus;
using store::TrainingPhase;

constexpr TrainingPhase kAllPhases[] = {TrainingPhase::kQueued, TrainingPhase::kStaging, TrainingPhase::kRunning,
                                        TrainingPhase::kFinishing, TrainingPhase::kDone};
constexpr TrainingJobStatus kAllStatuses[] = {TrainingJobStatus::kInProgress, TrainingJobStatus::kCompleted,
                                              TrainingJobStatus::kFailed, TrainingJobStatus::kStopping,
                                              TrainingJobStatus::kStopped};

// Every (from, to) pair of phases: exactly these changes (besides staying) are legal.
TEST(TrainingStatesTest, PhaseTable) {
  const std::set<std::pair<std::string_view, std::string_view>> legal = {
      {"queued", "staging"}, {"queued", "done"},      {"staging", "running"},
      {"staging", "done"},   {"staging", "queued"},   {"running", "finishing"},
      {"finishing", "done"}, {"finishing", "queued"}, {"running", "queued"},  // a managed-spot interruption
  };
  for (TrainingPhase from : kAllPhases) {
    for (TrainingPhase to : kAllPhases) {
      const bool expected = from == to || legal.contains({ToString(from), ToString(to)});
      EXPECT_EQ(IsLegal(from, to), expected) << ToString(from) << " -> " << ToString(to);
    }
  }
}

TEST(TrainingStatesTest, StatusTable) {
  const std::set<std::pair<std::string_view, std::string_view>> legal = {
      {"InProgress", "Stopping"}, {"InProgress", "Completed"}, {"InProgress", "Failed"},
      {"InProgress", "Stopped"},  {"Stopping", "Stopped"},     {"Stopping", "Failed"},
  };
  for (TrainingJobStatus from : kAllStatuses) {
    for (TrainingJobStatus to : kAllStatuses) {
      const bool expected = from == to || legal.contains({ToString(from), ToString(to)});
      EXPECT_EQ(IsLegal(from, to), expected) << ToString(from) << " -> " << ToString(to);
    }
  }
}

TEST(TrainingStatesTest, AnIllegalChangeIsCountedAndStillMade) {
  store::TrainingJobRecord record;
  record.name = "j";
  const int64_t before = IllegalTrainingTransitions();
  SetPhase(record, TrainingPhase::kStaging);
  SetStatus(record, TrainingJobStatus::kStopping);
  EXPECT_EQ(IllegalTrainingTransitions(), before);
  SetPhase(record, TrainingPhase::kFinishing);  // staging -> finishing skips running
  EXPECT_EQ(record.state.phase, TrainingPhase::kFinishing);
  SetStatus(record, TrainingJobStatus::kCompleted);  // a stopping job does not complete
  EXPECT_EQ(record.status, TrainingJobStatus::kCompleted);
  EXPECT_EQ(IllegalTrainingTransitions(), before + 2);
  SetStatus(record, TrainingJobStatus::kInProgress);  // terminal
  EXPECT_EQ(IllegalTrainingTransitions(), before + 3);
}

}  // namespace
}  // namespace kiln::control
