#include "store/database.h"

#include <sqlite3.h>

#include <string>
#include <utility>

#include "base/time.h"
#include "store/migrations.h"

namespace kiln::store {
namespace {

Status CodeToStatus(sqlite3* db, int rc, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT: {
      int ext = db != nullptr ? sqlite3_extended_errcode(db) : rc;
      if (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return Status::AlreadyExists(std::move(msg));
      }
      return Status::FailedPrecondition(std::move(msg));
    }
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return Status::Unavailable(std::move(msg));
    case SQLITE_FULL: return Status::ResourceExhausted(std::move(msg));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Status::DataLoss(std::move(msg));
    default: return Status::Internal(std::move(msg));
  }
}

}  // namespace

// ---- Statement ----

Statement::Statement(Database* db, sqlite3_stmt* stmt, std::unique_lock<RecursiveMutex> lock)
    : db_(db), stmt_(stmt), lock_(std::move(lock)) {}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), lock_(std::move(other.lock_)), bind_error_(std::move(other.bind_error_)) {
  other.stmt_ = nullptr;
}

Statement::~Statement() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

Status Statement::BindResult(int rc) {
  if (rc != SQLITE_OK && bind_error_.ok()) bind_error_ = db_->StatusFromCode(rc, "bind");
  return bind_error_;
}

Statement& Statement::BindInt64(int index, int64_t value) {
  (void)BindResult(sqlite3_bind_int64(stmt_, index, value));
  return *this;
}
Statement& Statement::BindDouble(int index, double value) {
  (void)BindResult(sqlite3_bind_double(stmt_, index, value));
  return *this;
}
Statement& Statement::BindText(int index, std::string_view value) {
  (void)BindResult(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}
Statement& Statement::BindBlob(int index, std::string_view value) {
  // A zero-length blob must still bind as a blob (not NULL): pass a non-null pointer.
  static const char kEmpty = 0;
  (void)BindResult(
      sqlite3_bind_blob64(stmt_, index, value.empty() ? &kEmpty : value.data(), value.size(), SQLITE_TRANSIENT));
  return *this;
}
Statement& Statement::BindNull(int index) {
  (void)BindResult(sqlite3_bind_null(stmt_, index));
  return *this;
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_error_ = Status::Ok();
}

Result<bool> Statement::Step() {
  if (!bind_error_.ok()) return bind_error_;
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  Status s = db_->StatusFromCode(rc, "sqlite step");
  sqlite3_reset(stmt_);
  return s;
}

Status Statement::Run() {
  for (;;) {
    ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return Status::Ok();
  }
}

int64_t Statement::ColumnInt64(int column) const { return sqlite3_column_int64(stmt_, column); }
double Statement::ColumnDouble(int column) const { return sqlite3_column_double(stmt_, column); }
std::string Statement::ColumnText(int column) const {
  const unsigned char* p = sqlite3_column_text(stmt_, column);
  int n = sqlite3_column_bytes(stmt_, column);
  return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p), n);
}
std::string Statement::ColumnBlob(int column) const {
  const void* p = sqlite3_column_blob(stmt_, column);
  int n = sqlite3_column_bytes(stmt_, column);
  return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
}
bool Statement::IsNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
int Statement::ColumnCount() const { return sqlite3_column_count(stmt_); }

// ---- Database ----

Status Database::StatusFromCode(int rc, std::string_view what) { return CodeToStatus(db_, rc, what); }

Result<std::unique_ptr<Database>> Database::Open(const std::string& path, const Options& options) {
  sqlite3* raw = nullptr;
  // NOMUTEX: every use of the connection already holds mutex_ (Statement and Transaction carry the
  // lock), so SQLite's own per-call mutex only cost time (~27% of a metric-store range read).
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  if (rc != SQLITE_OK) {
    Status s = CodeToStatus(raw, rc, "open database " + path);
    sqlite3_close(raw);
    return s;
  }
  std::unique_ptr<Database> db(new Database(raw));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, options.busy_timeout_ms);
  // WAL lets readers in other processes (kiln CLI, backups) proceed during writes; FULL makes
  // every commit durable before it returns, which is what "acknowledged" means in DESIGN.md §4.
  RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(db->Exec(options.durable ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  RETURN_IF_ERROR(db->Migrate(options.migrations != nullptr ? *options.migrations : AllMigrations()));
  return db;
}

Database::~Database() { sqlite3_close_v2(db_); }

Result<Statement> Database::Prepare(std::string_view sql) {
  std::unique_lock<RecursiveMutex> lock(mutex_);  // handed to the Statement
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) return StatusFromCode(rc, "prepare");
  if (stmt == nullptr) return Status::InvalidArgument("prepare: empty SQL");
  return Statement(this, stmt, std::move(lock));
}

Status Database::Exec(std::string_view sql) {
  RecursiveMutexLock lock(mutex_);
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::Ok();
  Status s = StatusFromCode(rc, "exec");
  if (err != nullptr) {
    s = Status(s.code(), std::string("exec: ") + err);
    sqlite3_free(err);
  }
  return s;
}

Status Database::WithTransaction(const std::function<Status(Database&)>& body) {
  Transaction txn(*this);
  RETURN_IF_ERROR(txn.status());
  RETURN_IF_ERROR(body(*this));
  return txn.Commit();
}

int64_t Database::LastInsertRowId() {
  RecursiveMutexLock lock(mutex_);
  return sqlite3_last_insert_rowid(db_);
}

int64_t Database::Changes() {
  RecursiveMutexLock lock(mutex_);
  return sqlite3_changes64(db_);
}

Status Database::Migrate(const std::vector<Migration>& migrations) {
  RETURN_IF_ERROR(
      Exec("CREATE TABLE IF NOT EXISTS schema_migrations ("
           " version INTEGER PRIMARY KEY NOT NULL, name TEXT NOT NULL, applied_millis INTEGER NOT NULL)"));
  int64_t current = 0;
  {
    ASSIGN_OR_RETURN(auto st, Prepare("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) current = st.ColumnInt64(0);
  }
  int64_t known = migrations.empty() ? 0 : migrations.back().version;
  if (current > known) {
    return Status::FailedPrecondition("database schema version " + std::to_string(current) +
                                      " is newer than this binary supports (" + std::to_string(known) +
                                      "); upgrade Kiln or use another data directory");
  }
  int64_t expected = 1;
  for (const Migration& m : migrations) {
    if (m.version != expected) {
      return Status::Internal("migration list out of order at version " + std::to_string(m.version));
    }
    ++expected;
    if (m.version <= current) continue;
    Status s = WithTransaction([&](Database& d) -> Status {
      RETURN_IF_ERROR(d.Exec(m.sql));
      ASSIGN_OR_RETURN(auto st, d.Prepare("INSERT INTO schema_migrations(version, name, applied_millis) "
                                          "VALUES (?, ?, ?)"));
      st.BindInt64(1, m.version).BindText(2, m.name).BindInt64(3, NowMillis());
      return st.Run();
    });
    if (!s.ok()) {
      return Status::Internal("migration " + std::to_string(m.version) + " (" + std::string(m.name) +
                              ") failed: " + s.message());
    }
    current = m.version;
  }
  schema_version_ = current;
  return Status::Ok();
}

// ---- Transaction ----

Transaction::Transaction(Database& db) : db_(db), lock_(db.mutex_) {
  if (db_.transaction_depth_ == 0) {
    begin_status_ = db_.Exec("BEGIN IMMEDIATE");
  } else {
    begin_status_ = db_.Exec("SAVEPOINT kiln_sp" + std::to_string(db_.transaction_depth_));
  }
  if (begin_status_.ok()) {
    ++db_.transaction_depth_;
  } else {
    done_ = true;
  }
}

Transaction::~Transaction() {
  if (done_) return;
  --db_.transaction_depth_;
  if (db_.transaction_depth_ == 0) {
    (void)db_.Exec("ROLLBACK");
  } else {
    std::string sp = "kiln_sp" + std::to_string(db_.transaction_depth_);
    (void)db_.Exec("ROLLBACK TO " + sp + "; RELEASE " + sp);
  }
}

Status Transaction::Commit() {
  if (done_) return Status::FailedPrecondition("transaction already finished");
  db_.mutex_.AssertHeld();  // lock_ holds it
  int depth = db_.transaction_depth_ - 1;
  Status s = depth == 0 ? db_.Exec("COMMIT") : db_.Exec("RELEASE kiln_sp" + std::to_string(depth));
  if (!s.ok()) return s;  // the destructor rolls back
  db_.transaction_depth_ = depth;
  done_ = true;
  return Status::Ok();
}

}  // namespace kiln::store
