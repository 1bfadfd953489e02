// fourway-train-cuda: fourway-train with the tensors on GPUs. Same program (train_program.hpp),
// same flags:
//   fourway-train-cuda --ranks 4 --zero 3          LocalWorld: 4 ranks as threads on GPU 0
//   mpirun -np 8 fourway-train-cuda --backend nccl --zero 3
//                                                  one process per GPU (node-local rank)
// Each rank's memory cap is --memory-cap-gb, or by default the device's free memory at start.
// --backend mpi is refused: MpiComm moves host memory; NCCL is the GPU transport.
#include "cuda_target.cuh"

int main(int argc, char** argv) {
  return fourway_train::run_program<fourway_train::CudaTarget>(argc, argv);
}
