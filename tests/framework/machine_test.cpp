#include "framework/machine.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "framework/cpu_path.hpp"
#include "framework/results_store.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace {

TEST(Machine, DetectsTheRunningMachine) {
  const auto m = MachineDescription::detect();
  EXPECT_EQ(m.logical_cpus, sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(m.host_threads, HostExecSpace().concurrency());
  EXPECT_GT(m.memory_bytes, std::int64_t{1} << 28);
  EXPECT_EQ(m.kokkos_version, "3.4.1");
  EXPECT_NE(m.enabled_exec_spaces.find(HostExecSpace::name()), std::string::npos);
  EXPECT_NE(m.kokkos_configuration.find("Kokkos"), std::string::npos);
  EXPECT_FALSE(m.git_revision.empty());
  EXPECT_FALSE(m.compiler.empty());
  EXPECT_EQ(m.gpu_name.empty(), !has_gpu);
  // AMX in CPUID but the path refused: the record says why.
  const std::string amx = amx_description();
  if (amx == "not in CPUID" || cpu_path_supported(CpuPath::amx_bf16))
    EXPECT_EQ(m.amx, amx);
  else
    EXPECT_EQ(m.amx, amx + "; amx_bf16 not offered: " + amx_bf16_unavailable_reason());
}

TEST(Machine, StoresEveryFieldAsAnAttribute) {
  const auto m = MachineDescription::detect();
  const std::string path = ::testing::TempDir() + "writescope_machine_" + std::to_string(::getpid()) + ".h5";
  {
    ResultsStore store(path);
    auto txn = store.begin();
    auto group = txn.root().create_group("machine");
    m.store(group);
    txn.commit();
  }
  ResultsReader reader(path);
  for (const auto& [name, value] : m.fields()) {
    if (const auto* text = std::get_if<std::string>(&value))
      EXPECT_EQ(reader.string_attribute("/machine", name), *text) << name;
    else
      EXPECT_EQ(reader.int_attribute("/machine", name), std::get<std::int64_t>(value)) << name;
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
}

}  // namespace
}  // namespace writescope
