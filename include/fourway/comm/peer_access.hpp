//! Which GPUs a LocalWorld rank must be able to read from directly, and the refusal when it
//! cannot.
//!
//! LocalWorld's device collectives launch one kernel per rank that reads every peer's buffer
//! (comm/local_world.hpp). With all ranks on one GPU that is ordinary device memory; with ranks
//! on several GPUs the kernel dereferences another GPU's pointers, which needs peer access
//! (`cudaDeviceEnablePeerAccess`). `peer_access_plan` decides from the devices of the peers'
//! buffers and a `can_access(from, to)` query (cudaDeviceCanAccessPeer on a GPU, any function in a
//! test): the devices to enable, or a DeviceError naming the two GPUs and the fixes.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway {

/// The distinct devices in `peer_devices` other than `device` (negative entries, buffers that are
/// not device memory, are ignored), sorted; throws DeviceError if `can_access(device, d)` is false
/// for one of them. `group` names the group in the message.
template <class CanAccess>
std::vector<int> peer_access_plan(int device, const std::vector<int>& peer_devices,
                                  CanAccess can_access, std::string_view group) {
  std::vector<int> out;
  for (int d : peer_devices) {
    if (d < 0 || d == device || std::find(out.begin(), out.end(), d) != out.end()) continue;
    check<DeviceError>(can_access(device, d), "fourway: ", group, " has ranks on GPU ", device,
                       " and GPU ", d, ", but GPU ", device, " cannot access GPU ", d,
                       "'s memory (cudaDeviceCanAccessPeer is 0), and LocalWorld's device "
                       "collectives read peers' buffers directly. Put all ranks of a LocalWorld "
                       "group on one GPU, or use NcclWorld (one process per GPU)");
    out.push_back(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fourway
