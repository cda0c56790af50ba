#include "aws/sigv2.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::aws {

namespace {

// Sub-resources that belong to the signed resource (botocore's HmacV1Auth.QSAOfInterest).
constexpr std::string_view kSubresources[] = {"accelerate",
                                              "acl",
                                              "cors",
                                              "defaultObjectAcl",
                                              "location",
                                              "logging",
                                              "partNumber",
                                              "policy",
                                              "requestPayment",
                                              "torrent",
                                              "versioning",
                                              "versionId",
                                              "versions",
                                              "website",
                                              "uploads",
                                              "uploadId",
                                              "response-content-type",
                                              "response-content-language",
                                              "response-expires",
                                              "response-cache-control",
                                              "response-content-disposition",
                                              "response-content-encoding",
                                              "delete",
                                              "lifecycle",
                                              "tagging",
                                              "restore",
                                              "storageClass",
                                              "notification",
                                              "replication",
                                              "analytics",
                                              "metrics",
                                              "inventory",
                                              "select",
                                              "select-type",
                                              "object-lock"};

bool IsSubresource(std::string_view name) {
  return std::find(std::begin(kSubresources), std::end(kSubresources), name) != std::end(kSubresources);
}

// Query parameters as (raw name, decoded value) pairs, in order; '+' is a literal plus and a
// malformed escape is kept as written.
std::vector<QueryParam> QueryPairs(std::string_view raw_query) {
  Result<std::vector<QueryParam>> params = ParseQueryString(raw_query, {.decode_names = false});  // cannot fail
  return std::move(*params);
}

std::string QueryValue(std::string_view raw_query, std::string_view name) {
  for (auto& [n, v] : QueryPairs(raw_query)) {
    if (n == name) return v;
  }
  return "";
}

bool HasQueryParam(std::string_view raw_query, std::string_view name) {
  for (auto& [n, v] : QueryPairs(raw_query)) {
    if (n == name) return true;
  }
  return false;
}

std::string HeaderValue(const HeaderMap& headers, std::string_view name) {
  const std::string* v = FindHeader(headers, name);
  return v ? std::string(Trim(*v)) : std::string();
}

}  // namespace

bool IsSigV2(const SignableRequest& request) {
  if (const std::string* auth = FindHeader(request.headers, "Authorization")) {
    return StartsWith(*auth, "AWS ");
  }
  return HasQueryParam(request.raw_query, "AWSAccessKeyId") && HasQueryParam(request.raw_query, "Signature");
}

std::string SigV2StringToSign(const SignableRequest& request, std::string_view date_or_expires,
                              std::string_view resource_path, bool query_form) {
  std::string out = std::string(request.method) + "\n";
  auto pairs = QueryPairs(request.raw_query);
  auto header_or_query = [&](std::string_view name) {
    std::string v = HeaderValue(request.headers, name);
    if (v.empty() && query_form) {
      for (auto& [n, value] : pairs) {
        if (EqualsIgnoreCase(n, name)) return value;
      }
    }
    return v;
  };
  out += header_or_query("Content-MD5") + "\n";
  out += header_or_query("Content-Type") + "\n";
  out += std::string(date_or_expires) + "\n";

  std::map<std::string, std::string> amz;  // lower-case name → comma-joined trimmed values
  for (const auto& [name, value] : request.headers) {
    std::string lower = ToLower(name);
    if (!StartsWith(lower, "x-amz-")) continue;
    std::string& joined = amz[lower];
    if (!joined.empty()) joined += ',';
    joined += Trim(value);
  }
  if (query_form) {
    // Presigned URLs carry the signed x-amz-* headers (e.g. the security token) as parameters.
    for (auto& [n, v] : pairs) {
      std::string lower = ToLower(n);
      if (StartsWith(lower, "x-amz-") && !amz.count(lower)) amz[lower] = std::string(Trim(v));
    }
  }
  for (const auto& [name, value] : amz) out += name + ":" + value + "\n";

  out += resource_path;
  std::vector<std::pair<std::string, std::string>> sub;
  for (auto& [n, v] : pairs) {
    if (IsSubresource(n)) sub.emplace_back(n, v);
  }
  std::stable_sort(sub.begin(), sub.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < sub.size(); ++i) {
    out += i == 0 ? '?' : '&';
    out += sub[i].first;
    // botocore writes `name=value` whenever the parameter had a '=' (even with an empty value);
    // S3's own sub-resources without values (?uploads, ?delete) are sent bare.
    if (!sub[i].second.empty() || request.raw_query.find(sub[i].first + "=") != std::string_view::npos) {
      out += '=';
      out += sub[i].second;
    }
  }
  return out;
}

std::string SigV2Sign(std::string_view secret, std::string_view string_to_sign) {
  return Base64Encode(HmacSha1(secret, string_to_sign));
}

std::variant<VerifiedRequest, AuthError> VerifySigV2(const SignableRequest& request,
                                                     const CredentialProvider& credentials,
                                                     const std::string& default_region, int64_t now_millis,
                                                     int64_t max_skew_millis) {
  std::string key_id, signature, date_or_expires;
  bool query_form = false;
  if (const std::string* auth = FindHeader(request.headers, "Authorization")) {
    std::string_view rest = Trim(std::string_view(*auth).substr(4));
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) {
      return AuthError{AuthFailure::kMalformed,
                       "The authorization header is malformed; expected 'AWS <key>:<signature>'.", "", ""};
    }
    key_id = std::string(rest.substr(0, colon));
    signature = std::string(rest.substr(colon + 1));
    date_or_expires = HeaderValue(request.headers, "Date");
    std::string amz_date = HeaderValue(request.headers, "x-amz-date");
    std::string when = amz_date.empty() ? date_or_expires : amz_date;
    auto t = ParseRfc1123(when);
    if (!t) t = ParseAmzDate(when);
    if (!t) {
      return AuthError{AuthFailure::kMissing, "AWS authentication requires a valid Date or x-amz-date header", "", ""};
    }
    if (*t < now_millis - max_skew_millis || *t > now_millis + max_skew_millis) {
      return AuthError{AuthFailure::kSkewed,
                       "The difference between the request time and the current time is too large.", "", ""};
    }
    // When x-amz-date is given it is the signed time and the Date line is empty (S3 docs).
    if (!amz_date.empty()) date_or_expires.clear();
  } else {
    query_form = true;
    key_id = QueryValue(request.raw_query, "AWSAccessKeyId");
    signature = QueryValue(request.raw_query, "Signature");
    date_or_expires = QueryValue(request.raw_query, "Expires");
    // S3 answers each of these with AccessDenied (403) and these words.
    auto query_error = [](AuthFailure failure, std::string message) {
      AuthError error{failure, std::move(message), "", ""};
      error.form = AuthForm::kQueryV2;
      return error;
    };
    if (key_id.empty() || signature.empty() || date_or_expires.empty()) {
      return query_error(AuthFailure::kMalformed,
                         "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters");
    }
    // Seconds since the epoch, a 32-bit time as S3 reads it (an expiry past 2038 is refused too).
    auto expires = ParseInt64(date_or_expires);
    if (!expires || *expires < 0 || *expires > INT32_MAX) {
      return query_error(AuthFailure::kMalformed, "Invalid date (should be seconds since epoch): " + date_or_expires);
    }
    if (*expires * 1000 < now_millis) {
      AuthError error = query_error(AuthFailure::kExpired, "Request has expired");
      std::string expires_at = FormatIso8601Millis(*expires * 1000);
      std::string server_time = FormatIso8601Millis(now_millis);
      // S3 writes both without the fraction: 2024-05-01T10:00:00Z.
      error.details = {{"Expires", expires_at.substr(0, 19) + "Z"}, {"ServerTime", server_time.substr(0, 19) + "Z"}};
      return error;
    }
  }
  std::optional<Credential> credential = credentials.Lookup(key_id);
  if (!credential) {
    return AuthError{AuthFailure::kUnknownKey, "The AWS Access Key Id you provided does not exist in our records.", "",
                     ""};
  }
  if (!credential->session_token.empty()) {
    std::string token = HeaderValue(request.headers, "x-amz-security-token");
    if (token.empty() && query_form) token = QueryValue(request.raw_query, "x-amz-security-token");
    if (token != credential->session_token) {
      return AuthError{AuthFailure::kBadToken, "The provided token is malformed or otherwise invalid.", "", ""};
    }
  }
  // Virtual-hosted requests sign "/<bucket>" + path; the front door does not know the bucket
  // suffixes, so the host's first label is tried as the bucket when the plain path fails.
  std::vector<std::string> resources = {request.raw_path.empty() ? "/" : std::string(request.raw_path)};
  std::string host = HeaderValue(request.headers, "Host");
  if (size_t dot = host.find('.');
      dot != std::string::npos && dot > 0 && host.find_first_not_of("0123456789.:") != std::string::npos) {
    resources.push_back("/" + host.substr(0, dot) + resources.front());
  }
  std::string first_string_to_sign;
  for (const std::string& resource : resources) {
    std::string string_to_sign = SigV2StringToSign(request, date_or_expires, resource, query_form);
    if (first_string_to_sign.empty()) first_string_to_sign = string_to_sign;
    if (ConstantTimeEquals(SigV2Sign(credential->secret_access_key, string_to_sign), signature)) {
      VerifiedRequest verified;
      verified.credential = *credential;
      verified.region = default_region;
      verified.service = "s3";
      verified.payload_mode = std::string(kUnsignedPayload);
      verified.presigned = query_form;
      return verified;
    }
  }
  return AuthError{AuthFailure::kBadSignature, "", "", first_string_to_sign};
}

}  // namespace kiln::aws
