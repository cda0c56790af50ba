#include "control/tuning_stopping.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>

namespace kiln::control::tuning {
namespace {

using nlohmann::json;

// a is strictly better (a lower loss) than b; NaN is worse than everything, so a diverged trial
// never outranks a finite one and two NaNs tie.
bool Better(double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// A whole number in [1, limit] from a JSON integer or decimal-digit text; nullopt otherwise.
std::optional<int> PositiveInteger(const json& value, int limit) {
  int64_t parsed = 0;
  if (value.is_number_integer()) {
    parsed = value.get<int64_t>();
  } else if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(limit)) return std::nullopt;
    parsed = static_cast<int64_t>(value.get<uint64_t>());
  } else if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty() || text.size() > 9) return std::nullopt;  // 9 digits cannot overflow int64
    for (char c : text) {
      if (c < '0' || c > '9') return std::nullopt;
      parsed = parsed * 10 + (c - '0');
    }
  } else {
    return std::nullopt;
  }
  if (parsed < 1 || parsed > limit) return std::nullopt;
  return static_cast<int>(parsed);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Median rule

std::optional<std::string> MedianStop(const std::vector<double>& curve,
                                      const std::vector<std::vector<double>>& completed, const MedianRule& rule) {
  const size_t steps = curve.size();
  if (steps == 0 || steps < static_cast<size_t>(std::max(1, rule.min_steps))) return std::nullopt;
  std::vector<double> averages;
  for (const std::vector<double>& other : completed) {
    if (other.size() < steps) continue;  // no running average at this report
    double sum = 0;
    int count = 0;
    for (size_t i = 0; i < steps; ++i) {
      if (!std::isfinite(other[i])) continue;
      sum += other[i];
      ++count;
    }
    if (count > 0) averages.push_back(sum / count);
  }
  if (averages.size() < static_cast<size_t>(std::max(1, rule.min_completed))) return std::nullopt;
  const double median = Median(averages);
  const double current = curve[steps - 1];
  if (!(std::isnan(current) || current > median)) return std::nullopt;
  return "its objective at report " + std::to_string(steps) +
         " is worse than the median of the running averages of the " + std::to_string(averages.size()) +
         " completed training jobs that reached that report (TrainingJobEarlyStoppingType Auto)";
}

// ---------------------------------------------------------------------------------------------
// Hyperband

Hyperband::Hyperband(int min_resource, int max_resource, int eta, std::vector<int> weights)
    : min_resource_(min_resource), max_resource_(max_resource), eta_(eta), weights_(std::move(weights)) {
  for (int w : weights_) total_weight_ += w;
}

Result<Hyperband> Hyperband::Create(int min_resource, int max_resource, int eta) {
  if (min_resource < 1) {
    return Status::InvalidArgument("HyperbandStrategyConfig.MinResource (" + std::to_string(min_resource) +
                                   ") must be at least 1.");
  }
  if (max_resource > kMaxResourceLimit) {
    return Status::InvalidArgument("HyperbandStrategyConfig.MaxResource (" + std::to_string(max_resource) +
                                   ") must be at most " + std::to_string(kMaxResourceLimit) + ".");
  }
  if (max_resource <= min_resource) {
    return Status::InvalidArgument("HyperbandStrategyConfig.MinResource (" + std::to_string(min_resource) +
                                   ") must be less than MaxResource (" + std::to_string(max_resource) +
                                   "); lower MinResource or raise MaxResource.");
  }
  if (eta < 2) return Status::InvalidArgument("Hyperband's reduction factor must be at least 2.");

  // s_max = floor(log_eta(R / r)) by integer steps (no floating-point log at the boundaries).
  int s_max = 0;
  for (int64_t resource = min_resource; resource * eta <= max_resource; resource *= eta) ++s_max;
  // Synchronous Hyperband's bracket sizes: bracket b starts at r·eta^b, i.e. Li et al.'s bracket
  // s = s_max - b with n_s = ceil((s_max+1)/(s+1) · eta^s) configurations.
  std::vector<int> weights;
  for (int b = 0; b <= s_max; ++b) {
    const int s = s_max - b;
    int64_t power = 1;
    for (int i = 0; i < s; ++i) power *= eta;  // eta^s <= R / r <= 20000
    weights.push_back(static_cast<int>(((s_max + 1) * power + s) / (s + 1)));
  }
  return Hyperband(min_resource, max_resource, eta, std::move(weights));
}

int Hyperband::BracketWeight(int bracket) const { return bracket >= 0 && bracket < brackets() ? weights_[bracket] : 0; }

int Hyperband::BracketOf(int trial_index) const {
  // Smooth weighted round-robin (each step: every bracket gains its weight, the richest is chosen
  // and pays the total). Its sequence repeats every total_weight_ trials, so only the position in
  // the cycle matters.
  const int64_t steps = std::max(0, trial_index) % total_weight_;
  std::vector<int64_t> credit(weights_.size(), 0);
  int chosen = 0;
  for (int64_t t = 0; t <= steps; ++t) {
    chosen = 0;
    for (size_t b = 0; b < weights_.size(); ++b) {
      credit[b] += weights_[b];
      if (credit[b] > credit[chosen]) chosen = static_cast<int>(b);
    }
    credit[chosen] -= total_weight_;
  }
  return chosen;
}

std::vector<int> Hyperband::Rungs(int bracket) const {
  std::vector<int> rungs;
  if (bracket < 0 || bracket >= brackets()) return rungs;
  int64_t resource = min_resource_;
  for (int i = 0; i < bracket; ++i) resource *= eta_;
  for (; resource < max_resource_; resource *= eta_) rungs.push_back(static_cast<int>(resource));
  return rungs;
}

Hyperband::Verdict Hyperband::Judge(int bracket, int judged_rung, const std::vector<double>& curve,
                                    const std::vector<std::vector<double>>& bracket_curves) const {
  Verdict verdict;
  verdict.judged_rung = std::max(0, judged_rung);
  const std::vector<int> rungs = Rungs(bracket);
  for (size_t k = static_cast<size_t>(verdict.judged_rung); k < rungs.size(); ++k) {
    const size_t rung = static_cast<size_t>(rungs[k]);
    if (curve.size() < rung) break;  // not there yet
    const double mine = curve[rung - 1];
    int reached = 1;  // the trial itself
    int better = 0;
    for (const std::vector<double>& other : bracket_curves) {
      if (other.size() < rung) continue;
      ++reached;
      if (Better(other[rung - 1], mine)) ++better;
    }
    const int rank = better + 1;
    const int allowed = (reached + eta_ - 1) / eta_;  // ceil(reached / eta)
    if (rank > allowed) {
      verdict.stop = true;
      verdict.reason = "at rung " + std::to_string(rung) + " of bracket " + std::to_string(bracket) + " (its report " +
                       std::to_string(rung) + "), its objective ranks " + std::to_string(rank) + " of the " +
                       std::to_string(reached) + " trials of the bracket that reached that rung; only the top " +
                       std::to_string(allowed) + " (1/" + std::to_string(eta_) + ") continue";
      return verdict;
    }
    verdict.judged_rung = static_cast<int>(k) + 1;
  }
  if (curve.size() >= static_cast<size_t>(max_resource_)) {
    verdict.stop = true;
    verdict.reason = "reached MaxResource (" + std::to_string(max_resource_) + " reports)";
  }
  return verdict;
}

Result<int> InferMaxResource(const json& hyperband_config, const json& static_hyperparameters) {
  const std::string range = "an integer from 1 to " + std::to_string(Hyperband::kMaxResourceLimit);
  if (hyperband_config.is_object()) {
    auto it = hyperband_config.find("MaxResource");
    if (it != hyperband_config.end() && !it->is_null()) {
      std::optional<int> max_resource = PositiveInteger(*it, Hyperband::kMaxResourceLimit);
      if (!max_resource || !it->is_number()) {
        return Status::InvalidArgument("HyperbandStrategyConfig.MaxResource must be " + range + ".");
      }
      return *max_resource;
    }
  }
  // AWS's list, in AWS's order.
  static constexpr std::array<std::string_view, 5> kKeys = {"epochs", "numepochs", "n-epochs", "n_epochs",
                                                            "num_epochs"};
  if (static_hyperparameters.is_object()) {
    for (std::string_view key : kKeys) {
      auto it = static_hyperparameters.find(std::string(key));
      if (it == static_hyperparameters.end()) continue;
      if (std::optional<int> max_resource = PositiveInteger(*it, Hyperband::kMaxResourceLimit)) return *max_resource;
      return Status::InvalidArgument("Hyperband reads MaxResource from StaticHyperParameters \"" + std::string(key) +
                                     "\" (" + it->dump() + "), which is not " + range +
                                     "; set it to one, or set HyperbandStrategyConfig.MaxResource.");
    }
  }
  return Status::InvalidArgument(
      "HyperbandStrategyConfig.MaxResource is not set and cannot be inferred: none of the StaticHyperParameters "
      "epochs, numepochs, n-epochs, n_epochs, num_epochs is present; set HyperbandStrategyConfig.MaxResource.");
}

// ---------------------------------------------------------------------------------------------
// Completion criteria

CompletionCriteria CompletionCriteriaFromJson(const json& criteria, bool maximize) {
  CompletionCriteria out;
  if (!criteria.is_object()) return out;
  if (auto it = criteria.find("TargetObjectiveMetricValue"); it != criteria.end() && it->is_number()) {
    const double target = it->get<double>();
    out.target_loss = maximize ? -target : target;
  }
  if (auto it = criteria.find("BestObjectiveNotImproving"); it != criteria.end() && it->is_object()) {
    if (auto max = it->find("MaxNumberOfTrainingJobsNotImproving"); max != it->end() && max->is_number_integer()) {
      out.max_not_improving = max->get<int>();
    }
  }
  if (auto it = criteria.find("ConvergenceDetected"); it != criteria.end() && it->is_object()) {
    if (auto flag = it->find("CompleteOnConvergence"); flag != it->end() && flag->is_string()) {
      out.convergence = flag->get<std::string>() == "Enabled";
    }
  }
  return out;
}

CompletionCheck CheckCompletion(const CompletionCriteria& criteria, const std::vector<double>& losses) {
  CompletionCheck check;

  // BestObjectiveNotImproving's count (always: it is NumberOfTrainingJobsObjectiveNotImproving).
  std::optional<double> best;
  for (double loss : losses) {
    if (!std::isfinite(loss)) {
      ++check.not_improving;
      continue;
    }
    if (!best) {
      best = loss;
      check.not_improving = 0;
      continue;
    }
    // "by 1% or greater": the 1e-9 keeps an exact 1% from failing on rounding.
    const bool improves =
        *best == 0 ? loss < 0 : (*best - loss) > 0 && (*best - loss) >= 0.01 * std::abs(*best) * (1 - 1e-9);
    check.not_improving = improves ? 0 : check.not_improving + 1;
    best = std::min(*best, loss);
  }

  // Convergence (always computed: it feeds ConvergenceDetectedTime).
  std::vector<double> finite;
  for (double loss : losses) {
    if (std::isfinite(loss)) finite.push_back(loss);
  }
  if (finite.size() >= static_cast<size_t>(kConvergenceMinTrials)) {
    const size_t half = finite.size() / 2;
    const double best_earlier = *std::min_element(finite.begin(), finite.begin() + half);
    const auto [lowest, highest] = std::minmax_element(finite.begin(), finite.end());
    const double gain = best_earlier - *lowest;
    check.converged = gain <= 0.01 * std::max(std::abs(*lowest), *highest - *lowest);
  }

  if (criteria.target_loss) {
    for (double loss : losses) {
      if (loss <= *criteria.target_loss) {
        check.reason = "TargetObjectiveMetricValue was reached.";
        return check;
      }
    }
  }
  if (criteria.max_not_improving && *criteria.max_not_improving > 0 &&
      check.not_improving >= *criteria.max_not_improving) {
    check.reason = "BestObjectiveNotImproving: " + std::to_string(check.not_improving) +
                   " training jobs in a row did not improve the best objective by 1% or more "
                   "(MaxNumberOfTrainingJobsNotImproving " +
                   std::to_string(*criteria.max_not_improving) + ").";
    return check;
  }
  if (criteria.convergence && check.converged) {
    check.reason = "ConvergenceDetected: the best objective improved by 1% or less over the last " +
                   std::to_string(finite.size() - finite.size() / 2) + " training jobs.";
  }
  return check;
}

}  // namespace kiln::control::tuning
