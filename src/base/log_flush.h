#pragma once
// Crash-time access to the process-wide log sink (base/log.h's InitLogging owns it).

namespace kiln {

// Writes the buffered log lines now unless another thread is writing them: the sink's lock is
// taken with try_lock, so this never blocks. For a fatal-signal handler, which must not wait on a
// lock the crashed thread may hold. No-op before InitLogging.
void TryFlushLogs();

}  // namespace kiln
