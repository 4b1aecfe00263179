#include "attention/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace writescope {
namespace {

double key_at(const AttentionShape& s, const ReferenceKV& kv, std::int64_t t, int h, int d) {
  return kv.keys[(t * s.kv_heads + h) * s.key_dim + d];
}

double value_at(const AttentionShape& s, const ReferenceKV& kv, std::int64_t t, int h, int d) {
  return s.values_in_keys ? key_at(s, kv, t, h, d) : kv.values[(t * s.kv_heads + h) * s.value_dim + d];
}

/// One query head over tokens [begin, end): writes value_dim outputs (and,
/// where `spread` is given, their spreads), returns lse.
double attend(const AttentionShape& s, const float* q, int head, const ReferenceKV& kv, std::int64_t begin,
              std::int64_t end, double* o, double* spread = nullptr) {
  const int kv_head = head / s.group();
  std::fill(o, o + s.value_dim, 0.0);
  if (spread) std::fill(spread, spread + s.value_dim, 0.0);
  if (begin >= end) return -std::numeric_limits<double>::infinity();
  std::vector<double> scores(static_cast<std::size_t>(end - begin));
  for (std::int64_t t = begin; t < end; ++t) {
    double dot = 0;
    for (int d = 0; d < s.key_dim; ++d) dot += static_cast<double>(q[d]) * key_at(s, kv, t, kv_head, d);
    scores[t - begin] = dot * s.scale();
  }
  const double m = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (std::int64_t t = begin; t < end; ++t) {
    const double p = std::exp(scores[t - begin] - m);
    sum += p;
    for (int d = 0; d < s.value_dim; ++d) {
      const double term = p * value_at(s, kv, t, kv_head, d);
      o[d] += term;
      if (spread) spread[d] += term * term;
    }
  }
  for (int d = 0; d < s.value_dim; ++d) {
    o[d] /= sum;
    if (spread) spread[d] = std::sqrt(spread[d]) / sum;
  }
  return m + std::log(sum);
}

}  // namespace

void reference_decode(const AttentionShape& shape, const float* query, const ReferenceKV& kv, std::int64_t begin,
                      std::int64_t end, std::vector<double>& o, std::vector<double>& lse,
                      std::vector<double>* spread) {
  o.assign(static_cast<std::size_t>(shape.q_heads) * shape.value_dim, 0.0);
  lse.assign(static_cast<std::size_t>(shape.q_heads), 0.0);
  if (spread) spread->assign(o.size(), 0.0);
  for (int h = 0; h < shape.q_heads; ++h)
    lse[h] = attend(shape, query + static_cast<std::int64_t>(h) * shape.key_dim, h, kv, begin, end,
                    o.data() + static_cast<std::int64_t>(h) * shape.value_dim,
                    spread ? spread->data() + static_cast<std::int64_t>(h) * shape.value_dim : nullptr);
}

void reference_prefill(const AttentionShape& shape, const float* queries, std::int64_t query_tokens,
                       std::int64_t first_position, const ReferenceKV& kv, std::vector<double>& o) {
  o.assign(static_cast<std::size_t>(query_tokens) * shape.q_heads * shape.value_dim, 0.0);
  for (std::int64_t i = 0; i < query_tokens; ++i)
    for (int h = 0; h < shape.q_heads; ++h)
      attend(shape, queries + (i * shape.q_heads + h) * shape.key_dim, h, kv, 0, first_position + i + 1,
             o.data() + (i * shape.q_heads + h) * shape.value_dim);
}

}  // namespace writescope
