#include "control/multi_model_fetcher.h"

#include <nlohmann/json.hpp>

#include "agent/model_data.h"

namespace kiln::control {

Status MultiModelFetcher::Fetch(const std::string& s3_uri, const std::string& dir) {
  if (s3_uri.rfind("s3://", 0) != 0) {
    return Status::InvalidArgument("ClientError: " + s3_uri + " is not an s3:// URI.");
  }
  const std::string rest = s3_uri.substr(5);
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size()) {
    return Status::NotFound("No object at " + s3_uri + ".");
  }
  // A missing object is the client's ValidationError (no retry): tell it apart before unpacking.
  auto head = store_->HeadObject(rest.substr(0, slash), rest.substr(slash + 1));
  if (!head.ok()) {
    if (head.status().IsNotFound()) return Status::NotFound("No object at " + s3_uri + ".");
    return head.status();
  }
  nlohmann::json container = {{"ModelDataUrl", s3_uri}};
  auto prepared = agent::PrepareModelData(*store_, container, dir, cache_dir_, nullptr, cap_);
  if (!prepared.ok()) return prepared.status();
  return Status::Ok();
}

}  // namespace kiln::control
