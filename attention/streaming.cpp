#include "attention/streaming.hpp"

#include <map>
#include <stdexcept>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace writescope {

#ifdef KOKKOS_ENABLE_CUDA
template <class Scalar>
struct StreamedDecode<Scalar>::Events {
  cudaEvent_t filled[2], read[2];
  Events() {
    for (int b = 0; b < 2; ++b) {
      cudaEventCreateWithFlags(&filled[b], cudaEventDisableTiming);
      cudaEventCreateWithFlags(&read[b], cudaEventDisableTiming);
    }
  }
  ~Events() {
    for (int b = 0; b < 2; ++b) {
      cudaEventDestroy(filled[b]);
      cudaEventDestroy(read[b]);
    }
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};
#else
template <class Scalar>
struct StreamedDecode<Scalar>::Events {};
#endif

template <class Scalar>
StreamedDecode<Scalar>::StreamedDecode(const AttentionShape& shape, const BlockGeometry& geometry, int chunk_blocks)
    : shape_(shape), geometry_(geometry), chunk_blocks_(chunk_blocks) {
  if (chunk_blocks < 1) throw std::invalid_argument("StreamedDecode: chunk_blocks must be at least 1");
  for (auto& buffer : landing_)
    buffer = Kokkos::View<Scalar**, Kokkos::LayoutRight, GpuMemSpace>(
        Kokkos::view_alloc(std::string("writescope::attention::landing"), Kokkos::WithoutInitializing),
        static_cast<std::size_t>(chunk_blocks), static_cast<std::size_t>(geometry.block_elements()));
  if constexpr (has_gpu) events_ = std::make_unique<Events>();
}

template <class Scalar>
StreamedDecode<Scalar>::~StreamedDecode() = default;
template <class Scalar>
StreamedDecode<Scalar>::StreamedDecode(StreamedDecode&&) noexcept = default;

template <class Scalar>
std::vector<typename StreamedDecode<Scalar>::Chunk> StreamedDecode<Scalar>::plan(
    const std::vector<BlockSegment>& segments) const {
  std::vector<Chunk> chunks;
  std::map<int, int> landing_slot;  // pool slot -> landing slot, within the current chunk
  for (const BlockSegment& segment : segments) {
    auto found = landing_slot.find(segment.slot);
    if (found == landing_slot.end()) {
      if (chunks.empty() || static_cast<int>(landing_slot.size()) == chunk_blocks_) {
        chunks.emplace_back();
        landing_slot.clear();
      }
      Chunk& chunk = chunks.back();
      const int landing = static_cast<int>(landing_slot.size());
      found = landing_slot.emplace(segment.slot, landing).first;
      if (!chunk.runs.empty() && chunk.runs.back().first + chunk.runs.back().second == segment.slot)
        chunk.runs.back().second += 1;
      else
        chunk.runs.emplace_back(segment.slot, 1);
    }
    BlockSegment moved = segment;
    moved.slot = found->second;
    chunks.back().segments.push_back(moved);
  }
  return chunks;
}

template <class Scalar>
void StreamedDecode<Scalar>::copy(const GpuExecSpace& space, const PinnedPool& pool, const Chunk& chunk, int buffer) {
  int landing = 0;
  for (const auto& [first, count] : chunk.runs) {
    Kokkos::deep_copy(space, Kokkos::subview(landing_[buffer], std::make_pair(landing, landing + count), Kokkos::ALL),
                      Kokkos::subview(pool, std::make_pair(first, first + count), Kokkos::ALL));
    landing += count;
    bytes_copied_ += static_cast<std::uint64_t>(count) * geometry_.block_elements() * sizeof(Scalar);
    copies_issued_ += 1;
  }
}

template <class Scalar>
void StreamedDecode<Scalar>::run(const GpuExecSpace& copy_space, const GpuExecSpace& compute_space,
                                 const Queries& queries, const PinnedPool& pool,
                                 const std::vector<BlockSegment>& segments, const PartialState<GpuMemSpace>& out,
                                 AttentionPass pass) {
  bytes_copied_ = 0;
  copies_issued_ = 0;
  clear(compute_space, out);
  const std::vector<Chunk> chunks = plan(segments);
  if (chunks.empty()) return;
  if (chunk_out_.batch() != out.batch() || chunk_out_.q_heads() != out.q_heads() ||
      chunk_out_.value_dim() != out.value_dim())
    chunk_out_ = PartialState<GpuMemSpace>(Kokkos::WithoutInitializing, "writescope::attention::chunk_out",
                                           out.batch(), out.q_heads(), out.value_dim());
#ifdef KOKKOS_ENABLE_CUDA
  const cudaStream_t copy_stream = copy_space.cuda_stream(), compute_stream = compute_space.cuda_stream();
  // The previous run's last kernels may still read the buffers (events never
  // recorded are no-ops to wait for).
  cudaStreamWaitEvent(copy_stream, events_->read[0], 0);
  copy(copy_space, pool, chunks[0], 0);
  cudaEventRecord(events_->filled[0], copy_stream);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const int buffer = static_cast<int>(i % 2), next = 1 - buffer;
    if (i + 1 < chunks.size()) {
      // Chunk i + 1 goes into the buffer kernel i - 1 read (recorded last
      // iteration; for i = 0, the previous run's).
      cudaStreamWaitEvent(copy_stream, events_->read[next], 0);
      copy(copy_space, pool, chunks[i + 1], next);
      cudaEventRecord(events_->filled[next], copy_stream);
    }
    cudaStreamWaitEvent(compute_stream, events_->filled[buffer], 0);
    attend_segments<GpuExecSpace, Scalar, GpuMemSpace>(pass, compute_space, shape_, geometry_, BlockOrder::token_major,
                                                       queries, landing_[buffer], chunks[i].segments, workspace_,
                                                       prefill_workspace_, chunk_out_);
    merge_into(compute_space, out, chunk_out_);
    cudaEventRecord(events_->read[buffer], compute_stream);
  }
#else
  compute_space.fence();  // the previous run's last kernel no longer reads buffer 0
  copy(copy_space, pool, chunks[0], 0);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    copy_space.fence();     // chunk i has landed
    compute_space.fence();  // the kernel on chunk i - 1 no longer reads the other buffer
    if (i + 1 < chunks.size()) copy(copy_space, pool, chunks[i + 1], static_cast<int>((i + 1) % 2));
    attend_segments<GpuExecSpace, Scalar, GpuMemSpace>(pass, compute_space, shape_, geometry_, BlockOrder::token_major,
                                                       queries, landing_[i % 2], chunks[i].segments, workspace_,
                                                       prefill_workspace_, chunk_out_);
    merge_into(compute_space, out, chunk_out_);
  }
#endif
}

template class StreamedDecode<float>;
template class StreamedDecode<bf16>;

}  // namespace writescope
