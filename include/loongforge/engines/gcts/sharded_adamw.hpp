// loongforge/engines/gcts/sharded_adamw.hpp — GCTS's sharded optimizer
// (gcts.shard_optimizer), an implementation of the update seam
// (optim/optimizer.hpp).
//
// ShardedAdamW: the same update as AdamW, op for
// op, on this rank's range of the flat parameter space only (Note [Flat
// shards] in comm/shard.hpp): the reducer leaves the averaged gradient of
// that range in shard().grad; step() updates the parameters' pieces in the
// range and all-gathers the updated parameters from every rank, so all ranks
// end the step with equal parameters while each holds 1/world of the moments
// (tiny tensors: replicated, updated everywhere). clip_grad_norm() sums the
// squared norms of every rank's range (one all-reduce of a scalar). Every
// parameter counts as having a gradient each step (as after any multi-rank
// average: a missing one is zeros). state_tensors() are this rank's pieces
// ("shard.exp_avg", "shard.exp_avg_sq": its range; "<name>.exp_avg" of the
// replicated tensors); load_state() takes full per-parameter moments
// ("<name>.exp_avg", as AdamW writes them and as state.cpp assembles them
// from a sharded checkpoint of any world size) and keeps its range.
// With ShardedOptions::overlap_gather the all-gather goes out in pieces
// while step() is still updating, and step() returns with them in flight:
// sync_parameters() completes them (Note [Gather overlap] in
// src/engines/gcts/sharded_adamw.cpp). With ShardedOptions::fused the update of the range and
// of the replicated tensors runs through ATen's multi-tensor kernels as
// FusedAdamW's does (equal to the op-for-op form within float rounding), the
// squared norms are float32 device scalars, and a non-finite norm skips the
// update on the device (skips_nonfinite_on_device()). With
// ShardedOptions::gradient_views (the default) the sharded parameters'
// gradients are views into one flat buffer, shard().local (Note [Gradient
// views] in comm/shard.hpp): they are defined from construction on, and
// step()/zero_grad() zero that buffer instead of dropping them. At several
// ranks the all-gather's buffers borrow the gradients' memory (Note
// [Borrowed gather buffers] in src/engines/gcts/sharded_adamw.cpp): with gathers left in
// flight, step() leaves the gradients to sync_parameters() to zero (so it
// must come before the next backward: a step() before it throws
// std::logic_error), and zero_grad() completes the gathers first.
// A parameter given with bf16_weight becomes a bf16 working copy here too,
// on any device (Note [Sharded working copies] in src/engines/gcts/sharded_adamw.cpp): every
// rank keeps its whole fp32 master, which takes the place of the parameter
// in the update of this rank's range and in the all-gather (fp32), and the
// copy is the master rounded once the gathered values are in; its gradient is
// an fp32 tensor autograd sums into (a view into the flat buffer, or a kept
// tensor of its own).
//
// The gradients it makes the parameters hold (views into its flat buffer, or
// fp32 sums for working copies) are its own: owns_gradients() is true, so a
// step runner adds into them. sharded() is true: every rank checkpoints its
// own shard.
//
// Example:
//   ShardedAdamW opt(params, optim::AdamWOptions{}, world.get(), /*tiny_numel=*/4096, sharded_options);
//   reducer->average_gradients(opt.params(), phases, step);   // fills opt.shard().grad
//   opt.clip_grad_norm(1.0); opt.step(lr); opt.sync_parameters();
#pragma once

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"  // comm::Pending
#include "loongforge/optim/optimizer.hpp"

namespace loongforge::gcts {

struct ShardedOptions {
  bool overlap_gather = false;     // leave the all-gathers in flight after step() (sync_parameters() completes them)
  int64_t gather_piece_numel = 0;  // elements each rank sends per all-gather; 0: its whole range in one
  bool fused = false;              // ATen's multi-tensor AdamW (as FusedAdamW) instead of AdamW's op sequence
  bool gradient_views = true;      // the sharded parameters' .grad are views into one flat buffer (Note [Gradient views])
};

class ShardedAdamW final : public optim::Optimizer {
 public:
  // `world` nullptr: one rank (the shard is everything). Tensors up to
  // tiny_numel elements stay replicated.
  ShardedAdamW(const std::vector<optim::OptimizedParam>& params, optim::AdamWOptions options, comm::World* world,
               int64_t tiny_numel, ShardedOptions sharded = {});
  ~ShardedAdamW() override;
  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;
  const std::vector<at::Tensor>& params() const override { return params_; }
  at::Tensor clip_grad_norm(double max_norm) override;
  void step(double lr) override;
  void zero_grad() override;
  void keep_gradients(bool keep) override { keep_grads_ = keep; }
  bool skips_nonfinite_on_device() const override { return fused_; }
  void sync_parameters() override;  // also rounds the working copies from their masters
  optim::NamedTensorList state_tensors() const override;
  bool sharded() const override { return true; }
  bool owns_gradients() const override { return true; }
  int64_t state_bytes() const override;  // the replicated moments on every rank, not only rank 0
  int64_t buffer_bytes() const override;  // masters, gradient shard, all-gather buffers
  at::Tensor master_weight(const at::Tensor& param) const override;
  void load_weight(const at::Tensor& param, const at::Tensor& value) override;
  WorkingCopies working_copies() const override;
  nlohmann::json state_json() const override;
  void load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) override;

  // After a failed collective (fault tolerance): waits out the all-gathers still in flight without using what
  // they received (a failed one ends at the world's timeout), zeroes the memory they borrowed; returns how
  // many there were. The parameters keep this rank's own range updated and the others' as before the update.
  int64_t abandon_gathers();
  // "<name>.exp_avg(_sq)" of the tiny replicated tensors, on every rank (state_tensors() lists them on rank 0).
  optim::NamedTensorList replicated_state() const;
  comm::ShardTarget& shard() { return target_; }
  int64_t gathers_in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  const comm::ShardLayout& layout() const { return target_.layout; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  // Where the other ranks' elements of one all-gather piece go (Note
  // [Gather overlap]): buffer_offset is into gathered_.
  struct Copy {
    size_t param = 0;
    int64_t param_offset = 0, buffer_offset = 0, numel = 0;
  };
  void plan_pieces(int64_t piece_numel);
  void launch_gather(size_t p);
  // The tensor holding parameter i's value for the update and the gather: its master, or itself.
  const at::Tensor& value(size_t i) const { return masters_[i].defined() ? masters_[i] : params_[i]; }
  void round_copies();
  void fused_update(double lr);
  void install_gradient_views();
  void clear_gradients();  // zero_grad() without completing the gathers
  void zero_lent();        // zeroes the gradient memory the gathers borrow
  void wait_out_gathers();  // waits for every gather in flight, failed ones too; their results unused
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<bool> decay_;
  std::vector<int64_t> steps_;  // op-for-op form: updates taken, per parameter
  optim::AdamWOptions opt_;
  comm::World* world_;
  bool fused_ = false;
  std::vector<at::Tensor> device_steps_;  // fused: float32 scalars per parameter, as FusedAdamW keeps them
  at::Tensor lr_, found_inf_;             // fused: float32 device scalars
  comm::ShardTarget target_;
  at::Tensor exp_avg_, exp_avg_sq_;                    // (owned) fp32: this rank's range
  std::map<size_t, std::pair<at::Tensor, at::Tensor>> replicated_;  // tiny tensors: exp_avg, exp_avg_sq
  at::Tensor send_, gathered_;  // all-gather buffers: (pieces x q), (pieces x world x q); Note [Borrowed gather buffers]
  int64_t piece_q_ = 0;                                // elements per rank per piece
  std::vector<std::vector<Copy>> receive_;             // per piece
  std::vector<comm::Pending> in_flight_;               // launched, not yet completed (sync_parameters)
  std::chrono::steady_clock::time_point first_launch_;
  bool overlap_gather_ = false;
  bool lend_grads_ = false;  // the gathers' buffers are gradient memory (Note [Borrowed gather buffers])
  bool lent_ = false;        // gathers in flight hold it: sync_parameters() zeroes it
  bool keep_grads_ = false;
  std::vector<at::Tensor> masters_;  // fp32 master of a bf16 working copy (whole, on every rank); undefined for the others
  std::vector<at::Tensor> copies_, copy_masters_;  // the working copies and their masters, in parameter order
  bool copies_stale_ = false;        // masters updated, copies not rounded from them yet (sync_parameters)
};

}  // namespace loongforge::gcts
