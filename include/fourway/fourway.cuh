//! The umbrella header for nvcc builds: the host library plus the CUDA backend, the CUDA layer
//! ops and, where their flags are 1, NCCL (and NCCL bootstrapped over MPI).
#pragma once

#include "fourway/backend/cuda/adamw.cuh"
#include "fourway/backend/cuda/attention.cuh"
#include "fourway/backend/cuda/attention_select.cuh"
#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/cuda/bias.cuh"
#include "fourway/backend/cuda/blockwise_attention.cuh"
#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/cross_entropy.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
#include "fourway/backend/cuda/embedding.cuh"
#include "fourway/backend/cuda/flash_attention.cuh"
#include "fourway/backend/cuda/fused_attention.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/cuda/gemm_epilogue.cuh"
#include "fourway/backend/cuda/gqa.cuh"
#include "fourway/backend/cuda/graph.cuh"
#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/backend/cuda/layernorm.cuh"
#include "fourway/backend/cuda/rmsnorm.cuh"
#include "fourway/backend/cuda/rope.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/backend/cuda/swiglu.cuh"
#include "fourway/backend/ops.cuh"
#include "fourway/comm/device_reduce.cuh"
#include "fourway/fourway.hpp"
#include "fourway/parallel/cp/ring_attention.cuh"

#if FOURWAY_HAS_NCCL
#include "fourway/comm/nccl_comm.cuh"
#include "fourway/comm/nccl_env.cuh"
#endif

#if FOURWAY_HAS_MPI && FOURWAY_HAS_NCCL
#include "fourway/comm/nccl_mpi.cuh"
#endif

#if FOURWAY_HAS_CUDNN
#include "fourway/backend/cudnn/sdpa.cuh"
#endif
