#include "objects/hash_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "base/encoding.h"
#include "base/hash.h"

namespace kiln::objects {
namespace {

// Pushes `data` through a pipeline in buffer-sized chunks, as FsObjectStore::Stage does, and
// returns the hex MD5 the pipeline's thread computed.
std::string PipelinedMd5(const std::string& data, size_t buffers, size_t buffer_size) {
  Digest md5(Digest::Algorithm::kMd5);
  HashPipeline pipeline(buffers, buffer_size, [&md5](std::string_view chunk) { md5.Update(chunk); });
  size_t offset = 0;
  while (offset < data.size()) {
    char* buffer = pipeline.NextBuffer();
    size_t n = std::min(buffer_size, data.size() - offset);
    std::memcpy(buffer, data.data() + offset, n);
    offset += n;
    pipeline.Submit(n, offset == data.size());
  }
  pipeline.Finish();
  return HexEncode(md5.Final());
}

std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  return data;
}

TEST(HashPipelineTest, SameDigestAsHashingInline) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{4097}, size_t{100000}, size_t{1 << 20}}) {
    std::string data = Pattern(size);
    std::string expected = HexEncode(Md5(data));
    EXPECT_EQ(PipelinedMd5(data, 2, 4096), expected) << size;
    EXPECT_EQ(PipelinedMd5(data, 4, 1000), expected) << size;
    EXPECT_EQ(PipelinedMd5(data, 3, 1 << 20), expected) << size;
  }
}

TEST(HashPipelineTest, OneChunkUploadIsHashedInlineWithoutAThread) {
  std::thread::id caller = std::this_thread::get_id();
  std::thread::id hashed_on;
  HashPipeline pipeline(4, 64, [&](std::string_view) { hashed_on = std::this_thread::get_id(); });
  char* buffer = pipeline.NextBuffer();
  std::memset(buffer, 'x', 10);
  pipeline.Submit(10, /*last=*/true);
  EXPECT_EQ(hashed_on, caller);  // already hashed when Submit returns
  pipeline.Finish();
}

TEST(HashPipelineTest, ChunksArriveInOrderAndTheRingBlocksWhenFull) {
  // The hash function is slow and records what it sees: the caller must wait for buffers (never
  // more than `buffers` outstanding) and every chunk must arrive once, in order.
  constexpr size_t kBuffers = 3;
  std::atomic<int> outstanding{0};
  std::atomic<int> max_outstanding{0};
  std::string seen;
  HashPipeline pipeline(kBuffers, 8, [&](std::string_view chunk) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    seen.append(chunk);
    --outstanding;
  });
  std::string expected;
  for (int i = 0; i < 40; ++i) {
    char* buffer = pipeline.NextBuffer();
    std::string text = std::to_string(i) + ",";
    std::memcpy(buffer, text.data(), text.size());
    expected += text;
    int now = ++outstanding;
    max_outstanding = std::max(max_outstanding.load(), now);
    pipeline.Submit(text.size(), i == 39);
  }
  pipeline.Finish();
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(outstanding.load(), 0);
  EXPECT_LE(max_outstanding.load(), static_cast<int>(kBuffers) + 1);
}

TEST(HashPipelineTest, DestroyingMidUploadAbandonsQueuedChunksAndJoins) {
  // The first chunk's hashing is held until well after the caller has queued three more and
  // dropped the pipeline (a failed upload returns without Finish()): the destructor must not hash
  // the queue out, only wait for the chunk in progress.
  std::atomic<bool> release{false};
  std::atomic<int> hashed{0};
  std::thread releaser;
  {
    HashPipeline pipeline(4, 16, [&](std::string_view) {
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++hashed;
    });
    for (int i = 0; i < 4; ++i) {
      std::memset(pipeline.NextBuffer(), 'a', 16);
      pipeline.Submit(16, /*last=*/false);
    }
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      release = true;
    });
  }
  releaser.join();
  EXPECT_LE(hashed.load(), 1);  // 0 when the thread had not taken the first chunk yet
}

}  // namespace
}  // namespace kiln::objects
