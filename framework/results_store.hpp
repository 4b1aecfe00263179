#pragma once
// HDF5 results store that a killed run can never corrupt.
//
// Writes are copy-on-write transactions: begin() reads the committed file into
// memory, all writes go to that copy, and commit() writes it to
// "<path>.partial", fsyncs it and atomically renames it over "<path>". A
// transaction holds the whole file in memory (two to three copies while it
// starts or commits): results files are small; logits files grow with steps x vocab. A process killed at any moment leaves
// "<path>" exactly as the last commit left it; a transaction that is dropped
// without commit() changes nothing. An exclusive lock ("<path>.lock") keeps a
// second writer out with a clear error instead of a corrupted file.

#include <H5Cpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace writescope {

class ResultsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `text` as the name of a group: HDF5 names hold no '/' and here no '.', both become '_'.
std::string group_name(std::string text);

/// A group inside an open transaction. Datasets are row-major with the given
/// shape (empty shape: one dimension of values.size()).
class ResultsReader;

class ResultsGroup {
 public:
  /// Creates a subgroup; it must not exist yet.
  ResultsGroup create_group(const std::string& name);
  /// Opens an existing subgroup.
  ResultsGroup open_group(const std::string& name);
  bool has(const std::string& name) const;
  /// Removes a subgroup or dataset.
  void remove(const std::string& name);
  /// Copies group `group_path` of a committed file, with everything in it, here as `name`.
  void copy_group(const ResultsReader& from, const std::string& group_path, const std::string& name);

  template <class T>
  void write(const std::string& name, const std::vector<T>& values, const std::vector<std::size_t>& shape = {});

  /// Appends to an extendible dataset, creating it on first use: rows of
  /// `row_length` values (shape (rows, row_length)), or single values (shape
  /// (n,)) when row_length is 0. For results that arrive step by step.
  template <class T>
  void append(const std::string& name, const std::vector<T>& values, std::size_t row_length = 0);

  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, const char* value) { set_attribute(name, std::string(value)); }
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, std::int64_t value);
  void set_attribute(const std::string& name, const std::vector<double>& values);
  bool has_attribute(const std::string& name) const;
  void remove_attribute(const std::string& name);

  const std::string& path() const noexcept { return path_; }

  /// Checksum of everything in this group (attributes other than its own
  /// "checksum", datasets, subgroups): "crc32:" and 8 hex digits over a
  /// canonical serialisation that analysis/report.py repeats (results_checksum).
  std::string checksum() const;

 private:
  friend class ResultsTransaction;
  ResultsGroup(H5::Group group, std::string path, std::string file);
  std::string where(const std::string& name) const;
  H5::Group group_;
  std::string path_;
  std::string file_;
};

class ResultsTransaction {
 public:
  ResultsTransaction(ResultsTransaction&&) noexcept;
  ResultsTransaction& operator=(ResultsTransaction&&) = delete;
  ~ResultsTransaction();

  ResultsGroup root();
  /// Makes every write of this transaction durable and visible at once.
  /// Throws ResultsError where the file is left as it was; a folder that
  /// cannot be synced after the file is replaced is a warning (log_warn),
  /// once per folder: the commit is visible, only its survival of a machine
  /// crash is not assured.
  void commit();

 private:
  friend class ResultsStore;
  /// An in-memory copy of `image` (an empty image: a new file); commit()
  /// writes it to the file with permissions `mode` (none: as the umask allows).
  ResultsTransaction(std::string path, const std::string& image, std::optional<unsigned> mode);
  std::string path_, partial_path_;
  std::optional<unsigned> mode_;
  std::unique_ptr<H5::H5File> file_;
  std::shared_ptr<bool> open_;  // its store's "a transaction is open", cleared when it commits or ends
};

/// Owner of one results file for writing. Holds the file's lock while alive.
class ResultsStore {
 public:
  /// Creates the file (empty, committed) if it does not exist. Throws
  /// ResultsError if another process holds the lock or the file is not HDF5.
  explicit ResultsStore(std::string path);
  ~ResultsStore();
  ResultsStore(const ResultsStore&) = delete;
  ResultsStore& operator=(const ResultsStore&) = delete;

  const std::string& path() const noexcept { return path_; }
  /// Names of the committed top-level groups.
  std::vector<std::string> groups() const;
  bool contains(const std::string& group) const;
  /// Starts a transaction on a copy of the committed file. One at a time:
  /// ResultsError while another of this store is open (its commit would
  /// replace the file without the other's writes).
  ResultsTransaction begin();
  /// Starts a transaction on an empty file: its commit replaces the whole
  /// file, which keeps what it held until then. One at a time, as begin().
  ResultsTransaction begin_replacement();

 private:
  /// `transaction`, marked as this store's open one; ResultsError if one is.
  ResultsTransaction opened(ResultsTransaction transaction);
  std::string path_;
  int lock_fd_ = -1;
  std::shared_ptr<bool> transaction_open_ = std::make_shared<bool>(false);
};

/// Whether a ResultsStore (of this process or another) holds the lock of
/// the results file `path` names, i.e. the file is being written.
bool results_file_being_written(const std::string& path);

/// Read-only access to a committed results file. Damage the HDF5 library
/// would crash on is found when the file is opened (crashes_reading).
class ResultsReader {
 public:
  explicit ResultsReader(const std::string& path);
  const std::string& path() const noexcept { return path_; }

  bool exists(const std::string& object_path) const;
  bool has_attribute(const std::string& object_path, const std::string& name) const;
  /// Whether the file's root has no attributes and no members: one a writer
  /// created and stopped before its first commit, which any writer may take
  /// over (another program's file holds at least an attribute).
  bool holds_nothing() const;
  /// Member names of a group ("/" for the root), in creation order.
  std::vector<std::string> list(const std::string& group_path) const;
  std::vector<std::size_t> shape(const std::string& dataset_path) const;
  template <class T>
  std::vector<T> read(const std::string& dataset_path) const;

  std::string string_attribute(const std::string& object_path, const std::string& name) const;
  double double_attribute(const std::string& object_path, const std::string& name) const;
  std::int64_t int_attribute(const std::string& object_path, const std::string& name) const;
  std::vector<double> doubles_attribute(const std::string& object_path, const std::string& name) const;
  /// ResultsGroup::checksum of a committed group, computed from what is in the
  /// file now; ResultsError when the group cannot be read at all.
  std::string checksum(const std::string& group_path) const;
  /// Whether `object_path` is, or lies inside, a member of one of the root's
  /// groups (a run, "/runs/<run>") that is damaged so that reading it crashes
  /// the HDF5 library; the constructor finds them by reading the whole file
  /// in a child process, and every read of them is a ResultsError instead.
  /// (Damage that crashes it outside such members makes the constructor throw.)
  bool crashes_reading(const std::string& object_path) const;

 private:
  friend class ResultsGroup;  // copy_group reads the file
  friend class ResultsStore;  // lists the groups of the file it wrote, unscanned
  /// Opens `path` without the scan (`scan` false): only to list the groups of a file this process committed.
  ResultsReader(const std::string& path, bool scan);
  H5::Attribute attribute(const std::string& object_path, const std::string& name) const;
  /// What a read of an object takes in: the link naming it (in its group),
  /// the object itself, or it and everything under it.
  enum class Reads { link, object, subtree };
  /// ResultsError where the read touches a crashing object.
  void refuse_crashing(const std::string& object_path, Reads reads) const;
  std::string path_;
  std::vector<std::string> crashing_;
  H5::H5File file_;
};

}  // namespace writescope
