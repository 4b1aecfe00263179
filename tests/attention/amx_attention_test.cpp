// The AMX tile product of MLA decode attention (host_block_attention_amx.cpp)
// against a double reference: on emulated tiles wherever AVX-512 BF16 runs,
// and on the hardware's tiles where the amx_bf16 path is supported (there the
// decode tests also run it through decode_attention, test::for_each_cpu_path).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/impl/host_block_attention.hpp"
#include "attention/shape.hpp"
#include "cpu_paths.hpp"
#include "framework/bf16.hpp"
#include "framework/cpu_path.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace {

#ifdef WRITESCOPE_HOST_AVX512_BF16

using RunProduct = std::function<void(const impl::HostSegment<bf16>*, int, int, const std::uint32_t* const*,
                                      const impl::HostSegment<bf16>*, float*, float*)>;

/// Three blocks of one shape's KV, `heads` of its KV heads (the last ones)
/// and their query groups; runs of segments that start and end inside 32-token chunks (NaN
/// around them), and that rise into (or fall from) much larger scores,
/// checked against a double reference of the same bf16 KV with bf16-rounded
/// queries.
class AmxRuns {
 public:
  AmxRuns(const AttentionShape& shape, BlockOrder order, int heads)
      : order_(order), geometry_(shape.block_geometry(block_tokens)), group_(shape.group()), heads_(heads),
        first_head_(shape.kv_heads - heads), scale_(1.0f / std::sqrt(static_cast<float>(shape.key_dim))) {
    std::mt19937 random(7);
    std::normal_distribution<float> normal;
    pool_.resize(static_cast<std::size_t>(blocks * geometry_.block_elements()));
    for (bf16& element : pool_) element = from_float<bf16>(normal(random));
    const int rows = heads_ * group_;  // query heads, head-major
    queries_.resize(static_cast<std::size_t>(rows * geometry_.key_dim));
    for (float& q : queries_) q = normal(random);
    // Block 2's scores some 14 to 17 above the others' (its last 32 key
    // dims, keys only, along the queries' constant ones): a run into it
    // rescales its state beyond any lazy margin.
    for (int q = 0; q < rows; ++q)
      for (int d = geometry_.key_dim - 32; d < geometry_.key_dim; ++d) queries_[q * geometry_.key_dim + d] = 1.0f;
    for (int k = first_head_; k < first_head_ + heads_; ++k)
      for (int t = 0; t < block_tokens; ++t)
        for (int d = geometry_.key_dim - 32; d < geometry_.key_dim; ++d)
          pool_[2 * geometry_.block_elements() + geometry_.key_offset(order_, t, k, d)] = from_float<bf16>(6.0f);
    query_pairs_.resize(queries_.size() / 2);
    const std::size_t head_words = static_cast<std::size_t>(group_ * geometry_.key_dim / 2);
    for (int h = 0; h < heads_; ++h)
      impl::prepare_query_pairs_amx(geometry_, group_, queries_.data() + h * group_ * geometry_.key_dim,
                                    query_pairs_.data() + h * head_words);
  }

  /// (block, first token, tokens) per segment of one run.
  struct Piece {
    int block, first, tokens;
  };

  void expect_reference(const RunProduct& product, const std::vector<Piece>& pieces) const {
    // The head's keys and values outside the run are NaN: nothing of them may
    // reach the result (the kernels read whole chunks around the segments).
    std::vector<bf16> pool = pool_;
    for (int block = 0; block < blocks; ++block)
      for (int t = 0; t < block_tokens; ++t) {
        bool inside = false;
        for (const Piece& piece : pieces)
          inside |= piece.block == block && t >= piece.first && t < piece.first + piece.tokens;
        if (inside) continue;
        bf16* kv = pool.data() + block * geometry_.block_elements();
        for (int k = first_head_; k < first_head_ + heads_; ++k) {
          for (int d = 0; d < geometry_.key_dim; ++d) kv[geometry_.key_offset(order_, t, k, d)] = bf16{0x7fc0};
          for (int d = 0; d < geometry_.value_dim; ++d) kv[geometry_.value_offset(order_, t, k, d)] = bf16{0x7fc0};
        }
      }
    std::vector<impl::HostSegment<bf16>> run;
    for (const Piece& piece : pieces)
      run.push_back({pool.data() + piece.block * geometry_.block_elements(), geometry_, order_, first_head_,
                     piece.first, piece.tokens, queries_.data(), group_, scale_});
    const int rows = heads_ * group_;
    std::vector<float> o(static_cast<std::size_t>(rows * geometry_.value_dim)), lse(rows);
    std::vector<const std::uint32_t*> pairs;
    for (int h = 0; h < heads_; ++h) pairs.push_back(query_pairs_.data() + h * group_ * geometry_.key_dim / 2);
    product(run.data(), static_cast<int>(run.size()), heads_, pairs.data(), nullptr, o.data(), lse.data());
    std::vector<double> ref_o, ref_lse, rounding;
    reference(pieces, ref_o, ref_lse, rounding);
    for (int h = 0; h < rows; ++h) {
      ASSERT_NEAR(lse[h], ref_lse[h], test::attention_lse_tolerance(true, ref_lse[h])) << "head " << h;
      for (int d = 0; d < geometry_.value_dim; ++d) {
        const int i = h * geometry_.value_dim + d;
        ASSERT_NEAR(o[i], ref_o[i], rounding[i] + 1e-4) << "head " << h << " dim " << d;
      }
    }
  }

  const BlockGeometry& geometry() const { return geometry_; }

 private:
  static constexpr int block_tokens = 640, blocks = 3;

  float key(int block, int token, int head, int d) const {
    return to_float(pool_[block * geometry_.block_elements() + geometry_.key_offset(order_, token, head, d)]);
  }
  float value(int block, int token, int head, int d) const {
    return to_float(pool_[block * geometry_.block_elements() + geometry_.value_offset(order_, token, head, d)]);
  }

  /// o (heads * group, value_dim), lse (heads * group) natural log, and `rounding`, what
  /// rounding the weights to bf16 can move each o by (at most 2^-8 of each
  /// weight: sum of p |v| / sum of p, times 2^-8).
  void reference(const std::vector<Piece>& pieces, std::vector<double>& o, std::vector<double>& lse,
                 std::vector<double>& rounding) const {
    o.assign(static_cast<std::size_t>(heads_ * group_ * geometry_.value_dim), 0.0);
    rounding.assign(o.size(), 0.0);
    lse.assign(heads_ * group_, 0.0);
    for (int h = 0; h < heads_ * group_; ++h) {
      const int kv_head = first_head_ + h / group_;
      std::vector<double> scores;
      std::vector<std::pair<int, int>> tokens;
      for (const Piece& piece : pieces)
        for (int t = piece.first; t < piece.first + piece.tokens; ++t) {
          double dot = 0;
          for (int d = 0; d < geometry_.key_dim; ++d)
            dot += double{round_to<bf16>(queries_[h * geometry_.key_dim + d])} * key(piece.block, t, kv_head, d);
          scores.push_back(dot * scale_);
          tokens.emplace_back(piece.block, t);
        }
      double maximum = -INFINITY, sum = 0;
      for (double s : scores) maximum = std::max(maximum, s);
      for (std::size_t i = 0; i < scores.size(); ++i) {
        const double p = std::exp(scores[i] - maximum);
        sum += p;
        for (int d = 0; d < geometry_.value_dim; ++d) {
          const double v = value(tokens[i].first, tokens[i].second, kv_head, d);
          o[h * geometry_.value_dim + d] += p * v;
          rounding[h * geometry_.value_dim + d] += p * std::abs(v);
        }
      }
      for (int d = 0; d < geometry_.value_dim; ++d) {
        o[h * geometry_.value_dim + d] /= sum;
        rounding[h * geometry_.value_dim + d] *= std::ldexp(1.0, -8) / sum;
      }
      lse[h] = maximum + std::log(sum);
    }
  }

  BlockOrder order_;
  BlockGeometry geometry_;
  int group_, heads_, first_head_;
  float scale_;
  std::vector<bf16> pool_;
  std::vector<float> queries_;
  std::vector<std::uint32_t> query_pairs_;
};

/// Runs with whole and partial chunks (640-token blocks: segments that are
/// not a whole number of them), one token, chunks across segments.
const std::vector<std::vector<AmxRuns::Piece>> runs{{{0, 0, 32}},
                                                    {{1, 200, 1}},
                                                    {{2, 3, 17}},
                                                    {{0, 5, 600}, {1, 0, 640}, {2, 0, 40}},
                                                    {{2, 100, 64}, {0, 31, 33}},
                                                    {{1, 300, 300}}};

/// Every run, for MLA (both orders: token rows either way) and the GQA shapes
/// in both orders (token-major blocks: two KV heads in one call, as their
/// work items take all heads).
void expect_every_run(const RunProduct& product) {
  struct Case {
    AttentionShape shape;
    BlockOrder order;
    int heads;
  };
  const std::vector<Case> cases{{deepseek_v2_lite_mla_attention(), BlockOrder::head_major, 1},
                                {deepseek_v2_lite_mla_attention(), BlockOrder::token_major, 1},
                                {qwen3_30b_a3b_attention(), BlockOrder::head_major, 1},
                                {qwen3_30b_a3b_attention(), BlockOrder::token_major, 2},
                                {mixtral_8x7b_attention(), BlockOrder::head_major, 1},
                                {mixtral_8x7b_attention(), BlockOrder::token_major, 2}};
  for (const auto& [shape, order, heads] : cases) {
    const AmxRuns kv(shape, order, heads);
    ASSERT_TRUE(impl::amx_takes(kv.geometry(), order, shape.group())) << shape.name;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(shape.name + ", run " + std::to_string(r) +
                   (order == BlockOrder::head_major ? ", head-major" : ", token-major"));
      kv.expect_reference(product, runs[r]);
    }
  }
}

TEST(AmxDecodeProduct, EmulatedTilesMatchTheReference) {
  if (!cpu_path_supported(CpuPath::avx512_bf16))
    GTEST_SKIP() << "the kernel's softmax needs AVX-512 BF16, which this CPU or build lacks";
  expect_every_run(impl::host_run_attention_amx_emulated);
}

TEST(AmxDecodeProduct, HardwareTilesMatchTheReference) {
  if (!cpu_path_supported(CpuPath::amx_bf16))
    GTEST_SKIP() << "amx_bf16: " << test::unsupported_reason(CpuPath::amx_bf16);
  expect_every_run(impl::host_run_attention_amx);
}

#endif

// MLA and GQA in either order, in blocks of whole 32-token chunks; MLA only
// with its 16 heads.
TEST(AmxDecodeProduct, TakesMlaAndGroupsInBlocksOfWholeChunks) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  const BlockGeometry mla = deepseek_v2_lite_mla_attention().block_geometry(256);
  for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major})
    EXPECT_TRUE(impl::amx_takes(mla, order, 16));
  EXPECT_FALSE(impl::amx_takes(mla, BlockOrder::token_major, 8));
  for (const AttentionShape& gqa : {qwen3_30b_a3b_attention(), mixtral_8x7b_attention()}) {
    for (BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
      EXPECT_TRUE(impl::amx_takes(gqa.block_geometry(256), order, gqa.group())) << gqa.name;
      EXPECT_FALSE(impl::amx_takes(gqa.block_geometry(48), order, gqa.group()))
          << gqa.name << ": 48-token blocks end inside a chunk";
    }
  }
  BlockGeometry odd = mla;
  odd.key_dim = 560;  // not whole 32-dim tile steps
  EXPECT_FALSE(impl::amx_takes(odd, BlockOrder::token_major, 16));
#else
  GTEST_SKIP() << "built without the AVX-512 kernels";
#endif
}

}  // namespace
}  // namespace writescope
