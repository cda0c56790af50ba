// The CloudWatch service model (src/api/models/cloudwatch.json: botocore's, trimmed to the
// operations Kiln serves), embedded with .incbin like the SageMaker model (service_model_data.cc).
// KILN_CLOUDWATCH_MODEL_PATH is set by src/api/CMakeLists.txt.
#include <string_view>

#include "api/cloudwatch.h"

#ifndef KILN_CLOUDWATCH_MODEL_PATH
#error "KILN_CLOUDWATCH_MODEL_PATH must name src/api/models/cloudwatch.json"
#endif

__asm__(
    ".pushsection .rodata\n"
    ".balign 16\n"
    ".global kiln_cloudwatch_model_begin\n"
    "kiln_cloudwatch_model_begin:\n"
    ".incbin \"" KILN_CLOUDWATCH_MODEL_PATH "\"\n"
    ".global kiln_cloudwatch_model_end\n"
    "kiln_cloudwatch_model_end:\n"
    ".byte 0\n"
    ".popsection\n");

extern "C" const char kiln_cloudwatch_model_begin[];
extern "C" const char kiln_cloudwatch_model_end[];

namespace kiln::api {

std::string_view EmbeddedCloudWatchModelJson() {
  return std::string_view(kiln_cloudwatch_model_begin,
                          static_cast<size_t>(kiln_cloudwatch_model_end - kiln_cloudwatch_model_begin));
}

}  // namespace kiln::api
