#include "framework/roofline.hpp"
#include "experiments/harness.hpp"

#include <gtest/gtest.h>

#include <tuple>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "synthetic_rates.hpp"

namespace writescope {
namespace {

constexpr double gigabyte = 1e9;

TEST(Roofline, LinkAndCpuShareTheBandInProportionToTheirRates) {
  // Link 25 GB/s and CPU 100 GB/s: the CPU takes 100 / 125 = 0.8 of the band.
  const RooflineModel model(test::synthetic_rates(25, 100));
  const SplitPrediction p = model.best_split(StepBytes{0, 0, 10 * gigabyte}, 0, 0);
  EXPECT_NEAR(p.alpha, 0.8, 1e-6);
  EXPECT_NEAR(p.gpu_seconds, p.cpu_seconds, 1e-9);
  EXPECT_NEAR(p.step_seconds, 10 * gigabyte / 125e9, 1e-9);
}

TEST(Roofline, ResidentBytesAndExpertWorkShiftTheSplit) {
  const RooflineModel model(test::synthetic_rates(50, 50));
  // 6 GB resident in VRAM cost 2 ms on the GPU; the CPU also spends 10 ms on experts.
  const SplitPrediction p = model.best_split(StepBytes{6 * gigabyte, 0, 4 * gigabyte}, 0, 0.010);
  const double expected_cpu_bytes = (4e9 / 50e9 + 6e9 / 3000e9 - 0.010) / (2 / 50e9);
  EXPECT_NEAR(p.cpu_movable_bytes, expected_cpu_bytes, 1e3);
  EXPECT_NEAR(p.gpu_seconds, p.cpu_seconds, 1e-9);
}

// CpuResident's head-major blocks and the band's token-major ones run
// different kernels: each is priced at its own rate, and a slower band kernel
// gives the CPU less of the band.
TEST(Roofline, TheBandIsPricedAtTheCpusTokenMajorRate) {
  ModelRates r = test::synthetic_rates(25, 100);
  r.cpu_streamed_attention_gbps = 50;
  const RooflineModel model(r);
  EXPECT_NEAR(model.cpu_seconds(2e9, 1e9, 0, 0), 2e9 / 100e9 + 1e9 / 50e9, 1e-15);
  // All band: the CPU takes 50 / (50 + 25) of it.
  const SplitPrediction band = model.best_split(StepBytes{0, 0, 9e9}, 0, 0);
  EXPECT_NEAR(band.cpu_movable_bytes, 6e9, 1e3);
  EXPECT_NEAR(band.cpu_seconds, 6e9 / 50e9, 1e-9);
  // 1 GB CpuResident (10 ms at 100 GB/s) besides: the CPU takes x of the band where
  // 10 ms + x / 50 GB/s = (9 GB - x) / 25 GB/s.
  const SplitPrediction mixed = model.best_split(StepBytes{0, 1e9, 9e9}, 0, 0);
  EXPECT_NEAR(mixed.cpu_movable_bytes, (9e9 / 25e9 - 0.01) / (1 / 50e9 + 1 / 25e9), 1e3);
  EXPECT_NEAR(mixed.cpu_seconds, mixed.gpu_seconds, 1e-9);
  // Without a GPU the host reads GpuResident's blocks token-major too.
  r.has_gpu = false;
  const SplitPrediction host_only = RooflineModel(r).predict(StepBytes{1e9, 2e9, 1e9}, 0, 0, 0);
  EXPECT_NEAR(host_only.cpu_seconds, 2e9 / 100e9 + 2e9 / 50e9, 1e-12);
}

TEST(Roofline, NoGpuPutsEverythingOnTheCpu) {
  ModelRates r = test::synthetic_rates(25, 100);
  r.has_gpu = false;
  const SplitPrediction p = RooflineModel(r).best_split(StepBytes{1e9, 1e9, 2e9}, 0, 0);
  EXPECT_EQ(p.alpha, 1.0);
  EXPECT_EQ(p.gpu_seconds, 0.0);
  EXPECT_NEAR(p.cpu_seconds, 4e9 / 100e9, 1e-12);
}

TEST(Roofline, EverythingInVramLeavesTheCpuIdle) {
  const SplitPrediction p = RooflineModel(test::synthetic_rates(25, 100)).best_split(StepBytes{8e9, 0, 0}, 0, 0);
  EXPECT_EQ(p.alpha, 0.0);
  EXPECT_NEAR(p.step_seconds, 8e9 / 3000e9, 1e-12);
}

TEST(Roofline, ComputeBoundCpuIsLimitedByItsFmaRate) {
  ModelRates r = test::synthetic_rates(25, 100);
  r.cpu_fma_glanes = 100;  // 4 FMAs per byte at 100 G/s: 25 GB/s effective
  const SplitPrediction p = RooflineModel(r).best_split(StepBytes{0, 0, 10e9}, 4.0, 0);
  EXPECT_NEAR(p.alpha, 0.5, 1e-6);
}

// The FMA limit counts every byte the CPU reads, CpuResident's too: 4 FMAs a
// byte at 100 G/s is 25 GB/s, against 100 of bandwidth.
TEST(Roofline, TheFmaLimitCountsCpuResidentBytes) {
  ModelRates r = test::synthetic_rates(25, 100);
  r.cpu_fma_glanes = 100;
  const RooflineModel model(r);
  EXPECT_NEAR(model.cpu_seconds(2e9, 0, 4.0, 0), 2e9 / 25e9, 1e-12);
  EXPECT_NEAR(model.cpu_seconds(1e9, 1e9, 4.0, 0), 2e9 / 25e9, 1e-12);
  EXPECT_NEAR(model.cpu_seconds(0, 2e9, 4.0, 0), 2e9 / 25e9, 1e-12);
  EXPECT_NEAR(model.cpu_seconds(0, 0, 4.0, 0.003), 0.003, 1e-15);  // no bytes: its experts alone
}

TEST(Roofline, LatenciesMakeTinyStepsOneSided) {
  ModelRates r = test::synthetic_rates(25, 100);
  r.cpu_latency_s = 1e-3;  // the CPU share costs 1 ms just to start
  const SplitPrediction p = RooflineModel(r).best_split(StepBytes{0, 0, 1e6}, 0, 0);
  EXPECT_EQ(p.alpha, 0.0);  // 1 MB streams in 40 us: not worth waking the CPU
  // The other end: a GPU launch of 1 ms for 1 MB the CPU reads in 10 us.
  r.cpu_latency_s = 0;
  r.gpu_latency_s = 1e-3;
  const SplitPrediction q = RooflineModel(r).best_split(StepBytes{0, 0, 1e6}, 0, 0);
  EXPECT_EQ(q.alpha, 1.0);
  EXPECT_EQ(q.gpu_seconds, 0.0);  // no GPU work, no launch
  EXPECT_NEAR(q.step_seconds, 1e6 / 100e9, 1e-15);
}

TEST(RateEstimator, SmoothsNoiseRejectsOutliersAndFollowsDrift) {
  RateEstimator rate(100.0, 0.5, 1.5, 3);
  rate.observe(110);
  EXPECT_NEAR(rate.value(), 105, 1e-9);
  rate.observe(10);  // one outlier: held back
  EXPECT_NEAR(rate.value(), 105, 1e-9);
  rate.observe(104);  // agreement resets the pending outliers
  rate.observe(40);
  rate.observe(42);
  EXPECT_NEAR(rate.value(), 104.5, 1e-9);
  rate.observe(44);  // third consecutive low sample: a real drift
  EXPECT_NEAR(rate.value(), 42, 1e-9);
  EXPECT_THROW(RateEstimator(0.0), std::invalid_argument);
}

class ProfileTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "writescope_profile_" + std::to_string(::getpid()) + ".yaml";
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    paths_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const auto& p : paths_) std::remove(p.c_str());
  }
  std::vector<std::string> paths_;
};

TEST_F(ProfileTest, ShippedExampleProfilesLoad) {
  for (const char* name : {"h200-pcie5", "a100-pcie4", "v100-pcie3"}) {
    const auto profile = find_profile(name);
    EXPECT_EQ(profile.name, name);
    EXPECT_GT(profile.pinned_h2d_gbps, 0);
    EXPECT_GT(profile.cpu_attention("qwen3-30b-a3b", profile.cpu_threads), 0);
  }
}

TEST_F(ProfileTest, SaveAndLoadRoundTrip) {
  auto profile = find_profile("h200-pcie5");
  const std::string path = write("");
  profile.save(path);
  const auto again = MachineProfile::load(path);
  EXPECT_EQ(again.to_yaml(), profile.to_yaml());
  EXPECT_DOUBLE_EQ(again.cpu_attention("qwen3-30b-a3b", 8), 2.3);   // largest measured count <= 8
  EXPECT_DOUBLE_EQ(again.cpu_attention("qwen3-30b-a3b", 64), 25);
  EXPECT_THROW(again.cpu_attention("llama", 16), std::out_of_range);
  // Streaming chunks: 4 MiB where the profile has none; its own value otherwise.
  EXPECT_EQ(again.link_chunk_bytes, std::uint64_t{4} << 20);
  MachineProfile measured = again;
  measured.link_chunk_bytes = std::uint64_t{3} << 20;
  measured.save(path);
  EXPECT_EQ(MachineProfile::load(path).link_chunk_bytes, std::uint64_t{3} << 20);
  // Every CPU path round-trips, amx_bf16 (the GPU machine's host) included, with the product path, the
  // next-pass level and the token-major pass per shape.
  measured.cpu_path = "amx_bf16";
  measured.cpu_decode_path = {{"qwen3-30b-a3b", "avx512_bf16"}, {"mixtral-8x7b", "avx512_fma"}};
  measured.cpu_next_pass_prefetch = {{"qwen3-30b-a3b", "l1"}, {"mixtral-8x7b", "l2"}};
  measured.cpu_token_major_pass = {{"qwen3-30b-a3b", "32"}, {"mixtral-8x7b", "64"}};
  measured.cpu_head_major_pass = {{"qwen3-30b-a3b", "128"}, {"mixtral-8x7b", "32"}};
  measured.save(path);
  const auto amx = MachineProfile::load(path);
  EXPECT_EQ(amx.cpu_path, "amx_bf16");
  EXPECT_EQ(amx.cpu_decode_path, measured.cpu_decode_path);
  EXPECT_EQ(amx.cpu_next_pass_prefetch, measured.cpu_next_pass_prefetch);
  EXPECT_EQ(amx.cpu_token_major_pass, measured.cpu_token_major_pass);
  EXPECT_EQ(amx.cpu_head_major_pass, measured.cpu_head_major_pass);
  // The band's rates and path per shape; a shape without a band rate reads the band at CpuResident's.
  measured.cpu_streamed_decode_path = {{"qwen3-30b-a3b", "avx512_fma"}};
  measured.cpu_streamed_attention_gbps["qwen3-30b-a3b"] = {{1, 2.0}, {16, 21}};
  measured.save(path);
  const auto with_band = MachineProfile::load(path);
  EXPECT_EQ(with_band.cpu_streamed_decode_path, measured.cpu_streamed_decode_path);
  EXPECT_EQ(with_band.cpu_streamed_attention_gbps, measured.cpu_streamed_attention_gbps);
  EXPECT_DOUBLE_EQ(with_band.cpu_streamed_attention("qwen3-30b-a3b", 8), 2.0);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_band, "qwen3-30b-a3b", 16).cpu_streamed_attention_gbps, 21);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_band, "qwen3-30b-a3b", 16).cpu_attention_gbps, 25);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_band, "mixtral-8x7b", 16).cpu_streamed_attention_gbps, 25);
  EXPECT_THROW(with_band.cpu_streamed_attention("llama", 16), std::out_of_range);
  EXPECT_TRUE(again.cpu_streamed_attention_gbps.empty());
  EXPECT_EQ(again.to_yaml().find("streamed_attention_gbps"), std::string::npos);
  EXPECT_TRUE(again.cpu_decode_path.empty());  // not stated: no warning, no comparison
  EXPECT_TRUE(again.cpu_next_pass_prefetch.empty());
  EXPECT_TRUE(again.cpu_token_major_pass.empty());
  // Older profiles give the BLAS rates under their older names.
  EXPECT_DOUBLE_EQ(find_profile("a100-pcie4").cpu_expert_gbps, 100);
  // The GPU's decode rate over VRAM-resident KV replaces the copy rate for the shapes it was measured on.
  measured.gpu_attention_gbps["qwen3-30b-a3b"] = 180;
  measured.save(path);
  const auto with_gpu_rate = MachineProfile::load(path);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_gpu_rate, "qwen3-30b-a3b", 16).hbm_gbps, 180);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_gpu_rate, "mixtral-8x7b", 16).hbm_gbps, with_gpu_rate.hbm_gbps);
  // The GPU's memory: as a byte size in the shipped profiles, in bytes once saved.
  EXPECT_EQ(find_profile("v100-pcie3").gpu_memory_bytes, std::uint64_t{16000000000});
  EXPECT_EQ(again.gpu_memory_bytes, std::uint64_t{141000000000});
  measured.gpu_memory_bytes = std::uint64_t{80} << 30;
  measured.save(path);
  EXPECT_EQ(MachineProfile::load(path).gpu_memory_bytes, std::uint64_t{80} << 30);
  // The GPU's fp32 FMA rate caps the attention of shapes without a measured rate at
  // fma_glanes / (FMAs per byte): 30000 / 15 = 2000 GB/s under HBM's 4200 for MLA, not 2 per byte's 15000.
  EXPECT_DOUBLE_EQ(again.gpu_fma_glanes, 30000);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(again, "deepseek-v2-lite", 16, 15).hbm_gbps, 2000);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(again, "mixtral-8x7b", 16, 2).hbm_gbps, again.hbm_gbps);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(again, "deepseek-v2-lite", 16).hbm_gbps, again.hbm_gbps);
  EXPECT_DOUBLE_EQ(ModelRates::from_profile(with_gpu_rate, "qwen3-30b-a3b", 16, 1e3).hbm_gbps, 180);  // measured
  measured.gpu_fma_glanes = 1234;
  measured.save(path);
  EXPECT_DOUBLE_EQ(MachineProfile::load(path).gpu_fma_glanes, 1234);
}

// Latencies are kept in seconds and written in microseconds: the text shows
// the figure as given, and a saved profile saves to the same text.
TEST_F(ProfileTest, LatenciesPrintAsGiven) {
  const std::string path = write("");
  MachineProfile profile = find_profile("h200-pcie5");
  profile.gpu_launch_latency_s = 7.9e-6;
  profile.cpu_launch_latency_s = 2.3e-6;
  profile.link_latency_s = 11.1e-6;
  const std::string text = profile.to_yaml();
  for (const char* line : {"launch_latency_us: 7.9\n", "launch_latency_us: 2.3\n", "latency_us: 11.1\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
  profile.save(path);
  EXPECT_EQ(MachineProfile::load(path).to_yaml(), text);
  EXPECT_NEAR(MachineProfile::load(path).gpu_launch_latency_s, 7.9e-6, 1e-20);
}

// A profile is written through a name of its own: a file beside it named
// like a partial copy (a user's, or another writer's) is left as it was.
TEST_F(ProfileTest, SavingLeavesAFileNamedLikeItsPartialCopy) {
  const std::string path = write("");
  const std::string beside = path + ".partial";
  {
    std::FILE* f = std::fopen(beside.c_str(), "w");
    std::fputs("kept", f);
    std::fclose(f);
  }
  paths_.push_back(beside);
  const auto profile = find_profile("h200-pcie5");
  profile.save(path);
  EXPECT_EQ(MachineProfile::load(path).to_yaml(), profile.to_yaml());
  // Readable as any file the user writes (the umask's), not mkstemp's 0600.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat status {};
  ASSERT_EQ(::stat(path.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0666 & ~mask);
  std::FILE* f = std::fopen(beside.c_str(), "r");
  ASSERT_NE(f, nullptr) << beside << " was removed";
  char text[16] = {};
  EXPECT_EQ(std::fread(text, 1, sizeof text - 1, f), 4u);
  std::fclose(f);
  EXPECT_STREQ(text, "kept");
}

TEST_F(ProfileTest, ErrorsNameTheField) {
  const std::string base = R"(name: bad
gpu: {hbm_gbps: 1000}
link: {pinned_h2d_gbps: 25, pinned_d2h_gbps: 25, pageable_h2d_gbps: 8, pageable_d2h_gbps: -8}
cpu: {threads: 4, dram_read_gbps: 20, fma_glanes: 100, expert_gbps: 10, expert_gflops: 50,
      attention_gbps: {qwen3-30b-a3b: {4: 5}}}
)";
  try {
    MachineProfile::load(write(base));
    FAIL() << "negative bandwidth accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "link.pageable_d2h_gbps");
    EXPECT_EQ(e.reason(), "must be a rate in [0.001, 100000] (G/s), got -8");
  }
  // Finite but absurd: a rate no machine has, a latency of hours, threads past Kokkos' pool.
  for (const auto& [from, to, field, reason] : std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"fma_glanes: 100", "fma_glanes: 1e-300", "cpu.fma_glanes", "must be a rate in [0.001, 100000] (G/s), got 1e-300"},
           {"hbm_gbps: 1000", "hbm_gbps: 1e9", "gpu.hbm_gbps", "must be a rate in [0.001, 100000] (G/s), got 1000000000"},
           {"hbm_gbps: 1000", "hbm_gbps: 100000.3", "gpu.hbm_gbps", "must be a rate in [0.001, 100000] (G/s), got 100000.3"},
           {"hbm_gbps: 1000", "hbm_gbps: 1000, launch_latency_us: 1e30", "gpu.launch_latency_us",
            "must be a number of microseconds in [0, 1000000], got 1e+30"},
           {"threads: 4", "threads: 100000", "cpu.threads", "must be in [1, 512], got 100000"},
           {"hbm_gbps: 1000", "hbm_gbps: 1000, memory: 0", "gpu.memory", "must be a positive byte size such as 16GB"},
           {"hbm_gbps: 1000", "hbm_gbps: 1000, fma_glanes: 0", "gpu.fma_glanes",
            "must be a rate in [0.001, 100000] (G/s), got 0"}}) {
    std::string text = base;
    text.replace(text.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8");
    text.replace(text.find(from), from.size(), to);
    try {
      MachineProfile::load(write(text));
      ADD_FAILURE() << to << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), field) << to;
      EXPECT_EQ(e.reason(), reason) << to;
    }
  }
  try {
    MachineProfile::load(write("name: ' '\n" + base.substr(base.find('\n') + 1)));
    FAIL() << "an empty name accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "name");
    EXPECT_EQ(e.reason(), "must not be empty");
  }
  {  // A host-only profile's GPU and link sections would be dropped unread.
    std::string host_only = "has_gpu: false\n" + base;
    host_only.replace(host_only.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8");
    for (const char* section : {"gpu", "link"}) {
      try {
        MachineProfile::load(write(host_only));
        ADD_FAILURE() << "has_gpu: false with a " << section << " section accepted";
      } catch (const ConfigError& e) {
        EXPECT_EQ(e.field(), section);
        EXPECT_EQ(e.reason(), "is given although has_gpu is false; remove it, or set has_gpu: true");
      }
      if (section == std::string("gpu")) host_only.erase(host_only.find("gpu: {hbm_gbps: 1000}\n"), 22);
    }
  }
  std::string zero_chunk = base;
  zero_chunk.replace(zero_chunk.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8, chunk_bytes: 0");
  try {
    MachineProfile::load(write(zero_chunk));
    FAIL() << "a zero streaming chunk accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "link.chunk_bytes");
  }
  std::string both_names = base;
  both_names.replace(both_names.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8");
  both_names.replace(both_names.find("expert_gbps: 10"), 15, "expert_gbps: 10, gemv_gbps: 10");
  try {
    MachineProfile::load(write(both_names));
    FAIL() << "both names of the expert rate accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "cpu.gemv_gbps");
    EXPECT_NE(e.reason().find("older name of expert_gbps"), std::string::npos) << e.reason();
  }
  // A bad path, a bad level, and a level not given per shape (the form before levels were measured per shape).
  for (const auto& [field, value, named, reason] :
       {std::tuple{"path", "avx1024", "cpu.path", "avx1024"},
        std::tuple{"decode_path", "{mixtral-8x7b: avx1024}", "cpu.decode_path.mixtral-8x7b", "avx1024"},
        std::tuple{"decode_path", "avx2", "cpu.decode_path", "mapping"},
        std::tuple{"streamed_decode_path", "{qwen3-30b-a3b: avx3}", "cpu.streamed_decode_path.qwen3-30b-a3b", "avx3"},
        std::tuple{"next_pass_prefetch", "{qwen3-30b-a3b: l3}", "cpu.next_pass_prefetch.qwen3-30b-a3b", "l3"},
        std::tuple{"next_pass_prefetch", "l2", "cpu.next_pass_prefetch", "mapping"},
        std::tuple{"token_major_pass", "{qwen3-30b-a3b: 48}", "cpu.token_major_pass.qwen3-30b-a3b", "48"},
        std::tuple{"token_major_pass", "64", "cpu.token_major_pass", "mapping"},
        std::tuple{"head_major_pass", "{mixtral-8x7b: 16}", "cpu.head_major_pass.mixtral-8x7b", "16"},
        std::tuple{"streamed_attention_gbps", "{qwen3-30b-a3b: {4: 0}}", "cpu.streamed_attention_gbps.qwen3-30b-a3b.4",
                   "a rate in [0.001, 100000] (G/s), got 0"},
        std::tuple{"streamed_attention_gbps", "{qwen3-30b-a3b: {04: 5}}",
                   "cpu.streamed_attention_gbps.qwen3-30b-a3b.04", "thread count"}}) {
    std::string bad = base;
    bad.replace(bad.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8");
    bad.replace(bad.find("threads: 4"), 10, std::string("threads: 4, ") + field + ": " + value);
    try {
      MachineProfile::load(write(bad));
      FAIL() << field << " " << value << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), named);
      EXPECT_NE(e.reason().find(reason), std::string::npos) << e.reason();
    }
  }
  // Thread counts as keys: whole numbers only, so that no two keys name one count ("1" and "1.9", "01").
  for (const std::string key : {"four", "2x", "1.9", "01", "0"}) {
    const std::string no_gpu = R"(name: laptop
has_gpu: false
cpu: {threads: 4, dram_read_gbps: 20, fma_glanes: 100, expert_gbps: 10, expert_gflops: 50,
      attention_gbps: {qwen3-30b-a3b: {1: 4, )" + key + R"(: 5}}}
)";
    try {
      MachineProfile::load(write(no_gpu));
      FAIL() << "thread count '" << key << "' accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "cpu.attention_gbps.qwen3-30b-a3b." + key);
    }
  }
  // Rates per shape of the wrong shape: a list, a bare number, a key that is not a name.
  for (const auto& [gpu_rates, cpu_rates, named] :
       {std::tuple{"", "[5, 6]", "cpu.attention_gbps"},
        std::tuple{"", "{qwen3-30b-a3b: 5}", "cpu.attention_gbps.qwen3-30b-a3b"},
        std::tuple{"", "{[qwen3-30b-a3b]: {4: 5}}", "cpu.attention_gbps"},
        std::tuple{", attention_gbps: [900]", "{qwen3-30b-a3b: {4: 5}}", "gpu.attention_gbps"},
        std::tuple{", attention_gbps: 900", "{qwen3-30b-a3b: {4: 5}}", "gpu.attention_gbps"}}) {
    std::string bad = base;
    bad.replace(bad.find("pageable_d2h_gbps: -8"), 21, "pageable_d2h_gbps: 8");
    bad.replace(bad.find("hbm_gbps: 1000"), 14, std::string("hbm_gbps: 1000") + gpu_rates);
    bad.replace(bad.find("{qwen3-30b-a3b: {4: 5}}"), 23, cpu_rates);
    try {
      MachineProfile::load(write(bad));
      FAIL() << gpu_rates << " " << cpu_rates << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), named) << e.what();
      EXPECT_NE(e.reason().find("expected a mapping"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace writescope
