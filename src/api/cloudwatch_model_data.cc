// The CloudWatch service model (src/api/models/cloudwatch.json: botocore's, trimmed to the
// operations Kiln serves), embedded in the binary. KILN_CLOUDWATCH_MODEL_PATH is set by
// src/api/CMakeLists.txt, which also makes this object depend on the JSON file.
#include <string_view>

#include "api/cloudwatch.h"
#include "base/embed.h"

#ifndef KILN_CLOUDWATCH_MODEL_PATH
#error "KILN_CLOUDWATCH_MODEL_PATH must name src/api/models/cloudwatch.json"
#endif

KILN_EMBED_FILE(kiln_cloudwatch_model, KILN_CLOUDWATCH_MODEL_PATH);

namespace kiln::api {

std::string_view EmbeddedCloudWatchModelJson() { return KILN_EMBEDDED(kiln_cloudwatch_model); }

}  // namespace kiln::api
