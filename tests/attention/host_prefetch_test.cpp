#include "attention/host_prefetch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/decode.hpp"
#include "attention/impl/host_block_attention.hpp"
#include "attention/reference.hpp"
#include "attention/shape.hpp"
#include "cpu_paths.hpp"
#include "framework/host_memory.hpp"
#include "framework/spaces.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace {

constexpr char variable[] = "WRITESCOPE_NEXT_PASS_PREFETCH";
constexpr char pass_variable[] = "WRITESCOPE_TOKEN_MAJOR_PASS";

/// Sets an environment variable (the level's unless named) for a scope, unsetting it after.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const char* value, const char* name = variable) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnvironment() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(PrefetchLevel, NamesRoundTripAndAnUnknownNameListsTheKnownOnes) {
  for (PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2})
    EXPECT_EQ(parse_prefetch_level(prefetch_level_name(level)), level);
  try {
    parse_prefetch_level("l3");
    FAIL() << "l3 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'l3' (known: l1, l2)"), std::string::npos) << e.what();
  }
}

TEST(NextPassPrefetch, PinBeatsEnvironmentBeatsMeasurement) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  const PrefetchLevel measured = active_next_pass_prefetch(shape);
  EXPECT_EQ(measured, next_pass_prefetch_measurement(shape).faster);
  {
    const ScopedEnvironment environment("l2");
    EXPECT_EQ(active_next_pass_prefetch(shape), PrefetchLevel::l2);
    EXPECT_EQ(describe_next_pass_prefetch(shape), std::string("l2 (") + variable + ")");
    {
      const ScopedNextPassPrefetch pinned(PrefetchLevel::l1);
      EXPECT_EQ(active_next_pass_prefetch(shape), PrefetchLevel::l1);
      EXPECT_EQ(describe_next_pass_prefetch(shape), "l1 (pinned)");
    }
    EXPECT_EQ(active_next_pass_prefetch(shape), PrefetchLevel::l2);
  }
  EXPECT_EQ(active_next_pass_prefetch(shape), measured);
}

TEST(NextPassPrefetch, AnUnknownLevelInTheEnvironmentNamesTheVariable) {
  const ScopedEnvironment environment("L2");
  try {
    active_next_pass_prefetch(qwen3_30b_a3b_attention());
    FAIL() << "L2 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), std::string(variable) + ": unknown prefetch level 'L2' (known: l1, l2)");
  }
}

// calibrate's processes for other thread counts take the parent's passes
// through the variable (CalibrationCommand.ChildProcessesTakeTheParentsChoices).
TEST(NextPassPrefetch, TheHeadMajorPassesFollowTheEnvironment) {
  constexpr char head_pass_variable[] = "WRITESCOPE_HEAD_MAJOR_PASS";
  const AttentionShape shape = qwen3_30b_a3b_attention();
  const int measured = active_head_major_pass(shape);
  if (measured == 0) {
    const ScopedEnvironment environment("32", head_pass_variable);
    EXPECT_EQ(active_head_major_pass(shape), 0) << "a pin where the products pass by their rule";
    std::cout << "[ SKIPPED  ] the head-major passes: " << cpu_path_name(active_cpu_path())
              << " does not request the next pass by level\n";
    return;
  }
  const int other = measured == 128 ? 32 : 128;
  {
    const ScopedEnvironment environment(std::to_string(other).c_str(), head_pass_variable);
    EXPECT_EQ(active_head_major_pass(shape), other);
    const std::string described = describe_next_pass_prefetch(shape);
    EXPECT_NE(described.find(", passes of " + std::to_string(other) + " tokens (" + head_pass_variable + ")"),
              std::string::npos)
        << described;
  }
  {
    const ScopedEnvironment environment("100", head_pass_variable);
    try {
      active_head_major_pass(shape);
      FAIL() << "100 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(head_pass_variable) + ": unknown head-major pass '100' (known: 32, 64, 128)");
    }
  }
  EXPECT_EQ(active_head_major_pass(shape), measured);
}

TEST(NextPassPrefetch, ProbeIsTwiceTheLastLevelCacheWithin64To256MiB) {
  constexpr std::int64_t mib = std::int64_t{1} << 20;
  EXPECT_EQ(next_pass_probe_bytes(0), 64 * mib);
  EXPECT_EQ(next_pass_probe_bytes(32 * mib), 64 * mib);
  EXPECT_EQ(next_pass_probe_bytes(105 * mib), 210 * mib);
  EXPECT_EQ(next_pass_probe_bytes(508 * mib), 256 * mib);
}

TEST(NextPassPrefetch, ProbeStepsTakeTurnsOverWindowsOfAtLeast512MiBOrTwo) {
  constexpr std::int64_t mib = std::int64_t{1} << 20;
  EXPECT_EQ(next_pass_probe_windows(64 * mib), 8);
  EXPECT_EQ(next_pass_probe_windows(100 * mib), 5);
  EXPECT_EQ(next_pass_probe_windows(210 * mib), 2);
  EXPECT_EQ(next_pass_probe_windows(256 * mib), 2);
}

TEST(NextPassPrefetch, L2IsTakenOnlyWhenThreePercentFaster) {
  EXPECT_EQ(faster_prefetch_level(1.0, 0.97), PrefetchLevel::l2);
  EXPECT_EQ(faster_prefetch_level(1.0, 0.98), PrefetchLevel::l1);
  EXPECT_EQ(faster_prefetch_level(1.0, 1.5), PrefetchLevel::l1);
  EXPECT_EQ(faster_prefetch_level(2.0, 1.0), PrefetchLevel::l2);
}

TEST(NextPassPrefetch, OnlyHeadMajorAvx512ProductsHonourTheLevel) {
  using impl::next_pass_level;
  for (PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
    EXPECT_EQ(next_pass_level(CpuPath::avx512_bf16, true, 8, level), level);
    EXPECT_EQ(next_pass_level(CpuPath::avx512_bf16, true, 4, level), level);
    EXPECT_EQ(next_pass_level(CpuPath::avx512_fma, true, 4, level), level);
    // fp32 products of groups of 8 are compute-bound: L2 requests cost them.
    EXPECT_EQ(next_pass_level(CpuPath::avx512_fma, true, 8, level), PrefetchLevel::l1);
    // Token rows, and the paths without next-pass requests.
    EXPECT_EQ(next_pass_level(CpuPath::avx512_bf16, false, 8, level), PrefetchLevel::l1);
    for (CpuPath other : {CpuPath::scalar, CpuPath::avx2, CpuPath::amx_bf16})
      EXPECT_EQ(next_pass_level(other, true, 8, level), PrefetchLevel::l1) << cpu_path_name(other);
  }
}

/// A made-up shape of Mixtral's name and group but other heads and dimensions.
AttentionShape made_up_mixtral() {
  AttentionShape shape = mixtral_8x7b_attention();
  shape.q_heads = 8, shape.kv_heads = 2, shape.key_dim = shape.value_dim = 64;
  return shape;
}

// The measurement runs the kernel of each shape on KV from DRAM with each
// level, where the active path honours the level for it; its figures are what
// it chose by. (Zen 5, one process: Qwen3 15-20% faster with L1, Mixtral
// 8-17% with L2, so one level for every shape costs one of them.)
TEST(NextPassPrefetch, IsMeasuredFromDramOnEachShapeWhereItMatters) {
  bool any = false;
  for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), made_up_mixtral(),
                                      deepseek_v2_lite_mla_attention()}) {
    SCOPED_TRACE(shape.name + ", " + std::to_string(shape.q_heads) + " query heads");
    const CpuPath path = decode_product_path(shape, BlockOrder::head_major);
    const bool honoured = impl::honours_next_pass_level(
        path, shape.block_geometry(256).tiled_keys(BlockOrder::head_major), shape.group());
    const NextPassPrefetchMeasurement& m = next_pass_prefetch_measurement(shape);
    EXPECT_EQ(&m, &next_pass_prefetch_measurement(shape)) << "measured again";
    ASSERT_EQ(m.measured, honoured);
    // The probe is the shape itself (its heads, not only its name).
    EXPECT_EQ(m.probe, shape.name + " (" + std::to_string(shape.q_heads) + " query / " +
                           std::to_string(shape.kv_heads) + " KV heads), head-major");
    EXPECT_EQ(m.path, cpu_path_name(path));
    if (!honoured) {
      EXPECT_EQ(active_next_pass_prefetch(shape), PrefetchLevel::l1);
      EXPECT_EQ(active_head_major_pass(shape), 0);
      EXPECT_NE(describe_next_pass_prefetch(shape).find("does not request the next pass by level"), std::string::npos);
      continue;
    }
    any = true;
    EXPECT_GE(m.kv_bytes, next_pass_probe_bytes(last_level_cache_bytes()));
    // The timed steps read every window of the pool, each from DRAM.
    EXPECT_EQ(m.pool_bytes, next_pass_probe_windows(m.kv_bytes) * m.kv_bytes);
    EXPECT_EQ(m.windows_read, next_pass_probe_windows(m.kv_bytes));
    EXPECT_EQ(m.paths_run, std::vector<CpuPath>(6, path)) << "every choice on the path measured";
    EXPECT_GT(m.l1_ms, 0);
    EXPECT_GT(m.l2_ms, 0);
    EXPECT_GE(m.alternations, 5);
    // Each level at its fastest length (the rule's 128 unless 3% slower), the level by those.
    for (int level = 0; level < 2; ++level) {
      for (const double ms : m.pass_ms[level]) EXPECT_GT(ms, 0);
      EXPECT_EQ(m.pass_for[level], fastest_pass(m.pass_ms[level], 128));
      const auto at = std::find(pass_lengths.begin(), pass_lengths.end(), m.pass_for[level]) - pass_lengths.begin();
      EXPECT_EQ(level == 0 ? m.l1_ms : m.l2_ms, m.pass_ms[level][at]);
    }
    EXPECT_EQ(m.faster, faster_prefetch_level(m.l1_ms, m.l2_ms));
    EXPECT_EQ(active_next_pass_prefetch(shape), m.faster);
    EXPECT_EQ(active_head_major_pass(shape), m.pass_for[static_cast<int>(m.faster)]);
    EXPECT_NE(describe_next_pass_prefetch(shape).find("measured on " + m.path + ", " + m.probe + ", " +
                                                      std::to_string(m.kv_bytes >> 20) + " MiB a step over " +
                                                      std::to_string(m.pool_bytes >> 20) + " MiB"),
              std::string::npos);
  }
  EXPECT_NE(&next_pass_prefetch_measurement(mixtral_8x7b_attention()),
            &next_pass_prefetch_measurement(made_up_mixtral()))
      << "shapes of one name share a measurement";
  if (!any)
    std::cout << "[ SKIPPED  ] no measurement: no model shape's products honour the level on "
              << cpu_path_name(active_cpu_path()) << "\n";
}

/// Head-major (or token-major) bf16 blocks of random values, one sequence of
/// segments that start and end inside blocks, attended on the host.
class HostDecode {
 public:
  HostDecode(const AttentionShape& shape, BlockOrder order) : shape_(shape), order_(order) {
    geometry_ = shape.block_geometry(256);
    constexpr int blocks = 5;
    pool_ = Pool("writescope::test::pool", blocks, geometry_.block_elements());
    const std::vector<float> values = test::random_values<bf16>(pool_.span(), 31, 0.5f);
    for (std::size_t i = 0; i < values.size(); ++i) pool_.data()[i] = from_float<bf16>(values[i]);
    queries_ = Queries("writescope::test::queries", 1, shape.q_heads, shape.key_dim);
    const std::vector<float> q = test::random_values<float>(queries_.span(), 32);
    std::copy(q.begin(), q.end(), queries_.data());
    for (int slot = 0; slot < blocks; ++slot) {
      const int begin = slot == 0 ? 37 : 0, end = slot == blocks - 1 ? 201 : 256;
      segments_.push_back(BlockSegment{0, slot, begin, end - begin, std::int64_t{slot} * 256 + begin});
    }
  }
  /// Where `product_path` takes no pass length: the step matches the
  /// reference and its workspace records none.
  void expect_reference_without_a_pass(CpuPath product_path) const {
    DecodeWorkspace<HostMemSpace> workspace;
    expect_reference(attend(workspace), test::host_bf16_products<bf16>(product_path));
    EXPECT_EQ(workspace.host_pass, 0);
  }
  /// Checks `state` against the plain reference over the same tokens, its
  /// queries rounded to bf16 where the products are (`bf16_products`).
  void expect_reference(const PartialState<HostMemSpace>& state, bool bf16_products) const {
    std::vector<float> keys, values, queries(queries_.data(), queries_.data() + queries_.span());
    for (const BlockSegment& s : segments_)
      for (int t = s.token_begin; t < s.token_begin + s.token_count; ++t)
        for (int h = 0; h < shape_.kv_heads; ++h) {
          for (int d = 0; d < shape_.key_dim; ++d)
            keys.push_back(to_float(pool_(s.slot, geometry_.key_offset(order_, t, h, d))));
          for (int d = 0; d < shape_.value_dim; ++d)
            values.push_back(to_float(pool_(s.slot, geometry_.value_offset(order_, t, h, d))));
        }
    if (bf16_products)
      for (float& q : queries) q = round_to<bf16>(q);
    const auto tokens = static_cast<std::int64_t>(keys.size() / (shape_.kv_heads * shape_.key_dim));
    std::vector<double> o, lse, spread;
    reference_decode(shape_, queries.data(), ReferenceKV{keys.data(), values.data(), tokens}, 0, tokens, o, lse,
                     &spread);
    for (int h = 0; h < shape_.q_heads; ++h) {
      ASSERT_NEAR(state.lse(0, h), lse[h], test::attention_lse_tolerance(bf16_products, lse[h])) << "head " << h;
      for (int d = 0; d < shape_.value_dim; ++d)
        ASSERT_NEAR(state.o(0, h, d), o[h * shape_.value_dim + d], test::attention_o_tolerance(bf16_products, spread[h * shape_.value_dim + d]))
            << "head " << h << " d " << d;
    }
  }
  /// The state, and what the launch ran (in `workspace`).
  PartialState<HostMemSpace> attend(DecodeWorkspace<HostMemSpace>& workspace) const {
    PartialState<HostMemSpace> out("writescope::test::out", 1, shape_.q_heads, shape_.value_dim);
    decode_attention(HostExecSpace(), shape_, geometry_, order_, ConstQueries(queries_), ConstPool(pool_), segments_,
                     workspace, out);
    HostExecSpace().fence();
    return out;
  }
  const BlockGeometry& geometry() const { return geometry_; }

 private:
  using Pool = Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace>;
  using ConstPool = Kokkos::View<const bf16**, Kokkos::LayoutRight, HostMemSpace>;
  using Queries = Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace>;
  using ConstQueries = Kokkos::View<const float***, Kokkos::LayoutRight, HostMemSpace>;
  AttentionShape shape_;
  BlockOrder order_;
  BlockGeometry geometry_;
  Pool pool_;
  Queries queries_;
  std::vector<BlockSegment> segments_;
};

/// Makes each level's head-major pass `tokens` in the shape's measurement on
/// the active path for a scope, restoring the measurement after.
class ScopedHeadMajorPasses {
 public:
  ScopedHeadMajorPasses(const AttentionShape& shape, int tokens)
      : shape_(shape), measured_(next_pass_prefetch_measurement(shape)) {
    NextPassPrefetchMeasurement m = measured_;
    m.pass_for = {tokens, tokens};
    impl::replace_next_pass_prefetch_measurement(shape_, m);
  }
  ~ScopedHeadMajorPasses() { impl::replace_next_pass_prefetch_measurement(shape_, measured_); }

 private:
  AttentionShape shape_;
  NextPassPrefetchMeasurement measured_;
};

// The launch requests what the active level and the rule say (benchmarks
// label their figures with it), and the level changes no result: with passes
// of one length, the products of both levels agree bit for bit (the accuracy
// tests run the measured ones).
TEST(NextPassPrefetch, DecodeRequestsThePinnedLevelAndItChangesNoResult) {
  test::for_each_cpu_path([&](CpuPath path) {
    for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention()})
      for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
        SCOPED_TRACE(shape.name + (order == BlockOrder::head_major ? ", head-major" : ", token-major"));
        const ScopedHeadMajorPasses one_length(shape, 64);
        const HostDecode decode(shape, order);
        const CpuPath product_path =
            impl::host_product_path(path, decode.geometry(), order, shape.group(), true);
        std::vector<PartialState<HostMemSpace>> states;
        for (PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
          const ScopedNextPassPrefetch pinned(level);
          DecodeWorkspace<HostMemSpace> workspace;
          states.push_back(decode.attend(workspace));
          EXPECT_EQ(workspace.host_path, product_path);
          EXPECT_EQ(workspace.host_next_pass,
                    impl::next_pass_level(product_path, decode.geometry().tiled_keys(order), shape.group(), level))
              << "pinned " << prefetch_level_name(level);
        }
        for (std::size_t i = 0; i < states[0].o.span(); ++i)
          ASSERT_EQ(states[0].o.data()[i], states[1].o.data()[i]) << "o element " << i;
        for (std::size_t i = 0; i < states[0].lse.span(); ++i)
          ASSERT_EQ(states[0].lse.data()[i], states[1].lse.data()[i]) << "lse element " << i;
      }
  });
}

// Unpinned, each shape's decode requests the level measured for that shape:
// here Qwen3's made l1 and Mixtral's l2, then the other way round.
TEST(NextPassPrefetch, DecodeTakesTheLevelMeasuredForItsShape) {
  const std::vector<AttentionShape> shapes = {qwen3_30b_a3b_attention(), mixtral_8x7b_attention()};
  std::vector<NextPassPrefetchMeasurement> measured;
  for (const AttentionShape& shape : shapes) measured.push_back(next_pass_prefetch_measurement(shape));
  for (const PrefetchLevel qwen3_level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      NextPassPrefetchMeasurement m = measured[s];
      m.faster = (s == 0) == (qwen3_level == PrefetchLevel::l1) ? PrefetchLevel::l1 : PrefetchLevel::l2;
      impl::replace_next_pass_prefetch_measurement(shapes[s], m);
    }
    for (const AttentionShape& shape : shapes) {
      SCOPED_TRACE(shape.name + ", Qwen3's level " + prefetch_level_name(qwen3_level));
      const HostDecode decode(shape, BlockOrder::head_major);
      DecodeWorkspace<HostMemSpace> workspace;
      decode.attend(workspace);
      EXPECT_EQ(workspace.host_next_pass, impl::next_pass_level(workspace.host_path, true, shape.group(),
                                                                next_pass_prefetch_measurement(shape).faster));
    }
  }
  for (std::size_t s = 0; s < shapes.size(); ++s) impl::replace_next_pass_prefetch_measurement(shapes[s], measured[s]);
}

TEST(TokenMajorPass, LengthsRoundTripAndAnUnknownOneListsTheKnownOnes) {
  for (const int tokens : pass_lengths) EXPECT_EQ(parse_token_major_pass(std::to_string(tokens)), tokens);
  for (const char* unknown : {"48", "256", "64 tokens", ""}) {
    try {
      parse_token_major_pass(unknown);
      FAIL() << "'" << unknown << "' accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("unknown token-major pass '") + unknown + "' (known: 32, 64, 128)");
    }
  }
  EXPECT_THROW(ScopedTokenMajorPass(48), std::invalid_argument);
}

TEST(TokenMajorPass, TheRulesLengthUnlessAnotherIsThreePercentFaster) {
  EXPECT_EQ(fastest_pass({1.0, 0.98, 1.1}, 64), 64);
  EXPECT_EQ(fastest_pass({0.97, 1.0, 1.1}, 64), 32);
  EXPECT_EQ(fastest_pass({1.0, 1.2, 0.9}, 64), 128);
  EXPECT_EQ(fastest_pass({1.0, 0.9, 0.8}, 32), 128);
  EXPECT_EQ(fastest_pass({1.0, 0.99, 0.98}, 32), 32);
  // The rule's 128 KiB a pass: 128 tokens of one 256-byte head, 64 of Qwen3's 4 KV heads, 32 of Mixtral's 8 or more.
  EXPECT_EQ(impl::token_major_pass_rule(2 * 128 * 2), 128);
  EXPECT_EQ(impl::token_major_pass_rule(4 * 256 * 2), 64);
  EXPECT_EQ(impl::token_major_pass_rule(8 * 256 * 2), 32);
  EXPECT_EQ(impl::token_major_pass_rule(64 * 256 * 2), 32);
}

TEST(TokenMajorPass, PinBeatsEnvironmentBeatsMeasurement) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  if (!impl::honours_token_major_pass(decode_product_path(shape, BlockOrder::token_major), shape)) {
    EXPECT_EQ(active_token_major_pass(shape), 0);
    {
      const ScopedTokenMajorPass pinned(32);
      EXPECT_EQ(active_token_major_pass(shape), 0) << "a pin where the products pass by their rule";
    }
    std::cout << "[ SKIPPED  ] the token-major pass: " << cpu_path_name(active_cpu_path())
              << " passes by its own rule\n";
    return;
  }
  const int measured = active_token_major_pass(shape);
  EXPECT_EQ(measured, token_major_pass_measurement(shape).fastest);
  {
    const ScopedEnvironment environment("128", pass_variable);
    EXPECT_EQ(active_token_major_pass(shape), 128);
    EXPECT_EQ(describe_token_major_pass(shape), std::string("128 tokens (") + pass_variable + ")");
    {
      const ScopedTokenMajorPass pinned(32);
      EXPECT_EQ(active_token_major_pass(shape), 32);
      EXPECT_EQ(describe_token_major_pass(shape), "32 tokens (pinned)");
    }
    EXPECT_EQ(active_token_major_pass(shape), 128);
  }
  {
    const ScopedEnvironment environment("100", pass_variable);
    try {
      active_token_major_pass(shape);
      FAIL() << "100 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(pass_variable) + ": unknown token-major pass '100' (known: 32, 64, 128)");
    }
  }
  EXPECT_EQ(active_token_major_pass(shape), measured);
}

// Each GQA shape's token-major decode is timed at every length on KV from
// DRAM, where the active path takes the length (Zen 5: Qwen3 32 tokens 5-17%
// ahead of the rule's 64, where Zen 4 measured 64 best); MLA keeps its rule.
TEST(TokenMajorPass, IsMeasuredFromDramOnEachShapeWhereItMatters) {
  bool any = false;
  for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), made_up_mixtral(),
                                      deepseek_v2_lite_mla_attention()}) {
    SCOPED_TRACE(shape.name + ", " + std::to_string(shape.q_heads) + " query heads");
    const CpuPath path = decode_product_path(shape, BlockOrder::token_major);
    const bool honoured = impl::honours_token_major_pass(path, shape);
    const TokenMajorPassMeasurement& m = token_major_pass_measurement(shape);
    EXPECT_EQ(&m, &token_major_pass_measurement(shape)) << "measured again";
    ASSERT_EQ(m.measured, honoured);
    EXPECT_EQ(m.probe, shape.name + " (" + std::to_string(shape.q_heads) + " query / " +
                           std::to_string(shape.kv_heads) + " KV heads), token-major");
    EXPECT_EQ(m.path, cpu_path_name(path));
    if (!honoured) {
      EXPECT_EQ(active_token_major_pass(shape), 0);
      EXPECT_NE(describe_token_major_pass(shape).find("passes by its own rule"), std::string::npos);
      continue;
    }
    any = true;
    EXPECT_GE(m.kv_bytes, next_pass_probe_bytes(last_level_cache_bytes()));
    // The timed steps read every window of the pool, each from DRAM.
    EXPECT_EQ(m.pool_bytes, next_pass_probe_windows(m.kv_bytes) * m.kv_bytes);
    EXPECT_EQ(m.windows_read, next_pass_probe_windows(m.kv_bytes));
    EXPECT_EQ(m.paths_run, std::vector<CpuPath>(pass_lengths.size(), path)) << "every length on the path measured";
    for (const double ms : m.ms) EXPECT_GT(ms, 0);
    EXPECT_GE(m.alternations, 5);
    EXPECT_EQ(m.rule, impl::token_major_pass_rule(std::int64_t{shape.kv_heads} * (shape.key_dim + shape.value_dim) * 2));
    EXPECT_EQ(m.fastest, fastest_pass(m.ms, m.rule));
    EXPECT_EQ(active_token_major_pass(shape), m.fastest);
    EXPECT_NE(describe_token_major_pass(shape).find(std::to_string(m.fastest) + " tokens (measured on " + m.path +
                                                    ", " + m.probe + ", " + std::to_string(m.kv_bytes >> 20) +
                                                    " MiB a step over " + std::to_string(m.pool_bytes >> 20) + " MiB"),
              std::string::npos);
  }
  EXPECT_FALSE(impl::honours_token_major_pass(CpuPath::amx_bf16, qwen3_30b_a3b_attention()));
  EXPECT_FALSE(impl::honours_token_major_pass(CpuPath::avx2, qwen3_30b_a3b_attention()));
  EXPECT_FALSE(impl::honours_token_major_pass(CpuPath::avx512_bf16, deepseek_v2_lite_mla_attention()));
  EXPECT_TRUE(impl::honours_token_major_pass(CpuPath::avx512_fma, mixtral_8x7b_attention()));
  if (!any)
    std::cout << "[ SKIPPED  ] no measurement: no model shape's products take a token-major pass on "
              << cpu_path_name(active_cpu_path()) << "\n";
}

// Every length agrees with the reference, on every path that takes one; the
// launch passes the one pinned; and unpinned, each shape's decode takes the
// length measured for it: its result is bit for bit the pinned run's of that
// length (the softmax weights are rounded against the maximum so far, so
// passes of another length differ in the last bits).
TEST(TokenMajorPass, DecodeTakesTheLengthMeasuredForItsShapeAndEveryLengthMatchesTheReference) {
  bool any = false;
  test::for_each_cpu_path([&](CpuPath path) {
    for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention()}) {
      SCOPED_TRACE(shape.name);
      const HostDecode decode(shape, BlockOrder::token_major);
      const CpuPath product_path =
          impl::host_product_path(path, decode.geometry(), BlockOrder::token_major, shape.group(), true);
      if (!impl::honours_token_major_pass(product_path, shape)) {
        decode.expect_reference_without_a_pass(product_path);
        continue;
      }
      any = true;
      std::vector<PartialState<HostMemSpace>> pinned_states;
      for (const int tokens : pass_lengths) {
        SCOPED_TRACE(std::to_string(tokens) + " tokens a pass");
        const ScopedTokenMajorPass pinned(tokens);
        DecodeWorkspace<HostMemSpace> workspace;
        pinned_states.push_back(decode.attend(workspace));
        EXPECT_EQ(workspace.host_pass, tokens);
        decode.expect_reference(pinned_states.back(), test::host_bf16_products<bf16>(product_path));
      }
      const auto same = [](const PartialState<HostMemSpace>& a, const PartialState<HostMemSpace>& b) {
        return std::equal(a.o.data(), a.o.data() + a.o.span(), b.o.data()) &&
               std::equal(a.lse.data(), a.lse.data() + a.lse.span(), b.lse.data());
      };
      ASSERT_FALSE(same(pinned_states.front(), pinned_states.back())) << "lengths indistinguishable by result";
      const TokenMajorPassMeasurement measured = token_major_pass_measurement(shape);
      for (std::size_t i = 0; i < pass_lengths.size(); ++i) {
        TokenMajorPassMeasurement m = measured;
        m.fastest = pass_lengths[i];
        impl::replace_token_major_pass_measurement(shape, m);
        DecodeWorkspace<HostMemSpace> workspace;
        const PartialState<HostMemSpace> state = decode.attend(workspace);
        EXPECT_EQ(workspace.host_pass, m.fastest);
        EXPECT_TRUE(same(state, pinned_states[i])) << "measured " << m.fastest << " tokens";
      }
      impl::replace_token_major_pass_measurement(shape, measured);
    }
  });
  if (!any)
    std::cout << "[ SKIPPED  ] no path here takes a token-major pass length\n";
}

// Head-major passes take the length measured with the active level: every
// length agrees with the reference, and the launch runs the measured one (the
// softmax weights are rounded against the maximum so far, so lengths differ
// in the last bits).
TEST(NextPassPrefetch, DecodeTakesTheHeadMajorPassMeasuredAndEveryLengthMatchesTheReference) {
  bool any = false;
  test::for_each_cpu_path([&](CpuPath path) {
    for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention()}) {
      SCOPED_TRACE(shape.name);
      const HostDecode decode(shape, BlockOrder::head_major);
      const CpuPath product_path =
          impl::host_product_path(path, decode.geometry(), BlockOrder::head_major, shape.group(), true);
      if (!impl::honours_next_pass_level(product_path, true, shape.group())) {
        decode.expect_reference_without_a_pass(product_path);
        continue;
      }
      any = true;
      std::vector<PartialState<HostMemSpace>> states;
      for (const int tokens : pass_lengths) {
        SCOPED_TRACE(std::to_string(tokens) + " tokens a pass");
        const ScopedHeadMajorPasses measured(shape, tokens);
        for (const PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
          const ScopedNextPassPrefetch pinned(level);
          EXPECT_EQ(active_head_major_pass(shape), tokens);
        }
        DecodeWorkspace<HostMemSpace> workspace;
        states.push_back(decode.attend(workspace));
        EXPECT_EQ(workspace.host_pass, tokens);
        decode.expect_reference(states.back(), test::host_bf16_products<bf16>(product_path));
      }
      const auto& first = states.front();
      const auto& last = states.back();
      EXPECT_FALSE(std::equal(first.o.data(), first.o.data() + first.o.span(), last.o.data()))
          << "passes of 32 and 128 tokens indistinguishable by result";
    }
  });
  if (!any) std::cout << "[ SKIPPED  ] no path here requests the next pass by level\n";
}

TEST(ProductPath, TheOtherAvx512PathOnlyWhereThreePercentFaster) {
  EXPECT_EQ(faster_product_path(CpuPath::avx512_bf16, 100, 97), CpuPath::avx512_fma);
  EXPECT_EQ(faster_product_path(CpuPath::avx512_bf16, 100, 97.5), CpuPath::avx512_bf16) << "within the noise";
  EXPECT_EQ(faster_product_path(CpuPath::avx512_bf16, 97, 100), CpuPath::avx512_bf16);
  EXPECT_EQ(faster_product_path(CpuPath::avx512_fma, 97, 100), CpuPath::avx512_bf16);
  EXPECT_EQ(faster_product_path(CpuPath::avx512_fma, 97.5, 100), CpuPath::avx512_fma) << "within the noise";
  EXPECT_EQ(faster_product_path(CpuPath::avx512_fma, 100, 90), CpuPath::avx512_fma);
}

/// The skip message where this machine measures no product path.
bool skipped_without_a_product_path() {
  if (impl::measures_product_path(active_cpu_path())) return false;
  std::cout << "[ SKIPPED  ] no product path is measured: the machine's path is " << cpu_path_name(active_cpu_path())
            << ", not an AVX-512 one\n";
  return true;
}

// Each shape and block order is timed on both AVX-512 paths from DRAM, each
// with its own measured choices, where both products take it; the path the
// decode asks for is the faster by faster_product_path, and says so.
TEST(ProductPath, IsMeasuredFromDramOnEachShapeAndOrderWhereBothPathsRun) {
  if (skipped_without_a_product_path()) return;
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), made_up_mixtral(), deepseek_v2_lite_mla_attention()})
    for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
      const std::string order_name = order == BlockOrder::head_major ? "head-major" : "token-major";
      SCOPED_TRACE(shape.name + ", " + std::to_string(shape.q_heads) + " query heads, " + order_name);
      const ProductPathMeasurement& m = product_path_measurement(shape, order);
      EXPECT_EQ(&m, &product_path_measurement(shape, order)) << "measured again";
      bool both_take = true;
      for (CpuPath path : {CpuPath::avx512_bf16, CpuPath::avx512_fma})
        both_take =
            both_take && impl::host_product_path(path, shape.block_geometry(256), order, shape.group(), true) == path;
      ASSERT_EQ(m.measured, both_take);
      EXPECT_EQ(m.machine, active_cpu_path());
      EXPECT_EQ(m.probe, shape.name + " (" + std::to_string(shape.q_heads) + " query / " +
                             std::to_string(shape.kv_heads) + " KV heads), " + order_name);
      const std::string described = describe_decode_cpu_path(shape, order);
      if (!both_take) {
        EXPECT_EQ(m.faster, m.machine);
        EXPECT_NE(described.find("not both AVX-512 products take it"), std::string::npos) << described;
        continue;
      }
      EXPECT_GT(m.bf16_ms, 0);
      EXPECT_GT(m.fma_ms, 0);
      EXPECT_GE(m.alternations, 5);
      EXPECT_EQ(m.windows_read, next_pass_probe_windows(m.kv_bytes));
      EXPECT_EQ(m.paths_run, (std::vector<CpuPath>{CpuPath::avx512_bf16, CpuPath::avx512_fma}));
      EXPECT_EQ(m.faster, faster_product_path(m.machine, m.bf16_ms, m.fma_ms));
      EXPECT_EQ(active_decode_cpu_path(shape, order), m.faster);
      EXPECT_EQ(described.rfind(std::string(cpu_path_name(m.faster)) + " (measured on avx512_bf16 and avx512_fma, " +
                                    m.probe + ", " + std::to_string(m.kv_bytes >> 20) + " MiB a step over " +
                                    std::to_string(m.pool_bytes >> 20) + " MiB",
                                0),
                0u)
          << described;
    }
  EXPECT_EQ(describe_decode_cpu_paths(mixtral_8x7b_attention()),
            "head-major: " + describe_decode_cpu_path(mixtral_8x7b_attention(), BlockOrder::head_major) +
                "; token-major: " + describe_decode_cpu_path(mixtral_8x7b_attention(), BlockOrder::token_major));
}

// A product path measurement and the level measurements of both paths under
// it (a shape measured nowhere else) read one pool of KV, filled once.
TEST(ProductPath, ItsProbesShareOnePool) {
  if (skipped_without_a_product_path()) return;
  AttentionShape shape = mixtral_8x7b_attention();
  shape.q_heads = 16, shape.kv_heads = 4;
  ASSERT_TRUE(impl::honours_next_pass_level(CpuPath::avx512_fma, true, shape.group()));
  const int filled = impl::probe_pools_filled();
  const ProductPathMeasurement& m = product_path_measurement(shape, BlockOrder::head_major);
  ASSERT_TRUE(m.measured);
  EXPECT_EQ(impl::probe_pools_filled(), filled + 1) << "three probes: each path's levels, then the paths";
  for (CpuPath path : {CpuPath::avx512_bf16, CpuPath::avx512_fma}) {
    const ScopedCpuPath pinned(path);
    EXPECT_TRUE(next_pass_prefetch_measurement(shape).measured) << cpu_path_name(path);
  }
  EXPECT_EQ(impl::probe_pools_filled(), filled + 1) << "the levels were measured under the product path's";
}

// Unpinned, the decode runs the path measured faster for its shape and order,
// bit for bit as that path pinned (the two differ: vdpbf16ps rounds the
// queries to bf16); a pinned path beats the measurement.
TEST(ProductPath, DecodeTakesThePathMeasuredForItsShapeUnlessOneIsPinned) {
  if (skipped_without_a_product_path()) return;
  const AttentionShape shape = mixtral_8x7b_attention();
  for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
    SCOPED_TRACE(order == BlockOrder::head_major ? "head-major" : "token-major");
    const ProductPathMeasurement measured = product_path_measurement(shape, order);
    ASSERT_TRUE(measured.measured);
    const HostDecode decode(shape, order);
    std::vector<PartialState<HostMemSpace>> pinned_states;  // avx512_bf16's, avx512_fma's
    for (CpuPath path : {CpuPath::avx512_bf16, CpuPath::avx512_fma}) {
      const ScopedCpuPath pinned(path);
      DecodeWorkspace<HostMemSpace> workspace;
      pinned_states.push_back(decode.attend(workspace));
      EXPECT_EQ(workspace.host_path, path);
    }
    ASSERT_NE(pinned_states[0].o(0, 0, 0), pinned_states[1].o(0, 0, 0)) << "the paths' results differ";
    for (int faster = 0; faster < 2; ++faster) {
      const CpuPath path = faster ? CpuPath::avx512_fma : CpuPath::avx512_bf16;
      const CpuPath other = faster ? CpuPath::avx512_bf16 : CpuPath::avx512_fma;
      SCOPED_TRACE(std::string("measured faster: ") + cpu_path_name(path));
      ProductPathMeasurement m = measured;
      m.faster = path;
      impl::replace_product_path_measurement(shape, order, m);
      DecodeWorkspace<HostMemSpace> workspace;
      const PartialState<HostMemSpace> state = decode.attend(workspace);
      EXPECT_EQ(workspace.host_path, path);
      for (std::size_t i = 0; i < state.o.span(); ++i)
        ASSERT_EQ(state.o.data()[i], pinned_states[faster].o.data()[i]) << "o element " << i;
      EXPECT_EQ(describe_decode_cpu_path(shape, order).rfind(std::string(cpu_path_name(path)) + " (measured", 0), 0u);
      const ScopedCpuPath pinned(other);
      DecodeWorkspace<HostMemSpace> pinned_workspace;
      decode.attend(pinned_workspace);
      EXPECT_EQ(pinned_workspace.host_path, other) << "a pinned path beats the measurement";
      EXPECT_EQ(describe_decode_cpu_path(shape, order), std::string(cpu_path_name(other)) + " (set_cpu_path)");
    }
    impl::replace_product_path_measurement(shape, order, measured);
  }
}

// A shape no AVX-512 product takes (2 query heads a KV head) runs a plainer
// path: results and `writescope info` name the path a launch runs, and the
// one asked (the machine's, or a pinned one) where it falls back.
TEST(ProductPath, TheDescriptionNamesThePathTheProductsRun) {
  AttentionShape shape = qwen3_30b_a3b_attention();
  shape.name = "two-query-heads";
  shape.q_heads = 8, shape.kv_heads = 4;
  for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
    const std::string probe =
        std::string("two-query-heads (8 query / 4 KV heads), ") + (order == BlockOrder::head_major ? "head-major" : "token-major");
    SCOPED_TRACE(probe);
    const HostDecode decode(shape, order);
    const auto expect_described = [&](CpuPath asked, const std::string& source) {
      DecodeWorkspace<HostMemSpace> workspace;
      decode.attend(workspace);
      EXPECT_EQ(decode_product_path(shape, order), workspace.host_path);
      const std::string runs = cpu_path_name(workspace.host_path);
      if (workspace.host_path == asked) {
        EXPECT_EQ(describe_decode_cpu_path(shape, order).rfind(runs + " (", 0), 0u);
      } else {
        EXPECT_EQ(describe_decode_cpu_path(shape, order),
                  runs + " (" + cpu_path_name(asked) + ", " + source + ", does not take " + probe + ")");
      }
    };
    expect_described(active_cpu_path(), "the machine's path");
    if (vector_path(active_cpu_path()) >= CpuPath::avx512_fma) {
      EXPECT_NE(decode_product_path(shape, order), active_cpu_path()) << "the machine's AVX-512 path fell back";
    }
    test::for_each_cpu_path([&](CpuPath path) { expect_described(path, "from set_cpu_path"); });
  }
}

}  // namespace
}  // namespace writescope
