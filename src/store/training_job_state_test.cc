#include "store/training_job_state.h"

#include <gtest/gtest.h>

namespace kiln::store {
namespace {

using nlohmann::json;

TEST(TrainingJobStateEnumsTest, EveryValueRoundTripsThroughItsString) {
  for (auto p : {TrainingPhase::kQueued, TrainingPhase::kStaging, TrainingPhase::kRunning, TrainingPhase::kFinishing,
                 TrainingPhase::kDone}) {
    EXPECT_EQ(ParseTrainingPhase(ToString(p)), p) << ToString(p);
  }
  for (auto s : {TrainingJobStatus::kInProgress, TrainingJobStatus::kCompleted, TrainingJobStatus::kFailed,
                 TrainingJobStatus::kStopping, TrainingJobStatus::kStopped}) {
    EXPECT_EQ(ParseTrainingJobStatus(ToString(s)), s) << ToString(s);
  }
  for (int i = 0; i <= static_cast<int>(SecondaryStatus::kRestarting); ++i) {
    auto s = static_cast<SecondaryStatus>(i);
    EXPECT_FALSE(ToString(s).empty()) << i;
    EXPECT_EQ(ParseSecondaryStatus(ToString(s)), s) << ToString(s);
  }
  for (auto r : {StopRequest::kNone, StopRequest::kUser, StopRequest::kMaxRuntime, StopRequest::kMaxWaitTime}) {
    EXPECT_EQ(ParseStopRequest(ToString(r)), r);
  }
  // The strings are the ones rows have always held.
  EXPECT_EQ(ToString(TrainingPhase::kFinishing), "finishing");
  EXPECT_EQ(ToString(TrainingJobStatus::kInProgress), "InProgress");
  EXPECT_EQ(ToString(SecondaryStatus::kMaxRuntimeExceeded), "MaxRuntimeExceeded");
  EXPECT_EQ(ToString(StopRequest::kMaxRuntime), "max_runtime");
  EXPECT_EQ(ToString(StopRequest::kMaxWaitTime), "max_wait_time");
  EXPECT_FALSE(ParseTrainingPhase("Queued").has_value());  // case-sensitive, as written
  EXPECT_FALSE(ParseTrainingJobStatus("inprogress").has_value());
  EXPECT_FALSE(ParseSecondaryStatus("Bogus").has_value());
  EXPECT_FALSE(ParseStopRequest("peer_failure").has_value());
}

// Documents as the controller wrote them before the state was typed: each reads and writes back
// to the same JSON.
TEST(TrainingJobStateJsonTest, DocumentsInTodaysFormatRoundTrip) {
  const char* documents[] = {
      R"({"phase":"queued"})",
      R"({"phase":"queued","transitions":[{"Status":"Starting","StartTime":1,"StatusMessage":"Starting the training job"}],
          "status_message":"Starting the training job"})",
      R"({"phase":"staging","allocations":[{"cpus":[0],"memory_bytes":1,"gpus":[],"gpu_uuids":[],"note":""}],
          "transitions":[{"Status":"Starting","StartTime":1,"EndTime":2,"StatusMessage":"a"},
                         {"Status":"Pending","StartTime":2,"StatusMessage":"Waiting for compute capacity"}],
          "status_message":"Waiting for compute capacity"})",
      R"({"phase":"done","failure_reason":"AlgorithmError: boom, exit code: 1","training_end_millis":9,
          "training_start_millis":5,"model_artifacts":"s3://b/o/model.tar.gz","output_artifacts":"s3://b/o/output.tar.gz",
          "final_metrics":{"acc":{"value":1,"timestamp_millis":7},"loss":{"value":0.25,"timestamp_millis":8}},
          "hosts":[{"host":"algo-1","shard_index":0,"instance_id":"i","root":"/r","log_stream":"j/algo-1-1","started_millis":5},
                   {"host":"algo-2","shard_index":1,"instance_id":"i2","root":"/r2","log_stream":"j/algo-2-1","started_millis":5}],
          "credentials":{"access_key_id":"AKIA","secret_access_key":"x","session_token":"t","expiration_millis":3},
          "last_stream_epoch":1,"retries":2,"last_failure":"InternalServerError: lost","stop_requested":"user"})",
      R"({"phase":"running","future_member":{"a":[1,2]}})",
      // Managed spot: an interrupted job waiting to resume, and one being stopped at MaxWaitTime.
      R"({"phase":"queued","training_start_millis":1000,"interruptions":2,"billable_millis":40200,
          "resume_after_millis":90000,"interrupt_requested":"kiln interrupt","attempt_start_millis":50000})",
      R"({"phase":"running","stop_requested":"max_wait_time","interruptions":1,"billable_millis":1})",
  };
  for (const char* text : documents) {
    const json document = json::parse(text);
    auto state = TrainingJobStateFromJson(document);
    ASSERT_TRUE(state.ok()) << text << ": " << state.status().ToString();
    EXPECT_EQ(TrainingJobStateToJson(*state), document) << text;
  }
}

TEST(TrainingJobStateJsonTest, ReadsTypedMembers) {
  auto state = TrainingJobStateFromJson(json::parse(R"({"phase":"finishing","stop_requested":"max_runtime",
      "transitions":[{"Status":"Training","StartTime":10,"EndTime":20,"StatusMessage":"m"}],
      "hosts":[{"host":"algo-1","shard_index":0,"instance_id":"i","root":"/r","log_stream":"s","started_millis":10}],
      "final_metrics":{"loss":{"value":0.5,"timestamp_millis":15}}, "training_start_millis": 10})"));
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->phase, TrainingPhase::kFinishing);
  EXPECT_EQ(state->stop_requested, StopRequest::kMaxRuntime);
  ASSERT_EQ(state->transitions.size(), 1u);
  EXPECT_EQ(state->transitions[0].status, SecondaryStatus::kTraining);
  EXPECT_EQ(state->transitions[0].end_millis, 20);
  EXPECT_EQ(state->hosts[0].log_stream, "s");
  EXPECT_EQ(state->final_metrics["loss"], (FinalMetric{0.5, 15}));
  EXPECT_EQ(state->training_start_millis, 10);
  EXPECT_FALSE(state->failure_reason.has_value());
  EXPECT_TRUE(state->extra.empty());
}

TEST(TrainingJobStateJsonTest, ReadsAndWritesTheManagedSpotMembers) {
  TrainingJobState state;
  state.phase = TrainingPhase::kRunning;
  state.stop_requested = StopRequest::kMaxWaitTime;
  state.training_start_millis = 1000;
  state.interruptions = 3;
  state.billable_millis = 40200;
  state.interrupt_requested = "on-demand job j2 needs the capacity";
  state.resume_after_millis = 70000;
  state.attempt_start_millis = 60000;
  const json document = TrainingJobStateToJson(state);
  EXPECT_EQ(document["stop_requested"], "max_wait_time");
  EXPECT_EQ(document["interruptions"], 3);
  EXPECT_EQ(document["billable_millis"], 40200);
  EXPECT_EQ(document["interrupt_requested"], "on-demand job j2 needs the capacity");
  EXPECT_EQ(document["resume_after_millis"], 70000);
  EXPECT_EQ(document["attempt_start_millis"], 60000);
  auto read = TrainingJobStateFromJson(document);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, state);
  EXPECT_TRUE(read->extra.empty());  // known members, not kept as unknown ones
}

// A document written before managed spot (no spot members) reads as the defaults, and writes none.
TEST(TrainingJobStateJsonTest, DocumentsWithoutTheSpotMembersReadAsDefaults) {
  const json old = json::parse(R"({"phase":"done","training_start_millis":5,"training_end_millis":9,
      "retries":1,"stop_requested":"user"})");
  auto state = TrainingJobStateFromJson(old);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->interruptions, 0);
  EXPECT_EQ(state->billable_millis, 0);
  EXPECT_FALSE(state->interrupt_requested.has_value());
  EXPECT_FALSE(state->resume_after_millis.has_value());
  EXPECT_FALSE(state->attempt_start_millis.has_value());
  EXPECT_EQ(TrainingJobStateToJson(*state), old);
  // Nulls read as absent too.
  auto nulls = TrainingJobStateFromJson(json::parse(R"({"interruptions":null,"billable_millis":null,
      "interrupt_requested":null,"resume_after_millis":null,"attempt_start_millis":null})"));
  ASSERT_TRUE(nulls.ok()) << nulls.status().ToString();
  EXPECT_EQ(*nulls, TrainingJobState{});
}

TEST(TrainingJobStateJsonTest, DefaultsAndTheDefaultDocument) {
  auto empty = TrainingJobStateFromJson(json::object());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->phase, TrainingPhase::kQueued);  // a row without a phase is queued
  EXPECT_EQ(*empty, TrainingJobState{});
  EXPECT_TRUE(TrainingJobStateFromJson(json()).ok());
  EXPECT_EQ(TrainingJobStateToJson(TrainingJobState{}), json::parse(R"({"phase":"queued"})"));
}

TEST(TrainingJobStateJsonTest, WrongTypesAndUnknownStringsAreErrorsNamingTheMember) {
  struct Case {
    const char* document;
    const char* member;
  };
  const Case cases[] = {
      {R"([])", "document"},
      {R"({"phase":"sleeping"})", "phase"},
      {R"({"phase":3})", "phase"},
      {R"({"stop_requested":"peer"})", "stop_requested"},
      {R"({"transitions":{}})", "transitions"},
      {R"({"transitions":[{"Status":"Dozing","StartTime":1}]})", "transitions[0].Status"},
      {R"({"transitions":[{"Status":"Training","StartTime":"1"}]})", "transitions[0].StartTime"},
      {R"({"hosts":[{"host":1}]})", "hosts[0].host"},
      {R"({"training_start_millis":1.5})", "training_start_millis"},
      {R"({"training_start_millis":18446744073709551615})", "training_start_millis"},
      {R"({"failure_reason":false})", "failure_reason"},
      {R"({"final_metrics":{"loss":{"value":"x"}}})", "final_metrics.loss.value"},
      {R"({"final_metrics":[]})", "final_metrics"},
      {R"({"interruptions":"2"})", "interruptions"},
      {R"({"billable_millis":1.5})", "billable_millis"},
      {R"({"interrupt_requested":true})", "interrupt_requested"},
      {R"({"resume_after_millis":"soon"})", "resume_after_millis"},
      {R"({"attempt_start_millis":[1]})", "attempt_start_millis"},
  };
  for (const Case& c : cases) {
    auto state = TrainingJobStateFromJson(json::parse(c.document));
    ASSERT_FALSE(state.ok()) << c.document;
    EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument) << c.document;
    EXPECT_NE(state.status().message().find(c.member), std::string::npos)
        << c.document << ": " << state.status().message();
  }
}

}  // namespace
}  // namespace kiln::store
