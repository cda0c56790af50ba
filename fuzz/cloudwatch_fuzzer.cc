// Fuzzes the CloudWatch metrics API (src/api/cloudwatch.h) in its three protocols over a real
// MetricStore: RPC v2 CBOR bodies (aws::DecodeCbor → model validation → handlers → shaped CBOR
// answer), Query forms (aws::ParseQueryForm + DecodeQueryInput → the same handlers → XML), and
// JSON 1.0 bodies (the JsonService the front door registers).
//
// Input layout: byte 0 = flags:
//   bits 0-1  protocol: 0 CBOR, 1 Query form, 2 JSON 1.0, 3 CBOR
//   bits 2-3  operation: PutMetricData, GetMetricStatistics, GetMetricData, ListMetrics (Query:
//             used as Action when the form names none)
// the rest = the body (CBOR bytes, form text, JSON text).
// Every input starts from the same database: a few series in "App" and "AWS/SageMaker" around the
// fixed clock (2024-05-01T10:00:00Z), restored per input (fuzz_support.h RestoreDatabase).
//
// Checks besides "no crash, no sanitizer report": never a 5xx; CBOR answers decode, errors as a
// map with a string __type and an x-amzn-query-error header "<__type>;Sender"; Query answers are
// well-formed XML whose root is <OpResponse> or <ErrorResponse> with a <Code>; JSON answers are
// objects, errors with __type.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include "api/cloudwatch.h"
#include "aws/cbor.h"
#include "aws/query_codec.h"
#include "fuzz_support.h"
#include "observe/metric_store.h"

namespace {

using kiln::fuzz::Check;

constexpr int64_t kNow = 1714557600000;
constexpr const char* kOperations[] = {"PutMetricData", "GetMetricStatistics", "GetMetricData", "ListMetrics"};

struct World {
  kiln::store::Database* db = &kiln::fuzz::SharedDatabase();
  kiln::observe::MetricStore store{db};
  std::unique_ptr<kiln::api::CloudWatch> cloudwatch;
  std::unique_ptr<kiln::api::JsonService> json;

  World() {
    kiln::fuzz::QuietLogs();
    kiln::api::CloudWatchOptions options;
    options.store = &store;
    options.now_millis = [] { return kNow; };
    cloudwatch = std::make_unique<kiln::api::CloudWatch>(options);
    json = cloudwatch->MakeJsonService();
  }
};

World& TheWorld() {
  static World* world = new World();
  return *world;
}

void Populate(kiln::store::Database& db) {
  kiln::observe::MetricStore store(&db);
  std::vector<kiln::observe::MetricDatum> batch;
  for (int i = 0; i < 20; ++i) {
    kiln::observe::MetricDatum d;
    d.name = i % 2 ? "Latency" : "Count";
    d.dimensions = {{"Host", "h" + std::to_string(i % 3)}};
    d.timestamp_millis = kNow - 600000 + i * 30000;
    d.values_counts = {{1.0 * i, 1}, {2.0 * i + 1, 2}};
    d.unit = "Milliseconds";
    batch.push_back(d);
  }
  Check(store.Put("App", batch).ok());
  Check(
      store.Put("AWS/SageMaker", "Invocations", {{"EndpointName", "ep"}, {"VariantName", "v"}}, kNow - 60000, 3).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& world = TheWorld();
  kiln::fuzz::RestoreDatabase(Populate);
  const uint8_t flags = data[0];
  const std::string op = kOperations[(flags >> 2) & 3];
  std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln::aws::RequestContext context;
  context.request_id = "fuzz";
  const int protocol = flags & 3;
  kiln::aws::WireResponse r;
  if (protocol == 1) {
    auto params = kiln::aws::ParseQueryForm(body);
    if (!params.ok()) return 0;
    params->emplace("Action", op);
    r = world.cloudwatch->HandleQuery(context, *params);
    pugi::xml_document doc;
    Check(doc.load_buffer(r.body.data(), r.body.size()));
    std::string root = doc.document_element().name();
    if (r.status == 200) {
      Check(root == params->at("Action") + "Response");
    } else {
      Check(root == "ErrorResponse");
      Check(!std::string(doc.document_element().child("Error").child_value("Code")).empty());
    }
  } else if (protocol == 2) {
    r = world.json->Handle(context, op, body);
    auto parsed = nlohmann::json::parse(r.body, nullptr, false);
    Check(parsed.is_object());
    if (r.status != 200) Check(parsed["__type"].is_string());
  } else {
    r = world.cloudwatch->HandleCbor(context, op, body);
    if (!r.body.empty()) {
      auto decoded = kiln::aws::DecodeCbor(r.body, kiln::aws::CborLimits{.max_depth = 64, .max_values = 1 << 24});
      Check(decoded.ok() && decoded->is_object());
      if (r.status != 200) {
        Check((*decoded)["__type"].is_string());
        const std::string* header = kiln::FindHeader(r.headers, "x-amzn-query-error");
        Check(header != nullptr && *header == (*decoded)["__type"].get<std::string>() + ";Sender");
      }
    } else {
      Check(r.status == 200 && op == "PutMetricData");
    }
  }
  if (kiln::fuzz::Debug()) std::fprintf(stderr, "%s %d: %s\n", op.c_str(), r.status, r.body.substr(0, 300).c_str());
  Check(r.status < 500);
  return 0;
}
