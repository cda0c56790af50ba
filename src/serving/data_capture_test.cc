#include "serving/data_capture.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/encoding.h"
#include "base/regex.h"
#include "net/test_util/fake_response_writer.h"
#include "serving/shadow_variants.h"
#include "serving/test_util/fake_container.h"

namespace kiln::serving {
namespace {

using nlohmann::json;
using testing::FakeContainer;

class FakeUploader : public CaptureUploader {
 public:
  struct File {
    std::string bucket;
    std::string key;
    std::string content;
  };
  Status Upload(const std::string& bucket, const std::string& key, const std::string& content) override {
    MutexLock lock(mu_);
    if (fail_) return Status::Unavailable("bucket gone");
    files_.push_back({bucket, key, content});
    return Status::Ok();
  }
  std::vector<File> files() {
    MutexLock lock(mu_);
    return files_;
  }
  // Every line of every file, parsed.
  std::vector<json> Lines() {
    std::vector<json> lines;
    for (const File& file : files()) {
      size_t start = 0;
      while (start < file.content.size()) {
        size_t end = file.content.find('\n', start);
        lines.push_back(json::parse(file.content.substr(start, end - start)));
        start = end + 1;
      }
    }
    return lines;
  }
  void SetFail(bool fail) {
    MutexLock lock(mu_);
    fail_ = fail;
  }

 private:
  Mutex mu_;
  std::vector<File> files_ GUARDED_BY(mu_);
  bool fail_ GUARDED_BY(mu_) = false;
};

json Config(int percentage = 100, std::string mode = "InputAndOutput") {
  return {{"EnableCapture", true},
          {"InitialSamplingPercentage", percentage},
          {"DestinationS3Uri", "s3://bkt/capture/dir/"},
          {"CaptureOptions", {{{"CaptureMode", mode}}}},
          {"CaptureContentTypeHeader",
           {{"CsvContentTypes", {"text/csv"}}, {"JsonContentTypes", {"application/json", "Application/JSONLines"}}}}};
}

std::shared_ptr<const DataCaptureSettings> Settings(const json& config) {
  auto settings = ParseDataCaptureConfig(config);
  EXPECT_TRUE(settings.ok()) << settings.status().ToString();
  return settings.ok() ? *settings : nullptr;
}

CaptureInput Input(std::string_view input, std::string_view input_type, std::string_view output,
                   std::string_view output_type, std::string_view inference_id = "") {
  CaptureInput in;
  in.endpoint = "ep";
  in.variant = "AllTraffic";
  in.input = input;
  in.input_content_type = input_type;
  in.output = output;
  in.output_content_type = output_type;
  in.inference_id = inference_id;
  in.epoch_millis = 1714557603042;  // 2024-05-01T10:00:03.042Z
  return in;
}

TEST(DataCaptureConfigTest, ParsesDestinationModesAndTypes) {
  auto s = Settings(Config(37));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->sampling_percentage, 37);
  EXPECT_EQ(s->bucket, "bkt");
  EXPECT_EQ(s->prefix, "capture/dir");
  EXPECT_TRUE(s->capture_input);
  EXPECT_TRUE(s->capture_output);
  EXPECT_EQ(CaptureEncoding(*s, "text/csv"), "CSV");
  EXPECT_EQ(CaptureEncoding(*s, "Text/CSV; charset=utf-8"), "CSV");
  EXPECT_EQ(CaptureEncoding(*s, "application/json"), "JSON");
  EXPECT_EQ(CaptureEncoding(*s, "application/jsonlines"), "JSON");
  EXPECT_EQ(CaptureEncoding(*s, "application/x-npy"), "BASE64");
  EXPECT_EQ(CaptureEncoding(*s, ""), "BASE64");

  json only_input = Config(100, "Input");
  only_input["CaptureOptions"].push_back({{"CaptureMode", "Output"}});
  only_input["DestinationS3Uri"] = "s3://bkt";
  s = Settings(only_input);
  EXPECT_TRUE(s->capture_input && s->capture_output);
  EXPECT_EQ(s->prefix, "");

  json off = Config();
  off["EnableCapture"] = false;
  auto disabled = ParseDataCaptureConfig(off);
  ASSERT_TRUE(disabled.ok());
  EXPECT_EQ(*disabled, nullptr);

  json https = Config();
  https["DestinationS3Uri"] = "https://example.com/x";
  EXPECT_FALSE(ParseDataCaptureConfig(https).ok());
}

TEST(DataCaptureTest, WritesOneLinePerInvocationWithAwsShapeAndPath) {
  FakeUploader uploader;
  DataCapture capture({}, &uploader);
  capture.Start();
  auto settings = Settings(Config());
  ASSERT_TRUE(capture.Capture(
      settings, Input("69,0,153.7,109\n", "text/csv", "0.0254", "text/csv; charset=utf-8", "order-1234")));
  std::string binary("\x00\x01\xff\xfe", 4);
  ASSERT_TRUE(
      capture.Capture(settings, Input(binary, "application/x-npy", "{\"a\":\"\xc3\xa9\\n\"}", "application/json")));
  // CSV declared but not UTF-8: stored base64 rather than as broken text.
  ASSERT_TRUE(capture.Capture(settings, Input(binary, "text/csv", "x\"y", "text/csv")));
  capture.FlushForTest();

  auto files = uploader.files();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].bucket, "bkt");
  auto key_pattern = Regex::Compile("capture/dir/ep/AllTraffic/2024/05/01/10/00-03-042-[0-9a-f-]{36}\\.jsonl",
                                    {.mode = Regex::Mode::kFullMatch});
  ASSERT_TRUE(key_pattern.ok());
  EXPECT_TRUE(key_pattern->Match(files[0].key)) << files[0].key;
  auto lines = uploader.Lines();
  ASSERT_EQ(lines.size(), 3u);
  const json& first = lines[0];
  EXPECT_EQ(
      first["captureData"]["endpointInput"],
      json(
          {{"observedContentType", "text/csv"}, {"mode", "INPUT"}, {"data", "69,0,153.7,109\n"}, {"encoding", "CSV"}}));
  EXPECT_EQ(first["captureData"]["endpointOutput"], json({{"observedContentType", "text/csv; charset=utf-8"},
                                                          {"mode", "OUTPUT"},
                                                          {"data", "0.0254"},
                                                          {"encoding", "CSV"}}));
  EXPECT_EQ(first["eventMetadata"]["inferenceId"], "order-1234");
  EXPECT_EQ(first["eventMetadata"]["inferenceTime"], "2024-05-01T10:00:03Z");
  EXPECT_EQ(first["eventMetadata"]["eventId"].get<std::string>().size(), 36u);
  EXPECT_EQ(first["eventVersion"], "0");
  EXPECT_EQ(lines[1]["captureData"]["endpointInput"]["encoding"], "BASE64");
  EXPECT_EQ(Base64Decode(lines[1]["captureData"]["endpointInput"]["data"].get<std::string>()), binary);
  EXPECT_EQ(lines[1]["captureData"]["endpointOutput"]["data"], "{\"a\":\"\xc3\xa9\\n\"}");
  EXPECT_EQ(lines[1]["captureData"]["endpointOutput"]["encoding"], "JSON");
  EXPECT_FALSE(lines[1]["eventMetadata"].contains("inferenceId"));
  EXPECT_EQ(lines[2]["captureData"]["endpointInput"]["encoding"], "BASE64");
  EXPECT_EQ(lines[2]["captureData"]["endpointOutput"]["data"], "x\"y");
  EXPECT_NE(lines[0]["eventMetadata"]["eventId"], lines[1]["eventMetadata"]["eventId"]);
}

TEST(DataCaptureTest, ModesAndSampling) {
  FakeUploader uploader;
  DataCapture capture({}, &uploader);
  capture.Start();
  EXPECT_TRUE(capture.Capture(Settings(Config(100, "Input")), Input("in", "text/csv", "out", "text/csv")));
  EXPECT_TRUE(capture.Capture(Settings(Config(100, "Output")), Input("in", "text/csv", "out", "text/csv")));
  auto none = Settings(Config(0));
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(capture.Capture(none, Input("in", "text/csv", "out", "text/csv")));
  auto some = Settings(Config(30));
  int sampled = 0;
  for (int i = 0; i < 10000; ++i) sampled += capture.Capture(some, Input("in", "text/csv", "out", "text/csv"));
  EXPECT_NEAR(sampled, 3000, 230);  // 5 sd
  capture.FlushForTest();
  auto lines = uploader.Lines();
  ASSERT_EQ(lines.size(), 2u + static_cast<size_t>(sampled));
  EXPECT_TRUE(lines[0]["captureData"].contains("endpointInput"));
  EXPECT_FALSE(lines[0]["captureData"].contains("endpointOutput"));
  EXPECT_FALSE(lines[1]["captureData"].contains("endpointInput"));
  EXPECT_EQ(lines[1]["captureData"]["endpointOutput"]["data"], "out");
}

TEST(DataCaptureTest, FlushesByIntervalSizeAndHour) {
  FakeUploader uploader;
  DataCaptureOptions options;
  options.flush_interval = std::chrono::milliseconds(200);
  options.max_file_bytes = 4096;
  DataCapture capture(options, &uploader);
  capture.Start();
  auto settings = Settings(Config());
  ASSERT_TRUE(capture.Capture(settings, Input("a", "text/csv", "b", "text/csv")));
  // The interval: the file appears by itself.
  for (int i = 0; i < 100 && uploader.files().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(uploader.files().size(), 1u);
  // The size: 2,000-byte inputs, a file every two or three records.
  std::string big(2000, 'x');
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(capture.Capture(settings, Input(big, "text/csv", "b", "text/csv")));
  for (int i = 0; i < 100 && uploader.files().size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(uploader.files().size(), 3u);
  capture.FlushForTest();
  // A new hour starts a new file under the new hour's directory.
  CaptureInput later = Input("a", "text/csv", "b", "text/csv");
  ASSERT_TRUE(capture.Capture(settings, Input("a", "text/csv", "b", "text/csv")));
  later.epoch_millis += 3600000;
  ASSERT_TRUE(capture.Capture(settings, later));
  capture.FlushForTest();
  auto files = uploader.files();
  ASSERT_GE(files.size(), 2u);
  EXPECT_NE(files[files.size() - 2].key.find("/2024/05/01/10/"), std::string::npos);
  EXPECT_NE(files.back().key.find("/2024/05/01/11/"), std::string::npos);
  EXPECT_EQ(uploader.Lines().size(), 9u);
}

TEST(DataCaptureTest, BoundedBufferDropsAndFailedUploadsAreCounted) {
  FakeUploader uploader;
  DataCaptureOptions options;
  options.max_pending_bytes = 10000;
  DataCapture capture(options, &uploader);  // not started: nothing drains the buffer
  auto settings = Settings(Config());
  std::string big(3000, 'x');
  int queued = 0;
  for (int i = 0; i < 10; ++i) queued += capture.Capture(settings, Input(big, "text/csv", "b", "text/csv"));
  EXPECT_EQ(queued, 3);
  EXPECT_EQ(capture.stats().dropped, 7u);
  uploader.SetFail(true);
  capture.Start();
  capture.FlushForTest();
  EXPECT_EQ(capture.stats().upload_failures, 1u);
  EXPECT_EQ(capture.stats().files_written, 0u);
  uploader.SetFail(false);
  EXPECT_TRUE(capture.Capture(settings, Input("a", "text/csv", "b", "text/csv")));
  capture.Stop();  // writes what is open
  EXPECT_EQ(capture.stats().files_written, 1u);
  EXPECT_FALSE(capture.Capture(settings, Input("a", "text/csv", "b", "text/csv")));
}

// ---- Through the router: the production answer is captured, shadows get copies.

class ObservedRouterTest : public ::testing::Test {
 protected:
  InvocationCounts Totals(const std::string& variant) { return metrics_.Totals()[{"ep", variant}]; }

  ObservedRouterTest()
      : metrics_({}, nullptr),
        capture_({}, &uploader_),
        shadows_(ShadowVariantsOptions{.threads = 2, .invocation_timeout_ms = 2000}, &client_, &metrics_, &capture_) {
    RouterOptions options;
    options.invocation_timeout_ms = 2000;
    router_ = std::make_unique<Router>(options, &routes_, &client_, &metrics_);
    router_->SetInvocationObserver(&capture_);
    capture_.SetShadows(&shadows_);
    capture_.Start();
    shadows_.Start();
  }
  ~ObservedRouterTest() override {
    shadows_.Stop();
    capture_.Stop();
  }

  void Publish(uint16_t production_port, std::optional<uint16_t> shadow_port, const json& capture_config) {
    auto route = std::make_shared<EndpointRoute>();
    route->name = "ep";
    route->status = "InService";
    VariantRoute production;
    production.name = "AllTraffic";
    auto instance = std::make_shared<InstanceTarget>();
    instance->instance_id = "i-0";
    instance->port = production_port;
    production.instances.push_back(instance);
    route->variants.push_back(production);
    if (shadow_port) {
      VariantRoute shadow;
      shadow.name = "Shadow";
      shadow.weight = 0;
      auto s = std::make_shared<InstanceTarget>();
      s->instance_id = "i-1";
      s->port = *shadow_port;
      shadow.instances.push_back(s);
      route->shadow_variants.push_back(shadow);
    }
    if (!capture_config.is_null()) route->data_capture = Settings(capture_config);
    routes_.Publish(route);
  }

  net::FakeResponseWriter Invoke(std::string body, std::string inference_id = "") {
    HeaderMap headers{{"Content-Type", "text/csv"}};
    if (!inference_id.empty()) headers.emplace("X-Amzn-SageMaker-Inference-Id", inference_id);
    InvokeRequest request;
    request.endpoint_name = "ep";
    request.headers = &headers;
    request.body = body;
    request.request_id = "req-1";
    request.account_id = "123456789012";
    net::FakeResponseWriter writer;
    router_->Invoke(request, writer);
    return writer;
  }

  FakeUploader uploader_;
  RoutingTable routes_;
  net::HttpClient client_;
  InvocationMetrics metrics_;
  DataCapture capture_;
  ShadowVariants shadows_;
  std::unique_ptr<Router> router_;
};

TEST_F(ObservedRouterTest, CapturesAnsweredInvocationsOnly) {
  FakeContainer container;
  container.Respond(200, "0.5", "Content-Type: text/csv\r\n");
  Publish(container.port(), std::nullopt, Config());
  ASSERT_EQ(Invoke("1,2", "inf-7").status(), 200);
  container.Respond(500, "boom", "Content-Type: text/plain\r\n");
  ASSERT_EQ(Invoke("3,4").status(), 424);
  capture_.FlushForTest();
  auto lines = uploader_.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["captureData"]["endpointInput"]["data"], "1,2");
  EXPECT_EQ(lines[0]["captureData"]["endpointOutput"]["data"], "0.5");
  EXPECT_EQ(lines[0]["eventMetadata"]["inferenceId"], "inf-7");
}

TEST_F(ObservedRouterTest, ShadowGetsEveryRequestAndNeverAnswers) {
  FakeContainer production;
  production.Respond(200, "prod", "Content-Type: text/csv\r\n");
  FakeContainer shadow;
  shadow.Respond(200, "shadow", "Content-Type: text/csv\r\n");
  Publish(production.port(), shadow.port(), Config());
  for (int i = 0; i < 5; ++i) {
    auto w = Invoke("row-" + std::to_string(i));
    ASSERT_EQ(w.status(), 200);
    EXPECT_EQ(w.body(), "prod");
    EXPECT_EQ(w.header("x-Amzn-Invoked-Production-Variant"), "AllTraffic");
  }
  for (int i = 0; i < 200 && shadows_.stats().sent < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(shadows_.stats().sent, 5u);
  EXPECT_EQ(shadows_.stats().failed, 0u);
  auto received = shadow.received();
  ASSERT_EQ(received.size(), 5u);
  std::multiset<std::string> bodies;
  for (const auto& r : received) bodies.insert(r.body);
  EXPECT_EQ(bodies, (std::multiset<std::string>{"row-0", "row-1", "row-2", "row-3", "row-4"}));
  EXPECT_NE(received[0].head.find("Content-Type: text/csv\r\n"), std::string::npos);
  EXPECT_EQ(Totals("Shadow").invocations, 5u);
  EXPECT_EQ(Totals("AllTraffic").invocations, 5u);
  // Both variants' answers captured, each under its own name.
  capture_.FlushForTest();
  std::map<std::string, int> by_variant;
  for (const auto& file : uploader_.files()) {
    by_variant[file.key.substr(0, file.key.find("/20"))] +=
        static_cast<int>(std::count(file.content.begin(), file.content.end(), '\n'));
  }
  EXPECT_EQ(by_variant["capture/dir/ep/AllTraffic"], 5);
  EXPECT_EQ(by_variant["capture/dir/ep/Shadow"], 5);
}

TEST_F(ObservedRouterTest, FailingShadowLeavesTheCallerAlone) {
  FakeContainer production;
  production.Respond(200, "prod", "Content-Type: text/csv\r\n");
  FakeContainer shadow;
  shadow.Respond(503, "down", "Content-Type: text/plain\r\n");
  Publish(production.port(), shadow.port(), json());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Invoke("x").body(), "prod");
  for (int i = 0; i < 200 && shadows_.stats().sent < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  shadow.SetMode(FakeContainer::Mode::kClose);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Invoke("y").body(), "prod");
  for (int i = 0; i < 200 && shadows_.stats().sent < 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(shadows_.stats().sent, 6u);
  EXPECT_EQ(shadows_.stats().failed, 6u);
  EXPECT_EQ(Totals("Shadow").model_errors, 6u);
  EXPECT_EQ(Totals("Shadow").errors_5xx, 3u);
  EXPECT_EQ(Totals("AllTraffic").model_errors, 0u);
}

// What capture adds to one invocation on the invoke path (DataCapture::Capture: the sample, the
// copy into the buffer under its mutex, with the writer draining it meanwhile, as in a server),
// and what the writer spends per record (encoding, the line, the file).
// Run: serving_test --gtest_also_run_disabled_tests --gtest_filter='*CaptureCost*'
TEST(DataCaptureCostTest, DISABLED_CaptureCost) {
  class NullUploader : public CaptureUploader {
   public:
    Status Upload(const std::string&, const std::string&, const std::string& content) override {
      bytes += content.size();
      return Status::Ok();
    }
    size_t bytes = 0;
  } uploader;
  auto ns = [](auto a, auto b, int n) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count() / static_cast<double>(n);
  };
  for (size_t size : {size_t{100}, size_t{1024}, size_t{64 * 1024}}) {
    DataCaptureOptions options;
    options.max_pending_bytes = size_t{1} << 34;  // nothing dropped
    const std::string input(size, 'i');
    const std::string output(size / 4 + 1, 'o');
    const auto settings = Settings(Config());
    const int n = size > 10000 ? 5000 : 100000;
    double sampled = 0;
    double skipped = 0;
    {
      DataCapture capture(options, &uploader);
      capture.Start();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        capture.Capture(settings, Input(input, "application/json", output, "application/json", "id-1"));
      }
      auto t1 = std::chrono::steady_clock::now();
      const auto none = Settings(Config(0));
      for (int i = 0; i < n; ++i) capture.Capture(none, Input(input, "application/json", output, "application/json"));
      auto t2 = std::chrono::steady_clock::now();
      sampled = ns(t0, t1, n);
      skipped = ns(t1, t2, n);
      EXPECT_EQ(capture.stats().dropped, 0u);
    }
    // The writer alone: records queued first, then written in one pass.
    DataCapture capture(options, &uploader);
    auto fill = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      capture.Capture(settings, Input(input, "application/json", output, "application/json", "id-1"));
    }
    auto t0 = std::chrono::steady_clock::now();
    capture.Start();
    capture.FlushForTest();
    auto t1 = std::chrono::steady_clock::now();
    std::printf(
        "input %6zu B, output %6zu B: Capture %7.0f ns sampled (%7.0f ns without a writer running), %5.1f ns not "
        "sampled; writer %7.0f ns/record\n",
        input.size(), output.size(), sampled, ns(fill, t0, n), skipped, ns(t0, t1, n));
  }
}

}  // namespace
}  // namespace kiln::serving
