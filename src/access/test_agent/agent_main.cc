// `kiln agent` without the rest of the CLI, for access_test (as runtime/process/test_shim for the
// shim): the same RunAgentMain the kiln binary dispatches to.
#include <unistd.h>

#include <cstdio>

#include "access/agent_main.h"

// _exit, not a return: see kiln_main.cc's `agent` dispatch (LeakSanitizer's exit-time check cannot
// run once the agent has joined an instance's pid namespace).
int main(int argc, char** argv) {
  const int code = kiln::access::RunAgentMain(argc, argv);
  std::fflush(nullptr);
  _exit(code);
}
