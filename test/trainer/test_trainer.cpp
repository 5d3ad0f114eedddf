// Proves the trainer's seams change nothing and its lifecycle keeps its
// promises (n16-tiny on the bundled dataset, CPU, fp32, one thread):
// - Trainer (BatchSource -> StepRunner -> GradientReducer -> Optimizer) gives
//   bit for bit the losses and weights of the plain loop written out below,
//   over 50 steps with gradient accumulation;
// - the default generators are seeded from run.seed (identical runs write
//   identical RNG state) and a resume restores them;
// - --resume latest refuses to start over when every checkpoint is damaged;
// - a libtorch error inside a step names the step and the phase, keeps the
//   intact state as a checkpoint and stops.
#include <cmath>    // std::ceil
#include <cstdlib>  // setenv, unsetenv
#include <fstream>  // std::ifstream

#include <ATen/ATen.h>      // at::Tensor
#include <ATen/Context.h>   // at::globalContext
#include <ATen/Parallel.h>  // at::set_num_threads

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"
#include "loongforge/trainer/trainer.hpp"

using namespace loongforge;
using lf_catch::Contains;

namespace {

const std::string kModel = std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt";
const std::string kData = LOONGFORGE_TEST_DATASET;

std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(LOONGFORGE_TEST_MODELS) + "/trainer-" + name;
  remove_tree(dir);
  make_dirs(dir);
  return dir;
}

config::Config tiny_config(const std::string& out, std::vector<std::string> sets) {
  std::vector<std::string> all = {"model.path=" + kModel, "data.path=" + kData, "run.output_dir=" + out,
                                  "run.name=r", "run.threads=1", "run.deterministic=true", "run.device=cpu",
                                  "logging.progress=off", "logging.tensorboard=false", "control.enable=false",
                                  "trainer.micro_batch_size=2", "checkpoint.interval_steps=1000"};
  all.insert(all.end(), sets.begin(), sets.end());
  return config::parse_config_text("{}", "test", all);
}

std::vector<double> losses_of(const trainer::Trainer& t) {
  std::vector<double> out;
  for (const auto& r : t.history()) out.push_back(r.loss);
  return out;
}

std::string hex_of(const at::Tensor& bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    const auto b = bytes.data_ptr<uint8_t>()[i];
    s += d[b >> 4], s += d[b & 15];
  }
  return s;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j;
  in >> j;
  return j;
}

// The plain loop of docs/training-semantics.md s5, written out without the
// seams: fetch K micro-batches, weight by valid elements, forward/backward,
// clip, AdamW.
struct PlainLoop {
  std::vector<double> losses;
  std::vector<at::Tensor> params;

  PlainLoop(const config::Config& cfg, int64_t steps) {
    at::set_num_threads(1);
    at::globalContext().setDeterministicAlgorithms(true, false);
    model::Model net = model::Model::load(kModel, c10::kCPU);
    net.train();
    const data::Dataset ds = data::Dataset::open(kData);
    const auto& mc = net.info().config;
    data::SampleOptions so;
    so.seed = static_cast<uint64_t>(cfg.run.seed);
    so.micro_batch_size = cfg.trainer.micro_batch_size;
    so.accumulation = cfg.trainer.gradient_accumulation_steps;
    so.image_size = mc.at("image_size").get<int64_t>();
    so.num_views = mc.at("num_views").get<int64_t>();
    so.max_state_dim = mc.at("max_state_dim").get<int64_t>();
    so.max_action_dim = mc.at("max_action_dim").get<int64_t>();
    data::BatchBuilder builder(ds, so);
    std::vector<optim::OptimizedParam> trainable;
    for (const auto& p : net.parameters())
      if (p.info->trainable) trainable.push_back({p.info->name, p.tensor, p.info->decay});
    optim::AdamWOptions ao;
    ao.beta1 = cfg.optimizer.beta1, ao.beta2 = cfg.optimizer.beta2, ao.eps = cfg.optimizer.eps;
    ao.weight_decay = cfg.optimizer.weight_decay;
    optim::AdamW opt(trainable, ao);
    optim::Schedule sched;
    sched.peak_lr = cfg.optimizer.lr;
    sched.total_steps = cfg.trainer.max_steps;
    sched.warmup_steps = static_cast<int64_t>(std::ceil(cfg.schedule.warmup_ratio * cfg.trainer.max_steps));
    const int64_t k = cfg.trainer.gradient_accumulation_steps;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<data::MicroBatch> mbs;
      double total = 0;
      for (int64_t i = 0; i < k; ++i) {
        mbs.push_back(builder.micro_batch(s, i));
        total += static_cast<double>(mbs.back().num_valid);
      }
      double step_loss = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double w = total > 0 ? static_cast<double>(mbs[i].num_valid) / total : 1.0 / static_cast<double>(k);
        const at::Tensor loss = net.forward(mbs[i].tensors).at("loss");
        (loss * w).backward();
        step_loss += loss.item<double>() * w;
      }
      opt.clip_grad_norm(cfg.trainer.grad_clip_norm);
      opt.step(sched.lr_at(s));
      losses.push_back(step_loss);
    }
    for (const auto& p : net.parameters()) params.push_back(p.tensor.detach().clone());
  }
};

}  // namespace

TEST_CASE("trainer: the seams reproduce the plain training loop bit for bit over 50 CPU steps") {
  const std::string out = fresh_dir("seams");
  const auto cfg = tiny_config(out, {"trainer.max_steps=50", "trainer.gradient_accumulation_steps=2"});
  trainer::Trainer t(cfg, comm::WorldInfo{});
  REQUIRE(t.run() == 0);
  const PlainLoop plain(cfg, 50);
  REQUIRE(losses_of(t) == plain.losses);  // exact double equality, every step

  const auto saved = checkpoint::read_safetensors(t.run_dir() + "/checkpoints/epoch_0_step_50/model.safetensors");
  REQUIRE(saved.size() == plain.params.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    INFO(saved[i].first);
    REQUIRE(at::equal(saved[i].second, plain.params[i]));
  }
}

TEST_CASE("trainer: identical runs write identical RNG state, seeded from run.seed, and a resume restores it") {
  const std::string out = fresh_dir("rng");
  auto run = [&](const std::string& name, std::vector<std::string> sets) {
    sets.push_back("run.name=" + name);
    trainer::Trainer t(tiny_config(out, sets), comm::WorldInfo{});
    REQUIRE(t.run() == 0);
    return read_json(out + "/" + name + "/checkpoints/epoch_0_step_4/trainer_state.json")["rng"];
  };
  const auto a = run("a", {"trainer.max_steps=4"});
  const auto b = run("b", {"trainer.max_steps=4"});
  const auto c = run("c", {"trainer.max_steps=4", "run.seed=7"});
  REQUIRE(a == b);
  REQUIRE(a != c);

  // A resume sets the default CPU generator to the saved state. Nothing in
  // training draws from it yet (dropout is off), so give the checkpoint a
  // state that seeding alone cannot produce, and fix its manifest entry.
  const std::string ckpt = out + "/a/checkpoints/epoch_0_step_4";
  at::manual_seed(999);
  const std::string other = hex_of(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state());
  REQUIRE(other != a["cpu_default_generator"].get<std::string>());
  auto state = read_json(ckpt + "/trainer_state.json");
  state["rng"]["cpu_default_generator"] = other;
  const std::string text = state.dump(2) + "\n";
  std::ofstream(ckpt + "/trainer_state.json") << text;
  auto manifest = read_json(ckpt + "/MANIFEST.json");
  manifest["files"]["trainer_state.json"] = {{"bytes", text.size()}, {"sha256", sha256_hex(text)}};
  std::ofstream(ckpt + "/MANIFEST.json") << manifest.dump(2) << "\n";
  REQUIRE(checkpoint::validate_checkpoint(ckpt).ok());

  trainer::Trainer resumed(tiny_config(out, {"run.name=a", "trainer.max_steps=4", "checkpoint.resume=latest"}),
                           comm::WorldInfo{});
  resumed.open();
  REQUIRE(hex_of(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state()) == other);
}

TEST_CASE("trainer: --resume latest refuses to start over when every checkpoint is damaged") {
  const std::string out = fresh_dir("damaged");
  {
    trainer::Trainer t(tiny_config(out, {"trainer.max_steps=4", "checkpoint.interval_steps=2"}), comm::WorldInfo{});
    REQUIRE(t.run() == 0);
  }
  for (const std::string step : {"2", "4"}) {
    const std::string f = out + "/r/checkpoints/epoch_0_step_" + step + "/scheduler.json";
    std::ofstream(f, std::ios::app) << " ";  // one byte more than the manifest says
  }
  trainer::Trainer t(tiny_config(out, {"trainer.max_steps=8", "checkpoint.resume=latest"}), comm::WorldInfo{});
  try {
    t.open();
    FAIL("open() accepted a run whose checkpoints are all damaged");
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("every checkpoint in " + out + "/r/checkpoints is damaged"));
    CHECK_THAT(msg, Contains("epoch_0_step_4"));
    CHECK_THAT(msg, Contains("epoch_0_step_2"));
    CHECK_THAT(msg, Contains("start a fresh run without --resume"));
  }
}

TEST_CASE("trainer: a libtorch error inside a step names the step and phase and keeps the intact state") {
  const std::string out = fresh_dir("fault");
  ::setenv("LOONGFORGE_TEST_FAULT", "backward@3", 1);
  trainer::Trainer t(tiny_config(out, {"trainer.max_steps=10"}), comm::WorldInfo{});
  try {
    t.run();
    ::unsetenv("LOONGFORGE_TEST_FAULT");
    FAIL("the injected out-of-memory error did not stop the run");
  } catch (const TrainingError& e) {
    ::unsetenv("LOONGFORGE_TEST_FAULT");
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("step 3, phase backward (micro-batch 0) on rank 0 (cpu): out of memory"));
    CHECK_THAT(msg, Contains("MB peak on the host"));
    CHECK_THAT(msg, Contains("lower trainer.micro_batch_size (now 2)"));
    CHECK_THAT(msg, Contains("The state after step 2 is saved"));
  }
  const std::string ckpt = out + "/r/checkpoints/epoch_0_step_2";
  REQUIRE(checkpoint::validate_checkpoint(ckpt).ok());
  REQUIRE(read_json(ckpt + "/trainer_state.json")["step"] == 2);
}

TEST_CASE("trainer: precision.bf16_weights=on is refused on a CPU run, naming the key and the fix, and auto trains in fp32 and says so in summary.json") {
  const std::string out = fresh_dir("bf16-weights");
  trainer::Trainer t(tiny_config(out, {"trainer.max_steps=2", "precision.bf16_weights=on"}), comm::WorldInfo{});
  try {
    t.open();
    FAIL("open() accepted bf16 working copies on a CPU run");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("precision.bf16_weights=on"));
    CHECK_THAT(msg, Contains("does not compute in bf16 autocast on a GPU"));
    CHECK_THAT(msg, Contains("set precision.bf16_weights=auto or off"));
  }
  trainer::Trainer a(tiny_config(fresh_dir("bf16-weights-auto"), {"trainer.max_steps=2"}), comm::WorldInfo{});
  REQUIRE(a.run() == 0);
  REQUIRE(a.history().size() == 2);
  REQUIRE(read_json(a.run_dir() + "/summary.json").at("bf16_weights").is_null());  // no copies kept
}

// trainer.micro_batch_size: auto on the CPU (the choosing itself: test_micro_batch; on a GPU: e2e_micro_batch_auto_gpu).
TEST_CASE("trainer: micro_batch_size auto is refused on a CPU run before the model loads, saying why and naming the fix") {
  const std::string out = fresh_dir("mb-auto-cpu");
  trainer::Trainer t(tiny_config(out, {"trainer.micro_batch_size=auto", "trainer.global_batch_size=8",
                                       "trainer.max_steps=2"}),
                     comm::WorldInfo{});
  try {
    t.open();
    FAIL("open() accepted micro_batch_size auto on a CPU run");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("--set: trainer.micro_batch_size is auto, which sizes the micro-batch to the GPU's "
                             "memory, but this run is on the CPU (run.device=cpu): there is no device memory to fit"));
    CHECK_THAT(msg, Contains("Set trainer.micro_batch_size to a number"));
  }
  REQUIRE_FALSE(path_exists(out + "/r"));  // refused before anything was written
}

TEST_CASE("trainer: a resume with micro_batch_size auto keeps the checkpoint's micro-batch, also on the CPU, and "
          "continues as the uninterrupted run") {
  const std::string out = fresh_dir("mb-auto-resume");
  // Straight: 4 steps of 2 x 2 samples. Cut: the same, stopped after 2 steps with a checkpoint.
  trainer::Trainer straight(tiny_config(out, {"run.name=straight", "trainer.global_batch_size=4", "trainer.max_steps=4"}),
                            comm::WorldInfo{});
  REQUIRE(straight.run() == 0);
  {
    trainer::Trainer cut(tiny_config(out, {"trainer.global_batch_size=4", "trainer.max_steps=4",
                                           "trainer.steps_per_run=2"}),
                         comm::WorldInfo{});
    REQUIRE(cut.run() == 0);
  }
  trainer::Trainer resumed(tiny_config(out, {"trainer.micro_batch_size=auto", "trainer.global_batch_size=4",
                                             "trainer.max_steps=4", "checkpoint.resume=latest"}),
                           comm::WorldInfo{});
  REQUIRE(resumed.run() == 0);
  const std::vector<double> all = losses_of(straight);
  REQUIRE(losses_of(resumed) == std::vector<double>(all.begin() + 2, all.end()));  // exact, steps 3 and 4
  const nlohmann::json mb = read_json(resumed.run_dir() + "/summary.json").at("micro_batch");
  REQUIRE(mb.at("size") == 2);
  REQUIRE(mb.at("accumulation") == 2);
  REQUIRE(mb.at("auto").at("source") == "checkpoint");
  REQUIRE_THAT(mb.at("auto").at("checkpoint").get<std::string>(), Contains("epoch_0_step_2"));
  // The run directory's config.yaml records the size it trained with and where it came from.
  std::ifstream in(resumed.run_dir() + "/config.yaml");
  const std::string config_yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_THAT(config_yaml, Contains("Value chosen for auto, set at --set, kept from "));
  REQUIRE_THAT(config_yaml, Contains("\n  micro_batch_size: 2\n"));
  // A run with a number says nothing of auto.
  REQUIRE(read_json(straight.run_dir() + "/summary.json").at("micro_batch").at("auto").is_null());
}
