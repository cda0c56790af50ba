#pragma once
// Test helper for the network tests of runtime/process: runs a shell command (ip, nft, ...) and
// returns what it printed, stdout and stderr together ("" when it cannot be started).

#include <cstdio>
#include <string>

namespace kiln::runtime::test_util {

inline std::string Shell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace kiln::runtime::test_util
