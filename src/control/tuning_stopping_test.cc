#include "control/tuning_stopping.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include <gtest/gtest.h>

namespace kiln::control::tuning {
namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Median rule

// Running averages at report 3: (3+2+1)/3 = 2, (6+3+3)/3 = 4, (4+1+1)/3 = 2, (5+3+1)/3 = 3
// → median of {2, 2, 3, 4} = 2.5.
const std::vector<std::vector<double>> kCompleted = {{3, 2, 1, 1}, {6, 3, 3, 3}, {4, 1, 1, 1}, {5, 3, 1, 0}};

TEST(MedianStopTest, StopsATrialWorseThanTheMedianAndKeepsABetterOne) {
  auto worse = MedianStop({9, 9, 2.6}, kCompleted);
  ASSERT_TRUE(worse.has_value());
  EXPECT_NE(worse->find("report 3"), std::string::npos) << *worse;
  EXPECT_NE(worse->find("4 completed"), std::string::npos) << *worse;
  // Only the current value counts, not the trial's own history (AWS: "the value of the objective
  // metric for the current training job").
  EXPECT_FALSE(MedianStop({9, 9, 2.4}, kCompleted).has_value());
  // A tie with the median is not worse.
  EXPECT_FALSE(MedianStop({9, 9, 2.5}, kCompleted).has_value());
}

TEST(MedianStopTest, ComparesWithRunningAveragesNotCurrentValues) {
  // Completed trials that started badly and ended well: their values at report 2 are 1, their
  // running averages (9+1)/2 = 5. A trial at 3 is better than the running averages' median.
  const std::vector<std::vector<double>> completed = {{9, 1, 1}, {9, 1, 1}, {9, 1, 1}};
  EXPECT_FALSE(MedianStop({4, 3}, completed).has_value());
  EXPECT_TRUE(MedianStop({4, 5.5}, completed).has_value());
}

TEST(MedianStopTest, ComparesAtTheTrialsOwnReportCount) {
  // At report 1 the running averages are the first values {3, 6, 4, 5} → median 4.5; at report 4
  // they are {1.75, 3.75, 1.75, 2.25} → median 2.
  EXPECT_FALSE(MedianStop({4.4}, kCompleted, {.min_completed = 3, .min_steps = 1}).has_value());
  EXPECT_TRUE(MedianStop({4.6}, kCompleted, {.min_completed = 3, .min_steps = 1}).has_value());
  // At report 2: {2.5, 4.5, 2.5, 4} → median 3.25.
  EXPECT_TRUE(MedianStop({0, 3.3}, kCompleted).has_value());
  EXPECT_FALSE(MedianStop({0, 3.2}, kCompleted).has_value());
  EXPECT_TRUE(MedianStop({1, 1, 1, 2.1}, kCompleted).has_value());
  EXPECT_FALSE(MedianStop({1, 1, 1, 1.9}, kCompleted).has_value());
}

TEST(MedianStopTest, EvenCountUsesTheMeanOfTheMiddleTwo) {
  const std::vector<std::vector<double>> completed = {{1, 1}, {2, 2}, {3, 3}, {4, 4}};
  EXPECT_TRUE(MedianStop({0, 2.6}, completed).has_value());
  EXPECT_FALSE(MedianStop({0, 2.4}, completed).has_value());
}

TEST(MedianStopTest, NeedsEnoughCompletedTrialsThatReachedTheReport) {
  // Two completed trials: too few to judge, however bad the trial.
  EXPECT_FALSE(MedianStop({100, 100}, {{1, 1}, {1, 1}}).has_value());
  // Three completed, but one stopped after one report: at report 2 only two take part.
  EXPECT_FALSE(MedianStop({100, 100}, {{1, 1}, {1, 1}, {1}}).has_value());
  // At report 1 all three take part (with min_steps 1).
  EXPECT_TRUE(MedianStop({100}, {{1, 1}, {1, 1}, {1}}, {.min_completed = 3, .min_steps = 1}).has_value());
  // A trial past the end of every completed curve is not judged.
  EXPECT_FALSE(MedianStop({100, 100, 100, 100, 100}, kCompleted).has_value());
  // The rule's thresholds are honoured.
  EXPECT_TRUE(MedianStop({100, 100}, {{1, 1}, {1, 1}}, {.min_completed = 2, .min_steps = 2}).has_value());
}

TEST(MedianStopTest, NeedsMinStepsReports) {
  EXPECT_FALSE(MedianStop({100}, kCompleted).has_value());  // default min_steps 2
  EXPECT_FALSE(MedianStop({}, kCompleted).has_value());
  EXPECT_TRUE(MedianStop({100, 100}, kCompleted).has_value());
}

TEST(MedianStopTest, NonFiniteValues) {
  // A diverged trial is worse than any median.
  EXPECT_TRUE(MedianStop({1, kNaN}, kCompleted).has_value());
  EXPECT_TRUE(MedianStop({1, std::numeric_limits<double>::infinity()}, kCompleted).has_value());
  // A NaN inside a completed curve is left out of its running average: {NaN, 1} averages to 1.
  const std::vector<std::vector<double>> completed = {{kNaN, 1}, {kNaN, 1}, {kNaN, 1}};
  EXPECT_TRUE(MedianStop({0, 1.5}, completed).has_value());
  EXPECT_FALSE(MedianStop({0, 0.5}, completed).has_value());
}

// ---------------------------------------------------------------------------------------------
// Hyperband

Hyperband Make(int min_resource, int max_resource) {
  auto made = Hyperband::Create(min_resource, max_resource);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::move(made).value();
}

TEST(HyperbandTest, CreateRejectsBadResources) {
  auto zero = Hyperband::Create(0, 10);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(zero.status().IsInvalidArgument());
  EXPECT_NE(zero.status().message().find("MinResource"), std::string::npos);
  for (auto [min, max] : {std::pair{5, 5}, std::pair{6, 5}}) {
    auto bad = Hyperband::Create(min, max);
    ASSERT_FALSE(bad.ok()) << min << " " << max;
    EXPECT_TRUE(bad.status().IsInvalidArgument());
    EXPECT_NE(bad.status().message().find("must be less than MaxResource"), std::string::npos)
        << bad.status().message();
  }
  auto big = Hyperband::Create(1, 20001);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("20000"), std::string::npos);
  EXPECT_FALSE(Hyperband::Create(1, 10, 1).ok());
  EXPECT_TRUE(Hyperband::Create(1, 20000).ok());
  EXPECT_TRUE(Hyperband::Create(1, 2).ok());
}

TEST(HyperbandTest, BracketsAndRungs) {
  Hyperband hb = Make(1, 81);  // s_max = 4
  ASSERT_EQ(hb.brackets(), 5);
  EXPECT_EQ(hb.Rungs(0), (std::vector<int>{1, 3, 9, 27}));
  EXPECT_EQ(hb.Rungs(1), (std::vector<int>{3, 9, 27}));
  EXPECT_EQ(hb.Rungs(3), (std::vector<int>{27}));
  EXPECT_TRUE(hb.Rungs(4).empty());  // r·eta^4 == R: its trials run to MaxResource
  EXPECT_TRUE(hb.Rungs(5).empty());
  EXPECT_TRUE(hb.Rungs(-1).empty());
  // Synchronous Hyperband's bracket sizes n_s = ceil((s_max+1)/(s+1) · eta^s).
  EXPECT_EQ(hb.BracketWeight(0), 81);
  EXPECT_EQ(hb.BracketWeight(1), 34);
  EXPECT_EQ(hb.BracketWeight(2), 15);
  EXPECT_EQ(hb.BracketWeight(3), 8);
  EXPECT_EQ(hb.BracketWeight(4), 5);

  Hyperband hundred = Make(1, 100);  // still s_max = 4, but the last bracket judges at 81
  ASSERT_EQ(hundred.brackets(), 5);
  EXPECT_EQ(hundred.Rungs(4), (std::vector<int>{81}));

  Hyperband two = Make(2, 50);  // 2, 6, 18 < 50; 54 > 50 → s_max = 2
  ASSERT_EQ(two.brackets(), 3);
  EXPECT_EQ(two.Rungs(0), (std::vector<int>{2, 6, 18}));
  EXPECT_EQ(two.Rungs(2), (std::vector<int>{18}));

  Hyperband small = Make(1, 2);  // one bracket judged at 1
  ASSERT_EQ(small.brackets(), 1);
  EXPECT_EQ(small.Rungs(0), (std::vector<int>{1}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(small.BracketOf(i), 0);
}

TEST(HyperbandTest, BracketAssignmentFollowsTheWeights) {
  Hyperband hb = Make(1, 81);
  const int total = 81 + 34 + 15 + 8 + 5;
  EXPECT_EQ(hb.BracketOf(0), 0);  // the first trial goes to the most aggressive bracket
  std::vector<int> counts(hb.brackets(), 0);
  for (int i = 0; i < total; ++i) {
    const int b = hb.BracketOf(i);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, hb.brackets());
    ++counts[b];
    for (int k = 0; k < hb.brackets(); ++k) {
      const double share = static_cast<double>(i + 1) * hb.BracketWeight(k) / total;
      EXPECT_LE(std::abs(counts[k] - share), 1.5) << "bracket " << k << " after " << i + 1 << " trials";
    }
    // The assignment is periodic, hence a pure function of the index.
    EXPECT_EQ(hb.BracketOf(i + total), b);
  }
  EXPECT_EQ(counts, (std::vector<int>{81, 34, 15, 8, 5}));
  // Even a short job spreads over the brackets: 12 trials reach at least three of them.
  std::map<int, int> first12;
  for (int i = 0; i < 12; ++i) ++first12[hb.BracketOf(i)];
  EXPECT_GE(first12.size(), 3u);
}

TEST(HyperbandTest, BracketsBalanceTheirBudget) {
  // Synchronous Hyperband's budget of a bracket is n_b · (its first rung) · (number of halvings + 1);
  // the weights make these equal within rounding, for every layout Kiln can make.
  for (auto [min, max] : {std::pair{1, 81}, std::pair{1, 20000}, std::pair{2, 50}, std::pair{3, 1000}}) {
    Hyperband hb = Make(min, max);
    std::vector<double> budgets;
    double start = min;
    for (int b = 0; b < hb.brackets(); ++b, start *= hb.eta()) {
      budgets.push_back(hb.BracketWeight(b) * start * (hb.brackets() - b));
    }
    const auto [lo, hi] = std::minmax_element(budgets.begin(), budgets.end());
    EXPECT_LE(*hi / *lo, 1.2) << min << ".." << max;
  }
}

TEST(HyperbandTest, FirstArrivalAtARungPasses) {
  Hyperband hb = Make(1, 81);
  Hyperband::Verdict v = hb.Judge(0, 0, {100}, {});
  EXPECT_FALSE(v.stop);
  EXPECT_EQ(v.judged_rung, 1);
  // Others that have not reached the rung do not count.
  v = hb.Judge(1, 0, {100, 100, 100}, {{1, 1}, {1}});
  EXPECT_FALSE(v.stop);
  EXPECT_EQ(v.judged_rung, 1);
}

TEST(HyperbandTest, KeepsTheTopThirdOfThoseThatReachedTheRung) {
  Hyperband hb = Make(1, 81);
  // Rung 1 of bracket 0; two others reached it (0.5, 0.6): n = 3, only the best continues.
  const std::vector<std::vector<double>> others = {{0.5}, {0.6}};
  Hyperband::Verdict stop = hb.Judge(0, 0, {0.55}, others);
  EXPECT_TRUE(stop.stop);
  EXPECT_EQ(stop.judged_rung, 0);
  EXPECT_NE(stop.reason.find("rung 1"), std::string::npos) << stop.reason;
  EXPECT_NE(stop.reason.find("ranks 2 of the 3"), std::string::npos) << stop.reason;
  EXPECT_FALSE(hb.Judge(0, 0, {0.4}, others).stop);
  EXPECT_FALSE(hb.Judge(0, 0, {0.5}, others).stop);  // a tie favours the trial
  // n = 4: the top ceil(4/3) = 2 continue.
  const std::vector<std::vector<double>> three = {{0.5}, {0.6}, {0.7}};
  EXPECT_FALSE(hb.Judge(0, 0, {0.55}, three).stop);
  EXPECT_TRUE(hb.Judge(0, 0, {0.65}, three).stop);
  // A diverged (NaN) trial ranks last.
  EXPECT_TRUE(hb.Judge(0, 0, {kNaN}, others).stop);
  EXPECT_FALSE(hb.Judge(0, 0, {0.9}, {{kNaN}, {kNaN}}).stop);
}

TEST(HyperbandTest, JudgesAtTheRungValueAndOnlyOnce) {
  Hyperband hb = Make(1, 81);
  // Others: good at report 1, bad at report 3.
  const std::vector<std::vector<double>> others = {{0.1, 0.9, 0.9}, {0.1, 0.9, 0.9}};
  // The trial is bad at report 1 (rung 1) but good at report 3 (rung 3).
  const std::vector<double> curve = {0.5, 0.2, 0.2};
  // Not yet judged: rung 1 is judged first, with the value at report 1, and fails.
  Hyperband::Verdict first = hb.Judge(0, 0, curve, others);
  EXPECT_TRUE(first.stop);
  EXPECT_NE(first.reason.find("rung 1"), std::string::npos) << first.reason;
  // Rung 1 already passed: only rung 3 is judged, and passes.
  Hyperband::Verdict later = hb.Judge(0, 1, curve, others);
  EXPECT_FALSE(later.stop);
  EXPECT_EQ(later.judged_rung, 2);
  // Nothing new to judge before report 9: the verdict keeps judged_rung.
  later = hb.Judge(0, 2, {0.5, 0.2, 0.2, 0.2}, others);
  EXPECT_FALSE(later.stop);
  EXPECT_EQ(later.judged_rung, 2);
}

TEST(HyperbandTest, SkippedRungsAreJudgedInOrder) {
  Hyperband hb = Make(1, 81);
  // The trial reported 9 values between two calls. It is the best at report 1, but at report 3
  // two others are better (n = 3): stopped at rung 3, having passed rung 1.
  const std::vector<std::vector<double>> others = {{0.9, 0.1, 0.1}, {0.9, 0.1, 0.1}};
  Hyperband::Verdict v = hb.Judge(0, 0, std::vector<double>(9, 0.5), others);
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.judged_rung, 1);
  EXPECT_NE(v.reason.find("rung 3"), std::string::npos) << v.reason;
}

TEST(HyperbandTest, NotStoppedBeforeMinResource) {
  Hyperband hb = Make(3, 81);  // bracket 0's first rung is 3
  const std::vector<std::vector<double>> others = {{0.1, 0.1, 0.1}, {0.1, 0.1, 0.1}, {0.1, 0.1, 0.1}};
  EXPECT_FALSE(hb.Judge(0, 0, {9, 9}, others).stop);
  EXPECT_TRUE(hb.Judge(0, 0, {9, 9, 9}, others).stop);
}

TEST(HyperbandTest, StopsAtMaxResource) {
  Hyperband hb = Make(1, 9);  // brackets: 0 {1, 3}, 1 {3}, 2 {} (9 == R)
  ASSERT_EQ(hb.brackets(), 3);
  EXPECT_FALSE(hb.Judge(0, 2, std::vector<double>(8, 0.1), {}).stop);
  Hyperband::Verdict v = hb.Judge(0, 2, std::vector<double>(9, 0.1), {});
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.judged_rung, 2);
  EXPECT_NE(v.reason.find("reached MaxResource (9"), std::string::npos) << v.reason;
  // The last bracket has no rungs: its worst trial still runs to MaxResource.
  const std::vector<std::vector<double>> better(5, std::vector<double>(9, 0.0));
  EXPECT_FALSE(hb.Judge(2, 0, std::vector<double>(8, 1.0), better).stop);
  EXPECT_TRUE(hb.Judge(2, 0, std::vector<double>(9, 1.0), better).stop);
  // Past MaxResource too (reports that arrived between two calls).
  EXPECT_TRUE(hb.Judge(2, 0, std::vector<double>(12, 1.0), better).stop);
}

// Runs a whole asynchronous Hyperband over `trials` configurations whose curves are
// quality + 1/report (the ranking at every rung is the ranking by quality), `parallel` at a time,
// one report per running trial per tick, judging every running trial at every tick as the
// controller does. Returns, per trial, how many reports it made.
struct Simulated {
  std::vector<int> bracket;
  std::vector<double> quality;
  std::vector<int> reports;
};
Simulated Simulate(const Hyperband& hb, int trials, int parallel) {
  Simulated sim;
  uint64_t state = 12345;
  for (int i = 0; i < trials; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    sim.quality.push_back(static_cast<double>(state >> 11) / static_cast<double>(1ull << 53));
    sim.bracket.push_back(hb.BracketOf(i));
  }
  std::vector<std::vector<double>> curves(trials);
  std::vector<int> judged(trials, 0);
  int next = 0;
  std::vector<int> running;
  while (next < trials || !running.empty()) {
    while (static_cast<int>(running.size()) < parallel && next < trials) running.push_back(next++);
    std::vector<int> still;
    for (int t : running) {
      curves[t].push_back(sim.quality[t] + 1.0 / static_cast<double>(curves[t].size() + 1));
      std::vector<std::vector<double>> others;
      for (int o = 0; o < trials; ++o) {
        if (o != t && sim.bracket[o] == sim.bracket[t] && !curves[o].empty()) others.push_back(curves[o]);
      }
      Hyperband::Verdict v = hb.Judge(sim.bracket[t], judged[t], curves[t], others);
      judged[t] = v.judged_rung;
      if (!v.stop) still.push_back(t);
    }
    running = still;
  }
  for (int t = 0; t < trials; ++t) sim.reports.push_back(static_cast<int>(curves[t].size()));
  return sim;
}

TEST(HyperbandTest, SimulationKeepsAboutAThirdAtEachRungAndTheBestReachesMaxResource) {
  Hyperband hb = Make(1, 81);
  Simulated sim = Simulate(hb, 143 * 2, 8);
  // Bracket 0 (162 trials): of those that reached a well-filled rung, about 1/eta pass it (more
  // than 1/eta at thin rungs, where the first arrivals pass unopposed).
  int judged_rungs = 0;
  for (int rung : hb.Rungs(0)) {
    int reached = 0, passed = 0;
    for (size_t t = 0; t < sim.reports.size(); ++t) {
      if (sim.bracket[t] != 0 || sim.reports[t] < rung) continue;
      ++reached;
      if (sim.reports[t] > rung) ++passed;
    }
    if (reached < 30) continue;
    ++judged_rungs;
    const double fraction = static_cast<double>(passed) / reached;
    EXPECT_GT(fraction, 0.25) << "rung " << rung << ": " << passed << "/" << reached;
    EXPECT_LT(fraction, 0.45) << "rung " << rung << ": " << passed << "/" << reached;
  }
  EXPECT_GE(judged_rungs, 2);
  // Every trial ends; none runs past MaxResource; the best configuration of each bracket is never
  // outranked, so it trains to MaxResource.
  std::map<int, size_t> best_of;
  for (size_t t = 0; t < sim.reports.size(); ++t) {
    EXPECT_GE(sim.reports[t], 1);
    EXPECT_LE(sim.reports[t], 81);
    auto it = best_of.find(sim.bracket[t]);
    if (it == best_of.end() || sim.quality[t] < sim.quality[it->second]) best_of[sim.bracket[t]] = t;
  }
  ASSERT_EQ(best_of.size(), 5u);
  for (auto [bracket, t] : best_of) EXPECT_EQ(sim.reports[t], 81) << "bracket " << bracket;
  // The aggressive bracket spends far less per trial than the one without rungs.
  double spent0 = 0, spent4 = 0;
  int n0 = 0, n4 = 0;
  for (size_t t = 0; t < sim.reports.size(); ++t) {
    if (sim.bracket[t] == 0) spent0 += sim.reports[t], ++n0;
    if (sim.bracket[t] == 4) spent4 += sim.reports[t], ++n4;
  }
  EXPECT_EQ(spent4 / n4, 81.0);
  EXPECT_LT(spent0 / n0, 81.0 / 4);
  // Over two full cycles of the assignment, every bracket spends about the same resource in total
  // (Hyperband's balance: many cheap trials in bracket 0, a few full ones in bracket 4).
  std::vector<double> spent(hb.brackets(), 0);
  for (size_t t = 0; t < sim.reports.size(); ++t) spent[sim.bracket[t]] += sim.reports[t];
  const auto [lo, hi] = std::minmax_element(spent.begin(), spent.end());
  EXPECT_LE(*hi / *lo, 1.5) << "bracket 0 spent " << spent[0] << ", bracket 4 " << spent[4];
}

TEST(HyperbandTest, JudgeIsAPureFunction) {
  // A restarted controller recomputes the same verdicts from the stored curves.
  Hyperband a = Make(1, 81);
  Hyperband b = Make(1, 81);
  Simulated one = Simulate(a, 60, 4);
  Simulated two = Simulate(b, 60, 4);
  EXPECT_EQ(one.reports, two.reports);
  EXPECT_EQ(one.bracket, two.bracket);
}

// ---------------------------------------------------------------------------------------------
// InferMaxResource

TEST(InferMaxResourceTest, ExplicitMaxResourceWins) {
  auto r = InferMaxResource(json{{"MinResource", 1}, {"MaxResource", 27}}, json{{"epochs", "50"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 27);
  EXPECT_FALSE(InferMaxResource(json{{"MaxResource", 20001}}, json::object()).ok());
  EXPECT_FALSE(InferMaxResource(json{{"MaxResource", 0}}, json::object()).ok());
}

TEST(InferMaxResourceTest, FromAwsKeysInAwsOrder) {
  for (const char* key : {"epochs", "numepochs", "n-epochs", "n_epochs", "num_epochs"}) {
    auto r = InferMaxResource(json::object(), json{{key, "12"}, {"lr", "0.1"}});
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    EXPECT_EQ(*r, 12) << key;
  }
  // Several present: the first in AWS's list decides.
  auto r = InferMaxResource(json{{"MinResource", 2}}, json{{"num_epochs", "30"}, {"numepochs", "20"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 20);
  // A null config and a JSON integer value.
  r = InferMaxResource(nullptr, json{{"epochs", 7}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 7);
}

TEST(InferMaxResourceTest, RejectsWhatItCannotUse) {
  for (const char* value : {"abc", "0", "20001", "1.5", " 10", "-3", ""}) {
    auto r = InferMaxResource(json::object(), json{{"epochs", value}});
    ASSERT_FALSE(r.ok()) << value;
    EXPECT_TRUE(r.status().IsInvalidArgument());
    EXPECT_NE(r.status().message().find("\"epochs\""), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("HyperbandStrategyConfig.MaxResource"), std::string::npos);
  }
  // No key (names are exact: "Epochs" is not one of them).
  for (const json& statics : {json::object(), json{{"Epochs", "10"}, {"epoch", "10"}}, json(nullptr)}) {
    auto r = InferMaxResource(json::object(), statics);
    ASSERT_FALSE(r.ok()) << statics.dump();
    EXPECT_TRUE(r.status().IsInvalidArgument());
    EXPECT_NE(r.status().message().find("set HyperbandStrategyConfig.MaxResource"), std::string::npos)
        << r.status().message();
  }
}

// ---------------------------------------------------------------------------------------------
// Completion criteria

TEST(CompletionCriteriaTest, FromJson) {
  const json criteria = {{"TargetObjectiveMetricValue", 0.9},
                         {"BestObjectiveNotImproving", {{"MaxNumberOfTrainingJobsNotImproving", 5}}},
                         {"ConvergenceDetected", {{"CompleteOnConvergence", "Enabled"}}}};
  CompletionCriteria max = CompletionCriteriaFromJson(criteria, /*maximize=*/true);
  ASSERT_TRUE(max.target_loss.has_value());
  EXPECT_DOUBLE_EQ(*max.target_loss, -0.9);
  EXPECT_EQ(max.max_not_improving, 5);
  EXPECT_TRUE(max.convergence);
  CompletionCriteria min = CompletionCriteriaFromJson(criteria, /*maximize=*/false);
  EXPECT_DOUBLE_EQ(*min.target_loss, 0.9);

  CompletionCriteria disabled =
      CompletionCriteriaFromJson(json{{"ConvergenceDetected", {{"CompleteOnConvergence", "Disabled"}}}}, false);
  EXPECT_FALSE(disabled.convergence);
  EXPECT_FALSE(disabled.target_loss.has_value());
  EXPECT_FALSE(disabled.max_not_improving.has_value());
  for (const json& none : {json::object(), json(nullptr), json("x")}) {
    CompletionCriteria c = CompletionCriteriaFromJson(none, true);
    EXPECT_FALSE(c.target_loss || c.max_not_improving || c.convergence);
  }
}

TEST(CompletionCriteriaTest, TargetObjectiveMetricValue) {
  CompletionCriteria minimize;
  minimize.target_loss = 0.1;
  EXPECT_FALSE(CheckCompletion(minimize, {}).reason);
  EXPECT_FALSE(CheckCompletion(minimize, {0.5, 0.2, 0.1001}).reason);
  auto reached = CheckCompletion(minimize, {0.5, 0.1, 0.3});
  ASSERT_TRUE(reached.reason);
  EXPECT_NE(reached.reason->find("TargetObjectiveMetricValue"), std::string::npos);
  // Maximize accuracy to 0.9: losses are negated accuracies.
  CompletionCriteria maximize = CompletionCriteriaFromJson(json{{"TargetObjectiveMetricValue", 0.9}}, true);
  EXPECT_FALSE(CheckCompletion(maximize, {-0.5, -0.89}).reason);
  EXPECT_TRUE(CheckCompletion(maximize, {-0.5, -0.91}).reason);
  // Without the criterion a great loss ends nothing.
  EXPECT_FALSE(CheckCompletion(CompletionCriteria{}, {-100}).reason);
}

TEST(CompletionCriteriaTest, NotImprovingCountsTrialsThatFailToBeatTheBestByOnePercent) {
  CompletionCriteria none;
  EXPECT_EQ(CheckCompletion(none, {}).not_improving, 0);
  EXPECT_EQ(CheckCompletion(none, {1.0}).not_improving, 0);  // the first trial improves
  EXPECT_EQ(CheckCompletion(none, {1.0, 2.0}).not_improving, 1);
  EXPECT_EQ(CheckCompletion(none, {1.0, 0.995}).not_improving, 1);  // 0.5% better: not enough
  EXPECT_EQ(CheckCompletion(none, {100, 99}).not_improving, 0);     // exactly 1%: improves
  EXPECT_EQ(CheckCompletion(none, {1.0, 2.0, 3.0, 0.5}).not_improving, 0);
  EXPECT_EQ(CheckCompletion(none, {1.0, 2.0, 3.0, 0.5, 0.6}).not_improving, 1);
  // The best follows the true minimum: 0.995 becomes the best, so 0.99 is only 0.5% better than
  // it (not improving) while 0.985 is 1.005% better (improving).
  EXPECT_EQ(CheckCompletion(none, {1.0, 0.995, 0.99}).not_improving, 2);
  EXPECT_EQ(CheckCompletion(none, {1.0, 0.995, 0.985}).not_improving, 0);
  // Negative losses (negated Maximize values): 1% of |best|.
  EXPECT_EQ(CheckCompletion(none, {-0.90, -0.905}).not_improving, 1);
  EXPECT_EQ(CheckCompletion(none, {-0.90, -0.91}).not_improving, 0);
  // A best of exactly 0: any lower loss improves.
  EXPECT_EQ(CheckCompletion(none, {0.0, -1e-9}).not_improving, 0);
  EXPECT_EQ(CheckCompletion(none, {0.0, 0.0}).not_improving, 1);
  // NaN never improves.
  EXPECT_EQ(CheckCompletion(none, {1.0, kNaN}).not_improving, 1);
}

TEST(CompletionCriteriaTest, NotImprovingFiresExactlyAtTheLimit) {
  CompletionCriteria criteria;
  criteria.max_not_improving = 3;
  EXPECT_FALSE(CheckCompletion(criteria, {1.0, 1.5, 1.2}).reason);
  auto fired = CheckCompletion(criteria, {1.0, 1.5, 1.2, 1.0});
  ASSERT_TRUE(fired.reason);
  EXPECT_EQ(fired.not_improving, 3);
  EXPECT_NE(fired.reason->find("BestObjectiveNotImproving"), std::string::npos) << *fired.reason;
  // An improvement resets the count.
  EXPECT_FALSE(CheckCompletion(criteria, {1.0, 1.5, 1.2, 0.5, 0.7, 0.8}).reason);
  EXPECT_TRUE(CheckCompletion(criteria, {1.0, 1.5, 1.2, 0.5, 0.7, 0.8, 0.9}).reason);
}

TEST(CompletionCriteriaTest, Convergence) {
  CompletionCriteria enabled;
  enabled.convergence = true;
  // Flat results: converged once there are 10, not before.
  std::vector<double> flat(9, 0.5);
  EXPECT_FALSE(CheckCompletion(enabled, flat).converged);
  flat.push_back(0.5);
  auto converged = CheckCompletion(enabled, flat);
  EXPECT_TRUE(converged.converged);
  ASSERT_TRUE(converged.reason);
  EXPECT_NE(converged.reason->find("ConvergenceDetected"), std::string::npos);
  // "1% or less": no gain at all is convergence even when the threshold is 0 (every loss 0).
  EXPECT_TRUE(CheckCompletion(enabled, std::vector<double>(10, 0.0)).converged);
  // Best of the first half 0.50; the second half reaches 0.45 (10% better): still improving.
  const std::vector<double> improving = {0.9, 0.7, 0.5, 0.8, 0.6, 0.7, 0.45, 0.8, 0.6, 0.9};
  EXPECT_FALSE(CheckCompletion(enabled, improving).converged);
  EXPECT_FALSE(CheckCompletion(enabled, improving).reason);
  // The second half reaches 0.497 (0.6% better than 0.50; range 0.403): converged.
  const std::vector<double> plateau = {0.9, 0.7, 0.5, 0.8, 0.6, 0.7, 0.497, 0.8, 0.6, 0.9};
  EXPECT_TRUE(CheckCompletion(enabled, plateau).converged);
  EXPECT_TRUE(CheckCompletion(enabled, plateau).reason);
  // Disabled: detected (for ConvergenceDetectedTime) but the job goes on.
  auto disabled = CheckCompletion(CompletionCriteria{}, plateau);
  EXPECT_TRUE(disabled.converged);
  EXPECT_FALSE(disabled.reason);
  // Near-zero losses: the range keeps the threshold meaningful (1% of 0.001 would never be met).
  const std::vector<double> small = {0.5, 0.4, 0.3, 0.2, 0.002, 0.3, 0.2, 0.4, 0.0015, 0.3};
  EXPECT_TRUE(CheckCompletion(enabled, small).converged);  // gain 0.0005 <= 1% of range 0.4985
}

TEST(CompletionCriteriaTest, FirstMetCriterionNamesTheReason) {
  CompletionCriteria all{.target_loss = 0.5, .max_not_improving = 3, .convergence = true};
  const std::vector<double> losses = {0.4, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  auto check = CheckCompletion(all, losses);
  ASSERT_TRUE(check.reason);
  EXPECT_NE(check.reason->find("TargetObjectiveMetricValue"), std::string::npos);
  EXPECT_EQ(check.not_improving, 9);
  EXPECT_TRUE(check.converged);
  all.target_loss.reset();
  check = CheckCompletion(all, losses);
  ASSERT_TRUE(check.reason);
  EXPECT_NE(check.reason->find("BestObjectiveNotImproving"), std::string::npos);
}

}  // namespace
}  // namespace kiln::control::tuning
