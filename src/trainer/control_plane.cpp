// The trainer's verbs (control_plane.hpp).
#include "control_plane.hpp"

#include <unistd.h>  // getpid

#include <algorithm>  // std::max

#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store
#include <torch/cuda.h>                           // torch::cuda::synchronize

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/control/protocol.hpp"

namespace loongforge::trainer {

using nlohmann::json;
namespace code = control::code;

// ---------------------------------------------------------------------------
// The one-rank bus

namespace {
class LocalBus final : public CommandBus {
 public:
  Command publish(Command c, int64_t steps_done) override {
    c.apply_step = steps_done;
    pending_.push_back(c);
    return c;
  }
  std::vector<Command> poll(int64_t) override {
    std::vector<Command> out;
    out.swap(pending_);
    return out;
  }
  void announce_checkpoint(int64_t, const json&) override {}
  std::optional<json> checkpoint_result(int64_t) override { return std::nullopt; }

 private:
  std::vector<Command> pending_;
};

// Note [Cluster-wide verbs]: "lf/ctl/seq" counts commands; command k is
// stored at "lf/ctl/cmd/k". Every rank polls the counter once per step.
class StoreBus final : public CommandBus {
 public:
  explicit StoreBus(c10d::Store& store) : store_(store) {}
  Command publish(Command c, int64_t steps_done) override {
    c.apply_step = steps_done + 2;
    const json j = {{"verb", c.verb}, {"args", c.args}, {"apply_step", c.apply_step}, {"origin_rank", c.origin_rank},
                    {"token", c.token}};
    const int64_t k = store_.add("lf/ctl/seq", 1);
    set(key(k), j.dump());
    return c;
  }
  void skip_published() override { seen_ = store_.add("lf/ctl/seq", 0); }
  std::vector<Command> poll(int64_t) override {
    std::vector<Command> out;
    const int64_t n = store_.add("lf/ctl/seq", 0);
    for (; seen_ < n; ++seen_) {
      const json j = json::parse(get(key(seen_ + 1)));  // waits until the publisher has set it
      Command c;
      c.verb = j.at("verb").get<std::string>();
      c.args = j.at("args");
      c.apply_step = j.at("apply_step").get<int64_t>();
      c.origin_rank = j.at("origin_rank").get<int64_t>();
      c.token = j.at("token").get<uint64_t>();
      out.push_back(std::move(c));
    }
    return out;
  }
  void announce_checkpoint(int64_t step, const json& result) override {
    set("lf/ckpt/" + std::to_string(step), result.dump());
  }
  std::optional<json> checkpoint_result(int64_t step) override {
    const std::string k = "lf/ckpt/" + std::to_string(step);
    if (!store_.check({k})) return std::nullopt;
    return json::parse(get(k));
  }

 private:
  static std::string key(int64_t k) { return "lf/ctl/cmd/" + std::to_string(k); }
  void set(const std::string& k, const std::string& v) { store_.set(k, std::vector<uint8_t>(v.begin(), v.end())); }
  std::string get(const std::string& k) {
    const auto v = store_.get(k);
    return std::string(v.begin(), v.end());
  }
  c10d::Store& store_;
  int64_t seen_ = 0;
};
}  // namespace

std::unique_ptr<CommandBus> make_local_bus() { return std::make_unique<LocalBus>(); }
std::unique_ptr<CommandBus> make_store_bus(c10d::Store& store) {
  return std::make_unique<StoreBus>(store);
}

// ---------------------------------------------------------------------------
// Setup

namespace {
// control.socket with every "{rank}" replaced by this process's rank (several
// ranks on one host need a socket each; launchers give them the same arguments).
std::string socket_for_rank(std::string path, int64_t rank) {
  const std::string mark = "{rank}", number = std::to_string(rank);
  for (size_t at = path.find(mark); at != std::string::npos; at = path.find(mark, at + number.size()))
    path.replace(at, mark.size(), number);
  return path;
}
}  // namespace

ControlPlane::ControlPlane(const config::Config& cfg, Identity id, std::unique_ptr<CommandBus> bus,
                           const std::vector<Engine>& engines)
    : id_(std::move(id)), bus_(std::move(bus)) {
  status_ = {{"phase", "starting"}};
  // Every rank applies cluster-wide engine verbs, with or without a socket.
  for (const Engine& e : engines)
    for (const EngineVerb& v : e.verbs)
      if (v.cluster) cluster_verbs_[v.name] = &v;
  if (!cfg.control.enable) return;
  control::ServerOptions so;
  so.socket_path = socket_for_rank(cfg.control.socket, id_.rank);
  so.allow_root = cfg.control.allow_root;
  so.identity = {{"rank", id_.rank}, {"world", id_.world}, {"model", id_.model}};
  server_ = std::make_unique<control::Server>(so);
  register_verbs(engines);
  server_->start();
  socket_path_ = server_->path();
  LF_LOG(logger("control"), info) << "control socket " << socket_path_ << " (try: loongforge status --pid "
                                  << ::getpid() << ")";
}

ControlPlane::~ControlPlane() {
  if (server_) server_->stop();
}

const std::string& ControlPlane::socket_path() const { return socket_path_; }

void ControlPlane::publish_status(json status) {
  std::lock_guard<std::mutex> lock(status_mu_);
  status_ = std::move(status);
}

void ControlPlane::set_live_status(std::string key, std::function<json()> read) {
  std::lock_guard<std::mutex> lock(status_mu_);
  live_status_.emplace_back(std::move(key), std::move(read));
}

namespace {
// Checks an engine verb's arguments, then refuses it when the engine is off.
void admit(const Engine& e, const EngineVerb& v, const json& args) {
  if (v.check_args) {
    const std::string problem = v.check_args(args);
    if (!problem.empty()) throw control::VerbError(code::kBadArgs, problem);
  }
  if (!e.built)
    throw control::VerbError(code::kEngineOff, v.name + " needs the " + e.title +
                                                   " engine, which is not in this build yet (it arrives with " +
                                                   e.arrives_with + "); training runs on the plain path");
  if (!e.enabled)
    throw control::VerbError(code::kEngineOff, v.name + " needs the " + e.title + " engine, which is off in this run (" +
                                                   e.name + ".enable=false)");
  if (!v.run)
    throw control::VerbError(code::kEngineOff, v.name + " is not in this build yet: the " + e.title +
                                                   " engine is, without this verb");
}
}  // namespace

void ControlPlane::register_verbs(const std::vector<Engine>& engines) {
  server_->on_query("status", [this](const json&) {
    std::lock_guard<std::mutex> lock(status_mu_);
    json s = status_;
    for (const auto& [key, read] : live_status_) s[key] = read();
    s["pid"] = static_cast<int64_t>(::getpid());
    s["socket"] = server_->path();  // set before the server listens (socket_path_ is assigned after start())
    const control::ServerStats st = server_->stats();
    s["control"] = {{"connections", st.connections},
                    {"requests", st.requests},
                    {"error_replies", st.error_replies},
                    {"rejected_connections", st.rejected_connections},
                    {"closed_for_timeout", st.closed_for_timeout},
                    {"closed_for_line_length", st.closed_for_line_length},
                    {"closed_for_slow_reader", st.closed_for_slow_reader}};
    return s;
  });

  // Cluster-wide verbs: published at this boundary, answered when done here.
  auto cluster_verb = [this](const std::string& verb) {
    return [this, verb](const json& args, control::Reply reply) {
      Command c;
      c.verb = verb;
      c.args = args;
      c.origin_rank = id_.rank;
      c.token = next_token_++;
      origin_waiters_.emplace(c.token, reply);
      bus_->publish(c, steps_done_);
    };
  };
  server_->on_task("checkpoint-now", cluster_verb("checkpoint-now"));
  server_->on_task("stop", cluster_verb("stop"));
  // hot-rejoin: checked here (the rank must be lost and registered), applied by every rank at one step.
  server_->on_task("hot-rejoin", [this, cluster_verb](const json& args, control::Reply reply) {
    if (!rejoin_check_)
      throw control::VerbError(code::kEngineOff,
                               "hot-rejoin needs fault tolerance, which is off in this run (fault.enable=false): a "
                               "lost rank cannot be taken back; restart the job from its newest checkpoint");
    if (const std::string problem = rejoin_check_(args); !problem.empty())
      throw control::VerbError(code::kBadArgs, problem);
    cluster_verb("hot-rejoin")(args, reply);
  });

  server_->on_task("profile-step", [this](const json& args, control::Reply reply) {
    if (profile_) throw control::VerbError(code::kBusy, "a profile is already being recorded; retry when it ends");
    Profile p{reply, 1.0, 1000, Clock::now(), false, false, {}, {}, nullptr};
    if (auto it = args.find("kernels"); it != args.end()) {
      if (!it->is_boolean()) throw control::VerbError(code::kBadArgs, "kernels must be true or false");
      p.kernels = it->get<bool>();
    }
    if (auto it = args.find("duration_s"); it != args.end()) {
      if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 3600)
        throw control::VerbError(code::kBadArgs, "duration_s must be a number of seconds in (0, 3600]");
      p.duration_s = it->get<double>();
    }
    if (auto it = args.find("max_steps"); it != args.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 100000)
        throw control::VerbError(code::kBadArgs, "max_steps must be an integer in [1, 100000]");
      p.max_steps = it->get<int64_t>();
    }
    profile_ = std::move(p);
  });

  server_->on_stream("monitor-comm", [this](const json&, int64_t tick) {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (!status_.contains("comm"))
      throw control::VerbError(code::kEngineOff, "monitor-comm: this run has no gradient communication (world size " +
                                                     std::to_string(id_.world) + ")");
    if (tick < 0) return json();
    return json{{"step", status_.value("step", int64_t{0})}, {"comm", status_["comm"]}};
  });
  for (const Engine& e : engines) {
    for (const EngineVerb& v : e.verbs) {
      if (v.query) {
        server_->on_query(v.name, [&e, &v](const json& args) -> json {
          admit(e, v, args);
          return v.run(args);
        });
      } else if (v.cluster) {
        // Checked here, applied by every rank at the same step (Note [Cluster-wide verbs]).
        server_->on_task(v.name, [this, &e, &v, cluster_verb](const json& args, control::Reply reply) {
          admit(e, v, args);
          cluster_verb(v.name)(args, reply);
        });
      } else {
        server_->on_task(v.name, [&e, &v](const json& args, control::Reply reply) {
          admit(e, v, args);
          reply.ok(v.run(args));
        });
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Step boundaries

ControlPlane::Actions ControlPlane::step_boundary(int64_t steps_done, bool stop_signal, bool requeue_signal) {
  Actions a;
  steps_done_ = steps_done;
  if (stop_signal && !stop_published_) {  // published once, applied like `loongforge stop`
    stop_published_ = true;
    Command c;
    c.verb = "stop";
    c.origin_rank = id_.rank;
    c.token = 0;  // nobody waits for an answer
    if (requeue_signal) c.args["requeue"] = true;
    c.args["signal"] = true;
    bus_->publish(c, steps_done);
  }
  if (server_) server_->drain();
  for (auto& c : bus_->poll(steps_done)) {
    if (c.apply_step < steps_done)
      throw CommError("rank " + std::to_string(id_.rank) + " received '" + c.verb + "' from rank " +
                      std::to_string(c.origin_rank) + " for step " + std::to_string(c.apply_step) +
                      " after passing it (at step " + std::to_string(steps_done) +
                      "); ranks drifted apart, which every-step collectives should prevent");
    due_.push_back(std::move(c));
  }
  if (id_.rank != 0) answer_checkpoint_waiters_from_bus();
  for (auto it = due_.begin(); it != due_.end();) {
    if (it->apply_step != steps_done) {
      ++it;
      continue;
    }
    std::optional<control::Reply> mine;
    if (it->origin_rank == id_.rank) {
      if (auto w = origin_waiters_.find(it->token); w != origin_waiters_.end()) {
        mine = w->second;
        origin_waiters_.erase(w);
      }
    }
    if (it->verb == "checkpoint-now") {
      a.checkpoint = true;
      if (mine) checkpoint_waiters_.emplace(steps_done, *mine);
    } else if (it->verb == "stop") {
      a.stop = true;
      a.requeue = a.requeue || it->args.value("requeue", false);
      a.signal = a.signal || it->args.value("signal", false);
      if (mine) stop_waiters_.push_back(*mine);
    } else if (it->verb == "hot-rejoin") {
      a.rejoin = it->args.value("rank", int64_t{-1});
      if (mine) mine->ok({{"admitting", a.rejoin}, {"applied_at_step", steps_done}});
    } else if (auto v = cluster_verbs_.find(it->verb); v != cluster_verbs_.end()) {
      try {
        json result = v->second->run(it->args);
        result["applied_at_step"] = steps_done;
        if (mine) mine->ok(result);
      } catch (const std::exception& e) {
        LF_LOG(logger("control"), warn) << it->verb << " failed at step " << steps_done << ": " << e.what();
        if (mine) mine->error(code::kFailed, e.what());
      }
    }
    LF_LOG(logger("control"), info) << it->verb << " (from rank " << it->origin_rank << ") applied at step "
                                    << steps_done;
    it = due_.erase(it);
  }
  return a;
}

void ControlPlane::request(const std::string& verb, const json& args) {
  Command c;
  c.verb = verb;
  c.args = args;
  c.origin_rank = id_.rank;
  c.token = 0;  // nobody waits for an answer
  bus_->publish(c, steps_done_);
}

void ControlPlane::step_begins() {
  if (profile_ && !profile_->started) {
    profile_->started = true;
    profile_->start = Clock::now();
    std::string why;
    if (profile_->kernels && !counter_.start(why)) profile_->cuda = {{"error", "cannot count CUDA activity: " + why}};
  }
}

namespace {
// `result` is what rank 0's writer reported ({step, path, ..., error}).
void answer_checkpoint(const control::Reply& r, const json& result) {
  const std::string error = result.value("error", std::string());
  if (error.empty())
    r.ok(result);
  else
    r.error(code::kFailed, "the checkpoint at step " + std::to_string(result.value("step", int64_t{0})) +
                               " failed on rank 0: " + error);
}
}  // namespace

void ControlPlane::checkpoint_finished(int64_t step, const std::string& path, const std::string& error, double seconds,
                                       uint64_t bytes) {
  const json result = {{"step", step}, {"path", path}, {"seconds", seconds}, {"bytes", bytes}, {"world", id_.world}, {"error", error}};
  if (id_.world > 1) bus_->announce_checkpoint(step, result);
  auto range = checkpoint_waiters_.equal_range(step);
  for (auto it = range.first; it != range.second; ++it) answer_checkpoint(it->second, result);
  checkpoint_waiters_.erase(range.first, range.second);
}

// Ranks other than 0 learn from the bus when rank 0's write ended.
void ControlPlane::answer_checkpoint_waiters_from_bus() {
  for (auto it = checkpoint_waiters_.begin(); it != checkpoint_waiters_.end();) {
    if (auto r = bus_->checkpoint_result(it->first)) {
      answer_checkpoint(it->second, *r);
      it = checkpoint_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------
// Profiling

void ControlPlane::end_phase(const char* name, int64_t step, int64_t micro, Clock::time_point t0) {
  if (!profiling()) return;
  if (id_.cuda) torch::cuda::synchronize();
  phase(name, step, micro, t0, Clock::now());
}

void ControlPlane::phase(const char* name, int64_t step, int64_t micro, Clock::time_point t0, Clock::time_point t1) {
  if (!profiling()) return;
  constexpr size_t kMaxEvents = 50000;  // keeps the reply a few MB at most
  if (profile_->events.size() >= kMaxEvents) return;
  const auto us = [&](Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - profile_->start).count(); };
  profile_->events.push_back({name, step, micro, us(t0), us(t1) - us(t0)});
}

void ControlPlane::step_done(int64_t step, double step_ms, const json& memory, const json& data) {
  if (!profiling()) return;
  profile_->steps.push_back({{"step", step}, {"step_ms", step_ms}});
  if (!data.is_null()) profile_->steps.back()["data"] = data;
  const double elapsed = std::chrono::duration<double>(Clock::now() - profile_->start).count();
  if (elapsed < profile_->duration_s && static_cast<int64_t>(profile_->steps.size()) < profile_->max_steps) return;
  if (profile_->kernels && profile_->cuda.is_null())
    profile_->cuda = counter_.stop(static_cast<int64_t>(profile_->steps.size()));

  // Per-phase totals per step and their means.
  std::map<std::string, double> total_ms;
  std::map<int64_t, std::map<std::string, double>> per_step;
  json trace = json::array();
  const int64_t pid = ::getpid();
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "loongforge-train rank " + std::to_string(id_.rank)}}}});
  trace.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "trainer"}}}});
  for (const auto& e : profile_->events) {
    total_ms[e.name] += e.dur_us / 1000.0;
    per_step[e.step][e.name] += e.dur_us / 1000.0;
    json ev = {{"name", e.name}, {"cat", "phase"}, {"ph", "X"}, {"ts", e.start_us}, {"dur", e.dur_us}, {"pid", pid}, {"tid", 1},
               {"args", {{"step", e.step}}}};
    if (e.micro >= 0) ev["args"]["micro_batch"] = e.micro;
    trace.push_back(std::move(ev));
  }
  const double n = static_cast<double>(profile_->steps.size());
  json phases = json::object();
  for (const auto& [name, ms] : total_ms) phases[name] = {{"total_ms", ms}, {"mean_ms_per_step", ms / n}};
  json steps = json::array();
  double step_total = 0;
  for (auto& s : profile_->steps) {
    s["phases_ms"] = per_step[s["step"].get<int64_t>()];
    step_total += s["step_ms"].get<double>();
    steps.push_back(s);
  }
  json result = {{"schema", "loongforge.profile/1"},
                 {"rank", id_.rank},
                 {"world", id_.world},
                 {"device", id_.device},
                 {"precision", id_.precision},
                 {"model", id_.model},
                 {"first_step", profile_->steps.front()["step"]},
                 {"last_step", step},
                 {"steps", profile_->steps.size()},
                 {"duration_s", elapsed},
                 {"mean_step_ms", step_total / n},
                 {"phases", phases},
                 {"per_step", steps},
                 {"memory", memory},
                 {"trace", {{"traceEvents", trace}, {"displayTimeUnit", "ms"}}}};
  if (profile_->kernels) result["cuda"] = profile_->cuda;
  profile_->reply.ok(result);
  profile_.reset();
}

// ---------------------------------------------------------------------------
// Exit

void ControlPlane::shutdown(const json& final_state_in) {
  json final_state = final_state_in;
  if (id_.rank != 0 && id_.world > 1) {  // rank 0 wrote the checkpoints; ranks met at a barrier after its last write
    if (auto r = bus_->checkpoint_result(final_state.value("stopped_at_step", int64_t{0})))
      final_state["checkpoint"] = r->value("path", std::string());
    answer_checkpoint_waiters_from_bus();
  }
  for (auto& r : stop_waiters_) r.ok(final_state);
  stop_waiters_.clear();
  for (auto& [step, r] : checkpoint_waiters_)
    r.error(code::kShuttingDown, "the trainer exited before the checkpoint of step " + std::to_string(step) + " was written");
  checkpoint_waiters_.clear();
  for (auto& [token, r] : origin_waiters_) r.error(code::kShuttingDown, "the trainer exited before this request applied");
  origin_waiters_.clear();
  if (profile_ && profile_->kernels && profile_->cuda.is_null()) (void)counter_.stop(0);
  if (profile_) profile_->reply.error(code::kShuttingDown, "the trainer exited while profiling");
  profile_.reset();
  if (server_) server_->stop();
}

}  // namespace loongforge::trainer
