#include "store/processing_job_state.h"

#include <gtest/gtest.h>

namespace kiln::store {
namespace {

using nlohmann::json;

TEST(ProcessingJobStatusTest, EveryWordRoundTripsAndOthersAreRefused) {
  const std::pair<ProcessingJobStatus, const char*> words[] = {
      {ProcessingJobStatus::kInProgress, "InProgress"}, {ProcessingJobStatus::kCompleted, "Completed"},
      {ProcessingJobStatus::kFailed, "Failed"},         {ProcessingJobStatus::kStopping, "Stopping"},
      {ProcessingJobStatus::kStopped, "Stopped"},
  };
  for (const auto& [status, word] : words) {
    EXPECT_EQ(ProcessingJobStatusName(status), word);
    EXPECT_EQ(ParseProcessingJobStatus(word), status);
  }
  EXPECT_FALSE(ParseProcessingJobStatus("inprogress").has_value());
  EXPECT_FALSE(ParseProcessingJobStatus("Deleting").has_value());
  EXPECT_FALSE(ParseProcessingJobStatus("").has_value());
  EXPECT_TRUE(IsTerminal(ProcessingJobStatus::kCompleted));
  EXPECT_TRUE(IsTerminal(ProcessingJobStatus::kFailed));
  EXPECT_TRUE(IsTerminal(ProcessingJobStatus::kStopped));
  EXPECT_FALSE(IsTerminal(ProcessingJobStatus::kInProgress));
  EXPECT_FALSE(IsTerminal(ProcessingJobStatus::kStopping));
  EXPECT_TRUE(IsActive(ProcessingJobStatus::kInProgress));
  EXPECT_TRUE(IsActive(ProcessingJobStatus::kStopping));
  EXPECT_FALSE(IsActive(ProcessingJobStatus::kStopped));
}

ProcessingJobState FullState() {
  ProcessingJobState s;
  s.start_millis = 1234;
  s.failure_reason = "AlgorithmError: exit code 1";
  s.exit_message = "bad input";
  s.stop_reason = std::string(kProcessingStopRequested);
  ProcessingHostState h1;
  h1.runtime_id = "proc-1";
  h1.log_stream = "job/algo-1-1700000000";
  h1.log_offset = 4096;
  h1.exit_code = 0;
  ProcessingHostState h2;
  h2.runtime_id = "proc-2";
  h2.exit_code = 137;
  h2.oom_killed = true;
  s.hosts = {h1, h2, ProcessingHostState{}};
  s.allocation_ids = {"alloc-1", "alloc-2"};
  s.extra = {{"network", "kiln-net-1"}, {"attempt", 2}};
  return s;
}

TEST(ProcessingJobStateJsonTest, EveryMemberRoundTrips) {
  const ProcessingJobState s = FullState();
  const json document = ProcessingJobStateToJson(s);
  EXPECT_EQ(document["hosts"][1]["exit_code"], 137);
  EXPECT_FALSE(document["hosts"][2].contains("exit_code"));  // not exited: absent
  EXPECT_EQ(document["network"], "kiln-net-1");              // extra at the top level
  auto back = ProcessingJobStateFromJson(json::parse(document.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
}

TEST(ProcessingJobStateJsonTest, DefaultsAndTheNullDocument) {
  auto from_null = ProcessingJobStateFromJson(json());
  ASSERT_TRUE(from_null.ok());
  EXPECT_EQ(*from_null, ProcessingJobState{});
  auto from_empty = ProcessingJobStateFromJson(json::object());
  ASSERT_TRUE(from_empty.ok());
  EXPECT_EQ(*from_empty, ProcessingJobState{});
  const json document = ProcessingJobStateToJson(ProcessingJobState{});
  EXPECT_FALSE(document.contains("start_millis"));
  EXPECT_EQ(document["hosts"], json::array());
  EXPECT_EQ(*ProcessingJobStateFromJson(document), ProcessingJobState{});
}

TEST(ProcessingJobStateJsonTest, TypedMembersWinOverStaleCopiesInExtra) {
  ProcessingJobState s;
  s.failure_reason = "typed";
  s.extra = {{"failure_reason", "stale"}, {"mine", true}};
  const json document = ProcessingJobStateToJson(s);
  EXPECT_EQ(document["failure_reason"], "typed");
  EXPECT_EQ(document["mine"], true);
  auto back = ProcessingJobStateFromJson(document);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->extra, (json{{"mine", true}}));
}

TEST(ProcessingJobStateJsonTest, WrongTypesAreErrorsNamingTheMember) {
  const std::pair<json, const char*> cases[] = {
      {json::array(), "the document"},
      {{{"start_millis", "soon"}}, "start_millis"},
      {{{"failure_reason", 3}}, "failure_reason"},
      {{{"exit_message", json::array()}}, "exit_message"},
      {{{"stop_reason", false}}, "stop_reason"},
      {{{"hosts", json::object()}}, "hosts"},
      {{{"hosts", {1}}}, "hosts[0]"},
      {{{"hosts", {json::object(), {{"exit_code", "0"}}}}}, "hosts[1].exit_code"},
      {{{"hosts", {{{"exit_code", int64_t{1} << 40}}}}}, "hosts[0].exit_code"},
      {{{"hosts", {{{"log_offset", 1.5}}}}}, "hosts[0].log_offset"},
      {{{"hosts", {{{"oom_killed", "yes"}}}}}, "hosts[0].oom_killed"},
      {{{"allocation_ids", {"a", 2}}}, "allocation_ids[1]"},
  };
  for (const auto& [document, member] : cases) {
    auto got = ProcessingJobStateFromJson(document);
    ASSERT_FALSE(got.ok()) << document.dump();
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(member), std::string::npos) << got.status().message();
  }
}

}  // namespace
}  // namespace kiln::store
