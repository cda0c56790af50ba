#pragma once
// Judging a hyperparameter tuning job's trials (issue 17): the median stopping rule of
// TrainingJobEarlyStoppingType Auto, asynchronous Hyperband, and TuningJobCompletionCriteria.
//
// Everything here is a pure function of its arguments (no clocks, no randomness, no hidden
// state), so the tuning controller can recompute every decision from the stored trials after a
// restart and reach the same verdicts.
//
// Losses throughout: lower is better. The controller negates the values of a Maximize objective
// before calling in, so "worse" always means "larger". A curve is one trial's objective values
// in the order the trial reported them, one value per report; the number of reports is the
// trial's "resource" (epochs, for a script that reports once per epoch).
//
// Thread-safety: free functions over values; Hyperband is an immutable value (const methods only).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace kiln::control::tuning {

// ---------------------------------------------------------------------------------------------
// The median stopping rule (TrainingJobEarlyStoppingType Auto).
//
// AWS ("Stop Training Jobs Early", How Early Stopping Works): after each epoch, take the objective
// value; compute, for every previous training job, the running average of its objective up to
// the same epoch and the median of those running averages; stop the current job when its value
// is worse than that median.
//
// Kiln's reading, where AWS leaves it open:
//   * "the same epoch" is the report count s = curve.size(): the running trial's current value
//     curve[s-1] is compared with, for each completed trial that reported at least s values, the
//     mean of its first s values. A completed trial with fewer than s reports has no running
//     average at s and does not take part (a trial running longer than all completed ones is
//     never stopped past their length).
//   * "previous training jobs" are the completed ones the caller passes (the controller passes
//     the curves of this job's Completed trials).
//   * The rule judges only when at least `min_completed` completed trials take part at s and the
//     trial has at least `min_steps` reports, so that one noisy first value or a lone reference
//     trial does not end a trial.
//   * "Worse" is strictly greater than the median (a tie continues); with an even number of
//     running averages the median is the mean of the middle two.
//   * Non-finite values: a running trial whose current value is NaN or +inf is worse than any
//     median (a diverged loss); NaN/inf values inside a completed curve are left out of its
//     running average (a completed curve with no finite value up to s does not take part).
struct MedianRule {
  // Completed trials that must have reached the running trial's report count before it is judged.
  int min_completed = 3;
  // Reports the running trial must have made before it can be stopped.
  int min_steps = 2;
};

// `curve`: the running trial's losses; `completed`: completed trials' loss curves. Returns the
// reason (a sentence fragment naming the report count and the number of trials compared) when the
// trial must stop, nullopt when it continues.
std::optional<std::string> MedianStop(const std::vector<double>& curve,
                                      const std::vector<std::vector<double>>& completed, const MedianRule& rule = {});

// ---------------------------------------------------------------------------------------------
// Asynchronous Hyperband: successive halving run asynchronously (ASHA) inside each of several
// brackets, in the manner of the AWS blog post that introduced Hyperband to SageMaker (Hyperband
// "uses Asynchronous Successive Halving") and of Ray Tune's AsyncHyperBand.
//
//   r = MinResource, R = MaxResource, eta = 3 (the reduction factor).
//   Brackets b = 0 .. s_max, s_max = floor(log_eta(R / r)). Bracket b judges its trials at the
//   rungs r·eta^(b+k), k = 0, 1, ..., every rung < R: bracket 0 is the most aggressive (first
//   judged at r), the last bracket judges least (when r·eta^s_max == R it has no rung at all and
//   its trials run to R, like the last bracket of synchronous Hyperband). No trial is stopped by a
//   rung before it reported r values (AWS: "If the value for MinResource has not been reached, the
//   training job is not stopped by Hyperband").
//
//   Bracket assignment (BracketOf): trial i gets a bracket by smooth weighted round-robin over the
//   brackets with the weights of synchronous Hyperband, w_b = ceil((s_max+1)/(s_max-b+1) ·
//   eta^(s_max-b)) configurations, so that every bracket spends about the same total resource
//   (aggressive brackets get many cheap trials, conservative ones few long trials). In every
//   prefix of trials each bracket's count is within 1.5 of its exact share (checked for every
//   bracket layout Kiln can make: s_max 0..9), each full cycle of sum(w) trials gives bracket b
//   exactly w_b, and the first trial goes to bracket 0. Deterministic: no seed, no state.
//
//   Judging (Judge): when a trial has reported at least rung m values, its loss at report m is
//   ranked against the losses at report m of the other trials of its bracket that reached m
//   (running or ended, whatever their status). Counting itself, n trials have reached m; the trial
//   passes when its rank (1 + the number of others strictly better; ties favour the trial) is at
//   most ceil(n / eta) — the top 1/eta at the time it arrives. The first trial to reach a rung
//   always passes (ASHA's asynchronous promotion: nobody waits for a full rung), so the fraction
//   that passes tends to 1/eta as the rung fills. Each rung is judged once (`judged_rung`), at the
//   first Judge call that sees the trial past it; rungs skipped between two calls are judged in
//   order with the trial's values at those rungs.
//
//   MaxResource: a trial that reported R values is stopped (AWS: "Once a job reaches the
//   MaxResource value, it is stopped"); its objective is its last value.
class Hyperband {
 public:
  // AWS: "The maximum value is 20,000 epochs."
  static constexpr int kMaxResourceLimit = 20000;

  // InvalidArgument unless 1 <= min_resource < max_resource <= kMaxResourceLimit and eta >= 2;
  // the message names MinResource / MaxResource and says what to change.
  static Result<Hyperband> Create(int min_resource, int max_resource, int eta = 3);

  int min_resource() const { return min_resource_; }
  int max_resource() const { return max_resource_; }
  int eta() const { return eta_; }

  // Number of brackets, s_max + 1 (>= 1).
  int brackets() const { return static_cast<int>(weights_.size()); }
  // Trials per cycle of bracket `bracket` (w_b above); 0 for a bracket out of range.
  int BracketWeight(int bracket) const;
  // The bracket of this job's trial `trial_index` (0-based), in [0, brackets()). A negative index
  // is treated as 0.
  int BracketOf(int trial_index) const;
  // Report counts at which a trial of `bracket` is judged, ascending, each < max_resource (empty
  // for the last bracket when r·eta^s_max == R, and for a bracket out of range).
  std::vector<int> Rungs(int bracket) const;

  // The verdict on one trial. judged_rung: how many of the bracket's rungs (Rungs(bracket)[0 ..
  // judged_rung-1]) the trial has passed; store it and pass it back on the next call. reason: why
  // the trial must stop ("" when it continues).
  struct Verdict {
    bool stop = false;
    int judged_rung = 0;
    std::string reason;
  };
  // Judges `curve` (a trial of bracket `bracket` that has already passed `judged_rung` rungs)
  // against `bracket_curves`, the curves of the OTHER trials of the same bracket (the trial's own
  // curve must not be among them). Stops the trial at the first rung it fails, or when it reported
  // max_resource values ("reached MaxResource"); otherwise continues with the new judged_rung.
  // A bracket out of range is judged as having no rungs (only MaxResource applies).
  Verdict Judge(int bracket, int judged_rung, const std::vector<double>& curve,
                const std::vector<std::vector<double>>& bracket_curves) const;

 private:
  Hyperband(int min_resource, int max_resource, int eta, std::vector<int> weights);

  int min_resource_ = 1;
  int max_resource_ = 2;
  int eta_ = 3;
  std::vector<int> weights_;  // w_b, one per bracket
  int total_weight_ = 0;      // sum of weights_ (the round-robin's cycle)
};

// MaxResource of a Hyperband tuning job. `hyperband_config`: the HyperbandStrategyConfig object
// (null or {} when absent); `static_hyperparameters`: the definition's StaticHyperParameters
// (string → string; null or {} when absent).
//   * HyperbandStrategyConfig.MaxResource when set (InvalidArgument when it is not an integer in
//     [1, 20000]).
//   * Else the first of AWS's keys present in StaticHyperParameters, in AWS's order: epochs,
//     numepochs, n-epochs, n_epochs, num_epochs (exact, case-sensitive names). Its value must be a
//     whole number in [1, 20000] written as decimal digits ("10"; Kiln also takes a JSON integer);
//     anything else is InvalidArgument naming the key.
//   * Else InvalidArgument saying to set HyperbandStrategyConfig.MaxResource or one of the keys.
// MinResource is not checked here: Hyperband::Create(MinResource, MaxResource) does that. AWS
// documents no default MinResource; Kiln uses 1 (kDefaultMinResource) when it is absent.
inline constexpr int kDefaultMinResource = 1;
Result<int> InferMaxResource(const nlohmann::json& hyperband_config, const nlohmann::json& static_hyperparameters);

// ---------------------------------------------------------------------------------------------
// TuningJobCompletionCriteria.
//
// AWS documents the criteria loosely ("improve model performance by 1% or greater", "unlikely to
// improve more than 1% over the objective metric from the best training job"); Kiln's rules:
//
//   TargetObjectiveMetricValue: met when any trial's final objective reaches the target (for
//     Minimize: objective <= target; for Maximize: objective >= target — in losses, loss <= the
//     negated target).
//   BestObjectiveNotImproving: walking the losses in the order the trials ended, a trial
//     "improves" when its loss beats the best loss before it by at least 1% of |best| (when the
//     best is exactly 0: by any amount). The first trial with an objective improves. The count of
//     trials since the last improving one is NumberOfTrainingJobsObjectiveNotImproving; the
//     criterion is met when it reaches MaxNumberOfTrainingJobsNotImproving. The best always
//     follows the true minimum (a 0.5% better trial becomes the new best but does not reset the
//     count). A non-finite loss never improves (it counts as not improving).
//   ConvergenceDetected (CompleteOnConvergence Enabled): with n >= kConvergenceMinTrials finite
//     losses, split them into the first floor(n/2) and the rest; converged when the later half
//     improved the best of the earlier half by less than 1% of max(|best|, range of the losses).
//     The later half's gain stands in for what as many more trials would gain, so this reads
//     AWS's "unlikely to improve more than 1% over the best"; the range keeps the threshold
//     meaningful when the best is near 0. `converged` is reported whether or not the criterion is
//     enabled (it feeds ConvergenceDetectedTime); only an enabled criterion ends the job.
// When several criteria are met at once, the reason names the first in the order above.
struct CompletionCriteria {
  std::optional<double> target_loss;     // TargetObjectiveMetricValue as a loss (negated for Maximize)
  std::optional<int> max_not_improving;  // BestObjectiveNotImproving.MaxNumberOfTrainingJobsNotImproving
  bool convergence = false;              // ConvergenceDetected.CompleteOnConvergence == "Enabled"
};

// Minimum number of trials with a finite objective before convergence can be detected.
inline constexpr int kConvergenceMinTrials = 10;

// From a TuningJobCompletionCriteria object (null, {} or a non-object: no criteria) and the
// objective's Type (maximize: negates TargetObjectiveMetricValue). Members of the wrong type are
// ignored (the API model validates the request before it is stored).
CompletionCriteria CompletionCriteriaFromJson(const nlohmann::json& criteria, bool maximize);

struct CompletionCheck {
  std::optional<std::string> reason;  // set when a criterion ends the tuning job (a full sentence)
  int not_improving = 0;              // NumberOfTrainingJobsObjectiveNotImproving
  bool converged = false;             // the convergence rule holds (whether or not it is enabled)
};
// `losses`: the final objective losses of this job's trials that have one, in the order they ended.
CompletionCheck CheckCompletion(const CompletionCriteria& criteria, const std::vector<double>& losses);

}  // namespace kiln::control::tuning
