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
// with a message naming it. A sharded optimizer's moments are re-sharded
// (Note [Re-sharding after a lost rank] below). Not covered: the loss of
// rank 0 (it serves the rendezvous store). Taking a restarted
// rank back: Note [Taking a rank back] below.
//
// On GPUs (NCCL) three things differ:
//  - A step's collectives are only queued when step() reaches the update, so
//    settle_step() waits for the device to have run them, failing the step
//    with CommError after fault.comm_timeout_s or on the backend's error
//    (Note [Settling a step on NCCL] in world.hpp): the update of a step
//    whose reduction broke is never queued, as on Gloo.
//  - recover() aborts the failed world's communicator first: kernels that
//    wait for a dead peer return, so the device runs on.
//  - CUDA graphs that hold the old world's collectives (the reduction
//    captured into the last micro-batch's graph) are dropped when the new
//    gradient path sets its reduction (the graph runner's
//    set_graph_reduction): they are captured again on the new communicator.
// One GPU runs this path with one rank (test_nccl_gpu, and
// test/comm/test_fault_one_rank.py with LOONGFORGE_TEST_STALL_AT_STEP);
// several GPUs have not run it (scripts/dev/gpu/fault_drill.sh will).
#include <algorithm>  // std::find, std::sort, std::unique
#include <cstdlib>    // std::getenv, std::atoll
#include <fstream>    // std::ifstream
#include <map>        // std::map
#include <thread>     // std::this_thread

#include <ATen/ATen.h>  // at::cat
#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <ATen/cuda/Sleep.h>           // at::cuda::sleep
#include <c10/cuda/CUDAException.h>   // C10_CUDA_CHECK
#include <cuda_runtime_api.h>         // cudaDeviceGetAttribute
#endif

#include "control_plane.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/engines/adfe/adfe.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/engines/gcts/sharded_adamw.hpp"
#include "stop_signal.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {

namespace {
double s_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const char* const kGenerationKey = "lf/ft/generation";
const char* const kEndedKey = "lf/ft/ended";  // rank 0's last step, set as the job ends
std::string join_key(int64_t job_rank) { return "lf/ft/join/" + std::to_string(job_rank); }

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

// The heartbeat, and the hot-rejoin verb's check.
void Trainer::Impl::open_fault() {
  fault_ = cfg_.fault.enable;
  job_rank_ = world_info_.rank;
  job_world_ = world_info_.world_size;
  for (int64_t r = 0; r < world_info_.world_size; ++r) members_.push_back(r);
  if (!fault_) return;
  if (!world_) {
    LF_LOG(logger("trainer"), warn) << "fault.enable has no effect on one rank (there is no other rank to lose)";
    fault_ = false;
    return;
  }
  // A restarted rank beats once it is a member again: until then the others must see its old heartbeat
  // stand still (Note [Regroup]).
  if (!world_->joining()) heartbeat_ = std::make_unique<fault::Heartbeat>(world_info_, job_rank_, cfg_.fault.heartbeat_s);
  control_->set_rejoin_check([this](const nlohmann::json& args) { return rejoin_problem(args); });
}

// From the second step on, a collective that hangs fails after fault.comm_timeout_s (the first step keeps the
// rendezvous timeout: ranks reach it after loading at their own pace).
void Trainer::Impl::after_first_step() {
  if (!fault_ || comm_timeout_set_) return;
  world_->set_timeout(static_cast<int64_t>(cfg_.fault.comm_timeout_s * 1000));
  comm_timeout_set_ = true;
}

namespace {
// Test hook: LOONGFORGE_TEST_STALL_AT_STEP=N fails step N's communication once per process, before the
// settling: on a GPU the device is kept busy (a spin kernel) for 3 x the collective timeout, so the settling
// times out and aborts the communicator as for a hung peer; on CPU ranks it raises the CommError a failed
// Gloo collective raises. One rank can so run the recovery (test/comm/test_fault_one_rank.py, CPU and GPU).
void test_stall(int64_t step, const comm::World& world, c10::Device device) {
  static bool stalled = false;
  const char* v = std::getenv("LOONGFORGE_TEST_STALL_AT_STEP");
  if (!v || stalled || std::atoll(v) != step) return;
  stalled = true;
  LF_LOG(logger("trainer"), warn) << "LOONGFORGE_TEST_STALL_AT_STEP: step " << step << "'s communication fails";
  if (!device.is_cuda())
    throw CommError("rank " + std::to_string(world.rank()) + ": step " + std::to_string(step) +
                    "'s communication failed (injected by LOONGFORGE_TEST_STALL_AT_STEP)");
#if LOONGFORGE_WITH_CUDA_KERNELS
  const double stall_s = 3.0 * static_cast<double>(world.timeout_ms()) / 1000.0;
  int khz = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device.index()));
  at::cuda::sleep(static_cast<int64_t>(stall_s * khz * 1000.0));
#endif
}
}  // namespace

void Trainer::Impl::settle_step(int64_t step) {
  if (!fault_ || !world_) return;
  test_stall(step, *world_, device_);
  Phase p(*control_, "settle", step);
  world_->settle("step " + std::to_string(step) + "'s collectives");
}

// Step 3 of Note [Training on after a lost rank]: every rank's weights, moments and step counts <- `root`'s.
// A sharded optimizer's moments are not copied here (each rank holds its own range: Note [Re-sharding
// after a lost rank]): only its replicated tensors' moments, and `steps` receives root's step counts.
void Trainer::Impl::copy_state_from(int64_t root, nlohmann::json* steps) {
  std::vector<at::Tensor> tensors;
  std::vector<bool> separate_master;
  for (const auto& p : optimizer_->params()) {
    const at::Tensor m = optimizer_->master_weight(p);
    separate_master.push_back(!m.is_same(p));
    tensors.push_back(m);
  }
  auto* sharded = dynamic_cast<gcts::ShardedAdamW*>(optimizer_.get());
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, t] : sharded ? sharded->replicated_state() : optimizer_->state_tensors())
    tensors.push_back(t), state[name] = t;
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
  const nlohmann::json j = nlohmann::json::parse(std::string(v.begin(), v.end()));
  if (sharded)
    *steps = j;
  else
    optimizer_->load_state(state, j);
}

// Note [Re-sharding after a lost rank]
// A sharded optimizer (gcts.shard_optimizer) keeps each rank's range of the
// flat AdamW moments on that rank alone (Note [Flat shards] in shard.hpp).
// When the world changes (a regroup, or a rank taken back), every rank of the
// new world assembles the full moments as the previous generation laid them
// out (its members' ranks there: Decision::before): the range of each member
// still here comes from that member (one broadcast per range), with the fp32
// weights of that range (the member updated them itself); the moments of a
// lost rank's range from the newest checkpoint that validates (rank 0 of the
// new world reads it, whatever world size wrote it: Note [Re-sharding] in
// state.cpp), or zeros when the run has none, and its weights from the
// source. The replicated tensors' moments and weights and the step counts
// come from the source (copy_state_from). Why weights per range: with
// gcts.overlap the last update's all-gather completes only before the next
// forward, so a rank lost then leaves every survivor with its own range
// updated and the others' not yet received (recover() waits those gathers
// out: abandon_gathers); taken from their owners, every range is at the
// agreed step but the lost one, which misses that one update. The gradient
// path then gets a new ShardedAdamW over the new world, which takes its range
// (load_state, as a resume does): the run goes on as if resumed from a
// checkpoint holding exactly that state (test/comm/test_fault_tolerance.py
// builds that checkpoint and compares). The lost range's moments are older
// than the rest by the steps since that checkpoint: the approximation, logged
// with its age. Not covered: with gcts.overlap=false the all-gather is waited
// for inside the update, and a failure there makes the step be taken again
// after the survivors updated their ranges (those get the update twice).
// Memory: every rank holds the full fp32 moments and weights for the moment,
// as a resume does.
namespace {
using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) in the flat space

// The moments (exp_avg, exp_avg_sq: 2 x the ranges' total, laid end to end) of the flat ranges `lost` from the
// newest checkpoint under `dir` that validates; `info` gets its path and step, or why none was used (zeros).
at::Tensor lost_moments_from_checkpoint(const std::string& dir, const model::Model& net, const gcts::ShardedAdamW& so,
                                        const Ranges& lost, int64_t n, nlohmann::json& info) {
  const comm::ShardLayout& l = so.layout();
  at::Tensor out = at::zeros({2, n}, so.params().front().options().dtype(at::kFloat));
  info = {{"checkpoint", ""}, {"step", -1}, {"why", ""}};
  try {
    const std::string ckpt = checkpoint::find_latest(dir);
    if (ckpt.empty()) {
      info["why"] = "the run has no checkpoint that validates in " + dir;
      return out;
    }
    int64_t step = -1;
    const auto saved = read_optimizer_state(ckpt, net, &step);
    int64_t at_ = 0;
    for (const auto& [b, e] : lost) {
      for (size_t k = 0; k < l.sharded.size(); ++k) {
        const size_t i = l.sharded[k];
        const int64_t p0 = l.offsets[k], s0 = std::max(p0, b), s1 = std::min(p0 + so.params()[i].numel(), e);
        if (s0 >= s1) continue;
        int64_t row = 0;
        for (const char* what : {".exp_avg", ".exp_avg_sq"})
          out[row++].narrow(0, at_ + s0 - b, s1 - s0).copy_(
              saved.at(so.names()[i] + what).reshape({-1}).narrow(0, s0 - p0, s1 - s0));
      }
      at_ += e - b;
    }
    info["checkpoint"] = ckpt, info["step"] = step;
  } catch (const std::exception& e) {
    out.zero_();
    info = {{"checkpoint", ""}, {"step", -1}, {"why", std::string("reading the newest checkpoint failed: ") + e.what()}};
  }
  return out;
}
}  // namespace

Trainer::Impl::ShardedState Trainer::Impl::assemble_sharded_state(const fault::Decision& d, nlohmann::json& event) {
  const auto& log = logger("trainer");
  auto& so = dynamic_cast<gcts::ShardedAdamW&>(*optimizer_);
  const comm::ShardLayout& l = so.layout();  // parameters, offsets and total do not depend on the world
  const auto& params = so.params();
  const int64_t W = static_cast<int64_t>(d.before.size());
  if (W == 0) throw TrainingError("a regroup decision without the previous generation's members (a sharded optimizer needs them)");
  const int64_t chunk = (l.total + W - 1) / W;
  const auto opts = params.front().options().dtype(at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor flat = at::zeros({3, l.total}, opts);  // exp_avg, exp_avg_sq, the fp32 weights
  // This rank's weights laid flat (its masters: a working copy's fp32 master, else the parameter).
  std::vector<at::Tensor> pieces;
  for (size_t i : l.sharded) pieces.push_back(so.master_weight(params[i]).detach().reshape({-1}).to(at::kFloat));
  const at::Tensor my_weights = at::cat(pieces);

  Ranges lost;
  int64_t from_members = 0;
  for (int64_t o = 0; o < W; ++o) {
    const int64_t b = std::min(o * chunk, l.total), e = std::min((o + 1) * chunk, l.total);
    if (b >= e) continue;
    const int64_t owner = d.rank_of(d.before[static_cast<size_t>(o)]);
    if (owner < 0) {
      lost.emplace_back(b, e);
      continue;
    }
    std::vector<at::Tensor> buf = {at::empty({3, e - b}, opts)};
    if (owner == world_info_.rank) {
      if (l.world != W || l.begin() != b || l.end() != e)
        throw TrainingError("rank " + std::to_string(job_rank_) + ": its optimizer shard [" + std::to_string(l.begin()) +
                            ", " + std::to_string(l.end()) + ") of " + std::to_string(l.world) +
                            " ranks is not the range the regroup expects ([" + std::to_string(b) + ", " +
                            std::to_string(e) + ") of " + std::to_string(W) + ")");
      std::map<std::string, at::Tensor> mine;
      for (const auto& [name, t] : so.state_tensors()) mine[name] = t;
      buf[0][0].copy_(mine.at("shard.exp_avg").reshape({-1}).narrow(0, 0, e - b));
      buf[0][1].copy_(mine.at("shard.exp_avg_sq").reshape({-1}).narrow(0, 0, e - b));
      buf[0][2].copy_(my_weights.narrow(0, b, e - b));
    }
    world_->broadcast(buf, owner);
    flat.narrow(1, b, e - b).copy_(buf[0]);
    from_members += e - b;
  }

  nlohmann::json source = {{"members_elements", from_members}};
  if (!lost.empty()) {
    int64_t n = 0;
    for (const auto& [b, e] : lost) n += e - b;
    // The lost ranges laid end to end: moments from rank 0's read of the checkpoint, weights from the source.
    std::vector<at::Tensor> buf = {at::zeros({3, n}, opts)};
    const std::string info_key = "lf/ft/" + std::to_string(d.generation) + "/lost_moments";
    if (world_info_.rank == 0) {
      nlohmann::json info;
      buf[0].narrow(0, 0, 2).copy_(lost_moments_from_checkpoint(ckpt_dir_, *net_, so, lost, n, info));
      const std::string text = info.dump();
      world_->store().set(info_key, std::vector<uint8_t>(text.begin(), text.end()));
    }
    world_->broadcast(buf, 0);
    std::vector<at::Tensor> w = {buf[0][2]};
    if (world_info_.rank == d.rank_of(d.source)) {
      int64_t at_ = 0;
      for (const auto& [b, e] : lost) w[0].narrow(0, at_, e - b).copy_(my_weights.narrow(0, b, e - b)), at_ += e - b;
    }
    world_->broadcast(w, d.rank_of(d.source));
    int64_t at_ = 0;
    for (const auto& [b, e] : lost) flat.narrow(1, b, e - b).copy_(buf[0].narrow(1, at_, e - b)), at_ += e - b;

    const auto v = world_->store().get(info_key);
    const nlohmann::json info = nlohmann::json::parse(std::string(v.begin(), v.end()));
    const int64_t ckpt_step = info["step"].get<int64_t>();
    source["lost_elements"] = n;
    source["lost_from"] = ckpt_step >= 0 ? info["checkpoint"].get<std::string>() : std::string("zeros");
    source["lost_from_step"] = ckpt_step;
    if (ckpt_step >= 0)
      LF_LOG(log, warn) << "sharded AdamW: the moments of the lost rank(s)' ranges (" << n << " elements) come from "
                        << info["checkpoint"].get<std::string>() << " (step " << ckpt_step << ", "
                        << d.step - ckpt_step << " step(s) before the rest); " << from_members
                        << " elements from the members' own shards";
    else
      LF_LOG(log, warn) << "sharded AdamW: the moments of the lost rank(s)' ranges (" << n
                        << " elements) start again from zeros: " << info["why"].get<std::string>() << "; "
                        << from_members << " elements from the members' own shards (set checkpoint.interval_steps "
                        << "so that a checkpoint is near when a rank is lost)";
  }
  event["optimizer_moments"] = source;

  ShardedState out;
  for (size_t k = 0; k < l.sharded.size(); ++k) {
    const size_t i = l.sharded[k];
    const auto piece = [&](int64_t row) {
      return flat[row].narrow(0, l.offsets[k], params[i].numel()).view(params[i].sizes());
    };
    out.moments[so.names()[i] + ".exp_avg"] = piece(0);
    out.moments[so.names()[i] + ".exp_avg_sq"] = piece(1);
    out.weights[i] = piece(2);
  }
  return out;
}

// Stops the job where it cannot go on, after rank 0 has checkpointed the agreed step. A sharded optimizer's
// shares still have the lost world's layout (nothing was re-sharded yet): no checkpoint is written then, and
// the restart takes the newest one on disk.
void Trainer::Impl::stop_after_regroup(const std::string& why) {
  std::string where = "no checkpoint was written (rank 0 writes it)";
  if (optimizer_->sharded()) {
    where = "no checkpoint of this step was written (the sharded optimizer's shares are laid out for the lost "
            "world): the newest in " + ckpt_dir_ + " is where to go on from";
  } else if (leader_) {
    save(steps_done_);
    if (writer_) writer_->wait();
    collect_writes();
    where = "rank 0 wrote a checkpoint of step " + std::to_string(steps_done_) + " to " + last_ckpt_;
  }
  world_->barrier();
  throw TrainingError(why + "; " + where + ": restart the job on a world size that works with checkpoint.resume=latest");
}

// Steps 3-4 of Note [Training on after a lost rank], for a regroup after a failure and for taking a rank back:
// the next generation's World, the state of `d.source`, and what depends on the world. Returns the
// accumulation before; `event` gets the figures. Stops the job (stop_after_regroup) where it cannot go on.
int64_t Trainer::Impl::apply_decision(const fault::Decision& d, nlohmann::json& event) {
  const auto rank = d.rank_of(job_rank_);
  const auto size = static_cast<int64_t>(d.members.size());
  reducer_.reset();  // its hooks and buckets belong to the old world
  if (graph_reduction_) runner_->set_graph_reduction(nullptr);  // drops the graphs holding the old world's collectives
  graph_reduction_.reset();
  std::unique_ptr<comm::World> next =
      comm::World::regroup(*world_, rank, size, d.generation, static_cast<int64_t>(cfg_.fault.comm_timeout_s * 1000));
  // The old process group may still be waiting out a hung collective (up to comm_timeout_s): it goes on a thread.
  std::unique_ptr<comm::World> old = std::move(world_);
  world_ = std::move(next);
  join_retired_worlds(/*finished_only=*/true);
  auto done = std::make_shared<std::atomic<bool>>(false);
  retired_worlds_.push_back({std::thread([w = std::move(old), done]() mutable {
                               w.reset();
                               done->store(true);
                             }),
                             done});
  generation_ = d.generation;
  members_ = d.members;
  world_info_.rank = rank, world_info_.world_size = size;
  control_->rank_changed(rank, size);
  if (leader_) {  // where a restarted rank learns that the job goes on (Note [Taking a rank back])
    const std::string g = std::to_string(generation_);
    world_->store().set(kGenerationKey, std::vector<uint8_t>(g.begin(), g.end()));
  }

  // A sharded optimizer's moments first, while every rank still holds its shard of the previous layout.
  const bool sharded = optimizer_->sharded();
  ShardedState kept;
  nlohmann::json sharded_steps;
  if (sharded) kept = assemble_sharded_state(d, event);
  copy_state_from(d.rank_of(d.source), &sharded_steps);
  if (sharded)  // the replicated tensors' moments, now the source's
    for (const auto& [name, t] : dynamic_cast<gcts::ShardedAdamW&>(*optimizer_).replicated_state())
      kept.moments[name] = t.detach().clone();
  steps_done_ = d.step;
  if (!sharded) event["state_sha256"] = state_digest();  // a sharded one's: once its weights are in (below)
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

  // The data order re-sharded over the new world, as a resume on this world size would.
  source_.reset();
  sample_options_.rank = rank, sample_options_.world = size, sample_options_.accumulation = k;
  source_ = adfe::make_source(cfg_, data_.parts(), sample_options_, device_, tokens_per_view_);
  // A replicated optimizer stays as it is; a sharded one is made again over the new world (its fp32 masters
  // kept: a bf16 working copy's master lives in the optimizer) and takes its range of the moments.
  if (sharded) {  // the replicated tensors' weights (the source's) are kept beside the assembled ranges
    const auto& params = optimizer_->params();
    for (size_t i = 0; i < params.size(); ++i)
      if (!kept.weights.count(i)) kept.weights[i] = optimizer_->master_weight(params[i]).detach().clone();
    optimizer_.reset();
  }
  gcts::GradientPath g = gcts::make_gradient_path(
      cfg_, {world_.get(), net_.get(), runner_.get(), device_, bf16_, mode_.graphs, mode_.compiled, k},
      find_engine(engines_, "gcts"), std::move(optimizer_));
  optimizer_ = std::move(g.optimizer);
  if (sharded) {
    for (const auto& [i, w] : kept.weights) optimizer_->load_weight(optimizer_->params()[i], w);
    optimizer_->load_state(kept.moments, sharded_steps);
    event["state_sha256"] = state_digest();
  }
  reducer_ = std::move(g.reducer);
  graph_reduction_ = std::move(g.graph_reduction);
  event["accumulation"] = k;
  return k_before;
}

void Trainer::Impl::recover(const CommError& error) {
  const auto& log = logger("trainer");
  const auto t0 = Clock::now();
  const double into_step_s = std::chrono::duration<double>(t0 - step_began_).count();
  const int64_t failed_step = steps_done_ + 1;
  const int64_t world_before = world_info_.world_size, rank_before = world_info_.rank;
  LF_LOG(log, warn) << "step " << failed_step << " failed " << into_step_s << " s into the step: " << error.what()
                    << "; regrouping without the lost rank(s) (fault.enable)";
  world_->abort();  // NCCL: its kernels that wait for a lost peer return (no-op on Gloo)
  // A sharded optimizer's all-gathers of the last update may still be in flight in the failed world
  // (gcts.overlap): waited out, their results unused (Note [Re-sharding after a lost rank]).
  int64_t abandoned = 0;
  if (auto* so = dynamic_cast<gcts::ShardedAdamW*>(optimizer_.get())) abandoned = so->abandon_gathers();
  optimizer_->zero_grad();  // the failed step's partial gradients

  const fault::Decision d =
      fault::regroup(world_->store(), {generation_, job_rank_, members_, steps_done_}, fault::options(cfg_));
  abandon_lost_peer_files(d);
  const int64_t behind = d.step - steps_done_;
  nlohmann::json event = {{"event", "regrouped"},
                          {"failed_step", failed_step},
                          {"step", d.step},
                          {"generation", d.generation},
                          {"lost", d.lost},
                          {"members", d.members},
                          {"world_before", world_before},
                          {"world", static_cast<int64_t>(d.members.size())},
                          {"state_from", d.source},
                          {"failed_after_s", into_step_s},
                          {"abandoned_gathers", abandoned},
                          {"waited_s", d.waited_s},
                          {"error", std::string(error.what()).substr(0, 300)}};
  const int64_t k_before = apply_decision(d, event);
  event["regroup_s"] = s_since(t0);
  fault_events_.push_back(event);
  if (progress_) progress_->event(event);
  LF_LOG(log, warn) << "lost rank(s) " << ranks_text(d.lost) << " at step " << failed_step << ": rank " << rank_before
                    << " of " << world_before << " is now rank " << world_info_.rank << " of "
                    << world_info_.world_size << " (generation " << d.generation << "); continuing from step "
                    << d.step + 1 << " (the interrupted step taken again) with the state of rank " << d.source
                    << " copied in memory" << (behind > 0 ? " (this rank was " + std::to_string(behind) + " update behind)" : "")
                    << "; global batch " << pos_.global_batch << " kept: accumulation " << k_before << " -> "
                    << cfg_.trainer.gradient_accumulation_steps << "; regrouped in " << s_since(t0)
                    << " s; state sha256 " << event["state_sha256"].get<std::string>();
}

// A sharded optimizer's checkpoint in flight on rank 0 waits for every other rank's shard (Note [Peer files]
// in writer.cpp); a lost rank's never comes. Rank 0 fails that write now: left waiting, it would hold rank 0
// at its next checkpoint (Writer::submit waits for the previous write) while the survivors time out on it.
void Trainer::Impl::abandon_lost_peer_files(const fault::Decision& d) {
  if (!leader_ || !writer_ || !optimizer_->sharded()) return;
  const auto expected = peer_optimizer_files(static_cast<int64_t>(members_.size()));  // ranks 1.. of the failed world
  std::vector<std::string> files;
  for (size_t r = 1; r < members_.size(); ++r)  // members_: the failed world's job ranks, in rank order
    if (std::find(d.lost.begin(), d.lost.end(), members_[r]) != d.lost.end()) files.push_back(expected[r - 1]);
  if (!files.empty()) writer_->peers_lost(files, "rank(s) " + ranks_text(d.lost) + " were lost (fault.enable)");
}

// Note [Taking a rank back]
// A lost rank's process, started again with the same command and environment
// (the job's RANK and WORLD_SIZE), finds the key lf/ft/generation in the
// rendezvous store (rank 0 sets it at every new generation): the job goes
// on without it. It opens no process group then (World::connect's joining
// form), loads the model and builds its seams as any rank does, sets
// lf/ft/join/<its job rank> and waits. `loongforge hot-rejoin --rank N` (sent
// to any rank; checked there: N must be lost and registered) or, with
// fault.auto_rejoin, rank 0 itself publishes the verb, which every member
// applies at the same step boundary: rank 0 writes the next generation's
// decision (the members and N, the step every member is at, rank 0 as the
// source) to lf/ft/<g+1>/decision, where the waiting process reads it too,
// and all of them apply it as after a failure (apply_decision): a new group,
// the state copied from rank 0 over it (peers, not disk), the accumulation
// back down, the data order re-sharded. The next step runs on the full world.
void Trainer::Impl::admit(int64_t which) {
  const auto& log = logger("trainer");
  const auto t0 = Clock::now();
  auto& store = world_->store();
  // Rank 0's answer for this boundary (its own key: a refusal must not be read at a later boundary), and the
  // decision a waiting process reads.
  const std::string next = "lf/ft/" + std::to_string(generation_ + 1);
  const std::string answer = next + "/answer/" + std::to_string(steps_done_);
  fault::Decision d;
  std::vector<int64_t> taken;
  if (leader_) {
    for (int64_t r : lost_ranks())
      if ((which < 0 || r == which) && store.check({join_key(r)})) taken.push_back(r);
    nlohmann::json j;
    if (taken.empty()) {
      j = {{"admit", false}};
    } else {
      d.generation = generation_ + 1;
      d.members = members_;
      d.before = members_;
      for (int64_t r : taken) d.members.push_back(r), store.deleteKey(join_key(r));
      std::sort(d.members.begin(), d.members.end());
      d.step = steps_done_;
      d.source = job_rank_;
      j = d.to_json();
      j["admit"] = true;
    }
    const std::string text = j.dump();
    if (!taken.empty()) store.set(next + "/decision", std::vector<uint8_t>(text.begin(), text.end()));
    store.set(answer, std::vector<uint8_t>(text.begin(), text.end()));
  }
  const auto v = store.get(answer);
  const nlohmann::json j = nlohmann::json::parse(std::string(v.begin(), v.end()));
  if (!j.value("admit", false)) {
    LF_LOG(log, warn) << "hot-rejoin at step " << steps_done_ << ": "
                      << (which < 0 ? std::string("no lost rank") : "rank " + std::to_string(which))
                      << " has registered to rejoin; nothing changes";
    return;
  }
  d = fault::Decision::from_json(j);
  for (int64_t r : d.members)
    if (std::find(members_.begin(), members_.end(), r) == members_.end()) taken.push_back(r);
  std::sort(taken.begin(), taken.end());
  taken.erase(std::unique(taken.begin(), taken.end()), taken.end());
  const int64_t world_before = world_info_.world_size;
  // NCCL: nothing of the old group may still run on the device when the new group replaces it.
  world_->settle("the last step before taking back rank(s) " + ranks_text(taken));
  nlohmann::json event = {{"event", "rejoined"},      {"step", d.step},       {"generation", d.generation},
                          {"rejoined", taken},        {"members", d.members}, {"world_before", world_before},
                          {"world", static_cast<int64_t>(d.members.size())}, {"state_from", d.source}};
  const int64_t k_before = apply_decision(d, event);
  event["rejoin_s"] = s_since(t0);
  fault_events_.push_back(event);
  if (progress_) progress_->event(event);
  LF_LOG(log, info) << "took back rank(s) " << ranks_text(taken) << " at step " << d.step << ": " << world_before
                    << " -> " << world_info_.world_size << " ranks (generation " << d.generation << "), this rank is "
                    << world_info_.rank << "; state copied from rank " << d.source << " over the new group; accumulation "
                    << k_before << " -> " << cfg_.trainer.gradient_accumulation_steps << "; took " << s_since(t0)
                    << " s; state sha256 " << event["state_sha256"].get<std::string>();
}

// The restarted process's side of Note [Taking a rank back]: registered, it waits for a generation that has it.
bool Trainer::Impl::wait_to_rejoin() {
  const auto& log = logger("trainer");
  auto& store = world_->store();
  store.set(join_key(job_rank_), std::vector<uint8_t>{'1'});
  const auto stopped = [&] {
    if (stop_requested()) throw TrainingError("rank " + std::to_string(job_rank_) + ": stopped while waiting to rejoin");
  };
  // Rank 0 tells the ranks still waiting when the job ends (tell_waiting_ranks_the_job_ended): this one then
  // has nothing to rejoin, and ends with status 0 (the job's result is the other ranks').
  const auto job_ended = [&] {
    if (!store.check({kEndedKey})) return false;
    const auto e = store.get(kEndedKey);
    store.deleteKey(join_key(job_rank_));
    LF_LOG(log, info) << "rank " << job_rank_ << ": the job ended at step " << std::string(e.begin(), e.end())
                      << " before this rank was taken back: nothing to rejoin";
    publish("ended before rejoining", nullptr);
    return true;
  };
  // Started while the others still regroup without this rank: the generation key comes when they are done.
  while (!store.check({kGenerationKey})) {
    stopped();
    if (job_ended()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto v = store.get(kGenerationKey);
  int64_t g = std::stoll(std::string(v.begin(), v.end()));
  LF_LOG(log, info) << "rank " << job_rank_ << ": the job goes on without this rank (generation " << g
                    << "); registered to rejoin, waiting to be admitted (loongforge hot-rejoin --rank " << job_rank_
                    << ", or fault.auto_rejoin)";
  publish("waiting to rejoin", nullptr);
  for (;;) {
    const std::string key = "lf/ft/" + std::to_string(g + 1) + "/decision";
    try {
      store.wait({key}, std::chrono::seconds(1));
    } catch (const std::exception&) {
      stopped();
      if (job_ended()) return false;
      continue;  // still waiting; the store is checked again (a lost store raises on the next call)
    }
    const auto dv = store.get(key);
    const nlohmann::json j = nlohmann::json::parse(std::string(dv.begin(), dv.end()));
    ++g;
    const fault::Decision d = fault::Decision::from_json(j);
    if (d.rank_of(job_rank_) < 0) continue;  // a generation without this rank (another failure): wait for the next
    nlohmann::json event = {{"event", "rejoined"}, {"step", d.step}, {"generation", d.generation},
                            {"members", d.members}, {"state_from", d.source}};
    const auto t0 = Clock::now();
    apply_decision(d, event);
    heartbeat_ = std::make_unique<fault::Heartbeat>(world_info_, job_rank_, cfg_.fault.heartbeat_s);
    fault_events_.push_back(event);
    LF_LOG(log, info) << "rank " << job_rank_ << " rejoined at step " << d.step << " as rank " << world_info_.rank
                      << " of " << world_info_.world_size << " (generation " << d.generation
                      << "); state copied from rank " << d.source << " in " << s_since(t0)
                      << " s; state sha256 " << event["state_sha256"].get<std::string>();
    return true;
  }
}

// Rank 0, as the job ends: the store goes with this process, so a restarted rank still waiting to be
// taken back is told first (lf/ft/ended) and given up to 2 x fault.heartbeat_timeout_s to read it (it
// deletes its registration); one that has not started to wait by then fails on the lost store.
void Trainer::Impl::tell_waiting_ranks_the_job_ended() {
  if (!fault_ || !leader_ || !world_) return;
  try {
    auto& store = world_->store();
    const std::string s = std::to_string(steps_done_);
    store.set(kEndedKey, std::vector<uint8_t>(s.begin(), s.end()));
    const auto deadline = Clock::now() + std::chrono::duration<double>(2 * cfg_.fault.heartbeat_timeout_s);
    for (int64_t r = 0; r < job_world_; ++r)
      while (r != job_rank_ && store.check({join_key(r)}) && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } catch (const std::exception& e) {
    LF_LOG(logger("trainer"), warn) << "could not tell restarted ranks that the job ended: " << e.what();
  }
}

std::vector<int64_t> Trainer::Impl::lost_ranks() const {
  std::vector<int64_t> lost;
  for (int64_t r = 0; r < job_world_; ++r)
    if (std::find(members_.begin(), members_.end(), r) == members_.end()) lost.push_back(r);
  return lost;
}

// What `loongforge hot-rejoin` is refused for, on the rank that receives it ("" = nothing).
std::string Trainer::Impl::rejoin_problem(const nlohmann::json& args) const {
  const auto it = args.find("rank");
  if (it == args.end() || !it->is_number_integer()) return "rank must be an integer (-1: every lost rank that registered)";
  const int64_t r = it->get<int64_t>();
  const std::vector<int64_t> lost = lost_ranks();
  if (lost.empty()) return "no rank of this job is lost: all " + std::to_string(job_world_) + " train";
  if (r < -1 || r >= job_world_)
    return "rank " + std::to_string(r) + " is not a rank of this job (0.." + std::to_string(job_world_ - 1) +
           ", or -1 for every lost rank that registered)";
  if (r >= 0 && std::find(lost.begin(), lost.end(), r) == lost.end())
    return "rank " + std::to_string(r) + " is not lost: it trains (lost: " + ranks_text(lost) + ")";
  auto& store = world_->store();
  for (int64_t l : lost)
    if ((r < 0 || l == r) && store.check({join_key(l)})) return "";
  return (r < 0 ? std::string("no lost rank (") + ranks_text(lost) + ")" : "rank " + std::to_string(r)) +
         " has not registered to rejoin: start its process again with the job's command and environment (RANK=" +
         (r < 0 ? std::string("<rank>") : std::to_string(r)) + "); it registers once it has loaded the model";
}

// fault.auto_rejoin, rank 0 at a step boundary: a lost rank that registered is taken back (every rank applies it
// two boundaries later, as a hot-rejoin sent to the socket).
void Trainer::Impl::poll_rejoins() {
  if (!fault_ || !leader_ || !cfg_.fault.auto_rejoin || rejoin_requested_ == generation_) return;
  auto& store = world_->store();
  for (int64_t r : lost_ranks())
    if (store.check({join_key(r)})) {
      control_->request("hot-rejoin", {{"rank", -1}});
      rejoin_requested_ = generation_;
      return;
    }
}

std::string Trainer::Impl::state_digest() const {
  std::string bytes;
  for (const auto& p : optimizer_->params()) {
    const at::Tensor t = optimizer_->master_weight(p).detach().contiguous().cpu();
    bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  // A sharded optimizer's ranks hold different ranges of the moments: its digest covers the weights and the
  // replicated tensors' moments, which every rank holds alike.
  auto* sharded = dynamic_cast<const gcts::ShardedAdamW*>(optimizer_.get());
  for (const auto& [name, t0] : sharded ? sharded->replicated_state() : optimizer_->state_tensors()) {
    const at::Tensor t = t0.detach().contiguous().cpu();
    bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return sha256_hex(bytes).substr(0, 16);
}

nlohmann::json Trainer::Impl::fault_status() const {
  return {{"enabled", fault_},        {"generation", generation_}, {"job_rank", job_rank_},
          {"members", members_},      {"events", fault_events_},   {"comm_timeout_s", cfg_.fault.comm_timeout_s},
          {"heartbeats", heartbeat_ ? heartbeat_->beats() : 0}};
}

void Trainer::Impl::join_retired_worlds(bool finished_only) {
  for (auto it = retired_worlds_.begin(); it != retired_worlds_.end();) {
    if (finished_only && !it->done->load()) {
      ++it;
      continue;
    }
    if (it->thread.joinable()) it->thread.join();
    it = retired_worlds_.erase(it);
  }
}

}  // namespace loongforge::trainer
