#pragma once
// Per-step records of split decode steps (α, predicted and measured times per
// device, bytes per region), written to the HDF5 results store.

#include <cstdint>
#include <vector>

#include "attention/split.hpp"
#include "framework/results_store.hpp"
#include "framework/roofline.hpp"

namespace writescope {

class StepLog {
 public:
  /// Columns of the `bytes` dataset, in order.
  static constexpr const char* byte_columns = "gpu_resident,gpu_streamed,cpu_resident,cpu_pinned";

  /// One step: the plan's prediction, the measured times and the bytes each
  /// device read (`bytes` as planned; `cpu_movable_bytes` of the band on the CPU).
  void record(const SplitPrediction& predicted, const SplitTimings& measured, const StepBytes& bytes,
              double cpu_movable_bytes);

  std::size_t steps() const noexcept { return alpha_.size(); }

  /// Datasets alpha, predicted_{gpu,cpu,step}_seconds, measured_{gpu,cpu,step}_seconds
  /// (steps), bytes (steps, 4) with attribute `columns`, into `group`.
  void write(ResultsGroup& group) const;

 private:
  std::vector<double> alpha_, predicted_gpu_, predicted_cpu_, predicted_step_, measured_gpu_, measured_cpu_,
      measured_step_, bytes_;
};

}  // namespace writescope
