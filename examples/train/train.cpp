// fourway-train: trains GPT-2 on Hugging Face safetensors weights and llm.c token files.
//
//   fourway-train                                   random 4x256 GPT on the built-in corpus
//   fourway-train --init-from gpt2.safetensors --data tiny_shakespeare_train.bin --seq 256
//
// Every error (flags, sizes, files) ends in one line on stderr and exit status 1 (2 for a flag
// that does not parse), never in a crash. The program is train_program.hpp; this file is its
// host target (fourway-train-cuda, train_cuda.cu, is the CUDA one).
#include "host_target.hpp"

int main(int argc, char** argv) {
  return fourway_train::run_program<fourway_train::HostTarget>(argc, argv);
}
