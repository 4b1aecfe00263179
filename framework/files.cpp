#include "framework/files.hpp"

#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace writescope {

namespace fs = std::filesystem;

std::string followed_symlinks(const std::string& path) {
  std::error_code error;
  fs::path real = path;
  for (int links = 0; fs::is_symlink(real, error); ++links) {
    const fs::path target = fs::read_symlink(real, error);
    if (error || links == 40) throw std::runtime_error(path + ": cannot resolve the symbolic link");
    real = target.is_absolute() ? target : real.parent_path() / target;
  }
  return real.string();
}

std::string not_a_file_reason(const std::string& path) {
  if (!path.empty() && path.back() == '/') return "ends in '/', as a folder does";
  std::string real;
  try {
    real = followed_symlinks(path);
  } catch (const std::runtime_error&) {
    return "is a symbolic link that cannot be resolved (a loop, or more than 40 links)";
  }
  std::error_code error;
  const fs::file_status status = fs::status(real, error);
  switch (status.type()) {
    case fs::file_type::not_found:
    case fs::file_type::none:
    case fs::file_type::regular: return "";
    case fs::file_type::directory: return "is a folder";
    case fs::file_type::character:
    case fs::file_type::block: return "is a device, not a file";
    case fs::file_type::fifo: return "is a pipe, not a file";
    case fs::file_type::socket: return "is a socket, not a file";
    default: return "is not a regular file";
  }
}

}  // namespace writescope
