// Embeds data/instance-types.json in the binary, so that the built-in catalog cannot drift from
// (or go missing beside) the executable. The path comes from the KILN_INSTANCE_TYPES_JSON compile
// definition (src/control/CMakeLists.txt), which also makes this file rebuild when the data changes.

#include <string_view>

#ifndef KILN_INSTANCE_TYPES_JSON
#error "KILN_INSTANCE_TYPES_JSON must name data/instance-types.json (see src/control/CMakeLists.txt)"
#endif

__asm__(
    ".pushsection .rodata\n"
    ".balign 16\n"
    ".global kiln_instance_types_json_begin\n"
    ".hidden kiln_instance_types_json_begin\n"
    ".type kiln_instance_types_json_begin, @object\n"
    "kiln_instance_types_json_begin:\n"
    ".incbin \"" KILN_INSTANCE_TYPES_JSON "\"\n"
    ".global kiln_instance_types_json_end\n"
    ".hidden kiln_instance_types_json_end\n"
    ".type kiln_instance_types_json_end, @object\n"
    "kiln_instance_types_json_end:\n"
    ".byte 0\n"
    ".popsection\n");

extern "C" const char kiln_instance_types_json_begin[];
extern "C" const char kiln_instance_types_json_end[];

namespace kiln::control {

// Declared in instance_catalog.cc.
std::string_view BuiltInInstanceTypesJson() {
  return std::string_view(kiln_instance_types_json_begin,
                          static_cast<size_t>(kiln_instance_types_json_end - kiln_instance_types_json_begin));
}

}  // namespace kiln::control
