// tuning_strategy_bench: how many trials do Kiln's tuning strategies need to reach a target on
// the standard test functions? (issue 17; control/tuning_strategy.h)
//
// For each function and strategy: 10 seeds (1..10), trials proposed one at a time by
// Strategy::Next with every earlier result observed, at most 200 trials; a run's count is the
// 1-based trial that first reached the target (cap + 1 when none did). Prints the median count, the
// quartiles, how many seeds reached the target, and the mean time per proposal.
// "Random x10cap" is Random allowed 10 times as many trials (its median is past the usual cap).
// "Bayesian x4" keeps 4 trials in flight (the oldest finishes, then one is proposed), so its
// proposals see pending trials (the liar), as a tuning job with MaxParallelTrainingJobs 4.
//
//   Branin      x1 ∈ [-5, 10], x2 ∈ [0, 15]; global minimum 0.397887; target f <= 0.397887 + 0.05
//               (regret 0.05, about 0.02% of the function's range on the box)
//   Hartmann-6  x ∈ [0, 1]^6; global minimum -3.32237; target f <= -3.0
//
// Build and run (only with -DKILN_BUILD_BENCH=ON; not run by ctest):
//   cmake -S . -B build -DKILN_BUILD_BENCH=ON && cmake --build build --target tuning_strategy_bench
//   build/bench/tuning_strategy_bench [seeds=10] [max_trials=200]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "control/tuning_space.h"
#include "control/tuning_strategy.h"

namespace {

using kiln::control::tuning::Assignment;
using kiln::control::tuning::MakeStrategy;
using kiln::control::tuning::Observation;
using kiln::control::tuning::Parameter;
using kiln::control::tuning::ParameterKind;
using kiln::control::tuning::Scaling;
using kiln::control::tuning::SearchSpace;

constexpr double kPi = 3.14159265358979323846;

struct Problem {
  std::string name;
  SearchSpace space;
  std::function<double(const Assignment&)> f;
  double target;
};

SearchSpace Box(const std::vector<std::pair<double, double>>& bounds) {
  std::vector<Parameter> params;
  for (size_t i = 0; i < bounds.size(); ++i) {
    params.push_back({"x" + std::to_string(i + 1),
                      ParameterKind::kContinuous,
                      bounds[i].first,
                      bounds[i].second,
                      Scaling::kLinear,
                      {}});
  }
  return SearchSpace::FromParameters(std::move(params));
}

double Get(const Assignment& a, const std::string& key) { return std::strtod(a.at(key).c_str(), nullptr); }

double Branin(const Assignment& a) {
  double x1 = Get(a, "x1"), x2 = Get(a, "x2");
  double b = 5.1 / (4 * kPi * kPi), c = 5 / kPi, t = 1 / (8 * kPi);
  double u = x2 - b * x1 * x1 + c * x1 - 6;
  return u * u + 10 * (1 - t) * std::cos(x1) + 10;
}

double Hartmann6(const Assignment& a) {
  static const double kAlpha[4] = {1.0, 1.2, 3.0, 3.2};
  static const double kA[4][6] = {
      {10, 3, 17, 3.5, 1.7, 8}, {0.05, 10, 17, 0.1, 8, 14}, {3, 3.5, 1.7, 10, 17, 8}, {17, 8, 0.05, 10, 0.1, 14}};
  static const double kP[4][6] = {{0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886},
                                  {0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991},
                                  {0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650},
                                  {0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381}};
  double x[6];
  for (int j = 0; j < 6; ++j) x[j] = Get(a, "x" + std::to_string(j + 1));
  double sum = 0;
  for (int i = 0; i < 4; ++i) {
    double e = 0;
    for (int j = 0; j < 6; ++j) e += kA[i][j] * (x[j] - kP[i][j]) * (x[j] - kP[i][j]);
    sum += kAlpha[i] * std::exp(-e);
  }
  return -sum;
}

struct RunResult {
  int trials;  // first trial reaching the target (1-based); max_trials + 1 when none did
  double seconds_per_proposal;
};

RunResult Run(const Problem& problem, const std::string& strategy_name, uint64_t seed, int max_trials, int parallel) {
  auto strategy = MakeStrategy(strategy_name, problem.space, seed);
  if (!strategy.ok()) {
    std::fprintf(stderr, "%s\n", strategy.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<Observation> observations;
  std::deque<size_t> in_flight;  // indices into observations, oldest first
  double spent = 0;
  int proposed = 0;
  auto finish_oldest = [&]() {
    Observation& o = observations[in_flight.front()];
    in_flight.pop_front();
    o.loss = problem.f(o.values);
    return *o.loss <= problem.target;
  };
  while (proposed < max_trials) {
    auto start = std::chrono::steady_clock::now();
    std::optional<Assignment> next = (*strategy)->Next(observations, proposed);
    spent += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!next) break;
    observations.push_back({*next, std::nullopt});
    in_flight.push_back(observations.size() - 1);
    ++proposed;
    if (static_cast<int>(in_flight.size()) >= parallel) {
      size_t index = in_flight.front();
      if (finish_oldest()) return {static_cast<int>(index) + 1, spent / proposed};
    }
  }
  while (!in_flight.empty()) {
    size_t index = in_flight.front();
    if (finish_oldest()) return {static_cast<int>(index) + 1, spent / std::max(proposed, 1)};
  }
  return {max_trials + 1, spent / std::max(proposed, 1)};
}

double Quantile(std::vector<int> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = argc > 1 ? std::atoi(argv[1]) : 10;
  int max_trials = argc > 2 ? std::atoi(argv[2]) : 200;
  std::vector<Problem> problems = {
      {"Branin", Box({{-5, 10}, {0, 15}}), Branin, 0.397887 + 0.05},
      {"Hartmann-6", Box(std::vector<std::pair<double, double>>(6, {0.0, 1.0})), Hartmann6, -3.0},
  };
  struct Variant {
    std::string label, strategy;
    int parallel;
    int cap_factor;  // the run's trial cap is cap_factor * max_trials
  };
  // "Random x10 cap" lets Random run 10 times longer, to show where its median really lies.
  std::vector<Variant> variants = {{"Random", "Random", 1, 1},
                                   {"Random x10cap", "Random", 1, 10},
                                   {"Bayesian", "Bayesian", 1, 1},
                                   {"Bayesian x4", "Bayesian", 4, 1}};
  std::printf("%d seeds, at most %d trials; count = first trial reaching the target (cap + 1 = not reached)\n\n", seeds,
              max_trials);
  std::printf("%-11s %-14s %8s %8s %8s %8s %12s\n", "function", "strategy", "median", "q25", "q75", "reached",
              "ms/proposal");
  for (const Problem& problem : problems) {
    for (const Variant& variant : variants) {
      std::vector<int> counts;
      double seconds = 0;
      for (int seed = 1; seed <= seeds; ++seed) {
        RunResult r = Run(problem, variant.strategy, static_cast<uint64_t>(seed), variant.cap_factor * max_trials,
                          variant.parallel);
        counts.push_back(r.trials);
        seconds += r.seconds_per_proposal;
      }
      int cap = variant.cap_factor * max_trials;
      int reached = static_cast<int>(std::count_if(counts.begin(), counts.end(), [&](int c) { return c <= cap; }));
      std::printf("%-11s %-14s %8.1f %8.1f %8.1f %5d/%-2d %12.1f\n", problem.name.c_str(), variant.label.c_str(),
                  Quantile(counts, 0.5), Quantile(counts, 0.25), Quantile(counts, 0.75), reached, seeds,
                  1000 * seconds / seeds);
      std::fflush(stdout);
    }
  }
  return 0;
}
