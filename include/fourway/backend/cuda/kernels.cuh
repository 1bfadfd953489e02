//! All CUDA kernels, twins of `backend/host/kernels.hpp` (same names, same parameters, a
//! `Context<Cuda>` first); see docs/contracts.md and docs/kernels.md.
// fourway-requires: cuda
#pragma once

#include "fourway/backend/cuda/adamw.cuh"
#include "fourway/backend/cuda/attention.cuh"
#include "fourway/backend/cuda/attention_select.cuh"
#include "fourway/backend/cuda/bias.cuh"
#include "fourway/backend/cuda/blockwise_attention.cuh"
#include "fourway/backend/cuda/cross_entropy.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
#include "fourway/backend/cuda/embedding.cuh"
#include "fourway/backend/cuda/flash_attention.cuh"
#include "fourway/backend/cuda/fused_attention.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/cuda/gemm_epilogue.cuh"
#include "fourway/backend/cuda/gqa.cuh"
#include "fourway/backend/cuda/layernorm.cuh"
#include "fourway/backend/cuda/rmsnorm.cuh"
#include "fourway/backend/cuda/rope.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/backend/cuda/swiglu.cuh"
