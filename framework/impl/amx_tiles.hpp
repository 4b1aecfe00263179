#pragma once
// AMX tile operations for the amx_bf16 CPU path: tile registers of up to 16
// rows of up to 64 bytes (fp32 16 columns, or bf16 32 / 16 pairs x 2;
// TileConfig). Two backends with the same members:
//  - AmxTiles: the instructions, as inline assembly (GCC's intrinsics paste
//    the register number into the text, so a template parameter cannot name
//    it), for CPUs where cpu_path_supported(CpuPath::amx_bf16);
//  - EmulatedTiles: the same semantics in plain C++, so that kernels written
//    against a backend are tested on machines without AMX.
// Kernels take the backend as a template parameter; tile numbers are
// template arguments (the register is part of the instruction).

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#include "framework/bf16.hpp"

namespace writescope::impl {

inline constexpr int tile_rows = 16;
inline constexpr int tile_row_bytes = 64;

/// The LDTILECFG operand: palette 1, the eight tiles tile_rows high and
/// tile_row_bytes wide but where rows_of / bytes_of say otherwise (bit t of
/// `tiles`: tile t).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) bytes_per_row[t] = tile_row_bytes, rows[t] = tile_rows;
  }
  TileConfig& rows_of(unsigned tiles, int count) {
    for (int t = 0; t < 8; ++t)
      if (tiles >> t & 1u) rows[t] = static_cast<std::uint8_t>(count);
    return *this;
  }
  TileConfig& bytes_of(unsigned tiles, int bytes) {
    for (int t = 0; t < 8; ++t)
      if (tiles >> t & 1u) bytes_per_row[t] = static_cast<std::uint16_t>(bytes);
    return *this;
  }
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

#if defined(__x86_64__)
/// The hardware. configure() before the first tile operation of a thread,
/// release() after its last (the tile state is per thread and large).
struct AmxTiles {
  void configure(const TileConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }
  void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int T>
  void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  /// Tile T <- 16 rows of 64 bytes, `stride` bytes apart from `rows`.
  template <int T>
  void load(const void* rows, std::int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(rows), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  void store(void* rows, std::int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(rows), "r"(stride), "i"(T) : "memory");
  }
  /// C (16 x 16 fp32) += A (16 x 32 bf16) B (16 pairs x 16 columns, each
  /// word a bf16 pair of consecutive k): tdpbf16ps.
  template <int C, int A, int B>
  void dot() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};
#endif

/// The same in plain C++ (fp32 accumulation of each pair's products; the
/// hardware flushes denormals and may round differently in the last bit).
/// Rows and bytes past a tile's configured ones are zero, as LDTILECFG and
/// loads leave them.
class EmulatedTiles {
 public:
  void configure(const TileConfig& config) {
    std::memset(tiles_, 0, sizeof tiles_);
    for (int t = 0; t < 8; ++t) rows_[t] = config.rows[t], bytes_[t] = config.bytes_per_row[t];
  }
  void release() {}
  template <int T>
  void zero() {
    std::memset(tiles_[T], 0, sizeof tiles_[T]);
  }
  template <int T>
  void load(const void* rows, std::int64_t stride) {
    for (int r = 0; r < rows_[T]; ++r)
      std::memcpy(tiles_[T] + r * tile_row_bytes, static_cast<const char*>(rows) + r * stride, bytes_[T]);
  }
  template <int T>
  void store(void* rows, std::int64_t stride) const {
    for (int r = 0; r < rows_[T]; ++r)
      std::memcpy(static_cast<char*>(rows) + r * stride, tiles_[T] + r * tile_row_bytes, bytes_[T]);
  }
  /// C (M x N) += A (M x 2K) B (K pairs x N): M = C's (and A's) rows, K = B's
  /// rows, N = C's (and B's) bytes / 4.
  template <int C, int A, int B>
  void dot() {
    float c[tile_rows][16];
    bf16 a[tile_rows][32], b[tile_rows][32];
    std::memcpy(c, tiles_[C], sizeof c);
    std::memcpy(a, tiles_[A], sizeof a);
    std::memcpy(b, tiles_[B], sizeof b);
    for (int m = 0; m < rows_[C]; ++m)
      for (int n = 0; n < bytes_[C] / 4; ++n)
        for (int p = 0; p < rows_[B]; ++p)
          c[m][n] += to_float(a[m][2 * p]) * to_float(b[p][2 * n]) + to_float(a[m][2 * p + 1]) * to_float(b[p][2 * n + 1]);
    std::memcpy(tiles_[C], c, sizeof c);
  }

 private:
  alignas(64) unsigned char tiles_[8][tile_rows * tile_row_bytes];
  int rows_[8] = {tile_rows, tile_rows, tile_rows, tile_rows, tile_rows, tile_rows, tile_rows, tile_rows};
  int bytes_[8] = {tile_row_bytes, tile_row_bytes, tile_row_bytes, tile_row_bytes,
                   tile_row_bytes, tile_row_bytes, tile_row_bytes, tile_row_bytes};
};

/// "" where the first `rows` rows of two 16-column fp32 tiles (e.g. the
/// hardware's and EmulatedTiles' result) agree bit for bit, else the first
/// element that differs: "C[r][n] is <first> on the tiles, <second> emulated".
inline std::string first_tile_difference(const float* tiles, const float* emulated, int rows) {
  for (int i = 0; i < rows * 16; ++i)
    if (std::memcmp(tiles + i, emulated + i, sizeof(float)) != 0) {
      std::ostringstream difference;
      difference << "C[" << i / 16 << "][" << i % 16 << "] is " << tiles[i] << " on the tiles, " << emulated[i]
                 << " emulated";
      return difference.str();
    }
  return "";
}

}  // namespace writescope::impl
