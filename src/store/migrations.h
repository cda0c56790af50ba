#pragma once
// The schema of Kiln's database as an ordered list of numbered migrations.
//
// To change the schema, append a Migration with the next version to the list in migrations.cc;
// never edit or reorder one that has shipped. Database::Open applies every migration whose
// version is above the file's, each in its own transaction, recording it in schema_migrations.

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::store {

struct Migration {
  int64_t version;        // 1, 2, 3, ... without gaps
  std::string_view name;  // short description, stored with the version
  std::string_view sql;   // one or more statements
};

// Every migration this binary knows, ascending by version.
const std::vector<Migration>& AllMigrations();

}  // namespace kiln::store
