#include "experiments/cli.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <sstream>

#include "attention/decode.hpp"
#include "attention/host_prefetch.hpp"
#include "framework/cpu_path.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace {

/// `info --format yaml` for scripts: one YAML document that holds the
/// machine's fields and, per shape and CPU region, the path its decode
/// product takes and why, as the text format prints them.
TEST(InfoTest, YamlSaysWhereEachDecodeProductRuns) {
  std::ostringstream out;
  ASSERT_EQ(info_command({"--format", "yaml"}, out), 0);
  const YAML::Node info = YAML::Load(out.str());
  EXPECT_EQ(info["cpu_path"].as<std::string>(), cpu_path_name(active_cpu_path()));
  EXPECT_EQ(info["spaces"]["gpu_execution_space"].as<std::string>(), std::string(GpuExecSpace::name()));
  EXPECT_EQ(info["spaces"]["host_memory_space"].as<std::string>(), std::string(HostMemSpace::name()));
  for (const AttentionShape& shape : supported_attention_shapes()) {
    const YAML::Node entry = info["cpu_decode"][shape.name];
    ASSERT_TRUE(entry.IsMap()) << shape.name << " missing from:\n" << out.str();
    for (Region region : {Region::cpu_resident, Region::cpu_streamed}) {
      const BlockOrder order = block_order(region);
      const YAML::Node product = entry[region_name(region)];
      ASSERT_TRUE(product.IsMap()) << shape.name << " " << region_name(region);
      const std::string path = product["path"].as<std::string>();
      EXPECT_EQ(path, cpu_path_name(decode_product_path(shape, order))) << shape.name << " " << region_name(region);
      EXPECT_TRUE(cpu_path_supported(parse_cpu_path(path))) << path;
      EXPECT_EQ(product["chosen"].as<std::string>(), describe_decode_cpu_path(shape, order));
    }
    EXPECT_EQ(entry["next_pass_prefetch"].as<std::string>(), describe_next_pass_prefetch(shape));
    EXPECT_EQ(entry["token_major_pass"].as<std::string>(), describe_token_major_pass(shape));
  }
  const std::string amx = info["amx_bf16"].as<std::string>();
  EXPECT_EQ(amx, cpu_path_supported(CpuPath::amx_bf16) ? "offered" : "not offered: " + amx_bf16_unavailable_reason());
}

}  // namespace
}  // namespace writescope
