#include "framework/host_memory.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>

#include <unistd.h>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace writescope {

namespace {

constexpr std::uintptr_t huge_page = std::uintptr_t{2} << 20;

/// The start of the first whole huge page at or after `address`.
std::uintptr_t first_whole_huge_page(const void* address) {
  return (reinterpret_cast<std::uintptr_t>(address) + huge_page - 1) / huge_page * huge_page;
}

}  // namespace

std::int64_t last_level_cache_bytes() {
  const long bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return bytes > 0 ? bytes : std::int64_t{32} << 20;
}

std::string transparent_huge_pages() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");  // "always [madvise] never"
  std::string line;
  if (!std::getline(file, line)) return "unavailable";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

bool huge_pages_advisable() {
  static const bool advisable = [] {
    const std::string mode = transparent_huge_pages();
    return mode == "always" || mode == "madvise";
  }();
  return advisable;
}

void advise_huge_pages(const void* data, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  const std::uintptr_t first = first_whole_huge_page(data);
  const std::uintptr_t last = (reinterpret_cast<std::uintptr_t>(data) + bytes) / huge_page * huge_page;
  if (!huge_pages_advisable() || last <= first) return;
  // Failure (e.g. a kernel without THP for this mapping) leaves small pages: still correct.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

bool huge_pages_advised(const void* data, std::size_t bytes) {
  const std::uintptr_t first = first_whole_huge_page(data);
  if (first + huge_page > reinterpret_cast<std::uintptr_t>(data) + bytes) return false;
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    // Mapping headers start "start-end perms ...", in hexadecimal.
    std::uintptr_t from = 0, to = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> from >> dash >> to && dash == '-') {
      inside = from <= first && first < to;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      std::istringstream flags(line.substr(8));
      std::string flag;
      while (flags >> flag)
        if (flag == "hg") return true;
      return false;
    }
  }
  return false;
}

}  // namespace writescope
