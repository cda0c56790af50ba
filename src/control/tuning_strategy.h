#pragma once
// Search strategies of a hyperparameter tuning job (issue 17): which hyperparameter values the
// next trial gets. All losses are lower-is-better (the controller negates Maximize objectives).
//
//   Random     each trial an independent uniform sample of the unit cube (so Logarithmic ranges are
//              log-uniform, categorical values equally likely), seeded by (seed, trial_index); an
//              exact repeat of an observed configuration is re-drawn (up to 64 times).
//   Grid       SearchSpace::GridPoint(trial_index): the Cartesian product of the categorical
//              ranges in order; nullopt once it is exhausted. Needs an all-categorical space.
//   Bayesian   a Gaussian-process surrogate with Expected Improvement (below).
//   Hyperband  configurations sampled as Random does; early stopping (tuning_stopping.h) judges them.
//
// Bayesian, in detail:
//   - Seeded random start: while fewer than max(3, min(10, d + 1)) observations have a loss
//     (d = encoded_dimensions()), trials are drawn as Random draws them.
//   - Surrogate: GP over the unit-cube encoding, Matern 5/2 kernel with one length-scale per
//     parameter (ARD; a categorical parameter's one-hot block shares one), losses standardised
//     (mean 0, sd 1). Hyperparameters maximise the log marginal likelihood plus a weak log-normal
//     prior on the length-scales (MAP): a grid over a shared length-scale and the noise ratio,
//     then coordinate sweeps that rescale each parameter's length-scale; the signal variance is
//     profiled out in closed form. Jitter 1e-6 on the diagonal. Fitted on at most 200 points
//     (the best 100 and 100 drawn by the seed); the model that proposes uses at most 500 (the
//     running trials and the same rule for the completed ones).
//   - Pending trials (observations without a loss) enter the GP with a lie for a value: the
//     mean the completed trials' GP predicts there (kriging believer), or the best observed loss
//     when that is higher, so proposals made while they run avoid them.
//   - Losses above the upper fence (third quartile + 3 interquartile ranges) are capped to it
//     before standardising, so one diverged trial does not flatten the model.
//   - Expected Improvement below the best observed loss, maximised over 2000 uniform candidates
//     (1000 past 300 points) plus 60 Gaussian perturbations of each of the 5 best observed
//     points, then a local search from the 5 best candidates. Candidates are snapped to
//     representable points (integers, one-hot), and a configuration equal to an earlier
//     observation's is skipped for the next best candidate.
//   - Observations that do not fit the space (a warm-start parent's other ranges) are ignored.
// Every strategy is deterministic in (seed, trial_index, observations): the random source is a
// fixed generator (splitmix64/xoshiro256**), not std:: distributions, whose output varies by library.
//
// Thread-safety: a Strategy is not thread-safe; the controller calls it from its one thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "control/tuning_space.h"

namespace kiln::control::tuning {

struct Observation {
  Assignment values;
  std::optional<double> loss;  // unset: still running (pending); NaN/inf are treated as unset
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // The configuration for trial `trial_index` (0-based, counting this job's trials), given every
  // observation so far (this job's trials, running ones with no loss, plus warm-start parents').
  // Deterministic in (seed, trial_index, observations). nullopt: nothing left (Grid exhausted).
  virtual std::optional<Assignment> Next(const std::vector<Observation>& observations, int trial_index) = 0;
};

// "Random" | "Grid" | "Bayesian" | "Hyperband". The strategy keeps its own copy of `space`.
// InvalidArgument for another name, and for Grid over a space with a non-categorical range
// ("Grid search supports only CategoricalParameterRanges; ...").
Result<std::unique_ptr<Strategy>> MakeStrategy(std::string_view name, const SearchSpace& space, uint64_t seed);

// A deterministic 64-bit generator (xoshiro256**, seeded through splitmix64). Exposed for the
// tests and the bench; strategies derive one per (seed, trial_index).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t NextU64();
  double Uniform();  // [0, 1), 53 bits
  double Normal();   // standard normal (Box–Muller)

 private:
  uint64_t s_[4];
};

}  // namespace kiln::control::tuning
