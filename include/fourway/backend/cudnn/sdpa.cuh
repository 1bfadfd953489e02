//! Causal attention through cuDNN's scaled-dot-product-attention graph (cuDNN 9, the
//! cudnn-frontend graph API): the `fourway::cudnn` component's kernels, which
//! `backend/cuda/attention_select.cuh` runs when the context asks for them
//! (`Context<Cuda>::set_cudnn_attention`) and cuDNN takes the call.
//!
//! Same contract as the other attention paths (`flash_attention_forward/backward`): qkv (B, T, 3C)
//! packed q|k|v, NH heads of size d = C/NH, out (B, T, C), lse (B, NH, T) the log-sum-exp of each
//! row's scaled scores (cuDNN's softmax statistics, natural log), causal (top-left diagonal),
//! scale 1/sqrt(d), bf16 / fp16 in and out, fp32 softmax and accumulation. The q, k and v tensors
//! are strided views of the packed qkv (strides T·3C, d, 3C, 1 over b, h, t, d), so nothing is
//! copied; the backward writes dq|dk|dv into the packed dqkv the same way.
//!
//! One graph per shape, direction, element type and device is built at its first call — graph
//! validation, cuDNN's heuristic (mode A), the support check and the plan — and kept (per thread:
//! a cuDNN handle is per thread and device here). A shape cuDNN declines, or whose workspace is
//! larger than the context's persistent GEMM workspace it runs in, is remembered as declined, and
//! `cudnn_attention_supports` says so: the caller then runs another path. Host twin: the
//! materialised and blockwise attention of backend/host (the CUDA test compares all paths with
//! it).
// fourway-requires: cuda cudnn
#pragma once

// The fourway::cudnn target compiles the frontend without its JSON library
// (CUDNN_FRONTEND_SKIP_JSON_LIB: only its serialisation of graphs needs it; its headers compile
// in under half the time), where they use std::strlen without <cstring>: it comes first.
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/gemm_epilogue.cuh"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::cuda {

namespace detail {

namespace cfe = ::cudnn_frontend;

template <class E>
constexpr bool cudnn_element = std::is_same_v<E, bf16> || std::is_same_v<E, fp16>;

template <class E>
constexpr cfe::DataType_t cudnn_type() {
  return std::is_same_v<E, bf16> ? cfe::DataType_t::BFLOAT16 : cfe::DataType_t::HALF;
}

inline void check_cudnn(cudnnStatus_t s, const char* what) {
  check<DeviceError>(s == CUDNN_STATUS_SUCCESS, "fourway: ", what, ": ", cudnnGetErrorString(s));
}

/// This thread's cuDNN handle on `device` (made at the first call, kept for the thread's life).
inline cudnnHandle_t cudnn_handle(int device) {
  struct Handles {
    std::map<int, cudnnHandle_t> by_device;
    ~Handles() {
      for (auto& [d, h] : by_device) (void)cudnnDestroy(h);
    }
  };
  thread_local Handles handles;
  auto it = handles.by_device.find(device);
  if (it == handles.by_device.end()) {
    cudnnHandle_t h = nullptr;
    check_cudnn(cudnnCreate(&h), "cudnnCreate");
    it = handles.by_device.emplace(device, h).first;
  }
  return it->second;
}

/// Tensor ids of the graphs' variant packs.
enum SdpaUid : std::int64_t {
  q_uid = 1,
  k_uid,
  v_uid,
  o_uid,
  stats_uid,
  do_uid,
  dq_uid,
  dk_uid,
  dv_uid
};

/// A built graph, or the record that cuDNN declined the shape.
struct SdpaGraph {
  std::shared_ptr<cfe::graph::Graph> graph;  // null: declined
  std::int64_t workspace = 0;
};

/// The (b, h, t, d) view of one of q, k, v inside the packed (B, T, 3C) qkv, or of the
/// (B, T, C) out.
inline std::shared_ptr<cfe::graph::Tensor_attributes> sdpa_view(cfe::graph::Graph& g,
                                                                const char* name, std::int64_t uid,
                                                                std::int64_t B, std::int64_t T,
                                                                std::int64_t NH, std::int64_t d,
                                                                std::int64_t row) {
  return g.tensor(cfe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, NH, T, d})
                      .set_stride({T * row, d, row, 1}));
}

/// Builds (once) the forward or backward graph of a shape; declined shapes keep a null graph.
template <class E>
const SdpaGraph& sdpa_graph(const Context<Cuda>& ctx, bool backward, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t NH) {
  using Key = std::tuple<int, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  thread_local std::map<Key, SdpaGraph> cache;
  const Key key{ctx.device(), backward, B, T, C, NH};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  SdpaGraph made;
  const std::int64_t d = C / NH;
  if (NH >= 1 && C % NH == 0 && d % 8 == 0 && d <= 256) {
    auto g = std::make_shared<cfe::graph::Graph>();
    g->set_io_data_type(cudnn_type<E>())
        .set_intermediate_data_type(cfe::DataType_t::FLOAT)
        .set_compute_data_type(cfe::DataType_t::FLOAT);
    auto q = sdpa_view(*g, "q", q_uid, B, T, NH, d, 3 * C);
    auto k = sdpa_view(*g, "k", k_uid, B, T, NH, d, 3 * C);
    auto v = sdpa_view(*g, "v", v_uid, B, T, NH, d, 3 * C);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    if (!backward) {
      auto [o, stats] = g->sdpa(q, k, v,
                                cfe::graph::SDPA_attributes()
                                    .set_name("fourway causal attention")
                                    .set_generate_stats(true)
                                    .set_attn_scale(scale)
                                    .set_causal_mask(true));
      o->set_output(true).set_uid(o_uid).set_dim({B, NH, T, d}).set_stride({T * C, d, C, 1});
      stats->set_output(true).set_uid(stats_uid).set_data_type(cfe::DataType_t::FLOAT);
    } else {
      auto o = sdpa_view(*g, "o", o_uid, B, T, NH, d, C);
      auto dout = sdpa_view(*g, "dO", do_uid, B, T, NH, d, C);
      auto stats = g->tensor(cfe::graph::Tensor_attributes()
                                 .set_name("stats")
                                 .set_uid(stats_uid)
                                 .set_dim({B, NH, T, 1})
                                 .set_stride({NH * T, T, 1, 1})
                                 .set_data_type(cfe::DataType_t::FLOAT));
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats,
                                           cfe::graph::SDPA_backward_attributes()
                                               .set_name("fourway causal attention backward")
                                               .set_attn_scale(scale)
                                               .set_causal_mask(true));
      const std::vector<std::int64_t> dims{B, NH, T, d}, strides{T * 3 * C, d, 3 * C, 1};
      dq->set_output(true).set_uid(dq_uid).set_dim(dims).set_stride(strides);
      dk->set_output(true).set_uid(dk_uid).set_dim(dims).set_stride(strides);
      dv->set_output(true).set_uid(dv_uid).set_dim(dims).set_stride(strides);
    }
    const cudnnHandle_t h = cudnn_handle(ctx.device());
    if (g->build(h, {cfe::HeurMode_t::A}).is_good() &&
        g->get_workspace_size(made.workspace).is_good() && made.workspace >= 0 &&
        static_cast<std::size_t>(made.workspace) <= lt_gemm_workspace_bytes) {
      made.graph = std::move(g);
    }
  }
  return cache.emplace(key, std::move(made)).first->second;
}

/// Runs a built graph on the context's stream, in the context's persistent workspace.
inline void sdpa_execute(const Context<Cuda>& ctx, const SdpaGraph& g,
                         std::unordered_map<std::int64_t, void*>& pack, const char* what) {
  const cudnnHandle_t h = cudnn_handle(ctx.device());
  check_cudnn(cudnnSetStream(h, ctx.stream()), "cudnnSetStream");
  auto err = g.graph->execute(h, pack, g.workspace > 0 ? ctx.lt_workspace() : nullptr);
  check<DeviceError>(err.is_good(), "fourway: ", what, ": ", err.get_message());
}

}  // namespace detail

/// True when cuDNN runs this causal attention (element type, head size, a graph its heuristic
/// builds within the context's workspace, 16-byte aligned tensors). Builds and keeps the forward
/// and backward graphs at the first call of a shape.
template <floating_dtype E, class... Ptrs>
bool cudnn_attention_supports(const Context<Cuda>& ctx, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH, const Ptrs*... ptrs) {
  if constexpr (!detail::cudnn_element<E>) {
    return false;
  } else {
    if (B < 1 || T < 1 || C < 1 || NH < 1) return false;
    if (!(detail::on_16_bytes(ptrs) && ...)) return false;
    return detail::sdpa_graph<E>(ctx, false, B, T, C, NH).graph != nullptr &&
           detail::sdpa_graph<E>(ctx, true, B, T, C, NH).graph != nullptr;
  }
}

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); see the file comment. The caller has
/// checked `cudnn_attention_supports`.
template <floating_dtype E>
void cudnn_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  static_assert(detail::cudnn_element<E>, "fourway: cuDNN attention runs bf16 and fp16");
  const detail::SdpaGraph& g = detail::sdpa_graph<E>(ctx, false, B, T, C, NH);
  check<ConfigError>(g.graph != nullptr, "fourway: cuDNN declined the causal attention of B=", B,
                     " T=", T, " C=", C, " NH=", NH, " (ask cudnn_attention_supports first)");
  auto* base = const_cast<E*>(qkv);
  std::unordered_map<std::int64_t, void*> pack{{detail::q_uid, base},
                                               {detail::k_uid, base + C},
                                               {detail::v_uid, base + 2 * C},
                                               {detail::o_uid, out},
                                               {detail::stats_uid, lse}};
  detail::sdpa_execute(ctx, g, pack, "cuDNN attention forward");
}

/// dqkv (B, T, 3C) from dout (B, T, C) and the forward's qkv, out and lse.
template <floating_dtype E>
void cudnn_attention_backward(const Context<Cuda>& ctx, E* dqkv, const E* dout, const E* qkv,
                              const E* out, const float* lse, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH) {
  static_assert(detail::cudnn_element<E>, "fourway: cuDNN attention runs bf16 and fp16");
  const detail::SdpaGraph& g = detail::sdpa_graph<E>(ctx, true, B, T, C, NH);
  check<ConfigError>(g.graph != nullptr,
                     "fourway: cuDNN declined the causal attention backward "
                     "of B=",
                     B, " T=", T, " C=", C, " NH=", NH);
  auto* base = const_cast<E*>(qkv);
  std::unordered_map<std::int64_t, void*> pack{{detail::q_uid, base},
                                               {detail::k_uid, base + C},
                                               {detail::v_uid, base + 2 * C},
                                               {detail::o_uid, const_cast<E*>(out)},
                                               {detail::do_uid, const_cast<E*>(dout)},
                                               {detail::stats_uid, const_cast<float*>(lse)},
                                               {detail::dq_uid, dqkv},
                                               {detail::dk_uid, dqkv + C},
                                               {detail::dv_uid, dqkv + 2 * C}};
  detail::sdpa_execute(ctx, g, pack, "cuDNN attention backward");
}

}  // namespace fourway::cuda
