// The trainer's bridge to what tch does not expose of libtorch: streams,
// events, the caching allocator's stream bookkeeping and pinned host
// memory. Everything goes through c10's device-generic interfaces
// (c10::Stream, c10::Event, the DeviceGuardImpl that libc10_cuda
// registers for CUDA), so nothing here calls the CUDA runtime itself and
// the binary needs no CUDA library of its own: on a machine without a GPU
// every call fails with libtorch's message instead. Errors come back in
// *err (see shim_common.h); the Rust side is trainer/src/cuda.rs.

#include "shim_common.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <cstdlib>

using offgnn::guarded;

namespace {

const c10::impl::DeviceGuardImplInterface* cuda_impl() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::Device cuda_device(int index) {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

extern "C" {

void offgnn_shim_free_string(char* s) { std::free(s); }

// A stream from libtorch's pool for CUDA device `device` (a c10::Stream*,
// freed with offgnn_stream_free; the stream itself is the pool's).
void* offgnn_stream_from_pool(int device, char** err) {
  c10::Stream* out = nullptr;
  guarded(err, [&] {
    out = new c10::Stream(cuda_impl()->getStreamFromGlobalPool(cuda_device(device), false));
  });
  return out;
}

void offgnn_stream_free(void* stream) { delete static_cast<c10::Stream*>(stream); }

// Makes `stream` the calling thread's current stream on its device: the
// work this thread queues there from now on goes to it.
int offgnn_stream_make_current(void* stream, char** err) {
  return guarded(err, [&] { cuda_impl()->exchangeStream(*static_cast<c10::Stream*>(stream)); })
             ? 0
             : -1;
}

// An event recorded now on the calling thread's current stream of CUDA
// device `device`; with `timing`, it can be timed against another one.
void* offgnn_event_record(int device, int timing, char** err) {
  c10::Event* out = nullptr;
  guarded(err, [&] {
    auto flag = timing != 0 ? c10::EventFlag::BACKEND_DEFAULT : c10::EventFlag::PYTORCH_DEFAULT;
    auto event = std::make_unique<c10::Event>(c10::DeviceType::CUDA, flag);
    event->record(cuda_impl()->getStream(cuda_device(device)));
    out = event.release();
  });
  return out;
}

void offgnn_event_free(void* event) { delete static_cast<c10::Event*>(event); }

// The calling thread's current stream of the event's device waits for the
// event (on the device; the host does not wait).
int offgnn_event_block(void* event, char** err) {
  return guarded(err, [&] {
           auto* e = static_cast<c10::Event*>(event);
           e->block(cuda_impl()->getStream(e->device()));
         })
             ? 0
             : -1;
}

// The host waits until the event has happened.
int offgnn_event_synchronize(void* event, char** err) {
  return guarded(err, [&] { static_cast<c10::Event*>(event)->synchronize(); }) ? 0 : -1;
}

// Milliseconds from `start` to `end`, both timing events that happened.
int offgnn_event_elapsed_ms(void* start, void* end, double* ms, char** err) {
  return guarded(err, [&] {
           *ms = static_cast<c10::Event*>(start)->elapsedTime(*static_cast<c10::Event*>(end));
         })
             ? 0
             : -1;
}

// Tells the caching allocator that `tensor` (an at::Tensor*, as tch holds
// it) is used on the calling thread's current stream of its device, so its
// memory is not handed out again before that stream is done with it (as
// torch's Tensor.record_stream does).
int offgnn_record_stream(void* tensor, char** err) {
  return guarded(err, [&] {
           const auto& t = *static_cast<at::Tensor*>(tensor);
           cuda_impl()->recordDataPtrOnStream(t.storage().data_ptr(),
                                              cuda_impl()->getStream(t.device()));
         })
             ? 0
             : -1;
}

// `bytes` of page-locked host memory from libtorch's caching host
// allocator, as a uint8 tensor (an at::Tensor*, for tch to own). A
// non-blocking copy from it records an event, and the allocator hands the
// block out again only after that event, so the tensor may be dropped as
// soon as its copy is queued.
void* offgnn_empty_pinned(int64_t bytes, char** err) {
  at::Tensor* out = nullptr;
  guarded(err, [&] {
    out = new at::Tensor(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
  });
  return out;
}

}  // extern "C"
