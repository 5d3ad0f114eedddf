// CPU priority of the calling thread (contract in threads.hpp).
#include "loongforge/common/threads.hpp"

#include <pthread.h>       // pthread_setname_np
#include <sys/resource.h>  // getpriority, setpriority
#include <sys/syscall.h>   // SYS_gettid
#include <unistd.h>        // syscall, getpid

#include <algorithm>  // std::min, std::max
#include <cerrno>     // errno
#include <fstream>    // std::ifstream
#include <string>     // std::string

namespace loongforge {

bool lower_thread_priority(int by) {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int process = getpriority(PRIO_PROCESS, static_cast<id_t>(getpid()));  // the main thread's
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return false;
  const int want = std::max(now, std::min(19, process + std::max(0, by)));
  return want == now || setpriority(PRIO_PROCESS, tid, want) == 0;
}

void set_thread_name(const char* name) {
  const std::string kept = std::string(name).substr(0, 15);  // the kernel's limit (16 with the NUL)
  pthread_setname_np(pthread_self(), kept.c_str());
}

ThreadUsage ThreadUsage::now() {
  ThreadUsage u;
  rusage r{};
  if (getrusage(RUSAGE_THREAD, &r) == 0) {
    u.cpu_s = static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
              static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
    u.major_faults = r.ru_majflt;
  }
  std::ifstream io("/proc/self/io");  // "read_bytes: N" (absent without task I/O accounting)
  for (std::string key; io >> key;) {
    int64_t value = 0;
    if (!(io >> value)) break;
    if (key == "read_bytes:") {
      u.storage_read_bytes = value;
      break;
    }
  }
  return u;
}

ThreadUsage ThreadUsage::operator-(const ThreadUsage& since) const {
  ThreadUsage d;
  d.cpu_s = cpu_s - since.cpu_s;
  d.major_faults = major_faults - since.major_faults;
  d.storage_read_bytes =
      storage_read_bytes >= 0 && since.storage_read_bytes >= 0 ? storage_read_bytes - since.storage_read_bytes : -1;
  return d;
}

ThreadUsage ThreadUsage::operator+(const ThreadUsage& more) const {
  ThreadUsage t;
  t.cpu_s = cpu_s + more.cpu_s;
  t.major_faults = major_faults + more.major_faults;
  t.storage_read_bytes =
      storage_read_bytes >= 0 && more.storage_read_bytes >= 0 ? storage_read_bytes + more.storage_read_bytes : -1;
  return t;
}

}  // namespace loongforge
