#include "agent/pipe_feeder.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <numeric>

#include "agent/errors.h"
#include "agent/training_layout.h"
#include "agent/transfer.h"
#include "base/fs.h"
#include "base/log.h"

namespace kiln::agent {

using nlohmann::json;

namespace {

constexpr uint32_t kRecordIoMagic = 0xced7230a;
constexpr uint64_t kMaxRecordLength = (1u << 29) - 1;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void PutLe32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Consumes a SIGPIPE pending on this thread (raised by a write to a FIFO without reader while
// SIGPIPE is blocked here), so it is never delivered later.
void DrainSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&set, nullptr, &zero) == SIGPIPE) {
  }
}

}  // namespace

std::string RecordIoHeader(uint32_t length) {
  std::string out;
  PutLe32(out, kRecordIoMagic);
  PutLe32(out, length & static_cast<uint32_t>(kMaxRecordLength));
  return out;
}

size_t RecordIoPadding(uint64_t length) { return static_cast<size_t>((4 - length % 4) % 4); }

std::vector<size_t> ShuffledOrder(size_t count, int64_t seed, int epoch) {
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  uint64_t state =
      static_cast<uint64_t>(seed) * 0x2545f4914f6cdd1dull ^ (static_cast<uint64_t>(epoch) + 1) * 0x9e3779b97f4a7c15ull;
  for (size_t i = count; i > 1; --i) {
    size_t j = static_cast<size_t>(SplitMix64(state) % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

struct PipeFeeder::Channel {
  std::string name;
  int first_epoch = 0;                  // where feeding starts (0, or the resumed epoch)
  bool first_was_open = false;          // resumed: the first epoch was already open by the reader
  std::vector<SelectedObject> objects;  // key order
  std::string distribution;
  bool gzip = false;
  bool recordio = false;
  std::optional<int64_t> seed;
};

PipeFeeder::PipeFeeder(objects::ObjectStore& store, json request, int host_index, int host_count, std::string opt_ml,
                       Options options)
    : store_(store),
      request_(std::move(request)),
      host_index_(host_index),
      host_count_(host_count),
      opt_ml_(std::move(opt_ml)),
      options_(std::move(options)) {}

PipeFeeder::~PipeFeeder() { Stop(); }

std::vector<std::string> PipeFeeder::channels() const {
  std::vector<std::string> out;
  for (const auto& c : channels_) out.push_back(c->name);
  return out;
}

Status PipeFeeder::Start() {
  std::string role_arn = request_.value("RoleArn", "");
  std::vector<std::unique_ptr<Channel>> channels;
  if (request_.contains("InputDataConfig") && request_["InputDataConfig"].is_array()) {
    for (const json& ch : request_["InputDataConfig"]) {
      if (ChannelInputMode(request_, ch) != "Pipe") continue;
      auto c = std::make_unique<Channel>();
      c->name = ch.value("ChannelName", "");
      ASSIGN_OR_RETURN(c->objects, SelectChannelObjects(store_, ch, role_arn));
      c->distribution = ch["DataSource"]["S3DataSource"].value("S3DataDistributionType", "FullyReplicated");
      c->gzip = ch.value("CompressionType", "None") == "Gzip";
      c->recordio = ch.value("RecordWrapperType", "None") == "RecordIO";
      if (ch.contains("ShuffleConfig") && ch["ShuffleConfig"].is_object() && ch["ShuffleConfig"].contains("Seed") &&
          ch["ShuffleConfig"]["Seed"].is_number_integer()) {
        c->seed = ch["ShuffleConfig"]["Seed"].get<int64_t>();
      }
      channels.push_back(std::move(c));
    }
  }
  if (channels.empty()) return Status::Ok();
  std::string dir = opt_ml_ + "/input/data";
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(MakeDirs(opt_ml_ + "/.kiln"));
  if (options_.resume) {
    for (auto& c : channels) {
      auto text = ReadFile(ProgressPath(c->name));
      if (!text.ok()) continue;  // never fed: start at _0 (created below when missing)
      json progress = json::parse(*text, nullptr, false);
      if (!progress.is_object()) continue;
      c->first_epoch = progress.value("epoch", 0);
      c->first_was_open = progress.value("phase", "") == "open";
    }
  }
  std::vector<std::string> created;
  for (const auto& c : channels) {
    std::string path = dir + "/" + c->name + "_" + std::to_string(c->first_epoch);
    struct stat st;
    if (options_.resume && stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) continue;  // a reader may wait on it
    unlink(path.c_str());
    if (mkfifo(path.c_str(), 0666) != 0) {
      Status s = ErrnoStatus("mkfifo " + path, errno);
      for (const auto& p : created) unlink(p.c_str());
      return s;
    }
    created.push_back(path);
  }
  channels_ = std::move(channels);
  stop_ = false;
  for (auto& c : channels_) threads_.emplace_back([this, ch = c.get()] { Feed(*ch); });
  return Status::Ok();
}

std::string PipeFeeder::ProgressPath(const std::string& channel) const {
  return opt_ml_ + "/.kiln/pipe-" + channel + ".json";
}

void PipeFeeder::RecordProgress(const std::string& channel, int epoch, const char* phase) const {
  // Not fsynced (ReplaceFile): it only has to survive the server process, not the machine (the
  // instance does not survive a reboot either).
  json progress = {{"epoch", epoch}, {"phase", phase}};
  Status s = ReplaceFile(ProgressPath(channel), progress.dump());
  if (!s.ok()) KLOG(warn, "pipe progress not recorded", {{"channel", channel}, {"error", s.ToString()}});
}

void PipeFeeder::Stop() {
  stop_ = true;
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

namespace {

// Result of writing into the FIFO.
enum class WriteOutcome { kOk, kReaderGone, kStopped, kError };

class FifoWriter {
 public:
  FifoWriter(int fd, const std::atomic<bool>& stop, std::chrono::milliseconds poll_interval)
      : fd_(fd), stop_(stop), poll_ms_(static_cast<int>(poll_interval.count())) {}

  WriteOutcome Write(const char* data, size_t n) {
    while (n > 0) {
      if (stop_.load()) return WriteOutcome::kStopped;
      ssize_t w = write(fd_, data, n);
      if (w > 0) {
        data += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) {
        struct pollfd p = {fd_, POLLOUT, 0};
        poll(&p, 1, std::max(1, poll_ms_));
        continue;
      }
      if (w < 0 && errno == EPIPE) {
        DrainSigpipe();
        return WriteOutcome::kReaderGone;
      }
      error_ = errno;
      return WriteOutcome::kError;
    }
    return WriteOutcome::kOk;
  }
  int error() const { return error_; }

 private:
  int fd_;
  const std::atomic<bool>& stop_;
  int poll_ms_;
  int error_ = 0;
};

// Where StreamObject writes, and how: one channel's FIFO for one epoch.
struct StreamTarget {
  objects::ObjectStore& store;
  const std::atomic<bool>& stop;
  const std::string& channel;
  bool gzip;
  bool recordio;
  FifoWriter& writer;
  std::vector<char>& buf;
};

// Streams object `o` into the FIFO (gunzipped when target.gzip; as one RecordIO record when
// target.recordio). Returns why it could not be read (outcome then kOk); otherwise `outcome` says
// whether writing can go on (kStopped also when a stop came while a gzip object was measured).
Status StreamObject(const StreamTarget& target, const SelectedObject& o, WriteOutcome& outcome) {
  std::string uri = "s3://" + o.bucket + "/" + o.key;
  auto reader = target.store.GetObject(o.bucket, o.key, std::nullopt);
  if (!reader.ok()) return ObjectError(reader.status(), "Streaming", o.bucket, o.key);
  std::unique_ptr<GzipSource> gunzip;
  ByteSource* source = reader->get();
  if (target.gzip) {
    gunzip = std::make_unique<GzipSource>(**reader, "S3 object \"" + uri + "\"");
    source = gunzip.get();
  }
  uint64_t length = (*reader)->info().size;
  if (target.recordio && target.gzip) {
    // The record header carries the decompressed length: count it in a first pass.
    auto counting = target.store.GetObject(o.bucket, o.key, std::nullopt);
    if (!counting.ok()) return ObjectError(counting.status(), "Streaming", o.bucket, o.key);
    GzipSource count_source(**counting, "S3 object \"" + uri + "\"");
    length = 0;
    while (!target.stop.load()) {
      auto n = count_source.Read(target.buf.data(), target.buf.size());
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      length += *n;
    }
    if (target.stop.load()) {
      outcome = WriteOutcome::kStopped;
      return Status::Ok();
    }
  }
  if (target.recordio) {
    if (length > kMaxRecordLength) {
      return ClientError("S3 object \"" + uri + "\" is " + std::to_string(length) +
                         " bytes, too large for one RecordIO record (at most 536870911 bytes) in Pipe channel \"" +
                         target.channel + "\". Please split it into smaller objects or use RecordWrapperType None.");
    }
    std::string header = RecordIoHeader(static_cast<uint32_t>(length));
    outcome = target.writer.Write(header.data(), header.size());
    if (outcome != WriteOutcome::kOk) return Status::Ok();
  }
  uint64_t written = 0;
  while (outcome == WriteOutcome::kOk) {
    auto n = source->Read(target.buf.data(), target.buf.size());
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    written += *n;
    outcome = target.writer.Write(target.buf.data(), *n);
  }
  if (outcome != WriteOutcome::kOk) return Status::Ok();
  if (target.recordio) {
    if (written != length) return InternalServerError("S3 object \"" + uri + "\" changed while it was streamed");
    static const char kZeros[4] = {0, 0, 0, 0};
    outcome = target.writer.Write(kZeros, RecordIoPadding(length));
  }
  return Status::Ok();
}

}  // namespace

void PipeFeeder::Feed(Channel& ch) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto fail = [&](const Status& s) {
    KLOG(error, "pipe channel failed", {{"channel", ch.name}, {"error", s.message()}});
    if (options_.on_error) options_.on_error(ch.name, s);
  };
  auto sleep_poll = [&] { std::this_thread::sleep_for(options_.poll_interval); };
  const std::string dir = opt_ml_ + "/input/data/";
  std::vector<char> buf(options_.buffer_size);

  for (int epoch = ch.first_epoch; !stop_.load(); ++epoch) {
    if (options_.max_epochs > 0 && epoch >= options_.max_epochs) break;
    std::string path = dir + ch.name + "_" + std::to_string(epoch);
    if (epoch == ch.first_epoch && ch.first_was_open) {
      // Resumed after the old feeder died while the reader had this epoch open: the reader got
      // EOF early. Wait for it to close the FIFO, then go on with the next epoch.
      while (!stop_.load()) {
        UniqueFd probe(open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
        if (!probe.valid() && (errno == ENXIO || errno == ENOENT)) break;
        probe.Reset();
        sleep_poll();
      }
      unlink(path.c_str());
      continue;
    }
    if (epoch > ch.first_epoch) {
      unlink(path.c_str());
      if (mkfifo(path.c_str(), 0666) != 0) return fail(ErrnoStatus("mkfifo " + path, errno));
    }
    RecordProgress(ch.name, epoch, "waiting");
    UniqueFd fd;
    while (!stop_.load()) {
      fd = UniqueFd(open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
      if (fd.valid()) break;
      if (errno != ENXIO && errno != EINTR) return fail(ErrnoStatus("open " + path, errno));
      sleep_poll();
    }
    if (stop_.load()) return;
    RecordProgress(ch.name, epoch, "open");

    std::vector<SelectedObject> ordered;
    if (ch.seed) {
      for (size_t i : ShuffledOrder(ch.objects.size(), *ch.seed, epoch)) ordered.push_back(ch.objects[i]);
    } else {
      ordered = ch.objects;
    }
    auto share = ShardObjects(ordered, ch.distribution, host_index_, host_count_);

    FifoWriter writer(fd.get(), stop_, options_.poll_interval);
    WriteOutcome outcome = WriteOutcome::kOk;
    Status error;
    StreamTarget target{store_, stop_, ch.name, ch.gzip, ch.recordio, writer, buf};
    for (const auto& o : share) {
      error = StreamObject(target, o, outcome);
      if (!error.ok() || outcome != WriteOutcome::kOk) break;
    }
    fd.Reset();
    if (!error.ok()) {
      if (error.code() == StatusCode::kDataLoss) {
        error = ClientError(error.message() + " in Pipe channel \"" + ch.name +
                            "\" with CompressionType Gzip. Please make sure every object of the channel "
                            "is gzip-compressed, or set CompressionType to None.");
      } else if (!IsFailureReason(error)) {
        error = InternalServerError("Pipe channel \"" + ch.name + "\": " + error.ToString(), error.code());
      }
      return fail(error);
    }
    if (outcome == WriteOutcome::kStopped) return;
    if (outcome == WriteOutcome::kError) return fail(ErrnoStatus("write " + path, writer.error()));
    // Wait until the reader has closed this epoch's FIFO before the next one appears.
    while (!stop_.load()) {
      UniqueFd probe(open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
      if (!probe.valid() && errno == ENXIO) break;
      if (!probe.valid() && errno != EINTR) return fail(ErrnoStatus("open " + path, errno));
      probe.Reset();
      sleep_poll();
    }
    if (stop_.load()) return;
    unlink(path.c_str());
  }
}

}  // namespace kiln::agent
