// `kiln agent` end to end: a real process-runtime instance (hostname algo-1, /opt/ml bound, its
// own pid/mount/uts namespaces), the agent binary (KILN_TEST_AGENT: RunAgentMain without the rest
// of the CLI) started per connection by a ProxyCommand that plays the daemon (a socketpair end as
// --socket-fd, a file as --events-fd), and OpenSSH's ssh as the client. Needs root (setns).
#include "access/agent_main.h"
#include "access/instance_entry.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/fs.h"
#include "base/strings.h"
#include "runtime/process/process_runtime.h"

namespace kiln::access {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* AgentPath() {
  const char* env = std::getenv("KILN_TEST_AGENT");
  return env != nullptr && *env != '\0' ? env : KILN_TEST_AGENT;
}
const char* ShimPath() {
  const char* env = std::getenv("KILN_TEST_SHIM");
  return env != nullptr && *env != '\0' ? env : KILN_TEST_SHIM;
}

// The daemon's part: a socketpair, the agent with one end as its --socket-fd ({sock} in its
// arguments) and the events file as --events-fd ({events}); the other end joined to stdin/stdout
// (what ssh talks to). {key} is replaced by the first line of the file argv[3] names. Writes the
// agent's exit code to argv[1] and its stderr to argv[1].err once it exited.
constexpr const char* kDaemonScript = R"(import os, signal, socket, subprocess, sys, threading
signal.signal(signal.SIGHUP, signal.SIG_IGN)
rc_file, events_file, key_file = sys.argv[1], sys.argv[2], sys.argv[3]
key = open(key_file).read().splitlines()[0]
a, b = socket.socketpair()
ev = open(events_file, 'ab')
args = [x.replace('{sock}', str(b.fileno())).replace('{events}', str(ev.fileno())).replace('{key}', key)
        for x in sys.argv[4:]]
p = subprocess.Popen(args, pass_fds=(b.fileno(), ev.fileno()), stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=open(rc_file + '.err', 'wb'))
b.close()
ev.close()
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            a.shutdown(socket.SHUT_WR)
            return
        a.sendall(d)
threading.Thread(target=up, daemon=True).start()
try:
    while True:
        d = a.recv(65536)
        if not d:
            break
        while d:
            n = os.write(1, d)
            d = d[n:]
except OSError:
    pass
rc = p.wait()
with open(rc_file + '.tmp', 'w') as f:
    f.write(str(rc))
os.rename(rc_file + '.tmp', rc_file)
)";

struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult RunShell(const std::string& command) {
  RunResult result;
  FILE* pipe = popen(("timeout 60 " + command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string Readlink(const std::string& path) {
  char buf[256] = {};
  ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The pids whose command line (NULs read as spaces) starts with `prefix`.
std::vector<int> ProcessesStartingWith(const std::string& prefix) {
  std::vector<int> pids;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string cmd = ReadFile(std::string("/proc/") + e->d_name + "/cmdline").value_or("");
    for (char& c : cmd) {
      if (c == '\0') c = ' ';
    }
    if (cmd.rfind(prefix, 0) == 0) pids.push_back(std::atoi(e->d_name));
  }
  closedir(d);
  return pids;
}

class AgentMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "entering an instance's namespaces needs root";
    if (::access("/usr/bin/ssh", X_OK) != 0) GTEST_SKIP() << "OpenSSH's client (/usr/bin/ssh) is not installed";
    char tmpl[] = "/tmp/kiln-h2-agent-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    RunResult keygen = RunShell("ssh-keygen -q -t ed25519 -N '' -f " + dir_ + "/id");
    ASSERT_EQ(keygen.exit_code, 0) << keygen.output;
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/daemon.py", kDaemonScript).ok());
    opt_ml_ = dir_ + "/optml";
    ASSERT_TRUE(MakeDirs(opt_ml_ + "/input/data").ok());
    ASSERT_TRUE(WriteFileAtomic(opt_ml_ + "/input/data/hello.txt", "hello\n").ok());
    Result<std::unique_ptr<runtime::Runtime>> rt = runtime::OpenProcessRuntime({dir_ + "/state", {ShimPath()}});
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    runtime_ = std::move(*rt);
    id_ = "h2-agent-" + std::to_string(getpid());
    runtime::InstanceSpec spec;
    spec.instance_id = id_;
    spec.opt_ml_dir = opt_ml_;
    spec.hostname = "algo-1";
    // PID 1 is `sh` (like a `train` entry point); its child plays the toolkit's user process.
    // prlimit execs it with limits of its own (as a container engine's ulimits would).
    spec.argv = {"prlimit", "--nofile=1000:2000",
                 "--",      "sh",
                 "-c",      "SM_TRAINING_ENV=from-toolkit SOME_VAR=from-script sleep 600 & wait"};
    spec.memory_limit_bytes = 512ull << 20;  // its own cgroup v2 leaf where the host allows
    spec.env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/root"}, {"SOME_VAR", "from-pid1"}, {"PID1_ONLY", "yes"}};
    Status launched = runtime_->Launch(spec);
    ASSERT_TRUE(launched.ok()) << launched.ToString();
    Result<runtime::AccessPoint> point = runtime_->Access(id_);
    ASSERT_TRUE(point.ok()) << point.status().ToString();
    pid_ = point->host_pid;
    // Wait for the user process to exist (sh forks it right away).
    for (int i = 0; i < 200 && ReadInstanceIdentity(pid_).value_or(InstanceIdentity{}).user_process_pid == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void TearDown() override {
    if (runtime_ != nullptr) {
      for (const std::string& id : runtime_->List().value_or(std::vector<std::string>{})) {
        runtime_->Stop(id, std::chrono::seconds(0)).ok();
        runtime_->Wait(id, std::chrono::seconds(10)).ok();
        runtime_->Remove(id).ok();
      }
    }
    if (!dir_.empty()) (void)RemoveAll(dir_);
  }

  // ssh to the instance through a fresh agent; `agent_args` after the standard ones.
  // With an empty `remote_command`, a shell request (what `ssh host` sends) reading `stdin_text`.
  RunResult Ssh(const std::string& remote_command, const std::string& agent_args = "",
                const std::string& stdin_text = "") {
    std::string command = "ssh " + ClientOptions(agent_args) + " root@algo-1";
    if (!remote_command.empty()) command += " '" + remote_command + "'";
    if (!stdin_text.empty()) command = "printf '%s\\n' '" + stdin_text + "' | " + command;
    return RunShell(command);
  }

  // OpenSSH options (ssh, sftp) that reach the instance through a fresh agent.
  std::string ClientOptions(const std::string& agent_args = "") {
    std::string proxy = "/usr/bin/python3 " + dir_ + "/daemon.py " + dir_ + "/rc " + dir_ + "/events " + dir_ +
                        "/id.pub " + AgentPath() + " --pid " + std::to_string(pid_) +
                        " --socket-fd {sock} --events-fd {events} --authorized-key {key} --host-key " + dir_ +
                        "/host_key --working-directory /opt/ml/code --working-directory /opt/ml " + agent_args;
    unlink((dir_ + "/rc").c_str());
    return "-F /dev/null -o 'ProxyCommand=" + proxy +
           "' -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
           " -o BatchMode=yes -o IdentitiesOnly=yes -o IdentityAgent=none -i " +
           dir_ + "/id";
  }

  // The agent's exit code once it exited (-1 if it did not within 10 s), and its stderr.
  int AgentExitCode() {
    for (int i = 0; i < 1000; ++i) {
      Result<std::string> rc = ReadFile(dir_ + "/rc");
      if (rc.ok()) return std::atoi(rc->c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string AgentStderr() { return ReadFile(dir_ + "/rc.err").value_or(""); }

  std::string dir_, opt_ml_, id_;
  int pid_ = 0;
  std::unique_ptr<runtime::Runtime> runtime_;
};

TEST_F(AgentMainTest, AShellRunsInsideTheInstance) {
  RunResult r =
      Ssh("hostname; pwd; echo $SOME_VAR $SM_TRAINING_ENV $PID1_ONLY; ls /opt/ml/input/data; "
          "readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/uts; tr \"\\0\" \" \" < /proc/1/cmdline; echo; "
          "id -u; ulimit -n; ulimit -Hn; exit 7");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  std::vector<std::string> lines;
  for (std::string_view line : Split(r.output, '\n')) lines.emplace_back(line);
  ASSERT_GE(lines.size(), 11u) << r.output << AgentStderr();
  EXPECT_EQ(lines[0], "algo-1");
  EXPECT_EQ(lines[1], "/opt/ml");  // /opt/ml/code does not exist
  EXPECT_EQ(lines[2], "from-script from-toolkit yes");
  EXPECT_EQ(lines[3], "hello.txt");
  const std::string proc = "/proc/" + std::to_string(pid_);
  EXPECT_EQ(lines[4], Readlink(proc + "/ns/pid"));
  EXPECT_NE(lines[4], Readlink("/proc/self/ns/pid"));
  EXPECT_EQ(lines[5], Readlink(proc + "/ns/mnt"));
  EXPECT_EQ(lines[6], Readlink(proc + "/ns/uts"));
  EXPECT_THAT(lines[7], HasSubstr("sleep 600 & wait"));  // PID 1 of the instance's pid namespace
  EXPECT_EQ(lines[8], "0");
  EXPECT_EQ(lines[9], "1000");  // the instance's limits, not the daemon's
  EXPECT_EQ(lines[10], "2000");
  EXPECT_EQ(AgentExitCode(), 0) << AgentStderr();

  // The shell is in the instance's cgroups (its own leaf where the shim made one), not ours.
  std::string theirs = ReadFile(proc + "/cgroup").value_or("");
  RunResult cgroup = Ssh("cat /proc/self/cgroup");
  EXPECT_EQ(cgroup.output, theirs);
  if (theirs.find("/kiln/" + id_) != std::string::npos) {
    EXPECT_NE(ReadFile("/proc/self/cgroup").value_or(""), theirs);
  }

  std::string events = ReadFile(dir_ + "/events").value_or("");
  EXPECT_THAT(events, HasSubstr(R"({"event":"authenticated","user":"root"})"));
  EXPECT_THAT(events, HasSubstr(R"("event":"exec","exit_status":7})"));
}

// `ssh host` without a command: the shell keeps the workload's environment (R-11), which a login
// shell's /etc/profile would replace (Debian's resets PATH).
TEST_F(AgentMainTest, AShellKeepsTheWorkloadsPath) {
  RunResult r = Ssh("", "", "echo \"$PATH $SM_TRAINING_ENV\"; exit 5");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_EQ(r.output, "/usr/bin:/bin from-toolkit\n");
  EXPECT_THAT(ReadFile(dir_ + "/events").value_or(""), HasSubstr(R"({"event":"shell","exit_status":5})"));
}

// sftp (the agent itself serves it, inside the mount namespace): relative paths from the working
// directory, the instance's files both ways.
TEST_F(AgentMainTest, SftpReachesTheInstancesFiles) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/up.txt", "uploaded\n").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/batch",
                              "put " + dir_ + "/up.txt model.txt\nget input/data/hello.txt " + dir_ + "/got.txt\n")
                  .ok());
  RunResult r = RunShell("sftp " + ClientOptions() + " -b " + dir_ + "/batch root@algo-1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFile(opt_ml_ + "/model.txt").value_or(""), "uploaded\n");
  EXPECT_EQ(ReadFile(dir_ + "/got.txt").value_or(""), "hello\n");
}

// Sessions run as the workload's user (/proc/<pid>/status), here an instance whose PID 1 runs as
// nobody.
TEST_F(AgentMainTest, SessionsRunAsTheWorkloadsUser) {
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no setpriv";
  runtime::InstanceSpec spec;
  spec.instance_id = id_ + "-nobody";
  spec.opt_ml_dir = opt_ml_;
  spec.hostname = "algo-2";
  spec.argv = {"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "sleep", "600"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  ASSERT_TRUE(runtime_->Launch(spec).ok());
  int nobody_pid = 0;
  for (int i = 0; i < 200; ++i) {
    Result<InstanceIdentity> who = ReadInstanceIdentity(runtime_->Access(spec.instance_id).value_or({}).host_pid);
    if (who.ok() && who->uid == 65534) {
      nobody_pid = runtime_->Access(spec.instance_id)->host_pid;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(nobody_pid, 0);
  pid_ = nobody_pid;
  RunResult r = Ssh("hostname; id -u; id -g; id -G");
  EXPECT_EQ(r.output, "algo-2\n65534\n65534\n65534\n") << AgentStderr();
  EXPECT_EQ(AgentExitCode(), 0) << AgentStderr();
}

// A long command is cut in its events (the lines stay short), not in what runs.
TEST_F(AgentMainTest, LongCommandsAreCutInEvents) {
  RunResult r = Ssh("echo " + std::string(20000, 'x') + " | wc -c");
  EXPECT_EQ(r.output, "20001\n");
  std::string events = ReadFile(dir_ + "/events").value_or("");
  EXPECT_THAT(events, HasSubstr("xxx...\",\"event\":\"exec\",\"exit_status\":0}"));
  for (std::string_view line : Split(events, '\n')) EXPECT_LT(line.size(), 4200u);
}

TEST_F(AgentMainTest, NothingIsLeftAfterTheConnectionCloses) {
  // A background job that outlives its shell, and one the shell waits for.
  RunResult r = Ssh("sleep 4321 </dev/null >/dev/null 2>&1 & echo started");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "started\n");
  EXPECT_EQ(AgentExitCode(), 0) << AgentStderr();
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ProcessesStartingWith("sleep 4321").empty();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "a background job outlived the connection";
  // The agent exited (its rc is written); so did the proxy that wrote it, soon after.
  bool agent_gone = false;
  for (int i = 0; i < 100 && !agent_gone; ++i) {
    agent_gone = ProcessesStartingWith(std::string(AgentPath()) + " --pid").empty();
    if (!agent_gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(agent_gone);
  // The instance itself runs on.
  EXPECT_EQ(runtime_->Inspect(id_)->state, runtime::InstanceState::kRunning);
}

TEST_F(AgentMainTest, SigtermEndsTheConnectionAndKillsTheChildren) {
  // ssh runs in the background; the agent gets SIGTERM while `sleep 4322` runs in the session.
  pid_t client = fork();
  ASSERT_GE(client, 0);
  if (client == 0) {
    setpgid(0, 0);
    RunResult r = Ssh("sleep 4322; echo not-reached");
    _exit(r.output.find("not-reached") == std::string::npos ? 0 : 1);
  }
  bool running = false;
  for (int i = 0; i < 500 && !running; ++i) {
    running = !ProcessesStartingWith("sleep 4322").empty();
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> agents = ProcessesStartingWith(std::string(AgentPath()) + " --pid " + std::to_string(pid_) + " ");
  if (!running || agents.size() != 1u) {
    kill(-client, SIGKILL);  // the client, its proxy and (through its death signal) the agent
    waitpid(client, nullptr, 0);
    FAIL() << "the session's sleep is " << (running ? "" : "not ") << "running; " << agents.size() << " agents";
  }
  ASSERT_EQ(kill(agents[0], SIGTERM), 0);
  int status = 0;
  waitpid(client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(AgentExitCode(), 0) << AgentStderr();
  EXPECT_TRUE(ProcessesStartingWith("sleep 4322").empty());
}

TEST(AgentMainArgumentsTest, BadArgumentsExit2AndAGonePidExits3WithOneLine) {
  RunResult none = RunShell(std::string(AgentPath()));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.output, "kiln agent: --pid <host pid of the instance> is required\n");
  RunResult bad_fd = RunShell(std::string(AgentPath()) + " --pid 1 --socket-fd 99 --authorized-key x");
  EXPECT_EQ(bad_fd.exit_code, 2);
  EXPECT_THAT(bad_fd.output, HasSubstr("--socket-fd 99 is not an open descriptor"));
  RunResult unknown = RunShell(std::string(AgentPath()) + " --pid 1 --socket-fd 0 --frobnicate 1");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown argument --frobnicate"));
  // A pid that does not exist (pid_max is at most 2^22).
  RunResult gone = RunShell(std::string(AgentPath()) +
                            " --pid 99999999 --socket-fd 0 --authorized-key 'ssh-ed25519 "
                            "AAAAC3NzaC1lZDI1NTE5AAAAIKzQ6hOwc5mmdRMS1KqmCbmXHWd4/Kas3FVZmDpBpnjX t' </dev/null");
  EXPECT_EQ(gone.exit_code, 3);
  EXPECT_THAT(gone.output, HasSubstr("does not exist"));
  EXPECT_EQ(std::count(gone.output.begin(), gone.output.end(), '\n'), 1) << gone.output;
}

}  // namespace
}  // namespace kiln::access
