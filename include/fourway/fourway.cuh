//! The umbrella header for nvcc builds: the host library plus the CUDA backend.
#pragma once

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/fourway.hpp"
