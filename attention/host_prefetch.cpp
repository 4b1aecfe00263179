#include "attention/host_prefetch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
constexpr std::array<CpuPath, 2> product_paths = {CpuPath::avx512_bf16, CpuPath::avx512_fma};
constexpr int unpinned = -1;
std::atomic<int> pinned{unpinned}, pinned_pass{unpinned};

/// The measurements' own pins (CpuPath, PrefetchLevel, tokens per pass), for
/// the kernels they launch on their thread only.
struct Pins {
  int path = unpinned, level = unpinned, pass = unpinned;
};
thread_local Pins probing;

/// Sets `probing` for a scope, restoring the pins before.
class ProbingPins {
 public:
  explicit ProbingPins(Pins pins) : previous_(probing) { probing = pins; }
  ~ProbingPins() { probing = previous_; }
  ProbingPins(const ProbingPins&) = delete;
  ProbingPins& operator=(const ProbingPins&) = delete;

 private:
  Pins previous_;
};

constexpr char environment_variable[] = "WRITESCOPE_NEXT_PASS_PREFETCH";
constexpr char pass_environment_variable[] = "WRITESCOPE_TOKEN_MAJOR_PASS";
constexpr char head_pass_environment_variable[] = "WRITESCOPE_HEAD_MAJOR_PASS";

/// `variable`'s value parsed by `parse` (as an int), or unpinned.
template <class Parse>
int from_environment(const char* variable, Parse parse) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return unpinned;
  try {
    return static_cast<int>(parse(value));
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string(variable) + ": " + error.what());
  }
}
int level_from_environment() { return from_environment(environment_variable, parse_prefetch_level); }
int pass_from_environment() { return from_environment(pass_environment_variable, parse_token_major_pass); }
int head_pass_from_environment() {
  return from_environment(head_pass_environment_variable,
                          [](const std::string& tokens) { return parse_pass_length(tokens, "head-major pass"); });
}

/// The probes' KV: bf16 values of a few bits in [-0.5, 0.5) (softmax weights
/// of every size), filled once and shared by the probes that run while one is
/// held (a product path measurement holds one over its paths' level and pass
/// probes and its own: one fill of 512 MiB instead of up to three).
std::atomic<int> probe_pools_filled{0};

class ProbePool {
 public:
  explicit ProbePool(std::int64_t elements)
      : values_(Kokkos::view_alloc("writescope::attention::prefetch_probe_pool", Kokkos::WithoutInitializing),
                elements) {
    ++probe_pools_filled;
    advise_huge_pages(values_);  // as the cache's host pools
    // One chunk of the pattern, copied into the rest.
    constexpr std::int64_t chunk = 1 << 16;
    bf16* data = values_.data();
    for (std::int64_t i = 0; i < std::min(chunk, elements); ++i)
      data[i] = from_float<bf16>(
          static_cast<float>((static_cast<std::uint64_t>(i) * 2654435761u) >> 24 & 255) / 256.0f - 0.5f);
    for (std::int64_t begin = chunk; begin < elements; begin += chunk)
      std::memcpy(data + begin, data, static_cast<std::size_t>(std::min(chunk, elements - begin)) * sizeof(bf16));
  }
  std::int64_t elements() const { return static_cast<std::int64_t>(values_.span()); }
  const bf16* data() const { return values_.data(); }

 private:
  Kokkos::View<bf16*, HostMemSpace> values_;
};

/// A pool of at least `elements`: the one a probe or measurement still holds
/// where it is large enough, else a new one.
std::shared_ptr<const ProbePool> probe_pool(std::int64_t elements) {
  static std::mutex mutex;
  static std::weak_ptr<const ProbePool> held;
  const std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<const ProbePool> pool = held.lock(); pool && pool->elements() >= elements) return pool;
  auto pool = std::make_shared<const ProbePool>(elements);
  held = pool;
  return pool;
}

/// How a probe of blocks of `geometry` lays out its steps: `blocks` a step,
/// more than twice the last-level cache, in `windows` windows.
struct ProbeLayout {
  int blocks = 0, windows = 0;
  std::int64_t elements() const { return std::int64_t{blocks} * windows; }  // blocks in all
};
ProbeLayout probe_layout(const BlockGeometry& geometry) {
  const std::int64_t block_bytes = geometry.block_elements() * static_cast<std::int64_t>(sizeof(bf16));
  const std::int64_t wanted = next_pass_probe_bytes(last_level_cache_bytes());
  ProbeLayout layout;
  layout.blocks = static_cast<int>((wanted + block_bytes - 1) / block_bytes);
  layout.windows = next_pass_probe_windows(layout.blocks * block_bytes);
  return layout;
}

constexpr int probe_block_tokens = 256;

/// The pool elements a probe of `shape` reads.
std::int64_t probe_pool_elements(const AttentionShape& shape) {
  const BlockGeometry geometry = shape.block_geometry(probe_block_tokens);
  return probe_layout(geometry).elements() * geometry.block_elements();
}

/// The decode step the choices are timed on: one sequence of whole blocks in
/// `order`, more than twice the last-level cache, in the next of
/// next_pass_probe_windows windows of a shared pool (probe_pool) at each step.
class Probe {
 public:
  Probe(const AttentionShape& shape, BlockOrder order)
      : shape_(shape), order_(order), geometry_(shape.block_geometry(probe_block_tokens)) {
    const ProbeLayout layout = probe_layout(geometry_);
    const int blocks = layout.blocks;
    windows_ = layout.windows;
    window_read_.assign(static_cast<std::size_t>(windows_), false);
    pool_ = probe_pool(probe_pool_elements(shape));
    blocks_ = ConstPool(pool_->data(), layout.elements(), geometry_.block_elements());
    queries_ = Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace>(
        Kokkos::view_alloc("writescope::attention::prefetch_probe_queries", Kokkos::WithoutInitializing), 1,
        shape.q_heads, shape.key_dim);
    for (std::size_t i = 0; i < queries_.span(); ++i)
      queries_.data()[i] = static_cast<float>(i % 7) / 7.0f - 0.5f;
    segments_.resize(static_cast<std::size_t>(windows_));
    for (int window = 0; window < windows_; ++window)
      for (int block = 0; block < blocks; ++block)
        segments_[window].push_back(
            BlockSegment{0, window * blocks + block, 0, probe_block_tokens, std::int64_t{block} * probe_block_tokens});
    out_ = PartialState<HostMemSpace>(Kokkos::WithoutInitializing, "writescope::attention::prefetch_probe", 1,
                                      shape.q_heads, shape.value_dim);
  }
  std::int64_t pool_bytes() const { return static_cast<std::int64_t>(blocks_.span() * sizeof(bf16)); }
  std::int64_t kv_bytes() const { return pool_bytes() / windows_; }
  int windows_read() const { return static_cast<int>(std::count(window_read_.begin(), window_read_.end(), true)); }
  /// The product path of the last step.
  CpuPath path_run() const { return workspace_.host_path; }
  void forget_windows_read() { window_read_.assign(window_read_.size(), false); }
  /// Milliseconds of one step, over the next window, with `pins`' path, next
  /// pass level and tokens per pass (the measured choices where unpinned).
  double step_ms(Pins pins) {
    const ProbingPins pinned_here(pins);
    const HostExecSpace space;
    const int window = next_window_;
    next_window_ = (next_window_ + 1) % windows_;
    window_read_[static_cast<std::size_t>(window)] = true;
    space.fence();
    const auto start = std::chrono::steady_clock::now();
    decode_attention(space, shape_, geometry_, order_, ConstQueries(queries_), blocks_, segments_[window], workspace_,
                     out_);
    space.fence();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  using ConstQueries = Kokkos::View<const float***, Kokkos::LayoutRight, HostMemSpace>;
  using ConstPool = Kokkos::View<const bf16**, Kokkos::LayoutRight, HostMemSpace>;
  AttentionShape shape_;
  BlockOrder order_;
  BlockGeometry geometry_;
  std::shared_ptr<const ProbePool> pool_;
  ConstPool blocks_;  // (blocks, block elements) of pool_
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> queries_;
  int windows_ = 1, next_window_ = 0;
  std::vector<bool> window_read_;
  std::vector<std::vector<BlockSegment>> segments_;  // per window
  DecodeWorkspace<HostMemSpace> workspace_;
  PartialState<HostMemSpace> out_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// The probe's shape as results name it, e.g. "qwen3-30b-a3b (32 query / 4 KV heads), head-major".
std::string probe_name(const AttentionShape& shape, BlockOrder order) {
  std::ostringstream name;
  name << shape.name << " (" << shape.q_heads << " query / " << shape.kv_heads << " KV heads), "
       << (order == BlockOrder::head_major ? "head-major" : "token-major");
  return name.str();
}

/// The path the products of `shape` take over bf16 blocks in `order` on `path`.
CpuPath product_path(const AttentionShape& shape, BlockOrder order, CpuPath path) {
  return impl::host_product_path(path, shape.block_geometry(probe_block_tokens), order, shape.group(), true);
}

constexpr int alternations = 7;

/// Whether the products of `path` request the next pass of the shape's
/// head-major blocks by level (and so take a measured head-major pass).
bool takes_level(CpuPath path, const AttentionShape& shape) {
  return impl::honours_next_pass_level(path, shape.block_geometry(256).tiled_keys(BlockOrder::head_major),
                                       shape.group());
}

/// Fills m's probe fields for `shape` in `order`; where the products take the
/// choice (`honoured`), the median milliseconds of a probe step with each of
/// `choices` (pinned by `pins(choice)`), alternated: each round in the other
/// order than the last, so that drift lands on all.
template <class Choice, std::size_t N, class ChoicePins>
std::optional<std::array<double, N>> probe_choices(HostProbe& m, const AttentionShape& shape, BlockOrder order,
                                                   bool honoured, const std::array<Choice, N>& choices,
                                                   ChoicePins pins) {
  m.probe = probe_name(shape, order);
  if (!honoured) return std::nullopt;
  Probe probe(shape, order);
  for (const Choice& choice : choices) probe.step_ms(pins(choice));  // warm-up: workspace, first touch of the state
  probe.forget_windows_read();
  std::array<std::vector<double>, N> ms;
  m.paths_run.resize(N);
  for (int round = 0; round < alternations; ++round)
    for (std::size_t i = 0; i < N; ++i) {
      const std::size_t c = round % 2 == 0 ? i : N - 1 - i;
      ms[c].push_back(probe.step_ms(pins(choices[c])));
      m.paths_run[c] = probe.path_run();
    }
  std::array<double, N> medians{};
  for (std::size_t c = 0; c < N; ++c) medians[c] = median(ms[c]);
  m.measured = true;
  m.kv_bytes = probe.kv_bytes();
  m.pool_bytes = probe.pool_bytes();
  m.windows_read = probe.windows_read();
  m.alternations = alternations;
  return medians;
}

/// The level measurement of `shape` on `path` (head-major blocks).
NextPassPrefetchMeasurement measure_level(const AttentionShape& shape, CpuPath path, BlockOrder order) {
  NextPassPrefetchMeasurement m;
  m.path = cpu_path_name(path);
  // Every (level, length), level-major.
  std::array<std::pair<PrefetchLevel, int>, 2 * pass_lengths.size()> choices;
  for (std::size_t i = 0; i < choices.size(); ++i)
    choices[i] = {all_levels[i / pass_lengths.size()], pass_lengths[i % pass_lengths.size()]};
  const auto ms =
      probe_choices(m, shape, order, takes_level(path, shape), choices, [path](std::pair<PrefetchLevel, int> c) {
        return Pins{static_cast<int>(path), static_cast<int>(c.first), c.second};
      });
  if (ms) {
    for (std::size_t i = 0; i < choices.size(); ++i) m.pass_ms[i / pass_lengths.size()][i % pass_lengths.size()] = (*ms)[i];
    double* level_ms[] = {&m.l1_ms, &m.l2_ms};
    for (int level = 0; level < 2; ++level) {
      m.pass_for[level] = fastest_pass(m.pass_ms[level], pass_lengths.back());
      const auto at = std::find(pass_lengths.begin(), pass_lengths.end(), m.pass_for[level]) - pass_lengths.begin();
      *level_ms[level] = m.pass_ms[level][at];
    }
    m.faster = faster_prefetch_level(m.l1_ms, m.l2_ms);
  }
  return m;
}

/// The token-major pass measurement of `shape` on `path` (token-major blocks).
TokenMajorPassMeasurement measure_pass(const AttentionShape& shape, CpuPath path, BlockOrder order) {
  TokenMajorPassMeasurement m;
  m.path = cpu_path_name(path);
  // Token rows request their next pass into L1 at every length.
  const auto ms =
      probe_choices(m, shape, order, impl::honours_token_major_pass(path, shape), pass_lengths, [path](int tokens) {
        return Pins{static_cast<int>(path), static_cast<int>(PrefetchLevel::l1), tokens};
      });
  if (ms) {
    m.ms = *ms;
    m.rule = impl::token_major_pass_rule(std::int64_t{shape.kv_heads} * (shape.key_dim + shape.value_dim) *
                                         static_cast<std::int64_t>(sizeof(bf16)));
    m.fastest = fastest_pass(m.ms, m.rule);
  }
  return m;
}

/// Measurements of one kind, per path, block order and shape (its heads and
/// dimensions, not its name: tests attend shapes they make up), each taken
/// once by `measure`. Callers pick the path before: picking it may measure
/// other kinds (active_decode_cpu_path), which must not wait on this lock. A
/// measurement whose probe asks for its own kind (a choice its pins missed)
/// is an error, not a wait on itself.
template <class Measurement, Measurement (*measure)(const AttentionShape&, CpuPath, BlockOrder)>
class PerShape {
 public:
  const Measurement& get(const AttentionShape& shape, CpuPath path, BlockOrder order) {
    if (measuring_)
      throw std::logic_error("host decode attention: a probe asked for the measurement it is taking (" +
                             probe_name(shape, order) + " on " + cpu_path_name(path) + ")");
    const std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<const Measurement>& m = measurements_[key(shape, path, order)];
    if (!m) {
      measuring_ = true;
      try {
        m = std::make_unique<const Measurement>(measure(shape, path, order));
      } catch (...) {
        measuring_ = false;
        throw;
      }
      measuring_ = false;
    }
    return *m;
  }
  void replace(const AttentionShape& shape, CpuPath path, BlockOrder order, const Measurement& m) {
    const std::lock_guard<std::mutex> lock(mutex_);
    measurements_[key(shape, path, order)] = std::make_unique<const Measurement>(m);
  }

 private:
  using Key = std::tuple<CpuPath, BlockOrder, int, int, int, int, bool>;
  static Key key(const AttentionShape& shape, CpuPath path, BlockOrder order) {
    return {path, order, shape.q_heads, shape.kv_heads, shape.key_dim, shape.value_dim, shape.values_in_keys};
  }
  std::mutex mutex_;
  std::map<Key, std::unique_ptr<const Measurement>> measurements_;
  static inline thread_local bool measuring_ = false;
};

/// The product path measurement of `shape` over blocks in `order` for a
/// machine whose path is `machine` (one of product_paths): each path's own
/// choices measured first, then a step on each path with them, all over one
/// pool.
ProductPathMeasurement measure_product_path(const AttentionShape& shape, CpuPath machine, BlockOrder order) {
  ProductPathMeasurement m;
  m.path = std::string(cpu_path_name(product_paths[0])) + " and " + cpu_path_name(product_paths[1]);
  m.machine = m.faster = machine;
  bool both_take = impl::measures_product_path(machine);
  for (const CpuPath path : product_paths)
    both_take = both_take && cpu_path_supported(path) && product_path(shape, order, path) == path;
  std::shared_ptr<const ProbePool> pool;  // one fill for every probe below
  if (both_take) {
    pool = probe_pool(probe_pool_elements(shape));
    for (const CpuPath path : product_paths) {
      const ProbingPins on_path(Pins{static_cast<int>(path)});
      if (order == BlockOrder::head_major)
        active_head_major_pass(shape);  // with its level
      else
        active_token_major_pass(shape);
    }
  }
  const auto ms = probe_choices(m, shape, order, both_take, product_paths,
                                [](CpuPath path) { return Pins{static_cast<int>(path)}; });
  if (ms) {
    m.bf16_ms = (*ms)[0];
    m.fma_ms = (*ms)[1];
    m.faster = faster_product_path(machine, m.bf16_ms, m.fma_ms);
  }
  return m;
}

PerShape<NextPassPrefetchMeasurement, measure_level> level_measurements;
PerShape<TokenMajorPassMeasurement, measure_pass> pass_measurements;
PerShape<ProductPathMeasurement, measure_product_path> path_measurements;

/// A description's "measured on <path>, <probe>, <n> MiB a step over <pool> MiB, medians of <rounds>: ", its
/// figures to follow.
std::ostringstream measured_on(const HostProbe& m) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(3);
  out << "measured on " << m.path << ", " << m.probe << ", " << (m.kv_bytes >> 20) << " MiB a step over "
      << (m.pool_bytes >> 20) << " MiB, medians of " << m.alternations << ": ";
  return out;
}

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

int next_pass_probe_windows(std::int64_t step_bytes) {
  constexpr std::int64_t pool = std::int64_t{512} << 20;
  return static_cast<int>(std::max<std::int64_t>(2, pool / std::max<std::int64_t>(1, step_bytes)));
}

PrefetchLevel faster_prefetch_level(double l1_ms, double l2_ms) {
  return l2_ms <= 0.97 * l1_ms ? PrefetchLevel::l2 : PrefetchLevel::l1;
}

const NextPassPrefetchMeasurement& next_pass_prefetch_measurement(const AttentionShape& shape) {
  const CpuPath path = decode_product_path(shape, BlockOrder::head_major);
  return level_measurements.get(shape, path, BlockOrder::head_major);
}

PrefetchLevel active_next_pass_prefetch(const AttentionShape& shape) {
  if (probing.level != unpinned) return static_cast<PrefetchLevel>(probing.level);
  if (const int level = pinned.load(); level != unpinned) return static_cast<PrefetchLevel>(level);
  if (const int level = level_from_environment(); level != unpinned) return static_cast<PrefetchLevel>(level);
  return next_pass_prefetch_measurement(shape).faster;
}

void set_next_pass_prefetch(PrefetchLevel level) { pinned = static_cast<int>(level); }

int active_head_major_pass(const AttentionShape& shape) {
  if (!takes_level(decode_product_path(shape, BlockOrder::head_major), shape)) return 0;
  if (probing.pass != unpinned) return probing.pass;
  if (const int tokens = head_pass_from_environment(); tokens != unpinned) return tokens;
  const PrefetchLevel level = active_next_pass_prefetch(shape);
  return next_pass_prefetch_measurement(shape).pass_for[static_cast<int>(level)];
}

std::string describe_next_pass_prefetch(const AttentionShape& shape) {
  const std::string level = prefetch_level_name(active_next_pass_prefetch(shape));
  std::string passes;  // where the variable pins the head-major passes
  if (head_pass_from_environment() != unpinned && active_head_major_pass(shape) > 0)
    passes = ", passes of " + std::to_string(active_head_major_pass(shape)) + " tokens (" +
             head_pass_environment_variable + ")";
  if (pinned.load() != unpinned) return level + " (pinned)" + passes;
  if (level_from_environment() != unpinned) return level + " (" + environment_variable + ")" + passes;
  if (!passes.empty()) return level + " (measured)" + passes;
  const NextPassPrefetchMeasurement& m = next_pass_prefetch_measurement(shape);
  if (!m.measured) return level + " (" + m.probe + " on " + m.path + " does not request the next pass by level)";
  std::ostringstream out = measured_on(m);
  for (int l = 0; l < 2; ++l) {
    out << (l ? ", " : "") << prefetch_level_name(all_levels[l]) << " at ";
    for (std::size_t i = 0; i < pass_lengths.size(); ++i) out << (i ? "/" : "") << pass_lengths[i];
    out << " tokens";
    for (const double ms : m.pass_ms[l]) out << " " << ms;
    out << " ms";
  }
  return level + ", passes of " + std::to_string(active_head_major_pass(shape)) + " tokens (" + out.str() + ")";
}

ScopedNextPassPrefetch::ScopedNextPassPrefetch(PrefetchLevel level) : previous_(pinned.load()) {
  set_next_pass_prefetch(level);
}

ScopedNextPassPrefetch::~ScopedNextPassPrefetch() { pinned = previous_; }

int parse_pass_length(const std::string& tokens, const std::string& what) {
  std::string known;
  for (const int length : pass_lengths) {
    if (tokens == std::to_string(length)) return length;
    known += (known.empty() ? "" : ", ") + std::to_string(length);
  }
  throw std::invalid_argument("unknown " + what + " '" + tokens + "' (known: " + known + ")");
}

int parse_token_major_pass(const std::string& tokens) { return parse_pass_length(tokens, "token-major pass"); }

int fastest_pass(const std::array<double, pass_lengths.size()>& ms, int rule) {
  std::size_t fastest = 0, at_rule = 0;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i] < ms[fastest]) fastest = i;
    if (pass_lengths[i] == rule) at_rule = i;
  }
  return ms[fastest] <= 0.97 * ms[at_rule] ? pass_lengths[fastest] : rule;
}

const TokenMajorPassMeasurement& token_major_pass_measurement(const AttentionShape& shape) {
  const CpuPath path = decode_product_path(shape, BlockOrder::token_major);
  return pass_measurements.get(shape, path, BlockOrder::token_major);
}

int active_token_major_pass(const AttentionShape& shape) {
  if (!impl::honours_token_major_pass(decode_product_path(shape, BlockOrder::token_major), shape)) return 0;
  if (probing.pass != unpinned) return probing.pass;
  if (const int tokens = pinned_pass.load(); tokens != unpinned) return tokens;
  if (const int tokens = pass_from_environment(); tokens != unpinned) return tokens;
  return token_major_pass_measurement(shape).fastest;
}

std::string describe_token_major_pass(const AttentionShape& shape) {
  const int tokens = active_token_major_pass(shape);
  const std::string length = std::to_string(tokens) + " tokens";
  const TokenMajorPassMeasurement& m = token_major_pass_measurement(shape);
  if (tokens == 0) return "not measured (" + m.probe + " on " + m.path + " passes by its own rule)";
  if (pinned_pass.load() != unpinned) return length + " (pinned)";
  if (pass_from_environment() != unpinned) return length + " (" + pass_environment_variable + ")";
  std::ostringstream out = measured_on(m);
  for (std::size_t i = 0; i < m.ms.size(); ++i)
    out << (i ? ", " : "") << pass_lengths[i] << " tokens " << m.ms[i] << " ms";
  out << "; the rule's " << m.rule;
  return length + " (" + out.str() + ")";
}

ScopedTokenMajorPass::ScopedTokenMajorPass(int tokens) : previous_(pinned_pass.load()) {
  parse_token_major_pass(std::to_string(tokens));  // a length the products take, or the error
  pinned_pass = tokens;
}

ScopedTokenMajorPass::~ScopedTokenMajorPass() { pinned_pass = previous_; }

CpuPath faster_product_path(CpuPath machine, double bf16_ms, double fma_ms) {
  const bool fma = machine == CpuPath::avx512_fma;
  const double machine_ms = fma ? fma_ms : bf16_ms, other_ms = fma ? bf16_ms : fma_ms;
  return other_ms <= 0.97 * machine_ms ? (fma ? CpuPath::avx512_bf16 : CpuPath::avx512_fma) : machine;
}

const ProductPathMeasurement& product_path_measurement(const AttentionShape& shape, BlockOrder order) {
  return path_measurements.get(shape, active_cpu_path(), order);
}

CpuPath active_decode_cpu_path(const AttentionShape& shape, BlockOrder order) {
  if (probing.path != unpinned) return static_cast<CpuPath>(probing.path);
  const CpuPath machine = active_cpu_path();
  if (*cpu_path_pinned_by() != '\0' || !impl::measures_product_path(machine)) return machine;
  return product_path_measurement(shape, order).faster;
}

CpuPath decode_product_path(const AttentionShape& shape, BlockOrder order) {
  return product_path(shape, order, active_decode_cpu_path(shape, order));
}

std::string describe_decode_cpu_path(const AttentionShape& shape, BlockOrder order) {
  const CpuPath asked = active_decode_cpu_path(shape, order), runs = decode_product_path(shape, order);
  const std::string path = cpu_path_name(runs);
  const char* by = cpu_path_pinned_by();
  // The path the products run leads: products that do not take the shape
  // fall back (impl::host_product_path), and a shape no product path
  // measures runs the machine's path.
  if (runs != asked)
    return path + " (" + cpu_path_name(asked) + (*by != '\0' ? std::string(", from ") + by : ", the machine's path") +
           ", does not take " + probe_name(shape, order) + ")";
  if (*by != '\0') return path + " (" + by + ")";
  if (!impl::measures_product_path(active_cpu_path())) return path + " (this machine's; no other path is measured)";
  const ProductPathMeasurement& m = product_path_measurement(shape, order);
  if (!m.measured) return path + " (" + m.probe + ": not both AVX-512 products take it)";
  std::ostringstream out = measured_on(m);
  out << cpu_path_name(product_paths[0]) << " " << m.bf16_ms << " ms, " << cpu_path_name(product_paths[1]) << " "
      << m.fma_ms << " ms; the machine's " << cpu_path_name(m.machine);
  return path + " (" + out.str() + ")";
}

std::string describe_decode_cpu_paths(const AttentionShape& shape) {
  return "head-major: " + describe_decode_cpu_path(shape, BlockOrder::head_major) +
         "; token-major: " + describe_decode_cpu_path(shape, BlockOrder::token_major);
}

std::string host_attention_choices(const AttentionShape& shape) {
  std::ostringstream out;
  out << "head-major " << cpu_path_name(decode_product_path(shape, BlockOrder::head_major));
  if (const int passes = active_head_major_pass(shape); passes > 0)
    out << ", next pass into " << prefetch_level_name(active_next_pass_prefetch(shape)) << ", passes of " << passes
        << " tokens";
  out << "; token-major " << cpu_path_name(decode_product_path(shape, BlockOrder::token_major));
  if (const int tokens = active_token_major_pass(shape); tokens > 0) out << ", passes of " << tokens << " tokens";
  return out.str();
}

namespace impl {

void replace_next_pass_prefetch_measurement(const AttentionShape& shape, const NextPassPrefetchMeasurement& m) {
  level_measurements.replace(shape, decode_product_path(shape, BlockOrder::head_major), BlockOrder::head_major, m);
}

bool honours_next_pass_level(CpuPath path, bool tiled_keys, int group) {
  return (path == CpuPath::avx512_bf16 || (path == CpuPath::avx512_fma && group <= 4)) && tiled_keys;
}

PrefetchLevel next_pass_level(CpuPath path, bool tiled_keys, int group, PrefetchLevel requested) {
  return honours_next_pass_level(path, tiled_keys, group) ? requested : PrefetchLevel::l1;
}

void replace_token_major_pass_measurement(const AttentionShape& shape, const TokenMajorPassMeasurement& m) {
  pass_measurements.replace(shape, decode_product_path(shape, BlockOrder::token_major), BlockOrder::token_major, m);
}

void replace_product_path_measurement(const AttentionShape& shape, BlockOrder order, const ProductPathMeasurement& m) {
  path_measurements.replace(shape, active_cpu_path(), order, m);
}

int probe_pools_filled() { return writescope::probe_pools_filled.load(); }

bool measures_product_path(CpuPath machine) {
  return std::find(product_paths.begin(), product_paths.end(), machine) != product_paths.end();
}

bool honours_token_major_pass(CpuPath path, const AttentionShape& shape) {
  return (path == CpuPath::avx512_bf16 || path == CpuPath::avx512_fma) && !shape.values_in_keys &&
         !shape.block_geometry(256).tiled_keys(BlockOrder::token_major);
}

}  // namespace impl
}  // namespace writescope
