#pragma once
// GPU attention over GpuStreamed blocks (pinned host memory): the blocks are
// copied to the GPU in chunks of a few large DMAs into a double-buffered
// landing area, and the kernel on chunk i runs while chunk i + 1 is copied
// (DESIGN.md §2, §3). Consecutive pool slots travel in one copy, so a
// sequence's blocks written in order move as one range.
//
// On CUDA the two streams order each other on the device (events): the copy
// into a buffer waits for the kernel that last read it, the kernel for the
// copy that filled it, and the host issues every chunk without waiting, so the
// link never idles for a host round trip between chunks. Host builds fence.

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/decode.hpp"
#include "attention/prefill.hpp"
#include "framework/spaces.hpp"

namespace writescope {

template <class Scalar>
class StreamedDecode {
 public:
  using PinnedPool = Kokkos::View<const Scalar**, Kokkos::LayoutRight, PinnedMemSpace>;
  using Queries = Kokkos::View<const float***, Kokkos::LayoutRight, GpuMemSpace>;

  /// `chunk_blocks` blocks per landing buffer (two buffers are allocated).
  StreamedDecode(const AttentionShape& shape, const BlockGeometry& geometry, int chunk_blocks);
  ~StreamedDecode();
  StreamedDecode(StreamedDecode&&) noexcept;

  /// Attends queries (batch, q_heads, key_dim) over `segments` of `pool`
  /// ((slots, block_elements) token-major blocks; segments sorted by
  /// batch_index) into `out` (batch, q_heads, value_dim). Copies run
  /// on `copy_space`, kernels on `compute_space`; the call returns once both
  /// have been issued and the last chunk's kernel is enqueued (fence
  /// compute_space before reading `out`). With AttentionPass::prompt the
  /// queries are one prompt chunk's rows (rows, q_heads, key_dim) and every
  /// row reads every segment.
  void run(const GpuExecSpace& copy_space, const GpuExecSpace& compute_space, const Queries& queries,
           const PinnedPool& pool, const std::vector<BlockSegment>& segments, const PartialState<GpuMemSpace>& out,
           AttentionPass pass = AttentionPass::decode);

  /// Bytes copied host -> device by the last run (whole blocks).
  std::uint64_t bytes_copied() const noexcept { return bytes_copied_; }
  /// Copies (DMA requests) issued by the last run.
  int copies_issued() const noexcept { return copies_issued_; }

 private:
  struct Chunk {
    std::vector<BlockSegment> segments;               // slots renumbered into the landing buffer
    std::vector<std::pair<int, int>> runs;            // (first pool slot, count), landing slots in order
  };
  std::vector<Chunk> plan(const std::vector<BlockSegment>& segments) const;
  void copy(const GpuExecSpace& space, const PinnedPool& pool, const Chunk& chunk, int buffer);

  AttentionShape shape_;
  BlockGeometry geometry_;
  int chunk_blocks_;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, GpuMemSpace> landing_[2];  // each (chunk_blocks, block_elements)
  DecodeWorkspace<GpuMemSpace> workspace_;
  PrefillWorkspace<GpuMemSpace> prefill_workspace_;
  PartialState<GpuMemSpace> chunk_out_;
  std::uint64_t bytes_copied_ = 0;
  int copies_issued_ = 0;
  struct Events;                    // CUDA: per landing buffer, "filled" and "read"
  std::unique_ptr<Events> events_;  // null in host builds
};

extern template class StreamedDecode<float>;
extern template class StreamedDecode<bf16>;

}  // namespace writescope
