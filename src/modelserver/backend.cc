#include "modelserver/backend.h"

#include <nlohmann/json.hpp>

namespace kiln::modelserver {

InferenceResponse ErrorResponse(int status, std::string_view type, std::string_view message) {
  InferenceResponse response;
  response.status = status;
  response.content_type = "application/json";
  nlohmann::json body = {{"code", status}, {"type", std::string(type)}, {"message", std::string(message)}};
  // Handler messages may hold any bytes: replace invalid UTF-8 rather than throw.
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

}  // namespace kiln::modelserver
