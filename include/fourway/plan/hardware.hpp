//! The machine a plan is sized for: GPU memory and throughput, and two link classes — NVLink
//! inside a node, InfiniBand across nodes — each an alpha-beta model (latency per ring step,
//! bandwidth per GPU per direction) — and the memory bandwidth that times what streams through
//! memory rather than the tensor cores (an unfused attention's scores, plan/step_time.hpp).
//!
//! Presets are datasheet figures (cited at each), not measurements: memory in GB = 1e9 B as NVIDIA
//! prints it, dense (no sparsity) tensor-core TFLOP/s, NVLink as the per-direction half of the
//! bidirectional figure, InfiniBand as one NIC per GPU as in the DGX systems. Latencies are order-
//! of-magnitude assumptions and say so. What a run achieves is lower: `mfu` scales the peak
//! (by default fourway's measured MFU, `measured_mfu` in plan/planner.hpp).
#pragma once

#include <optional>
#include <string_view>

#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

struct Link {
  double bandwidth_gbs = 0;  // GB/s (1e9 B/s) per GPU per direction
  double latency_us = 0;     // per ring step
};

struct Hardware {
  std::string_view name = "custom";
  int gpus_per_node = 8;
  double memory_gb = 0;       // per GPU, GB = 1e9 B
  double peak_tflops_16 = 0;  // dense bf16/fp16 tensor-core TFLOP/s
  double peak_tflops_32 = 0;  // fp32 (no TF32) TFLOP/s
  Link nvlink;                // inside a node
  Link infiniband;            // across nodes
  double memory_tbs = 0;      // HBM bandwidth, TB/s (1e12 B/s)

  [[nodiscard]] constexpr double peak_tflops(Precision p) const {
    return p == Precision::fp32 ? peak_tflops_32 : peak_tflops_16;
  }
};

// Latency assumptions (all presets): 1 µs per ring step over NVLink, 5 µs over InfiniBand —
// the order of NCCL's small-message latencies; override with --nvlink-latency-us/--ib-latency-us.
inline constexpr double nvlink_latency_us = 1.0;
inline constexpr double infiniband_latency_us = 5.0;

// NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 80 GB HBM2e, BF16 312 TFLOPS dense,
// FP32 19.5 TFLOPS, NVLink 600 GB/s (bidirectional), GPU memory bandwidth 2,039 GB/s; DGX A100
// datasheet: 8× ConnectX-6 200 Gb/s (HDR) for 8 GPUs, 25 GB/s per GPU per direction.
inline constexpr Hardware a100_80g{"a100-80g",
                                   8,
                                   80.0,
                                   312.0,
                                   19.5,
                                   Link{300.0, nvlink_latency_us},
                                   Link{25.0, infiniband_latency_us},
                                   2.039};
// NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, BF16 989 TFLOPS dense (1,979 with
// sparsity), FP32 67 TFLOPS, NVLink 900 GB/s, 3.35 TB/s; DGX H100: 8× ConnectX-7 400 Gb/s (NDR),
// 50 GB/s.
inline constexpr Hardware h100{
    "h100", 8, 80.0, 989.0, 67.0, Link{450.0, nvlink_latency_us}, Link{50.0, infiniband_latency_us},
    3.35};
// NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, BF16 989 TFLOPS dense, FP32 67
// TFLOPS, NVLink 900 GB/s, 4.8 TB/s; DGX H200: 8× ConnectX-7 400 Gb/s, 50 GB/s per GPU.
inline constexpr Hardware h200{"h200",
                               8,
                               141.0,
                               989.0,
                               67.0,
                               Link{450.0, nvlink_latency_us},
                               Link{50.0, infiniband_latency_us},
                               4.8};

constexpr std::optional<Hardware> hardware_preset(std::string_view name) {
  if (name == "a100-80g" || name == "a100") return a100_80g;
  if (name == "h100") return h100;
  if (name == "h200") return h200;
  return std::nullopt;
}

}  // namespace fourway::plan
