#include "experiments/impl/descriptor_output.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>

#include "scratch_dir.hpp"

namespace writescope {
namespace {

/// Text longer than the buffer, so that writes happen before the flush.
std::string long_text() {
  std::string text;
  for (int line = 0; text.size() < 3 * (std::size_t{1} << 16); ++line) text += "line " + std::to_string(line) + "\n";
  return text;
}

TEST(DescriptorOutput, WritesEverythingInOrder) {
  const test::ScratchDir dir("descriptor_output");
  const std::string path = (dir.path() / "out.txt").string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const std::string text = long_text();
  {
    impl::DescriptorOutput buffer(fd);
    std::ostream out(&buffer);
    out << text.substr(0, 100);
    for (char c : text.substr(100, 1000)) out.put(c);
    out << text.substr(1100);
    EXPECT_TRUE(out.flush());
    EXPECT_EQ(buffer.first_error(), 0);
  }
  ::close(fd);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), text);
}

/// Output stdio still holds for standard output (Kokkos prints its warnings
/// with printf) goes before what the buffer writes after it.
TEST(DescriptorOutput, StdioOutputBeforeItStaysFirst) {
  const test::ScratchDir dir("descriptor_output");
  const std::string path = (dir.path() / "stdout.txt").string();
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(saved, 0);
  ASSERT_GE(file, 0);
  ASSERT_EQ(::dup2(file, STDOUT_FILENO), STDOUT_FILENO);
  std::printf("from stdio, ");  // no line end: stdio keeps it, line-buffered or not
  {
    impl::DescriptorOutput buffer(STDOUT_FILENO);
    std::ostream out(&buffer);
    out << "from the buffer\n" << std::flush;
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "from stdio, from the buffer\n");
}

/// On a terminal each line shows when it is complete, as stdio's line
/// buffering showed it; the rest waits for the line's end or a flush.
TEST(DescriptorOutput, ATerminalGetsEachLineWhenItEnds) {
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (terminal < 0 || ::grantpt(terminal) != 0 || ::unlockpt(terminal) != 0) GTEST_SKIP() << "no pseudo-terminal here";
  const int fd = ::open(::ptsname(terminal), O_WRONLY | O_NOCTTY);
  ASSERT_GE(fd, 0);
  // What the terminal shows within a moment (its line discipline ends lines with \r\n).
  auto shown = [&] {
    std::string text;
    pollfd ready{terminal, POLLIN, 0};
    char chunk[256];
    while (::poll(&ready, 1, 200) > 0) {
      const ssize_t n = ::read(terminal, chunk, sizeof chunk);
      if (n <= 0) break;
      text.append(chunk, static_cast<std::size_t>(n));
    }
    return text;
  };
  impl::DescriptorOutput buffer(fd);
  std::ostream out(&buffer);
  out << "first line\nsecond";
  EXPECT_EQ(shown(), "first line\r\n");
  out << " line" << '\n';
  EXPECT_EQ(shown(), "second line\r\n");
  out << "third" << std::flush;
  EXPECT_EQ(shown(), "third");
  ::close(fd);
  ::close(terminal);
}

/// The first failed write's reason outlives errno: the command line reads it
/// at its final flush, long after (info > /dev/full lost it once info's text
/// passed stdio's buffer).
TEST(DescriptorOutput, KeepsTheReasonItsFirstWriteFailed) {
  const int fd = ::open("/dev/full", O_WRONLY);
  if (fd < 0) GTEST_SKIP() << "no /dev/full here";
  impl::DescriptorOutput buffer(fd);
  std::ostream out(&buffer);
  out << long_text();
  EXPECT_FALSE(out);
  EXPECT_EQ(buffer.first_error(), ENOSPC);
  errno = 0;
  out.clear();
  EXPECT_TRUE(out.flush());  // what a failed write left is dropped, not written again
  // A later failure for another reason (the descriptor now read-only) leaves the first one's.
  const int read_only = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(read_only, 0);
  ASSERT_EQ(::dup2(read_only, fd), fd);
  ::close(read_only);
  out << "more";
  EXPECT_FALSE(out.flush());
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(buffer.first_error(), ENOSPC);
  ::close(fd);
}

}  // namespace
}  // namespace writescope
