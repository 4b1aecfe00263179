#include "framework/results_store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "framework/files.hpp"
#include "framework/log.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

template <class T>
const H5::PredType& native_type() {
  if constexpr (std::is_same_v<T, double>) return H5::PredType::NATIVE_DOUBLE;
  else if constexpr (std::is_same_v<T, float>) return H5::PredType::NATIVE_FLOAT;
  else if constexpr (std::is_same_v<T, std::int32_t>) return H5::PredType::NATIVE_INT32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return H5::PredType::NATIVE_INT64;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return H5::PredType::NATIVE_UINT64;
  else static_assert(sizeof(T) == 0, "unsupported dataset element type");
}

const H5::StrType& string_type() {
  static const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  return type;
}

/// The system error (errno) under the last HDF5 failure of this thread.
thread_local int last_system_error = 0;

herr_t find_system_error(unsigned, const H5E_error2_t* error, void*) {
  // HDF5's file drivers record a failed system call as "..., errno = 28, error message = '...'".
  if (error->desc != nullptr)
    if (const char* at = std::strstr(error->desc, "errno = ")) last_system_error = std::atoi(at + 8);
  return 0;
}

/// HDF5 calls this when an API call fails, with the error stack still
/// intact (it is cleared by the next call, e.g. a destructor while the C++
/// exception unwinds); instead of printing the stack it keeps the errno.
herr_t record_system_error(hid_t stack, void*) {
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, find_system_error, nullptr);
  return 0;
}

void record_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, record_system_error, nullptr); }

/// What an HDF5 failure means: the system error underneath it (no space
/// left, file too large, permission denied) when there was one, else HDF5's message.
std::string hdf5_failure(const H5::Exception& e) {
  if (last_system_error != 0) return std::string(std::strerror(last_system_error)) + " (" + e.getDetailMsg() + ")";
  return e.getDetailMsg();
}

/// Runs `body`, turning HDF5's exceptions into one ResultsError with context.
template <class Body>
auto guarded(const std::string& context, Body&& body) -> decltype(body()) {
  last_system_error = 0;
  try {
    return body();
  } catch (const H5::Exception& e) {
    throw ResultsError(context + ": " + hdf5_failure(e));
  }
}


/// Syncs the folder `folder` (its entries: a rename into it); returns the
/// system's reason on failure, empty on success.
std::string sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  const int error = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return error == 0 ? std::string() : std::strerror(error);
}

/// Says, once per folder in this process, that commits into `folder` are
/// not synced: a file system without fsync for folders (some FUSE and
/// network ones: "Invalid argument") would otherwise say so on every run.
void warn_folder_not_synced(const std::string& folder, const std::string& file, const std::string& reason) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(folder).second) return;
  log_warn("results: ", folder, ": the folder cannot be synced (", reason, "): ", file,
           " holds what was committed, but a crash of the machine, not of this process, may bring back an "
           "earlier commit; said once per folder");
}

/// The bytes of the file at `path`; `error` gets the system's reason on failure.
std::string read_bytes(const std::string& path, std::string& error) {
  std::string bytes;
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    error = std::strerror(errno);
    return bytes;
  }
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(in, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) error = std::strerror(errno);
    if (got <= 0) break;
    bytes.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(in);
  return bytes;
}

/// Writes `bytes` to a new file `path` with permissions `mode` (none: as the
/// umask allows) and makes them durable; returns the system's reason on failure ("No space left on
/// device", "File too large"), empty on success.
std::string write_bytes(const std::string& path, const std::string& bytes, std::optional<mode_t> mode) {
  const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode ? 0600 : 0666);
  if (out < 0) return std::strerror(errno);
  int error = !mode || ::fchmod(out, *mode) == 0 ? 0 : errno;
  for (std::size_t written = 0; written < bytes.size() && error == 0;) {
    const ssize_t n = ::write(out, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno != EINTR) error = errno;
    if (n > 0) written += static_cast<std::size_t>(n);
  }
  if (error == 0 && ::fsync(out) != 0) error = errno;
  if (::close(out) != 0 && error == 0) error = errno;
  return error == 0 ? std::string() : std::strerror(error);
}

/// HDF5 file access through memory only (the core driver without a backing
/// store), starting from `image` when it is not empty.
class MemoryFileAccess {
 public:
  explicit MemoryFileAccess(const std::string& image) : id_(H5Pcreate(H5P_FILE_ACCESS)) {
    H5Pset_fapl_core(id_, std::size_t{1} << 20, 0);
    if (!image.empty()) H5Pset_file_image(id_, const_cast<char*>(image.data()), image.size());
  }
  ~MemoryFileAccess() { H5Pclose(id_); }
  MemoryFileAccess(const MemoryFileAccess&) = delete;
  MemoryFileAccess& operator=(const MemoryFileAccess&) = delete;
  hid_t id() const noexcept { return id_; }

 private:
  hid_t id_;
};

/// The file a results path names, checked for writing: a symbolic link's
/// target (so that the lock, the partial copy and the rename act on the real
/// file and the link stays a link), in a folder that exists, not a folder itself.
std::string writable_results_path(const std::string& path) {
  std::error_code error;
  fs::path real;
  try {
    real = followed_symlinks(path);
  } catch (const std::runtime_error& e) {
    throw ResultsError(e.what());
  }
  if (fs::is_directory(real, error))
    throw ResultsError(path + ": is a folder; give a results file name such as " + (fs::path(path) / "results.h5").string());
  const fs::path folder = fs::absolute(real, error).parent_path();
  if (!fs::is_directory(folder, error))
    throw ResultsError(path + ": the folder " + folder.string() + " does not exist");
  return real.string();
}

/// Property list that records link creation order, so that listings come back
/// in the order results were written.
class CreationOrderPlist {
 public:
  explicit CreationOrderPlist(hid_t plist_class) : id_(H5Pcreate(plist_class)) {
    H5Pset_link_creation_order(id_, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  }
  ~CreationOrderPlist() { H5Pclose(id_); }
  CreationOrderPlist(const CreationOrderPlist&) = delete;
  CreationOrderPlist& operator=(const CreationOrderPlist&) = delete;
  hid_t id() const noexcept { return id_; }

 private:
  hid_t id_;
};

H5::Group create_ordered_group(const H5::Group& parent, const std::string& name) {
  const CreationOrderPlist plist(H5P_GROUP_CREATE);
  const hid_t id = H5Gcreate2(parent.getId(), name.c_str(), H5P_DEFAULT, plist.id(), H5P_DEFAULT);
  if (id < 0) throw H5::GroupIException("H5Gcreate2", "cannot create group '" + name + "'");
  H5::Group group(id);  // takes its own reference
  H5Gclose(id);
  return group;
}

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

/// In creation order where the group tracks it (create_ordered_group), else
/// by name. One pass: iterating a damaged group again after a failure
/// crashed inside HDF5 (a double free).
std::vector<std::string> list_members(const H5::Group& group) {
  unsigned order_flags = 0;
  const hid_t plist = H5Gget_create_plist(group.getId());
  if (plist < 0 || H5Pget_link_creation_order(plist, &order_flags) < 0) order_flags = 0;
  if (plist >= 0) H5Pclose(plist);
  const H5_index_t by = (order_flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  hsize_t index = 0;
  if (H5Literate(group.getId(), by, H5_ITER_INC, &index, collect_name, &names) < 0)
    throw H5::GroupIException("H5Literate", "cannot list the group's members");
  return names;
}

// ----------------------------------------------------------------- checksums

/// CRC-32 (IEEE 802.3, reflected; zlib's crc32 and Python's zlib.crc32).
std::uint32_t crc32(std::uint32_t crc, const std::string& bytes) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (unsigned char b : bytes) crc = table[(crc ^ b) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

template <class T>
void append_le(std::string& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  out.append(raw, sizeof(T));
}

/// One attribute as the checksum sees it: kind 's' (string), 'i' (int64
/// values) or 'f' (float64 values), a uint64 count, the values little-endian.
std::string attribute_bytes(const H5::Attribute& attribute) {
  std::string out;
  const H5T_class_t kind = attribute.getTypeClass();
  if (kind == H5T_STRING) {
    std::string value;
    attribute.read(attribute.getStrType(), value);
    out += 's';
    append_le<std::uint64_t>(out, value.size());
    out += value;
    return out;
  }
  const auto n = static_cast<std::size_t>(attribute.getSpace().getSimpleExtentNpoints());
  if (kind == H5T_INTEGER) {
    std::vector<std::int64_t> values(n);
    attribute.read(H5::PredType::NATIVE_INT64, values.data());
    out += 'i';
    append_le<std::uint64_t>(out, n);
    for (auto v : values) append_le(out, v);
  } else {
    std::vector<double> values(n);
    attribute.read(H5::PredType::NATIVE_DOUBLE, values.data());
    out += 'f';
    append_le<std::uint64_t>(out, n);
    for (auto v : values) append_le(out, v);
  }
  return out;
}

/// One dataset: 'D', its element kind ('d' float64, 'f' float32, 'i' int32,
/// 'l' int64, 'u' uint64), a uint64 rank and dims, the values little-endian.
std::string dataset_bytes(const H5::DataSet& dataset) {
  const H5::DataSpace space = dataset.getSpace();
  std::vector<hsize_t> dims(static_cast<std::size_t>(space.getSimpleExtentNdims()));
  space.getSimpleExtentDims(dims.data());
  const auto n = static_cast<std::size_t>(space.getSimpleExtentNpoints());
  const H5T_class_t kind = dataset.getTypeClass();
  const std::size_t size = dataset.getDataType().getSize();
  std::string out = "D";
  char code = 'd';
  const H5::PredType* type = &H5::PredType::NATIVE_DOUBLE;
  if (kind == H5T_FLOAT && size == 4) code = 'f', type = &H5::PredType::NATIVE_FLOAT;
  if (kind == H5T_INTEGER) {
    const bool is_signed = dataset.getIntType().getSign() != H5T_SGN_NONE;
    if (size == 4) code = 'i', type = &H5::PredType::NATIVE_INT32;
    else if (is_signed) code = 'l', type = &H5::PredType::NATIVE_INT64;
    else code = 'u', type = &H5::PredType::NATIVE_UINT64;
  }
  out += code;
  append_le<std::uint64_t>(out, dims.size());
  for (hsize_t d : dims) append_le<std::uint64_t>(out, d);
  std::string values(n * type->getSize(), '\0');
  if (n > 0) dataset.read(values.data(), *type);
  return out + values;
}

/// (key, bytes) of every attribute and dataset under `group`: keys are
/// "path@attribute" and "path" relative to the checksummed group.
void checksum_items(const H5::Group& group, const std::string& prefix,
                    std::vector<std::pair<std::string, std::string>>& items) {
  for (int i = 0; i < group.getNumAttrs(); ++i) {
    const H5::Attribute attribute = group.openAttribute(static_cast<unsigned>(i));
    const std::string name = attribute.getName();
    if (prefix.empty() && name == "checksum") continue;
    items.emplace_back(prefix + "@" + name, attribute_bytes(attribute));
  }
  for (const std::string& name : list_members(group)) {
    if (group.childObjType(name) == H5O_TYPE_GROUP)
      checksum_items(group.openGroup(name), prefix + name + "/", items);
    else
      items.emplace_back(prefix + name, dataset_bytes(group.openDataSet(name)));
  }
}

std::string group_checksum(const H5::Group& group) {
  std::vector<std::pair<std::string, std::string>> items;
  checksum_items(group, "", items);
  std::sort(items.begin(), items.end());
  std::uint32_t crc = 0;
  for (const auto& [key, bytes] : items) crc = crc32(crc, key + '\0' + bytes);
  char text[16];
  std::snprintf(text, sizeof text, "%08x", crc);
  return std::string("crc32:") + text;
}

// ------------------------------------------------- damage that crashes HDF5

/// Where reading a file crashes the HDF5 library: libhdf5 1.10 (Debian 12)
/// copies some lengths of damaged metadata unchecked (a global heap object's,
/// a B-tree header's) and dies of a segmentation fault, which no error
/// handler sees. So a reader first reads every object of the file in a child
/// process, the way the readers do.
struct CrashScan {
  std::string file_level;            // a crash outside the root groups' members: where
  std::vector<std::string> objects;  // members of the root's groups ("/runs/<run>") that crash it
};

/// Seconds without progress after which the scan's child is stopped (the file is then not checked).
constexpr int scan_stall_seconds = 120;

/// Whether a child that died of `signal` crashed (rather than being stopped
/// from outside: the OOM killer's SIGKILL, a terminal's SIGINT).
bool is_crash(int signal) {
  return signal == SIGSEGV || signal == SIGBUS || signal == SIGABRT || signal == SIGFPE || signal == SIGILL;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV, a segmentation fault";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT, an abort";
    case SIGFPE: return "SIGFPE";
    default: return "SIGILL";
  }
}

void write_line(int fd, const std::string& text) {
  const std::string line = text + '\n';
  for (std::size_t written = 0; written < line.size();) {
    const ssize_t n = ::write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    written += static_cast<std::size_t>(n);
  }
}

/// The child's walk: names each object on `fd` before reading it, reads it
/// as checksums do, and says "done" at the end. HDF5 errors are left to the
/// real reader; only where the process dies matters.
void scan_in_child(const std::string& path, const std::set<std::string>& skip, int fd) {
  auto attempt = [](auto&& body) {
    try {
      body();
    } catch (...) {
    }
  };
  attempt([&] {
    write_line(fd, "/");
    const H5::H5File file(path, H5F_ACC_RDONLY);
    const H5::Group root = file.openGroup("/");
    for (int i = 0; i < root.getNumAttrs(); ++i) attempt([&] { attribute_bytes(root.openAttribute(static_cast<unsigned>(i))); });
    for (const std::string& name : list_members(root)) {
      const std::string top = "/" + name;
      write_line(fd, top);
      attempt([&] {
        if (root.childObjType(name) != H5O_TYPE_GROUP) {
          dataset_bytes(root.openDataSet(name));
          return;
        }
        const H5::Group group = root.openGroup(name);
        for (int i = 0; i < group.getNumAttrs(); ++i)
          attempt([&] { attribute_bytes(group.openAttribute(static_cast<unsigned>(i))); });
        for (const std::string& member : list_members(group)) {
          const std::string object = top + "/" + member;
          if (skip.count(object) != 0) continue;
          write_line(fd, object);
          attempt([&] {
            if (group.childObjType(member) == H5O_TYPE_GROUP) group_checksum(group.openGroup(member));
            else dataset_bytes(group.openDataSet(member));
          });
          write_line(fd, top);
        }
      });
    }
    write_line(fd, "/");  // closing the file: a crash there is the whole file's
  });
  write_line(fd, "done");
}

/// One child's walk skipping `skip`: "" when it finished (or could not
/// tell: it could not start, was stopped from outside or hung, which
/// `unchecked` then says), else the last object it named before it crashed
/// (with the signal in `why`).
std::string scan_once(const std::string& path, const std::set<std::string>& skip, std::string& why,
                      std::string& unchecked) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    unchecked = std::string("no pipe (") + std::strerror(errno) + ")";
    return "";
  }
  const pid_t child = ::fork();
  if (child < 0) {
    unchecked = std::string("no child process (") + std::strerror(errno) + ")";
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return "";
  }
  if (child == 0) {
    ::close(pipe_fds[0]);
    scan_in_child(path, skip, pipe_fds[1]);
    ::_exit(0);  // no destructors, atexit handlers or flushes of the parent's state
  }
  ::close(pipe_fds[1]);
  std::string received, last = "/";
  bool done = false, stalled = false;
  char buffer[4096];
  for (;;) {
    pollfd wait_for{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&wait_for, 1, scan_stall_seconds * 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      stalled = true;
      ::kill(child, SIGKILL);
      break;
    }
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    received.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t end; (end = received.find('\n')) != std::string::npos; received.erase(0, end + 1)) {
      const std::string line = received.substr(0, end);
      if (line == "done") done = true;
      else last = line;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (done) return "";
  if (!stalled && WIFSIGNALED(status) && is_crash(WTERMSIG(status))) {
    why = signal_name(WTERMSIG(status));
    return last;
  }
  unchecked = stalled ? "its reading stopped responding for " + std::to_string(scan_stall_seconds) + " s"
              : WIFSIGNALED(status) ? "its reading was stopped by signal " + std::to_string(WTERMSIG(status))
                                    : "its reading ended early";
  return "";
}

CrashScan scan_for_crashes(const std::string& path) {
  // At most this many crashing objects are looked for, one child each.
  constexpr std::size_t most_objects = 64;
  CrashScan scan;
  std::set<std::string> skip;
  for (;;) {
    std::string why, unchecked;
    const std::string at = scan_once(path, skip, why, unchecked);
    if (!unchecked.empty())
      log_warn("results: ", path, ": not checked for damage that crashes the HDF5 library (", unchecked,
               "); read as it is");
    if (at.empty()) return scan;
    const bool member = std::count(at.begin(), at.end(), '/') == 2;
    if (!member || skip.size() >= most_objects) {
      scan.file_level = (member ? "more than " + std::to_string(most_objects) + " objects, the last " : std::string()) +
                        (at == "/" ? std::string("its root group") : at) + " (" + why + ")";
      return scan;
    }
    skip.insert(at);
    scan.objects.push_back(at);
  }
}

/// scan_for_crashes, once per version of a file in a process: a commit
/// renames a new file over the old one (another inode), an edit changes its
/// size or modification time.
CrashScan cached_scan_for_crashes(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return scan_for_crashes(path);
  using Version = std::tuple<std::string, dev_t, ino_t, off_t, std::int64_t>;
  std::error_code ignored;
  const Version version{fs::absolute(path, ignored).string(), status.st_dev, status.st_ino, status.st_size,
                        std::int64_t{status.st_mtim.tv_sec} * 1'000'000'000 + status.st_mtim.tv_nsec};
  static std::mutex mutex;
  static std::map<Version, CrashScan> scans;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto found = scans.find(version); found != scans.end()) return found->second;
  }
  CrashScan scan = scan_for_crashes(path);
  const std::lock_guard<std::mutex> lock(mutex);
  return scans.emplace(version, std::move(scan)).first->second;
}

void require_hdf5(const std::string& path) {
  if (!guarded(path, [&] { return H5::H5File::isHdf5(path); }))
    throw ResultsError(path + ": exists but is not an HDF5 file; refusing to touch it");
}

template <class Object>
void replace_attribute(Object& object, const std::string& name, const H5::DataType& type,
                       const H5::DataSpace& space, const void* data) {
  if (object.attrExists(name)) object.removeAttr(name);
  H5::Attribute attribute = object.createAttribute(name, type, space);
  attribute.write(type, data);
}

}  // namespace

// ---------------------------------------------------------------- ResultsGroup

ResultsGroup::ResultsGroup(H5::Group group, std::string path, std::string file)
    : group_(std::move(group)), path_(std::move(path)), file_(std::move(file)) {}

std::string ResultsGroup::where(const std::string& name) const {
  return file_ + ": " + (path_ == "/" ? "/" + name : path_ + "/" + name);
}

bool ResultsGroup::has(const std::string& name) const {
  return guarded(where(name), [&] { return group_.nameExists(name); });
}

ResultsGroup ResultsGroup::create_group(const std::string& name) {
  if (has(name)) throw ResultsError(where(name) + ": already exists");
  return guarded(where(name), [&] {
    return ResultsGroup(create_ordered_group(group_, name), path_ == "/" ? "/" + name : path_ + "/" + name, file_);
  });
}

void ResultsGroup::remove(const std::string& name) {
  guarded(where(name), [&] { group_.unlink(name); });
}

void ResultsGroup::copy_group(const ResultsReader& from, const std::string& group_path, const std::string& name) {
  if (has(name)) throw ResultsError(where(name) + ": already exists");
  from.refuse_crashing(group_path, ResultsReader::Reads::subtree);
  guarded(where(name) + " (from " + from.path_ + ": " + group_path + ")", [&] {
    if (H5Ocopy(from.file_.getId(), group_path.c_str(), group_.getId(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0)
      throw H5::GroupIException("H5Ocopy", "cannot copy the group");
  });
}

ResultsGroup ResultsGroup::open_group(const std::string& name) {
  return guarded(where(name), [&] {
    return ResultsGroup(group_.openGroup(name), path_ == "/" ? "/" + name : path_ + "/" + name, file_);
  });
}

template <class T>
void ResultsGroup::write(const std::string& name, const std::vector<T>& values,
                         const std::vector<std::size_t>& shape) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(values.size());
  const auto count = std::accumulate(dims.begin(), dims.end(), hsize_t{1}, std::multiplies<>());
  if (count != values.size())
    throw ResultsError(where(name) + ": shape holds " + std::to_string(count) + " values but " +
                       std::to_string(values.size()) + " were given");
  guarded(where(name), [&] {
    H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
    H5::DataSet dataset = group_.createDataSet(name, native_type<T>(), space);
    if (!values.empty()) dataset.write(values.data(), native_type<T>());
  });
}

std::string ResultsGroup::checksum() const {
  return guarded(file_ + ": " + path_, [&] { return group_checksum(group_); });
}

template <class T>
void ResultsGroup::append(const std::string& name, const std::vector<T>& values, std::size_t row_length) {
  const int rank = row_length == 0 ? 1 : 2;
  if (rank == 2 && values.size() % row_length != 0)
    throw ResultsError(where(name) + ": " + std::to_string(values.size()) + " values are not whole rows of " +
                       std::to_string(row_length));
  guarded(where(name), [&] {
    H5::DataSet dataset;
    if (group_.nameExists(name)) {
      dataset = group_.openDataSet(name);
      if (dataset.getCreatePlist().getLayout() != H5D_CHUNKED)
        throw ResultsError(where(name) + ": was written whole (write()), not grown by append(); it cannot grow");
    } else {
      const hsize_t empty[2] = {0, row_length}, unlimited[2] = {H5S_UNLIMITED, row_length};
      const hsize_t chunk[2] = {rank == 1 ? hsize_t{1024} : hsize_t{1}, row_length};
      H5::DSetCreatPropList plist;
      plist.setChunk(rank, chunk);
      dataset = group_.createDataSet(name, native_type<T>(), H5::DataSpace(rank, empty, unlimited), plist);
    }
    H5::DataSpace file_space = dataset.getSpace();
    hsize_t dims[2] = {0, 0};
    const bool same_rank = file_space.getSimpleExtentNdims() == rank;
    if (same_rank) file_space.getSimpleExtentDims(dims);
    if (!same_rank || (rank == 2 && dims[1] != row_length) || !(dataset.getDataType() == native_type<T>()))
      throw ResultsError(where(name) + ": exists with another shape or type than rows of " + std::to_string(row_length));
    const hsize_t added[2] = {rank == 1 ? values.size() : values.size() / row_length, row_length};
    const hsize_t start[2] = {dims[0], 0};
    const hsize_t grown[2] = {dims[0] + added[0], row_length};
    dataset.extend(grown);
    file_space = dataset.getSpace();
    file_space.selectHyperslab(H5S_SELECT_SET, added, start);
    if (!values.empty()) dataset.write(values.data(), native_type<T>(), H5::DataSpace(rank, added), file_space);
  });
}

template void ResultsGroup::append(const std::string&, const std::vector<float>&, std::size_t);
template void ResultsGroup::append(const std::string&, const std::vector<std::int32_t>&, std::size_t);

bool ResultsGroup::has_attribute(const std::string& name) const {
  return guarded(where("@" + name), [&] { return group_.attrExists(name); });
}

void ResultsGroup::remove_attribute(const std::string& name) {
  guarded(where("@" + name), [&] { group_.removeAttr(name); });
}

void ResultsGroup::set_attribute(const std::string& name, const std::string& value) {
  guarded(where("@" + name), [&] {
    const char* text = value.c_str();
    replace_attribute(group_, name, string_type(), H5::DataSpace(H5S_SCALAR), &text);
  });
}

void ResultsGroup::set_attribute(const std::string& name, double value) {
  guarded(where("@" + name), [&] {
    replace_attribute(group_, name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR), &value);
  });
}

void ResultsGroup::set_attribute(const std::string& name, std::int64_t value) {
  guarded(where("@" + name), [&] {
    replace_attribute(group_, name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR), &value);
  });
}

void ResultsGroup::set_attribute(const std::string& name, const std::vector<double>& values) {
  guarded(where("@" + name), [&] {
    const hsize_t n = values.size();
    replace_attribute(group_, name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(1, &n), values.data());
  });
}

template void ResultsGroup::write(const std::string&, const std::vector<double>&, const std::vector<std::size_t>&);
template void ResultsGroup::write(const std::string&, const std::vector<float>&, const std::vector<std::size_t>&);
template void ResultsGroup::write(const std::string&, const std::vector<std::int32_t>&,
                                  const std::vector<std::size_t>&);
template void ResultsGroup::write(const std::string&, const std::vector<std::int64_t>&,
                                  const std::vector<std::size_t>&);
template void ResultsGroup::write(const std::string&, const std::vector<std::uint64_t>&,
                                  const std::vector<std::size_t>&);

// ---------------------------------------------------------- ResultsTransaction

ResultsTransaction::ResultsTransaction(std::string path, const std::string& image, std::optional<unsigned> mode)
    : path_(std::move(path)), partial_path_(path_ + ".partial"), mode_(mode) {
  // In memory: HDF5 never writes to the disk, so a full disk cannot leave its
  // state half-closed (closing such a file again crashes inside HDF5); commit()
  // writes the image itself.
  // A name of its own: without a file descriptor HDF5 matches open in-memory
  // files by name and would hand back a copy a lingering group still holds.
  static std::atomic<unsigned long> transactions{0};
  const std::string name = path_ + " (in memory, transaction " + std::to_string(++transactions) + ")";
  file_ = guarded(path_, [&] {
    const MemoryFileAccess access(image);
    hid_t id = -1;
    if (image.empty()) {
      const CreationOrderPlist creation(H5P_FILE_CREATE);
      id = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, creation.id(), access.id());
    } else {
      id = H5Fopen(name.c_str(), H5F_ACC_RDWR, access.id());
    }
    if (id < 0) throw H5::FileIException("H5Fopen", "cannot open the results file's copy in memory");
    auto file = std::make_unique<H5::H5File>(id);  // takes its own reference
    H5Fclose(id);
    return file;
  });
}

ResultsTransaction::ResultsTransaction(ResultsTransaction&& other) noexcept
    : path_(std::move(other.path_)),
      partial_path_(std::move(other.partial_path_)),
      mode_(other.mode_),
      file_(std::move(other.file_)),
      open_(std::move(other.open_)) {
  other.partial_path_.clear();
}

ResultsTransaction::~ResultsTransaction() {
  if (open_) *open_ = false;
  if (file_) {
    try {
      file_->close();
    } catch (const H5::Exception&) {
    }
  }
}

ResultsGroup ResultsTransaction::root() {
  if (!file_) throw ResultsError(path_ + ": transaction already committed or failed");
  return guarded(path_, [&] { return ResultsGroup(file_->openGroup("/"), "/", path_); });
}

void ResultsTransaction::commit() {
  if (!file_) throw ResultsError(path_ + ": transaction already committed or failed");
  const std::string image = guarded(path_, [&] {
    file_->flush(H5F_SCOPE_GLOBAL);
    const ssize_t size = H5Fget_file_image(file_->getId(), nullptr, 0);
    std::string bytes(size > 0 ? static_cast<std::size_t>(size) : 0, '\0');
    if (size < 0 || H5Fget_file_image(file_->getId(), bytes.data(), bytes.size()) != size)
      throw H5::FileIException("H5Fget_file_image", "cannot take the image of the results file");
    file_->close();
    file_.reset();
    return bytes;
  });
  if (const std::string error = write_bytes(partial_path_, image, mode_); !error.empty()) {
    std::error_code ignored;
    fs::remove(partial_path_, ignored);
    throw ResultsError(partial_path_ + ": cannot write the committed copy: " + error);
  }
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    std::error_code ignored;
    fs::remove(partial_path_, ignored);
    throw ResultsError(path_ + ": cannot replace with the committed copy: " + std::strerror(error));
  }
  if (open_) *open_ = false;  // committed: the store may begin the next
  open_.reset();
  // Committed: the rename made the new file the one every reader opens, so a
  // folder that cannot be synced is said, not thrown (the caller would take
  // the run it holds as not written).
  const std::string parent = fs::absolute(fs::path(path_)).parent_path().string();
  if (const std::string error = sync_folder(parent); !error.empty()) warn_folder_not_synced(parent, path_, error);
}

// ---------------------------------------------------------------- ResultsStore

ResultsStore::ResultsStore(std::string path) : path_(writable_results_path(path)) {
  record_hdf5_errors();
  const std::string lock_path = path_ + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw ResultsError(lock_path + ": cannot create the lock file: " + std::strerror(errno));
  // results_file_being_written looks by taking a shared lock for a moment: a
  // writer that starts in that moment waits it out (100 ms) before refusing.
  for (int waited_ms = 0; ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0; ++waited_ms) {
    if (errno != EWOULDBLOCK || waited_ms == 100) {
      ::close(lock_fd_);
      throw ResultsError(path_ + ": another process is writing this results file (" + lock_path + " is locked)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  try {
    if (fs::exists(path_)) {
      ResultsReader{path_};  // an HDF5 file that opens
    } else {
      ResultsTransaction(path_, std::string(), std::nullopt).commit();
    }
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

bool results_file_being_written(const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return false;
  const int fd = ::open((writable_results_path(path) + ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // never written by a ResultsStore, or not readable: no writer to wait for
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

ResultsStore::~ResultsStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

// The store's own file lists its groups without a scan per call (one per run
// of a resumed experiment): a reader of its runs scans it.
std::vector<std::string> ResultsStore::groups() const { return ResultsReader(path_, false).list("/"); }

bool ResultsStore::contains(const std::string& group) const {
  return ResultsReader(path_, false).exists("/" + group);
}

ResultsTransaction ResultsStore::begin() {
  std::string error;
  const std::string image = read_bytes(path_, error);
  struct stat status {};
  if (error.empty() && ::stat(path_.c_str(), &status) != 0) error = std::strerror(errno);
  if (!error.empty()) throw ResultsError(path_ + ": cannot read the results file: " + error);
  return opened(ResultsTransaction(path_, image, static_cast<unsigned>(status.st_mode & 07777)));
}

ResultsTransaction ResultsStore::begin_replacement() {
  struct stat status {};
  if (::stat(path_.c_str(), &status) != 0)
    throw ResultsError(path_ + ": cannot read the results file: " + std::strerror(errno));
  return opened(ResultsTransaction(path_, std::string(), static_cast<unsigned>(status.st_mode & 07777)));
}

ResultsTransaction ResultsStore::opened(ResultsTransaction transaction) {
  if (*transaction_open_)
    throw ResultsError(path_ + ": a transaction of this results file is open; commit or drop it before the next "
                               "(its commit would replace the file without the other's writes)");
  *transaction_open_ = true;
  transaction.open_ = transaction_open_;
  return transaction;
}

// --------------------------------------------------------------- ResultsReader

ResultsReader::ResultsReader(const std::string& path) : ResultsReader(path, true) {}

ResultsReader::ResultsReader(const std::string& path, bool scan) : path_(path) {
  record_hdf5_errors();
  if (!fs::exists(path_)) throw ResultsError(path_ + ": no such results file");
  if (fs::is_directory(path_)) throw ResultsError(path_ + ": is a folder, not a results file");
  require_hdf5(path_);
  const CrashScan found = scan ? cached_scan_for_crashes(path_) : CrashScan{};
  if (!found.file_level.empty())
    throw ResultsError(path_ + ": is damaged so that the HDF5 library crashes reading " + found.file_level +
                       "; nothing in it can be read safely");
  crashing_ = found.objects;
  try {
    file_ = H5::H5File(path_, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    throw ResultsError(path_ + ": has an HDF5 signature but does not open (" + hdf5_failure(e) +
                       "): the file is truncated or damaged");
  }
}

namespace {
/// Whether `object_path` lies inside `object` (a member of it, at any depth).
bool lies_inside(const std::string& object_path, const std::string& object) {
  return object_path.size() > object.size() && object_path.compare(0, object.size(), object) == 0 &&
         object_path[object.size()] == '/';
}
}  // namespace

bool ResultsReader::crashes_reading(const std::string& object_path) const {
  return std::any_of(crashing_.begin(), crashing_.end(), [&](const std::string& object) {
    return object_path == object || lies_inside(object_path, object);
  });
}

void ResultsReader::refuse_crashing(const std::string& object_path, Reads reads) const {
  for (const std::string& object : crashing_) {
    const bool refused =
        lies_inside(object_path, object) || (reads != Reads::link && object_path == object) ||
        (reads == Reads::subtree && (object_path == "/" || lies_inside(object, object_path)));
    if (refused)
      throw ResultsError(path_ + ": " + object + ": is damaged so that the HDF5 library crashes reading it; it "
                         "cannot be read");
  }
}

bool ResultsReader::exists(const std::string& object_path) const {
  if (object_path == "/") return true;
  refuse_crashing(object_path, Reads::link);
  // Each prefix must exist before H5Lexists may be asked about the next one.
  std::size_t end = 0;
  do {
    end = object_path.find('/', end + 1);
    const std::string prefix = object_path.substr(0, end);
    if (H5Lexists(file_.getId(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  } while (end != std::string::npos);
  return true;
}

bool ResultsReader::has_attribute(const std::string& object_path, const std::string& name) const {
  refuse_crashing(object_path, Reads::object);
  return guarded(path_ + ": " + object_path + "@" + name, [&] {
    const htri_t found = H5Aexists_by_name(file_.getId(), object_path.c_str(), name.c_str(), H5P_DEFAULT);
    if (found < 0) throw H5::AttributeIException("H5Aexists_by_name", "cannot read the object's attributes");
    return found > 0;
  });
}

bool ResultsReader::holds_nothing() const {
  return guarded(path_ + ": /", [&] { return file_.openGroup("/").getNumAttrs() == 0; }) && list("/").empty();
}

std::vector<std::string> ResultsReader::list(const std::string& group_path) const {
  refuse_crashing(group_path, Reads::object);
  return guarded(path_ + ": " + group_path, [&] { return list_members(file_.openGroup(group_path)); });
}

std::vector<std::size_t> ResultsReader::shape(const std::string& dataset_path) const {
  refuse_crashing(dataset_path, Reads::object);
  return guarded(path_ + ": " + dataset_path, [&] {
    const H5::DataSpace space = file_.openDataSet(dataset_path).getSpace();
    std::vector<hsize_t> dims(static_cast<std::size_t>(space.getSimpleExtentNdims()));
    space.getSimpleExtentDims(dims.data());
    return std::vector<std::size_t>(dims.begin(), dims.end());
  });
}

template <class T>
std::vector<T> ResultsReader::read(const std::string& dataset_path) const {
  refuse_crashing(dataset_path, Reads::object);
  return guarded(path_ + ": " + dataset_path, [&] {
    const H5::DataSet dataset = file_.openDataSet(dataset_path);
    std::vector<T> values(static_cast<std::size_t>(dataset.getSpace().getSimpleExtentNpoints()));
    if (!values.empty()) dataset.read(values.data(), native_type<T>());
    return values;
  });
}

template std::vector<double> ResultsReader::read(const std::string&) const;
template std::vector<float> ResultsReader::read(const std::string&) const;
template std::vector<std::int32_t> ResultsReader::read(const std::string&) const;
template std::vector<std::int64_t> ResultsReader::read(const std::string&) const;
template std::vector<std::uint64_t> ResultsReader::read(const std::string&) const;

std::string ResultsReader::checksum(const std::string& group_path) const {
  refuse_crashing(group_path, Reads::subtree);
  return guarded(path_ + ": " + group_path, [&] { return group_checksum(file_.openGroup(group_path)); });
}

H5::Attribute ResultsReader::attribute(const std::string& object_path, const std::string& name) const {
  refuse_crashing(object_path, Reads::object);
  const std::string context = path_ + ": " + object_path + "@" + name;
  return guarded(context, [&] {
    if (object_path == "/" || file_.childObjType(object_path) == H5O_TYPE_GROUP)
      return file_.openGroup(object_path).openAttribute(name);
    return file_.openDataSet(object_path).openAttribute(name);
  });
}

std::string ResultsReader::string_attribute(const std::string& object_path, const std::string& name) const {
  const H5::Attribute attr = attribute(object_path, name);
  return guarded(path_ + ": " + object_path + "@" + name, [&] {
    std::string value;
    attr.read(attr.getStrType(), value);
    return value;
  });
}

double ResultsReader::double_attribute(const std::string& object_path, const std::string& name) const {
  const H5::Attribute attr = attribute(object_path, name);
  double value = 0;
  guarded(path_ + ": " + object_path + "@" + name, [&] { attr.read(H5::PredType::NATIVE_DOUBLE, &value); });
  return value;
}

std::int64_t ResultsReader::int_attribute(const std::string& object_path, const std::string& name) const {
  const H5::Attribute attr = attribute(object_path, name);
  std::int64_t value = 0;
  guarded(path_ + ": " + object_path + "@" + name, [&] { attr.read(H5::PredType::NATIVE_INT64, &value); });
  return value;
}

std::vector<double> ResultsReader::doubles_attribute(const std::string& object_path, const std::string& name) const {
  const H5::Attribute attr = attribute(object_path, name);
  return guarded(path_ + ": " + object_path + "@" + name, [&] {
    std::vector<double> values(static_cast<std::size_t>(attr.getSpace().getSimpleExtentNpoints()));
    if (!values.empty()) attr.read(H5::PredType::NATIVE_DOUBLE, values.data());
    return values;
  });
}

std::string group_name(std::string text) {
  std::replace_if(text.begin(), text.end(), [](char ch) { return ch == '/' || ch == '.'; }, '_');
  return text;
}

}  // namespace writescope
