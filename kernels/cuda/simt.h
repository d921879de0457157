// SIMT on the CPU: runs the CUDA kernels of kernels/cuda/*.cuh under g++, so that they are tested
// on machines without a GPU (this project's CI). Included by device.cuh when __CUDACC__ is not
// defined; never by nvcc.
//
// A launch runs the grid one block at a time on the calling thread (launches from several threads
// take turns). Each CUDA thread of a block is a fiber (ucontext) on its own stack, so `__shared__`
// is one plain array per block: a function-local static in the section troupe_simt_shared, which
// is filled with 0xFF bytes (a NaN for floats) before every block, as is the dynamic shared memory
// of TROUPE_DYNAMIC_SHARED, so that a read before any write in the block shows.
// Fibers switch only at barriers, warp operations and exit. Runnable threads run in the order the
// schedule gives (forward, reverse or shuffled, the blocks too), so a missing barrier changes a
// result under at least one schedule.
//
// Semantics (those of sm_70+ with independent thread scheduling):
//   __syncthreads()       releases when every live (not exited) thread of the block has arrived,
//                         all at the same call site; threads waiting at different sites with no
//                         other thread able to run is reported as a divergent barrier.
//   __syncwarp(mask), __shfl*_sync(mask, …), __ballot_sync/__any_sync/__all_sync(mask, …)
//                         release when every live lane named in mask has arrived at the same
//                         operation and site with the same mask (lanes that exited do not
//                         count); a shuffle reading a lane that is not taking part (outside the
//                         mask, exited or absent) and a mask without the caller's lane are errors.
//   atomics               plain read-modify-write (one OS thread runs the whole block).
// A launch returns the first error as a Status naming the kernel, block, threads and sites;
// the block is abandoned at that point.
//
// Example (what the launch macros in device.cuh expand to):
//   absl::Status s = simt::Launch("scale_kernel", dim3(blocks), dim3(256), 0,
//                                 [&] { scale_kernel(out, inp, n); });
#ifndef TROUPE_KERNELS_CUDA_SIMT_H_
#define TROUPE_KERNELS_CUDA_SIMT_H_

#ifdef __CUDACC__
#error "simt.h is the CPU stand-in for CUDA; nvcc compiles the kernels natively"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"

// Qualifiers before the CUDA headers, which keep definitions made first (crt/host_defines.h).
#define __shared__ static __attribute__((section("troupe_simt_shared")))
#define __device__
#define __global__
#define __host__
#define __launch_bounds__(...)
#include <cuda_bf16.h>  // bf16 arithmetic and conversions work under g++
#include <vector_types.h>

namespace troupe::kernels::simt {

enum class Schedule { kForward, kReverse, kShuffled };
const char* ScheduleName(Schedule s);

// The schedule of launches made by this OS thread; tests run each kernel under all three.
void SetSchedule(Schedule schedule, uint64_t seed = 1);
Schedule CurrentSchedule();

// Sets the schedule for the lifetime of the object, then restores the previous one.
class ScopedSchedule {
 public:
  explicit ScopedSchedule(Schedule schedule, uint64_t seed = 1);
  ~ScopedSchedule();
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  Schedule previous_;
  uint64_t previous_seed_;
};

namespace detail {
struct Fiber {
  uint3 thread_idx;
};
extern thread_local const Fiber* current_fiber;
extern thread_local uint3 current_block;
extern thread_local dim3 current_block_dim;
extern thread_local dim3 current_grid_dim;
extern thread_local unsigned char* current_dynamic_shared;

absl::Status LaunchImpl(const char* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                        void (*body)(void*), void* arg);

enum class WarpOp { kSync, kShfl, kBallot };
// Parks the calling lane at a warp operation and returns the 64-bit result (a shuffled value, or
// the ballot). `src_lane` is the lane to read for kShfl (itself when out of range), `value` the
// lane's contribution (bits of the shuffled value, or the predicate for kBallot).
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int src_lane, const char* file,
                        int line);
void SyncThreads(const char* file, int line);
}  // namespace detail

template <typename Body>
absl::Status Launch(const char* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    Body&& body) {
  using B = std::remove_reference_t<Body>;
  return detail::LaunchImpl(
      kernel, grid, block, dynamic_shared_bytes, [](void* b) { (*static_cast<B*>(b))(); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

inline int LaneId() {
  const uint3 t = detail::current_fiber->thread_idx;
  const dim3 d = detail::current_block_dim;
  return static_cast<int>((t.x + d.x * (t.y + d.y * t.z)) % 32);
}

template <typename T>
T Shfl(const char* file, int line, unsigned mask, T value, int src_lane, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a register value");
  const int lane = LaneId();
  const int base = lane - lane % width;
  const int src = base + ((src_lane % width) + width) % width;
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = detail::WarpCollective(detail::WarpOp::kShfl, mask, bits, src, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// The xor/down/up forms: a source outside the lane's width-segment yields the lane's own value.
template <typename T>
T ShflRelative(const char* file, int line, unsigned mask, T value, int src_lane_in_warp,
               int width) {
  const int lane = LaneId();
  const bool same_segment =
      src_lane_in_warp >= 0 && src_lane_in_warp < 32 && src_lane_in_warp / width == lane / width;
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = detail::WarpCollective(detail::WarpOp::kShfl, mask, bits,
                                same_segment ? src_lane_in_warp : lane, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

template <typename T>
T ShflXor(const char* file, int line, unsigned mask, T value, int lane_mask, int width = 32) {
  return ShflRelative(file, line, mask, value, LaneId() ^ lane_mask, width);
}
template <typename T>
T ShflDown(const char* file, int line, unsigned mask, T value, unsigned delta, int width = 32) {
  return ShflRelative(file, line, mask, value, LaneId() + static_cast<int>(delta), width);
}
template <typename T>
T ShflUp(const char* file, int line, unsigned mask, T value, unsigned delta, int width = 32) {
  return ShflRelative(file, line, mask, value, LaneId() - static_cast<int>(delta), width);
}

inline unsigned Ballot(const char* file, int line, unsigned mask, int predicate) {
  return static_cast<unsigned>(
      detail::WarpCollective(detail::WarpOp::kBallot, mask, predicate != 0, 0, file, line));
}

}  // namespace troupe::kernels::simt

// The CUDA built-ins kernels use, mapped onto the layer.
#define threadIdx (::troupe::kernels::simt::detail::current_fiber->thread_idx)
#define blockIdx (::troupe::kernels::simt::detail::current_block)
#define blockDim (::troupe::kernels::simt::detail::current_block_dim)
#define gridDim (::troupe::kernels::simt::detail::current_grid_dim)
#define warpSize 32
#define __syncthreads() ::troupe::kernels::simt::detail::SyncThreads(__FILE__, __LINE__)
#define __syncwarp(...)                                   \
  ((void)::troupe::kernels::simt::detail::WarpCollective( \
      ::troupe::kernels::simt::detail::WarpOp::kSync,     \
      ::troupe::kernels::simt::FullMask(__VA_ARGS__), 0, 0, __FILE__, __LINE__))
#define __shfl_sync(...) ::troupe::kernels::simt::Shfl(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::troupe::kernels::simt::ShflXor(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::troupe::kernels::simt::ShflDown(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::troupe::kernels::simt::ShflUp(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) ::troupe::kernels::simt::Ballot(__FILE__, __LINE__, mask, pred)
#define __any_sync(mask, pred) (__ballot_sync(mask, pred) != 0u)
#define __all_sync(mask, pred) (__ballot_sync(mask, pred) == (mask))
#define __ldg(p) (*(p))

namespace troupe::kernels::simt {
inline unsigned FullMask() { return 0xffffffffu; }
inline unsigned FullMask(unsigned mask) { return mask; }

template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
template <typename T>
T atomicExch(T* address, T value) {
  const T old = *address;
  *address = value;
  return old;
}
}  // namespace troupe::kernels::simt

using troupe::kernels::simt::atomicAdd;
using troupe::kernels::simt::atomicCAS;
using troupe::kernels::simt::atomicExch;
using troupe::kernels::simt::atomicMax;

#endif  // TROUPE_KERNELS_CUDA_SIMT_H_
