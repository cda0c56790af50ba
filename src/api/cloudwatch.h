#pragma once
// CloudWatch metrics (service `monitoring`, API 2010-08-01; spec/control-plane-api.md §13) over
// observe::MetricStore: PutMetricData, GetMetricStatistics, GetMetricData, ListMetrics (and
// DescribeAlarms over CloudWatchOptions::alarms: Kiln's scaling alarms; PutMetricAlarm and
// DeleteAlarms of metric alarms whose actions run step-scaling policies), in the
// three protocols the service model lists, all answering from one set of handlers:
//
//   AWS JSON 1.0        POST /, X-Amz-Target GraniteServiceVersion20100801.<Op>  → MakeJsonService()
//   Smithy RPC v2 CBOR  POST /service/GraniteServiceVersion20100801/operation/<Op> → HandleCbor()
//   AWS Query           POST / (or GET) Action=<Op>&Version=2010-08-01             → HandleQuery()
//
// Every request is decoded to the same JSON form (timestamps as epoch seconds), validated against
// the embedded botocore model (src/api/models/cloudwatch.json, trimmed to these operations) and
// handled once. Errors carry the service's Query error codes (the model's awsQueryCompatible
// codes: InvalidParameterValue, MissingParameter, InvalidParameterCombination, InvalidNextToken,
// InternalServiceError; model constraint violations are ValidationError with AWS's "1 validation
// error detected: ..." text); JSON 1.0 and CBOR answers add `x-amzn-query-error: <Code>;Sender`,
// which is where botocore ≥ 1.3x reads the code from.
//
// The rules beyond the model (AWS behaviour): `AWS/` namespaces are refused; values must be finite
// and within ±2^360 (non-zero magnitudes at least 2^-260); Values ≤ 150 with Counts of the same
// size; Value / Values / StatisticValues are exclusive; StorageResolution 1 or 60; timestamps at
// most two weeks old and two hours ahead; ≤ 1000 data per call. Periods are 1, 5, 10, 20, 30 or a
// multiple of 60, and a multiple of 60 / 300 / 3600 once StartTime is more than 3 hours / 15 days /
// 63 days old; StartTime is rounded down to the minute (5 minutes past 15 days, the hour past 63
// days; to the period for periods under a minute) and periods start there. GetMetricStatistics
// answers at most 1,440 periods; GetMetricData at most 500 queries and MaxDatapoints values per
// page (NextToken continues, results are PartialData until their last page). GetMetricData
// expressions: + - * / over query ids and numbers, parentheses, and SUM/AVG/MIN/MAX of a list
// [a, b, ...] (per timestamp); anything else (SEARCH, METRICS(), other functions) is
// ValidationError "Error in expression <id> [...]".
//
// Thread-safety: const methods only; the MetricStore is thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "api/service_model.h"
#include "aws/errors.h"
#include "aws/request_context.h"
#include "observe/metric_store.h"
#include "store/database.h"

namespace kiln::api {

inline constexpr std::string_view kCloudWatchTargetPrefix = "GraniteServiceVersion20100801";
inline constexpr std::string_view kCloudWatchSigningName = "monitoring";
inline constexpr std::string_view kCloudWatchXmlns = "http://monitoring.amazonaws.com/doc/2010-08-01/";
// Smithy RPC v2 paths: kCloudWatchCborPathPrefix + <Operation>.
inline constexpr std::string_view kCloudWatchCborPathPrefix = "/service/GraniteServiceVersion20100801/operation/";

struct CloudWatchOptions {
  observe::MetricStore* store = nullptr;  // not owned; must outlive the CloudWatch
  // The clock the time rules are checked against (tests pin it). Null: base::NowMillis.
  std::function<int64_t()> now_millis;
  // Largest GetMetricData MaxDatapoints and its default (AWS: 100,800).
  int64_t max_datapoints = 100800;
  // DescribeAlarms: every alarm there is, as MetricAlarm structures (JSON form, timestamps as
  // epoch seconds), e.g. the scaling alarms of api/autoscaling.h. Null: no alarms.
  std::function<Result<std::vector<nlohmann::json>>()> alarms;
  // PutMetricAlarm / DeleteAlarms keep metric alarms here (store/autoscaling_repository.h, kind
  // alarm; control/autoscaler.h evaluates them and runs the step-scaling policies their
  // AlarmActions name); DescribeAlarms lists them after `alarms`. Null: those operations answer
  // InvalidAction. `alarm_arn_prefix`: "arn:aws:cloudwatch:<region>:<account>:alarm:".
  store::Database* alarm_database = nullptr;
  std::string alarm_arn_prefix;
};

class CloudWatch {
 public:
  explicit CloudWatch(CloudWatchOptions options);

  // The embedded CloudWatch model, parsed once (never null; a parse failure aborts: build defect).
  static std::shared_ptr<const ServiceModel> Model();
  // Its raw JSON (for the shape-driven codecs).
  static const nlohmann::json& ModelJson();

  // Whether `operation` is one Kiln serves (the four above).
  static bool Serves(std::string_view operation);

  // Validates `input` (JSON form) against the model and runs the operation. Unknown operations
  // answer InvalidAction (Query's code for it).
  JsonOutcome Call(const aws::RequestContext& context, std::string_view operation, const nlohmann::json& input) const;

  // A JSON 1.0 service for the front door; its handlers call Call(). `this` must outlive it.
  std::unique_ptr<JsonService> MakeJsonService() const;

  // RPC v2 CBOR: `body` is the request's CBOR map (empty = no members). Malformed CBOR, or a body
  // that is not a map → SerializationException (400); the answer is CBOR (Content-Type
  // application/cbor, smithy-protocol: rpc-v2-cbor); errors are {__type, message} maps.
  aws::WireResponse HandleCbor(const aws::RequestContext& context, std::string_view operation,
                               std::string_view body) const;

  // Query: `params` are the decoded query-string and form parameters (Action, Version, ...).
  // Missing Action → MissingAction; another Version than 2010-08-01 → InvalidAction; badly typed
  // parameters → InvalidParameterValue naming the parameter. Answers XML in the monitoring
  // namespace.
  aws::WireResponse HandleQuery(const aws::RequestContext& context,
                                const std::map<std::string, std::string>& params) const;

 private:
  int64_t Now() const;
  JsonOutcome PutMetricData(const nlohmann::json& in) const;
  JsonOutcome GetMetricStatistics(const nlohmann::json& in) const;
  JsonOutcome GetMetricData(const nlohmann::json& in) const;
  JsonOutcome ListMetrics(const nlohmann::json& in) const;
  JsonOutcome DescribeAlarms(const nlohmann::json& in) const;
  JsonOutcome PutMetricAlarm(const nlohmann::json& in) const;
  JsonOutcome DeleteAlarms(const nlohmann::json& in) const;

  CloudWatchOptions options_;
};

// Embedded model text (src/api/models/cloudwatch.json).
std::string_view EmbeddedCloudWatchModelJson();

}  // namespace kiln::api
