// Trainer: losing a rank and training on (fault.enable; docs/fault-tolerance.md).
//
// Note [Training on after a lost rank]
// A collective (or the step's host exchange) that fails raises CommError out
// of step(). With fault.enable, run() hands it to recover() instead of
// ending the job:
//  1. The step's partial gradients are dropped: nothing of the failed step
//     reached the parameters (a replicated optimizer updates only after every
//     collective of the step has completed on this rank).
//  2. fault::regroup() (Note [Regroup] in src/fault/regroup.cpp) names the
//     survivors, the lost ranks and the step to continue from: the most
//     steps any survivor applied (a collective may complete on some ranks and
//     fail on others, so survivors can be one update apart).
//  3. The survivors open the next generation's World (Note [Regrouped
//     worlds] in world.hpp) and copy the full state -- fp32 weights, AdamW
//     moments and step counts -- from the survivor that applied the most
//     steps, in memory (one broadcast per dtype): no checkpoint is read, and
//     every survivor holds the same parameters afterwards.
//  4. What depends on the world is rebuilt as a resume on another world size
//     builds it (docs/training-semantics.md): the global batch is kept by
//     raising the accumulation (refused, with a checkpoint, where the new
//     world size does not divide it), the data order is re-sharded (each
//     rank's samples of a step follow from its new rank), and the gradient
//     reducer (GCTS's plan too) is made for the new world.
//  5. The interrupted step is taken again, on the new world. So the run from
//     there equals a run restarted on the survivors from a checkpoint of
//     that step (test/comm/test_fault_tolerance.py checks it bitwise).
// Below fault.min_world_size survivors, or where the global batch cannot be
// kept, rank 0 writes a checkpoint of the agreed step and every rank stops
// with a message naming it. Not covered yet: a sharded optimizer (the lost
// rank's moments are gone with it), GPUs (NCCL), the loss of rank 0 (it
// serves the rendezvous store), and taking a restarted rank back
// (hot-rejoin).
#include <algorithm>  // std::min
#include <map>        // std::map

#include <ATen/ATen.h>  // at::cat
#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store

#include "control_plane.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/engines/adfe/adfe.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {

namespace {
double s_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out.empty() ? "none" : out;
}

// `tensors` of every rank <- those of `root`: one broadcast per dtype, through a flat buffer.
void broadcast_flat(comm::World& world, const std::vector<at::Tensor>& tensors, int64_t root) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  at::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape({-1}));
    std::vector<at::Tensor> flat = {at::cat(flat_parts).contiguous()};
    world.broadcast(flat, root);
    int64_t off = 0;
    for (auto& t : group) {
      t.detach().copy_(flat[0].narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}
}  // namespace

// The heartbeat, and what fault tolerance cannot cover yet refused at start.
void Trainer::Impl::open_fault() {
  fault_ = cfg_.fault.enable;
  job_rank_ = world_info_.rank;
  for (int64_t r = 0; r < world_info_.world_size; ++r) members_.push_back(r);
  if (!fault_) return;
  if (!world_) {
    LF_LOG(logger("trainer"), warn) << "fault.enable has no effect on one rank (there is no other rank to lose)";
    fault_ = false;
    return;
  }
  const std::string at = cfg_.origin.count("fault.enable") ? cfg_.origin["fault.enable"] + ": " : "";
  if (world_->backend() != comm::Backend::Gloo)
    throw ConfigError(at + "fault.enable: training on after a lost rank works on CPU ranks over Gloo; this job's "
                           "ranks are GPUs over NCCL, where it is not built yet: set fault.enable=false");
  if (cfg_.gcts.enable && cfg_.gcts.shard_optimizer)
    throw ConfigError(at + "fault.enable with gcts.shard_optimizer=true: a lost rank takes its shard of the AdamW "
                           "state with it, and recovering it from the last checkpoint is not built yet: set "
                           "gcts.shard_optimizer=false (the replicated optimizer) or fault.enable=false");
  heartbeat_ = std::make_unique<fault::Heartbeat>(world_info_, job_rank_, cfg_.fault.heartbeat_s);
}

// From the second step on, a collective that hangs fails after fault.comm_timeout_s (the first step keeps the
// rendezvous timeout: ranks reach it after loading at their own pace).
void Trainer::Impl::after_first_step() {
  if (!fault_ || comm_timeout_set_) return;
  world_->set_timeout(static_cast<int64_t>(cfg_.fault.comm_timeout_s * 1000));
  comm_timeout_set_ = true;
}

// Step 3 of Note [Training on after a lost rank]: every rank's weights, moments and step counts <- `root`'s.
void Trainer::Impl::copy_state_from(int64_t root) {
  std::vector<at::Tensor> tensors;
  std::vector<bool> separate_master;
  for (const auto& p : optimizer_->params()) {
    const at::Tensor m = optimizer_->master_weight(p);
    separate_master.push_back(!m.is_same(p));
    tensors.push_back(m);
  }
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, t] : optimizer_->state_tensors()) tensors.push_back(t), state[name] = t;
  broadcast_flat(*world_, tensors, root);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < optimizer_->params().size(); ++i)
    if (separate_master[i]) optimizer_->load_weight(optimizer_->params()[i], tensors[i]);
  // The step counts (bias correction) travel through the store.
  const std::string key = "lf/ft/" + std::to_string(generation_) + "/optimizer";
  auto& store = world_->store();
  if (world_info_.rank == root) {
    const std::string j = optimizer_->state_json().dump();
    store.set(key, std::vector<uint8_t>(j.begin(), j.end()));
  }
  const auto v = store.get(key);
  optimizer_->load_state(state, nlohmann::json::parse(std::string(v.begin(), v.end())));
}

// Stops the job where it cannot go on, after rank 0 has checkpointed the agreed step.
void Trainer::Impl::stop_after_regroup(const std::string& why) {
  std::string where = "no checkpoint was written (rank 0 writes it)";
  if (leader_) {
    save(steps_done_);
    if (writer_) writer_->wait();
    collect_writes();
    where = "rank 0 wrote a checkpoint of step " + std::to_string(steps_done_) + " to " + last_ckpt_;
  }
  world_->barrier();
  throw TrainingError(why + "; " + where + ": restart the job on a world size that works with checkpoint.resume=latest");
}

void Trainer::Impl::recover(const CommError& error) {
  const auto& log = logger("trainer");
  const auto t0 = Clock::now();
  const double into_step_s = std::chrono::duration<double>(t0 - step_began_).count();
  const int64_t failed_step = steps_done_ + 1;
  const int64_t world_before = world_info_.world_size, rank_before = world_info_.rank;
  LF_LOG(log, warn) << "step " << failed_step << " failed " << into_step_s << " s into the step: " << error.what()
                    << "; regrouping without the lost rank(s) (fault.enable)";
  optimizer_->zero_grad();  // the failed step's partial gradients

  const fault::Decision d =
      fault::regroup(world_->store(), {generation_, job_rank_, members_, steps_done_}, fault::options(cfg_));
  const auto rank = d.rank_of(job_rank_);
  const auto size = static_cast<int64_t>(d.members.size());
  reducer_.reset();  // its hooks and buckets belong to the old world
  graph_reduction_.reset();
  std::unique_ptr<comm::World> next =
      comm::World::regroup(*world_, rank, size, d.generation, static_cast<int64_t>(cfg_.fault.comm_timeout_s * 1000));
  // The old process group may still be waiting out a hung collective (up to comm_timeout_s): it goes on a thread.
  std::unique_ptr<comm::World> old = std::move(world_);
  world_ = std::move(next);
  retired_worlds_.emplace_back([w = std::move(old)]() mutable { w.reset(); });
  generation_ = d.generation;
  members_ = d.members;
  world_info_.rank = rank, world_info_.world_size = size;
  control_->rank_changed(rank, size);

  copy_state_from(d.rank_of(d.source));
  const int64_t behind = d.step - steps_done_;
  steps_done_ = d.step;

  nlohmann::json event = {{"event", "regrouped"},
                          {"failed_step", failed_step},
                          {"step", d.step},
                          {"generation", d.generation},
                          {"lost", d.lost},
                          {"members", d.members},
                          {"world_before", world_before},
                          {"world", size},
                          {"state_from", d.source},
                          {"failed_after_s", into_step_s},
                          {"waited_s", d.waited_s},
                          {"error", std::string(error.what()).substr(0, 300)}};
  if (size < cfg_.fault.min_world_size) {
    event["stopped"] = "below fault.min_world_size";
    fault_events_.push_back(event);
    stop_after_regroup(std::to_string(size) + " rank(s) are left after losing rank(s) " + ranks_text(d.lost) +
                       ", fewer than fault.min_world_size = " + std::to_string(cfg_.fault.min_world_size));
  }
  const int64_t mb = cfg_.trainer.micro_batch_size, k_before = cfg_.trainer.gradient_accumulation_steps;
  if (pos_.global_batch % (mb * size) != 0) {
    std::string sizes;
    for (int64_t w = 1; w <= pos_.global_batch / mb; ++w)
      if (pos_.global_batch % (mb * w) == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(w);
    event["stopped"] = "global batch not kept";
    fault_events_.push_back(event);
    stop_after_regroup("the global batch of " + std::to_string(pos_.global_batch) + " samples cannot be kept on " +
                       std::to_string(size) + " ranks of micro-batch " + std::to_string(mb) +
                       " (world sizes that keep it: " + sizes + ")");
  }
  const int64_t k = pos_.global_batch / (mb * size);
  cfg_.trainer.gradient_accumulation_steps = k;
  cfg_.origin["trainer.gradient_accumulation_steps"] = "kept the global batch on " + std::to_string(size) + " ranks";

  // The data order re-sharded over the survivors, as a resume on this world size would.
  source_.reset();
  sample_options_.rank = rank, sample_options_.world = size, sample_options_.accumulation = k;
  source_ = adfe::make_source(cfg_, *dataset_, sample_options_, device_, tokens_per_view_);
  gcts::GradientPath g = gcts::make_gradient_path(
      cfg_, {world_.get(), net_.get(), runner_.get(), device_, bf16_, mode_.graphs, mode_.compiled, k},
      find_engine(engines_, "gcts"), std::move(optimizer_));
  optimizer_ = std::move(g.optimizer);
  reducer_ = std::move(g.reducer);
  graph_reduction_ = std::move(g.graph_reduction);

  event["accumulation"] = k;
  event["regroup_s"] = s_since(t0);
  fault_events_.push_back(event);
  if (progress_) progress_->event(event);
  LF_LOG(log, warn) << "lost rank(s) " << ranks_text(d.lost) << " at step " << failed_step << ": rank " << rank_before
                    << " of " << world_before << " is now rank " << rank << " of " << size << " (generation "
                    << d.generation << "); continuing from step " << d.step + 1
                    << " (the interrupted step taken again) with the state of rank " << d.source
                    << " copied in memory" << (behind > 0 ? " (this rank was " + std::to_string(behind) + " update behind)" : "")
                    << "; global batch " << pos_.global_batch << " kept: accumulation " << k_before << " -> " << k
                    << "; regrouped in " << s_since(t0) << " s";
}

nlohmann::json Trainer::Impl::fault_status() const {
  return {{"enabled", fault_},        {"generation", generation_}, {"job_rank", job_rank_},
          {"members", members_},      {"events", fault_events_},   {"comm_timeout_s", cfg_.fault.comm_timeout_s},
          {"heartbeats", heartbeat_ ? heartbeat_->beats() : 0}};
}

void Trainer::Impl::join_retired_worlds() {
  for (auto& t : retired_worlds_)
    if (t.joinable()) t.join();
  retired_worlds_.clear();
}

}  // namespace loongforge::trainer
