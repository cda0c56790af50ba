#pragma once
// Helpers shared by the fuzz targets (header only: each target is one .cc).

#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "net/http_server.h"
#include "store/database.h"
#include "store/test_util/temp_database.h"

namespace kiln::fuzz {

// A property of the code under test failed: abort, so libFuzzer records the input as a crash.
inline void Check(bool condition) {
  if (!condition) std::abort();
}

// Kiln logs every request at info; at 1,000s of runs a second that is all the fuzzer would do.
// KILN_FUZZ_DEBUG=1 keeps everything (debug level) for replaying one input.
inline void QuietLogs() {
  spdlog::set_level(std::getenv("KILN_FUZZ_DEBUG") != nullptr ? spdlog::level::debug : spdlog::level::off);
}

inline bool Debug() { return std::getenv("KILN_FUZZ_DEBUG") != nullptr; }

// A fresh directory removed (with everything in it) when destroyed. Under /dev/shm when it
// exists: the targets that open a SQLite database or write files per input do it in memory.
class ScratchDir {
 public:
  ScratchDir() {
    std::error_code ec;
    std::string base = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    std::string tmpl = base + "/kiln-fuzz-XXXXXX";
    Check(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One SQLite database (every migration applied) for the whole process. Opening a fresh one per
// input costs ~10 ms of migrations, and creating the resources a target needs through the API
// costs more than the request under test; restoring a snapshot costs ~0.1 ms.
inline store::Database& SharedDatabase() {
  static ScratchDir* dir = new ScratchDir();  // leaked on purpose: outlives every input
  static store::Database* db = store::testing::OpenTestDatabase(dir->path(), /*durable=*/false).release();
  return *db;
}

// Brings SharedDatabase() back to the state `populate` left it in: the first call runs
// `populate` on the freshly migrated database and copies every table (and the AUTOINCREMENT
// counters) into an attached in-memory snapshot; later calls ignore `populate` and copy the
// snapshot back, so every input starts from the same rows and ids and replays alone.
inline store::Database& RestoreDatabase(const std::function<void(store::Database&)>& populate = {}) {
  store::Database& db = SharedDatabase();
  static std::vector<std::string>* tables = nullptr;
  if (tables == nullptr) {
    tables = new std::vector<std::string>();
    auto st = db.Prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND name <> 'schema_migrations'");
    Check(st.ok());
    for (;;) {
      auto row = st->Step();
      Check(row.ok());
      if (!*row) break;
      tables->push_back(st->ColumnText(0));
    }
    if (populate) populate(db);
    std::string sql = "ATTACH DATABASE ':memory:' AS snap;";
    for (const std::string& t : *tables) sql += "CREATE TABLE snap.\"" + t + "\" AS SELECT * FROM main.\"" + t + "\";";
    sql += "CREATE TABLE snap.seq AS SELECT * FROM main.sqlite_sequence;";
    Check(db.Exec(sql).ok());
    return db;
  }
  std::string sql = "PRAGMA foreign_keys=OFF; BEGIN;";
  for (const std::string& t : *tables) {
    sql += "DELETE FROM main.\"" + t + "\"; INSERT INTO main.\"" + t + "\" SELECT * FROM snap.\"" + t + "\";";
  }
  sql += "DELETE FROM main.sqlite_sequence; INSERT INTO main.sqlite_sequence SELECT * FROM snap.seq; COMMIT;";
  sql += "PRAGMA foreign_keys=ON;";
  Check(db.Exec(sql).ok());
  return db;
}

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
inline bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n;
  }
  return true;
}

// Splits off the first line: {line, rest}. No newline: {all, ""}.
inline std::pair<std::string_view, std::string_view> FirstLine(std::string_view input) {
  size_t nl = input.find('\n');
  if (nl == std::string_view::npos) return {input, std::string_view(input.data() + input.size(), 0)};
  return {input.substr(0, nl), input.substr(nl + 1)};
}

}  // namespace kiln::fuzz
