#include "store/transform_job_repository.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

using nlohmann::json;

constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:transform-job/";

TransformJobRecord Job(const std::string& name, int64_t created) {
  TransformJobRecord r;
  r.name = name;
  r.arn = kArnPrefix + name;
  r.request = {{"TransformJobName", name}, {"ModelName", "m"}};
  r.creation_millis = created;
  r.last_modified_millis = created;
  r.state.model = {{"ModelName", "m"}, {"PrimaryContainer", {{"Image", "local:/bin/true"}}}};
  return r;
}

class TransformJobRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    repo_ = std::make_unique<TransformJobRepository>(db_.get());
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<TransformJobRepository> repo_;
};

TEST_F(TransformJobRepositoryTest, InsertGetAndNamesAreCaseInsensitive) {
  TransformJobRecord job = Job("Batch-1", 1000);
  ASSERT_TRUE(repo_->Insert(job).ok());
  EXPECT_EQ(job.version, 1);
  auto got = repo_->Get("batch-1");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->name, "Batch-1");
  EXPECT_EQ(got->request, job.request);
  EXPECT_EQ(got->state, job.state);
  EXPECT_EQ(got->status, TransformJobStatus::kInProgress);
  EXPECT_FALSE(got->end_millis.has_value());
  TransformJobRecord again = Job("BATCH-1", 2000);
  Status dup = repo_->Insert(again);
  EXPECT_TRUE(dup.IsAlreadyExists());
  EXPECT_EQ(dup.message(), std::string(kArnPrefix) + "Batch-1");
  EXPECT_TRUE(repo_->Get("other").status().IsNotFound());
}

TEST_F(TransformJobRepositoryTest, MutateWritesStatusStateAndEndTime) {
  TransformJobRecord job = Job("j", 1000);
  ASSERT_TRUE(repo_->Insert(job).ok());
  auto written = repo_->Mutate("J", [](TransformJobRecord& r) {
    r.status = TransformJobStatus::kFailed;
    r.state.failure_reason = "ClientError: x";
    r.state.start_millis = 1500;
    r.state.extra["controller"] = 7;
    r.end_millis = 2000;
    r.last_modified_millis = 2000;
    return Status::Ok();
  });
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(written->version, 2);
  auto got = repo_->Get("j");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, TransformJobStatus::kFailed);
  EXPECT_EQ(got->state.failure_reason, "ClientError: x");
  EXPECT_EQ(got->state.start_millis, 1500);
  EXPECT_EQ(got->state.extra["controller"], 7);  // unknown members survive
  EXPECT_EQ(got->end_millis, 2000);
  // An error from the mutation writes nothing.
  auto refused = repo_->Mutate("j", [](TransformJobRecord& r) {
    r.status = TransformJobStatus::kStopped;
    return Status::FailedPrecondition("no");
  });
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(repo_->Get("j")->status, TransformJobStatus::kFailed);
  EXPECT_TRUE(repo_->Mutate("missing", [](TransformJobRecord&) { return Status::Ok(); }).status().IsNotFound());
}

TEST_F(TransformJobRepositoryTest, ListActiveAndPages) {
  for (int i = 0; i < 4; ++i) {
    TransformJobRecord job = Job("job-" + std::to_string(i), 1000 + i);
    ASSERT_TRUE(repo_->Insert(job).ok());
  }
  ASSERT_TRUE(repo_
                  ->Mutate("job-1",
                           [](TransformJobRecord& r) {
                             r.status = TransformJobStatus::kCompleted;
                             return Status::Ok();
                           })
                  .ok());
  ASSERT_TRUE(repo_
                  ->Mutate("job-2",
                           [](TransformJobRecord& r) {
                             r.status = TransformJobStatus::kStopping;
                             r.state.stop_requested = true;
                             return Status::Ok();
                           })
                  .ok());
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 3u);
  EXPECT_EQ((*active)[0].name, "job-0");
  EXPECT_EQ((*active)[1].name, "job-2");
  EXPECT_TRUE((*active)[1].state.stop_requested);
  ListPageQuery q;
  q.descending = true;
  q.limit = 2;
  auto page = repo_->ListPage(q);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].name, "job-3");
  q.filter.status_equals = "Completed";
  page = repo_->ListPage(q);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].name, "job-1");
}

TEST_F(TransformJobRepositoryTest, CorruptRowsAreInternalAndSkippedByListActive) {
  TransformJobRecord job = Job("good", 1);
  ASSERT_TRUE(repo_->Insert(job).ok());
  auto st = db_->Prepare(
      "INSERT INTO transform_jobs(name, arn, request_json, status, creation_millis, last_modified_millis, "
      "end_millis, state_json, version) VALUES ('bad', 'arn', '{}', 'InProgress', 2, 2, NULL, "
      "'{\"failure_reason\": 3}', 1)");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->Run().ok());
  auto bad = repo_->Get("bad");
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_NE(bad.status().message().find("failure_reason"), std::string::npos) << bad.status().message();
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 1u);
  EXPECT_EQ((*active)[0].name, "good");
  EXPECT_FALSE(TransformJobStateFromJson(json{{"model", 3}}).ok());
  EXPECT_EQ(TransformJobStateFromJson(json()).value(), TransformJobState{});
}

}  // namespace
}  // namespace kiln::store
