// The compiled step's package cache (package_cache.hpp): the key, the lookup,
// the lock, and the compile as a subprocess of scripts/compile_step.py.
#include "loongforge/fusion/package_cache.hpp"

#include <fcntl.h>     // open, O_*
#include <poll.h>      // poll
#include <sys/file.h>  // flock
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execvpe, pipe2, readlink, environ

#include <cerrno>    // errno
#include <chrono>    // std::chrono
#include <cstdio>    // std::snprintf
#include <cstdlib>   // std::getenv, setenv
#include <cstring>   // std::strerror
#include <deque>     // std::deque
#include <fstream>   // std::ifstream, std::ofstream
#include <optional>  // std::optional
#include <thread>    // std::this_thread::sleep_for

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>  // AOTIModelPackageLoader
#include <torch/version.h>                                         // TORCH_VERSION
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>  // at::cuda::getDeviceProperties
#endif

#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"

namespace loongforge::fusion {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kFormat = 1;             // of the key: bump when its fields change meaning
constexpr double kQuietReportS = 30;   // a silent compile still reports this often
constexpr size_t kLogTailLines = 20;   // of a failed compile, in its error

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_s(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f s", s);
  return text;
}

// The file descriptor of an entry's lock, held (flock LOCK_EX) until destruction.
class EntryLock {
 public:
  explicit EntryLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw ConfigError("trainer.compile_cache: cannot open the lock file " + path + ": " +
                                   std::strerror(errno) + " (make the directory writable or set trainer.compile_cache)");
  }
  bool try_lock() { return flock(fd_, LOCK_EX | LOCK_NB) == 0; }
  ~EntryLock() {
    flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

 private:
  int fd_;
};

// The package's manifest; throws what libtorch or the JSON parser throws.
nlohmann::json manifest_of(const std::string& path) {
  const auto meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
  const auto it = meta.find("loongforge");
  return it == meta.end() ? nlohmann::json(nullptr) : nlohmann::json::parse(it->second);
}

// Dimension `dim` of batch tensor `key` in a package's manifest; -1 when absent.
int64_t batch_dim_of(const nlohmann::json& m, const char* key, size_t dim) {
  if (m.is_object())
    for (const auto& e : m.value("batch", nlohmann::json::array()))
      if (e.at(0) == key && e.at(2).size() > dim) return e.at(2).at(dim).get<int64_t>();
  return -1;
}

// The actions' dimension `dim` in a package's manifest (0: micro-batch, 1: action horizon); -1 when absent.
int64_t actions_dim_of(const nlohmann::json& m, size_t dim) { return batch_dim_of(m, "actions", dim); }

// Why the package at `path` cannot serve `key` ("" when it can): its manifest is read back (an unreadable or
// truncated file fails here) and compared field by field.
std::string entry_problem(const std::string& path, const PackageKey& key) {
  nlohmann::json m;
  try {
    m = manifest_of(path);
  } catch (const std::exception& e) {
    return "it cannot be read (" + short_libtorch_message(e.what()) + ")";
  }
  if (!m.is_object()) return "it has no LoongForge manifest";
  std::string torch_version = m.value("torch", "");
  torch_version = torch_version.substr(0, torch_version.find('+'));
  const int64_t micro = actions_dim_of(m, 0), horizon = actions_dim_of(m, 1);
  if (m.value("model_hash", "") != key.architecture_hash) return "its manifest names another model architecture";
  if (!key.code_hash.empty() && m.value("model_code", "") != key.code_hash)
    return "its manifest names other model code";
  if (m.value("device", "") != key.device || m.value("precision", "") != key.precision)
    return "its manifest names another device or precision";
  if (torch_version != key.torch_version) return "it was compiled with torch " + torch_version;
  if (m.value("trainable", std::vector<std::string>{}) != key.trainable)
    return "its manifest lists other trainable parameters";
  if (micro != key.micro_batch) return "it was compiled for micro-batch " + std::to_string(micro);
  if (horizon != key.action_horizon) return "it was compiled for action horizon " + std::to_string(horizon);
  if (const int64_t width = batch_dim_of(m, "text_tokens", 1); width != key.text_width)
    return "it was compiled for a text slot of " + std::to_string(width) + " tokens";
  return "";
}

// The last compile of the same model on the same kind of device, from the directory's history.
std::optional<double> estimate_s(const std::string& dir, const PackageKey& key) {
  std::ifstream in(dir + "/compile_times.jsonl");
  std::optional<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("model", "") == key.model_name && j.value("device", "") == key.device &&
        j.value("gpu_arch", "") == key.gpu_arch && j.value("precision", "") == key.precision)
      out = j.value("compile_s", 0.0);
  }
  return out;
}

std::string tail_of(const std::deque<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  | " + l;
  return out;
}

// Runs the compiler into `tmp`; returns its exit status (0: written). Every output line goes to `log_path`,
// the log and `progress`.
int run_compiler(const PackageKey& key, const CompileTools& tools, const std::string& tmp, const std::string& log_path,
                 std::optional<double> estimate, const std::string& final_path, const CompileProgress& progress,
                 std::deque<std::string>* tail) {
  const auto& log = logger("fusion");
  std::ofstream out(log_path, std::ios::trunc);
  std::vector<std::string> args = {tools.python,         tools.script,     key.model_path,
                                   "--batch-size",       std::to_string(key.micro_batch),
                                   "--action-horizon",   std::to_string(key.action_horizon),
                                   "--text-width",       std::to_string(key.text_width),
                                   "--device",           key.device,       "--precision",
                                   key.precision,        "--out",          tmp};
  if (!key.bf16_weights.empty()) {  // the list beside the entry's log, read by the compiler
    const std::string list = log_path + ".bf16_weights.json";
    std::ofstream(list) << nlohmann::json(key.bf16_weights).dump(1) << "\n";
    args.insert(args.end(), {"--bf16-weights", list});
  }
  std::string command;
  for (const auto& a : args) command += (command.empty() ? "" : " ") + a;
  out << "$ " << command << "\n" << std::flush;
  LF_LOG(log, info) << "compiled step: compiling " << final_path << " (" << key.model_name << ", micro-batch "
                    << key.micro_batch << ", action horizon " << key.action_horizon
                    << (key.text_width != key.model_text_slot ? ", text slot " + std::to_string(key.text_width) : "")
                    << ", " << key.device << (key.gpu_arch.empty() ? "" : " " + key.gpu_arch)
                    << ", " << key.precision << "; "
                    << (estimate ? "the last compile of this model here took " + fmt_s(*estimate)
                                 : std::string("no earlier compile of this model here to estimate from"))
                    << "): " << command;
  // The child's environment: this process's, its lines unbuffered, and the build's operator library.
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "PYTHONUNBUFFERED=", 17) != 0) env_text.emplace_back(*e);
  env_text.emplace_back("PYTHONUNBUFFERED=1");
  if (!tools.ops_library.empty() && env("LOONGFORGE_OPS_LIBRARY").empty())
    env_text.push_back("LOONGFORGE_OPS_LIBRARY=" + tools.ops_library);
  std::vector<char*> envp, argv;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipe_fd[2];
  if (pipe2(pipe_fd, O_CLOEXEC) != 0) throw ConfigError(std::string("compiled step: pipe: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw ConfigError(std::string("compiled step: fork: ") + std::strerror(errno));
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    dup2(pipe_fd[1], 1);
    dup2(pipe_fd[1], 2);
    execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "compiled step: cannot execute the Python interpreter (set LOONGFORGE_PYTHON)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  ::close(pipe_fd[1]);
  const Clock::time_point t0 = Clock::now();
  double last_report = 0;
  std::string stage = "starting", pending;
  auto report = [&](bool to_log) {
    const double elapsed = seconds_since(t0);
    if (progress)
      progress({{"state", "compiling"},
                {"package", final_path},
                {"elapsed_s", elapsed},
                {"estimate_s", estimate ? nlohmann::json(*estimate) : nlohmann::json(nullptr)},
                {"stage", stage},
                {"log", log_path}});
    if (to_log)
      LF_LOG(log, info) << "compiled step: compiling, " << fmt_s(elapsed)
                        << (estimate ? " of about " + fmt_s(*estimate) : std::string()) << " (" << stage << ")";
    last_report = elapsed;
  };
  report(false);
  for (;;) {
    pollfd p{pipe_fd[0], POLLIN, 0};
    const int ready = poll(&p, 1, 1000);
    if (ready > 0) {
      char buf[4096];
      const ssize_t n = read(pipe_fd[0], buf, sizeof buf);
      if (n <= 0) break;  // the child closed its output: it is exiting
      pending.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
        const std::string line = pending.substr(0, nl);
        out << line << "\n" << std::flush;
        if (line.empty()) continue;
        tail->push_back(line);
        if (tail->size() > kLogTailLines) tail->pop_front();
        stage = line;
        LF_LOG(log, info) << "compile_step: " << line;
        report(false);
      }
    } else if (ready < 0 && errno != EINTR) {
      break;
    }
    if (seconds_since(t0) - last_report >= kQuietReportS) report(true);
  }
  ::close(pipe_fd[0]);
  if (!pending.empty()) out << pending << "\n", tail->push_back(pending);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

CompileTools find_compile_tools() {
  CompileTools t;
  t.python = env("LOONGFORGE_PYTHON");
  if (t.python.empty()) t.python = path_exists(LOONGFORGE_BUILD_PYTHON) ? LOONGFORGE_BUILD_PYTHON : "python3";
  std::vector<std::string> candidates;
  if (const std::string d = env("LOONGFORGE_SCRIPTS_DIR"); !d.empty()) {
    if (!path_exists(d + "/compile_step.py"))
      throw ConfigError("LOONGFORGE_SCRIPTS_DIR=" + d + " has no compile_step.py: point it at LoongForge's scripts/ "
                        "folder");
    candidates.push_back(d + "/compile_step.py");
  }
  if (const std::string e = exe_dir(); !e.empty()) candidates.push_back(e + "/../share/loongforge/scripts/compile_step.py");
  candidates.push_back(std::string(LOONGFORGE_SOURCE_DIR) + "/scripts/compile_step.py");
  for (const auto& c : candidates)
    if (path_exists(c)) {
      t.script = c;
      break;
    }
  if (t.script.empty())
    throw ConfigError("trainer.compiled_step: scripts/compile_step.py was not found (looked in " + candidates.front() +
                      (candidates.size() > 1 ? " and " + candidates.back() : std::string()) +
                      "); set LOONGFORGE_SCRIPTS_DIR to LoongForge's scripts/ folder, or trainer.compiled_step=off");
  if (path_exists(LOONGFORGE_OPS_LIBRARY_PATH)) t.ops_library = LOONGFORGE_OPS_LIBRARY_PATH;
  return t;
}

std::string cache_dir(const config::Config& cfg) {
  if (!cfg.trainer.compile_cache.empty()) return cfg.trainer.compile_cache;
  if (const std::string root = env("LOONGFORGE_CACHE"); !root.empty()) return root + "/compiled";
  const std::string home = env("HOME");
  if (home.empty())
    throw ConfigError("trainer.compile_cache is unset and so are LOONGFORGE_CACHE and HOME: set trainer.compile_cache");
  return home + "/.cache/loongforge/compiled";
}

// Note [The driver's JIT cache]
// Measured on an H100 (docs/benchmarks.md, session 51): gr00t-n1.7-3b's first
// forward+backward with a cached package took 5.7 s on a machine that had
// never run it (5.0 s of it the trainer thread's CPU time, 171 MB read from
// storage) and 1.6 s on the next run; dropping the shared libraries from the
// page cache left it at 1.6 s, while CUDA_CACHE_DISABLE=1 on the warm machine
// brought it back to 5.2 s (4.7 s CPU). So the difference is the driver
// compiling PTX into machine code on first use and keeping the result in its
// JIT cache (~/.nv/ComputeCache by default, per machine and user). Kept beside
// the packages it travels with them: a cache directory on shared storage
// serves every node's first step, as it serves their packages. Entries are
// keyed by the driver on the PTX and the driver version, so sharing is safe.
std::string share_cuda_jit_cache(const config::Config& cfg) {
  if (cfg.run.device == "cpu" || !env("CUDA_CACHE_PATH").empty() || !env("CUDA_CACHE_DISABLE").empty()) return "";
  std::string dir;
  try {
    dir = cache_dir(cfg) + "/cuda-jit";
    make_dirs(dir);
  } catch (const std::exception& e) {
    LF_LOG(logger("fusion"), debug) << "CUDA's JIT cache stays the driver's default: " << e.what();
    return "";
  }
  setenv("CUDA_CACHE_PATH", dir.c_str(), /*overwrite=*/0);
  return dir;
}

nlohmann::json PackageKey::to_json() const {
  nlohmann::json j = {{"format", kFormat},           {"model", model_name},   {"architecture_hash", architecture_hash},
                      {"code_hash", code_hash},      {"trainable", trainable}, {"micro_batch", micro_batch},
                      {"action_horizon", action_horizon},
                      {"precision", precision},      {"device", device},      {"gpu_arch", gpu_arch},
                      {"torch", torch_version},      {"compile_script", script_hash}};
  if (!bf16_weights.empty()) j["bf16_weights"] = bf16_weights;  // absent: the keys of packages before the field
  if (text_width != model_text_slot) j["text_width"] = text_width;  // absent: the model's own slot, as before
  return j;
}

std::string PackageKey::digest() const { return sha256_hex(to_json().dump()); }

std::string PackageKey::file_name() const {
  return model_name + "-b" + std::to_string(micro_batch) + "-" + device + (gpu_arch.empty() ? "" : "-" + gpu_arch) +
         "-" + precision + "-" + digest().substr(0, 16) + ".pt2";
}

PackageKey package_key(const model::Model& net, int64_t micro_batch, int64_t action_horizon, int64_t text_width,
                       bool bf16, c10::Device device, const CompileTools& tools,
                       const std::vector<std::string>& bf16_weights) {
  PackageKey k;
  const model::ModelInfo& info = net.info();
  k.model_name = info.name, k.model_path = info.path;
  k.architecture_hash = info.architecture_hash, k.code_hash = info.code_hash;
  for (const auto& p : info.params)
    if (p.trainable) k.trainable.push_back(p.name);
  k.micro_batch = micro_batch;
  k.action_horizon = action_horizon;
  k.text_width = text_width;
  k.model_text_slot = info.text_slot;
  k.precision = bf16 ? "bf16" : "fp32";
  k.device = device.is_cuda() ? "cuda" : "cpu";
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
    k.gpu_arch = "sm_" + std::to_string(prop->major) + std::to_string(prop->minor);
  }
#endif
  k.torch_version = TORCH_VERSION;
  k.script_hash = sha256_file(tools.script);
  k.bf16_weights = bf16_weights;
  return k;
}

nlohmann::json PreparedPackage::to_json() const {
  return {{"path", path},           {"source", compiled ? "compiled" : "cache hit"}, {"compile_s", compile_s},
          {"waited_s", waited_s},   {"log", log},                                    {"key", key}};
}

PreparedPackage prepare_package(const std::string& dir, const PackageKey& key, const CompileTools& tools,
                                const CompileProgress& progress) {
  const auto& log = logger("fusion");
  try {
    make_dirs(dir);
  } catch (const std::exception& e) {
    throw ConfigError("trainer.compile_cache: cannot create " + dir + ": " + e.what() +
                      " (set trainer.compile_cache or LOONGFORGE_CACHE to a writable folder)");
  }
  const std::string file = key.file_name();
  const std::string stem = file.substr(0, file.size() - 4);
  PreparedPackage p;
  p.path = dir + "/" + file, p.log = dir + "/" + stem + ".log", p.key = key.digest();

  EntryLock lock(dir + "/" + stem + ".lock");
  const Clock::time_point t_wait = Clock::now();
  if (!lock.try_lock()) {
    LF_LOG(log, info) << "compiled step: another process is preparing " << p.path << "; waiting for it";
    double last = 0;
    while (!lock.try_lock()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const double waited = seconds_since(t_wait);
      if (progress) progress({{"state", "waiting"}, {"package", p.path}, {"elapsed_s", waited}, {"log", p.log}});
      if (waited - last >= kQuietReportS) {
        LF_LOG(log, info) << "compiled step: still waiting for another process's compile of " << p.path << " ("
                          << fmt_s(waited) << "; its log: " << p.log << ")";
        last = waited;
      }
    }
    p.waited_s = seconds_since(t_wait);
  }
  if (path_exists(p.path)) {
    const std::string problem = entry_problem(p.path, key);
    if (problem.empty()) {
      LF_LOG(log, info) << "compiled step: cache hit " << p.path
                        << (p.waited_s > 0 ? " (compiled by another process while this one waited " +
                                                 fmt_s(p.waited_s) + ")"
                                           : std::string());
      return p;
    }
    LF_LOG(log, warn) << "compiled step: the cached package " << p.path << " cannot serve this run: " << problem
                      << "; compiling it again";
    discard_package(p.path);
  }

  const std::string tmp = dir + "/." + stem + "." + std::to_string(getpid()) + ".pt2";
  const Clock::time_point t0 = Clock::now();
  std::deque<std::string> tail;
  const int status = run_compiler(key, tools, tmp, p.log, estimate_s(dir, key), p.path, progress, &tail);
  p.compile_s = seconds_since(t0);
  if (status != 0 || !path_exists(tmp)) {
    remove_tree(tmp);
    throw CompileFailed("trainer.compiled_step: compiling " + p.path + " failed (" +
                        (status == 0 ? std::string("no package written") : "exit status " + std::to_string(status)) +
                        " after " + fmt_s(p.compile_s) + "); its log is " + p.log + ", ending:" + tail_of(tail));
  }
  rename_path(tmp, p.path);
  p.compiled = true;
  std::ofstream(dir + "/compile_times.jsonl", std::ios::app)
      << nlohmann::json{{"model", key.model_name},   {"device", key.device},   {"gpu_arch", key.gpu_arch},
                        {"precision", key.precision}, {"micro_batch", key.micro_batch}, {"compile_s", p.compile_s},
                        {"package", file}}
             .dump()
      << "\n";
  LF_LOG(log, info) << "compiled step: compiled " << p.path << " in " << fmt_s(p.compile_s) << " (log: " << p.log
                    << ")";
  return p;
}

void discard_package(const std::string& path) { remove_tree(path); }

int64_t package_micro_batch(const std::string& path) {
  try {
    return actions_dim_of(manifest_of(path), 0);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t package_action_horizon(const std::string& path) {
  try {
    return actions_dim_of(manifest_of(path), 1);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t package_text_width(const std::string& path) {
  try {
    return batch_dim_of(manifest_of(path), "text_tokens", 1);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace loongforge::fusion
