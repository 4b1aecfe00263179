#pragma once
// An empty directory for the running test: TempDir()/writescope_<kind>_<pid>_<test name>,
// created with the object and removed with it, so tests that run at the same
// time (ctest -j, one gtest per process) never share files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace writescope::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& kind)
      : path_(std::filesystem::path(::testing::TempDir()) /
              ("writescope_" + kind + "_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace writescope::test
