// model::ArrayOps on one CUDA device: the elastic trainer's parameter, gradient and moment arrays
// in device memory, and its operations as the kernels of array_ops.cuh, with the host
// implementation's bits (model/array_ops.h). Implemented in array_ops_cuda.cu (nvcc, in
// troupe_model_cuda); this header has no CUDA header in it, so g++ code (a GPU Trainable, the
// trainer's tests) includes it.
//
// Conventions: arrays come from a caching allocator (allocator.h) over cudaMalloc on the device;
// every operation first makes the device current on the calling thread, enqueues its work on the
// ops' stream and waits for that stream before it returns (the ArrayOps contract), so a
// communicator on another stream or thread may use the arrays next. A FloatArray's memory goes
// back to the cache at once, without waiting for the device: work on other streams that uses the
// array (a collective) must have finished before the array is resized or destroyed. Copy accepts
// overlapping ranges (as memmove). name() is "cuda:N"; host_accessible() is false. Every CUDA
// failure is a Status naming the call with file:line. The ArrayOps must outlive its arrays, and a
// borrowed stream must outlive the ArrayOps. Calls from several threads are safe (they share the
// one stream).
//
// Example:
//   absl::StatusOr<std::unique_ptr<model::ArrayOps>> ops = CreateCudaArrayOps(/*device=*/0);
//   if (!ops.ok()) return ops.status();  // no usable GPU: FailedPrecondition naming the cause
//   model::FloatArray sum;
//   TROUPE_RETURN_IF_ERROR((*ops)->Assign(&sum, n, 0.0f));
//   TROUPE_RETURN_IF_ERROR((*ops)->Add(sum.data(), sum.data(), grads_on_device, n));
#ifndef TROUPE_MODEL_CUDA_ARRAY_OPS_CUDA_H_
#define TROUPE_MODEL_CUDA_ARRAY_OPS_CUDA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "troupe/model/array_ops.h"

namespace troupe::model::cuda {

// Array operations on device `device_ordinal` with a stream of their own (a blocking stream,
// destroyed with the ops). FailedPrecondition naming the CUDA runtime's error (e.g.
// cudaErrorInsufficientDriver) where no GPU can be used, when the ordinal is not one of this
// machine's devices, or when the device is older than compute capability 8.0 (the kernels are
// built for sm_80 and sm_90).
absl::StatusOr<std::unique_ptr<model::ArrayOps>> CreateCudaArrayOps(int device_ordinal);

// The same on a stream the caller owns and keeps alive for the ops' life: `stream` is a
// cudaStream_t of that device passed as void* (nullptr: the legacy default stream). GptDevice
// shares its stream this way, so that the trainer's operations are ordered with its kernels.
absl::StatusOr<std::unique_ptr<model::ArrayOps>> CreateCudaArrayOpsOnStream(int device_ordinal,
                                                                            void* stream);

}  // namespace troupe::model::cuda

#endif  // TROUPE_MODEL_CUDA_ARRAY_OPS_CUDA_H_
