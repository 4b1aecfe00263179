#pragma once

#include <stdexcept>
#include <string>

#include <algorithm>

#include "framework/launch.hpp"
#include "framework/math.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace impl {

inline constexpr int prefill_key_tile = 64;

template <class ExecSpace, class Scalar>
struct PrefillKernel {
  using MemSpace = typename ExecSpace::memory_space;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Scratch = Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> queries;
  TokenMajorView<Scalar, MemSpace> keys, values;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;
  int kv_heads, group, key_dim, value_dim;
  bool values_in_keys;
  float scale;
  std::int64_t first_position, key_begin, key_end;

  /// scores (group, tile), accumulators (group, value_dim), max, sum, correction (group each).
  KOKKOS_INLINE_FUNCTION std::size_t scratch_floats() const {
    return static_cast<std::size_t>(group) * (prefill_key_tile + value_dim + 3);
  }

  KOKKOS_INLINE_FUNCTION float value(std::int64_t token, int head, int d) const {
    return to_float(values_in_keys ? keys(token, head, d) : values(token, head, d));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int i = team.league_rank() / kv_heads;
    const int kv_head = team.league_rank() % kv_heads;
    const int q0 = kv_head * group;
    Scratch scratch(team.team_scratch(0), scratch_floats());
    float* scores = scratch.data();
    float* acc = scores + group * prefill_key_tile;
    float* maxima = acc + group * value_dim;
    float* sums = maxima + group;
    float* corrections = sums + group;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * value_dim), [&](int k) { acc[k] = 0; });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group), [&](int q) {
      maxima[q] = math::negative_infinity();
      sums[q] = 0;
    });
    team.team_barrier();

    const std::int64_t causal_end = first_position + i + 1;
    const std::int64_t end = key_end < causal_end ? key_end : causal_end;
    for (std::int64_t start = key_begin; start < end; start += prefill_key_tile) {
      const int count = static_cast<int>(end - start < prefill_key_tile ? end - start : prefill_key_tile);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int j) {
        for (int q = 0; q < group; ++q) {
          float dot = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, key_dim),
              [&](int d, float& sum) { sum += queries(i, q0 + q, d) * to_float(keys(start + j, kv_head, d)); }, dot);
          Kokkos::single(Kokkos::PerThread(team), [&]() { scores[q * prefill_key_tile + j] = dot * scale; });
        }
      });
      team.team_barrier();
      for (int q = 0; q < group; ++q) {
        float* row = scores + q * prefill_key_tile;
        float tile_max = math::negative_infinity();
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, count), [&](int j, float& best) { best = row[j] > best ? row[j] : best; },
            Kokkos::Max<float>(tile_max));
        const float new_max = maxima[q] > tile_max ? maxima[q] : tile_max;
        team.team_barrier();
        float tile_sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, count),
            [&](int j, float& sum) {
              const float p = math::exp(row[j] - new_max);
              Kokkos::single(Kokkos::PerThread(team), [&]() { row[j] = p; });
              sum += p;
            },
            tile_sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const float correction = math::exp(maxima[q] - new_max);  // 0 while nothing was seen yet
          corrections[q] = correction;
          sums[q] = sums[q] * correction + tile_sum;
          maxima[q] = new_max;
        });
      }
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, value_dim), [&](int d) {
        for (int q = 0; q < group; ++q) {
          float sum = acc[q * value_dim + d] * corrections[q];
          for (int j = 0; j < count; ++j) sum += scores[q * prefill_key_tile + j] * value(start + j, kv_head, d);
          acc[q * value_dim + d] = sum;
        }
      });
      team.team_barrier();
    }

    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, value_dim), [&](int d) {
      for (int q = 0; q < group; ++q) o(i, q0 + q, d) = sums[q] > 0 ? acc[q * value_dim + d] / sums[q] : 0.0f;
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group), [&](int q) {
      lse(i, q0 + q) = sums[q] > 0 ? maxima[q] + math::log(sums[q]) : math::negative_infinity();
    });
  }
};

}  // namespace impl

template <class ExecSpace, class Scalar>
void prefill_attention(const ExecSpace& space, const AttentionShape& shape,
                       const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& keys,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& values,
                       std::int64_t first_position, std::int64_t key_begin, std::int64_t key_end,
                       const PartialState<typename ExecSpace::memory_space>& out) {
  shape.validate();
  const auto chunk = static_cast<std::int64_t>(queries.extent(0));
  if (queries.extent(1) != static_cast<std::size_t>(shape.q_heads) ||
      queries.extent(2) != static_cast<std::size_t>(shape.key_dim))
    throw std::invalid_argument("prefill_attention: queries must be (chunk_tokens, q_heads, key_dim)");
  if (keys.extent(1) != static_cast<std::size_t>(shape.kv_heads) ||
      keys.extent(2) != static_cast<std::size_t>(shape.key_dim))
    throw std::invalid_argument("prefill_attention: keys must be (tokens, kv_heads, key_dim)");
  if (!shape.values_in_keys && (values.extent(0) != keys.extent(0) ||
                                values.extent(1) != static_cast<std::size_t>(shape.kv_heads) ||
                                values.extent(2) != static_cast<std::size_t>(shape.value_dim)))
    throw std::invalid_argument("prefill_attention: values must be (tokens, kv_heads, value_dim)");
  if (first_position < 0 || key_begin < 0 || key_begin > key_end)
    throw std::invalid_argument("prefill_attention: need 0 <= key_begin <= key_end and first_position >= 0");
  const std::int64_t needed = std::min(key_end, first_position + chunk);
  if (static_cast<std::int64_t>(keys.extent(0)) < needed)
    throw std::invalid_argument("prefill_attention: keys hold " + std::to_string(keys.extent(0)) +
                                " tokens but the chunk needs " + std::to_string(needed));
  if (out.batch() != chunk || out.q_heads() != shape.q_heads || out.value_dim() != shape.value_dim)
    throw std::invalid_argument("prefill_attention: out must be (chunk_tokens, q_heads, value_dim)");
  if (chunk == 0) return;
  const impl::PrefillKernel<ExecSpace, Scalar> kernel{
      queries,        keys,           values,          out.o,          out.lse, shape.kv_heads, shape.group(),
      shape.key_dim,  shape.value_dim, shape.values_in_keys, shape.scale(), first_position, key_begin, key_end};
  constexpr bool host = is_host_exec_space<ExecSpace>;
  Kokkos::TeamPolicy<ExecSpace> policy(space, static_cast<int>(chunk * shape.kv_heads), host ? 1 : 4, host ? 1 : 32);
  policy.set_scratch_size(0, Kokkos::PerTeam(kernel.scratch_floats() * sizeof(float)));
  launch_parallel_for("writescope::attention::prefill", policy, kernel);
}

}  // namespace writescope
