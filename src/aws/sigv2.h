#pragma once
// S3's legacy Signature Version 2 (HMAC-SHA1), header form `Authorization: AWS <key>:<sig>` and
// query form `AWSAccessKeyId=&Expires=&Signature=`.
//
// Why Kiln speaks it: botocore (1.26 through 1.43) presigns S3 URLs with SigV2 by default when
// the client has a custom endpoint in us-east-1 and no explicit `signature_version`, so
// unmodified `generate_presigned_url` calls — the SageMaker SDK's among them — produce SigV2
// URLs. AWS still accepts them; so does Kiln. The string to sign follows botocore's HmacV1Auth.

#include <string>
#include <string_view>
#include <variant>

#include "aws/sigv4.h"

namespace kiln::aws {

// True when the request carries SigV2 credentials (either form).
bool IsSigV2(const SignableRequest& request);

// The canonical string SigV2 signs. `date_or_expires` is the Date header (header form) or the
// Expires value (query form); `resource_path` the path with the bucket (for virtual-hosted
// requests, "/<bucket>" + path).
std::string SigV2StringToSign(const SignableRequest& request, std::string_view date_or_expires,
                              std::string_view resource_path, bool query_form);
std::string SigV2Sign(std::string_view secret, std::string_view string_to_sign);  // base64

// Verifies a SigV2 request. The result's payload_mode is UNSIGNED-PAYLOAD (SigV2 does not cover
// the body); region is `default_region`. Header form: Date within max skew (kSkewed). Query
// form: Expires in the future (kExpired, with S3's Expires/ServerTime details); a missing parameter or an
// Expires that is not 0..2^31-1 seconds since the epoch is kMalformed. Query-form failures carry
// AuthForm::kQueryV2 (S3 answers them AccessDenied).
std::variant<VerifiedRequest, AuthError> VerifySigV2(const SignableRequest& request,
                                                     const CredentialProvider& credentials,
                                                     const std::string& default_region, int64_t now_millis,
                                                     int64_t max_skew_millis = 15 * 60 * 1000);

}  // namespace kiln::aws
