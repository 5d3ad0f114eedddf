// CPU priority of the calling thread (contract in threads.hpp).
#include "loongforge/common/threads.hpp"

#include <pthread.h>       // pthread_setname_np
#include <sys/resource.h>  // getpriority, setpriority
#include <sys/syscall.h>   // SYS_gettid
#include <unistd.h>        // syscall, getpid

#include <algorithm>  // std::min, std::max
#include <cerrno>     // errno
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

}  // namespace loongforge
