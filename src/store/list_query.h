#pragma once
// Keyset listing shared by the repositories whose rows a List* operation pages through
// (training jobs, models, endpoint configurations, endpoints).
//
// A page is read in the order (sort key, name): the name is unique case-insensitively, so it
// breaks ties and the pair identifies a row. The next page starts strictly after the last row
// returned (`ListPageQuery::after`), which is a range condition on an index
// (training_jobs_by_*, endpoints_by_*, ... in migrations.cc): a page reads `limit` index entries
// whatever the table's size, and a cursor stays valid while rows are created or deleted between
// pages. Every filter except NameContains is served from indexed columns (a time range combined
// with another sort order is left to SQLite's planner: the range's index and a sort of the
// matching rows, or the order's index and a filter); NameContains (a
// case-insensitive substring, which no index serves) is tested on the name column alone, read
// from the index being walked, so no JSON is parsed for rows that do not match.
//
// Order and comparison, as the API promised before keyset paging (spec/control-plane-api.md §4):
// CreationTime and LastModifiedTime compare as integers (ms); Status compares byte-wise; names
// compare ASCII-case-insensitively (the columns' COLLATE NOCASE, the same as comparing the
// lower-cased names byte-wise).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "store/database.h"

namespace kiln::store {

enum class ListSortKey { kCreationTime, kName, kStatus };

// The last row of a page: its sort key's value (an integer for kCreationTime, a string for
// kStatus; for kName the key is the name itself and `key` is not read) and its name.
struct ListCursor {
  std::variant<int64_t, std::string> key;
  std::string name;
};

struct ListFilter {
  std::optional<std::string> status_equals;  // only for tables with a status column
  std::optional<std::string> name_contains;  // case-insensitive (ASCII) substring; empty = all
  std::optional<int64_t> creation_after_millis, creation_before_millis;  // exclusive bounds
  std::optional<int64_t> modified_after_millis, modified_before_millis;  // exclusive; tables with it
  // ListTrainingJobs' WarmPoolStatusEquals: tables with ListTable::warm_pool_status.
  std::optional<std::string> warm_pool_status_equals;
};

struct ListPageQuery {
  ListFilter filter;
  ListSortKey sort_by = ListSortKey::kCreationTime;
  bool descending = false;
  std::optional<ListCursor> after;  // rows strictly after this one in the order above
  size_t limit = 10;                // at most this many rows
};

// The table a listing reads: its name, the columns to select (read back by `row` by position),
// and which optional columns it has. A filter on a column the table lacks is InvalidArgument.
struct ListTable {
  std::string_view table;
  std::string_view columns;
  bool has_status = false;
  bool has_modified = false;
  // An SQL expression for a row's warm pool status ("" when it has none); empty: the table has no
  // warm pools to filter on.
  std::string_view warm_pool_status = {};
};

// Runs the page query on `database` and calls `row` for each row, in order; an error from `row`
// stops the listing and is returned. InvalidArgument when the query names a column the table
// lacks (status, last-modified) or its cursor's key has the wrong type for `sort_by`.
Status ListPage(Database& database, const ListTable& table, const ListPageQuery& query,
                const std::function<Status(const Statement&)>& row);

// Every row matching `filter`, ordered by `order_by` (columns of the table, e.g. "seq"), for the
// callers that want them all (the repositories' List); errors as ListPage.
Status ListAll(Database& database, const ListTable& table, const ListFilter& filter, std::string_view order_by,
               const std::function<Status(const Statement&)>& row);

// The page query's SQL and its bound values in order (tests check the plan with it), and the
// filter's alone ("SELECT <columns> FROM <table> WHERE ...", no order, no limit).
struct ListSqlArg {
  bool is_text = false;
  int64_t integer = 0;
  std::string text;
};
struct ListSql {
  std::string sql;
  std::vector<ListSqlArg> args;  // for the `?`s in order
};
Result<ListSql> BuildListSql(const ListTable& table, const ListPageQuery& query);
Result<ListSql> BuildFilterSql(const ListTable& table, const ListFilter& filter);

}  // namespace kiln::store
