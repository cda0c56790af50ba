// OpenHttpEngine (engine.h): the Docker Engine API v1.41 over a Unix socket, through EngineClient
// (engine_client.h). Written against Docker's documented API and checked against Podman 4.3's
// compatible socket; where the two differ the differences are handled here and said where.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "base/encoding.h"
#include "base/json_parse.h"
#include "base/time.h"
#include "runtime/docker/engine.h"
#include "runtime/docker/engine_client.h"

namespace kiln::runtime::docker {
namespace {

using nlohmann::json;

// Lines longer than this reach ContainerLogs' callback in pieces (engine.h).
constexpr size_t kMaxLogLine = 256 * 1024;
// One pull progress message is a few hundred bytes; an object larger than this is not one.
constexpr size_t kMaxPullMessage = 1u << 20;

// Percent-encodes a path part (container id or name, image reference), keeping what real names
// hold and RFC 3986 allows in a path unencoded: '/' (repository paths; the engines' routes match
// `{name:.*}`), ':' (tags, ports) and '@' (digests).
std::string EncodePath(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/' || c == ':' || c == '@') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// --- Reading the engine's JSON without exceptions (a field of an unexpected type reads as absent).

std::string Str(const json& object, const char* key) {
  if (!object.is_object()) {
    return "";
  }
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t Int(const json& object, const char* key) {
  if (!object.is_object()) {
    return 0;
  }
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) {
    return 0;
  }
  return it->is_number_float() ? static_cast<int64_t>(it->get<double>()) : it->get<int64_t>();
}

bool Bool(const json& object, const char* key) {
  if (!object.is_object()) {
    return false;
  }
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

const json& Member(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) {
    return kNull;
  }
  auto it = object.find(key);
  return it != object.end() ? *it : kNull;
}

// A list of strings; a plain string (old Dockerfiles' shell-form Entrypoint) is a list of one.
std::vector<std::string> StrList(const json& object, const char* key) {
  const json& value = Member(object, key);
  std::vector<std::string> out;
  if (value.is_string()) {
    out.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const json& item : value) {
      if (item.is_string()) {
        out.push_back(item.get<std::string>());
      }
    }
  }
  return out;
}

std::map<std::string, std::string> StrMap(const json& object, const char* key) {
  const json& value = Member(object, key);
  std::map<std::string, std::string> out;
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it.value().is_string()) {
        out[it.key()] = it.value().get<std::string>();
      }
    }
  }
  return out;
}

// The engines' times: RFC 3339 with nanoseconds (Docker) or whole seconds (Podman 4.3);
// "0001-01-01T00:00:00Z" (Go's zero time) means never, as does anything unreadable.
int64_t EngineMillis(const std::string& text) {
  if (text.empty() || text.rfind("0001-01-01", 0) == 0) {
    return 0;
  }
  return ParseIso8601(text).value_or(0);
}

std::string WithoutSlash(std::string name) {
  if (!name.empty() && name[0] == '/') {
    name.erase(0, 1);
  }
  return name;
}

// The engine's own words from an error body: {"message": "..."} (both engines), else the text.
std::string EngineMessage(const std::string& body) {
  auto doc = ParseJsonBounded(body);
  if (doc.ok()) {
    std::string message = Str(*doc, "message");
    if (!message.empty()) {
      return message;
    }
  }
  std::string text = body.substr(0, 1024);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.pop_back();
  }
  return text.empty() ? "(no message)" : text;
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool Contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// A failed pull as the registry explained it (engine.h, PullImage). "Not found" first: Docker
// Hub answers a missing repository with "pull access denied ..., repository does not exist or may
// require 'docker login': denied: ...", which is about a name, not credentials.
Status PullFailure(const std::string& message) {
  std::string lower = Lower(message);
  if (Contains(lower, "not found") || Contains(lower, "manifest unknown") || Contains(lower, "does not exist") ||
      Contains(lower, "name unknown") || Contains(lower, "no such image")) {
    return Status::NotFound(message);
  }
  if (Contains(lower, "unauthorized") || Contains(lower, "authentication required") || Contains(lower, "denied")) {
    return Status::PermissionDenied(message);
  }
  return Status::Internal(message);
}

// --- Pull progress: JSON objects one after the other (one per line on both engines; nothing here
// relies on the newlines). Splits them by tracking brace depth outside strings.
class JsonObjectSplitter {
 public:
  // Calls `on_object` with the text of each complete top-level object.
  Status Feed(std::string_view data, const std::function<Status(std::string_view)>& on_object) {
    for (char c : data) {
      if (depth_ == 0) {
        if (c != '{') {
          continue;  // whitespace between objects
        }
        current_.clear();
      }
      current_.push_back(c);
      if (current_.size() > kMaxPullMessage) {
        return Status::Internal("the container engine sent a pull progress message over 1 MiB");
      }
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (--depth_ == 0) {
          RETURN_IF_ERROR(on_object(current_));
          current_.clear();
        }
      }
    }
    return Status::Ok();
  }

 private:
  std::string current_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

// --- Logs: the body of GET /containers/{id}/logs?timestamps=1.
//
// Without a TTY both engines multiplex: frames of an 8-byte header (stream byte 0 stdin / 1 stdout
// / 2 stderr / 3 the engine's own error, three zero bytes, big-endian u32 size) and a payload. A
// container with a TTY gets the raw bytes, no headers (the first byte then is a timestamp's digit,
// never 0-3). Each log entry is "<RFC 3339 timestamp> <text>"; an entry without a final newline is a
// partial line the next entry of the same stream continues (Docker splits lines at 16 KiB and gives
// each part its own timestamp; Podman does the same for output written without a newline). So the
// decoder keeps one line in progress per stream, and at the start of each entry (after a newline,
// or at each frame) reads a timestamp; on a continuation it is dropped (the line keeps its first).
class LogDecoder {
 public:
  explicit LogDecoder(const std::function<void(const LogLine&)>& on_line) : on_line_(on_line) {}

  void Feed(std::string_view data) {
    while (!data.empty()) {
      if (mode_ == Mode::kUnknown) {
        mode_ = static_cast<unsigned char>(data[0]) <= 3 ? Mode::kMultiplexed : Mode::kRaw;
      }
      if (mode_ == Mode::kRaw) {
        Payload(streams_[0], data);
        return;
      }
      if (frame_left_ == 0) {
        size_t take = std::min(data.size(), 8 - header_.size());
        header_.append(data.substr(0, take));
        data.remove_prefix(take);
        if (header_.size() < 8) {
          return;
        }
        auto byte = [&](int i) { return static_cast<uint32_t>(static_cast<unsigned char>(header_[i])); };
        frame_stream_ = static_cast<int>(byte(0));
        frame_left_ = byte(4) << 24 | byte(5) << 16 | byte(6) << 8 | byte(7);
        header_.clear();
        // Each frame is one entry of the engine's log: it starts with its timestamp. What the
        // stream's last frame left as a possible timestamp without its space was text.
        if (frame_stream_ <= 2) {
          Stream& stream = streams_[frame_stream_ == 2 ? 1 : 0];
          if (!stream.stamp.empty()) {
            StartLine(stream, 0);
            stream.text.append(stream.stamp);
            stream.stamp.clear();
          }
          stream.at_entry = true;
        }
        continue;
      }
      size_t take = static_cast<size_t>(std::min<uint64_t>(data.size(), frame_left_));
      std::string_view payload = data.substr(0, take);
      data.remove_prefix(take);
      frame_left_ -= take;
      if (frame_stream_ == 3) {
        if (engine_error_.size() < 4096) {
          engine_error_.append(payload.substr(0, 4096 - engine_error_.size()));
        }
      } else {
        Payload(streams_[frame_stream_ == 2 ? 1 : 0], payload);
      }
    }
  }

  // The end of the output: the lines in progress are complete (a last line without newline).
  void Finish() {
    for (Stream& stream : streams_) {
      if (!stream.stamp.empty()) {
        stream.text.insert(0, stream.stamp);  // never got its space: not a timestamp
        stream.stamp.clear();
      }
      if (stream.has_line || !stream.text.empty()) {
        Emit(stream);
      }
    }
  }

  // What the engine reported on stream 3 (Docker's "systemerr"), "" when nothing.
  const std::string& engine_error() const { return engine_error_; }

 private:
  enum class Mode { kUnknown, kMultiplexed, kRaw };
  struct Stream {
    bool stderr_stream = false;
    bool at_entry = true;   // the next bytes start an entry: a timestamp first
    std::string stamp;      // the timestamp read so far (at_entry)
    bool has_line = false;  // a line is in progress (text may still be empty)
    int64_t millis = 0;     // of the line in progress
    std::string text;
  };

  static Stream MakeStream(bool stderr_stream) {
    Stream stream;
    stream.stderr_stream = stderr_stream;
    return stream;
  }

  void Payload(Stream& stream, std::string_view data) {
    while (!data.empty()) {
      if (stream.at_entry) {
        size_t space = data.find(' ');
        std::string_view part = data.substr(0, space);
        // A timestamp is at most ~36 characters of [0-9TZ:.+-]; anything else is text.
        bool stamp_like = stream.stamp.size() + part.size() <= 40 &&
                          part.find_first_not_of("0123456789TZ:.+-") == std::string_view::npos;
        if (!stamp_like) {
          stream.at_entry = false;
          StartLine(stream, 0);
          stream.text.append(stream.stamp);
          stream.stamp.clear();
          continue;
        }
        stream.stamp.append(part);
        if (space == std::string_view::npos) {
          return;  // the rest of the timestamp is in the next piece
        }
        data.remove_prefix(space + 1);
        std::optional<int64_t> millis = ParseIso8601(stream.stamp);
        stream.at_entry = false;
        if (millis) {
          StartLine(stream, *millis);
        } else {
          StartLine(stream, 0);
          stream.text.append(stream.stamp).push_back(' ');
        }
        stream.stamp.clear();
        continue;
      }
      size_t newline = data.find('\n');
      std::string_view part = data.substr(0, newline);
      while (stream.text.size() + part.size() > kMaxLogLine) {
        size_t room = kMaxLogLine - stream.text.size();
        stream.text.append(part.substr(0, room));
        part.remove_prefix(room);
        Emit(stream);
        stream.has_line = true;  // the same line goes on, with the same timestamp
      }
      stream.text.append(part);
      if (newline == std::string_view::npos) {
        return;
      }
      data.remove_prefix(newline + 1);
      if (mode_ == Mode::kRaw && !stream.text.empty() && stream.text.back() == '\r') {
        stream.text.pop_back();  // a TTY ends its lines with \r\n
      }
      Emit(stream);
      stream.at_entry = true;
    }
  }

  // A new entry begins: a new line, or the continuation of the line in progress.
  void StartLine(Stream& stream, int64_t millis) {
    if (!stream.has_line) {
      stream.has_line = true;
      stream.millis = millis;
    }
  }

  void Emit(Stream& stream) {
    LogLine line;
    line.stderr_stream = stream.stderr_stream;
    line.engine_millis = stream.millis;
    line.text = std::move(stream.text);
    stream.text.clear();
    stream.has_line = false;
    on_line_(line);
  }

  const std::function<void(const LogLine&)>& on_line_;
  Mode mode_ = Mode::kUnknown;
  std::string header_;
  uint64_t frame_left_ = 0;
  int frame_stream_ = 1;
  Stream streams_[2] = {MakeStream(false), MakeStream(true)};
  std::string engine_error_;
};

ImageInfo ParseImage(const json& image) {
  ImageInfo info;
  info.id = Str(image, "Id");
  info.repo_tags = StrList(image, "RepoTags");
  info.size_bytes = Int(image, "Size");
  // ListImages gives unix seconds, InspectImage an RFC 3339 string.
  const json& created = Member(image, "Created");
  info.created_seconds = created.is_string() ? EngineMillis(created.get<std::string>()) / 1000 : Int(image, "Created");
  return info;
}

class HttpEngine final : public Engine {
 public:
  explicit HttpEngine(HttpEngineOptions options)
      : options_(std::move(options)), client_(options_.socket), prefix_("/" + options_.api_version) {}

  // Engine
  std::string address() const override { return client_.address(); }

  Result<EngineVersion> Version() override {
    ASSIGN_OR_RETURN(json doc, CallJson("GET", "/version"));
    EngineVersion version;
    version.version = Str(doc, "Version");
    version.api_version = Str(doc, "ApiVersion");
    const json& components = Member(doc, "Components");
    if (components.is_array()) {
      for (const json& component : components) {
        std::string name = Str(component, "Name");
        if (version.name.empty()) {
          version.name = name;
        }
        if (Contains(name, "Podman")) {
          version.podman = true;
        }
      }
    }
    if (version.name.empty()) {
      version.name = "Docker Engine";  // engines before Components (API < 1.35)
    }
    return version;
  }

  Result<ImageInfo> InspectImage(const std::string& reference) override {
    ASSIGN_OR_RETURN(json doc, CallJson("GET", "/images/" + EncodePath(reference) + "/json"));
    ImageInfo info = ParseImage(doc);
    const json& config = Member(doc, "Config");
    info.entrypoint = StrList(config, "Entrypoint");
    info.cmd = StrList(config, "Cmd");
    info.env = StrList(config, "Env");
    info.working_dir = Str(config, "WorkingDir");
    return info;
  }

  Result<std::vector<ImageInfo>> ListImages() override {
    ASSIGN_OR_RETURN(json doc, CallJson("GET", "/images/json"));
    std::vector<ImageInfo> images;
    if (doc.is_array()) {
      for (const json& image : doc) {
        images.push_back(ParseImage(image));
      }
    }
    return images;
  }

  Status PullImage(const std::string& reference, const std::string& registry_auth,
                   const std::function<void(const PullProgress&)>& on_progress,
                   const std::function<bool()>& cancelled) override {
    // fromImage=<repository>&tag=<tag or digest>: an empty tag would pull every tag (Docker).
    std::string repository = reference;
    std::string tag = "latest";
    if (size_t at = reference.find('@'); at != std::string::npos) {
      repository = reference.substr(0, at);
      tag = reference.substr(at + 1);
    } else if (size_t colon = reference.rfind(':');
               colon != std::string::npos && reference.find('/', colon) == std::string::npos) {
      repository = reference.substr(0, colon);
      tag = reference.substr(colon + 1);
    }
    EngineHttpRequest request;
    request.method = "POST";
    request.target = prefix_ + "/images/create?fromImage=" + UriEncode(repository) + "&tag=" + UriEncode(tag);
    if (!registry_auth.empty()) {
      request.headers.emplace_back("X-Registry-Auth", registry_auth);
    }
    JsonObjectSplitter splitter;
    Status failure;
    auto on_object = [&](std::string_view text) -> Status {
      auto message = ParseJsonBounded(text);
      if (!message.ok()) {
        return Status::Internal("the container engine at " + address() + " sent a pull progress message that is not " +
                                "JSON: " + message.status().message());
      }
      std::string error = Str(*message, "error");
      if (error.empty()) {
        error = Str(Member(*message, "errorDetail"), "message");
      }
      if (!error.empty() || message->contains("errorDetail")) {
        return PullFailure(error.empty() ? "the pull failed (no message)" : error);
      }
      PullProgress progress;
      progress.status = Str(*message, "status");
      progress.layer = Str(*message, "id");
      const json& detail = Member(*message, "progressDetail");
      progress.current = Int(detail, "current");
      progress.total = Int(detail, "total");
      if (on_progress) {
        on_progress(progress);
      }
      return Status::Ok();
    };
    std::string error_body;
    ASSIGN_OR_RETURN(int status, client_.Stream(
                                     request, [&](std::string_view data) { return splitter.Feed(data, on_object); },
                                     cancelled, &error_body));
    if (status < 200 || status > 299) {
      // Docker answers a pull it refuses at once with an HTTP error (404 for a repository that
      // does not exist); the same reading of the message applies.
      std::string message = EngineMessage(error_body);
      return status == 404 ? Status::NotFound(message) : PullFailure(message);
    }
    return Status::Ok();
  }

  Result<std::string> CreateContainer(const std::string& name, const nlohmann::json& body) override {
    std::string text;
    try {
      text = body.dump();
    } catch (const json::exception& e) {
      // Only invalid UTF-8 in a string makes dump() throw.
      return Status::InvalidArgument(std::string("the container's create body cannot be sent: ") + e.what());
    }
    std::string target = prefix_ + "/containers/create?name=" + UriEncode(name);
    ASSIGN_OR_RETURN(EngineHttpResponse response, Send("POST", target, std::move(text)));
    // Docker answers a taken name with 409; Podman 4.3 with 500 "... the container name "x" is
    // already in use by <id>. You have to remove that container ...: that name is already in use".
    if (response.status == 409 ||
        (response.status == 500 && Contains(EngineMessage(response.body), "is already in use"))) {
      return Status::AlreadyExists(EngineMessage(response.body));
    }
    ASSIGN_OR_RETURN(json doc, Parse("POST", target, response));
    std::string id = Str(doc, "Id");
    if (id.empty()) {
      return Status::Internal("the container engine at " + address() + " created container " + name +
                              " but its answer has no Id");
    }
    return id;
  }

  Status StartContainer(const std::string& id) override {
    std::string target = prefix_ + "/containers/" + EncodePath(id) + "/start";
    ASSIGN_OR_RETURN(EngineHttpResponse response, Send("POST", target));
    if (response.status == 304) {
      return Status::Ok();  // already started
    }
    return Check("POST", target, response);
  }

  Status KillContainer(const std::string& id, int signal) override {
    std::string target = prefix_ + "/containers/" + EncodePath(id) + "/kill?signal=" + std::to_string(signal);
    ASSIGN_OR_RETURN(EngineHttpResponse response, Send("POST", target));
    // Not running: Docker answers 409 "Container ... is not running"; Podman 500 "can only kill
    // running containers. ... is in state exited: container state improper".
    if (response.status == 409 || response.status == 500) {
      std::string message = EngineMessage(response.body);
      if (response.status == 409 || Contains(message, "state improper") || Contains(message, "not running")) {
        return Status::FailedPrecondition(message);
      }
    }
    return Check("POST", target, response);
  }

  Result<ContainerState> InspectContainer(const std::string& id_or_name) override {
    ASSIGN_OR_RETURN(json doc, CallJson("GET", "/containers/" + EncodePath(id_or_name) + "/json"));
    ContainerState state;
    state.id = Str(doc, "Id");
    state.name = WithoutSlash(Str(doc, "Name"));
    state.labels = StrMap(Member(doc, "Config"), "Labels");
    const json& s = Member(doc, "State");
    // Podman's own states where Docker's differ: "stopped" (exited, cleanup pending; seen for a
    // few ms after the exit) and "configured" (created, not yet initialised) read as Docker's.
    state.status = Str(s, "Status");
    if (state.status == "stopped") {
      state.status = "exited";
    } else if (state.status == "configured") {
      state.status = "created";
    }
    state.running = Bool(s, "Running");
    state.pid = state.running ? static_cast<int>(Int(s, "Pid")) : 0;
    state.exit_code = static_cast<int>(Int(s, "ExitCode"));
    state.oom_killed = Bool(s, "OOMKilled");
    state.error = Str(s, "Error");
    state.started_millis = EngineMillis(Str(s, "StartedAt"));
    state.finished_millis = state.running ? 0 : EngineMillis(Str(s, "FinishedAt"));
    return state;
  }

  Status RemoveContainer(const std::string& id) override {
    // SIGKILL first: a forced DELETE of a running container stops it the engine's way, SIGTERM then
    // StopTimeout (30 s) later SIGKILL, and a PID 1 without a SIGTERM handler ignores SIGTERM, so
    // the DELETE took the whole 30 s and ran into the call's timeout (measured on Podman 4.3). The
    // kill's answer does not matter (a container that is not running refuses it).
    (void)Send("POST", prefix_ + "/containers/" + EncodePath(id) + "/kill?signal=9");
    std::string target = prefix_ + "/containers/" + EncodePath(id) + "?force=1&v=1";
    ASSIGN_OR_RETURN(EngineHttpResponse response, Send("DELETE", target));
    return Check("DELETE", target, response);
  }

  Result<std::vector<ContainerSummary>> ListContainers(const std::string& label_filter) override {
    std::string path = "/containers/json?all=1";
    if (!label_filter.empty()) {
      path += "&filters=" + UriEncode(json{{"label", json::array({label_filter})}}.dump());
    }
    ASSIGN_OR_RETURN(json doc, CallJson("GET", path));
    std::vector<ContainerSummary> containers;
    if (doc.is_array()) {
      for (const json& item : doc) {
        ContainerSummary summary;
        summary.id = Str(item, "Id");
        std::vector<std::string> names = StrList(item, "Names");
        summary.name = names.empty() ? "" : WithoutSlash(names[0]);
        summary.labels = StrMap(item, "Labels");
        summary.state = Str(item, "State");
        containers.push_back(std::move(summary));
      }
    }
    return containers;
  }

  Status ContainerLogs(const std::string& id, bool follow, int64_t since_seconds,
                       const std::function<void(const LogLine&)>& on_line,
                       const std::function<bool()>& cancelled) override {
    EngineHttpRequest request;
    request.target = prefix_ + "/containers/" + EncodePath(id) + "/logs?stdout=1&stderr=1&timestamps=1";
    if (follow) {
      request.target += "&follow=1";
    }
    if (since_seconds > 0) {
      request.target += "&since=" + std::to_string(since_seconds);
    }
    LogDecoder decoder(on_line);
    std::string error_body;
    ASSIGN_OR_RETURN(int status, client_.Stream(
                                     request,
                                     [&](std::string_view data) {
                                       decoder.Feed(data);
                                       return Status::Ok();
                                     },
                                     cancelled, &error_body));
    if (status < 200 || status > 299) {
      return ErrorFor("GET", request.target, status, error_body);
    }
    decoder.Finish();
    if (!decoder.engine_error().empty()) {
      return Status::Internal("the container engine at " + address() + " failed reading the logs of " + id + ": " +
                              decoder.engine_error());
    }
    return Status::Ok();
  }

  Result<ContainerStats> Stats(const std::string& id) override {
    ASSIGN_OR_RETURN(json doc, CallJson("GET", "/containers/" + EncodePath(id) + "/stats?stream=false&one-shot=true"));
    ContainerStats stats;
    const json& cpu = Member(Member(doc, "cpu_stats"), "cpu_usage");
    stats.cpu_total_usec = static_cast<uint64_t>(std::max<int64_t>(0, Int(cpu, "total_usage"))) / 1000;
    const json& memory = Member(doc, "memory_stats");
    stats.memory_bytes = static_cast<uint64_t>(std::max<int64_t>(0, Int(memory, "usage")));
    stats.memory_limit_bytes = static_cast<uint64_t>(std::max<int64_t>(0, Int(memory, "limit")));
    return stats;
  }

 private:
  Result<EngineHttpResponse> Send(const std::string& method, const std::string& target, std::string body = "") {
    EngineHttpRequest request;
    request.method = method;
    request.target = target;
    request.body = std::move(body);
    return client_.Call(request, options_.timeout_ms);
  }

  Status ErrorFor(const std::string& method, const std::string& target, int status, const std::string& body) const {
    std::string message = EngineMessage(body);
    if (status == 404) {
      return Status::NotFound(message);
    }
    return Status::Internal("the container engine at " + address() + " answered " + method + " " + target +
                            " with HTTP " + std::to_string(status) + ": " + message);
  }

  Status Check(const std::string& method, const std::string& target, const EngineHttpResponse& response) const {
    if (response.status >= 200 && response.status <= 299) {
      return Status::Ok();
    }
    return ErrorFor(method, target, response.status, response.body);
  }

  Result<json> Parse(const std::string& method, const std::string& target, const EngineHttpResponse& response) const {
    RETURN_IF_ERROR(Check(method, target, response));
    auto doc = ParseJsonBounded(response.body);
    if (!doc.ok()) {
      return Status::Internal("the container engine at " + address() + " answered " + method + " " + target +
                              " with a body that is not JSON: " + doc.status().message());
    }
    return std::move(doc).value();
  }

  // A call under the API prefix whose 2xx answer is JSON.
  Result<json> CallJson(const std::string& method, const std::string& path) {
    std::string target = prefix_ + path;
    ASSIGN_OR_RETURN(EngineHttpResponse response, Send(method, target));
    return Parse(method, target, response);
  }

  const HttpEngineOptions options_;
  const EngineClient client_;
  const std::string prefix_;
};

}  // namespace

std::unique_ptr<Engine> OpenHttpEngine(HttpEngineOptions options) {
  return std::make_unique<HttpEngine>(std::move(options));
}

}  // namespace kiln::runtime::docker
