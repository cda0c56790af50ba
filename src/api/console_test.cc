// The web console's server side (issue 22): static serving from an in-memory asset table, the
// sign-in routes, and cookie authentication through the FrontDoor.
#include "api/console.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "api/front_door.h"
#include "aws/sigv4.h"
#include "base/hash.h"
#include "net/test_util/fake_response_writer.h"
#include "objects/fs_object_store.h"
#include "objects/s3api/s3_api.h"
#include "store/database.h"
#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

constexpr std::string_view kKeyId = "AKIACONSOLE000000001";
constexpr std::string_view kSecret = "consolesecretconsolesecret0123456789abcd";

class TestCredentials final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    if (id != kKeyId || removed) return std::nullopt;
    aws::Credential c;
    c.access_key_id = std::string(kKeyId);
    c.secret_access_key = secret;
    c.account_id = "123456789012";
    c.principal_arn = "arn:aws:iam::123456789012:user/console";
    return c;
  }
  std::string secret = std::string(kSecret);
  bool removed = false;
};

// The table the generated console_assets.cc would hold, for two files.
const std::string kIndex = "<!doctype html><title>Kiln</title><script src=\"/console/assets/app-AB12.js\"></script>";
const std::string kApp = "console.log('kiln')";
const ConsoleAsset kFiles[] = {
    {"index.html", "text/html; charset=utf-8", "1111", false, kIndex, "GZ-INDEX", "BR-INDEX"},
    {"assets/app-AB12.js", "text/javascript; charset=utf-8", "2222", true, kApp, "GZ-APP", {}},
    {"favicon.svg", "image/svg+xml", "3333", false, "<svg/>", {}, {}},
};

class ConsoleTest : public ::testing::Test {
 protected:
  ConsoleTest() { Reset(/*auth=*/true, /*built=*/true); }

  void Reset(bool auth, bool built) {
    Console::Options options;
    options.sessions.ttl_millis = 3600 * 1000;
    options.sessions.now_millis = [this] { return now_; };
    options.assets = built ? ConsoleAssets{true, kFiles} : ConsoleAssets{};
    console_ = std::make_unique<Console>(std::move(options), &credentials_);
    FrontDoorOptions door_options;
    door_options.account_id = "123456789012";
    door_options.auth_enabled = auth;
    door_ = std::make_unique<FrontDoor>(door_options, &credentials_, s3_.get());
    auto sagemaker = std::make_unique<JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11);
    sagemaker->Register("WhoAmI", [](const aws::RequestContext& context, const nlohmann::json&) -> JsonOutcome {
      return nlohmann::json{{"Key", context.auth ? context.auth->credential.access_key_id : "-"}};
    });
    door_->AddJsonService(std::move(sagemaker));
    door_->SetConsole(console_.get());
  }

  void SetUpS3() {
    db_ = std::move(store::Database::Open(dir_.path() + "/kiln.db", {})).value();
    objects_ =
        std::move(objects::FsObjectStore::Open({.root = dir_.path() + "/objects", .database = db_.get()})).value();
    ASSERT_TRUE(objects_->CreateBucket("console", "us-east-1").ok());
    StringByteSource source("bucket bytes");
    ASSERT_TRUE(objects_->PutObject("console", "index.html", source, {}).ok());
    s3_ = std::make_unique<objects::S3Api>(objects::S3ApiOptions{}, objects_.get());
    Reset(true, true);
  }

  // Sends a request through the front door; signed (SigV4 for `service`) when `sign`.
  net::FakeResponseWriter Send(std::string method, std::string path, HeaderMap headers = {}, std::string body = "",
                               bool sign = false, std::string service = "sagemaker", std::string secret = "") {
    headers.emplace("Host", "127.0.0.1:5456");
    if (sign) {
      aws::OwnedSignable signable{method, path, "", headers};
      aws::SignOptions options;
      options.access_key_id = std::string(kKeyId);
      options.secret_access_key = secret.empty() ? std::string(kSecret) : secret;
      options.service = service;
      options.payload_hash = service == "s3" ? std::string(aws::kUnsignedPayload) : Sha256Hex(body);
      options.s3 = service == "s3";
      aws::SignRequest(signable, options);
      headers = signable.headers;
    }
    StringByteSource source(body);
    net::HttpRequest request;
    request.method = method;
    request.raw_path = path;
    request.target = path;
    request.headers = headers;
    request.body = &source;
    net::FakeResponseWriter writer;
    door_->Handle(request, writer);
    return writer;
  }

  // Signs in through the protocol (a signed POST) and returns the cookie's token.
  std::string SignIn() {
    auto w = Send("POST", "/_kiln/console/session", {{"Content-Type", "application/x-amz-json-1.1"}}, "{}", true);
    EXPECT_EQ(w.status(), 200) << w.body();
    const std::string* set_cookie = FindHeader(w.headers(), "Set-Cookie");
    if (set_cookie == nullptr) return "";
    std::string value = set_cookie->substr(std::string("kiln_session=").size());
    return value.substr(0, value.find(';'));
  }

  net::FakeResponseWriter Json(const std::string& cookie, bool console_header = true) {
    HeaderMap headers = {{"X-Amz-Target", "SageMaker.WhoAmI"},
                         {"Content-Type", "application/x-amz-json-1.1"},
                         {"Cookie", "theme=light; kiln_session=" + cookie}};
    if (console_header) headers.emplace("X-Kiln-Console", "1");
    return Send("POST", "/", headers, "{}");
  }

  static std::string ErrorType(const net::FakeResponseWriter& w) {
    auto j = nlohmann::json::parse(w.body(), nullptr, false);
    return j.is_object() ? j.value("__type", "") : "";
  }
  static std::string Header(const net::FakeResponseWriter& w, std::string_view name) {
    const std::string* value = FindHeader(w.headers(), name);
    return value ? *value : "";
  }

  int64_t now_ = 1'700'000'000'000;
  TestCredentials credentials_;
  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<objects::FsObjectStore> objects_;
  std::unique_ptr<objects::S3Api> s3_;
  std::unique_ptr<Console> console_;
  std::unique_ptr<FrontDoor> door_;
};

// ---- static serving ----

TEST_F(ConsoleTest, ConsoleRedirectsToItsSlash) {
  auto w = Send("GET", "/console");
  EXPECT_EQ(w.status(), 301);
  EXPECT_EQ(Header(w, "Location"), "/console/");
  EXPECT_EQ(Header(w, "X-Content-Type-Options"), "nosniff");
}

TEST_F(ConsoleTest, ServesIndexWithSecurityAndCacheHeaders) {
  auto w = Send("GET", "/console/");
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), kIndex);
  EXPECT_EQ(Header(w, "Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(Header(w, "Cache-Control"), "no-cache");
  EXPECT_EQ(Header(w, "ETag"), "\"1111\"");
  EXPECT_EQ(Header(w, "Vary"), "Accept-Encoding");
  EXPECT_EQ(Header(w, "Content-Encoding"), "");
  EXPECT_NE(Header(w, "Content-Security-Policy").find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_EQ(Header(w, "Referrer-Policy"), "no-referrer");
}

TEST_F(ConsoleTest, HistoryRoutesFallBackToIndex) {
  for (const char* path : {"/console/training-jobs", "/console/training-jobs/my-job",
                           "/console/objects/bucket/prefix/file.txt", "/console/index.html"}) {
    auto w = Send("GET", path);
    EXPECT_EQ(w.status(), 200) << path;
    EXPECT_EQ(w.body(), kIndex) << path;
  }
}

TEST_F(ConsoleTest, HashedAssetsAreImmutable) {
  auto w = Send("GET", "/console/assets/app-AB12.js");
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), kApp);
  EXPECT_EQ(Header(w, "Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(Header(w, "Cache-Control"), "public, max-age=31536000, immutable");
  EXPECT_EQ(Header(w, "ETag"), "\"2222\"");
}

TEST_F(ConsoleTest, MissingAssetIs404NotIndex) {
  auto w = Send("GET", "/console/assets/app-OLD.js");
  EXPECT_EQ(w.status(), 404);
  EXPECT_EQ(Header(w, "Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(Header(w, "X-Content-Type-Options"), "nosniff");
}

TEST_F(ConsoleTest, PicksTheEncodingFromAcceptEncoding) {
  struct Case {
    std::string path, accept, encoding, body;
  } cases[] = {
      {"/console/", "gzip, deflate, br", "br", "BR-INDEX"},
      {"/console/", "gzip", "gzip", "GZ-INDEX"},
      {"/console/", "br;q=0, gzip;q=0.5", "gzip", "GZ-INDEX"},
      {"/console/", "identity", "", kIndex},
      {"/console/", "*", "br", "BR-INDEX"},
      {"/console/", "*, br;q=0", "gzip", "GZ-INDEX"},
      {"/console/", "gzip;q=0, br;q=0", "", kIndex},
      {"/console/assets/app-AB12.js", "br, gzip", "gzip", "GZ-APP"},  // no br variant
      {"/console/favicon.svg", "br, gzip", "", "<svg/>"},             // no variant at all
  };
  for (const Case& c : cases) {
    auto w = Send("GET", c.path, {{"Accept-Encoding", c.accept}});
    EXPECT_EQ(w.status(), 200);
    EXPECT_EQ(Header(w, "Content-Encoding"), c.encoding) << c.path << " " << c.accept;
    EXPECT_EQ(w.body(), c.body) << c.path << " " << c.accept;
  }
  EXPECT_EQ(Header(Send("GET", "/console/favicon.svg"), "Vary"), "");
}

TEST_F(ConsoleTest, IfNoneMatchAnswers304) {
  auto w = Send("GET", "/console/assets/app-AB12.js", {{"If-None-Match", "\"9999\", \"2222\""}});
  EXPECT_EQ(w.status(), 304);
  EXPECT_EQ(w.body(), "");
  EXPECT_EQ(Header(w, "ETag"), "\"2222\"");
  EXPECT_EQ(Header(w, "Cache-Control"), "public, max-age=31536000, immutable");
  EXPECT_EQ(Send("GET", "/console/", {{"If-None-Match", "W/\"1111\""}}).status(), 304);
  EXPECT_EQ(Send("GET", "/console/", {{"If-None-Match", "\"2222\""}}).status(), 200);
}

TEST_F(ConsoleTest, HeadSendsTheLengthWithoutABody) {
  auto w = Send("HEAD", "/console/", {{"Accept-Encoding", "gzip"}});
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), "");
  EXPECT_EQ(w.content_length(), std::optional<uint64_t>(8));
}

TEST_F(ConsoleTest, NotBuiltAnswers503) {
  Reset(true, false);
  auto w = Send("GET", "/console/training-jobs");
  EXPECT_EQ(w.status(), 503);
  EXPECT_EQ(Header(w, "Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(w.body().find("The console was not built: run scripts/build.sh (it needs npm"), std::string::npos);
  // The APIs are unaffected.
  EXPECT_EQ(Send("GET", "/_kiln/health").status(), 200);
}

TEST_F(ConsoleTest, SignedOrMarkedConsolePathsStayS3s) {
  SetUpS3();
  // A bucket named "console": SDKs (signed) reach it.
  auto signed_get = Send("GET", "/console/index.html", {}, "", true, "s3");
  EXPECT_EQ(signed_get.status(), 200) << signed_get.body();
  EXPECT_EQ(signed_get.body(), "bucket bytes");
  // The console's own object-store calls carry X-Kiln-Console and the cookie.
  std::string token = SignIn();
  auto marked = Send("GET", "/console/index.html", {{"X-Kiln-Console", "1"}, {"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(marked.status(), 200) << marked.body();
  EXPECT_EQ(marked.body(), "bucket bytes");
  // Unsigned and unmarked: the console's page.
  EXPECT_EQ(Send("GET", "/console/index.html").body(), kIndex);
  // Other methods are never the console's.
  EXPECT_EQ(Send("PUT", "/console/x").status(), 403);
}

TEST_F(ConsoleTest, WithoutAConsoleTheConsolePathIsS3s) {
  SetUpS3();
  door_->SetConsole(nullptr);
  auto w = Send("GET", "/console/");
  EXPECT_EQ(w.status(), 403);  // S3's AccessDenied: unsigned
  EXPECT_NE(w.body().find("<Code>AccessDenied</Code>"), std::string::npos);
  EXPECT_EQ(ErrorType(Send("GET", "/_kiln/console/session")), "UnknownOperationException");
}

// ---- sign-in protocol ----

TEST_F(ConsoleTest, SessionStatusWithoutCookie) {
  auto w = Send("GET", "/_kiln/console/session");
  EXPECT_EQ(w.status(), 200);
  auto j = nlohmann::json::parse(w.body());
  EXPECT_EQ(j["auth"], "sigv4");
  EXPECT_EQ(j["region"], "us-east-1");
  EXPECT_EQ(j["signed_in"], false);
  EXPECT_FALSE(j.contains("access_key_id"));
  EXPECT_EQ(Header(w, "Cache-Control"), "no-store");
}

TEST_F(ConsoleTest, SignInSetsTheCookieAndStatusShowsIt) {
  auto w = Send("POST", "/_kiln/console/session", {{"Content-Type", "application/x-amz-json-1.1"}}, "{}", true);
  ASSERT_EQ(w.status(), 200) << w.body();
  const std::string set_cookie = Header(w, "Set-Cookie");
  EXPECT_EQ(set_cookie.find("kiln_session="), 0u);
  EXPECT_NE(set_cookie.find("; Path=/; HttpOnly; SameSite=Strict; Max-Age=3600"), std::string::npos);
  EXPECT_EQ(set_cookie.find("Secure"), std::string::npos);  // plain http is how GPU boxes are reached
  auto j = nlohmann::json::parse(w.body());
  EXPECT_EQ(j["signed_in"], true);
  EXPECT_EQ(j["access_key_id"], kKeyId);
  EXPECT_EQ(j["principal_arn"], "arn:aws:iam::123456789012:user/console");
  EXPECT_EQ(j["expires_at"], now_ / 1000 + 3600);
  EXPECT_EQ(w.body().find(kSecret), std::string::npos);

  std::string token = set_cookie.substr(13, 64);
  auto status = Send("GET", "/_kiln/console/session", {{"Cookie", "kiln_session=" + token}});
  auto s = nlohmann::json::parse(status.body());
  EXPECT_EQ(s["signed_in"], true);
  EXPECT_EQ(s["principal_arn"], "arn:aws:iam::123456789012:user/console");
}

TEST_F(ConsoleTest, SignInFailuresAreTheApisErrors) {
  auto unknown_key = [&] {
    HeaderMap headers = {{"Content-Type", "application/x-amz-json-1.1"}, {"Host", "127.0.0.1:5456"}};
    aws::OwnedSignable signable{"POST", "/_kiln/console/session", "", headers};
    aws::SignOptions options;
    options.access_key_id = "AKIANOBODY";
    options.secret_access_key = "x";
    options.service = "sagemaker";
    options.payload_hash = Sha256Hex("{}");
    aws::SignRequest(signable, options);
    return Send("POST", "/_kiln/console/session", signable.headers, "{}");
  }();
  EXPECT_EQ(unknown_key.status(), 400);
  EXPECT_EQ(ErrorType(unknown_key), "UnrecognizedClientException");
  auto bad_secret = Send("POST", "/_kiln/console/session", {}, "{}", true, "sagemaker", "wrong-secret");
  EXPECT_EQ(ErrorType(bad_secret), "InvalidSignatureException");
  EXPECT_EQ(Header(bad_secret, "Set-Cookie"), "");
  auto unsigned_post = Send("POST", "/_kiln/console/session", {}, "{}");
  EXPECT_EQ(ErrorType(unsigned_post), "MissingAuthenticationTokenException");
  // A cookie is not a way to sign in.
  std::string token = SignIn();
  auto cookie_post =
      Send("POST", "/_kiln/console/session", {{"Cookie", "kiln_session=" + token}, {"X-Kiln-Console", "1"}}, "{}");
  EXPECT_EQ(ErrorType(cookie_post), "MissingAuthenticationTokenException");
  EXPECT_EQ(console_->sessions().size(), 1u);
}

TEST_F(ConsoleTest, SignOutNeedsTheHeaderAndEndsTheSession) {
  std::string token = SignIn();
  auto refused = Send("DELETE", "/_kiln/console/session", {{"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(refused.status(), 403);
  EXPECT_EQ(ErrorType(refused), "AccessDeniedException");
  EXPECT_EQ(Json(token).status(), 200);

  auto w = Send("DELETE", "/_kiln/console/session", {{"Cookie", "kiln_session=" + token}, {"X-Kiln-Console", "1"}});
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), "{}");
  EXPECT_NE(Header(w, "Set-Cookie").find("kiln_session=; "), std::string::npos);
  EXPECT_NE(Header(w, "Set-Cookie").find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(ErrorType(Json(token)), "ExpiredTokenException");
}

TEST_F(ConsoleTest, AuthOffNeedsNoSignIn) {
  Reset(/*auth=*/false, true);
  auto status = nlohmann::json::parse(Send("GET", "/_kiln/console/session").body());
  EXPECT_EQ(status["auth"], "off");
  EXPECT_EQ(status["signed_in"], false);
  // Unsigned calls work; a stale cookie or a missing header does not get in the way.
  auto w = Json(std::string(64, 'f'), /*console_header=*/false);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(nlohmann::json::parse(w.body())["Key"], "-");
  // A signed sign-in still works and the session is used.
  std::string token = SignIn();
  EXPECT_EQ(nlohmann::json::parse(Json(token).body())["Key"], kKeyId);
}

// ---- cookie authentication on the APIs ----

TEST_F(ConsoleTest, CookieActsAsTheKey) {
  std::string token = SignIn();
  auto w = Json(token);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(nlohmann::json::parse(w.body())["Key"], kKeyId);
}

TEST_F(ConsoleTest, PostWithoutTheConsoleHeaderIsRefused) {
  std::string token = SignIn();
  auto w = Json(token, /*console_header=*/false);
  EXPECT_EQ(w.status(), 403);
  EXPECT_EQ(ErrorType(w), "AccessDeniedException");
  EXPECT_NE(w.body().find("Console requests must carry X-Kiln-Console: 1"), std::string::npos);
}

TEST_F(ConsoleTest, KilnRoutesNeedTheHeaderEvenForGet) {
  std::string token = SignIn();
  // /_kiln/remote/release accepts GET and acts: a GET another app on the host triggers must not.
  auto bare = Send("GET", "/_kiln/remote/release", {{"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(bare.status(), 403);
  EXPECT_EQ(ErrorType(bare), "AccessDeniedException");
  // With the header the request is authenticated (and then finds no remote access here).
  auto marked = Send("GET", "/_kiln/remote/targets", {{"Cookie", "kiln_session=" + token}, {"X-Kiln-Console", "1"}});
  EXPECT_EQ(ErrorType(marked), "UnknownOperationException");
}

TEST_F(ConsoleTest, S3GetWithTheCookieNeedsNoHeader) {
  SetUpS3();
  std::string token = SignIn();
  // A download link: a plain GET with the cookie.
  StringByteSource object("object bytes");
  ASSERT_TRUE(objects_->PutObject("console", "dir/a.txt", object, {}).ok());
  auto w = Send("GET", "/console/dir/a.txt", {{"Cookie", "kiln_session=" + token}, {"X-Kiln-Console", "1"}});
  EXPECT_EQ(w.body(), "object bytes");
  auto link = Send("GET", "/other/x", {{"Cookie", "kiln_session=" + token}});
  EXPECT_NE(link.body().find("<Code>NoSuchBucket</Code>"), std::string::npos) << link.body();
  auto list = Send("GET", "/", {{"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(list.status(), 200) << list.body();
  EXPECT_NE(list.body().find("<Name>console</Name>"), std::string::npos);
}

TEST_F(ConsoleTest, ExpiredSessionIsExpiredTokenInEachProtocol) {
  SetUpS3();
  std::string token = SignIn();
  now_ += 3600 * 1000;
  auto json = Json(token);
  EXPECT_EQ(json.status(), 400);
  EXPECT_EQ(ErrorType(json), "ExpiredTokenException");
  EXPECT_NE(json.body().find("The console session expired or was signed out: sign in again"), std::string::npos);
  auto xml = Send("GET", "/", {{"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(xml.status(), 400);
  EXPECT_NE(xml.body().find("<Code>ExpiredToken</Code>"), std::string::npos) << xml.body();
  EXPECT_NE(xml.body().find("sign in again"), std::string::npos);
  // An unknown token is the same answer.
  EXPECT_EQ(ErrorType(Json(std::string(64, 'a'))), "ExpiredTokenException");
  // The session check says signed out, without an error.
  auto status = Send("GET", "/_kiln/console/session", {{"Cookie", "kiln_session=" + token}});
  EXPECT_EQ(status.status(), 200);
  EXPECT_EQ(nlohmann::json::parse(status.body())["signed_in"], false);
}

TEST_F(ConsoleTest, RevokedKeyEndsTheSession) {
  std::string token = SignIn();
  credentials_.secret = "rotated-secret";
  EXPECT_EQ(ErrorType(Json(token)), "ExpiredTokenException");
  credentials_.secret = std::string(kSecret);
  EXPECT_EQ(ErrorType(Json(token)), "ExpiredTokenException");  // gone for good
  token = SignIn();
  credentials_.removed = true;
  EXPECT_EQ(ErrorType(Json(token)), "ExpiredTokenException");
}

TEST_F(ConsoleTest, SignedRequestsIgnoreTheCookie) {
  HeaderMap headers = {{"X-Amz-Target", "SageMaker.WhoAmI"},
                       {"Content-Type", "application/x-amz-json-1.1"},
                       {"Cookie", "kiln_session=" + std::string(64, 'a')}};
  auto w = Send("POST", "/", headers, "{}", true);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(nlohmann::json::parse(w.body())["Key"], kKeyId);
  // And a bad signature is not rescued by a good cookie.
  std::string token = SignIn();
  headers.erase("Cookie");
  headers.emplace("Cookie", "kiln_session=" + token);
  auto bad = Send("POST", "/", headers, "{}", true, "sagemaker", "wrong-secret");
  EXPECT_EQ(ErrorType(bad), "InvalidSignatureException");
}

TEST_F(ConsoleTest, WithoutCookieUnsignedIsMissingAuthentication) {
  auto w = Send("POST", "/", {{"X-Amz-Target", "SageMaker.WhoAmI"}, {"X-Kiln-Console", "1"}}, "{}");
  EXPECT_EQ(ErrorType(w), "MissingAuthenticationTokenException");
}

TEST(ConsoleCookieTest, ParsesTheSessionCookie) {
  net::HttpRequest request;
  EXPECT_FALSE(Console::SessionCookie(request).has_value());
  request.headers.emplace("Cookie", "a=1; kiln_session_x=2;kiln_session= abc ; b=3");
  EXPECT_EQ(Console::SessionCookie(request).value_or("-"), "abc");
  request.headers.clear();
  request.headers.emplace("Cookie", "kiln_session=");
  request.headers.emplace("Cookie", "kiln_session=\"q\"");
  EXPECT_EQ(Console::SessionCookie(request).value_or("-"), "q");
}

}  // namespace
}  // namespace kiln::api
