//! The umbrella header: everything that compiles with any C++20 compiler. CUDA parts
//! (`backend/cuda/*.cuh`) are included by `fourway/fourway.cuh` in nvcc builds.
#pragma once

#include "fourway/backend/host/backend.hpp"
#include "fourway/config.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/shape.hpp"
#include "fourway/core/tensor.hpp"
