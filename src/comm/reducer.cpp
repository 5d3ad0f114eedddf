// The GradientReducers (reducer.hpp): none on one rank, the plain flat
// all-reduce (GCTS off), and GCTS's `simple` and `hybrid` strategies.
#include "loongforge/comm/reducer.hpp"

#include <algorithm>  // std::max
#include <chrono>     // std::chrono
#include <map>        // std::map

#include <ATen/ATen.h>  // at::full, at::empty, at::cat

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"

namespace loongforge::comm {

nlohmann::json GradientReducer::switch_strategy(const std::string&) {
  throw CommError("switch-strategy needs GCTS (gcts.enable=true); this run uses " + strategy());
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// nccl-tests' bus bandwidth factors: what each rank's link carries per byte of
// the collective's data.
double bus_factor(const std::string& collective, double n) {
  if (n <= 1) return 0.0;
  if (collective == "all-reduce") return 2.0 * (n - 1.0) / n;
  return (n - 1.0) / n;  // reduce-scatter, all-gather
}

nlohmann::json group_json(const std::string& name, const std::string& collective, double bytes, double ms,
                          int64_t calls, double n) {
  const double algbw = ms > 0 ? bytes / (ms * 1e6) : 0.0;
  return {{"name", name},       {"collective", collective}, {"bytes", bytes},
          {"time_ms", ms},      {"calls", calls},           {"algbw_gbps", algbw},
          {"busbw_gbps", algbw * bus_factor(collective, n)}};
}

class LocalReducer final : public GradientReducer {
 public:
  int64_t world_size() const override { return 1; }
  int64_t sum_counts(int64_t local) override { return local; }
  void average_gradients(const std::vector<at::Tensor>&, PhaseRecorder&, int64_t) override {}
  at::Tensor sum_scalar(const at::Tensor& scalar) override { return scalar; }
  std::string strategy() const override { return "none (1 rank: no gradient communication)"; }
  nlohmann::json comm_status() const override { return nullptr; }
};

// Sums over ranks shared by the plain and GCTS reducers.
int64_t sum_count(World& world, int64_t local) {
  std::vector<at::Tensor> t = {at::full({1}, local, at::TensorOptions().dtype(at::kLong).device(world.device()))};
  world.allreduce_sum(t);
  return t[0].item<int64_t>();
}

at::Tensor sum_device_scalar(World& world, const at::Tensor& scalar) {
  // Gloo reduces host tensors: the logged loss crosses to the host there.
  std::vector<at::Tensor> t = {scalar.to(world.device()).reshape({1}).clone()};
  world.allreduce_sum(t);
  return t[0].reshape({}).to(scalar.device());
}

class AllReduceReducer final : public GradientReducer {
 public:
  explicit AllReduceReducer(World& world) : world_(world), sync_(world) {}
  int64_t world_size() const override { return world_.size(); }
  int64_t sum_counts(int64_t local) override { return sum_count(world_, local); }

  void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) override {
    Phase p(phases, "comm/all-reduce", step + 1);
    last_ = sync_.average(params);
  }

  at::Tensor sum_scalar(const at::Tensor& scalar) override { return sum_device_scalar(world_, scalar); }

  std::string strategy() const override {
    return "plain (one fp32 all-reduce after backward; gcts.enable=false)";
  }

  nlohmann::json comm_status() const override {
    return {{"world", world_.size()},
            {"groups", nlohmann::json::array({group_json("all-reduce", "all-reduce", last_.bytes, last_.ms, 1,
                                                         static_cast<double>(world_.size()))})}};
  }

 private:
  World& world_;
  GradientSync sync_;
  SyncStats last_;
};

// ---------------------------------------------------------------------------
// GCTS
//
// Note [GCTS strategies]
// Both strategies reduce after backward, on the trainer thread, with every
// bucket's collective launched before the first is waited for (the
// backend's threads or streams run them while the next bucket is packed).
// Gradients are packed into flat buffers of gcts.reduce_dtype, summed, then
// divided by the world size in fp32: with fp32 and two ranks every element is
// (a + b) / 2 whatever the bucket, so the strategies agree bit for bit; with
// more ranks only the collective's summation order differs.
//  - simple: parameters in optimizer order, cut into buckets of
//    gcts.bucket_mb (the first of gcts.first_bucket_mb), all-reduced.
//  - hybrid: (1) tensors up to gcts.tiny_tensor_kb in one coalesced
//    all-reduce, launched first (latency-bound: one call instead of dozens);
//    (2) unsharded, with gcts.sparse_embodiment: per-embodiment parameters
//    (dim 0 = slot) reduce only the slot rows that hold a non-zero gradient
//    on some rank (one small all-reduce of the row masks, then the selected
//    rows in one coalesced all-reduce); rows zero on every rank average to
//    zero, which they already are; (3) the rest in buckets of backward-readiness
//    order, approximated as reverse definition order (the order autograd
//    produces gradients for a module written top to bottom, as DDP assumes),
//    the first bucket small; all-reduced, or with a sharded optimizer
//    reduce-scattered straight into each rank's shard (Note [Flat shards]):
//    bucket k is the k-th slice of every rank's range, so rank r receives
//    slice k of its own range.
// With a sharded optimizer, `simple` all-reduces everything and keeps this
// rank's range: the shard layout does not depend on the strategy, which is
// what lets switch-strategy change it between any two steps.

struct Bucket {
  std::vector<size_t> params;  // indices, in pack order
  int64_t numel = 0;
};

// Cuts `order` into buckets: the first up to first_numel elements, the rest
// up to bucket_numel; a tensor larger than a bucket gets one of its own.
std::vector<Bucket> cut_buckets(const std::vector<size_t>& order, const std::vector<ReducedParam>& params,
                                int64_t first_numel, int64_t bucket_numel) {
  std::vector<Bucket> out;
  Bucket cur;
  for (size_t i : order) {
    const int64_t cap = out.empty() ? first_numel : bucket_numel;
    if (!cur.params.empty() && cur.numel + params[i].numel > cap) {
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
    cur.params.push_back(i);
    cur.numel += params[i].numel;
  }
  if (!cur.params.empty()) out.push_back(std::move(cur));
  return out;
}

class GctsReducer final : public GradientReducer {
 public:
  GctsReducer(const config::Config& cfg, World* world, std::vector<ReducedParam> params, ShardTarget* shard)
      : world_(world), params_(std::move(params)), shard_(shard), strategy_(cfg.gcts.comm_strategy),
        dtype_(cfg.gcts.reduce_dtype == "bf16" ? at::kBFloat16 : at::kFloat),
        sparse_embodiment_(cfg.gcts.sparse_embodiment) {
    const int64_t esize = dtype_ == at::kFloat ? 4 : 2;
    bucket_numel_ = std::max<int64_t>(1, static_cast<int64_t>(cfg.gcts.bucket_mb * 1e6) / esize);
    first_numel_ = std::max<int64_t>(1, static_cast<int64_t>(cfg.gcts.first_bucket_mb * 1e6) / esize);
    const auto tiny_numel = static_cast<int64_t>(cfg.gcts.tiny_tensor_kb * 1024.0 / 4.0);
    std::vector<size_t> all, dense;
    for (size_t i = 0; i < params_.size(); ++i) all.push_back(i);
    simple_ = cut_buckets(all, params_, first_numel_, bucket_numel_);
    if (shard_) {
      tiny_.params = shard_->layout.replicated;
      for (size_t i : tiny_.params) tiny_.numel += params_[i].numel;
      sharded_.assign(params_.size(), false);
      for (size_t i : shard_->layout.sharded) sharded_[i] = true;
    } else {
      for (size_t k = params_.size(); k-- > 0;) {  // reverse definition order (Note [GCTS strategies])
        if (params_[k].numel <= tiny_numel) {
          tiny_.params.push_back(k);
          tiny_.numel += params_[k].numel;
        } else if (sparse_embodiment_ && params_[k].embodiment && !params_[k].shape.empty()) {
          embodiment_.push_back(k);
        } else {
          dense.push_back(k);
        }
      }
      dense_ = cut_buckets(dense, params_, first_numel_, bucket_numel_);
    }
  }

  int64_t world_size() const override { return world_ ? world_->size() : 1; }
  int64_t sum_counts(int64_t local) override { return world_ ? sum_count(*world_, local) : local; }
  at::Tensor sum_scalar(const at::Tensor& scalar) override {
    return world_ ? sum_device_scalar(*world_, scalar) : scalar;
  }

  void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) override {
    if (!world_ && !shard_) return;  // one rank, replicated state: the gradients are the mean already
    const std::string phase = "comm/" + strategy_;
    Phase p(phases, phase.c_str(), step + 1);
    at::NoGradGuard no_grad;
    stats_.clear();
    t0_ = Clock::now();
    if (strategy_ == "simple")
      run_simple(params);
    else
      run_hybrid(params);
  }

  std::string strategy() const override {
    std::string s = strategy_ + " (GCTS, " + (dtype_ == at::kFloat ? "fp32" : "bf16") + " reduction";
    if (shard_) s += ", sharded optimizer";
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
    const double n = static_cast<double>(world_->size());
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& [name, g] : stats_) groups.push_back(group_json(name, g.collective, g.bytes, g.ms, g.calls, n));
    if (shard_ && shard_->gather_bytes > 0)
      groups.push_back(
          group_json("parameters (sharded optimizer)", "all-gather", shard_->gather_bytes, shard_->gather_ms, 1, n));
    return {{"world", world_->size()}, {"strategy", strategy_}, {"groups", groups}};
  }

  nlohmann::json plan() const override {
    auto names = [&](const std::vector<size_t>& idx) {
      nlohmann::json a = nlohmann::json::array();
      for (size_t i : idx) a.push_back(params_[i].name);
      return a;
    };
    auto buckets = [&](const std::vector<Bucket>& bs) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& b : bs) a.push_back({{"numel", b.numel}, {"params", names(b.params)}});
      return a;
    };
    nlohmann::json j = {{"strategy", strategy_},
                        {"reduce_dtype", dtype_ == at::kFloat ? "fp32" : "bf16"},
                        {"world", world_size()},
                        {"simple", {{"buckets", buckets(simple_)}}},
                        {"hybrid",
                         {{"tiny_coalesced", {{"numel", tiny_.numel}, {"params", names(tiny_.params)}}},
                          {"embodiment_sparse", names(embodiment_)},
                          {"dense_buckets", buckets(dense_)}}}};
    if (shard_) {
      const ShardLayout& l = shard_->layout;
      j["sharded"] = {{"total", l.total}, {"chunk", l.chunk}, {"rank", l.rank}, {"begin", l.begin()},
                      {"end", l.end()},   {"reduce_scatter_slices", slices().size()}};
    }
    return j;
  }

 private:
  struct GroupStats {
    std::string collective;
    double bytes = 0, ms = 0;
    int64_t calls = 0;
  };
  struct InFlight {
    std::string group;
    Pending pending;
    std::function<void()> finish;  // unpack once the collective is done
  };

  at::Tensor grad_or_zeros(const at::Tensor& p) const {
    return p.grad().defined() ? p.grad() : at::zeros_like(p, at::MemoryFormat::Contiguous);
  }

  // Copies the averaged flat gradient of parameter i where the optimizer reads it.
  void deliver(const std::vector<at::Tensor>& params, size_t i, const at::Tensor& avg) {
    if (shard_ && sharded_[i]) {
      for (const auto& s : segments_of(i))
        shard_->grad.narrow(0, s.shard_offset, s.numel).copy_(avg.narrow(0, s.param_offset, s.numel));
      return;
    }
    at::Tensor p = params[i];
    if (p.grad().defined())
      p.mutable_grad().copy_(avg.view(p.sizes()));
    else
      p.mutable_grad() = avg.view(p.sizes()).to(p.dtype()).clone();
  }

  std::vector<ShardLayout::Segment> segments_of(size_t i) const {
    std::vector<ShardLayout::Segment> out;
    for (const auto& s : shard_->layout.segments)
      if (s.param == i) out.push_back(s);
    return out;
  }

  // Packs `b` into one flat buffer of the reduction dtype and all-reduces it.
  void launch_all_reduce(const std::vector<at::Tensor>& params, const Bucket& b, const std::string& group,
                         std::vector<InFlight>& flight) {
    if (b.params.empty()) return;
    at::Tensor flat = at::empty({b.numel}, params[b.params.front()].options().dtype(dtype_));
    int64_t off = 0;
    for (size_t i : b.params) {
      flat.narrow(0, off, params_[i].numel).copy_(grad_or_zeros(params[i]).reshape({-1}));
      off += params_[i].numel;
    }
    InFlight f;
    f.group = group;
    f.pending = collective_all_reduce(flat, group, "all-reduce");
    f.finish = [this, &params, &b, flat] {
      const at::Tensor avg = average(flat);
      int64_t o = 0;
      for (size_t i : b.params) {
        deliver(params, i, avg.narrow(0, o, params_[i].numel));
        o += params_[i].numel;
      }
    };
    flight.push_back(std::move(f));
  }

  Pending collective_all_reduce(const at::Tensor& flat, const std::string& group, const char* collective) {
    GroupStats& g = stats_[group];
    g.collective = collective;
    g.bytes += static_cast<double>(flat.numel() * flat.element_size());
    g.calls += 1;
    return world_ ? world_->allreduce_sum_async(flat) : Pending();
  }

  // fp32 mean of a summed buffer.
  at::Tensor average(const at::Tensor& summed) const {
    at::Tensor f = summed.scalar_type() == at::kFloat ? summed : summed.to(at::kFloat);
    return f.div_(static_cast<double>(world_size()));
  }

  void finish_all(std::vector<InFlight>& flight) {
    for (auto& f : flight) {
      f.pending.wait();
      f.finish();
      stats_[f.group].ms = ms_since(t0_);  // completion time of the group's last collective
    }
    flight.clear();
  }

  void run_simple(const std::vector<at::Tensor>& params) {
    std::vector<InFlight> flight;
    for (const auto& b : simple_) launch_all_reduce(params, b, "all-reduce (buckets)", flight);
    finish_all(flight);
  }

  void run_hybrid(const std::vector<at::Tensor>& params) {
    std::vector<InFlight> flight;
    launch_all_reduce(params, tiny_, "tiny tensors (coalesced)", flight);
    if (shard_) {
      launch_reduce_scatter(params, flight);
    } else {
      launch_sparse_embodiment(params, flight);
      for (const auto& b : dense_) launch_all_reduce(params, b, "dense (buckets)", flight);
    }
    finish_all(flight);
  }

  // Per-rank slice bounds [a, b) inside the chunk for the strided
  // reduce-scatter buckets (Note [GCTS strategies]).
  std::vector<std::pair<int64_t, int64_t>> slices() const {
    std::vector<std::pair<int64_t, int64_t>> out;
    const int64_t n = world_size(), chunk = shard_->layout.chunk;
    int64_t a = 0;
    while (a < chunk) {
      const int64_t len = std::max<int64_t>(1, (out.empty() ? first_numel_ : bucket_numel_) / n);
      out.emplace_back(a, std::min(chunk, a + len));
      a = out.back().second;
    }
    return out;
  }

  void launch_reduce_scatter(const std::vector<at::Tensor>& params, std::vector<InFlight>& flight) {
    const ShardLayout& l = shard_->layout;
    if (l.chunk == 0) return;
    const int64_t n = world_size();
    const auto opts = shard_->grad.options().dtype(dtype_);
    at::Tensor flat = at::empty({n * l.chunk}, opts);  // every rank's range, padded
    for (size_t k = 0; k < l.sharded.size(); ++k) {
      const size_t i = l.sharded[k];
      flat.narrow(0, l.offsets[k], params_[i].numel).copy_(grad_or_zeros(params[i]).reshape({-1}));
    }
    if (n * l.chunk > l.total) flat.narrow(0, l.total, n * l.chunk - l.total).zero_();
    at::Tensor out = world_ ? at::empty({l.chunk}, opts) : flat;
    const std::string group = "dense (reduce-scatter into shards)";
    for (const auto& [a, b] : slices()) {
      GroupStats& g = stats_[group];
      g.collective = "reduce-scatter";
      g.bytes += static_cast<double>(n * (b - a) * flat.element_size());
      g.calls += 1;
      InFlight f;
      f.group = group;
      if (world_) {
        std::vector<at::Tensor> inputs;
        for (int64_t r = 0; r < n; ++r) inputs.push_back(flat.narrow(0, r * l.chunk + a, b - a));
        f.pending = world_->reduce_scatter_sum_async(out.narrow(0, a, b - a), std::move(inputs));
      }
      const int64_t a0 = a, b0 = b;
      f.finish = [this, out, a0, b0] {
        shard_->grad.narrow(0, a0, b0 - a0).copy_(average(out.narrow(0, a0, b0 - a0).clone()));
      };
      flight.push_back(std::move(f));
    }
  }

  void launch_sparse_embodiment(const std::vector<at::Tensor>& params, std::vector<InFlight>& flight) {
    if (embodiment_.empty()) return;
    // Which slot rows hold gradient on some rank.
    std::vector<at::Tensor> masks;
    for (size_t i : embodiment_) {
      const at::Tensor& p = params[i];
      const int64_t slots = params_[i].shape[0];
      masks.push_back(p.grad().defined() ? p.grad().reshape({slots, -1}).ne(0).any(1).to(at::kInt)
                                         : at::zeros({slots}, p.options().dtype(at::kInt)));
    }
    at::Tensor mask = at::cat(masks).to(world_ ? world_->device() : masks.front().device());
    if (world_) {
      std::vector<at::Tensor> t = {mask};
      world_->allreduce_sum(t);
      GroupStats& g = stats_["embodiment slot masks"];
      g.collective = "all-reduce", g.bytes += static_cast<double>(mask.numel() * 4), g.calls += 1;
    }
    mask = mask.to(masks.front().device());
    // The selected rows of every embodiment parameter, in one buffer.
    std::vector<at::Tensor> rows, index;
    int64_t off = 0, numel = 0;
    for (size_t k = 0; k < embodiment_.size(); ++k) {
      const size_t i = embodiment_[k];
      const int64_t slots = params_[i].shape[0];
      index.push_back(mask.narrow(0, off, slots).nonzero().reshape({-1}));
      off += slots;
      rows.push_back(grad_or_zeros(params[i]).index_select(0, index.back()).reshape({-1}).to(dtype_));
      numel += rows.back().numel();
    }
    at::Tensor flat = at::cat(rows);
    InFlight f;
    f.group = "embodiment (used slot rows)";
    f.pending = collective_all_reduce(flat, f.group, "all-reduce");
    f.finish = [this, &params, flat, index] {
      const at::Tensor avg = average(flat);
      int64_t o = 0;
      for (size_t k = 0; k < embodiment_.size(); ++k) {
        at::Tensor p = params[embodiment_[k]];
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
        auto shape = p.sizes().vec();
        shape[0] = index[k].numel();
        const int64_t n = index[k].numel() * (params_[embodiment_[k]].numel / params_[embodiment_[k]].shape[0]);
        p.mutable_grad().index_copy_(0, index[k], avg.narrow(0, o, n).view(shape));
        o += n;
      }
    };
    (void)numel;
    flight.push_back(std::move(f));
  }

  World* world_;
  std::vector<ReducedParam> params_;
  ShardTarget* shard_;
  std::string strategy_;
  at::ScalarType dtype_;
  bool sparse_embodiment_;
  int64_t bucket_numel_ = 0, first_numel_ = 0;
  std::vector<Bucket> simple_, dense_;
  Bucket tiny_;
  std::vector<size_t> embodiment_;
  std::vector<bool> sharded_;
  std::map<std::string, GroupStats> stats_;
  Clock::time_point t0_;
};

std::string check_strategy(const nlohmann::json& args) {
  const auto it = args.find("strategy");
  const std::string s = it != args.end() && it->is_string() ? it->get<std::string>() : std::string("(not a string)");
  if (s == "simple" || s == "hybrid") return "";
  return "strategy must be simple or hybrid, got '" + s.substr(0, 32) + "'";
}

}  // namespace

std::unique_ptr<GradientReducer> make_plain_reducer(World* world) {
  if (!world) return std::make_unique<LocalReducer>();
  return std::make_unique<AllReduceReducer>(*world);
}

std::unique_ptr<GradientReducer> make_gcts_reducer(const config::Config& cfg, World* world,
                                                   std::vector<ReducedParam> params, ShardTarget* shard) {
  return std::make_unique<GctsReducer>(cfg, world, std::move(params), shard);
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "gcts";
  e.title = "GCTS";
  e.what = "gradient communication scheduling";
  e.arrives_with = "the GCTS and NCCL issue";
  e.built = kGctsBuilt;
  e.enabled = kGctsBuilt && cfg.gcts.enable;
  e.verbs.push_back(EngineVerb{"switch-strategy", false, check_strategy, nullptr, /*cluster=*/true});
  e.verbs.push_back(EngineVerb{"hot-rejoin", false, nullptr, nullptr, false});
  return e;
}

void attach(Engine& e, GradientReducer& reducer) {
  GradientReducer* r = &reducer;
  for (auto& v : e.verbs)
    if (v.name == "switch-strategy")
      v.run = [r](const nlohmann::json& args) { return r->switch_strategy(args.at("strategy").get<std::string>()); };
  e.status = [r] { return nlohmann::json{{"strategy", r->strategy()}}; };
  e.save_state = [r] { return r->plan(); };
}

}  // namespace loongforge::comm
