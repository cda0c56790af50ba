#include "observe/log_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "base/encoding.h"
#include "base/fs.h"
#include "base/ids.h"

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

struct LogStore::StreamFile {
  UniqueFd fd;
  std::vector<IndexEntry> index;
  uint64_t size = 0;               // bytes of whole records; a torn tail past it is cut off at load
  std::vector<int64_t> ingestion;  // per event, parallel to index
};

Result<std::unique_ptr<LogStore>> LogStore::Open(Options options) {
  if (options.database == nullptr) return Status::InvalidArgument("LogStore needs a database");
  RETURN_IF_ERROR(MakeDirs(options.root, 0700).WithPrefix("log dir"));
  return std::unique_ptr<LogStore>(new LogStore(std::move(options)));
}

LogStore::LogStore(Options options) : options_(std::move(options)) {}
LogStore::~LogStore() = default;

int64_t LogStore::Now() const { return (options_.clock ? *options_.clock : Clock::System()).NowMillis(); }

std::string LogStore::FilePath(const std::string& id) const { return options_.root + "/" + id + ".events"; }

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

Result<LogStore::StreamFile*> LogStore::OpenStreamFile(const std::string& id) {
  auto it = files_.find(id);
  if (it != files_.end()) return it->second.get();
  auto file = std::make_unique<StreamFile>();
  std::string path = FilePath(id);
  file->fd = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!file->fd.valid()) return ErrnoStatus("open " + path, errno);
  // Build the index with buffered reads; a record cut short by a crash ends the file.
  std::string buf;
  uint64_t buf_start = 0;
  uint64_t offset = 0;
  for (;;) {
    // Make sure [offset, offset + need) is in buf.
    auto ensure = [&](size_t need) -> Result<bool> {
      while (offset + need > buf_start + buf.size()) {
        size_t keep_from = static_cast<size_t>(offset - buf_start);
        buf.erase(0, keep_from);
        buf_start = offset;
        size_t old = buf.size();
        size_t want = std::max<size_t>(need, 1 << 20);
        buf.resize(old + want);
        ASSIGN_OR_RETURN(size_t n, PreadSome(file->fd.get(), buf.data() + old, want, buf_start + old));
        buf.resize(old + n);
        if (n == 0) return false;
      }
      return true;
    };
    ASSIGN_OR_RETURN(bool have_header, ensure(kHeaderBytes));
    if (!have_header) break;
    const char* h = buf.data() + (offset - buf_start);
    uint64_t len = GetLe(h, 4);
    int64_t ts = static_cast<int64_t>(GetLe(h + 4, 8));
    int64_t ingestion = static_cast<int64_t>(GetLe(h + 12, 8));
    ASSIGN_OR_RETURN(bool have_body, ensure(kHeaderBytes + len));
    if (!have_body) break;
    file->index.push_back({ts, offset});
    file->ingestion.push_back(ingestion);
    offset += kHeaderBytes + len;
  }
  file->size = offset;
  if (::ftruncate(file->fd.get(), static_cast<off_t>(offset)) != 0) return ErrnoStatus("truncate " + path, errno);
  StreamFile* raw = file.get();
  files_.emplace(id, std::move(file));
  return raw;
}

void LogStore::DropStreamFile(const std::string& id) {
  files_.erase(id);
  ::unlink(FilePath(id).c_str());
}

Result<std::vector<OutputEvent>> LogStore::ReadRange(StreamFile* file, size_t first, size_t last) {
  std::vector<OutputEvent> out;
  if (first >= last) return out;
  uint64_t begin = file->index[first].offset;
  uint64_t end = last < file->index.size() ? file->index[last].offset : file->size;
  std::string buf(end - begin, '\0');
  size_t got = 0;
  while (got < buf.size()) {
    ASSIGN_OR_RETURN(size_t n, PreadSome(file->fd.get(), buf.data() + got, buf.size() - got, begin + got));
    if (n == 0) return Status::DataLoss("log event file is shorter than its index");
    got += n;
  }
  out.reserve(last - first);
  for (size_t i = first; i < last; ++i) {
    const char* h = buf.data() + (file->index[i].offset - begin);
    uint64_t len = GetLe(h, 4);
    OutputEvent e;
    e.timestamp = static_cast<int64_t>(GetLe(h + 4, 8));
    e.ingestion_time = static_cast<int64_t>(GetLe(h + 12, 8));
    e.message.assign(h + kHeaderBytes, len);
    out.push_back(std::move(e));
  }
  return out;
}

Status LogStore::CreateGroup(const std::string& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare("INSERT INTO log_groups(name, created_millis) VALUES (?, ?)"));
  st.BindText(1, group).BindInt64(2, Now());
  Status s = st.Run();
  if (s.IsAlreadyExists()) return Status::AlreadyExists("The specified log group already exists");
  return s;
}

Status LogStore::DeleteGroup(const std::string& group) {
  std::lock_guard<std::mutex> lock(mutex_);
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
  std::lock_guard<std::mutex> lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  ASSIGN_OR_RETURN(auto st, options_.database->Prepare(
                                "INSERT INTO log_streams(id, group_name, name, created_millis) VALUES (?, ?, ?, ?)"));
  st.BindText(1, RandomHex(16)).BindText(2, group).BindText(3, stream).BindInt64(4, Now());
  Status s = st.Run();
  if (s.IsAlreadyExists()) return Status::AlreadyExists("The specified log stream already exists");
  return s;
}

Status LogStore::DeleteStream(const std::string& group, const std::string& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
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

  std::lock_guard<std::mutex> lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(row.id));
  int64_t now = Now();
  std::string buf;
  buf.reserve(total);
  std::vector<IndexEntry> added;
  uint64_t offset = file->size;
  int64_t bytes = 0;
  for (const InputEvent& e : events) {
    added.push_back({e.timestamp, offset + buf.size()});
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
  file->size = offset + buf.size();
  for (const IndexEntry& entry : added) {
    file->index.push_back(entry);
    file->ingestion.push_back(now);
  }
  int64_t count = static_cast<int64_t>(file->index.size());
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
  std::lock_guard<std::mutex> lock(mutex_);
  ASSIGN_OR_RETURN(auto st,
                   options_.database->Prepare(
                       "SELECT g.name, g.created_millis, "
                       "(SELECT coalesce(sum(stored_bytes), 0) FROM log_streams s WHERE s.group_name = g.name) "
                       "FROM log_groups g WHERE g.name > ?1 AND substr(g.name, 1, length(?2)) = ?2 "
                       "AND (?3 = '' OR instr(lower(g.name), lower(?3)) > 0) ORDER BY g.name LIMIT ?4"));
  st.BindText(1, after).BindText(2, prefix).BindText(3, pattern).BindInt64(4, limit + 1);
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
  // The token is the sort key of the last stream returned; the next page starts after it.
  std::optional<std::pair<int64_t, std::string>> after;
  if (!token.empty()) {
    auto j = DecodeToken(token);
    if (!j || !j->contains("k") || !j->contains("n") || !(*j)["k"].is_number_integer() || !(*j)["n"].is_string()) {
      return Status::InvalidArgument(kBadToken);
    }
    after.emplace((*j)["k"].get<int64_t>(), (*j)["n"].get<std::string>());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  ASSIGN_OR_RETURN(auto st,
                   options_.database->Prepare("SELECT name, created_millis, first_event_millis, last_event_millis, "
                                              "last_ingestion_millis, stored_bytes, event_count FROM log_streams "
                                              "WHERE group_name = ?1 AND substr(name, 1, length(?2)) = ?2"));
  st.BindText(1, group).BindText(2, prefix);
  std::vector<StreamInfo> all;
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
    all.push_back(std::move(info));
  }
  auto key = [&](const StreamInfo& s) {
    int64_t k = order == StreamOrder::kLastEventTime ? s.last_event_timestamp.value_or(0) : 0;
    return std::make_pair(k, s.name);
  };
  std::sort(all.begin(), all.end(),
            [&](const StreamInfo& a, const StreamInfo& b) { return descending ? key(b) < key(a) : key(a) < key(b); });
  StreamPage page;
  for (const StreamInfo& s : all) {
    if (after && (descending ? !(key(s) < *after) : !(*after < key(s)))) continue;
    if (page.streams.size() == static_cast<size_t>(limit)) {
      auto k = key(page.streams.back());
      page.next_token = EncodeToken({{"k", k.first}, {"n", k.second}});
      break;
    }
    page.streams.push_back(s);
  }
  return page;
}

Result<StreamInfo> LogStore::GetStream(const std::string& group, const std::string& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  return row.info;
}

Result<EventsPage> LogStore::GetEvents(const std::string& group, const std::string& stream, const EventsQuery& query) {
  if (query.limit && (*query.limit < 1 || *query.limit > kMaxEventsLimit)) {
    return Status::InvalidArgument("limit must be between 1 and 10000");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ASSIGN_OR_RETURN(StreamRow row, FindStream(group, stream));
  // Decode the token: direction and position (an event index in append order).
  char direction = query.start_from_head ? 'f' : 'b';
  std::optional<size_t> position;
  if (!query.token.empty()) {
    if (query.token.size() < 3 || (query.token[0] != 'f' && query.token[0] != 'b') || query.token[1] != '/') {
      return Status::InvalidArgument(kBadToken);
    }
    auto j = DecodeToken(std::string_view(query.token).substr(2));
    if (!j || !j->contains("s") || !j->contains("p") || !j->contains("d") || !(*j)["s"].is_string() ||
        !(*j)["p"].is_number_unsigned() || !(*j)["d"].is_string() ||
        (*j)["d"].get<std::string>() != std::string(1, query.token[0])) {
      return Status::InvalidArgument(kBadToken);
    }
    if ((*j)["s"].get<std::string>() != row.id) return Status::InvalidArgument(kBadToken);
    direction = query.token[0];
    position = (*j)["p"].get<size_t>();
  }
  ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(row.id));
  const size_t n = file->index.size();
  if (position && *position > n) return Status::InvalidArgument(kBadToken);
  const size_t max_events = query.limit ? static_cast<size_t>(*query.limit) : static_cast<size_t>(kMaxEventsLimit);
  const bool byte_bound = !query.limit;
  auto event_bytes = [&](size_t i) {
    uint64_t end = i + 1 < n ? file->index[i + 1].offset : file->size;
    return end - file->index[i].offset - kHeaderBytes + kEventOverheadBytes;
  };
  std::vector<size_t> picked;
  size_t bytes = 0;
  auto take = [&](size_t i) {
    if (!InRange(file->index[i].timestamp, query.start_time, query.end_time)) return true;
    if (picked.size() >= max_events) return false;
    size_t b = event_bytes(i);
    if (byte_bound && !picked.empty() && bytes + b > kDefaultPageBytes) return false;
    bytes += b;
    picked.push_back(i);
    return true;
  };
  if (direction == 'f') {
    for (size_t i = position.value_or(0); i < n && take(i); ++i) {
    }
  } else {
    for (size_t i = position.value_or(n); i > 0 && take(i - 1); --i) {
    }
    std::reverse(picked.begin(), picked.end());
  }
  EventsPage page;
  if (picked.empty()) {
    // Nothing here: the token that was sent comes back unchanged (the end-of-stream rule), and
    // the other direction turns around at the same position.
    size_t p = position.value_or(direction == 'f' ? 0 : n);
    if (!position && !query.start_from_head) p = 0;  // an empty tail page: newer events start at 0
    page.next_forward_token = PositionToken('f', row.id, p);
    page.next_backward_token = PositionToken('b', row.id, p);
    if (!query.token.empty()) (direction == 'f' ? page.next_forward_token : page.next_backward_token) = query.token;
    return page;
  }
  // Index runs of picked events are read with one pread each.
  for (size_t k = 0; k < picked.size();) {
    size_t run_end = k + 1;
    while (run_end < picked.size() && picked[run_end] == picked[run_end - 1] + 1) ++run_end;
    ASSIGN_OR_RETURN(auto events, ReadRange(file, picked[k], picked[run_end - 1] + 1));
    for (auto& e : events) page.events.push_back(std::move(e));
    k = run_end;
  }
  page.next_forward_token = PositionToken('f', row.id, picked.back() + 1);
  page.next_backward_token = PositionToken('b', row.id, picked.front());
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
  std::optional<std::tuple<int64_t, std::string, size_t>> after;
  if (!query.token.empty()) {
    auto j = DecodeToken(query.token);
    if (!j || !j->contains("t") || !j->contains("n") || !j->contains("q") || !(*j)["t"].is_number_integer() ||
        !(*j)["n"].is_string() || !(*j)["q"].is_number_unsigned()) {
      return Status::InvalidArgument(kBadToken);
    }
    after.emplace((*j)["t"].get<int64_t>(), (*j)["n"].get<std::string>(), (*j)["q"].get<size_t>());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  RETURN_IF_ERROR(CheckGroup(group));
  std::vector<std::pair<std::string, std::string>> streams;  // (name, id), by name
  {
    ASSIGN_OR_RETURN(auto st, options_.database->Prepare("SELECT name, id FROM log_streams WHERE group_name = ?1 AND "
                                                         "substr(name, 1, length(?2)) = ?2 ORDER BY name"));
    st.BindText(1, group).BindText(2, query.stream_name_prefix);
    for (;;) {
      ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      std::string name = st.ColumnText(0);
      if (!query.stream_names.empty() &&
          std::find(query.stream_names.begin(), query.stream_names.end(), name) == query.stream_names.end()) {
        continue;
      }
      streams.emplace_back(std::move(name), st.ColumnText(1));
    }
  }
  struct Candidate {
    int64_t ts;
    size_t stream;  // index into streams (name order, so ties sort by name)
    size_t seq;
  };
  std::vector<Candidate> candidates;
  std::vector<StreamFile*> files;
  FilterPage page;
  for (size_t s = 0; s < streams.size(); ++s) {
    ASSIGN_OR_RETURN(StreamFile * file, OpenStreamFile(streams[s].second));
    files.push_back(file);
    page.searched_streams.push_back(streams[s].first);
    for (size_t i = 0; i < file->index.size(); ++i) {
      int64_t ts = file->index[i].timestamp;
      if (!InRange(ts, query.start_time, query.end_time)) continue;
      if (after && !(*after < std::make_tuple(ts, streams[s].first, i))) continue;
      candidates.push_back({ts, s, i});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.ts, a.stream, a.seq) < std::tie(b.ts, b.stream, b.seq);
  });
  const size_t max_events = query.limit ? static_cast<size_t>(*query.limit) : static_cast<size_t>(kMaxEventsLimit);
  size_t bytes = 0;
  size_t scanned = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const Candidate& c = candidates[k];
    bool full = page.events.size() >= max_events || scanned >= kMaxFilterScan;
    if (full) {
      const Candidate& last = candidates[k - 1];
      page.next_token = EncodeToken({{"t", last.ts}, {"n", streams[last.stream].first}, {"q", last.seq}});
      break;
    }
    ++scanned;
    ASSIGN_OR_RETURN(auto events, ReadRange(files[c.stream], c.seq, c.seq + 1));
    OutputEvent& e = events.front();
    if (!MatchesFilterPattern(query.pattern, e.message)) continue;
    size_t b = e.message.size() + kEventOverheadBytes;
    if (!query.limit && !page.events.empty() && bytes + b > kDefaultPageBytes) {
      const Candidate& last = candidates[k - 1];
      page.next_token = EncodeToken({{"t", last.ts}, {"n", streams[last.stream].first}, {"q", last.seq}});
      break;
    }
    bytes += b;
    FilteredEvent f;
    f.stream_name = streams[c.stream].first;
    f.timestamp = e.timestamp;
    f.ingestion_time = e.ingestion_time;
    f.message = std::move(e.message);
    f.event_id = std::to_string(c.ts) + streams[c.stream].second.substr(0, 8) + std::to_string(c.seq);
    page.events.push_back(std::move(f));
  }
  return page;
}

}  // namespace kiln::observe
