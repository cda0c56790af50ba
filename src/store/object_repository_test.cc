#include "store/object_repository.h"

#include <gtest/gtest.h>

#include "base/strings.h"
#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

class ObjectRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path());
    repo_ = std::make_unique<ObjectRepository>(db_.get());
    ASSERT_TRUE(repo_->CreateBucket({"b", "us-east-1", 1}).ok());
  }
  ObjectRow Row(const std::string& key, const std::string& file) {
    ObjectRow r;
    r.bucket = "b";
    r.key = key;
    r.file_id = file;
    r.etag = "e-" + file;
    return r;
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<ObjectRepository> repo_;
};

TEST(PrefixUpperBoundTest, Cases) {
  EXPECT_EQ(PrefixUpperBound(""), std::nullopt);
  EXPECT_EQ(PrefixUpperBound("ab"), "ac");
  EXPECT_EQ(PrefixUpperBound(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(PrefixUpperBound(std::string("\xff", 1)), std::nullopt);
}

TEST_F(ObjectRepositoryTest, BucketsUniqueAndNotEmpty) {
  EXPECT_TRUE(repo_->CreateBucket({"b", "us-east-1", 2}).IsAlreadyExists());
  ASSERT_TRUE(repo_->PutObject(Row("k", "f1"), {}).ok());
  Status s = repo_->DeleteBucket("b");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(StartsWith(s.message(), "BucketNotEmpty:")) << s.message();
  EXPECT_TRUE(StartsWith(repo_->DeleteBucket("nope").message(), "NoSuchBucket:"));
  auto old = repo_->DeleteObject("b", "k");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old, std::optional<std::string>("f1"));
  EXPECT_TRUE(repo_->DeleteBucket("b").ok());
}

TEST_F(ObjectRepositoryTest, PutReplacesAndReturnsOldFile) {
  auto first = repo_->PutObject(Row("k", "f1"), {});
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->has_value());
  auto second = repo_->PutObject(Row("k", "f2"), {});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(**second, "f1");
  auto got = repo_->GetObject("b", "k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->file_id, "f2");
  EXPECT_TRUE(StartsWith(repo_->GetObject("b", "zz").status().message(), "NoSuchKey:"));
  EXPECT_TRUE(StartsWith(repo_->GetObject("q", "k").status().message(), "NoSuchBucket:"));
}

TEST_F(ObjectRepositoryTest, ConditionsCheckedInTransaction) {
  ASSERT_TRUE(repo_->PutObject(Row("k", "f1"), {}).ok());
  WriteCondition none_match;
  none_match.if_none_match_star = true;
  auto r = repo_->PutObject(Row("k", "f2"), none_match);
  EXPECT_TRUE(StartsWith(r.status().message(), "PreconditionFailed:"));
  WriteCondition match;
  match.if_match = "wrong";
  EXPECT_FALSE(repo_->PutObject(Row("k", "f2"), match).ok());
  match.if_match = "e-f1";
  EXPECT_TRUE(repo_->PutObject(Row("k", "f2"), match).ok());
  EXPECT_EQ(repo_->GetObject("b", "k")->file_id, "f2");
}

TEST_F(ObjectRepositoryTest, ScanUsesByteOrder) {
  for (std::string k : {std::string("a"), std::string("a/b"), std::string("\xc3\xa9"), std::string("B"),
                        std::string("a\x01", 2), std::string("", 0)}) {
    ASSERT_TRUE(repo_->PutObject(Row(k, "f" + k), {}).ok());
  }
  auto all = repo_->ScanObjects("b", "", true, std::nullopt, 100);
  ASSERT_TRUE(all.ok());
  std::vector<std::string> keys;
  for (auto& r : *all) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"", "B", "a", std::string("a\x01", 2), "a/b", "\xc3\xa9"}));
  auto range = repo_->ScanObjects("b", "a", false, PrefixUpperBound("a"), 100);
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->size(), 2u);
}

TEST_F(ObjectRepositoryTest, MultipartLifecycle) {
  UploadRow up{"u1", "b", "key", 5, "{}", ""};
  ASSERT_TRUE(repo_->CreateUpload(up).ok());
  EXPECT_TRUE(StartsWith(repo_->GetUpload("b", "other", "u1").status().message(), "NoSuchUpload:"));
  PartRow p{"u1", 1, "p1", 10, "e1", 6, "{}"};
  ASSERT_TRUE(repo_->PutPart("b", "key", p).ok());
  p.file_id = "p1b";
  auto replaced = repo_->PutPart("b", "key", p);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(**replaced, "p1");
  p.part_number = 2;
  p.file_id = "p2";
  ASSERT_TRUE(repo_->PutPart("b", "key", p).ok());
  EXPECT_EQ(repo_->ListParts("u1", 1, 10)->size(), 1u);
  EXPECT_EQ(repo_->DeleteBucket("b").code(), StatusCode::kFailedPrecondition);
  auto ids = repo_->AllFileIds();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 2u);

  auto unref = repo_->CompleteUpload("b", "key", "u1", Row("key", "obj"));
  ASSERT_TRUE(unref.ok());
  EXPECT_EQ(unref->size(), 2u);
  EXPECT_TRUE(repo_->ListParts("u1", 0, 0)->empty());
  EXPECT_TRUE(StartsWith(repo_->AbortUpload("b", "key", "u1").status().message(), "NoSuchUpload:"));
  EXPECT_EQ(repo_->GetObject("b", "key")->file_id, "obj");
}

}  // namespace
}  // namespace kiln::store
