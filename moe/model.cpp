#include "moe/model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "attention/prefill.hpp"
#include "framework/concurrent.hpp"
#include "framework/config.hpp"
#include "framework/host_memory.hpp"
#include "framework/host_pinning.hpp"
#include "framework/launch.hpp"
#include "framework/machine.hpp"
#include "framework/streams.hpp"
#include "framework/timer.hpp"
#include "moe/impl/model_kernels.hpp"
#include "moe/layer_kernels.hpp"
#include "moe/linear.hpp"

namespace writescope {
namespace {

using Gpu = GpuExecSpace;
using GpuMem = GpuMemSpace;
using Host = HostExecSpace;
template <class MemSpace>
using WeightView = Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace>;
using TokenRows = Kokkos::View<bf16***, Kokkos::LayoutRight, GpuMem>;  // (tokens, heads, dim)
using Queries = Kokkos::View<float***, Kokkos::LayoutRight, GpuMem>;    // (rows, q_heads, key_dim)

/// Starts into = from on `space` (asynchronous where the space is).
template <class ExecSpace, class Into, class From>
void start_expert_copy(const ExecSpace& space, const Into& into, const From& from) {
  Kokkos::deep_copy(space, into.gate, from.gate);
  Kokkos::deep_copy(space, into.up, from.up);
  Kokkos::deep_copy(space, into.down, from.down);
}

/// into = from, on `space`; returns when the copy is done.
template <class ExecSpace, class Into, class From>
void copy_expert(const ExecSpace& space, const Into& into, const From& from) {
  start_expert_copy(space, into, from);
  space.fence();
}

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

/// Names of a routed expert's gate, up and down projections.
std::array<std::string, 3> expert_tensor_names(const ModelConfig& config, int layer, int expert) {
  if (config.architecture == Architecture::mixtral) {
    const std::string p = layer_prefix(layer) + "block_sparse_moe.experts." + std::to_string(expert) + ".";
    return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  }
  const std::string p = layer_prefix(layer) + "mlp.experts." + std::to_string(expert) + ".";
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

/// Grows a rank-3 view to at least (rows, b, c).
template <class View>
View scratch3(View& v, const char* label, int rows, int b, int c) {
  if (v.extent(0) < static_cast<std::size_t>(rows) || v.extent(1) != static_cast<std::size_t>(b) ||
      v.extent(2) != static_cast<std::size_t>(c))
    v = View(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), std::size_t(rows), std::size_t(b),
             std::size_t(c));
  return Kokkos::subview(v, std::make_pair(0, rows), Kokkos::ALL, Kokkos::ALL);
}

/// Seconds of `work` on the GPU instance `gpu`, fenced before and after.
template <class Work>
double gpu_seconds(const Gpu& gpu, Work&& work) {
  return time_fenced(gpu, [&](const Gpu&) { work(); });
}

}  // namespace

namespace impl {

/// One routed expert's weights: gate and up (intermediate, hidden), down (hidden, intermediate).
template <class MemSpace>
struct ExpertBuffers {
  WeightView<MemSpace> gate, up, down;
  ExpertBuffers() = default;
  ExpertBuffers(const std::string& label, int hidden, int intermediate)
      : gate(Kokkos::view_alloc(label + "_gate", Kokkos::WithoutInitializing), std::size_t(intermediate),
             std::size_t(hidden)),
        up(Kokkos::view_alloc(label + "_up", Kokkos::WithoutInitializing), std::size_t(intermediate),
           std::size_t(hidden)),
        down(Kokkos::view_alloc(label + "_down", Kokkos::WithoutInitializing), std::size_t(hidden),
             std::size_t(intermediate)) {}
  /// Views into 3 * hidden * intermediate values at `data` (gate, up, down), owned elsewhere.
  ExpertBuffers(bf16* data, int hidden, int intermediate)
      : gate(data, std::size_t(intermediate), std::size_t(hidden)),
        up(data + std::size_t(intermediate) * hidden, std::size_t(intermediate), std::size_t(hidden)),
        down(data + 2 * std::size_t(intermediate) * hidden, std::size_t(hidden), std::size_t(intermediate)) {}
  template <class Space = MemSpace>
  ExpertWeights<bf16, Space> weights() const {
    using Unmanaged = Kokkos::View<const bf16**, Kokkos::LayoutRight, Space>;
    return ExpertWeights<bf16, Space>{Unmanaged(gate.data(), gate.extent(0), gate.extent(1)),
                                      Unmanaged(up.data(), up.extent(0), up.extent(1)),
                                      Unmanaged(down.data(), down.extent(0), down.extent(1))};
  }
};

}  // namespace impl

/// Every routed expert of a model in host memory, [MoE layer][expert]: one
/// allocation (registered once: page-locking works on whole pages, so
/// neighbouring allocations must not be registered apart), page-locked while
/// a model that copies experts to the GPU uses the store
/// (ModelOptions::pin_experts).
struct HostExpertStore {
  Kokkos::View<bf16*, HostMemSpace> memory;  // [MoE layer][expert]: gate, up, down
  std::vector<std::vector<impl::ExpertBuffers<HostMemSpace>>> layers;
  std::unique_ptr<HostPinning> pinning;      // while pinned

  explicit HostExpertStore(const ModelConfig& config)
      : memory(Kokkos::view_alloc(std::string("writescope::moe::host_experts"), Kokkos::WithoutInitializing),
               MoeModel::expert_store_bytes(config) / sizeof(bf16)) {
    advise_huge_pages(memory);  // before the weights are written
    const std::size_t per_expert = MoeModel::expert_bytes(config) / sizeof(bf16);
    bf16* next = memory.data();
    for (int layer = config.dense_layers; layer < config.layers; ++layer) {
      layers.emplace_back();
      for (int e = 0; e < config.experts; ++e, next += per_expert)
        layers.back().emplace_back(next, config.hidden, config.expert_intermediate);
    }
  }
  bool pinned() const noexcept { return pinning != nullptr; }
  void pin(bool on) {
    if (on == pinned()) return;
    pinning = on ? std::make_unique<HostPinning>(memory.data(), bytes()) : nullptr;
  }
  std::uint64_t bytes() const { return memory.span() * sizeof(bf16); }
};

using Weight = Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMem>;  // (out, in)
using Norm = Kokkos::View<const float*, GpuMem>;                           // (width)

/// One layer's attention weights and norms, looked up once (empty where the
/// architecture has none).
struct LayerWeights {
  Weight q, k, v, o, q_a, q_b, kv_a, kv_b;
  Norm input_norm, post_attention_norm, q_norm, k_norm, q_a_norm, kv_a_norm;
};

struct MoeModel::Impl {
  GpuStreams streams{3};  // attention, feed-forward, expert prefetch
  std::vector<int> prefetching_slots;  // expert slots copies on streams[2] fill, not yet waited for
  std::map<std::string, Weight> weights;
  std::map<std::string, Norm> norms;
  std::vector<LayerWeights> layers;
  std::vector<Router<Gpu, bf16>> routers;                                // per MoE layer
  std::vector<std::vector<ExpertWeights<bf16, GpuMem>>> shared;          // per MoE layer
  std::vector<ExpertWeights<bf16, GpuMem>> dense;                        // DeepSeek's first layers
  std::vector<impl::ExpertBuffers<GpuMem>> slots;
  impl::ExpertBuffers<GpuMem> staging;
  ExpertRunner<Gpu, bf16> gpu_runner;
  ExpertRunner<Host, bf16> cpu_runner;
  SwigluScratch<GpuMem> dense_scratch;
  Kokkos::View<const double*, GpuMem> inverse_frequencies;
  float rope_scale = 1.0f;
  std::unique_ptr<SplitDecode<bf16>> split;  // every batch size's

  // Activations, grown on demand and reused by every layer and step.
  Matrix<GpuMem> x, h, branch, h_ffn, branch_ffn, q, k, v, q_a, compressed, latent, mla_values, cpu_result, logits;
  Kokkos::View<float**, Kokkos::LayoutRight, PinnedMemSpace> x_pinned, out_pinned, logits_pinned;
  TokenRows keys, values;
  Queries queries;
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> host_queries;
  PartialState<GpuMem> merged, earlier;
  PrefillWorkspace<GpuMem> prefill_workspace;
  // MLA prompt chunks in the decompressed form: a span of latent rows, widened,
  // expanded, split into per-head keys and values, and the span's state.
  Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMem> latent_span;
  Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace> latent_span_host;  // host-pool rows of CUDA builds
  Matrix<GpuMem> widened, expanded;
  Queries keys_d, values_d;
  PartialState<GpuMem> span_state, prompt_values;
  Kokkos::View<std::int64_t*, GpuMem> span_starts;
  Kokkos::View<int*, GpuMem> tokens;
  Kokkos::View<int, GpuMem> non_finite;  // ModelOptions::check_finite's flag
  Kokkos::View<std::int64_t*, GpuMem> positions;

  const Weight& weight(const std::string& name) const { return weights.at(name); }
  /// The named weight, or an empty view when the model has none.
  Weight optional_weight(const std::string& name) const {
    const auto found = weights.find(name);
    return found == weights.end() ? Weight() : found->second;
  }
  Norm optional_norm(const std::string& name) const {
    const auto found = norms.find(name);
    return found == norms.end() ? Norm() : found->second;
  }
  SplitDecode<bf16>& split_for(const AttentionShape& shape, const BlockGeometry& geometry, int chunk) {
    if (!split) split = std::make_unique<SplitDecode<bf16>>(shape, geometry, chunk);
    return *split;
  }
  PartialState<GpuMem>& partial(PartialState<GpuMem>& state, const char* label, int rows, int heads, int dim) {
    if (state.o.extent(0) != static_cast<std::size_t>(rows) || state.o.extent(1) != static_cast<std::size_t>(heads) ||
        state.o.extent(2) != static_cast<std::size_t>(dim))
      state = PartialState<GpuMem>(label, rows, heads, dim);
    return state;
  }
};

std::uint64_t MoeModel::expert_bytes(const ModelConfig& config) {
  return 3ull * static_cast<std::uint64_t>(config.hidden) * config.expert_intermediate * sizeof(bf16);
}

std::uint64_t MoeModel::kv_vram(const ModelConfig& config, const ModelOptions& options,
                                std::uint64_t blocks_per_layer) {
  // The GPU's decode keeps one partial state per VRAM block of a layer in a
  // step: it is reserved next to the blocks so the pool never outgrows the budget.
  const AttentionShape shape = config.attention();
  const std::uint64_t block_bytes =
      static_cast<std::uint64_t>(shape.block_geometry(options.block_tokens).block_elements()) * sizeof(bf16);
  const std::uint64_t state_bytes = static_cast<std::uint64_t>(shape.q_heads) * (shape.value_dim + 1) * sizeof(float);
  return blocks_per_layer * (static_cast<std::uint64_t>(config.layers) * block_bytes + state_bytes);
}

void LayerRecord::add(const LayerRecord& part) {
  attention_gpu += part.attention_gpu;
  attention_cpu += part.attention_cpu;
  experts_gpu += part.experts_gpu;
  experts_cpu += part.experts_cpu;
  transfers += part.transfers;
  other += part.other;
  attention += part.attention;
  feed_forward += part.feed_forward;
  predicted_attention += part.predicted_attention;
  for (int r = 0; r < 4; ++r) region_bytes[r] += part.region_bytes[r];
  streamed_bytes += part.streamed_bytes;
  streamed_seconds += part.streamed_seconds;
  const double bytes = region_bytes[0] + region_bytes[1] + region_bytes[2] + region_bytes[3];
  const double cpu = region_bytes[int(Region::cpu_resident)] + region_bytes[int(Region::cpu_streamed)];
  alpha = bytes > 0 ? cpu / bytes : 0;
}

VramUse MoeModel::fixed_vram(const ModelConfig& config, const ModelOptions& options) {
  VramUse use;
  const auto norms = static_cast<std::uint64_t>(config.norm_parameters());
  use.weights = (static_cast<std::uint64_t>(config.parameters() - config.routed_expert_parameters()) - norms) *
                    sizeof(bf16) +
                norms * sizeof(float);
  // Activations of max_rows tokens (the widest matrices of a layer), attention
  // buffers of one step, two streaming landing buffers and the staging expert.
  const AttentionShape shape = config.attention();
  const BlockGeometry geometry = shape.block_geometry(options.block_tokens);
  const std::uint64_t rows = static_cast<std::uint64_t>(options.max_rows);
  const std::uint64_t widest = std::max<std::uint64_t>(
      {static_cast<std::uint64_t>(config.vocab), static_cast<std::uint64_t>(config.q_heads) * shape.key_dim,
       static_cast<std::uint64_t>(std::max(config.dense_intermediate, config.expert_intermediate)) *
           std::max(1, config.shared_experts)});
  const std::uint64_t activations = rows * (4ull * config.hidden + 4 * widest) * sizeof(float);
  // Queries and partial states for max_rows rows, and the prefill kernels'
  // query tiles (queries and accumulators) in their three GPU workspaces (the
  // chunk's own keys, VRAM blocks, streamed blocks), each counted twice for
  // rows rounded up to whole tiles and workspaces that grow by doubling.
  const std::uint64_t prefill_tiles = 3 * 2 * rows * config.q_heads * (shape.key_dim + shape.value_dim) * sizeof(float);
  std::uint64_t attention =
      rows * config.q_heads * (shape.key_dim + 3ull * shape.value_dim + 3) * sizeof(float) + prefill_tiles;
  if (config.mla()) {
    // Decompressed prompt chunks: a span of latent rows, widened, expanded,
    // per-head keys and values, two states and the prefill kernel's tiles.
    const std::uint64_t heads = config.q_heads, nope = config.qk_nope_head_dim, rope = config.qk_rope_head_dim,
                        vdim = config.v_head_dim, latent = config.kv_lora_rank;
    attention += rows * ((latent + rope) * sizeof(bf16) + sizeof(std::int64_t) +
                         (latent + heads * (nope + vdim) + heads * (nope + rope + vdim) +
                          2 * heads * (vdim + 1) + heads * (nope + rope + vdim)) *
                             sizeof(float));
  }
  const std::uint64_t streaming = 2ull * options.stream_chunk_blocks * geometry.block_elements() * sizeof(bf16);
  use.workspace = activations + attention + streaming + (config.experts > 0 ? expert_bytes(config) : 0);
  return use;
}

VramUse MoeModel::vram_plan(const ModelConfig& config, const ModelOptions& options) {
  // Weights and workspace first, then the policy's expert slots, then KV.
  VramUse use = fixed_vram(config, options);
  const std::uint64_t fixed = use.weights + use.workspace;
  if (fixed > options.vram_budget)
    throw ModelBudgetError("vram_budget: " + format_byte_size(options.vram_budget) + " cannot hold " + config.name +
                           "'s GPU weights (" + format_byte_size(use.weights) +
                           ": attention, routers, shared and dense experts, embeddings, LM head) and workspace (" +
                           format_byte_size(use.workspace) + "); it needs at least " + format_byte_size(fixed));
  const std::uint64_t left = options.vram_budget - fixed;
  const std::uint64_t per_expert = expert_bytes(config);
  const int fit = per_expert > 0 ? static_cast<int>(std::min<std::uint64_t>(left / per_expert, 1u << 30)) : 0;
  const int moe_layers = config.layers - config.dense_layers;
  const int slots = config.experts > 0 ? options.experts->slots(fit, moe_layers, config.experts) : 0;
  use.expert_slots = static_cast<std::uint64_t>(slots) * per_expert;
  if (use.expert_slots > left)
    throw ModelBudgetError("vram_budget: " + format_byte_size(options.vram_budget) + " leaves " + format_byte_size(left) +
                           " after weights and workspace, but the expert policy keeps " + std::to_string(slots) +
                           " routed experts on the GPU (" + format_byte_size(use.expert_slots) +
                           "); it needs at least " + format_byte_size(fixed + use.expert_slots));
  const std::uint64_t blocks_per_layer = options.vram_kv ? (left - use.expert_slots) / kv_vram(config, options, 1) : 0;
  const std::uint64_t block_bytes =
      static_cast<std::uint64_t>(config.attention().block_geometry(options.block_tokens).block_elements()) *
      sizeof(bf16);
  use.kv = blocks_per_layer * static_cast<std::uint64_t>(config.layers) * block_bytes;
  use.workspace += kv_vram(config, options, blocks_per_layer) - use.kv;
  return use;
}

std::pair<const void*, std::uint64_t> host_expert_memory(const HostExpertStore& store) {
  return {store.memory.data(), store.bytes()};
}

std::uint64_t MoeModel::expert_store_bytes(const ModelConfig& config) {
  return static_cast<std::uint64_t>(config.layers - config.dense_layers) * config.experts * expert_bytes(config);
}

std::uint64_t MoeModel::pinned_staging_bytes(const ModelConfig& config, const ModelOptions& options) {
  // Expert inputs and outputs of the CPU's experts, and the logits of a step.
  return static_cast<std::uint64_t>(options.max_rows) * (2ull * config.hidden + config.vocab) * sizeof(float);
}

std::uint64_t MoeModel::host_bytes_needed(const ModelConfig& config, const ModelOptions& options) {
  const VramUse vram = vram_plan(config, options);
  // In a host-only build the "GPU" is the host: its weights, slots and KV live in host memory too.
  const std::uint64_t gpu_side = has_gpu ? 0 : vram.weights + vram.workspace + vram.expert_slots + vram.kv;
  // Tensors arrive one at a time: the largest (the embeddings or an expert
  // matrix) is held once more, as read from the file (F32 at most: 4 bytes
  // an element) beside its bf16 copy.
  const std::uint64_t loading =
      std::max<std::uint64_t>(static_cast<std::uint64_t>(config.vocab) * config.hidden,
                              static_cast<std::uint64_t>(config.hidden) *
                                  std::max(config.dense_intermediate, config.expert_intermediate)) *
      (sizeof(float) + sizeof(bf16));
  return (options.host_experts ? 0 : expert_store_bytes(config)) + options.pinned_kv_budget +
         options.host_kv_budget + pinned_staging_bytes(config, options) + gpu_side + loading;
}

HostUse MoeModel::host_use() const {
  const Impl& m = *impl_;
  HostUse use;
  use.experts = host_experts_->bytes();
  use.experts_pinned = host_experts_->pinned();
  use.kv_pinned = cache_->pinned_pool().span() * sizeof(bf16);
  use.kv_host = cache_->host_pool().span() * sizeof(bf16);
  use.staging_pinned = (m.x_pinned.span() + m.out_pinned.span() + m.logits_pinned.span()) * sizeof(float);
  return use;
}

void MoeModel::free_sequence(int sequence) {
  for (int layer = 0; layer < config_.layers; ++layer)
    kv_policy_->released(layer, cache_->block_regions(layer, sequence));
  cache_->free_sequence(sequence);
}

MoeModel::MoeModel(const ModelConfig& config, const TensorSource& source, ModelOptions options)
    : config_(config),
      shape_(config.attention()),
      options_(std::move(options)),
      residency_(0, 0, 0),
      impl_(std::make_unique<Impl>()) {
  config_.validate();
  if (!options_.kv_policy) throw std::invalid_argument("model: ModelOptions::kv_policy is required");
  if (!options_.experts) throw std::invalid_argument("model: ModelOptions::experts is required");
  if (options_.max_rows < 1) throw std::invalid_argument("model: max_rows must be positive");
  if (options_.micro_batches > 1 && options_.experts->computes_on_cpu())
    throw std::invalid_argument("model: micro-batches overlap the CPU's attention with the GPU's experts, so the "
                                "expert policy must keep every expert on the GPU");
  const int moe_layers = config_.layers - config_.dense_layers;
  vram_ = vram_plan(config_, options_);
  // Decided before anything is allocated: a model too large for the machine
  // is a ModelBudgetError naming the bytes, not an out-of-memory kill.
  if (const std::uint64_t needed = host_bytes_needed(config_, options_), available = available_host_memory();
      needed > available) {
    const std::uint64_t gpu_side = vram_.weights + vram_.workspace + vram_.expert_slots + vram_.kv;
    throw ModelBudgetError(
        "host memory: " + config_.name + " with these budgets needs " + format_byte_size(needed) +
        " of host memory (routed experts " + format_byte_size(options_.host_experts ? 0 : expert_store_bytes(config_)) +
        ", KV pools " + format_byte_size(options_.pinned_kv_budget + options_.host_kv_budget) + ", staging " +
        format_byte_size(pinned_staging_bytes(config_, options_)) +
        (has_gpu ? std::string() : ", the host build's GPU side " + format_byte_size(gpu_side)) +
        ", loading the rest) but this machine has " + format_byte_size(available) + " available");
  }
  const int slots = static_cast<int>(vram_.expert_slots / std::max<std::uint64_t>(1, expert_bytes(config_)));

  // Every routed expert lives in host memory, page-locked when the expert
  // policy copies experts to the GPU (DMA) and the memory plan allows it; the
  // CPU computes on it in place either way. Tensors arrive one at a time,
  // so a full-size model never exists twice in host memory; a store shared
  // with an earlier model of the same weights is not filled again.
  Impl& m = *impl_;
  const bool shared_store = options_.host_experts != nullptr;
  if (shared_store) {
    if (options_.host_experts->layers.size() != static_cast<std::size_t>(moe_layers) ||
        (moe_layers > 0 &&
         (options_.host_experts->layers.front().size() != static_cast<std::size_t>(config_.experts) ||
          (config_.experts > 0 &&
           (options_.host_experts->layers.front().front().gate.extent(0) !=
                static_cast<std::size_t>(config_.expert_intermediate) ||
            options_.host_experts->layers.front().front().gate.extent(1) != static_cast<std::size_t>(config_.hidden))))))
      throw std::invalid_argument("model " + config_.name + ": the shared expert store holds another model's experts");
    host_experts_ = options_.host_experts;
  } else {
    host_experts_ = std::make_shared<HostExpertStore>(config_);
  }
  host_experts_->pin(options_.pin_experts && options_.experts->loads_experts());
  std::map<std::string, WeightView<HostMemSpace>> expert_parts;
  for (int layer = config_.dense_layers; layer < config_.layers; ++layer) {
    for (int e = 0; e < config_.experts; ++e) {
      const auto& expert = host_experts_->layers[layer - config_.dense_layers][e];
      const auto names = expert_tensor_names(config_, layer, e);
      expert_parts[names[0]] = expert.gate;
      expert_parts[names[1]] = expert.up;
      expert_parts[names[2]] = expert.down;
    }
  }
  for (const TensorSpec& spec : weight_specs(config_)) {
    const bool routed = expert_parts.count(spec.name) != 0;
    if (routed && shared_store) continue;
    const std::vector<bf16> values = source(spec);
    if (static_cast<std::int64_t>(values.size()) != spec.elements())
      throw std::invalid_argument("model " + config_.name + ": tensor '" + spec.name + "' has " +
                                  std::to_string(values.size()) + " values, expected " +
                                  std::to_string(spec.elements()));
    if (const auto part = expert_parts.find(spec.name); part != expert_parts.end()) {
      std::copy(values.begin(), values.end(), part->second.data());
    } else if (spec.is_norm) {
      Kokkos::View<float*, Kokkos::HostSpace> host("writescope::moe::norm", values.size());
      for (std::size_t k = 0; k < values.size(); ++k) host(k) = to_float(values[k]);
      m.norms[spec.name] = Kokkos::create_mirror_view_and_copy(GpuMem(), host);
    } else {
      const Kokkos::View<const bf16**, Kokkos::LayoutRight, Kokkos::HostSpace,
                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>
          host(values.data(), static_cast<std::size_t>(spec.shape[0]), static_cast<std::size_t>(spec.shape[1]));
      WeightView<GpuMem> weight(Kokkos::view_alloc(std::string("writescope::moe::weight"), Kokkos::WithoutInitializing),
                                host.extent(0), host.extent(1));
      Kokkos::deep_copy(weight, host);
      m.weights[spec.name] = weight;
    }
  }
  const bool mixtral = config_.architecture == Architecture::mixtral;
  for (int layer = 0; layer < config_.layers; ++layer) {
    const std::string a = layer_prefix(layer) + "self_attn.";
    m.layers.push_back(LayerWeights{m.optional_weight(a + "q_proj.weight"), m.optional_weight(a + "k_proj.weight"),
                                    m.optional_weight(a + "v_proj.weight"), m.weight(a + "o_proj.weight"),
                                    m.optional_weight(a + "q_a_proj.weight"), m.optional_weight(a + "q_b_proj.weight"),
                                    m.optional_weight(a + "kv_a_proj_with_mqa.weight"),
                                    m.optional_weight(a + "kv_b_proj.weight"),
                                    m.norms.at(layer_prefix(layer) + "input_layernorm.weight"),
                                    m.norms.at(layer_prefix(layer) + "post_attention_layernorm.weight"),
                                    m.optional_norm(a + "q_norm.weight"), m.optional_norm(a + "k_norm.weight"),
                                    m.optional_norm(a + "q_a_layernorm.weight"),
                                    m.optional_norm(a + "kv_a_layernorm.weight")});
    const std::string p = layer_prefix(layer) + (mixtral ? "block_sparse_moe." : "mlp.");
    if (layer < config_.dense_layers) {
      m.dense.push_back({m.weight(p + "gate_proj.weight"), m.weight(p + "up_proj.weight"),
                         m.weight(p + "down_proj.weight")});
      continue;
    }
    m.routers.emplace_back(m.weight(p + "gate.weight"), config_.experts_per_token,
                           config_.router_normalizes() ? RouterKind::normalized_topk : RouterKind::scaled_topk,
                           config_.routed_scaling_factor);
    m.shared.emplace_back();
    if (config_.shared_experts > 0)
      m.shared.back().push_back({m.weight(p + "shared_experts.gate_proj.weight"),
                                 m.weight(p + "shared_experts.up_proj.weight"),
                                 m.weight(p + "shared_experts.down_proj.weight")});
  }
  for (int s = 0; s < slots; ++s)
    m.slots.emplace_back("writescope::moe::expert_slot", config_.hidden, config_.expert_intermediate);
  if (config_.experts > 0)
    m.staging = impl::ExpertBuffers<GpuMem>("writescope::moe::expert_staging", config_.hidden, config_.expert_intermediate);
  residency_ = ExpertResidency(moe_layers, config_.experts, slots);
  for (const ExpertLoad& load : options_.experts->initial(residency_)) {
    if (load.slot < 0 || load.slot >= slots)
      throw std::invalid_argument("model: the expert policy's initial load names slot " + std::to_string(load.slot));
    copy_expert(Gpu(), m.slots[load.slot], host_experts_->layers.at(load.layer).at(load.expert));
    residency_.assign(load.slot, load.layer, load.expert);
  }

  cache_ = std::make_unique<InplaceKVCache<bf16>>(
      KVCacheShape{config_.layers, shape_.block_geometry(options_.block_tokens)},
      KVCacheBudgets{vram_.kv, options_.pinned_kv_budget, options_.host_kv_budget}, BudgetPolicy::strict);
  kv_policy_ = options_.kv_policy(shape_, *cache_);
  const RotaryEmbedding rope = RotaryEmbedding::for_model(config_);
  Kokkos::View<double*, Kokkos::HostSpace> frequencies("writescope::moe::inverse_frequencies",
                                                       rope.inverse_frequencies.size());
  std::copy(rope.inverse_frequencies.begin(), rope.inverse_frequencies.end(), frequencies.data());
  m.inverse_frequencies = Kokkos::create_mirror_view_and_copy(GpuMem(), frequencies);
  m.rope_scale = static_cast<float>(rope.scale);
  records_.resize(static_cast<std::size_t>(config_.layers));
}

MoeModel::~MoeModel() {
  if (impl_) impl_->streams[2].fence();  // no prefetch may land in freed slots
}

bool mla_prompt_cheaper_decompressed(const ModelConfig& config, int rows) {
  if (!config.mla()) return false;
  const double heads = config.q_heads, latent = config.kv_lora_rank;
  const double absorbed = heads * (2 * latent + config.qk_rope_head_dim);
  const double decompressed = heads * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim);
  const double expansion = heads * (config.qk_nope_head_dim + config.v_head_dim) * latent;
  return rows * (absorbed - decompressed) > expansion;
}

MoeModel MoeModel::synthetic(const ModelConfig& config, std::uint64_t seed, ModelOptions options) {
  return MoeModel(config, [seed](const TensorSpec& spec) { return synthetic_tensor<bf16>(spec, seed); },
                  std::move(options));
}

MoeModel MoeModel::from_checkpoint(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                                   ModelOptions options) {
  check_checkpoint_sizes(checkpoint, config);
  return MoeModel(config, [&](const TensorSpec& spec) { return checkpoint.read<bf16>(spec.name, spec.shape); },
                  std::move(options));
}

int MoeModel::add_sequence(std::int64_t expected_tokens) {
  const int sequence = cache_->add_sequence();
  if (static_cast<std::size_t>(sequence) >= expected_tokens_.size()) expected_tokens_.resize(sequence + 1, 0);
  expected_tokens_[sequence] = expected_tokens;
  return sequence;
}


void MoeModel::end_warmup() {
  Impl& m = *impl_;
  m.streams[2].fence();
  m.prefetching_slots.clear();
  for (const ExpertLoad& load : options_.experts->end_warmup(residency_)) {
    copy_expert(Gpu(), m.slots.at(load.slot), host_experts_->layers.at(load.layer).at(load.expert));
    residency_.assign(load.slot, load.layer, load.expert);
  }
}

namespace {

/// The rows of one forward pass: decode (one token of each of several
/// sequences) or a prompt chunk (consecutive tokens of one sequence).
struct Pass {
  std::vector<int> sequences;           // per row
  std::vector<std::int64_t> positions;  // per row
  bool prefill = false;
  int first_row = 0;                    // of the step's activations (micro-batches)
  Kokkos::View<const std::int64_t*, GpuMem> device_positions = {};
  int rows() const { return static_cast<int>(sequences.size()); }
  /// Rows [begin, end) of this pass.
  Pass slice(int begin, int end) const {
    Pass part{std::vector<int>(sequences.begin() + begin, sequences.begin() + end),
              std::vector<std::int64_t>(positions.begin() + begin, positions.begin() + end), prefill,
              first_row + begin, Kokkos::subview(device_positions, std::make_pair(begin, end))};
    return part;
  }
};


}  // namespace

// The model's forward pass over the model's state, kept out of the header so
// that it stays free of Kokkos views.
struct ModelForward {
  MoeModel::Impl& m;
  const ModelConfig& c;
  const AttentionShape& shape;
  const ModelOptions& options;
  InplaceKVCache<bf16>& cache;
  KVPolicy& kv_policy;
  ExpertPolicy& expert_policy;
  ExpertResidency& residency;
  std::vector<std::int64_t>& expected_tokens;
  const HostExpertStore& host_experts;
  // Attention and feed-forward work go to their own GPU streams, so that the
  // stages of two micro-batches overlap and fences wait for one stage only.
  const Gpu& attention_gpu;
  const Gpu& ffn_gpu;

  /// Attention of the pass' queries (rows, q_heads, key_dim) through the KV
  /// policy's split plan, into `out`: a decode step's rows over ranges[i] of
  /// sequences[i], or (AttentionPass::prompt) a prompt chunk's rows over
  /// ranges[0] of sequences[0], its earlier tokens.
  void split_attention(int layer, AttentionPass kind, const std::vector<int>& sequences,
                       const std::vector<TokenRange>& ranges,
                       const Kokkos::View<const float***, Kokkos::LayoutRight, GpuMem>& queries,
                       const PartialState<GpuMem>& out, LayerRecord& record) {
    const int rows = static_cast<int>(queries.extent(0));
    SplitPrediction prediction;
    SplitPlan plan = kv_policy.plan(layer, sequences, ranges, prediction);
    // Bytes as the KV policy's plan serves them, before a prompt pass hands
    // the CPU's share of the band to the GPU.
    record.region_bytes[int(Region::gpu_resident)] += kv_policy.segment_bytes(plan.gpu_resident);
    record.region_bytes[int(Region::gpu_streamed)] += kv_policy.segment_bytes(plan.gpu_streamed);
    record.region_bytes[int(Region::cpu_resident)] += kv_policy.segment_bytes(plan.cpu_resident);
    record.region_bytes[int(Region::cpu_streamed)] += kv_policy.segment_bytes(plan.cpu_pinned);
    if (kind == AttentionPass::prompt) {
      // A prompt chunk is compute-bound (every block is read by a whole query
      // tile), and the GPU computes orders of magnitude faster than the CPU:
      // the pinned band goes to the GPU, only host-resident blocks (not
      // pinned, so not streamable) are read in place by the CPU. The decode
      // model's prediction and feedback do not apply to such a pass.
      plan.gpu_streamed.insert(plan.gpu_streamed.end(), plan.cpu_pinned.begin(), plan.cpu_pinned.end());
      plan.cpu_pinned.clear();
      sort_by_batch_and_slot(plan.gpu_streamed);
    }
    // SplitDecode takes the queries in host memory (the CPU reads them in place).
    const auto host_queries = scratch3(m.host_queries, "writescope::moe::host_queries", rows, shape.q_heads,
                                       shape.key_dim);
    Kokkos::deep_copy(attention_gpu, host_queries, queries);
    attention_gpu.fence();
    const SplitTimings timings = m.split_for(shape, cache.geometry(), options.stream_chunk_blocks)
                                     .run(cache, host_queries, plan, out, kind);
    if (kind == AttentionPass::decode) {
      kv_policy.observe(plan, timings);
      record.predicted_attention += prediction.step_seconds;
    }
    record.streamed_bytes += static_cast<double>(timings.streamed_bytes);
    record.streamed_seconds += timings.streamed_seconds;
    record.attention_gpu += timings.gpu_seconds;
    record.attention_cpu += timings.cpu_seconds;
    record.attention += timings.step_seconds;
  }

  /// Rows [first_row, first_row + count) of keys (rows, kv_heads, key_dim) and
  /// values (rows, kv_heads, value_dim; the keys when values_in_keys) into the
  /// cache, where the KV policy places them.
  void append_rows(int layer, int sequence, const TokenRows& keys, const TokenRows& values, int first_row, int count,
                   bool decode) {
    using Token = Kokkos::View<const bf16***, Kokkos::LayoutRight, GpuMem>;
    const BlockGeometry& g = cache.geometry();
    const bf16* k = keys.data() + std::int64_t{first_row} * g.kv_heads * g.key_dim;
    const bf16* v = g.values_in_keys ? k : values.data() + std::int64_t{first_row} * g.kv_heads * g.value_dim;
    kv_policy.place_and_write(
        layer, sequence, count, std::max(expected_tokens[sequence], cache.length(layer, sequence) + count), decode,
        [&](const std::vector<Region>& regions) {
          cache.append<Gpu, GpuMem>(attention_gpu, layer, sequence, Token(k, count, g.kv_heads, g.key_dim),
                                    Token(v, count, g.kv_heads, g.value_dim), regions);
        });
  }

  /// Writes the pass' keys (rows, kv_heads, key_dim) and values into the cache
  /// and attends: decode over each sequence's whole cache; a prompt chunk
  /// through the prefill kernel over its own keys, merged with the sequence's
  /// earlier tokens read from the cache once per query tile.
  void attend_and_append(int layer, const Pass& pass, const TokenRows& keys, const TokenRows& values,
                         const Queries& queries, const PartialState<GpuMem>& out, LayerRecord& record) {
    const Gpu& gpu = attention_gpu;
    const int rows = pass.rows();
    const BlockGeometry& g = cache.geometry();
    if (!pass.prefill) {
      std::vector<TokenRange> ranges;
      for (int r = 0; r < rows; ++r) {
        append_rows(layer, pass.sequences[r], keys, values, r, 1, true);
        ranges.push_back(TokenRange{0, cache.length(layer, pass.sequences[r])});
      }
      split_attention(layer, AttentionPass::decode, pass.sequences, ranges, queries, out, record);
      return;
    }
    const int sequence = pass.sequences.front();
    const std::int64_t earlier = pass.positions.front();
    const double chunk_seconds = gpu_seconds(gpu, [&] {
      prefill_attention<Gpu, bf16>(gpu, shape, queries, keys, g.values_in_keys ? keys : values, 0, 0, rows,
                                   m.prefill_workspace, out);
    });
    record.attention_gpu += chunk_seconds;
    record.attention += chunk_seconds;
    if (earlier > 0) {
      const auto& part = m.partial(m.earlier, "writescope::moe::earlier_attention", rows, shape.q_heads,
                                   shape.value_dim);
      split_attention(layer, AttentionPass::prompt, {sequence}, {TokenRange{0, earlier}}, queries, part, record);
      record.attention += gpu_seconds(gpu, [&] { merge_into(gpu, out, part); });
    }
    append_rows(layer, sequence, keys, values, 0, rows, false);
  }

  /// GQA attention of the pass' normalised rows h (rows, hidden) into out (rows, hidden).
  void gqa_attention(int layer, const Pass& pass, const Matrix<GpuMem>& h, const Matrix<GpuMem>& out,
                     LayerRecord& record) {
    const Gpu& gpu = attention_gpu;
    const int rows = pass.rows(), hd = c.head_dim, qh = c.q_heads, kvh = c.kv_heads;
    const auto q = impl::scratch(m.q, "writescope::moe::q", rows, qh * hd);
    const auto k = impl::scratch(m.k, "writescope::moe::k", rows, kvh * hd);
    const auto v = impl::scratch(m.v, "writescope::moe::v", rows, kvh * hd);
    const LayerWeights& w = m.layers[layer];
    linear<Gpu, bf16>(gpu, h, w.q, q);
    linear<Gpu, bf16>(gpu, h, w.k, k);
    linear<Gpu, bf16>(gpu, h, w.v, v);
    if (c.qk_norm) {
      rms_norm(gpu, q, w.q_norm, hd, c.rms_eps);
      rms_norm(gpu, k, w.k_norm, hd, c.rms_eps);
    }
    apply_rope(gpu, q, pass.device_positions, m.inverse_frequencies, m.rope_scale, 0, hd, hd, false);
    apply_rope(gpu, k, pass.device_positions, m.inverse_frequencies, m.rope_scale, 0, hd, hd, false);
    const TokenRows keys = scratch3(m.keys, "writescope::moe::keys", rows, kvh, hd);
    const TokenRows values = scratch3(m.values, "writescope::moe::values", rows, kvh, hd);
    using Flat = Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMem>;
    launch_parallel_for("writescope::moe::pack_keys", impl::rows_by_columns(gpu, rows, kvh * hd),
                         impl::PackBf16<GpuMem>{Flat(keys.data(), rows, kvh * hd), k});
    launch_parallel_for("writescope::moe::pack_values", impl::rows_by_columns(gpu, rows, kvh * hd),
                         impl::PackBf16<GpuMem>{Flat(values.data(), rows, kvh * hd), v});
    gpu.fence();
    const Queries queries(q.data(), rows, qh, hd);
    const auto& merged = m.partial(m.merged, "writescope::moe::attention", rows, qh, hd);
    attend_and_append(layer, pass, keys, values, queries, merged, record);
    linear<Gpu, bf16>(gpu, Kokkos::View<const float**, Kokkos::LayoutRight, GpuMem>(merged.o.data(), rows, qh * hd),
                      w.o, out);
  }

  /// MLA attention (absorbed) of the pass' normalised rows h (rows, hidden) into out (rows, hidden).
  void mla_attention(int layer, const Pass& pass, const Matrix<GpuMem>& h, const Matrix<GpuMem>& out,
                     LayerRecord& record) {
    const Gpu& gpu = attention_gpu;
    const int rows = pass.rows();
    const int heads = c.q_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vdim = c.v_head_dim,
              latent = c.kv_lora_rank;
    const LayerWeights& w = m.layers[layer];
    const auto q = impl::scratch(m.q, "writescope::moe::q", rows, heads * (nope + rope));
    if (c.q_lora_rank > 0) {
      const auto q_a = impl::scratch(m.q_a, "writescope::moe::q_a", rows, c.q_lora_rank);
      linear<Gpu, bf16>(gpu, h, w.q_a, q_a);
      rms_norm(gpu, q_a, w.q_a_norm, c.q_lora_rank, mla_inner_norm_eps);
      linear<Gpu, bf16>(gpu, q_a, w.q_b, q);
    } else {
      linear<Gpu, bf16>(gpu, h, w.q, q);
    }
    const auto compressed = impl::scratch(m.compressed, "writescope::moe::kv_a", rows, latent + rope);
    const auto normed = impl::scratch(m.latent, "writescope::moe::latent", rows, latent);
    linear<Gpu, bf16>(gpu, h, w.kv_a, compressed);
    Kokkos::deep_copy(gpu, normed, Kokkos::subview(compressed, Kokkos::ALL, std::make_pair(0, latent)));
    rms_norm(gpu, normed, w.kv_a_norm, latent, mla_inner_norm_eps);
    apply_rope(gpu, q, pass.device_positions, m.inverse_frequencies, m.rope_scale, nope, nope + rope, rope, true);
    apply_rope(gpu, compressed, pass.device_positions, m.inverse_frequencies, m.rope_scale, latent, latent + rope, rope, true);
    const TokenRows keys = scratch3(m.keys, "writescope::moe::latent_rows", rows, 1, latent + rope);
    launch_parallel_for("writescope::moe::pack_latent", impl::rows_by_columns(gpu, rows, latent + rope),
                         impl::PackLatentRow<GpuMem>{Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMem>(
                                                         keys.data(), rows, latent + rope),
                                                     normed, compressed});
    const bool decompressed =
        pass.prefill && (options.mla_prompt_form == MlaPromptForm::decompressed ||
                         (options.mla_prompt_form == MlaPromptForm::automatic && mla_prompt_cheaper_decompressed(c, rows)));
    if (decompressed) {
      const auto& state = m.partial(m.prompt_values, "writescope::moe::mla_prompt", rows, heads, vdim);
      mla_decompressed_prompt(layer, pass, q, keys, state, record);
      append_rows(layer, pass.sequences.front(), keys, keys, 0, rows, false);
      linear<Gpu, bf16>(gpu, Kokkos::View<const float**, Kokkos::LayoutRight, GpuMem>(state.o.data(), rows, heads * vdim),
                        w.o, out);
      return;
    }
    const auto& kv_b = w.kv_b;
    const Queries queries = scratch3(m.queries, "writescope::moe::mla_queries", rows, heads, latent + rope);
    // The host's vector width of floats: columns per absorbed query item, lanes of
    // the expanded values' sums; 1 on GPUs, whose threads are the lanes.
    constexpr int span = is_host_exec_space<Gpu> ? 16 : 1;
    launch_parallel_for("writescope::moe::absorb_queries",
                         impl::rows_by_columns(gpu, rows * heads, (latent + rope + span - 1) / span),
                         impl::AbsorbQueries<GpuMem, span>{queries, q, kv_b, heads, nope, rope, vdim, latent});
    gpu.fence();
    const auto& merged = m.partial(m.merged, "writescope::moe::attention", rows, heads, latent);
    attend_and_append(layer, pass, keys, keys, queries, merged, record);
    const auto values = impl::scratch(m.mla_values, "writescope::moe::mla_values", rows, heads * vdim);
    launch_parallel_for("writescope::moe::expand_values", impl::rows_by_columns(gpu, rows * heads, vdim),
                         impl::ExpandValues<GpuMem, span>{values, merged.o, kv_b, heads, nope, vdim, latent});
    linear<Gpu, bf16>(gpu, values, w.o, out);
  }

  /// MLA, decompressed: the queries (rows, heads, nope + rope) against the
  /// latent rows `rows` (tokens, latent + rope) expanded per head; query i
  /// sees key t when t < first_position + i + 1 (first_position >= tokens: all).
  /// Written into `out` (rows, heads, v), or merged into it when `merge`.
  void decompressed_span(int layer, const Kokkos::View<const float***, Kokkos::LayoutRight, GpuMem>& queries,
                         const Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMem>& rows,
                         std::int64_t first_position, const PartialState<GpuMem>& out, bool merge) {
    const Gpu& gpu = attention_gpu;
    const int n = static_cast<int>(rows.extent(0));
    const int heads = c.q_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vdim = c.v_head_dim,
              latent = c.kv_lora_rank;
    const auto widened = impl::scratch(m.widened, "writescope::moe::mla_widened", n, latent);
    launch_parallel_for("writescope::moe::widen_latent", impl::rows_by_columns(gpu, n, latent),
                         impl::WidenLatent<GpuMem>{widened, rows});
    const auto expanded = impl::scratch(m.expanded, "writescope::moe::mla_expanded", n, heads * (nope + vdim));
    linear<Gpu, bf16>(gpu, widened, m.layers[layer].kv_b, expanded);
    const auto keys = scratch3(m.keys_d, "writescope::moe::mla_keys", n, heads, nope + rope);
    const auto values = scratch3(m.values_d, "writescope::moe::mla_values_per_head", n, heads, vdim);
    launch_parallel_for("writescope::moe::split_expanded", impl::rows_by_columns(gpu, n * heads, nope + rope + vdim),
                         impl::SplitExpanded<GpuMem>{keys, values, expanded, rows, heads, nope, rope, vdim, latent});
    const AttentionShape expanded_shape{shape.name + " decompressed", heads, heads, nope + rope, vdim, false,
                                        shape.scale()};
    const int query_rows = static_cast<int>(queries.extent(0));
    const PartialState<GpuMem>& target =
        merge ? m.partial(m.span_state, "writescope::moe::mla_span", query_rows, heads, vdim) : out;
    prefill_attention<Gpu, float>(gpu, expanded_shape, queries, keys, values, first_position, 0, n,
                                  m.prefill_workspace, target);
    if (merge) merge_into(gpu, out, target);
  }

  /// Cached latent rows of `region` at pool element offsets starts[0, n) as a
  /// (n, latent + rope) matrix on the GPU: gathered there when the GPU reads
  /// the pool, else (host memory in CUDA builds) by the CPU and copied over.
  Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMem> gather_latent_rows(Region region,
                                                                              const std::int64_t* starts, int n) {
    const Gpu& gpu = attention_gpu;
    const int width = c.kv_lora_rank + c.qk_rope_head_dim;
    const auto rows = impl::scratch(m.latent_span, "writescope::moe::mla_latent_span", n, width);
    auto gather = [&](const auto& pool) {
      using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
      if constexpr (Kokkos::SpaceAccessibility<Gpu, PoolSpace>::accessible) {
        if (m.span_starts.extent(0) < static_cast<std::size_t>(n))
          m.span_starts = Kokkos::View<std::int64_t*, GpuMem>(
              Kokkos::view_alloc("writescope::moe::mla_span_starts", Kokkos::WithoutInitializing), n);
        const auto device_starts = Kokkos::subview(m.span_starts, std::make_pair(0, n));
        Kokkos::deep_copy(gpu, device_starts,
                          Kokkos::View<const std::int64_t*, Kokkos::HostSpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>(starts, n));
        launch_parallel_for("writescope::moe::gather_latent_rows", impl::rows_by_columns(gpu, n, width),
                             impl::GatherLatentRows<GpuMem>{rows, pool.data(), device_starts});
      } else {
        const auto host_rows = impl::scratch(m.latent_span_host, "writescope::moe::mla_latent_span_host", n, width);
        gpu.fence();  // earlier appends into the pool, and the last copy out of host_rows
        for (int t = 0; t < n; ++t)
          std::memcpy(&host_rows(t, 0), pool.data() + starts[t], sizeof(bf16) * static_cast<std::size_t>(width));
        Kokkos::deep_copy(gpu, rows, host_rows);
      }
    };
    if (region == Region::gpu_resident) gather(cache.vram_pool());
    else if (region == Region::cpu_resident) gather(cache.host_pool());
    else gather(cache.pinned_pool());
    return rows;
  }

  /// An MLA prompt chunk in the decompressed form (mla_prompt_cheaper_decompressed):
  /// queries q (rows, heads * (nope + rope)), roped, against its own latent
  /// rows (rows, 1, latent + rope) causally and against the sequence's
  /// earlier rows, in spans of max_rows tokens; o (rows, heads, v) into `out`.
  /// Every earlier key is expanded for the chunk, a GEMM the GPU runs far
  /// faster than the CPU, so the GPU takes every region here (host-resident
  /// rows are gathered by the CPU and copied, 1.1 KB a token).
  void mla_decompressed_prompt(int layer, const Pass& pass, const Matrix<GpuMem>& q, const TokenRows& latent_rows,
                               const PartialState<GpuMem>& out, LayerRecord& record) {
    const Gpu& gpu = attention_gpu;
    const int rows = pass.rows(), width = c.kv_lora_rank + c.qk_rope_head_dim;
    const int sequence = pass.sequences.front();
    const std::int64_t earlier = pass.positions.front();
    const Kokkos::View<const float***, Kokkos::LayoutRight, GpuMem> queries(q.data(), rows, c.q_heads,
                                                                            c.qk_nope_head_dim + c.qk_rope_head_dim);
    using Rows = Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMem>;
    const double seconds = gpu_seconds(gpu, [&] {
      decompressed_span(layer, queries, Rows(latent_rows.data(), rows, width), 0, out, false);
      const BlockGeometry& g = cache.geometry();
      for (Region region : all_regions) {
        const auto segments = cache.segments(layer, region, {sequence}, {TokenRange{0, earlier}});
        record.region_bytes[int(region)] += kv_policy.segment_bytes(segments);
        std::vector<std::int64_t> starts;
        for (const BlockSegment& segment : segments)
          for (int t = segment.token_begin; t < segment.token_begin + segment.token_count; ++t)
            starts.push_back(std::int64_t{segment.slot} * g.block_elements() +
                             g.key_offset(block_order(region), t, 0, 0));
        for (std::size_t first = 0; first < starts.size(); first += static_cast<std::size_t>(options.max_rows)) {
          const int n = static_cast<int>(std::min(starts.size() - first, static_cast<std::size_t>(options.max_rows)));
          decompressed_span(layer, queries, gather_latent_rows(region, starts.data() + first, n), n, out, true);
        }
      }
    });
    record.attention_gpu += seconds;
    record.attention += seconds;
  }

  void load(const ExpertLoad& load, const impl::ExpertBuffers<GpuMem>& into) {
    copy_expert(ffn_gpu, into, host_experts.layers.at(load.layer).at(load.expert));
  }

  /// Starts `loads` (into slots) on the prefetch stream, which overlaps the
  /// next layer's attention; wait_for_prefetch() is called before experts run.
  void prefetch(const std::vector<ExpertLoad>& loads) {
    const Gpu& copy = m.streams[2];
    for (const ExpertLoad& l : loads) {
      if (l.slot < 0) continue;
      start_expert_copy(copy, m.slots.at(l.slot), host_experts.layers.at(l.layer).at(l.expert));
      residency.assign(l.slot, l.layer, l.expert);
      if (std::find(m.prefetching_slots.begin(), m.prefetching_slots.end(), l.slot) == m.prefetching_slots.end())
        m.prefetching_slots.push_back(l.slot);
    }
  }

  /// Seconds the feed-forward of `plan` waited for the prefetch stream (its
  /// exposed transfers): only where the plan uses a slot a copy in flight
  /// fills. Another micro-batch of the layer before the prefetched one goes
  /// on beside the copy, as CGOPipe's paging overlaps it.
  double wait_for_prefetch(int moe_layer, const ExpertPlan& plan) {
    if (!plan.touches_slots(moe_layer, residency, m.prefetching_slots)) return 0;
    m.prefetching_slots.clear();
    return FencedTimer<Gpu>(m.streams[2]).seconds();
  }

  /// Loads into slots (not staging); returns their seconds.
  double load_into_slots(const std::vector<ExpertLoad>& loads) {
    // No copy, no time: the fences of an empty timing would count as transfers.
    if (std::none_of(loads.begin(), loads.end(), [](const ExpertLoad& l) { return l.slot >= 0; })) return 0.0;
    return gpu_seconds(ffn_gpu, [&] {
      for (const ExpertLoad& l : loads) {
        if (l.slot < 0) continue;
        load(l, m.slots.at(l.slot));
        residency.assign(l.slot, l.layer, l.expert);
      }
    });
  }

  /// The feed-forward of normalised rows h (rows, hidden) into out (rows, hidden):
  /// router, then the expert policy's GPU experts and the shared experts on the
  /// GPU while its CPU experts run on the host (from a copy of h in pinned memory).
  void feed_forward(int layer, const Matrix<GpuMem>& h, const Matrix<GpuMem>& out, LayerRecord& record) {
    const Gpu& gpu = ffn_gpu;
    const int rows = static_cast<int>(h.extent(0)), hidden = c.hidden;
    if (layer < c.dense_layers) {
      record.experts_gpu += gpu_seconds(gpu, [&] { swiglu_expert<Gpu, bf16>(gpu, m.dense[layer], h, out, m.dense_scratch); });
      return;
    }
    const int moe_layer = layer - c.dense_layers;
    const Routing routing = m.routers[moe_layer](gpu, h);
    const ExpertPlan plan = expert_policy.plan(moe_layer, routing, residency);
    const double waited = wait_for_prefetch(moe_layer, plan);

    double gpu_compute = 0, gpu_transfers = 0, cpu_compute = 0, cpu_transfers = 0;
    Matrix<HostMemSpace> x_host, out_host;  // views of pinned buffers: DMA-able, ordinary memory to the CPU
    if (!plan.cpu.empty()) {
      const auto x_pinned = impl::scratch(m.x_pinned, "writescope::moe::expert_inputs", rows, hidden);
      const auto out_pinned = impl::scratch(m.out_pinned, "writescope::moe::cpu_expert_outputs", rows, hidden);
      cpu_transfers += gpu_seconds(gpu, [&] { Kokkos::deep_copy(gpu, x_pinned, h); });
      x_host = Matrix<HostMemSpace>(x_pinned.data(), rows, hidden);
      out_host = Matrix<HostMemSpace>(out_pinned.data(), rows, hidden);
    }
    auto gpu_work = [&] {
      gpu_transfers += load_into_slots(plan.loads);
      double staged = 0;  // experts loaded into the staging buffer as they are needed
      const double phase = gpu_seconds(gpu, [&] {
        Kokkos::deep_copy(gpu, out, 0.0f);
        m.gpu_runner.upload(gpu, routing);
        // Runs of resident experts as one batch each (a launch per step of
        // the batch, not per expert); an expert loaded into the one staging
        // buffer alone, in the plan's order, so every row adds its experts'
        // terms in that order either way.
        std::vector<int> resident;
        std::vector<ExpertWeights<bf16, GpuMem>> resident_weights;
        auto add_resident = [&] {
          if (!resident.empty()) m.gpu_runner.add(gpu, resident, resident_weights, h, out);
          resident.clear();
          resident_weights.clear();
        };
        for (int e : plan.gpu) {
          if (const int slot = residency.slot_of(moe_layer, e); slot >= 0) {
            resident.push_back(e);
            resident_weights.push_back(m.slots[slot].weights());
            continue;
          }
          const bool listed = std::any_of(plan.loads.begin(), plan.loads.end(), [&](const ExpertLoad& l) {
            return l.slot < 0 && l.layer == moe_layer && l.expert == e;
          });
          if (!listed)
            throw std::logic_error("expert policy: expert " + std::to_string(e) + " of MoE layer " +
                                   std::to_string(moe_layer) +
                                   " is planned on the GPU but neither resident nor loaded");
          add_resident();
          staged += gpu_seconds(gpu, [&] { load(ExpertLoad{moe_layer, e, -1}, m.staging); });
          m.gpu_runner.add(gpu, m.staging.weights(), e, h, out);
        }
        add_resident();
        for (const auto& expert : m.shared[moe_layer]) m.gpu_runner.add_all(gpu, expert, h, out);
      });
      gpu_transfers += staged;
      gpu_compute += phase - staged;
    };
    auto cpu_work = [&] {
      cpu_compute += time_fenced(Host(), [&](const Host& space) {
        Kokkos::deep_copy(space, out_host, 0.0f);
        m.cpu_runner.upload(space, routing);
        std::vector<ExpertWeights<bf16, HostMemSpace>> experts;
        for (int e : plan.cpu) experts.push_back(host_experts.layers[moe_layer][e].weights<HostMemSpace>());
        m.cpu_runner.add(space, plan.cpu, experts, x_host, out_host);
      });
    };
    if (plan.cpu.empty()) {
      gpu_work();
    } else if (gpu_worker_thread()) {
      // The GPU's experts are driven from their own host thread so that the
      // OpenMP threads compute the CPU's experts at the same time.
      run_concurrently(gpu_work, cpu_work);
    } else {
      gpu_work();
      cpu_work();
    }
    if (!plan.cpu.empty()) {
      const auto result = impl::scratch(m.cpu_result, "writescope::moe::cpu_expert_result", rows, hidden);
      cpu_transfers += gpu_seconds(gpu, [&] { Kokkos::deep_copy(gpu, result, out_host); });
      gpu_compute += gpu_seconds(gpu, [&] {
        launch_parallel_for("writescope::moe::add_cpu_experts", impl::rows_by_columns(gpu, rows, hidden),
                             impl::AddRows<GpuMem>{out, result});
      });
    }
    prefetch(expert_policy.after_layer(moe_layer, routing, residency));
    record.experts_gpu += gpu_compute;
    record.experts_cpu += cpu_compute;
    record.transfers += gpu_transfers + cpu_transfers + waited;
  }

  /// x += block(rms_norm(x)) over the pass' rows of x_all (rows, hidden), on
  /// `gpu` with the stage's own buffers; block(h, branch) writes branch.
  template <class Block>
  void residual_stage(const Gpu& gpu, const Pass& pass, const Matrix<GpuMem>& x_all, const Norm& norm,
                      Matrix<GpuMem>& h_buffer, Matrix<GpuMem>& branch_buffer, Block&& block) {
    const int rows = pass.rows();
    const auto x = Kokkos::subview(x_all, std::make_pair(pass.first_row, pass.first_row + rows), Kokkos::ALL);
    const auto h = impl::scratch(h_buffer, "writescope::moe::normed", rows, c.hidden);
    const auto branch = impl::scratch(branch_buffer, "writescope::moe::branch", rows, c.hidden);
    Kokkos::deep_copy(gpu, h, x);
    rms_norm(gpu, h, norm, c.hidden, c.rms_eps);
    block(h, branch);
    launch_parallel_for("writescope::moe::residual", impl::rows_by_columns(gpu, rows, c.hidden),
                         impl::AddRows<GpuMem>{x, branch});
    gpu.fence();
  }

  void attention_stage(int layer, const Pass& pass, const Matrix<GpuMem>& x, LayerRecord& record) {
    residual_stage(attention_gpu, pass, x, m.layers[layer].input_norm, m.h, m.branch,
                   [&](const Matrix<GpuMem>& h, const Matrix<GpuMem>& branch) {
                     if (c.mla())
                       mla_attention(layer, pass, h, branch, record);
                     else
                       gqa_attention(layer, pass, h, branch, record);
                   });
  }

  void feed_forward_stage(int layer, const Pass& pass, const Matrix<GpuMem>& x, LayerRecord& record) {
    residual_stage(ffn_gpu, pass, x, m.layers[layer].post_attention_norm, m.h_ffn, m.branch_ffn,
                   [&](const Matrix<GpuMem>& h, const Matrix<GpuMem>& branch) {
                     record.feed_forward += gpu_seconds(ffn_gpu, [&] { feed_forward(layer, h, branch, record); });
                   });
  }

  /// One layer over `parts` (micro-batches): the feed-forward of part j runs
  /// while part j + 1's attention runs (CGOPipe's two stages; concurrent in
  /// CUDA builds, where the CPU attends while the GPU computes experts, and
  /// wherever gpu_worker_thread() is on).
  void layer_pipeline(int layer, const std::vector<Pass>& parts, const Matrix<GpuMem>& x, LayerRecord& record) {
    std::vector<LayerRecord> attention(parts.size()), ffn(parts.size());
    attention_stage(layer, parts[0], x, attention[0]);
    for (std::size_t j = 0; j < parts.size(); ++j) {
      if (gpu_worker_thread() && j + 1 < parts.size()) {
        run_concurrently([&] { feed_forward_stage(layer, parts[j], x, ffn[j]); },
                         [&] { attention_stage(layer, parts[j + 1], x, attention[j + 1]); });
      } else {
        feed_forward_stage(layer, parts[j], x, ffn[j]);
        if (j + 1 < parts.size()) attention_stage(layer, parts[j + 1], x, attention[j + 1]);
      }
    }
    for (std::size_t j = 0; j < parts.size(); ++j) record.add(attention[j]), record.add(ffn[j]);
  }

  /// Runs `tokens` (one per row) through every layer in `micro_batches`
  /// groups of rows; returns the logits of rows [first_logit_row, rows), each (vocab).
  std::vector<std::vector<float>> run(Pass pass, const std::vector<int>& tokens, int first_logit_row,
                                      int micro_batches, std::vector<LayerRecord>& records) {
    const Gpu& gpu = attention_gpu;
    const int rows = pass.rows(), hidden = c.hidden;
    for (int token : tokens)
      if (token < 0 || token >= c.vocab)
        throw std::invalid_argument("model: token " + std::to_string(token) + " outside the vocabulary of " +
                                    std::to_string(c.vocab));
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    if (m.tokens.extent(0) < static_cast<std::size_t>(rows)) {
      m.tokens = Kokkos::View<int*, GpuMem>("writescope::moe::tokens", rows);
      m.positions = Kokkos::View<std::int64_t*, GpuMem>("writescope::moe::positions", rows);
    }
    const auto token_view = Kokkos::subview(m.tokens, std::make_pair(0, rows));
    // On the step's stream: a plain deep_copy would wait for the expert
    // prefetch started after the last layer, which overlaps this step.
    Kokkos::deep_copy(gpu, token_view, Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(tokens.data(), rows));
    const auto position_view = Kokkos::subview(m.positions, std::make_pair(0, rows));
    Kokkos::deep_copy(gpu, position_view,
                      Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Unmanaged>(pass.positions.data(), rows));
    pass.device_positions = position_view;
    std::vector<Pass> parts;
    const int groups = std::max(1, std::min(micro_batches, rows));
    for (int g = 0; g < groups; ++g) parts.push_back(pass.slice(rows * g / groups, rows * (g + 1) / groups));

    const auto x = impl::scratch(m.x, "writescope::moe::x", rows, hidden);
    launch_parallel_for("writescope::moe::embed", impl::rows_by_columns(gpu, rows, hidden),
                         impl::EmbedRows<GpuMem>{x, m.weight("model.embed_tokens.weight"), token_view});
    gpu.fence();
    for (int layer = 0; layer < c.layers; ++layer) {
      LayerRecord& record = records[layer];
      record = LayerRecord{};
      const double wall = gpu_seconds(gpu, [&] { layer_pipeline(layer, parts, x, record); });
      record.other = std::max(0.0, wall - record.attention - record.feed_forward);
      if (options.check_finite && !all_finite(gpu, x))
        throw NonFiniteError("model: the output of layer " + std::to_string(layer) + " holds NaN or Inf");
    }
    const int out_rows = rows - first_logit_row;
    const auto last = Kokkos::subview(x, std::make_pair(first_logit_row, rows), Kokkos::ALL);
    const auto normed = impl::scratch(m.h, "writescope::moe::h", out_rows, hidden);
    Kokkos::deep_copy(gpu, normed, last);
    rms_norm(gpu, normed, m.norms.at("model.norm.weight"), hidden, c.rms_eps);
    const auto logits = impl::scratch(m.logits, "writescope::moe::logits", out_rows, c.vocab);
    linear<Gpu, bf16>(gpu, normed, m.weight(c.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"),
                      logits);
    // Through a pinned buffer grown once: no host allocation per step.
    const auto host = impl::scratch(m.logits_pinned, "writescope::moe::logits_pinned", out_rows, c.vocab);
    Kokkos::deep_copy(gpu, host, logits);
    gpu.fence();
    std::vector<std::vector<float>> out(static_cast<std::size_t>(out_rows));
    for (int r = 0; r < out_rows; ++r) {
      out[r].assign(&host(r, 0), &host(r, 0) + c.vocab);
      if (!std::all_of(out[r].begin(), out[r].end(), [](float v) { return std::isfinite(v); }))
        throw NonFiniteError("model: the logits of row " + std::to_string(first_logit_row + r) + " hold NaN or Inf");
    }
    return out;
  }

  bool all_finite(const Gpu& gpu, const Matrix<GpuMem>& x) {
    if (!m.non_finite.is_allocated()) m.non_finite = Kokkos::View<int, GpuMem>("writescope::moe::non_finite");
    const Kokkos::View<int, GpuMem> found = m.non_finite;
    Kokkos::deep_copy(gpu, found, 0);
    launch_parallel_for("writescope::moe::flag_non_finite", impl::rows_by_columns(gpu, x.extent_int(0), x.extent_int(1)),
                        impl::FlagNonFinite<GpuMem>{x, found});
    int host_found = 0;
    Kokkos::deep_copy(gpu, host_found, found);
    gpu.fence();
    return host_found == 0;
  }

  /// Appends `tokens` tokens of synthetic keys and values to every layer of
  /// `sequence`, through the KV policy's prefill placement.
  void fill(int sequence, std::int64_t tokens, std::uint64_t seed) {
    const Gpu gpu;
    const BlockGeometry& g = cache.geometry();
    const std::int64_t chunk = std::min(tokens, MoeModel::fill_chunk_tokens);
    const TokenRows keys("writescope::moe::synthetic_keys", chunk, g.kv_heads, g.key_dim);
    const TokenRows values("writescope::moe::synthetic_values", chunk, g.kv_heads, g.value_dim);
    for (int layer = 0; layer < c.layers; ++layer) {
      for (std::int64_t begin = 0; begin < tokens; begin += chunk) {
        const int count = static_cast<int>(std::min(chunk, tokens - begin));
        const std::uint64_t stream = (seed * 1315423911ull + layer) * 2654435761ull + sequence;
        launch_parallel_for("writescope::moe::synthetic_kv", impl::rows_by_columns(gpu, count, g.kv_heads * g.key_dim),
                             impl::SyntheticRows{Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMem>(
                                                     keys.data(), count, g.kv_heads * g.key_dim),
                                                 stream, begin});
        if (!g.values_in_keys)
          launch_parallel_for("writescope::moe::synthetic_kv",
                               impl::rows_by_columns(gpu, count, g.kv_heads * g.value_dim),
                               impl::SyntheticRows{Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMem>(
                                                       values.data(), count, g.kv_heads * g.value_dim),
                                                   ~stream, begin});
        gpu.fence();
        using Token = Kokkos::View<const bf16***, Kokkos::LayoutRight, GpuMem>;
        kv_policy.place_and_write(
            layer, sequence, count, std::max(expected_tokens[sequence], cache.length(layer, sequence) + count), false,
            [&](const std::vector<Region>& regions) {
              cache.append<Gpu, GpuMem>(
                  gpu, layer, sequence, Token(keys.data(), count, g.kv_heads, g.key_dim),
                  Token(g.values_in_keys ? keys.data() : values.data(), count, g.kv_heads, g.value_dim), regions);
            });
      }
    }
  }
};

void MoeModel::fill_context(int sequence, std::int64_t tokens, std::uint64_t seed) {
  if (tokens < 1) return;
  forward().fill(sequence, tokens, seed);
}

ModelForward MoeModel::forward() {
  return ModelForward{*impl_,     config_,         shape_,           options_,         *cache_, *kv_policy_,
                      *options_.experts, residency_, expected_tokens_, *host_experts_, impl_->streams[0],
                      impl_->streams[1]};
}

std::vector<std::vector<float>> MoeModel::step(const std::vector<int>& sequences, const std::vector<int>& tokens) {
  if (sequences.size() != tokens.size() || sequences.empty())
    throw std::invalid_argument("model: step needs one token per sequence");
  if (static_cast<int>(sequences.size()) > options_.max_rows)
    throw std::invalid_argument("model: a step of " + std::to_string(sequences.size()) +
                                " sequences exceeds max_rows = " + std::to_string(options_.max_rows));
  Pass pass;
  pass.sequences = sequences;
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    if (std::count(sequences.begin(), sequences.end(), sequences[i]) > 1)
      throw std::invalid_argument("model: sequence " + std::to_string(sequences[i]) + " appears twice in one step");
    pass.positions.push_back(cache_->length(0, sequences[i]));
  }
  return forward().run(pass, tokens, 0, options_.micro_batches, records_);
}

std::vector<float> MoeModel::prefill(int sequence, const std::vector<int>& prompt,
                                     const std::function<void(std::int64_t done, std::int64_t total)>& progress) {
  if (prompt.empty()) throw std::invalid_argument("model: prefill needs at least one prompt token");
  if (cache_->length(0, sequence) != 0)
    throw std::invalid_argument("model: prefill starts an empty sequence; sequence " + std::to_string(sequence) +
                                " already holds " + std::to_string(cache_->length(0, sequence)) + " tokens");
  std::vector<float> logits;
  std::vector<LayerRecord> chunk_records(records_.size());
  for (auto& r : records_) r = LayerRecord{};
  for (std::size_t begin = 0; begin < prompt.size(); begin += static_cast<std::size_t>(options_.max_rows)) {
    const std::size_t end = std::min(prompt.size(), begin + static_cast<std::size_t>(options_.max_rows));
    Pass pass;
    pass.sequences.assign(end - begin, sequence);
    pass.prefill = true;
    for (std::size_t t = begin; t < end; ++t) pass.positions.push_back(static_cast<std::int64_t>(t));
    const std::vector<int> tokens(prompt.begin() + begin, prompt.begin() + end);
    logits = forward().run(pass, tokens, static_cast<int>(end - begin) - 1, 1, chunk_records).front();
    for (std::size_t l = 0; l < records_.size(); ++l) records_[l].add(chunk_records[l]);
    if (progress) progress(static_cast<std::int64_t>(end), static_cast<std::int64_t>(prompt.size()));
  }
  // The split's per-row states grew to the chunks' rows, not a decode batch's: free them.
  impl_->split.reset();
  return logits;
}

}  // namespace writescope
