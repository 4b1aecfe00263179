#include "attention/host_prefetch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "attention/decode.hpp"
#include "attention/shape.hpp"
#include "framework/host_memory.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace {

constexpr PrefetchLevel all_levels[] = {PrefetchLevel::l1, PrefetchLevel::l2};
constexpr int unpinned = -1;
std::atomic<int> pinned{unpinned};
// The measurement's own pin, for the kernels it launches on its thread only.
thread_local int probing = unpinned;

constexpr char environment_variable[] = "WRITESCOPE_NEXT_PASS_PREFETCH";

/// The environment's level, or unpinned.
int from_environment() {
  const char* value = std::getenv(environment_variable);
  if (value == nullptr || *value == '\0') return unpinned;
  try {
    return static_cast<int>(parse_prefetch_level(value));
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string(environment_variable) + ": " + error.what());
  }
}

/// The decode step the levels are timed on: one sequence over a pool of
/// whole head-major blocks, more than twice the last-level cache.
class Probe {
 public:
  explicit Probe(const AttentionShape& shape)
      : shape_(shape), geometry_(shape.block_geometry(block_tokens)) {
    const std::int64_t block_bytes = geometry_.block_elements() * static_cast<std::int64_t>(sizeof(bf16));
    const std::int64_t wanted = next_pass_probe_bytes(last_level_cache_bytes());
    const int blocks = static_cast<int>((wanted + block_bytes - 1) / block_bytes);
    pool_ = Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace>(
        Kokkos::view_alloc("writescope::attention::prefetch_probe_pool", Kokkos::WithoutInitializing), blocks,
        geometry_.block_elements());
    advise_huge_pages(pool_);  // as the cache's host pools
    // One block of values of a few bits in [-0.5, 0.5) (softmax weights of
    // every size), copied into the others.
    bf16* data = pool_.data();
    const std::int64_t elements = geometry_.block_elements();
    for (std::int64_t i = 0; i < elements; ++i)
      data[i] = from_float<bf16>(static_cast<float>((static_cast<std::uint64_t>(i) * 2654435761u) >> 24 & 255) /
                                     256.0f -
                                 0.5f);
    for (int block = 1; block < blocks; ++block)
      std::memcpy(data + block * elements, data, static_cast<std::size_t>(block_bytes));
    queries_ = Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace>(
        Kokkos::view_alloc("writescope::attention::prefetch_probe_queries", Kokkos::WithoutInitializing), 1,
        shape.q_heads, shape.key_dim);
    for (std::size_t i = 0; i < queries_.span(); ++i)
      queries_.data()[i] = static_cast<float>(i % 7) / 7.0f - 0.5f;
    for (int slot = 0; slot < blocks; ++slot)
      segments_.push_back(BlockSegment{0, slot, 0, block_tokens, std::int64_t{slot} * block_tokens});
    out_ = PartialState<HostMemSpace>(Kokkos::WithoutInitializing, "writescope::attention::prefetch_probe", 1,
                                      shape.q_heads, shape.value_dim);
  }
  std::int64_t kv_bytes() const { return static_cast<std::int64_t>(pool_.span() * sizeof(bf16)); }
  /// Milliseconds of one step with the next pass requested into `level`.
  double step_ms(PrefetchLevel level) {
    probing = static_cast<int>(level);
    const HostExecSpace space;
    space.fence();
    const auto start = std::chrono::steady_clock::now();
    decode_attention(space, shape_, geometry_, BlockOrder::head_major, ConstQueries(queries_), ConstPool(pool_),
                     segments_, workspace_, out_);
    space.fence();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    probing = unpinned;
    return ms;
  }

 private:
  static constexpr int block_tokens = 256;
  using ConstQueries = Kokkos::View<const float***, Kokkos::LayoutRight, HostMemSpace>;
  using ConstPool = Kokkos::View<const bf16**, Kokkos::LayoutRight, HostMemSpace>;
  AttentionShape shape_;
  BlockGeometry geometry_;
  Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace> pool_;
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> queries_;
  std::vector<BlockSegment> segments_;
  DecodeWorkspace<HostMemSpace> workspace_;
  PartialState<HostMemSpace> out_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

NextPassPrefetchMeasurement measure(const AttentionShape& shape) {
  NextPassPrefetchMeasurement m;
  const CpuPath path = impl::host_product_path(active_cpu_path(), shape.block_geometry(256), BlockOrder::head_major,
                                               shape.group(), true);
  m.path = cpu_path_name(path);
  std::ostringstream probe_name;
  probe_name << shape.name << " (" << shape.q_heads << " query / " << shape.kv_heads << " KV heads), head-major";
  m.probe = probe_name.str();
  if (!impl::honours_next_pass_level(path, shape.block_geometry(256).tiled_keys(BlockOrder::head_major),
                                     shape.group()))
    return m;
  Probe probe(shape);
  probe.step_ms(PrefetchLevel::l1);  // warm-up: workspace, first touch of the state
  probe.step_ms(PrefetchLevel::l2);
  constexpr int alternations = 7;
  std::vector<double> l1, l2;
  for (int round = 0; round < alternations; ++round) {
    // Each level first in every other round: drift lands on both.
    const bool l1_first = round % 2 == 0;
    const double first = probe.step_ms(l1_first ? PrefetchLevel::l1 : PrefetchLevel::l2);
    const double second = probe.step_ms(l1_first ? PrefetchLevel::l2 : PrefetchLevel::l1);
    l1.push_back(l1_first ? first : second);
    l2.push_back(l1_first ? second : first);
  }
  m.measured = true;
  m.kv_bytes = probe.kv_bytes();
  m.alternations = alternations;
  m.l1_ms = median(l1);
  m.l2_ms = median(l2);
  m.faster = faster_prefetch_level(m.l1_ms, m.l2_ms);
  return m;
}

// The measurements, per active path and shape (its heads and dimensions, not
// its name: tests attend shapes they make up).
using MeasurementKey = std::tuple<CpuPath, int, int, int, int, bool>;
MeasurementKey measurement_key(const AttentionShape& shape) {
  return {active_cpu_path(), shape.q_heads, shape.kv_heads, shape.key_dim, shape.value_dim, shape.values_in_keys};
}
std::mutex measurements_mutex;
std::map<MeasurementKey, std::unique_ptr<const NextPassPrefetchMeasurement>> measurements;

}  // namespace

const char* prefetch_level_name(PrefetchLevel level) { return level == PrefetchLevel::l2 ? "l2" : "l1"; }

PrefetchLevel parse_prefetch_level(const std::string& name) {
  for (PrefetchLevel level : all_levels)
    if (name == prefetch_level_name(level)) return level;
  throw std::invalid_argument("unknown prefetch level '" + name + "' (known: l1, l2)");
}

std::int64_t next_pass_probe_bytes(std::int64_t last_level_cache_bytes) {
  constexpr std::int64_t least = std::int64_t{64} << 20, most = std::int64_t{256} << 20;
  return std::min(most, std::max(least, 2 * last_level_cache_bytes));
}

PrefetchLevel faster_prefetch_level(double l1_ms, double l2_ms) {
  return l2_ms <= 0.97 * l1_ms ? PrefetchLevel::l2 : PrefetchLevel::l1;
}

const NextPassPrefetchMeasurement& next_pass_prefetch_measurement(const AttentionShape& shape) {
  const std::lock_guard<std::mutex> lock(measurements_mutex);
  std::unique_ptr<const NextPassPrefetchMeasurement>& m = measurements[measurement_key(shape)];
  if (!m) m = std::make_unique<const NextPassPrefetchMeasurement>(measure(shape));
  return *m;
}

PrefetchLevel active_next_pass_prefetch(const AttentionShape& shape) {
  if (probing != unpinned) return static_cast<PrefetchLevel>(probing);
  if (const int level = pinned.load(); level != unpinned) return static_cast<PrefetchLevel>(level);
  if (const int level = from_environment(); level != unpinned) return static_cast<PrefetchLevel>(level);
  return next_pass_prefetch_measurement(shape).faster;
}

void set_next_pass_prefetch(PrefetchLevel level) { pinned = static_cast<int>(level); }

std::string describe_next_pass_prefetch(const AttentionShape& shape) {
  const std::string level = prefetch_level_name(active_next_pass_prefetch(shape));
  if (pinned.load() != unpinned) return level + " (pinned)";
  if (from_environment() != unpinned) return level + " (" + environment_variable + ")";
  const NextPassPrefetchMeasurement& m = next_pass_prefetch_measurement(shape);
  if (!m.measured) return level + " (" + m.probe + " on " + m.path + " does not request the next pass by level)";
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(3);
  out << level << " (measured on " << m.path << ", " << m.probe << ", " << (m.kv_bytes >> 20) << " MiB, medians of "
      << m.alternations << ": l1 " << m.l1_ms << " ms, l2 " << m.l2_ms << " ms)";
  return out.str();
}

ScopedNextPassPrefetch::ScopedNextPassPrefetch(PrefetchLevel level) : previous_(pinned.load()) {
  set_next_pass_prefetch(level);
}

ScopedNextPassPrefetch::~ScopedNextPassPrefetch() { pinned = previous_; }

namespace impl {

void replace_next_pass_prefetch_measurement(const AttentionShape& shape, const NextPassPrefetchMeasurement& m) {
  const std::lock_guard<std::mutex> lock(measurements_mutex);
  measurements[measurement_key(shape)] = std::make_unique<const NextPassPrefetchMeasurement>(m);
}

bool honours_next_pass_level(CpuPath path, bool tiled_keys, int group) {
  return (path == CpuPath::avx512_bf16 || (path == CpuPath::avx512_fma && group <= 4)) && tiled_keys;
}

PrefetchLevel next_pass_level(CpuPath path, bool tiled_keys, int group, PrefetchLevel requested) {
  return honours_next_pass_level(path, tiled_keys, group) ? requested : PrefetchLevel::l1;
}

}  // namespace impl
}  // namespace writescope
