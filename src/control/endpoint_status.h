#pragma once
// What DescribeEndpoint says about a variant while its instances are provisioned, and the words
// of the capacity failure (spec/serving-contract.md §1 step 1). Pure functions, so that the
// endpoint controller's decisions about status text are tables of cases in their test.
//
// VariantStatus (ProductionVariantSummary.VariantStatus, enum Creating|Updating|Deleting|
// ActivatingTraffic|Baking in the API model) lists operations in progress. AWS has no "Failed"
// variant status: a Failed endpoint's variants list no entry, and neither does an InService
// endpoint with nothing starting.
//
// Thread-safety: free functions, no state.

#include <chrono>
#include <string>

#include <vector>

#include <nlohmann/json.hpp>

#include "store/endpoint_state.h"

namespace kiln::control {

// Where one production variant stands, as the endpoint controller sees it.
struct VariantProgress {
  store::EndpointStatus endpoint_status = store::EndpointStatus::kCreating;
  bool provisioning = false;  // one of the variant's instances is starting (not yet healthy)
  // The capacity wait of one of its instances ("Waiting for compute capacity: ..."), or empty.
  std::string waiting_for;
  double start_time = 0;  // epoch seconds of the operation (the endpoint's last change)
};

// The VariantStatus entries for `progress`: an empty array unless the endpoint is Creating or
// Updating or an instance is starting (a replacement of an InService endpoint: Updating). The
// entry's StatusMessage is the capacity wait when there is one (AWS's VariantStatusMessage allows
// 1024 characters; longer text is cut), else "Starting and health-checking instances." while an
// instance starts.
std::vector<store::VariantStatusEntry> VariantStatusEntries(const VariantProgress& progress);

// The provision budget of a variant: its VariantInstanceProvisionTimeoutInSeconds when set (the
// API validated 300–3600), else `fallback` (the operator's endpoints.provision_timeout_seconds).
std::chrono::seconds ProvisionTimeout(const nlohmann::json& config_variant, std::chrono::seconds fallback);

// StatusMessage while an instance waits for capacity under the strict policy. `shortfall` is
// Scheduler::AllocateNow's Unavailable message ("ml.m5.xlarge needs 4 vCPUs and 16 GiB; 0 of 2
// vCPUs free"):
//   "Waiting for compute capacity: <shortfall> (scheduler policy strict). The instance fails if
//    it cannot start within VariantInstanceProvisionTimeoutInSeconds (<n> s; <left> s left)."
std::string CapacityWaitMessage(const std::string& shortfall, std::chrono::seconds timeout, std::chrono::seconds left);

// FailureReason once the provision budget is spent, AWS's sentence first (what clients match on)
// and then what Kiln knows:
//   "Unable to provision requested ML compute capacity. Please retry using a different ML
//    instance type. Kiln: production variant AllTraffic waited <n> s
//    (VariantInstanceProvisionTimeoutInSeconds) for capacity on this host (scheduler policy
//    strict): <shortfall>."
std::string CapacityTimeoutReason(const std::string& variant, const std::string& shortfall,
                                  std::chrono::seconds timeout);

// FailureReason for a type that can never run on this host (Scheduler::CheckFeasible's message,
// e.g. a GPU type on a host without GPUs): AWS's sentence, then "Kiln: production variant <v>: <why>."
std::string CapacityNeverReason(const std::string& variant, const std::string& why);

}  // namespace kiln::control
