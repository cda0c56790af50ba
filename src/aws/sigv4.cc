#include "aws/sigv4.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/query_string.h"
#include "base/strings.h"
#include "base/time.h"

namespace kiln::aws {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";
constexpr std::string_view kTerminator = "aws4_request";
constexpr int64_t kMaxPresignSeconds = 604800;

// ---- SHA-256 and HMAC-SHA256 for the signature ----
//
// OpenSSL 3's one-shot calls (EVP_DigestInit_ex with EVP_sha256(), HMAC()) look the algorithm up
// in the provider store on every call (a process-wide read-write lock, shared by every event loop)
// and allocate a fresh context: ~1 µs for a 16-byte hash, and 4 of them (body, canonical request,
// the HMAC's two) were most of a request's verification. Here the algorithm is fetched once, each
// thread reuses one context, and the HMAC starts from the signing key's precomputed inner and outer
// states (kept in the key cache below), so an HMAC costs two small SHA-256 finishes.

const EVP_MD* Sha256Algorithm() {
  static const EVP_MD* md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (fetched == nullptr) std::abort();  // a broken OpenSSL: nothing sensible to do
    return fetched;                        // kept for the life of the process
  }();
  return md;
}

// An owned EVP_MD_CTX.
struct MdContext {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  MdContext() {
    if (ctx == nullptr) std::abort();
  }
  ~MdContext() { EVP_MD_CTX_free(ctx); }
  MdContext(const MdContext&) = delete;
  MdContext& operator=(const MdContext&) = delete;
};

// The calling thread's scratch context.
EVP_MD_CTX* ScratchContext() {
  thread_local MdContext scratch;
  return scratch.ctx;
}

using Digest32 = std::array<unsigned char, 32>;

Digest32 Sha256Of(std::string_view data) {
  EVP_MD_CTX* ctx = ScratchContext();
  Digest32 out;
  if (EVP_DigestInit_ex(ctx, Sha256Algorithm(), nullptr) != 1 || EVP_DigestUpdate(ctx, data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx, out.data(), nullptr) != 1) {
    std::abort();
  }
  return out;
}

std::string HexOf(const Digest32& digest) {
  return HexEncode(std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

// HMAC-SHA256 under one key, its ipad/opad blocks already absorbed (RFC 2104).
class HmacKey {
 public:
  explicit HmacKey(std::string_view key) {
    // Signing keys are 32 bytes; a key longer than the block would be hashed first (RFC 2104).
    Digest32 hashed;
    if (key.size() > kBlock) {
      hashed = Sha256Of(key);
      key = std::string_view(reinterpret_cast<const char*>(hashed.data()), hashed.size());
    }
    unsigned char ipad[kBlock], opad[kBlock];
    for (size_t i = 0; i < kBlock; ++i) {
      unsigned char k = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
      ipad[i] = k ^ 0x36;
      opad[i] = k ^ 0x5c;
    }
    if (EVP_DigestInit_ex(inner_.ctx, Sha256Algorithm(), nullptr) != 1 ||
        EVP_DigestUpdate(inner_.ctx, ipad, kBlock) != 1 ||
        EVP_DigestInit_ex(outer_.ctx, Sha256Algorithm(), nullptr) != 1 ||
        EVP_DigestUpdate(outer_.ctx, opad, kBlock) != 1) {
      std::abort();
    }
    OPENSSL_cleanse(ipad, kBlock);
    OPENSSL_cleanse(opad, kBlock);
  }

  Digest32 Mac(std::string_view data) const {
    EVP_MD_CTX* ctx = ScratchContext();
    Digest32 inner_hash, out;
    if (EVP_MD_CTX_copy_ex(ctx, inner_.ctx) != 1 || EVP_DigestUpdate(ctx, data.data(), data.size()) != 1 ||
        EVP_DigestFinal_ex(ctx, inner_hash.data(), nullptr) != 1 || EVP_MD_CTX_copy_ex(ctx, outer_.ctx) != 1 ||
        EVP_DigestUpdate(ctx, inner_hash.data(), inner_hash.size()) != 1 ||
        EVP_DigestFinal_ex(ctx, out.data(), nullptr) != 1) {
      std::abort();
    }
    return out;
  }

 private:
  static constexpr size_t kBlock = 64;  // SHA-256's block size
  MdContext inner_, outer_;
};

// ---- Signing-key cache ----
//
// Deriving kSigning costs four HMACs; every request of a client reuses the same one for a day
// (the cache key includes the scope's date, so a new day derives a new key once). Entries keep
// the secret they were derived from, so a rotated secret never hits a stale key. Per thread: the
// event loops and workers each keep their own, with no lock between them. Bounded: when full it
// is simply cleared (entries are cheap to rebuild, and there are few distinct keys per day).
struct SigningKey {
  std::string secret;  // what the key was derived from
  std::string key;     // kSigning, 32 raw bytes
  HmacKey hmac;        // HMAC under `key`
  SigningKey(std::string_view secret_in, std::string key_in) : secret(secret_in), key(std::move(key_in)), hmac(key) {}
};

const SigningKey& CachedSigningKey(std::string_view key_id, std::string_view secret, std::string_view date,
                                   std::string_view region, std::string_view service) {
  constexpr size_t kMaxEntries = 64;
  thread_local std::map<std::string, std::unique_ptr<SigningKey>, std::less<>> entries;
  thread_local std::string cache_key;
  cache_key.clear();
  cache_key.append(key_id).append("\n").append(date).append("\n").append(region).append("\n").append(service);
  auto it = entries.find(cache_key);
  if (it != entries.end() && it->second->secret == secret) return *it->second;
  if (it == entries.end() && entries.size() >= kMaxEntries) entries.clear();
  auto entry = std::make_unique<SigningKey>(secret, DeriveSigningKey(secret, date, region, service));
  std::unique_ptr<SigningKey>& slot = entries[cache_key];
  slot = std::move(entry);
  return *slot;
}

bool IsHex64(std::string_view s) {
  if (s.size() != 64) {
    return false;
  }
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); });
}

bool IsPayloadLiteral(std::string_view s) {
  return s == kUnsignedPayload || s == kStreamingSigned || s == kStreamingSignedTrailer ||
         s == kStreamingUnsignedTrailer;
}

// Decodes %XX escapes; a malformed escape is kept literally (it is then re-encoded as %25..),
// which is what AWS's signers do with such input.
std::string DecodeLenient(std::string_view s) {
  std::optional<std::string> decoded = UriDecode(s);
  return decoded ? *decoded : std::string(s);
}

// The query as SigV4 reads it: '+' is a literal plus and a malformed escape is kept as written
// (see DecodeLenient).
std::vector<QueryParam> ParseQuery(std::string_view raw_query) {
  Result<std::vector<QueryParam>> params = ParseQueryString(raw_query);  // never fails in this mode
  return std::move(*params);
}

// RFC 3986 §5.2.4 dot-segment removal plus the collapsing of empty segments that AWS services
// (not S3) apply, as botocore's remove_dot_segments does.
std::string NormalizePath(std::string_view path) {
  if (path.empty()) {
    return "/";
  }
  std::vector<std::string_view> output;
  for (std::string_view segment : Split(path, '/')) {
    if (segment.empty() || segment == ".") {
      continue;
    }
    if (segment == "..") {
      if (!output.empty()) {
        output.pop_back();
      }
      continue;
    }
    output.push_back(segment);
  }
  std::string result = path.front() == '/' ? "/" : "";
  for (size_t i = 0; i < output.size(); ++i) {
    if (i > 0) {
      result += '/';
    }
    result.append(output[i]);
  }
  if (path.back() == '/' && !output.empty()) {
    result += '/';
  }
  return result.empty() ? "/" : result;
}

// Appends `value` trimmed, with runs of spaces (and tabs) inside collapsed to one space.
void AppendCanonicalHeaderValue(std::string& out, std::string_view value) {
  std::string_view trimmed = Trim(value);
  bool in_space = false;
  for (char c : trimmed) {
    if (c == ' ' || c == '\t') {
      if (!in_space) {
        out += ' ';
      }
      in_space = true;
    } else {
      out += c;
      in_space = false;
    }
  }
}

void AppendLower(std::string& out, std::string_view text) {
  for (char c : text) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string Scope(std::string_view date, std::string_view region, std::string_view service) {
  std::string scope;
  scope.append(date).append("/").append(region).append("/").append(service).append("/").append(kTerminator);
  return scope;
}

void SetHeader(HeaderMap& headers, const std::string& name, std::string value) {
  headers.erase(name);
  headers.emplace(name, std::move(value));
}

// ---- Verification helpers ----

struct ParsedAuth {
  bool presigned = false;
  std::string access_key_id;
  std::string date;  // credential scope date
  std::string region;
  std::string service;
  std::string terminator;
  std::vector<std::string> signed_headers;
  std::string signed_headers_text;
  std::string signature;
  std::string amz_date;               // the request time as yyyymmddThhmmssZ
  bool amz_date_from_header = false;  // X-Amz-Date header (header form) rather than Date
  int64_t expires_seconds = 0;        // presigned only
  std::string security_token;         // from header or query, "" if none
  bool has_security_token = false;
};

AuthError Fail(AuthFailure failure, std::string message) { return AuthError{failure, std::move(message), "", ""}; }

// A failure of the presigned (query-string) form.
AuthError FailQuery(AuthFailure failure, std::string message) {
  AuthError error = Fail(failure, std::move(message));
  error.form = AuthForm::kQueryV4;
  return error;
}

// S3's time format in <Error> details: 2024-05-01T10:00:00Z (no fraction).
std::string ErrorTime(int64_t epoch_millis) {
  std::string t = FormatIso8601Millis(epoch_millis);
  if (size_t dot = t.find('.'); dot != std::string::npos) t = t.substr(0, dot) + "Z";
  return t;
}

// Splits "AKID/yyyymmdd/region/service/aws4_request".
bool ParseCredential(std::string_view text, ParsedAuth* out) {
  std::vector<std::string_view> parts = Split(text, '/');
  if (parts.size() != 5 || parts[0].empty()) {
    return false;
  }
  out->access_key_id = std::string(parts[0]);
  out->date = std::string(parts[1]);
  out->region = std::string(parts[2]);
  out->service = std::string(parts[3]);
  out->terminator = std::string(parts[4]);
  return true;
}

std::string CredentialMalformedMessage(bool s3, std::string_view credential) {
  if (s3) {
    return "The authorization header is malformed; the Credential is mal-formed; expecting "
           "\"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\".";
  }
  return "Credential should be scoped to a valid region, not ''. Credential=" + std::string(credential);
}

std::variant<ParsedAuth, AuthError> ParseHeaderForm(const SignableRequest& request, const std::string& authorization,
                                                    const VerifyOptions& options) {
  ParsedAuth parsed;
  std::string_view text = Trim(authorization);
  if (!StartsWith(text, kAlgorithm) || (text.size() > kAlgorithm.size() && text[kAlgorithm.size()] != ' ')) {
    return Fail(AuthFailure::kMalformed,
                "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.");
  }
  text.remove_prefix(kAlgorithm.size());
  std::optional<std::string> credential, signed_headers, signature;
  for (std::string_view part : Split(text, ',')) {
    part = Trim(part);
    size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      continue;
    }
    std::string_view name = Trim(part.substr(0, eq));
    std::string value(Trim(part.substr(eq + 1)));
    if (name == "Credential") {
      credential = value;
    } else if (name == "SignedHeaders") {
      signed_headers = value;
    } else if (name == "Signature") {
      signature = value;
    }
  }
  const std::string* amz_date = FindHeader(request.headers, "x-amz-date");
  const std::string* date = FindHeader(request.headers, "date");
  std::string missing;
  if (!credential) {
    missing += "Authorization header requires 'Credential' parameter. ";
  }
  if (!signature) {
    missing += "Authorization header requires 'Signature' parameter. ";
  }
  if (!signed_headers) {
    missing += "Authorization header requires 'SignedHeaders' parameter. ";
  }
  if (amz_date == nullptr && date == nullptr) {
    missing += "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header. ";
  }
  if (!missing.empty()) {
    return Fail(AuthFailure::kMalformed, missing + "Authorization=" + authorization);
  }
  if (!ParseCredential(*credential, &parsed)) {
    return Fail(AuthFailure::kMalformed, CredentialMalformedMessage(options.s3, *credential));
  }
  parsed.signed_headers_text = *signed_headers;
  for (std::string_view name : Split(*signed_headers, ';')) {
    parsed.signed_headers.emplace_back(name);
  }
  parsed.signature = *signature;
  if (amz_date != nullptr) {
    std::optional<int64_t> t = ParseAmzDate(Trim(*amz_date));
    if (!t) {
      return Fail(AuthFailure::kMalformed, "Invalid X-Amz-Date '" + *amz_date + "'; expected yyyyMMddTHHmmssZ.");
    }
    parsed.amz_date = std::string(Trim(*amz_date));
    parsed.amz_date_from_header = true;
  } else {
    std::optional<int64_t> t = ParseRfc1123(Trim(*date));
    if (!t) {
      return Fail(AuthFailure::kMalformed, "Invalid Date header '" + *date + "'.");
    }
    parsed.amz_date = FormatAmzDate(*t);
  }
  if (const std::string* token = FindHeader(request.headers, "x-amz-security-token")) {
    parsed.security_token = *token;
    parsed.has_security_token = true;
  }
  return parsed;
}

std::variant<ParsedAuth, AuthError> ParsePresignedForm(const std::vector<QueryParam>& params,
                                                       const VerifyOptions& options) {
  ParsedAuth parsed;
  parsed.presigned = true;
  const std::string* algorithm = FindQueryParam(params, "X-Amz-Algorithm");
  const std::string* credential = FindQueryParam(params, "X-Amz-Credential");
  const std::string* date = FindQueryParam(params, "X-Amz-Date");
  const std::string* expires = FindQueryParam(params, "X-Amz-Expires");
  const std::string* signed_headers = FindQueryParam(params, "X-Amz-SignedHeaders");
  const std::string* signature = FindQueryParam(params, "X-Amz-Signature");
  std::string missing;
  for (auto [value, name] : {std::pair{algorithm, "X-Amz-Algorithm"}, std::pair{credential, "X-Amz-Credential"},
                             std::pair{signature, "X-Amz-Signature"}, std::pair{date, "X-Amz-Date"},
                             std::pair{signed_headers, "X-Amz-SignedHeaders"}, std::pair{expires, "X-Amz-Expires"}}) {
    if (value == nullptr) {
      missing += missing.empty() ? "" : ", ";
      missing += name;
    }
  }
  if (!missing.empty()) {
    return FailQuery(AuthFailure::kMalformed,
                     "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, "
                     "X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters. Missing: " +
                         missing + ".");
  }
  if (*algorithm != kAlgorithm) {
    return FailQuery(AuthFailure::kMalformed, "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"");
  }
  if (!ParseCredential(*credential, &parsed)) {
    return FailQuery(AuthFailure::kMalformed,
                     options.s3 ? "Error parsing the X-Amz-Credential parameter; the Credential is mal-formed; "
                                  "expecting \"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\"."
                                : CredentialMalformedMessage(false, *credential));
  }
  if (!ParseAmzDate(*date)) {
    return FailQuery(AuthFailure::kMalformed, "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"");
  }
  parsed.amz_date = *date;
  // S3's answers (each AuthorizationQueryParametersError, 400): not an integer or beyond int64
  // "should be a number"; below 0 "must be non-negative"; above a week the long sentence below.
  // 0 is accepted and the URL is expired from the start.
  std::optional<int64_t> expires_value = ParseInt64(*expires);
  if (!expires_value) {
    return FailQuery(AuthFailure::kMalformed, "X-Amz-Expires should be a number");
  }
  if (*expires_value < 0) {
    return FailQuery(AuthFailure::kMalformed, "X-Amz-Expires must be non-negative");
  }
  if (*expires_value > kMaxPresignSeconds) {
    return FailQuery(AuthFailure::kMalformed,
                     "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be "
                     "less than 604800 seconds");
  }
  parsed.expires_seconds = *expires_value;
  parsed.signed_headers_text = *signed_headers;
  for (std::string_view name : Split(*signed_headers, ';')) {
    parsed.signed_headers.emplace_back(name);
  }
  parsed.signature = *signature;
  if (const std::string* token = FindQueryParam(params, "X-Amz-Security-Token")) {
    parsed.security_token = *token;
    parsed.has_security_token = true;
  }
  return parsed;
}

std::string SignatureMismatchMessage(bool s3) {
  return s3 ? "The request signature we calculated does not match the signature you provided. Check your key "
              "and signing method."
            : "The request signature we calculated does not match the signature you provided. Check your AWS "
              "Secret Access Key and signing method. Consult the service documentation for details.";
}

}  // namespace

std::string PayloadSha256Hex(std::string_view payload) { return HexOf(Sha256Of(payload)); }

std::string DeriveSigningKey(std::string_view secret, std::string_view yyyymmdd, std::string_view region,
                             std::string_view service) {
  std::string k_date = HmacSha256("AWS4" + std::string(secret), yyyymmdd);
  std::string k_region = HmacSha256(k_date, region);
  std::string k_service = HmacSha256(k_region, service);
  return HmacSha256(k_service, kTerminator);
}

std::string CanonicalUri(std::string_view raw_path, bool s3_rules) {
  if (raw_path.empty()) {
    return "/";
  }
  if (s3_rules) {
    // S3 signs the key as sent: no normalisation, so "a//b/./c" stays; each byte is encoded once.
    // Segments are decoded one by one so that an escaped slash (%2F) stays escaped.
    std::string out;
    bool first = true;
    for (std::string_view segment : Split(raw_path, '/')) {
      if (!first) {
        out += '/';
      }
      first = false;
      out += UriEncode(DecodeLenient(segment));
    }
    return out;
  }
  // Other services: clients encode the (already-encoded) path a second time, which relative to
  // the wire form is a single encoding of the normalised raw path.
  return UriEncode(NormalizePath(raw_path), /*keep_slash=*/true);
}

std::string CanonicalQuery(std::string_view raw_query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (const QueryParam& param : ParseQuery(raw_query)) {
    if (param.name == "X-Amz-Signature") {
      continue;
    }
    encoded.emplace_back(UriEncode(param.name), UriEncode(param.value));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) {
      out += '&';
    }
    out.append(name).append("=").append(value);
  }
  return out;
}

std::string CanonicalRequest(const SignableRequest& request, const std::vector<std::string>& signed_headers,
                             std::string_view payload_hash, bool s3_rules) {
  // Built in place (one buffer, sized once): this runs for every signed request.
  size_t size =
      request.method.size() + request.raw_path.size() * 3 + request.raw_query.size() * 3 + payload_hash.size() + 8;
  for (const std::string& name : signed_headers) size += 2 * name.size() + 64;  // values are mostly short
  std::string out;
  out.reserve(size);
  out.append(request.method).append("\n");
  out.append(CanonicalUri(request.raw_path, s3_rules)).append("\n");
  if (!request.raw_query.empty()) out.append(CanonicalQuery(request.raw_query));
  out.append("\n");
  for (const std::string& name : signed_headers) {
    AppendLower(out, name);
    out += ':';
    bool first = true;
    for (auto [it, end] = request.headers.equal_range(name); it != end; ++it) {
      if (!first) out += ',';
      first = false;
      AppendCanonicalHeaderValue(out, it->second);
    }
    out += '\n';
  }
  out.append("\n");
  for (size_t i = 0; i < signed_headers.size(); ++i) {
    if (i > 0) {
      out += ';';
    }
    AppendLower(out, signed_headers[i]);
  }
  out.append("\n").append(payload_hash);
  return out;
}

std::string StringToSign(std::string_view amz_date, std::string_view scope, std::string_view canonical_request) {
  std::string out;
  out.reserve(kAlgorithm.size() + amz_date.size() + scope.size() + 3 + 64);
  out.append(kAlgorithm).append("\n").append(amz_date).append("\n").append(scope).append("\n");
  out.append(HexOf(Sha256Of(canonical_request)));
  return out;
}

std::string SignRequest(OwnedSignable& request, const SignOptions& options) {
  int64_t now = options.time_millis != 0 ? options.time_millis : NowMillis();
  std::string amz_date = FormatAmzDate(now);
  std::string date = FormatAmzDateShort(now);
  std::string payload_hash = options.payload_hash.empty() ? std::string(kEmptySha256) : options.payload_hash;
  request.headers.erase("authorization");
  SetHeader(request.headers, "X-Amz-Date", amz_date);
  if (options.s3) {
    SetHeader(request.headers, "X-Amz-Content-Sha256", payload_hash);
  }
  if (!options.session_token.empty()) {
    SetHeader(request.headers, "X-Amz-Security-Token", options.session_token);
  }
  std::vector<std::string> signed_headers;
  for (const auto& [name, value] : request.headers) {
    std::string lower = ToLower(name);
    if (signed_headers.empty() || signed_headers.back() != lower) {
      signed_headers.push_back(std::move(lower));
    }
  }
  std::sort(signed_headers.begin(), signed_headers.end());
  signed_headers.erase(std::unique(signed_headers.begin(), signed_headers.end()), signed_headers.end());
  std::string scope = Scope(date, options.region, options.service);
  std::string canonical = CanonicalRequest(request, signed_headers, payload_hash, options.s3);
  const SigningKey& key =
      CachedSigningKey(options.access_key_id, options.secret_access_key, date, options.region, options.service);
  std::string signature = HexOf(key.hmac.Mac(StringToSign(amz_date, scope, canonical)));
  request.headers.emplace("Authorization", std::string(kAlgorithm) + " Credential=" + options.access_key_id + "/" +
                                               scope + ", SignedHeaders=" + Join(signed_headers, ";") +
                                               ", Signature=" + signature);
  return signature;
}

std::string PresignQuery(const SignableRequest& request, const SignOptions& options, int64_t expires_seconds) {
  int64_t now = options.time_millis != 0 ? options.time_millis : NowMillis();
  std::string amz_date = FormatAmzDate(now);
  std::string date = FormatAmzDateShort(now);
  std::string scope = Scope(date, options.region, options.service);
  std::string query(request.raw_query);
  auto add = [&query](std::string_view name, std::string_view value) {
    if (!query.empty()) {
      query += '&';
    }
    query.append(name).append("=").append(UriEncode(value));
  };
  add("X-Amz-Algorithm", kAlgorithm);
  add("X-Amz-Credential", options.access_key_id + "/" + scope);
  add("X-Amz-Date", amz_date);
  add("X-Amz-Expires", std::to_string(expires_seconds));
  add("X-Amz-SignedHeaders", "host");
  if (!options.session_token.empty()) {
    add("X-Amz-Security-Token", options.session_token);
  }
  std::string payload_hash = options.payload_hash;
  if (payload_hash.empty()) {
    payload_hash = options.s3 ? std::string(kUnsignedPayload) : std::string(kEmptySha256);
  }
  OwnedSignable presigned{std::string(request.method), std::string(request.raw_path), query, {}};
  if (const std::string* host = FindHeader(request.headers, "host")) {
    presigned.headers.emplace("host", *host);
  }
  std::string canonical = CanonicalRequest(presigned, {"host"}, payload_hash, options.s3);
  const SigningKey& key =
      CachedSigningKey(options.access_key_id, options.secret_access_key, date, options.region, options.service);
  add("X-Amz-Signature", HexOf(key.hmac.Mac(StringToSign(amz_date, scope, canonical))));
  return query;
}

namespace {

// The steps of VerifyRequest, in order. Each answers the first failure it finds (nullopt: passed).

// Step 1: parse the header or presigned form.
std::variant<ParsedAuth, AuthError> ParseAuth(const SignableRequest& request, const VerifyOptions& options) {
  std::vector<QueryParam> params = ParseQuery(request.raw_query);
  const std::string* authorization = FindHeader(request.headers, "authorization");
  if (authorization != nullptr) {
    return ParseHeaderForm(request, *authorization, options);
  }
  if (FindQueryParam(params, "X-Amz-Algorithm") || FindQueryParam(params, "X-Amz-Credential") ||
      FindQueryParam(params, "X-Amz-Signature")) {
    return ParsePresignedForm(params, options);
  }
  return Fail(AuthFailure::kMissing, "Missing Authentication Token");
}

// Step 2: the key's security token, when it has one or the request sends one.
std::optional<AuthError> CheckSecurityToken(const ParsedAuth& parsed, const Credential& credential) {
  if (credential.session_token.empty() && !parsed.has_security_token) return std::nullopt;
  bool token_signed = parsed.presigned || std::find(parsed.signed_headers.begin(), parsed.signed_headers.end(),
                                                    "x-amz-security-token") != parsed.signed_headers.end();
  if (!parsed.has_security_token || !token_signed ||
      !ConstantTimeEquals(parsed.security_token, credential.session_token)) {
    return Fail(AuthFailure::kBadToken, "The security token included in the request is invalid.");
  }
  return std::nullopt;
}

// Step 3: the credential scope (date, region, service, terminator).
std::optional<AuthError> CheckScope(const ParsedAuth& parsed, const VerifyOptions& options) {
  if (parsed.date != std::string_view(parsed.amz_date).substr(0, 8)) {
    return Fail(AuthFailure::kBadSignature,
                "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '" +
                    parsed.date + "' != '" + parsed.amz_date.substr(0, 8) + "', from '" + parsed.amz_date + "'.");
  }
  bool region_ok = options.accept_any_region ? !parsed.region.empty()
                                             : std::find(options.regions.begin(), options.regions.end(),
                                                         parsed.region) != options.regions.end();
  if (!region_ok) {
    std::string expected = options.regions.empty() ? "" : options.regions.front();
    if (options.s3 && parsed.presigned) {
      return FailQuery(AuthFailure::kMalformed, "Error parsing the X-Amz-Credential parameter; the region '" +
                                                    parsed.region + "' is wrong; expecting '" + expected + "'");
    }
    if (options.s3) {
      return Fail(AuthFailure::kMalformed, "The authorization header is malformed; the region '" + parsed.region +
                                               "' is wrong; expecting '" + expected + "'");
    }
    return Fail(AuthFailure::kBadSignature, "Credential should be scoped to a valid region. ");
  }
  if (parsed.service != options.expected_service) {
    return Fail(AuthFailure::kBadSignature,
                "Credential should be scoped to correct service: '" + options.expected_service + "'. ");
  }
  if (parsed.terminator != kTerminator) {
    return Fail(AuthFailure::kMalformed, "Credential should be scoped with a valid terminator: 'aws4_request', not '" +
                                             parsed.terminator + "'. ");
  }
  return std::nullopt;
}

// Step 4: time (a presigned URL's validity window, or the header form's allowed skew).
std::optional<AuthError> CheckTime(const ParsedAuth& parsed, const VerifyOptions& options, int64_t now_millis) {
  int64_t request_millis = *ParseAmzDate(parsed.amz_date);
  if (parsed.presigned) {
    // expires_seconds <= 604800 (checked while parsing): no overflow.
    int64_t expires_millis = request_millis + parsed.expires_seconds * 1000;
    if (request_millis - options.max_skew_millis > now_millis) {
      AuthError error = FailQuery(AuthFailure::kExpired, "Request is not yet valid");
      error.details = {{"X-Amz-Date", std::to_string(request_millis)},
                       {"Expires", ErrorTime(expires_millis)},
                       {"ServerTime", ErrorTime(now_millis)}};
      return error;
    }
    if (now_millis > expires_millis) {
      AuthError error = FailQuery(AuthFailure::kExpired, "Request has expired");
      error.details = {{"X-Amz-Expires", std::to_string(parsed.expires_seconds)},
                       {"Expires", ErrorTime(expires_millis)},
                       {"ServerTime", ErrorTime(now_millis)}};
      return error;
    }
  } else if (request_millis < now_millis - options.max_skew_millis) {
    return Fail(AuthFailure::kSkewed, "Signature expired: " + parsed.amz_date + " is now earlier than " +
                                          FormatAmzDate(now_millis - options.max_skew_millis) + " (" +
                                          FormatAmzDate(now_millis) + " - 15 min.)");
  } else if (request_millis > now_millis + options.max_skew_millis) {
    return Fail(AuthFailure::kSkewed, "Signature not yet current: " + parsed.amz_date + " is still later than " +
                                          FormatAmzDate(now_millis + options.max_skew_millis) + " (" +
                                          FormatAmzDate(now_millis) + " + 15 min.)");
  }
  return std::nullopt;
}

// The payload hash that went into the canonical request, and the x-amz-content-sha256 mode the
// payload reader must honour (empty when the header form sent none outside S3).
struct PayloadHash {
  std::string hash;
  std::string mode;
};

std::variant<PayloadHash, AuthError> ResolvePayloadHash(const SignableRequest& request, const ParsedAuth& parsed,
                                                        const VerifyOptions& options,
                                                        std::optional<std::string_view> body_sha256_hex) {
  PayloadHash out;
  const std::string* content_sha256 = FindHeader(request.headers, "x-amz-content-sha256");
  if (content_sha256 != nullptr) {
    out.hash = std::string(Trim(*content_sha256));
    if (!IsHex64(out.hash) && !IsPayloadLiteral(out.hash)) {
      return Fail(AuthFailure::kBadContentSha256,
                  "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
                  "STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid "
                  "sha256 value.");
    }
    if (!options.s3 && body_sha256_hex && IsHex64(out.hash) && ToLower(out.hash) != ToLower(*body_sha256_hex)) {
      return Fail(AuthFailure::kBadContentSha256,
                  "The provided 'x-amz-content-sha256' header does not match what was computed.");
    }
    out.mode = out.hash;
  } else if (options.s3) {
    if (!parsed.presigned) {
      return Fail(AuthFailure::kBadContentSha256, "Missing required header for this request: x-amz-content-sha256");
    }
    out.hash = std::string(kUnsignedPayload);
    out.mode = out.hash;
  } else if (body_sha256_hex) {
    out.hash = std::string(*body_sha256_hex);
  } else {
    out.hash = std::string(kEmptySha256);
  }
  return out;
}

// Step 5: signed headers (host always; X-Amz-Date when the date came from it; every one present).
std::optional<AuthError> CheckSignedHeaders(const SignableRequest& request, const ParsedAuth& parsed,
                                            const VerifyOptions& options) {
  auto is_signed = [&parsed](std::string_view name) {
    return std::find(parsed.signed_headers.begin(), parsed.signed_headers.end(), name) != parsed.signed_headers.end();
  };
  if (!is_signed("host")) {
    return Fail(AuthFailure::kMalformed,
                parsed.presigned ? "X-Amz-SignedHeaders must include 'host'."
                                 : "'Host' must be a signed header. SignedHeaders=" + parsed.signed_headers_text);
  }
  if (!parsed.presigned && parsed.amz_date_from_header && !is_signed("x-amz-date")) {
    return Fail(AuthFailure::kMalformed,
                "'X-Amz-Date' must be a signed header. SignedHeaders=" + parsed.signed_headers_text);
  }
  for (const std::string& name : parsed.signed_headers) {
    bool lower = std::none_of(name.begin(), name.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
    if (name.empty() || !lower || FindHeader(request.headers, name) == nullptr) {
      return Fail(AuthFailure::kBadSignature, SignatureMismatchMessage(options.s3) + " Signed header '" + name +
                                                  "' is not present in the request.");
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<VerifiedRequest, AuthError> VerifyRequest(const SignableRequest& request,
                                                       const CredentialProvider& credentials,
                                                       const VerifyOptions& options, int64_t now_millis,
                                                       std::optional<std::string_view> body_sha256_hex) {
  std::variant<ParsedAuth, AuthError> parse_result = ParseAuth(request, options);
  if (auto* error = std::get_if<AuthError>(&parse_result)) {
    return std::move(*error);
  }
  ParsedAuth parsed = std::move(std::get<ParsedAuth>(parse_result));

  std::optional<Credential> credential = credentials.Lookup(parsed.access_key_id);
  if (!credential) {
    return Fail(AuthFailure::kUnknownKey, options.s3
                                              ? "The AWS Access Key Id you provided does not exist in our records."
                                              : "The security token included in the request is invalid.");
  }
  if (auto error = CheckSecurityToken(parsed, *credential)) return std::move(*error);
  if (auto error = CheckScope(parsed, options)) return std::move(*error);
  if (auto error = CheckTime(parsed, options, now_millis)) return std::move(*error);
  std::variant<PayloadHash, AuthError> payload = ResolvePayloadHash(request, parsed, options, body_sha256_hex);
  if (auto* error = std::get_if<AuthError>(&payload)) {
    return std::move(*error);
  }
  PayloadHash& payload_hash = std::get<PayloadHash>(payload);
  if (auto error = CheckSignedHeaders(request, parsed, options)) return std::move(*error);

  // Step 6: the signature.
  std::string scope = Scope(parsed.date, parsed.region, parsed.service);
  const SigningKey& signing_key = CachedSigningKey(credential->access_key_id, credential->secret_access_key,
                                                   parsed.date, parsed.region, parsed.service);
  std::string canonical = CanonicalRequest(request, parsed.signed_headers, payload_hash.hash, options.s3);
  std::string string_to_sign = StringToSign(parsed.amz_date, scope, canonical);
  std::string expected = HexOf(signing_key.hmac.Mac(string_to_sign));
  if (!ConstantTimeEquals(expected, ToLower(parsed.signature))) {
    return AuthError{AuthFailure::kBadSignature, SignatureMismatchMessage(options.s3), std::move(canonical),
                     std::move(string_to_sign)};
  }

  VerifiedRequest verified;
  verified.credential = std::move(*credential);
  verified.region = parsed.region;
  verified.service = parsed.service;
  verified.amz_date = parsed.amz_date;
  verified.scope = std::move(scope);
  verified.signing_key = signing_key.key;
  verified.seed_signature = std::move(expected);
  verified.payload_mode = std::move(payload_hash.mode);
  verified.presigned = parsed.presigned;
  return verified;
}

std::string ScopeServiceOf(const SignableRequest& request) {
  std::string credential;
  if (const std::string* authorization = FindHeader(request.headers, "authorization")) {
    size_t pos = authorization->find("Credential=");
    if (pos == std::string::npos) {
      return "";
    }
    std::string_view rest = std::string_view(*authorization).substr(pos + 11);
    credential = std::string(Trim(rest.substr(0, rest.find(','))));
  } else {
    const std::vector<QueryParam> params = ParseQuery(request.raw_query);
    const std::string* value = FindQueryParam(params, "X-Amz-Credential");
    if (value == nullptr) {
      return "";
    }
    credential = *value;
  }
  ParsedAuth parsed;
  if (!ParseCredential(credential, &parsed)) {
    return "";
  }
  return parsed.service;
}

}  // namespace kiln::aws
