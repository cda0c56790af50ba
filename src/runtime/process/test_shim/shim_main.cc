// A shim binary for runtime_process_test and the launch benchmark, so that they do not depend on
// the cli (the real one is `kiln shim`, which calls the same RunShim).
#include "runtime/process/process_runtime.h"

int main(int argc, char** argv) { return kiln::runtime::RunShim(argc, argv); }
