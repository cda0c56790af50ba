#include "runtime/slurm/slurm_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

extern char** environ;

namespace kiln::runtime::slurm {

namespace {

constexpr char kSqueueFormat[] = "%i|%T|%r|%N";

struct CommandResult {
  int exit_status = -1;  // -1: killed by a signal or timed out
  bool timed_out = false;
  std::string out, err;
};

// Whether a variable of the server's environment is one a submitted job may see: what the tools
// and a shell need (the search path, who and where, the locale) and Slurm's own settings
// (SLURM_CONF, SBATCH_*), never anything else (credentials, proxies, Kiln's own).
bool JobVisibleVariable(std::string_view name) {
  for (std::string_view keep : {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR"}) {
    if (name == keep) return true;
  }
  return StartsWith(name, "LC_") || StartsWith(name, "SLURM_") || StartsWith(name, "SBATCH_");
}

// Runs `argv` (argv[0] a name looked up on PATH, or a path) with stdin on /dev/null, this
// process's environment (`clean`: only its JobVisibleVariable ones) plus `extra_env`, capturing
// stdout and stderr; kills it past `timeout`. Errors only when it could not be started at all.
Result<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& extra_env, std::chrono::milliseconds timeout,
                                 bool clean = false) {
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    if (clean && !JobVisibleVariable(name)) continue;
    if (extra_env.count(std::string(name)) == 0) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : extra_env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return ErrnoStatus("pipe", errno);
  }
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return ErrnoStatus("fork for " + argv[0], err);
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execvpe(cargv[0], cargv.data(), envp.data());
    const char msg[] = "cannot execute the Slurm command\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  UniqueFd out_fd(out_pipe[0]), err_fd(err_pipe[0]);
  CommandResult result;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = true, err_open = true;
  char buf[8192];
  while (out_open || err_open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd fds[2] = {{out_open ? out_fd.get() : -1, POLLIN, 0}, {err_open ? err_fd.get() : -1, POLLIN, 0}};
    int r = poll(fds, 2, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
    }
  }
  if (result.timed_out) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!result.timed_out && WIFEXITED(wstatus)) result.exit_status = WEXITSTATUS(wstatus);
  return result;
}

// The command's own words for an error: its stderr (trimmed, at most a few lines), else stdout.
std::string Words(const CommandResult& r) {
  std::string text(Trim(r.err.empty() ? r.out : r.err));
  if (text.size() > 2000) text = text.substr(0, 2000) + "...";
  if (text.empty()) text = r.timed_out ? "no answer" : "exit status " + std::to_string(r.exit_status);
  return text;
}

// True when the words say the controller could not be reached (as opposed to a refusal).
bool ControllerUnreachable(std::string_view words) {
  for (std::string_view marker :
       {"Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes were transmitted",
        "Communication connection failure", "Slurm backup controller in standby", "cannot execute"}) {
    if (words.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

std::string Tool(const CliSlurmClientOptions& options, const char* name) {
  return options.bin_dir.empty() ? std::string(name) : options.bin_dir + "/" + name;
}

class CliSlurmClient final : public SlurmClient {
 public:
  explicit CliSlurmClient(CliSlurmClientOptions options) : options_(std::move(options)) {}

  Result<std::string> Submit(const SubmitRequest& request) override {
    std::vector<std::string> argv = {Tool(options_, "sbatch")};
    for (std::string& a : SbatchArguments(request)) argv.push_back(std::move(a));
    // sbatch runs in a clean environment that --export=ALL hands to the job whole (see
    // SbatchArguments): the token, the tools' variables, nothing else of the server's.
    ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv, request.env, options_.command_timeout, /*clean=*/true));
    if (r.timed_out) return Status::Unavailable("sbatch did not answer within the command timeout: " + Words(r));
    if (r.exit_status != 0) {
      std::string words = Words(r);
      if (ControllerUnreachable(words)) return Status::Unavailable(words);
      return Status::InvalidArgument(words);
    }
    Result<std::string> id = ParseSbatchParsable(r.out);
    if (!id.ok()) return Status::Internal("sbatch --parsable printed no job id: " + Words(r));
    return id;
  }

  Result<std::map<std::string, JobInfo>> Query(const std::vector<std::string>& job_ids) override {
    std::map<std::string, JobInfo> found;
    if (job_ids.empty()) return found;
    // Every state, this user's jobs, one call; filtered here. (`squeue -j a,b` fails outright
    // when one of several ids was purged, on some releases.)
    ASSIGN_OR_RETURN(CommandResult r,
                     RunCommand({Tool(options_, "squeue"), "-h", "--states=all", "--me", "-o", kSqueueFormat}, {},
                                options_.command_timeout));
    if (r.timed_out || r.exit_status != 0) return Status::Unavailable("squeue failed: " + Words(r));
    std::map<std::string, JobInfo> all = ParseSqueue(r.out);
    std::set<std::string> wanted(job_ids.begin(), job_ids.end());
    for (auto& [id, info] : all) {
      if (wanted.count(id) == 0) continue;
      if (IsTerminalState(info.state)) {
        // squeue has no exit code; scontrol has it (and the node list of a job that failed).
        Result<CommandResult> s =
            RunCommand({Tool(options_, "scontrol"), "show", "job", "-o", id}, {}, options_.command_timeout);
        if (s.ok() && s->exit_status == 0) {
          Result<JobInfo> detail = ParseScontrolJob(s->out);
          if (detail.ok()) {
            info.exit_code = detail->exit_code;
            info.term_signal = detail->term_signal;
            if (info.node_list.empty()) info.node_list = detail->node_list;
          }
        }
      }
      found.emplace(id, std::move(info));
    }
    return found;
  }

  Status Cancel(const std::string& job_id, int signal) override {
    std::vector<std::string> argv = {Tool(options_, "scancel")};
    if (signal != 0) {
      argv.push_back("--full");
      argv.push_back("--signal=" + std::to_string(signal));
    }
    argv.push_back(job_id);
    ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv, {}, options_.command_timeout));
    if (r.timed_out) return Status::Unavailable("scancel " + job_id + " did not answer: " + Words(r));
    if (r.exit_status != 0) {
      std::string words = Words(r);
      // Already ended or purged: nothing is left to cancel.
      if (words.find("Invalid job id") != std::string::npos ||
          words.find("already completing or completed") != std::string::npos) {
        return Status::Ok();
      }
      if (ControllerUnreachable(words)) return Status::Unavailable(words);
      return Status::Internal("scancel " + job_id + ": " + words);
    }
    return Status::Ok();
  }

 private:
  const CliSlurmClientOptions options_;
};

}  // namespace

bool IsTerminalState(std::string_view state) {
  for (std::string_view s : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                             "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}) {
    if (state == s) return true;
  }
  return false;
}

std::unique_ptr<SlurmClient> NewCliSlurmClient(CliSlurmClientOptions options) {
  return std::make_unique<CliSlurmClient>(std::move(options));
}

std::map<std::string, JobInfo> ParseSqueue(std::string_view text) {
  std::map<std::string, JobInfo> jobs;
  for (std::string_view line : Split(text, '\n')) {
    line = Trim(line);
    if (line.empty()) continue;
    std::vector<std::string_view> f = Split(line, '|');
    if (f.size() < 4) continue;
    JobInfo info;
    info.job_id = std::string(Trim(f[0]));
    info.state = std::string(Trim(f[1]));
    info.reason = std::string(Trim(f[2]));
    info.node_list = std::string(Trim(f[3]));
    if (info.job_id.empty()) continue;
    jobs[info.job_id] = std::move(info);
  }
  return jobs;
}

Result<JobInfo> ParseScontrolJob(std::string_view text) {
  text = Trim(text);
  if (text.empty() || text.find("Invalid job id") != std::string_view::npos || !StartsWith(text, "JobId=")) {
    return Status::NotFound(text.empty() ? "scontrol printed nothing" : std::string(text));
  }
  // Only the first line: one job (a heterogeneous job prints one line per component).
  text = text.substr(0, text.find('\n'));
  // Key=Value tokens separated by spaces; a token without '=' continues the previous value
  // (Reason and Comment may hold spaces).
  std::map<std::string, std::string> fields;
  std::string last;
  for (std::string_view token : Split(text, ' ')) {
    if (token.empty()) continue;
    size_t eq = token.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      if (!last.empty()) fields[last] += " " + std::string(token);
      continue;
    }
    last = std::string(token.substr(0, eq));
    fields[last] = std::string(token.substr(eq + 1));
  }
  JobInfo info;
  info.job_id = fields["JobId"];
  std::string state = fields["JobState"];
  info.state = state.substr(0, state.find(' '));  // "CANCELLED by 0" in some releases
  info.reason = fields["Reason"];
  info.node_list = fields["NodeList"] == "(null)" ? "" : fields["NodeList"];
  const std::string& exit = fields["ExitCode"];
  size_t colon = exit.find(':');
  if (colon != std::string::npos) {
    info.exit_code = std::atoi(exit.substr(0, colon).c_str());
    info.term_signal = std::atoi(exit.substr(colon + 1).c_str());
  }
  return info;
}

Result<std::string> ParseSbatchParsable(std::string_view text) {
  // The id is the last non-empty line (sbatch may print warnings to stdout before it on some sites).
  std::string_view last;
  for (std::string_view line : Split(Trim(text), '\n')) {
    if (!Trim(line).empty()) last = Trim(line);
  }
  std::string_view id = last.substr(0, last.find(';'));
  if (id.empty()) return Status::InvalidArgument("no job id");
  for (char c : id) {
    if (c < '0' || c > '9') {
      if (c != '_') return Status::InvalidArgument("not a job id: " + std::string(id));
    }
  }
  return std::string(id);
}

std::vector<std::string> SbatchArguments(const SubmitRequest& r) {
  std::vector<std::string> a = {"--parsable", "--job-name=" + r.job_name, "--nodes=" + std::to_string(r.nodes),
                                "--ntasks-per-node=1"};
  if (r.cpus_per_task > 0) a.push_back("--cpus-per-task=" + std::to_string(r.cpus_per_task));
  if (r.memory_bytes > 0) {
    uint64_t mib = (r.memory_bytes + (1ull << 20) - 1) >> 20;
    a.push_back("--mem=" + std::to_string(mib) + "M");
  }
  if (r.gpus_per_node > 0) a.push_back("--gpus-per-node=" + std::to_string(r.gpus_per_node));
  if (r.time_limit_seconds > 0) a.push_back("--time=" + std::to_string((r.time_limit_seconds + 59) / 60));
  if (!r.partition.empty()) a.push_back("--partition=" + r.partition);
  if (!r.qos.empty()) a.push_back("--qos=" + r.qos);
  if (!r.account.empty()) a.push_back("--account=" + r.account);
  if (!r.output_path.empty()) a.push_back("--output=" + r.output_path);
  if (!r.working_dir.empty()) a.push_back("--chdir=" + r.working_dir);
  // ALL of sbatch's environment, which Submit makes clean (the request's variables and what the
  // tools need): values never on a command line, and no login environment loaded on the node —
  // a list without ALL implies --get-user-env there, a login shell per job (~1.7 s each on the
  // test cluster, piling up when dozens of jobs start at once).
  a.push_back("--export=ALL");
  for (const std::string& extra : r.extra_args) a.push_back(extra);
  a.push_back(r.script_path);
  return a;
}

}  // namespace kiln::runtime::slurm
