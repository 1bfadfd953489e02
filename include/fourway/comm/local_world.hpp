//! LocalWorld: N ranks as threads of one process, and `LocalComm`, its communicator (the
//! algorithms are described in comm/local/comm.hpp).
//!
//! This header gathers LocalWorld's parts, one job each, under comm/local/: state.hpp (the world,
//! a group, a rank), executor.hpp (the async worker), gate.hpp (when the worker may move data; its
//! Work), reduce.hpp (the host reduction), rendezvous.hpp (arrival, agreement and completion of a
//! collective), device.hpp (device memory under nvcc), mailbox.hpp (point-to-point) and comm.hpp
//! (LocalComm, LocalWorld::launch).
#pragma once

#include "fourway/comm/communicator.hpp"
#include "fourway/comm/local/comm.hpp"
