// Embeds data/instance-types.json in the binary (base/embed.h), so that the built-in catalog
// cannot drift from (or go missing beside) the executable. The path comes from the
// KILN_INSTANCE_TYPES_JSON compile definition (src/control/CMakeLists.txt), which also makes this
// file rebuild when the data changes.

#include <string_view>

#include "base/embed.h"

#ifndef KILN_INSTANCE_TYPES_JSON
#error "KILN_INSTANCE_TYPES_JSON must name data/instance-types.json (see src/control/CMakeLists.txt)"
#endif

KILN_EMBED_FILE(kiln_instance_types_json, KILN_INSTANCE_TYPES_JSON);

namespace kiln::control {

// Declared in instance_catalog.cc.
std::string_view BuiltInInstanceTypesJson() { return KILN_EMBEDDED(kiln_instance_types_json); }

}  // namespace kiln::control
