#pragma once
// `kiln hold-start --seconds N -- PROGRAM [ARGS...]`: the hold before a training host's program
// starts (spec remote-access.md R-15; control/training_hold.h builds this command line). Started
// by the runtime as the instance's program, so it is PID 1 of the sandbox: it prints a `[kiln]`
// line (the job's log stream), waits until SIGUSR1 (`kiln release <target>`, or `kill -USR1 1`
// inside the instance) or N seconds, then exec()s PROGRAM with the signal dispositions and mask it
// was started with (default, unblocked), so the program keeps PID 1 and sees signals exactly as
// without the hold. SIGTERM or SIGINT while holding (the job is stopped) end it with 128 + the
// signal. `kiln hold-start --seconds N --after-exit` is the post-mortem instance's program:
// the same wait, then exit 0. Not started by people; kiln_main dispatches it before parsing other
// flags.

namespace kiln::cli {

// argv[0] is "hold-start". Returns (with a program: only on an error) 0 when an --after-exit hold
// ends, 2 for a bad command line, 127 when PROGRAM cannot be exec()ed, 128 + signal when stopped
// while holding.
int RunHoldStart(int argc, char** argv);

}  // namespace kiln::cli
