#include "runtime/slurm/slurm_client.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

#include "base/fs.h"

namespace kiln::runtime::slurm {
namespace {

TEST(SlurmClientParse, Squeue) {
  auto jobs = ParseSqueue(
      "812|PENDING|Resources|\n"
      "813|RUNNING|None|kn[1-2]\n"
      "814|COMPLETED|None|kn1\n"
      "garbage\n\n");
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs["812"].state, "PENDING");
  EXPECT_EQ(jobs["812"].reason, "Resources");
  EXPECT_EQ(jobs["812"].node_list, "");
  EXPECT_EQ(jobs["813"].node_list, "kn[1-2]");
  EXPECT_EQ(jobs["814"].exit_code, -1);
}

TEST(SlurmClientParse, ScontrolShowJob) {
  Result<JobInfo> info = ParseScontrolJob(
      "JobId=815 JobName=kiln-train UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 Account=(null) "
      "QOS=normal JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
      "Reboot=0 ExitCode=3:0 RunTime=00:00:01 NodeList=kn2 Comment=a comment with spaces BatchHost=kn2\n");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->job_id, "815");
  EXPECT_EQ(info->state, "FAILED");
  EXPECT_EQ(info->reason, "NonZeroExitCode");
  EXPECT_EQ(info->exit_code, 3);
  EXPECT_EQ(info->term_signal, 0);
  EXPECT_EQ(info->node_list, "kn2");
  EXPECT_TRUE(ParseScontrolJob("slurm_load_jobs error: Invalid job id specified\n").status().IsNotFound());
  EXPECT_TRUE(ParseScontrolJob("").status().IsNotFound());
  Result<JobInfo> killed = ParseScontrolJob("JobId=9 JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=(null)");
  ASSERT_TRUE(killed.ok());
  EXPECT_EQ(killed->term_signal, 15);
  EXPECT_EQ(killed->node_list, "");
}

TEST(SlurmClientParse, SbatchParsable) {
  EXPECT_EQ(*ParseSbatchParsable("812\n"), "812");
  EXPECT_EQ(*ParseSbatchParsable("812;cluster1\n"), "812");
  EXPECT_FALSE(ParseSbatchParsable("").ok());
  EXPECT_FALSE(ParseSbatchParsable("sbatch: error\n").ok());
}

TEST(SlurmClientParse, TerminalStates) {
  EXPECT_TRUE(IsTerminalState("COMPLETED"));
  EXPECT_TRUE(IsTerminalState("NODE_FAIL"));
  EXPECT_TRUE(IsTerminalState("PREEMPTED"));
  EXPECT_FALSE(IsTerminalState("PENDING"));
  EXPECT_FALSE(IsTerminalState("COMPLETING"));
  EXPECT_FALSE(IsTerminalState("RUNNING"));
}

TEST(SlurmClientParse, SbatchArguments) {
  SubmitRequest r;
  r.job_name = "kiln-job";
  r.script_path = "/state/x/batch.sh";
  r.nodes = 2;
  r.cpus_per_task = 4;
  r.memory_bytes = (16ull << 30) + 1;
  r.gpus_per_node = 1;
  r.time_limit_seconds = 3601;
  r.partition = "gpu";
  r.qos = "high";
  r.output_path = "/tmp/kiln-%j.log";
  r.env = {{"KILN_NODE_TOKEN", "secret"}};
  r.extra_args = {"--constraint=a100"};
  std::vector<std::string> a = SbatchArguments(r);
  std::vector<std::string> expected = {"--parsable",
                                       "--job-name=kiln-job",
                                       "--nodes=2",
                                       "--ntasks-per-node=1",
                                       "--cpus-per-task=4",
                                       "--mem=16385M",
                                       "--gpus-per-node=1",
                                       "--time=61",
                                       "--partition=gpu",
                                       "--qos=high",
                                       "--output=/tmp/kiln-%j.log",
                                       "--export=ALL",
                                       "--constraint=a100",
                                       "/state/x/batch.sh"};
  EXPECT_EQ(a, expected);
  for (const std::string& arg : a) EXPECT_EQ(arg.find("secret"), std::string::npos) << "token on the command line";
}

// The CLI client against stand-in scripts that record their arguments and print what Slurm would.
class CliSlurmClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kiln-slurm-cli-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Tool(const std::string& name, const std::string& body) {
    const std::string path = (dir_ / name).string();
    ASSERT_TRUE(WriteFileAtomic(path, "#!/bin/sh\n" + body, 0755).ok());
  }
  std::unique_ptr<SlurmClient> Client() { return NewCliSlurmClient({.bin_dir = dir_.string()}); }
  std::string Read(const std::string& name) { return ReadFile((dir_ / name).string()).value_or(""); }
  std::filesystem::path dir_;
};

TEST_F(CliSlurmClientTest, SubmitPassesTheTokenInTheEnvironment) {
  Tool("sbatch", "echo \"$@\" > " + (dir_ / "args").string() + "\necho \"$KILN_NODE_TOKEN\" > " +
                     (dir_ / "env").string() + "\necho \"[$KILN_SECRET_FOR_TEST]\" > " + (dir_ / "leak").string() +
                     "\necho '812;c1'\n");
  setenv("KILN_SECRET_FOR_TEST", "server-only", 1);
  SubmitRequest r;
  r.job_name = "kiln-x";
  r.script_path = "/x.sh";
  r.env = {{"KILN_NODE_TOKEN", "tok"}};
  Result<std::string> id = Client()->Submit(r);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "812");
  EXPECT_EQ(Read("env"), "tok\n");
  EXPECT_NE(Read("args").find("--export=ALL"), std::string::npos);
  // The server's own environment stays here: only the tools' variables and the request's go.
  EXPECT_EQ(Read("leak"), "[]\n");
}

TEST_F(CliSlurmClientTest, SubmitRefusalCarriesSlurmsWords) {
  Tool("sbatch",
       "echo 'sbatch: error: invalid partition specified: gpu' >&2\n"
       "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n");
  Result<std::string> id = Client()->Submit(SubmitRequest{});
  ASSERT_FALSE(id.ok());
  EXPECT_TRUE(id.status().IsInvalidArgument());
  EXPECT_NE(id.status().message().find("invalid partition specified: gpu"), std::string::npos);
}

TEST_F(CliSlurmClientTest, ControllerDownIsUnavailable) {
  Tool("sbatch",
       "echo 'sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect "
       "failure)' >&2\nexit 1\n");
  Result<std::string> id = Client()->Submit(SubmitRequest{});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnavailable);
}

TEST_F(CliSlurmClientTest, QueryOneSqueueThenScontrolForEndedJobs) {
  Tool("squeue", "echo squeue >> " + (dir_ / "calls").string() +
                     "\necho '7|PENDING|Resources|'\necho '8|FAILED|NonZeroExitCode|kn1'\necho '9|RUNNING|None|kn2'\n");
  Tool("scontrol", "echo \"scontrol $4\" >> " + (dir_ / "calls").string() +
                       "\necho 'JobId=8 JobState=FAILED Reason=NonZeroExitCode ExitCode=2:0 NodeList=kn1'\n");
  Result<std::map<std::string, JobInfo>> jobs = Client()->Query({"7", "8", "10"});
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  EXPECT_EQ(jobs->size(), 2u);  // 9 is not asked for, 10 is unknown
  EXPECT_EQ(jobs->at("7").reason, "Resources");
  EXPECT_EQ(jobs->at("8").exit_code, 2);
  EXPECT_EQ(Read("calls"), "squeue\nscontrol 8\n");
}

TEST_F(CliSlurmClientTest, CancelOfAnEndedJobIsOk) {
  Tool("scancel", "echo \"$@\" > " + (dir_ / "args").string() +
                      "\necho 'scancel: error: Kill job error on job id 5: Invalid job id specified' >&2\nexit 1\n");
  EXPECT_TRUE(Client()->Cancel("5", 15).ok());
  EXPECT_EQ(Read("args"), "--full --signal=15 5\n");
}

TEST_F(CliSlurmClientTest, MissingToolIsUnavailable) {
  Result<std::map<std::string, JobInfo>> jobs = Client()->Query({"1"});
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kiln::runtime::slurm
