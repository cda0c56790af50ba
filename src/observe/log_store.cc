#include "observe/log_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"

namespace kiln::observe {
namespace {

constexpr size_t kHeaderBytes = 20;  // u32 length, i64 timestamp, i64 ingestion time
constexpr size_t kDefaultPageBytes = 1048576;
// FilterLogEvents reads at most this many candidate events per page; the rest continue under
// nextToken (an empty page with a token is allowed, spec §11).
constexpr size_t kMaxFilterScan = 200000;
constexpr int64_t kMaxBatchSpanMillis = 24LL * 3600 * 1000;

const char kNoGroup[] = "The specified log group does not exist.";
const char kNoStream[] = "The specified log stream does not exist.";
const char kBadToken[] = "The specified nextToken is invalid.";

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool InRange(int64_t ts, const std::optional<int64_t>& start, const std::optional<int64_t>& end) {
  return (!start || ts >= *start) && (!end || ts < *end);
}

// Tokens are opaque to clients: base64 of a small JSON object, so that a mangled one fails to
// parse instead of pointing somewhere else.
std::string EncodeToken(const nlohmann::json& j) { return Base64Encode(j.dump()); }
std::optional<nlohmann::json> DecodeToken(std::string_view text) {
  auto raw = Base64Decode(text);
  if (!raw) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*raw, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::string PositionToken(char direction, const std::string& stream_id, size_t position) {
  nlohmann::json j = {{"s", stream_id}, {"p", position}, {"d", std::string(1, direction)}};
  return std::string(1, direction) + "/" + EncodeToken(j);
}

// Splits a filter pattern into terms; a quoted phrase is one term and may follow '?' or '-'.
std::vector<std::string> PatternTerms(const std::string& pattern) {
  std::vector<std::string> terms;
  size_t i = 0;
  while (i < pattern.size()) {
    while (i < pattern.size() && (pattern[i] == ' ' || pattern[i] == '\t')) ++i;
    if (i >= pattern.size()) break;
    std::string term;
    if (pattern[i] == '?' || pattern[i] == '-') term.push_back(pattern[i++]);
    if (i < pattern.size() && pattern[i] == '"') {
      size_t close = pattern.find('"', i + 1);
      if (close == std::string::npos) close = pattern.size();
      term += pattern.substr(i + 1, close - i - 1);
      i = close + 1;
    } else {
      while (i < pattern.size() && pattern[i] != ' ' && pattern[i] != '\t') term.push_back(pattern[i++]);
    }
    terms.push_back(std::move(term));
  }
  return terms;
}

// The least string above every string that starts with `prefix` in byte order (the prefix with
// trailing 0xff bytes dropped and its last byte incremented); none for an empty or all-0xff one.
std::optional<std::string> PrefixEnd(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::nullopt;
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

}  // namespace

bool MatchesFilterPattern(const std::string& pattern, const std::string& message) {
  bool any_optional = false, optional_hit = false;
  for (const std::string& term : PatternTerms(pattern)) {
    if (!term.empty() && term[0] == '?') {
      any_optional = true;
      if (message.find(term.substr(1)) != std::string::npos) optional_hit = true;
    } else if (!term.empty() && term[0] == '-') {
      if (term.size() > 1 && message.find(term.substr(1)) != std::string::npos) return false;
    } else if (message.find(term) == std::string::npos) {
      return false;
    }
  }
  return !any_optional || optional_hit;
}

// One block of a stream: events [first_seq, end_seq) in records [begin, end) of the event file.
struct LogStore::Block {
  uint64_t first_seq = 0;
  uint64_t end_seq = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  int64_t min_ts = 0;
  int64_t max_ts = 0;
};

// A stream's open handle. Its size is constant: per-event and per-block data stay on disk.
// Invariants: blocks == count / kBlockEvents entries are in the index file (unless `broken`);
// events [blocks * kBlockEvents, count) form the partial last block starting at tail_offset.
struct LogStore::StreamFile {
  std::string id;
  UniqueFd fd;        // the event file
  UniqueFd index_fd;  // the index file
  uint64_t size = 0;  // bytes of whole records; a torn tail past it is cut off at load
  uint64_t count = 0;
  uint64_t blocks = 0;
  uint64_t tail_offset = 0;
  int64_t tail_min = 0;  // min and max timestamp of the partial block, when it has events
  int64_t tail_max = 0;
  bool sorted = true;  // no event's timestamp is below the one appended before it
  int64_t last_ts = 0;
  bool broken = false;  // an index entry read back corrupt or was not written: reload on next open
  std::list<std::string>::iterator lru;
};

// Filter's order: timestamp, then stream (by name: `streams` is sorted by name), then sequence.
struct LogStore::Candidate {
  int64_t ts = 0;
  uint32_t stream = 0;
  uint32_t len = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;  // of the record
  int64_t ingestion = 0;
};

// The last key a Filter page examined (from a token or the previous chunk): candidates are after it.
struct LogStore::FilterBound {
  int64_t ts = 0;
  std::string stream_name;
  uint64_t seq = 0;
};

namespace {

constexpr uint64_t kBlockEvents = 64;
constexpr size_t kEntryBytes = 32;
constexpr size_t kEntryPage = 128;     // index entries read at once
constexpr size_t kReadChunk = 65536;   // sequential record reads
constexpr size_t kFilterChunk = 8192;  // Filter candidates selected per pass over the streams
constexpr uint32_t kEntrySorted = 1;

// Index entry: u64 offset of the block's first record, i64 min and max timestamp, u32 flags
// (kEntrySorted: timestamps non-decreasing from the stream's first event through this block),
// u32 CRC-32C of the first 28 bytes.
struct IndexEntry {
  uint64_t offset = 0;
  int64_t min_ts = 0;
  int64_t max_ts = 0;
  uint32_t flags = 0;
};

void EncodeEntry(const IndexEntry& e, std::string& out) {
  size_t at = out.size();
  PutLe(out, e.offset, 8);
  PutLe(out, static_cast<uint64_t>(e.min_ts), 8);
  PutLe(out, static_cast<uint64_t>(e.max_ts), 8);
  PutLe(out, e.flags, 4);
  PutLe(out, Crc32cUpdate(0, std::string_view(out.data() + at, 28)), 4);
}

std::optional<IndexEntry> DecodeEntry(const char* p) {
  if (GetLe(p + 28, 4) != Crc32cUpdate(0, std::string_view(p, 28))) return std::nullopt;
  IndexEntry e;
  e.offset = GetLe(p, 8);
  e.min_ts = static_cast<int64_t>(GetLe(p + 8, 8));
  e.max_ts = static_cast<int64_t>(GetLe(p + 16, 8));
  e.flags = static_cast<uint32_t>(GetLe(p + 24, 4));
  return e;
}

Status PreadAll(int fd, char* buf, size_t n, uint64_t offset, const char* what) {
  size_t got = 0;
  while (got < n) {
    ASSIGN_OR_RETURN(size_t r, PreadSome(fd, buf + got, n - got, offset + got));
    if (r == 0) return Status::DataLoss(std::string(what) + " is shorter than expected");
    got += r;
  }
  return Status::Ok();
}

Status PwriteAll(int fd, std::string_view data, uint64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("write log index", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

struct RecordHeader {
  uint64_t offset = 0;  // of the header
  uint32_t len = 0;
  int64_t ts = 0;
  int64_t ingestion = 0;
};

// Reads the records of [begin, end) of an event file in order through one buffer of ~64 KiB
// (more only for a single larger record). Bodies are read only when asked for.
class RecordReader {
 public:
  RecordReader(int fd, uint64_t begin, uint64_t end) : fd_(fd), pos_(begin), end_(end) {}

  // The next record's header; false at the end of the range or at a record cut short there.
  Result<bool> Next(RecordHeader* h) {
    ASSIGN_OR_RETURN(bool have, Ensure(pos_, kHeaderBytes));
    if (!have) return false;
    const char* p = buf_.data() + (pos_ - buf_start_);
    h->offset = pos_;
    h->len = static_cast<uint32_t>(GetLe(p, 4));
    h->ts = static_cast<int64_t>(GetLe(p + 4, 8));
    h->ingestion = static_cast<int64_t>(GetLe(p + 12, 8));
    if (pos_ + kHeaderBytes + h->len > end_) return false;
    pos_ += kHeaderBytes + h->len;
    return true;
  }

  // The message of a record that Next returned.
  Result<std::string> Message(const RecordHeader& h) {
    ASSIGN_OR_RETURN(bool have, Ensure(h.offset + kHeaderBytes, h.len));
    if (!have) return Status::DataLoss("log event file is shorter than its index");
    return std::string(buf_.data() + (h.offset + kHeaderBytes - buf_start_), h.len);
  }

  uint64_t position() const { return pos_; }

 private:
  // Makes [offset, offset + need) resident; false when it reaches past the range or the file.
  Result<bool> Ensure(uint64_t offset, size_t need) {
    if (offset >= buf_start_ && offset + need <= buf_start_ + buf_.size()) return true;
    if (offset + need > end_) return false;
    size_t want = static_cast<size_t>(std::min<uint64_t>(std::max(need, kReadChunk), end_ - offset));
    buf_.resize(want);
    buf_start_ = offset;
    size_t got = 0;
    while (got < want) {
      ASSIGN_OR_RETURN(size_t n, PreadSome(fd_, buf_.data() + got, want - got, offset + got));
      if (n == 0) break;
      got += n;
    }
    buf_.resize(got);
    return got >= need;
  }

  int fd_;
  uint64_t pos_;
  uint64_t end_;
  std::string buf_;
  uint64_t buf_start_ = 0;
};

}  // namespace

Result<std::unique_ptr<LogStore>> LogStore::Open(Options options) {
  if (options.database == nullptr) return Status::InvalidArgument("LogStore needs a database");
  if (options.max_open_streams == 0) options.max_open_streams = 1;
  RETURN_IF_ERROR(MakeDirs(options.root, 0700).WithPrefix("log dir"));
  return std::unique_ptr<LogStore>(new LogStore(std::move(options)));
}

LogStore::LogStore(Options options) : options_(std::move(options)) {}
LogStore::~LogStore() = default;

int64_t LogStore::Now() const { return (options_.clock ? *options_.clock : Clock::System()).NowMillis(); }

std::string LogStore::FilePath(const std::string& id) const { return options_.root + "/" + id + ".events"; }
std::string LogStore::IndexPath(const std::string& id) const { return options_.root + "/" + id + ".index"; }

Status LogStore::CheckGroup(const std::string& group) {
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare("SELECT 1 FROM log_groups WHERE name = ?"));
  st.BindText(1, group);
  ASSIGN_OR_RETURN(bool found, st.Step());
  return found ? Status::Ok() : Status::NotFound(kNoGroup);
}

Result<LogStore::StreamRow> LogStore::FindStream(const std::string& group, const std::string& stream) {
  RETURN_IF_ERROR(CheckGroup(group));
  ASSIGN_OR_RETURN(auto st,
                   options_.database->Prepare("SELECT id, created_millis, first_event_millis, last_event_millis, "
                                              "last_ingestion_millis, stored_bytes, event_count FROM log_streams "
                                              "WHERE group_name = ? AND name = ?"));
  st.BindText(1, group).BindText(2, stream);
  ASSIGN_OR_RETURN(bool found, st.Step());
  if (!found) return Status::NotFound(kNoStream);
  StreamRow row;
  row.id = st.ColumnText(0);
  row.info.name = stream;
  row.info.creation_time = st.ColumnInt64(1);
  if (!st.IsNull(2)) row.info.first_event_timestamp = st.ColumnInt64(2);
  if (!st.IsNull(3)) row.info.last_event_timestamp = st.ColumnInt64(3);
  if (!st.IsNull(4)) row.info.last_ingestion_time = st.ColumnInt64(4);
  row.info.stored_bytes = st.ColumnInt64(5);
  row.info.event_count = st.ColumnInt64(6);
  return row;
}

namespace {

// Adds one event (already on disk at `offset`, `bytes` long) to the handle's partial block;
// appends the block's index entry to `entries` when the block is complete.
void AddEvent(uint64_t& count, uint64_t& blocks, uint64_t& tail_offset, int64_t& tail_min, int64_t& tail_max,
              bool& sorted, int64_t& last_ts, int64_t ts, uint64_t offset, uint64_t bytes, std::string& entries) {
  if (count == blocks * kBlockEvents) {
    tail_offset = offset;
    tail_min = tail_max = ts;
  } else {
    tail_min = std::min(tail_min, ts);
    tail_max = std::max(tail_max, ts);
  }
  if (count > 0 && ts < last_ts) sorted = false;
  last_ts = ts;
  ++count;
  if (count == (blocks + 1) * kBlockEvents) {
    EncodeEntry({tail_offset, tail_min, tail_max, sorted ? kEntrySorted : 0}, entries);
    ++blocks;
    tail_offset = offset + bytes;
  }
}

}  // namespace

// Trusts the index entries before the last one; checks the last against the block it describes
// (a crash can tear an entry, and entries are written after the events they describe are
// synced, so an index can be short but never ahead). Then scans the events after the last
// indexed block, writing entries for blocks that are complete, and cuts a torn record off the end.
Status LogStore::LoadIndex(StreamFile* f) {
  struct stat data_st {
  }, index_st{};
  if (::fstat(f->fd.get(), &data_st) != 0) return ErrnoStatus("stat log events", errno);
  if (::fstat(f->index_fd.get(), &index_st) != 0) return ErrnoStatus("stat log index", errno);
  const uint64_t data_size = static_cast<uint64_t>(data_st.st_size);
  uint64_t entries = static_cast<uint64_t>(index_st.st_size) / kEntryBytes;
  f->count = f->blocks = f->tail_offset = 0;
  f->sorted = true;
  if (entries > 0) {
    char raw[kEntryBytes];
    bool good = false;
    IndexEntry last;
    if (PreadAll(f->index_fd.get(), raw, kEntryBytes, (entries - 1) * kEntryBytes, "log index").ok()) {
      auto e = DecodeEntry(raw);
      if (e && e->offset < data_size) {
        last = *e;
        RecordReader reader(f->fd.get(), last.offset, data_size);
        RecordHeader h;
        int64_t lo = INT64_MAX, hi = INT64_MIN, prev = INT64_MIN;
        bool in_order = true;
        uint64_t n = 0;
        for (; n < kBlockEvents; ++n) {
          ASSIGN_OR_RETURN(bool have, reader.Next(&h));
          if (!have) break;
          lo = std::min(lo, h.ts);
          hi = std::max(hi, h.ts);
          if (h.ts < prev) in_order = false;
          prev = h.ts;
        }
        good =
            n == kBlockEvents && lo == last.min_ts && hi == last.max_ts && (in_order || !(last.flags & kEntrySorted));
        if (good) {
          f->blocks = entries;
          f->count = entries * kBlockEvents;
          f->tail_offset = reader.position();
          f->sorted = (last.flags & kEntrySorted) != 0;
          f->last_ts = prev;
        }
      }
    }
    if (!good) {
      KLOG(warn, "log index does not match its events; rebuilding it", {{"stream_id", f->id}});
      entries = 0;
    }
  }
  if (static_cast<uint64_t>(index_st.st_size) != entries * kEntryBytes &&
      ::ftruncate(f->index_fd.get(), static_cast<off_t>(entries * kEntryBytes)) != 0) {
    return ErrnoStatus("truncate log index", errno);
  }
  RecordReader reader(f->fd.get(), f->tail_offset, data_size);
  RecordHeader h;
  std::string pending;
  uint64_t pending_from = f->blocks;
  for (;;) {
    ASSIGN_OR_RETURN(bool have, reader.Next(&h));
    if (!have) break;
    AddEvent(f->count, f->blocks, f->tail_offset, f->tail_min, f->tail_max, f->sorted, f->last_ts, h.ts, h.offset,
             kHeaderBytes + h.len, pending);
    if (pending.size() >= kEntryPage * kEntryBytes) {
      RETURN_IF_ERROR(PwriteAll(f->index_fd.get(), pending, pending_from * kEntryBytes));
      pending.clear();
      pending_from = f->blocks;
    }
  }
  if (f->count == f->blocks * kBlockEvents) f->tail_offset = reader.position();
  RETURN_IF_ERROR(PwriteAll(f->index_fd.get(), pending, pending_from * kEntryBytes));
  f->size = reader.position();
  if (f->size < data_size && ::ftruncate(f->fd.get(), static_cast<off_t>(f->size)) != 0) {
    return ErrnoStatus("truncate log events", errno);
  }
  return Status::Ok();
}

Result<LogStore::StreamFile*> LogStore::OpenStreamFile(const std::string& id) {
  auto it = files_.find(id);
  if (it != files_.end()) {
    if (!it->second->broken) {
      lru_.splice(lru_.begin(), lru_, it->second->lru);
      return it->second.get();
    }
    lru_.erase(it->second->lru);
    files_.erase(it);
  }
  auto file = std::make_unique<StreamFile>();
  file->id = id;
  std::string path = FilePath(id);
  file->fd = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!file->fd.valid()) return ErrnoStatus("open " + path, errno);
  std::string index_path = IndexPath(id);
  file->index_fd = UniqueFd(::open(index_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!file->index_fd.valid()) return ErrnoStatus("open " + index_path, errno);
  RETURN_IF_ERROR(LoadIndex(file.get()));
  while (files_.size() >= options_.max_open_streams && !lru_.empty()) {
    files_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(id);
  file->lru = lru_.begin();
  StreamFile* raw = file.get();
  files_.emplace(id, std::move(file));
  return raw;
}

void LogStore::DropStreamFile(const std::string& id) {
  auto it = files_.find(id);
  if (it != files_.end()) {
    lru_.erase(it->second->lru);
    files_.erase(it);
  }
  ::unlink(FilePath(id).c_str());
  ::unlink(IndexPath(id).c_str());
}

Result<LogStore::Block> LogStore::GetBlock(StreamFile* f, uint64_t k) {
  Block b;
  b.first_seq = k * kBlockEvents;
  if (k >= f->blocks) {
    b.end_seq = f->count;
    b.begin = f->tail_offset;
    b.end = f->size;
    b.min_ts = f->tail_min;
    b.max_ts = f->tail_max;
    return b;
  }
  // This entry and the next one's offset (the block's end) in one read.
  const bool has_next = k + 1 < f->blocks;
  char raw[2 * kEntryBytes];
  Status read =
      PreadAll(f->index_fd.get(), raw, has_next ? 2 * kEntryBytes : kEntryBytes, k * kEntryBytes, "log index");
  std::optional<IndexEntry> e = read.ok() ? DecodeEntry(raw) : std::nullopt;
  std::optional<IndexEntry> next = read.ok() && has_next ? DecodeEntry(raw + kEntryBytes) : std::nullopt;
  if (!e || (has_next && !next)) {
    f->broken = true;
    (void)::ftruncate(f->index_fd.get(), 0);
    KLOG(warn, "log index entry is corrupt; rebuilding the index", {{"stream_id", f->id}});
    return Status::DataLoss("The log stream's index was damaged and is being rebuilt; retry the request.");
  }
  b.end_seq = b.first_seq + kBlockEvents;
  b.begin = e->offset;
  b.end = has_next ? next->offset : f->tail_offset;
  b.min_ts = e->min_ts;
  b.max_ts = e->max_ts;
  return b;
}

template <typename Pred>
Result<uint64_t> LogStore::FirstBlockWhere(StreamFile* f, uint64_t lo, uint64_t hi, Pred pred) {
  uint64_t end = hi + 1;
  while (lo < end) {
    uint64_t mid = lo + (end - lo) / 2;
    ASSIGN_OR_RETURN(Block b, GetBlock(f, mid));
    if (pred(b)) {
      end = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

namespace {
// True when no timestamp of block `b` is in [start, end).
template <typename BlockT>
bool Disjoint(const BlockT& b, const std::optional<int64_t>& start, const std::optional<int64_t>& end) {
  return (start && b.max_ts < *start) || (end && b.min_ts >= *end);
}

// Reads the records of sequences [first_seq, end_seq) from `reader` (placed at first_seq's
// record) and calls visit(header, seq) for each, in order, until it returns false. Errors:
// DataLoss when the file holds fewer records than its index says; visit's own.
template <typename Visit>
Status VisitRecords(RecordReader& reader, uint64_t first_seq, uint64_t end_seq, Visit visit) {
  for (uint64_t seq = first_seq; seq < end_seq; ++seq) {
    RecordHeader h;
    ASSIGN_OR_RETURN(bool have, reader.Next(&h));
    if (!have) return Status::DataLoss("log event file is shorter than its index");
    ASSIGN_OR_RETURN(bool more, visit(h, seq));
    if (!more) break;
  }
  return Status::Ok();
}

// The direction ('f' or 'b') and event position (an index in append order) of a GetLogEvents
// token. Errors: InvalidArgument(kBadToken) when it is malformed or names a stream other than
// `stream_id`.
Status DecodeEventsToken(const std::string& token, const std::string& stream_id, char* direction,
                         std::optional<size_t>* position) {
  if (token.size() < 3 || (token[0] != 'f' && token[0] != 'b') || token[1] != '/') {
    return Status::InvalidArgument(kBadToken);
  }
  auto j = DecodeToken(std::string_view(token).substr(2));
  if (!j || !j->contains("s") || !j->contains("p") || !j->contains("d") || !(*j)["s"].is_string() ||
      !(*j)["p"].is_number_unsigned() || !(*j)["d"].is_string() ||
      (*j)["d"].get<std::string>() != std::string(1, token[0])) {
    return Status::InvalidArgument(kBadToken);
  }
  if ((*j)["s"].get<std::string>() != stream_id) return Status::InvalidArgument(kBadToken);
  *direction = token[0];
  *position = (*j)["p"].get<size_t>();
  return Status::Ok();
}
}  // namespace

LogStore::MemoryStats LogStore::TEST_MemoryStats() {
  MutexLock lock(mutex_);
  MemoryStats stats;
  stats.open_streams = files_.size();
  for (const auto& [id, file] : files_) stats.index_bytes += sizeof(StreamFile) + file->id.capacity();
  return stats;
}

Status LogStore::CreateGroup(const std::string& group) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare("INSERT INTO log_groups(name, created_millis) VALUES (?, ?)"));
  st.BindText(1, group).BindInt64(2, Now());
  Status s = st.Run();
  if (s.IsAlreadyExists()) return Status::AlreadyExists("The specified log group already exists");
  return s;
}

Status LogStore::DeleteGroup(const std::string& group) {
  MutexLock lock(mutex_);
  std::vector<std::string> ids;
  RETURN_IF_ERROR(options_.database->WithTransaction([&](store::Database& db) -> Status {
    ASSIGN_OR_RETURN(auto check, db.Prepare("SELECT 1 FROM log_groups WHERE name = ?"));
    check.BindText(1, group);
    ASSIGN_OR_RETURN(bool found, check.Step());
    if (!found) return Status::NotFound(kNoGroup);
    ASSIGN_OR_RETURN(auto list, db.Prepare("SELECT id FROM log_streams WHERE group_name = ?"));
    list.BindText(1, group);
    for (;;) {
      ASSIGN_OR_RETURN(bool row, list.Step());
      if (!row) break;
      ids.push_back(list.ColumnText(0));
    }
    ASSIGN_OR_RETURN(auto del_streams, db.Prepare("DELETE FROM log_streams WHERE group_name = ?"));
    del_streams.BindText(1, group);
    RETURN_IF_ERROR(del_streams.Run());
    ASSIGN_OR_RETURN(auto del_group, db.Prepare("DELETE FROM log_groups WHERE name = ?"));
    del_group.BindText(1, group);
    return del_group.Run();
  }));
  for (const std::string& id : ids) DropStreamFile(id);
  return Status::Ok();
}

Status LogStore::CreateStream(const std::string& group, const std::string& stream) {
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare(
                                "INSERT INTO log_streams(id, group_name, name, created_millis) VALUES (?, ?, ?, ?)"));
  st.BindText(1, RandomHex(16)).BindText(2, group).BindText(3, stream).BindInt64(4, Now());
  Status s = st.Run();
  if (s.IsAlreadyExists()) return Status::AlreadyExists("The specified log stream already exists");
  return s;
}

Status LogStore::DeleteStream(const std::string& group, const std::string& stream) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare("DELETE FROM log_streams WHERE id = ?"));
  st.BindText(1, row.id);
  RETURN_IF_ERROR(st.Run());
  DropStreamFile(row.id);
  return Status::Ok();
}

Result<int64_t> LogStore::Append(const std::string& group, const std::string& stream,
                                 const std::vector<InputEvent>& events) {
  if (events.empty()) return Status::InvalidArgument("logEvents must contain at least one event");
  if (events.size() > kMaxBatchEvents) {
    return Status::InvalidArgument(
        "The batch of log events in a single PutLogEvents request cannot exceed 10000 events");
  }
  size_t total = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const InputEvent& e = events[i];
    if (e.message.empty()) return Status::InvalidArgument("Log event message must not be empty");
    if (e.message.size() > kMaxEventMessageBytes) {
      return Status::InvalidArgument("Log event too large: " + std::to_string(e.message.size() + kEventOverheadBytes) +
                                     " bytes exceeds limit of " + std::to_string(kMaxEventMessageBytes));
    }
    total += e.message.size() + kEventOverheadBytes;
    if (i > 0 && e.timestamp < events[i - 1].timestamp) {
      return Status::InvalidArgument("Log events in a single PutLogEvents request must be in chronological order.");
    }
  }
  if (total > kMaxBatchBytes) {
    return Status::InvalidArgument("Upload too large: " + std::to_string(total) + " bytes exceeds limit of " +
                                   std::to_string(kMaxBatchBytes));
  }
  if (events.back().timestamp - events.front().timestamp > kMaxBatchSpanMillis) {
    return Status::InvalidArgument(
        "A batch of log events in a single PutLogEvents request cannot span more than 24 hours.");
  }

  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(row.id));
  int64_t now = Now();
  std::string buf;
  buf.reserve(total);
  uint64_t offset = file->size;
  int64_t bytes = 0;
  for (const InputEvent& e : events) {
    PutLe(buf, e.message.size(), 4);
    PutLe(buf, static_cast<uint64_t>(e.timestamp), 8);
    PutLe(buf, static_cast<uint64_t>(now), 8);
    buf += e.message;
    bytes += static_cast<int64_t>(e.message.size());
  }
  // pwrite at the known end so that a failed write can be cut off again.
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::pwrite(file->fd.get(), buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      (void)::ftruncate(file->fd.get(), static_cast<off_t>(offset));
      return ErrnoStatus("append log events", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(file->fd.get()) != 0) {
    int err = errno;
    (void)::ftruncate(file->fd.get(), static_cast<off_t>(offset));
    return ErrnoStatus("sync log events", err);
  }
  // The events are durable; index entries for the blocks they complete follow (not synced: the
  // index is rebuilt from the events when it is short).
  file->size = offset + buf.size();
  std::string entries;
  const uint64_t first_new_block = file->blocks;
  uint64_t at = offset;
  for (const InputEvent& e : events) {
    uint64_t record = kHeaderBytes + e.message.size();
    AddEvent(file->count, file->blocks, file->tail_offset, file->tail_min, file->tail_max, file->sorted, file->last_ts,
             e.timestamp, at, record, entries);
    at += record;
  }
  if (Status written = PwriteAll(file->index_fd.get(), entries, first_new_block * kEntryBytes); !written.ok()) {
    KLOG(warn, "log index write failed; the index is rebuilt on next use",
         {{"stream_id", row.id}, {"error", written.ToString()}});
    (void)::ftruncate(file->index_fd.get(), static_cast<off_t>(first_new_block * kEntryBytes));
    file->broken = true;
  }
  int64_t count = static_cast<int64_t>(file->count);
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare(
                                "UPDATE log_streams SET "
                                "first_event_millis = min(coalesce(first_event_millis, ?1), ?1), "
                                "last_event_millis = max(coalesce(last_event_millis, ?2), ?2), "
                                "last_ingestion_millis = ?3, stored_bytes = stored_bytes + ?4, event_count = ?5 "
                                "WHERE id = ?6"));
  st.BindInt64(1, events.front().timestamp)
      .BindInt64(2, events.back().timestamp)
      .BindInt64(3, now)
      .BindInt64(4, bytes)
      .BindInt64(5, count)
      .BindText(6, row.id);
  RETURN_IF_ERROR(st.Run());
  return count;
}

Result<GroupPage> LogStore::ListGroups(const std::string& prefix, const std::string& pattern, int limit,
                                       const std::string& token) {
  if (!prefix.empty() && !pattern.empty()) {
    return Status::InvalidArgument("LogGroup name prefix and LogGroup name pattern are mutually exclusive parameters.");
  }
  std::string after;
  if (!token.empty()) {
    auto j = DecodeToken(token);
    if (!j || !j->contains("g") || !(*j)["g"].is_string()) return Status::InvalidArgument(kBadToken);
    after = (*j)["g"].get<std::string>();
  }
  MutexLock lock(mutex_);
  // A keyset range of the name index: after the token, and within [prefix, PrefixEnd(prefix))
  // (the substr test stays the definition of the prefix; the bounds let the index skip the rest).
  const std::optional<std::string> end = PrefixEnd(prefix);
  ASSIGN_OR_RETURN(auto st,
                   options_.database->Prepare(
                       std::string("SELECT g.name, g.created_millis, "
                                   "(SELECT coalesce(sum(stored_bytes), 0) FROM log_streams s "
                                   "WHERE s.group_name = g.name) "
                                   "FROM log_groups g WHERE substr(g.name, 1, length(?2)) = ?2") +
                       // Only the tighter lower bound (SQLite ranges the index on one of them).
                       (after >= prefix ? " AND g.name > ?1" : " AND g.name >= ?2") + (end ? " AND g.name < ?5" : "") +
                       " AND (?3 = '' OR instr(lower(g.name), lower(?3)) > 0) ORDER BY g.name LIMIT ?4"));
  st.BindText(1, after).BindText(2, prefix).BindText(3, pattern).BindInt64(4, limit + 1);
  if (end) st.BindText(5, *end);
  GroupPage page;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    page.groups.push_back({st.ColumnText(0), st.ColumnInt64(1), st.ColumnInt64(2)});
  }
  if (page.groups.size() > static_cast<size_t>(limit)) {
    page.groups.resize(limit);
    page.next_token = EncodeToken({{"g", page.groups.back().name}});
  }
  return page;
}

Result<StreamPage> LogStore::ListStreams(const std::string& group, const std::string& prefix, StreamOrder order,
                                         bool descending, int limit, const std::string& token) {
  if (!prefix.empty() && order == StreamOrder::kLastEventTime) {
    return Status::InvalidArgument("Cannot order by LastEventTime with a logStreamNamePrefix.");
  }
  // The token is the sort key (k, name) of the last stream returned; the next page starts after
  // it. k is the last event time (0 for a stream without events) ordering by LastEventTime, and
  // always 0 ordering by name.
  std::optional<std::pair<int64_t, std::string>> after;
  if (!token.empty()) {
    auto j = DecodeToken(token);
    if (!j || !j->contains("k") || !j->contains("n") || !(*j)["k"].is_number_integer() || !(*j)["n"].is_string()) {
      return Status::InvalidArgument(kBadToken);
    }
    after.emplace((*j)["k"].get<int64_t>(), (*j)["n"].get<std::string>());
  }
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  // Keyset pages: each query below is one range of an index (UNIQUE (group_name, name), or
  // log_streams_by_last_event) read for at most limit + 1 rows, so a page costs the same however
  // many streams the group holds. The extra row only says whether there is a next page.
  StreamPage page;
  const size_t want = static_cast<size_t>(limit) + 1;
  auto run = [&](const std::string& where, const std::string& order_by,
                 const std::function<void(store::Statement&)>& bind) -> Status {
    if (page.streams.size() >= want) return Status::Ok();
    ASSIGN_OR_RETURN(auto st,
                     options_.database->Prepare("SELECT name, created_millis, first_event_millis, last_event_millis, "
                                                "last_ingestion_millis, stored_bytes, event_count FROM log_streams "
                                                "WHERE group_name = ?1" +
                                                where + " ORDER BY " + order_by + " LIMIT ?9"));
    st.BindText(1, group).BindInt64(9, static_cast<int64_t>(want - page.streams.size()));
    bind(st);
    for (;;) {
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      StreamInfo info;
      info.name = st.ColumnText(0);
      info.creation_time = st.ColumnInt64(1);
      if (!st.IsNull(2)) info.first_event_timestamp = st.ColumnInt64(2);
      if (!st.IsNull(3)) info.last_event_timestamp = st.ColumnInt64(3);
      if (!st.IsNull(4)) info.last_ingestion_time = st.ColumnInt64(4);
      info.stored_bytes = st.ColumnInt64(5);
      info.event_count = st.ColumnInt64(6);
      page.streams.push_back(std::move(info));
    }
    return Status::Ok();
  };
  const char* dir = descending ? " DESC" : "";
  const char* past = descending ? " < " : " > ";  // after the token in the page order
  if (order == StreamOrder::kLogStreamName) {
    // Every key here is (0, name): a token with another k lies before or after all of them.
    if (after && after->first != 0 && (descending ? after->first < 0 : after->first > 0)) return page;
    const bool by_name = after && after->first == 0;
    // Names starting with the prefix (byte order, BINARY collation) lie in [prefix, end): the
    // bounds make the prefix an index range; the substr test stays the definition.
    // Only the tighter of two bounds on the same side is written: SQLite ranges the index on one
    // of them, and the other would leave it scanning from the prefix to the token.
    std::optional<std::string> end = PrefixEnd(prefix);
    bool lower_is_token = by_name && !descending && after->second >= prefix;
    bool upper_is_token = by_name && descending && (!end || after->second <= *end);
    std::string where = " AND substr(name, 1, length(?2)) = ?2";
    where += lower_is_token ? " AND name > ?4" : " AND name >= ?2";
    if (upper_is_token) {
      where += " AND name < ?4";
    } else if (end) {
      where += " AND name < ?3";
    }
    RETURN_IF_ERROR(run(where, std::string("name") + dir, [&](store::Statement& st) {
      st.BindText(2, prefix);
      if (end) st.BindText(3, *end);
      if (by_name) st.BindText(4, after->second);
    }));
  } else {
    // The expression must match log_streams_by_last_event's for the index to serve it. The rest
    // of the token's own k comes first (names after the token's), then the later k's; two ranges,
    // since SQLite does not range-scan a row-value comparison over an expression.
    const std::string k = "coalesce(last_event_millis, 0)";
    if (after) {
      RETURN_IF_ERROR(run(" AND " + k + " = ?5 AND name" + past + "?4", std::string("name") + dir,
                          [&](store::Statement& st) { st.BindInt64(5, after->first).BindText(4, after->second); }));
    }
    RETURN_IF_ERROR(
        run(after ? " AND " + k + past + "?5" : std::string(), k + dir + ", name" + dir, [&](store::Statement& st) {
          if (after) st.BindInt64(5, after->first);
        }));
  }
  if (page.streams.size() > static_cast<size_t>(limit)) {
    page.streams.resize(limit);
    const StreamInfo& last = page.streams.back();
    int64_t k = order == StreamOrder::kLastEventTime ? last.last_event_timestamp.value_or(0) : 0;
    page.next_token = EncodeToken({{"k", k}, {"n", last.name}});
  }
  return page;
}

Result<StreamInfo> LogStore::GetStream(const std::string& group, const std::string& stream) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  return row.info;
}

Result<EventsPage> LogStore::GetEvents(const std::string& group, const std::string& stream, const EventsQuery& query) {
  if (query.limit && (*query.limit < 1 || *query.limit > kMaxEventsLimit)) {
    return Status::InvalidArgument("limit must be between 1 and 10000");
  }
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  char direction = query.start_from_head ? 'f' : 'b';
  std::optional<size_t> position;
  if (!query.token.empty()) RETURN_IF_ERROR(DecodeEventsToken(query.token, row.id, &direction, &position));
  ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(row.id));
  const uint64_t n = file->count;
  if (position && *position > n) return Status::InvalidArgument(kBadToken);
  const size_t max_events = query.limit ? static_cast<size_t>(*query.limit) : static_cast<size_t>(kMaxEventsLimit);
  const bool byte_bound = !query.limit;
  // Events are visited one at a time from the position in the page's direction; out-of-range
  // events are passed over, the page ends at max_events or (without a limit) 1 MB.
  std::vector<OutputEvent> picked;
  uint64_t first_pick = 0, last_pick = 0;
  size_t bytes = 0;
  auto take = [&](const RecordHeader& h, uint64_t seq, RecordReader& reader) -> Result<bool> {
    if (!InRange(h.ts, query.start_time, query.end_time)) return true;
    if (picked.size() >= max_events) return false;
    size_t b = h.len + kEventOverheadBytes;
    if (byte_bound && !picked.empty() && bytes + b > kDefaultPageBytes) return false;
    bytes += b;
    ASSIGN_OR_RETURN(std::string message, reader.Message(h));
    if (picked.empty()) first_pick = last_pick = seq;
    first_pick = std::min(first_pick, seq);
    last_pick = std::max(last_pick, seq);
    picked.push_back({h.ts, h.ingestion, std::move(message)});
    return true;
  };
  const uint64_t last_block = n == 0 ? 0 : (n - 1) / kBlockEvents;
  bool full = false;
  if (direction == 'f') {
    uint64_t i = position.value_or(0);
    if (file->sorted && query.start_time && i < n) {
      // Timestamps never decrease: blocks that end before start_time hold nothing in range.
      ASSIGN_OR_RETURN(uint64_t k, FirstBlockWhere(file, i / kBlockEvents, last_block,
                                                   [&](const Block& b) { return b.max_ts >= *query.start_time; }));
      i = std::max(i, std::min(n, k * kBlockEvents));
    }
    while (i < n && !full) {
      ASSIGN_OR_RETURN(Block block, GetBlock(file, i / kBlockEvents));
      if (Disjoint(block, query.start_time, query.end_time)) {
        if (file->sorted && query.end_time && block.min_ts >= *query.end_time) break;  // so is everything later
        i = block.end_seq;
        continue;
      }
      RecordReader reader(file->fd.get(), block.begin, block.end);
      RETURN_IF_ERROR(VisitRecords(reader, block.first_seq, block.end_seq,
                                   [&](const RecordHeader& h, uint64_t seq) -> Result<bool> {
                                     if (seq < i) return true;
                                     ASSIGN_OR_RETURN(bool more, take(h, seq, reader));
                                     full = !more;
                                     return more;
                                   }));
      i = block.end_seq;
    }
  } else {
    uint64_t i = position.value_or(n);  // events before i, newest first
    if (file->sorted && query.end_time && i > 0) {
      // Blocks that start at or after end_time hold nothing in range.
      ASSIGN_OR_RETURN(uint64_t k, FirstBlockWhere(file, 0, (i - 1) / kBlockEvents,
                                                   [&](const Block& b) { return b.min_ts >= *query.end_time; }));
      i = std::min(i, k * kBlockEvents);
    }
    std::vector<RecordHeader> headers;
    while (i > 0 && !full) {
      ASSIGN_OR_RETURN(Block block, GetBlock(file, (i - 1) / kBlockEvents));
      if (Disjoint(block, query.start_time, query.end_time)) {
        if (file->sorted && query.start_time && block.max_ts < *query.start_time) break;
        i = block.first_seq;
        continue;
      }
      RecordReader reader(file->fd.get(), block.begin, block.end);
      headers.clear();
      RETURN_IF_ERROR(VisitRecords(reader, block.first_seq, i, [&](const RecordHeader& h, uint64_t) -> Result<bool> {
        headers.push_back(h);
        return true;
      }));
      for (size_t j = headers.size(); j > 0 && !full; --j) {
        ASSIGN_OR_RETURN(bool more, take(headers[j - 1], block.first_seq + j - 1, reader));
        full = !more;
      }
      i = block.first_seq;
    }
    std::reverse(picked.begin(), picked.end());
  }
  EventsPage page;
  if (picked.empty()) {
    // Nothing here: the token that was sent comes back unchanged (the end-of-stream rule), and
    // the other direction turns around at the same position.
    uint64_t p = position.value_or(direction == 'f' ? 0 : n);
    if (!position && !query.start_from_head) p = 0;  // an empty tail page: newer events start at 0
    page.next_forward_token = PositionToken('f', row.id, p);
    page.next_backward_token = PositionToken('b', row.id, p);
    if (!query.token.empty()) (direction == 'f' ? page.next_forward_token : page.next_backward_token) = query.token;
    return page;
  }
  page.events = std::move(picked);
  page.next_forward_token = PositionToken('f', row.id, last_pick + 1);
  page.next_backward_token = PositionToken('b', row.id, first_pick);
  return page;
}

Result<FilterPage> LogStore::Filter(const std::string& group, const FilterQuery& query) {
  if (!query.stream_names.empty() && !query.stream_name_prefix.empty()) {
    return Status::InvalidArgument("logStreamNames and logStreamNamePrefix are mutually exclusive parameters.");
  }
  if (query.limit && (*query.limit < 1 || *query.limit > kMaxEventsLimit)) {
    return Status::InvalidArgument("limit must be between 1 and 10000");
  }
  // The token is the sort key (timestamp, stream name, sequence) of the last event examined.
  std::optional<FilterBound> after;
  if (!query.token.empty()) {
    auto j = DecodeToken(query.token);
    if (!j || !j->contains("t") || !j->contains("n") || !j->contains("q") || !(*j)["t"].is_number_integer() ||
        !(*j)["n"].is_string() || !(*j)["q"].is_number_unsigned()) {
      return Status::InvalidArgument(kBadToken);
    }
    after = FilterBound{(*j)["t"].get<int64_t>(), (*j)["n"].get<std::string>(), (*j)["q"].get<uint64_t>()};
  }
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  std::vector<FilterStream> streams;  // by name
  {
    ASSIGN_OR_RETURN(auto st, options_.database->Prepare(
                                  "SELECT name, id, first_event_millis, last_event_millis FROM log_streams "
                                  "WHERE group_name = ?1 AND substr(name, 1, length(?2)) = ?2 ORDER BY name"));
    st.BindText(1, group).BindText(2, query.stream_name_prefix);
    for (;;) {
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      FilterStream fs;
      fs.name = st.ColumnText(0);
      if (!query.stream_names.empty() &&
          std::find(query.stream_names.begin(), query.stream_names.end(), fs.name) == query.stream_names.end()) {
        continue;
      }
      fs.id = st.ColumnText(1);
      if (!st.IsNull(2)) fs.first_event = st.ColumnInt64(2);
      if (!st.IsNull(3)) fs.last_event = st.ColumnInt64(3);
      streams.push_back(std::move(fs));
    }
  }
  FilterPage page;
  for (const FilterStream& fs : streams) page.searched_streams.push_back(fs.name);
  // Candidates (events in the time range after the token) are examined in key order, taken from
  // the streams a chunk at a time so that memory stays bounded however long the streams are.
  const size_t max_events = query.limit ? static_cast<size_t>(*query.limit) : static_cast<size_t>(kMaxEventsLimit);
  size_t bytes = 0;
  size_t scanned = 0;
  std::optional<Candidate> prev;  // the last candidate examined
  auto token_after_prev = [&] {
    return EncodeToken({{"t", prev->ts}, {"n", streams[prev->stream].name}, {"q", prev->seq}});
  };
  std::optional<FilterBound> bound = after;
  for (;;) {
    ASSIGN_OR_RETURN(std::vector<Candidate> chunk, FilterChunk(streams, query, bound, kFilterChunk));
    for (const Candidate& c : chunk) {
      if (page.events.size() >= max_events || scanned >= kMaxFilterScan) {
        page.next_token = token_after_prev();
        return page;
      }
      ++scanned;
      ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(streams[c.stream].id));
      std::string message(c.len, '\0');
      RETURN_IF_ERROR(PreadAll(file->fd.get(), message.data(), c.len, c.offset + kHeaderBytes, "log event file"));
      if (!MatchesFilterPattern(query.pattern, message)) {
        prev = c;
        continue;
      }
      size_t b = message.size() + kEventOverheadBytes;
      if (!query.limit && !page.events.empty() && bytes + b > kDefaultPageBytes) {
        page.next_token = token_after_prev();
        return page;
      }
      bytes += b;
      FilteredEvent f;
      f.stream_name = streams[c.stream].name;
      f.timestamp = c.ts;
      f.ingestion_time = c.ingestion;
      f.message = std::move(message);
      f.event_id = std::to_string(c.ts) + streams[c.stream].id.substr(0, 8) + std::to_string(c.seq);
      page.events.push_back(std::move(f));
      prev = c;
    }
    if (chunk.size() < kFilterChunk) return page;  // that was every candidate
    bound = FilterBound{chunk.back().ts, streams[chunk.back().stream].name, chunk.back().seq};
  }
}

// One pass over the streams keeps the `limit` smallest candidates in a max-heap. A stream whose
// timestamps never decreased is entered by binary search and left at the first event past the
// heap's largest key (or the end of the range); any other stream is scanned block by block,
// passing over blocks whose timestamps cannot qualify.
Result<std::vector<LogStore::Candidate>> LogStore::FilterChunk(const std::vector<FilterStream>& streams,
                                                               const FilterQuery& query,
                                                               const std::optional<FilterBound>& bound, size_t limit) {
  auto less = [](const Candidate& a, const Candidate& b) {
    return std::tie(a.ts, a.stream, a.seq) < std::tie(b.ts, b.stream, b.seq);
  };
  std::vector<Candidate> heap;  // max-heap under `less`
  std::optional<int64_t> lo = query.start_time;
  if (bound) lo = lo ? std::max(*lo, bound->ts) : bound->ts;
  for (size_t s = 0; s < streams.size(); ++s) {
    const FilterStream& fs = streams[s];
    if (!fs.first_event || !fs.last_event) continue;  // no events
    if ((lo && *fs.last_event < *lo) || (query.end_time && *fs.first_event >= *query.end_time)) continue;
    if (heap.size() >= limit && *fs.first_event > heap.front().ts) continue;
    // After the bound: a later timestamp, or the same one in a later stream, or the same stream later.
    const int name_vs_bound = bound ? fs.name.compare(bound->stream_name) : 0;
    auto after_bound = [&](int64_t ts, uint64_t seq) {
      if (!bound || ts != bound->ts) return !bound || ts > bound->ts;
      return name_vs_bound > 0 || (name_vs_bound == 0 && seq > bound->seq);
    };
    ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(fs.id));
    if (file->count == 0) continue;
    const uint64_t last_block = (file->count - 1) / kBlockEvents;
    uint64_t k = 0;
    if (file->sorted && bound && name_vs_bound == 0) {
      // The bound's own stream: ordered, so everything after the bound has a greater sequence.
      k = std::min(bound->seq / kBlockEvents, last_block);
    }
    if (file->sorted && lo) {
      // A stream named before the bound's needs a later timestamp than the bound's.
      const bool strictly = bound && name_vs_bound < 0 && *lo == bound->ts;
      ASSIGN_OR_RETURN(k, FirstBlockWhere(file, k, last_block,
                                          [&](const Block& b) { return strictly ? b.max_ts > *lo : b.max_ts >= *lo; }));
    }
    bool done = false;
    for (; k <= last_block && !done; ++k) {
      ASSIGN_OR_RETURN(Block block, GetBlock(file, k));
      const bool full = heap.size() >= limit;
      if (Disjoint(block, lo, query.end_time) || (full && block.min_ts > heap.front().ts)) {
        if (file->sorted && !Disjoint(block, lo, std::nullopt)) break;  // later blocks start later still
        continue;
      }
      RecordReader reader(file->fd.get(), block.begin, block.end);
      RETURN_IF_ERROR(VisitRecords(reader, block.first_seq, block.end_seq,
                                   [&](const RecordHeader& h, uint64_t seq) -> Result<bool> {
                                     if (!InRange(h.ts, query.start_time, query.end_time) || !after_bound(h.ts, seq)) {
                                       done = file->sorted && query.end_time && h.ts >= *query.end_time;
                                       return !done;
                                     }
                                     Candidate c{h.ts, static_cast<uint32_t>(s), h.len, seq, h.offset, h.ingestion};
                                     if (heap.size() >= limit) {
                                       if (!less(c, heap.front())) {
                                         done = file->sorted;  // keys only grow from here in this stream
                                         return !done;
                                       }
                                       std::pop_heap(heap.begin(), heap.end(), less);
                                       heap.back() = c;
                                     } else {
                                       heap.push_back(c);
                                     }
                                     std::push_heap(heap.begin(), heap.end(), less);
                                     return true;
                                   }));
    }
  }
  std::sort_heap(heap.begin(), heap.end(), less);
  return heap;
}

}  // namespace kiln::observe
