#include "runtime/docker/images.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/encoding.h"
#include "base/time.h"

namespace kiln::runtime::docker {
namespace internal {
// EnsureImage with its clock as a parameter (milliseconds, any epoch), so that the tests can
// drive the progress throttle without sleeping. images_test.cc declares it too.
Status EnsureImageWithClock(Engine& engine, const ContainerImage& image, const ImageSettings& settings,
                            const std::function<void(const std::string&)>& progress,
                            const std::function<bool()>& cancelled, const std::function<int64_t()>& now_millis);
}  // namespace internal

namespace {

constexpr size_t kMaxNameLength = 255;  // Docker's limit on registry + repository
constexpr size_t kMaxTagLength = 128;   // [\w][\w.-]{0,127}
constexpr int64_t kProgressEveryMs = 500;

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// One path component: [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*. Empty when valid, else what is wrong.
std::string CheckPathComponent(std::string_view c) {
  if (c.empty()) return "it has an empty path component (\"//\", or a leading or trailing '/')";
  for (char ch : c) {
    if (ch >= 'A' && ch <= 'Z') return "repository names must be lower case (\"" + std::string(c) + "\")";
  }
  if (!IsLowerAlnum(c.front()) || !IsLowerAlnum(c.back())) {
    return "each path component must start and end with a lower-case letter or digit (\"" + std::string(c) + "\")";
  }
  for (size_t i = 0; i < c.size(); ++i) {
    char ch = c[i];
    if (IsLowerAlnum(ch) || ch == '-') continue;
    if (ch == '.' || ch == '_') {
      // Separators: ".", "_", "__" (and runs of '-', handled above) between alphanumerics.
      size_t run = 1;
      while (i + run < c.size() && (c[i + run] == '.' || c[i + run] == '_')) ++run;
      std::string_view sep = c.substr(i, run);
      if (sep != "." && sep != "_" && sep != "__") {
        return "\"" + std::string(sep) + "\" is not a valid separator in \"" + std::string(c) + "\"";
      }
      i += run - 1;
      continue;
    }
    return "the character '" + std::string(1, ch) + "' is not allowed in a repository name (\"" + std::string(c) +
           "\")";
  }
  return "";
}

// A registry: host[:port], the host a DNS name ([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])? labels
// joined by '.') or an IPv6 address in brackets.
std::string CheckRegistry(std::string_view r) {
  std::string_view host = r;
  std::string_view port;
  if (!r.empty() && r.front() == '[') {
    size_t close = r.find(']');
    if (close == std::string_view::npos) return "the registry \"" + std::string(r) + "\" has an unclosed '['";
    for (char ch : r.substr(1, close - 1)) {
      if (!IsHex(ch) && ch != ':' && ch != '.') return "the registry \"" + std::string(r) + "\" is not a valid host";
    }
    host = r.substr(0, close + 1);
    std::string_view rest = r.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return "the registry \"" + std::string(r) + "\" is not host[:port]";
      port = rest.substr(1);
      if (port.empty()) return "the registry \"" + std::string(r) + "\" has an empty port";
    }
  } else {
    size_t colon = r.find(':');
    if (colon != std::string_view::npos) {
      host = r.substr(0, colon);
      port = r.substr(colon + 1);
      if (port.empty()) return "the registry \"" + std::string(r) + "\" has an empty port";
    }
    if (host.empty()) return "the registry \"" + std::string(r) + "\" has no host";
    size_t start = 0;
    while (start <= host.size()) {
      size_t dot = host.find('.', start);
      std::string_view label = host.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
      if (label.empty() || !IsAlnum(label.front()) || !IsAlnum(label.back())) {
        return "the registry \"" + std::string(r) + "\" is not a valid host name";
      }
      for (char ch : label) {
        if (!IsAlnum(ch) && ch != '-') return "the registry \"" + std::string(r) + "\" is not a valid host name";
      }
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
  }
  for (char ch : port) {
    if (!IsDigit(ch)) return "the registry port in \"" + std::string(r) + "\" is not a number";
  }
  return "";
}

std::string CheckTag(std::string_view tag) {
  if (tag.empty()) return "the tag after ':' is empty";
  if (tag.size() > kMaxTagLength) return "the tag is longer than 128 characters";
  auto word = [](char ch) { return IsAlnum(ch) || ch == '_'; };
  if (!word(tag.front())) return "the tag \"" + std::string(tag) + "\" must start with a letter, digit or '_'";
  for (char ch : tag) {
    if (!word(ch) && ch != '.' && ch != '-') {
      return "the tag \"" + std::string(tag) + "\" may contain only letters, digits, '_', '.' and '-'";
    }
  }
  return "";
}

// algorithm:hex, e.g. sha256:<64 hex>.
std::string CheckDigest(std::string_view d) {
  size_t colon = d.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == d.size()) {
    return "the digest \"" + std::string(d) + "\" is not algorithm:hex (e.g. sha256:<64 hex digits>)";
  }
  std::string_view algorithm = d.substr(0, colon);
  std::string_view hex = d.substr(colon + 1);
  for (char ch : algorithm) {
    if (!IsLowerAlnum(ch) && ch != '+' && ch != '.' && ch != '_' && ch != '-') {
      return "the digest algorithm \"" + std::string(algorithm) + "\" is not valid";
    }
  }
  for (char ch : hex) {
    if (!IsHex(ch)) return "the digest \"" + std::string(d) + "\" is not hexadecimal after the ':'";
  }
  if (algorithm == "sha256" && hex.size() != 64) return "a sha256 digest has 64 hex digits";
  if (algorithm == "sha512" && hex.size() != 128) return "a sha512 digest has 128 hex digits";
  if (hex.size() < 32) return "the digest \"" + std::string(d) + "\" is too short";
  return "";
}

Status Invalid(const std::string& text, const std::string& why) {
  return Status::InvalidArgument("image \"" + text + "\" is not a valid image reference ([registry[:port]/]" +
                                 "repository[:tag][@digest]): " + why);
}

// "3.4 MB": decimal units, as the engines print pull sizes.
std::string FormatBytes(int64_t bytes) {
  char buf[32];
  if (bytes >= 1000LL * 1000 * 1000) {
    snprintf(buf, sizeof(buf), "%.1f GB", static_cast<double>(bytes) / 1e9);
  } else if (bytes >= 10LL * 1000 * 1000) {
    snprintf(buf, sizeof(buf), "%.0f MB", static_cast<double>(bytes) / 1e6);
  } else if (bytes >= 1000LL * 1000) {
    snprintf(buf, sizeof(buf), "%.1f MB", static_cast<double>(bytes) / 1e6);
  } else if (bytes >= 1000) {
    snprintf(buf, sizeof(buf), "%.0f kB", static_cast<double>(bytes) / 1e3);
  } else {
    snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

// Sums a pull's per-layer messages into "3 of 7 layers, 45 MB of 120 MB". Docker reports
// "Pulling fs layer" / "Waiting" / "Downloading" (current/total) / "Verifying Checksum" /
// "Download complete" / "Extracting" / "Pull complete" / "Already exists" per layer; Podman's
// compat API "Pulling fs layer" / "Downloading" / "Download complete" / "Already exists" per blob
// and a last "Download complete" carrying the image id. A layer counts once announced; a
// completion for an id never announced (that image id, "Pulling from <tag>") is no layer.
class PullTally {
 public:
  void Add(const PullProgress& p) {
    if (p.layer.empty() || p.status.rfind("Pulling from", 0) == 0) return;
    const bool announces = p.status == "Pulling fs layer" || p.status == "Waiting" || p.status == "Downloading" ||
                           p.status == "Already exists";
    auto it = layers_.find(p.layer);
    if (it == layers_.end()) {
      if (!announces) return;
      it = layers_.emplace(p.layer, Layer{}).first;
    }
    Layer& layer = it->second;
    if (p.status == "Downloading") {
      if (p.total > 0) layer.total = p.total;
      layer.current = std::max(layer.current, p.current);
    } else if (p.status == "Verifying Checksum" || p.status == "Download complete" || p.status == "Extracting" ||
               p.status == "Pull complete" || p.status == "Already exists") {
      layer.done = true;
      if (layer.total > 0) layer.current = layer.total;
    }
  }

  std::string Text() const {
    if (layers_.empty()) return "starting";
    int done = 0;
    int64_t current = 0;
    int64_t total = 0;
    for (const auto& [id, layer] : layers_) {
      if (layer.done) ++done;
      current += std::min(layer.current, layer.total > 0 ? layer.total : layer.current);
      total += layer.total;
    }
    std::string text = std::to_string(done) + " of " + std::to_string(layers_.size()) + " layers";
    if (total > 0) text += ", " + FormatBytes(current) + " of " + FormatBytes(total);
    return text;
  }

 private:
  struct Layer {
    int64_t current = 0;
    int64_t total = 0;
    bool done = false;
  };
  std::map<std::string, Layer> layers_;
};

std::string TrimSlashes(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// The image as the messages name it: "<requested>", or "<requested> (mirror <reference>)".
struct Names {
  std::string requested;
  std::string reference;
  bool mirrored = false;
  std::string Label() const {
    if (reference == requested) return reference;
    return requested + (mirrored ? " (mirror " : " (as ") + reference + ")";
  }
};

// The engine's words for a registry it could not talk to (Podman and Docker).
bool RegistryUnreachable(const std::string& message) {
  for (const char* words : {"pinging container registry", "connection refused", "no such host", "dial tcp",
                            "i/o timeout", "network is unreachable", "TLS handshake timeout"}) {
    if (message.find(words) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::string ImageReference::ToString() const {
  std::string out = registry + "/" + repository;
  if (!digest.empty()) return out + "@" + digest;
  return out + ":" + (tag.empty() ? std::string("latest") : tag);
}

bool ImageReference::ecr() const {
  // <12-digit account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]
  std::string_view r = registry;
  size_t dot = r.find('.');
  if (dot != 12) return false;
  for (char ch : r.substr(0, 12)) {
    if (!IsDigit(ch)) return false;
  }
  r.remove_prefix(13);
  if (r.rfind("dkr.ecr.", 0) == 0) {
    r.remove_prefix(8);
  } else if (r.rfind("dkr.ecr-fips.", 0) == 0) {
    r.remove_prefix(13);
  } else {
    return false;
  }
  std::string_view suffix;
  for (std::string_view s : {".amazonaws.com", ".amazonaws.com.cn"}) {
    if (r.size() > s.size() && r.substr(r.size() - s.size()) == s) suffix = s;
  }
  if (suffix.empty()) return false;
  std::string_view region = r.substr(0, r.size() - suffix.size());
  if (region.empty()) return false;
  for (char ch : region) {
    if (!IsLowerAlnum(ch) && ch != '-') return false;
  }
  return true;
}

Result<ImageReference> ParseImageReference(const std::string& text) {
  if (text.empty()) return Invalid(text, "it is empty");
  for (char ch : text) {
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') return Invalid(text, "it contains white space");
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) {
      return Invalid(text, "it contains a character outside printable ASCII");
    }
  }
  ImageReference ref;
  std::string_view rest = text;
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    std::string_view digest = rest.substr(at + 1);
    if (std::string why = CheckDigest(digest); !why.empty()) return Invalid(text, why);
    ref.digest = std::string(digest);
    rest = rest.substr(0, at);
  }
  // A tag is a ':' after the last '/' (a ':' before it is a registry port).
  size_t last_slash = rest.rfind('/');
  size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos && (last_slash == std::string_view::npos || colon > last_slash)) {
    std::string_view tag = rest.substr(colon + 1);
    if (std::string why = CheckTag(tag); !why.empty()) return Invalid(text, why);
    ref.tag = std::string(tag);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return Invalid(text, "it has no repository name");
  if (rest.size() > kMaxNameLength) return Invalid(text, "the name is longer than 255 characters");
  std::string_view path = rest;
  size_t first_slash = rest.find('/');
  if (first_slash != std::string_view::npos) {
    std::string_view first = rest.substr(0, first_slash);
    if (first.find('.') != std::string_view::npos || first.find(':') != std::string_view::npos ||
        first == "localhost") {
      if (std::string why = CheckRegistry(first); !why.empty()) return Invalid(text, why);
      ref.registry = std::string(first);
      path = rest.substr(first_slash + 1);
    }
  }
  if (path.empty()) return Invalid(text, "it has no repository after the registry");
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    std::string_view component =
        path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (std::string why = CheckPathComponent(component); !why.empty()) return Invalid(text, why);
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  ref.repository = std::string(path);
  if (ref.registry.empty() || ref.registry == "index.docker.io" || ref.registry == "registry-1.docker.io") {
    ref.registry = "docker.io";
  }
  if (ref.registry == "docker.io" && ref.repository.find('/') == std::string::npos) {
    ref.repository = "library/" + ref.repository;
  }
  if (ref.tag.empty() && ref.digest.empty()) ref.tag = "latest";
  return ref;
}

Result<std::string> EngineReference(const std::string& image_uri, const ImageSettings& settings) {
  ASSIGN_OR_RETURN(ImageReference ref, ParseImageReference(image_uri));
  if (!ref.ecr() || settings.ecr_mirror.empty()) {
    // As written: a short name ("byo:1") is what the engine resolves against its local images
    // ("localhost/byo:1" on Podman, "docker.io/library/byo:1" on Docker), so that an image built
    // on the node under that name is found without a registry.
    return image_uri;
  }
  std::string mapped = TrimSlashes(settings.ecr_mirror) + "/" + ref.repository;
  mapped += ref.digest.empty() ? ":" + ref.tag : "@" + ref.digest;
  Result<ImageReference> check = ParseImageReference(mapped);
  if (!check.ok()) {
    return Status::InvalidArgument("container_engine.ecr_mirror \"" + settings.ecr_mirror + "\" maps image " +
                                   image_uri + " to \"" + mapped +
                                   "\", which is not a valid image reference; set it to a registry host[:port] and "
                                   "an optional path, e.g. registry.local:5000/ecr");
  }
  return mapped;
}

std::string RegistryAuthHeader(const std::string& registry, const ImageSettings& settings) {
  auto it = settings.registries.find(registry);
  if (it == settings.registries.end() && registry == "docker.io") {
    // Docker Hub goes by several names in credential files.
    for (const char* alias : {"index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/"}) {
      it = settings.registries.find(alias);
      if (it != settings.registries.end()) break;
    }
  }
  if (it == settings.registries.end()) return "";
  nlohmann::json auth = {
      {"username", it->second.username}, {"password", it->second.password}, {"serveraddress", registry}};
  // base64url with its padding: what Docker (base64.URLEncoding) and Podman decode.
  std::string encoded = Base64Encode(auth.dump());
  for (char& ch : encoded) {
    if (ch == '+') ch = '-';
    if (ch == '/') ch = '_';
  }
  return encoded;
}

Status internal::EnsureImageWithClock(Engine& engine, const ContainerImage& image, const ImageSettings& settings,
                                      const std::function<void(const std::string&)>& progress,
                                      const std::function<bool()>& cancelled,
                                      const std::function<int64_t()>& now_millis) {
  Names names;
  names.requested = image.requested.empty() ? image.reference : image.requested;
  if (!image.reference.empty()) {
    names.reference = image.reference;
  } else {
    ASSIGN_OR_RETURN(names.reference, EngineReference(image.requested, settings));
  }
  Result<ImageReference> parsed = ParseImageReference(names.reference);
  if (!parsed.ok()) return parsed.status();
  Result<ImageReference> requested = ParseImageReference(names.requested);
  const bool requested_ecr = requested.ok() && requested->ecr();
  names.mirrored = requested_ecr && names.reference != names.requested && !settings.ecr_mirror.empty();
  const std::string engine_at = "the container engine (" + engine.address() + ")";

  auto unreachable = [&](const Status& s) {
    return Status::Unavailable("cannot make image " + names.Label() + " ready: " + s.message() +
                               ". Start the container engine, or fix container_engine.socket in the Kiln config file");
  };
  auto cancelled_status = [&] { return Status::Aborted("preparing image " + names.Label() + " was cancelled"); };

  if (cancelled && cancelled()) return cancelled_status();
  Result<ImageInfo> present = engine.InspectImage(names.reference);
  if (present.ok()) return Status::Ok();
  if (present.status().code() == StatusCode::kUnavailable) return unreachable(present.status());
  if (!present.status().IsNotFound()) {
    return Status(present.status().code(),
                  "looking up image " + names.Label() + " in " + engine_at + " failed: " + present.status().message());
  }

  // Not present: pull it. Progress texts at most every kProgressEveryMs, plus a final one.
  const std::string auth = RegistryAuthHeader(parsed->registry, settings);
  PullTally tally;
  int64_t last_report = 0;
  bool reported = false;
  auto report = [&](bool force, const char* verb = "pulling ") {
    if (!progress) return;
    const int64_t now = now_millis();
    if (!force && reported && now - last_report < kProgressEveryMs) return;
    last_report = now;
    reported = true;
    progress(verb + names.Label() + ": " + tally.Text());
  };
  report(true);
  Status pulled = engine.PullImage(
      names.reference, auth,
      [&](const PullProgress& p) {
        tally.Add(p);
        report(false);
      },
      cancelled ? cancelled : std::function<bool()>([] { return false; }));

  if (!pulled.ok()) {
    const std::string tried = "pulling " + names.reference + (names.mirrored ? " from the mirror" : "") + " failed: ";
    const std::string head =
        "image " + names.requested + " is not in " + engine_at + " and " + tried + pulled.message() + ". ";
    switch (pulled.code()) {
      case StatusCode::kAborted: return cancelled_status();
      case StatusCode::kUnavailable: return unreachable(pulled);
      case StatusCode::kNotFound:
        if (names.mirrored) {
          return Status::NotFound(head + "Push it to the mirror as " + names.reference +
                                  ", or build or load it on this node under that name (podman build -t " +
                                  names.reference + " ..., or docker build)");
        }
        if (requested_ecr && settings.ecr_mirror.empty()) {
          return Status::NotFound(head +
                                  "ECR images cannot be pulled without AWS credentials: build or load it on "
                                  "this node under that name (podman build -t " +
                                  names.reference +
                                  " ..., or docker build), or set container_engine.ecr_mirror in the Kiln config "
                                  "file to a registry that has it");
        }
        return Status::NotFound(head + "Build or load the image on this node (podman build -t " + names.reference +
                                " ..., or docker build), or push it to " + parsed->registry);
      case StatusCode::kPermissionDenied:
      case StatusCode::kUnauthenticated:
        return Status::PermissionDenied(head + "The registry " + parsed->registry + " refused " +
                                        (auth.empty() ? std::string("an anonymous pull: configure credentials for it")
                                                      : std::string("the configured credentials: fix them")) +
                                        " under container_engine.registries[\"" + parsed->registry +
                                        "\"] in the Kiln config file");
      default:
        if (RegistryUnreachable(pulled.message())) {
          // Podman: 500 "pinging container registry ...: connection refused". Retrying the job
          // does not make the image appear: the image's problem (NotFound -> ClientError), as
          // SageMaker fails a job whose image cannot be pulled.
          return Status::NotFound(head + "Build or load the image on this node (podman build -t " + names.reference +
                                  " ..., or docker build), or make " + parsed->registry + " reachable from this node");
        }
        return Status(pulled.code(),
                      "pulling " + names.Label() + " through " + engine_at + " failed: " + pulled.message());
    }
  }

  // Confirm: the engine must now have it under the name Launch will use. Engines store a pulled
  // short name under its canonical name, which they also resolve; try that as well.
  Result<ImageInfo> after = engine.InspectImage(names.reference);
  if (!after.ok() && after.status().IsNotFound()) after = engine.InspectImage(parsed->ToString());
  if (!after.ok()) {
    if (after.status().code() == StatusCode::kUnavailable) return unreachable(after.status());
    return Status::Internal(engine_at + " reported pulling " + names.Label() +
                            " as done but does not have it: " + after.status().message());
  }
  report(true, "pulled ");
  return Status::Ok();
}

Status EnsureImage(Engine& engine, const ContainerImage& image, const ImageSettings& settings,
                   const std::function<void(const std::string&)>& progress, const std::function<bool()>& cancelled) {
  return internal::EnsureImageWithClock(engine, image, settings, progress, cancelled, [] { return NowMillis(); });
}

}  // namespace kiln::runtime::docker
