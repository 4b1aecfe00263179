// Preloaded (LD_PRELOAD) by ctest's framework.results_commit_folder_not_synced:
// fsync of a folder fails with EINVAL, as on file systems without fsync for
// folders (some FUSE and network ones); every other fsync is the C library's.
#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>

extern "C" int fsync(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) == 0 && S_ISDIR(status.st_mode)) {
    errno = EINVAL;
    return -1;
  }
  using Fsync = int (*)(int);
  static const Fsync library_fsync = reinterpret_cast<Fsync>(::dlsym(RTLD_NEXT, "fsync"));
  return library_fsync(fd);
}
