#include "framework/files.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "scratch_dir.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

// A file written through a chain of links lands at its end; a loop is an error naming the path.
TEST(Files, FollowedSymlinksEndsAtTheLastTarget) {
  const test::ScratchDir dir("files");
  const fs::path target = dir.path() / "sub" / "target.yaml";
  fs::create_directories(target.parent_path());
  fs::create_symlink("sub/target.yaml", dir.path() / "first");
  fs::create_symlink(dir.path() / "first", dir.path() / "second");
  EXPECT_EQ(fs::path(followed_symlinks((dir.path() / "second").string())), target);
  EXPECT_EQ(followed_symlinks((dir.path() / "plain").string()), (dir.path() / "plain").string());
  fs::create_symlink("loop_b", dir.path() / "loop_a");
  fs::create_symlink("loop_a", dir.path() / "loop_b");
  try {
    followed_symlinks((dir.path() / "loop_a").string());
    ADD_FAILURE() << "a loop of links was followed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("loop_a: cannot resolve the symbolic link"), std::string::npos) << e.what();
  }
}

// Each kind of path a file cannot be written over is named; a file, a missing
// name and a link to either can take one.
TEST(Files, NotAFileReasonNamesWhatThePathIs) {
  const test::ScratchDir dir("files");
  const std::string base = dir.path().string();
  std::ofstream(base + "/file") << "x";
  fs::create_symlink("file", base + "/link_to_file");
  fs::create_symlink("missing", base + "/link_to_missing");
  ASSERT_EQ(::mkfifo((base + "/pipe").c_str(), 0600), 0);
  fs::create_symlink("pipe", base + "/link_to_pipe");
  fs::create_symlink("loop_b", base + "/loop_a");
  fs::create_symlink("loop_a", base + "/loop_b");
  EXPECT_EQ(not_a_file_reason(base + "/file"), "");
  EXPECT_EQ(not_a_file_reason(base + "/missing"), "");
  EXPECT_EQ(not_a_file_reason(base + "/link_to_file"), "");
  EXPECT_EQ(not_a_file_reason(base + "/link_to_missing"), "");
  EXPECT_EQ(not_a_file_reason(base + "/out/"), "ends in '/', as a folder does");
  EXPECT_EQ(not_a_file_reason(base), "is a folder");
  EXPECT_EQ(not_a_file_reason(base + "/pipe"), "is a pipe, not a file");
  EXPECT_EQ(not_a_file_reason(base + "/link_to_pipe"), "is a pipe, not a file");
  EXPECT_EQ(not_a_file_reason("/dev/null"), "is a device, not a file");
  EXPECT_EQ(not_a_file_reason(base + "/loop_a"),
            "is a symbolic link that cannot be resolved (a loop, or more than 40 links)");
}

}  // namespace
}  // namespace writescope
