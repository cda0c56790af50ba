#include "aws/query_codec.h"

#include <gtest/gtest.h>

namespace kiln::aws {
namespace {

const nlohmann::json& Shapes() {
  static const nlohmann::json shapes = nlohmann::json::parse(R"({
    "In": {"type": "structure", "members": {
      "Namespace": {"shape": "S"}, "Period": {"shape": "I"}, "Start": {"shape": "Ts"}, "Flag": {"shape": "B"},
      "Dimensions": {"shape": "Dims"}, "Values": {"shape": "Ds"}, "Tags": {"shape": "M"}, "Named": {"shape": "S", "locationName": "Other"}}},
    "S": {"type": "string"}, "I": {"type": "integer"}, "Ts": {"type": "timestamp"}, "B": {"type": "boolean"},
    "D": {"type": "double"},
    "Dims": {"type": "list", "member": {"shape": "Dim"}},
    "Dim": {"type": "structure", "members": {"Name": {"shape": "S"}, "Value": {"shape": "S"}}, "xmlOrder": ["Name", "Value"]},
    "Ds": {"type": "list", "member": {"shape": "D"}},
    "M": {"type": "map", "key": {"shape": "S"}, "value": {"shape": "D"}}})");
  return shapes;
}

nlohmann::json DecodeForm(std::string_view form) {
  auto params = ParseQueryForm(form);
  EXPECT_TRUE(params.ok()) << params.status().message();
  if (!params.ok()) return nullptr;
  auto decoded = DecodeQueryInput(Shapes(), "In", *params);
  EXPECT_TRUE(decoded.ok()) << decoded.status().message();
  return decoded.ok() ? *decoded : nlohmann::json(nullptr);
}

std::string DecodeFormError(std::string_view form) {
  auto params = ParseQueryForm(form);
  if (!params.ok()) return params.status().message();
  auto decoded = DecodeQueryInput(Shapes(), "In", *params);
  EXPECT_FALSE(decoded.ok());
  return decoded.ok() ? "" : decoded.status().message();
}

TEST(QueryCodecTest, ParseForm) {
  auto params = ParseQueryForm("Action=GetMetricStatistics&Version=2010-08-01&A=x+y%2Fz&&Empty=&Bare");
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(params->at("A"), "x y/z");
  EXPECT_EQ(params->at("Empty"), "");
  EXPECT_EQ(params->at("Bare"), "");
  EXPECT_EQ(params->size(), 5u);
  EXPECT_FALSE(ParseQueryForm("A=%zz").ok());
  EXPECT_FALSE(ParseQueryForm("%=1").ok());
}

TEST(QueryCodecTest, DecodesStructuresListsMapsAndScalars) {
  nlohmann::json in = DecodeForm(
      "Namespace=ns&Period=60&Start=2024-05-01T10%3A00%3A00.250000Z&Flag=true&Other=o"
      "&Dimensions.member.2.Name=b&Dimensions.member.2.Value=2&Dimensions.member.1.Name=a&Dimensions.member.1.Value=1"
      "&Dimensions.member.10.Name=c&Dimensions.member.10.Value=10"
      "&Values.member.1=1.5&Values.member.2=-2&Tags.entry.1.key=k&Tags.entry.1.value=3&Ignored=1");
  EXPECT_EQ(in["Namespace"], "ns");
  EXPECT_EQ(in["Period"], 60);
  EXPECT_DOUBLE_EQ(in["Start"].get<double>(), 1714557600.25);
  EXPECT_EQ(in["Flag"], true);
  EXPECT_EQ(in["Named"], "o");
  ASSERT_EQ(in["Dimensions"].size(), 3u);
  EXPECT_EQ(in["Dimensions"][0], nlohmann::json({{"Name", "a"}, {"Value", "1"}}));
  EXPECT_EQ(in["Dimensions"][1]["Name"], "b");
  EXPECT_EQ(in["Dimensions"][2]["Name"], "c");  // numeric order: 10 after 2
  EXPECT_EQ(in["Values"], nlohmann::json({1.5, -2.0}));
  EXPECT_EQ(in["Tags"], nlohmann::json({{"k", 3.0}}));
  EXPECT_FALSE(in.contains("Ignored"));
}

TEST(QueryCodecTest, EmptyListAndEpochTimestamp) {
  nlohmann::json in = DecodeForm("Dimensions=&Start=1714557600");
  EXPECT_EQ(in["Dimensions"], nlohmann::json::array());
  EXPECT_EQ(in["Start"], 1714557600.0);
}

TEST(QueryCodecTest, BadValuesNameTheParameter) {
  EXPECT_NE(DecodeFormError("Period=abc").find("The value abc for parameter Period is invalid"), std::string::npos);
  EXPECT_NE(DecodeFormError("Flag=yes").find("parameter Flag"), std::string::npos);
  EXPECT_NE(DecodeFormError("Start=yesterday").find("ISO-8601"), std::string::npos);
  EXPECT_NE(DecodeFormError("Values.member.1=1x").find("Values.member.1"), std::string::npos);
  EXPECT_NE(DecodeFormError("Dimensions.member.0.Name=a").find("list index"), std::string::npos);
  EXPECT_NE(DecodeFormError("Dimensions.member.x.Name=a").find("list index"), std::string::npos);
  EXPECT_NE(DecodeFormError("Dimensions=notalist").find("a list"), std::string::npos);
}

TEST(QueryCodecTest, EncodesXmlInShapeOrder) {
  nlohmann::json shapes = nlohmann::json::parse(R"({
    "Out": {"type": "structure", "members": {"Label": {"shape": "S"}, "Points": {"shape": "Ps"}}},
    "Ps": {"type": "list", "member": {"shape": "P"}},
    "P": {"type": "structure", "members": {"Timestamp": {"shape": "Ts"}, "Average": {"shape": "D"}, "Ext": {"shape": "M"}},
          "xmlOrder": ["Timestamp", "Average", "Ext"]},
    "S": {"type": "string"}, "Ts": {"type": "timestamp"}, "D": {"type": "double"},
    "M": {"type": "map", "key": {"shape": "S"}, "value": {"shape": "D"}}})");
  nlohmann::json value = {
      {"Label", "a<b"},
      {"Points",
       {{{"Average", 0.1}, {"Timestamp", 1714557600}, {"Ext", {{"p99", 2}}}}, {{"Timestamp", 1714557600.5}}}}};
  EXPECT_EQ(EncodeQueryXml(shapes, "Out", value),
            "<Label>a&lt;b</Label><Points>"
            "<member><Timestamp>2024-05-01T10:00:00Z</Timestamp><Average>0.1</Average>"
            "<Ext><entry><key>p99</key><value>2</value></entry></Ext></member>"
            "<member><Timestamp>2024-05-01T10:00:00.500Z</Timestamp></member></Points>");
}

TEST(QueryCodecTest, ResponseAndErrorEnvelopes) {
  WireResponse ok =
      QueryResponse("ListMetrics", "http://monitoring.amazonaws.com/doc/2010-08-01/", true, "<Metrics/>", "req-1");
  EXPECT_EQ(ok.body,
            "<ListMetricsResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\"><ListMetricsResult>"
            "<Metrics/></ListMetricsResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata>"
            "</ListMetricsResponse>\n");
  WireResponse empty = QueryResponse("PutMetricData", "ns", false, "", "req-2");
  EXPECT_EQ(empty.body.find("Result"), std::string::npos);
  WireResponse error = QueryError("ns", AwsError("InvalidParameterValue", "bad & worse"), "req-3");
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.body,
            "<ErrorResponse xmlns=\"ns\"><Error><Type>Sender</Type><Code>InvalidParameterValue</Code>"
            "<Message>bad &amp; worse</Message></Error><RequestId>req-3</RequestId></ErrorResponse>\n");
}

}  // namespace
}  // namespace kiln::aws
