#include "attention/split.hpp"

#include <algorithm>

#include "framework/concurrent.hpp"
#include "framework/timer.hpp"

namespace writescope {
namespace {

/// What a fence on a stream that has finished may take (a CUDA stream
/// synchronisation: a few microseconds; an estimate, not yet measured on the
/// GPU machine): a resident kernel whose fence returns within this of the
/// streamed path's has no exact time.
constexpr double fence_seconds = 20e-6;

}  // namespace

void sort_by_batch_and_slot(std::vector<BlockSegment>& segments) {
  std::sort(segments.begin(), segments.end(), [](const BlockSegment& a, const BlockSegment& b) {
    return a.batch_index != b.batch_index ? a.batch_index < b.batch_index : a.slot < b.slot;
  });
}

double segment_bytes(const std::vector<BlockSegment>& segments, double bytes_per_token) {
  double tokens = 0;
  for (const BlockSegment& s : segments) tokens += s.token_count;
  return tokens * bytes_per_token;
}

StepBytes plan_bytes(const SplitPlan& plan, double bytes_per_token) {
  return StepBytes{segment_bytes(plan.gpu_resident, bytes_per_token), segment_bytes(plan.cpu_resident, bytes_per_token),
                   segment_bytes(plan.gpu_streamed, bytes_per_token) + segment_bytes(plan.cpu_pinned, bytes_per_token)};
}

template <class Scalar>
SplitDecode<Scalar>::SplitDecode(const AttentionShape& shape, const BlockGeometry& geometry, int chunk_blocks)
    : shape_(shape), geometry_(geometry), streamed_(shape, geometry, chunk_blocks) {}

namespace {

/// The first `rows` rows of `state`.
template <class MemSpace>
PartialState<MemSpace> leading_rows(const PartialState<MemSpace>& state, int rows) {
  PartialState<MemSpace> part;
  part.o = Kokkos::subview(state.o, std::make_pair(0, rows), Kokkos::ALL, Kokkos::ALL);
  part.lse = Kokkos::subview(state.lse, std::make_pair(0, rows), Kokkos::ALL);
  return part;
}

}  // namespace

template <class Scalar>
void SplitDecode<Scalar>::use_rows(int batch) {
  if (gpu_queries_storage_.extent(0) < static_cast<std::size_t>(batch)) {
    gpu_queries_storage_ = decltype(gpu_queries_storage_)("writescope::attention::split_queries", batch, shape_.q_heads,
                                                          shape_.key_dim);
    resident_out_storage_ =
        PartialState<GpuMemSpace>("writescope::attention::split_resident", batch, shape_.q_heads, shape_.value_dim);
    cpu_on_gpu_storage_ =
        PartialState<GpuMemSpace>("writescope::attention::split_cpu_on_gpu", batch, shape_.q_heads, shape_.value_dim);
    cpu_out_storage_[0] = PartialState<HostMemSpace>("writescope::attention::split_cpu_resident", batch,
                                                     shape_.q_heads, shape_.value_dim);
    cpu_out_storage_[1] = PartialState<HostMemSpace>("writescope::attention::split_cpu_pinned", batch, shape_.q_heads,
                                                     shape_.value_dim);
  }
  gpu_queries_ = Kokkos::subview(gpu_queries_storage_, std::make_pair(0, batch), Kokkos::ALL, Kokkos::ALL);
  resident_out_ = leading_rows(resident_out_storage_, batch);
  cpu_on_gpu_ = leading_rows(cpu_on_gpu_storage_, batch);
  for (int i = 0; i < 2; ++i) cpu_out_[i] = leading_rows(cpu_out_storage_[i], batch);
}

template <class Scalar>
double SplitDecode<Scalar>::run_gpu_share(const InplaceKVCache<Scalar>& cache, const SplitPlan& plan,
                                          const PartialState<GpuMemSpace>& out) {
  const GpuExecSpace& copy = streams_[0];
  const GpuExecSpace& compute = streams_[1];
  const GpuExecSpace& resident = streams_[2];
  FencedTimer<GpuExecSpace> timer(compute);
  timer.start();
  FencedTimer<GpuExecSpace> resident_timer(resident);
  resident_timer.start();
  attend_segments<GpuExecSpace, Scalar, GpuMemSpace>(pass_, resident, shape_, geometry_, BlockOrder::token_major,
                                                     gpu_queries_, cache.vram_pool(), plan.gpu_resident,
                                                     resident_workspace_, resident_prefill_workspace_, resident_out_);
  // A host build runs its instances one after the other: the kernel is done here.
  if constexpr (!has_gpu) resident_seconds_ = plan.gpu_resident.empty() ? 0.0 : resident_timer.seconds();
  // The streamed path alone (its copies precede its kernels on `compute`),
  // beside the resident kernel on its own stream.
  FencedTimer<GpuExecSpace> streamed_timer(compute);
  streamed_timer.start();
  streamed_.run(copy, compute, gpu_queries_, cache.pinned_pool(), plan.gpu_streamed, out, pass_);
  streamed_seconds_ = plan.gpu_streamed.empty() ? 0.0 : streamed_timer.seconds();
  if constexpr (has_gpu) {
    // Fenced after the streamed path: exact only if the resident kernel ended
    // last, i.e. its fence returned later than the streamed path's did (on the
    // resident kernel's clock) by more than a fence takes; else no sample,
    // rather than the streamed path's time charged to the resident kernel.
    const double streamed_end = resident_timer.seconds_unfenced();
    const double until_resident = resident_timer.seconds();
    resident_seconds_ =
        !plan.gpu_resident.empty() && until_resident > streamed_end + fence_seconds ? until_resident : 0.0;
  }
  return timer.seconds();
}

template <class Scalar>
double SplitDecode<Scalar>::run_cpu_share(const InplaceKVCache<Scalar>& cache, const HostQueries& queries,
                                          const SplitPlan& plan) {
  const HostExecSpace host;
  return time_fenced(host, [&](const HostExecSpace& space) {
    attend_segments<HostExecSpace, Scalar, HostMemSpace>(pass_, space, shape_, geometry_, BlockOrder::head_major,
                                                         queries, cache.host_pool(), plan.cpu_resident,
                                                         cpu_workspace_[0], cpu_prefill_workspace_[0], cpu_out_[0]);
    attend_segments<HostExecSpace, Scalar, PinnedMemSpace>(pass_, space, shape_, geometry_, BlockOrder::token_major,
                                                           queries, cache.pinned_pool(), plan.cpu_pinned,
                                                           cpu_workspace_[1], cpu_prefill_workspace_[1], cpu_out_[1]);
    merge_into(space, cpu_out_[0], cpu_out_[1]);
  });
}

template <class Scalar>
SplitTimings SplitDecode<Scalar>::run(const InplaceKVCache<Scalar>& cache, const HostQueries& queries,
                                      const SplitPlan& plan, const PartialState<GpuMemSpace>& out,
                                      AttentionPass pass) {
  pass_ = pass;
  use_rows(static_cast<int>(queries.extent(0)));
  SplitTimings timings;
  const GpuExecSpace& compute = streams_[1];
  FencedTimer<GpuExecSpace> step(compute);
  step.start();
  Kokkos::deep_copy(compute, gpu_queries_, queries);
  compute.fence();
  if (gpu_worker_thread()) {
    // The GPU share is a chain of copies, kernels and fences: drive it from its
    // own host thread so the OpenMP threads stay free for the CPU share.
    run_concurrently([&] { timings.gpu_seconds = run_gpu_share(cache, plan, out); },
                     [&] { timings.cpu_seconds = run_cpu_share(cache, queries, plan); });
  } else {
    timings.gpu_seconds = run_gpu_share(cache, plan, out);
    timings.cpu_seconds = run_cpu_share(cache, queries, plan);
  }
  Kokkos::deep_copy(compute, cpu_on_gpu_.o, cpu_out_[0].o);
  Kokkos::deep_copy(compute, cpu_on_gpu_.lse, cpu_out_[0].lse);
  merge_into(compute, out, resident_out_);
  merge_into(compute, out, cpu_on_gpu_);
  timings.step_seconds = step.seconds();
  timings.streamed_bytes = streamed_.bytes_copied();
  timings.streamed_seconds = streamed_seconds_;
  timings.resident_seconds = resident_seconds_;
  return timings;
}

template class SplitDecode<float>;
template class SplitDecode<bf16>;

}  // namespace writescope
