#pragma once
// One decode step of attention split along the sequence between the GPU and
// the CPU (DESIGN.md §4, execution): the GPU attends its VRAM-resident blocks
// in place and streams its share of pinned blocks, while the CPU attends the
// host-resident blocks and its share of pinned blocks in place; the partial
// states then merge on the GPU. In a CUDA build the GPU share is driven from a
// second host thread so both devices work at the same time; in a host-only
// build the two shares run one after the other on the host, or on two threads
// when the worker thread is switched on (framework/concurrent.hpp).

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "attention/decode.hpp"
#include "attention/streaming.hpp"
#include "framework/roofline.hpp"
#include "framework/streams.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {

/// Block segments per device and pool for one step, each list sorted by batch index.
struct SplitPlan {
  std::vector<BlockSegment> gpu_resident;  // VRAM pool, read in place by the GPU
  std::vector<BlockSegment> gpu_streamed;  // pinned pool, streamed to the GPU
  std::vector<BlockSegment> cpu_resident;  // host pool, read in place by the CPU
  std::vector<BlockSegment> cpu_pinned;    // pinned pool, read in place by the CPU (the movable band)
};

/// Sorts segments by batch index, then slot: a device reads its share of the
/// band in address order, and the GPU copies a run of consecutive slots at once.
void sort_by_batch_and_slot(std::vector<BlockSegment>& segments);

/// KV bytes of the segments' tokens at `bytes_per_token`.
double segment_bytes(const std::vector<BlockSegment>& segments, double bytes_per_token);
/// The plan's KV bytes by where they live: VRAM, host memory, the pinned band.
StepBytes plan_bytes(const SplitPlan& plan, double bytes_per_token);

struct SplitTimings {
  double gpu_seconds = 0;   // GPU share: resident + streamed, until its last kernel finished
  double cpu_seconds = 0;   // CPU share
  double step_seconds = 0;  // whole step including the final merge
  std::uint64_t streamed_bytes = 0;  // copied host -> device for the streamed segments (whole blocks)
  double streamed_seconds = 0;       // from the first copy to the last streamed kernel's end
  /// The resident kernel's time, when it is known exactly (it ran alone, or
  /// ended after the streamed path beside it); 0 otherwise.
  double resident_seconds = 0;
};

template <class Scalar>
class SplitDecode {
 public:
  using HostQueries = Kokkos::View<const float***, Kokkos::LayoutRight, HostMemSpace>;

  /// `chunk_blocks`: blocks per streaming chunk (see StreamedDecode). One
  /// instance serves every batch size (decode steps, prompt chunks): its
  /// per-row states grow to the largest batch run and its landing buffers are
  /// the streaming chunks' alone.
  SplitDecode(const AttentionShape& shape, const BlockGeometry& geometry, int chunk_blocks);

  /// Attends queries (batch, q_heads, key_dim) over the plan's segments of
  /// `cache` (layer fixed by the plan) into `out` (batch, q_heads, value_dim).
  /// With AttentionPass::prompt the queries are one prompt chunk's rows and
  /// every row reads every segment of the plan (the sequence's earlier
  /// tokens), once per query tile.
  SplitTimings run(const InplaceKVCache<Scalar>& cache, const HostQueries& queries, const SplitPlan& plan,
                   const PartialState<GpuMemSpace>& out, AttentionPass pass = AttentionPass::decode);

 private:
  double run_gpu_share(const InplaceKVCache<Scalar>& cache, const SplitPlan& plan, const PartialState<GpuMemSpace>& out);
  double run_cpu_share(const InplaceKVCache<Scalar>& cache, const HostQueries& queries, const SplitPlan& plan);
  /// Points the per-row views at the first `batch` rows of their storage, grown first where it is smaller.
  void use_rows(int batch);

  AttentionShape shape_;
  BlockGeometry geometry_;
  AttentionPass pass_ = AttentionPass::decode;  // of the run in progress
  GpuStreams streams_{3};  // copy, compute, resident
  double streamed_seconds_ = 0;  // of the last run_gpu_share
  double resident_seconds_ = 0;  // of the last run_gpu_share, where exact
  StreamedDecode<Scalar> streamed_;
  DecodeWorkspace<GpuMemSpace> resident_workspace_;
  DecodeWorkspace<HostMemSpace> cpu_workspace_[2];
  PrefillWorkspace<GpuMemSpace> resident_prefill_workspace_;
  PrefillWorkspace<HostMemSpace> cpu_prefill_workspace_[2];
  // The run's rows (use_rows) of the storage below: queries (batch, q_heads,
  // key_dim), states (batch, q_heads, value_dim).
  Kokkos::View<float***, Kokkos::LayoutRight, GpuMemSpace> gpu_queries_;
  PartialState<GpuMemSpace> resident_out_, cpu_on_gpu_;
  PartialState<HostMemSpace> cpu_out_[2];
  Kokkos::View<float***, Kokkos::LayoutRight, GpuMemSpace> gpu_queries_storage_;
  PartialState<GpuMemSpace> resident_out_storage_, cpu_on_gpu_storage_;
  PartialState<HostMemSpace> cpu_out_storage_[2];
};

extern template class SplitDecode<float>;
extern template class SplitDecode<bf16>;

}  // namespace writescope
