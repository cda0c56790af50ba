#pragma once
// Test helper: a Database in a fresh temporary directory (a real file, so WAL and reopen behave
// as in production), removed when the helper is destroyed. Header-only so that other modules'
// tests can include it.

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "store/database.h"

namespace kiln::store::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Opens <dir>/kiln.db with every migration; throws on failure (tests only). `durable` false
// skips fsync at commit (faster; fine for tests that do not simulate power loss).
inline std::unique_ptr<Database> OpenTestDatabase(const std::string& dir, bool durable = true) {
  Database::Options options;
  options.durable = durable;
  auto db = Database::Open(dir + "/kiln.db", options);
  if (!db.ok()) throw std::runtime_error(db.status().ToString());
  return std::move(db).value();
}

}  // namespace kiln::store::testing
