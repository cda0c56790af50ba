#pragma once
// Server configuration: defaults, then the JSON config file (--config), then KILN_DATA_DIR, then
// command-line flags. Every field is optional in the file.
//
//   {
//     "listen": "127.0.0.1:5456",
//     "data_dir": "~/.kiln",
//     "region": "us-east-1",            // or "regions": ["us-east-1", "eu-west-1"]
//     "accept_any_region": false,
//     "account_id": "000000000000",
//     "auth": "sigv4",                  // or "off" (loopback only)
//     "log_level": "info", "log_format": "logfmt",   // or "json"
//     "public_endpoint": "http://kiln.example:5456",  // what `kiln env` prints
//     "virtual_host_suffixes": ["localhost"],
//     "credentials": [{"access_key_id": "...", "secret_access_key": "..."}],
//     "object_store": {"backend": "fs"}
//       or {"backend": "s3", "endpoint": "http://host:9000", "region": "us-east-1",
//           "access_key_id": "...", "secret_access_key": "...", "session_token": ""}
//     "scheduler": {"policy": "strict",         // or "shrink" (development boxes)
//                   "allow_cpu_fallback": false, // GPU shapes on a GPU-less host
//                   "cpus": 8, "memory_gib": 30, "gpus": [0, 1]},   // override what is discovered
//     "environments": [{"name": "torch", "images": ["*pytorch-training*"],
//                       "interpreter": "/opt/venvs/torch/bin/python", "env": {"K": "V"}}],
//     "instance_types": [{"type": "ml.g5.xlarge", "memory_gib": 12}],  // extends the built-in catalog
//     "training": {"stop_grace_seconds": 120, "keep_host_dirs": false,
//                  "staging_parallelism": 8, "toolkit_dir": "/usr/lib/kiln/python"},
//     "endpoints": {"invocation_timeout_seconds": 60, "stop_grace_seconds": 30,
//                   "health_interval_seconds": 5, "port_range": [20000, 30000],
//                   "provision_timeout_seconds": 3600,   // variants without a provision timeout
//                   "model_server": "/usr/local/lib/kiln/kiln-model-server"},  // default: found
//     "http": {"max_connections": 16384, "max_connections_per_address": 4096,
//              "first_byte_timeout_seconds": 10, "header_timeout_seconds": 30,
//              "idle_timeout_seconds": 75, "io_timeout_seconds": 120,
//              "event_loops": 0,          // 0: one per core
//              "worker_threads": 256},    // threads for the blocking (non-invoke) requests
//     "archives": {"max_unpacked_mib": 0,      // 0: each archive's cap comes from the volume
//                  "max_entries": 1000000},    // members per model.tar.gz / sourcedir.tar.gz
//     "network": {"mode": "auto",          // "namespaces" | "host": per-instance network namespaces
//                 "cidr": "10.213.0.0/16", // the private range job/endpoint subnets come from
//                 "subnet_prefix": 24,     // each network's block (16..28)
//                 "firewall": true},       // nftables rules between networks (isolation)
//     "instance_metrics": {"interval_seconds": 10,  // CPU/Memory/Disk/GPU utilization samples
//                          "gpu_command": ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
//                                          "--format=csv,noheader,nounits"]},  // the default; same columns if replaced
//     "container_engine": {"socket": "unix:///run/podman/podman.sock",  // "" (default): no engine
//                          "images": ["*"],        // which image URIs run on the engine (fnmatch)
//                          "ecr_mirror": "registry.local:5000/ecr",
//                          "registries": {"registry.local:5000": {"username": "u", "password": "p"}},
//                          "gpus": "auto",         // "device_requests" | "cdi" | "devices"
//                          "log_driver": "",       // "" : the engine's default
//                          "shm_fraction": 0.5,    // /dev/shm as a fraction of the instance's memory
//                          "ulimits": {"nofile": [65536, 65536], "memlock": "unlimited"},
//                          "lost_after_seconds": 60},
//     "remote_access": {"enabled": true,                 // the operator's switch
//                       "allowed_principals": ["*"],     // fnmatch globs over the caller's ARN
//                       "allow_network_isolated": true,  // EnableNetworkIsolation jobs too
//                       "idle_timeout_seconds": 3600,    // no bytes either way
//                       "max_connection_seconds": 0},    // 0: no limit
//     "tuning": {"max_parallel_training_jobs": 100,   // account limits of a tuning job (limits.md)
//                "max_number_of_training_jobs": 500},
//     "spot": {"interrupt_after_seconds": [600, 1800],  // attempt n of each spot job is interrupted
//                                                     // after [n] s of training; later ones run on
//              "interrupt_probability_per_hour": 0,   // random interruptions (Poisson), 0..3600
//              "restart_delay_seconds": 0,            // an interrupted job waits this long to queue
//              "preempt_for_on_demand": true,         // on-demand jobs reclaim spot jobs' capacity
//              "seed": 0}                             // the random draws' seed; 0: from the clock
//     "autoscaling": {"period_seconds": 60},           // scaling alarms' evaluation period
//     "console": {"enabled": true,       // the web console under /console/ (issue 22)
//                 "session_minutes": 720},  // a sign-in lasts this long (12 h, as the AWS console)
//     "runtime": "process",              // or "slurm": instances run on a Slurm cluster (issue 21)
//     "slurm": {"server_url": "http://10.77.0.1:5456",   // how the compute nodes reach this server
//               "partition": "", "qos": "", "account": "",   // defaults; tags kiln:slurm-* override
//               "node_command": ["/usr/local/bin/kiln"],     // `kiln` on the compute nodes
//               "scratch_dir": "/tmp",                       // node-local scratch for /opt/ml
//               "poll_seconds": 2,                           // one squeue per round
//               "sbatch_args": [],                           // appended to every sbatch
//               "request_cpus": true, "request_memory": true, // ask Slurm for the ml.* shape's
//               "bin_dir": ""},                              // where sbatch/squeue/...; "": PATH
//   }

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aws/credentials.h"
#include "base/status.h"

namespace kiln::cli {

struct ObjectStoreConfig {
  std::string backend = "fs";  // "fs" | "s3"
  std::string endpoint;
  std::string region = "us-east-1";
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
};

struct TrainingConfig {
  int stop_grace_seconds = 120;  // SIGTERM → SIGKILL, as `docker stop -t 120` (AWS behaviour)
  bool keep_host_dirs = false;   // keep <data-dir>/training/<job> after the job (debugging)
  int staging_parallelism = 8;
  std::string toolkit_dir;  // where python/kiln_toolkit lives; empty: next to the binary's sources
};

struct EndpointsConfig {
  int invocation_timeout_seconds = 60;  // container answer budget (AWS: 60 s)
  int stop_grace_seconds = 30;          // SIGTERM → SIGKILL (AWS behaviour)
  double health_interval_seconds = 5;   // pings of routable instances
  int port_range_begin = 20000;         // instance ports, blocks of 100; below Linux's ephemeral range (32768+)
  int port_range_end = 30000;
  // How long an instance waits for capacity under `strict` when its variant sets no
  // VariantInstanceProvisionTimeoutInSeconds; shorter fails endpoints sooner on a busy host.
  int provision_timeout_seconds = 3600;
  // The kiln-model-server program that serves framework images; empty: beside the kiln binary,
  // <prefix>/lib/kiln/, or the build tree this binary came from.
  std::string model_server;
};

// The front door's connection limits (net::HttpServerOptions says what each costs).
struct HttpConfig {
  int max_connections = 16384;             // open at once, in all
  int max_connections_per_address = 4096;  // open at once from one client IP
  int first_byte_timeout_seconds = 10;     // accept → first request byte
  int header_timeout_seconds = 30;         // first byte → end of the request header
  int idle_timeout_seconds = 75;           // keep-alive wait between requests
  int io_timeout_seconds = 120;            // a read or write that makes no progress
  int event_loops = 0;                     // event-loop threads serving connections; 0: one per core
  int worker_threads = 256;                // threads running blocking requests (API, S3), at most
};

// Caps on unpacked model.tar.gz and sourcedir.tar.gz (control/archive_caps.h).
struct ArchivesConfig {
  int max_unpacked_mib = 0;     // operator-wide cap replacing the volume-derived one; 0: derive
  int max_entries = 1'000'000;  // members per archive
};

// Instance metrics sampling (control/instance_metrics.h).
struct InstanceMetricsConfig {
  double interval_seconds = 10;          // each instance's CPU/memory/disk/GPU sample
  std::vector<std::string> gpu_command;  // empty: nvidia-smi's usage query (runtime/gpus.h)
};

// Per-instance networks (runtime/networks.h, runtime/process/bridge_networks.h). "auto": each
// training host and endpoint instance gets its own network namespace when the server may create
// them (root with CAP_NET_ADMIN), else instances share the node's network (logged at start);
// "namespaces": the same, but the server refuses to start when it cannot; "host": instances
// always share the node's network (every algo-N is 127.0.0.1).
struct NetworkConfig {
  std::string mode = "auto";           // "auto" | "namespaces" | "host"
  std::string cidr = "10.213.0.0/16";  // IPv4 range the per-job/per-endpoint subnets are carved from
  int subnet_prefix = 24;              // each network's block: 16..28 and >= the cidr's prefix
  bool firewall = true;                // nftables rules (jobs cannot reach each other, isolation)
};

// The container runtime (runtime/docker/docker_runtime.h): users' own images run through a
// Docker-Engine-API engine (Docker's socket or Podman's compatible one). No socket (the default):
// no engine, every image resolves through the environments table as before.
struct ContainerEngineConfig {
  // "unix:///path" after Validate ("/path" in the file is accepted); "" = no engine.
  std::string socket;
  // fnmatch globs of image URIs that run on the engine ('*' also matches '/'); `local:` never does.
  // ["*"] when a socket is set and the file does not say.
  std::vector<std::string> images;
  std::string ecr_mirror;  // ECR-style URIs map to <mirror>/<repository>[:tag]; "" = none
  struct Credential {
    std::string username;
    std::string password;
  };
  std::map<std::string, Credential> registries;  // by registry host[:port]
  std::string gpus = "auto";                     // "auto" | "device_requests" | "cdi" | "devices"
  std::string log_driver;                        // "" = the engine's default
  double shm_fraction = 0.5;                     // 0 < x <= 1
  struct Ulimit {
    std::string name;
    int64_t soft = 0;  // -1: unlimited
    int64_t hard = 0;
  };
  std::vector<Ulimit> ulimits;  // empty: the server's own hard limits (DefaultUlimits)
  int lost_after_seconds = 60;  // an unreachable engine's running containers count as lost after this

  bool enabled() const { return !socket.empty(); }
};

// Remote access to running instances (access/tunnel_service.h; spec remote-access.md,
//
struct RemoteAccessConfig {
  bool enabled = true;                                  // off: every connect is refused, open ones close
  std::vector<std::string> allowed_principals = {"*"};  // principal ARN globs allowed kiln:RemoteConnect
  bool allow_network_isolated = true;                   // false: EnableNetworkIsolation jobs are refused
  int idle_timeout_seconds = 3600;                      // a tunnel without traffic this long closes
  int max_connection_seconds = 0;                       // a tunnel open this long closes; 0: no limit
};

// Hyperparameter tuning (control/tuning_controller.h): Kiln's account limits, which
// CreateHyperParameterTuningJob answers ResourceLimitExceeded beyond (spec limits.md).
struct TuningConfig {
  int max_parallel_training_jobs = 100;
  int max_number_of_training_jobs = 500;  // also the budget of a job that sets none
};

// Managed spot training (control::SpotOptions, issue 18): where interruptions of
// EnableManagedSpotTraining jobs come from besides `kiln interrupt`. The defaults interrupt
// nothing on their own; on-demand jobs that need the node reclaim spot jobs' capacity.
struct SpotConfig {
  std::vector<double> interrupt_after_seconds;  // attempt n is interrupted after [n] s of training
  double interrupt_probability_per_hour = 0;    // per running spot job, 0..3600
  double restart_delay_seconds = 0;             // an interrupted job is queued again after this
  bool preempt_for_on_demand = true;            // the scheduler reclaims spot grants for on-demand jobs
  uint64_t seed = 0;                            // the probability draws' seed; 0: from the clock
};

// Application Auto Scaling (control/autoscaler.h, issue 19): the evaluation period of scaling
// alarms (AWS: 60 s; tests use 1-2 s so that a scale-out and back takes seconds).
struct AutoscalingConfig {
  int period_seconds = 60;
};

// Asynchronous inference (control/async_dispatcher.h, issue 19): notification webhooks by SNS
// topic ARN, the per-endpoint queue bound, and the default per-instance concurrency.
struct AsyncInferenceConfig {
  std::map<std::string, std::string> notifications;  // topic ARN → http://host:port/path
  int max_queue_per_endpoint = 100000;
  int default_max_concurrency = 4;
};

// Serverless endpoint variants (control/serverless_scaler.h, issue 19): how long an instance
// of a serverless pool may stay idle before it is stopped (Kiln: 10 minutes; tests use seconds),
// and the requests in flight at once over all serverless endpoints (AWS's regional quota, 1000).
struct ServerlessConfig {
  int idle_seconds = 600;
  int account_max_concurrency = 1000;
};

// Data capture (serving/data_capture.h, serving-contract.md §14): how long a capture file
// collects records before it is written (AWS: 60 s; tests use about 1 s), and how much captured
// data may wait for the writer before records are dropped.
struct DataCaptureSection {
  double flush_interval_seconds = 60;
  int max_buffer_mb = 64;
};

// Multi-model endpoints (serving/multi_model.h, serving-contract.md §7.3): how long a request
// waits for its model to download and load before ModelNotReadyException (Kiln: 60 s; the load
// goes on meanwhile; tests use seconds).
struct MultiModelSection {
  double load_wait_seconds = 60;
};

// The web console (api/console.h, issue 22): the browser app under /console/ and its sign-in
// sessions. Sessions live in memory: a restart signs everyone out.
struct ConsoleConfig {
  bool enabled = true;        // off: /console/ is S3's path as before, console cookies are ignored
  int session_minutes = 720;  // 1..43200 (30 days); longer keeps a stolen cookie useful longer
};

// The Slurm runtime (runtime/slurm/slurm_runtime.h, issue 21), used with "runtime": "slurm".
struct SlurmConfig {
  std::string server_url;               // required with runtime "slurm": http://<address the nodes reach>:<port>
  std::string partition, qos, account;  // "": Slurm's defaults
  std::vector<std::string> node_command = {"/usr/local/bin/kiln"};
  std::string scratch_dir = "/tmp";
  double poll_seconds = 2;  // 0.2..60: shorter notices pending reasons and dead nodes sooner
  std::vector<std::string> sbatch_args;
  bool request_cpus = true;    // --cpus-per-task from the ml.* shape's vCPUs
  bool request_memory = true;  // --mem from the ml.* shape's memory
  std::string bin_dir;         // "": sbatch, squeue, scontrol, scancel from PATH
};

struct Config {
  std::string listen = "127.0.0.1:5456";
  std::string data_dir = "~/.kiln";
  std::vector<std::string> regions = {"us-east-1"};
  bool accept_any_region = false;
  std::string account_id = "000000000000";
  bool auth_enabled = true;
  std::string log_level = "info";
  std::string log_format = "logfmt";
  std::string public_endpoint;
  std::vector<std::string> virtual_host_suffixes = {"localhost"};
  std::vector<aws::Credential> credentials;  // explicitly configured key pairs
  ObjectStoreConfig object_store;
  // Sections parsed by their owners (control::SchedulerOptionsFromJson,
  // runtime::EnvironmentTable::FromJson, control::InstanceCatalog::FromJson); null when absent.
  nlohmann::json scheduler;
  nlohmann::json environments;
  nlohmann::json instance_types;
  TrainingConfig training;
  EndpointsConfig endpoints;
  HttpConfig http;
  ArchivesConfig archives;
  InstanceMetricsConfig instance_metrics;
  NetworkConfig network;
  ContainerEngineConfig container_engine;
  RemoteAccessConfig remote_access;
  TuningConfig tuning;
  SpotConfig spot;
  AutoscalingConfig autoscaling;
  AsyncInferenceConfig async_inference;
  ServerlessConfig serverless;
  MultiModelSection multi_model;
  DataCaptureSection data_capture;
  ConsoleConfig console;
  std::string runtime = "process";  // "process" | "slurm"
  SlurmConfig slurm;
};

// Applies the JSON document at `path` over `config`. Errors name the file and the bad field.
Status LoadConfigFile(const std::string& path, Config* config);
// Applies KILN_DATA_DIR when set.
void ApplyEnvironment(Config* config);
// Checks the combination: listen parses, account id is 12 digits, regions and data_dir non-empty,
// log_format known, backend known and complete, and that a non-loopback listen address has
// explicitly configured credentials and auth on. Expands "~" in data_dir and gives each configured
// credential the account id, principal ARN and user id it leaves out.
Status Validate(Config* config);

// The URL clients use: public_endpoint, or http://<listen> (0.0.0.0/:: shown as 127.0.0.1).
std::string ClientEndpoint(const Config& config);

}  // namespace kiln::cli
