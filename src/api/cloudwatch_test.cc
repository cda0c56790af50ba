#include "api/cloudwatch.h"

#include <gtest/gtest.h>

#include "aws/cbor.h"
#include "aws/query_codec.h"
#include "base/encoding.h"
#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

using nlohmann::json;

// 2024-05-01T10:00:00Z
constexpr int64_t kNow = 1714557600000;
constexpr double kNowSeconds = 1714557600.0;

class CloudWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), false);
    store_ = std::make_unique<observe::MetricStore>(db_.get());
    CloudWatchOptions options;
    options.store = store_.get();
    options.now_millis = [this] { return now_; };
    cw_ = std::make_unique<CloudWatch>(options);
    service_ = cw_->MakeJsonService();
    context_.request_id = "req-1";
  }

  // JSON 1.0 through the JsonService, as botocore 1.43 sends it: (status, body, query-error header).
  struct Answer {
    int status = 0;
    json body;
    std::string query_error;
  };
  Answer Json10(const std::string& op, const json& input) {
    aws::WireResponse r = service_->Handle(context_, op, input.dump());
    const std::string* header = FindHeader(r.headers, "x-amzn-query-error");
    return {r.status, json::parse(r.body), header ? *header : ""};
  }
  json Ok(const std::string& op, const json& input) {
    Answer a = Json10(op, input);
    EXPECT_EQ(a.status, 200) << op << " " << a.body.dump();
    return a.body;
  }
  // The code a botocore client sees (from x-amzn-query-error), checked against __type.
  std::string Error(const std::string& op, const json& input, std::string* message = nullptr) {
    Answer a = Json10(op, input);
    EXPECT_NE(a.status, 200) << op << " " << a.body.dump();
    std::string code = a.body.value("__type", "");
    EXPECT_EQ(a.query_error, code + ";Sender");
    if (message) *message = a.body.value("message", "");
    return code;
  }

  void Put(const json& data, const std::string& ns = "Custom/Test") {
    Ok("PutMetricData", {{"Namespace", ns}, {"MetricData", data}});
  }

  json Stats(const json& extra) {
    json in = {{"Namespace", "Custom/Test"},
               {"MetricName", "Latency"},
               {"StartTime", kNowSeconds - 600},
               {"EndTime", kNowSeconds},
               {"Period", 60},
               {"Statistics", {"SampleCount", "Average", "Sum", "Minimum", "Maximum"}}};
    if (!extra.is_null()) in.update(extra);
    return in;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> store_;
  std::unique_ptr<CloudWatch> cw_;
  std::unique_ptr<JsonService> service_;
  aws::RequestContext context_;
  int64_t now_ = kNow;
};

TEST_F(CloudWatchTest, EmbeddedModelParsesAndCompiles) {
  ASSERT_NE(CloudWatch::Model(), nullptr);
  EXPECT_TRUE(CloudWatch::Model()->TEST_CompileAllPatterns().ok());
  for (const char* op : {"PutMetricData", "GetMetricStatistics", "GetMetricData", "ListMetrics"}) {
    EXPECT_TRUE(CloudWatch::Model()->HasOperation(op)) << op;
  }
  EXPECT_EQ(CloudWatch::ModelJson()["metadata"]["targetPrefix"], "GraniteServiceVersion20100801");
}

TEST_F(CloudWatchTest, PutThenStatisticsAreExact) {
  Put({{{"MetricName", "Latency"}, {"Timestamp", kNowSeconds - 300}, {"Value", 10}, {"Unit", "Milliseconds"}},
       {{"MetricName", "Latency"},
        {"Timestamp", kNowSeconds - 290},
        {"Values", {1, 2, 30}},
        {"Counts", {1, 2, 1}},
        {"Unit", "Milliseconds"}},
       {{"MetricName", "Latency"},
        {"Timestamp", kNowSeconds - 120},
        {"StatisticValues", {{"SampleCount", 4}, {"Sum", 20}, {"Minimum", 2}, {"Maximum", 8}}},
        {"Unit", "Milliseconds"}}});
  json out = Ok("GetMetricStatistics", Stats({}));
  EXPECT_EQ(out["Label"], "Latency");
  ASSERT_EQ(out["Datapoints"].size(), 2u);
  json first = out["Datapoints"][0];
  EXPECT_DOUBLE_EQ(first["Timestamp"].get<double>(), kNowSeconds - 300);
  EXPECT_DOUBLE_EQ(first["SampleCount"].get<double>(), 5);
  EXPECT_DOUBLE_EQ(first["Sum"].get<double>(), 45);
  EXPECT_DOUBLE_EQ(first["Average"].get<double>(), 9);
  EXPECT_DOUBLE_EQ(first["Minimum"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(first["Maximum"].get<double>(), 30);
  EXPECT_EQ(first["Unit"], "Milliseconds");
  EXPECT_DOUBLE_EQ(out["Datapoints"][1]["Average"].get<double>(), 5);

  json only_pct = Stats({{"ExtendedStatistics", {"p50", "p99.9"}}});
  only_pct.erase("Statistics");
  json pct = Ok("GetMetricStatistics", only_pct);
  ASSERT_EQ(pct["Datapoints"].size(), 2u);
  EXPECT_DOUBLE_EQ(pct["Datapoints"][0]["ExtendedStatistics"]["p50"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(pct["Datapoints"][0]["ExtendedStatistics"]["p99.9"].get<double>(), 30);
  EXPECT_FALSE(pct["Datapoints"][0].contains("Average"));
  // A bare statistic set with Minimum != Maximum has no percentiles (CloudWatch's rule).
  EXPECT_FALSE(pct["Datapoints"][1].contains("ExtendedStatistics"));
  // Unit filter: points stored with another unit are not answered.
  EXPECT_TRUE(Ok("GetMetricStatistics", Stats({{"Unit", "Seconds"}}))["Datapoints"].empty());
}

TEST_F(CloudWatchTest, DimensionsMatchAsAWholeSet) {
  Put({{{"MetricName", "Latency"},
        {"Timestamp", kNowSeconds - 60},
        {"Dimensions", {{{"Name", "EndpointName"}, {"Value", "ep"}}, {{"Name", "VariantName"}, {"Value", "v"}}}},
        {"Value", 3}}});
  json dims = {{{"Name", "VariantName"}, {"Value", "v"}}, {{"Name", "EndpointName"}, {"Value", "ep"}}};
  EXPECT_EQ(Ok("GetMetricStatistics", Stats({{"Dimensions", dims}}))["Datapoints"].size(), 1u);
  EXPECT_TRUE(Ok("GetMetricStatistics", Stats({}))["Datapoints"].empty());
  json partial = {{{"Name", "EndpointName"}, {"Value", "ep"}}};
  EXPECT_TRUE(Ok("GetMetricStatistics", Stats({{"Dimensions", partial}}))["Datapoints"].empty());
}

TEST_F(CloudWatchTest, PutMetricDataErrors) {
  std::string message;
  EXPECT_EQ(Error("PutMetricData", {{"Namespace", "AWS/EC2"}, {"MetricData", {{{"MetricName", "m"}, {"Value", 1}}}}},
                  &message),
            "InvalidParameterValue");
  EXPECT_NE(message.find("The value AWS/EC2 for parameter Namespace is invalid"), std::string::npos);
  EXPECT_EQ(Error("PutMetricData", {{"Namespace", "n"}}), "MissingParameter");
  EXPECT_EQ(
      Error("PutMetricData",
            {{"Namespace", "n"}, {"MetricData", {{{"MetricName", "m"}, {"Value", 1}, {"Values", {1}}}}}}, &message),
      "InvalidParameterCombination");
  EXPECT_NE(message.find("MetricData.member.1.Value and MetricData.member.1.Values are mutually exclusive"),
            std::string::npos);
  EXPECT_EQ(Error("PutMetricData", {{"Namespace", "n"}, {"MetricData", {{{"MetricName", "m"}}}}}), "MissingParameter");
  EXPECT_EQ(Error("PutMetricData",
                  {{"Namespace", "n"}, {"MetricData", {{{"MetricName", "m"}, {"Values", {1, 2}}, {"Counts", {1}}}}}}),
            "InvalidParameterValue");
  EXPECT_EQ(
      Error("PutMetricData",
            {{"Namespace", "n"}, {"MetricData", {{{"MetricName", "m"}, {"Values", json(std::vector<int>(151, 1))}}}}}),
      "InvalidParameterValue");
  EXPECT_EQ(
      Error("PutMetricData", {{"Namespace", "n"}, {"MetricData", {{{"MetricName", "m"}, {"Value", 1e200}}}}}, &message),
      "InvalidParameterValue");
  EXPECT_NE(message.find("MetricData.member.1.Value"), std::string::npos);
  EXPECT_EQ(Error("PutMetricData", {{"Namespace", "n"},
                                    {"MetricData", {{{"MetricName", "m"}, {"Value", 1}, {"StorageResolution", 5}}}}}),
            "InvalidParameterValue");
  EXPECT_EQ(Error("PutMetricData",
                  {{"Namespace", "n"},
                   {"MetricData", {{{"MetricName", "m"}, {"Value", 1}, {"Timestamp", kNowSeconds - 15 * 86400}}}}},
                  &message),
            "InvalidParameterValue");
  EXPECT_NE(message.find("two weeks"), std::string::npos);
  EXPECT_EQ(Error("PutMetricData",
                  {{"Namespace", "n"},
                   {"MetricData",
                    {{{"MetricName", "m"},
                      {"StatisticValues", {{"SampleCount", 1}, {"Sum", 1}, {"Minimum", 3}, {"Maximum", 2}}}}}}}),
            "InvalidParameterValue");
  json many = json::array();
  for (int i = 0; i < 1001; ++i) many.push_back({{"MetricName", "m"}, {"Value", i}});
  EXPECT_EQ(Error("PutMetricData", {{"Namespace", "n"}, {"MetricData", many}}), "InvalidParameterValue");
  // The model's own constraints: ValidationError with AWS's text.
  EXPECT_EQ(
      Error("PutMetricData", {{"Namespace", "n"}, {"MetricData", {{{"MetricName", ""}, {"Value", 1}}}}}, &message),
      "ValidationError");
  EXPECT_NE(message.find("metricData.1.member.metricName"), std::string::npos) << message;
  // Nothing of a refused call is stored.
  EXPECT_TRUE(Ok("ListMetrics", json::object())["Metrics"].empty());
}

TEST_F(CloudWatchTest, StatisticsRequestErrors) {
  std::string message;
  json neither = Stats({});
  neither.erase("Statistics");
  EXPECT_EQ(Error("GetMetricStatistics", neither, &message), "MissingParameter");
  EXPECT_EQ(message, "Must specify either Statistics or ExtendedStatistics.");
  // An empty list breaks the model's length rule (1 to 5).
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"Statistics", json::array()}})), "ValidationError");
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"Statistics", {"Median"}}})),
            "InvalidParameterValue");  // as AWS, not the enum
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"ExtendedStatistics", {"p101"}}})), "InvalidParameterValue");
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"Period", 45}})), "InvalidParameterValue");
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"StartTime", kNowSeconds}, {"EndTime", kNowSeconds - 60}})),
            "InvalidParameterValue");
  // More than 1,440 periods.
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"StartTime", kNowSeconds - 86400 - 60}, {"Period", 60}}), &message),
            "InvalidParameterCombination");
  EXPECT_EQ(message,
            "You have requested up to 1,441 datapoints, which exceeds the limit of 1,440. You may reduce the "
            "datapoints requested by increasing Period, or decreasing the time range.");
  EXPECT_EQ(Ok("GetMetricStatistics", Stats({{"StartTime", kNowSeconds - 86400}, {"Period", 60}}))["Datapoints"].size(),
            0u);
  // Old data needs coarser periods: 10 s works for the last 3 hours only.
  EXPECT_EQ(Ok("GetMetricStatistics", Stats({{"StartTime", kNowSeconds - 3600}, {"Period", 10}}))["Datapoints"].size(),
            0u);
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"StartTime", kNowSeconds - 4 * 3600}, {"Period", 10}}), &message),
            "InvalidParameterValue");
  EXPECT_NE(message.find("multiple of 60"), std::string::npos);
  EXPECT_EQ(
      Error("GetMetricStatistics",
            Stats({{"StartTime", kNowSeconds - 20 * 86400}, {"EndTime", kNowSeconds - 19 * 86400}, {"Period", 60}}),
            &message),
      "InvalidParameterValue");
  EXPECT_NE(message.find("multiple of 300"), std::string::npos);
  EXPECT_EQ(
      Error("GetMetricStatistics",
            Stats({{"StartTime", kNowSeconds - 70 * 86400}, {"EndTime", kNowSeconds - 69 * 86400}, {"Period", 300}}),
            &message),
      "InvalidParameterValue");
  EXPECT_NE(message.find("multiple of 3600"), std::string::npos);
  EXPECT_EQ(Error("GetMetricStatistics", Stats({{"Period", 0}})), "ValidationError");
}

TEST_F(CloudWatchTest, StartIsRoundedDownToTheMinute) {
  Put({{{"MetricName", "Latency"}, {"Timestamp", kNowSeconds - 100}, {"Value", 1}}});
  json out = Ok("GetMetricStatistics", Stats({{"StartTime", kNowSeconds - 110}}));
  ASSERT_EQ(out["Datapoints"].size(), 1u);
  EXPECT_DOUBLE_EQ(out["Datapoints"][0]["Timestamp"].get<double>(), kNowSeconds - 120);
}

TEST_F(CloudWatchTest, GetMetricDataStatsOrderAndPaging) {
  json data = json::array();
  for (int i = 0; i < 5; ++i) {
    data.push_back({{"MetricName", "Latency"}, {"Timestamp", kNowSeconds - 300 + 60 * i}, {"Values", {i, 10 * i}}});
  }
  Put(data);
  auto query = [](const std::string& id, const std::string& stat) {
    return json{
        {"Id", id},
        {"MetricStat",
         {{"Metric", {{"Namespace", "Custom/Test"}, {"MetricName", "Latency"}}}, {"Period", 60}, {"Stat", stat}}}};
  };
  json in = {{"MetricDataQueries", {query("avg", "Average"), query("p99", "p99"), query("sum", "Sum")}},
             {"StartTime", kNowSeconds - 600},
             {"EndTime", kNowSeconds}};
  in["MetricDataQueries"][2]["ReturnData"] = false;
  in["MetricDataQueries"][1]["Label"] = "tail";
  json out = Ok("GetMetricData", in);
  ASSERT_EQ(out["MetricDataResults"].size(), 2u);
  json avg = out["MetricDataResults"][0];
  EXPECT_EQ(avg["Id"], "avg");
  EXPECT_EQ(avg["Label"], "Latency");
  EXPECT_EQ(avg["StatusCode"], "Complete");
  ASSERT_EQ(avg["Values"].size(), 5u);
  // TimestampDescending by default.
  EXPECT_DOUBLE_EQ(avg["Timestamps"][0].get<double>(), kNowSeconds - 60);
  EXPECT_DOUBLE_EQ(avg["Values"][0].get<double>(), 22);
  EXPECT_EQ(out["MetricDataResults"][1]["Label"], "tail");
  EXPECT_DOUBLE_EQ(out["MetricDataResults"][1]["Values"][0].get<double>(), 40);
  EXPECT_FALSE(out.contains("NextToken"));

  in["ScanBy"] = "TimestampAscending";
  in["MaxDatapoints"] = 3;
  json page1 = Ok("GetMetricData", in);
  EXPECT_EQ(page1["MetricDataResults"][0]["Values"].size(), 3u);
  EXPECT_EQ(page1["MetricDataResults"][0]["StatusCode"], "PartialData");
  EXPECT_DOUBLE_EQ(page1["MetricDataResults"][0]["Timestamps"][0].get<double>(), kNowSeconds - 300);
  EXPECT_EQ(page1["MetricDataResults"][1]["Values"].size(), 0u);
  ASSERT_TRUE(page1["NextToken"].is_string());
  std::vector<double> avg_values, p99_values;
  json page = page1;
  int pages = 1;
  for (;;) {
    for (const json& v : page["MetricDataResults"][0]["Values"]) avg_values.push_back(v.get<double>());
    for (const json& v : page["MetricDataResults"][1]["Values"]) p99_values.push_back(v.get<double>());
    if (!page.contains("NextToken")) break;
    ASSERT_LT(pages, 10);
    in["NextToken"] = page["NextToken"];
    page = Ok("GetMetricData", in);
    ++pages;
  }
  EXPECT_EQ(pages, 4);
  EXPECT_EQ(avg_values, (std::vector<double>{0, 5.5, 11, 16.5, 22}));
  EXPECT_EQ(p99_values, (std::vector<double>{0, 10, 20, 30, 40}));

  // A token used with another request.
  in["MaxDatapoints"] = 4;
  EXPECT_EQ(Error("GetMetricData", in), "InvalidNextToken");
  in["NextToken"] = "not-a-token";
  EXPECT_EQ(Error("GetMetricData", in), "InvalidNextToken");
}

TEST_F(CloudWatchTest, GetMetricDataMath) {
  json data = json::array();
  for (int i = 0; i < 3; ++i) {
    data.push_back({{"MetricName", "A"}, {"Timestamp", kNowSeconds - 180 + 60 * i}, {"Value", i + 1}});
    if (i > 0) data.push_back({{"MetricName", "B"}, {"Timestamp", kNowSeconds - 180 + 60 * i}, {"Value", 10 * i}});
  }
  Put(data);
  auto stat = [](const std::string& id, const std::string& name, bool returned) {
    return json{{"Id", id},
                {"ReturnData", returned},
                {"MetricStat",
                 {{"Metric", {{"Namespace", "Custom/Test"}, {"MetricName", name}}}, {"Period", 60}, {"Stat", "Sum"}}}};
  };
  auto expr = [](const std::string& id, const std::string& text) { return json{{"Id", id}, {"Expression", text}}; };
  json in = {{"MetricDataQueries",
              {expr("later", "doubled + 1"), stat("a", "A", false), stat("b", "B", false), expr("doubled", "a * 2"),
               expr("ratio", "b / (a - 1)"), expr("total", "SUM([a, b, 100])"), expr("most", "MAX([a, b])"),
               expr("neg", "-a"), expr("scalar", "2 * 3")}},
             {"StartTime", kNowSeconds - 600},
             {"EndTime", kNowSeconds},
             {"ScanBy", "TimestampAscending"}};
  json out = Ok("GetMetricData", in);
  std::map<std::string, json> by_id;
  for (const json& r : out["MetricDataResults"]) by_id[r["Id"]] = r;
  ASSERT_EQ(by_id.size(), 7u);  // a and b are not returned
  EXPECT_EQ(by_id["doubled"]["Values"], json({2.0, 4.0, 6.0}));
  EXPECT_EQ(by_id["doubled"]["Label"], "doubled");
  EXPECT_EQ(by_id["later"]["Values"], json({3.0, 5.0, 7.0}));  // refers to an expression defined after it
  EXPECT_EQ(by_id["ratio"]["Values"], json({10.0, 10.0}));     // x / 0 at the first minute is dropped
  EXPECT_EQ(by_id["ratio"]["Timestamps"], json({kNowSeconds - 120, kNowSeconds - 60}));
  EXPECT_EQ(by_id["total"]["Values"], json({101.0, 112.0, 123.0}));  // B has no point at the first minute
  EXPECT_EQ(by_id["most"]["Values"], json({1.0, 10.0, 20.0}));
  EXPECT_EQ(by_id["neg"]["Values"], json({-1.0, -2.0, -3.0}));
  EXPECT_TRUE(by_id["scalar"]["Values"].empty());
  json cycle = {{"MetricDataQueries", {expr("x", "y + 1"), expr("y", "x * 2")}},
                {"StartTime", kNowSeconds - 600},
                {"EndTime", kNowSeconds}};
  std::string message;
  EXPECT_EQ(Error("GetMetricData", cycle, &message), "ValidationError");
  EXPECT_NE(message.find("refers to itself"), std::string::npos) << message;
}

TEST_F(CloudWatchTest, GetMetricDataErrors) {
  auto with = [](json q) {
    return json{{"MetricDataQueries", {std::move(q)}}, {"StartTime", kNowSeconds - 600}, {"EndTime", kNowSeconds}};
  };
  json stat = {{"Metric", {{"Namespace", "n"}, {"MetricName", "m"}}}, {"Period", 60}, {"Stat", "Average"}};
  EXPECT_EQ(Error("GetMetricData", with({{"Id", "Bad"}, {"MetricStat", stat}})), "InvalidParameterValue");
  EXPECT_EQ(Error("GetMetricData", with({{"Id", "a"}})), "InvalidParameterCombination");
  std::string message;
  EXPECT_EQ(Error("GetMetricData", with({{"Id", "e"}, {"Expression", "m1 * 2"}}), &message), "ValidationError");
  EXPECT_EQ(message, "Error in expression e [Unknown id m1]");
  EXPECT_EQ(
      Error("GetMetricData", with({{"Id", "e"}, {"Expression", "SEARCH('{AWS/EC2}', 'Average', 300)"}}), &message),
      "ValidationError");
  EXPECT_NE(message.find("Unsupported Metric Math function: SEARCH"), std::string::npos);
  EXPECT_EQ(Error("GetMetricData", with({{"Id", "e"}, {"Expression", "(1 + "}}), &message), "ValidationError");
  stat["Stat"] = "tm99";
  EXPECT_EQ(Error("GetMetricData", with({{"Id", "a"}, {"MetricStat", stat}})), "InvalidParameterValue");
  json many = json::array();
  for (int i = 0; i < 501; ++i) many.push_back({{"Id", "q" + std::to_string(i)}, {"Expression", "1"}});
  EXPECT_EQ(
      Error("GetMetricData", {{"MetricDataQueries", many}, {"StartTime", kNowSeconds - 60}, {"EndTime", kNowSeconds}}),
      "InvalidParameterValue");
}

TEST_F(CloudWatchTest, ListMetricsFiltersAndPages) {
  json data = json::array();
  for (int i = 0; i < 3; ++i) {
    data.push_back({{"MetricName", "m" + std::to_string(i)},
                    {"Dimensions", {{{"Name", "Host"}, {"Value", "h" + std::to_string(i % 2)}}}},
                    {"Value", 1}});
  }
  Put(data);
  Put({{{"MetricName", "old"}, {"Timestamp", kNowSeconds - 4 * 3600}, {"Value", 1}}}, "Other");
  EXPECT_EQ(Ok("ListMetrics", json::object())["Metrics"].size(), 4u);
  json h0 = Ok("ListMetrics", {{"Dimensions", {{{"Name", "Host"}, {"Value", "h0"}}}}});
  ASSERT_EQ(h0["Metrics"].size(), 2u);
  EXPECT_EQ(h0["Metrics"][0], json({{"Namespace", "Custom/Test"},
                                    {"MetricName", "m0"},
                                    {"Dimensions", {{{"Name", "Host"}, {"Value", "h0"}}}}}));
  EXPECT_EQ(Ok("ListMetrics", {{"Dimensions", {{{"Name", "Host"}}}}})["Metrics"].size(), 3u);
  EXPECT_EQ(Ok("ListMetrics", {{"Namespace", "Other"}})["Metrics"].size(), 1u);
  EXPECT_EQ(Ok("ListMetrics", {{"RecentlyActive", "PT3H"}})["Metrics"].size(), 3u);
  EXPECT_EQ(Error("ListMetrics", {{"NextToken", "garbage"}}), "InvalidParameterValue");
}

TEST_F(CloudWatchTest, ListMetricsPagesOf500) {
  json data = json::array();
  for (int i = 0; i < 1000; ++i) data.push_back({{"MetricName", "m" + std::to_string(1000 + i)}, {"Value", 1}});
  Put(data);
  Put({{{"MetricName", "z"}, {"Value", 1}}});
  json page = Ok("ListMetrics", {{"Namespace", "Custom/Test"}});
  size_t total = page["Metrics"].size();
  EXPECT_EQ(total, 500u);
  int pages = 1;
  while (page.contains("NextToken")) {
    ASSERT_LT(pages, 5);
    page = Ok("ListMetrics", {{"Namespace", "Custom/Test"}, {"NextToken", page["NextToken"]}});
    total += page["Metrics"].size();
    ++pages;
  }
  EXPECT_EQ(total, 1001u);
  EXPECT_EQ(pages, 3);
}

TEST_F(CloudWatchTest, CborRoundTrip) {
  Put({{{"MetricName", "Latency"}, {"Timestamp", kNowSeconds - 60}, {"Value", 4}, {"Unit", "Count"}}});
  aws::CborWriter w;
  w.MapHeader(6);
  w.Text("Namespace");
  w.Text("Custom/Test");
  w.Text("MetricName");
  w.Text("Latency");
  w.Text("StartTime");
  w.Timestamp(kNowSeconds - 600);
  w.Text("EndTime");
  w.Timestamp(kNowSeconds);
  w.Text("Period");
  w.Int(60);
  w.Text("Statistics");
  w.ArrayHeader(1);
  w.Text("Average");
  aws::WireResponse r = cw_->HandleCbor(context_, "GetMetricStatistics", w.bytes());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(*FindHeader(r.headers, "Content-Type"), "application/cbor");
  EXPECT_EQ(*FindHeader(r.headers, "smithy-protocol"), "rpc-v2-cbor");
  auto decoded = aws::DecodeCbor(r.body);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ((*decoded)["Label"], "Latency");
  EXPECT_EQ((*decoded)["Datapoints"][0]["Timestamp"], static_cast<int64_t>(kNowSeconds - 60));
  EXPECT_DOUBLE_EQ((*decoded)["Datapoints"][0]["Average"].get<double>(), 4.0);
  // The timestamp is a tag-1 item.
  EXPECT_NE(r.body.find(std::string("Timestamp\xc1", 10)), std::string::npos);
}

TEST_F(CloudWatchTest, CborErrors) {
  aws::WireResponse bad = cw_->HandleCbor(context_, "GetMetricStatistics", std::string("\xa1\x61", 2));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(*FindHeader(bad.headers, "x-amzn-query-error"), "SerializationException;Sender");
  auto body = aws::DecodeCbor(bad.body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ((*body)["__type"], "SerializationException");
  EXPECT_NE((*body)["message"].get<std::string>().find("not valid CBOR"), std::string::npos);

  aws::CborWriter w;
  w.MapHeader(2);
  w.Text("Namespace");
  w.Text("AWS/SageMaker");
  w.Text("MetricData");
  w.ArrayHeader(1);
  w.MapHeader(2);
  w.Text("MetricName");
  w.Text("m");
  w.Text("Value");
  w.Double(std::nan(""));
  aws::WireResponse aws_ns = cw_->HandleCbor(context_, "PutMetricData", w.bytes());
  EXPECT_EQ(*FindHeader(aws_ns.headers, "x-amzn-query-error"), "InvalidParameterValue;Sender");

  aws::WireResponse unknown = cw_->HandleCbor(context_, "SetAlarmState", "");
  EXPECT_EQ(unknown.status, 404);
  aws::WireResponse not_map = cw_->HandleCbor(context_, "ListMetrics", std::string("\x01", 1));
  EXPECT_EQ(not_map.status, 400);
  aws::WireResponse empty = cw_->HandleCbor(context_, "ListMetrics", "");
  EXPECT_EQ(empty.status, 200);
}

TEST_F(CloudWatchTest, QueryRoundTripAndErrors) {
  auto query = [&](const std::string& form) {
    auto params = aws::ParseQueryForm(form);
    EXPECT_TRUE(params.ok());
    return cw_->HandleQuery(context_, *params);
  };
  aws::WireResponse put = query(
      "Action=PutMetricData&Version=2010-08-01&Namespace=Custom%2FTest&MetricData.member.1.MetricName=Latency"
      "&MetricData.member.1.Value=7&MetricData.member.1.Timestamp=2024-05-01T09%3A58%3A30Z"
      "&MetricData.member.1.Dimensions.member.1.Name=Host&MetricData.member.1.Dimensions.member.1.Value=a");
  EXPECT_EQ(put.status, 200) << put.body;
  EXPECT_NE(put.body.find("<PutMetricDataResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\">"),
            std::string::npos);
  aws::WireResponse stats = query(
      "Action=GetMetricStatistics&Version=2010-08-01&Namespace=Custom%2FTest&MetricName=Latency"
      "&StartTime=2024-05-01T09%3A50%3A00Z&EndTime=2024-05-01T10%3A00%3A00Z&Period=60"
      "&Statistics.member.1=Maximum&Dimensions.member.1.Name=Host&Dimensions.member.1.Value=a");
  EXPECT_EQ(stats.status, 200) << stats.body;
  EXPECT_NE(stats.body.find("<GetMetricStatisticsResult><Datapoints><member>"
                            "<Timestamp>2024-05-01T09:58:00Z</Timestamp><Maximum>7</Maximum><Unit>None</Unit>"
                            "</member></Datapoints><Label>Latency</Label></GetMetricStatisticsResult>"),
            std::string::npos)
      << stats.body;
  aws::WireResponse bad = query(
      "Action=GetMetricStatistics&Version=2010-08-01&Namespace=n&MetricName=m"
      "&StartTime=2024-05-01T09%3A50%3A00Z&EndTime=2024-05-01T10%3A00%3A00Z&Period=sixty"
      "&Statistics.member.1=Maximum");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("<Code>InvalidParameterValue</Code>"), std::string::npos);
  EXPECT_NE(bad.body.find("parameter Period"), std::string::npos);
  EXPECT_NE(query("Version=2010-08-01").body.find("<Code>MissingAction</Code>"), std::string::npos);
  EXPECT_NE(query("Action=SetAlarmState&Version=2010-08-01").body.find("<Code>InvalidAction</Code>"),
            std::string::npos);
  EXPECT_NE(query("Action=ListMetrics&Version=2011-06-15").body.find("<Code>InvalidAction</Code>"), std::string::npos);
  aws::WireResponse list = query("Action=ListMetrics&Version=2010-08-01");
  EXPECT_NE(
      list.body.find("<Metrics><member><Namespace>Custom/Test</Namespace><MetricName>Latency</MetricName>"
                     "<Dimensions><member><Name>Host</Name><Value>a</Value></member></Dimensions></member></Metrics>"),
      std::string::npos)
      << list.body;
}

// DescribeAlarms lists what CloudWatchOptions::alarms gives (Kiln's scaling alarms), filtered
// and paged, in JSON 1.0 and Query.
TEST_F(CloudWatchTest, DescribeAlarmsListsTheGivenAlarms) {
  CloudWatchOptions options;
  options.store = store_.get();
  options.alarms = []() -> Result<std::vector<json>> {
    std::vector<json> out;
    for (const char* name : {"TargetTracking-a-AlarmHigh-1", "TargetTracking-a-AlarmLow-1", "Other"}) {
      out.push_back({{"AlarmName", name},
                     {"AlarmArn", std::string("arn:aws:cloudwatch:us-east-1:000000000000:alarm:") + name},
                     {"StateValue", std::string(name).find("High") != std::string::npos ? "ALARM" : "OK"},
                     {"StateUpdatedTimestamp", 1714557600.0},
                     {"AlarmActions", {"arn:aws:autoscaling:policy"}},
                     {"MetricName", "InvocationsPerInstance"},
                     {"Namespace", "AWS/SageMaker"},
                     {"Statistic", "Sum"},
                     {"Dimensions", {{{"Name", "EndpointName"}, {"Value", "ep"}}}},
                     {"Period", 60},
                     {"EvaluationPeriods", 3},
                     {"Threshold", 4.5},
                     {"ComparisonOperator", "GreaterThanThreshold"}});
    }
    return out;
  };
  CloudWatch cw(options);
  auto service = cw.MakeJsonService();
  auto call = [&](const json& in) {
    aws::WireResponse r = service->Handle(context_, "DescribeAlarms", in.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  };
  EXPECT_EQ(call(json::object())["MetricAlarms"].size(), 3u);
  json prefixed = call({{"AlarmNamePrefix", "TargetTracking-a-"}});
  ASSERT_EQ(prefixed["MetricAlarms"].size(), 2u);
  EXPECT_EQ(prefixed["MetricAlarms"][0]["Threshold"], 4.5);
  EXPECT_EQ(call({{"StateValue", "ALARM"}})["MetricAlarms"].size(), 1u);
  EXPECT_EQ(call({{"AlarmNames", {"Other"}}})["MetricAlarms"].size(), 1u);
  EXPECT_TRUE(call({{"AlarmTypes", {"CompositeAlarm"}}})["MetricAlarms"].empty());
  EXPECT_EQ(call({{"ActionPrefix", "arn:aws:autoscaling:"}})["MetricAlarms"].size(), 3u);
  json first = call({{"MaxRecords", 2}});
  ASSERT_EQ(first["MetricAlarms"].size(), 2u);
  json rest = call({{"MaxRecords", 2}, {"NextToken", first["NextToken"]}});
  ASSERT_EQ(rest["MetricAlarms"].size(), 1u);
  EXPECT_EQ(rest["MetricAlarms"][0]["AlarmName"], "Other");
  EXPECT_FALSE(rest.contains("NextToken"));
  aws::WireResponse mixed =
      service->Handle(context_, "DescribeAlarms", json{{"AlarmNames", {"x"}}, {"AlarmNamePrefix", "x"}}.dump());
  EXPECT_EQ(mixed.status, 400);

  auto params = aws::ParseQueryForm("Action=DescribeAlarms&Version=2010-08-01&AlarmNames.member.1=Other");
  ASSERT_TRUE(params.ok());
  aws::WireResponse xml = cw.HandleQuery(context_, *params);
  EXPECT_EQ(xml.status, 200) << xml.body;
  EXPECT_NE(xml.body.find("<AlarmName>Other</AlarmName>"), std::string::npos) << xml.body;
  EXPECT_NE(xml.body.find("<Threshold>4.5</Threshold>"), std::string::npos) << xml.body;
}

// PutMetricAlarm / DeleteAlarms keep metric alarms in the database (for the autoscaler's step
// policies); DescribeAlarms lists them with their state.
TEST_F(CloudWatchTest, PutDescribeAndDeleteMetricAlarms) {
  CloudWatchOptions options;
  options.store = store_.get();
  options.alarm_database = db_.get();
  options.alarm_arn_prefix = "arn:aws:cloudwatch:us-east-1:000000000000:alarm:";
  options.now_millis = [this] { return now_; };
  CloudWatch cw(options);
  auto service = cw.MakeJsonService();
  auto call = [&](const std::string& op, const json& in) {
    aws::WireResponse r = service->Handle(context_, op, in.dump());
    return std::make_pair(r.status, json::parse(r.body));
  };
  json alarm = json::parse(R"({"AlarmName": "backlog", "Namespace": "AWS/SageMaker",
      "MetricName": "HasBacklogWithoutCapacity", "Dimensions": [{"Name": "EndpointName", "Value": "ep"}],
      "Statistic": "Average", "Period": 60, "EvaluationPeriods": 2, "Threshold": 1,
      "ComparisonOperator": "GreaterThanOrEqualToThreshold", "AlarmActions": ["arn:policy"],
      "Tags": [{"Key": "k", "Value": "v"}]})");
  EXPECT_EQ(call("PutMetricAlarm", alarm).first, 200);
  auto [status, described] = call("DescribeAlarms", json::object());
  ASSERT_EQ(status, 200);
  ASSERT_EQ(described["MetricAlarms"].size(), 1u);
  const json& a = described["MetricAlarms"][0];
  EXPECT_EQ(a["AlarmArn"], "arn:aws:cloudwatch:us-east-1:000000000000:alarm:backlog");
  EXPECT_EQ(a["StateValue"], "INSUFFICIENT_DATA");
  EXPECT_EQ(a["AlarmActions"], json::array({"arn:policy"}));
  EXPECT_FALSE(a.contains("Tags"));
  EXPECT_FALSE(a.contains("UpdatedMillis"));

  json math = alarm;
  math.erase("MetricName");
  math["Metrics"] = json::parse(R"([{"Id": "m1", "Expression": "1"}])");
  EXPECT_EQ(call("PutMetricAlarm", math).second["__type"], "InvalidParameterValue");
  json band = alarm;
  band["ComparisonOperator"] = "LessThanLowerThreshold";
  EXPECT_EQ(call("PutMetricAlarm", band).second["__type"], "InvalidParameterValue");
  json missing = alarm;
  missing.erase("Statistic");
  EXPECT_EQ(call("PutMetricAlarm", missing).second["__type"], "MissingParameter");
  json too_many = alarm;
  too_many["DatapointsToAlarm"] = 3;
  EXPECT_EQ(call("PutMetricAlarm", too_many).second["__type"], "InvalidParameterCombination");

  EXPECT_EQ(call("DeleteAlarms", {{"AlarmNames", {"backlog", "nope"}}}).second["__type"], "ResourceNotFound");
  EXPECT_EQ(call("DeleteAlarms", {{"AlarmNames", {"backlog"}}}).first, 200);
  EXPECT_TRUE(call("DescribeAlarms", json::object()).second["MetricAlarms"].empty());
}

}  // namespace
}  // namespace kiln::api
