// Real processes in real namespaces: these tests need root (or unprivileged user namespaces, for
// the one test that drops to nobody) and run the shim binary built beside them (KILN_TEST_SHIM).
#include "runtime/process/process_runtime.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/fs.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/netlink.h"
#include "runtime/process/state.h"

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;

// The shim binary: built beside this test; KILN_TEST_SHIM in the environment overrides the path
// (for running the binaries on another machine).
const char* ShimPath() {
  const char* env = std::getenv("KILN_TEST_SHIM");
  return env != nullptr && *env != '\0' ? env : KILN_TEST_SHIM;
}

struct Record {
  int64_t millis;
  char tag;
  std::string line;
};

std::vector<Record> ReadRecords(const std::string& path) {
  std::vector<Record> records;
  std::string text = ReadFile(path).value_or("");
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    EXPECT_NE(nl, std::string::npos) << "record without LF";
    if (nl == std::string::npos) break;
    std::string rec = text.substr(start, nl - start);
    start = nl + 1;
    size_t sp = rec.find(' ');
    EXPECT_NE(sp, std::string::npos) << rec;
    EXPECT_GE(rec.size(), sp + 3) << rec;
    EXPECT_EQ(rec[sp + 2], ' ') << rec;
    std::optional<int64_t> millis = ParseInt64(rec.substr(0, sp));
    EXPECT_TRUE(millis.has_value()) << rec;
    records.push_back({millis.value_or(0), rec[sp + 1], rec.substr(sp + 3)});
  }
  return records;
}

std::vector<std::string> Lines(const std::vector<Record>& records, char tag) {
  std::vector<std::string> out;
  for (const Record& r : records) {
    if (r.tag == tag) out.push_back(r.line);
  }
  return out;
}

// True if a process whose command line contains `needle` (NULs read as spaces) exists.
bool ProcessWithCmdline(const std::string& needle) {
  DIR* d = opendir("/proc");
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string cmd = ReadFile(std::string("/proc/") + e->d_name + "/cmdline").value_or("");
    for (char& c : cmd) {
      if (c == '\0') c = ' ';
    }
    // Zombies have an empty cmdline; they are not running.
    if (cmd.find(needle) != std::string::npos && getpid() != std::atoi(e->d_name)) found = true;
  }
  closedir(d);
  return found;
}

class ProcessRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-rt-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_dir_ = root_ + "/state";
    opt_ml_ = root_ + "/optml";
    ASSERT_TRUE(MakeDirs(opt_ml_).ok());
    runtime_ = Open();
  }
  void TearDown() override {
    if (runtime_) {
      for (const std::string& id : runtime_->List().value_or({})) {
        runtime_->Stop(id, std::chrono::seconds(0)).ok();
        runtime_->Wait(id, std::chrono::seconds(5)).ok();
      }
    }
    RemoveAll(root_).ok();
  }
  std::unique_ptr<Runtime> Open() {
    Result<std::unique_ptr<Runtime>> r = OpenProcessRuntime({state_dir_, {ShimPath()}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  InstanceSpec Spec(const std::string& id, const std::string& script) {
    InstanceSpec spec;
    spec.instance_id = id;
    spec.opt_ml_dir = opt_ml_;
    spec.hostname = "algo-1";
    spec.argv = {"sh", "-c", script};
    spec.env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/root"}};
    return spec;
  }
  InstanceStatus RunToEnd(const InstanceSpec& spec) {
    Status s = runtime_->Launch(spec);
    EXPECT_TRUE(s.ok()) << s.ToString();
    Result<InstanceStatus> st = runtime_->Wait(spec.instance_id, std::chrono::seconds(10));
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->state, InstanceState::kExited);
    return *st;
  }
  // Waits until the captured output contains `text`.
  bool WaitForOutput(const std::string& id, const std::string& text) {
    for (int i = 0; i < 500; ++i) {
      if (ReadFile(runtime_->OutputPath(id)).value_or("").find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string root_, state_dir_, opt_ml_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(ProcessRuntimeTest, CapturesStdoutAndStderrAsRecordsInOrder) {
  InstanceStatus st =
      RunToEnd(Spec("echo", "echo out1; sleep 0.05; echo err1 >&2; sleep 0.05; echo; echo out2; printf partial"));
  EXPECT_EQ(st.exit_code, 0);
  EXPECT_EQ(st.term_signal, 0);
  EXPECT_FALSE(st.stop_requested);
  std::vector<Record> records = ReadRecords(runtime_->OutputPath("echo"));
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[0].tag, 'o');
  EXPECT_EQ(records[0].line, "out1");
  EXPECT_EQ(records[1].tag, 'e');
  EXPECT_EQ(records[1].line, "err1");
  EXPECT_EQ(records[2].line, "");
  EXPECT_EQ(records[3].line, "out2");
  EXPECT_EQ(records[4].line, "partial");  // flushed at EOF without a newline
  EXPECT_GE(records[0].millis, st.started_millis);
  EXPECT_LE(records[4].millis, st.finished_millis + 100);
  EXPECT_GE(records[1].millis, records[0].millis + 40);
  EXPECT_LE(st.started_millis, st.finished_millis);
}

TEST_F(ProcessRuntimeTest, SplitsLongLines) {
  RunToEnd(Spec("long", "head -c 600000 /dev/zero | tr '\\0' a; echo; echo short"));
  std::vector<std::string> lines = Lines(ReadRecords(runtime_->OutputPath("long")), 'o');
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].size(), kMaxOutputLineBytes);
  EXPECT_EQ(lines[1].size(), kMaxOutputLineBytes);
  EXPECT_EQ(lines[2].size(), 600000 - 2 * kMaxOutputLineBytes);
  EXPECT_EQ(lines[2], std::string(lines[2].size(), 'a'));
  EXPECT_EQ(lines[3], "short");
}

TEST_F(ProcessRuntimeTest, SandboxHasHostnameOptMlPrivateTmpHostsAndOwnPidNamespace) {
  ASSERT_TRUE(WriteFileAtomic(opt_ml_ + "/input.txt", "hello from the host\n").ok());
  ASSERT_TRUE(WriteFileAtomic("/tmp/kiln-rt-host-marker", "x").ok());
  std::string data = root_ + "/data";
  ASSERT_TRUE(MakeDirs(data).ok());
  ASSERT_TRUE(WriteFileAtomic(data + "/d.txt", "dataset\n").ok());
  InstanceSpec spec = Spec("sandbox",
                           "hostname; cat /opt/ml/input.txt; ls -A /tmp | wc -l; echo pid=$$; "
                           "ps -e --no-headers | wc -l; echo written > /opt/ml/out.txt; cat /etc/hosts; "
                           "cat /data/d.txt; touch /data/x 2>/dev/null || echo ro; pwd; "
                           "grep Cpus_allowed_list /proc/self/status");
  spec.hosts_file_lines = {"10.0.0.1 algo-1", "10.0.0.2 algo-2"};
  spec.extra_mounts = {{data, "/data", true}};
  spec.working_dir = "/opt/ml";
  spec.cpus = {0};
  InstanceStatus st = RunToEnd(spec);
  unlink("/tmp/kiln-rt-host-marker");
  EXPECT_EQ(st.exit_code, 0);
  std::vector<Record> records = ReadRecords(runtime_->OutputPath("sandbox"));
  EXPECT_THAT(Lines(records, 'e'), ::testing::IsEmpty());
  std::vector<std::string> out = Lines(records, 'o');
  ASSERT_EQ(out.size(), 11u) << Join(out, "\n");
  EXPECT_EQ(out[0], "algo-1");
  EXPECT_EQ(out[1], "hello from the host");
  EXPECT_EQ(out[2], "0");      // the host's /tmp is not visible
  EXPECT_EQ(out[3], "pid=1");  // the program is PID 1 of the sandbox
  EXPECT_EQ(out[4], "3");      // ps sees only sh, itself and wc
  EXPECT_EQ(out[5], "10.0.0.1 algo-1");
  EXPECT_EQ(out[6], "10.0.0.2 algo-2");
  EXPECT_EQ(out[7], "dataset");
  EXPECT_EQ(out[8], "ro");
  EXPECT_EQ(out[9], "/opt/ml");
  EXPECT_EQ(out[10], "Cpus_allowed_list:\t0");
  EXPECT_EQ(ReadFile(opt_ml_ + "/out.txt").value_or(""), "written\n");
  EXPECT_FALSE(PathExists(data + "/x"));
}

TEST_F(ProcessRuntimeTest, RecordsExitCodeAndSignal) {
  InstanceStatus st = RunToEnd(Spec("code", "exit 7"));
  EXPECT_EQ(st.exit_code, 7);
  EXPECT_EQ(st.term_signal, 0);

  InstanceSpec spec = Spec("sig", "");
  spec.argv = {"sleep", "30"};
  ASSERT_TRUE(runtime_->Launch(spec).ok());
  Result<InstanceStatus> running = runtime_->Inspect("sig");
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state, InstanceState::kRunning);
  EXPECT_GT(running->started_millis, 0);
  ASSERT_TRUE(runtime_->Signal("sig", SIGKILL).ok());
  Result<InstanceStatus> done = runtime_->Wait("sig", std::chrono::seconds(5));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state, InstanceState::kExited);
  EXPECT_EQ(done->exit_code, -1);
  EXPECT_EQ(done->term_signal, SIGKILL);
  EXPECT_FALSE(done->stop_requested);
  EXPECT_EQ(runtime_->Signal("sig", SIGTERM).code(), StatusCode::kFailedPrecondition);
}

TEST_F(ProcessRuntimeTest, StopDeliversSigtermToTheProgramsHandler) {
  ASSERT_TRUE(runtime_
                  ->Launch(Spec("term",
                                "trap 'echo term > /opt/ml/termed; exit 3' TERM; echo ready; "
                                "while :; do sleep 0.05; done"))
                  .ok());
  ASSERT_TRUE(WaitForOutput("term", "ready"));
  int64_t t0 = NowMillis();
  ASSERT_TRUE(runtime_->Stop("term", std::chrono::seconds(10)).ok());
  Result<InstanceStatus> st = runtime_->Wait("term", std::chrono::seconds(5));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_EQ(st->exit_code, 3);
  EXPECT_TRUE(st->stop_requested);
  EXPECT_LT(NowMillis() - t0, 2000);
  EXPECT_EQ(ReadFile(opt_ml_ + "/termed").value_or(""), "term\n");
  EXPECT_TRUE(runtime_->Stop("term", std::chrono::seconds(1)).ok());  // idempotent after exit
}

TEST_F(ProcessRuntimeTest, StopKillsAfterTheShortestGraceWhenSigtermIsIgnored) {
  // sh without a trap, as PID 1, ignores SIGTERM (Docker semantics); its child must die too.
  ASSERT_TRUE(runtime_->Launch(Spec("stubborn", "sleep 876543 & echo ready; while :; do sleep 0.05; done")).ok());
  ASSERT_TRUE(WaitForOutput("stubborn", "ready"));
  EXPECT_TRUE(ProcessWithCmdline("sleep 876543"));
  int64_t t0 = NowMillis();
  ASSERT_TRUE(runtime_->Stop("stubborn", std::chrono::seconds(60)).ok());
  ASSERT_TRUE(runtime_->Stop("stubborn", std::chrono::seconds(1)).ok());  // a shorter grace wins
  Result<InstanceStatus> mid = runtime_->Wait("stubborn", std::chrono::milliseconds(500));
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->state, InstanceState::kRunning);
  EXPECT_TRUE(mid->stop_requested);
  Result<InstanceStatus> st = runtime_->Wait("stubborn", std::chrono::seconds(5));
  ASSERT_TRUE(st.ok());
  int64_t elapsed = NowMillis() - t0;
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_EQ(st->term_signal, SIGKILL);
  EXPECT_TRUE(st->stop_requested);
  EXPECT_GE(elapsed, 950);
  EXPECT_LT(elapsed, 2500);
  EXPECT_FALSE(ProcessWithCmdline("sleep 876543"));
}

TEST_F(ProcessRuntimeTest, ChildrenDieWithTheProgram) {
  InstanceStatus st = RunToEnd(Spec("orphans", "sleep 765432 & sleep 765432 & echo spawned"));
  EXPECT_EQ(st.exit_code, 0);
  EXPECT_FALSE(ProcessWithCmdline("sleep 765432"));
}

TEST_F(ProcessRuntimeTest, MissingProgramFailsLaunchAndLeavesNothing) {
  InstanceSpec spec = Spec("missing", "");
  spec.argv = {"/nonexistent/pythn3", "train"};
  Status s = runtime_->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cannot execute /nonexistent/pythn3: No such file or directory"));
  EXPECT_FALSE(PathExists(state_dir_ + "/missing"));
  EXPECT_FALSE(ProcessWithCmdline(state_dir_ + "/missing"));

  spec.argv = {"no-such-program-kiln"};
  s = runtime_->Launch(spec);
  EXPECT_THAT(s.message(), HasSubstr("cannot execute no-such-program-kiln: No such file or directory"));
  EXPECT_THAT(s.message(), HasSubstr("/usr/bin:/bin"));

  ASSERT_TRUE(WriteFileAtomic(opt_ml_ + "/data.txt", "not a program", 0644).ok());
  spec.argv = {"/opt/ml/data.txt"};
  s = runtime_->Launch(spec);
  EXPECT_THAT(s.message(), HasSubstr("cannot execute /opt/ml/data.txt: Permission denied"));

  spec = Spec("missing", "true");
  spec.working_dir = "/no/such/dir";
  s = runtime_->Launch(spec);
  EXPECT_THAT(s.message(), HasSubstr("cannot change to working directory /no/such/dir"));
  EXPECT_THAT(runtime_->List().value(), ::testing::IsEmpty());
  EXPECT_FALSE(ProcessWithCmdline(state_dir_ + "/missing"));
}

TEST_F(ProcessRuntimeTest, RejectsBadSpecsAndDuplicateIds) {
  EXPECT_EQ(runtime_->Launch(Spec("bad/id", "true")).code(), StatusCode::kInvalidArgument);
  InstanceSpec spec = Spec("noml", "true");
  spec.opt_ml_dir = root_ + "/nope";
  EXPECT_EQ(runtime_->Launch(spec).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(runtime_->Launch(Spec("dup", "sleep 5")).ok());
  EXPECT_EQ(runtime_->Launch(Spec("dup", "true")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(runtime_->Inspect("unknown").status().code(), StatusCode::kNotFound);
}

TEST_F(ProcessRuntimeTest, RefusesContainerImagesNamingTheSetting) {
  InstanceSpec spec = Spec("image", "true");
  spec.container = ContainerImage{.requested = "registry.local/byo:1", .reference = "", .entrypoint = std::nullopt};
  Status s = runtime_->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot run container image registry.local/byo:1"));
  EXPECT_THAT(s.message(), HasSubstr("container_engine"));
  EXPECT_FALSE(PathExists(state_dir_ + "/image"));
}

TEST_F(ProcessRuntimeTest, InstanceOutlivesTheProcessThatLaunchedIt) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::unique_ptr<Runtime> rt = Open();
    bool ok = rt && rt->Launch(Spec("survivor", "echo one; sleep 0.5; echo two; exit 4")).ok();
    if (!ok) _exit(1);
    kill(getpid(), SIGKILL);  // the "server" dies without any cleanup
  }
  int wstatus;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "launch in the child failed";
  std::unique_ptr<Runtime> fresh = Open();
  Result<InstanceStatus> now = fresh->Inspect("survivor");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->state, InstanceState::kRunning);
  EXPECT_THAT(fresh->List().value(), ::testing::ElementsAre("survivor"));
  Result<InstanceStatus> st = fresh->Wait("survivor", std::chrono::seconds(5));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_EQ(st->exit_code, 4);
  EXPECT_THAT(Lines(ReadRecords(fresh->OutputPath("survivor")), 'o'), ::testing::ElementsAre("one", "two"));
}

TEST_F(ProcessRuntimeTest, WaitTimesOutListAndRemove) {
  ASSERT_TRUE(runtime_->Launch(Spec("a", "sleep 0.3")).ok());
  ASSERT_TRUE(runtime_->Launch(Spec("b", "true")).ok());
  EXPECT_THAT(runtime_->List().value(), ::testing::ElementsAre("a", "b"));
  int64_t t0 = NowMillis();
  Result<InstanceStatus> st = runtime_->Wait("a", std::chrono::milliseconds(100));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kRunning);
  EXPECT_GE(NowMillis() - t0, 95);
  EXPECT_EQ(runtime_->Remove("a").code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(runtime_->Wait("a", std::chrono::seconds(5))->state, InstanceState::kExited);
  ASSERT_EQ(runtime_->Wait("b", std::chrono::seconds(5))->state, InstanceState::kExited);
  EXPECT_TRUE(runtime_->Remove("a").ok());
  EXPECT_EQ(runtime_->Inspect("a").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(runtime_->List().value(), ::testing::ElementsAre("b"));
  EXPECT_EQ(runtime_->Remove("a").code(), StatusCode::kNotFound);
}

TEST_F(ProcessRuntimeTest, InstanceIsLostWhenItsShimDiesAndTheProgramGoesWithIt) {
  InstanceSpec spec = Spec("lost", "");
  spec.argv = {"sleep", "654321"};
  ASSERT_TRUE(runtime_->Launch(spec).ok());
  Result<process_state::StartedRecord> started =
      process_state::DecodeStarted(ReadFile(state_dir_ + "/lost/" + process_state::kStartedFile).value_or(""));
  ASSERT_TRUE(started.ok());
  ASSERT_EQ(kill(started->shim_pid, SIGKILL), 0);
  InstanceState state = InstanceState::kRunning;
  for (int i = 0; i < 200 && state == InstanceState::kRunning; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    state = runtime_->Inspect("lost")->state;
  }
  EXPECT_EQ(state, InstanceState::kLost);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = !ProcessWithCmdline("sleep 654321");
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(runtime_->Wait("lost", std::chrono::seconds(1))->state, InstanceState::kLost);
  EXPECT_TRUE(runtime_->Remove("lost").ok());
}

TEST_F(ProcessRuntimeTest, LongStateDirUsesAShortSocketPath) {
  std::string long_dir = root_ + "/" + std::string(100, 'd');
  Result<std::unique_ptr<Runtime>> rt = OpenProcessRuntime({long_dir, {ShimPath()}});
  ASSERT_TRUE(rt.ok());
  InstanceSpec spec = Spec("long-socket", "sleep 5");
  ASSERT_TRUE((*rt)->Launch(spec).ok());
  std::string socket = process_state::SocketPath(long_dir + "/long-socket");
  EXPECT_TRUE(StartsWith(socket, "/tmp/kiln-"));
  EXPECT_TRUE(PathExists(socket));
  ASSERT_TRUE((*rt)->Stop("long-socket", std::chrono::seconds(0)).ok());
  EXPECT_EQ((*rt)->Wait("long-socket", std::chrono::seconds(5))->term_signal, SIGKILL);
  EXPECT_TRUE((*rt)->Remove("long-socket").ok());
  EXPECT_FALSE(PathExists(socket));
}

// Where cgroup v2 offers the memory controller, the program runs in its own cgroup with memory.max
// set, and the cgroup goes away with the instance.
TEST_F(ProcessRuntimeTest, MemoryLimitUsesACgroupWhereAvailable) {
  std::string controllers = ReadFile("/sys/fs/cgroup/cgroup.controllers").value_or("");
  if (controllers.find("memory") == std::string::npos) GTEST_SKIP() << "no cgroup v2 memory controller here";
  InstanceSpec spec =
      Spec("mem", "cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max; cut -d: -f3 /proc/self/cgroup");
  spec.memory_limit_bytes = 64 << 20;
  RunToEnd(spec);
  std::vector<std::string> lines = Lines(ReadRecords(runtime_->OutputPath("mem")), 'o');
  ASSERT_EQ(lines.size(), 2u) << ReadFile(state_dir_ + "/mem/shim.log").value_or("");
  EXPECT_EQ(lines[0], std::to_string(64 << 20));
  EXPECT_EQ(lines[1], "/kiln/mem");
  EXPECT_FALSE(PathExists("/sys/fs/cgroup/kiln/mem"));
}

// Usage: CPU time of every process of the sandbox (here two busy shells), memory, the spec's
// memory limit and GPUs; FailedPrecondition once the instance has ended, NotFound for no instance.
TEST_F(ProcessRuntimeTest, UsageMeasuresTheSandboxsProcesses) {
  InstanceSpec spec = Spec("usage", "(while :; do :; done) & while :; do :; done");
  spec.memory_limit_bytes = 512ull << 20;
  spec.gpus = {3};  // only recorded: no /dev/nvidia3 needed
  ASSERT_TRUE(runtime_->Launch(spec).ok());
  Result<InstanceUsage> first = runtime_->Usage("usage");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  Result<InstanceUsage> second = runtime_->Usage("usage");
  auto wall_usec = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->source, first->source);
  if (second->source == "proc") {
    EXPECT_EQ(second->process_count, 2);  // the program and its subshell
    EXPECT_EQ(second->memory_limit_bytes, 512ull << 20);
  } else {
    EXPECT_EQ(second->source, "cgroup");
    EXPECT_EQ(second->memory_limit_bytes, 512ull << 20);  // memory.max as written by the shim
  }
  EXPECT_GT(second->memory_bytes, 0u);
  EXPECT_EQ(second->gpus, (std::vector<int>{3}));
  ASSERT_GE(second->cpu_usec, first->cpu_usec);
  double percent = 100.0 * static_cast<double>(second->cpu_usec - first->cpu_usec) / static_cast<double>(wall_usec);
  EXPECT_GT(percent, 10.0);

  ASSERT_TRUE(runtime_->Stop("usage", std::chrono::seconds(0)).ok());
  ASSERT_EQ(runtime_->Wait("usage", std::chrono::seconds(10))->state, InstanceState::kExited);
  EXPECT_EQ(runtime_->Usage("usage").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Usage("nope").status().code(), StatusCode::kNotFound);
}

// Access: the program's host pid (PID 1 of the sandbox: its pid namespace differs from ours, and
// it sees itself as pid 1) and the spec's hostname; FailedPrecondition once it ended, NotFound for
// no instance.
TEST_F(ProcessRuntimeTest, AccessGivesTheProgramsHostPidAndHostname) {
  ASSERT_TRUE(runtime_->Launch(Spec("access", "echo ready; exec sleep 60")).ok());
  Result<AccessPoint> point = runtime_->Access("access");
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->hostname, "algo-1");
  ASSERT_GT(point->host_pid, 0);
  std::string pid_dir = "/proc/" + std::to_string(point->host_pid);
  ASSERT_TRUE(WaitForOutput("access", "ready"));
  // "ready" is printed before the shell execs sleep; while the kernel builds the new image its
  // cmdline reads empty (CI saw it), so wait for the exec to finish.
  std::string cmdline;
  for (int i = 0; i < 500 && cmdline.find("sleep") == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    cmdline = ReadFile(pid_dir + "/cmdline").value_or("");
  }
  EXPECT_THAT(cmdline, HasSubstr("sleep"));
  char ours[64] = {}, theirs[64] = {};
  ASSERT_GT(readlink("/proc/self/ns/pid", ours, sizeof(ours) - 1), 0);
  ASSERT_GT(readlink((pid_dir + "/ns/pid").c_str(), theirs, sizeof(theirs) - 1), 0);
  EXPECT_STRNE(ours, theirs);
  // NSpid: the host's pid, then the sandbox's (1).
  std::string status = ReadFile(pid_dir + "/status").value_or("");
  EXPECT_THAT(status, HasSubstr("NSpid:\t" + std::to_string(point->host_pid) + "\t1\n"));

  ASSERT_TRUE(runtime_->Stop("access", std::chrono::seconds(0)).ok());
  ASSERT_EQ(runtime_->Wait("access", std::chrono::seconds(10))->state, InstanceState::kExited);
  EXPECT_EQ(runtime_->Access("access").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Access("nope").status().code(), StatusCode::kNotFound);
}

// /dev/nvidia<N> of GPUs not assigned are /dev/null inside (needs a host with NVIDIA devices).
TEST_F(ProcessRuntimeTest, HidesUnassignedGpus) {
  struct stat st;
  if (stat("/dev/nvidia0", &st) != 0) GTEST_SKIP() << "no /dev/nvidia0 on this host";
  InstanceSpec spec = Spec("gpu-none", "stat -c %t,%T /dev/nvidia0; ls /dev/nvidiactl");
  RunToEnd(spec);
  EXPECT_THAT(Lines(ReadRecords(runtime_->OutputPath("gpu-none")), 'o'),
              ::testing::ElementsAre("1,3", "/dev/nvidiactl"));  // /dev/null's numbers
  spec.instance_id = "gpu-0";
  spec.gpus = {0};
  RunToEnd(spec);
  std::vector<std::string> lines = Lines(ReadRecords(runtime_->OutputPath("gpu-0")), 'o');
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "c3,0");  // NVIDIA's major 195
}

// Unprivileged: the shim enters a user namespace in which the caller is root. The mount point of
// the extra mount cannot be created in the host's /opt by nobody, which exercises the fallback that
// rebuilds /opt on a tmpfs inside the sandbox.
TEST_F(ProcessRuntimeTest, RunsUnprivilegedInAUserNamespace) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to nobody";
  std::string data = root_ + "/userns-data";
  ASSERT_TRUE(MakeDirs(data).ok());
  ASSERT_TRUE(WriteFileAtomic(data + "/f", "visible\n").ok());
  std::string state = root_ + "/userns-state";
  ASSERT_TRUE(MakeDirs(state).ok());
  for (const std::string& p : {root_, state, opt_ml_, data}) chmod(p.c_str(), 0777);
  chmod((data + "/f").c_str(), 0644);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
      _exit(10);
    if (access(ShimPath(), X_OK) != 0) _exit(77);
    pid_t probe = fork();  // can nobody create a user namespace here?
    if (probe == 0) _exit(unshare(CLONE_NEWUSER) == 0 ? 0 : 1);
    int probe_status;
    if (waitpid(probe, &probe_status, 0) != probe || !WIFEXITED(probe_status) || WEXITSTATUS(probe_status) != 0)
      _exit(78);
    Result<std::unique_ptr<Runtime>> rt = OpenProcessRuntime({state, {ShimPath()}});
    if (!rt.ok()) _exit(11);
    InstanceSpec spec = Spec("userns", "id -u; hostname; echo pid=$$; cat /opt/kiln-userns-test/data/f; ls -d /opt/ml");
    spec.extra_mounts = {{data, "/opt/kiln-userns-test/data", true}};
    Status s = (*rt)->Launch(spec);
    if (!s.ok()) {
      std::fprintf(stderr, "launch: %s\n", s.ToString().c_str());
      _exit(12);
    }
    Result<InstanceStatus> st = (*rt)->Wait("userns", std::chrono::seconds(10));
    _exit(st.ok() && st->state == InstanceState::kExited && st->exit_code == 0 ? 0 : 13);
  }
  int wstatus;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) == 77) GTEST_SKIP() << ShimPath() << " is not executable by nobody";
  if (WEXITSTATUS(wstatus) == 78) GTEST_SKIP() << "this host does not allow unprivileged user namespaces";
  std::string output = ReadFile(state + "/userns/output").value_or("");
  std::string shim_log = ReadFile(state + "/userns/shim.log").value_or("");
  ASSERT_EQ(WEXITSTATUS(wstatus), 0) << output << shim_log;
  EXPECT_THAT(Lines(ReadRecords(state + "/userns/output"), 'o'),
              ::testing::ElementsAre("0", "algo-1", "pid=1", "visible", "/opt/ml"));
  EXPECT_FALSE(PathExists("/opt/kiln-userns-test"));  // only inside the sandbox
}

// The spec file carries the network attachment; spec files written before it existed still decode.
TEST(ProcessStateTest, SpecJsonCarriesTheNetworkAndOldSpecsDecode) {
  InstanceSpec spec;
  spec.instance_id = "algo-1";
  spec.opt_ml_dir = "/x";
  spec.argv = {"true"};
  NetworkAttachment net;
  net.network = "training-job";
  net.bridge = "kb-12";
  net.host_veth = "kv12-2";
  net.address = "10.213.12.2";
  net.prefix_length = 23;
  net.gateway = "10.213.12.1";
  net.isolated = true;
  net.interface_name = "ens5";
  net.loopback_forwards = {8080, 9000};
  spec.network = net;
  Result<InstanceSpec> back = process_state::DecodeSpec(process_state::EncodeSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->network.has_value());
  EXPECT_EQ(back->network->network, "training-job");
  EXPECT_EQ(back->network->bridge, "kb-12");
  EXPECT_EQ(back->network->host_veth, "kv12-2");
  EXPECT_EQ(back->network->address, "10.213.12.2");
  EXPECT_EQ(back->network->prefix_length, 23);
  EXPECT_EQ(back->network->gateway, "10.213.12.1");
  EXPECT_TRUE(back->network->isolated);
  EXPECT_EQ(back->network->interface_name, "ens5");
  EXPECT_EQ(back->network->loopback_forwards, (std::vector<int>{8080, 9000}));

  spec.network.reset();
  std::string plain = process_state::EncodeSpec(spec);
  EXPECT_EQ(plain.find("\"network\":{"), std::string::npos);
  back = process_state::DecodeSpec(plain);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->network.has_value());
  EXPECT_EQ(back->network_namespace, "");
  spec.network_namespace = "/proc/42/ns/net";
  back = process_state::DecodeSpec(process_state::EncodeSpec(spec));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->network_namespace, "/proc/42/ns/net");
  // As written by a Kiln before per-instance networks.
  back = process_state::DecodeSpec(
      R"({"instance_id":"a","opt_ml_dir":"/x","extra_mounts":[],"hostname":"algo-1","hosts_file_lines":[],)"
      R"("argv":["true"],"env":{},"working_dir":"","cpus":[],"memory_limit_bytes":0,"gpus":[]})");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->network.has_value());
  // A torn attachment is a bad spec, not "no network".
  back = process_state::DecodeSpec(
      R"({"instance_id":"a","opt_ml_dir":"/x","extra_mounts":[],"hostname":"algo-1","hosts_file_lines":[],)"
      R"("argv":["true"],"env":{},"working_dir":"","cpus":[],"memory_limit_bytes":0,"gpus":[],)"
      R"("network":{"bridge":"kb-1"}})");
  EXPECT_EQ(back.status().code(), StatusCode::kDataLoss);
}

// Instances with a network namespace of their own, on a bridge this fixture creates (a name and a
// subnet no other test or server uses) and deletes in TearDown, also when a test fails. ctest runs
// the tests of this fixture in parallel processes: each test has its own bridge, veth names and
// subnet (10.247.<n>.0/24, n from the test's name).
class NamespacedNetworkTest : public ProcessRuntimeTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "namespaced networks need root";
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const int n = 10 + static_cast<int>(std::hash<std::string>{}(test) % 200);
    bridge_ = "kh2br" + std::to_string(n);
    veth_prefix_ = "kh2v" + std::to_string(n) + "-";
    net_ = "10.247." + std::to_string(n) + ".";
    ProcessRuntimeTest::SetUp();
    CleanLinks();
    Status s = netlink::CreateBridge(bridge_, net_ + "1", 24, "kiln runtime_process_test");
    ASSERT_TRUE(s.ok()) << s.ToString();
    bridge_created_ = true;
  }
  void TearDown() override {
    if (geteuid() != 0) return;
    ProcessRuntimeTest::TearDown();
    if (bridge_created_) CleanLinks();
  }
  void CleanLinks() {
    for (const std::string& veth : netlink::ListLinks(veth_prefix_).value_or({})) netlink::DeleteLink(veth).ok();
    netlink::DeleteLink(bridge_).ok();
  }
  // The attachment of host .<octet> of the test's subnet.
  NetworkAttachment Attachment(int octet, bool isolated = false, std::vector<int> forwards = {}) {
    NetworkAttachment a;
    a.network = "test-net";
    a.bridge = bridge_;
    a.host_veth = veth_prefix_ + std::to_string(octet);
    a.address = net_ + std::to_string(octet);
    a.prefix_length = 24;
    a.gateway = net_ + "1";
    a.isolated = isolated;
    a.loopback_forwards = std::move(forwards);
    return a;
  }
  InstanceSpec NetSpec(const std::string& id, const std::string& hostname, const NetworkAttachment& net,
                       const std::string& script) {
    InstanceSpec spec = Spec(id, script);
    spec.hostname = hostname;
    spec.hosts_file_lines = {"127.0.0.1 localhost", net_ + "2 algo-1", net_ + "3 algo-2"};
    spec.env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin";
    spec.network = net;
    return spec;
  }
  std::vector<std::string> Veths() { return netlink::ListLinks(veth_prefix_).value_or({"<ListLinks failed>"}); }
  std::string Diagnostics(const std::string& id) {
    return "output:\n" + ReadFile(runtime_->OutputPath(id)).value_or("") + "shim.log:\n" +
           ReadFile(state_dir_ + "/" + id + "/shim.log").value_or("");
  }

  bool bridge_created_ = false;
  std::string bridge_, veth_prefix_;
  std::string net_;  // "10.247.<n>."
};

// Two instances on one bridge: each sees lo and eth0 with its own address, its hostname and a
// default route via the bridge; one reaches the other's TCP server by name (/etc/hosts). When an
// instance ends, its host veth is gone by the time its exit is visible.
TEST_F(NamespacedNetworkTest, InstancesHaveEth0AndReachEachOtherOverTheBridge) {
  InstanceSpec server = NetSpec("srv", "algo-1", Attachment(2), "");
  server.argv = {"/usr/bin/python3", "-c",
                 "import socket\n"
                 "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 "s.bind(('" +
                     net_ +
                     "2', 7000)); s.listen(4); print('listening', flush=True)\n"
                     "c, peer = s.accept(); line = c.makefile().readline().strip()\n"
                     "c.sendall(('hello %s from %s, peer %s\\n' % (line, socket.gethostname(), peer[0])).encode())\n"
                     "c.close()\n"};
  Status s = runtime_->Launch(server);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(WaitForOutput("srv", "listening")) << Diagnostics("srv");
  EXPECT_THAT(Veths(), ::testing::ElementsAre(veth_prefix_ + "2"));

  InstanceSpec client = NetSpec("cli", "algo-2", Attachment(3),
                                "hostname; ip -o link | wc -l; ip -4 -br addr show dev eth0 | awk '{print $3}'; "
                                "echo $(ip route show default); exec /usr/bin/python3 -c \"$CLIENT\"");
  client.env["CLIENT"] =
      "import socket\n"
      "c = socket.create_connection(('algo-1', 7000), timeout=5); c.sendall(b'algo-2\\n')\n"
      "print(c.makefile().readline().strip())\n";
  InstanceStatus st = RunToEnd(client);
  EXPECT_EQ(st.exit_code, 0) << Diagnostics("cli");
  EXPECT_THAT(Lines(ReadRecords(runtime_->OutputPath("cli")), 'o'),
              ::testing::ElementsAre("algo-2", "2", net_ + "3/24", "default via " + net_ + "1 dev eth0",
                                     "hello algo-2 from algo-1, peer " + net_ + "3"))
      << Diagnostics("cli");
  EXPECT_THAT(ReadFile(state_dir_ + "/cli/shim.log").value_or(""),
              HasSubstr("network test-net: eth0 " + net_ + "3/24"));

  Result<InstanceStatus> done = runtime_->Wait("srv", std::chrono::seconds(5));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 0) << Diagnostics("srv");
  EXPECT_THAT(Veths(), ::testing::IsEmpty());
  EXPECT_FALSE(netlink::LinkAlias(veth_prefix_ + "2").ok());
}

// The loopback forward: 127.0.0.1:<port> inside the namespace reaches the node's 127.0.0.1:<port>
// (where Kiln's endpoint listens), both directions, half-close included, several connections.
TEST_F(NamespacedNetworkTest, LoopbackForwardReachesTheNodesLoopback) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  // Answers each connection once the client's EOF came through: the relay must propagate it.
  std::thread node_server([listener] {
    for (int i = 0; i < 3; ++i) {
      int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      timeval tv{10, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      size_t total = 0;
      char buf[65536];
      ssize_t n;
      while ((n = recv(c, buf, sizeof(buf), 0)) > 0) total += static_cast<size_t>(n);
      std::string reply = "node got " + std::to_string(total) + (n == 0 ? " then EOF\n" : " then an error\n");
      send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      close(c);
    }
  });
  InstanceSpec spec = NetSpec("fwd", "algo-1", Attachment(2, false, {port}), "");
  spec.argv = {"/usr/bin/python3", "-c",
               "import socket, sys\n"
               "port = int(sys.argv[1])\n"
               "for size in (5, 3000000, 0):\n"
               "    c = socket.create_connection(('127.0.0.1', port), timeout=10)\n"
               "    c.sendall(b'x' * size); c.shutdown(socket.SHUT_WR)\n"
               "    print(c.makefile().read().strip(), flush=True)\n",
               std::to_string(port)};
  InstanceStatus st = RunToEnd(spec);
  shutdown(listener, SHUT_RDWR);
  node_server.join();
  close(listener);
  EXPECT_EQ(st.exit_code, 0) << Diagnostics("fwd");
  EXPECT_THAT(Lines(ReadRecords(runtime_->OutputPath("fwd")), 'o'),
              ::testing::ElementsAre("node got 5 then EOF", "node got 3000000 then EOF", "node got 0 then EOF"))
      << Diagnostics("fwd");
  EXPECT_THAT(Veths(), ::testing::IsEmpty());
}

// EnableNetworkIsolation: no default route, so anything off the subnet is unreachable; no forwards.
TEST_F(NamespacedNetworkTest, IsolatedInstanceHasNoDefaultRoute) {
  InstanceSpec spec = NetSpec("iso", "algo-1", Attachment(4, /*isolated=*/true), "");
  spec.argv = {"/bin/sh", "-c",
               "ip route show default | wc -l; ip -4 route | awk '{print $1}'; "
               "exec /usr/bin/python3 -c \"$PROBE\""};
  spec.env["PROBE"] =
      "import errno, socket\n"
      "try:\n"
      "    socket.create_connection(('10.246.8.9', 80), timeout=5); print('connected')\n"
      "except OSError as e:\n"
      "    print(errno.errorcode.get(e.errno, e))\n";
  InstanceStatus st = RunToEnd(spec);
  EXPECT_EQ(st.exit_code, 0) << Diagnostics("iso");
  EXPECT_THAT(Lines(ReadRecords(runtime_->OutputPath("iso")), 'o'),
              ::testing::ElementsAre("0", net_ + "0/24", "ENETUNREACH"))
      << Diagnostics("iso");
  EXPECT_THAT(Veths(), ::testing::IsEmpty());
}

// Stop of a namespaced instance: the relay's listener and the veth go with it.
TEST_F(NamespacedNetworkTest, StoppedInstanceLeavesNoVeth) {
  InstanceSpec spec = NetSpec("stopped", "algo-1", Attachment(5, false, {1}), "echo ready; sleep 600");
  ASSERT_TRUE(runtime_->Launch(spec).ok());
  ASSERT_TRUE(WaitForOutput("stopped", "ready"));
  EXPECT_THAT(Veths(), ::testing::ElementsAre(veth_prefix_ + "5"));
  ASSERT_TRUE(runtime_->Stop("stopped", std::chrono::seconds(0)).ok());
  Result<InstanceStatus> st = runtime_->Wait("stopped", std::chrono::seconds(5));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_THAT(Veths(), ::testing::IsEmpty());
}

// A bridge that does not exist: Launch fails naming it, the program never runs, and nothing is
// left (no veth, no process, no state directory). The same after the veth exists: a loopback
// forward that cannot listen (the port twice) kills the waiting child and deletes the veth.
TEST_F(NamespacedNetworkTest, NetworkFailuresFailLaunchAndLeaveNothing) {
  InstanceSpec spec = NetSpec("nobridge", "algo-1", Attachment(6), "touch /opt/ml/ran; sleep 600");
  spec.network->bridge = "kh2nobridge";
  Status s = runtime_->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("bridge kh2nobridge"));
  EXPECT_FALSE(PathExists(opt_ml_ + "/ran"));
  EXPECT_FALSE(PathExists(state_dir_ + "/nobridge"));
  EXPECT_FALSE(ProcessWithCmdline(state_dir_ + "/nobridge"));
  EXPECT_THAT(Veths(), ::testing::IsEmpty());

  spec = NetSpec("badforward", "algo-1", Attachment(7, false, {4567, 4567}), "touch /opt/ml/ran; sleep 600");
  s = runtime_->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("cannot listen on 127.0.0.1:4567 inside the instance's network namespace"));
  EXPECT_FALSE(PathExists(opt_ml_ + "/ran"));
  EXPECT_FALSE(PathExists(state_dir_ + "/badforward"));
  EXPECT_FALSE(ProcessWithCmdline(state_dir_ + "/badforward"));
  EXPECT_THAT(Veths(), ::testing::IsEmpty());
  EXPECT_THAT(runtime_->List().value(), ::testing::IsEmpty());
}

// A network namespace joined to a bridge needs CAP_NET_ADMIN in the node's namespace: a shim that
// is not root says so instead of trying inside a user namespace.
TEST_F(ProcessRuntimeTest, NetworkNeedsARootShim) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to nobody";
  std::string state = root_ + "/nonroot-state";
  ASSERT_TRUE(MakeDirs(state).ok());
  for (const std::string& p : {root_, state, opt_ml_}) chmod(p.c_str(), 0777);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
      _exit(10);
    if (access(ShimPath(), X_OK) != 0) _exit(77);
    Result<std::unique_ptr<Runtime>> rt = OpenProcessRuntime({state, {ShimPath()}});
    if (!rt.ok()) _exit(11);
    InstanceSpec spec = Spec("nonroot", "touch /opt/ml/ran-nonroot");
    NetworkAttachment net;
    net.network = "training-x";
    net.bridge = "kh2nope";
    net.host_veth = "kh2nope-2";
    net.address = "10.247.9.2";
    net.gateway = "10.247.9.1";
    spec.network = net;
    Status s = (*rt)->Launch(spec);
    std::fprintf(stderr, "launch: %s\n", s.ToString().c_str());
    bool ok = s.code() == StatusCode::kFailedPrecondition &&
              s.message().find("needs the shim to run as root") != std::string::npos &&
              s.message().find("training-x") != std::string::npos && (*rt)->List().value_or({"?"}).empty();
    _exit(ok ? 0 : 12);
  }
  int wstatus;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) == 77) GTEST_SKIP() << ShimPath() << " is not executable by nobody";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  EXPECT_FALSE(PathExists(opt_ml_ + "/ran-nonroot"));
}

TEST_F(ProcessRuntimeTest, RejectsBadNetworkAttachments) {
  InstanceSpec spec = Spec("badnet", "true");
  NetworkAttachment net;
  net.network = "n";
  net.bridge = "kb-1";
  net.host_veth = "kv1-2";
  net.address = "10.213.1.2";
  net.gateway = "10.213.1.1";
  net.loopback_forwards = {0};
  spec.network = net;
  EXPECT_EQ(runtime_->Launch(spec).code(), StatusCode::kInvalidArgument);
  spec.network->loopback_forwards = {};
  spec.network->host_veth = "a-veth-name-too-long";
  EXPECT_EQ(runtime_->Launch(spec).code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(runtime_->List().value(), ::testing::IsEmpty());
}

// network_namespace (runtime.h): the program runs in the namespace given (here one a forked child
// of the test holds), not the node's; a namespace that is gone is refused before anything starts.
TEST_F(ProcessRuntimeTest, JoinsAnExistingNetworkNamespace) {
  if (geteuid() != 0) GTEST_SKIP() << "joining a network namespace needs root";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    char byte = unshare(CLONE_NEWNET) == 0 ? 'y' : 'n';
    [[maybe_unused]] ssize_t n = write(ready[1], &byte, 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  const std::string path = "/proc/" + std::to_string(holder) + "/ns/net";
  char target[128] = {0};
  ssize_t len = readlink(path.c_str(), target, sizeof(target) - 1);
  char own[128] = {0};
  ssize_t own_len = readlink("/proc/self/ns/net", own, sizeof(own) - 1);
  if (byte != 'y' || len <= 0 || own_len <= 0) {
    kill(holder, SIGKILL);
    waitpid(holder, nullptr, 0);
    GTEST_SKIP() << "cannot create a network namespace here";
  }
  InstanceSpec spec = Spec("joined", "readlink /proc/self/ns/net");
  spec.network_namespace = path;
  InstanceStatus st = RunToEnd(spec);
  EXPECT_EQ(st.exit_code, 0);
  std::vector<std::string> lines = Lines(ReadRecords(runtime_->OutputPath("joined")), 'o');
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], std::string(target, static_cast<size_t>(len)));
  EXPECT_NE(lines[0], std::string(own, static_cast<size_t>(own_len)));
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  InstanceSpec gone = Spec("gone", "true");
  gone.network_namespace = path;
  Status refused = runtime_->Launch(gone);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("does not exist"));
}

}  // namespace
}  // namespace kiln::runtime
