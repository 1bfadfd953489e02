//! All host kernels (the readable reference the CUDA kernels are tested against); see the
//! kernels table in docs/contracts.md and docs/kernels.md.
#pragma once

#include "fourway/backend/host/adamw.hpp"
#include "fourway/backend/host/attention.hpp"
#include "fourway/backend/host/bias.hpp"
#include "fourway/backend/host/cross_entropy.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/embedding.hpp"
#include "fourway/backend/host/flash_attention.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/backend/host/gemm_epilogue.hpp"
#include "fourway/backend/host/gqa.hpp"
#include "fourway/backend/host/layernorm.hpp"
#include "fourway/backend/host/rmsnorm.hpp"
#include "fourway/backend/host/rope.hpp"
#include "fourway/backend/host/softmax.hpp"
#include "fourway/backend/host/swiglu.hpp"
