// POSIX file-system helpers (Note [No std::filesystem] in files.hpp).
#include "loongforge/common/files.hpp"

#include <fcntl.h>     // open
#include <ftw.h>       // nftw
#include <sys/stat.h>     // stat, mkdir
#include <sys/syscall.h>  // SYS_renameat2
#include <unistd.h>    // rmdir, unlink, fsync, truncate, syscall

#include <cerrno>   // errno
#include <cstdio>   // std::rename
#include <cstring>  // std::strerror

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)  // linux/fs.h; glibc < 2.28 lacks it (and the renameat2 wrapper)
#endif

#include "loongforge/common/error.hpp"

namespace loongforge {

namespace {
[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error("cannot " + what + " '" + path + "': " + std::strerror(errno));
}

void copy_file(const std::string& from, const std::string& to, mode_t mode) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail("read", from);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode | S_IWUSR);
  if (out < 0) {
    ::close(in);
    fail("create", to);
  }
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(in, buf, sizeof(buf))) > 0) {
    if (::write(out, buf, static_cast<size_t>(n)) != n) {
      ::close(in);
      ::close(out);
      fail("write", to);
    }
  }
  ::close(in);
  ::close(out);
}
}  // namespace

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && !is_directory(cur) && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        fail("create directory", cur);
    }
    if (i < path.size()) cur += path[i];
  }
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) fail("remove", path);
    return;
  }
  const auto remove_one = [](const char* p, const struct stat*, int type, struct FTW*) {
    return (type == FTW_DP ? ::rmdir(p) : ::unlink(p)) == 0 ? 0 : -1;
  };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) fail("remove", path);
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) fail("rename to '" + to + "'", from);
}

bool exchange_paths(const std::string& a, const std::string& b) {
#ifdef SYS_renameat2
  // The raw system call: glibc gained a renameat2() wrapper only in 2.28.
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) return false;
  fail("exchange with '" + b + "'", a);
#else
  return false;
#endif
}

void copy_tree(const std::string& from, const std::string& to) {
  struct stat st {};
  if (::stat(from.c_str(), &st) != 0) fail("read", from);
  if (!S_ISDIR(st.st_mode)) return copy_file(from, to, st.st_mode & 0777);
  make_dirs(to);
  // nftw visits parents before children (no FTW_DEPTH): directories first.
  static thread_local const std::string* src_root = nullptr;
  static thread_local const std::string* dst_root = nullptr;
  src_root = &from;
  dst_root = &to;
  const auto copy_one = [](const char* p, const struct stat* s, int type, struct FTW*) {
    const std::string dst = *dst_root + (p + src_root->size());
    if (type == FTW_D) return (is_directory(dst) || ::mkdir(dst.c_str(), 0755) == 0) ? 0 : -1;
    if (type == FTW_F) {
      try {  // never unwind through nftw's C frames
        copy_file(p, dst, s->st_mode & 0777);
      } catch (...) {
        return -1;
      }
    }
    return 0;
  };
  if (::nftw(from.c_str(), copy_one, 16, FTW_PHYS) != 0) fail("copy", from);
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync directory", path);
}

void resize_file(const std::string& path, long long bytes) {
  if (::truncate(path.c_str(), static_cast<off_t>(bytes)) != 0) fail("resize", path);
}

}  // namespace loongforge
