#include "store/database.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "store/migrations.h"
#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

using testing::TempDir;

int64_t CountRows(Database& db, const std::string& table) {
  auto st = db.Prepare("SELECT COUNT(*) FROM " + table);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  auto row = st->Step();
  EXPECT_TRUE(row.ok() && *row);
  return st->ColumnInt64(0);
}

TEST(DatabaseTest, MigrationsApplyOnceAndReopenIsIdempotent) {
  TempDir dir;
  std::vector<Migration> migrations = {
      {1, "t1", "CREATE TABLE t1 (a INTEGER); INSERT INTO t1 VALUES (1);"},
      {2, "t2", "CREATE TABLE t2 (b TEXT);"},
  };
  Database::Options options;
  options.migrations = &migrations;
  {
    auto db = Database::Open(dir.path() + "/x.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    EXPECT_EQ((*db)->schema_version(), 2);
    EXPECT_EQ(CountRows(**db, "schema_migrations"), 2);
    EXPECT_EQ(CountRows(**db, "t1"), 1);
  }
  {
    // Reopening applies nothing again (the INSERT in migration 1 would otherwise duplicate).
    auto db = Database::Open(dir.path() + "/x.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    EXPECT_EQ(CountRows(**db, "t1"), 1);
    EXPECT_EQ(CountRows(**db, "schema_migrations"), 2);
  }
  // A later binary appends migration 3: only it runs.
  migrations.push_back({3, "t3", "INSERT INTO t1 VALUES (3);"});
  auto db = Database::Open(dir.path() + "/x.db", options);
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  EXPECT_EQ((*db)->schema_version(), 3);
  EXPECT_EQ(CountRows(**db, "t1"), 2);
}

TEST(DatabaseTest, ProductionMigrationsApply) {
  TempDir dir;
  auto db = testing::OpenTestDatabase(dir.path());
  EXPECT_EQ(db->schema_version(), AllMigrations().back().version);
  EXPECT_EQ(CountRows(*db, "objects"), 0);
  auto st = db->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(st->ColumnText(0), "wal");
}

TEST(DatabaseTest, NewerSchemaIsRefused) {
  TempDir dir;
  std::vector<Migration> two = {{1, "a", "CREATE TABLE a (x);"}, {2, "b", "CREATE TABLE b (x);"}};
  std::vector<Migration> one = {{1, "a", "CREATE TABLE a (x);"}};
  Database::Options options;
  options.migrations = &two;
  ASSERT_TRUE(Database::Open(dir.path() + "/x.db", options).ok());
  options.migrations = &one;
  auto db = Database::Open(dir.path() + "/x.db", options);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("newer"), std::string::npos) << db.status().message();
}

TEST(DatabaseTest, FailedMigrationRollsBack) {
  TempDir dir;
  std::vector<Migration> bad = {{1, "a", "CREATE TABLE a (x);"}, {2, "b", "CREATE TABLE b (x); THIS IS NOT SQL;"}};
  Database::Options options;
  options.migrations = &bad;
  auto db = Database::Open(dir.path() + "/x.db", options);
  ASSERT_FALSE(db.ok());
  std::vector<Migration> good = {{1, "a", "CREATE TABLE a (x);"}, {2, "b", "CREATE TABLE b (x);"}};
  options.migrations = &good;
  auto again = Database::Open(dir.path() + "/x.db", options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();  // table b was not left half-created
  EXPECT_EQ((*again)->schema_version(), 2);
}

class DbFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::vector<Migration> kMigrations = {
        {1, "kv", "CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB, n INTEGER, d REAL);"}};
    Database::Options options;
    options.migrations = &kMigrations;
    auto db = Database::Open(dir_.path() + "/t.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(db).value();
  }
  Status Insert(Database& db, const std::string& k, int64_t n) {
    ASSIGN_OR_RETURN(auto st, db.Prepare("INSERT INTO kv(k, n) VALUES (?, ?)"));
    st.BindText(1, k).BindInt64(2, n);
    return st.Run();
  }
  TempDir dir_;
  std::unique_ptr<Database> db_;
};

TEST_F(DbFixture, TypedBindingRoundTrips) {
  std::string blob("a\0b\xff", 4);
  {
    auto ins = db_->Prepare("INSERT INTO kv(k, v, n, d) VALUES (?, ?, ?, ?)");
    ASSERT_TRUE(ins.ok());
    ins->BindText(1, "key").BindBlob(2, blob).BindInt64(3, -5).BindDouble(4, 2.5);
    ASSERT_TRUE(ins->Run().ok());
    ins->Reset();
    ins->BindText(1, "nulls").BindNull(2).BindNull(3).BindNull(4);
    ASSERT_TRUE(ins->Run().ok());
  }

  auto st = db_->Prepare("SELECT v, n, d FROM kv ORDER BY k");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(st->ColumnBlob(0), blob);
  EXPECT_EQ(st->ColumnInt64(1), -5);
  EXPECT_DOUBLE_EQ(st->ColumnDouble(2), 2.5);
  ASSERT_TRUE(*st->Step());
  EXPECT_TRUE(st->IsNull(0));
  EXPECT_TRUE(st->IsNull(1));
  EXPECT_FALSE(*st->Step());
}

TEST_F(DbFixture, BadSqlAndBadBindReportErrors) {
  auto bad = db_->Prepare("SELEC nonsense");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("syntax"), std::string::npos) << bad.status().message();
  auto st = db_->Prepare("SELECT ?");
  ASSERT_TRUE(st.ok());
  st->BindInt64(5, 1);
  EXPECT_FALSE(st->Step().ok());
}

TEST_F(DbFixture, UniqueViolationIsAlreadyExists) {
  ASSERT_TRUE(Insert(*db_, "a", 1).ok());
  Status s = Insert(*db_, "a", 2);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_NE(s.message().find("UNIQUE"), std::string::npos) << s.message();
}

TEST_F(DbFixture, TransactionRollsBackOnError) {
  Status s = db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(Insert(db, "x", 1));
    return Status::Aborted("changed my mind");
  });
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(CountRows(*db_, "kv"), 0);

  // A constraint failure mid-transaction rolls back the earlier insert too.
  s = db_->WithTransaction([&](Database& db) -> Status {
    RETURN_IF_ERROR(Insert(db, "y", 1));
    RETURN_IF_ERROR(Insert(db, "y", 2));
    return Status::Ok();
  });
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(CountRows(*db_, "kv"), 0);

  ASSERT_TRUE(db_->WithTransaction([&](Database& db) { return Insert(db, "z", 1); }).ok());
  EXPECT_EQ(CountRows(*db_, "kv"), 1);
}

TEST_F(DbFixture, RaiiTransactionAndNestedSavepoint) {
  {
    Transaction txn(*db_);
    ASSERT_TRUE(txn.status().ok());
    ASSERT_TRUE(Insert(*db_, "a", 1).ok());
    // The inner failure undoes only its own insert.
    Status inner = db_->WithTransaction([&](Database& db) -> Status {
      RETURN_IF_ERROR(Insert(db, "b", 1));
      return Status::Internal("inner fails");
    });
    EXPECT_FALSE(inner.ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  EXPECT_EQ(CountRows(*db_, "kv"), 1);
  {
    Transaction txn(*db_);
    ASSERT_TRUE(Insert(*db_, "c", 1).ok());
    // No commit: destructor rolls back.
  }
  EXPECT_EQ(CountRows(*db_, "kv"), 1);
}

TEST_F(DbFixture, ConcurrentWritersFromThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Status s = db_->WithTransaction([&](Database& db) -> Status {
          RETURN_IF_ERROR(Insert(db, std::to_string(t) + "/" + std::to_string(i), i));
          // Read-modify-write of a shared counter: lost updates would show as a wrong total.
          ASSIGN_OR_RETURN(auto st, db.Prepare("INSERT INTO kv(k, n) VALUES ('counter', 1) "
                                               "ON CONFLICT(k) DO UPDATE SET n = n + 1"));
          return st.Run();
        });
        if (!s.ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(CountRows(*db_, "kv"), kThreads * kPerThread + 1);
  auto st = db_->Prepare("SELECT n FROM kv WHERE k = 'counter'");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(st->ColumnInt64(0), kThreads * kPerThread);
}

}  // namespace
}  // namespace kiln::store
