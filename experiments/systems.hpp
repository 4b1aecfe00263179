#pragma once
// The systems compared (DESIGN.md §6). Each is a KV placement and attention
// policy plus an expert policy on the same model runtime, kernels and KV
// layouts, so a speedup measures the policy, not the code. One file per system
// in systems/ says what the original does and what the reproduction keeps.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/roofline.hpp"
#include "moe/model.hpp"

namespace writescope {

/// Tunables of the reproduced policies (recorded with every run).
struct SystemOptions {
  double expert_vram_share = 0.5;  // Fiddler / HybriMoE: share of the free VRAM given to expert slots
  double score_decay = 0.8;        // HybriMoE: weight of the past in the decayed expert scores
  int prefetch_experts = 0;        // HybriMoE: next-layer experts prefetched per layer; 0: experts_per_token
  std::string writescope_experts = "ktransformers";  // WriteScope's expert policy (a baseline's name)
};

/// What a system is built for: what a server knows before the run (its
/// budgets, batch and prompts' length), never the run's final length or other
/// systems' results.
struct SystemContext {
  ModelConfig model;
  MachineProfile profile;
  int batch = 1;
  std::int64_t context = 0;              // tokens per sequence at the start
  SystemOptions options;
  std::uint64_t vram_budget = 0;
  int block_tokens = 64;
  int max_rows = 1;                      // most tokens a forward pass carries (ModelOptions::max_rows)
  int stream_chunk_blocks = 8;           // KV blocks per streaming chunk (ModelOptions::stream_chunk_blocks)
  bool experts_pinned = true;            // expert copies run at the pinned (else pageable) link rate
};

struct System {
  std::string expert_policy;       // the baseline whose expert policy it runs
  KVPolicyFactory kv_policy;
  std::shared_ptr<ExpertPolicy> experts;
  int micro_batches = 1;           // sequences of a step run in this many groups (MoE-Lightning)
  /// Where spilled KV goes: one region (the pinned band for the GPU-attention
  /// baselines, the host pool for MoE-Lightning), none (GPU-only), or both
  /// pools (WriteScope: spill_region empty and spills_to_both).
  std::optional<Region> spill_region;
  bool spills_to_both = false;
  bool vram_kv = true;             // false: no KV in VRAM (MoE-Lightning)
};

/// "writescope", "fiddler", "ktransformers", "moe-lightning", "hybrimoe", "gpu-only".
const std::vector<std::string>& system_names();
/// Baselines whose expert policy WriteScope may run ("fiddler", "ktransformers", "hybrimoe").
const std::vector<std::string>& expert_policy_names();
/// The named system; std::invalid_argument lists the names otherwise.
System make_system(const std::string& name, const SystemContext& context);

/// A system whose KV fills its layers' VRAM share first (unless `use_vram`
/// is false) and then spills to `spill` (Region::gpu_resident: nowhere), read
/// by each block's affine device; its expert policy and name are `experts`
/// and `name` (also the expert policy's name).
System first_fit_system(const std::string& name, const SystemContext& context, Region spill, bool use_vram,
                        std::shared_ptr<ExpertPolicy> experts);

/// WriteScope's decode step with each baseline's expert policy (fiddler,
/// ktransformers, hybrimoe) as its roofline model predicts it from the profile,
/// the budgets and the context alone: the expert phase plus the attention its
/// expert slots leave room for, in seconds per step, by policy name.
std::map<std::string, double> writescope_expert_estimates(const SystemContext& context);
/// WriteScope's own expert policy for `context`, picked before the run: the
/// one writescope_expert_estimates predicts fastest.
std::string writescope_expert_choice(const SystemContext& context);

/// The roofline model of `context`'s machine and model shape.
RooflineModel roofline_of(const SystemContext& context);
/// The fixed VRAM (MoeModel::fixed_vram: weights, workspace) of the context's
/// run: its budget, block size, rows and streaming chunks.
VramUse fixed_vram_of(const SystemContext& context);
/// Expert costs from the machine profile.
ExpertCosts expert_costs_of(const SystemContext& context);

// One per system (systems/*.cpp).
System make_writescope(const SystemContext& context);
System make_fiddler(const SystemContext& context);
System make_ktransformers(const SystemContext& context);
System make_moe_lightning(const SystemContext& context);
System make_hybrimoe(const SystemContext& context);
System make_gpu_only(const SystemContext& context);
/// MoE-Lightning's resident MoE layers by its roofline (HRM), before the VRAM budget caps them.
int moe_lightning_resident_layers(const SystemContext& context);
/// The expert policy of a baseline, for WriteScope to share.
std::shared_ptr<ExpertPolicy> fiddler_experts(const SystemContext& context);
std::shared_ptr<ExpertPolicy> hybrimoe_experts(const SystemContext& context);

}  // namespace writescope
