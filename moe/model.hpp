#pragma once
// The model runtime (DESIGN.md §5): one GPU and the CPU decoding a batch of
// sequences of an MoE model.
//
// On the GPU: embedding, norms, attention projections (GQA with Qwen3's q/k
// norms; MLA in the absorbed form, whose cache row is the normalised latent
// and the roped k_pe), the router, shared experts, DeepSeek's dense first
// layers, the routed experts the expert policy keeps in GPU slots or loads
// for a step, the final norm and the LM head. On the CPU, from host memory:
// the routed experts the policy gives it, at the same time as the GPU's
// experts in a CUDA build. Attention of a decode step runs through
// SplitDecode over the InplaceKVCache on the blocks the KV policy assigns to
// each device; a prompt chunk runs through the prefill kernel (merged with
// the earlier chunks read back from the cache) before its KV is written to
// the regions the KV policy chooses. bf16 weights, fp32
// activations.
//
// VRAM budget = GPU weights + workspace + expert slots + the KV cache's VRAM
// pool: what the weights, workspace and slots leave goes to the KV cache, and
// a budget that cannot hold the weights and workspace is a ModelBudgetError.
// In a host-only build the "GPU" is the host, so budgets are still enforced
// and every path runs, only without a second device.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/kv_policy.hpp"
#include "attention/split.hpp"
#include "framework/roofline.hpp"
#include "layouts/inplace_kv_cache.hpp"
#include "moe/expert_policy.hpp"
#include "moe/experts.hpp"
#include "moe/reference_model.hpp"
#include "moe/safetensors.hpp"
#include "moe/weights.hpp"

namespace writescope {

/// A budget that cannot hold what the model needs; the message names the
/// budget, what it must hold and how much is missing.
class ModelBudgetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Every routed expert of a model in host memory (page-locked while a model
/// with ModelOptions::pin_experts uses it); models of the same config and
/// weights can share one (MoeModel::host_experts()).
struct HostExpertStore;
/// The store's one allocation: its first byte and its size in bytes.
std::pair<const void*, std::uint64_t> host_expert_memory(const HostExpertStore& store);

/// A forward pass produced NaN or Inf; the message names the layer (or the logits).
class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Makes the KV policy once the model's cache exists.
using KVPolicyFactory =
    std::function<std::unique_ptr<KVPolicy>(const AttentionShape& shape, const InplaceKVCache<bf16>& cache)>;

/// How MLA (DeepSeek) prompt chunks attend; decode steps always use the
/// absorbed form (one row per sequence).
enum class MlaPromptForm {
  automatic,     // mla_prompt_cheaper_decompressed() decides per chunk
  absorbed,      // queries absorbed into the latent: keys and values are the cached latent rows
  decompressed,  // keys and values expanded from the latent rows, per head (kv_b_proj)
};

/// Whether a prompt chunk of `rows` rows costs fewer multiply-adds in MLA's
/// decompressed form (both forms are GEMM-shaped on the same device, so
/// multiply-adds decide): per (row, key) the absorbed form does heads x
/// (2 kv_lora_rank + rope), the decompressed form heads x (nope + rope + v),
/// but it first expands every key, heads x (nope + v) x kv_lora_rank, once
/// per chunk. Wide chunks spread that over more rows: DeepSeek-V2-Lite from
/// 171 rows on.
bool mla_prompt_cheaper_decompressed(const ModelConfig& config, int rows);

struct ModelOptions {
  std::uint64_t vram_budget = 0;    // bytes: GPU weights, workspace, expert slots and the KV VRAM pool
  std::uint64_t pinned_kv_budget = 0;  // bytes of pinned host memory for the KV cache's movable band
  std::uint64_t host_kv_budget = 0;    // bytes of host memory for CpuResident KV blocks
  int block_tokens = 16;
  int max_rows = 64;                // most tokens one forward pass carries (batch or prompt chunk)
  int stream_chunk_blocks = 8;      // KV blocks per streaming chunk
  int micro_batches = 1;            // a decode step's sequences run in this many pipelined groups;
                                    // above 1 the expert policy must keep every expert on the GPU
  bool vram_kv = true;              // false: no KV in VRAM (what slots leave stays unused)
  /// Page-lock the routed experts' host store where the expert policy copies
  /// experts to the GPU (ExpertPolicy::loads_experts; copies from pageable
  /// memory run at the pageable rate); a policy that never copies them
  /// leaves the store pageable whatever this says.
  bool pin_experts = true;
  /// Check each layer's output for NaN and Inf (NonFiniteError naming the
  /// first such layer): one small kernel and a synchronisation per layer, so
  /// for generation, not for measurements (which check the logits alone).
  bool check_finite = false;
  MlaPromptForm mla_prompt_form = MlaPromptForm::automatic;
  KVPolicyFactory kv_policy;        // required
  std::shared_ptr<ExpertPolicy> experts = std::make_shared<CpuExpertPolicy>();
  /// Routed experts already in pinned memory from a model of the same config
  /// and weights: shared, and not read from the tensor source again.
  std::shared_ptr<HostExpertStore> host_experts;
};

/// Seconds and bytes of one layer of one forward pass. Devices overlap, so the
/// components may add up to more than the layer's wall time; `other` is the
/// wall time outside attention steps and feed-forwards (norms, projections,
/// residuals), zero where overlapping micro-batches leave none.
struct LayerRecord {
  double attention_gpu = 0, attention_cpu = 0, experts_gpu = 0, experts_cpu = 0, transfers = 0, other = 0;
  double attention = 0;            // wall time of the attention step
  double feed_forward = 0;         // wall time of the feed-forward (router, experts, transfers)
  double predicted_attention = 0;  // the roofline model's prediction for the KV policy's plan
  double alpha = 0;                // CPU share of the KV bytes read
  /// KV bytes read, indexed by Region: VRAM by the GPU, pinned streamed to the
  /// GPU, host by the CPU, pinned read in place by the CPU (the band's blocks
  /// count where they were read, whichever region they were written to).
  double region_bytes[4] = {0, 0, 0, 0};
  /// Bytes the GPU streamed over the link and the time its streamed path took.
  double streamed_bytes = 0, streamed_seconds = 0;

  /// Adds `part` (a micro-batch or prompt chunk); alpha becomes the CPU share of all the bytes.
  void add(const LayerRecord& part);
};

/// Where the VRAM budget went (workspace includes the decode states reserved per VRAM KV block).
struct VramUse {
  std::uint64_t weights = 0, workspace = 0, expert_slots = 0, kv = 0;
};

/// Host memory of the model's data: the routed experts (page-locked or not),
/// the KV cache's pinned band and host pool, and pinned staging buffers.
struct HostUse {
  std::uint64_t experts = 0, kv_pinned = 0, kv_host = 0, staging_pinned = 0;
  bool experts_pinned = false;
  std::uint64_t pinned() const { return (experts_pinned ? experts : 0) + kv_pinned + staging_pinned; }
  std::uint64_t total() const { return experts + kv_pinned + kv_host + staging_pinned; }
};

struct ModelForward;

class MoeModel {
 public:
  struct Impl;

  /// Gives the values of one weight tensor; called once per tensor of weight_specs(config), in that order.
  using TensorSource = std::function<std::vector<bf16>(const TensorSpec& spec)>;

  MoeModel(const ModelConfig& config, const TensorSource& source, ModelOptions options);
  /// Deterministic synthetic weights (synthetic_tensor).
  static MoeModel synthetic(const ModelConfig& config, std::uint64_t seed, ModelOptions options);
  /// Weights read from a Hugging Face checkpoint; CheckpointError names a missing or mis-shaped tensor.
  static MoeModel from_checkpoint(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                                  ModelOptions options);
  MoeModel(MoeModel&&) = default;
  ~MoeModel();

  /// Bytes of VRAM the model needs besides expert slots and KV (weights + workspace).
  static VramUse fixed_vram(const ModelConfig& config, const ModelOptions& options);
  /// Where `options.vram_budget` goes (weights, workspace, the expert
  /// policy's slots, KV); ModelBudgetError when it cannot hold them.
  static VramUse vram_plan(const ModelConfig& config, const ModelOptions& options);
  /// Bytes of every routed expert of the model (the host store).
  static std::uint64_t expert_store_bytes(const ModelConfig& config);
  /// Most bytes of pinned staging buffers (expert inputs and outputs, logits) a model of `options` grows.
  static std::uint64_t pinned_staging_bytes(const ModelConfig& config, const ModelOptions& options);
  /// Bytes of VRAM that `blocks_per_layer` KV blocks in every layer take, with their decode states.
  static std::uint64_t kv_vram(const ModelConfig& config, const ModelOptions& options, std::uint64_t blocks_per_layer);
  /// Bytes of one routed expert's weights.
  static std::uint64_t expert_bytes(const ModelConfig& config);
  /// Host memory a model of `options` allocates at most: the expert store
  /// (unless shared), KV pools, staging, in a host-only build the GPU side, and
  /// the largest tensor while loading. The constructor compares it with
  /// available_host_memory() before allocating anything.
  static std::uint64_t host_bytes_needed(const ModelConfig& config, const ModelOptions& options);

  const ModelConfig& config() const noexcept { return config_; }
  const AttentionShape& attention_shape() const noexcept { return shape_; }
  const InplaceKVCache<bf16>& cache() const noexcept { return *cache_; }
  const VramUse& vram_use() const noexcept { return vram_; }
  /// Host memory the model holds now.
  HostUse host_use() const;
  /// The routed experts in pinned memory, for another model of the same weights.
  const std::shared_ptr<HostExpertStore>& host_experts() const noexcept { return host_experts_; }

  /// A new, empty sequence expected to reach `expected_tokens` (KV placement plans for it).
  int add_sequence(std::int64_t expected_tokens = 0);
  /// What placement plans `sequence` for (add_sequence's argument).
  std::int64_t expected_tokens(int sequence) const { return expected_tokens_.at(static_cast<std::size_t>(sequence)); }

  /// Returns every block of `sequence` to its pool (the KV policy is told); the id becomes invalid.
  void free_sequence(int sequence);

  /// Runs `prompt` of an empty `sequence` through the prefill path, in chunks
  /// of at most max_rows tokens; returns the logits of its last token (vocab).
  /// A chunk attends to its own tokens causally and to the earlier chunks
  /// where the KV policy placed them, once per query tile (prefill.hpp), and
  /// is written through the policy as it is produced. `progress` (optional)
  /// hears the tokens done after each chunk.
  std::vector<float> prefill(int sequence, const std::vector<int>& prompt,
                             const std::function<void(std::int64_t done, std::int64_t total)>& progress = {});
  /// Appends `tokens` tokens of synthetic keys and values (seeded; uniform in
  /// [-1, 1)) to every layer of `sequence`, placed by the KV policy as a
  /// prefill would place them: a long context for decode measurements, whose
  /// step times do not depend on the values.
  void fill_context(int sequence, std::int64_t tokens, std::uint64_t seed);
  /// Tokens fill_context places per call of the KV policy (what plans of its placement replay).
  static constexpr std::int64_t fill_chunk_tokens = 4096;
  /// One decode token for each of `sequences`; returns their logits (batch, vocab).
  std::vector<std::vector<float>> step(const std::vector<int>& sequences, const std::vector<int>& tokens);

  /// Per layer, the last forward pass's record.
  const std::vector<LayerRecord>& last_records() const noexcept { return records_; }
  /// Tells the expert policy that warm-up is over (it may move experts now).
  void end_warmup();

 private:
  ModelForward forward();

  ModelConfig config_;
  AttentionShape shape_;
  ModelOptions options_;
  VramUse vram_;
  std::unique_ptr<InplaceKVCache<bf16>> cache_;
  std::unique_ptr<KVPolicy> kv_policy_;
  std::shared_ptr<HostExpertStore> host_experts_;
  ExpertResidency residency_;
  std::vector<LayerRecord> records_;
  std::vector<std::int64_t> expected_tokens_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace writescope
