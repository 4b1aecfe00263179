#pragma once
// Paths of the files WriteScope writes.

#include <string>

namespace writescope {

/// The file `path` names at the end of its chain of symbolic links (the last
/// target need not exist), so that a file written through a link leaves the
/// link a link. Throws std::runtime_error naming `path` for a loop or a link
/// that cannot be read.
std::string followed_symlinks(const std::string& path);

/// Why `path` cannot take a regular file written over it, or "" where it can:
/// it ends in '/', or it names (through its links) a folder, a device, a pipe
/// or a socket, which a rename would replace and a read could wait on forever,
/// or a link that cannot be resolved.
std::string not_a_file_reason(const std::string& path);

}  // namespace writescope
