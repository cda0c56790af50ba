#include "api/sts.h"

#include "base/encoding.h"

namespace kiln::api {

aws::WireResponse HandleSts(const aws::RequestContext& context, const std::map<std::string, std::string>& params) {
  auto action = params.find("Action");
  if (action != params.end()) context.operation = action->second;
  if (action == params.end()) {
    return aws::SerializeError(aws::Protocol::kQuery, aws::AwsError("MissingAction", "Missing Action"),
                               context.request_id);
  }
  if (action->second != "GetCallerIdentity") {
    return aws::SerializeError(
        aws::Protocol::kQuery,
        aws::AwsError("InvalidAction", "Could not find operation " + action->second + " for version 2011-06-15"),
        context.request_id);
  }
  std::string arn, user_id, account = context.account_id;
  if (context.auth != nullptr) {
    arn = context.auth->credential.principal_arn;
    user_id = context.auth->credential.user_id;
    if (!context.auth->credential.account_id.empty()) account = context.auth->credential.account_id;
  } else {
    arn = "arn:aws:iam::" + account + ":root";
    user_id = account;
  }
  aws::WireResponse response;
  response.headers.emplace("x-amzn-RequestId", context.request_id);
  response.headers.emplace("Content-Type", "text/xml");
  response.body =
      "<GetCallerIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\n"
      "  <GetCallerIdentityResult>\n"
      "    <Arn>" +
      XmlEscape(arn) +
      "</Arn>\n"
      "    <UserId>" +
      XmlEscape(user_id) +
      "</UserId>\n"
      "    <Account>" +
      XmlEscape(account) +
      "</Account>\n"
      "  </GetCallerIdentityResult>\n"
      "  <ResponseMetadata>\n"
      "    <RequestId>" +
      XmlEscape(context.request_id) +
      "</RequestId>\n"
      "  </ResponseMetadata>\n"
      "</GetCallerIdentityResponse>\n";
  return response;
}

}  // namespace kiln::api
