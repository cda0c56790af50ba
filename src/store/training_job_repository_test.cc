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
    r.status = "InProgress";
    r.secondary_status = "Starting";
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
    j.secondary_status = "Training";
    j.state["x"] = 1;
    j.last_modified_millis = 5000;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->version, 2);
  auto failed = repo_->Mutate("a", [](TrainingJobRecord& j) {
    j.secondary_status = "Bogus";
    return Status::FailedPrecondition("no");
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  auto got = repo_->Get("a");
  EXPECT_EQ(got->secondary_status, "Training");
  EXPECT_EQ(got->state["x"], 1);
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
    j.secondary_status = "Pending";
    j.state["n"] = j.name;
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));  // the missing name skipped
  EXPECT_EQ(repo_->Get("a")->secondary_status, "Pending");
  EXPECT_EQ(repo_->Get("a")->state["n"], "a");
  EXPECT_EQ(repo_->Get("a")->version, 2);
  EXPECT_EQ(repo_->Get("b")->secondary_status, "Starting");
  EXPECT_EQ(repo_->Get("b")->version, 1);
  EXPECT_EQ(repo_->Get("c")->state["n"], "c");
  EXPECT_TRUE(repo_->MutateEach({}, [](TrainingJobRecord&) { return true; }).ok());
}

TEST_F(TrainingJobRepositoryTest, ListFiltersAndActive) {
  for (int i = 0; i < 5; ++i) {
    auto j = Job("job-" + std::to_string(i), 1000 * (i + 1));
    ASSERT_TRUE(repo_->Insert(j).ok());
  }
  ASSERT_TRUE(repo_->Mutate("job-1", [](TrainingJobRecord& j) {
                     j.status = "Completed";
                     return Status::Ok();
                   }).ok());
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
