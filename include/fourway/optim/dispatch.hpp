//! Backend dispatch for the optimizer: `detail::optim_ops<B>` is `Ops<B>` (backend/ops.hpp), the
//! one kernel set every rung above the backend names. Kept as an alias for existing callers.
#pragma once

#include "fourway/backend/ops.hpp"

namespace fourway::detail {

template <class B>
using optim_ops = Ops<B>;

}  // namespace fourway::detail
