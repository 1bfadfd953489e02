// fourway-train --check (check_program.hpp): its instantiations for the host target, in their own
// unit so that they compile beside train.cpp.
#include "check_program.hpp"
#include "host_target.hpp"

namespace fourway_train {
template int run_check<HostTarget, float>(const Options&);
template int run_check<HostTarget, fw::bf16>(const Options&);
template int run_check<HostTarget, fw::fp16>(const Options&);
}  // namespace fourway_train
