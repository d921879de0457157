// The rank actor "troupe.rank": data loader, trainer, parameter shard and checkpoint writer of
// one worker process. Its CAF handlers only queue work for a step thread (the step blocks in the
// collectives) — except an abort, which fails the running generation's collectives at once.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "caf/all.hpp"
#include "coordinator_bootstrap.h"
#include "protocol.h"
#include "troupe/actors/training.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/nccl_communicator.h"
#include "troupe/collectives/ucx_communicator.h"
#include "troupe/runtime/actor.h"
#include "troupe/runtime/log.h"
#include "troupe/runtime/status.h"
#include "troupe/train/chaos_file_system.h"
#include "troupe/train/elastic.h"
#include "troupe/train/job_events.h"
#include "troupe/train/line_log.h"
#include "troupe/train/lowcomm_rank.h"

namespace troupe::actors {
namespace {

// The NCCL communicator of a generation whose model is in GPU memory. The host communicator's
// liveness monitor fails it (NCCL's own transport may never notice a peer's death over NVLink or
// shared memory), also before it exists: a death reported while NCCL is being set up aborts it
// as soon as it is installed.
class DeviceComm {
 public:
  collectives::Communicator* Install(std::unique_ptr<collectives::Communicator> comm) {
    std::lock_guard<std::mutex> l(mu_);
    comm_ = std::move(comm);
    if (!dead_.ok()) comm_->Abort(dead_);
    return comm_.get();
  }
  void Fail(const absl::Status& dead) {
    std::lock_guard<std::mutex> l(mu_);
    if (comm_ != nullptr) {
      comm_->Abort(dead);
    } else if (dead_.ok()) {
      dead_ = dead;
    }
  }
  void AbortForGeneration(uint64_t new_gen) {
    std::lock_guard<std::mutex> l(mu_);
    if (comm_ != nullptr && comm_->generation() < new_gen) comm_->AbortForGeneration(new_gen);
  }

 private:
  std::mutex mu_;
  std::unique_ptr<collectives::Communicator> comm_;
  absl::Status dead_;
};

class RankState {
 public:
  // The fault the coordinator armed on this rank (ArmKill): at `point` of `step` (-1: none).
  struct ArmedFault {
    int64_t step = -1;
    int32_t signal = SIGKILL;  // 0: the process stays (hang-worker)
    train::FaultKind kind = train::FaultKind::kKillWorker;
    train::StepPoint point = train::StepPoint::kExchange;
  };

  // `address`: the worker's node's advertised address (its collectives listen there).
  RankState(caf::actor_system& sys, train::JobSpec spec, std::string worker, std::string address)
      : sys_(sys),
        spec_(std::move(spec)),
        worker_(std::move(worker)),
        address_(std::move(address)) {}
  ~RankState() { Stop(); }

  absl::Status Init() {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainable> model,
                            train::TrainableRegistry::Global().Create(spec_.model));
    model_ = std::move(model);
    // Chaos on the checkpoint disk, and kills in the middle of writing a shard, live under the
    // store (chaos_file_system.h).
    disk_ = std::make_unique<train::ChaosFileSystem>(
        train::PosixFileSystem(), spec_.CheckpointDir(), train::DiskFaultsOf(spec_),
        [this](int64_t step) {
          if (auto f = TakeArmed(step, train::StepPoint::kCheckpoint)) FireArmedFault(*f);
        });
    absl::StatusOr<std::unique_ptr<train::CheckpointStore>> store =
        train::CheckpointStore::Open({.dir = spec_.CheckpointDir(),
                                      .keep_last = spec_.keep_last,
                                      .fs = disk_.get(),
                                      .warning = {}});
    if (!store.ok()) return store.status();
    store_ = std::move(*store);
    serve_log_ = std::make_unique<train::LineLog>(absl::StrCat(
        spec_.work_dir, "/serve/", absl::StrReplaceAll(worker_, {{"/", "_"}}), ".log"));
    train::ElasticRank::Options o;
    o.microbatches = spec_.model.microbatches;
    o.deterministic = spec_.deterministic;
    o.seed = spec_.seed;
    o.adamw = spec_.adamw;
    o.schedule = spec_.schedule;
    o.pipeline = spec_.pipeline_schedule;
    o.collective.timeout = spec_.timeouts.collective;
    o.bucket_bytes = int64_t{spec_.bucket_kib} << 10;
    o.param_delta = spec_.param_delta;
    o.replicate_optimizer = spec_.replicate_optimizer;
    o.on_serve = [this](int64_t step, int32_t k) {
      serve_log_->Write(absl::StrCat(step, " ", k + MicrobatchOffset(), " ", gen_.load()));
    };
    o.on_point = [this](int64_t step, train::StepPoint point) {
      if (auto f = TakeArmed(step, point)) FireArmedFault(*f);
    };
    const collectives::CollectiveOptions collective = o.collective;
    rank_ = std::make_unique<train::ElasticRank>(model_.get(), std::move(o));
    if (spec_.lowcomm_groups > 0) {
      // corrupt-update@S: this rank's group sends 1000 × its Δ in step S's sync, if it leads it.
      auto corrupt = [this](int64_t step, bool leads) {
        auto f = TakeArmed(step, train::StepPoint::kExchange, /*corrupt_update=*/true);
        if (f && !leads) {
          base::SupervisionEvent e = train::JobEvent("fault_failed", worker_, "rank");
          e.generation = gen_;
          e.Set("kind", train::FaultKindName(f->kind)).Set("step", step).reason =
              "this rank does not lead its group (its first rank sends the group's update)";
          train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
        }
        if (f && leads) NoteFired(*f);
        return f.has_value() && leads;
      };
      lowcomm_ = std::make_unique<train::LowCommRank>(
          rank_.get(),
          train::LowCommRank::Options{spec_.lowcomm, spec_.steps, collective, corrupt});
    }
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      stopping_ = true;
      queue_.clear();
    }
    Abort(UINT64_MAX);
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // From the actor's thread: fails the current generation's collectives now.
  void Abort(uint64_t new_gen) {
    uint64_t cur = aborted_below_.load();
    while (new_gen > cur && !aborted_below_.compare_exchange_weak(cur, new_gen)) {
    }
    std::lock_guard<std::mutex> l(comm_mu_);
    if (comm_ != nullptr && comm_->generation() < new_gen) comm_->AbortForGeneration(new_gen);
    if (device_ != nullptr) device_->AbortForGeneration(new_gen);
  }

  // `always`: runs even if its generation was aborted meanwhile (a commit: the coordinator has
  // recorded the step, so every rank that staged it must apply it).
  void Post(uint64_t gen, std::function<void()> task, bool always = false) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back({gen, always, std::move(task)});
    cv_.notify_all();
  }

  // Chaos: die like kill -9 (or hang like a stopped process, or stop making progress while the
  // process goes on answering: signal 0) in the middle of the step (its gradient exchange or its
  // parameters' share under way) or of writing its checkpoint shard, after writing down when
  // (the coordinator measures recovery from at_ns).
  void FireArmedFault(const ArmedFault& f) {
    if (f.kind == train::FaultKind::kClockStep) return StepClock(f.step);
    NoteFired(f);
    if (f.signal != 0) {
      raise(f.signal);
      return;
    }
    // Stuck for good: only eviction (the process ends), a fence (SIGKILL from its node) or the
    // rank's own stop ends it.
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return stopping_; });
  }

  // The fault_fired event of a fault this rank carries out.
  void NoteFired(const ArmedFault& f) {
    base::SupervisionEvent e = train::JobEvent("fault_fired", worker_, "rank");
    e.generation = gen_;
    e.pid = getpid();
    e.signal = f.signal;
    e.Set("kind", train::FaultKindName(f.kind))
        .Set("step", f.step)
        .Set("point", train::StepPointName(f.point))
        .Set("rank", rank_->rank())
        // On the machine's clock (a clock-step of this process's own is taken back): another
        // process measures the recovery from it.
        .Set("at_ns", absl::ToUnixNanos(absl::Now()) - stepped_ns_.load());
    train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
  }

  // From the actor's thread: the coordinator gave this rank up for good while it was alive. Its
  // step thread may be stuck, which nothing but the end of the process stops.
  // `coordinator_here`: the coordinator that sent it runs in this process.
  void Evicted(const std::string& why, bool coordinator_here) {
    // The coordinator's own process (the lab, or a coordinator restarted beside a rank) stays:
    // the job goes on without this rank, and a stuck step thread waits for the process's end.
    if (coordinator_here) {
      runtime::LogWarn(worker_, "evicted from the job (" + why +
                                    "); this process also runs the job's coordinator, so it stays");
      return;
    }
    base::SupervisionEvent e = train::JobEvent("evicted", worker_, "rank");
    e.generation = gen_;
    e.pid = getpid();
    e.reason = why;
    train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
    runtime::LogWarn(worker_, "evicted from the job (" + why + "): this process ends");
    std::fflush(nullptr);
    _exit(3);
  }

  // clock-step: this process's wall clock jumps by [chaos] clock_step, through the offset file its
  // preloaded libtroupe_clock_step.so reads (its node agent set both up: TROUPE_CLOCK_STEP_DIR).
  void StepClock(int64_t step) {
    const char* file = getenv("TROUPE_CLOCK_STEP_FILE");
    base::SupervisionEvent e =
        train::JobEvent(file ? "fault_fired" : "fault_failed", worker_, "rank");
    e.generation = gen_;
    e.pid = getpid();
    e.Set("kind", train::FaultKindName(train::FaultKind::kClockStep))
        .Set("step", step)
        .Set("rank", rank_->rank())
        .Set("by", absl::FormatDuration(spec_.clock_step));
    if (file == nullptr) {
      e.reason =
          "this worker has no clock to step: its node agent ran without TROUPE_CLOCK_STEP_DIR";
    } else {
      // Whole or not at all: the preloaded clock re-reads the file every 50 ms.
      const std::string tmp = absl::StrCat(file, ".tmp");
      std::ofstream(tmp) << absl::ToInt64Nanoseconds(spec_.clock_step) << "\n";
      std::rename(tmp.c_str(), file);
      stepped_ns_ = absl::ToInt64Nanoseconds(spec_.clock_step);
    }
    train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
  }

  void ArmKill(int64_t step, int32_t sig, int32_t fault_kind, int32_t point) {
    std::lock_guard<std::mutex> l(armed_mu_);
    armed_ =
        ArmedFault{step, sig == SIGSTOP || sig == 0 ? sig : SIGKILL,
                   static_cast<train::FaultKind>(fault_kind), static_cast<train::StepPoint>(point)};
  }

  // The armed fault if it is for this step and point, disarmed: it fires once, even if the step
  // runs again. A corrupt-update is taken only by the outer sync (`corrupt_update`: the caller is
  // it), every other fault only by the step's points.
  std::optional<ArmedFault> TakeArmed(int64_t step, train::StepPoint point,
                                      bool corrupt_update = false) {
    std::lock_guard<std::mutex> l(armed_mu_);
    if (armed_.step < 0 || armed_.step != step || armed_.point != point ||
        (armed_.kind == train::FaultKind::kCorruptUpdate) != corrupt_update) {
      return std::nullopt;
    }
    const ArmedFault f = armed_;
    armed_.step = -1;
    return f;
  }

  // Tasks (step thread).
  void NewEpoch(uint64_t epoch) {
    // Refused only when a later epoch has claimed the store: this rank's coordinator has been
    // replaced, and its writes are refused from now on either way.
    if (absl::Status s = store_->Claim(epoch); !s.ok()) {
      runtime::LogWarn(worker_, absl::StrCat("lease epoch ", epoch, ": ", s.message()));
    }
  }
  void Configure(uint64_t gen, const train::GenerationPlan& plan_in, caf::actor coordinator) {
    coordinator_ = coordinator;
    const train::GenerationPlan* plan = &plan_in;
    // A stale coordinator's plan (a later lease epoch has claimed the store) is refused here.
    absl::Status st = plan->epoch != 0 ? store_->Claim(plan->epoch) : absl::OkStatus();
    if (st.ok()) {
      {
        std::lock_guard<std::mutex> l(comm_mu_);
        comm_.reset();  // the old generation's buffers are no longer written to after this
        device_.reset();
        if (model_->device().is_cuda()) device_ = std::make_shared<DeviceComm>();
      }
      gen_ = gen;
      internal::CoordinatorBootstrap boot(sys_, coordinator, gen, &aborted_below_,
                                          spec_.timeouts.rpc);
      collectives::UcxOptions uo;
      uo.rank = plan->rank;
      uo.size = plan->world;
      uo.generation = gen;
      uo.key_prefix = spec_.name;
      uo.address = address_;
      uo.connect_timeout = spec_.timeouts.bootstrap;
      uo.liveness_timeout = spec_.timeouts.liveness;
      if (device_ != nullptr) {
        uo.on_peer_dead = [device = device_](const absl::Status& dead) { device->Fail(dead); };
      }
      absl::StatusOr<std::unique_ptr<collectives::Communicator>> comm =
          collectives::CreateUcxCommunicator(&boot, uo);
      collectives::Communicator* device_comm = nullptr;
      if (!comm.ok()) {
        st = comm.status();
      } else {
        {
          std::lock_guard<std::mutex> l(comm_mu_);
          comm_ = std::move(*comm);
          if (aborted_below_.load() > gen) comm_->AbortForGeneration(aborted_below_.load());
        }
        if (device_ != nullptr) {
          // A model in GPU memory: its buffers move over NCCL, the gradient norm's few doubles
          // over the host communicator, whose liveness monitor aborts NCCL when a peer dies.
          collectives::NcclOptions no;
          no.rank = plan->rank;
          no.size = plan->world;
          no.generation = gen;
          no.device = model_->device().ordinal;
          no.key_prefix = spec_.name;
          no.connect_timeout = spec_.timeouts.bootstrap;
          absl::StatusOr<std::unique_ptr<collectives::Communicator>> nccl =
              collectives::CreateNcclCommunicator(&boot, no);
          if (nccl.ok()) {
            device_comm = device_->Install(*std::move(nccl));
            device_->AbortForGeneration(aborted_below_.load());
          } else {
            st = nccl.status();
          }
        }
        if (st.ok()) {
          if (writer_.joinable()) writer_.join();  // it reads the state Configure replaces
          st = lowcomm_ != nullptr
                   ? lowcomm_->Configure(comm_.get(), *plan, store_.get())
                   : rank_->Configure(device_comm != nullptr ? device_comm : comm_.get(), *plan,
                                      store_.get(), comm_.get());
        }
      }
    }
    caf::anon_send(coordinator, RankConfigured{gen, worker_, WireStatus::From(st),
                                               collectives::BlamedPeer(st).value_or(-1)});
  }

  // [lowcomm]: whether this rank is in the first group (name order), which writes checkpoints and
  // evaluates; true without groups.
  bool FirstGroup() const { return lowcomm_ == nullptr || lowcomm_->group().index == 0; }

  // [lowcomm]: group g's microbatch k is the job's g·M + k (each group trains on data of its own:
  // the step's loss averages all of them, and each is served once).
  int32_t MicrobatchOffset() const {
    if (lowcomm_ == nullptr) return 0;
    return lowcomm_->group().index * spec_.model.microbatches;
  }

  // [eval] due before step `step` (the parameters of `step` steps): this rank's share of it.
  absl::Status Evaluate(int64_t step, StepDone* done) {
    const int64_t every = spec_.eval_every;
    if (every <= 0 || step == 0 || step % every != 0 || !FirstGroup()) return absl::OkStatus();
    const absl::Time start = base::MonotonicNow();
    TROUPE_ASSIGN_OR_RETURN(auto share, train::EvalShare(*model_, spec_.model.eval_microbatches,
                                                         rank_->rank(), rank_->layout().world));
    for (const auto& [k, loss] : share) {
      done->eval_microbatches.push_back(k);
      done->eval_losses.push_back(loss);
    }
    done->eval_seconds = absl::ToDoubleSeconds(base::MonotonicNow() - start);
    return absl::OkStatus();
  }

  void Step(uint64_t gen, int64_t step) {
    const absl::Time start = base::MonotonicNow();
    const int64_t start_ns = absl::ToUnixNanos(absl::Now());  // the jobs timeline's wall stamp
    const uint64_t sent = comm_ != nullptr ? comm_->stats().bytes_sent : 0;
    StepDone evaluated;
    train::OuterSync sync;
    absl::StatusOr<train::StepOutcome> out = absl::FailedPreconditionError(
        absl::StrCat("step ", step, " asked, this rank is at step ", rank_->committed_steps()));
    if (step == rank_->committed_steps()) {
      absl::Status eval = rank_->stages() == 1 ? Evaluate(step, &evaluated) : absl::OkStatus();
      out = !eval.ok()            ? absl::StatusOr<train::StepOutcome>(eval)
            : lowcomm_ != nullptr ? lowcomm_->RunStep(&sync)
                                  : rank_->RunStep();
    }
    const int32_t blamed = collectives::BlamedPeer(out.status()).value_or(-1);
    if (!out.ok() && comm_ != nullptr) {
      out = absl::Status(out.status().code(),
                         absl::StrCat(out.status().message(), " [", comm_->DebugString(), "]"));
    }
    StepDone done{gen, step, worker_, WireStatus::From(out.status()), {}, {}, 0, blamed};
    if (out.ok()) {
      for (const auto& [k, loss] : out->losses) {
        done.microbatches.push_back(k + MicrobatchOffset());
        done.losses.push_back(loss);
      }
      done.grad_norm = out->grad_norm;
      done.compute_seconds = out->compute_seconds;
      done.schedule_seconds = out->schedule_seconds;
      done.start_ns = start_ns;
      done.step_seconds = absl::ToDoubleSeconds(base::MonotonicNow() - start);
      done.collective_seconds = out->collective_seconds;
      done.exchange_seconds = out->exchange_seconds;
      done.exposed_seconds = out->exposed_seconds;
      done.update_seconds = out->update_seconds;
      done.param_delta = out->param_delta;
      if (comm_ != nullptr) done.collective_bytes = comm_->stats().bytes_sent - sent;
      done.eval_microbatches = std::move(evaluated.eval_microbatches);
      done.eval_losses = std::move(evaluated.eval_losses);
      done.eval_seconds = evaluated.eval_seconds;
      done.outer_fragments = std::move(sync.fragments);
      done.outer_applied = std::move(sync.applied);
      done.outer_clipped = std::move(sync.clipped);
      done.outer_rejected = std::move(sync.rejected);
      done.outer_bytes = sync.bytes_sent;
      done.outer_feedback_error = sync.feedback_error;
      done.outer_wait_seconds = sync.wait_seconds;
      if (rank_->stages() > 1) NoteInFlight(gen, step, *out);
    }
    caf::anon_send(coordinator_, std::move(done));
  }

  // A pipeline stage's most microbatches in flight, into the job's event log whenever a
  // generation's step holds more than the ones before it (tests check the schedule's bound).
  void NoteInFlight(uint64_t gen, int64_t step, const train::StepOutcome& out) {
    if (gen == in_flight_gen_ && out.max_in_flight <= in_flight_max_) return;
    in_flight_gen_ = gen;
    in_flight_max_ = out.max_in_flight;
    const train::GridPosition pos =
        train::GridPositionOf(rank_->rank(), rank_->layout().world, rank_->stages());
    base::SupervisionEvent e = train::JobEvent("stage_in_flight", worker_, "rank");
    e.generation = gen;
    e.Set("step", step)
        .Set("stage", pos.stage)
        .Set("stages", rank_->stages())
        .Set("microbatches", out.block_size)
        .Set("in_flight", out.max_in_flight)
        .Set("schedule", train::PipelineScheduleName(spec_.pipeline_schedule));
    train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
  }

  void Commit(uint64_t gen, int64_t checkpoint_step) {
    // The write in flight reads the committed state in place, which Commit changes.
    if (writer_.joinable()) writer_.join();
    if (lowcomm_ != nullptr) {
      lowcomm_->Commit();
    } else {
      rank_->Commit();
    }
    if (checkpoint_step < 0 || checkpoint_step != rank_->committed_steps()) return;
    if (!FirstGroup()) return;  // [lowcomm]: the first group's shards are the checkpoint
    // Written on the writer thread while the next step runs (which only reads that state): in
    // place on the host, from a copy out of a GPU.
    auto copy = std::make_shared<train::HostShard>();
    absl::StatusOr<train::ShardView> view = rank_->CommittedShard(copy.get());
    const int index = rank_->rank();
    if (view.ok() && lowcomm_ != nullptr) lowcomm_->AddOuter(&*view);
    if (!view.ok()) {
      caf::anon_send(coordinator_, ShardWritten{gen, checkpoint_step, index, train::ShardFileInfo{},
                                                WireStatus::From(view.status())});
      return;
    }
    if (view->end <= view->begin) {  // a rank that owns only padding writes nothing
      if (auto f = TakeArmed(checkpoint_step, train::StepPoint::kCheckpoint)) {
        base::SupervisionEvent e = train::JobEvent("fault_failed", worker_, "rank");
        e.generation = gen;
        e.Set("kind", train::FaultKindName(f->kind)).Set("step", checkpoint_step).reason =
            "this rank owns only padding: it writes no shard to be killed in";
        train::EventLog(train::EventLogPath(spec_.work_dir)).Write(std::move(e));
      }
      return;
    }
    writer_ = std::thread([this, copy, shard = *view, index, checkpoint_step, gen] {
      (void)copy;  // a GPU model's copy lives until written
      absl::StatusOr<train::ShardFileInfo> info = store_->WriteShard(checkpoint_step, index, shard);
      train::ShardFileInfo i = info.ok() ? *info : train::ShardFileInfo{};
      caf::anon_send(coordinator_,
                     ShardWritten{gen, checkpoint_step, index, i, WireStatus::From(info.status())});
    });
  }

  void Final(uint64_t gen) {
    // A device that cannot copy the parameters out reports the CRC of nothing: the job then
    // fails its final check naming the ranks that disagree.
    absl::StatusOr<uint32_t> params_crc = rank_->ParamsCrc32c();
    const uint32_t crc = params_crc.ok() ? *params_crc : 0;
    FinalParams f{
        gen, static_cast<int64_t>(crc), model_->num_params(), rank_->committed_steps(), {}, {}};
    // The final parameters' validation loss, all of it here (only this rank is asked). A failed
    // evaluation leaves it out: the coordinator reports no final validation loss.
    if (spec_.eval_every > 0 && rank_->stages() == 1) {
      auto share = train::EvalShare(*model_, spec_.model.eval_microbatches, 0, 1);
      for (const auto& [k, loss] : share.ok() ? *share : decltype(share)::value_type{}) {
        f.eval_microbatches.push_back(k);
        f.eval_losses.push_back(loss);
      }
    }
    caf::anon_send(coordinator_, std::move(f));
  }

 private:
  struct Task {
    uint64_t gen;
    bool always;
    std::function<void()> run;
  };

  void Loop() {
    while (true) {
      Task t;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) break;
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      // Work of an aborted generation is skipped (its step is abandoned by the next Configure).
      if (!t.always && t.gen < aborted_below_.load()) continue;
      t.run();
    }
    if (writer_.joinable()) writer_.join();
  }

  caf::actor_system& sys_;
  train::JobSpec spec_;
  std::string worker_;
  std::string address_;
  std::unique_ptr<train::Trainable> model_;
  std::unique_ptr<train::ChaosFileSystem> disk_;  // under store_
  std::unique_ptr<train::CheckpointStore> store_;
  std::unique_ptr<train::ElasticRank> rank_;
  std::unique_ptr<train::LowCommRank> lowcomm_;  // [lowcomm]: over rank_, its group's
  uint64_t in_flight_gen_ = 0;                   // NoteInFlight: the generation and its most so far
  int in_flight_max_ = 0;
  std::unique_ptr<train::LineLog> serve_log_;
  caf::actor coordinator_;
  std::atomic<uint64_t> gen_{0};  // the step thread's; read by the writer and actor threads
  std::atomic<uint64_t> aborted_below_{0};
  std::mutex armed_mu_;
  ArmedFault armed_;                    // armed_mu_
  std::atomic<int64_t> stepped_ns_{0};  // this process's wall clock, stepped by clock-step
  std::mutex comm_mu_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::shared_ptr<DeviceComm> device_;  // a model in GPU memory only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_, writer_;
};

}  // namespace

absl::Status RegisterTrainingActors(runtime::ActorRegistry& registry) {
  AddTrainingMessageTypes(registry);
  TROUPE_RETURN_IF_ERROR(RegisterCoordinator(registry));
  return registry.Register<std::string, std::string, std::string>(
      kRankActorType,
      [](runtime::Actor* self, std::string spec_text, std::string worker,
         std::string address) -> caf::behavior {
        absl::StatusOr<train::JobSpec> spec =
            train::ParseJobSpec(spec_text, "job spec from the coordinator");
        std::shared_ptr<RankState> st;
        absl::Status init = spec.status();
        if (spec.ok()) {
          st = std::make_shared<RankState>(self->system(), *spec, worker, address);
          init = st->Init();
        }
        if (!init.ok()) {
          runtime::LogError(absl::StrCat("rank ", worker), init.ToString());
          self->quit(runtime::StatusToError(init));
          return {};
        }
        self->attach_functor([st] { st->Stop(); });
        return {
            [st](const ConfigureRank& m) {
              st->Abort(m.generation);
              st->Post(m.generation,
                       [st, m] { st->Configure(m.generation, m.plan, m.coordinator); });
            },
            [st](const RunStep& m) {
              st->Post(m.generation, [st, m] { st->Step(m.generation, m.step); });
            },
            [st](const CommitRank& m) {
              st->Post(
                  m.generation, [st, m] { st->Commit(m.generation, m.checkpoint_step); },
                  /*always=*/true);
            },
            [st](const AbortBelow& m) { st->Abort(m.generation); },
            [st](const RankEpoch& m) {
              st->Post(
                  m.generation, [st, m] { st->NewEpoch(m.epoch); }, /*always=*/true);
            },
            [st](const ArmKill& m) { st->ArmKill(m.step, m.signal, m.fault_kind, m.point); },
            [self, st](const Evict& m) {
              const caf::strong_actor_ptr& from = self->current_sender();
              st->Evicted(m.why, from && from->node() == self->system().node());
            },
            [st](const AskFinal& m) {
              st->Post(m.generation, [st, m] { st->Final(m.generation); });
            },
        };
      });
}

}  // namespace troupe::actors
