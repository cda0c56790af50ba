#include "serving/async_queue.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::serving {

namespace {

constexpr std::string_view kSuffix = ".journal";

nlohmann::json ToJson(const AsyncRequest& r) {
  return {{"op", "put"},
          {"seq", r.seq},
          {"endpoint", r.endpoint},
          {"inference_id", r.inference_id},
          {"input", r.input_location},
          {"content_type", r.content_type},
          {"accept", r.accept},
          {"custom_attributes", r.custom_attributes},
          {"output", r.output_location},
          {"failure", r.failure_location},
          {"received_millis", r.received_millis},
          {"ttl_seconds", r.ttl_seconds},
          {"invocation_timeout_seconds", r.invocation_timeout_seconds}};
}

AsyncRequest FromJson(const nlohmann::json& j) {
  AsyncRequest r;
  r.seq = j.value("seq", uint64_t{0});
  r.endpoint = j.value("endpoint", "");
  r.inference_id = j.value("inference_id", "");
  r.input_location = j.value("input", "");
  r.content_type = j.value("content_type", "");
  r.accept = j.value("accept", "");
  r.custom_attributes = j.value("custom_attributes", "");
  r.output_location = j.value("output", "");
  r.failure_location = j.value("failure", "");
  r.received_millis = j.value("received_millis", int64_t{0});
  r.ttl_seconds = j.value("ttl_seconds", 21600);
  r.invocation_timeout_seconds = j.value("invocation_timeout_seconds", 900);
  return r;
}

}  // namespace

struct AsyncQueue::Journal {
  std::string endpoint;
  int fd = -1;
  uint64_t next_seq = 1;
  uint64_t lines = 0;                     // lines in the file now
  uint64_t written = 0;                   // lines written by this process (never reset: group commit's clock)
  uint64_t synced = 0;                    // `written` as of the last completed fdatasync
  std::map<uint64_t, AsyncRequest> live;  // waiting and in flight, by seq (= arrival order)
  std::deque<uint64_t> waiting;
  ~Journal() {
    if (fd >= 0) ::close(fd);
  }
};

AsyncQueue::AsyncQueue(AsyncQueueOptions options) : options_(std::move(options)) {}
AsyncQueue::~AsyncQueue() = default;

Result<std::unique_ptr<AsyncQueue>> AsyncQueue::Open(AsyncQueueOptions options) {
  RETURN_IF_ERROR(MakeDirs(options.dir, 0700).WithPrefix("async queue dir"));
  std::unique_ptr<AsyncQueue> queue(new AsyncQueue(std::move(options)));
  RETURN_IF_ERROR(queue->Recover());
  return queue;
}

std::string AsyncQueue::PathOf(const std::string& endpoint) const {
  return options_.dir + "/" + endpoint + std::string(kSuffix);
}

Status AsyncQueue::Recover() {
  DIR* dir = ::opendir(options_.dir.c_str());
  if (dir == nullptr) return ErrnoStatus("open " + options_.dir, errno);
  std::vector<std::string> endpoints;
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name.size() > kSuffix.size() && EndsWith(name, kSuffix)) {
      endpoints.push_back(name.substr(0, name.size() - kSuffix.size()));
    }
  }
  ::closedir(dir);
  MutexLock lock(mu_);
  for (const std::string& endpoint : endpoints) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(PathOf(endpoint)));
    auto journal = std::make_unique<Journal>();
    journal->endpoint = endpoint;
    size_t start = 0;
    // A last line without its newline was never acknowledged (the crash came mid-write): ignored.
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) break;
      std::string_view line(text.data() + start, end - start);
      start = end + 1;
      ++journal->lines;
      auto parsed = nlohmann::json::parse(line, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) continue;
      const uint64_t seq = parsed.value("seq", uint64_t{0});
      journal->next_seq = std::max(journal->next_seq, seq + 1);
      if (parsed.value("op", "") == "put") {
        AsyncRequest request = FromJson(parsed);
        request.endpoint = endpoint;
        request.recovered = true;
        journal->live[seq] = std::move(request);
      } else {
        journal->live.erase(seq);
      }
    }
    for (const auto& [seq, request] : journal->live) journal->waiting.push_back(seq);
    // Rewritten at once with only the live requests (also drops a torn last line).
    RETURN_IF_ERROR(Compact(*journal));
    if (!journal->live.empty()) {
      KLOG(info, "async queue recovered", {{"endpoint", endpoint}, {"requests", std::to_string(journal->live.size())}});
    }
    journals_[endpoint] = std::move(journal);
  }
  work_pending_ = true;
  return Status::Ok();
}

AsyncQueue::Journal* AsyncQueue::JournalFor(const std::string& endpoint) {
  auto it = journals_.find(endpoint);
  if (it != journals_.end()) return it->second.get();
  return nullptr;
}

Status AsyncQueue::AppendLine(Journal& journal, const std::string& line) {
  if (journal.fd < 0) {
    journal.fd = ::open(PathOf(journal.endpoint).c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (journal.fd < 0) return ErrnoStatus("open async journal " + PathOf(journal.endpoint), errno);
  }
  RETURN_IF_ERROR(WriteAll(journal.fd, line));
  ++journal.lines;
  ++journal.written;
  return Status::Ok();
}

Status AsyncQueue::Compact(Journal& journal) {
  const std::string path = PathOf(journal.endpoint);
  const std::string temp = path + ".tmp";
  std::string text;
  for (const auto& [seq, request] : journal.live) text += ToJson(request).dump() + "\n";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("open " + temp, errno);
  Status written = WriteAll(fd, text);
  if (written.ok() && ::fsync(fd) != 0) written = ErrnoStatus("fsync " + temp, errno);
  if (!written.ok()) {
    ::close(fd);
    ::unlink(temp.c_str());
    return written;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    Status renamed = ErrnoStatus("rename " + temp, errno);
    ::close(fd);
    return renamed;
  }
  RETURN_IF_ERROR(FsyncDir(options_.dir));
  ::close(fd);
  if (journal.fd >= 0) ::close(journal.fd);
  journal.fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (journal.fd < 0) return ErrnoStatus("open async journal " + path, errno);
  journal.lines = journal.live.size();
  journal.synced = journal.written;  // everything live is in the synced file
  return Status::Ok();
}

Status AsyncQueue::Enqueue(AsyncRequest& request) {
  uint64_t mine = 0;
  {
    MutexLock lock(mu_);
    Journal* journal = JournalFor(request.endpoint);
    if (journal == nullptr) {
      auto created = std::make_unique<Journal>();
      created->endpoint = request.endpoint;
      journal = created.get();
      journals_[request.endpoint] = std::move(created);
    }
    if (journal->live.size() >= options_.max_per_endpoint) {
      return Status::ResourceExhausted("the queue of endpoint " + request.endpoint + " holds " +
                                       std::to_string(journal->live.size()) + " requests (its bound)");
    }
    request.seq = journal->next_seq++;
    request.recovered = false;
    RETURN_IF_ERROR(AppendLine(*journal, ToJson(request).dump() + "\n"));
    mine = journal->written;
    journal->live[request.seq] = request;
    journal->waiting.push_back(request.seq);
  }
  // Group commit: one fdatasync covers every line written before it started.
  {
    MutexLock sync(sync_mu_);
    int fd = -1;
    uint64_t target = 0;
    {
      MutexLock lock(mu_);
      Journal* journal = JournalFor(request.endpoint);
      if (journal == nullptr || journal->synced >= mine) {
        fd = -1;
      } else {
        fd = journal->fd;
        target = journal->written;
      }
    }
    if (fd >= 0) {
      // sync_mu_ is held: no compaction or Drop closes the fd meanwhile.
      if (::fdatasync(fd) != 0) return ErrnoStatus("fdatasync async journal", errno);
      MutexLock lock(mu_);
      if (Journal* journal = JournalFor(request.endpoint)) journal->synced = std::max(journal->synced, target);
    }
  }
  {
    MutexLock lock(mu_);
    work_pending_ = true;
  }
  work_.NotifyAll();
  return Status::Ok();
}

std::optional<AsyncRequest> AsyncQueue::Take(const std::string& endpoint) {
  MutexLock lock(mu_);
  Journal* journal = JournalFor(endpoint);
  while (journal != nullptr && !journal->waiting.empty()) {
    uint64_t seq = journal->waiting.front();
    journal->waiting.pop_front();
    auto it = journal->live.find(seq);
    if (it != journal->live.end()) return it->second;
  }
  return std::nullopt;
}

void AsyncQueue::Untake(const AsyncRequest& request) {
  {
    MutexLock lock(mu_);
    Journal* journal = JournalFor(request.endpoint);
    if (journal == nullptr || journal->live.count(request.seq) == 0) return;
    journal->waiting.push_front(request.seq);
    work_pending_ = true;
  }
  work_.NotifyAll();
}

void AsyncQueue::Complete(const std::string& endpoint, uint64_t seq) {
  bool compact = false;
  {
    MutexLock lock(mu_);
    Journal* journal = JournalFor(endpoint);
    if (journal == nullptr || journal->live.erase(seq) == 0) return;
    Status appended = AppendLine(*journal, nlohmann::json{{"op", "done"}, {"seq", seq}}.dump() + "\n");
    if (!appended.ok()) {
      KLOG(warn, "async journal done line not written", {{"endpoint", endpoint}, {"error", appended.ToString()}});
    }
    compact = journal->lines > options_.compact_min_records && journal->live.size() * 2 <= journal->lines;
  }
  if (!compact) return;
  MutexLock sync(sync_mu_);
  MutexLock lock(mu_);
  Journal* journal = JournalFor(endpoint);
  if (journal == nullptr) return;
  if (journal->lines > options_.compact_min_records && journal->live.size() * 2 <= journal->lines) {
    Status compacted = Compact(*journal);
    if (!compacted.ok()) {
      KLOG(warn, "async journal not compacted", {{"endpoint", endpoint}, {"error", compacted.ToString()}});
    }
  }
}

void AsyncQueue::Drop(const std::string& endpoint) {
  MutexLock sync(sync_mu_);
  MutexLock lock(mu_);
  auto it = journals_.find(endpoint);
  if (it == journals_.end()) return;
  journals_.erase(it);
  ::unlink(PathOf(endpoint).c_str());
}

std::map<std::string, AsyncBacklog> AsyncQueue::Backlogs() const {
  MutexLock lock(mu_);
  std::map<std::string, AsyncBacklog> out;
  for (const auto& [endpoint, journal] : journals_) {
    AsyncBacklog b;
    b.waiting = journal->waiting.size();
    b.in_flight = journal->live.size() - std::min(journal->live.size(), b.waiting);
    if (!journal->live.empty()) b.oldest_received_millis = journal->live.begin()->second.received_millis;
    out[endpoint] = b;
  }
  return out;
}

void AsyncQueue::WaitForWork(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (!work_pending_) work_.WaitFor(mu_, timeout);
  work_pending_ = false;
}

void AsyncQueue::Wake() {
  {
    MutexLock lock(mu_);
    work_pending_ = true;
  }
  work_.NotifyAll();
}

size_t AsyncQueue::TEST_JournalLines(const std::string& endpoint) const {
  MutexLock lock(mu_);
  auto it = journals_.find(endpoint);
  return it == journals_.end() ? 0 : it->second->lines;
}

}  // namespace kiln::serving
