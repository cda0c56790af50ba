#include "store/processing_job_repository.h"

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

constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:processing-job/";

ProcessingJobRecord Job(const std::string& name, int64_t created) {
  ProcessingJobRecord r;
  r.name = name;
  r.arn = kArnPrefix + ToLower(name);
  r.request = {{"ProcessingJobName", name},
               {"AppSpecification", {{"ImageUri", "kiln/sklearn:1.2"}}},
               {"ProcessingResources",
                {{"ClusterConfig", {{"InstanceCount", 1}, {"InstanceType", "ml.m5.xlarge"}, {"VolumeSizeInGB", 30}}}}}};
  r.status = ProcessingJobStatus::kInProgress;
  r.creation_millis = created;
  r.last_modified_millis = created;
  return r;
}

class ProcessingJobRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    repo_ = std::make_unique<ProcessingJobRepository>(db_.get());
  }
  void SetStatus(const std::string& name, ProcessingJobStatus status) {
    auto r = repo_->Mutate(name, [&](ProcessingJobRecord& j) {
      j.status = status;
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  void InsertRaw(const std::string& name, const std::string& status, const std::string& request,
                 const std::string& state) {
    auto st = db_->Prepare(
        "INSERT INTO processing_jobs(name, arn, request_json, status, creation_millis, last_modified_millis, "
        "end_millis, state_json, version) VALUES (?, ?, ?, ?, 1, 1, NULL, ?, 1)");
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    st->BindText(1, name).BindText(2, kArnPrefix + name).BindText(3, request).BindText(4, status).BindText(5, state);
    ASSERT_TRUE(st->Run().ok());
  }
  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<ProcessingJobRepository> repo_;
};

TEST_F(ProcessingJobRepositoryTest, InsertGetRoundTripsEveryColumn) {
  auto a = Job("Proc-A", 1000);
  a.end_millis = 4000;
  a.status = ProcessingJobStatus::kFailed;
  a.last_modified_millis = 4000;
  a.state.start_millis = 1500;
  a.state.failure_reason = "AlgorithmError: exit code 2";
  a.state.exit_message = "oops";
  ProcessingHostState host;
  host.runtime_id = "r-1";
  host.log_stream = "Proc-A/algo-1-1700000000";
  host.log_offset = 10;
  host.exit_code = 2;
  a.state.hosts = {host};
  a.state.allocation_ids = {"g-1"};
  a.state.extra = {{"controller", {{"phase", "done"}}}};
  ASSERT_TRUE(repo_->Insert(a).ok());
  EXPECT_GT(a.seq, 0);
  EXPECT_EQ(a.version, 1);

  auto got = repo_->Get("proc-a");  // any case
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->seq, a.seq);
  EXPECT_EQ(got->name, "Proc-A");
  EXPECT_EQ(got->arn, a.arn);
  EXPECT_EQ(got->request, a.request);
  EXPECT_EQ(got->status, ProcessingJobStatus::kFailed);
  EXPECT_EQ(got->creation_millis, 1000);
  EXPECT_EQ(got->last_modified_millis, 4000);
  EXPECT_EQ(got->end_millis, 4000);
  EXPECT_EQ(got->state, a.state);
  EXPECT_EQ(got->version, 1);

  auto b = Job("Proc-B", 2000);
  ASSERT_TRUE(repo_->Insert(b).ok());
  EXPECT_GT(b.seq, a.seq);
  EXPECT_FALSE(repo_->Get("Proc-B")->end_millis.has_value());
  EXPECT_TRUE(repo_->Get("nope").status().IsNotFound());
}

TEST_F(ProcessingJobRepositoryTest, NamesAreUniqueInAnyCase) {
  auto a = Job("Proc-A", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  auto dup = Job("PROC-a", 2000);
  Status s = repo_->Insert(dup);
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(s.message(), a.arn);  // the existing job's ARN, for ResourceInUse's message
  EXPECT_EQ(dup.seq, 0);
  // A training job of the same name is another resource kind: no conflict.
  TrainingJobRepository training(db_.get());
  TrainingJobRecord job;
  job.name = "Proc-A";
  job.arn = "arn:training";
  job.request = nlohmann::json::object();
  EXPECT_TRUE(training.Insert(job).ok());
}

TEST_F(ProcessingJobRepositoryTest, MutateWritesInOneStepAndAbortsOnError) {
  auto a = Job("a", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  auto r = repo_->Mutate("A", [](ProcessingJobRecord& j) {
    j.state.hosts.resize(2);
    j.state.hosts[1].runtime_id = "r-2";
    j.state.stop_reason = std::string(kProcessingStopRequested);
    j.status = ProcessingJobStatus::kStopping;
    j.last_modified_millis = 5000;
    j.request["Extra"] = 1;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, 2);
  EXPECT_EQ(r->status, ProcessingJobStatus::kStopping);

  // An error from the callback leaves the row as it was, whatever the callback changed.
  auto failed = repo_->Mutate("a", [](ProcessingJobRecord& j) {
    j.status = ProcessingJobStatus::kFailed;
    j.state.hosts.clear();
    j.end_millis = 9;
    return Status::FailedPrecondition("no");
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  auto got = repo_->Get("a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, ProcessingJobStatus::kStopping);
  ASSERT_EQ(got->state.hosts.size(), 2u);
  EXPECT_EQ(got->state.hosts[1].runtime_id, "r-2");
  EXPECT_EQ(got->state.stop_reason, "StopRequested");
  EXPECT_EQ(got->last_modified_millis, 5000);
  EXPECT_FALSE(got->end_millis.has_value());
  EXPECT_EQ(got->request["Extra"], 1);
  EXPECT_EQ(got->version, 2);

  SetStatus("a", ProcessingJobStatus::kStopped);
  EXPECT_EQ(repo_->Get("a")->version, 3);
  EXPECT_TRUE(repo_->Mutate("missing", [](ProcessingJobRecord&) { return Status::Ok(); }).status().IsNotFound());
}

// The API's stop and the controller's progress write from different threads: none is lost.
TEST_F(ProcessingJobRepositoryTest, ConcurrentMutatesLoseNoUpdate) {
  auto a = Job("a", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  constexpr int kThreads = 4;
  constexpr int kEach = 25;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < kEach; ++k) {
        auto r = repo_->Mutate("a", [&](ProcessingJobRecord& j) {
          j.state.allocation_ids.push_back(std::to_string(j.state.allocation_ids.size()));
          return Status::Ok();
        });
        EXPECT_TRUE(r.ok()) << r.status().ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto got = repo_->Get("a");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->state.allocation_ids.size(), static_cast<size_t>(kThreads * kEach));
  for (size_t i = 0; i < got->state.allocation_ids.size(); ++i) {
    EXPECT_EQ(got->state.allocation_ids[i], std::to_string(i));
  }
  EXPECT_EQ(got->version, 1 + kThreads * kEach);
}

TEST_F(ProcessingJobRepositoryTest, ListActiveIsInProgressAndStoppingInCreationOrder) {
  const ProcessingJobStatus statuses[] = {ProcessingJobStatus::kStopping,   ProcessingJobStatus::kCompleted,
                                          ProcessingJobStatus::kInProgress, ProcessingJobStatus::kFailed,
                                          ProcessingJobStatus::kStopped,    ProcessingJobStatus::kInProgress};
  for (int i = 0; i < 6; ++i) {
    // Creation times decrease: the order is seq (creation order), not the clock's value.
    auto j = Job("job-" + std::to_string(i), 10000 - i);
    ASSERT_TRUE(repo_->Insert(j).ok());
    SetStatus(j.name, statuses[i]);
  }
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  std::vector<std::string> names;
  for (const auto& r : *active) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"job-0", "job-2", "job-5"}));
  EXPECT_EQ((*active)[0].status, ProcessingJobStatus::kStopping);
}

TEST_F(ProcessingJobRepositoryTest, DeleteRemovesTheRowAndItsTagsOnly) {
  TagRepository tags(db_.get());
  auto a = Job("Proc-A", 1000);
  auto b = Job("Proc-B", 1000);
  ASSERT_TRUE(repo_->Insert(a).ok());
  ASSERT_TRUE(repo_->Insert(b).ok());
  ASSERT_TRUE(tags.Add(a.arn, {{"team", "ml"}, {"env", "dev"}}).ok());
  ASSERT_TRUE(tags.Add(b.arn, {{"team", "ml"}}).ok());
  ASSERT_TRUE(repo_->Delete("proc-a").ok());
  EXPECT_TRUE(repo_->Get("Proc-A").status().IsNotFound());
  EXPECT_TRUE(tags.List(a.arn)->empty());
  EXPECT_EQ(tags.List(b.arn)->size(), 1u);
  EXPECT_TRUE(repo_->Get("Proc-B").ok());
  EXPECT_TRUE(repo_->Delete("Proc-A").IsNotFound());
  // The name is free again.
  auto again = Job("Proc-A", 2000);
  EXPECT_TRUE(repo_->Insert(again).ok());
}

TEST_F(ProcessingJobRepositoryTest, UnreadableRowsAreInternalCorruptRowErrors) {
  InsertRaw("bad-status", "Sleeping", "{}", "{}");
  InsertRaw("bad-json", "InProgress", "{}", "{not json");
  InsertRaw("bad-request", "InProgress", "[", "{}");
  InsertRaw("bad-host", "InProgress", "{}", R"({"hosts":[{"exit_code":"zero"}]})");
  for (const char* name : {"bad-status", "bad-json", "bad-request", "bad-host"}) {
    auto got = repo_->Get(name);
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << name;
    EXPECT_NE(got.status().message().find("corrupt row"), std::string::npos) << got.status().message();
    // Mutate reads the row first: it neither calls back nor writes.
    bool called = false;
    auto m = repo_->Mutate(name, [&](ProcessingJobRecord&) {
      called = true;
      return Status::Ok();
    });
    EXPECT_EQ(m.status().code(), StatusCode::kInternal);
    EXPECT_FALSE(called);
  }
  EXPECT_NE(repo_->Get("bad-status").status().message().find("Sleeping"), std::string::npos);
  EXPECT_NE(repo_->Get("bad-host").status().message().find("hosts[0].exit_code"), std::string::npos);
  // The controller's list leaves unreadable rows out, so one bad row stalls no other job.
  auto active = repo_->ListActive();
  ASSERT_TRUE(active.ok()) << active.status().ToString();
  EXPECT_TRUE(active->empty());
  // A summary page reads the state document (FailureReason, ExitMessage): a corrupt one is Internal.
  ListPageQuery q;
  q.limit = 100;
  EXPECT_EQ(repo_->ListPage(q).status().code(), StatusCode::kInternal);
  // A corrupt row can still be deleted.
  EXPECT_TRUE(repo_->Delete("bad-json").ok());
  EXPECT_TRUE(repo_->Get("bad-json").status().IsNotFound());
  EXPECT_TRUE(repo_->Delete("bad-host").ok());
  auto page = repo_->ListPage(q);  // the status column is text: the summary does not parse it
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(page->size(), 2u);
}

// Keyset pages give exactly the order ListProcessingJobs promises: (key, lower-case name),
// ascending or descending, whatever the page size, with every filter.
class ProcessingJobListTest : public ProcessingJobRepositoryTest {
 protected:
  void SetUp() override {
    ProcessingJobRepositoryTest::SetUp();
    std::mt19937 rng(12);
    const ProcessingJobStatus statuses[] = {ProcessingJobStatus::kInProgress, ProcessingJobStatus::kCompleted,
                                            ProcessingJobStatus::kStopped, ProcessingJobStatus::kFailed};
    for (int i = 0; i < 50; ++i) {
      ProcessingJobRecord r =
          Job(std::string(i % 2 ? "Proc-" : "proc-") + std::to_string(rng() % 100) + "-" + std::to_string(i),
              1000 * static_cast<int64_t>(rng() % 5));
      r.status = statuses[rng() % 4];
      r.last_modified_millis = r.creation_millis + static_cast<int64_t>(rng() % 4000);
      if (r.status != ProcessingJobStatus::kInProgress) r.end_millis = r.last_modified_millis;
      if (r.status == ProcessingJobStatus::kFailed) r.state.failure_reason = "why " + r.name;
      if (i % 3 == 0) r.state.exit_message = "message " + r.name;
      ASSERT_TRUE(repo_->Insert(r).ok());
      all_.push_back(r);
    }
  }

  std::vector<std::string> Expected(const ListPageQuery& q) {
    std::vector<ProcessingJobRecord> rows;
    const ListFilter& f = q.filter;
    for (const auto& r : all_) {
      if (f.status_equals && ProcessingJobStatusName(r.status) != *f.status_equals) continue;
      if (f.name_contains && ToLower(r.name).find(ToLower(*f.name_contains)) == std::string::npos) continue;
      if (f.creation_after_millis && !(r.creation_millis > *f.creation_after_millis)) continue;
      if (f.creation_before_millis && !(r.creation_millis < *f.creation_before_millis)) continue;
      if (f.modified_after_millis && !(r.last_modified_millis > *f.modified_after_millis)) continue;
      if (f.modified_before_millis && !(r.last_modified_millis < *f.modified_before_millis)) continue;
      rows.push_back(r);
    }
    auto key = [&](const ProcessingJobRecord& r) {
      std::string k = q.sort_by == ListSortKey::kStatus ? std::string(ProcessingJobStatusName(r.status)) : "";
      int64_t n = q.sort_by == ListSortKey::kCreationTime ? r.creation_millis : 0;
      return std::make_tuple(n, k, ToLower(r.name));
    };
    std::sort(rows.begin(), rows.end(),
              [&](const auto& a, const auto& b) { return q.descending ? key(b) < key(a) : key(a) < key(b); });
    std::vector<std::string> names;
    for (const auto& r : rows) names.push_back(r.name);
    return names;
  }

  const ProcessingJobRecord& Find(const std::string& name) {
    return *std::find_if(all_.begin(), all_.end(), [&](const auto& r) { return r.name == name; });
  }

  // Every row, `page` at a time through cursors; checks each summary row against its record.
  std::vector<std::string> PageThrough(ListPageQuery q, size_t page) {
    q.limit = page;
    std::vector<std::string> names;
    for (int guard = 0; guard < 1000; ++guard) {
      auto rows = repo_->ListPage(q);
      EXPECT_TRUE(rows.ok()) << rows.status().ToString();
      if (!rows.ok() || rows->empty()) break;
      for (const auto& row : *rows) {
        const auto& record = Find(row.name);
        EXPECT_EQ(row.arn, record.arn);
        EXPECT_EQ(row.status, ProcessingJobStatusName(record.status));
        EXPECT_EQ(row.creation_millis, record.creation_millis);
        EXPECT_EQ(row.last_modified_millis, record.last_modified_millis);
        EXPECT_EQ(row.end_millis, record.end_millis);
        EXPECT_EQ(row.failure_reason, record.state.failure_reason);
        EXPECT_EQ(row.exit_message, record.state.exit_message);
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

  std::vector<ProcessingJobRecord> all_;
};

TEST_F(ProcessingJobListTest, PagesGiveTheReferenceOrderForEverySortFilterAndPageSize) {
  std::vector<ListFilter> filters(7);
  filters[1].status_equals = "Completed";
  filters[2].name_contains = "PROC-1";
  filters[3].creation_after_millis = 1000;
  filters[3].creation_before_millis = 4000;
  filters[4].modified_after_millis = 2000;
  filters[4].modified_before_millis = 5000;
  filters[5].status_equals = "InProgress";
  filters[5].name_contains = "-";
  filters[5].creation_after_millis = 0;
  filters[6].status_equals = "Stopping";  // matches nothing
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

// Every sort, with or without StatusEquals, walks one of the migration's indexes in order (no
// temporary B-tree sorting the matches): a page reads `limit` rows however many jobs there are.
TEST_F(ProcessingJobListTest, PagesAreIndexRangesWithoutASort) {
  ListTable table;
  table.table = "processing_jobs";
  table.columns = "name";
  table.has_status = true;
  table.has_modified = true;
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
          auto sql = BuildListSql(table, q);
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
      "EXPLAIN QUERY PLAN SELECT seq FROM processing_jobs WHERE status IN ('InProgress', 'Stopping') ORDER BY seq");
  ASSERT_TRUE(st.ok());
  std::string plan;
  while (*st->Step()) plan += st->ColumnText(3) + "; ";
  EXPECT_NE(plan.find("INDEX"), std::string::npos) << plan;
}

// A data directory from before issue 18 (schema version 11, with a tuning job) opens with the
// processing migration applied: its rows are untouched and processing jobs can be stored.
TEST(ProcessingJobMigrationTest, AppliesOnAnExistingVersion11Database) {
  testing::TempDir dir;
  const auto& all = AllMigrations();
  ASSERT_GE(all.size(), 12u);
  ASSERT_EQ(all[11].version, 12);
  std::vector<Migration> up_to_11(all.begin(), all.begin() + 11);
  ASSERT_EQ(up_to_11.back().version, 11);
  {
    Database::Options options;
    options.durable = false;
    options.migrations = &up_to_11;
    auto db = Database::Open(dir.path() + "/kiln.db", options);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    TrainingJobRepository training(db->get());
    TrainingJobRecord job;
    job.name = "old-job";
    job.arn = "arn:aws:sagemaker:us-east-1:1:training-job/old-job";
    job.request = {{"TrainingJobName", "old-job"}};
    ASSERT_TRUE(training.Insert(job).ok());
    EXPECT_FALSE((*db)->Prepare("SELECT COUNT(*) FROM processing_jobs").ok());  // not there yet
  }
  auto db = testing::OpenTestDatabase(dir.path(), /*durable=*/false);
  EXPECT_EQ(db->schema_version(), all.back().version);
  EXPECT_TRUE(TrainingJobRepository(db.get()).Get("old-job").ok());
  ProcessingJobRepository processing(db.get());
  auto job = Job("new-processing-job", 5);
  ASSERT_TRUE(processing.Insert(job).ok());
  EXPECT_EQ(processing.Get("NEW-PROCESSING-JOB")->arn, job.arn);
  for (const char* index :
       {"processing_jobs_by_creation", "processing_jobs_by_status", "processing_jobs_by_status_name",
        "processing_jobs_by_status_creation", "processing_jobs_by_modified"}) {
    auto st = db->Prepare("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?");
    ASSERT_TRUE(st.ok());
    st->BindText(1, index);
    ASSERT_TRUE(*st->Step());
    EXPECT_EQ(st->ColumnInt64(0), 1) << index;
  }
}

}  // namespace
}  // namespace kiln::store
