#include "experiments/predict.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <map>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "experiments/calibration.hpp"
#include "experiments/impl/run_record.hpp"
#include "framework/log.hpp"
#include "framework/machine.hpp"
#include "framework/results_store.hpp"
#include "framework/runtime.hpp"
#include "moe/linear.hpp"
#include "moe/weights.hpp"

namespace writescope {
namespace {

/// Kernel launches (each also a fence) counted from moe/model.cpp's decode
/// path, each paying the profile's launch latency: a layer outside attention
/// and experts (norms, projections, rope, residuals, copies of queries and
/// activations), its router (logits, top-k, copies to the host), a routed
/// expert on the GPU side run alone (gather, gate, up, silu, down, scatter),
/// a batch of experts (gather, gate and up, silu, down, weighted sums; on a
/// GPU also the two copies of its indices and weights, and a launch of the
/// products per impl::max_team_problems groups of their rows), and the step
/// outside layers (embedding, final norm, LM head, logits).
constexpr int layer_launches = 17, router_launches = 5, expert_launches = 6, expert_batch_launches = 5,
              gpu_expert_batch_copies = 2, step_launches = 6;

/// Weight bytes of the model's dense parts, read once per decode step.
struct DenseBytes {
  std::vector<double> attention, router, shared, dense_mlp;  // per layer
  double lm_head = 0;
};

DenseBytes dense_bytes(const ModelConfig& c) {
  DenseBytes d;
  for (auto* v : {&d.attention, &d.router, &d.shared, &d.dense_mlp}) v->assign(static_cast<std::size_t>(c.layers), 0.0);
  for (const TensorSpec& spec : weight_specs(c)) {
    const double bytes = static_cast<double>(spec.elements()) * (spec.is_norm ? sizeof(float) : sizeof(bf16));
    const std::string prefix = "model.layers.";
    if (spec.name.rfind(prefix, 0) != 0) {
      if (spec.name == "lm_head.weight" || (c.tied_embeddings && spec.name == "model.embed_tokens.weight"))
        d.lm_head = bytes;
      continue;
    }
    const std::size_t dot = spec.name.find('.', prefix.size());
    const auto layer = static_cast<std::size_t>(std::stoi(spec.name.substr(prefix.size(), dot - prefix.size())));
    const std::string rest = spec.name.substr(dot + 1);
    const std::size_t block = rest.find('.');
    const std::string module = rest.substr(0, block), inside = rest.substr(block + 1);
    const bool feed_forward = module == "mlp" || module == "block_sparse_moe";  // Mixtral's name for it
    if (!feed_forward) d.attention[layer] += bytes;  // self_attn and the layer's norms
    else if (inside.rfind("shared_experts.", 0) == 0) d.shared[layer] += bytes;
    else if (inside.rfind("experts.", 0) == 0) continue;  // routed: priced by the expert policy's plan
    else if (inside == "gate.weight") d.router[layer] += bytes;
    else d.dense_mlp[layer] += bytes;
  }
  return d;
}

/// The context the systems' own cost views take (roofline_of, expert_costs_of).
SystemContext cost_context(const MachineProfile& p, const ModelConfig& c, bool experts_pinned) {
  SystemContext context{c, p, 1, 0, SystemOptions{}};
  context.experts_pinned = experts_pinned;
  return context;
}

/// What the profile says each piece of a decode step costs.
struct StepRates {
  bool has_gpu = false;
  double dense_gbps = 0;      // GPU-side weights (HBM; the host's bf16 kernel without a GPU)
  double dense_gflops = 0;    // the host's bf16 kernel without a GPU
  double launch_s = 0;        // one kernel launch of the GPU-side work
  double cpu_launch_s = 0;    // one parallel region on the host threads
  double link_gbps = 0;       // pinned host -> GPU (a host copy without a GPU)
  double d2h_gbps = 0;
  double link_latency_s = 0;
  RooflineModel roofline;
  double fmas_per_byte = 0;
  ExpertCosts experts;

  StepRates(const MachineProfile& p, const ModelConfig& c, bool experts_pinned)
      : has_gpu(p.has_gpu),
        roofline(roofline_of(cost_context(p, c, experts_pinned))),
        fmas_per_byte(c.attention().fmas_per_byte(sizeof(bf16))),
        experts(expert_costs_of(cost_context(p, c, experts_pinned))) {
    const double host_copy_gbps = p.cpu_dram_read_gbps / 2;
    dense_gbps = has_gpu ? p.hbm_gbps : p.cpu_expert_gbps;
    dense_gflops = p.cpu_expert_gflops;
    launch_s = has_gpu ? p.gpu_launch_latency_s : p.cpu_launch_latency_s;
    cpu_launch_s = p.cpu_launch_latency_s;
    link_gbps = has_gpu ? p.pinned_h2d_gbps : host_copy_gbps;
    d2h_gbps = has_gpu ? p.pinned_d2h_gbps : host_copy_gbps;
    link_latency_s = has_gpu ? p.link_latency_s : 0.0;
    if (!has_gpu) {
      // A host build's expert "load" is a host copy: finite, without a link's latency.
      experts.link_gbps = host_copy_gbps;
      experts.link_latency_s = 0;
      experts.has_gpu = true;
    }
  }

  /// One routed expert's products over `tokens` rows on the GPU side (the
  /// CPU without a GPU), without its launches.
  double gpu_expert(int tokens) const { return has_gpu ? experts.gpu_seconds(tokens) : experts.cpu_seconds(tokens); }
  /// The launches of a routed expert run alone on the GPU side.
  double gpu_expert_launches_s() const { return expert_launches * launch_s; }
  /// The launches of a batch of experts on the GPU side whose rows make
  /// `row_groups` groups of up to impl::linear_team_rows (a host build runs
  /// each product step of the batch in one launch).
  double gpu_expert_batch_launches_s(int row_groups) const {
    if (!has_gpu) return expert_batch_launches * launch_s;
    const int per_launch = impl::max_team_problems;
    const int products = (2 * row_groups + per_launch - 1) / per_launch + (row_groups + per_launch - 1) / per_launch;
    return (expert_batch_launches - 2 + products + gpu_expert_batch_copies) * launch_s;
  }
  /// The launches of a layer's CPU experts, one batch.
  double cpu_expert_batch_launches_s() const { return expert_batch_launches * cpu_launch_s; }
  /// Dense bf16 weights of `bytes` applied to `rows` rows on the GPU side. A
  /// GPU streams them at HBM rate (a decode batch is far below its compute
  /// rate); the host's linear kernel at a few rows neither streams nor
  /// computes at its peak, so there the weight stream and the multiply-adds
  /// (at the expert kernel's calibrated FLOP rate) add up.
  double dense(double bytes, int rows) const {
    const double stream = bytes / (dense_gbps * 1e9);
    return has_gpu ? stream : stream + rows * bytes / sizeof(bf16) * 2 / (dense_gflops * 1e9);
  }
};

/// Decode attention of one plan: resident and streamed bytes on the GPU, CPU
/// bytes in place, overlapping; without a GPU the host reads everything, and
/// streamed blocks are first copied as a host build copies them.
/// Adds the attention of one plan to `record`; returns its timings as SplitDecode reports them (what
/// the KV policy's feedback observes). Streamed bytes are the tokens' (the KV policy's unit), where
/// StreamedDecode copies whole blocks: a partly filled last block is underpriced (README, Projection).
/// `copies_in_flight`: link seconds of expert prefetch copies still running when the attention starts.
/// They share the link with the streamed KV, each at half its rate while both run, so both end
/// `shared_link_seconds` later than alone (the caller delays its copies by as much).
SplitTimings price_attention(const StepRates& r, const StepBytes& bytes, double cpu_movable, double copies_in_flight,
                             LayerRecord& record, double& shared_link_seconds) {
  SplitTimings t;
  const double streamed = bytes.movable - cpu_movable;
  const double transfer = streamed > 0 ? streamed / (r.link_gbps * 1e9) : 0.0;
  shared_link_seconds = std::min(copies_in_flight, transfer);
  if (streamed > 0) t.streamed_seconds = transfer + shared_link_seconds + r.link_latency_s;
  if (r.has_gpu) {
    const SplitPrediction p = r.roofline.predict(bytes, cpu_movable, r.fmas_per_byte, 0);
    t.gpu_seconds = p.gpu_seconds + shared_link_seconds;
    t.cpu_seconds = p.cpu_seconds;
    t.step_seconds = std::max(t.gpu_seconds, p.cpu_seconds);
    // The resident kernel's own time is known when it ends after the streamed path beside it.
    const double resident = bytes.gpu_resident / (r.roofline.rates().hbm_gbps * 1e9) + r.roofline.rates().gpu_latency_s;
    if (bytes.gpu_resident > 0 && resident >= t.streamed_seconds) t.resident_seconds = resident;
  } else {
    t.gpu_seconds = bytes.gpu_resident + streamed > 0
                        ? r.roofline.cpu_seconds(0, bytes.gpu_resident + streamed, r.fmas_per_byte, 0) +
                              t.streamed_seconds
                        : 0.0;
    t.cpu_seconds = r.roofline.cpu_seconds(bytes.cpu_resident, cpu_movable, r.fmas_per_byte, 0);
    t.step_seconds = t.gpu_seconds + t.cpu_seconds;
  }
  t.streamed_bytes = static_cast<std::uint64_t>(streamed);
  record.attention_gpu += t.gpu_seconds;
  record.attention_cpu += t.cpu_seconds;
  record.attention += t.step_seconds;
  record.streamed_bytes += streamed;
  record.streamed_seconds += t.streamed_seconds;
  return t;
}

/// Top-k distinct experts per row, uniformly, with random positive weights.
Routing draw_routing(int rows, int experts, int per_token, std::mt19937_64& random) {
  Routing routing;
  routing.rows.assign(static_cast<std::size_t>(experts), {});
  routing.weights.assign(static_cast<std::size_t>(experts), {});
  std::vector<int> order(static_cast<std::size_t>(experts));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int row = 0; row < rows; ++row) {
    for (int e = 0; e < experts; ++e) order[e] = e;
    for (int k = 0; k < per_token; ++k) {
      std::uniform_int_distribution<int> pick(k, experts - 1);
      std::swap(order[k], order[pick(random)]);
      routing.rows[order[k]].push_back(row);
      routing.weights[order[k]].push_back(weight(random));
    }
  }
  for (auto& rows_of : routing.rows) std::sort(rows_of.begin(), rows_of.end());
  return routing;
}

/// The model runtime's decisions without its data: the cache's bookkeeping,
/// the KV policy, the expert policy and its slots, driven as MoeModel drives them.
class PlanningModel {
 public:
  PlanningModel(const ModelConfig& config, const ModelOptions& options, const MachineProfile& profile,
                std::uint64_t seed)
      : c_(config),
        options_(options),
        shape_(config.attention()),
        vram_(MoeModel::vram_plan(config, options)),
        residency_(config.layers - config.dense_layers, config.experts,
                   config.experts > 0 ? static_cast<int>(vram_.expert_slots / MoeModel::expert_bytes(config)) : 0),
        cache_(KVCacheShape{config.layers, shape_.block_geometry(options.block_tokens)},
               KVCacheBudgets{vram_.kv, options.pinned_kv_budget, options.host_kv_budget}, BudgetPolicy::strict,
               KVStorage::bookkeeping),
        kv_policy_(options.kv_policy(shape_, cache_)),
        rates_(profile, config, options.pin_experts),
        dense_(dense_bytes(config)),
        random_(seed) {
    for (const ExpertLoad& load : options_.experts->initial(residency_)) residency_.assign(load.slot, load.layer, load.expert);
  }

  const VramUse& vram() const { return vram_; }
  /// The pinned staging buffers MoeModel would have grown by now (HostUse::staging_pinned).
  std::uint64_t staging_pinned_bytes() const {
    return (2 * staged_cpu_experts_ + staged_logits_) * sizeof(float);
  }
  const InplaceKVCache<bf16>& cache() const { return cache_; }

  int add_sequence(std::int64_t expected) {
    const int sequence = cache_.add_sequence();
    expected_.resize(static_cast<std::size_t>(sequence) + 1, 0);
    expected_[sequence] = expected;
    return sequence;
  }
  void free_sequence(int sequence) {
    for (int layer = 0; layer < c_.layers; ++layer) kv_policy_->released(layer, cache_.block_regions(layer, sequence));
    cache_.free_sequence(sequence);
  }
  void append(int layer, int sequence, std::int64_t tokens, bool decode) {
    kv_policy_->place_and_write(
        layer, sequence, tokens, std::max(expected_[sequence], cache_.length(layer, sequence) + tokens), decode,
        [&](const std::vector<Region>& regions) { cache_.record_append(layer, sequence, tokens, regions); });
  }
  /// MoeModel::fill_context's placement: every layer in chunks of MoeModel::fill_chunk_tokens.
  void fill_context(int sequence, std::int64_t tokens) {
    for (int layer = 0; layer < c_.layers; ++layer)
      for (std::int64_t begin = 0; begin < tokens; begin += MoeModel::fill_chunk_tokens)
        append(layer, sequence, std::min(MoeModel::fill_chunk_tokens, tokens - begin), false);
  }
  /// MoeModel::prefill's decisions for a prompt of `tokens`: chunks of
  /// max_rows placed layer by layer, the expert policy seeing their routing.
  void prefill(int sequence, std::int64_t tokens) {
    for (std::int64_t begin = 0; begin < tokens; begin += options_.max_rows) {
      const int rows = static_cast<int>(std::min<std::int64_t>(options_.max_rows, tokens - begin));
      for (int layer = 0; layer < c_.layers; ++layer) {
        append(layer, sequence, rows, false);
        if (layer < c_.dense_layers) continue;
        const int moe_layer = layer - c_.dense_layers;
        const Routing routing = draw_routing(rows, c_.experts, c_.experts_per_token, random_);
        const ExpertPlan plan = options_.experts->plan(moe_layer, routing, residency_);
        if (!plan.cpu.empty()) stage_cpu_experts(rows);
        apply(plan.loads);
        apply(options_.experts->after_layer(moe_layer, routing, residency_));
      }
      stage_logits(1);  // the chunk's last row
    }
  }
  /// As MoeModel::end_warmup: the prefetch stream is drained before the policy places experts.
  void end_warmup() {
    prefetch_wait_ = 0;
    prefetching_slots_.clear();
    apply(options_.experts->end_warmup(residency_));
  }

  /// One decode step of `sequences`: the layer records and the step's seconds.
  double step(const std::vector<int>& sequences, std::vector<LayerRecord>& records) {
    const int rows = static_cast<int>(sequences.size());
    const int groups = std::max(1, std::min(options_.micro_batches, rows));
    records.assign(static_cast<std::size_t>(c_.layers), LayerRecord{});
    double seconds = 0;
    for (int layer = 0; layer < c_.layers; ++layer) {
      LayerRecord& record = records[layer];
      std::vector<double> attention_stage(static_cast<std::size_t>(groups)), ffn_stage(attention_stage.size()),
          issued(attention_stage.size());  // prefetch copy seconds each part's feed-forward starts as it ends
      bool waits = false;
      for (int g = 0; g < groups; ++g) {
        const std::vector<int> part(sequences.begin() + rows * g / groups, sequences.begin() + rows * (g + 1) / groups);
        LayerRecord stage;
        // The previous layer's prefetch copies run beside the first part's attention. (A later part's
        // would need the timeline first; only MoE-Lightning runs several, and it streams no KV.)
        double shared_link_seconds = 0;
        attention_stage[g] = attend(layer, part, g == 0 ? prefetch_wait_ : 0.0, stage, shared_link_seconds) +
                             layer_dense(layer, static_cast<int>(part.size()));
        prefetch_wait_ += shared_link_seconds;
        ffn_stage[g] = feed_forward(layer, static_cast<int>(part.size()), stage, issued[g], waits);
        record.add(stage);
      }
      // The feed-forward waits for the copies where its plan uses a slot they fill (MoeModel's
      // wait_for_prefetch), in the first part that does; the timeline puts the wait in part 0's stage.
      const LayerTimeline timeline =
          layer_timeline(attention_stage, ffn_stage, issued, prefetch_wait_, waits, rates_.has_gpu);
      record.transfers += timeline.exposed;
      record.feed_forward += timeline.exposed;
      prefetch_wait_ = timeline.copies_left;
      record.other = std::max(0.0, timeline.wall - record.attention - record.feed_forward);
      seconds += timeline.wall;
    }
    stage_logits(rows);
    const double logits = static_cast<double>(rows) * c_.vocab * sizeof(float);
    const double lm_head =
        rates_.dense(dense_.lm_head, rows) + logits / (rates_.d2h_gbps * 1e9) + step_launches * rates_.launch_s;
    // The copies go on beside the LM head.
    prefetch_wait_ = std::max(0.0, prefetch_wait_ - lm_head);
    return seconds + lm_head;
  }

 private:
  /// The CPU's experts of `rows` rows: their inputs and outputs staged in pinned memory.
  void stage_cpu_experts(int rows) {
    staged_cpu_experts_ = scratch_span_after(staged_cpu_experts_, static_cast<std::size_t>(rows) * c_.hidden);
  }
  /// The logits of `rows` rows, copied to the host through pinned memory.
  void stage_logits(int rows) {
    staged_logits_ = scratch_span_after(staged_logits_, static_cast<std::size_t>(rows) * c_.vocab);
  }

  void apply(const std::vector<ExpertLoad>& loads) {
    for (const ExpertLoad& l : loads)
      if (l.slot >= 0) residency_.assign(l.slot, l.layer, l.expert);
  }

  /// Appends one token to each of `part` and prices its attention beside `copies_in_flight` link seconds
  /// of prefetch copies (price_attention); returns the stage's seconds.
  double attend(int layer, const std::vector<int>& part, double copies_in_flight, LayerRecord& record,
                double& shared_link_seconds) {
    std::vector<TokenRange> ranges;
    for (int sequence : part) {
      append(layer, sequence, 1, true);
      ranges.push_back(TokenRange{0, cache_.length(layer, sequence)});
    }
    SplitPrediction prediction;
    const SplitPlan plan = kv_policy_->plan(layer, part, ranges, prediction);
    const double bytes_per_token = kv_policy_->bytes_per_token();
    const StepBytes bytes = plan_bytes(plan, bytes_per_token);
    const double cpu_movable = segment_bytes(plan.cpu_pinned, bytes_per_token);
    record.region_bytes[int(Region::gpu_resident)] += bytes.gpu_resident;
    record.region_bytes[int(Region::gpu_streamed)] += bytes.movable - cpu_movable;
    record.region_bytes[int(Region::cpu_resident)] += bytes.cpu_resident;
    record.region_bytes[int(Region::cpu_streamed)] += cpu_movable;
    record.predicted_attention += prediction.step_seconds;
    const SplitTimings timings =
        price_attention(rates_, bytes, cpu_movable, copies_in_flight, record, shared_link_seconds);
    // The runtime's feedback, with the priced times as the measurement.
    kv_policy_->observe(plan, timings);
    return timings.step_seconds;
  }

  /// The layer's dense weights outside the feed-forward and its launches.
  double layer_dense(int layer, int rows) const {
    return rates_.dense(dense_.attention[layer], rows) + layer_launches * rates_.launch_s;
  }

  /// The feed-forward of `rows` rows: the expert policy's plan priced;
  /// prefetches it issues are added to `prefetch`. Returns its seconds.
  double feed_forward(int layer, int rows, LayerRecord& record, double& prefetch, bool& waits) {
    if (layer < c_.dense_layers) {
      const double seconds = rates_.dense(dense_.dense_mlp[layer], rows);
      record.experts_gpu += seconds;
      record.feed_forward += seconds;
      return seconds;
    }
    const int moe_layer = layer - c_.dense_layers;
    const Routing routing = draw_routing(rows, c_.experts, c_.experts_per_token, random_);
    const ExpertPlan plan = options_.experts->plan(moe_layer, routing, residency_);
    if (plan.touches_slots(moe_layer, residency_, prefetching_slots_)) {
      waits = true;
      prefetching_slots_.clear();
    }
    if (!plan.cpu.empty()) stage_cpu_experts(rows);
    double gpu = rates_.dense(dense_.shared[layer], rows), cpu = 0, copies = 0;
    const double loads = static_cast<double>(plan.loads.size()) * rates_.experts.transfer_seconds();
    apply(plan.loads);
    // As the runtime runs them: runs of resident experts one batch each, a
    // staged expert alone.
    int batch_groups = 0;
    auto close_batch = [&] {
      if (batch_groups > 0) gpu += rates_.gpu_expert_batch_launches_s(batch_groups);
      batch_groups = 0;
    };
    for (int e : plan.gpu) {
      const int tokens = static_cast<int>(routing.rows[e].size());
      gpu += rates_.gpu_expert(tokens);
      if (residency_.slot_of(moe_layer, e) >= 0) {
        batch_groups += (tokens + impl::linear_team_rows - 1) / impl::linear_team_rows;
        continue;
      }
      close_batch();
      gpu += rates_.gpu_expert_launches_s();
    }
    close_batch();
    for (int e : plan.cpu) cpu += rates_.experts.cpu_seconds(static_cast<int>(routing.rows[e].size()));
    if (!plan.cpu.empty()) {
      cpu += rates_.cpu_expert_batch_launches_s();
      const double activations = static_cast<double>(rows) * c_.hidden * sizeof(float);
      copies = activations / (rates_.link_gbps * 1e9) + activations / (rates_.d2h_gbps * 1e9) + 2 * rates_.link_latency_s;
    }
    const std::vector<ExpertLoad> next = options_.experts->after_layer(moe_layer, routing, residency_);
    apply(next);
    // The runtime prefetches into slots only (a staging load waits for its layer).
    const double issued = static_cast<double>(std::count_if(next.begin(), next.end(),
                                                             [](const ExpertLoad& l) { return l.slot >= 0; })) *
                          rates_.experts.transfer_seconds();
    // Without a GPU a prefetch copy runs at once on the host threads.
    if (rates_.has_gpu) {
      prefetch += issued;
      for (const ExpertLoad& l : next)
        if (l.slot >= 0 && std::find(prefetching_slots_.begin(), prefetching_slots_.end(), l.slot) ==
                               prefetching_slots_.end())
          prefetching_slots_.push_back(l.slot);
    }
    const double router = rates_.dense(dense_.router[layer], rows) + router_launches * rates_.launch_s;
    const double seconds = router + copies + (rates_.has_gpu ? std::max(gpu + loads, cpu) : gpu + loads + cpu) +
                           (rates_.has_gpu ? 0.0 : issued);
    record.experts_gpu += gpu;
    record.experts_cpu += cpu;
    record.transfers += loads + copies + (rates_.has_gpu ? 0.0 : issued);
    record.feed_forward += seconds;
    return seconds;
  }

  ModelConfig c_;
  ModelOptions options_;
  AttentionShape shape_;
  VramUse vram_;
  ExpertResidency residency_;
  InplaceKVCache<bf16> cache_;
  std::unique_ptr<KVPolicy> kv_policy_;
  StepRates rates_;
  DenseBytes dense_;
  std::mt19937_64 random_;
  std::vector<std::int64_t> expected_;
  double prefetch_wait_ = 0;  // prefetch copy seconds left at the next layer's start
  std::vector<int> prefetching_slots_;  // slots those copies fill, not yet waited for (MoeModel's prefetching_slots)
  // Floats of MoeModel's x_pinned (as of out_pinned) and logits_pinned, grown as impl::scratch grows them.
  std::size_t staged_cpu_experts_ = 0, staged_logits_ = 0;
};

}  // namespace

LayerTimeline layer_timeline(const std::vector<double>& attention, const std::vector<double>& feed_forward,
                             const std::vector<double>& issued, double copies_left, bool waits, bool overlap) {
  const std::size_t parts = attention.size();
  if (parts == 0 || feed_forward.size() != parts || issued.size() != parts)
    throw std::invalid_argument("layer_timeline: one attention stage, feed-forward and prefetch per part");
  LayerTimeline t;
  // The copy stream's end, in seconds from the layer's start.
  double copies_until = copies_left;
  t.wall = attention[0];
  if (waits) {
    t.exposed = std::max(0.0, copies_until - attention[0]);
    copies_until = 0;
  }
  for (std::size_t j = 0; j < parts; ++j) {
    // Part 0's feed-forward waits for the copies inside its stage, beside part 1's attention (MoeModel's
    // layer_pipeline), not before it.
    const double stage = feed_forward[j] + (j == 0 ? t.exposed : 0.0);
    if (issued[j] > 0) copies_until = std::max(copies_until, t.wall + stage) + issued[j];
    const bool last = j + 1 == parts;
    t.wall += last ? stage : overlap ? std::max(stage, attention[j + 1]) : stage + attention[j + 1];
  }
  t.copies_left = std::max(0.0, copies_until - t.wall);
  return t;
}

PricedSteps price_decode(const ModelConfig& config, const ModelOptions& options, const MachineProfile& profile,
                         const DecodeWorkload& workload) {
  PlanningModel model(config, options, profile, workload.seed);
  if (workload.profile_tokens > 0) {
    const int sequence = model.add_sequence(workload.planned_tokens);
    model.prefill(sequence, workload.profile_tokens);
    model.free_sequence(sequence);
    model.end_warmup();
  }
  std::vector<int> sequences;
  for (int b = 0; b < workload.batch; ++b) {
    sequences.push_back(model.add_sequence(workload.planned_tokens));
    if (workload.prefill_context)
      model.prefill(sequences.back(), workload.context);
    else
      model.fill_context(sequences.back(), workload.context);
  }
  PricedSteps priced;
  priced.vram = model.vram();
  std::vector<LayerRecord> records;
  for (int step = 0; step < workload.warmup_steps + workload.measured_steps; ++step) {
    if (step == 0 && workload.profile_tokens == 0) model.end_warmup();  // as the harness: before the first step
    const double seconds = model.step(sequences, records);
    if (step < workload.warmup_steps) continue;
    priced.step_seconds.push_back(seconds);
    priced.layers.push_back(records);
  }
  const InplaceKVCache<bf16>& cache = model.cache();
  priced.host.experts = MoeModel::expert_store_bytes(config);
  priced.host.staging_pinned = model.staging_pinned_bytes();
  priced.host.experts_pinned = options.pin_experts && options.experts->loads_experts();
  priced.host.kv_pinned = static_cast<std::uint64_t>(cache.capacity_blocks(Region::gpu_streamed)) * cache.block_bytes();
  priced.host.kv_host = static_cast<std::uint64_t>(cache.capacity_blocks(Region::cpu_resident)) * cache.block_bytes();
  return priced;
}

namespace {

/// A group name of the predicted file: the profile and the run.
std::string predicted_id(const MachineProfile& profile, const RunSpec& run) {
  return group_name(profile.name + "__" + run.id());
}

/// The run of `config` priced on `profile`, as the harness would have measured it.
impl::RunResult predict_run(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile) {
  const impl::RunSetup setup = impl::prepare_run(config, run, profile);
  DecodeWorkload workload;
  workload.batch = run.batch;
  workload.context = run.context;
  workload.planned_tokens = config.max_sequence_tokens;
  workload.prefill_context = config.context_fill == "prefill";
  workload.warmup_steps = config.warmup_steps;
  workload.measured_steps = config.measured_steps;
  workload.profile_tokens = setup.profiles ? config.profile_tokens : 0;
  workload.seed = config.seed + 7919ull * static_cast<std::uint64_t>(run.repetition);
  const PricedSteps priced = price_decode(run.model->config, setup.options, profile, workload);
  impl::RunResult result;
  result.step_seconds = priced.step_seconds;
  for (const auto& layers : priced.layers) result.add_step(layers);
  result.micro_batches = setup.system.micro_batches;
  result.planned_sequence_tokens = config.max_sequence_tokens;
  result.vram = priced.vram;
  result.host = priced.host;
  result.attention_fmas_per_byte = run.model->config.attention().fmas_per_byte(sizeof(bf16));
  const ModelRates rates = roofline_of(setup.context).rates();
  result.cpu_attention_gbps = rates.cpu_attention_gbps;
  result.cpu_streamed_attention_gbps = rates.cpu_streamed_attention_gbps;
  return result;
}

double mean(const std::vector<double>& values) {
  double total = 0;
  for (double v : values) total += v;
  return values.empty() ? 0.0 : total / static_cast<double>(values.size());
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// The profile's CPU attention rates hold for the block size they were measured with.
void warn_on_block_size(const ExperimentConfig& config) {
  if (config.block_tokens != calibration_block_tokens)
    log_info("predict: warning: ", config.name, " uses ", config.block_tokens, "-token KV blocks but CPU attention ",
             "rates are calibrated with ", calibration_block_tokens, "-token blocks; the CPU kernels run smaller ",
             "blocks slower than the projection says");
}

/// predict_experiment's file, written into `store`.
ExperimentSummary write_projection(ResultsStore& store, const ExperimentConfig& config,
                                   const std::vector<MachineProfile>& profiles,
                                   const std::vector<std::vector<RunSpec>>& runs_of, const std::string& machine_yaml,
                                   std::ostream& progress, const std::string& command) {
  const std::string& output = store.path();
  // One transaction replaces an earlier projection whole: until the commit the
  // file keeps it (a failure or a kill loses nothing), and a commit rewrites
  // the whole file anyway.
  auto txn = store.begin_replacement();
  ResultsGroup root = txn.root();
  std::size_t planned_runs = 0;
  for (const std::vector<RunSpec>& runs : runs_of) planned_runs += runs.size();
  impl::write_experiment_attributes(root, config, profiles.front(), machine_yaml, Shard{}, planned_runs);
  root.set_attribute("predicted", std::int64_t{1});
  ResultsGroup all = root.create_group("profiles");
  for (const MachineProfile& p : profiles) {
    ResultsGroup g = all.create_group(group_name(p.name));
    g.set_attribute("name", p.name);
    g.set_attribute("yaml", p.to_yaml());
  }
  ResultsGroup runs_group = root.open_group("runs");
  ExperimentSummary summary;
  for (std::size_t p = 0; p < profiles.size(); ++p) {
    const MachineProfile& profile = profiles[p];
    const std::vector<RunSpec>& runs = runs_of[p];
    progress << "predict: " << profile.name << ": " << runs.size() << " runs" << std::endl;
    auto last_report = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const RunSpec& run = runs[i];
      impl::RunFailure failure;
      const std::optional<impl::RunResult> result =
          impl::attempt_run([&] { return predict_run(config, run, profile); }, failure);
      const std::string id = predicted_id(profile, run);
      impl::write_run(runs_group, id, config, run, profile.name, machine_yaml, result, failure);
      ResultsGroup written = runs_group.open_group(id);
      written.set_attribute("predicted", std::int64_t{1});
      if (!command.empty()) written.set_attribute("command", command);
      written.set_attribute("checksum", written.checksum());
      if (result) ++summary.complete;
      else ++(failure.status == "does_not_fit" ? summary.did_not_fit : summary.failed);
      if (failure.status == "failed")
        progress << "predict: " << profile.name << ": " << id << ": failed: " << failure.reason << std::endl;
      if (const auto now = std::chrono::steady_clock::now(); now - last_report > std::chrono::seconds(5)) {
        progress << "predict: " << profile.name << ": " << i + 1 << "/" << runs.size() << " runs" << std::endl;
        last_report = now;
      }
    }
  }
  txn.commit();
  progress << "predict: " << summary.complete << " runs predicted, " << summary.did_not_fit << " do not fit, "
           << summary.failed << " failed; wrote " << output << " (projected, not measured)" << std::endl;
  return summary;
}

}  // namespace

ExperimentSummary predict_experiment(const ExperimentConfig& config, const std::vector<MachineProfile>& profiles,
                                     const std::string& output, std::ostream& progress, const std::string& command) {
  if (profiles.empty()) throw std::invalid_argument("predict: --profile must name at least one machine profile");
  warn_on_block_size(config);
  const bool created = !std::filesystem::exists(output);
  std::string replacing;  // what is said when an earlier projection is replaced
  if (!created) {
    const ResultsReader existing(output);
    const bool projection = existing.has_attribute("/", "predicted") && existing.int_attribute("/", "predicted") == 1;
    // A file that holds nothing is a projection stopped before its commit.
    const bool measured = !projection && results_file_problem(existing).empty();
    if (!projection && !existing.holds_nothing())
      throw std::invalid_argument("predict: " + output +
                                  (measured ? " holds measured runs; a projection never overwrites them"
                                            : " is not a projection's results file; a projection overwrites only one") +
                                  " (give another --output)");
    // Projections take seconds to make again, so one replaces another, saying so (once the call is checked).
    if (projection) {
      const std::string experiment =
          existing.has_attribute("/", "experiment") ? existing.string_attribute("/", "experiment") : "";
      const std::size_t runs = existing.exists("/runs") ? existing.list("/runs").size() : 0;
      replacing = "predict: replacing " + output + "'s projection" +
                  (experiment.empty() || experiment == config.name ? std::string()
                                                                   : " of experiment '" + experiment + "'") +
                  " (" + std::to_string(runs) + " runs)";
    }
  }
  for (std::size_t p = 0; p < profiles.size(); ++p)
    for (std::size_t q = 0; q < p; ++q)
      if (profiles[p].name == profiles[q].name)
        throw std::invalid_argument("predict: --profile names profile '" + profiles[p].name + "' twice");
      else if (group_name(profiles[p].name) == group_name(profiles[q].name))
        throw std::invalid_argument("predict: --profile: profiles '" + profiles[q].name + "' and '" + profiles[p].name +
                                    "' would be stored under one name ('" + group_name(profiles[p].name) +
                                    "': '/' and '.' become '_'); rename one");
  // Every profile's runs first: a profile that cannot price the experiment fails before any file is written.
  std::vector<std::vector<RunSpec>> runs_of;
  for (const MachineProfile& profile : profiles) runs_of.push_back(expand_runs(config, profile));
  if (!replacing.empty()) progress << replacing << std::endl;
  create_output_folder("predict: --output", output);
  const std::string machine_yaml = MachineDescription::detect().to_yaml();
  ResultsStore store(output);
  try {
    return write_projection(store, config, profiles, runs_of, machine_yaml, progress, command);
  } catch (...) {
    std::error_code ignored;  // the empty file this call created
    if (created) std::filesystem::remove(output, ignored);
    throw;
  }
}

PredictionComparison compare_predictions(const std::string& results_file, const MachineProfile* cpu_from,
                                         std::ostream* progress) {
  const ResultsReader reader(results_file);
  if (const std::string problem = results_file_problem(reader); !problem.empty())
    throw std::invalid_argument("predict --compare: " + results_file + " is not an experiment's results file (" +
                                problem + "); it compares files that `writescope run` wrote");
  if (reader.has_attribute("/", "predicted") && reader.int_attribute("/", "predicted") == 1)
    throw std::invalid_argument("predict --compare: " + results_file +
                                " holds predicted runs; compare predictions with a file of measured runs");
  const RecordedExperiment recorded = read_recorded_experiment(reader);
  const ExperimentConfig& config = recorded.config;
  const MachineProfile& measured_with = recorded.profile;
  const MachineProfile profile = cpu_from ? with_cpu_of(measured_with, *cpu_from) : measured_with;
  warn_on_block_size(config);
  // The runs as measured: WriteScope's own expert policy was picked with the
  // file's profile, whatever CPU prices them.
  std::map<std::string, RunSpec> by_id;
  for (const RunSpec& run : expand_runs(config, measured_with)) by_id.emplace(run.id(), run);

  PredictionComparison comparison;
  comparison.profile = profile.name;
  std::map<std::pair<std::string, std::string>, std::vector<double>> errors;
  std::vector<double> step_errors;
  auto error_of = [](double predicted, double measured) { return std::abs(predicted - measured) / measured; };
  std::vector<std::string> complete;
  for (const std::string& group : reader.list("/runs"))
    if (reader.string_attribute("/runs/" + group, "status") == "complete") complete.push_back(group);
  if (progress) *progress << "predict --compare: " << complete.size() << " complete runs to price" << std::endl;
  auto last_report = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < complete.size(); ++i) {
    if (const auto now = std::chrono::steady_clock::now(); progress && now - last_report > std::chrono::seconds(5)) {
      *progress << "predict --compare: " << i << "/" << complete.size() << " runs" << std::endl;
      last_report = now;
    }
    const std::string& group = complete[i];
    const std::string g = "/runs/" + group;
    if (const std::string damage = run_damage(reader, g); !damage.empty()) {
      comparison.unpriced.push_back(group + ": " + damage);
      continue;
    }
    const auto found = by_id.find(group);
    if (found == by_id.end() || reader.string_attribute(g, "config") != impl::run_yaml(config, found->second)) {
      comparison.unpriced.push_back(group + ": its settings are not a run of the file's experiment");
      continue;
    }
    // The seconds as measured, checksum or not: a run whose seconds are
    // missing, empty or not finite is named, never averaged into an error.
    std::string unusable;
    auto measured_seconds = [&](const std::string& dataset, bool positive) {
      std::vector<double> values;
      if (!reader.exists(g + "/" + dataset)) {
        if (unusable.empty()) unusable = "it has no " + dataset;
        return values;
      }
      values = reader.read<double>(g + "/" + dataset);
      const bool good = !values.empty() && std::all_of(values.begin(), values.end(), [&](double v) {
        return std::isfinite(v) && (positive ? v > 0 : v >= 0);
      });
      if (!good && unusable.empty())
        unusable = "its " + dataset + " (" + std::to_string(values.size()) + " values) are not all " +
                   (positive ? "positive" : "non-negative") + " finite seconds";
      return values;
    };
    const std::vector<double> step_seconds = measured_seconds("step_seconds", true),
                              attention_seconds = measured_seconds("attention_seconds", false);
    std::map<std::string, std::vector<double>> component_seconds;
    for (const char* name : impl::component_names)
      component_seconds[name] = measured_seconds(std::string("components/") + name, false);
    if (!unusable.empty()) {
      comparison.unpriced.push_back(group + ": " + unusable);
      continue;
    }
    const std::optional<ConfigNode> machine =
        reader.has_attribute(g, "machine")
            ? std::optional(ConfigNode::parse(reader.string_attribute(g, "machine"), results_file + ":" + g + "@machine"))
            : std::nullopt;
    // The profile's CPU rates hold at its thread count (`run` only warns of another): such a run priced with
    // them would show the difference as the model's error. Another profile's CPU (--cpu-from) is priced at its own.
    if (const int threads = machine ? machine->get_or<int>("host_threads", profile.cpu_threads) : profile.cpu_threads;
        !cpu_from && threads != profile.cpu_threads) {
      comparison.unpriced.push_back(group + ": it ran with " + std::to_string(threads) +
                                    " host threads, the profile's CPU rates are for " +
                                    std::to_string(profile.cpu_threads));
      continue;
    }
    impl::RunFailure failure;
    const std::optional<impl::RunResult> priced =
        impl::attempt_run([&] { return predict_run(config, found->second, profile); }, failure);
    if (!priced) {
      comparison.unpriced.push_back(group + ": " + failure.reason);
      continue;
    }
    const impl::RunResult& predicted = *priced;
    // Another profile's CPU may change a system's own choices (MoE-Lightning's micro-batches): such a run
    // priced would be another run than the one measured.
    if (reader.has_attribute(g, "micro_batches") && reader.int_attribute(g, "micro_batches") != predicted.micro_batches) {
      comparison.unpriced.push_back(group + ": it ran " + std::to_string(reader.int_attribute(g, "micro_batches")) +
                                    " micro-batches, the profile's CPU would choose " +
                                    std::to_string(predicted.micro_batches));
      continue;
    }
    // Measured on a build without a GPU: the GPU's share ran on the host.
    if (profile.has_gpu && machine && machine->get_or<std::string>("gpu_name", "").empty())
      ++comparison.host_only_runs;
    const std::string system = reader.string_attribute(g, "system") +
                               (reader.string_attribute(g, "system") == "writescope"
                                    ? "[" + reader.string_attribute(g, "expert_policy") + "]"
                                    : "");
    const double measured_step = mean(step_seconds);
    const double step_error = error_of(mean(predicted.step_seconds), measured_step);
    step_errors.push_back(step_error);
    errors[{system, "step"}].push_back(step_error);
    // A component is compared where it is at least 5% of the measured step:
    // a relative error of a near-zero time says nothing.
    auto compare = [&](const std::string& name, double predicted_time, double measured_time) {
      if (measured_time >= 0.05 * measured_step) errors[{system, name}].push_back(error_of(predicted_time, measured_time));
    };
    compare("attention", mean(predicted.attention), mean(attention_seconds));
    const auto layers = static_cast<double>(reader.int_attribute(g, "layers"));
    for (const char* name : impl::component_names)
      compare(name, mean(predicted.components.at(name)) * layers, mean(component_seconds.at(name)) * layers);
  }
  comparison.runs = static_cast<int>(step_errors.size());
  if (step_errors.empty())
    throw std::invalid_argument(
        "predict --compare: " + results_file +
        (comparison.unpriced.empty() ? " holds no complete runs of its experiment to compare"
                                     : ": none of its " + std::to_string(comparison.unpriced.size()) +
                                           " complete runs could be priced; the first: " + comparison.unpriced.front()));
  comparison.median_step_error = median(step_errors);
  comparison.worst_step_error = *std::max_element(step_errors.begin(), step_errors.end());
  for (const auto& [key, values] : errors)
    comparison.errors.push_back({key.first, key.second, static_cast<int>(values.size()), median(values),
                                 *std::max_element(values.begin(), values.end())});
  return comparison;
}

std::string format_comparison(const PredictionComparison& c) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  out << "Prediction error of " << c.runs << " measured runs, priced with profile '" << c.profile
      << "' (|predicted - measured| / measured of mean times; components of at least 5% of the step)\n";
  out << std::left << std::setw(26) << "system" << std::setw(16) << "component" << std::right << std::setw(6) << "runs"
      << std::setw(10) << "median" << std::setw(10) << "worst" << "\n";
  for (const PredictionError& e : c.errors)
    out << std::left << std::setw(26) << e.system << std::setw(16) << e.component << std::right << std::setw(6) << e.runs
        << std::setw(9) << 100 * e.median << "%" << std::setw(9) << 100 * e.worst << "%\n";
  for (const std::string& run : c.unpriced) out << "not compared: " << run << "\n";
  out << "median error " << 100 * c.median_step_error << "% (worst " << 100 * c.worst_step_error << "%) over " << c.runs
      << " runs\n";
  if (c.host_only_runs > 0)
    out << "note: " << c.host_only_runs << " of these runs came from a build without a GPU, but profile '" << c.profile
        << "' describes a GPU machine: their GPU work ran on the host, so the error says how far this host is from "
           "that GPU, not how well the roofline predicts it\n";
  return out.str();
}

MachineProfile with_cpu_of(const MachineProfile& base, const MachineProfile& cpu) {
  MachineProfile p = base;
  p.name = base.name + "+cpu:" + cpu.name;
  p.cpu_threads = cpu.cpu_threads;
  p.cpu_dram_read_gbps = cpu.cpu_dram_read_gbps;
  p.cpu_path = cpu.cpu_path;
  p.cpu_decode_path = cpu.cpu_decode_path;
  p.cpu_streamed_decode_path = cpu.cpu_streamed_decode_path;
  p.cpu_next_pass_prefetch = cpu.cpu_next_pass_prefetch;
  p.cpu_token_major_pass = cpu.cpu_token_major_pass;
  p.cpu_head_major_pass = cpu.cpu_head_major_pass;
  p.cpu_fma_glanes = cpu.cpu_fma_glanes;
  p.cpu_launch_latency_s = cpu.cpu_launch_latency_s;
  p.cpu_expert_gbps = cpu.cpu_expert_gbps;
  p.cpu_expert_gflops = cpu.cpu_expert_gflops;
  p.cpu_attention_gbps = cpu.cpu_attention_gbps;
  p.cpu_streamed_attention_gbps = cpu.cpu_streamed_attention_gbps;
  p.sources["cpu"] = "from profile '" + cpu.name + "': " + cpu.source_of("cpu");
  return p;
}

}  // namespace writescope
