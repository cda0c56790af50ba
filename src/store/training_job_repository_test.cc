#include "store/training_job_repository.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

class TrainingJobRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    repo_ = std::make_unique<TrainingJobRepository>(db_.get());
  }
  TrainingJobRecord Job(const std::string& name, int64_t created) {
    TrainingJobRecord r;
    r.name = name;
    r.arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/" + name;
    r.request = {{"TrainingJobName", name}};
    r.status = TrainingJobStatus::kInProgress;
    r.secondary_status = SecondaryStatus::kStarting;
    r.creation_millis = created;
    r.last_modified_millis = created;
    return r;
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<TrainingJobRepository> repo_;
};

TEST_F(TrainingJobRepositoryTest, InsertGetAndCaseInsensitiveUniqueness) {
  auto a = Job("Job-A", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  EXPECT_GT(a.seq, 0);
  auto dup = Job("job-a", 2000);
  Status s = repo_->Insert(dup);
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(s.message(), a.arn);  // the existing job's ARN, for AWS's ResourceInUse message
  auto got = repo_->Get("JOB-A");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name, "Job-A");
  EXPECT_EQ(got->request["TrainingJobName"], "Job-A");
  EXPECT_TRUE(repo_->Get("nope").status().IsNotFound());
}

TEST_F(TrainingJobRepositoryTest, MutateIsAtomicAndAbortsOnError) {
  auto a = Job("a", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  auto r = repo_->Mutate("a", [](TrainingJobRecord& j) {
    j.secondary_status = SecondaryStatus::kTraining;
    j.state.extra["x"] = 1;  // a member this version does not know survives the round trip
    j.last_modified_millis = 5000;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->version, 2);
  auto failed = repo_->Mutate("a", [](TrainingJobRecord& j) {
    j.secondary_status = SecondaryStatus::kFailed;
    return Status::FailedPrecondition("no");
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  auto got = repo_->Get("a");
  EXPECT_EQ(got->secondary_status, SecondaryStatus::kTraining);
  EXPECT_EQ(got->state.extra["x"], 1);
  EXPECT_EQ(got->last_modified_millis, 5000);
}

TEST_F(TrainingJobRepositoryTest, MutateEachWritesTheChosenRowsInOneGo) {
  for (const char* name : {"a", "b", "c"}) {
    auto job = Job(name, 1000);
    ASSERT_TRUE(repo_->Insert(job).ok());
  }
  std::vector<std::string> seen;
  Status s = repo_->MutateEach({"A", "b", "missing", "c"}, [&](TrainingJobRecord& j) {
    seen.push_back(j.name);
    if (j.name == "b") return false;  // left as it was
    j.secondary_status = SecondaryStatus::kPending;
    j.state.status_message = j.name;
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));  // the missing name skipped
  EXPECT_EQ(repo_->Get("a")->secondary_status, SecondaryStatus::kPending);
  EXPECT_EQ(repo_->Get("a")->state.status_message, "a");
  EXPECT_EQ(repo_->Get("a")->version, 2);
  EXPECT_EQ(repo_->Get("b")->secondary_status, SecondaryStatus::kStarting);
  EXPECT_EQ(repo_->Get("b")->version, 1);
  EXPECT_EQ(repo_->Get("c")->state.status_message, "c");
  EXPECT_TRUE(repo_->MutateEach({}, [](TrainingJobRecord&) { return true; }).ok());
}

TEST_F(TrainingJobRepositoryTest, ListFiltersAndActive) {
  for (int i = 0; i < 5; ++i) {
    auto j = Job("job-" + std::to_string(i), 1000 * (i + 1));
    ASSERT_TRUE(repo_->Insert(j).ok());
  }
  ASSERT_TRUE(repo_
                  ->Mutate("job-1",
                           [](TrainingJobRecord& j) {
                             j.status = TrainingJobStatus::kCompleted;
                             return Status::Ok();
                           })
                  .ok());
  TrainingJobListQuery q;
  q.status_equals = "Completed";
  EXPECT_EQ(repo_->List(q)->size(), 1u);
  q = {};
  q.name_contains = "JOB-3";
  EXPECT_EQ(repo_->List(q)->size(), 1u);
  q = {};
  q.creation_after_millis = 2000;
  q.creation_before_millis = 5000;
  auto between = repo_->List(q);
  ASSERT_EQ(between->size(), 2u);
  EXPECT_EQ((*between)[0].name, "job-2");
  EXPECT_EQ(repo_->ListActive()->size(), 4u);
  ASSERT_TRUE(repo_->Delete("job-0").ok());
  EXPECT_TRUE(repo_->Delete("job-0").IsNotFound());
}

// A row as earlier versions wrote it (raw SQL, today's column strings and state document) is
// read into the typed record and written back with the same document.
TEST_F(TrainingJobRepositoryTest, ReadsARowInTodaysFormatAndWritesItBackUnchanged) {
  const std::string state = R"({"phase":"running","retries":1,"last_failure":"InternalServerError: lost",
    "stop_requested":"max_runtime","training_start_millis":1500,"last_stream_epoch":2,
    "allocations":[{"cpus":[0,1],"memory_bytes":8589934592,"gpus":[],"gpu_uuids":[],"note":""}],
    "credentials":{"access_key_id":"AKIA","secret_access_key":"s"},
    "hosts":[{"host":"algo-1","shard_index":0,"instance_id":"training-old-algo-1","root":"/w/old/algo-1",
              "log_stream":"old/algo-1-2","started_millis":1500}],
    "transitions":[{"Status":"Starting","StartTime":1000,"EndTime":1500,"StatusMessage":"Starting the training job"},
                   {"Status":"Stopping","StartTime":1500,"StatusMessage":"Stopping the training job"}],
    "status_message":"Stopping the training job",
    "final_metrics":{"loss":{"value":0.5,"timestamp_millis":1600}}})";
  {
    auto st = db_->Prepare(
        "INSERT INTO training_jobs(name, arn, request_json, status, secondary_status, creation_millis, "
        "last_modified_millis, training_end_millis, state_json, version) VALUES "
        "('old', 'arn:old', '{}', 'Stopping', 'Stopping', 1000, 1500, NULL, ?, 1)");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    st->BindText(1, state);
    ASSERT_TRUE(st->Run().ok());
  }
  auto got = repo_->Get("old");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->status, TrainingJobStatus::kStopping);
  EXPECT_EQ(got->secondary_status, SecondaryStatus::kStopping);
  EXPECT_EQ(got->state.phase, TrainingPhase::kRunning);
  EXPECT_EQ(got->state.stop_requested, StopRequest::kMaxRuntime);
  ASSERT_EQ(got->state.hosts.size(), 1u);
  EXPECT_EQ(got->state.hosts[0].instance_id, "training-old-algo-1");
  EXPECT_EQ(got->state.transitions[0].end_millis, 1500);
  EXPECT_EQ(got->state.final_metrics["loss"].value, 0.5);
  ASSERT_TRUE(repo_->Mutate("old", [](TrainingJobRecord&) { return Status::Ok(); }).ok());
  auto st = db_->Prepare("SELECT state_json, status, secondary_status FROM training_jobs WHERE name = 'old'");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(nlohmann::json::parse(st->ColumnText(0)), nlohmann::json::parse(state));
  EXPECT_EQ(st->ColumnText(1), "Stopping");
  EXPECT_EQ(st->ColumnText(2), "Stopping");
}

TEST_F(TrainingJobRepositoryTest, AnUnreadableStatusIsACorruptRow) {
  auto st = db_->Prepare(
      "INSERT INTO training_jobs(name, arn, request_json, status, secondary_status, creation_millis, "
      "last_modified_millis, training_end_millis, state_json, version) VALUES "
      "('bad', 'arn:bad', '{}', 'Sleeping', 'Starting', 1, 1, NULL, '{}', 1)");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->Run().ok());
  auto got = repo_->Get("bad");
  EXPECT_EQ(got.status().code(), StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("Sleeping"), std::string::npos);
}

TEST_F(TrainingJobRepositoryTest, TagsKeepOrderAndReplaceValues) {
  TagRepository tags(db_.get());
  std::string arn = "arn:aws:sagemaker:us-east-1:1:training-job/x";
  ASSERT_TRUE(tags.Add(arn, {{"b", "1"}, {"a", "2"}}).ok());
  ASSERT_TRUE(tags.Add(arn, {{"b", "3"}, {"c", "4"}}).ok());
  auto list = tags.List("ARN:AWS:SAGEMAKER:US-EAST-1:1:TRAINING-JOB/X");
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].key, "b");
  EXPECT_EQ((*list)[0].value, "3");
  EXPECT_EQ((*list)[2].key, "c");
  ASSERT_TRUE(tags.Remove(arn, {"a", "zzz"}).ok());
  EXPECT_EQ(tags.List(arn)->size(), 2u);
}

}  // namespace
}  // namespace kiln::store
