#include "attention/step_log.hpp"

namespace writescope {

void StepLog::record(const SplitPrediction& predicted, const SplitTimings& measured, const StepBytes& bytes,
                     double cpu_movable_bytes) {
  alpha_.push_back(predicted.alpha);
  predicted_gpu_.push_back(predicted.gpu_seconds);
  predicted_cpu_.push_back(predicted.cpu_seconds);
  predicted_step_.push_back(predicted.step_seconds);
  measured_gpu_.push_back(measured.gpu_seconds);
  measured_cpu_.push_back(measured.cpu_seconds);
  measured_step_.push_back(measured.step_seconds);
  bytes_.insert(bytes_.end(),
                {bytes.gpu_resident, bytes.movable - cpu_movable_bytes, bytes.cpu_resident, cpu_movable_bytes});
}

void StepLog::write(ResultsGroup& group) const {
  group.write("alpha", alpha_);
  group.write("predicted_gpu_seconds", predicted_gpu_);
  group.write("predicted_cpu_seconds", predicted_cpu_);
  group.write("predicted_step_seconds", predicted_step_);
  group.write("measured_gpu_seconds", measured_gpu_);
  group.write("measured_cpu_seconds", measured_cpu_);
  group.write("measured_step_seconds", measured_step_);
  group.write("bytes", bytes_, {steps(), 4});
  group.set_attribute("bytes_columns", byte_columns);
}

}  // namespace writescope
