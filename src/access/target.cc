#include "access/target.h"

#include <optional>
#include <vector>

#include "base/strings.h"

namespace kiln::access {

namespace {

constexpr std::string_view kTrainingPrefix = "training-job/";
constexpr std::string_view kEndpointPrefix = "endpoint/";
constexpr std::string_view kAliasPrefix = "sagemaker-training-job:";
constexpr std::string_view kHostSuffix = ".training.kiln";

bool Alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// "algo-<n>" → n (1..9999, no leading zero).
std::optional<int> ParseHost(std::string_view text) {
  if (!StartsWith(text, "algo-")) return std::nullopt;
  std::string_view digits = text.substr(5);
  if (digits.empty() || digits.size() > 4 || digits[0] == '0') return std::nullopt;
  int n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

bool IsInstanceId(std::string_view id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!Alnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

Status Invalid(std::string_view text, std::string_view why) {
  return Status::InvalidArgument(
      "the target \"" + std::string(text.substr(0, 256)) + "\" " + std::string(why) +
      "; use training-job/<job>/algo-<n>, sagemaker-training-job:<job>_algo-<n>, algo-<n>.<job>.training.kiln, "
      "<job>, or endpoint/<endpoint>[/<variant>[/<instance-id>]]");
}

// "arn:aws:sagemaker:<region>:<account>:<kind>/<name>" → (kind, name) when it has that shape.
std::optional<std::pair<std::string, std::string>> SplitArn(std::string_view text) {
  if (!StartsWith(text, "arn:")) return std::nullopt;
  std::vector<std::string_view> parts = Split(text, ':');
  if (parts.size() != 6 || parts[2] != "sagemaker") return std::nullopt;
  std::string_view rest = parts[5];
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  return std::make_pair(std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1)));
}

}  // namespace

bool IsResourceName(std::string_view name) {
  if (name.empty() || name.size() > 63 || !Alnum(name.front()) || !Alnum(name.back())) return false;
  for (char c : name) {
    if (!Alnum(c) && c != '-') return false;
  }
  return true;
}

std::string Target::Canonical() const {
  if (resource.kind == ResourceKind::kTrainingJob) {
    return std::string(kTrainingPrefix) + resource.name + "/algo-" + std::to_string(host);
  }
  std::string out = std::string(kEndpointPrefix) + resource.name;
  if (!variant.empty()) out += "/" + variant;
  if (!instance_id.empty()) out += "/" + instance_id;
  return out;
}

std::string Target::Alias() const {
  if (resource.kind == ResourceKind::kTrainingJob) {
    return std::string(kAliasPrefix) + resource.name + "_algo-" + std::to_string(host);
  }
  return Canonical();
}

std::string Target::HostName() const {
  if (resource.kind == ResourceKind::kTrainingJob) return "algo-" + std::to_string(host);
  return instance_id;
}

Result<ResourceRef> ParseResource(std::string_view text) {
  auto invalid = [&](std::string_view why) {
    return Status::InvalidArgument("the resource \"" + std::string(text.substr(0, 256)) + "\" " + std::string(why) +
                                   "; use a training job or endpoint name, training-job/<job>, endpoint/<endpoint>, "
                                   "or the resource's ARN");
  };
  ResourceRef ref;
  std::string_view name;
  if (auto arn = SplitArn(text)) {
    if (arn->first == "training-job") {
      ref.kind = ResourceKind::kTrainingJob;
    } else if (arn->first == "endpoint") {
      ref.kind = ResourceKind::kEndpoint;
    } else {
      return invalid("is the ARN of neither a training job nor an endpoint");
    }
    ref.name = arn->second;
    if (!IsResourceName(ref.name)) return invalid("has no valid resource name after its '/'");
    return ref;
  }
  if (StartsWith(text, kTrainingPrefix)) {
    ref.kind = ResourceKind::kTrainingJob;
    name = text.substr(kTrainingPrefix.size());
  } else if (StartsWith(text, kEndpointPrefix)) {
    ref.kind = ResourceKind::kEndpoint;
    name = text.substr(kEndpointPrefix.size());
  } else {
    ref.bare = true;
    name = text;
  }
  if (!IsResourceName(name)) return invalid("is not a valid name");
  ref.name = std::string(name);
  return ref;
}

Result<Target> ParseTarget(std::string_view text) {
  Target target;
  if (text.empty()) return Invalid(text, "is empty");
  if (SplitArn(text)) {
    Result<ResourceRef> resource = ParseResource(text);
    if (!resource.ok()) return Invalid(text, "is not the ARN of a training job or an endpoint");
    target.resource = std::move(resource).value();
    return target;
  }
  // sagemaker-training-job:<job>_algo-<n>
  if (StartsWith(text, kAliasPrefix)) {
    std::string_view rest = text.substr(kAliasPrefix.size());
    size_t underscore = rest.rfind('_');
    if (underscore == std::string_view::npos) return Invalid(text, "has no _algo-<n> after the job name");
    std::optional<int> host = ParseHost(rest.substr(underscore + 1));
    if (!host) return Invalid(text, "has no _algo-<n> after the job name");
    std::string_view job = rest.substr(0, underscore);
    if (!IsResourceName(job)) return Invalid(text, "does not name a valid training job");
    target.resource = {ResourceKind::kTrainingJob, std::string(job), false};
    target.host = *host;
    return target;
  }
  // algo-<n>.<job>.training.kiln (host names are case-insensitive: ssh may pass %h lower-cased,
  // but job names keep their case as typed).
  if (EndsWith(ToLower(text), kHostSuffix)) {
    std::string_view rest = text.substr(0, text.size() - kHostSuffix.size());
    size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return Invalid(text, "has no algo-<n>.<job> before .training.kiln");
    std::optional<int> host = ParseHost(ToLower(rest.substr(0, dot)));
    std::string_view job = rest.substr(dot + 1);
    if (!host) return Invalid(text, "does not start with algo-<n>.");
    if (!IsResourceName(job)) return Invalid(text, "does not name a valid training job");
    target.resource = {ResourceKind::kTrainingJob, std::string(job), false};
    target.host = *host;
    return target;
  }
  if (StartsWith(text, kTrainingPrefix)) {
    std::vector<std::string_view> parts = Split(text.substr(kTrainingPrefix.size()), '/');
    if (parts.size() > 2) return Invalid(text, "has too many parts");
    if (!IsResourceName(parts[0])) return Invalid(text, "does not name a valid training job");
    target.resource = {ResourceKind::kTrainingJob, std::string(parts[0]), false};
    if (parts.size() == 2) {
      std::optional<int> host = ParseHost(parts[1]);
      if (!host) return Invalid(text, "names no host algo-<n> (n from 1) after the job");
      target.host = *host;
    }
    return target;
  }
  if (StartsWith(text, kEndpointPrefix)) {
    std::vector<std::string_view> parts = Split(text.substr(kEndpointPrefix.size()), '/');
    if (parts.size() > 3) return Invalid(text, "has too many parts");
    if (!IsResourceName(parts[0])) return Invalid(text, "does not name a valid endpoint");
    target.resource = {ResourceKind::kEndpoint, std::string(parts[0]), false};
    if (parts.size() >= 2) {
      if (!IsResourceName(parts[1])) return Invalid(text, "does not name a valid production variant");
      target.variant = std::string(parts[1]);
    }
    if (parts.size() == 3) {
      if (!IsInstanceId(parts[2])) return Invalid(text, "does not name a valid instance id");
      target.instance_id = std::string(parts[2]);
    }
    return target;
  }
  if (!IsResourceName(text)) return Invalid(text, "is not a target");
  target.resource = {ResourceKind::kTrainingJob, std::string(text), true};
  return target;
}

}  // namespace kiln::access
