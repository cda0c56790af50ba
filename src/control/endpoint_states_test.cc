#include "control/endpoint_states.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace kiln::control {
namespace {

using store::EndpointStatus;

constexpr EndpointStatus kAllStatuses[] = {
    EndpointStatus::kOutOfService,   EndpointStatus::kCreating,    EndpointStatus::kUpdating,
    EndpointStatus::kSystemUpdating, EndpointStatus::kRollingBack, EndpointStatus::kInService,
    EndpointStatus::kDeleting,       EndpointStatus::kFailed,      EndpointStatus::kUpdateRollbackFailed};
constexpr InstancePhase kAllPhases[] = {
    InstancePhase::kProvisioning, InstancePhase::kStarting, InstancePhase::kInService, InstancePhase::kFailed,
    InstancePhase::kDraining,     InstancePhase::kStopped,  InstancePhase::kDetached};

// Every (from, to) pair of statuses: exactly these changes (besides staying) are legal.
TEST(EndpointStatesTest, StatusTable) {
  const std::set<std::pair<std::string_view, std::string_view>> legal = {
      {"Creating", "InService"},       {"Creating", "Failed"},
      {"InService", "Updating"},       {"Updating", "InService"},
      {"SystemUpdating", "InService"}, {"Updating", "RollingBack"},
      {"RollingBack", "InService"},    {"RollingBack", "UpdateRollbackFailed"},
      {"OutOfService", "Deleting"},    {"Creating", "Deleting"},
      {"Updating", "Deleting"},        {"SystemUpdating", "Deleting"},
      {"RollingBack", "Deleting"},     {"InService", "Deleting"},
      {"Failed", "Deleting"},          {"UpdateRollbackFailed", "Deleting"},
  };
  for (EndpointStatus from : kAllStatuses) {
    for (EndpointStatus to : kAllStatuses) {
      const bool expected = from == to || legal.contains({store::ToString(from), store::ToString(to)});
      EXPECT_EQ(IsLegal(from, to), expected) << store::ToString(from) << " -> " << store::ToString(to);
    }
  }
}

TEST(EndpointStatesTest, InstancePhaseTable) {
  const std::set<std::pair<std::string_view, std::string_view>> legal = {
      {"provisioning", "starting"}, {"provisioning", "failed"},   {"provisioning", "draining"},
      {"starting", "in-service"},   {"starting", "failed"},       {"starting", "draining"},
      {"in-service", "failed"},     {"in-service", "draining"},   {"failed", "draining"},
      {"draining", "stopped"},      {"provisioning", "detached"}, {"starting", "detached"},
      {"in-service", "detached"},   {"failed", "detached"},       {"draining", "detached"},
  };
  for (InstancePhase from : kAllPhases) {
    for (InstancePhase to : kAllPhases) {
      const bool expected = from == to || legal.contains({ToString(from), ToString(to)});
      EXPECT_EQ(IsLegal(from, to), expected) << ToString(from) << " -> " << ToString(to);
    }
  }
}

TEST(EndpointStatesTest, IllegalChangesAreCountedAndStillMade) {
  store::EndpointRecord record;
  record.name = "ep";
  record.status = EndpointStatus::kCreating;
  const int64_t before = IllegalEndpointTransitions();
  SetStatus(record, EndpointStatus::kInService);
  EXPECT_EQ(IllegalEndpointTransitions(), before);
  EXPECT_EQ(record.status, EndpointStatus::kInService);
  SetStatus(record, EndpointStatus::kInService);  // staying is legal
  EXPECT_EQ(IllegalEndpointTransitions(), before);
  record.status = EndpointStatus::kDeleting;
  SetStatus(record, EndpointStatus::kCreating);  // Deleting is terminal: a bug, logged, made
  EXPECT_EQ(IllegalEndpointTransitions(), before + 1);
  EXPECT_EQ(record.status, EndpointStatus::kCreating);
  CheckInstancePhaseChange("ep", "i-1", InstancePhase::kStopped, InstancePhase::kInService);
  EXPECT_EQ(IllegalEndpointTransitions(), before + 2);
  CheckInstancePhaseChange("ep", "i-1", InstancePhase::kStarting, InstancePhase::kInService);
  EXPECT_EQ(IllegalEndpointTransitions(), before + 2);
}

}  // namespace
}  // namespace kiln::control
