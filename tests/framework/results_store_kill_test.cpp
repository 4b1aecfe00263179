// A writer killed at arbitrary moments must leave every committed group intact
// and the file readable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <numeric>
#include <thread>

#include "framework/results_store.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t values_per_group = 200'000;  // 1.6 MB: commits take a while

std::vector<double> group_values(int index) {
  std::vector<double> values(values_per_group);
  std::iota(values.begin(), values.end(), static_cast<double>(index));
  return values;
}

/// Child process: commits group after group until killed.
[[noreturn]] void write_forever(const std::string& path, int first_index) {
  try {
    ResultsStore store(path);
    for (int index = first_index;; ++index) {
      auto txn = store.begin();
      auto group = txn.root().create_group("run_" + std::to_string(index));
      group.set_attribute("index", std::int64_t{index});
      group.write("values", group_values(index));
      group.set_attribute("complete", std::int64_t{1});
      txn.commit();
    }
  } catch (...) {
    _exit(3);
  }
}

TEST(ResultsStoreKill, KilledWriterLeavesCommittedGroupsIntact) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_kill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "results.h5").string();
  { ResultsStore created(path); }  // an empty committed file; the lock is released again

  int next_index = 0;
  // Kill at different points of the write/commit cycle.
  for (const int delay_ms : {5, 17, 40, 73, 120, 9, 31}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) write_forever(path, next_index);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited on its own, status " << status;

    // The file opens and every committed group is complete and correct.
    ResultsReader reader(path);
    const auto groups = reader.list("/");
    ASSERT_GE(static_cast<int>(groups.size()), next_index) << "committed groups were lost";
    for (const auto& name : groups) {
      const std::int64_t index = reader.int_attribute("/" + name, "index");
      EXPECT_EQ(name, "run_" + std::to_string(index));
      EXPECT_EQ(reader.int_attribute("/" + name, "complete"), 1);
      EXPECT_EQ(reader.read<double>("/" + name + "/values"), group_values(static_cast<int>(index))) << name;
    }
    next_index = static_cast<int>(groups.size());
  }
  // A new writer takes over where the killed ones stopped.
  ResultsStore store(path);
  auto txn = store.begin();
  txn.root().create_group("after_kills");
  txn.commit();
  EXPECT_EQ(store.groups().back(), "after_kills");
  EXPECT_EQ(static_cast<int>(store.groups().size()), next_index + 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace writescope
