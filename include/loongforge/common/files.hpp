// loongforge/common/files.hpp — the file-system operations LoongForge needs,
// on plain POSIX calls.
//
// Note [No std::filesystem]: libtorch.so (the PyPI wheel) exports its own
// copy of libstdc++'s std::filesystem symbols; the dynamic linker binds our
// calls to them, and std::filesystem::remove_all then jumps to address 0
// (seen with torch 2.11.0). Nothing in LoongForge uses std::filesystem; use
// these helpers instead.
//
// Contract: every function throws loongforge::Error naming the path and the
// OS error, except path_exists (never throws) and exchange_paths (returns
// false where the kernel or file system cannot exchange).
#pragma once

#include <string>  // std::string

namespace loongforge {

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
void make_dirs(const std::string& path);                           // mkdir -p
void remove_tree(const std::string& path);                         // rm -rf (no error if absent)
void rename_path(const std::string& from, const std::string& to);  // atomic within a file system
// Swaps two existing paths in one atomic step (Linux renameat2 with
// RENAME_EXCHANGE): at every moment each name holds one of the two. Returns
// false, changing nothing, where the kernel or the file system does not
// support it (EINVAL, ENOSYS, EOPNOTSUPP); other failures throw.
bool exchange_paths(const std::string& a, const std::string& b);
void copy_tree(const std::string& from, const std::string& to);    // cp -r (files, directories)
void fsync_directory(const std::string& path);
void resize_file(const std::string& path, long long bytes);

}  // namespace loongforge
