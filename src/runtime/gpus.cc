#include "runtime/gpus.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::runtime {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;

// Finds an executable named `name` on $PATH, then in /usr/bin, /usr/local/bin and
// /usr/local/nvidia/bin (where NVIDIA's container toolkit puts it): the server may run with a
// minimal PATH under systemd.
std::optional<std::string> FindExecutable(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    for (std::string_view dir : Split(path, ':')) {
      if (!dir.empty()) dirs.emplace_back(dir);
    }
  }
  dirs.emplace_back("/usr/bin");
  dirs.emplace_back("/usr/local/bin");
  dirs.emplace_back("/usr/local/nvidia/bin");
  for (const std::string& dir : dirs) {
    std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// Runs argv (argv[0] absolute) with stdin and stderr on /dev/null and returns its stdout, or
// nullopt if it could not start, exited non-zero or ran past `timeout` (then it is killed).
std::optional<std::string> RunCapture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                      const char* purpose = "gpu discovery") {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 2);
    }
    dup2(fds[1], 1);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  UniqueFd out(fds[0]);
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out.get(), POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    ssize_t n = read(out.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  if (timed_out) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    KLOG(warn, std::string(purpose) + ": nvidia-smi timed out", {{"timeout_ms", std::to_string(timeout.count())}});
    return std::nullopt;
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) return std::nullopt;
  return text;
}

// The value after the first ':' of a "Key:  value" line, trimmed.
std::string_view ValueAfterColon(std::string_view line) {
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return {};
  return Trim(line.substr(colon + 1));
}

}  // namespace

std::string NormalizePciBusId(std::string_view bus_id) {
  std::string id = ToLower(Trim(bus_id));
  // Domain is 8 hex digits in nvidia-smi, 4 in /proc and sysfs.
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) {
    std::string_view domain = std::string_view(id).substr(0, colon);
    size_t excess = colon - 4;
    if (domain.substr(0, excess).find_first_not_of('0') == std::string_view::npos) {
      id.erase(0, excess);
    }
  }
  return id;
}

std::vector<GpuInfo> ParseNvidiaSmiCsv(std::string_view text) {
  std::vector<GpuInfo> gpus;
  for (std::string_view line : Split(text, '\n')) {
    line = Trim(line);
    if (line.empty()) continue;
    std::vector<std::string_view> cols = Split(line, ',');
    if (cols.size() < 4) continue;
    for (auto& c : cols) c = Trim(c);
    std::optional<int64_t> index = ParseInt64(cols[0]);
    if (!index || *index < 0 || cols[1].empty()) continue;
    GpuInfo gpu;
    gpu.index = static_cast<int>(*index);
    gpu.uuid = std::string(cols[1]);
    gpu.name = std::string(cols[2]);
    if (std::optional<uint64_t> mib = ParseUint64(cols[3])) gpu.memory_bytes = *mib * kMiB;
    if (cols.size() >= 5 && !cols[4].empty() && cols[4] != "[N/A]") {
      gpu.pci_bus_id = NormalizePciBusId(cols[4]);
    }
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  return gpus;
}

bool ParseProcGpuInformation(std::string_view text, GpuInfo* out) {
  GpuInfo gpu;
  for (std::string_view line : Split(text, '\n')) {
    line = Trim(line);
    if (StartsWith(line, "Model:")) {
      gpu.name = std::string(ValueAfterColon(line));
    } else if (StartsWith(line, "GPU UUID:")) {
      gpu.uuid = std::string(ValueAfterColon(line));
    } else if (StartsWith(line, "Bus Location:")) {
      gpu.pci_bus_id = NormalizePciBusId(ValueAfterColon(line));
    } else if (StartsWith(line, "Device Minor:")) {
      if (std::optional<int64_t> minor = ParseInt64(ValueAfterColon(line))) {
        gpu.minor = static_cast<int>(*minor);
      }
    }
  }
  if (gpu.name.empty() && gpu.uuid.empty()) return false;
  *out = std::move(gpu);
  return true;
}

std::vector<GpuInfo> ReadProcGpus(const std::string& dir) {
  std::vector<GpuInfo> gpus;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return gpus;
  std::vector<std::string> entries;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") entries.push_back(name);
  }
  closedir(d);
  for (const std::string& entry : entries) {
    Result<std::string> text = ReadFile(dir + "/" + entry + "/information");
    if (!text.ok()) continue;
    GpuInfo gpu;
    if (!ParseProcGpuInformation(*text, &gpu)) continue;
    if (gpu.pci_bus_id.empty()) gpu.pci_bus_id = NormalizePciBusId(entry);
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.pci_bus_id < b.pci_bus_id; });
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].index = static_cast<int>(i);
  return gpus;
}

std::vector<GpuInfo> DiscoverGpus(std::chrono::milliseconds timeout) {
  std::vector<GpuInfo> from_proc = ReadProcGpus();
  if (std::optional<std::string> smi = FindExecutable("nvidia-smi")) {
    std::optional<std::string> out = RunCapture(
        {*smi, "--query-gpu=index,uuid,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits"}, timeout);
    if (out) {
      std::vector<GpuInfo> gpus = ParseNvidiaSmiCsv(*out);
      // nvidia-smi does not report device minors; /proc does, keyed by bus id.
      for (GpuInfo& gpu : gpus) {
        for (const GpuInfo& p : from_proc) {
          if (!gpu.pci_bus_id.empty() && p.pci_bus_id == gpu.pci_bus_id) gpu.minor = p.minor;
        }
      }
      if (!gpus.empty() || from_proc.empty()) return gpus;
      KLOG(warn, "gpu discovery: nvidia-smi listed no GPUs; using /proc/driver/nvidia", {});
    } else {
      KLOG(warn, "gpu discovery: nvidia-smi failed; using /proc/driver/nvidia", {{"path", *smi}});
    }
  }
  return from_proc;
}

std::vector<std::string> DefaultGpuUsageCommand() {
  return {"nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"};
}

std::vector<GpuUsage> ParseNvidiaSmiUsageCsv(std::string_view text) {
  std::vector<GpuUsage> gpus;
  // "[N/A]", "[Not Supported]" and junk read as unknown; percentages are clamped to 0–100.
  auto number = [](std::string_view s) -> std::optional<double> {
    std::string copy(Trim(s));
    if (copy.empty()) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(copy.c_str(), &end);
    if (errno != 0 || end != copy.c_str() + copy.size() || !(v >= 0) || v > 1e15) return std::nullopt;
    return v;
  };
  for (std::string_view line : Split(text, '\n')) {
    line = Trim(line);
    if (line.empty()) continue;
    std::vector<std::string_view> cols = Split(line, ',');
    if (cols.size() < 4) continue;
    std::optional<int64_t> index = ParseInt64(Trim(cols[0]));
    if (!index || *index < 0 || *index > 1'000'000) continue;
    GpuUsage gpu;
    gpu.index = static_cast<int>(*index);
    if (std::optional<double> util = number(cols[1])) gpu.utilization_percent = std::min(*util, 100.0);
    std::optional<double> used = number(cols[2]), total = number(cols[3]);
    if (used && total && *total > 0) gpu.memory_percent = std::min(*used / *total * 100.0, 100.0);
    gpus.push_back(gpu);
  }
  std::sort(gpus.begin(), gpus.end(), [](const GpuUsage& a, const GpuUsage& b) { return a.index < b.index; });
  return gpus;
}

Result<std::vector<GpuUsage>> SampleGpuUsage(const std::vector<std::string>& command,
                                             std::chrono::milliseconds timeout) {
  if (command.empty() || command[0].empty()) return Status::InvalidArgument("no GPU usage command configured");
  std::vector<std::string> argv = command;
  if (argv[0][0] != '/') {
    std::optional<std::string> found = FindExecutable(argv[0]);
    if (!found) return Status::NotFound(argv[0] + " is not installed");
    argv[0] = *found;
  } else if (access(argv[0].c_str(), X_OK) != 0) {
    return Status::NotFound(argv[0] + " is not installed");
  }
  std::optional<std::string> out = RunCapture(argv, timeout, "gpu metrics");
  if (!out) return Status::Unavailable(argv[0] + " failed or timed out");
  return ParseNvidiaSmiUsageCsv(*out);
}

}  // namespace kiln::runtime
