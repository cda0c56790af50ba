#pragma once
// RoutedRuntime: one Runtime over the process runtime and the container runtime, so controllers
// keep one `runtime::Runtime*`. Launch goes to the container runtime when the spec carries a
// ContainerImage, to the process runtime otherwise; every other call goes to the backend that has
// the instance id (the container runtime is asked first: its Inspect of an unknown id is a stat of
// its state directory, no engine call), and List is the union. PrepareImage goes to the container
// runtime. Usage and Access likewise.
//
// Thread-safety: as the backends (every method from any thread).
#include <memory>

#include "runtime/runtime.h"

namespace kiln::runtime {

// `containers` may be null (no engine configured): then it is `processes` unchanged in behaviour,
// and a spec with a ContainerImage fails Launch with FailedPrecondition naming the setting.
std::unique_ptr<Runtime> MakeRoutedRuntime(std::unique_ptr<Runtime> processes, std::unique_ptr<Runtime> containers);

}  // namespace kiln::runtime
