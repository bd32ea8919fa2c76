// The trainer's bridge to libtorch's c10d: a TCPStore, a process group
// (ProcessGroupGloo on the CPU, ProcessGroupNCCL on CUDA), and the three
// collectives data-parallel training needs. Everything here is libtorch's;
// this file only gives it a C interface that Rust can call. Every function
// catches C++ exceptions and returns their message in *err (see
// shim_common.h); the Rust side is trainer/src/distributed.rs.

#include "shim_common.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef OFFGNN_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

struct offgnn_c10d_group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

using offgnn::guarded;

namespace {

// GLOO_SOCKET_IFNAME, as torch.distributed reads it: a comma-separated list
// of interfaces, one device each; else the device for this host's name.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices() {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const char* names = std::getenv("GLOO_SOCKET_IFNAME");
  if (names != nullptr && names[0] != '\0') {
    std::stringstream list(names);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!name.empty()) {
        devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      }
    }
  }
  if (devices.empty()) {
    devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return devices;
}

}  // namespace

extern "C" {

int offgnn_c10d_has_nccl() {
#ifdef OFFGNN_NCCL
  return 1;
#else
  return 0;
#endif
}

// Connects to the job's store and forms the process group. `is_server`: this
// process hosts the TCPStore (rank 0 when no launcher hosts it); `prefix`:
// the keys' namespace within the store. `backend`: 0 Gloo, 1 NCCL.
offgnn_c10d_group* offgnn_c10d_new(const char* host, uint16_t port, int is_server,
                                   const char* prefix, int rank, int world,
                                   int backend, int64_t timeout_ms, char** err) {
  offgnn_c10d_group* group = nullptr;
  guarded(err, [&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<size_t>(world);
    opts.waitWorkers = false;
    opts.timeout = timeout;
    opts.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> tcp =
        c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    c10::intrusive_ptr<c10d::Backend> pg;
    if (backend == 0) {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices = gloo_devices();
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
    } else {
#ifdef OFFGNN_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
#else
      throw std::runtime_error(
          "this trainer was built without NCCL (libtorch_cuda or the CUDA and NCCL headers "
          "were missing at build time): the cuda device cannot be used across processes");
#endif
    }
    group = new offgnn_c10d_group{store, pg};
  });
  return group;
}

void offgnn_c10d_free(offgnn_c10d_group* group) { delete group; }

// Sums `tensor` (an at::Tensor*, as tch holds it) over the group, in place.
int offgnn_c10d_allreduce_sum(offgnn_c10d_group* group, void* tensor, char** err) {
  return guarded(err, [&] {
           std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
           c10d::AllreduceOptions opts;
           opts.reduceOp = c10d::ReduceOp::SUM;
           group->backend->allreduce(tensors, opts)->wait();
         })
             ? 0
             : -1;
}

// Overwrites `tensor` with root's, in place.
int offgnn_c10d_broadcast(offgnn_c10d_group* group, void* tensor, int root, char** err) {
  return guarded(err, [&] {
           std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
           c10d::BroadcastOptions opts;
           opts.rootRank = root;
           opts.rootTensor = 0;
           group->backend->broadcast(tensors, opts)->wait();
         })
             ? 0
             : -1;
}

int offgnn_c10d_barrier(offgnn_c10d_group* group, char** err) {
  return guarded(err, [&] { group->backend->barrier(c10d::BarrierOptions())->wait(); }) ? 0
                                                                                        : -1;
}

}  // extern "C"
