#pragma once
// Page-locking an existing host allocation for the GPU's DMA (cudaHostRegister),
// so that one copy of a large store (the routed experts) can be pinned for the
// systems that copy from it and stay pageable for those that do not, without
// being rebuilt. In a host-only build nothing is locked; the bytes are still
// counted, so budgets and records read alike in both builds.

#include <cstddef>

namespace writescope {

class HostPinning {
 public:
  /// Locks [data, data + bytes); std::runtime_error names the bytes and the
  /// CUDA error when the driver refuses.
  HostPinning(void* data, std::size_t bytes);
  ~HostPinning();
  HostPinning(const HostPinning&) = delete;
  HostPinning& operator=(const HostPinning&) = delete;

  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;
};

}  // namespace writescope
