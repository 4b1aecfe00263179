#include "framework/concurrent.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace writescope {
namespace {

TEST(RunConcurrently, RunsBothAtTheSameTime) {
  // Each side waits for the other to start: this only finishes if they overlap.
  std::atomic<int> started{0};
  auto side = [&] {
    ++started;
    while (started.load() < 2) std::this_thread::yield();
  };
  run_concurrently(side, side);
  EXPECT_EQ(started.load(), 2);
}

TEST(RunConcurrently, RethrowsAfterBothFinished) {
  std::atomic<bool> here_done{false}, thread_done{false};
  EXPECT_THROW(run_concurrently([] { throw std::runtime_error("thread"); }, [&] { here_done = true; }),
               std::runtime_error);
  EXPECT_TRUE(here_done);
  try {
    run_concurrently([&] { thread_done = true; }, [] { throw std::invalid_argument("here"); });
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "here");
  }
  EXPECT_TRUE(thread_done);
}

}  // namespace
}  // namespace writescope
