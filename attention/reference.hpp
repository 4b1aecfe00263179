#pragma once
// Plain reference attention: double accumulation, no tricks. Every kernel is
// tested against it.

#include <cstdint>
#include <vector>

#include "attention/shape.hpp"

namespace writescope {

/// Keys and values of one sequence, as floats: keys (tokens, kv_heads, key_dim),
/// values (tokens, kv_heads, value_dim); when shape.values_in_keys, values are
/// read from the keys and `values` is unused.
struct ReferenceKV {
  const float* keys;
  const float* values;
  std::int64_t tokens;
};

/// Decode attention of one query (q_heads, key_dim) over tokens [begin, end).
/// o: (q_heads, value_dim); lse: (q_heads), natural log, -inf for an empty range.
/// spread (when given): (q_heads, value_dim), sqrt(sum p_t^2 v_t^2) / sum p_t,
/// the size of an output's terms: rounding each term by a relative e moves
/// the output by about e x spread (tests scale their tolerances by it).
void reference_decode(const AttentionShape& shape, const float* query, const ReferenceKV& kv, std::int64_t begin,
                      std::int64_t end, std::vector<double>& o, std::vector<double>& lse,
                      std::vector<double>* spread = nullptr);

/// Causal prefill: queries (query_tokens, q_heads, key_dim) at positions
/// [first_position, first_position + query_tokens) attend to tokens
/// [0, position]. o: (query_tokens, q_heads, value_dim).
void reference_prefill(const AttentionShape& shape, const float* queries, std::int64_t query_tokens,
                       std::int64_t first_position, const ReferenceKV& kv, std::vector<double>& o);

}  // namespace writescope
