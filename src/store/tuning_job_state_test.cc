#include "store/tuning_job_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln::store {
namespace {

using nlohmann::json;

TEST(TuningJobStatusTest, EveryWordRoundTripsAndOthersAreRefused) {
  const TuningJobStatus all[] = {TuningJobStatus::kInProgress,  TuningJobStatus::kCompleted, TuningJobStatus::kFailed,
                                 TuningJobStatus::kStopping,    TuningJobStatus::kStopped,   TuningJobStatus::kDeleting,
                                 TuningJobStatus::kDeleteFailed};
  for (auto s : all) {
    auto parsed = ParseTuningJobStatus(ToString(s));
    ASSERT_TRUE(parsed.ok()) << ToString(s);
    EXPECT_EQ(*parsed, s);
  }
  // AWS's HyperParameterTuningJobStatus words.
  EXPECT_EQ(ToString(TuningJobStatus::kInProgress), "InProgress");
  EXPECT_EQ(ToString(TuningJobStatus::kDeleteFailed), "DeleteFailed");
  auto bad = ParseTuningJobStatus("inprogress");  // case-sensitive, as written
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("inprogress"), std::string::npos);

  EXPECT_FALSE(IsTerminal(TuningJobStatus::kInProgress));
  EXPECT_FALSE(IsTerminal(TuningJobStatus::kStopping));
  EXPECT_FALSE(IsTerminal(TuningJobStatus::kDeleting));
  EXPECT_TRUE(IsTerminal(TuningJobStatus::kCompleted));
  EXPECT_TRUE(IsTerminal(TuningJobStatus::kFailed));
  EXPECT_TRUE(IsTerminal(TuningJobStatus::kStopped));
  EXPECT_TRUE(IsTerminal(TuningJobStatus::kDeleteFailed));
  EXPECT_TRUE(IsActive(TuningJobStatus::kInProgress));
  EXPECT_TRUE(IsActive(TuningJobStatus::kStopping));
  EXPECT_FALSE(IsActive(TuningJobStatus::kDeleting));
}

// A state with every member set to a non-default value.
TuningJobState FullState() {
  TuningJobState s;
  TuningTrial a;
  a.seq = 1;
  a.name = "tune-001-0a1b2c3d";
  a.definition_name = "def-a";
  a.tuned = {{"lr", "0.01"}, {"layers", "3"}, {"opt", "adam"}};
  a.creation_millis = 1000;
  a.status = "Completed";
  a.objective = 0.125;
  a.curve = {0.9, 0.5, 0.25, 0.125};
  a.bracket = 2;
  a.judged_rung = 1;
  a.start_millis = 1100;
  a.end_millis = 1900;
  TuningTrial b;
  b.seq = 2;
  b.name = "";  // could not be created
  b.tuned = {{"lr", "1e-05"}};
  b.creation_millis = 1200;
  b.status = "Failed";
  b.failure_reason = "ValidationException: bad image";
  TuningTrial c;
  c.seq = 3;
  c.name = "tune-003-ffffffff";
  c.creation_millis = 1300;
  c.status = "Stopped";
  c.curve = {2.5, 1.0};
  c.early_stopped = "median rule: 1.0 > median 0.5 at step 2";
  c.start_millis = 1350;
  s.trials = {a, b, c};
  s.failure_reason = "every trial failed";
  s.stop_reason = "TargetObjectiveMetricValue reached";
  s.not_improving = 4;
  s.convergence_detected_millis = 5000;
  s.stop_requested = true;
  s.end_millis = 6000;
  s.runtime_ms_consumed = 123456;
  return s;
}

TEST(TuningJobStateJsonTest, EveryMemberRoundTrips) {
  const TuningJobState s = FullState();
  const json document = ToJson(s);
  // Through text, as the row stores it.
  auto back = TuningJobStateFromJson(json::parse(document.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  EXPECT_EQ(ToJson(*back), document);
  // The member names are the document's contract (a restarted server reads them).
  EXPECT_EQ(document["trials"][0]["tuned"]["lr"], "0.01");
  EXPECT_EQ(document["trials"][0]["objective"], 0.125);
  EXPECT_EQ(document["trials"][2]["early_stopped"], "median rule: 1.0 > median 0.5 at step 2");
  EXPECT_EQ(document["trials"][2]["curve"], json::parse("[2.5, 1.0]"));
  EXPECT_EQ(document["stop_requested"], true);
  EXPECT_EQ(document["runtime_ms_consumed"], 123456);
  EXPECT_FALSE(document["trials"][1].contains("objective"));  // optionals only when set
}

TEST(TuningJobStateJsonTest, DefaultsAndTheNullDocument) {
  auto from_null = TuningJobStateFromJson(json());
  ASSERT_TRUE(from_null.ok());
  EXPECT_EQ(*from_null, TuningJobState{});
  auto from_empty = TuningJobStateFromJson(json::object());
  ASSERT_TRUE(from_empty.ok());
  EXPECT_EQ(*from_empty, TuningJobState{});
  // The document of a new job (the API's Insert).
  EXPECT_EQ(ToJson(TuningJobState{}),
            json::parse(R"({"trials":[],"not_improving":0,"stop_requested":false,"runtime_ms_consumed":0})"));
  auto trial = TuningJobStateFromJson(json::parse(R"({"trials":[{"seq":1}]})"));
  ASSERT_TRUE(trial.ok()) << trial.status().ToString();
  EXPECT_EQ(trial->trials[0].status, "InProgress");
  EXPECT_EQ(trial->trials[0].bracket, -1);
}

TEST(TuningJobStateJsonTest, NonFiniteMetricValuesSurvive) {
  TuningJobState s;
  TuningTrial t;
  t.seq = 1;
  t.objective = std::numeric_limits<double>::quiet_NaN();
  t.curve = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), 1.5};
  s.trials = {t};
  const json document = json::parse(ToJson(s).dump());
  EXPECT_EQ(document["trials"][0]["objective"], "NaN");
  auto back = TuningJobStateFromJson(document);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->trials[0].objective.has_value());
  EXPECT_TRUE(std::isnan(*back->trials[0].objective));
  ASSERT_EQ(back->trials[0].curve.size(), 3u);
  EXPECT_EQ(back->trials[0].curve[0], std::numeric_limits<double>::infinity());
  EXPECT_EQ(back->trials[0].curve[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(back->trials[0].curve[2], 1.5);
}

TEST(TuningJobStateJsonTest, UnknownMembersAreKeptAndWrittenBack) {
  const json document = json::parse(R"({"trials":[{"seq":1,"status":"InProgress","future_trial":[1,2]}],
                                        "future_member":{"a":"b"}})");
  auto state = TuningJobStateFromJson(document);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->extra["future_member"]["a"], "b");
  EXPECT_EQ(state->trials[0].extra["future_trial"], json::parse("[1,2]"));
  const json written = ToJson(*state);
  EXPECT_EQ(written["future_member"], document["future_member"]);
  EXPECT_EQ(written["trials"][0]["future_trial"], document["trials"][0]["future_trial"]);
}

TEST(TuningJobStateJsonTest, WrongTypesAndUnknownWordsAreErrorsNamingTheMember) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([])", "the document"},
      {R"({"trials":{}})", "trials"},
      {R"({"trials":[1]})", "trials[0]"},
      {R"({"trials":[{"seq":"1"}]})", "trials[0].seq"},
      {R"({"trials":[{"seq":4294967296}]})", "trials[0].seq"},
      {R"({"trials":[{"status":"Running"}]})", "trials[0].status"},
      {R"({"trials":[{"tuned":{"lr":0.1}}]})", "trials[0].tuned.lr"},
      {R"({"trials":[{"tuned":[]}]})", "trials[0].tuned"},
      {R"({"trials":[{"objective":"high"}]})", "trials[0].objective"},
      {R"({"trials":[{},{"curve":[1,null]}]})", "trials[1].curve[1]"},
      {R"({"trials":[{"end_millis":1.5}]})", "trials[0].end_millis"},
      {R"({"not_improving":-2147483649})", "not_improving"},
      {R"({"stop_requested":"yes"})", "stop_requested"},
      {R"({"failure_reason":3})", "failure_reason"},
      {R"({"runtime_ms_consumed":"1"})", "runtime_ms_consumed"},
  };
  for (const auto& [text, member] : cases) {
    auto state = TuningJobStateFromJson(json::parse(text));
    ASSERT_FALSE(state.ok()) << text;
    EXPECT_TRUE(state.status().IsInvalidArgument()) << text;
    EXPECT_NE(state.status().message().find(std::string("tuning job state: ") + member + " is not"), std::string::npos)
        << text << " => " << state.status().message();
  }
}

}  // namespace
}  // namespace kiln::store
