// fourway-llama: trains the Llama-style decoder of llama.hpp — a model of the user's own, built
// from fourway's layers — on any mesh of LocalWorld ranks, through the same Mesh runtime as GPT
// (fw::MeshStrategy with fw::model_family<llama::Config>), and with --check compares the mesh
// with the one-rank run (fw::check_mesh). docs/llama.md has the flags and a session.
//
//   fourway-llama --tp 2 --pp 2 --dp 2 --zero 1 --steps 5 --check
#include <functional>
#include <string>
#include <string_view>

#include "common/decoder_program.hpp"
#include "llama.hpp"

namespace {

struct Program {
  using Config = llama::Config;
  static constexpr const char* name = "fourway-llama";
  static std::string usage() {
    return "usage: fourway-llama [--tp N] [--pp N] [--dp N] [--zero 0-3] [--micro-batches M]\n"
           "                     [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [--steps N]\n"
           "                     [--batch B] [--seq T] [--layers L] [--dim C] [--heads H] [--ffn "
           "F]\n"
           "                     [--precision fp32|bf16] [--checkpoint] [--lr X] [--seed S] "
           "[--check]\n"
           "                     [--backend local|strict] [--comm-timeout SECONDS]\n"
           "Trains the Llama-style example decoder (RMSNorm, rotary embeddings, SwiGLU, untied "
           "head)\n"
           "on tp*pp*dp LocalWorld ranks from the built-in corpus. --check runs the mesh and the\n"
           "one-rank model on the same batches and exits 1 when they differ beyond the "
           "precision's\n"
           "bounds. --backend strict holds every communicator call to NCCL's contract "
           "(docs/comm.md).\n";
  }
  /// --ffn (--layers, --dim and --heads are every decoder's).
  template <class Integer>
  static bool model_flag(std::string_view a, Config& cfg, Integer&& integer) {
    if (a != "--ffn") return false;
    cfg.ffn = integer();
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) { return decoder_program::main<Program>(argc, argv); }
