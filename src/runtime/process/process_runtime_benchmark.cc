// Launch latency of the process runtime (the job-start critical path): for N launches of
// `/bin/echo ready`, the time until Launch returns and until the program's first line is in the
// captured-output file, against spawning the same program bare and reading its first line from a
// pipe. Needs root (or unprivileged user namespaces). Usage:
//   runtime_process_benchmark [iterations] [shim binary]
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/fs.h"
#include "runtime/process/process_runtime.h"

namespace {

double NowMicros() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Print(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-34s median %7.2f ms   p90 %7.2f ms   min %7.2f ms\n", what, v[v.size() / 2] / 1000,
              v[v.size() * 9 / 10] / 1000, v.front() / 1000);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 50;
  std::string shim = argc > 2 ? argv[2] : KILN_TEST_SHIM;
  char tmpl[] = "/tmp/kiln-rtbench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::string root = tmpl;
  kiln::MakeDirs(root + "/optml").ok();
  auto rt = kiln::runtime::OpenProcessRuntime({root + "/state", {shim}});
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", rt.status().ToString().c_str());
    return 1;
  }
  std::vector<double> launch, first_line, bare, shim_main, sandbox_exec;
  for (int i = 0; i < iterations; ++i) {
    kiln::runtime::InstanceSpec spec;
    spec.instance_id = "bench-" + std::to_string(i);
    spec.opt_ml_dir = root + "/optml";
    spec.hostname = "algo-1";
    spec.argv = {"/bin/echo", "ready"};
    spec.env = {{"PATH", "/usr/bin:/bin"}};
    std::string output = (*rt)->OutputPath(spec.instance_id);
    double t0 = NowMicros();
    kiln::Status s = (*rt)->Launch(spec);
    double t1 = NowMicros();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    struct stat st;
    while (stat(output.c_str(), &st) != 0 || st.st_size == 0) {
    }
    double t2 = NowMicros();
    launch.push_back(t1 - t0);
    first_line.push_back(t2 - t0);
    (*rt)->Wait(spec.instance_id, std::chrono::seconds(5)).ok();
    // "... (X ms after the shim's main, of which sandbox + exec Y ms)"
    std::string log = kiln::ReadFile(root + "/state/" + spec.instance_id + "/shim.log").value_or("");
    double in_shim = 0, sandbox = 0;
    size_t at = log.find(" ms after the shim's main");
    if (at != std::string::npos) {
      size_t open = log.rfind('(', at);
      in_shim = std::atof(log.c_str() + open + 1);
      size_t of = log.find("sandbox + exec ", at);
      sandbox = std::atof(log.c_str() + of + 15);
    }
    shim_main.push_back(in_shim * 1000);
    sandbox_exec.push_back(sandbox * 1000);
    (*rt)->Remove(spec.instance_id).ok();

    int fds[2];
    if (pipe(fds) != 0) return 1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    char arg0[] = "/bin/echo", arg1[] = "ready";
    char* args[] = {arg0, arg1, nullptr};
    pid_t pid;
    double b0 = NowMicros();
    char path_env[] = "PATH=/usr/bin:/bin";
    char* envp[] = {path_env, nullptr};  // the same environment as the sandboxed program
    posix_spawn(&pid, arg0, &actions, nullptr, args, envp);
    close(fds[1]);
    char buf[64];
    if (read(fds[0], buf, sizeof(buf)) <= 0) return 1;
    bare.push_back(NowMicros() - b0);
    close(fds[0]);
    posix_spawn_file_actions_destroy(&actions);
    waitpid(pid, nullptr, 0);
  }
  std::printf("%d launches of /bin/echo (shim %s)\n", iterations, shim.c_str());
  Print("Launch returns", launch);
  Print("first line in the output file", first_line);
  Print("  of which shim main -> exec'd", shim_main);
  Print("  of which sandbox + exec", sandbox_exec);
  Print("bare posix_spawn -> first line", bare);
  kiln::RemoveAll(root).ok();
  return 0;
}
