#include "api/front_door.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "net/test_util/fake_response_writer.h"
#include "aws/sigv4.h"
#include "base/hash.h"
#include "base/time.h"

namespace kiln::api {
namespace {

class FixedCredentials final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    if (id != "AKIATESTKEY000000001") return std::nullopt;
    aws::Credential c;
    c.access_key_id = "AKIATESTKEY000000001";
    c.secret_access_key = "testsecrettestsecrettestsecret0123456789";
    c.account_id = "123456789012";
    c.principal_arn = "arn:aws:iam::123456789012:user/tester";
    c.user_id = "AIDATESTER";
    return c;
  }
};

class FrontDoorTest : public ::testing::Test {
 protected:
  FrontDoorTest() {
    FrontDoorOptions options;
    options.account_id = "123456789012";
    options.version = "test";
    door_ = std::make_unique<FrontDoor>(options, &credentials_, nullptr);
    auto sagemaker = std::make_unique<JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11);
    sagemaker->Register("Echo", [](const aws::RequestContext&, const nlohmann::json& input) -> JsonOutcome {
      return nlohmann::json{{"Echoed", input}};
    });
    door_->AddJsonService(std::move(sagemaker));
  }

  // Sends a request through the front door, signed with `secret` unless it is empty.
  net::FakeResponseWriter Send(std::string method, std::string path, std::string query, HeaderMap headers,
                          std::string body, const std::string& service, const std::string& key_id,
                          const std::string& secret, int64_t time_millis = 0) {
    headers.emplace("Host", "127.0.0.1:5456");
    if (!secret.empty()) {
      aws::SignableRequest signable{method, path, query, headers};
      aws::SignOptions sign;
      sign.access_key_id = key_id;
      sign.secret_access_key = secret;
      sign.service = service;
      sign.payload_hash = Sha256Hex(body);
      sign.time_millis = time_millis;
      aws::SignRequest(signable, sign);
      headers = signable.headers;
    }
    StringByteSource source(body);
    net::HttpRequest request;
    request.method = method;
    request.raw_path = path;
    request.raw_query = query;
    request.target = query.empty() ? path : path + "?" + query;
    request.headers = headers;
    request.body = &source;
    net::FakeResponseWriter writer;
    door_->Handle(request, writer);
    return writer;
  }

  net::FakeResponseWriter SendJson(const std::string& target, const std::string& body, const std::string& secret,
                              const std::string& key_id = "AKIATESTKEY000000001", int64_t time_millis = 0) {
    return Send("POST", "/", "", {{"X-Amz-Target", target}, {"Content-Type", "application/x-amz-json-1.1"}}, body,
                "sagemaker", key_id, secret, time_millis);
  }

  static std::string ErrorType(const net::FakeResponseWriter& w) {
    auto j = nlohmann::json::parse(w.body(), nullptr, false);
    return j.is_object() ? j.value("__type", "") : "";
  }

  const std::string secret_ = "testsecrettestsecrettestsecret0123456789";
  FixedCredentials credentials_;
  std::unique_ptr<FrontDoor> door_;
};

TEST_F(FrontDoorTest, HealthNeedsNoCredentials) {
  auto w = Send("GET", "/_kiln/health", "", {}, "", "", "", "");
  EXPECT_EQ(w.status(), 200);
  EXPECT_NE(w.body().find("\"ok\""), std::string::npos);
}

TEST_F(FrontDoorTest, SignedJsonOperationRuns) {
  auto w = SendJson("SageMaker.Echo", R"({"A": 1})", secret_);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(nlohmann::json::parse(w.body())["Echoed"]["A"], 1);
  EXPECT_NE(FindHeader(w.headers(), "x-amzn-RequestId"), nullptr);
}

TEST_F(FrontDoorTest, UnknownOperationIsNamed) {
  auto w = SendJson("SageMaker.ListTrainingJobs", "{}", secret_);
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(ErrorType(w), "UnknownOperationException");
  EXPECT_NE(w.body().find("ListTrainingJobs"), std::string::npos);
}

TEST_F(FrontDoorTest, MalformedJsonIsSerializationException) {
  for (const char* target : {"SageMaker.Echo", "SageMaker.ListTrainingJobs"}) {
    auto w = SendJson(target, "{not json", secret_);
    EXPECT_EQ(w.status(), 400);
    EXPECT_EQ(ErrorType(w), "SerializationException") << target;
  }
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "[1, 2]", secret_)), "SerializationException");
}

TEST_F(FrontDoorTest, AuthenticationFailuresPerJsonProtocol) {
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", "")), "MissingAuthenticationTokenException");
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", secret_, "AKIAUNKNOWN000000000")), "UnrecognizedClientException");
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", "wrong-secret-wrong-secret-wrong-secret00")),
            "InvalidSignatureException");
  auto skewed = SendJson("SageMaker.Echo", "{}", secret_, "AKIATESTKEY000000001", NowMillis() - 20 * 60 * 1000);
  EXPECT_EQ(ErrorType(skewed), "InvalidSignatureException");
  EXPECT_NE(skewed.body().find("Signature expired"), std::string::npos);
  EXPECT_NE(FindHeader(skewed.headers(), "Date"), nullptr);
}

TEST_F(FrontDoorTest, StsGetCallerIdentity) {
  std::string body = "Action=GetCallerIdentity&Version=2011-06-15";
  auto w = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}}, body, "sts",
                "AKIATESTKEY000000001", secret_);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_NE(w.body().find("<Account>123456789012</Account>"), std::string::npos);
  EXPECT_NE(w.body().find("<Arn>arn:aws:iam::123456789012:user/tester</Arn>"), std::string::npos);

  auto bad = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded"}}, body, "sts",
                  "AKIAUNKNOWN000000000", secret_);
  EXPECT_EQ(bad.status(), 403);
  EXPECT_NE(bad.body().find("<Code>InvalidClientTokenId</Code>"), std::string::npos);

  auto unknown = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded"}},
                      "Action=AssumeRoot&Version=2011-06-15", "sts", "AKIATESTKEY000000001", secret_);
  EXPECT_EQ(unknown.status(), 400);
  EXPECT_NE(unknown.body().find("<Code>InvalidAction</Code>"), std::string::npos);
}

TEST(AuthErrorForTest, S3Codes) {
  auto code = [](aws::AuthFailure f) { return AuthErrorFor(aws::Protocol::kRestXml, {f, "m", "", ""}); };
  EXPECT_EQ(code(aws::AuthFailure::kMissing).code, "AccessDenied");
  EXPECT_EQ(code(aws::AuthFailure::kMissing).http_status, 403);
  EXPECT_EQ(code(aws::AuthFailure::kMalformed).code, "AuthorizationHeaderMalformed");
  EXPECT_EQ(code(aws::AuthFailure::kMalformed).http_status, 400);
  EXPECT_EQ(code(aws::AuthFailure::kUnknownKey).code, "InvalidAccessKeyId");
  EXPECT_EQ(code(aws::AuthFailure::kBadSignature).code, "SignatureDoesNotMatch");
  EXPECT_EQ(code(aws::AuthFailure::kSkewed).code, "RequestTimeTooSkewed");
  EXPECT_EQ(code(aws::AuthFailure::kExpired).code, "AccessDenied");
  EXPECT_EQ(AuthErrorFor(aws::Protocol::kRestJson, {aws::AuthFailure::kBadSignature, "", "", ""}).http_status, 403);
  EXPECT_EQ(AuthErrorFor(aws::Protocol::kJson11, {aws::AuthFailure::kBadSignature, "", "", ""}).http_status, 400);
}

}  // namespace
}  // namespace kiln::api
