// The Application Auto Scaling model (src/api/models/autoscaling.json: botocore's, trimmed to the
// operations Kiln serves), embedded in the binary. KILN_AUTOSCALING_MODEL_PATH is set by
// src/api/CMakeLists.txt, which also makes this object depend on the JSON file.
#include <string_view>

#include "api/autoscaling.h"
#include "base/embed.h"

#ifndef KILN_AUTOSCALING_MODEL_PATH
#error "KILN_AUTOSCALING_MODEL_PATH must name src/api/models/autoscaling.json"
#endif

KILN_EMBED_FILE(kiln_autoscaling_model, KILN_AUTOSCALING_MODEL_PATH);

namespace kiln::api {

std::string_view EmbeddedAutoscalingModelJson() { return KILN_EMBEDDED(kiln_autoscaling_model); }

}  // namespace kiln::api
