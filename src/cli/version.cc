#include "cli/version.h"

namespace kiln::cli {
std::string KilnVersion() { return KILN_VERSION; }
}  // namespace kiln::cli
