#include "framework/host_memory.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace writescope {

namespace {
constexpr std::uintptr_t huge_page = std::uintptr_t{2} << 20;
}  // namespace

std::string transparent_huge_pages() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");  // "always [madvise] never"
  std::string line;
  if (!std::getline(file, line)) return "unavailable";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

void advise_huge_pages(const void* data, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  static const bool advisable = [] {
    const std::string mode = transparent_huge_pages();
    return mode == "always" || mode == "madvise";
  }();
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (start + huge_page - 1) / huge_page * huge_page;
  const std::uintptr_t last = (start + bytes) / huge_page * huge_page;
  if (!advisable || last <= first) return;
  // Failure (e.g. a kernel without THP for this mapping) leaves small pages: still correct.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

bool huge_pages_advised(const void* data, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (start + huge_page - 1) / huge_page * huge_page;
  if (first + huge_page > start + bytes) return false;
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
