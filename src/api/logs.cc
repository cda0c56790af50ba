#include "api/logs.h"

#include <functional>
#include <optional>
#include <utility>

#include "api/errors.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using observe::LogStore;

aws::AwsError InvalidParameter(std::string message) {
  return aws::AwsError("InvalidParameterException", std::move(message));
}

std::string ConstraintMessage(const std::string& value, const std::string& member, const std::string& constraint) {
  return "1 validation error detected: Value '" + value + "' at '" + member +
         "' failed to satisfy constraint: Member must " + constraint;
}

// Reads the members of a request, remembering the first problem so that a handler can check
// once after reading everything it needs.
class Input {
 public:
  explicit Input(const json& j) : j_(j) {}
  const std::optional<aws::AwsError>& error() const { return error_; }

  std::optional<std::string> String(const std::string& name, bool required = false) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) {
      if (required)
        Fail(InvalidParameter("1 validation error detected: Value null at '" + name +
                              "' failed to satisfy constraint: Member must not be null"));
      return std::nullopt;
    }
    if (!it->is_string()) {
      Fail(aws::AwsError("SerializationException", "Expected a string for " + name));
      return std::nullopt;
    }
    return it->get<std::string>();
  }
  std::optional<int64_t> Int(const std::string& name) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer()) {
      Fail(aws::AwsError("SerializationException", "Expected an integer for " + name));
      return std::nullopt;
    }
    return it->get<int64_t>();
  }
  bool Bool(const std::string& name, bool fallback) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      Fail(aws::AwsError("SerializationException", "Expected a boolean for " + name));
      return fallback;
    }
    return it->get<bool>();
  }
  std::optional<int> Limit(const std::string& name, int64_t min, int64_t max) {
    auto v = Int(name);
    if (!v) return std::nullopt;
    if (*v < min || *v > max) {
      Fail(InvalidParameter(ConstraintMessage(std::to_string(*v), name,
                                              *v < min ? "have value greater than or equal to " + std::to_string(min)
                                                       : "have value less than or equal to " + std::to_string(max))));
      return std::nullopt;
    }
    return static_cast<int>(*v);
  }
  void GroupName(const std::string& name, const std::string& member) {
    if (name.empty() || name.size() > 512) {
      Fail(InvalidParameter(ConstraintMessage(name, member, "have length between 1 and 512")));
      return;
    }
    for (char c : name) {
      bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                c == '_' || c == '/' || c == '#';
      if (!ok) {
        Fail(InvalidParameter(
            ConstraintMessage(name, member, "satisfy regular expression pattern: [\\.\\-_/#A-Za-z0-9]+")));
        return;
      }
    }
  }
  void StreamName(const std::string& name, const std::string& member) {
    if (name.empty() || name.size() > 512) {
      Fail(InvalidParameter(ConstraintMessage(name, member, "have length between 1 and 512")));
    } else if (name.find_first_of(":*") != std::string::npos) {
      Fail(InvalidParameter(ConstraintMessage(name, member, "satisfy regular expression pattern: [^:*]*")));
    }
  }
  void Token(const std::optional<std::string>& token, const std::string& member) {
    if (token && token->empty())
      Fail(InvalidParameter(ConstraintMessage("", member, "have length greater than or equal to 1")));
  }
  // logGroupName, or logGroupIdentifier (a name or an ARN, with or without ":*"); exactly one.
  std::string Group(bool required = true) {
    auto name = String("logGroupName");
    auto identifier = String("logGroupIdentifier");
    if (name && identifier) {
      Fail(InvalidParameter("LogGroup name and LogGroup ARN are mutually exclusive parameters."));
      return "";
    }
    if (identifier) {
      std::string id = *identifier;
      if (id.rfind("arn:", 0) == 0) {
        size_t pos = id.find(":log-group:");
        if (pos == std::string::npos) {
          Fail(InvalidParameter("Invalid logGroupIdentifier: " + id));
          return "";
        }
        id = id.substr(pos + 11);
        if (id.size() >= 2 && id.compare(id.size() - 2, 2, ":*") == 0) id.resize(id.size() - 2);
      }
      GroupName(id, "logGroupIdentifier");
      return id;
    }
    if (!name) {
      if (required) Fail(InvalidParameter("Should provide either logGroupName or logGroupIdentifier."));
      return "";
    }
    GroupName(*name, "logGroupName");
    return *name;
  }
  void Fail(aws::AwsError e) {
    if (!error_) error_ = std::move(e);
  }

 private:
  const json& j_;
  std::optional<aws::AwsError> error_;
};

struct Context {
  LogStore* store;  // not owned
  std::string account_id;
  std::string region;

  std::string GroupArn(const aws::RequestContext& rc, const std::string& group) const {
    return "arn:aws:logs:" + (rc.region.empty() ? region : rc.region) + ":" +
           (rc.account_id.empty() ? account_id : rc.account_id) + ":log-group:" + group;
  }
};

// logGroupName and logStreamName, both required and valid; nullopt when `input` has recorded a
// problem with either (Create/DeleteLogStream, PutLogEvents).
struct GroupAndStream {
  std::string group;
  std::string stream;
};

std::optional<GroupAndStream> ReadGroupAndStream(Input& input) {
  auto group = input.String("logGroupName", true);
  auto stream = input.String("logStreamName", true);
  if (group) input.GroupName(*group, "logGroupName");
  if (stream) input.StreamName(*stream, "logStreamName");
  if (input.error()) return std::nullopt;
  return GroupAndStream{std::move(*group), std::move(*stream)};
}

// Create/DeleteLogGroup: `apply` to the checked logGroupName; an empty answer.
JsonOutcome OnGroup(const json& in, const std::function<Status(const std::string& group)>& apply) {
  Input input(in);
  auto name = input.String("logGroupName", true);
  if (name) input.GroupName(*name, "logGroupName");
  if (input.error()) return *input.error();
  Status s = apply(*name);
  if (!s.ok()) return AwsErrorFromStatus(s, ErrorService::kLogs);
  return json::object();
}

// Create/DeleteLogStream: `apply` to the checked names; an empty answer.
JsonOutcome OnStream(const json& in,
                     const std::function<Status(const std::string& group, const std::string& stream)>& apply) {
  Input input(in);
  std::optional<GroupAndStream> names = ReadGroupAndStream(input);
  if (!names) return *input.error();
  Status s = apply(names->group, names->stream);
  if (!s.ok()) return AwsErrorFromStatus(s, ErrorService::kLogs);
  return json::object();
}

JsonOutcome PutLogEvents(const Context& ctx, const aws::RequestContext&, const json& in) {
  Input input(in);
  std::optional<GroupAndStream> names = ReadGroupAndStream(input);
  if (!names) return *input.error();
  auto it = in.find("logEvents");
  if (it == in.end() || it->is_null()) {
    return InvalidParameter(
        "1 validation error detected: Value null at 'logEvents' failed to satisfy constraint: Member must not be "
        "null");
  }
  if (!it->is_array()) return aws::AwsError("SerializationException", "Expected a list for logEvents");
  if (it->empty() || it->size() > observe::kMaxBatchEvents) {
    return InvalidParameter(ConstraintMessage("[...]", "logEvents", "have length between 1 and 10000"));
  }
  std::vector<observe::InputEvent> events;
  events.reserve(it->size());
  for (const json& e : *it) {
    if (!e.is_object()) return aws::AwsError("SerializationException", "Expected an object in logEvents");
    Input event(e);
    auto ts = event.Int("timestamp");
    auto message = event.String("message");
    if (event.error()) return *event.error();
    if (!ts || !message) {
      return InvalidParameter(std::string("1 validation error detected: Value null at 'logEvents.member.") +
                              (ts ? "message" : "timestamp") +
                              "' failed to satisfy constraint: Member must not be null");
    }
    events.push_back({*ts, std::move(*message)});
  }
  auto count = ctx.store->Append(names->group, names->stream, events);
  if (!count.ok()) return AwsErrorFromStatus(count.status(), ErrorService::kLogs);
  // AWS's sequence tokens are long decimal strings; they are ignored by PutLogEvents since 2023.
  std::string token = std::to_string(*count);
  token.insert(0, token.size() < 56 ? 56 - token.size() : 0, '0');
  token[0] = '4';
  return json{{"nextSequenceToken", token}};
}

JsonOutcome DescribeLogGroups(const Context& ctx, const aws::RequestContext& rc, const json& in) {
  Input input(in);
  std::string prefix = input.String("logGroupNamePrefix").value_or("");
  std::string pattern = input.String("logGroupNamePattern").value_or("");
  auto limit = input.Limit("limit", 1, 50);
  auto token = input.String("nextToken");
  input.Token(token, "nextToken");
  if (!prefix.empty()) input.GroupName(prefix, "logGroupNamePrefix");
  if (input.error()) return *input.error();
  auto page = ctx.store->ListGroups(prefix, pattern, limit.value_or(50), token.value_or(""));
  if (!page.ok()) return AwsErrorFromStatus(page.status(), ErrorService::kLogs);
  json groups = json::array();
  for (const auto& g : page->groups) {
    std::string arn = ctx.GroupArn(rc, g.name);
    groups.push_back({{"logGroupName", g.name},
                      {"creationTime", g.creation_time},
                      {"metricFilterCount", 0},
                      {"arn", arn + ":*"},
                      {"logGroupArn", arn},
                      {"storedBytes", g.stored_bytes},
                      {"logGroupClass", "STANDARD"}});
  }
  json out = {{"logGroups", groups}};
  if (!page->next_token.empty()) out["nextToken"] = page->next_token;
  return out;
}

JsonOutcome DescribeLogStreams(const Context& ctx, const aws::RequestContext& rc, const json& in) {
  Input input(in);
  std::string group = input.Group();
  std::string prefix = input.String("logStreamNamePrefix").value_or("");
  auto order_by = input.String("orderBy").value_or("LogStreamName");
  bool descending = input.Bool("descending", false);
  auto limit = input.Limit("limit", 1, 50);
  auto token = input.String("nextToken");
  input.Token(token, "nextToken");
  if (!prefix.empty()) input.StreamName(prefix, "logStreamNamePrefix");
  if (order_by != "LogStreamName" && order_by != "LastEventTime") {
    input.Fail(InvalidParameter(
        ConstraintMessage(order_by, "orderBy", "satisfy enum value set: [LogStreamName, LastEventTime]")));
  }
  if (input.error()) return *input.error();
  auto order =
      order_by == "LastEventTime" ? observe::StreamOrder::kLastEventTime : observe::StreamOrder::kLogStreamName;
  auto page = ctx.store->ListStreams(group, prefix, order, descending, limit.value_or(50), token.value_or(""));
  if (!page.ok()) return AwsErrorFromStatus(page.status(), ErrorService::kLogs);
  json streams = json::array();
  std::string group_arn = ctx.GroupArn(rc, group);
  for (const auto& s : page->streams) {
    json j = {{"logStreamName", s.name},
              {"creationTime", s.creation_time},
              {"arn", group_arn + ":log-stream:" + s.name},
              {"storedBytes", 0}};
    if (s.first_event_timestamp) j["firstEventTimestamp"] = *s.first_event_timestamp;
    if (s.last_event_timestamp) j["lastEventTimestamp"] = *s.last_event_timestamp;
    if (s.last_ingestion_time) j["lastIngestionTime"] = *s.last_ingestion_time;
    streams.push_back(std::move(j));
  }
  json out = {{"logStreams", streams}};
  if (!page->next_token.empty()) out["nextToken"] = page->next_token;
  return out;
}

JsonOutcome GetLogEvents(const Context& ctx, const aws::RequestContext&, const json& in) {
  Input input(in);
  std::string group = input.Group();
  auto stream = input.String("logStreamName", true);
  if (stream) input.StreamName(*stream, "logStreamName");
  observe::EventsQuery query;
  query.start_time = input.Int("startTime");
  query.end_time = input.Int("endTime");
  query.limit = input.Limit("limit", 1, observe::kMaxEventsLimit);
  query.start_from_head = input.Bool("startFromHead", false);
  auto token = input.String("nextToken");
  input.Token(token, "nextToken");
  input.Bool("unmask", false);
  if (input.error()) return *input.error();
  query.token = token.value_or("");
  auto page = ctx.store->GetEvents(group, *stream, query);
  if (!page.ok()) return AwsErrorFromStatus(page.status(), ErrorService::kLogs);
  json events = json::array();
  for (const auto& e : page->events) {
    events.push_back({{"timestamp", e.timestamp}, {"message", e.message}, {"ingestionTime", e.ingestion_time}});
  }
  return json{{"events", events},
              {"nextForwardToken", page->next_forward_token},
              {"nextBackwardToken", page->next_backward_token}};
}

JsonOutcome FilterLogEvents(const Context& ctx, const aws::RequestContext&, const json& in) {
  Input input(in);
  std::string group = input.Group();
  observe::FilterQuery query;
  auto names = in.find("logStreamNames");
  if (names != in.end() && !names->is_null()) {
    if (!names->is_array()) return aws::AwsError("SerializationException", "Expected a list for logStreamNames");
    if (names->empty() || names->size() > 100) {
      input.Fail(InvalidParameter(ConstraintMessage("[...]", "logStreamNames", "have length between 1 and 100")));
    }
    for (const json& n : *names) {
      if (!n.is_string()) return aws::AwsError("SerializationException", "Expected strings in logStreamNames");
      input.StreamName(n.get<std::string>(), "logStreamNames.member");
      query.stream_names.push_back(n.get<std::string>());
    }
  }
  auto prefix = input.String("logStreamNamePrefix");
  if (prefix) {
    input.StreamName(*prefix, "logStreamNamePrefix");
    query.stream_name_prefix = *prefix;
  }
  if (prefix && names != in.end() && !names->is_null()) {
    input.Fail(InvalidParameter("logStreamNames and logStreamNamePrefix are mutually exclusive parameters."));
  }
  query.start_time = input.Int("startTime");
  query.end_time = input.Int("endTime");
  query.pattern = input.String("filterPattern").value_or("");
  if (query.pattern.size() > 1024) {
    input.Fail(
        InvalidParameter(ConstraintMessage(query.pattern, "filterPattern", "have length less than or equal to 1024")));
  }
  query.limit = input.Limit("limit", 1, observe::kMaxEventsLimit);
  auto token = input.String("nextToken");
  input.Token(token, "nextToken");
  input.Bool("interleaved", true);
  input.Bool("unmask", false);
  if (input.error()) return *input.error();
  query.token = token.value_or("");
  auto page = ctx.store->Filter(group, query);
  if (!page.ok()) return AwsErrorFromStatus(page.status(), ErrorService::kLogs);
  json events = json::array();
  for (const auto& e : page->events) {
    events.push_back({{"logStreamName", e.stream_name},
                      {"timestamp", e.timestamp},
                      {"message", e.message},
                      {"ingestionTime", e.ingestion_time},
                      {"eventId", e.event_id}});
  }
  json searched = json::array();
  for (const auto& s : page->searched_streams) searched.push_back({{"logStreamName", s}, {"searchedCompletely", true}});
  json out = {{"events", events}, {"searchedLogStreams", searched}};
  if (!page->next_token.empty()) out["nextToken"] = page->next_token;
  return out;
}

void Register(JsonService* service, std::shared_ptr<Context> ctx) {
  service->Register("CreateLogGroup", [ctx](const aws::RequestContext&, const json& in) {
    return OnGroup(in, [&](const std::string& group) { return ctx->store->CreateGroup(group); });
  });
  service->Register("DeleteLogGroup", [ctx](const aws::RequestContext&, const json& in) {
    return OnGroup(in, [&](const std::string& group) { return ctx->store->DeleteGroup(group); });
  });
  service->Register("CreateLogStream", [ctx](const aws::RequestContext&, const json& in) {
    return OnStream(in, [&](const std::string& group, const std::string& stream) {
      return ctx->store->CreateStream(group, stream);
    });
  });
  service->Register("DeleteLogStream", [ctx](const aws::RequestContext&, const json& in) {
    return OnStream(in, [&](const std::string& group, const std::string& stream) {
      return ctx->store->DeleteStream(group, stream);
    });
  });
  using Operation = JsonOutcome (*)(const Context&, const aws::RequestContext&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"PutLogEvents", PutLogEvents},
                          {"DescribeLogGroups", DescribeLogGroups},
                          {"DescribeLogStreams", DescribeLogStreams},
                          {"GetLogEvents", GetLogEvents},
                          {"FilterLogEvents", FilterLogEvents}}) {
    // `op = op`: clang before 16 cannot capture a structured binding by name.
    service->Register(name, [ctx, op = op](const aws::RequestContext& rc, const json& in) { return op(*ctx, rc, in); });
  }
}

}  // namespace

void RegisterLogsOperations(JsonService* service, observe::LogStore* store, const std::string& account_id,
                            const std::string& region) {
  Register(service, std::make_shared<Context>(Context{store, account_id, region}));
}

}  // namespace kiln::api
