// The SageMaker service model (src/api/models/sagemaker.json, ~670 KB), embedded with the
// assembler's .incbin: no generated source and no CMake string processing, so it costs nothing
// at build time. KILN_SAGEMAKER_MODEL_PATH is set by src/api/CMakeLists.txt, which also makes this
// object depend on the JSON file.
#include <string_view>

#include "api/service_model.h"

#ifndef KILN_SAGEMAKER_MODEL_PATH
#error "KILN_SAGEMAKER_MODEL_PATH must name src/api/models/sagemaker.json"
#endif

__asm__(
    ".pushsection .rodata\n"
    ".balign 16\n"
    ".global kiln_sagemaker_model_begin\n"
    "kiln_sagemaker_model_begin:\n"
    ".incbin \"" KILN_SAGEMAKER_MODEL_PATH "\"\n"
    ".global kiln_sagemaker_model_end\n"
    "kiln_sagemaker_model_end:\n"
    ".byte 0\n"
    ".popsection\n");

extern "C" const char kiln_sagemaker_model_begin[];
extern "C" const char kiln_sagemaker_model_end[];

namespace kiln::api {

std::string_view EmbeddedSageMakerModelJson() {
  return std::string_view(kiln_sagemaker_model_begin,
                          static_cast<size_t>(kiln_sagemaker_model_end - kiln_sagemaker_model_begin));
}

}  // namespace kiln::api
