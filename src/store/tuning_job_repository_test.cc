#include "store/tuning_job_repository.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <tuple>

#include "base/strings.h"
#include "store/migrations.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::store {
namespace {

constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:hyper-parameter-tuning-job/";

TuningJobRecord Job(const std::string& name, int64_t created) {
  TuningJobRecord r;
  r.name = name;
  r.arn = kArnPrefix + ToLower(name);
  r.request = {{"HyperParameterTuningJobName", name}, {"HyperParameterTuningJobConfig", {{"Strategy", "Bayesian"}}}};
  r.status = TuningJobStatus::kInProgress;
  r.creation_millis = created;
  r.last_modified_millis = created;
  return r;
}

class TuningJobRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    repo_ = std::make_unique<TuningJobRepository>(db_.get());
  }
  void SetStatus(const std::string& name, TuningJobStatus status) {
    auto r = repo_->Mutate(name, [&](TuningJobRecord& j) {
      j.status = status;
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  void InsertRaw(const std::string& name, const std::string& status, const std::string& request,
                 const std::string& state) {
    auto st = db_->Prepare(
        "INSERT INTO tuning_jobs(name, arn, request_json, status, creation_millis, last_modified_millis, end_millis, "
        "state_json, version) VALUES (?, ?, ?, ?, 1, 1, NULL, ?, 1)");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    st->BindText(1, name).BindText(2, kArnPrefix + name).BindText(3, request).BindText(4, status).BindText(5, state);
    ASSERT_TRUE(st->Run().ok());
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<TuningJobRepository> repo_;
};

TEST_F(TuningJobRepositoryTest, InsertGetRoundTripsEveryColumn) {
  auto a = Job("Tune-A", 1000);
  a.end_millis = 4000;
  a.status = TuningJobStatus::kCompleted;
  a.last_modified_millis = 4000;
  TuningTrial t;
  t.seq = 1;
  t.name = "Tune-A-001-0123abcd";
  t.tuned = {{"lr", "0.5"}};
  t.status = "Completed";
  t.objective = 0.75;
  t.curve = {1.0, 0.75};
  a.state.trials = {t};
  a.state.stop_reason = "MaxNumberOfTrainingJobs reached";
  a.state.runtime_ms_consumed = 3000;
  ASSERT_TRUE(repo_->Insert(a).ok());
  EXPECT_GT(a.seq, 0);
  EXPECT_EQ(a.version, 1);

  auto got = repo_->Get("tune-a");  // any case
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->seq, a.seq);
  EXPECT_EQ(got->name, "Tune-A");
  EXPECT_EQ(got->arn, a.arn);
  EXPECT_EQ(got->request, a.request);
  EXPECT_EQ(got->status, TuningJobStatus::kCompleted);
  EXPECT_EQ(got->creation_millis, 1000);
  EXPECT_EQ(got->last_modified_millis, 4000);
  EXPECT_EQ(got->end_millis, 4000);
  EXPECT_EQ(got->state, a.state);
  EXPECT_EQ(got->version, 1);

  auto b = Job("Tune-B", 2000);
  ASSERT_TRUE(repo_->Insert(b).ok());
  EXPECT_GT(b.seq, a.seq);
  EXPECT_FALSE(repo_->Get("Tune-B")->end_millis.has_value());
  EXPECT_TRUE(repo_->Get("nope").status().IsNotFound());
}

TEST_F(TuningJobRepositoryTest, NamesAreUniqueInAnyCase) {
  auto a = Job("Tune-A", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  auto dup = Job("TUNE-a", 2000);
  Status s = repo_->Insert(dup);
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(s.message(), a.arn);  // the existing job's ARN, for ResourceInUse's message
  EXPECT_EQ(dup.seq, 0);
  // A training job of the same name is another resource kind: no conflict.
  TrainingJobRepository training(db_.get());
  TrainingJobRecord job;
  job.name = "Tune-A";
  job.arn = "arn:training";
  job.request = nlohmann::json::object();
  EXPECT_TRUE(training.Insert(job).ok());
}

TEST_F(TuningJobRepositoryTest, MutateWritesInOneStepAndAbortsOnError) {
  auto a = Job("a", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  auto r = repo_->Mutate("A", [](TuningJobRecord& j) {
    TuningTrial t;
    t.seq = 1;
    t.name = "a-001-00000000";
    j.state.trials.push_back(t);
    j.state.stop_requested = true;
    j.status = TuningJobStatus::kStopping;
    j.last_modified_millis = 5000;
    j.request["Extra"] = 1;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, 2);

  // An error from the callback leaves the row as it was, whatever the callback changed.
  auto failed = repo_->Mutate("a", [](TuningJobRecord& j) {
    j.status = TuningJobStatus::kFailed;
    j.state.trials.clear();
    j.end_millis = 9;
    return Status::FailedPrecondition("no");
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  auto got = repo_->Get("a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, TuningJobStatus::kStopping);
  ASSERT_EQ(got->state.trials.size(), 1u);
  EXPECT_EQ(got->state.trials[0].name, "a-001-00000000");
  EXPECT_TRUE(got->state.stop_requested);
  EXPECT_EQ(got->last_modified_millis, 5000);
  EXPECT_FALSE(got->end_millis.has_value());
  EXPECT_EQ(got->request["Extra"], 1);
  EXPECT_EQ(got->version, 2);

  SetStatus("a", TuningJobStatus::kStopped);
  EXPECT_EQ(repo_->Get("a")->version, 3);
  EXPECT_TRUE(repo_->Mutate("missing", [](TuningJobRecord&) { return Status::Ok(); }).status().IsNotFound());
}

// Mutate is a read-modify-write in one transaction: writers on several threads (the API's stop
// and the controller's progress) never lose each other's changes.
TEST_F(TuningJobRepositoryTest, ConcurrentMutatesLoseNoUpdate) {
  auto a = Job("a", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  constexpr int kThreads = 4;
  constexpr int kEach = 25;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kEach; ++k) {
        auto r = repo_->Mutate("a", [&](TuningJobRecord& j) {
          TuningTrial t;
          t.seq = static_cast<int>(j.state.trials.size()) + 1;
          t.definition_name = std::to_string(i);
          j.state.trials.push_back(t);
          ++j.state.not_improving;
          return Status::Ok();
        });
        EXPECT_TRUE(r.ok()) << r.status().ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto got = repo_->Get("a");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->state.trials.size(), static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(got->state.not_improving, kThreads * kEach);
  for (size_t i = 0; i < got->state.trials.size(); ++i) EXPECT_EQ(got->state.trials[i].seq, static_cast<int>(i) + 1);
  EXPECT_EQ(got->version, 1 + kThreads * kEach);
}

TEST_F(TuningJobRepositoryTest, ListActiveIsInProgressAndStoppingInCreationOrder) {
  const TuningJobStatus statuses[] = {TuningJobStatus::kStopping,     TuningJobStatus::kCompleted,
                                      TuningJobStatus::kInProgress,   TuningJobStatus::kFailed,
                                      TuningJobStatus::kStopped,      TuningJobStatus::kDeleting,
                                      TuningJobStatus::kDeleteFailed, TuningJobStatus::kInProgress};
  for (int i = 0; i < 8; ++i) {
    // Creation times decrease: the order is seq (creation order), not the clock's value.
    auto j = Job("job-" + std::to_string(i), 10000 - i);
    ASSERT_TRUE(repo_->Insert(j).ok());
    SetStatus(j.name, statuses[i]);
  }
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  std::vector<std::string> names;
  for (const auto& r : *active) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"job-0", "job-2", "job-7"}));
  EXPECT_EQ((*active)[0].status, TuningJobStatus::kStopping);
}

TEST_F(TuningJobRepositoryTest, DeleteRemovesTheRowAndItsTagsOnly) {
  TagRepository tags(db_.get());
  auto a = Job("Tune-A", 1000);
  auto b = Job("Tune-B", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  ASSERT_TRUE(repo_->Insert(b).ok());
  ASSERT_TRUE(tags.Add(a.arn, {{"team", "ml"}, {"env", "dev"}}).ok());
  ASSERT_TRUE(tags.Add(b.arn, {{"team", "ml"}}).ok());
  ASSERT_TRUE(repo_->Delete("tune-a").ok());
  EXPECT_TRUE(repo_->Get("Tune-A").status().IsNotFound());
  EXPECT_TRUE(tags.List(a.arn)->empty());
  EXPECT_EQ(tags.List(b.arn)->size(), 1u);
  EXPECT_TRUE(repo_->Get("Tune-B").ok());
  EXPECT_TRUE(repo_->Delete("Tune-A").IsNotFound());
  // The name is free again.
  auto again = Job("Tune-A", 2000);
  EXPECT_TRUE(repo_->Insert(again).ok());
}

TEST_F(TuningJobRepositoryTest, UnreadableRowsAreInternalCorruptRowErrors) {
  InsertRaw("bad-status", "Sleeping", "{}", "{}");
  InsertRaw("bad-json", "InProgress", "{}", "{not json");
  InsertRaw("bad-request", "InProgress", "[", "{}");
  InsertRaw("bad-trial", "InProgress", "{}", R"({"trials":[{"status":"Running"}]})");
  for (const char* name : {"bad-status", "bad-json", "bad-request", "bad-trial"}) {
    auto got = repo_->Get(name);
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << name;
    EXPECT_NE(got.status().message().find("corrupt row"), std::string::npos) << got.status().message();
    // Mutate reads the row first: it neither calls back nor writes.
    bool called = false;
    auto m = repo_->Mutate(name, [&](TuningJobRecord&) {
      called = true;
      return Status::Ok();
    });
    EXPECT_EQ(m.status().code(), StatusCode::kInternal);
    EXPECT_FALSE(called);
  }
  EXPECT_NE(repo_->Get("bad-status").status().message().find("Sleeping"), std::string::npos);
  EXPECT_NE(repo_->Get("bad-trial").status().message().find("trials[0].status"), std::string::npos);
  // The controller's list leaves unreadable rows out, so one bad row stalls no other job.
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_TRUE(active->empty());
  // The summary page reads typed columns only; whole records surface the corruption.
  ListPageQuery q;
  q.limit = 100;
  EXPECT_EQ(repo_->ListPage(q)->size(), 4u);
  EXPECT_EQ(repo_->ListPageRecords(q).status().code(), StatusCode::kInternal);
  // A corrupt row can still be deleted.
  EXPECT_TRUE(repo_->Delete("bad-json").ok());
  EXPECT_TRUE(repo_->Get("bad-json").status().IsNotFound());
}

// Keyset pages give exactly the order ListHyperParameterTuningJobs promises: (key, lower-case
// name), ascending or descending, whatever the page size, with every filter.
class TuningJobListTest : public TuningJobRepositoryTest {
 protected:
  void SetUp() override {
    TuningJobRepositoryTest::SetUp();
    std::mt19937 rng(11);
    const TuningJobStatus statuses[] = {TuningJobStatus::kInProgress, TuningJobStatus::kCompleted,
                                        TuningJobStatus::kStopped, TuningJobStatus::kFailed};
    for (int i = 0; i < 50; ++i) {
      TuningJobRecord r =
          Job(std::string(i % 2 ? "Tune-" : "tune-") + std::to_string(rng() % 100) + "-" + std::to_string(i),
              1000 * static_cast<int64_t>(rng() % 5));
      r.status = statuses[rng() % 4];
      r.last_modified_millis = r.creation_millis + static_cast<int64_t>(rng() % 4000);
      if (r.status != TuningJobStatus::kInProgress) r.end_millis = r.last_modified_millis;
      ASSERT_TRUE(repo_->Insert(r).ok());
      all_.push_back(r);
    }
  }

  std::vector<std::string> Expected(const ListPageQuery& q) {
    std::vector<TuningJobRecord> rows;
    const ListFilter& f = q.filter;
    for (const auto& r : all_) {
      if (f.status_equals && ToString(r.status) != *f.status_equals) continue;
      if (f.name_contains && ToLower(r.name).find(ToLower(*f.name_contains)) == std::string::npos) continue;
      if (f.creation_after_millis && !(r.creation_millis > *f.creation_after_millis)) continue;
      if (f.creation_before_millis && !(r.creation_millis < *f.creation_before_millis)) continue;
      if (f.modified_after_millis && !(r.last_modified_millis > *f.modified_after_millis)) continue;
      if (f.modified_before_millis && !(r.last_modified_millis < *f.modified_before_millis)) continue;
      rows.push_back(r);
    }
    auto key = [&](const TuningJobRecord& r) {
      std::string k = q.sort_by == ListSortKey::kStatus ? std::string(ToString(r.status)) : "";
      int64_t n = q.sort_by == ListSortKey::kCreationTime ? r.creation_millis : 0;
      return std::make_tuple(n, k, ToLower(r.name));
    };
    std::sort(rows.begin(), rows.end(),
              [&](const auto& a, const auto& b) { return q.descending ? key(b) < key(a) : key(a) < key(b); });
    std::vector<std::string> names;
    for (const auto& r : rows) names.push_back(r.name);
    return names;
  }

  // Every row, `page` at a time through cursors; checks that ListPageRecords gives the same pages.
  std::vector<std::string> PageThrough(ListPageQuery q, size_t page) {
    q.limit = page;
    std::vector<std::string> names;
    for (int guard = 0; guard < 1000; ++guard) {
      auto rows = repo_->ListPage(q);
      auto records = repo_->ListPageRecords(q);
      EXPECT_TRUE(rows.ok()) << rows.status().ToString();
      EXPECT_TRUE(records.ok()) << records.status().ToString();
      if (!rows.ok() || !records.ok() || rows->empty()) break;
      EXPECT_EQ(rows->size(), records->size());
      for (size_t i = 0; i < rows->size() && i < records->size(); ++i) {
        const auto& row = (*rows)[i];
        const auto& record = (*records)[i];
        EXPECT_EQ(row.name, record.name);
        EXPECT_EQ(row.arn, record.arn);
        EXPECT_EQ(row.status, ToString(record.status));
        EXPECT_EQ(row.creation_millis, record.creation_millis);
        EXPECT_EQ(row.last_modified_millis, record.last_modified_millis);
        EXPECT_EQ(row.end_millis, record.end_millis);
        names.push_back(row.name);
      }
      const auto& last = rows->back();
      ListCursor c;
      c.name = last.name;
      if (q.sort_by == ListSortKey::kCreationTime) c.key = last.creation_millis;
      if (q.sort_by == ListSortKey::kStatus) c.key = last.status;
      q.after = c;
      if (rows->size() < page) break;
    }
    return names;
  }

  std::vector<TuningJobRecord> all_;
};

TEST_F(TuningJobListTest, PagesGiveTheReferenceOrderForEverySortFilterAndPageSize) {
  std::vector<ListFilter> filters(7);
  filters[1].status_equals = "Completed";
  filters[2].name_contains = "TUNE-1";
  filters[3].creation_after_millis = 1000;
  filters[3].creation_before_millis = 4000;
  filters[4].modified_after_millis = 2000;
  filters[4].modified_before_millis = 5000;
  filters[5].status_equals = "InProgress";
  filters[5].name_contains = "-";
  filters[5].creation_after_millis = 0;
  filters[6].status_equals = "Deleting";  // matches nothing
  for (const auto& filter : filters) {
    for (auto sort : {ListSortKey::kCreationTime, ListSortKey::kName, ListSortKey::kStatus}) {
      for (bool descending : {false, true}) {
        for (size_t page : {1, 3, 7, 100}) {
          ListPageQuery q;
          q.filter = filter;
          q.sort_by = sort;
          q.descending = descending;
          SCOPED_TRACE(::testing::Message() << "sort " << static_cast<int>(sort) << " desc " << descending << " page "
                                            << page << " status " << filter.status_equals.value_or("-"));
          EXPECT_EQ(PageThrough(q, page), Expected(q));
        }
      }
    }
  }
}

// Every sort, with or without StatusEquals, walks one of migration 11's indexes in order (no
// temporary B-tree sorting the matches): a page reads `limit` rows however many jobs there are.
TEST_F(TuningJobListTest, PagesAreIndexRangesWithoutASort) {
  static constexpr ListTable kTable{
      .table = "tuning_jobs", .columns = "name", .has_status = true, .has_modified = true};
  for (bool status_filter : {false, true}) {
    for (auto sort : {ListSortKey::kCreationTime, ListSortKey::kName, ListSortKey::kStatus}) {
      for (bool descending : {false, true}) {
        for (bool cursor : {false, true}) {
          ListPageQuery q;
          if (status_filter) q.filter.status_equals = "InProgress";
          if (sort == ListSortKey::kCreationTime) q.filter.creation_after_millis = 5;
          q.sort_by = sort;
          q.descending = descending;
          if (cursor) {
            q.after = ListCursor{sort == ListSortKey::kCreationTime ? std::variant<int64_t, std::string>(int64_t{7})
                                                                    : std::variant<int64_t, std::string>("b"),
                                 "b"};
          }
          auto sql = BuildListSql(kTable, q);
          ASSERT_TRUE(sql.ok());
          auto st = db_->Prepare("EXPLAIN QUERY PLAN " + sql->sql);
          ASSERT_TRUE(st.ok()) << sql->sql;
          std::string plan;
          while (*st->Step()) plan += st->ColumnText(3) + "; ";
          SCOPED_TRACE(sql->sql + " => " + plan);
          EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos);
          EXPECT_NE(plan.find("INDEX"), std::string::npos);
        }
      }
    }
  }
  // ListActive: the (status, seq) index, no sort.
  auto st = db_->Prepare(
      "EXPLAIN QUERY PLAN SELECT seq FROM tuning_jobs WHERE status IN ('InProgress', 'Stopping') ORDER BY seq");
  ASSERT_TRUE(st.ok());
  std::string plan;
  while (*st->Step()) plan += st->ColumnText(3) + "; ";
  EXPECT_NE(plan.find("INDEX"), std::string::npos) << plan;
}

// A data directory from before issue 17 (schema version 10, with training jobs and tags) opens
// with migration 11 applied: its rows are untouched and tuning jobs can be stored.
TEST(TuningJobMigrationTest, AppliesOnAnExistingVersion10Database) {
  testing::TempDir dir;
  const auto& all = AllMigrations();
  ASSERT_GE(all.size(), 11u);
  ASSERT_EQ(all[10].version, 11);
  std::vector<Migration> up_to_10(all.begin(), all.begin() + 10);
  ASSERT_EQ(up_to_10.back().version, 10);
  {
    Database::Options options;
    options.durable = false;
    options.migrations = &up_to_10;
    auto db = Database::Open(dir.path() + "/kiln.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    EXPECT_EQ((*db)->schema_version(), 10);
    TrainingJobRepository training(db->get());
    TrainingJobRecord job;
    job.name = "old-job";
    job.arn = "arn:aws:sagemaker:us-east-1:1:training-job/old-job";
    job.request = {{"TrainingJobName", "old-job"}};
    ASSERT_TRUE(training.Insert(job).ok());
    ASSERT_TRUE(TagRepository(db->get()).Add(job.arn, {{"k", "v"}}).ok());
    EXPECT_FALSE((*db)->Prepare("SELECT COUNT(*) FROM tuning_jobs").ok());  // not there yet
  }
  auto db = testing::OpenTestDatabase(dir.path(), /*durable=*/false);
  EXPECT_EQ(db->schema_version(), all.back().version);
  auto old = TrainingJobRepository(db.get()).Get("old-job");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->request["TrainingJobName"], "old-job");
  EXPECT_EQ(TagRepository(db.get()).List("arn:aws:sagemaker:us-east-1:1:training-job/old-job")->size(), 1u);
  TuningJobRepository tuning(db.get());
  auto job = Job("new-tuning-job", 5);
  ASSERT_TRUE(tuning.Insert(job).ok());
  EXPECT_EQ(tuning.Get("NEW-TUNING-JOB")->arn, job.arn);
  // Every index the listing relies on exists.
  for (const char* index : {"tuning_jobs_by_creation", "tuning_jobs_by_status", "tuning_jobs_by_status_name",
                            "tuning_jobs_by_status_creation", "tuning_jobs_by_modified"}) {
    auto st = db->Prepare("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?");
    ASSERT_TRUE(st.ok());
    st->BindText(1, index);
    ASSERT_TRUE(*st->Step());
    EXPECT_EQ(st->ColumnInt64(0), 1) << index;
  }
}

}  // namespace
}  // namespace kiln::store
