// The `kiln` command. Thin: parses the command line and calls into cli/ (STYLE.md §1).

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "access/agent_main.h"
#include "api/credential_store.h"
#include "base/crash_handler.h"
#include "base/fs.h"
#include "base/log.h"
#include "cli/config.h"
#include "cli/hold_start_command.h"
#include "cli/images_command.h"
#include "cli/logs_command.h"
#include "cli/remote_command.h"
#include "cli/server.h"
#include "cli/version.h"
#include "runtime/docker/engine.h"
#include "runtime/process/process_runtime.h"
#include "runtime/slurm/node_agent.h"

namespace kiln::cli {
namespace {

struct CommonFlags {
  std::string config_path;
  std::string data_dir;
  std::string listen;
  std::string log_level;
};

Result<Config> LoadConfig(const CommonFlags& flags) {
  Config config;
  if (!flags.config_path.empty()) RETURN_IF_ERROR(LoadConfigFile(flags.config_path, &config));
  ApplyEnvironment(&config);
  if (!flags.data_dir.empty()) config.data_dir = flags.data_dir;
  if (!flags.listen.empty()) config.listen = flags.listen;
  if (!flags.log_level.empty()) config.log_level = flags.log_level;
  RETURN_IF_ERROR(Validate(&config));
  return config;
}

int Fail(const Status& status) {
  std::cerr << "kiln: " << status.message() << "\n";
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// Each connection holds a socket, and a reader of a multipart object holds one descriptor per
// part (up to 10,000), so the server runs with the hard limit rather than the usual soft 1024.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    KLOG(warn, "could not raise the open-file limit", {{"soft", std::to_string(before)}});
  }
}

int RunServer(const CommonFlags& flags) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  // Block the stop signals in every thread (the logger's included); the main thread waits for
  // them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  InitLogging(config->log_level, config->log_format == "json" ? LogFormat::kJson : LogFormat::kLogfmt);
  // A crash writes the signal and a symbolised backtrace to the log before the process dies
  // (then the supervisor restarts it and the new server adopts every instance).
  InstallCrashHandler();
  // Large buffers (request bodies, DOMs) come from mmap and go back to the system when freed.
  // glibc raises its mmap threshold to the size of each mmapped block freed (up to 32 MiB), after
  // which 16 MiB request bodies came from the heap and ~0.9 GB stayed resident after a burst.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  signal(SIGPIPE, SIG_IGN);
  RaiseOpenFileLimit();

  auto server = Server::Create(std::move(config).value());
  if (!server.ok()) {
    KLOG(error, "server failed to start", {{"error", server.status().ToString()}});
    return Fail(server.status());
  }
  Status started = (*server)->Start();
  if (!started.ok()) return Fail(started);
  const Config& c = (*server)->config();
  std::string address = c.listen.substr(0, c.listen.rfind(':')) + ":" + std::to_string((*server)->port());
  KLOG(info, "listening",
       {{"address", address},
        {"data_dir", c.data_dir},
        {"object_store", c.object_store.backend},
        {"version", KilnVersion()}});
  spdlog::default_logger()->flush();  // the ready line is for operators and scripts: no delay
  int sig = 0;
  sigwait(&stop_signals, &sig);
  KLOG(info, "stopping", {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
  (*server)->Stop();
  server->reset();
  KLOG(info, "stopped", {});
  spdlog::shutdown();
  return 0;
}

// The key a local client uses: the config's first, else the first of <data-dir>/credentials.json.
std::optional<aws::Credential> ClientKey(const Config& config) {
  if (!config.credentials.empty()) return config.credentials.front();
  auto keys = api::CredentialStore::ReadFile(config.data_dir + "/credentials.json", config.account_id);
  if (!keys.ok() || keys->empty()) {
    std::cerr << "kiln: no credentials in " << config.data_dir
              << "/credentials.json; start `kiln server` once (it creates them) or run `kiln keys add`\n";
    return std::nullopt;
  }
  return keys->front();
}

int RunLogs(const CommonFlags& flags, const std::string& endpoint, const std::string& job, bool follow) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  LogsCommandOptions options;
  // AWS_* variables win, so `kiln logs` works against any Kiln the shell is pointed at.
  const char* env_key = std::getenv("AWS_ACCESS_KEY_ID");
  const char* env_secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  if (env_key != nullptr && env_secret != nullptr) {
    options.credential.access_key_id = env_key;
    options.credential.secret_access_key = env_secret;
    if (const char* token = std::getenv("AWS_SESSION_TOKEN")) options.credential.session_token = token;
  } else {
    auto key = ClientKey(*config);
    if (!key) return 1;
    options.credential = *key;
  }
  const char* env_endpoint = std::getenv("AWS_ENDPOINT_URL");
  options.endpoint = !endpoint.empty() ? endpoint : env_endpoint != nullptr ? env_endpoint : ClientEndpoint(*config);
  options.region = config->regions.front();
  options.job_name = job;
  options.follow = follow;
  Status s = RunLogsCommand(options, std::cout, std::cerr);
  if (!s.ok()) {
    std::cerr << "kiln logs: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

int RunEnv(const CommonFlags& flags, const std::string& endpoint) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  std::optional<aws::Credential> key = ClientKey(*config);
  if (!key) return 1;
  std::string url = endpoint.empty() ? ClientEndpoint(*config) : endpoint;
  std::cout << "export AWS_ENDPOINT_URL=" << url << "\n"
            << "export AWS_ACCESS_KEY_ID=" << key->access_key_id << "\n"
            << "export AWS_SECRET_ACCESS_KEY=" << key->secret_access_key << "\n"
            << "export AWS_DEFAULT_REGION=" << config->regions.front() << "\n"
            << "export AWS_REGION=" << config->regions.front() << "\n";
  if (!key->session_token.empty()) std::cout << "export AWS_SESSION_TOKEN=" << key->session_token << "\n";
  return 0;
}

int RunImages(const CommonFlags& flags, bool json) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  if (!config->container_engine.enabled()) {
    std::cerr << "kiln images: " << NoEngineConfiguredMessage() << "\n";
    return 1;
  }
  runtime::docker::HttpEngineOptions options;
  options.socket = config->container_engine.socket;
  options.timeout_ms = 10000;
  std::unique_ptr<runtime::docker::Engine> engine = runtime::docker::OpenHttpEngine(options);
  Status s = RunImagesCommand(*engine, json, ::time(nullptr), std::cout);
  if (!s.ok()) {
    std::cerr << "kiln images: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

int RunKeysAdd(const CommonFlags& flags, const std::string& user) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  Status dir = MakeDirs(config->data_dir, 0700);
  if (!dir.ok()) return Fail(dir);
  auto key = api::CredentialStore::AddKey(config->data_dir + "/credentials.json", config->account_id, user);
  if (!key.ok()) return Fail(key.status());
  std::cout << "access_key_id=" << key->access_key_id << "\nsecret_access_key=" << key->secret_access_key << "\n";
  return 0;
}

int RunKeysList(const CommonFlags& flags) {
  auto config = LoadConfig(flags);
  if (!config.ok()) return Fail(config.status());
  auto keys = api::CredentialStore::ReadFile(config->data_dir + "/credentials.json", config->account_id);
  if (!keys.ok()) return Fail(keys.status());
  for (const auto& k : *keys) std::cout << k.access_key_id << "\t" << k.principal_arn << "\n";
  return 0;
}

// The remote-access commands' client: credentials and region as `kiln logs` (AWS_* variables
// first, else the config's key), the endpoint from --endpoint-url, $AWS_ENDPOINT_URL, the config.
// Without `need_credentials` (ssh-config only prints) no key is looked up.
std::optional<RemoteClient> ResolveRemoteClient(const CommonFlags& flags, const std::string& endpoint,
                                                bool need_credentials) {
  auto config = LoadConfig(flags);
  if (!config.ok()) {
    Fail(config.status());
    return std::nullopt;
  }
  RemoteClient client;
  const char* env_key = std::getenv("AWS_ACCESS_KEY_ID");
  const char* env_secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  if (env_key != nullptr && env_secret != nullptr) {
    client.credential.access_key_id = env_key;
    client.credential.secret_access_key = env_secret;
    if (const char* token = std::getenv("AWS_SESSION_TOKEN")) client.credential.session_token = token;
  } else if (need_credentials) {
    auto key = ClientKey(*config);
    if (!key) return std::nullopt;
    client.credential = *key;
  }
  const char* env_endpoint = std::getenv("AWS_ENDPOINT_URL");
  auto parsed = ParseEndpoint(!endpoint.empty()         ? endpoint
                              : env_endpoint != nullptr ? env_endpoint
                                                        : ClientEndpoint(*config));
  if (!parsed.ok()) {
    Fail(parsed.status());
    return std::nullopt;
  }
  client.endpoint = *parsed;
  client.region = config->regions.front();
  return client;
}

// `path` made absolute against the working directory (ssh-config's lines are used from anywhere).
std::string AbsolutePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  return getcwd(cwd, sizeof(cwd)) != nullptr ? std::string(cwd) + "/" + path : path;
}

// --config/--data-dir as given to this command, absolute, for the ssh-proxy that ssh starts.
std::vector<std::string> ProxyFlags(const CommonFlags& flags) {
  std::vector<std::string> out;
  if (!flags.config_path.empty()) out.insert(out.end(), {"--config", AbsolutePath(flags.config_path)});
  if (!flags.data_dir.empty()) out.insert(out.end(), {"--data-dir", AbsolutePath(flags.data_dir)});
  return out;
}

int Main(int argc, char** argv) {
  // `kiln shim` is started by the process runtime, not by people: RunShim parses its own
  // arguments, and building the CLI is skipped on the job-start path.
  if (argc >= 2 && std::string_view(argv[1]) == "shim") return runtime::RunShim(argc - 1, argv + 1);
  // `kiln agent` likewise: started by the daemon per remote-access connection (access/agent_main.h).
  // It ends with _exit: once it has joined an instance's pid namespace, LeakSanitizer's exit-time
  // check (sanitizer builds) forks its tracer into that namespace, where our pid does not exist,
  // and spins forever waiting for it; nothing of the agent needs tearing down at exit.
  if (argc >= 2 && std::string_view(argv[1]) == "agent") {
    const int code = access::RunAgentMain(argc - 1, argv + 1);
    std::fflush(nullptr);
    _exit(code);
  }
  // `kiln hold-start` likewise: a training host's program while it is held before start
  // (control/training_hold.h); it exec()s the real program.
  if (argc >= 2 && std::string_view(argv[1]) == "hold-start") return RunHoldStart(argc - 1, argv + 1);
  // `kiln node` likewise: started by srun inside a Slurm job the server submitted (runtime/slurm/
  // node_agent.h); its flags are the batch script's, a contract with the server side.
  if (argc >= 2 && std::string_view(argv[1]) == "node") return runtime::slurm::RunNodeMain(argc - 1, argv + 1);
  CLI::App app{"kiln: a self-hosted, SageMaker-compatible platform"};
  app.require_subcommand(1);
  CommonFlags flags;
  auto add_common = [&flags](CLI::App* cmd) {
    cmd->add_option("--config", flags.config_path, "JSON config file");
    cmd->add_option("--data-dir", flags.data_dir, "state directory (default ~/.kiln, or $KILN_DATA_DIR)");
  };

  CLI::App* server = app.add_subcommand("server", "run the Kiln server");
  add_common(server);
  server->add_option("--listen", flags.listen, "address to listen on (default 127.0.0.1:5456)");
  server->add_option("--log-level", flags.log_level, "trace|debug|info|warn|error");

  std::string endpoint;
  CLI::App* env = app.add_subcommand("env", "print export lines that point AWS clients at Kiln");
  add_common(env);
  env->add_option("--endpoint", endpoint, "URL to export (default: from the config's listen address)");
  env->add_option("--listen", flags.listen, "the server's listen address, if not the default");

  std::string logs_job;
  bool logs_follow = false;
  CLI::App* logs = app.add_subcommand("logs", "print a training job's logs (like the SageMaker SDK's logs=True)");
  add_common(logs);
  logs->add_option("job", logs_job, "training job name")->required();
  logs->add_flag("-f,--follow", logs_follow, "keep printing until the job ends");
  logs->add_option("--endpoint", endpoint, "Kiln URL (default: $AWS_ENDPOINT_URL, else the config's listen address)");
  logs->add_option("--listen", flags.listen, "the server's listen address, if not the default");

  bool images_json = false;
  CLI::App* images =
      app.add_subcommand("images", "list the container engine's images (config container_engine.socket)");
  add_common(images);
  images->add_flag("--json", images_json, "print JSON (one object per image) instead of a table");

  app.add_subcommand("version", "print the version");
  // Listed for --help only; dispatched above.
  app.add_subcommand("shim", "internal: the per-instance supervisor started by the process runtime")->allow_extras();
  app.add_subcommand("agent", "internal: the remote-access agent started by the server per connection")->allow_extras();
  app.add_subcommand("hold-start", "internal: a training program held before start for a remote connection")
      ->allow_extras();
  app.add_subcommand("node", "internal: runs an instance on a Slurm node (started by srun in a job Kiln submitted)")
      ->allow_extras();

  CLI::App* keys = app.add_subcommand("keys", "manage access keys");
  keys->require_subcommand(1);
  std::string user = "kiln-user";
  CLI::App* keys_add = keys->add_subcommand("add", "create a new access key pair");
  add_common(keys_add);
  keys_add->add_option("--user", user, "user name for the key's principal ARN");
  CLI::App* keys_list = keys->add_subcommand("list", "list access key ids");
  add_common(keys_list);

  // Remote access (spec/remote-access.md §3.5).
  std::string remote_endpoint;
  ConnectOptions connect_options;
  connect_options.key_path = DefaultKeyPath();
  auto add_remote_common = [&](CLI::App* cmd) {
    add_common(cmd);
    cmd->add_option("--endpoint-url", remote_endpoint,
                    "Kiln URL (default: $AWS_ENDPOINT_URL, else the config's listen address)");
  };
  auto add_key = [&](CLI::App* cmd) {
    cmd->add_option("--key", connect_options.key_path,
                    "SSH private key (default ~/.ssh/sagemaker-ssh-gw; an Ed25519 pair is created when absent)");
  };
  CLI::App* ssh_proxy =
      app.add_subcommand("ssh-proxy", "tunnel stdin/stdout to a target's SSH server (an ssh ProxyCommand)");
  add_remote_common(ssh_proxy);
  add_key(ssh_proxy);
  ssh_proxy->add_option("target", connect_options.target, "training-job/<job>/algo-<n>, <job>, ...")->required();

  CLI::App* connect = app.add_subcommand("connect", "open a shell (or run a command) in a job's container");
  add_remote_common(connect);
  add_key(connect);
  connect
      ->add_option("--local-port", connect_options.local_port,
                   "serve the tunnel on localhost:<port> for any SSH client instead (default 11022)")
      ->expected(0, 1)
      ->default_str("11022");
  connect->add_option("-L", connect_options.local_forwards, "local forward, as ssh -L")->allow_extra_args(false);
  connect->add_option("-R", connect_options.remote_forwards, "remote forward, as ssh -R")->allow_extra_args(false);
  connect->add_flag("--wait", connect_options.wait, "wait until the target is Ready (polls every 5 s)");
  connect->add_option("--wait-timeout", connect_options.wait_timeout_seconds, "seconds --wait waits (default 900)");
  connect->add_option("target", connect_options.target, "training-job/<job>/algo-<n>, <job>, ...")->required();
  connect->add_option("command", connect_options.command, "command to run instead of a shell (after --)");

  int remote_port = 0;
  int local_port = 0;
  CLI::App* port_forward =
      app.add_subcommand("port-forward", "forward localhost:<local-port> to a port inside a job's container");
  add_remote_common(port_forward);
  add_key(port_forward);
  port_forward->add_option("target", connect_options.target, "training-job/<job>/algo-<n>, <job>, ...")->required();
  port_forward->add_option("remote-port", remote_port, "port inside the container")->required();
  port_forward->add_option("local-port", local_port, "local port (default: the remote port)");

  std::string alias;
  CLI::App* ssh_config = app.add_subcommand("ssh-config", "print an ~/.ssh/config block for a target");
  add_remote_common(ssh_config);
  add_key(ssh_config);
  ssh_config->add_option("--alias", alias, "Host name of the block (default: derived from the target)");
  ssh_config->add_option("target", connect_options.target, "training-job/<job>/algo-<n>, <job>, ...")->required();

  bool remote_json = false;
  std::string remote_resource;
  CLI::App* targets = app.add_subcommand("targets", "list a job's or endpoint's remote-access targets");
  add_remote_common(targets);
  targets->add_flag("--json", remote_json, "print the JSON answer");
  targets->add_option("resource", remote_resource, "training job or endpoint (name, training-job/<job>, ARN)")
      ->required();

  int max_results = 0;
  CLI::App* connections = app.add_subcommand("connections", "list remote-access connections (audit), newest first");
  add_remote_common(connections);
  connections->add_flag("--json", remote_json, "print the JSON answer");
  connections->add_option("--max-results", max_results, "at most this many");
  connections->add_option("resource", remote_resource, "only this training job or endpoint");

  CLI::App* release = app.add_subcommand("release",
                                         "end a held target's hold (its program starts, or a post-mortem "
                                         "hold ends)");
  add_remote_common(release);
  release->add_option("target", connect_options.target, "training-job/<job>/algo-<n>, <job>, ...")->required();

  // Managed spot (issue 18): reclaim a spot job's instances now, as a spot interruption does.
  std::string interrupt_job;
  CLI::App* interrupt = app.add_subcommand(
      "interrupt", "interrupt a managed spot training job (it resumes from its checkpoints when capacity returns)");
  add_remote_common(interrupt);
  interrupt->add_option("job", interrupt_job, "training job name")->required();

  CLI11_PARSE(app, argc, argv);

  if (server->parsed()) return RunServer(flags);
  if (env->parsed()) return RunEnv(flags, endpoint);
  if (logs->parsed()) return RunLogs(flags, endpoint, logs_job, logs_follow);
  if (images->parsed()) return RunImages(flags, images_json);
  if (app.got_subcommand("version")) {
    std::cout << "kiln " << KilnVersion() << "\n";
    return 0;
  }
  if (keys_add->parsed()) return RunKeysAdd(flags, user);
  if (keys_list->parsed()) return RunKeysList(flags);
  for (CLI::App* cmd : {ssh_proxy, connect, port_forward, ssh_config, targets, connections, release, interrupt}) {
    if (!cmd->parsed()) continue;
    std::optional<RemoteClient> client = ResolveRemoteClient(flags, remote_endpoint, cmd != ssh_config);
    if (!client) return cmd == ssh_proxy ? 255 : 1;
    connect_options.proxy_flags = ProxyFlags(flags);
    connect_options.key_path = AbsolutePath(ExpandHome(connect_options.key_path));
    if (cmd == ssh_proxy) return RunSshProxy(*client, connect_options.key_path, connect_options.target);
    if (cmd == connect) return RunConnect(*client, connect_options);
    if (cmd == port_forward) return RunPortForward(*client, connect_options, remote_port, local_port);
    if (cmd == ssh_config) {
      return RunSshConfig(*client, connect_options.key_path, connect_options.proxy_flags, connect_options.target,
                          alias);
    }
    if (cmd == targets) return RunTargets(*client, remote_resource, remote_json);
    if (cmd == release) return RunRelease(*client, connect_options.target);
    if (cmd == interrupt) return RunInterrupt(*client, interrupt_job);
    return RunConnections(*client, remote_resource, max_results, remote_json);
  }
  return 2;
}

}  // namespace
}  // namespace kiln::cli

int main(int argc, char** argv) { return kiln::cli::Main(argc, argv); }
