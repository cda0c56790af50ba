// `kiln agent` without the rest of the CLI, for access_test (as runtime/process/test_shim for the
// shim): the same RunAgentMain the kiln binary dispatches to.
#include "access/agent_main.h"

int main(int argc, char** argv) { return kiln::access::RunAgentMain(argc, argv); }
