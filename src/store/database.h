#pragma once
// Database: Kiln's durable state (DESIGN.md §4), one SQLite file opened through the C API.
//
// Durability: WAL journal, synchronous=FULL, so a write acknowledged by a committed transaction
// survives a crash or power loss. Foreign keys are enforced. Schema changes are numbered
// migrations (store/migrations.h) applied in order at Open, each in its own transaction.
//
// Thread-safety: one Database may be used from any number of threads. A single mutex serialises
// every use of the connection; Statement objects and Transaction hold it for their lifetime, so
// keep them short-lived and never hold one while waiting on something that needs the database.
// The mutex is recursive so that code inside a Transaction may prepare statements and call Exec.
//
//   ASSIGN_OR_RETURN(auto db, Database::Open(path, {}));
//   RETURN_IF_ERROR(db->WithTransaction([&](Database& d) -> Status {
//     ASSIGN_OR_RETURN(auto st, d.Prepare("INSERT INTO t(a, b) VALUES (?, ?)"));
//     st.BindInt64(1, 7).BindText(2, "x");
//     return st.Run();
//   }));

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace kiln::store {

struct Migration;

// A prepared statement. Movable, not copyable; holds the database lock while it exists.
// Parameter indexes are 1-based (SQLite's convention), column indexes 0-based.
class Statement {
 public:
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  // Binding errors (index out of range) are reported by the next Step()/Run().
  Statement& BindInt64(int index, int64_t value);
  Statement& BindDouble(int index, double value);
  Statement& BindText(int index, std::string_view value);
  Statement& BindBlob(int index, std::string_view value);
  Statement& BindNull(int index);
  // Resets the statement so that it may run again with new bindings.
  void Reset();

  // Advances to the next row: true when a row is available, false when done.
  // A UNIQUE/PRIMARY KEY violation is AlreadyExists; other constraint failures FailedPrecondition;
  // SQLITE_BUSY is Unavailable; anything else Internal with SQLite's message.
  Result<bool> Step();
  // Runs a statement that returns no rows (or ignores them).
  Status Run();

  // Column readers for the current row. NULL reads as 0 / "" ; IsNull tells them apart.
  int64_t ColumnInt64(int column) const;
  double ColumnDouble(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;
  bool IsNull(int column) const;
  int ColumnCount() const;

 private:
  friend class Database;
  Statement(class Database* db, sqlite3_stmt* stmt, std::unique_lock<RecursiveMutex> lock);
  Status BindResult(int rc);

  class Database* db_;
  sqlite3_stmt* stmt_;
  // Invisible to the thread-safety analysis (a lock held across calls); the statement touches no
  // GUARDED_BY member of the Database.
  std::unique_lock<RecursiveMutex> lock_;
  Status bind_error_;
};

class Database {
 public:
  struct Options {
    // How long a statement waits for a lock held by another connection (another process) before
    // failing with Unavailable. Longer waits trade latency for fewer spurious failures.
    int busy_timeout_ms = 5000;
    // true: synchronous=FULL, every commit is durable before it returns. false: synchronous=NORMAL,
    // several times faster per commit, but a power loss may drop the last commits (WAL never
    // corrupts). Only tests should turn it off.
    bool durable = true;
    // The migrations to apply; nullptr means store::AllMigrations(). Tests pass their own list.
    const std::vector<Migration>* migrations = nullptr;
  };

  // Opens (creating if needed) the database at `path` (":memory:" for a private in-memory one)
  // and applies pending migrations. Errors: Internal when SQLite cannot open the file or a
  // migration fails (that migration is rolled back); FailedPrecondition when the file's schema
  // version is newer than this binary knows (it was written by a newer Kiln).
  static Result<std::unique_ptr<Database>> Open(const std::string& path, const Options& options);

  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Compiles `sql` (one statement). The returned Statement holds the lock until destroyed.
  Result<Statement> Prepare(std::string_view sql);
  // Runs one or more statements without results.
  Status Exec(std::string_view sql);

  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT with the lock held throughout; rolls back when
  // `body` returns an error (which is returned) or when COMMIT fails. A nested call (inside
  // another transaction on this thread) uses a SAVEPOINT, so its failure undoes only its own
  // changes; the outer transaction decides whether anything is committed.
  Status WithTransaction(const std::function<Status(Database&)>& body);

  // Highest applied migration version.
  int64_t schema_version() const { return schema_version_; }
  // Rowid of the last INSERT on this connection (meaningful only under the caller's transaction).
  int64_t LastInsertRowId();
  // Rows changed by the last statement.
  int64_t Changes();

 private:
  friend class Statement;
  friend class Transaction;
  explicit Database(sqlite3* db) : db_(db) {}
  Status Migrate(const std::vector<Migration>& migrations);
  Status StatusFromCode(int rc, std::string_view what);

  sqlite3* db_;
  RecursiveMutex mutex_;
  int transaction_depth_ GUARDED_BY(mutex_) = 0;
  int64_t schema_version_ = 0;
};

// RAII form of a transaction: begins on construction (check status()), rolls back on destruction
// unless Commit() succeeded. Holds the database lock for its lifetime.
class Transaction {
 public:
  explicit Transaction(Database& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  const Status& status() const { return begin_status_; }
  Status Commit();

 private:
  Database& db_;
  // Holds db_.mutex_ from construction to destruction; methods say so with AssertHeld (the analysis
  // cannot follow a lock kept in a member).
  std::unique_lock<RecursiveMutex> lock_;
  Status begin_status_;
  bool done_ = false;
};

}  // namespace kiln::store
