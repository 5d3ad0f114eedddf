// The survivors' agreement on the next generation after a lost rank (fault.hpp).
#include <algorithm>  // std::max, std::find
#include <chrono>     // std::chrono
#include <map>        // std::map
#include <thread>     // std::this_thread

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "loongforge/common/log.hpp"
#include "loongforge/fault/fault.hpp"

namespace loongforge::fault {

int64_t Decision::rank_of(int64_t job_rank) const {
  const auto it = std::find(members.begin(), members.end(), job_rank);
  return it == members.end() ? -1 : static_cast<int64_t>(it - members.begin());
}

nlohmann::json Decision::to_json() const {
  return {{"generation", generation}, {"members", members}, {"lost", lost},   {"before", before},
          {"step", step},             {"source", source},   {"waited_s", waited_s}};
}

Decision Decision::from_json(const nlohmann::json& j) {
  Decision d;
  d.generation = j.at("generation").get<int64_t>();
  d.members = j.at("members").get<std::vector<int64_t>>();
  d.lost = j.at("lost").get<std::vector<int64_t>>();
  d.before = j.value("before", std::vector<int64_t>{});
  d.step = j.at("step").get<int64_t>();
  d.source = j.at("source").get<int64_t>();
  d.waited_s = j.at("waited_s").get<double>();
  return d;
}

// Note [Regroup]
// Generation g failed (a collective of it raised on some rank). Each rank
// that gets here sets lf/ft/<g+1>/here/<job rank> to the steps it has applied
// (ranks may differ by one: a collective can complete on some ranks and fail
// on others) and waits for lf/ft/<g+1>/decision. Rank 0 serves the store and
// decides: it waits for every member of g either to arrive or to be lost,
// where lost means its heartbeat (fault.hpp) stood still for
// fault.heartbeat_timeout_s while rank 0 watched. A rank whose heartbeat goes
// on is waited for (it may still be waiting out a hung collective, at most
// fault.comm_timeout_s) until a deadline of comm_timeout_s +
// 2 x heartbeat_timeout_s; one that has not arrived by then is left out.
// The decision names the members (ascending job ranks: a member's new rank is
// its index, so rank 0 stays rank 0 and keeps writing checkpoints), the lost
// ranks, and the step to continue from: the most any member has applied,
// with the first member at that step as the source every member copies its
// state from (the trainer, src/trainer/trainer_fault.cpp).
namespace {

using Clock = std::chrono::steady_clock;

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Decision decide(c10d::Store& store, const Standing& me, const Options& o, const std::string& prefix) {
  const auto t0 = Clock::now();
  const double deadline_s = o.comm_timeout_s + 2 * o.heartbeat_timeout_s;
  struct Watch {
    std::string beat;
    Clock::time_point changed;
  };
  std::map<int64_t, Watch> pending;
  for (int64_t r : me.members)
    if (r != me.job_rank) pending[r] = {"", t0};
  std::map<int64_t, int64_t> arrived = {{me.job_rank, me.steps_done}};
  std::vector<int64_t> lost;
  while (!pending.empty()) {
    for (auto it = pending.begin(); it != pending.end();) {
      const int64_t r = it->first;
      const std::string here = prefix + "here/" + std::to_string(r);
      if (store.check({here})) {
        arrived[r] = nlohmann::json::parse(text(store.get(here))).at("step").get<int64_t>();
        it = pending.erase(it);
        continue;
      }
      const std::string hb = heartbeat_key(r);
      const std::string beat = store.check({hb}) ? text(store.get(hb)) : "";
      if (beat != it->second.beat) {
        it->second = {beat, Clock::now()};
      } else if (seconds_since(it->second.changed) >= o.heartbeat_timeout_s) {
        LF_LOG(logger("comm"), warn) << "rank " << r << " is lost: its heartbeat stood still for "
                                     << o.heartbeat_timeout_s << " s (fault.heartbeat_timeout_s)";
        lost.push_back(r);
        it = pending.erase(it);
        continue;
      }
      ++it;
    }
    if (!pending.empty() && seconds_since(t0) > deadline_s) {
      for (const auto& [r, w] : pending) {
        LF_LOG(logger("comm"), warn) << "rank " << r << " is left out: its heartbeat goes on but it did not reach "
                                     << "the regroup within " << deadline_s
                                     << " s (fault.comm_timeout_s + 2 x fault.heartbeat_timeout_s)";
        lost.push_back(r);
      }
      pending.clear();
    }
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Decision d;
  d.generation = me.generation + 1;
  for (const auto& [r, steps] : arrived) {  // std::map: ascending job ranks
    d.members.push_back(r);
    if (steps > d.step || d.members.size() == 1) d.step = steps, d.source = r;
  }
  std::sort(lost.begin(), lost.end());
  d.lost = lost;
  d.before = me.members;
  d.waited_s = seconds_since(t0);
  return d;
}

}  // namespace

Decision regroup(c10d::Store& store, const Standing& me, const Options& o) {
  const std::string prefix = "lf/ft/" + std::to_string(me.generation + 1) + "/";
  const std::string decision_key = prefix + "decision";
  try {
    store.set(prefix + "here/" + std::to_string(me.job_rank), bytes(nlohmann::json{{"step", me.steps_done}}.dump()));
    Decision d;
    if (me.job_rank == 0) {
      d = decide(store, me, o, prefix);
      store.set(decision_key, bytes(d.to_json().dump()));
    } else {
      // Rank 0 may first wait out its own hung collective, then the others.
      const double wait_s = 2 * o.comm_timeout_s + 3 * o.heartbeat_timeout_s + 30;
      store.wait({decision_key}, std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000)));
      d = Decision::from_json(nlohmann::json::parse(text(store.get(decision_key))));
    }
    if (d.rank_of(me.job_rank) < 0)
      throw CommError("rank " + std::to_string(me.job_rank) + " was left out of the job at generation " +
                      std::to_string(d.generation) +
                      " (rank 0 took it for lost: its heartbeat stood still, or it arrived after the others had "
                      "regrouped); the job goes on without it, and this process exits");
    return d;
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(me.job_rank) +
                    ": regrouping after a failed collective needs the rendezvous store served by rank 0, and it "
                    "failed: " + e.what() +
                    " (when rank 0 is lost the job cannot go on: restart it from the newest checkpoint with "
                    "checkpoint.resume=latest)");
  }
}

}  // namespace loongforge::fault
