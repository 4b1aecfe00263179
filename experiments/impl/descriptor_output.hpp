#pragma once
// The command line's standard output: a stream buffer over a file descriptor
// that keeps the reason its first write failed. Through std::cout that reason
// is lost: a write that fails in the middle of a command sets only the stream's
// state, and errno has moved on by the time the command line checks its
// output (`info > /dev/full` said "could not be written" with no reason once
// info's text passed stdio's 4 KiB buffer, on an AVX-512 machine).

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <streambuf>

namespace writescope::impl {

class DescriptorOutput : public std::streambuf {
 public:
  /// Writes to `fd` (not closed here); line by line where it is a terminal.
  explicit DescriptorOutput(int fd) : fd_(fd), by_line_(::isatty(fd) == 1) { restart(); }
  ~DescriptorOutput() override { drain(); }
  DescriptorOutput(const DescriptorOutput&) = delete;
  DescriptorOutput& operator=(const DescriptorOutput&) = delete;

  /// errno of the first write that failed (EIO for one that wrote nothing);
  /// 0 while none has.
  int first_error() const { return first_error_; }

 protected:
  /// Every character of a terminal's output comes here (its put area looks
  /// full), so that a line's end drains it.
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    if (pptr() == buffer_.data() + buffer_.size() && !drain()) return traits_type::eof();
    const auto used = pptr() - pbase();
    buffer_[static_cast<std::size_t>(used)] = traits_type::to_char_type(c);
    setp(buffer_.data(), by_line_ ? buffer_.data() + used + 1 : buffer_.data() + buffer_.size());
    pbump(static_cast<int>(used + 1));
    if (by_line_ && traits_type::to_char_type(c) == '\n' && !drain()) return traits_type::eof();
    return c;
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  void restart() { setp(buffer_.data(), by_line_ ? buffer_.data() : buffer_.data() + buffer_.size()); }
  /// Writes what is buffered; false where a write failed (what it left is dropped).
  bool drain() {
    // What stdio holds for the same descriptor goes first, as when both went
    // through stdio's buffer (Kokkos prints its warnings with printf).
    if (pbase() < pptr() && fd_ == ::fileno(stdout)) std::fflush(stdout);
    for (const char* p = pbase(); p < pptr();) {
      const ssize_t written = ::write(fd_, p, static_cast<std::size_t>(pptr() - p));
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        if (first_error_ == 0) first_error_ = written < 0 ? errno : EIO;
        restart();
        return false;
      }
      p += written;
    }
    restart();
    return true;
  }

  int fd_;
  bool by_line_;
  int first_error_ = 0;
  std::array<char, 1 << 16> buffer_{};
};

}  // namespace writescope::impl
