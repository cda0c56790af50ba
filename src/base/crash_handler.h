#pragma once
// Evidence from a crash. InstallCrashHandler() makes a fatal signal (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGABRT) or an uncaught exception write, to stderr (the server log):
//
//   ts=... level=critical msg="fatal signal" signal=SIGSEGV code=1 addr=0x0 pid=... tid=...
//   ts=... level=critical msg="backtrace" frame=0 at="kiln::api::Foo(...) at src/api/foo.cc:12"
//   ...
//
// then the default action runs (the process dies with that signal, a core is dumped where the
// system allows), so a supervisor (the systemd unit's Restart=on-failure) restarts it and the
// restarted server adopts every instance.
//
// The first lines use only async-signal-safe calls. The symbolised frames that follow read the
// binary's DWARF with libbacktrace (Boost.Stacktrace), which allocates: a crash inside the
// allocator could hang there, so a watchdog alarm (5 s) ends the process with the signal anyway.
//
// Stack overflow: the handler runs on an alternate signal stack, which is per thread. The
// installing thread gets one; every other long-lived thread should call
// InstallAlternateSignalStack() once when it starts (the HTTP server's threads do).

namespace kiln {

// Installs the handlers process-wide (idempotent) and an alternate stack for the calling thread.
void InstallCrashHandler();

// Gives the calling thread an alternate signal stack (idempotent per thread; freed at thread exit).
void InstallAlternateSignalStack();

}  // namespace kiln
