#pragma once
// STS over the AWS Query protocol (spec/control-plane-api.md §14): GetCallerIdentity.

#include <map>
#include <string>

#include "aws/errors.h"
#include "aws/request_context.h"

namespace kiln::api {

// `params` are the decoded query-string and form-body parameters. Missing Action → MissingAction,
// unknown → InvalidAction, both 400 in the Query error shape.
aws::WireResponse HandleSts(const aws::RequestContext& context, const std::map<std::string, std::string>& params);

}  // namespace kiln::api
