#pragma once
// LogStore: Kiln's CloudWatch Logs data (spec/control-plane-api.md §11). Groups and streams are
// rows in the database (metadata only); each stream's events live in one append-only file under
// `root`, named by the stream's internal id (never its name, which may hold any character but
// ':' and '*'). A record is: u32 message length, i64 timestamp ms, i64 ingestion ms (all little
// endian), then the message bytes.
//
// Memory does not grow with stream length. Beside each event file, `<id>.index` holds one 32-byte
// entry per block of 64 events (the block's first record offset, its min and max timestamp, and
// whether every timestamp so far has been non-decreasing), appended after the events are synced;
// it is derived data, checked on open and rebuilt from the event file when missing, short or
// corrupt. In memory a stream is a constant-size handle (counts, the partial last block), and at
// most Options::max_open_streams handles (two file descriptors each) are kept, least recently
// used evicted. A read seeks to its block through the index and scans at most one block before
// its first event; time bounds skip whole blocks by their min/max (binary search when the stream's
// timestamps never decreased, the common case for container output).
//
// Events are kept in append order: each PutLogEvents batch is sorted by timestamp (validated),
// but batches may interleave in time. Positions in GetEvents tokens are event indexes in that
// order, so an event appended later is always past every existing forward token.
//
// Errors: NotFound with "The specified log group does not exist." / "The specified log stream
// does not exist.", AlreadyExists with "The specified log group already exists" / "The specified
// log stream already exists", InvalidArgument for bad parameters (unsorted batch, oversized
// message or batch, malformed token), DataLoss when an index entry turns out corrupt (the index is
// then rebuilt on the next call), others (I/O, database) as their Status.
//
// Thread-safety: every method may be called from any thread; one mutex serialises them.

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
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
    // Stream handles kept open (two descriptors and ~150 bytes each). Fewer costs a reopen (a
    // read of the last index entry and a scan of at most two blocks) when more streams than
    // this are read or written in turn.
    size_t max_open_streams = 64;
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

  // What the store holds in memory for streams: open handles and their bytes (the handle, its id;
  // no per-event or per-block state). Independent of how many events the streams hold.
  struct MemoryStats {
    size_t open_streams = 0;
    size_t index_bytes = 0;
  };
  MemoryStats TEST_MemoryStats();

 private:
  struct StreamFile;
  struct Block;
  struct Candidate;
  struct FilterBound;
  struct StreamRow {
    std::string id;
    StreamInfo info;
  };
  struct FilterStream {
    std::string name;
    std::string id;
    std::optional<int64_t> first_event;  // from the stream's row: min and max timestamp
    std::optional<int64_t> last_event;
  };

  explicit LogStore(Options options);
  Status CheckGroup(const std::string& group);
  Result<StreamRow> FindStream(const std::string& group, const std::string& stream);
  // The stream's handle, opened (and its index checked or rebuilt) if not cached. The pointer is
  // valid until the next OpenStreamFile or DropStreamFile call (either may evict it); the handle,
  // like files_, is only used under mutex_ (a nested struct cannot name it in GUARDED_BY).
  Result<StreamFile*> OpenStreamFile(const std::string& id) REQUIRES(mutex_);
  Status LoadIndex(StreamFile* file) REQUIRES(mutex_);
  // Block k of the stream (k <= (count - 1) / 64); the last block may be the partial one.
  Result<Block> GetBlock(StreamFile* file, uint64_t k) REQUIRES(mutex_);
  // The smallest k in [lo, hi] for which pred(block k) holds, for a predicate that is false then
  // true over the blocks (hi + 1 when it never holds).
  template <typename Pred>
  Result<uint64_t> FirstBlockWhere(StreamFile* file, uint64_t lo, uint64_t hi, Pred pred) REQUIRES(mutex_);
  // The `limit` smallest candidates of a Filter (timestamp, stream, sequence) after `bound`.
  Result<std::vector<Candidate>> FilterChunk(const std::vector<FilterStream>& streams, const FilterQuery& query,
                                             const std::optional<FilterBound>& bound, size_t limit) REQUIRES(mutex_);
  std::string FilePath(const std::string& id) const;
  std::string IndexPath(const std::string& id) const;
  void DropStreamFile(const std::string& id) REQUIRES(mutex_);
  int64_t Now() const;

  Options options_;
  Mutex mutex_;
  // Open stream handles by stream id, and their ids most recently used first.
  std::map<std::string, std::unique_ptr<StreamFile>> files_ GUARDED_BY(mutex_);
  std::list<std::string> lru_ GUARDED_BY(mutex_);
};

}  // namespace kiln::observe
