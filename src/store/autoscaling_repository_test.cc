#include "store/autoscaling_repository.h"

#include <gtest/gtest.h>

#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

class AutoscalingRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override { db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false); }

  static AutoscalingRecord Row(AutoscalingKind kind, const std::string& resource, const std::string& name) {
    AutoscalingRecord r;
    r.kind = kind;
    r.service_namespace = "sagemaker";
    r.resource_id = resource;
    r.scalable_dimension = "sagemaker:variant:DesiredInstanceCount";
    r.name = name;
    r.creation_millis = 1000;
    r.doc = {{"Name", name}};
    return r;
  }

  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
};

TEST_F(AutoscalingRepositoryTest, PutReplacesKeepingSeqAndCreation) {
  AutoscalingRepository repo(db_.get());
  auto first = repo.Put(Row(AutoscalingKind::kPolicy, "endpoint/e/variant/v", "p"));
  ASSERT_TRUE(first.ok());
  AutoscalingRecord again = Row(AutoscalingKind::kPolicy, "endpoint/e/variant/v", "p");
  again.creation_millis = 5000;
  again.doc = {{"Name", "changed"}};
  auto second = repo.Put(again);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->seq, first->seq);
  EXPECT_EQ(second->creation_millis, 1000);
  EXPECT_EQ(second->doc["Name"], "changed");
  EXPECT_EQ(repo.Insert(again).code(), StatusCode::kAlreadyExists);
}

TEST_F(AutoscalingRepositoryTest, DeleteTargetTakesPoliciesAndActionsButNotActivities) {
  AutoscalingRepository repo(db_.get());
  const std::string resource = "endpoint/e/variant/v";
  ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kTarget, resource, "")).ok());
  ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kPolicy, resource, "p")).ok());
  ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kScheduledAction, resource, "s")).ok());
  ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kActivity, resource, "a1")).ok());
  ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kPolicy, "endpoint/e/variant/w", "p")).ok());
  ASSERT_TRUE(repo.DeleteTarget("sagemaker", resource, "sagemaker:variant:DesiredInstanceCount").ok());
  EXPECT_EQ(repo.DeleteTarget("sagemaker", resource, "sagemaker:variant:DesiredInstanceCount").code(),
            StatusCode::kNotFound);
  EXPECT_EQ(repo.ListAll(AutoscalingKind::kPolicy)->size(), 1u);
  EXPECT_TRUE(repo.ListAll(AutoscalingKind::kScheduledAction)->empty());
  EXPECT_EQ(repo.ListAll(AutoscalingKind::kActivity)->size(), 1u);
}

TEST_F(AutoscalingRepositoryTest, ListFiltersPagesAndOrders) {
  AutoscalingRepository repo(db_.get());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(repo.Put(Row(AutoscalingKind::kActivity, i % 2 ? "endpoint/a/variant/v" : "endpoint/b/variant/v",
                             "act" + std::to_string(i)))
                    .ok());
  }
  AutoscalingQuery q;
  q.kind = AutoscalingKind::kActivity;
  q.service_namespace = "sagemaker";
  q.descending = true;
  q.limit = 2;
  auto page = repo.List(q);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].name, "act4");
  q.after_seq = (*page)[1].seq;
  q.limit = 0;
  q.resource_ids = {"endpoint/b/variant/v"};
  page = repo.List(q);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].name, "act2");
  EXPECT_EQ((*page)[1].name, "act0");
  ASSERT_TRUE(repo.PruneActivities("sagemaker", "endpoint/b/variant/v", 1).ok());
  EXPECT_EQ(repo.ListAll(AutoscalingKind::kActivity)->size(), 3u);
}

TEST_F(AutoscalingRepositoryTest, SetStateAndDelete) {
  AutoscalingRepository repo(db_.get());
  auto row = repo.Put(Row(AutoscalingKind::kPolicy, "endpoint/e/variant/v", "p"));
  ASSERT_TRUE(row.ok());
  ASSERT_TRUE(repo.SetState(*row, {{"high", 2}}).ok());
  EXPECT_EQ(repo.Get(AutoscalingKind::kPolicy, "sagemaker", "endpoint/e/variant/v",
                     "sagemaker:variant:DesiredInstanceCount", "p")
                ->state["high"],
            2);
  ASSERT_TRUE(repo.Delete(AutoscalingKind::kPolicy, "sagemaker", "endpoint/e/variant/v",
                          "sagemaker:variant:DesiredInstanceCount", "p")
                  .ok());
  EXPECT_EQ(repo.SetState(*row, {}).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln::store
