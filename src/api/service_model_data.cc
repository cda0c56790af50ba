// The SageMaker service model (src/api/models/sagemaker.json, ~670 KB), embedded in the binary
// (base/embed.h). KILN_SAGEMAKER_MODEL_PATH is set by src/api/CMakeLists.txt, which also makes
// this object depend on the JSON file.
#include <string_view>

#include "api/service_model.h"
#include "base/embed.h"

#ifndef KILN_SAGEMAKER_MODEL_PATH
#error "KILN_SAGEMAKER_MODEL_PATH must name src/api/models/sagemaker.json"
#endif

KILN_EMBED_FILE(kiln_sagemaker_model, KILN_SAGEMAKER_MODEL_PATH);

namespace kiln::api {

std::string_view EmbeddedSageMakerModelJson() { return KILN_EMBEDDED(kiln_sagemaker_model); }

}  // namespace kiln::api
