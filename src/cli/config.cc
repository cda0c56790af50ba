#include "cli/config.h"

#include <arpa/inet.h>

#include <cstdint>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/strings.h"
#include "net/http_server.h"

namespace kiln::cli {

namespace {
using nlohmann::json;

Status Field(const json& doc, const char* name, std::string* out, const std::string& path) {
  if (!doc.contains(name)) return Status::Ok();
  if (!doc[name].is_string()) return Status::InvalidArgument(path + ": \"" + name + "\" must be a string");
  *out = doc[name].get<std::string>();
  return Status::Ok();
}

Status Field(const json& doc, const char* name, bool* out, const std::string& path) {
  if (!doc.contains(name)) return Status::Ok();
  if (!doc[name].is_boolean()) return Status::InvalidArgument(path + ": \"" + name + "\" must be true or false");
  *out = doc[name].get<bool>();
  return Status::Ok();
}

Status Field(const json& doc, const char* name, int* out, const std::string& path) {
  if (!doc.contains(name)) return Status::Ok();
  if (!doc[name].is_number_integer()) return Status::InvalidArgument(path + ": \"" + name + "\" must be an integer");
  *out = doc[name].get<int>();
  return Status::Ok();
}

Status Field(const json& doc, const char* name, double* out, const std::string& path) {
  if (!doc.contains(name)) return Status::Ok();
  if (!doc[name].is_number()) return Status::InvalidArgument(path + ": \"" + name + "\" must be a number");
  *out = doc[name].get<double>();
  return Status::Ok();
}

Status StringList(const json& doc, const char* name, std::vector<std::string>* out, const std::string& path) {
  if (!doc.contains(name)) return Status::Ok();
  if (!doc[name].is_array()) return Status::InvalidArgument(path + ": \"" + name + "\" must be a list of strings");
  out->clear();
  for (const auto& v : doc[name]) {
    if (!v.is_string()) return Status::InvalidArgument(path + ": \"" + name + "\" must be a list of strings");
    out->push_back(v.get<std::string>());
  }
  return Status::Ok();
}

// The sections of the config file, each applied over `config` by its own step; `path` names the
// file in errors. A section that is absent leaves `config` as it was.

Status LoadCredentials(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("credentials")) return Status::Ok();
  if (!doc["credentials"].is_array()) return Status::InvalidArgument(path + ": \"credentials\" must be a list");
  config->credentials.clear();
  for (const auto& k : doc["credentials"]) {
    if (!k.is_object() || !k.contains("access_key_id") || !k.contains("secret_access_key") ||
        !k["access_key_id"].is_string() || !k["secret_access_key"].is_string()) {
      return Status::InvalidArgument(path + ": each credential needs string access_key_id and secret_access_key");
    }
    aws::Credential c;
    c.access_key_id = k["access_key_id"].get<std::string>();
    c.secret_access_key = k["secret_access_key"].get<std::string>();
    if (c.access_key_id.empty() || c.secret_access_key.size() < 16) {
      return Status::InvalidArgument(path + ": credential " + c.access_key_id +
                                     " needs a non-empty key id and a secret of at least 16 characters");
    }
    c.session_token = k.value("session_token", "");
    c.account_id = k.value("account_id", "");
    c.principal_arn = k.value("principal_arn", "");
    c.user_id = k.value("user_id", "");
    config->credentials.push_back(std::move(c));
  }
  return Status::Ok();
}

// "scheduler", "instance_types" and "environments" are kept as JSON for their owners to parse;
// only their shape is checked here.
Status LoadOwnerSections(const json& doc, Config* config, const std::string& path) {
  if (doc.contains("scheduler") && !doc["scheduler"].is_object()) {
    return Status::InvalidArgument(path + ": \"scheduler\" must be an object");
  }
  if (doc.contains("instance_types") && !doc["instance_types"].is_array() && !doc["instance_types"].is_object()) {
    return Status::InvalidArgument(path + ": \"instance_types\" must be a list of instance-type rows");
  }
  if (doc.contains("scheduler")) config->scheduler = doc["scheduler"];
  if (doc.contains("instance_types")) config->instance_types = doc["instance_types"];
  if (doc.contains("environments")) {
    if (!doc["environments"].is_array()) return Status::InvalidArgument(path + ": \"environments\" must be a list");
    config->environments = doc["environments"];
  }
  return Status::Ok();
}

Status LoadTraining(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("training")) return Status::Ok();
  const json& t = doc["training"];
  if (!t.is_object()) return Status::InvalidArgument(path + ": \"training\" must be an object");
  RETURN_IF_ERROR(Field(t, "stop_grace_seconds", &config->training.stop_grace_seconds, path));
  RETURN_IF_ERROR(Field(t, "keep_host_dirs", &config->training.keep_host_dirs, path));
  RETURN_IF_ERROR(Field(t, "staging_parallelism", &config->training.staging_parallelism, path));
  RETURN_IF_ERROR(Field(t, "toolkit_dir", &config->training.toolkit_dir, path));
  if (config->training.stop_grace_seconds < 0 || config->training.staging_parallelism < 1) {
    return Status::InvalidArgument(path +
                                   ": training.stop_grace_seconds must be >= 0 and "
                                   "training.staging_parallelism >= 1");
  }
  return Status::Ok();
}

Status LoadEndpoints(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("endpoints")) return Status::Ok();
  const json& e = doc["endpoints"];
  if (!e.is_object()) return Status::InvalidArgument(path + ": \"endpoints\" must be an object");
  RETURN_IF_ERROR(Field(e, "invocation_timeout_seconds", &config->endpoints.invocation_timeout_seconds, path));
  RETURN_IF_ERROR(Field(e, "stop_grace_seconds", &config->endpoints.stop_grace_seconds, path));
  RETURN_IF_ERROR(Field(e, "health_interval_seconds", &config->endpoints.health_interval_seconds, path));
  RETURN_IF_ERROR(Field(e, "provision_timeout_seconds", &config->endpoints.provision_timeout_seconds, path));
  RETURN_IF_ERROR(Field(e, "model_server", &config->endpoints.model_server, path));
  if (e.contains("port_range")) {
    const json& r = e["port_range"];
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer()) {
      return Status::InvalidArgument(path + ": endpoints.port_range must be [first, end), e.g. [20000, 30000]");
    }
    config->endpoints.port_range_begin = r[0].get<int>();
    config->endpoints.port_range_end = r[1].get<int>();
  }
  const auto& ec = config->endpoints;
  if (ec.invocation_timeout_seconds < 1 || ec.stop_grace_seconds < 0 || ec.health_interval_seconds <= 0 ||
      ec.port_range_begin < 1024 || ec.port_range_end > 65536 || ec.port_range_end - ec.port_range_begin < 100 ||
      ec.provision_timeout_seconds < 1) {
    return Status::InvalidArgument(path +
                                   ": endpoints: invocation_timeout_seconds >= 1, stop_grace_seconds >= 0, "
                                   "health_interval_seconds > 0, provision_timeout_seconds >= 1, port_range "
                                   "within [1024, 65536) and at least 100 ports wide");
  }
  return Status::Ok();
}

Status LoadHttp(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("http")) return Status::Ok();
  const json& h = doc["http"];
  if (!h.is_object()) return Status::InvalidArgument(path + ": \"http\" must be an object");
  HttpConfig& hc = config->http;
  const std::string where = path + ": http";  // errors say which section
  RETURN_IF_ERROR(Field(h, "max_connections", &hc.max_connections, where));
  RETURN_IF_ERROR(Field(h, "max_connections_per_address", &hc.max_connections_per_address, where));
  RETURN_IF_ERROR(Field(h, "first_byte_timeout_seconds", &hc.first_byte_timeout_seconds, where));
  RETURN_IF_ERROR(Field(h, "header_timeout_seconds", &hc.header_timeout_seconds, where));
  RETURN_IF_ERROR(Field(h, "idle_timeout_seconds", &hc.idle_timeout_seconds, where));
  RETURN_IF_ERROR(Field(h, "io_timeout_seconds", &hc.io_timeout_seconds, where));
  RETURN_IF_ERROR(Field(h, "event_loops", &hc.event_loops, where));
  RETURN_IF_ERROR(Field(h, "worker_threads", &hc.worker_threads, where));
  if (hc.max_connections < 1 || hc.max_connections_per_address < 1 || hc.first_byte_timeout_seconds < 1 ||
      hc.header_timeout_seconds < 1 || hc.idle_timeout_seconds < 1 || hc.io_timeout_seconds < 1 ||
      hc.worker_threads < 1) {
    return Status::InvalidArgument(path +
                                   ": http: max_connections, max_connections_per_address, worker_threads and every "
                                   "*_timeout_seconds must be >= 1");
  }
  if (hc.event_loops < 0 || hc.event_loops > 1024) {
    return Status::InvalidArgument(path + ": http: event_loops must be between 0 (one per core) and 1024");
  }
  return Status::Ok();
}

Status LoadArchives(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("archives")) return Status::Ok();
  const json& a = doc["archives"];
  if (!a.is_object()) return Status::InvalidArgument(path + ": \"archives\" must be an object");
  RETURN_IF_ERROR(Field(a, "max_unpacked_mib", &config->archives.max_unpacked_mib, path));
  RETURN_IF_ERROR(Field(a, "max_entries", &config->archives.max_entries, path));
  if (config->archives.max_unpacked_mib < 0 || config->archives.max_entries < 1) {
    return Status::InvalidArgument(path +
                                   ": archives.max_unpacked_mib must be >= 0 (0: from each instance's "
                                   "volume) and archives.max_entries >= 1");
  }
  return Status::Ok();
}

Status LoadInstanceMetrics(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("instance_metrics")) return Status::Ok();
  const json& m = doc["instance_metrics"];
  if (!m.is_object()) return Status::InvalidArgument(path + ": \"instance_metrics\" must be an object");
  RETURN_IF_ERROR(Field(m, "interval_seconds", &config->instance_metrics.interval_seconds, path));
  RETURN_IF_ERROR(StringList(m, "gpu_command", &config->instance_metrics.gpu_command, path));
  if (!(config->instance_metrics.interval_seconds >= 0.1 && config->instance_metrics.interval_seconds <= 3600)) {
    return Status::InvalidArgument(path + ": instance_metrics.interval_seconds must be between 0.1 and 3600");
  }
  if (m.contains("gpu_command") &&
      (config->instance_metrics.gpu_command.empty() || config->instance_metrics.gpu_command[0].empty())) {
    return Status::InvalidArgument(path + ": instance_metrics.gpu_command must name a program (argv list)");
  }
  return Status::Ok();
}

// "a.b.c.d/n": an IPv4 network address (no host bits set) and a prefix length 8..30 (the range must hold at least one
// subnet besides the first, which BridgeNetworks skips).
bool ParseIpv4Cidr(const std::string& cidr, int* prefix) {
  const size_t slash = cidr.find('/');
  if (slash == std::string::npos || slash + 1 >= cidr.size() || cidr.size() - slash > 3) return false;
  in_addr address{};
  if (::inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &address) != 1) return false;
  const std::string digits = cidr.substr(slash + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *prefix = std::stoi(digits);
  if (*prefix < 8 || *prefix > 30) return false;
  // No host bits: "10.213.0.0/16", not "10.213.0.1/16" (a typo that would move the range).
  const uint32_t host_bits = 0xffffffffu >> *prefix;
  return (ntohl(address.s_addr) & host_bits) == 0;
}

Status LoadNetwork(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("network")) return Status::Ok();
  const json& n = doc["network"];
  if (!n.is_object()) return Status::InvalidArgument(path + ": \"network\" must be an object");
  NetworkConfig& nc = config->network;
  const std::string where = path + ": network";
  RETURN_IF_ERROR(Field(n, "mode", &nc.mode, where));
  RETURN_IF_ERROR(Field(n, "cidr", &nc.cidr, where));
  RETURN_IF_ERROR(Field(n, "subnet_prefix", &nc.subnet_prefix, where));
  RETURN_IF_ERROR(Field(n, "firewall", &nc.firewall, where));
  if (nc.mode != "auto" && nc.mode != "namespaces" && nc.mode != "host") {
    return Status::InvalidArgument(path + ": network.mode must be \"auto\", \"namespaces\" or \"host\", got \"" +
                                   nc.mode + "\"");
  }
  int cidr_prefix = 0;
  if (!ParseIpv4Cidr(nc.cidr, &cidr_prefix)) {
    return Status::InvalidArgument(
        path + ": network.cidr must be an IPv4 range a.b.c.d/n with n from 8 to 30 and no host bits set, got \"" +
        nc.cidr + "\"");
  }
  if (nc.subnet_prefix < 16 || nc.subnet_prefix > 28 || nc.subnet_prefix <= cidr_prefix) {
    return Status::InvalidArgument(path +
                                   ": network.subnet_prefix must be from 16 to 28 and longer than the prefix of "
                                   "network.cidr (" +
                                   nc.cidr + "), got " + std::to_string(nc.subnet_prefix));
  }
  return Status::Ok();
}

// An rlimit value of container_engine.ulimits: a non-negative integer or "unlimited" (-1).
bool UlimitValue(const json& v, int64_t* out) {
  if (v.is_string() && v.get<std::string>() == "unlimited") {
    *out = -1;
    return true;
  }
  if (!v.is_number_integer() || v.get<int64_t>() < 0) return false;
  *out = v.get<int64_t>();
  return true;
}

Status LoadContainerEngine(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("container_engine")) return Status::Ok();
  const json& e = doc["container_engine"];
  const std::string where = path + ": container_engine";
  if (!e.is_object()) {
    return Status::InvalidArgument(where + " must be an object, e.g. {\"socket\": \"unix:///run/podman/podman.sock\"}");
  }
  // A misspelt key would otherwise be silently ignored (and the engine not used as meant).
  static const std::set<std::string> kKeys = {"socket",     "images",       "ecr_mirror", "registries",        "gpus",
                                              "log_driver", "shm_fraction", "ulimits",    "lost_after_seconds"};
  for (const auto& [key, value] : e.items()) {
    if (kKeys.count(key) == 0) {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are socket, images, ecr_mirror, registries, gpus, log_driver, "
                                     "shm_fraction, ulimits and lost_after_seconds");
    }
  }
  ContainerEngineConfig& ce = config->container_engine;
  RETURN_IF_ERROR(Field(e, "socket", &ce.socket, where));
  RETURN_IF_ERROR(StringList(e, "images", &ce.images, where));
  RETURN_IF_ERROR(Field(e, "ecr_mirror", &ce.ecr_mirror, where));
  RETURN_IF_ERROR(Field(e, "gpus", &ce.gpus, where));
  RETURN_IF_ERROR(Field(e, "log_driver", &ce.log_driver, where));
  RETURN_IF_ERROR(Field(e, "shm_fraction", &ce.shm_fraction, where));
  RETURN_IF_ERROR(Field(e, "lost_after_seconds", &ce.lost_after_seconds, where));

  // The engine's API socket: "unix:///path" or "/path", kept as "unix:///path".
  if (!ce.socket.empty()) {
    std::string socket_path = ce.socket;
    if (socket_path.rfind("unix://", 0) == 0) {
      socket_path = socket_path.substr(7);
    } else if (socket_path.find("://") != std::string::npos) {
      return Status::InvalidArgument(where + ".socket must be a Unix socket, \"unix:///path\" or \"/path\" (e.g. " +
                                     "unix:///run/podman/podman.sock or /var/run/docker.sock), got \"" + ce.socket +
                                     "\"");
    }
    if (socket_path.empty() || socket_path[0] != '/') {
      return Status::InvalidArgument(where +
                                     ".socket must be an absolute path, \"unix:///path\" or \"/path\" (e.g. "
                                     "unix:///run/podman/podman.sock), got \"" +
                                     ce.socket + "\"");
    }
    ce.socket = "unix://" + socket_path;
    if (!e.contains("images")) ce.images = {"*"};
  }
  for (const std::string& pattern : ce.images) {
    if (pattern.empty()) {
      return Status::InvalidArgument(where + ".images: an empty pattern matches nothing; use \"*\" for every image");
    }
    if (pattern.rfind("local:", 0) == 0) {
      return Status::InvalidArgument(where + ".images: \"" + pattern +
                                     "\": local: images always run on the process runtime; remove the pattern");
    }
  }
  if (e.contains("registries")) {
    const json& r = e["registries"];
    if (!r.is_object()) {
      return Status::InvalidArgument(where +
                                     ".registries must be an object of registry host[:port] -> {\"username\": ..., "
                                     "\"password\": ...}");
    }
    ce.registries.clear();
    for (const auto& [host, cred] : r.items()) {
      if (host.empty() || host.find('/') != std::string::npos) {
        return Status::InvalidArgument(where + ".registries: \"" + host +
                                       "\" is not a registry host[:port] (e.g. \"registry.local:5000\")");
      }
      if (!cred.is_object() || !cred.contains("username") || !cred.contains("password") ||
          !cred["username"].is_string() || !cred["password"].is_string() ||
          cred["username"].get<std::string>().empty()) {
        return Status::InvalidArgument(where + ".registries[\"" + host +
                                       "\"] needs a non-empty string \"username\" and a string \"password\"");
      }
      ce.registries[host] = {cred["username"].get<std::string>(), cred["password"].get<std::string>()};
    }
  }
  if (ce.gpus != "auto" && ce.gpus != "device_requests" && ce.gpus != "cdi" && ce.gpus != "devices") {
    return Status::InvalidArgument(where +
                                   ".gpus must be \"auto\" (device nodes on Podman, device requests on Docker), " +
                                   "\"device_requests\", \"cdi\" or \"devices\", got \"" + ce.gpus + "\"");
  }
  if (!(ce.shm_fraction > 0 && ce.shm_fraction <= 1)) {
    return Status::InvalidArgument(where +
                                   ".shm_fraction must be above 0 and at most 1 (the share of the instance's "
                                   "memory /dev/shm gets; SageMaker gives about 0.5), got " +
                                   std::to_string(ce.shm_fraction));
  }
  if (ce.lost_after_seconds < 1) {
    return Status::InvalidArgument(where + ".lost_after_seconds must be >= 1, got " +
                                   std::to_string(ce.lost_after_seconds));
  }
  if (e.contains("ulimits")) {
    const json& u = e["ulimits"];
    if (!u.is_object()) {
      return Status::InvalidArgument(where +
                                     ".ulimits must be an object of name -> [soft, hard] or \"unlimited\", e.g. "
                                     "{\"nofile\": [65536, 65536], \"memlock\": \"unlimited\"}");
    }
    ce.ulimits.clear();
    for (const auto& [name, value] : u.items()) {
      if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) {
        return Status::InvalidArgument(where + ".ulimits: \"" + name +
                                       "\" is not a limit name (nofile, nproc, memlock, stack, core, ...)");
      }
      ContainerEngineConfig::Ulimit limit{name, 0, 0};
      bool ok = false;
      if (value.is_array()) {
        ok = value.size() == 2 && UlimitValue(value[0], &limit.soft) && UlimitValue(value[1], &limit.hard);
      } else if (value.is_string() && value.get<std::string>() == "unlimited") {
        limit.soft = limit.hard = -1;
        ok = true;
      }
      if (!ok) {
        return Status::InvalidArgument(where + ".ulimits." + name +
                                       " must be [soft, hard] (non-negative integers or \"unlimited\") or "
                                       "\"unlimited\", got " +
                                       value.dump());
      }
      // -1 is unlimited, above any number.
      auto rank = [](int64_t v) { return v < 0 ? INT64_MAX : v; };
      if (rank(limit.soft) > rank(limit.hard)) {
        return Status::InvalidArgument(where + ".ulimits." + name + ": the soft limit " + value[0].dump() +
                                       " is above the hard limit " + value[1].dump());
      }
      ce.ulimits.push_back(std::move(limit));
    }
  }
  return Status::Ok();
}

Status LoadRemoteAccess(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("remote_access")) return Status::Ok();
  const json& r = doc["remote_access"];
  const std::string where = path + ": remote_access";
  if (!r.is_object()) return Status::InvalidArgument(where + " must be an object, e.g. {\"enabled\": true}");
  static const std::set<std::string> kKeys = {"enabled", "allowed_principals", "allow_network_isolated",
                                              "idle_timeout_seconds", "max_connection_seconds"};
  for (const auto& [key, value] : r.items()) {
    if (kKeys.count(key) == 0) {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are enabled, allowed_principals, allow_network_isolated, "
                                     "idle_timeout_seconds and max_connection_seconds");
    }
  }
  RemoteAccessConfig& ra = config->remote_access;
  RETURN_IF_ERROR(Field(r, "enabled", &ra.enabled, where));
  RETURN_IF_ERROR(StringList(r, "allowed_principals", &ra.allowed_principals, where));
  RETURN_IF_ERROR(Field(r, "allow_network_isolated", &ra.allow_network_isolated, where));
  RETURN_IF_ERROR(Field(r, "idle_timeout_seconds", &ra.idle_timeout_seconds, where));
  RETURN_IF_ERROR(Field(r, "max_connection_seconds", &ra.max_connection_seconds, where));
  for (const std::string& pattern : ra.allowed_principals) {
    if (pattern.empty()) {
      return Status::InvalidArgument(where +
                                     ".allowed_principals: an empty pattern matches nobody; use \"*\" for "
                                     "every principal or an ARN glob such as arn:aws:iam::*:user/alice");
    }
  }
  if (ra.idle_timeout_seconds < 1) {
    return Status::InvalidArgument(where + ".idle_timeout_seconds must be >= 1, got " +
                                   std::to_string(ra.idle_timeout_seconds));
  }
  if (ra.max_connection_seconds < 0) {
    return Status::InvalidArgument(where + ".max_connection_seconds must be >= 0 (0: no limit), got " +
                                   std::to_string(ra.max_connection_seconds));
  }
  return Status::Ok();
}

Status LoadTuning(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("tuning")) return Status::Ok();
  const json& t = doc["tuning"];
  const std::string where = path + ": tuning";
  if (!t.is_object())
    return Status::InvalidArgument(where + " must be an object, e.g. {\"max_parallel_training_jobs\": 100}");
  for (const auto& [key, value] : t.items()) {
    if (key != "max_parallel_training_jobs" && key != "max_number_of_training_jobs") {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are max_parallel_training_jobs and max_number_of_training_jobs");
    }
  }
  TuningConfig& tuning = config->tuning;
  RETURN_IF_ERROR(Field(t, "max_parallel_training_jobs", &tuning.max_parallel_training_jobs, where));
  RETURN_IF_ERROR(Field(t, "max_number_of_training_jobs", &tuning.max_number_of_training_jobs, where));
  if (tuning.max_parallel_training_jobs < 1 || tuning.max_number_of_training_jobs < 1) {
    return Status::InvalidArgument(where + ": max_parallel_training_jobs and max_number_of_training_jobs must be >= 1");
  }
  return Status::Ok();
}

Status LoadAutoscaling(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("autoscaling")) return Status::Ok();
  const json& a = doc["autoscaling"];
  const std::string where = path + ": autoscaling";
  if (!a.is_object()) return Status::InvalidArgument(where + " must be an object, e.g. {\"period_seconds\": 60}");
  for (const auto& [key, value] : a.items()) {
    if (key != "period_seconds") {
      return Status::InvalidArgument(where + ": unknown key \"" + key + "\"; the key is period_seconds");
    }
  }
  RETURN_IF_ERROR(Field(a, "period_seconds", &config->autoscaling.period_seconds, where));
  if (config->autoscaling.period_seconds < 1 || config->autoscaling.period_seconds > 3600) {
    return Status::InvalidArgument(where + ".period_seconds must be 1..3600, got " +
                                   std::to_string(config->autoscaling.period_seconds));
  }
  return Status::Ok();
}

Status LoadConsole(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("console")) return Status::Ok();
  const json& c = doc["console"];
  const std::string where = path + ": console";
  if (!c.is_object()) {
    return Status::InvalidArgument(where + " must be an object, e.g. {\"enabled\": true, \"session_minutes\": 720}");
  }
  for (const auto& [key, value] : c.items()) {
    if (key != "enabled" && key != "session_minutes") {
      return Status::InvalidArgument(where + ": unknown key \"" + key + "\"; the keys are enabled and session_minutes");
    }
  }
  RETURN_IF_ERROR(Field(c, "enabled", &config->console.enabled, where));
  RETURN_IF_ERROR(Field(c, "session_minutes", &config->console.session_minutes, where));
  if (config->console.session_minutes < 1 || config->console.session_minutes > 43200) {
    return Status::InvalidArgument(where + ".session_minutes must be 1..43200 (30 days), got " +
                                   std::to_string(config->console.session_minutes));
  }
  return Status::Ok();
}

Status LoadDataCapture(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("data_capture")) return Status::Ok();
  const json& a = doc["data_capture"];
  const std::string where = path + ": data_capture";
  if (!a.is_object()) {
    return Status::InvalidArgument(where + " must be an object, e.g. {\"flush_interval_seconds\": 60}");
  }
  for (const auto& [key, value] : a.items()) {
    if (key != "flush_interval_seconds" && key != "max_buffer_mb") {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are flush_interval_seconds and max_buffer_mb");
    }
  }
  RETURN_IF_ERROR(Field(a, "flush_interval_seconds", &config->data_capture.flush_interval_seconds, where));
  if (config->data_capture.flush_interval_seconds < 0.1 || config->data_capture.flush_interval_seconds > 3600) {
    return Status::InvalidArgument(where + ".flush_interval_seconds must be 0.1..3600, got " +
                                   std::to_string(config->data_capture.flush_interval_seconds));
  }
  RETURN_IF_ERROR(Field(a, "max_buffer_mb", &config->data_capture.max_buffer_mb, where));
  if (config->data_capture.max_buffer_mb < 1 || config->data_capture.max_buffer_mb > 65536) {
    return Status::InvalidArgument(where + ".max_buffer_mb must be 1..65536, got " +
                                   std::to_string(config->data_capture.max_buffer_mb));
  }
  return Status::Ok();
}

Status LoadMultiModel(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("multi_model")) return Status::Ok();
  const json& a = doc["multi_model"];
  const std::string where = path + ": multi_model";
  if (!a.is_object()) return Status::InvalidArgument(where + " must be an object, e.g. {\"load_wait_seconds\": 60}");
  for (const auto& [key, value] : a.items()) {
    if (key != "load_wait_seconds") {
      return Status::InvalidArgument(where + ": unknown key \"" + key + "\"; the key is load_wait_seconds");
    }
  }
  RETURN_IF_ERROR(Field(a, "load_wait_seconds", &config->multi_model.load_wait_seconds, where));
  if (config->multi_model.load_wait_seconds < 0.1 || config->multi_model.load_wait_seconds > 3600) {
    return Status::InvalidArgument(where + ".load_wait_seconds must be 0.1..3600, got " +
                                   std::to_string(config->multi_model.load_wait_seconds));
  }
  return Status::Ok();
}

Status LoadSlurm(const json& doc, Config* config, const std::string& path) {
  RETURN_IF_ERROR(Field(doc, "runtime", &config->runtime, path));
  if (!doc.contains("slurm")) return Status::Ok();
  const json& s = doc["slurm"];
  const std::string where = path + ": slurm";
  if (!s.is_object()) {
    return Status::InvalidArgument(where + " must be an object, e.g. {\"server_url\": \"http://10.77.0.1:5456\"}");
  }
  static const std::set<std::string> kKeys = {"server_url",   "partition",      "qos",          "account",
                                              "node_command", "scratch_dir",    "poll_seconds", "sbatch_args",
                                              "request_cpus", "request_memory", "bin_dir"};
  for (const auto& [key, value] : s.items()) {
    if (kKeys.count(key) == 0) {
      return Status::InvalidArgument(
          where + ": unknown key \"" + key +
          "\"; the keys are server_url, partition, qos, account, node_command, "
          "scratch_dir, poll_seconds, sbatch_args, request_cpus, request_memory and bin_dir");
    }
  }
  SlurmConfig& c = config->slurm;
  RETURN_IF_ERROR(Field(s, "server_url", &c.server_url, where));
  RETURN_IF_ERROR(Field(s, "partition", &c.partition, where));
  RETURN_IF_ERROR(Field(s, "qos", &c.qos, where));
  RETURN_IF_ERROR(Field(s, "account", &c.account, where));
  RETURN_IF_ERROR(StringList(s, "node_command", &c.node_command, where));
  RETURN_IF_ERROR(Field(s, "scratch_dir", &c.scratch_dir, where));
  RETURN_IF_ERROR(Field(s, "poll_seconds", &c.poll_seconds, where));
  RETURN_IF_ERROR(StringList(s, "sbatch_args", &c.sbatch_args, where));
  RETURN_IF_ERROR(Field(s, "request_cpus", &c.request_cpus, where));
  RETURN_IF_ERROR(Field(s, "request_memory", &c.request_memory, where));
  RETURN_IF_ERROR(Field(s, "bin_dir", &c.bin_dir, where));
  return Status::Ok();
}

Status LoadServerless(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("serverless")) return Status::Ok();
  const json& a = doc["serverless"];
  const std::string where = path + ": serverless";
  if (!a.is_object()) return Status::InvalidArgument(where + " must be an object, e.g. {\"idle_seconds\": 600}");
  for (const auto& [key, value] : a.items()) {
    if (key != "idle_seconds" && key != "account_max_concurrency") {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are idle_seconds and account_max_concurrency");
    }
  }
  RETURN_IF_ERROR(Field(a, "idle_seconds", &config->serverless.idle_seconds, where));
  if (config->serverless.idle_seconds < 1 || config->serverless.idle_seconds > 86400) {
    return Status::InvalidArgument(where + ".idle_seconds must be 1..86400, got " +
                                   std::to_string(config->serverless.idle_seconds));
  }
  RETURN_IF_ERROR(Field(a, "account_max_concurrency", &config->serverless.account_max_concurrency, where));
  if (config->serverless.account_max_concurrency < 1 || config->serverless.account_max_concurrency > 100000) {
    return Status::InvalidArgument(where + ".account_max_concurrency must be 1..100000, got " +
                                   std::to_string(config->serverless.account_max_concurrency));
  }
  return Status::Ok();
}

Status LoadAsyncInference(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("async_inference")) return Status::Ok();
  const json& a = doc["async_inference"];
  const std::string where = path + ": async_inference";
  if (!a.is_object()) {
    return Status::InvalidArgument(where +
                                   " must be an object, e.g. {\"notifications\": {\"<topic arn>\": "
                                   "\"http://127.0.0.1:9000/hook\"}}");
  }
  for (const auto& [key, value] : a.items()) {
    if (key != "notifications" && key != "max_queue_per_endpoint" && key != "default_max_concurrency") {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are notifications, max_queue_per_endpoint, "
                                     "default_max_concurrency");
    }
  }
  AsyncInferenceConfig& out = config->async_inference;
  if (a.contains("notifications")) {
    if (!a["notifications"].is_object()) return Status::InvalidArgument(where + ".notifications must be an object");
    for (const auto& [topic, url] : a["notifications"].items()) {
      if (!url.is_string() || url.get<std::string>().rfind("http://", 0) != 0) {
        return Status::InvalidArgument(where + ".notifications[\"" + topic + "\"] must be an http:// URL");
      }
      out.notifications[topic] = url.get<std::string>();
    }
  }
  RETURN_IF_ERROR(Field(a, "max_queue_per_endpoint", &out.max_queue_per_endpoint, where));
  RETURN_IF_ERROR(Field(a, "default_max_concurrency", &out.default_max_concurrency, where));
  if (out.max_queue_per_endpoint < 1 || out.default_max_concurrency < 1 || out.default_max_concurrency > 1000) {
    return Status::InvalidArgument(where + ": max_queue_per_endpoint must be >= 1 and default_max_concurrency 1..1000");
  }
  return Status::Ok();
}

constexpr double kMaxRestartDelaySeconds = 365.0 * 24 * 3600;

Status LoadSpot(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("spot")) return Status::Ok();
  const json& s = doc["spot"];
  const std::string where = path + ": spot";
  if (!s.is_object())
    return Status::InvalidArgument(where + " must be an object, e.g. {\"interrupt_after_seconds\": [600]}");
  static const std::set<std::string> kKeys = {"interrupt_after_seconds", "interrupt_probability_per_hour",
                                              "restart_delay_seconds", "preempt_for_on_demand", "seed"};
  for (const auto& [key, value] : s.items()) {
    if (kKeys.count(key) == 0) {
      return Status::InvalidArgument(where + ": unknown key \"" + key +
                                     "\"; the keys are interrupt_after_seconds, interrupt_probability_per_hour, "
                                     "restart_delay_seconds, preempt_for_on_demand and seed");
    }
  }
  SpotConfig& spot = config->spot;
  if (s.contains("interrupt_after_seconds")) {
    const json& list = s["interrupt_after_seconds"];
    if (!list.is_array()) {
      return Status::InvalidArgument(where +
                                     ".interrupt_after_seconds must be a list of seconds >= 0 (attempt n of each "
                                     "spot job is interrupted after [n] seconds of training), got " +
                                     list.dump());
    }
    std::vector<double> seconds;
    for (const json& v : list) {
      if (!v.is_number() || v.get<double>() < 0) {
        return Status::InvalidArgument(where + ".interrupt_after_seconds must be a list of seconds >= 0, got " +
                                       v.dump() + " in it");
      }
      seconds.push_back(v.get<double>());
    }
    spot.interrupt_after_seconds = std::move(seconds);
  }
  RETURN_IF_ERROR(Field(s, "interrupt_probability_per_hour", &spot.interrupt_probability_per_hour, where));
  RETURN_IF_ERROR(Field(s, "restart_delay_seconds", &spot.restart_delay_seconds, where));
  RETURN_IF_ERROR(Field(s, "preempt_for_on_demand", &spot.preempt_for_on_demand, where));
  if (s.contains("seed")) {
    if (!s["seed"].is_number_unsigned()) {
      return Status::InvalidArgument(where + ".seed must be an integer >= 0 (0: from the clock), got " +
                                     s["seed"].dump());
    }
    spot.seed = s["seed"].get<uint64_t>();
  }
  // !(x >= lo) also refuses NaN (not valid JSON, but cheap to be sure).
  if (!(spot.interrupt_probability_per_hour >= 0 && spot.interrupt_probability_per_hour <= 3600)) {
    return Status::InvalidArgument(where + ".interrupt_probability_per_hour must be between 0 and 3600, got " +
                                   std::to_string(spot.interrupt_probability_per_hour));
  }
  // At most a year: the server holds the delay in milliseconds (int64).
  if (!(spot.restart_delay_seconds >= 0 && spot.restart_delay_seconds <= kMaxRestartDelaySeconds)) {
    return Status::InvalidArgument(where + ".restart_delay_seconds must be between 0 and 31536000 (a year), got " +
                                   std::to_string(spot.restart_delay_seconds));
  }
  return Status::Ok();
}

Status LoadObjectStore(const json& doc, Config* config, const std::string& path) {
  if (!doc.contains("object_store")) return Status::Ok();
  const json& os = doc["object_store"];
  if (!os.is_object()) return Status::InvalidArgument(path + ": \"object_store\" must be an object");
  RETURN_IF_ERROR(Field(os, "backend", &config->object_store.backend, path));
  RETURN_IF_ERROR(Field(os, "endpoint", &config->object_store.endpoint, path));
  RETURN_IF_ERROR(Field(os, "region", &config->object_store.region, path));
  RETURN_IF_ERROR(Field(os, "access_key_id", &config->object_store.access_key_id, path));
  RETURN_IF_ERROR(Field(os, "secret_access_key", &config->object_store.secret_access_key, path));
  RETURN_IF_ERROR(Field(os, "session_token", &config->object_store.session_token, path));
  return Status::Ok();
}

}  // namespace

Status LoadConfigFile(const std::string& path, Config* config) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument(path + ": not a JSON object");
  }
  RETURN_IF_ERROR(Field(doc, "listen", &config->listen, path));
  RETURN_IF_ERROR(Field(doc, "data_dir", &config->data_dir, path));
  if (doc.contains("region")) {
    std::string region;
    RETURN_IF_ERROR(Field(doc, "region", &region, path));
    config->regions = {region};
  }
  RETURN_IF_ERROR(StringList(doc, "regions", &config->regions, path));
  RETURN_IF_ERROR(Field(doc, "accept_any_region", &config->accept_any_region, path));
  RETURN_IF_ERROR(Field(doc, "account_id", &config->account_id, path));
  if (doc.contains("auth")) {
    std::string auth;
    RETURN_IF_ERROR(Field(doc, "auth", &auth, path));
    if (auth != "sigv4" && auth != "off")
      return Status::InvalidArgument(path + ": \"auth\" must be \"sigv4\" or \"off\"");
    config->auth_enabled = auth == "sigv4";
  }
  RETURN_IF_ERROR(Field(doc, "log_level", &config->log_level, path));
  RETURN_IF_ERROR(Field(doc, "log_format", &config->log_format, path));
  RETURN_IF_ERROR(Field(doc, "public_endpoint", &config->public_endpoint, path));
  RETURN_IF_ERROR(StringList(doc, "virtual_host_suffixes", &config->virtual_host_suffixes, path));
  RETURN_IF_ERROR(LoadCredentials(doc, config, path));
  RETURN_IF_ERROR(LoadOwnerSections(doc, config, path));
  RETURN_IF_ERROR(LoadTraining(doc, config, path));
  RETURN_IF_ERROR(LoadEndpoints(doc, config, path));
  RETURN_IF_ERROR(LoadHttp(doc, config, path));
  RETURN_IF_ERROR(LoadArchives(doc, config, path));
  RETURN_IF_ERROR(LoadInstanceMetrics(doc, config, path));
  RETURN_IF_ERROR(LoadObjectStore(doc, config, path));
  RETURN_IF_ERROR(LoadNetwork(doc, config, path));
  RETURN_IF_ERROR(LoadContainerEngine(doc, config, path));
  RETURN_IF_ERROR(LoadRemoteAccess(doc, config, path));
  RETURN_IF_ERROR(LoadTuning(doc, config, path));
  RETURN_IF_ERROR(LoadSpot(doc, config, path));
  RETURN_IF_ERROR(LoadAutoscaling(doc, config, path));
  RETURN_IF_ERROR(LoadAsyncInference(doc, config, path));
  RETURN_IF_ERROR(LoadServerless(doc, config, path));
  RETURN_IF_ERROR(LoadMultiModel(doc, config, path));
  RETURN_IF_ERROR(LoadDataCapture(doc, config, path));
  RETURN_IF_ERROR(LoadConsole(doc, config, path));
  RETURN_IF_ERROR(LoadSlurm(doc, config, path));
  return Status::Ok();
}

void ApplyEnvironment(Config* config) {
  if (const char* dir = std::getenv("KILN_DATA_DIR"); dir != nullptr && *dir != '\0') {
    config->data_dir = dir;
  }
}

Status Validate(Config* config) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(net::ParseHostPort(config->listen, &host, &port));
  if (config->account_id.size() != 12 || config->account_id.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("account_id must be 12 digits, got \"" + config->account_id + "\"");
  }
  if (config->regions.empty()) return Status::InvalidArgument("at least one region is required");
  if (config->data_dir.empty()) return Status::InvalidArgument("data_dir must not be empty");
  config->data_dir = ExpandHome(config->data_dir);
  if (config->log_format != "logfmt" && config->log_format != "json") {
    return Status::InvalidArgument("log_format must be \"logfmt\" or \"json\"");
  }
  for (auto& c : config->credentials) {
    if (c.account_id.empty()) c.account_id = config->account_id;
    if (c.principal_arn.empty()) c.principal_arn = "arn:aws:iam::" + c.account_id + ":user/kiln";
    if (c.user_id.empty()) c.user_id = "AIDA" + c.access_key_id;
  }
  const ObjectStoreConfig& os = config->object_store;
  if (os.backend != "fs" && os.backend != "s3") {
    return Status::InvalidArgument("object_store.backend must be \"fs\" or \"s3\", got \"" + os.backend + "\"");
  }
  if (os.backend == "s3" && (os.endpoint.empty() || os.access_key_id.empty() || os.secret_access_key.empty())) {
    return Status::InvalidArgument("object_store backend \"s3\" needs endpoint, access_key_id and secret_access_key");
  }
  if (config->runtime != "process" && config->runtime != "slurm") {
    return Status::InvalidArgument("runtime must be \"process\" or \"slurm\", got \"" + config->runtime + "\"");
  }
  if (config->runtime == "slurm") {
    const SlurmConfig& s = config->slurm;
    if (!StartsWith(s.server_url, "http://") && !StartsWith(s.server_url, "https://")) {
      return Status::InvalidArgument(
          "runtime \"slurm\" needs slurm.server_url, the http:// URL at which the compute nodes reach this server "
          "(e.g. http://10.77.0.1:5456), got \"" +
          s.server_url + "\"");
    }
    if (s.node_command.empty() || s.node_command.front().empty()) {
      return Status::InvalidArgument("slurm.node_command must name the kiln binary on the compute nodes");
    }
    if (s.scratch_dir.empty() || s.scratch_dir.front() != '/') {
      return Status::InvalidArgument("slurm.scratch_dir must be an absolute path, got \"" + s.scratch_dir + "\"");
    }
    if (s.poll_seconds < 0.2 || s.poll_seconds > 60) {
      return Status::InvalidArgument("slurm.poll_seconds must be 0.2..60, got " + std::to_string(s.poll_seconds));
    }
    if (config->container_engine.enabled()) {
      return Status::InvalidArgument(
          "runtime \"slurm\" cannot run container images yet: remove container_engine from the config file");
    }
  }
  if (!net::IsLoopbackHost(host)) {
    if (config->credentials.empty()) {
      return Status::PermissionDenied(
          "refusing to listen on " + config->listen +
          " (not a loopback address) without explicitly configured credentials: add a \"credentials\" list to the "
          "config file (see README), or listen on 127.0.0.1");
    }
    if (!config->auth_enabled) {
      return Status::PermissionDenied("refusing to listen on " + config->listen + " with \"auth\": \"off\"");
    }
  }
  return Status::Ok();
}

std::string ClientEndpoint(const Config& config) {
  if (!config.public_endpoint.empty()) return config.public_endpoint;
  std::string host;
  uint16_t port = 0;
  if (!net::ParseHostPort(config.listen, &host, &port).ok()) return "http://" + config.listen;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::") host = "::1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port);
}

}  // namespace kiln::cli
