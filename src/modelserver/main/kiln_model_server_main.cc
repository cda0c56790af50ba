// kiln-model-server: see src/modelserver/README.md ("The program"). Thin: reads the options, wires
// the backend factory, runs the ModelServer until SIGTERM/SIGINT (or, in single-model mode, until
// the model fails to load: exit 1 with the reason in the log).

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "base/crash_handler.h"
#include "base/log.h"
#include "base/strings.h"
#include "modelserver/model_server.h"
#include "modelserver/options.h"
#include "modelserver/worker_pool.h"
#if __has_include("modelserver/torchscript_backend.h")
#include "modelserver/torchscript_backend.h"
#define KILN_MODEL_SERVER_HAS_TORCHSCRIPT 1
#endif

namespace kiln::modelserver {
namespace {

// Connections are sockets; the platform's router may hold many at once.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    KLOG(warn, "could not raise the open-file limit", {{"soft", std::to_string(before)}});
  }
}

// SAGEMAKER_CONTAINER_LOG_LEVEL is a Python logging level (10 debug, 20 info, 30 warning, 40 error);
// the server logs at the same level as its workers.
std::string LogLevel(const std::map<std::string, std::string>& env) {
  auto it = env.find("SAGEMAKER_CONTAINER_LOG_LEVEL");
  if (it == env.end()) return "info";
  std::optional<int64_t> level = ParseInt64(Trim(it->second));
  if (!level) return "info";
  if (*level <= 10) return "debug";
  if (*level <= 20) return "info";
  if (*level <= 30) return "warn";
  return "error";
}

Result<BackendFactory> MakeFactory(const ModelServerOptions& options, const std::map<std::string, std::string>& env) {
  if (options.backend == BackendKind::kPython) {
    return BackendFactory([options](const ModelSpec& spec) -> Result<std::unique_ptr<InferenceBackend>> {
      WorkerPoolOptions pool;
      pool.model_name = spec.name;
      pool.model_dir = spec.dir;
      pool.worker_command = {options.python, "-u", options.worker_script};
      pool.framework = options.framework;
      pool.workers = spec.workers;
      pool.queue_size = spec.queue_size;
      pool.timeout = spec.timeout;
      pool.batch_size = spec.batch_size;
      pool.batch_delay = spec.batch_delay;
      return std::unique_ptr<InferenceBackend>(std::make_unique<WorkerPool>(std::move(pool)));
    });
  }
#ifdef KILN_MODEL_SERVER_HAS_TORCHSCRIPT
  if (!TorchScriptAvailable()) {
    return Status::Unimplemented(
        "KILN_MODEL_SERVER_BACKEND=torchscript: this kiln-model-server was built without libtorch (install "
        "libtorch-dev and rebuild), or use KILN_MODEL_SERVER_BACKEND=python");
  }
  std::string default_accept = "application/json";
  if (auto it = env.find("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"); it != env.end() && !it->second.empty()) {
    default_accept = it->second;
  }
  return BackendFactory([default_accept](const ModelSpec& spec) -> Result<std::unique_ptr<InferenceBackend>> {
    TorchScriptOptions torch;
    torch.model_dir = spec.dir;
    torch.workers = spec.workers;
    torch.queue_size = std::max<size_t>(1, spec.queue_size);
    torch.timeout = spec.timeout;
    torch.default_accept = default_accept;
    return CreateTorchScriptBackend(std::move(torch));
  });
#else
  (void)env;
  return Status::Unimplemented(
      "KILN_MODEL_SERVER_BACKEND=torchscript: this kiln-model-server was built without the TorchScript backend; "
      "use KILN_MODEL_SERVER_BACKEND=python");
#endif
}

int Serve() {
  // The stop signals are blocked in every thread (the logger's and the server's included); the
  // main thread takes them with sigtimedwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::map<std::string, std::string> env = EnvironmentMap();
  InitLogging(LogLevel(env));
  InstallCrashHandler();
  // Request bodies (up to the payload limit) come from mmap and go back to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  signal(SIGPIPE, SIG_IGN);
  RaiseOpenFileLimit();

  SystemInfo system = ProbeSystem();
  auto options = ParseModelServerOptions(env, system);
  if (!options.ok()) {
    std::fprintf(stderr, "kiln-model-server: %s\n", options.status().message().c_str());
    return 2;
  }
  auto factory = MakeFactory(*options, env);
  if (!factory.ok()) {
    std::fprintf(stderr, "kiln-model-server: %s\n", factory.status().message().c_str());
    return 2;
  }
  ModelServerParams params;
  params.options = *options;
  params.backend_factory = std::move(factory).value();
  params.event_loops = static_cast<size_t>(std::clamp(system.cpus, 1, 4));
  auto server = ModelServer::Create(std::move(params));
  if (!server.ok()) {
    KLOG(error, "model server failed to start", {{"error", server.status().ToString()}});
    return 1;
  }
  Status started = (*server)->Start();
  if (!started.ok()) {
    KLOG(error, "model server failed to start", {{"error", started.ToString()}});
    return 1;
  }
  const ModelServerOptions& o = *options;
  KLOG(info, "listening",
       {{"port", std::to_string((*server)->port())},
        {"mode", o.multi_model ? "multi-model" : "single-model"},
        {"backend", BackendKindName(o.backend)},
        {"workers", std::to_string(o.workers)},
        {"model_dir", o.multi_model ? o.base_dir + "/models" : o.model_dir()},
        {"framework", o.framework.empty() ? "generic" : o.framework},
        {"timeout_s", std::to_string(o.timeout.count() / 1000)},
        {"max_payload_bytes", std::to_string(o.max_payload_bytes)},
        {"batch_size", std::to_string(o.batch_size)}});
  spdlog::default_logger()->flush();

  // Wait for a stop signal; in single-model mode also watch the load, so a model that cannot load
  // ends the program at once (the endpoint fails with the reason instead of waiting out its health
  // gate).
  bool watching_load = !o.multi_model;
  int sig = 0;
  while (true) {
    timespec tick{0, 100'000'000};
    sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig > 0) break;
    if (!watching_load) continue;
    BackendState state = (*server)->model_state();
    if (state == BackendState::kReady) {
      KLOG(info, "model loaded", {{"model_dir", o.model_dir()}});
      watching_load = false;
    } else if (state == BackendState::kFailed || state == BackendState::kStopped) {
      KLOG(error, "the model failed to load",
           {{"model_dir", o.model_dir()}, {"error", (*server)->model_load_error().ToString()}});
      (*server)->Stop(std::chrono::milliseconds(0));
      spdlog::shutdown();
      return 1;
    }
  }
  KLOG(info, "stopping", {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
  (*server)->Stop(o.timeout);
  server->reset();
  KLOG(info, "stopped", {});
  spdlog::shutdown();
  return 0;
}

}  // namespace
}  // namespace kiln::modelserver

int main(int argc, char** argv) {
  if (argc != 2 || std::string_view(argv[1]) != "serve") {
    std::fprintf(stderr, "usage: kiln-model-server serve   (see src/modelserver/README.md)\n");
    return 2;
  }
  return kiln::modelserver::Serve();
}
