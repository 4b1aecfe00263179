#include "framework/results_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

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

/// Runs `body`, turning HDF5's exceptions into one ResultsError with context.
template <class Body>
auto guarded(const std::string& context, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const H5::Exception& e) {
    throw ResultsError(context + ": " + e.getDetailMsg());
  }
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw ResultsError(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw ResultsError(path + ": fsync failed: " + std::strerror(errno));
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

std::vector<std::string> list_members(const H5::Group& group) {
  std::vector<std::string> names;
  hsize_t index = 0;
  if (H5Literate(group.getId(), H5_INDEX_CRT_ORDER, H5_ITER_INC, &index, collect_name, &names) < 0) {
    names.clear();
    index = 0;
    H5Literate(group.getId(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_name, &names);
  }
  return names;
}

void require_hdf5(const std::string& path) {
  if (!H5::H5File::isHdf5(path))
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

ResultsTransaction::ResultsTransaction(std::string path, std::string partial_path)
    : path_(std::move(path)), partial_path_(std::move(partial_path)) {
  file_ = guarded(partial_path_, [&] { return std::make_unique<H5::H5File>(partial_path_, H5F_ACC_RDWR); });
}

ResultsTransaction::ResultsTransaction(ResultsTransaction&& other) noexcept
    : path_(std::move(other.path_)), partial_path_(std::move(other.partial_path_)), file_(std::move(other.file_)) {}

ResultsTransaction::~ResultsTransaction() {
  if (!file_) return;
  try {
    file_->close();
  } catch (const H5::Exception&) {
  }
  std::error_code ignored;
  fs::remove(partial_path_, ignored);
}

ResultsGroup ResultsTransaction::root() {
  if (!file_) throw ResultsError(path_ + ": transaction already committed");
  return guarded(path_, [&] { return ResultsGroup(file_->openGroup("/"), "/", path_); });
}

void ResultsTransaction::commit() {
  if (!file_) throw ResultsError(path_ + ": transaction already committed");
  guarded(partial_path_, [&] {
    file_->flush(H5F_SCOPE_GLOBAL);
    file_->close();
  });
  file_.reset();
  fsync_path(partial_path_, O_RDONLY);
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0)
    throw ResultsError(path_ + ": cannot replace with the committed copy: " + std::strerror(errno));
  const fs::path parent = fs::absolute(fs::path(path_)).parent_path();
  fsync_path(parent.string(), O_RDONLY | O_DIRECTORY);
}

// ---------------------------------------------------------------- ResultsStore

ResultsStore::ResultsStore(std::string path) : path_(std::move(path)) {
  H5::Exception::dontPrint();
  const std::string lock_path = path_ + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw ResultsError(lock_path + ": cannot create the lock file: " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    throw ResultsError(path_ + ": another process is writing this results file (" + lock_path + " is locked)");
  }
  try {
    if (fs::exists(path_)) {
      require_hdf5(path_);
    } else {
      const std::string partial = path_ + ".partial";
      guarded(partial, [&] {
        const CreationOrderPlist plist(H5P_FILE_CREATE);
        const hid_t id = H5Fcreate(partial.c_str(), H5F_ACC_TRUNC, plist.id(), H5P_DEFAULT);
        if (id < 0) throw H5::FileIException("H5Fcreate", "cannot create the file");
        H5Fclose(id);
      });
      ResultsTransaction(path_, partial).commit();
    }
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

ResultsStore::~ResultsStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::vector<std::string> ResultsStore::groups() const { return ResultsReader(path_).list("/"); }

bool ResultsStore::contains(const std::string& group) const { return ResultsReader(path_).exists("/" + group); }

ResultsTransaction ResultsStore::begin() {
  const std::string partial = path_ + ".partial";
  std::error_code error;
  fs::copy_file(path_, partial, fs::copy_options::overwrite_existing, error);
  if (error) throw ResultsError(partial + ": cannot copy the results file: " + error.message());
  return ResultsTransaction(path_, partial);
}

// --------------------------------------------------------------- ResultsReader

ResultsReader::ResultsReader(const std::string& path) : path_(path) {
  H5::Exception::dontPrint();
  if (!fs::exists(path_)) throw ResultsError(path_ + ": no such results file");
  require_hdf5(path_);
  file_ = guarded(path_, [&] { return H5::H5File(path_, H5F_ACC_RDONLY); });
}

bool ResultsReader::exists(const std::string& object_path) const {
  if (object_path == "/") return true;
  // Each prefix must exist before H5Lexists may be asked about the next one.
  std::size_t end = 0;
  do {
    end = object_path.find('/', end + 1);
    const std::string prefix = object_path.substr(0, end);
    if (H5Lexists(file_.getId(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  } while (end != std::string::npos);
  return true;
}

std::vector<std::string> ResultsReader::list(const std::string& group_path) const {
  return guarded(path_ + ": " + group_path, [&] { return list_members(file_.openGroup(group_path)); });
}

std::vector<std::size_t> ResultsReader::shape(const std::string& dataset_path) const {
  return guarded(path_ + ": " + dataset_path, [&] {
    const H5::DataSpace space = file_.openDataSet(dataset_path).getSpace();
    std::vector<hsize_t> dims(static_cast<std::size_t>(space.getSimpleExtentNdims()));
    space.getSimpleExtentDims(dims.data());
    return std::vector<std::size_t>(dims.begin(), dims.end());
  });
}

template <class T>
std::vector<T> ResultsReader::read(const std::string& dataset_path) const {
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

H5::Attribute ResultsReader::attribute(const std::string& object_path, const std::string& name) const {
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

}  // namespace writescope
