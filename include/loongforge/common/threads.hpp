// loongforge/common/threads.hpp — the CPU priority of LoongForge's threads.
//
// Contract:
//  - lower_thread_priority(by) sets the calling thread's Linux nice value to
//    the process's (its main thread's) + `by`, at most 19, unless the thread
//    is already nicer (it never raises a thread's priority). Nice values are
//    per thread on Linux and inherited by threads it starts, hence the
//    process's as the base. Returns false when the kernel refuses (a thread
//    at normal priority still works).
//  - set_thread_name(name) names the calling thread (Linux, at most 15
//    characters kept): "lf-ckpt-writer"/"lf-ckpt-file" for the checkpoint
//    writer, "lf-data-produce"/"lf-data-decode" for ADFE, so top -H, a
//    debugger and the tests can tell them apart.
//  - The order a busy core is given in: the trainer thread (the process's
//    nice), then the data path (ADFE's producer and decode threads,
//    kDataThreadNice), then the checkpoint writer and its file workers
//    (kCheckpointThreadNice), so a checkpoint being hashed and written never
//    takes a core from the data path (issue #12 item 6). Threads are not
//    pinned.
//  - ThreadUsage::now() samples what the calling thread has cost so far: its
//    CPU time (user + system), its major page faults (pages it touched that
//    the kernel had to read from storage: a mapped library's code, a file
//    not in the page cache) and the bytes the whole process has read from
//    storage (/proc/self/io read_bytes; -1 where the kernel does not say).
//    Differences of two samples attribute a span of wall time: CPU-bound,
//    waiting on storage, or neither (waiting on a device or another thread).
#pragma once

#include <cstdint>

namespace loongforge {

constexpr int kDataThreadNice = 5;        // ADFE's threads: this much nicer than the process
constexpr int kCheckpointThreadNice = 10;  // the checkpoint writer's threads: nicer than the data path

bool lower_thread_priority(int by);
void set_thread_name(const char* name);

struct ThreadUsage {
  double cpu_s = 0;                  // this thread's user + system time
  int64_t major_faults = 0;          // this thread's page faults served from storage
  int64_t storage_read_bytes = -1;   // the process's bytes read from storage; -1: unknown
  static ThreadUsage now();
  ThreadUsage operator-(const ThreadUsage& since) const;
  ThreadUsage operator+(const ThreadUsage& more) const;  // two spans' usage together (a phase in two parts)
};

}  // namespace loongforge
