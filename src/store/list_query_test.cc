#include "store/list_query.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "base/strings.h"
#include "store/endpoint_repository.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::store {
namespace {

// Keyset pages must give exactly the order the API gave when it sorted in memory: (key, lower
// name), ascending or descending, with the rows after a cursor strictly after it.
class ListQueryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    jobs_ = std::make_unique<TrainingJobRepository>(db_.get());
    // Ties on every key: 6 creation times, 3 statuses, names in mixed case.
    std::mt19937 rng(7);
    const TrainingJobStatus statuses[] = {TrainingJobStatus::kInProgress, TrainingJobStatus::kCompleted,
                                          TrainingJobStatus::kFailed};
    for (int i = 0; i < 60; ++i) {
      TrainingJobRecord r;
      r.name = std::string(i % 2 ? "Job-" : "job-") + std::to_string(rng() % 1000) + "-" + std::to_string(i);
      r.arn = "arn:" + r.name;
      r.request = {{"TrainingJobName", r.name}};
      r.status = statuses[rng() % 3];
      r.secondary_status = SecondaryStatus::kStarting;
      r.creation_millis = 1000 * static_cast<int64_t>(rng() % 6);
      r.last_modified_millis = r.creation_millis + static_cast<int64_t>(rng() % 5000);
      if (i % 5 == 0) r.training_end_millis = r.last_modified_millis;
      ASSERT_TRUE(jobs_->Insert(r).ok());
      all_.push_back(r);
    }
  }

  // The reference: filter and sort in memory as ListTrainingJobs did before keyset paging.
  std::vector<std::string> Expected(const ListPageQuery& q) {
    std::vector<TrainingJobRecord> rows;
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
    auto key = [&](const TrainingJobRecord& r) {
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

  // Every row, read `page` rows at a time through cursors.
  std::vector<std::string> PageThrough(ListPageQuery q, size_t page) {
    q.limit = page;
    std::vector<std::string> names;
    for (int guard = 0; guard < 1000; ++guard) {
      auto rows = jobs_->ListPage(q);
      EXPECT_TRUE(rows.ok()) << rows.status().ToString();
      if (!rows.ok() || rows->empty()) break;
      for (const auto& r : *rows) names.push_back(r.name);
      const auto& last = rows->back();
      ListCursor c;
      c.name = last.name;
      if (q.sort_by == ListSortKey::kCreationTime) c.key = last.creation_millis;
      if (q.sort_by == ListSortKey::kStatus) c.key = last.status;
      if (q.sort_by == ListSortKey::kName) c.key = ToLower(last.name);
      q.after = c;
      if (rows->size() < page) break;
    }
    return names;
  }

  testing::TempDir dir_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<TrainingJobRepository> jobs_;
  std::vector<TrainingJobRecord> all_;
};

TEST_F(ListQueryTest, PagesGiveTheInMemoryOrderForEverySortFilterAndPageSize) {
  std::vector<ListFilter> filters(6);
  filters[1].status_equals = "Completed";
  filters[2].name_contains = "JOB-1";
  filters[3].creation_after_millis = 1000;
  filters[3].creation_before_millis = 5000;
  filters[4].modified_after_millis = 2500;
  filters[4].modified_before_millis = 6000;
  filters[5].status_equals = "Failed";
  filters[5].name_contains = "-";
  filters[5].creation_after_millis = 0;
  for (const ListFilter& f : filters) {
    for (auto sort : {ListSortKey::kCreationTime, ListSortKey::kName, ListSortKey::kStatus}) {
      for (bool descending : {false, true}) {
        ListPageQuery q;
        q.filter = f;
        q.sort_by = sort;
        q.descending = descending;
        const auto expected = Expected(q);
        for (size_t page : {1, 7, 100}) {
          EXPECT_EQ(PageThrough(q, page), expected)
              << "sort " << static_cast<int>(sort) << " desc " << descending << " page " << page;
        }
      }
    }
  }
}

TEST_F(ListQueryTest, SummaryRowsCarryTheTypedColumns) {
  ListPageQuery q;
  q.limit = 1000;
  auto rows = jobs_->ListPage(q);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), all_.size());
  for (const auto& row : *rows) {
    auto it = std::find_if(all_.begin(), all_.end(), [&](const auto& r) { return r.name == row.name; });
    ASSERT_NE(it, all_.end());
    EXPECT_EQ(row.arn, it->arn);
    EXPECT_EQ(row.status, ToString(it->status));
    EXPECT_EQ(row.secondary_status, ToString(it->secondary_status));
    EXPECT_EQ(row.creation_millis, it->creation_millis);
    EXPECT_EQ(row.last_modified_millis, it->last_modified_millis);
    EXPECT_EQ(row.training_end_millis, it->training_end_millis);
  }
}

TEST_F(ListQueryTest, RefusesCursorsOfTheWrongTypeAndColumnsATableLacks) {
  ListPageQuery q;
  q.after = ListCursor{std::string("x"), "job"};
  EXPECT_TRUE(jobs_->ListPage(q).status().IsInvalidArgument());  // creation time needs an integer key
  q.sort_by = ListSortKey::kStatus;
  q.after = ListCursor{int64_t{5}, "job"};
  EXPECT_TRUE(jobs_->ListPage(q).status().IsInvalidArgument());
  DefinitionRepository models(db_.get(), DefinitionRepository::Kind::kModel);
  ListPageQuery by_status;
  by_status.sort_by = ListSortKey::kStatus;
  EXPECT_TRUE(models.ListPage(by_status).status().IsInvalidArgument());
  ListPageQuery modified;
  modified.filter.modified_after_millis = 1;
  EXPECT_TRUE(models.ListPage(modified).status().IsInvalidArgument());
}

// The plans: every sort, with or without StatusEquals (and a creation-time range when sorting by
// creation time), walks an index in order (no temporary B-tree sorting the matches), so a page
// reads `limit` rows however many rows the table has. (A time range with another sort order is
// SQLite's choice: the range's index and a sort of the matches, or the order's index.)
TEST_F(ListQueryTest, PagesAreIndexRangesWithoutASort) {
  static constexpr ListTable kTables[] = {
      {.table = "training_jobs", .columns = "name", .has_status = true, .has_modified = true},
      {.table = "endpoints", .columns = "name", .has_status = true, .has_modified = true},
      {.table = "models", .columns = "name"},
      {.table = "endpoint_configs", .columns = "name"},
  };
  for (const ListTable& table : kTables) {
    for (bool status_filter : {false, true}) {
      for (auto sort : {ListSortKey::kCreationTime, ListSortKey::kName, ListSortKey::kStatus}) {
        for (bool descending : {false, true}) {
          for (bool cursor : {false, true}) {
            if ((status_filter || sort == ListSortKey::kStatus) && !table.has_status) continue;
            ListPageQuery q;
            if (status_filter) q.filter.status_equals = "InService";
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
  }
}

}  // namespace
}  // namespace kiln::store
