// A writer killed at arbitrary moments must leave every committed group intact
// and the file readable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
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

/// Child process: commits groups of `values` doubles into `path` with files
/// limited to `file_limit` bytes, as on a filesystem that fills up (small
/// groups fail when the commit flushes, large ones when they are written);
/// exits 0 when the
/// store reported the failure as one ResultsError naming the cause and the
/// file (the message goes to `message_path`), 4 for any other outcome.
[[noreturn]] void write_until_full(const std::string& path, rlim_t file_limit, std::size_t values,
                                   const std::string& message_path) {
  signal(SIGXFSZ, SIG_IGN);  // writes past the limit fail with EFBIG instead of killing the process
  const rlimit limit{file_limit, file_limit};
  setrlimit(RLIMIT_FSIZE, &limit);
  try {
    ResultsStore store(path);
    for (auto index = static_cast<std::int64_t>(store.groups().size());; ++index) {
      auto txn = store.begin();
      auto group = txn.root().create_group("run_" + std::to_string(index));
      group.set_attribute("index", std::int64_t{index});
      auto written = group_values(static_cast<int>(index));
      written.resize(values);
      group.write("values", written);
      txn.commit();
    }
  } catch (const ResultsError& e) {
    std::FILE* out = std::fopen(message_path.c_str(), "w");
    std::fputs(e.what(), out);
    std::fclose(out);
    _exit(0);  // a forked child of a threaded process: no exit handlers (the parent's threads are not here)
  } catch (...) {
    _exit(4);
  }
}

// A full filesystem during a commit is one clear error, not a crash: the
// committed runs stay intact and no partial copy is left behind.
TEST(ResultsStoreKill, AFullFilesystemIsOneErrorAndKeepsCommittedGroups) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_full_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "results.h5").string(), message_path = (dir / "message.txt").string();
  {
    ResultsStore store(path);
    auto txn = store.begin();
    auto group = txn.root().create_group("run_0");
    group.set_attribute("index", std::int64_t{0});
    group.write("values", group_values(0));
    txn.commit();
  }
  // Room beyond the committed file for nothing (the copy fails), a part of a
  // group or a few groups, at several points of a write.
  const std::pair<long, std::size_t> cases[] = {{-1000, 4},     {1000, values_per_group}, {400'000, values_per_group},
                                                {5'000'000, values_per_group}, {1000, 4}, {20'000, 4}};
  // Each group's length as written (by the case that committed it), not as stored.
  std::map<std::string, std::size_t> written_values{{"run_0", group_values(0).size()}};
  for (const auto& [room, values] : cases) {
    const auto limit = static_cast<rlim_t>(static_cast<long>(fs::file_size(path)) + room);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) write_until_full(path, limit, values, message_path);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the writer crashed (signal " << WTERMSIG(status) << ") at room " << room;
    ASSERT_EQ(WEXITSTATUS(status), 0) << "the writer did not report one ResultsError at room " << room;
    std::ifstream in(message_path);
    const std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("File too large"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(path + ".partial")) << "room " << room << ": " << message;
    ResultsReader reader(path);
    for (const auto& name : reader.list("/")) {
      const std::int64_t index = reader.int_attribute("/" + name, "index");
      EXPECT_EQ(name, "run_" + std::to_string(index));
      auto expected = group_values(static_cast<int>(index));
      expected.resize(written_values.emplace(name, values).first->second);
      EXPECT_EQ(reader.read<double>("/" + name + "/values"), expected) << name;
    }
    EXPECT_TRUE(reader.exists("/run_0"));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace writescope
