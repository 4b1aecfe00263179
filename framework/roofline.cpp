#include "framework/roofline.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include <sys/stat.h>
#include <unistd.h>

#include "framework/files.hpp"
#include "framework/cpu_path.hpp"
#include "framework/runtime.hpp"

namespace writescope {
namespace {

/// Every digit a value needs to show which side of a bound it lies on.
std::string format_number(double value) {
  std::ostringstream text;
  text << std::setprecision(15) << value;
  return text.str();
}

/// A measured rate (GB/s, G lane-FMAs/s, GFLOP/s): from 1 M/s, short of
/// which nothing was measured, to 10^5 G/s, past any memory or core count
/// (an H200's HBM is 4.8 TB/s; 128 AVX-512 cores about 1.2e4 G lane-FMAs/s).
/// Outside, a typo (1e-300) would price a step at 10^294 s.
double rate(const ConfigNode& node, const std::string& key) {
  const double value = node.get<double>(key);
  if (!(value >= 1e-3 && value <= 1e5))
    node.fail(key, "must be a rate in [0.001, 100000] (G/s), got " + format_number(value));
  return value;
}

/// A latency, at most a second (launches and copies take microseconds).
double latency_micros(const ConfigNode& node, const std::string& key) {
  const double value = node.get_or<double>(key, 0.0);
  if (!(value >= 0 && value <= 1e6))
    node.fail(key, "must be a number of microseconds in [0, 1000000], got " + format_number(value));
  return value * 1e-6;
}

}  // namespace

MachineProfile MachineProfile::load(const std::string& path) { return from_config(ConfigNode::load_file(path)); }

MachineProfile MachineProfile::from_config(const ConfigNode& root) {
  root.allow_only({"name", "has_gpu", "gpu", "link", "cpu", "sources"});
  MachineProfile p;
  p.name = root.get_text("name");
  p.has_gpu = root.get_or<bool>("has_gpu", true);
  for (const char* section : {"gpu", "link"})
    if (!p.has_gpu && root.has(section))
      root.fail(section, "is given although has_gpu is false; remove it, or set has_gpu: true");
  if (p.has_gpu) {
    const ConfigNode gpu = root.child("gpu");
    gpu.allow_only({"hbm_gbps", "launch_latency_us", "attention_gbps", "memory", "fma_glanes"});
    p.hbm_gbps = rate(gpu, "hbm_gbps");
    if (const auto attention = gpu.optional_child("attention_gbps"))
      for (const std::string& shape_name : attention->keys())
        p.gpu_attention_gbps[shape_name] = rate(*attention, shape_name);
    p.gpu_launch_latency_s = latency_micros(gpu, "launch_latency_us");
    if (gpu.has("memory")) {
      p.gpu_memory_bytes = gpu.get_bytes("memory");
      if (p.gpu_memory_bytes == 0) gpu.fail("memory", "must be a positive byte size such as 16GB");
    }
    if (gpu.has("fma_glanes")) p.gpu_fma_glanes = rate(gpu, "fma_glanes");
    const ConfigNode link = root.child("link");
    link.allow_only({"pinned_h2d_gbps", "pinned_d2h_gbps", "pageable_h2d_gbps", "pageable_d2h_gbps", "latency_us",
                     "chunk_bytes"});
    p.pinned_h2d_gbps = rate(link, "pinned_h2d_gbps");
    p.pinned_d2h_gbps = rate(link, "pinned_d2h_gbps");
    p.pageable_h2d_gbps = rate(link, "pageable_h2d_gbps");
    p.pageable_d2h_gbps = rate(link, "pageable_d2h_gbps");
    p.link_latency_s = latency_micros(link, "latency_us");
    p.link_chunk_bytes = static_cast<std::uint64_t>(link.get_integer_or(
        "chunk_bytes", static_cast<std::int64_t>(p.link_chunk_bytes), 1, std::int64_t{1} << 40));
  }
  const ConfigNode cpu = root.child("cpu");
  cpu.allow_only({"threads", "dram_read_gbps", "path", "decode_path", "streamed_decode_path", "next_pass_prefetch",
                  "head_major_pass", "token_major_pass", "fma_glanes", "launch_latency_us", "expert_gbps",
                  "expert_gflops", "gemv_gbps", "gemm_gflops", "attention_gbps", "streamed_attention_gbps"});
  // A CPU path's name: every path cpu_path.hpp knows, amx_bf16 included.
  const auto cpu_path_at = [](const ConfigNode& node, const std::string& key) {
    auto name = node.get<std::string>(key);
    try {
      parse_cpu_path(name);
    } catch (const std::invalid_argument& e) {
      node.fail(key, e.what());
    }
    return name;
  };
  if (cpu.has("path")) p.cpu_path = cpu_path_at(cpu, "path");
  // Per attention shape: a mapping from shape name to what `value` reads.
  const auto per_shape = [&](const char* key, const char* what, std::map<std::string, std::string>& into,
                             auto value) {
    if (!cpu.has(key)) return;
    const ConfigNode by_shape = cpu.child(key);
    if (!by_shape.yaml().IsMap())
      cpu.fail(key, std::string("expected a mapping from attention shape to ") + what + " (measured per shape)");
    for (const std::string& shape_name : by_shape.keys()) into[shape_name] = value(by_shape, shape_name);
  };
  const auto pass_tokens = [](const ConfigNode& node, const std::string& key) {
    return node.get_choice(key, {"32", "64", "128"});
  };
  per_shape("decode_path", "a CPU path", p.cpu_decode_path, cpu_path_at);
  per_shape("streamed_decode_path", "a CPU path", p.cpu_streamed_decode_path, cpu_path_at);
  per_shape("next_pass_prefetch", "l1 or l2", p.cpu_next_pass_prefetch,
            [](const ConfigNode& node, const std::string& key) { return node.get_choice(key, {"l1", "l2"}); });
  per_shape("head_major_pass", "32, 64 or 128 tokens", p.cpu_head_major_pass, pass_tokens);
  per_shape("token_major_pass", "32, 64 or 128 tokens", p.cpu_token_major_pass, pass_tokens);
  p.cpu_threads = static_cast<int>(cpu.get_integer("threads", 1, max_host_threads));
  p.cpu_dram_read_gbps = rate(cpu, "dram_read_gbps");
  p.cpu_fma_glanes = rate(cpu, "fma_glanes");
  p.cpu_launch_latency_s = latency_micros(cpu, "launch_latency_us");
  // The expert kernel's rates; older profiles have only the BLAS figures.
  for (const auto& [field, fallback, value] :
       {std::tuple{"expert_gbps", "gemv_gbps", &p.cpu_expert_gbps},
        std::tuple{"expert_gflops", "gemm_gflops", &p.cpu_expert_gflops}}) {
    if (cpu.has(field) && cpu.has(fallback))
      cpu.fail(fallback, std::string("is the older name of ") + field + "; give one of them");
    *value = rate(cpu, cpu.has(fallback) ? fallback : field);
  }
  // Per attention shape, per thread count: GB/s.
  const auto rates_by_threads = [&](const ConfigNode& attention, std::map<std::string, std::map<int, double>>& into) {
    for (const std::string& shape_name : attention.keys()) {
      const ConfigNode per_threads = attention.child(shape_name);
      for (const std::string& key : per_threads.keys()) {
        int threads = 0;
        const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), threads);
        if (error != std::errc() || end != key.data() + key.size() || key.front() == '0')
          per_threads.fail(key, "expected a thread count as the key (digits, no leading zero)");
        if (threads < 1) per_threads.fail(key, "thread counts must be at least 1");
        into[shape_name][threads] = rate(per_threads, key);
      }
    }
  };
  rates_by_threads(cpu.child("attention_gbps"), p.cpu_attention_gbps);
  if (const auto streamed = cpu.optional_child("streamed_attention_gbps"))
    rates_by_threads(*streamed, p.cpu_streamed_attention_gbps);
  if (p.cpu_attention_gbps.empty()) cpu.fail("attention_gbps", "must list at least one attention shape");
  if (const auto sources = root.optional_child("sources")) {
    sources->allow_only({"gpu", "link", "cpu"});
    for (const char* section : {"gpu", "link", "cpu"})
      if (sources->has(section)) p.sources[section] = sources->get<std::string>(section);
  }
  return p;
}

std::string MachineProfile::to_yaml() const {
  YAML::Emitter out;
  // 15 digits: a latency's seconds as microseconds (7.9e-6 * 1e6) prints as
  // 7.9, not 7.9000000000000004, and the text reads back to itself.
  out.SetDoublePrecision(15);
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << name << YAML::Key << "has_gpu" << YAML::Value
      << has_gpu;
  if (has_gpu) {
    out << YAML::Key << "gpu" << YAML::Value << YAML::BeginMap << YAML::Key << "hbm_gbps" << YAML::Value << hbm_gbps
        << YAML::Key << "launch_latency_us" << YAML::Value << gpu_launch_latency_s * 1e6;
    if (gpu_memory_bytes > 0) out << YAML::Key << "memory" << YAML::Value << gpu_memory_bytes;
    if (gpu_fma_glanes > 0) out << YAML::Key << "fma_glanes" << YAML::Value << gpu_fma_glanes;
    if (!gpu_attention_gbps.empty()) {
      out << YAML::Key << "attention_gbps" << YAML::Value << YAML::Flow << YAML::BeginMap;
      for (const auto& [shape, gbps] : gpu_attention_gbps) out << YAML::Key << shape << YAML::Value << gbps;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
    out << YAML::Key << "link" << YAML::Value << YAML::BeginMap << YAML::Key << "pinned_h2d_gbps" << YAML::Value
        << pinned_h2d_gbps << YAML::Key << "pinned_d2h_gbps" << YAML::Value << pinned_d2h_gbps << YAML::Key
        << "pageable_h2d_gbps" << YAML::Value << pageable_h2d_gbps << YAML::Key << "pageable_d2h_gbps" << YAML::Value
        << pageable_d2h_gbps << YAML::Key << "latency_us" << YAML::Value << link_latency_s * 1e6 << YAML::Key
        << "chunk_bytes" << YAML::Value << link_chunk_bytes << YAML::EndMap;
  }
  out << YAML::Key << "cpu" << YAML::Value << YAML::BeginMap << YAML::Key << "threads" << YAML::Value << cpu_threads
      << YAML::Key << "dram_read_gbps" << YAML::Value << cpu_dram_read_gbps << YAML::Key << "path" << YAML::Value
      << cpu_path;
  for (const auto& [key, by_shape] :
       {std::pair{"decode_path", &cpu_decode_path}, std::pair{"streamed_decode_path", &cpu_streamed_decode_path},
        std::pair{"next_pass_prefetch", &cpu_next_pass_prefetch}, std::pair{"head_major_pass", &cpu_head_major_pass},
        std::pair{"token_major_pass", &cpu_token_major_pass}}) {
    if (by_shape->empty()) continue;
    out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [shape, choice] : *by_shape) out << YAML::Key << shape << YAML::Value << choice;
    out << YAML::EndMap;
  }
  out << YAML::Key << "fma_glanes"
      << YAML::Value << cpu_fma_glanes << YAML::Key << "launch_latency_us" << YAML::Value
      << cpu_launch_latency_s * 1e6 << YAML::Key << "expert_gbps" << YAML::Value << cpu_expert_gbps << YAML::Key
      << "expert_gflops" << YAML::Value << cpu_expert_gflops;
  for (const auto& [key, rates] : {std::pair{"attention_gbps", &cpu_attention_gbps},
                                   std::pair{"streamed_attention_gbps", &cpu_streamed_attention_gbps}}) {
    if (rates->empty() && rates != &cpu_attention_gbps) continue;
    out << YAML::Key << key << YAML::Value << YAML::BeginMap;
    for (const auto& [shape, per_threads] : *rates) {
      out << YAML::Key << shape << YAML::Value << YAML::Flow << YAML::BeginMap;
      for (const auto& [threads, gbps] : per_threads) out << YAML::Key << threads << YAML::Value << gbps;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  if (!sources.empty()) {
    out << YAML::Key << "sources" << YAML::Value << YAML::BeginMap;
    for (const auto& [section, source] : sources) out << YAML::Key << section << YAML::Value << source;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void MachineProfile::save(const std::string& given) const {
  // Through its links, so that a link stays a link; a device or pipe is not
  // replaced by a file.
  const std::string path = followed_symlinks(given);
  if (const std::string why = not_a_file_reason(path); !why.empty())
    throw std::runtime_error(given + ": cannot hold the machine profile: it " + why);
  // A name of its own (mkstemp): a file that happens to have one is never
  // truncated, and a leftover of a killed run is never in the way.
  std::string partial = path + ".partial.XXXXXX";
  const int fd = ::mkstemp(partial.data());
  if (fd < 0) throw std::runtime_error(path + ": cannot write the machine profile: " + std::strerror(errno));
  // mkstemp's 0600 would hide the profile from the others who may read the user's files.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  std::FILE* file = ::fdopen(fd, "w");
  if (!file) {
    ::close(fd);
    std::remove(partial.c_str());
    throw std::runtime_error(partial + ": cannot write the machine profile: " + std::strerror(errno));
  }
  const std::string text = to_yaml();
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !written) {
    std::remove(partial.c_str());
    throw std::runtime_error(partial + ": cannot write the machine profile");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(partial.c_str());
    throw std::runtime_error(path + ": cannot replace with the new machine profile: " + std::strerror(error));
  }
}

namespace {

/// The rate of the largest thread count not above `threads` (else the smallest), or nullptr if `shape` has none.
const double* rate_at_threads(const std::map<std::string, std::map<int, double>>& rates, const std::string& shape,
                              int threads) {
  const auto found = rates.find(shape);
  if (found == rates.end() || found->second.empty()) return nullptr;
  auto at = found->second.upper_bound(threads);
  if (at != found->second.begin()) --at;
  return &at->second;
}

}  // namespace

double MachineProfile::cpu_attention(const std::string& shape, int threads) const {
  if (const double* rate = rate_at_threads(cpu_attention_gbps, shape, threads)) return *rate;
  throw std::out_of_range("machine profile '" + name + "' has no CPU attention figure for shape '" + shape + "'");
}

double MachineProfile::cpu_streamed_attention(const std::string& shape, int threads) const {
  if (const double* rate = rate_at_threads(cpu_streamed_attention_gbps, shape, threads)) return *rate;
  return cpu_attention(shape, threads);
}

std::string MachineProfile::source_of(const std::string& section) const {
  const auto found = sources.find(section);
  return found == sources.end() ? "not stated" : found->second;
}

double MachineProfile::gpu_attention(const std::string& shape) const {
  const auto found = gpu_attention_gbps.find(shape);
  return found == gpu_attention_gbps.end() ? hbm_gbps : found->second;
}

ModelRates ModelRates::from_profile(const MachineProfile& profile, const std::string& shape, int threads,
                                    double fmas_per_byte) {
  ModelRates r;
  r.has_gpu = profile.has_gpu;
  r.hbm_gbps = profile.gpu_attention(shape);
  // A measured rate has the GPU's compute in it already.
  if (profile.gpu_fma_glanes > 0 && fmas_per_byte > 0 && profile.gpu_attention_gbps.count(shape) == 0)
    r.hbm_gbps = std::min(r.hbm_gbps, profile.gpu_fma_glanes / fmas_per_byte);
  r.link_gbps = profile.pinned_h2d_gbps;
  r.cpu_attention_gbps = profile.cpu_attention(shape, threads);
  r.cpu_streamed_attention_gbps = profile.cpu_streamed_attention(shape, threads);
  r.cpu_fma_glanes = profile.cpu_fma_glanes;
  r.gpu_latency_s = profile.gpu_launch_latency_s;
  r.link_latency_s = profile.link_latency_s;
  r.cpu_latency_s = profile.cpu_launch_latency_s;
  return r;
}

double RooflineModel::gpu_seconds(double resident_bytes, double streamed_bytes) const {
  if (resident_bytes <= 0 && streamed_bytes <= 0) return 0;
  return resident_bytes / (rates_.hbm_gbps * 1e9) + streamed_bytes / (rates_.link_gbps * 1e9) +
         rates_.gpu_latency_s + (streamed_bytes > 0 ? rates_.link_latency_s : 0);
}

double RooflineModel::cpu_attention_seconds(double resident_bytes, double band_bytes) const {
  return (resident_bytes > 0 ? resident_bytes / (rates_.cpu_attention_gbps * 1e9) : 0) +
         (band_bytes > 0 ? band_bytes / (rates_.cpu_streamed_attention_gbps * 1e9) : 0);
}

double RooflineModel::cpu_seconds(double resident_bytes, double band_bytes, double fmas_per_byte,
                                  double expert_seconds) const {
  if (resident_bytes <= 0 && band_bytes <= 0) return expert_seconds;
  const double memory = cpu_attention_seconds(resident_bytes, band_bytes);
  const double compute = rates_.cpu_fma_glanes > 0
                             ? (resident_bytes + band_bytes) * fmas_per_byte / (rates_.cpu_fma_glanes * 1e9)
                             : 0;
  return std::max(memory, compute) + rates_.cpu_latency_s + expert_seconds;
}

SplitPrediction RooflineModel::predict(const StepBytes& bytes, double cpu_movable_bytes, double fmas_per_byte,
                                       double expert_seconds) const {
  SplitPrediction p;
  p.cpu_movable_bytes = std::clamp(cpu_movable_bytes, 0.0, bytes.movable);
  if (!rates_.has_gpu) p.cpu_movable_bytes = bytes.movable;
  // Without a GPU the host also reads GpuResident's blocks, token-major like the band.
  const double cpu_band_bytes = p.cpu_movable_bytes + (rates_.has_gpu ? 0 : bytes.gpu_resident);
  p.gpu_seconds = rates_.has_gpu ? gpu_seconds(bytes.gpu_resident, bytes.movable - p.cpu_movable_bytes) : 0;
  p.cpu_seconds = cpu_seconds(bytes.cpu_resident, cpu_band_bytes, fmas_per_byte, expert_seconds);
  p.step_seconds = std::max(p.gpu_seconds, p.cpu_seconds);
  p.alpha = bytes.total() > 0 ? (bytes.cpu_resident + cpu_band_bytes) / bytes.total() : 0;
  return p;
}

SplitPrediction RooflineModel::best_split(const StepBytes& bytes, double fmas_per_byte,
                                          double expert_seconds) const {
  if (!rates_.has_gpu) return predict(bytes, bytes.movable, fmas_per_byte, expert_seconds);
  // cpu - gpu grows with the CPU's share: bisect for where they meet, then
  // keep the best of that point and the two ends (latencies make steps).
  double low = 0, high = bytes.movable;
  for (int i = 0; i < 100 && high - low > 1e-9 * (1 + bytes.movable); ++i) {
    const double mid = 0.5 * (low + high);
    const SplitPrediction p = predict(bytes, mid, fmas_per_byte, expert_seconds);
    (p.cpu_seconds < p.gpu_seconds ? low : high) = mid;
  }
  SplitPrediction best = predict(bytes, 0.5 * (low + high), fmas_per_byte, expert_seconds);
  for (double end : {0.0, bytes.movable}) {
    const SplitPrediction p = predict(bytes, end, fmas_per_byte, expert_seconds);
    if (p.step_seconds < best.step_seconds) best = p;
  }
  return best;
}

RateEstimator::RateEstimator(double initial, double weight, double outlier_ratio, int confirmations)
    : value_(initial), weight_(weight), outlier_ratio_(outlier_ratio), confirmations_(confirmations) {
  if (!(initial > 0) || !(weight > 0 && weight <= 1) || !(outlier_ratio > 1) || confirmations < 1)
    throw std::invalid_argument("RateEstimator: need initial > 0, 0 < weight <= 1, outlier_ratio > 1, confirmations >= 1");
}

void RateEstimator::observe(double rate) {
  if (!(rate > 0) || !std::isfinite(rate)) return;
  const int side = rate > value_ * outlier_ratio_ ? 1 : rate * outlier_ratio_ < value_ ? -1 : 0;
  if (side == 0) {
    pending_side_ = pending_count_ = 0;
    pending_sum_ = 0;
    value_ += weight_ * (rate - value_);
    return;
  }
  if (side != pending_side_) {
    pending_side_ = side;
    pending_count_ = 0;
    pending_sum_ = 0;
  }
  pending_sum_ += rate;
  if (++pending_count_ >= confirmations_) {
    value_ = pending_sum_ / pending_count_;
    pending_side_ = pending_count_ = 0;
    pending_sum_ = 0;
  }
}

}  // namespace writescope
