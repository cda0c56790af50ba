#pragma once
#include <string>

namespace kiln::cli {
// "0.1.0" (from CMake's project version).
std::string KilnVersion();
}  // namespace kiln::cli
