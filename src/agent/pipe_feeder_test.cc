#include "agent/pipe_feeder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "agent/test_util/agent_fixture.h"
#include "aws/test_util/gzip_for_test.h"
#include "base/mutex.h"
#include "base/strings.h"

namespace kiln::agent {
namespace {

using nlohmann::json;
using testing::AgentTest;

std::string Gzip(const std::string& text) { return aws::testing::GzipForTest(text); }

// Opens `path` for reading once it exists (blocking until the feeder opens its end) and reads
// `limit` bytes or to EOF. Returns the bytes; closes the FIFO.
std::string ReadFifo(const std::string& path, size_t limit = SIZE_MAX) {
  int fd = -1;
  for (int i = 0; i < 1000 && fd < 0; ++i) {
    fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (fd < 0) return "<no fifo " + path + ">";
  std::string out;
  char buf[8192];
  while (out.size() < limit) {
    ssize_t n = read(fd, buf, std::min(sizeof(buf), limit - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

json PipeRequest(const json& channel_extra = json::object(), const std::string& distribution = "FullyReplicated") {
  json ch = {{"ChannelName", "train"},
             {"DataSource",
              {{"S3DataSource",
                {{"S3DataType", "S3Prefix"}, {"S3Uri", "s3://bkt/p/"}, {"S3DataDistributionType", distribution}}}}}};
  for (auto it = channel_extra.begin(); it != channel_extra.end(); ++it) ch[it.key()] = it.value();
  return json{{"AlgorithmSpecification", {{"TrainingInputMode", "Pipe"}}}, {"InputDataConfig", json::array({ch})}};
}

class PipeFeederTest : public AgentTest {
 protected:
  std::unique_ptr<PipeFeeder> Make(const json& request, int index = 0, int count = 1, bool resume = false) {
    PipeFeeder::Options o;
    o.resume = resume;
    o.poll_interval = std::chrono::milliseconds(5);
    o.buffer_size = 4096;
    o.on_error = [this](const std::string& channel, const Status& s) {
      MutexLock lock(mu_);
      errors_.push_back(channel + ": " + s.message());
    };
    return std::make_unique<PipeFeeder>(*store_, request, index, count, opt_ml(), o);
  }
  std::string opt_ml() const { return work() + "/h"; }
  std::string Fifo(int epoch) const { return opt_ml() + "/input/data/train_" + std::to_string(epoch); }
  std::vector<std::string> errors() {
    MutexLock lock(mu_);
    return errors_;
  }
  Mutex mu_;
  std::vector<std::string> errors_ GUARDED_BY(mu_);
};

TEST_F(PipeFeederTest, TwoEpochsGetTheConcatenationInKeyOrder) {
  Put("p/b", "second-");
  Put("p/a", "first-");
  Put("p/c", std::string(300000, 'c'));  // larger than a pipe buffer
  Put("p/dir/", "");                     // folder marker
  auto feeder = Make(PipeRequest());
  ASSERT_TRUE(feeder->Start().ok());
  struct stat st;
  ASSERT_EQ(stat(Fifo(0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  std::string expected = "first-second-" + std::string(300000, 'c');
  EXPECT_EQ(ReadFifo(Fifo(0)), expected);
  EXPECT_EQ(ReadFifo(Fifo(1)), expected);
  EXPECT_FALSE(PathExists(Fifo(0)));  // finished epochs are removed
  feeder->Stop();
  EXPECT_TRUE(errors().empty());
}

TEST_F(PipeFeederTest, EarlyReaderCloseThenNextEpochIsComplete) {
  std::string big(1 << 20, 'x');
  big[0] = 'A';
  Put("p/big", big);
  auto feeder = Make(PipeRequest());
  ASSERT_TRUE(feeder->Start().ok());
  EXPECT_EQ(ReadFifo(Fifo(0), 10), big.substr(0, 10));  // close after 10 bytes: the feeder gets EPIPE
  EXPECT_EQ(ReadFifo(Fifo(1)), big);
  EXPECT_EQ(ReadFifo(Fifo(2), 1), "A");
  EXPECT_EQ(ReadFifo(Fifo(3)), big);
  feeder->Stop();
  EXPECT_TRUE(errors().empty());
}

// A restarted server adopts the job: the new feeder continues from the recorded progress.
TEST_F(PipeFeederTest, ResumesAnEpochNobodyHadOpenedYet) {
  Put("p/a", "abc");
  auto old_feeder = Make(PipeRequest());
  ASSERT_TRUE(old_feeder->Start().ok());
  EXPECT_EQ(ReadFifo(Fifo(0)), "abc");
  // Epoch 1 exists and its feeder waits for a reader when the old server goes away.
  for (int i = 0; i < 1000 && !PathExists(Fifo(1)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  old_feeder->Stop();
  ASSERT_TRUE(PathExists(Fifo(1)));
  auto feeder = Make(PipeRequest(), 0, 1, /*resume=*/true);
  ASSERT_TRUE(feeder->Start().ok());
  EXPECT_FALSE(PathExists(Fifo(0)));  // not fed again from the start
  EXPECT_EQ(ReadFifo(Fifo(1)), "abc");
  EXPECT_EQ(ReadFifo(Fifo(2)), "abc");
  feeder->Stop();
}

TEST_F(PipeFeederTest, ResumeAfterAnEpochWasCutShortGoesOnWithTheNext) {
  Put("p/a", std::string(300000, 'a'));  // more than a pipe buffer: the old feeder is mid-epoch
  auto old_feeder = Make(PipeRequest());
  ASSERT_TRUE(old_feeder->Start().ok());
  int fd = -1;
  for (int i = 0; i < 1000 && fd < 0; ++i) fd = open(Fifo(0).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[1024];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  old_feeder->Stop();  // the old server dies while the reader has epoch 0 open
  std::string rest;
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) rest.append(buf, static_cast<size_t>(n));
  EXPECT_LT(rest.size() + 1024, 300000u);  // the reader saw EOF early
  auto feeder = Make(PipeRequest(), 0, 1, /*resume=*/true);
  ASSERT_TRUE(feeder->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(PathExists(Fifo(1)));  // not while the reader still has epoch 0 open
  close(fd);
  EXPECT_EQ(ReadFifo(Fifo(1)), std::string(300000, 'a'));
  feeder->Stop();
}

TEST_F(PipeFeederTest, NextFifoAppearsOnlyAfterTheReaderCloses) {
  Put("p/a", "abc");
  auto feeder = Make(PipeRequest());
  ASSERT_TRUE(feeder->Start().ok());
  int fd = -1;
  for (int i = 0; i < 1000 && fd < 0; ++i) fd = open(Fifo(0).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[16];
  std::string got;
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(got, "abc");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // EOF seen but still open
  EXPECT_FALSE(PathExists(Fifo(1)));
  close(fd);
  EXPECT_EQ(ReadFifo(Fifo(1)), "abc");
  feeder->Stop();
}

TEST_F(PipeFeederTest, GzipObjectsAreDecompressed) {
  Put("p/1.gz", Gzip("hello "));
  Put("p/2.gz", Gzip("world") + Gzip("!"));  // concatenated members
  Put("p/3.gz", Gzip(std::string(200000, 'z')));
  auto feeder = Make(PipeRequest({{"CompressionType", "Gzip"}}));
  ASSERT_TRUE(feeder->Start().ok());
  std::string expected = "hello world!" + std::string(200000, 'z');
  EXPECT_EQ(ReadFifo(Fifo(0)), expected);
  EXPECT_EQ(ReadFifo(Fifo(1)), expected);
  feeder->Stop();
  EXPECT_TRUE(errors().empty());
}

TEST_F(PipeFeederTest, RecordIoBytesAreExact) {
  Put("p/a", "abc");
  Put("p/b", "defgh");
  Put("p/c", "wxyz");
  Put("p/d", "");
  auto feeder = Make(PipeRequest({{"RecordWrapperType", "RecordIO"}}));
  ASSERT_TRUE(feeder->Start().ok());
  std::string expected = std::string("\x0a\x23\xd7\xce\x03\x00\x00\x00", 8) + "abc" + std::string(1, '\0') +
                         std::string("\x0a\x23\xd7\xce\x05\x00\x00\x00", 8) + "defgh" + std::string(3, '\0') +
                         std::string("\x0a\x23\xd7\xce\x04\x00\x00\x00", 8) + "wxyz" +
                         std::string("\x0a\x23\xd7\xce\x00\x00\x00\x00", 8);
  EXPECT_EQ(ReadFifo(Fifo(0)), expected);
  feeder->Stop();
  EXPECT_EQ(RecordIoHeader(0x12345), std::string("\x0a\x23\xd7\xce\x45\x23\x01\x00", 8));
  EXPECT_EQ(RecordIoPadding(4), 0u);
  EXPECT_EQ(RecordIoPadding(5), 3u);
}

TEST_F(PipeFeederTest, RecordIoOfGzipWrapsTheDecompressedBytes) {
  Put("p/a.gz", Gzip("hello"));
  auto feeder = Make(PipeRequest({{"RecordWrapperType", "RecordIO"}, {"CompressionType", "Gzip"}}));
  ASSERT_TRUE(feeder->Start().ok());
  EXPECT_EQ(ReadFifo(Fifo(0)), std::string("\x0a\x23\xd7\xce\x05\x00\x00\x00", 8) + "hello" + std::string(3, '\0'));
  feeder->Stop();
}

TEST_F(PipeFeederTest, CorruptGzipIsReported) {
  Put("p/a.gz", "this is not gzip at all");
  auto feeder = Make(PipeRequest({{"CompressionType", "Gzip"}}));
  ASSERT_TRUE(feeder->Start().ok());
  ReadFifo(Fifo(0));
  for (int i = 0; i < 200 && errors().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  feeder->Stop();
  ASSERT_EQ(errors().size(), 1u);
  EXPECT_TRUE(StartsWith(errors()[0], "train: ClientError: ")) << errors()[0];
  EXPECT_NE(errors()[0].find("s3://bkt/p/a.gz"), std::string::npos) << errors()[0];
}

TEST_F(PipeFeederTest, ShardedAcrossThreeHosts) {
  for (int i = 0; i < 7; ++i) Put("p/k" + std::to_string(i), std::to_string(i));
  auto feeder = Make(PipeRequest(json::object(), "ShardedByS3Key"), 1, 3);
  ASSERT_TRUE(feeder->Start().ok());
  EXPECT_EQ(ReadFifo(Fifo(0)), "14");
  feeder->Stop();
}

TEST_F(PipeFeederTest, ShuffleIsDeterministicPerEpoch) {
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(std::string(1, static_cast<char>('a' + i)));
    Put("p/" + keys.back(), keys.back());
  }
  auto feeder = Make(PipeRequest({{"ShuffleConfig", {{"Seed", 42}}}}));
  ASSERT_TRUE(feeder->Start().ok());
  std::string e0 = ReadFifo(Fifo(0));
  std::string e1 = ReadFifo(Fifo(1));
  feeder->Stop();
  auto expect = [&](int epoch) {
    std::string s;
    for (size_t i : ShuffledOrder(10, 42, epoch)) s += keys[i];
    return s;
  };
  EXPECT_EQ(e0, expect(0));
  EXPECT_EQ(e1, expect(1));
  EXPECT_NE(e0, e1);
  std::string sorted0 = e0;
  std::sort(sorted0.begin(), sorted0.end());
  EXPECT_EQ(sorted0, "abcdefghij");
  EXPECT_EQ(ShuffledOrder(10, 42, 0), ShuffledOrder(10, 42, 0));
  EXPECT_NE(ShuffledOrder(10, 42, 0), ShuffledOrder(10, 43, 0));
}

TEST_F(PipeFeederTest, StopWithoutReaderIsPromptAndEmptySelectionFails) {
  Put("p/a", "abc");
  auto feeder = Make(PipeRequest());
  ASSERT_TRUE(feeder->Start().ok());
  auto t0 = std::chrono::steady_clock::now();
  feeder->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));

  json request = PipeRequest();
  request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = "s3://bkt/nothing/";
  auto empty = Make(request);
  Status s = empty->Start();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(StartsWith(s.message(), "ClientError: No S3 objects found under S3 URL")) << s.message();
}

TEST_F(PipeFeederTest, StopWhileReaderIsSlow) {
  Put("p/big", std::string(4 << 20, 'b'));
  auto feeder = Make(PipeRequest());
  ASSERT_TRUE(feeder->Start().ok());
  int fd = -1;
  for (int i = 0; i < 1000 && fd < 0; ++i) fd = open(Fifo(0).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[100];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  auto t0 = std::chrono::steady_clock::now();
  feeder->Stop();  // the feeder is blocked on a full pipe
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  close(fd);
}

}  // namespace
}  // namespace kiln::agent
