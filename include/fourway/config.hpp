//! fourway configuration: host/device annotations and capability flags.
//!
//! Every other header includes this one first. A `.hpp` must compile with any C++20 compiler, so
//! CUDA-only spellings live behind `FOURWAY_CUDA_COMPILATION`, which is defined only when nvcc
//! (or clang in CUDA mode) compiles the translation unit.
#pragma once

#if defined(__CUDACC__) || defined(__CUDA_ARCH__)
#define FOURWAY_CUDA_COMPILATION 1
#endif

#if defined(FOURWAY_CUDA_COMPILATION)
#define FOURWAY_HOST_DEVICE __host__ __device__
#define FOURWAY_DEVICE __device__
#define FOURWAY_HOST __host__
#else
#define FOURWAY_HOST_DEVICE
#define FOURWAY_DEVICE
#define FOURWAY_HOST
#endif

// One definition per program. A body that depends on the compilation mode (host pointers only in
// a g++ unit, device memory too in an nvcc unit) is declared between these two macros: its names
// land in an inline namespace named after the mode, so a program that links `.cpp` and `.cu`
// units holds both versions under different symbols instead of letting the linker keep one
// (ctest lint.mode_namespace enforces it; tests/hygiene/odr_*.{cpp,cu} link both halves).
#if defined(FOURWAY_CUDA_COMPILATION)
#define FOURWAY_MODE_NAMESPACE cuda_unit
#else
#define FOURWAY_MODE_NAMESPACE host_unit
#endif
#define FOURWAY_BEGIN_MODE_NAMESPACE inline namespace FOURWAY_MODE_NAMESPACE {
#define FOURWAY_END_MODE_NAMESPACE }

#if defined(__CUDA_ARCH__)
#define FOURWAY_DEVICE_CODE 1  // inside device code (the device pass of nvcc)
#endif

// Capability flags, always defined: 1 where the CMake component target (fourway::cuda,
// fourway::nccl, fourway::mpi, fourway::cblas, fourway::cudnn) is linked, else 0. A user who
// includes the headers without CMake may define them by hand. Test them with
// `#if FOURWAY_HAS_MPI`; `#ifdef` and `defined(...)` are always true (ctest
// lint.capability_flags finds them).
#ifndef FOURWAY_HAS_CUDA
#define FOURWAY_HAS_CUDA 0
#endif
#ifndef FOURWAY_HAS_NCCL
#define FOURWAY_HAS_NCCL 0
#endif
#ifndef FOURWAY_HAS_MPI
#define FOURWAY_HAS_MPI 0
#endif
#ifndef FOURWAY_HAS_CBLAS
#define FOURWAY_HAS_CBLAS 0
#endif
#ifndef FOURWAY_HAS_CUDNN
#define FOURWAY_HAS_CUDNN 0
#endif

#define FOURWAY_VERSION_MAJOR 0
#define FOURWAY_VERSION_MINOR 1
#define FOURWAY_VERSION_PATCH 0

namespace fourway {
/// Sentinel for a degree that is known only at run time (e.g. from a command line).
inline constexpr int dynamic = -1;
}  // namespace fourway
