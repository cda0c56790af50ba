#pragma once
// RemoteConnectionRepository: the remote-access audit (migration 10, spec remote-access.md R-26).
// One row per tunnel the daemon opened (access/tunnel_service.h): who (principal ARN, source
// address), what (resource ARN, canonical target), when (start, end), and what happened (bytes
// each way, the forwards the client asked for, exec exit statuses, why it closed). A row is
// inserted when the tunnel opens and completed by Close when it ends; a server that died with
// tunnels open leaves rows without an end (CloseOpen marks them at the next start).
//
// Thread-safe (the Database serialises access). The Database must outlive the repository.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "store/database.h"

namespace kiln::store {

struct RemoteConnectionRecord {
  std::string id;  // the connection id (X-Kiln-Connection-Id)
  std::string resource_arn;
  std::string target;  // canonical: training-job/<job>/algo-<n>
  std::string principal;
  std::string source_address;
  int64_t start_millis = 0;
  std::optional<int64_t> end_millis;  // unset while open
  uint64_t bytes_in = 0;              // client → instance
  uint64_t bytes_out = 0;             // instance → client
  std::vector<std::string> forwards;  // "direct-tcpip localhost:6006", "tcpip-forward 12345"
  std::vector<int> exit_statuses;     // of exec and shell requests, in order
  std::string close_reason;           // empty while open
};

class RemoteConnectionRepository {
 public:
  explicit RemoteConnectionRepository(Database* database) : database_(database) {}

  // Inserts an open connection (end, bytes, forwards, statuses and reason as given, normally
  // empty). AlreadyExists when the id is taken.
  Status Insert(const RemoteConnectionRecord& record);
  // Completes the row of `record.id` with its end, bytes, forwards, statuses and reason.
  // NotFound when there is no such row.
  Status Close(const RemoteConnectionRecord& record);
  // The row of connection `id`. NotFound when there is none.
  Result<RemoteConnectionRecord> Get(const std::string& id);
  // Rows newest first (by start, then id), at most `limit`; `resource_arn` empty: all resources
  // (matched case-insensitively otherwise).
  Result<std::vector<RemoteConnectionRecord>> List(const std::string& resource_arn, int limit);
  // Ends every row still open with `reason` at `end_millis` (a server that stopped without
  // closing them). Returns how many.
  Result<int64_t> CloseOpen(int64_t end_millis, const std::string& reason);

 private:
  Database* database_;
};

}  // namespace kiln::store
