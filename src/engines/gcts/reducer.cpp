// GCTS's GradientReducer (comm/reducer.hpp): runs the plan (plan.hpp) every
// step, overlapped with the last micro-batch's backward when gcts.overlap.
//
// Note [Overlap]
// The reducer puts a post-accumulate-grad hook on every trainable parameter
// (torch::autograd::impl::set_post_acc_grad_hooks, the C++ slot behind
// Python's Tensor.register_post_accumulate_grad_hook: AccumulateGrad calls it
// after adding the backward's gradient into .grad; test/engines/gcts/test_overlap.cpp
// checks that it sees the accumulated value). begin_step(params, k) arms the
// hooks for the step's k backward passes: a parameter's gradient is final
// when its hook has fired k times (autograd accumulates a leaf once per
// backward, however often the forward used it). The hook then counts the
// parameter off its units and launches, in plan order, every unit whose
// gradients are all final (Note [Bucket order] in plan.cpp): the
// collectives run on the backend's threads (Gloo) or stream (NCCL) while
// autograd computes the remaining gradients. average_gradients(), after
// backward, launches what is left (units with a parameter that missed a
// micro-batch's backward, or everything when the hooks did not fire) and
// waits for all of them: that is the exposed communication. Packing copies
// the final gradient and results reach .grad only after backward, so the
// numbers are those of the non-overlapped path (bitwise: the same collectives
// on the same buffers). On CPUs the hooks run on the thread that called
// backward; on GPUs on autograd's device thread, whose current stream
// ProcessGroupNCCL orders its stream after (one NCCL rank: test_nccl_gpu). CUDA-graph
// replay and the compiled runner do not run AccumulateGrad: the trainer turns
// overlap off for them (under CUDA graphs on NCCL the reduction goes into the
// graph instead, below).
//
// Note [Reduction in the graph]
// A replayed CUDA graph runs no hooks, so under the graph runner the
// reduction used to follow backward, all of it exposed. On NCCL it can be
// captured instead: the graph runner captures the step's last micro-batch
// into a graph of its own (keyed by graph_key()), and inside that capture
// begin_capture() arms the hooks for that one backward, so each unit's
// packing and collective are recorded as its gradients become final
// (ProcessGroupNCCL launches on its stream after waiting for the capturing
// stream, which joins that stream to the capture); end_capture() records
// the remaining units, the waits (the capturing stream waits for each
// collective: the join) and the unpacking. Replaying that graph then
// reduces the gradients of every micro-batch accumulated so far, overlapped
// with the backward as the device schedules the graph's branches, with no
// host work. What the capture bakes in makes the key: strategy, bucket size,
// reduction dtype and, for hybrid's per-embodiment rows, the agreed slots (a
// graph replays only for the slots it was captured with; their index
// tensors are made before the capture, prepare_capture()). Timings: a
// captured collective has no DeviceSpan (World::launch skips it; an event
// recorded in a capture only orders streams); the trainer times the graph's
// tail on the device instead (exposed_on_device()). Every rank captures at
// the same step (the same warm-up counts and keys), and NCCL lets captured
// and uncaptured collectives mix on one communicator, so a rank that runs a
// step eagerly still matches one that replays. Gloo (CPUs) never captures.
#include <algorithm>  // std::max
#include <cmath>      // std::abs
#include <chrono>     // std::chrono
#include <deque>      // std::deque
#include <functional>  // std::function
#include <map>        // std::map

#include <ATen/ATen.h>                           // at::empty, at::cat
#include <ATen/core/grad_mode.h>                 // at::NoGradGuard
#include <torch/csrc/autograd/function_hook.h>  // torch::autograd::PostAccumulateGradHook
#include <torch/csrc/autograd/variable.h>       // torch::autograd::impl::set_post_acc_grad_hooks

#include "plan.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/comm/reducer_parts.hpp"

namespace loongforge::gcts {

using comm::Backend;
using comm::DeviceSpan;
using comm::GradientReducer;
using comm::Pending;
using comm::ReducedParam;
using comm::ShardLayout;
using comm::ShardTarget;
using comm::StepCounts;
using comm::World;

namespace {

class GctsReducer;

struct GradFinalHook final : torch::autograd::PostAccumulateGradHook {
  GradFinalHook(GctsReducer* r, size_t i) : reducer(r), index(i) {}
  void operator()(const torch::autograd::Variable& tensor) override;
  GctsReducer* reducer;
  size_t index;
};

class GctsReducer final : public GradientReducer {
 public:
  GctsReducer(const config::Config& cfg, World* world, std::vector<ReducedParam> params, ShardTarget* shard,
              bool overlap)
      : world_(world),
        params_(std::move(params)),
        shard_(shard),
        strategy_(cfg.gcts.comm_strategy),
        dtype_(cfg.gcts.reduce_dtype == "bf16" ? at::kBFloat16 : at::kFloat),
        overlap_(overlap),
        rebuild_interval_(cfg.gcts.rebuild_interval),
        configured_strategy_(cfg.gcts.comm_strategy),
        configured_bucket_bytes_(static_cast<int64_t>(cfg.gcts.bucket_mb * 1e6)) {
    const int64_t esize = dtype_ == at::kFloat ? 4 : 2;
    in_.params = &params_;
    in_.ready_pos = readiness_positions(params_);
    in_.bucket_numel = std::max<int64_t>(1, static_cast<int64_t>(cfg.gcts.bucket_mb * 1e6) / esize);
    in_.first_numel = std::max<int64_t>(1, static_cast<int64_t>(cfg.gcts.first_bucket_mb * 1e6) / esize);
    in_.tiny_numel = static_cast<int64_t>(cfg.gcts.tiny_tensor_kb * 1024.0 / 4.0);
    in_.world = world_ ? world_->size() : 1;
    in_.sparse_embodiment = cfg.gcts.sparse_embodiment;
    in_.shard = shard_ ? &shard_->layout : nullptr;
    if (shard_) {
      sharded_.assign(params_.size(), false);
      for (size_t i : shard_->layout.sharded) sharded_[i] = true;
    }
    replan();
  }

  ~GctsReducer() override {
    for (const auto& p : hooked_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }

  int64_t world_size() const override { return world_ ? world_->size() : 1; }
  bool reduces() const override { return world_ || shard_; }
  StepCounts agree_counts(const StepCounts& local) override {
    StepCounts all = world_ ? comm::detail::agree_counts(*world_, local) : local;
    slots_ = all.slots;  // this step's per-embodiment rows (Note [Embodiment rows])
    slots_known_ = true;
    return all;
  }
  at::Tensor sum_scalar(const at::Tensor& scalar) override {
    return world_ ? comm::detail::sum_device_scalar(*world_, scalar) : scalar;
  }
  // Note [Reduction in the graph].
  std::string graph_key() const override {
    if (!world_ || world_->backend() != Backend::Nccl || !has_work()) return "";
    const bool rows = has_rows();
    if (rows && !slots_known_) return "";  // the rows would be found by reading the device
    std::string k = strategy_ + ", bucket " + std::to_string(in_.bucket_numel * esize()) + " bytes, " +
                    (dtype_ == at::kFloat ? "fp32" : "bf16");
    if (rows) {
      k += ", slots";
      for (int64_t x : slots_) k += " " + std::to_string(x);
    }
    return k;
  }
  void prepare_capture() override {
    for (const auto& u : active().units)
      if (u.kind == Unit::Kind::Embodiment)
        for (size_t i : u.bucket.params) slot_index(params_[i].shape[0], live_[i].device());
  }
  void begin_capture() override {
    if (hooked_.empty()) install_hooks(live_);
    reset_step(live_);
    micro_batches_ = 1;  // this one backward makes the gradients final (earlier ones are in .grad)
    armed_ = true;
  }
  void end_capture() override {
    armed_ = false;
    at::NoGradGuard no_grad;
    while (next_ < active().units.size()) launch(next_++, /*in_backward=*/false);
    finish_all();  // each wait makes the capturing stream wait for its collective
    graph_units_[graph_key()] = std::move(timings_);
    timings_.clear();
    begun_ = false;
  }
  void graph_replayed() override { replayed_ = true; }
  void exposed_on_device(int64_t step, double ms) override { device_exposed_ = {step, ms}; }

  // One rank with a sharded optimizer: its gradient shard must be filled,
  // unless the gradients are views into it (Note [Gradient views]).
  bool has_work() const { return world_ || (shard_ && !shard_->local.defined()); }

  void begin_step(const std::vector<at::Tensor>& params, int64_t micro_batches) override {
    reset_step(params);
    if (!overlap_ || !has_work()) return;
    if (hooked_.empty()) install_hooks(params);
    micro_batches_ = micro_batches;
    armed_ = true;
  }

  // Note [Overlap]: the hook of parameter i fired.
  void grad_accumulated(size_t i) {
    if (!armed_ || ++count_[i] != micro_batches_) return;
    for (size_t u : active().units_of[i]) --missing_[u];
    while (next_ < active().units.size() && missing_[next_] == 0) launch(next_++, /*in_backward=*/true);
  }

  void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) override {
    armed_ = false;
    if (replayed_) {  // Note [Reduction in the graph]: the replay did it all
      replayed_ = false;
      step_ = step + 1;
      begun_ = false;
      unsettled_.clear();
      shown_ = graph_units_[graph_key()], shown_step_ = step_, shown_in_graph_ = true;  // the key: before the slots go
      slots_known_ = false;
      exposed_ms_ = 0;
      if (rebuild_interval_ > 0 && step_ % rebuild_interval_ == 0) rebuild();
      return;
    }
    if (!has_work()) {
      // One rank: the gradients are the mean already (and with gradient
      // views, in the optimizer's shard, but for any a runner replaced).
      if (shard_) shard_->adopt_foreign_grads(params);
      return;
    }
    if (!begun_) reset_step(params);
    const std::string phase = "comm/" + strategy_;
    Phase p(phases, phase.c_str(), step + 1);
    at::NoGradGuard no_grad;
    const auto t0 = Clock::now();
    while (next_ < active().units.size()) launch(next_++, /*in_backward=*/false);
    finish_all();
    exposed_ms_ = comm::detail::ms_since(t0);
    step_ = step + 1;
    begun_ = false;
    slots_known_ = false;
    shown_in_graph_ = false;
    settle_timings();
    if (world_ && rebuild_interval_ > 0 && step_ % rebuild_interval_ == 0) rebuild();
  }

  std::string strategy() const override {
    std::string s = strategy_ + " (GCTS, " + (dtype_ == at::kFloat ? "fp32" : "bf16") + " reduction";
    if (shard_) s += shard_->gather_overlap ? ", sharded optimizer with overlapped all-gathers" : ", sharded optimizer";
    if (!graph_units_.empty())
      s += ", captured into the last micro-batch's CUDA graph";
    else
      s += overlap_ ? ", overlapped with backward" : ", after backward";
    return s + ")";
  }

  nlohmann::json switch_strategy(const std::string& to) override {
    if (to != "simple" && to != "hybrid")
      throw CommError("strategy must be simple or hybrid, got '" + to.substr(0, 32) + "'");
    const std::string from = strategy_;
    strategy_ = to;
    LF_LOG(logger("comm"), info) << "gradient communication strategy " << from << " -> " << to;
    return {{"previous", from}, {"strategy", to}};
  }

  nlohmann::json comm_status() const override {
    if (!world_) return nullptr;
    settle();
    const double n = static_cast<double>(world_->size());
    std::map<std::string, comm::detail::GroupStats> groups;
    std::map<std::string, std::vector<std::pair<Clock::time_point, Clock::time_point>>> spans;
    std::vector<std::pair<Clock::time_point, Clock::time_point>> all;
    nlohmann::json buckets = nlohmann::json::array();
    int64_t in_backward = 0;
    for (const auto& t : shown_) {
      auto& g = groups[t.group];
      g.collective = t.collective, g.bytes += t.bytes, g.calls += 1;
      spans[t.group].push_back({t.launched, t.done});
      all.push_back({t.launched, t.done});
      nlohmann::json b = comm::detail::group_json(t.group, t.collective, t.bytes, t.ms, 1, n);
      if (shown_in_graph_) untimed(b);
      b["unit"] = t.unit;
      b["service_ms"] = t.service_ms;
      b["launched_in_backward"] = t.in_backward;
      buckets.push_back(std::move(b));
      in_backward += t.in_backward ? 1 : 0;
    }
    for (auto& [name, g] : groups) g.ms = union_ms(spans[name]);
    const double comm_ms = union_ms(all);
    nlohmann::json gj = nlohmann::json::array();
    for (const auto& [name, g] : groups) {
      gj.push_back(comm::detail::group_json(name, g.collective, g.bytes, g.ms, g.calls, n));
      if (shown_in_graph_) untimed(gj.back());
    }
    double gather_exposed_ms = 0;
    if (shard_ && shard_->gather_bytes > 0) {
      // Note [Gather overlap] in src/engines/gcts/sharded_adamw.cpp: ms from the first launch to the last arrival
      // (on NCCL from the pieces' device spans once they are done).
      double gather_ms = shard_->gather_ms;
      const auto& sp = shard_->gather_spans;
      if (!sp.empty() && std::all_of(sp.begin(), sp.end(), [](const auto& s) { return s && s->done(); })) {
        double last = 0;
        for (const auto& s : sp) last = std::max(last, s->ms_from(*sp.front()).second);
        gather_ms = last;
      }
      nlohmann::json g = comm::detail::group_json("parameters (sharded optimizer)", "all-gather", shard_->gather_bytes,
                                            gather_ms, shard_->gather_calls, n);
      g["exposed_ms"] = shard_->gather_exposed_ms;
      g["overlap"] = shard_->gather_overlap ? "during the update and the next batch's fetch" : "none";
      gj.push_back(std::move(g));
      gather_exposed_ms = shard_->gather_exposed_ms;
    }
    // On NCCL the host's times count launches; the trainer's device-timed
    // figure for the step (exposed_on_device: the reduction's and the
    // gather's waits) is its exposed_ms.
    const bool nccl = world_->backend() == Backend::Nccl;
    const double exposed = nccl && device_exposed_.first > 0 ? device_exposed_.second : exposed_ms_ + gather_exposed_ms;
    nlohmann::json j = {
            {"world", world_->size()},
            {"strategy", strategy_},
            {"overlap", overlap_ || shown_in_graph_},
            {"step", shown_step_},
            {"clock", shown_in_graph_ ? "none: captured in a CUDA graph (collectives are not timed one by one)"
                      : nccl          ? "device (CUDA events)"
                                      : "host"},
            {"reduce_exposed_ms", exposed_ms_},
            {"gather_exposed_ms", gather_exposed_ms},
            {"exposed_ms", exposed},
            {"comm_ms", comm_ms},
            {"units_launched_in_backward", in_backward},
            {"bucket_bytes", in_.bucket_numel * esize()},
            {"last_rebuild", last_rebuild_},
            {"groups", gj},
            {"buckets", buckets}};
    if (nccl) j["exposed_step"] = device_exposed_.first;  // the step the device-timed exposed figures are from
    if (shown_in_graph_) j["in_graph"] = true, j["comm_ms"] = nullptr;
    return j;
  }

  nlohmann::json plan() const override {
    nlohmann::json j = {
        {"strategy", strategy_},
        {"reduce_dtype", dtype_ == at::kFloat ? "fp32" : "bf16"},
        {"world", world_size()},
        {"overlap", overlap_},
        {"bucket_numel", in_.bucket_numel},
        {"first_bucket_numel", in_.first_numel},
        {"bucket_bytes", in_.bucket_numel * esize()},
        // What the run was started with (Note [Resuming the plan]).
        {"configured", {{"strategy", configured_strategy_}, {"bucket_bytes", configured_bucket_bytes_}}},
        {"simple", {{"units", plan_json(simple_, params_)}}},
        {"hybrid", {{"units", plan_json(hybrid_, params_)}}}};
    if (shard_) {
      const ShardLayout& l = shard_->layout;
      j["sharded"] = {{"total", l.total}, {"chunk", l.chunk}, {"rank", l.rank}, {"begin", l.begin()},
                      {"end", l.end()}};
    }
    return j;
  }

  // Note [Resuming the plan]
  // A checkpoint's plan records the strategy and bucket size in use at the
  // save and the ones the run was configured with. On resume, a value that
  // the run changed at runtime (switch-strategy; a gcts.rebuild_interval
  // re-plan) is taken back when the resumed run's config still has the
  // configured value of the saved run: the user changed nothing, so the run
  // continues as it was. A config changed since wins (the user asked for
  // it), and so does a checkpoint written before the plan recorded these.
  // Neither value changes what an element is summed with (Note [GCTS
  // strategies]), so this is about keeping the measured bucket size and the
  // operator's choice, not about numbers.
  std::string restore_plan(const nlohmann::json& saved) override {
    if (!saved.contains("configured")) return "";
    const nlohmann::json& conf = saved.at("configured");
    std::string took;
    const std::string s = saved.value("strategy", strategy_);
    if (conf.value("strategy", std::string()) == configured_strategy_ && s != strategy_ &&
        (s == "simple" || s == "hybrid")) {
      took += "strategy " + s + " (switched at runtime; gcts.comm_strategy is " + configured_strategy_ + ")";
      strategy_ = s;
    }
    const int64_t bytes = saved.value("bucket_bytes", int64_t{0});
    if (conf.value("bucket_bytes", int64_t{-1}) == configured_bucket_bytes_ && bytes > 0 &&
        bytes != in_.bucket_numel * esize()) {
      if (!took.empty()) took += ", ";
      took += "bucket " + std::to_string(bytes) + " bytes (re-planned; gcts.bucket_mb gives " +
              std::to_string(in_.bucket_numel * esize()) + ")";
      in_.bucket_numel = std::max<int64_t>(1, bytes / esize());
      replan();
    }
    return took;
  }


 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    size_t unit = 0;
    const char* collective = "all-reduce";
    double bytes = 0;
    bool in_backward = false;
    Clock::time_point launched;
    Pending pending;
    std::function<void()> finish;  // unpack once the collective is done
  };
  // Note [Collective timings]
  // A collective's time_ms is from its launch to its completion (Gloo: the
  // backend's completion callback; NCCL: device events, Note [Collective
  // timings on the device] in world.hpp, known a step or so later, so
  // monitor-comm's `step` may trail the running one): what nccl-tests times,
  // so algbw = bytes / time_ms. Collectives queue behind each other (Gloo runs two at a time),
  // so a late one's time includes waiting; service_ms is the part after the
  // previous collective's completion (0 when it finished under it), the
  // re-planning fit's input. A group's time and the step's comm_ms are the
  // union of their collectives' [launch, completion] spans: wall time with
  // communication in flight.
  struct Timing {
    size_t unit = 0;
    std::string group, collective;
    double bytes = 0, ms = 0, service_ms = 0;
    Clock::time_point launched, done;
    bool in_backward = false;
    std::shared_ptr<const DeviceSpan> span;  // NCCL (Note [Collective timings on the device] in world.hpp)
  };

  // Launch/completion times and service times in launch order from
  // [launched, done] spans (Note [Collective timings]).
  static void service_times(std::vector<Timing>& ts) {
    Clock::time_point prev_done{};
    for (auto& t : ts) {
      const auto start = std::max(t.launched, prev_done);
      prev_done = std::max(prev_done, t.done);
      t.ms = std::chrono::duration<double, std::milli>(t.done - t.launched).count();
      t.service_ms = std::max(0.0, std::chrono::duration<double, std::milli>(t.done - start).count());
    }
  }

  // The step's timings become what monitor-comm shows and the re-planning
  // window's samples: at once on host clocks; on NCCL once their device spans
  // are done (a later step: the host runs ahead), re-timed from the spans on
  // one clock (the first span's start).
  void settle_timings() {
    const bool device = !timings_.empty() && timings_.front().span;
    if (!device) {
      shown_ = timings_, shown_step_ = step_;
      for (const auto& t : shown_)
        if (t.service_ms > 0) window_.push_back({t.bytes, t.service_ms});
      return;
    }
    unsettled_.emplace_back(step_, timings_);
    settle();
  }

  // Moves every unsettled step whose spans are done, oldest first, to what
  // monitor-comm shows and to the re-planning window; never waits.
  void settle() const {
    while (!unsettled_.empty()) {
      auto& [step, ts] = unsettled_.front();
      if (!std::all_of(ts.begin(), ts.end(), [](const Timing& t) { return t.span->done(); })) break;
      const Clock::time_point origin{};
      for (auto& t : ts) {
        const auto [a, b] = t.span->ms_from(*ts.front().span);
        t.launched = origin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(a));
        t.done = origin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(b));
      }
      service_times(ts);
      for (const auto& t : ts)
        if (t.service_ms > 0) window_.push_back({t.bytes, t.service_ms});
      shown_ = std::move(ts), shown_step_ = step, shown_in_graph_ = false;
      unsettled_.pop_front();
    }
    if (unsettled_.size() > 8) unsettled_.pop_front();  // never done: a stalled device; keep what is shown
  }

  static double union_ms(std::vector<std::pair<Clock::time_point, Clock::time_point>> spans) {
    std::sort(spans.begin(), spans.end());
    double total = 0;
    Clock::time_point end{};
    for (const auto& [a, b] : spans) {
      const auto from = std::max(a, end);
      if (b > from) total += std::chrono::duration<double, std::milli>(b - from).count();
      end = std::max(end, b);
    }
    return total;
  }

  const Plan& active() const { return strategy_ == "simple" ? simple_ : hybrid_; }
  bool has_rows() const {
    const auto& us = active().units;
    return std::any_of(us.begin(), us.end(), [](const Unit& u) { return u.kind == Unit::Kind::Embodiment; });
  }
  // A collective captured in a graph has no time of its own (Note [Reduction in the graph]).
  static void untimed(nlohmann::json& j) { j["time_ms"] = j["algbw_gbps"] = j["busbw_gbps"] = nullptr; }
  int64_t esize() const { return dtype_ == at::kFloat ? 4 : 2; }

  // Note [Re-planning]
  // Every gcts.rebuild_interval steps, rank 0 fits the collectives of the
  // last interval (every bucket of every step with a positive service time:
  // bytes b_i, service time t_i, Note [Collective timings]) to
  // t = alpha + beta * b by least squares:
  // alpha is the fixed cost of one call, 1 / beta the bandwidth. A bucket of
  // 9 * alpha / beta bytes spends 10% of its time on the fixed cost: larger
  // buckets gain little bandwidth and delay the first launch (less overlap),
  // smaller ones pay the latency again and again. The new size is that,
  // clamped to [max(64 KB, first bucket), min(1 GB, a quarter of the
  // gradient bytes)] (so that at least about four buckets are left to overlap
  // with backward: the fit knows nothing of overlap); it is taken when it differs
  // from the current one by more than 25% (else the plan stays). Rank 0
  // publishes its decision through the rendezvous store (World::agree, key
  // per step), so every rank re-plans at the same step with the same size;
  // plans are pure functions of it. Re-planning changes which call carries an
  // element, never what it is summed with (Note [GCTS strategies]). The fit
  // needs two distinct bucket sizes (the first bucket is smaller, so a plan
  // with more than one bucket has them); without them, or with a
  // non-positive slope, the plan stays. A resumed run continues with the
  // re-planned size (Note [Resuming the plan]).
  void rebuild() {
    nlohmann::json d = {{"step", step_}, {"samples", window_.size()}};
    if (world_->rank() == 0) decide(d);
    window_.clear();
    d = nlohmann::json::parse(world_->agree("gcts/rebuild/" + std::to_string(step_), d.dump()));
    const int64_t before = in_.bucket_numel * esize();
    if (d.value("replan", false)) {
      in_.bucket_numel = std::max<int64_t>(1, d.at("bucket_bytes").get<int64_t>() / esize());
      replan();
    }
    d["bucket_bytes_before"] = before;
    last_rebuild_ = d;
    LF_LOG(logger("comm"), info) << "gcts.rebuild_interval: step " << step_ << ": "
                                 << (d.value("replan", false) ? "re-planned, bucket " : "plan kept, bucket ")
                                 << before << " -> " << in_.bucket_numel * esize() << " bytes ("
                                 << d.value("reason", std::string()) << ")";
  }

  void decide(nlohmann::json& d) const {
    const auto n = static_cast<double>(window_.size());
    double mb = 0, mt = 0;
    for (const auto& [b, t] : window_) mb += b / n, mt += t / n;
    double cov = 0, var = 0;
    for (const auto& [b, t] : window_) cov += (b - mb) * (t - mt), var += (b - mb) * (b - mb);
    if (window_.size() < 2 || var <= 0) {
      d["replan"] = false, d["reason"] = "one bucket size measured: nothing to fit";
      return;
    }
    const double beta = cov / var, alpha = std::max(0.0, mt - beta * mb);  // ms per byte, ms
    d["alpha_ms"] = alpha;
    d["bandwidth_gbps"] = beta > 0 ? 1.0 / (beta * 1e6) : 0.0;
    if (beta <= 0) {
      d["replan"] = false, d["reason"] = "time does not grow with bytes: nothing to fit";
      return;
    }
    double total = 0;
    for (const auto& p : params_) total += static_cast<double>(p.numel * esize());
    const double lo = std::max(65536.0, static_cast<double>(in_.first_numel * esize()));
    const double hi = std::max(lo, std::min(1e9, total / 4.0));  // at least ~4 buckets to overlap
    const double target = std::min(hi, std::max(lo, 9.0 * alpha / beta));
    const double current = static_cast<double>(in_.bucket_numel * esize());
    d["bucket_bytes"] = static_cast<int64_t>(target);
    d["replan"] = std::abs(target - current) > 0.25 * current;
    d["reason"] = "alpha " + std::to_string(alpha) + " ms, " + std::to_string(d["bandwidth_gbps"].get<double>()) +
                  " GB/s: 9 alpha / beta = " + std::to_string(static_cast<int64_t>(9.0 * alpha / beta)) + " bytes";
  }

  void replan() {
    simple_ = make_simple_plan(in_);
    hybrid_ = make_hybrid_plan(in_);
  }

  void install_hooks(const std::vector<at::Tensor>& params) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.requires_grad() || !p.is_leaf())
        throw CommError("gcts.overlap: parameter " + params_[i].name + " is not a trainable leaf tensor");
      if (torch::autograd::impl::post_acc_grad_hooks(p))
        throw CommError("gcts.overlap: parameter " + params_[i].name +
                        " already has a post-accumulate-grad hook (set gcts.overlap=false)");
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<GradFinalHook>(this, i));
      hooked_.push_back(p);
    }
  }

  void reset_step(const std::vector<at::Tensor>& params) {
    live_ = params;
    count_.assign(params_.size(), 0);
    missing_.clear();
    for (const auto& u : active().units) missing_.push_back(static_cast<int64_t>(u.bucket.params.size()));
    next_ = 0;
    flight_.clear();
    timings_.clear();
    begun_ = true;
  }

  at::Tensor grad_or_zeros(size_t i) const {
    const at::Tensor& p = live_[i];
    return p.grad().defined() ? p.grad() : at::zeros_like(p, at::MemoryFormat::Contiguous);
  }

  // Copies the averaged flat gradient of parameter i where the optimizer reads it.
  void deliver(size_t i, const at::Tensor& avg) {
    if (shard_ && sharded_[i]) {
      for (const auto& s : shard_->layout.segments)
        if (s.param == i)
          shard_->grad.narrow(0, s.shard_offset, s.numel).copy_(avg.narrow(0, s.param_offset, s.numel));
      return;
    }
    at::Tensor p = live_[i];
    if (p.grad().defined())
      p.mutable_grad().copy_(avg.view(p.sizes()));
    else
      p.mutable_grad() = avg.view(p.sizes()).to(p.dtype()).clone();
  }

  // fp32 mean of a summed buffer.
  at::Tensor average(const at::Tensor& summed) const {
    at::Tensor f = summed.scalar_type() == at::kFloat ? summed : summed.to(at::kFloat);
    return f.div_(static_cast<double>(world_size()));
  }

  Pending all_reduce(const at::Tensor& flat) { return world_ ? world_->allreduce_sum_async(flat) : Pending(); }

  void launch(size_t u, bool in_backward) {
    at::NoGradGuard no_grad;
    const Unit& unit = active().units[u];
    InFlight f;
    f.unit = u;
    f.in_backward = in_backward;
    f.launched = Clock::now();
    switch (unit.kind) {
      case Unit::Kind::AllReduce: launch_all_reduce(unit, f); break;
      case Unit::Kind::ReduceScatter: launch_reduce_scatter(unit, f); break;
      case Unit::Kind::Embodiment: launch_embodiment(unit, f); break;
    }
    flight_.push_back(std::move(f));
  }

  // Packs the bucket into one flat buffer of the reduction dtype and all-reduces it.
  void launch_all_reduce(const Unit& unit, InFlight& f) {
    const Bucket& b = unit.bucket;
    at::Tensor flat = at::empty({b.numel}, live_[b.params.front()].options().dtype(dtype_));
    int64_t off = 0;
    for (size_t i : b.params) {
      flat.narrow(0, off, params_[i].numel).copy_(grad_or_zeros(i).reshape({-1}));
      off += params_[i].numel;
    }
    f.bytes = static_cast<double>(flat.numel() * flat.element_size());
    f.pending = all_reduce(flat);
    f.finish = [this, &b, flat] {
      const at::Tensor avg = average(flat);
      int64_t o = 0;
      for (size_t i : b.params) {
        deliver(i, avg.narrow(0, o, params_[i].numel));
        o += params_[i].numel;
      }
    };
  }

  // Copies the gradient elements of flat range [x, y) into dst (length y - x).
  void fill_flat(at::Tensor dst, int64_t x, int64_t y) {
    const ShardLayout& l = shard_->layout;
    if (shard_->local.defined()) {  // Note [Gradient views]: one copy of the range
      adopt_foreign(x, y);
      dst.copy_(shard_->local.narrow(0, x, y - x));
      return;
    }
    const int64_t end = std::min(y, l.total);
    if (end < y) dst.narrow(0, std::max<int64_t>(0, end - x), y - std::max(end, x)).zero_();
    for (size_t k = 0; k < l.sharded.size(); ++k) {
      const size_t i = l.sharded[k];
      const int64_t p0 = l.offsets[k], p1 = p0 + params_[i].numel;
      const int64_t a = std::max(p0, x), b = std::min(p1, end);
      if (a >= b) continue;
      dst.narrow(0, a - x, b - a).copy_(grad_or_zeros(i).reshape({-1}).narrow(0, a - p0, b - a));
    }
  }

  // Note [Gradient views]: the gradients in [x, y) of parameters whose .grad
  // is not their view into the flat buffer (a runner replaced it) go there.
  void adopt_foreign(int64_t x, int64_t y) {
    const ShardLayout& l = shard_->layout;
    for (size_t k = 0; k < l.sharded.size(); ++k) {
      const int64_t p0 = l.offsets[k], p1 = p0 + params_[l.sharded[k]].numel;
      if (p1 <= x || p0 >= y) continue;
      const at::Tensor& g = live_[l.sharded[k]].grad();
      if (g.defined() && !shard_->is_view_grad(k, g)) shard_->local.narrow(0, p0, p1 - p0).copy_(g.reshape({-1}));
    }
  }

  // Slice [a, b) of every rank's chunk, reduce-scattered: rank r receives its own.
  void launch_reduce_scatter(const Unit& unit, InFlight& f) {
    const ShardLayout& l = shard_->layout;
    const int64_t n = world_size(), a = unit.slice_begin, len = unit.slice_end - unit.slice_begin;
    const auto opts = shard_->grad.options().dtype(dtype_);
    at::Tensor flat = at::empty({n * len}, opts);
    std::vector<at::Tensor> inputs;
    for (int64_t r = 0; r < n; ++r) {
      inputs.push_back(flat.narrow(0, r * len, len));
      fill_flat(inputs.back(), r * l.chunk + a, r * l.chunk + a + len);
    }
    f.collective = "reduce-scatter";
    f.bytes = static_cast<double>(n * len * flat.element_size());
    at::Tensor out = world_ ? at::empty({len}, opts) : inputs.front();
    if (world_) f.pending = world_->reduce_scatter_sum_async(out, std::move(inputs));
    f.finish = [this, out, a, len] { shard_->grad.narrow(0, a, len).copy_(average(out.clone())); };
  }

  // Note [Embodiment rows]
  // Per-embodiment parameters (dim 0 = slot) reduce only the rows of slots
  // some rank's batch indexed: the model reads a slot's row only for samples
  // of that embodiment (batch "embodiment_id"), so any other row's gradient
  // is zero on every rank and its mean is the zero it already is. The slots
  // come from agree_counts(), already united over ranks on the hosts; the
  // index tensor is cached per slot set (a dataset has one embodiment), so
  // the step neither reads the device nor copies to it. Without them (a
  // caller that did not agree the counts) the rows are found from the
  // gradients: non-zero rows, united by an all-reduce of the row masks, then
  // nonzero(), which waits for the device. Either way the same rows hold the
  // same sums (the known slots may add rows that are zero everywhere).
  at::Tensor slot_index(int64_t slots, c10::Device device) {
    std::vector<int64_t> ids;
    for (int64_t s : slots_) {
      if (s < 0 || s >= slots)
        throw CommError("gcts.sparse_embodiment: embodiment slot " + std::to_string(s) +
                        " is outside the per-embodiment parameters' " + std::to_string(slots) +
                        " slots (the dataset's embodiment_id must be below the model's embodiment count)");
      ids.push_back(s);
    }
    const auto key = std::make_pair(ids, slots);
    auto it = slot_index_.find(key);
    if (it == slot_index_.end())
      it = slot_index_.emplace(key, at::tensor(ids, at::TensorOptions().dtype(at::kLong)).to(device)).first;
    return it->second;
  }

  void launch_embodiment(const Unit& unit, InFlight& f) {
    const std::vector<size_t>& emb = unit.bucket.params;
    if (slots_known_) {
      std::vector<at::Tensor> rows, index;
      for (size_t i : emb) {
        index.push_back(slot_index(params_[i].shape[0], live_[i].device()));
        rows.push_back(grad_or_zeros(i).index_select(0, index.back()).reshape({-1}).to(dtype_));
      }
      reduce_rows(emb, std::move(rows), std::move(index), f);
      return;
    }
    std::vector<at::Tensor> masks;
    for (size_t i : emb) {
      const at::Tensor& p = live_[i];
      const int64_t slots = params_[i].shape[0];
      masks.push_back(p.grad().defined() ? p.grad().reshape({slots, -1}).ne(0).any(1).to(at::kInt)
                                         : at::zeros({slots}, p.options().dtype(at::kInt)));
    }
    at::Tensor mask = at::cat(masks).to(world_ ? world_->device() : masks.front().device());
    if (world_) {
      std::vector<at::Tensor> t = {mask};
      world_->allreduce_sum(t);
      f.bytes += static_cast<double>(mask.numel() * 4);
    }
    mask = mask.to(masks.front().device());
    std::vector<at::Tensor> rows, index;
    int64_t off = 0;
    for (size_t i : emb) {
      const int64_t slots = params_[i].shape[0];
      index.push_back(mask.narrow(0, off, slots).nonzero().reshape({-1}));
      off += slots;
      rows.push_back(grad_or_zeros(i).index_select(0, index.back()).reshape({-1}).to(dtype_));
    }
    reduce_rows(emb, std::move(rows), std::move(index), f);
  }

  // The selected rows of every per-embodiment parameter in one all-reduce; their means go back to those rows.
  void reduce_rows(const std::vector<size_t>& emb, std::vector<at::Tensor> rows, std::vector<at::Tensor> index,
                   InFlight& f) {
    at::Tensor flat = at::cat(rows);
    f.bytes += static_cast<double>(flat.numel() * flat.element_size());
    f.pending = all_reduce(flat);
    f.finish = [this, &emb, flat, index] {
      const at::Tensor avg = average(flat);
      int64_t o = 0;
      for (size_t k = 0; k < emb.size(); ++k) {
        const size_t i = emb[k];
        at::Tensor p = live_[i];
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
        auto shape = p.sizes().vec();
        shape[0] = index[k].numel();
        const int64_t m = index[k].numel() * (params_[i].numel / params_[i].shape[0]);
        p.mutable_grad().index_copy_(0, index[k], avg.narrow(0, o, m).view(shape));
        o += m;
      }
    };
  }

  // Waits for every unit in launch order (Note [Collective timings]).
  void finish_all() {
    for (auto& f : flight_) {
      f.pending.wait();
      f.finish();
      Timing t;
      t.done = f.pending.finished_at();
      t.launched = f.launched;
      t.unit = f.unit, t.group = active().units[f.unit].group, t.collective = f.collective, t.bytes = f.bytes;
      t.in_backward = f.in_backward;
      t.span = f.pending.span();
      timings_.push_back(std::move(t));
    }
    service_times(timings_);
    flight_.clear();
  }

  World* world_;
  std::vector<ReducedParam> params_;
  ShardTarget* shard_;
  std::string strategy_;
  at::ScalarType dtype_;
  bool overlap_;
  int64_t rebuild_interval_;
  std::string configured_strategy_;
  int64_t configured_bucket_bytes_;
  PlanInputs in_;
  Plan simple_, hybrid_;
  std::vector<bool> sharded_;
  std::vector<at::Tensor> hooked_;  // parameters carrying our hook
  std::vector<int64_t> slots_;      // this step's embodiment slots (agree_counts), valid while slots_known_
  bool slots_known_ = false;
  std::map<std::pair<std::vector<int64_t>, int64_t>, at::Tensor> slot_index_;  // (slots, slot count) -> device index

  // This step (reset_step).
  std::vector<at::Tensor> live_;
  std::vector<int64_t> count_, missing_;
  size_t next_ = 0;
  int64_t micro_batches_ = 1;
  bool armed_ = false, begun_ = false;
  std::vector<InFlight> flight_;

  // The last finished step, for monitor-comm; the re-planning window.
  std::vector<Timing> timings_;
  // Measurements, settled lazily (comm_status() is const): NCCL steps whose
  // device spans are not done yet; monitor-comm's newest settled step.
  mutable std::deque<std::pair<int64_t, std::vector<Timing>>> unsettled_;
  mutable std::vector<Timing> shown_;
  mutable int64_t shown_step_ = 0;
  mutable std::vector<std::pair<double, double>> window_;  // (bytes, ms) per collective since the last re-plan
  nlohmann::json last_rebuild_ = nullptr;
  double exposed_ms_ = 0;
  std::pair<int64_t, double> device_exposed_{0, 0.0};  // (step, ms): the trainer's device timing
  // Note [Reduction in the graph]: the units the captured graph carries; a replay this step.
  std::map<std::string, std::vector<Timing>> graph_units_;  // per graph key
  bool replayed_ = false;
  mutable bool shown_in_graph_ = false;
  int64_t step_ = 0;
};

void GradFinalHook::operator()(const torch::autograd::Variable&) { reducer->grad_accumulated(index); }

}  // namespace

std::unique_ptr<GradientReducer> make_reducer(const config::Config& cfg, World* world, std::vector<ReducedParam> params,
                                              ShardTarget* shard, bool overlap) {
  return std::make_unique<GctsReducer>(cfg, world, std::move(params), shard, overlap);
}

}  // namespace loongforge::gcts
