// fourway-gptj: trains the GPT-J-style parallel-block decoder of gptj.hpp (grouped-query
// attention, rotary embeddings) on any mesh of LocalWorld ranks through fw::MeshStrategy, and with
// --check compares the mesh with the one-rank run (fw::check_mesh). docs/llama.md, "A third model".
//
//   fourway-gptj --tp 2 --pp 2 --dp 2 --zero 1 --micro-batches 2 --steps 3 --check
#include <string>
#include <string_view>

#include "common/decoder_program.hpp"
#include "gptj.hpp"

namespace {

struct Program {
  using Config = gptj::Config;
  static constexpr const char* name = "fourway-gptj";
  static std::string usage() {
    return "usage: fourway-gptj [--tp N] [--pp N] [--dp N] [--zero 0-3] [--micro-batches M]\n"
           "                    [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [--steps N]\n"
           "                    [--batch B] [--seq T] [--layers L] [--dim C] [--heads H]\n"
           "                    [--kv-heads K] [--precision fp32|bf16] [--checkpoint] [--lr X]\n"
           "                    [--seed S] [--check] [--backend local|strict] [--comm-timeout S]\n"
           "Trains the GPT-J-style example decoder (parallel attention and MLP blocks,\n"
           "grouped-query attention, rotary embeddings, untied head) on tp*pp*dp LocalWorld\n"
           "ranks from the built-in corpus. --check runs the mesh and the one-rank model on the\n"
           "same batches and exits 1 when they differ beyond the precision's bounds.\n";
  }
  /// --kv-heads (--layers, --dim and --heads are every decoder's).
  template <class Integer>
  static bool model_flag(std::string_view a, Config& cfg, Integer&& integer) {
    if (a != "--kv-heads") return false;
    cfg.kv_heads = integer();
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) { return decoder_program::main<Program>(argc, argv); }
