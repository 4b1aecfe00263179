#include "moe/reference_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace writescope {
namespace {

constexpr double pi = 3.14159265358979323846;

/// y = W x for W (out, in) row-major, double accumulation.
std::vector<float> matvec(const std::vector<float>& w, const float* x, std::int64_t in) {
  const auto out = static_cast<std::int64_t>(w.size()) / in;
  std::vector<float> y(static_cast<std::size_t>(out));
  for (std::int64_t r = 0; r < out; ++r) {
    double sum = 0;
    for (std::int64_t c = 0; c < in; ++c) sum += static_cast<double>(w[r * in + c]) * x[c];
    y[r] = static_cast<float>(sum);
  }
  return y;
}

std::vector<float> matvec(const std::vector<float>& w, const std::vector<float>& x) {
  return matvec(w, x.data(), static_cast<std::int64_t>(x.size()));
}

void rms_norm(float* x, const float* scale, int n, double eps) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const double inverse = 1.0 / std::sqrt(sum / n + eps);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * inverse * scale[i]);
}

std::vector<float> rms_normed(std::vector<float> x, const std::vector<float>& scale, double eps) {
  rms_norm(x.data(), scale.data(), static_cast<int>(x.size()), eps);
  return x;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

/// Softmax-weighted attention of one query over `n` cached rows.
/// score(t) = scale * dot(q, key(t)); returns sum_t p(t) value(t) with `value_dim` entries.
template <class Key, class Value>
std::vector<float> attend(std::int64_t n, double scale, int value_dim, Key&& score, Value&& value) {
  std::vector<double> s(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) s[t] = scale * score(t);
  const double m = *std::max_element(s.begin(), s.end());
  double total = 0;
  std::vector<double> out(static_cast<std::size_t>(value_dim), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    const double p = std::exp(s[t] - m);
    total += p;
    const float* v = value(t);
    for (int d = 0; d < value_dim; ++d) out[d] += p * v[d];
  }
  std::vector<float> result(static_cast<std::size_t>(value_dim));
  for (int d = 0; d < value_dim; ++d) result[d] = static_cast<float>(out[d] / total);
  return result;
}

/// DeepSeek feeds rope dims interleaved (x0, x1, x2, ...) to a rotate-half
/// rotation by first gathering evens then odds.
void deinterleave(float* x, int dim) {
  std::vector<float> copy(x, x + dim);
  for (int i = 0; i < dim / 2; ++i) {
    x[i] = copy[2 * i];
    x[i + dim / 2] = copy[2 * i + 1];
  }
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

RotaryEmbedding RotaryEmbedding::for_model(const ModelConfig& c) {
  RotaryEmbedding r;
  const int dim = c.mla() ? c.qk_rope_head_dim : c.head_dim;
  for (int i = 0; i < dim / 2; ++i)
    r.inverse_frequencies.push_back(1.0 / std::pow(c.rope_theta, 2.0 * i / dim));
  if (c.rope_scaling.type != "yarn") return r;
  // DeepSeek's YaRN: interpolate low frequencies, keep high ones, ramp between.
  const RopeScaling& y = c.rope_scaling;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(y.original_max_position / (rotations * 2 * pi)) / (2 * std::log(c.rope_theta));
  };
  const double low = std::max(0.0, std::floor(correction_dim(y.beta_fast)));
  double high = std::min(dim - 1.0, std::ceil(correction_dim(y.beta_slow)));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolate = 1.0 - ramp;  // weight of the original frequency
    const double original = r.inverse_frequencies[i];
    r.inverse_frequencies[i] = original / y.factor * (1.0 - extrapolate) + original * extrapolate;
  }
  r.scale = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  return r;
}

void RotaryEmbedding::apply(float* x, int dim, std::int64_t position) const {
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inverse_frequencies[i];
    const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
    const double a = x[i], b = x[i + half];
    x[i] = static_cast<float>(a * c - b * s);
    x[i + half] = static_cast<float>(b * c + a * s);
  }
}

ReferenceModel::ReferenceModel(ModelConfig config, std::vector<std::vector<float>> weights, MlaForm mla_form)
    : config_(std::move(config)), mla_form_(mla_form), weights_(std::move(weights)),
      rope_(RotaryEmbedding::for_model(config_)) {
  config_.validate();
  const auto specs = weight_specs(config_);
  if (specs.size() != weights_.size())
    throw std::invalid_argument("reference model: " + std::to_string(weights_.size()) + " weight tensors for " +
                                std::to_string(specs.size()) + " specs");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (static_cast<std::int64_t>(weights_[i].size()) != specs[i].elements())
      throw std::invalid_argument("reference model: tensor '" + specs[i].name + "' has the wrong size");
    index_[specs[i].name] = i;
  }
  reset();
}

ReferenceModel ReferenceModel::synthetic(const ModelConfig& config, std::uint64_t seed, MlaForm mla_form) {
  std::vector<std::vector<float>> weights;
  for (const TensorSpec& spec : weight_specs(config)) weights.push_back(synthetic_tensor<float>(spec, seed));
  return ReferenceModel(config, std::move(weights), mla_form);
}

void ReferenceModel::reset() {
  keys_.assign(static_cast<std::size_t>(config_.layers), {});
  values_.assign(static_cast<std::size_t>(config_.layers), {});
  length_ = 0;
}

void ReferenceModel::cache_row(std::vector<float>& cache, const std::vector<float>& row) const {
  for (float x : row) cache.push_back(round_kv_ ? round_to<bf16>(x) : x);
}

const std::vector<float>& ReferenceModel::weight(const std::string& name) const { return weights_[index_.at(name)]; }

std::vector<float> ReferenceModel::gqa_attention(int layer, const std::vector<float>& x, std::int64_t position) {
  const ModelConfig& c = config_;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  std::vector<float> q = matvec(weight(p + "q_proj.weight"), x);
  std::vector<float> k = matvec(weight(p + "k_proj.weight"), x);
  const std::vector<float> v = matvec(weight(p + "v_proj.weight"), x);
  const int hd = c.head_dim;
  for (int h = 0; h < c.q_heads; ++h) {
    if (c.qk_norm) rms_norm(q.data() + h * hd, weight(p + "q_norm.weight").data(), hd, c.rms_eps);
    rope_.apply(q.data() + h * hd, hd, position);
  }
  for (int h = 0; h < c.kv_heads; ++h) {
    if (c.qk_norm) rms_norm(k.data() + h * hd, weight(p + "k_norm.weight").data(), hd, c.rms_eps);
    rope_.apply(k.data() + h * hd, hd, position);
  }
  auto& keys = keys_[layer];
  auto& values = values_[layer];
  cache_row(keys, k);
  cache_row(values, v);
  const std::int64_t n = position + 1;
  const int row = c.kv_heads * hd;
  std::vector<float> out;
  for (int h = 0; h < c.q_heads; ++h) {
    const int kv = h / (c.q_heads / c.kv_heads);
    const float* qh = q.data() + h * hd;
    const auto head = attend(
        n, 1.0 / std::sqrt(static_cast<double>(hd)), hd,
        [&](std::int64_t t) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * keys[t * row + kv * hd + d];
          return dot;
        },
        [&](std::int64_t t) { return values.data() + t * row + kv * hd; });
    out.insert(out.end(), head.begin(), head.end());
  }
  return matvec(weight(p + "o_proj.weight"), out);
}

std::vector<float> ReferenceModel::mla_attention(int layer, const std::vector<float>& x, std::int64_t position) {
  const ModelConfig& c = config_;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const int nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, latent = c.kv_lora_rank, vdim = c.v_head_dim;
  std::vector<float> q = c.q_lora_rank > 0
                             ? matvec(weight(p + "q_b_proj.weight"),
                                      rms_normed(matvec(weight(p + "q_a_proj.weight"), x),
                                                 weight(p + "q_a_layernorm.weight"), mla_inner_norm_eps))
                             : matvec(weight(p + "q_proj.weight"), x);
  std::vector<float> compressed = matvec(weight(p + "kv_a_proj_with_mqa.weight"), x);  // latent | k_pe
  rms_norm(compressed.data(), weight(p + "kv_a_layernorm.weight").data(), latent, mla_inner_norm_eps);
  deinterleave(compressed.data() + latent, rope);
  rope_.apply(compressed.data() + latent, rope, position);
  auto& cache = keys_[layer];
  cache_row(cache, compressed);
  const int row = latent + rope;
  const std::int64_t n = position + 1;
  const double scale = config_.attention().scale();
  const std::vector<float>& kv_b = weight(p + "kv_b_proj.weight");  // (heads * (nope + v), latent)
  std::vector<float> out;
  for (int h = 0; h < c.q_heads; ++h) {
    float* qh = q.data() + h * (nope + rope);
    deinterleave(qh + nope, rope);
    rope_.apply(qh + nope, rope, position);
    const float* w_k = kv_b.data() + static_cast<std::int64_t>(h) * (nope + vdim) * latent;  // (nope, latent)
    const float* w_v = w_k + static_cast<std::int64_t>(nope) * latent;                        // (v, latent)
    std::vector<float> head;
    if (mla_form_ == MlaForm::absorbed) {
      // q_latent = W_k^T q_nope: scores against the latent cache directly.
      std::vector<float> q_latent(static_cast<std::size_t>(latent));
      for (int l = 0; l < latent; ++l) {
        double sum = 0;
        for (int d = 0; d < nope; ++d) sum += static_cast<double>(w_k[d * latent + l]) * qh[d];
        q_latent[l] = static_cast<float>(sum);
      }
      const auto o_latent = attend(
          n, scale, latent,
          [&](std::int64_t t) {
            const float* kt = cache.data() + t * row;
            double dot = 0;
            for (int l = 0; l < latent; ++l) dot += static_cast<double>(q_latent[l]) * kt[l];
            for (int d = 0; d < rope; ++d) dot += static_cast<double>(qh[nope + d]) * kt[latent + d];
            return dot;
          },
          [&](std::int64_t t) { return cache.data() + t * row; });
      head = matvec(std::vector<float>(w_v, w_v + static_cast<std::int64_t>(vdim) * latent), o_latent);
    } else {
      // The original: decompress every cached token's key and value for this head.
      std::vector<float> k_nope(static_cast<std::size_t>(n * nope)), values(static_cast<std::size_t>(n * vdim));
      for (std::int64_t t = 0; t < n; ++t) {
        const float* lt = cache.data() + t * row;
        for (int d = 0; d < nope; ++d) {
          double sum = 0;
          for (int l = 0; l < latent; ++l) sum += static_cast<double>(w_k[d * latent + l]) * lt[l];
          k_nope[t * nope + d] = static_cast<float>(sum);
        }
        for (int d = 0; d < vdim; ++d) {
          double sum = 0;
          for (int l = 0; l < latent; ++l) sum += static_cast<double>(w_v[d * latent + l]) * lt[l];
          values[t * vdim + d] = static_cast<float>(sum);
        }
      }
      head = attend(
          n, scale, vdim,
          [&](std::int64_t t) {
            double dot = 0;
            for (int d = 0; d < nope; ++d) dot += static_cast<double>(qh[d]) * k_nope[t * nope + d];
            for (int d = 0; d < rope; ++d) dot += static_cast<double>(qh[nope + d]) * cache[t * row + latent + d];
            return dot;
          },
          [&](std::int64_t t) { return values.data() + t * vdim; });
    }
    out.insert(out.end(), head.begin(), head.end());
  }
  return matvec(weight(p + "o_proj.weight"), out);
}

std::vector<float> ReferenceModel::attention(int layer, const std::vector<float>& x, std::int64_t position) {
  return config_.mla() ? mla_attention(layer, x, position) : gqa_attention(layer, x, position);
}

std::vector<float> ReferenceModel::mlp(int layer, const std::vector<float>& x) const {
  const ModelConfig& c = config_;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  auto swiglu = [&](const std::string& prefix, const char* gate, const char* up, const char* down) {
    const auto g = matvec(weight(prefix + gate + ".weight"), x);
    const auto u = matvec(weight(prefix + up + ".weight"), x);
    std::vector<float> hidden(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) hidden[i] = static_cast<float>(silu(g[i]) * u[i]);
    return matvec(weight(prefix + down + ".weight"), hidden);
  };
  if (layer < c.dense_layers) return swiglu(p + "mlp.", "gate_proj", "up_proj", "down_proj");
  const bool mixtral = c.architecture == Architecture::mixtral;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  const auto logits = matvec(weight(moe + "gate.weight"), x);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  order.resize(static_cast<std::size_t>(c.experts_per_token));
  // Softmax over all experts; Mixtral's softmax over the top-k equals the
  // renormalised top-k of it, as Qwen3's norm_topk_prob does.
  const double m = logits[order.front()];
  double total = 0;
  for (float l : logits) total += std::exp(l - m);
  std::vector<double> weights;
  double chosen = 0;
  for (int e : order) {
    weights.push_back(std::exp(logits[e] - m) / total);
    chosen += weights.back();
  }
  for (double& w : weights) w = c.router_normalizes() ? w / chosen : w * c.routed_scaling_factor;
  std::vector<double> out(x.size(), 0.0);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::string expert = moe + "experts." + std::to_string(order[k]) + ".";
    const auto y = mixtral ? swiglu(expert, "w1", "w3", "w2") : swiglu(expert, "gate_proj", "up_proj", "down_proj");
    for (std::size_t i = 0; i < y.size(); ++i) out[i] += weights[k] * y[i];
  }
  if (c.shared_experts > 0) {
    const auto y = swiglu(moe + "shared_experts.", "gate_proj", "up_proj", "down_proj");
    for (std::size_t i = 0; i < y.size(); ++i) out[i] += y[i];
  }
  return std::vector<float>(out.begin(), out.end());
}

std::vector<float> ReferenceModel::token_step(int token) {
  const ModelConfig& c = config_;
  if (token < 0 || token >= c.vocab)
    throw std::invalid_argument("reference model: token " + std::to_string(token) + " outside the vocabulary of " +
                                std::to_string(c.vocab));
  const std::vector<float>& embedding = weight("model.embed_tokens.weight");
  std::vector<float> x(embedding.begin() + static_cast<std::int64_t>(token) * c.hidden,
                       embedding.begin() + static_cast<std::int64_t>(token + 1) * c.hidden);
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const auto a = attention(layer, rms_normed(x, weight(p + "input_layernorm.weight"), c.rms_eps), length_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    const auto f = mlp(layer, rms_normed(x, weight(p + "post_attention_layernorm.weight"), c.rms_eps));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += f[i];
  }
  ++length_;
  const auto normed = rms_normed(x, weight("model.norm.weight"), c.rms_eps);
  return matvec(c.tied_embeddings ? embedding : weight("lm_head.weight"), normed);
}

std::vector<float> ReferenceModel::forward(const std::vector<int>& tokens) {
  if (tokens.empty()) throw std::invalid_argument("reference model: forward needs at least one token");
  std::vector<float> logits;
  for (int token : tokens) logits = token_step(token);
  return logits;
}

std::vector<int> ReferenceModel::generate(const std::vector<int>& prompt, int new_tokens) {
  std::vector<float> logits = forward(prompt);
  std::vector<int> out;
  for (int i = 0; i < new_tokens; ++i) {
    const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 < new_tokens) logits = forward({next});
  }
  return out;
}

}  // namespace writescope
