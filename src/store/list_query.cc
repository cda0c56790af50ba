#include "store/list_query.h"

#include <algorithm>
#include <limits>

#include "base/strings.h"

namespace kiln::store {
namespace {

// (A struct rather than std::variant<int64_t, std::string>: GCC 12 warns, wrongly, that a
// moved variant's string may be used uninitialised.)
ListSqlArg Int(int64_t value) { return {.is_text = false, .integer = value, .text = {}}; }
ListSqlArg Text(std::string value) { return {.is_text = true, .integer = 0, .text = std::move(value)}; }
ListSqlArg Key(const std::variant<int64_t, std::string>& key) {
  if (const auto* i = std::get_if<int64_t>(&key)) return Int(*i);
  return Text(std::get<std::string>(key));
}

void AddWhere(ListSql& out, std::string_view condition, ListSqlArg value) {
  out.sql += " AND ";
  out.sql += condition;
  out.args.push_back(std::move(value));
}

void Bind(Statement& st, int index, const ListSqlArg& arg) {
  if (arg.is_text) {
    st.BindText(index, arg.text);
  } else {
    st.BindInt64(index, arg.integer);
  }
}

}  // namespace

Result<ListSql> BuildFilterSql(const ListTable& table, const ListFilter& f) {
  if (f.status_equals && !table.has_status) {
    return Status::InvalidArgument(std::string(table.table) + " has no status to filter on");
  }
  if ((f.modified_after_millis || f.modified_before_millis) && !table.has_modified) {
    return Status::InvalidArgument(std::string(table.table) + " has no last-modified time to filter on");
  }
  if (f.warm_pool_status_equals && table.warm_pool_status.empty()) {
    return Status::InvalidArgument(std::string(table.table) + " has no warm pool status to filter on");
  }
  ListSql out;
  out.sql = "SELECT " + std::string(table.columns) + " FROM " + std::string(table.table) + " WHERE 1 = 1";
  if (f.status_equals) AddWhere(out, "status = ?", Text(*f.status_equals));
  if (f.warm_pool_status_equals) {
    AddWhere(out, "(" + std::string(table.warm_pool_status) + ") = ?", Text(*f.warm_pool_status_equals));
  }
  if (f.creation_after_millis) AddWhere(out, "creation_millis > ?", Int(*f.creation_after_millis));
  if (f.creation_before_millis) AddWhere(out, "creation_millis < ?", Int(*f.creation_before_millis));
  if (f.modified_after_millis) AddWhere(out, "last_modified_millis > ?", Int(*f.modified_after_millis));
  if (f.modified_before_millis) AddWhere(out, "last_modified_millis < ?", Int(*f.modified_before_millis));
  // SQLite's built-in lower() folds ASCII only, like base's ToLower that the API used before.
  if (f.name_contains && !f.name_contains->empty()) {
    AddWhere(out, "instr(lower(name), ?) > 0", Text(ToLower(*f.name_contains)));
  }
  return out;
}

Result<ListSql> BuildListSql(const ListTable& table, const ListPageQuery& query) {
  if (query.sort_by == ListSortKey::kStatus && !table.has_status) {
    return Status::InvalidArgument(std::string(table.table) + " has no status to sort on");
  }
  ASSIGN_OR_RETURN(ListSql out, BuildFilterSql(table, query.filter));
  const char* key_column = query.sort_by == ListSortKey::kCreationTime ? "creation_millis"
                           : query.sort_by == ListSortKey::kStatus     ? "status"
                                                                       : nullptr;
  const std::string after = query.descending ? "<" : ">";
  if (query.after) {
    const ListCursor& c = *query.after;
    if (key_column == nullptr) {
      AddWhere(out, "name " + after + " ?", Text(c.name));
    } else {
      const bool want_int = query.sort_by == ListSortKey::kCreationTime;
      if (want_int != std::holds_alternative<int64_t>(c.key)) {
        return Status::InvalidArgument("list cursor key has the wrong type for its sort key");
      }
      // "key >= k AND (key > k OR name > n)" rather than the row value (key, name) > (k, n):
      // the first conjunct is a plain range on the index's leading sort column, which SQLite
      // turns into an index seek; the second only tests the rows tied on k.
      const std::string key(key_column);
      AddWhere(out, key + (query.descending ? " <= ?" : " >= ?"), Key(c.key));
      AddWhere(out, "(" + key + " " + after + " ? OR name " + after + " ?)", Key(c.key));
      out.args.push_back(Text(c.name));
    }
  }
  const char* order = query.descending ? " DESC" : "";
  out.sql += " ORDER BY ";
  if (key_column != nullptr) out.sql += std::string(key_column) + order + ", ";
  out.sql += std::string("name") + order;  // the column's collation: NOCASE
  out.sql += " LIMIT ?";
  const size_t limit = std::min<size_t>(query.limit, static_cast<size_t>(std::numeric_limits<int64_t>::max()));
  out.args.push_back(Int(static_cast<int64_t>(limit)));
  return out;
}

namespace {

Status Run(Database& database, const ListSql& sql, const std::function<Status(const Statement&)>& row) {
  ASSIGN_OR_RETURN(auto st, database.Prepare(sql.sql));
  for (size_t i = 0; i < sql.args.size(); ++i) Bind(st, static_cast<int>(i + 1), sql.args[i]);
  while (true) {
    ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) return Status::Ok();
    RETURN_IF_ERROR(row(st));
  }
}

}  // namespace

Status ListPage(Database& database, const ListTable& table, const ListPageQuery& query,
                const std::function<Status(const Statement&)>& row) {
  ASSIGN_OR_RETURN(ListSql sql, BuildListSql(table, query));
  return Run(database, sql, row);
}

Status ListAll(Database& database, const ListTable& table, const ListFilter& filter, std::string_view order_by,
               const std::function<Status(const Statement&)>& row) {
  ASSIGN_OR_RETURN(ListSql sql, BuildFilterSql(table, filter));
  sql.sql += " ORDER BY ";
  sql.sql += order_by;
  return Run(database, sql, row);
}

}  // namespace kiln::store
