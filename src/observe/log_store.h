#pragma once
// LogStore: Kiln's CloudWatch Logs data (spec/control-plane-api.md §11). Groups and streams are
// rows in the database (metadata only); each stream's events live in one append-only file under
// `root`, named by the stream's internal id (never its name, which may hold any character but
// ':' and '*'). A record is: u32 message length, i64 timestamp ms, i64 ingestion ms (all little
// endian), then the message bytes. A per-stream index of (timestamp, offset) is built lazily on
// the first read or append, so a page read is one pread of a contiguous byte range.
//
// Events are kept in append order: each PutLogEvents batch is sorted by timestamp (validated),
// but batches may interleave in time. Positions in GetEvents tokens are event indexes in that
// order, so an event appended later is always past every existing forward token.
//
// Errors: NotFound with "The specified log group does not exist." / "The specified log stream
// does not exist.", AlreadyExists with "The specified log group already exists" / "The specified
// log stream already exists", InvalidArgument for bad parameters (unsorted batch, oversized
// message or batch, malformed token), others (I/O, database) as their Status.
//
// Thread-safety: every method may be called from any thread; one mutex serialises them.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/time.h"
#include "store/database.h"

namespace kiln::observe {

inline constexpr size_t kMaxEventMessageBytes = 256 * 1024;
inline constexpr size_t kMaxBatchBytes = 1048576;
inline constexpr size_t kMaxBatchEvents = 10000;
inline constexpr size_t kEventOverheadBytes = 26;  // AWS counts message bytes + 26 per event
inline constexpr int kMaxEventsLimit = 10000;

struct InputEvent {
  int64_t timestamp = 0;
  std::string message;
};

struct OutputEvent {
  int64_t timestamp = 0;
  int64_t ingestion_time = 0;
  std::string message;
};

struct GroupInfo {
  std::string name;
  int64_t creation_time = 0;
  int64_t stored_bytes = 0;
};

struct StreamInfo {
  std::string name;
  int64_t creation_time = 0;
  std::optional<int64_t> first_event_timestamp;
  std::optional<int64_t> last_event_timestamp;
  std::optional<int64_t> last_ingestion_time;
  int64_t stored_bytes = 0;
  int64_t event_count = 0;
};

struct GroupPage {
  std::vector<GroupInfo> groups;
  std::string next_token;  // empty: no more
};

struct StreamPage {
  std::vector<StreamInfo> streams;
  std::string next_token;  // empty: no more
};

struct EventsQuery {
  std::optional<int64_t> start_time;  // inclusive
  std::optional<int64_t> end_time;    // exclusive
  std::optional<int> limit;           // 1..10000; unset: as many as fit in 1 MB (cap 10,000)
  bool start_from_head = false;       // used only without a token
  std::string token;                  // "f/..." or "b/..." from an earlier page, or empty
};

struct EventsPage {
  std::vector<OutputEvent> events;  // oldest first
  std::string next_forward_token;   // "f/<opaque>", always set
  std::string next_backward_token;  // "b/<opaque>", always set
};

struct FilterQuery {
  std::vector<std::string> stream_names;  // exact names; mutually exclusive with the prefix
  std::string stream_name_prefix;
  std::optional<int64_t> start_time;  // inclusive
  std::optional<int64_t> end_time;    // exclusive
  std::string pattern;                // see MatchesFilterPattern
  std::optional<int> limit;           // 1..10000; unset: 10,000 or 1 MB
  std::string token;
};

struct FilteredEvent {
  std::string stream_name;
  int64_t timestamp = 0;
  int64_t ingestion_time = 0;
  std::string message;
  std::string event_id;
};

struct FilterPage {
  std::vector<FilteredEvent> events;  // timestamp order; ties by stream name, then sequence
  std::vector<std::string> searched_streams;
  std::string next_token;  // empty when the search is complete
};

enum class StreamOrder { kLogStreamName, kLastEventTime };

// filterPattern (Kiln subset): empty matches everything; whitespace-separated terms are all
// required substrings; "a quoted phrase" is one term; ?term terms are alternatives (at least one
// must match when any is given); -term terms must not occur. Case-sensitive, like CloudWatch.
bool MatchesFilterPattern(const std::string& pattern, const std::string& message);

class LogStore {
 public:
  struct Options {
    std::string root;                     // directory for event files; created if missing
    store::Database* database = nullptr;  // must outlive the store
    const Clock* clock = nullptr;         // nullptr: Clock::System()
  };
  static Result<std::unique_ptr<LogStore>> Open(Options options);
  ~LogStore();
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  Status CreateGroup(const std::string& group);
  // Deletes the group, its streams and their event files.
  Status DeleteGroup(const std::string& group);
  Status CreateStream(const std::string& group, const std::string& stream);
  Status DeleteStream(const std::string& group, const std::string& stream);

  // Appends a batch (1..10,000 events, sorted by timestamp, each message 1..256 KiB, at most
  // 1,048,576 bytes counting 26 per event, spanning at most 24 h). Returns the stream's event
  // count after the append (the basis of PutLogEvents' nextSequenceToken).
  Result<int64_t> Append(const std::string& group, const std::string& stream, const std::vector<InputEvent>& events);

  // Groups sorted by name. `prefix` and `pattern` (case-insensitive substring) are exclusive.
  Result<GroupPage> ListGroups(const std::string& prefix, const std::string& pattern, int limit,
                               const std::string& token);
  // `prefix` with kLastEventTime is InvalidArgument (as in AWS).
  Result<StreamPage> ListStreams(const std::string& group, const std::string& prefix, StreamOrder order,
                                 bool descending, int limit, const std::string& token);
  Result<StreamInfo> GetStream(const std::string& group, const std::string& stream);
  // GetLogEvents token rules, spec §11.
  Result<EventsPage> GetEvents(const std::string& group, const std::string& stream, const EventsQuery& query);
  Result<FilterPage> Filter(const std::string& group, const FilterQuery& query);

 private:
  struct IndexEntry {
    int64_t timestamp;
    uint64_t offset;  // of the record header
  };
  struct StreamFile;
  struct StreamRow {
    std::string id;
    StreamInfo info;
  };

  explicit LogStore(Options options);
  Status CheckGroup(const std::string& group);
  Result<StreamRow> FindStream(const std::string& group, const std::string& stream);
  Result<StreamFile*> OpenStreamFile(const std::string& id);
  Result<std::vector<OutputEvent>> ReadRange(StreamFile* file, size_t first, size_t last);
  std::string FilePath(const std::string& id) const;
  void DropStreamFile(const std::string& id);
  int64_t Now() const;

  Options options_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<StreamFile>> files_;  // by stream id; guarded by mutex_
};

}  // namespace kiln::observe
