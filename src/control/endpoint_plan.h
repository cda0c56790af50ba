#pragma once
// The endpoint controller's planning step: from an endpoint's row and what its instances are
// doing now, the actions that move it toward the row's desired state. Pure (no clock, no store,
// no threads), so each decision is a table of cases in endpoint_plan_test.cc; the endpoint run
// (control/endpoint_controller.cc) executes the actions in order.
//
// What it decides, for an endpoint that is neither Deleting nor Failed (those two are handled
// by the run directly: stop everything, and for Deleting remove the row once all are stopped):
//   - instances of neither deployment, or of variants the target no longer has: stop;
//   - a failed instance not yet acted on: mark handled, stop it; if it runs the target
//     deployment, its variant's replacement backoff grows (replacement_backoff, doubling up to
//     60 s) and its reason fails a Creating endpoint (FailEndpoint) or rolls back an update
//     (RollBack) — an InService endpoint just replaces it after the backoff;
//   - per variant of the target deployment (the pending one while an update runs): launch the
//     missing instances (once the backoff allows; else wake at its end), or stop the surplus
//     (not-yet-healthy ones first, then the newest);
//   - when every variant has its desired healthy instances and none is surplus: Complete
//     (InService; an update's pending deployment becomes the deployment, moving all traffic in
//     one snapshot);
//   - an update under a DeploymentConfig (control/endpoint_rollout.h): DecideRollout's move —
//     Shift (record the next traffic step or the termination wait and route by it), a bake's
//     hold (Publish and look again), Complete, or RollBack (an alarm in ALARM, the
//     MaximumExecutionTimeout); a rolling update's batches set the new variant's desired count
//     and how many old instances stay (the surplus stopped, not-yet-healthy and newest first);
//   - RollingBack (an update rolled back after traffic had shifted): the rolled-back fleet stays
//     until the current deployment has its desired healthy instances (it serves only while the
//     old fleet has none routable), then goes; InService (Complete) once no other instance is
//     left; a failure of the current deployment's instance meanwhile: kRollbackFailed;
//   - otherwise Publish: route and record the observed state of the deployment that serves
//     (the current one while an update's new fleet comes up).
//
// Thread-safety: pure functions.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "store/endpoint_repository.h"
#include "store/endpoint_state.h"

namespace kiln::control {

// One instance as the plan sees it (EndpointInstance's state at the start of the pass).
struct ObservedInstance {
  std::string instance_id;
  std::string variant;
  int64_t generation = 0;
  bool healthy = false;
  bool failed = false;
  bool failure_handled = false;  // a failure an earlier pass acted on
  bool stop_requested = false;
  int64_t launched_millis = 0;
  std::string failure_reason;
};

// A variant's wait before the next replacement (after a failure of its target instances).
struct ReplacementBackoff {
  std::chrono::milliseconds delay{0};
  int64_t not_before = 0;  // in the controller's deadline milliseconds
  bool operator==(const ReplacementBackoff&) const = default;
};

struct PlanInput {
  const store::EndpointRecord* record = nullptr;
  std::vector<ObservedInstance> instances;
  std::map<std::string, ReplacementBackoff> backoff;  // by variant
  int64_t now = 0;                                    // deadline milliseconds
  std::chrono::milliseconds replacement_backoff{1000};
  // Guarded updates (control/endpoint_rollout.h): the wall clock (bakes and the execution timeout
  // are recorded in it), a watched AutoRollbackConfiguration alarm now in ALARM ("" when none),
  // and how often a bake looks at the alarms again.
  int64_t wall_now = 0;
  std::string alarm{};
  int64_t alarm_poll_millis = 500;
};

struct EndpointAction {
  enum class Kind {
    kHandleFailure,   // instance_id: its failure is acted on
    kSetBackoff,      // variant, backoff
    kClearBackoff,    // variant: its desired instances are healthy again
    kStopInstance,    // instance_id: drain and stop it
    kLaunch,          // variant, count: launch that many of the target deployment
    kRetryAt,         // when: reconcile again then (a backoff's end)
    kFailEndpoint,    // reason: a Creating endpoint fails (terminal for this pass)
    kRollBack,        // reason: an update fails, the old fleet stays (terminal)
    kComplete,        // promote_pending: InService now (terminal)
    kPublish,         // route and record the serving deployment (terminal)
    kShift,           // rollout: record it and route by it (terminal)
    kRollbackFailed,  // reason: RollingBack ends UpdateRollbackFailed (terminal)
  };
  Kind kind;
  std::string instance_id;
  std::string variant;
  int count = 0;
  int64_t when = 0;
  ReplacementBackoff backoff;
  std::string reason;
  bool promote_pending = false;
  store::RolloutState rollout{};  // kShift
  bool operator==(const EndpointAction&) const = default;
};

std::string_view ToString(EndpointAction::Kind kind);

// The actions of one reconcile pass; the last is always terminal (kFailEndpoint, kRollBack,
// kComplete, kPublish, kShift or kRollbackFailed). Precondition: record->status is neither Deleting nor Failed.
std::vector<EndpointAction> PlanEndpoint(const PlanInput& input);

// The instance count a variant should have: the desired count when set, else the deployment's
// InitialInstanceCount (default 1), 0 for a variant it does not have.
int DesiredCount(const store::EndpointRecord& record, const store::Deployment& deployment, const std::string& variant);
// The weight traffic should have: the desired weight when the variant has a desired entry
// (default 1), else InitialVariantWeight (default 1).
double DesiredWeight(const store::EndpointRecord& record, const store::Deployment& deployment,
                     const std::string& variant);
// The weight traffic uses now: during an UpdateEndpoint the old deployment keeps the weights it
// had (remembered in the observed state); otherwise the desired ones take effect at once.
double CurrentWeight(const store::EndpointRecord& record, const store::Deployment& routed, const std::string& variant);

}  // namespace kiln::control
