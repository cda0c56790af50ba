#pragma once
// Test fixture for agent tests: a real fs ObjectStore (SQLite + files) in a temp dir with
// bucket "bkt", and a scratch directory for /opt/ml trees.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "base/fs.h"
#include "base/io.h"
#include "objects/fs_object_store.h"
#include "store/test_util/temp_database.h"

namespace kiln::agent::testing {

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(store_dir_.path(), /*durable=*/false);
    objects::FsObjectStore::Options o;
    o.root = store_dir_.path() + "/objects";
    o.database = db_.get();
    o.sync = false;
    auto s = objects::FsObjectStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->CreateBucket("bkt", "us-east-1").ok());
  }

  void Put(const std::string& key, const std::string& data, const std::string& bucket = "bkt") {
    StringByteSource src(data);
    auto r = store_->PutObject(bucket, key, src, objects::PutOptions{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  std::string Get(const std::string& key, const std::string& bucket = "bkt") {
    auto r = store_->GetObject(bucket, key, std::nullopt);
    if (!r.ok()) return "<" + r.status().ToString() + ">";
    auto all = ReadAll(**r, 1 << 30);
    return all.ok() ? *all : "<read error>";
  }

  bool Exists(const std::string& key) { return store_->HeadObject("bkt", key).ok(); }

  static std::string Slurp(const std::string& path) {
    auto r = ReadFile(path);
    return r.ok() ? *r : "<missing " + path + ">";
  }

  std::string work() const { return work_dir_.path(); }

  store::testing::TempDir store_dir_;
  store::testing::TempDir work_dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<objects::FsObjectStore> store_;
};

}  // namespace kiln::agent::testing
