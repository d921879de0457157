// The sharded step against the single-process reference (model::Trainer), bit for bit, for any
// world size, across a rank's death, a scale-up and a checkpoint restore. Ranks are in-process
// communicators driven from threads; the process-level kills are in tests/training.
//
// Every test runs three ways: on host memory; on an "opaque device" — a model whose parameter,
// gradient and moment pointers the host cannot dereference (non-canonical addresses: any direct
// read or write by the trainer faults), reached only through its ArrayOps and a communicator
// that translates them, as a GPU's are through CUDA and NCCL; and over the NCCL communicator
// (its logic, on the in-process fake of NCCL and CUDA) beside a host communicator, as a rank on a
// GPU runs — a death failing NCCL's operations through Abort, as the rank's liveness monitor
// does. The same bits every way show that the elastic step is device-generic.
#include "troupe/train/elastic.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#ifdef TROUPE_ELASTIC_TEST_SIMT
#include "gpt.cuh"  // kernels/cuda, compiled here against the SIMT layer: GptCuda on the CPU
#include "gpt_device_trainable.h"
#endif
#include "nccl_backend.h"  // collectives/, private: the NCCL communicator over a backend
#include "troupe/collectives/bootstrap.h"
#include "troupe/collectives/inprocess.h"
#include "troupe/collectives/nccl_fake.h"
#include "troupe/model/crc32c.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/trainer.h"

namespace troupe::train {
namespace {

using collectives::Communicator;
using collectives::InProcessGroup;

constexpr int32_t kM = 8;

// The opaque device: its addresses are host addresses with bit 62 flipped (non-canonical on
// x86-64 and AArch64, so a dereference faults), translated back by its ArrayOps and communicator.
constexpr uintptr_t kOpaqueBit = uintptr_t{1} << 62;
template <class T>
T* Flip(T* p) {
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) ^ kOpaqueBit);
}

class OpaqueOps final : public model::ArrayOps {
 public:
  std::string name() const override { return "opaque"; }
  bool host_accessible() const override { return false; }
  absl::Status Copy(float* dst, const float* src, int64_t n) override {
    return host().Copy(Flip(dst), Flip(src), n);
  }
  absl::Status Fill(float* dst, int64_t n, float value) override {
    return host().Fill(Flip(dst), n, value);
  }
  absl::Status CopyToHost(float* host_dst, const float* src, int64_t n) override {
    return host().Copy(host_dst, Flip(src), n);
  }
  absl::Status CopyFromHost(float* dst, const float* host_src, int64_t n) override {
    return host().Copy(Flip(dst), host_src, n);
  }
  absl::Status Add(float* out, const float* x, const float* y, int64_t n) override {
    return host().Add(Flip(out), Flip(x), Flip(y), n);
  }
  absl::StatusOr<std::vector<double>> RangeChunkSquareSums(const float* x, int64_t begin,
                                                           int64_t end, int64_t total) override {
    return host().RangeChunkSquareSums(Flip(x), begin, end, total);
  }
  absl::Status AdamWUpdateRange(const std::vector<model::ParamTensor>& tensors, int64_t begin,
                                int64_t end, float* params, const float* grads, float* m, float* v,
                                const model::AdamWConfig& config,
                                const kernels::AdamWScalars& scalars,
                                const kernels::AdamWSources* from) override {
    if (from == nullptr) {
      return host().AdamWUpdateRange(tensors, begin, end, Flip(params), Flip(grads), Flip(m),
                                     Flip(v), config, scalars, nullptr);
    }
    const kernels::AdamWSources host_from{Flip(from->param), Flip(from->m), Flip(from->v)};
    return host().AdamWUpdateRange(tensors, begin, end, Flip(params), Flip(grads), Flip(m), Flip(v),
                                   config, scalars, &host_from);
  }

 protected:
  absl::StatusOr<float*> Allocate(int64_t n) override { return Flip(new float[n]); }
  void Free(float* p, int64_t /*n*/) override { delete[] Flip(p); }

 private:
  static model::ArrayOps& host() { return model::HostArrayOps(); }
};

// A host model's pipeline stages with every buffer handed out (and taken) as an opaque-device
// address.
class OpaqueStaged final : public StagedTrainable {
 public:
  explicit OpaqueStaged(StagedTrainable* inner) : inner_(inner) {}
  int num_units() const override { return inner_->num_units(); }
  int64_t boundary_size() const override { return inner_->boundary_size(); }
  std::vector<std::pair<int64_t, int64_t>> GradientRanges(int first, int end) const override {
    return inner_->GradientRanges(first, end);
  }
  std::vector<std::pair<int64_t, int64_t>> TiedRanges() const override {
    return inner_->TiedRanges();
  }
  void InitParamRange(uint64_t seed, int64_t begin, int64_t end) override {
    inner_->InitParamRange(seed, begin, end);
  }
  absl::Status SetStage(int first, int end, int slots) override {
    return inner_->SetStage(first, end, slots);
  }
  absl::StatusOr<double> StageForward(int64_t step, int32_t k, int slot,
                                      const float* input) override {
    return inner_->StageForward(step, k, slot, Flip(input));
  }
  const float* StageOutput(int slot) const override { return Flip(inner_->StageOutput(slot)); }
  absl::Status StageBackward(int slot, const float* d_output) override {
    return inner_->StageBackward(slot, Flip(d_output));
  }
  const float* InputGradient() const override { return Flip(inner_->InputGradient()); }
  absl::Status AddTiedGradient(int64_t step, int32_t k, const float* first_input_gradient,
                               float* tied) override {
    return inner_->AddTiedGradient(step, k, Flip(first_input_gradient), Flip(tied));
  }

 private:
  StagedTrainable* inner_;
};

// A host model whose buffers are handed out as opaque-device addresses.
class OpaqueTrainable final : public Trainable {
 public:
  explicit OpaqueTrainable(std::unique_ptr<Trainable> inner)
      : inner_(std::move(inner)), staged_(inner_->staged()) {}
  int64_t num_params() const override { return inner_->num_params(); }
  const std::vector<model::ParamTensor>& tensors() const override { return inner_->tensors(); }
  float* params() override { return Flip(inner_->params()); }
  const float* grads() const override { return Flip(inner_->grads()); }
  void InitParams(uint64_t seed) override { inner_->InitParams(seed); }
  absl::StatusOr<double> ComputeGradient(int64_t step, int32_t k) override {
    return inner_->ComputeGradient(step, k);
  }
  absl::StatusOr<double> ComputeGradientReporting(int64_t step, int32_t k,
                                                  const GradientReady& ready) override {
    return inner_->ComputeGradientReporting(step, k, ready);  // flat offsets: nothing to flip
  }
  int64_t tokens_per_microbatch() const override { return inner_->tokens_per_microbatch(); }
  model::ArrayOps& array_ops() override { return ops_; }
  StagedTrainable* staged() override { return inner_->staged() ? &staged_ : nullptr; }

 private:
  std::unique_ptr<Trainable> inner_;
  OpaqueOps ops_;
  OpaqueStaged staged_;
};

// Forwards to a host communicator: translating the opaque device's buffers (OpaqueComm), or
// saying that the peers are on other hosts (OtherHostsComm: the in-process group says they share
// this one).
class ForwardingComm final : public Communicator {
 public:
  ForwardingComm(Communicator* inner, bool opaque) : inner_(inner), opaque_(opaque) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  uint64_t generation() const override { return inner_->generation(); }
  collectives::Work AllReduce(collectives::Buffer in, collectives::Buffer out,
                              collectives::ReduceOp op,
                              const collectives::CollectiveOptions& o) override {
    return inner_->AllReduce(H(in), H(out), op, o);
  }
  collectives::Work ReduceScatter(collectives::Buffer in, collectives::Buffer out,
                                  collectives::ReduceOp op,
                                  const collectives::CollectiveOptions& o) override {
    return inner_->ReduceScatter(H(in), H(out), op, o);
  }
  collectives::Work AllGather(collectives::Buffer in, collectives::Buffer out,
                              const collectives::CollectiveOptions& o) override {
    return inner_->AllGather(H(in), H(out), o);
  }
  collectives::Work Broadcast(collectives::Buffer b, int root,
                              const collectives::CollectiveOptions& o) override {
    return inner_->Broadcast(H(b), root, o);
  }
  collectives::Work Send(collectives::Buffer b, int peer, uint32_t tag,
                         const collectives::CollectiveOptions& o) override {
    return inner_->Send(H(b), peer, tag, o);
  }
  collectives::Work Recv(collectives::Buffer b, int peer, uint32_t tag,
                         const collectives::CollectiveOptions& o) override {
    return inner_->Recv(H(b), peer, tag, o);
  }
  collectives::Work Barrier(const collectives::CollectiveOptions& o) override {
    return inner_->Barrier(o);
  }
  void Abort(absl::Status status) override { inner_->Abort(std::move(status)); }
  collectives::CommStats stats() const override { return inner_->stats(); }
  std::string DebugString() const override {
    return (opaque_ ? "opaque:" : "other-hosts:") + inner_->DebugString();
  }
  bool PeersShareHost() const override { return false; }
  bool MatchesByTag() const override { return inner_->MatchesByTag(); }

 private:
  collectives::Buffer H(collectives::Buffer b) const {
    if (opaque_) b.data = Flip(b.data);
    return b;
  }
  Communicator* inner_;
  const bool opaque_;
};
std::unique_ptr<Communicator> OpaqueComm(Communicator* inner) {
  return std::make_unique<ForwardingComm>(inner, /*opaque=*/true);
}
std::unique_ptr<Communicator> OtherHostsComm(Communicator* inner) {
  return std::make_unique<ForwardingComm>(inner, /*opaque=*/false);
}

// kOpaqueBf16: the opaque device holding the GPU's bf16 model (GptDeviceTrainable over GptCuda's
// launch sequence run by the SIMT layer), TROUPE_ELASTIC_TEST_SIMT builds only.
enum class Mode { kHost, kOpaqueDevice, kNccl, kOpaqueBf16 };

#ifdef TROUPE_ELASTIC_TEST_SIMT
// GptDevice's calls over GptCuda<bf16> in host memory, its kernels run by the SIMT layer and its
// GEMMs computed on the CPU from the cuBLASLt plans: what GptDeviceTrainable drives on a GPU.
class SimtBf16Gpt {
 public:
  using Gpt = model::cuda::GptCuda<__nv_bfloat16>;
  static absl::StatusOr<std::unique_ptr<SimtBf16Gpt>> Create(const model::GptConfig& config) {
    absl::StatusOr<std::unique_ptr<Gpt>> g =
        Gpt::Create(config, kernels::cuda::HostMemoryBackend(),
                    std::make_unique<model::cuda::ReferenceMatmulExecutor>(), nullptr);
    if (!g.ok()) return g.status();
    return std::make_unique<SimtBf16Gpt>(*std::move(g));
  }
  explicit SimtBf16Gpt(std::unique_ptr<Gpt> g) : g_(std::move(g)) {}
  const model::GptConfig& config() const { return g_->config(); }
  int64_t num_params() const { return g_->num_params(); }
  float* device_params() { return g_->params(); }
  model::ArrayOps& array_ops() { return model::HostArrayOps(); }
  absl::Status InitParams(uint64_t seed) { return g_->InitParams(seed); }
  absl::Status ParamsChanged() { return g_->ParamsChanged(); }
  absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets, int b, int t) {
    return g_->Forward(tokens, targets, b, t);
  }
  absl::Status ZeroGrad() { return g_->ZeroGrad(); }
  absl::Status Backward(float loss_weight, const Gpt::RangeReady& ready) {
    return g_->Backward(loss_weight, ready);
  }
  absl::StatusOr<const float*> Fp32Grads() { return g_->Fp32Grads(); }

 private:
  std::unique_ptr<Gpt> g_;
};

// The bf16 GPT of `spec` (size tiny) as the GPU path builds it, on the SIMT layer.
absl::StatusOr<std::unique_ptr<Trainable>> SimtBf16Trainable(const ModelSpec& spec) {
  absl::StatusOr<model::DataSource> data =
      model::DataSource::Open({spec.data_dir + "/train-00000.tok"}, 300,
                              {.seq_len = spec.seq_len,
                               .microbatch_size = spec.microbatch_size,
                               .microbatches_per_step = spec.microbatches,
                               .seed = spec.seed});
  if (!data.ok()) return data.status();
  absl::StatusOr<std::unique_ptr<SimtBf16Gpt>> gpt =
      SimtBf16Gpt::Create(model::GptConfig::Tiny(300));
  if (!gpt.ok()) return gpt.status();
  absl::StatusOr<std::unique_ptr<GptDeviceTrainable<SimtBf16Gpt>>> t =
      GptDeviceTrainable<SimtBf16Gpt>::Create(*std::move(gpt), *std::move(data), Device{});
  if (!t.ok()) return t.status();
  return std::unique_ptr<Trainable>(*std::move(t));
}
#endif

class ElasticTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe_elastic_" + std::to_string(getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    uint32_t x = 12345;
    for (auto& t : tokens) {
      x = x * 1664525u + 1013904223u;
      t = static_cast<int32_t>((x >> 16) % 300);
    }
    ASSERT_TRUE(model::WriteTokenShard(dir_ + "/train-00000.tok", tokens, 300).ok());
    spec_.data_dir = dir_;
    spec_.seq_len = 32;
    spec_.microbatch_size = 2;
    spec_.microbatches = kM;
    spec_.seed = 7;
    schedule_.warmup_steps = 2;
    schedule_.total_steps = 20;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Parameters and moments of the single-process reference after `steps` steps.
  void Reference(int steps, std::vector<float>* params, std::vector<float>* m) {
    auto data = model::DataSource::Open({dir_ + "/train-00000.tok"}, 300,
                                        {.seq_len = spec_.seq_len,
                                         .microbatch_size = spec_.microbatch_size,
                                         .microbatches_per_step = kM,
                                         .seed = 7});
    ASSERT_TRUE(data.ok()) << data.status();
    model::GptConfig config = model::GptConfig::Tiny(300);
    if (spec_.size == "tiny4") config.num_layers = 4;
    auto trainer = model::Trainer::Create(
        {.config = config, .adamw = {}, .schedule = schedule_, .init_seed = 3}, &*data);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int i = 0; i < steps; ++i) ASSERT_TRUE(trainer->Step().ok());
    params->assign(trainer->model().params(),
                   trainer->model().params() + trainer->model().num_params());
    *m = trainer->adam_m();
  }

  struct Rank {
    std::unique_ptr<Trainable> model;
    std::unique_ptr<ElasticRank> rank;
    int process = 0;  // kNccl: its process in the fake NCCL world
  };
  Rank NewRank(PipelineSchedule pipeline = PipelineSchedule::kOneFOneB) {
    Rank r;
    absl::StatusOr<std::unique_ptr<Trainable>> t;
#ifdef TROUPE_ELASTIC_TEST_SIMT
    if (GetParam() == Mode::kOpaqueBf16) t = SimtBf16Trainable(spec_);
#endif
    if (GetParam() != Mode::kOpaqueBf16) t = CreateGptTrainable(spec_);
    EXPECT_TRUE(t.ok()) << t.status();
    r.model = Opaque() ? std::make_unique<OpaqueTrainable>(*std::move(t)) : *std::move(t);
    r.process = processes_++;
    ElasticRank::Options o;
    o.microbatches = kM;
    o.seed = 3;
    o.schedule = schedule_;
    o.collective.timeout = absl::Seconds(20);
    o.pipeline = pipeline;
    o.bucket_bytes = bucket_bytes_;
    o.replicate_optimizer = replicate_;
    o.param_delta = param_delta_;
    o.on_serve = [this](int64_t s, int32_t k) {
      absl::MutexLock l(&mu_);
      served_.emplace_back(s, k);
    };
    r.rank = std::make_unique<ElasticRank>(r.model.get(), o);
    return r;
  }

  static bool Opaque() {
    return GetParam() == Mode::kOpaqueDevice || GetParam() == Mode::kOpaqueBf16;
  }

  // Runs f(i) on a thread per rank; returns each rank's status.
  static std::vector<absl::Status> Parallel(int n, const std::function<absl::Status(int)>& f) {
    std::vector<absl::Status> st(n);
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { st[i] = f(i); });
    for (auto& t : ts) t.join();
    return st;
  }
  static void ExpectAllOk(const std::vector<absl::Status>& st) {
    for (size_t i = 0; i < st.size(); ++i) EXPECT_TRUE(st[i].ok()) << "rank " << i << ": " << st[i];
  }

  // Configures ranks (ranks[i] becomes rank i) with `plan` and commits.
  void Configure(std::vector<Rank*> ranks, GenerationPlan plan, uint64_t gen,
                 CheckpointStore* store = nullptr) {
    std::vector<std::unique_ptr<Communicator>> comms;
    groups_.push_back(InProcessGroup::Create(ranks.size(), gen, &comms));
    // The communicator of the model's memory, where it is not the host one.
    std::vector<std::unique_ptr<Communicator>> device(ranks.size());
    const int n = static_cast<int>(ranks.size());
    auto st = Parallel(n, [&](int i) {
      if (Opaque()) {
        device[i] = OpaqueComm(comms[i].get());
      } else if (GetParam() == Mode::kNccl) {
        absl::StatusOr<std::unique_ptr<Communicator>> c = NcclRank(*ranks[i], i, n, gen);
        if (!c.ok()) return c.status();
        device[i] = *std::move(c);
      } else if (other_hosts_) {
        device[i] = OtherHostsComm(comms[i].get());
      }
      GenerationPlan p = plan;
      p.world = n;
      p.rank = i;
      return ranks[i]->rank->Configure(device[i] ? device[i].get() : comms[i].get(), p, store,
                                       comms[i].get());
    });
    ExpectAllOk(st);
    for (Rank* r : ranks) r->rank->Commit();
    device_comms_.clear();
    for (auto& c : device) device_comms_.push_back(c.get());
    for (auto& c : comms) comms_.push_back(std::move(c));
    for (auto& c : device) comms_.push_back(std::move(c));
  }
  // Runs steps until `until` is committed; each step's outcome by rank in *outcomes if given.
  void Steps(std::vector<Rank*> ranks, int until,
             std::vector<std::vector<StepOutcome>>* outcomes = nullptr) {
    while (ranks[0]->rank->committed_steps() < until) {
      std::vector<StepOutcome> outs(ranks.size());
      auto st = Parallel(ranks.size(), [&](int i) {
        absl::StatusOr<StepOutcome> o = ranks[i]->rank->RunStep();
        if (o.ok()) outs[i] = *std::move(o);
        return o.status();
      });
      ExpectAllOk(st);
      if (!st[0].ok()) return;
      for (Rank* r : ranks) r->rank->Commit();
      if (outcomes != nullptr) outcomes->push_back(std::move(outs));
    }
  }
  // Rank i of n in generation `gen` on the fake NCCL world, in r's process.
  absl::StatusOr<std::unique_ptr<Communicator>> NcclRank(const Rank& r, int i, int n,
                                                         uint64_t gen) {
    collectives::TcpBootstrapClient* boot;
    {
      absl::MutexLock l(&mu_);
      if (nccl_server_ == nullptr) {
        absl::StatusOr<std::unique_ptr<collectives::TcpBootstrapServer>> s =
            collectives::TcpBootstrapServer::Start();
        if (!s.ok()) return s.status();
        nccl_server_ = *std::move(s);
      }
      if (static_cast<int>(boots_.size()) <= r.process) boots_.resize(r.process + 1);
      if (boots_[r.process] == nullptr) {
        absl::StatusOr<std::unique_ptr<collectives::TcpBootstrapClient>> b =
            collectives::TcpBootstrapClient::Connect("127.0.0.1", nccl_server_->port());
        if (!b.ok()) return b.status();
        boots_[r.process] = *std::move(b);
      }
      boot = boots_[r.process].get();
    }
    collectives::NcclOptions o;
    o.rank = i;
    o.size = n;
    o.generation = gen;
    o.key_prefix = absl::StrCat("elastic", groups_.size());  // one id per group made
    o.connect_timeout = absl::Seconds(20);
    return collectives::CreateNcclCommunicator(boot, o, nccl_world_->Process(r.process));
  }

  // Rank i of the current generation (ranks[i]) dies: its host peers see it at once (the
  // in-process group); on NCCL its process stops answering and every rank's NCCL communicator is
  // aborted, the survivors' with the peer blamed — the rank actor's liveness monitor's job.
  void Kill(const std::vector<Rank*>& ranks, int i) {
    groups_.back()->KillRank(i);
    if (GetParam() != Mode::kNccl) return;
    nccl_world_->Process(ranks[i]->process)->Kill();
    for (size_t r = 0; r < device_comms_.size(); ++r) {
      device_comms_[r]->Abort(
          static_cast<int>(r) == i
              ? absl::AbortedError("this rank's process was killed")
              : collectives::BlamePeer(absl::UnavailableError("liveness: peer died"), i));
    }
  }

  // Steps [0, steps) each served every microbatch exactly once.
  void ExpectEveryMicrobatchServedOnce(int64_t steps) {
    std::vector<std::pair<int64_t, int32_t>> want;
    for (int64_t s = 0; s < steps; ++s)
      for (int32_t k = 0; k < kM; ++k) want.emplace_back(s, k);
    auto got = served_;
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want);
  }

  // Two data-parallel ranks run steps 0 and 1 and write checkpoint step-2 (null on failure).
  std::unique_ptr<CheckpointStore> CheckpointOfTwoRanksAtStep2() {
    auto store = CheckpointStore::Open({.dir = dir_ + "/ckpt", .keep_last = 2, .warning = {}});
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    std::vector<Rank> ranks(2);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
    Steps(ptrs, 2);
    CheckpointManifest meta;
    meta.num_params = ranks[0].model->num_params();
    meta.step = 2;
    meta.seed = 7;
    meta.world_size = 2;
    std::vector<HostShard> shards;
    std::vector<ShardView> views;
    for (auto& r : ranks) {
      absl::StatusOr<HostShard> shard = r.rank->CommittedShardOnHost();
      EXPECT_TRUE(shard.ok()) << shard.status();
      if (!shard.ok()) return nullptr;
      if (shard->end > shard->begin) shards.push_back(*std::move(shard));
    }
    for (const HostShard& shard : shards) views.push_back(shard.view());
    const absl::Status written = (*store)->Write(meta, views);
    EXPECT_TRUE(written.ok()) << written;
    return written.ok() ? *std::move(store) : nullptr;
  }

  // For 16 KiB, 64 KiB and 1 GiB pieces and each world size of `worlds`: fresh ranks trained to
  // step 2, then check(ranks, each step's outcomes by rank).
  void ForEveryBucketAndWorld(
      std::initializer_list<int> worlds,
      const std::function<void(const std::vector<Rank*>&,
                               const std::vector<std::vector<StepOutcome>>&)>& check) {
    for (int64_t bucket : {int64_t{16} << 10, int64_t{64} << 10, int64_t{1} << 30}) {
      bucket_bytes_ = bucket;
      for (int w : worlds) {
        SCOPED_TRACE(absl::StrCat("bucket ", bucket, " bytes, world ", w));
        std::vector<Rank> ranks(w);
        std::vector<Rank*> ptrs;
        for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
        Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
        std::vector<std::vector<StepOutcome>> outcomes;
        Steps(ptrs, 2, &outcomes);
        check(ptrs, outcomes);
      }
    }
  }

  // ranks->size() new ranks restored from `store`'s step-2 checkpoint and stepped to step 4; the
  // pointers into *ranks.
  std::vector<Rank*> RestoreStep2AndStepTo4(CheckpointStore* store, std::vector<Rank>* ranks) {
    std::vector<Rank*> ptrs;
    for (auto& r : *ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs,
              {.committed_steps = 2,
               .source = RestoreSource::kCheckpoint,
               .gone = {},
               .checkpoint_step = 2},
              5, store);
    Steps(ptrs, 4);
    return ptrs;
  }

  // Each rank's ParamsOnHost (a collective on a pipeline grid: every rank at once).
  static std::vector<std::vector<float>> Params(const std::vector<Rank*>& ranks) {
    std::vector<std::vector<float>> out(ranks.size());
    ExpectAllOk(Parallel(ranks.size(), [&](int i) {
      absl::StatusOr<std::vector<float>> p = ranks[i]->rank->ParamsOnHost();
      if (p.ok()) out[i] = *std::move(p);
      return p.status();
    }));
    return out;
  }
  // Every rank's parameters are `want`'s bits, and so is the CRC each computes (the job's check).
  static void ExpectBitIdentical(const std::vector<Rank*>& ranks, const std::vector<float>& want) {
    const std::vector<std::vector<float>> got = Params(ranks);
    for (size_t i = 0; i < ranks.size(); ++i) {
      ASSERT_EQ(got[i].size(), want.size()) << "rank " << i;
      EXPECT_EQ(0, std::memcmp(got[i].data(), want.data(), want.size() * sizeof(float)))
          << "rank " << i << ": parameters differ from the single-process reference";
    }
    std::vector<uint32_t> crc(ranks.size());
    ExpectAllOk(Parallel(ranks.size(), [&](int i) {
      absl::StatusOr<uint32_t> c = ranks[i]->rank->ParamsCrc32c();
      if (c.ok()) crc[i] = *c;
      return c.status();
    }));
    for (size_t i = 0; i < ranks.size(); ++i) {
      EXPECT_EQ(crc[i], model::Crc32c(want.data(), want.size() * sizeof(float))) << "rank " << i;
    }
  }

  std::string dir_;
  ModelSpec spec_;
  int64_t bucket_bytes_ = 0;                    // NewRank's ElasticRank::Options::bucket_bytes
  bool replicate_ = false;                      // and its replicate_optimizer
  ParamDelta param_delta_ = ParamDelta::kAuto;  // and its param_delta
  bool other_hosts_ = false;  // Configure: the ranks' communicators say their peers are elsewhere
  model::LrSchedule schedule_;
  std::vector<std::shared_ptr<InProcessGroup>> groups_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<Communicator*> device_comms_;  // of the current generation, if any
  int processes_ = 0;
  std::shared_ptr<collectives::testing::FakeNcclWorld> nccl_world_ =
      collectives::testing::FakeNcclWorld::Create();
  std::unique_ptr<collectives::TcpBootstrapServer> nccl_server_;
  std::vector<std::unique_ptr<collectives::TcpBootstrapClient>> boots_;
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, int32_t>> served_;
};

TEST_P(ElasticTest, AnyWorldSizeMatchesTheSingleProcessReference) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  for (int w : {1, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(w));
    std::vector<Rank> ranks(w);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
    Steps(ptrs, 3);
    ExpectBitIdentical(ptrs, want);
    // The moments, gathered from the owners, are the reference's too.
    for (auto& r : ranks) {
      absl::StatusOr<HostShard> shard = r.rank->CommittedShardOnHost();
      ASSERT_TRUE(shard.ok()) << shard.status();
      const ShardView v = shard->view();
      for (int64_t i = v.begin; i < v.end; ++i) {
        ASSERT_EQ(v.adam_m[i - v.begin], want_m[i]) << "element " << i;
      }
    }
  }
}

// The overlapped exchange sends the gradient in pieces as the backward pass finishes each block
// and gathers the parameters piece by piece behind AdamW: whatever the pieces, the bits are the
// serial reference's. 16 KiB: one norm chunk per piece (dozens per block); 64 KiB: about a block;
// 1 GiB: one piece per rank's range. World 5 mixes ranks of one microbatch (on the host they send
// from the model's gradient itself, AccumulateSubtree's subtree_) and of two.
TEST_P(ElasticTest, OverlappedStepIsBitIdenticalForEveryBucketSizeAndWorldSize) {
  std::vector<float> want, want_m;
  Reference(2, &want, &want_m);
  ForEveryBucketAndWorld({2, 3, 5}, [&](const std::vector<Rank*>& ptrs, const auto& outcomes) {
    ExpectBitIdentical(ptrs, want);
    for (const auto& step : outcomes) {
      for (const StepOutcome& o : step) {
        EXPECT_GT(o.exchange_seconds, 0);
        EXPECT_LE(o.exposed_seconds, o.exchange_seconds);
      }
    }
  });
}

TEST_P(ElasticTest, FastModeIsCloseButNotPromisedBitIdentical) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  std::vector<Rank> ranks(3);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) {
    r = NewRank();
    ElasticRank::Options o;
    o.microbatches = kM;
    o.seed = 3;
    o.schedule = schedule_;
    o.deterministic = false;
    r.rank = std::make_unique<ElasticRank>(r.model.get(), o);
    ptrs.push_back(&r);
  }
  Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(ptrs, 3);
  double max_diff = 0;
  const std::vector<std::vector<float>> all = Params(ptrs);
  const std::vector<float>& got = all[0];
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - want[i]));
  }
  EXPECT_LT(max_diff, 1e-4) << "fast-mode reduction drifted from the reference";
  for (const auto& p : all) EXPECT_EQ(p, got);  // every rank holds the same parameters
}

TEST_P(ElasticTest, RankDiesMidStepSurvivorsRestoreFromMemoryAndMatch) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(ptrs, 2);
  // Step 2: rank 2 dies while the others are in the gradient exchange.
  Kill(ptrs, 2);
  auto st = Parallel(4, [&](int i) { return ranks[i].rank->RunStep().status(); });
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(st[i].ok()) << "rank " << i;
  EXPECT_TRUE(absl::IsUnavailable(st[0])) << st[0];
  for (auto& r : ranks) r.rank->Abandon();
  // Generation 1: old ranks 0, 1, 3 become 0, 1, 2; old rank 2's moments come from its buddy.
  std::vector<Rank*> survivors = {&ranks[0], &ranks[1], &ranks[3]};
  Configure(survivors,
            {.committed_steps = 2, .source = RestoreSource::kMemory, .old_world = 4, .gone = {2}},
            1);
  Steps(survivors, 4);
  ExpectBitIdentical(survivors, want);
}

TEST_P(ElasticTest, AHostOfTwoRanksLostRestoresFromMirrorsOnTheOtherHost) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  // Ranks 0, 1 on one host, 2, 3 on another: buddies two ranks on.
  Configure(ptrs, {.buddy = 2, .source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(ptrs, 2);
  Kill(ptrs, 2);
  Kill(ptrs, 3);
  auto st = Parallel(2, [&](int i) { return ranks[i].rank->RunStep().status(); });
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(st[i].ok()) << "rank " << i;
  for (auto& r : ranks) r.rank->Abandon();
  std::vector<Rank*> survivors = {&ranks[0], &ranks[1]};
  Configure(survivors,
            {.committed_steps = 2,
             .source = RestoreSource::kMemory,
             .old_world = 4,
             .gone = {2, 3},
             .old_buddy = 2},
            1);
  Steps(survivors, 4);
  ExpectBitIdentical(survivors, want);
}

// Two ranks of six die apart (1 and 4: their buddies 2 and 5 live), a joiner comes: the kept
// ranks 0, 2, 3, 5 close up in their order, the world of five cuts the ranges differently, and
// every piece comes from its owner or its mirror.
TEST_P(ElasticTest, DeathsApartAndAJoinerInOneGenerationRestoreFromMemoryAndMatch) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(7);
  for (auto& r : ranks) r = NewRank();
  std::vector<Rank*> six = {&ranks[0], &ranks[1], &ranks[2], &ranks[3], &ranks[4], &ranks[5]};
  Configure(six, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(six, 2);
  std::vector<Rank*> five = {&ranks[0], &ranks[2], &ranks[3], &ranks[5], &ranks[6]};
  Configure(
      five,
      {.committed_steps = 2, .source = RestoreSource::kMemory, .old_world = 6, .gone = {1, 4}}, 1);
  Steps(five, 4);
  ExpectBitIdentical(five, want);
}

// A plan's gone ranks are validated: increasing, inside the old world, and leaving no more kept
// ranks than the new world holds.
TEST_P(ElasticTest, APlanWithBadGoneRanksIsRefused) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) r = NewRank();
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  for (const std::vector<int>& bad :
       {std::vector<int>{3, 2}, std::vector<int>{2, 2}, std::vector<int>{4}, std::vector<int>{}}) {
    auto st = Parallel(2, [&](int i) {
      GenerationPlan p{.world = 2,
                       .rank = i,
                       .committed_steps = 2,
                       .source = RestoreSource::kMemory,
                       .old_world = 4,
                       .gone = bad};
      return ranks[i].rank->Configure(comms[i].get(), p, nullptr);
    });
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[i])) << st[i];
      EXPECT_NE(st[i].message().find("gone ranks: expected increasing old ranks in [0, 4)"),
                std::string::npos)
          << st[i];
    }
  }
}

TEST_P(ElasticTest, APlanWithABuddyOffsetOutsideItsWorldIsRefused) {
  std::vector<Rank> ranks(2);
  for (auto& r : ranks) r = NewRank();
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  for (int bad : {0, 2}) {
    auto st = Parallel(2, [&](int i) {
      GenerationPlan p{
          .world = 2, .rank = i, .buddy = bad, .source = RestoreSource::kInit, .gone = {}};
      return ranks[i].rank->Configure(comms[i].get(), p, nullptr);
    });
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[i])) << st[i];
      EXPECT_NE(st[i].message().find("buddy offsets: expected 1 <= buddy < world"),
                std::string::npos)
          << st[i];
    }
  }
}

TEST_P(ElasticTest, JoinersAreFoldedInAndMatch) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(4);
  for (auto& r : ranks) r = NewRank();
  std::vector<Rank*> two = {&ranks[0], &ranks[1]},
                     four = {&ranks[0], &ranks[1], &ranks[2], &ranks[3]};
  Configure(two, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(two, 2);
  Configure(four,
            {.committed_steps = 2, .source = RestoreSource::kMemory, .old_world = 2, .gone = {}},
            1);
  Steps(four, 4);
  ExpectBitIdentical(four, want);
}

TEST_P(ElasticTest, CheckpointRestoreIntoAnotherWorldSizeMatches) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::unique_ptr<CheckpointStore> store = CheckpointOfTwoRanksAtStep2();
  ASSERT_NE(store, nullptr);
  std::vector<Rank> ranks(3);
  ExpectBitIdentical(RestoreStep2AndStepTo4(store.get(), &ranks), want);
}

TEST_P(ElasticTest, EveryMicrobatchServedOncePerCommittedStep) {
  std::vector<Rank> ranks(3);
  std::vector<Rank*> ptrs;
  for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
  Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(ptrs, 2);
  ExpectEveryMicrobatchServedOnce(2);
}

// The coordinator reads a GPU job's model shape on a node without GPUs: the host fp32 instance of
// a cuda bf16 spec builds there, with the layout of the model the ranks train (once a bug: the
// coordinator kept precision = "bf16", which the CPU model refuses, and every bf16 GPU job
// failed at its start).
TEST(HostLayoutSpecTest, AGpuBf16ModelHasAHostProbeWithItsLayout) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("troupe_host_layout_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 300);
  ASSERT_TRUE(model::WriteTokenShard(dir + "/train-00000.tok", tokens, 300).ok());
  ModelSpec gpu;
  gpu.data_dir = dir;
  gpu.size = "tiny4";
  gpu.device = "cuda:1";
  gpu.precision = "bf16";
  const ModelSpec host = HostLayoutSpec(gpu);
  EXPECT_EQ(host.device, "cpu");
  EXPECT_EQ(host.precision, "fp32");
  EXPECT_EQ(host.size, "tiny4");
  absl::StatusOr<std::unique_ptr<Trainable>> probe = TrainableRegistry::Global().Create(host);
  ASSERT_TRUE(probe.ok()) << probe.status();
  model::GptConfig config = model::GptConfig::Tiny(300);
  config.num_layers = 4;
  EXPECT_EQ((*probe)->num_params(), model::ParamLayout(config).total_size());
  EXPECT_EQ((*probe)->gpt_config()->num_layers, 4);
  std::filesystem::remove_all(dir);
}

// A model whose tensors() are whatever it is given: the registry checks them at creation.
class TensorListTrainable final : public Trainable {
 public:
  TensorListTrainable(std::vector<model::ParamTensor> tensors, int64_t n)
      : tensors_(std::move(tensors)), params_(n), grads_(n) {}
  int64_t num_params() const override { return static_cast<int64_t>(params_.size()); }
  const std::vector<model::ParamTensor>& tensors() const override { return tensors_; }
  float* params() override { return params_.data(); }
  const float* grads() const override { return grads_.data(); }
  void InitParams(uint64_t /*seed*/) override {}
  absl::StatusOr<double> ComputeGradient(int64_t /*step*/, int32_t /*k*/) override { return 0.0; }
  int64_t tokens_per_microbatch() const override { return 1; }

 private:
  std::vector<model::ParamTensor> tensors_;
  std::vector<float> params_, grads_;
};

// The staged AdamW writes only what the tensors cover (out of place, nothing else is carried
// over), so a custom model whose tensors leave a gap or stop short is refused by name at creation.
TEST(TrainableRegistryTest, TensorsThatDoNotCoverTheParametersAreRefusedByName) {
  auto tensor = [](std::string name, int64_t offset, int64_t size) {
    model::ParamTensor t;
    t.name = std::move(name);
    t.offset = offset;
    t.size = size;
    t.shape = {size};
    return t;
  };
  TrainableRegistry registry;
  auto add = [&](const std::string& name, std::vector<model::ParamTensor> tensors, int64_t n) {
    registry.Register(name, [=](const ModelSpec&) -> absl::StatusOr<std::unique_ptr<Trainable>> {
      return std::make_unique<TensorListTrainable>(tensors, n);
    });
  };
  add("gap", {tensor("a", 0, 3), tensor("b", 4, 2)}, 6);
  add("short", {tensor("a", 0, 3)}, 5);
  add("whole", {tensor("a", 0, 3), tensor("b", 3, 2)}, 5);
  ModelSpec spec;
  spec.type = "gap";
  absl::StatusOr<std::unique_ptr<Trainable>> made = registry.Create(spec);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find(
                "model 'gap': tensor 'b' covers [4, 6): expected it to start at 3"),
            absl::string_view::npos)
      << made.status();
  spec.type = "short";
  made = registry.Create(spec);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("tensors() cover [0, 3), expected [0, num_params() = 5)"),
            absl::string_view::npos)
      << made.status();
  spec.type = "whole";
  made = registry.Create(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->num_params(), 5);
}

TEST(PipelineScheduleTest, EveryMicrobatchOnceBackwardsInOrderInFlightBounded) {
  using Kind = PipelineOp::Kind;
  for (PipelineSchedule schedule : {PipelineSchedule::kOneFOneB, PipelineSchedule::kGPipe}) {
    for (int p = 1; p <= 5; ++p) {
      for (int s = 0; s < p; ++s) {
        for (int m = 1; m <= 9; ++m) {
          SCOPED_TRACE(testing::Message()
                       << PipelineScheduleName(schedule) << " p=" << p << " s=" << s << " m=" << m);
          const std::vector<PipelineOp> ops = StageOps(schedule, p, s, m);
          ASSERT_EQ(ops.size(), 2u * m);
          std::vector<int> forwarded(m, 0);
          int next_backward = 0;
          for (const PipelineOp& op : ops) {
            if (op.kind == Kind::kForward) {
              ++forwarded[op.microbatch];
            } else {
              ASSERT_EQ(op.microbatch, next_backward++) << "backwards in microbatch order";
              ASSERT_EQ(forwarded[op.microbatch], 1) << "backward before its forward";
            }
          }
          EXPECT_EQ(std::count(forwarded.begin(), forwarded.end(), 1), m);
          EXPECT_EQ(MaxInFlight(ops),
                    schedule == PipelineSchedule::kGPipe ? m : std::min(m, p - s));
        }
      }
    }
  }
  // 1F1B on stage 1 of 3 with 4 microbatches: one warm-up forward, then alternate.
  using O = PipelineOp;
  EXPECT_EQ(StageOps(PipelineSchedule::kOneFOneB, 3, 1, 4), (std::vector<O>{{Kind::kForward, 0},
                                                                            {Kind::kForward, 1},
                                                                            {Kind::kBackward, 0},
                                                                            {Kind::kForward, 2},
                                                                            {Kind::kBackward, 1},
                                                                            {Kind::kForward, 3},
                                                                            {Kind::kBackward, 2},
                                                                            {Kind::kBackward, 3}}));
  EXPECT_EQ(*ParsePipelineSchedule("gpipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::kOneFOneB);
  EXPECT_EQ(ParsePipelineSchedule("zb").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PipelineScheduleTest, UnitsPartitionedContiguouslyByCost) {
  using P = std::vector<std::pair<int, int>>;
  auto alike = [](int units) { return StageCosts{std::vector<double>(units, 1.0), 0, 0}; };
  EXPECT_EQ(*PartitionUnits(alike(4), 2), (P{{0, 2}, {2, 4}}));
  EXPECT_EQ(*PartitionUnits(alike(4), 3), (P{{0, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(*PartitionUnits(alike(6), 4), (P{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(*PartitionUnits(alike(5), 1), (P{{0, 5}}));
  EXPECT_EQ(*PartitionUnits(alike(3), 3), (P{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(PartitionUnits(alike(4), 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionUnits(alike(4), 0).status().code(), absl::StatusCode::kInvalidArgument);
  // A head worth 2.5 blocks: the last stage takes one block (3 | 3.5), not two (2 | 4.5).
  EXPECT_EQ(*PartitionUnits({{1, 1, 1, 1}, 0, 2.5}, 2), (P{{0, 3}, {3, 4}}));
  // An expensive first stage the same way round.
  EXPECT_EQ(*PartitionUnits({{1, 1, 1, 1}, 2.5, 0}, 2), (P{{0, 1}, {1, 4}}));
  // Uneven units: the most expensive stage is as cheap as any cut allows (5 | 4 + 3).
  EXPECT_EQ(*PartitionUnits({{2, 3, 4, 3}, 0, 0}, 2), (P{{0, 2}, {2, 4}}));
  // GPT-2 small (12 blocks of 12·768² + 1024·768, a head of 768·50257 multiply-adds per
  // token, about 5 blocks' worth) over 4 stages: the head's stage holds the fewest blocks.
  const double block = 12.0 * 768 * 768 + 1024.0 * 768, head = 768.0 * 50257;
  absl::StatusOr<std::vector<std::pair<int, int>>> gpt2 =
      PartitionUnits({std::vector<double>(12, block), 0, head}, 4);
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(*gpt2, (P{{0, 4}, {4, 8}, {8, 11}, {11, 12}}));
  // Grids for a world: the divisor closest to the stages asked for, within units and M.
  EXPECT_EQ(ChooseStages(4, 2, 4, 8), 2);
  EXPECT_EQ(ChooseStages(3, 2, 4, 8), 3) << "1 and 3 are as close: the larger";
  EXPECT_EQ(ChooseStages(3, 4, 4, 8), 3);
  EXPECT_EQ(ChooseStages(6, 4, 4, 8), 3);
  EXPECT_EQ(ChooseStages(5, 2, 4, 8), 1);
  EXPECT_EQ(ChooseStages(5, 2, 4, 4), 0) << "5 ranks: 5 replicas exceed M, 5 stages the units";
  EXPECT_EQ(ChooseStages(12, 2, 4, 4), 3);
  EXPECT_EQ(ChooseStages(4, 1, 4, 8), 1);
  // Rank r of a 2 × 3 grid: replica r % 2 of stage r / 2.
  for (int r = 0; r < 6; ++r) {
    const GridPosition g = GridPositionOf(r, 6, 3);
    EXPECT_EQ(g.replica, r % 2);
    EXPECT_EQ(g.stage, r / 2);
    EXPECT_EQ(GridRank(g, 6, 3), r);
  }
}

// [optimizer] state = "replicated": every rank keeps every range's moments, shares the reduced
// gradient pieces as it combines them and runs AdamW on all of them — no all-gather behind AdamW,
// no mirror. Host memory only (its shares go in arrival order: NCCL's issue order is not kept).
class ElasticReplicatedTest : public ElasticTest {
 protected:
  ElasticReplicatedTest() { replicate_ = true; }
  // What the host communicators of the last generation of w ranks sent so far (Configure appended
  // them, then w communicators of the model's memory).
  uint64_t HostBytesSent(int w) const {
    uint64_t bytes = 0;
    for (size_t i = comms_.size() - 2 * w; i < comms_.size() - w; ++i) {
      bytes += comms_[i]->stats().bytes_sent;
    }
    return bytes;
  }
  // Each rank's committed moments m of its range are the reference's.
  static void ExpectMomentsOf(const std::vector<Rank*>& ranks, const std::vector<float>& want_m) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      absl::StatusOr<HostShard> shard = ranks[i]->rank->CommittedShardOnHost();
      ASSERT_TRUE(shard.ok()) << shard.status();
      const int64_t count = shard->end - shard->begin;
      EXPECT_EQ(0, std::memcmp(shard->data.data() + count, want_m.data() + shard->begin,
                               count * sizeof(float)))
          << "rank " << i << ": the moments of its range differ from the reference's";
    }
  }
};

TEST_P(ElasticReplicatedTest, BitIdenticalForEveryBucketSizeAndWorldSize) {
  std::vector<float> want, want_m;
  Reference(2, &want, &want_m);
  ForEveryBucketAndWorld({1, 2, 3, 5}, [&](const std::vector<Rank*>& ptrs, const auto& outcomes) {
    ExpectBitIdentical(ptrs, want);
    ExpectMomentsOf(ptrs, want_m);
    for (const StepOutcome& o : outcomes.back()) EXPECT_LE(o.exposed_seconds, o.exchange_seconds);
  });
}

// Ranks 1 and 2 die in the middle of step 2: an owner and its buddy, which the sharded state
// cannot restore from memory; here the first survivor holds every range. A joiner takes the
// whole state from it.
TEST_P(ElasticReplicatedTest, AnySurvivorRestoresEveryRangeAndAJoinerIsFoldedIn) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::vector<Rank> ranks(5);
  for (auto& r : ranks) r = NewRank();
  std::vector<Rank*> four = {&ranks[0], &ranks[1], &ranks[2], &ranks[3]};
  Configure(four, {.source = RestoreSource::kInit, .gone = {}}, 0);
  Steps(four, 2);
  Kill(four, 1);
  Kill(four, 2);
  auto st = Parallel(2, [&](int i) { return four[i == 0 ? 0 : 3]->rank->RunStep().status(); });
  for (const absl::Status& s : st) EXPECT_FALSE(s.ok());
  for (auto& r : ranks) r.rank->Abandon();
  std::vector<Rank*> three = {&ranks[0], &ranks[3], &ranks[4]};
  Configure(
      three,
      {.committed_steps = 2, .source = RestoreSource::kMemory, .old_world = 4, .gone = {1, 2}}, 1);
  Steps(three, 4);
  ExpectBitIdentical(three, want);
  ExpectMomentsOf(three, want_m);
}

// The buddy runs its owner's AdamW on its mirror from the gradient the mirror brings, so the
// owner sends its updated range to every rank but the buddy: a sharded step puts on the wire what
// a replicated one does, 2(W - 1) gradients over all W ranks (6 at W = 4; 7 when the buddy got
// the updated range too), and the next steps' bits still hold.
TEST_P(ElasticReplicatedTest, TheBuddyMirrorAddsNoBytesToAStep) {
  constexpr int kW = 4;
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  param_delta_ = ParamDelta::kOff;  // the parameters as they are (the delta's bytes: below)
  for (const bool replicated : {false, true}) {
    replicate_ = replicated;
    SCOPED_TRACE(replicated ? "replicated" : "sharded");
    std::vector<Rank> ranks(kW);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
    Steps(ptrs, 1);
    const uint64_t before = HostBytesSent(kW);
    Steps(ptrs, 2);
    const double gradients = static_cast<double>(HostBytesSent(kW) - before) /
                             (static_cast<double>(ptrs[0]->model->num_params()) * sizeof(float));
    // Beyond the 6 gradients, only the sharded norm's chunk sums (a few doubles per 4 Ki chunk).
    EXPECT_GE(gradients, 2.0 * (kW - 1));
    EXPECT_LT(gradients, 2.0 * (kW - 1) + 0.1);
    Steps(ptrs, 3);
    ExpectBitIdentical(ptrs, want);
    ExpectMomentsOf(ptrs, want_m);
  }
}

// [elastic] param_delta = "on": each updated parameter piece travels as the XOR of its bits with
// the committed parameters, in byte planes, compressed (train/param_delta.h). The same bits and
// moments as the reference for every piece size and world size, in fewer bytes than the raw
// share.
class ElasticDeltaTest : public ElasticReplicatedTest {
 protected:
  ElasticDeltaTest() { replicate_ = false; }  // the sharded state: its parameter share
  // The bytes kW fresh ranks send in steps 2 and 3 (after step 1: every AdamW moves every
  // parameter by about the learning rate from then on), checking the reference's bits at 3.
  uint64_t BytesOfSteps2And3(int w, const std::vector<float>& want) {
    std::vector<Rank> ranks(w);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
    Steps(ptrs, 1);
    const uint64_t before = HostBytesSent(w);
    Steps(ptrs, 3);
    ExpectBitIdentical(ptrs, want);
    return HostBytesSent(w) - before;
  }
};

TEST_P(ElasticDeltaTest, TheParameterDeltaKeepsEveryBitInFewerBytes) {
  std::vector<float> want, want_m;
  Reference(2, &want, &want_m);
  param_delta_ = ParamDelta::kOn;
  ForEveryBucketAndWorld({2, 3, 4}, [&](const std::vector<Rank*>& ptrs, const auto&) {
    ExpectBitIdentical(ptrs, want);
    ExpectMomentsOf(ptrs, want_m);
  });
  Reference(3, &want, &want_m);
  constexpr int kW = 4;
  bucket_bytes_ = 0;
  param_delta_ = ParamDelta::kOff;
  const uint64_t raw = BytesOfSteps2And3(kW, want);
  param_delta_ = ParamDelta::kOn;
  const uint64_t delta = BytesOfSteps2And3(kW, want);
  // A step's raw share: each owner's range to the kW - 2 ranks that are neither it nor its buddy.
  const double share = 2.0 * (kW - 2) * static_cast<double>(want.size()) * sizeof(float);
  EXPECT_LT(static_cast<double>(delta), static_cast<double>(raw) - 0.15 * share)
      << "raw " << raw << " bytes, delta " << delta << " bytes (two steps' shares: " << share
      << ")";
  // "auto" where every peer shares the host: the parameters as they are, not even framed.
  param_delta_ = ParamDelta::kAuto;
  EXPECT_EQ(BytesOfSteps2And3(kW, want), raw);
}

// "auto" across hosts frames every piece, and each rank chooses for itself whether its pieces go
// as deltas: here ranks that always encode ("on") beside ranks that choose, in one step — the
// reference's bits for small and large pieces alike.
TEST_P(ElasticDeltaTest, AcrossHostsRanksSendingDeltasAndRawPiecesInOneStepKeepEveryBit) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  other_hosts_ = true;
  for (int64_t bucket : {int64_t{16} << 10, int64_t{0}}) {
    bucket_bytes_ = bucket;
    for (int w : {3, 4}) {
      SCOPED_TRACE(absl::StrCat("bucket ", bucket, " bytes, world ", w));
      std::vector<Rank> ranks(w);
      std::vector<Rank*> ptrs;
      for (int i = 0; i < w; ++i) {
        param_delta_ = i % 2 == 0 ? ParamDelta::kOn : ParamDelta::kAuto;
        ranks[i] = NewRank();
        ptrs.push_back(&ranks[i]);
      }
      Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
      std::vector<std::vector<StepOutcome>> outcomes;
      Steps(ptrs, 3, &outcomes);
      ExpectBitIdentical(ptrs, want);
      ExpectMomentsOf(ptrs, want_m);
      // From step 2 on (the first moves parameters from their initialisation), rank 0 sent
      // compressed pieces.
      ASSERT_EQ(outcomes.size(), 3u);
      EXPECT_TRUE(outcomes[2][0].param_delta);
    }
  }
}

// A checkpoint holds each range's moments, whichever state wrote it: a replicated one restores
// into a sharded world of another size and back, with the reference's bits.
TEST_P(ElasticReplicatedTest, CheckpointsRestoreIntoEitherStateAtAnotherWorldSize) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  for (const bool written_replicated : {true, false}) {
    replicate_ = written_replicated;
    std::filesystem::remove_all(dir_ + "/ckpt");
    std::unique_ptr<CheckpointStore> store = CheckpointOfTwoRanksAtStep2();
    ASSERT_NE(store, nullptr);
    replicate_ = !written_replicated;
    SCOPED_TRACE(written_replicated ? "replicated into sharded" : "sharded into replicated");
    std::vector<Rank> ranks(3);
    const std::vector<Rank*> ptrs = RestoreStep2AndStepTo4(store.get(), &ranks);
    ExpectBitIdentical(ptrs, want);
    ExpectMomentsOf(ptrs, want_m);
  }
}

TEST_P(ElasticReplicatedTest, IsRefusedOutsideDeterministicDataParallelismOnTheHost) {
  std::vector<std::unique_ptr<Communicator>> comms;
  auto group = InProcessGroup::Create(2, 0, &comms);
  std::vector<std::unique_ptr<Communicator>> own(2);
  for (int i = 0; i < 2; ++i) own[i] = OpaqueComm(comms[i].get());
  struct Case {
    const char* why;
    bool deterministic;
    int stages;
    bool own_comm;
  };
  for (const Case& c :
       {Case{"deterministic off", false, 1, false}, Case{"pipeline stages", true, 2, false},
        Case{"a communicator of the model's memory", true, 1, true}}) {
    SCOPED_TRACE(c.why);
    std::vector<Rank> ranks(2);
    for (auto& r : ranks) {
      r = NewRank();
      ElasticRank::Options o;
      o.microbatches = kM;
      o.deterministic = c.deterministic;
      o.replicate_optimizer = true;
      r.rank = std::make_unique<ElasticRank>(r.model.get(), o);
    }
    auto st = Parallel(2, [&](int i) {
      GenerationPlan p{.world = 2, .rank = i, .stages = c.stages, .gone = {}};
      return ranks[i].rank->Configure(c.own_comm ? own[i].get() : comms[i].get(), p, nullptr,
                                      comms[i].get());
    });
    for (const absl::Status& s : st) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_NE(s.message().find("a replicated optimizer state needs deterministic data "
                                 "parallelism on the host communicator"),
                std::string::npos)
          << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Memory, ElasticReplicatedTest, ::testing::Values(Mode::kHost),
                         [](const ::testing::TestParamInfo<Mode>&) { return "Host"; });
INSTANTIATE_TEST_SUITE_P(Memory, ElasticDeltaTest, ::testing::Values(Mode::kHost),
                         [](const ::testing::TestParamInfo<Mode>&) { return "Host"; });

// Pipeline grids on the 4-block GPT: the data-parallel reference's bits for any (dp, pp) and
// either schedule, each stage holding no more microbatches than its schedule allows.
class ElasticPipelineTest : public ElasticTest {
 protected:
  void SetUp() override {
    ElasticTest::SetUp();
    spec_.size = "tiny4";
  }
  // world ranks of `schedule`, configured as a grid of `stages` from scratch.
  std::vector<Rank> Grid(int world, int stages, PipelineSchedule schedule, uint64_t gen) {
    std::vector<Rank> ranks(world);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(schedule), ptrs.push_back(&r);
    Configure(ptrs, {.stages = stages, .source = RestoreSource::kInit, .gone = {}}, gen);
    return ranks;
  }
  static std::vector<Rank*> Ptrs(std::vector<Rank>& ranks) {
    std::vector<Rank*> out;
    for (auto& r : ranks) out.push_back(&r);
    return out;
  }
};

TEST_P(ElasticPipelineTest, EveryGridMatchesTheDataParallelReference) {
  std::vector<float> want, want_m;
  Reference(3, &want, &want_m);
  for (PipelineSchedule schedule : {PipelineSchedule::kOneFOneB, PipelineSchedule::kGPipe}) {
    for (const auto& [dp, pp] : std::vector<std::pair<int, int>>{{1, 2}, {2, 2}, {1, 4}, {2, 4}}) {
      SCOPED_TRACE(testing::Message()
                   << PipelineScheduleName(schedule) << " dp=" << dp << " pp=" << pp);
      std::vector<Rank> ranks = Grid(dp * pp, pp, schedule, 0);
      std::vector<std::vector<StepOutcome>> outcomes;
      Steps(Ptrs(ranks), 3, &outcomes);
      ExpectBitIdentical(Ptrs(ranks), want);
      ASSERT_EQ(outcomes.size(), 3u);
      const int m = kM / dp;  // each replica's microbatches
      for (int r = 0; r < dp * pp; ++r) {
        const GridPosition g = GridPositionOf(r, dp * pp, pp);
        const int bound = schedule == PipelineSchedule::kGPipe ? m : std::min(m, pp - g.stage);
        EXPECT_EQ(outcomes[0][r].max_in_flight, bound) << "rank " << r;
        // Losses come from the last stage only, one per microbatch of the replica.
        EXPECT_EQ(outcomes[0][r].losses.size(), g.stage == pp - 1 ? size_t(m) : 0u) << "rank " << r;
      }
    }
  }
}

TEST_P(ElasticPipelineTest, ALostStageWorkerReplansTheGridFromMemoryAndMatches) {
  std::vector<float> want, want_m;
  Reference(5, &want, &want_m);
  std::vector<Rank> ranks = Grid(4, 2, PipelineSchedule::kOneFOneB, 0);  // dp 2 × pp 2
  Steps(Ptrs(ranks), 2);
  // Step 2: rank 2 (replica 0 of stage 1) dies mid-step.
  Kill(Ptrs(ranks), 2);
  auto st = Parallel(4, [&](int i) { return ranks[i].rank->RunStep().status(); });
  EXPECT_FALSE(st[2].ok());
  for (int i : {0, 1, 3}) EXPECT_FALSE(st[i].ok()) << "rank " << i << " must fail, not hang";
  for (auto& r : ranks) r.rank->Abandon();
  // Generation 1: the three survivors as a 1 × 3 grid (blocks re-cut 2 + 1 + 1), old rank 2's
  // moments from its buddy's mirror.
  std::vector<Rank*> survivors = {&ranks[0], &ranks[1], &ranks[3]};
  Configure(survivors,
            {.stages = 3,
             .committed_steps = 2,
             .source = RestoreSource::kMemory,
             .old_world = 4,
             .gone = {2}},
            1);
  Steps(survivors, 3);
  // Generation 2: data parallelism only on the same three.
  Configure(survivors,
            {.stages = 1,
             .committed_steps = 3,
             .source = RestoreSource::kMemory,
             .old_world = 3,
             .gone = {}},
            2);
  Steps(survivors, 4);
  // Generation 3: a joiner makes a 2 × 2 grid again.
  Rank joiner = NewRank();
  std::vector<Rank*> four = {&ranks[0], &ranks[1], &ranks[3], &joiner};
  Configure(four,
            {.stages = 2,
             .committed_steps = 4,
             .source = RestoreSource::kMemory,
             .old_world = 3,
             .gone = {}},
            3);
  Steps(four, 5);
  ExpectBitIdentical(four, want);
  if (GetParam() != Mode::kHost) return;
  // Each rank of the grid keeps only its stage's and its range's parameters: every page of the
  // model's buffer outside them went back to the kernel, though the data-parallel generation
  // before held them all.
  const long page = sysconf(_SC_PAGESIZE);
  for (Rank* r : four) {
    absl::StatusOr<ElasticRank::Ranges> held =
        r->rank->HeldRanges(r->rank->layout(), r->rank->rank(), r->rank->stages());
    ASSERT_TRUE(held.ok()) << held.status();
    const int64_t n = r->model->num_params();
    const uintptr_t base = reinterpret_cast<uintptr_t>(r->model->params());
    const uintptr_t first_page = base / page * page;
    const size_t span = base + n * sizeof(float) - first_page;
    std::vector<unsigned char> in((span + page - 1) / page);
    ASSERT_EQ(mincore(reinterpret_cast<void*>(first_page), span, in.data()), 0);
    int64_t outside = 0, stray = 0, at = 0;
    auto count_gap = [&](int64_t b, int64_t e) {  // whole pages of floats [b, e)
      const uintptr_t pb = (base + b * sizeof(float) + page - 1) / page * page;
      const uintptr_t pe = (base + e * sizeof(float)) / page * page;
      for (uintptr_t p = pb; p < pe; p += page) {
        ++outside;
        stray += in[(p - first_page) / page] & 1;
      }
    };
    for (const auto& [b, e] : *held) count_gap(at, b), at = e;
    count_gap(at, n);
    EXPECT_GT(outside, 0) << "rank " << r->rank->rank() << " keeps the whole model";
    EXPECT_EQ(stray, 0) << "rank " << r->rank->rank() << ": " << stray << " of " << outside
                        << " pages outside its ranges are resident";
  }
}

TEST_P(ElasticPipelineTest, ACheckpointOfDataParallelismRestoresIntoAGridAndMatches) {
  std::vector<float> want, want_m;
  Reference(4, &want, &want_m);
  std::unique_ptr<CheckpointStore> store = CheckpointOfTwoRanksAtStep2();
  ASSERT_NE(store, nullptr);
  std::vector<Rank> ranks(4);  // dp 2 x pp 2: each reads only the ranges it keeps
  for (auto& r : ranks) r = NewRank();
  Configure(Ptrs(ranks),
            {.stages = 2,
             .committed_steps = 2,
             .source = RestoreSource::kCheckpoint,
             .gone = {},
             .checkpoint_step = 2},
            5, store.get());
  Steps(Ptrs(ranks), 4);
  ExpectBitIdentical(Ptrs(ranks), want);
}

TEST_P(ElasticPipelineTest, EveryMicrobatchServedOncePerCommittedStepByTheFirstStage) {
  std::vector<Rank> ranks = Grid(4, 2, PipelineSchedule::kOneFOneB, 0);
  Steps(Ptrs(ranks), 2);
  ExpectEveryMicrobatchServedOnce(2);
}

TEST_P(ElasticPipelineTest, BadGridsAreRefusedNamingTheProblem) {
  std::vector<Rank> ranks(3);
  for (auto& r : ranks) r = NewRank();
  std::vector<std::unique_ptr<Communicator>> comms;
  groups_.push_back(InProcessGroup::Create(3, 0, &comms));
  GenerationPlan plan{.world = 3, .rank = 0, .stages = 2, .gone = {}};
  absl::Status s = ranks[0].rank->Configure(comms[0].get(), plan, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("divisor of the world size 3, got 2"), absl::string_view::npos) << s;
  std::vector<std::unique_ptr<Communicator>> comms8;
  groups_.push_back(InProcessGroup::Create(8, 1, &comms8));
  std::vector<Rank> eight(1);
  eight[0] = NewRank();
  s = eight[0].rank->Configure(comms8[0].get(), {.world = 8, .rank = 0, .stages = 8, .gone = {}},
                               nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 1 to 4"), absl::string_view::npos) << s;
  for (auto& c : comms) c->Abort(absl::CancelledError("test over"));
  for (auto& c : comms8) c->Abort(absl::CancelledError("test over"));
}

#ifdef TROUPE_ELASTIC_TEST_SIMT
using ElasticBf16Test = ElasticTest;

// bf16 on the device, fp32 master weights: every microbatch's gradient is bf16, widened exactly
// to fp32, and summed in the canonical order, so any world size reaches the same bits; they are
// the GPU model's own bits (the bf16 roundings moved them off the fp32 reference, a little).
TEST_P(ElasticBf16Test, ABf16StepIsBitIdenticalAcrossWorldSizes) {
  // Short microbatches: the SIMT layer runs every CUDA thread as a fiber (~0.5 s a microbatch).
  spec_.seq_len = 8;
  spec_.microbatch_size = 1;
  std::vector<float> fp32, fp32_m;
  Reference(2, &fp32, &fp32_m);
  std::vector<float> want;
  for (int w : {1, 3}) {
    SCOPED_TRACE("world " + std::to_string(w));
    std::vector<Rank> ranks(w);
    std::vector<Rank*> ptrs;
    for (auto& r : ranks) r = NewRank(), ptrs.push_back(&r);
    Configure(ptrs, {.source = RestoreSource::kInit, .gone = {}}, 0);
    Steps(ptrs, 2);
    if (want.empty()) {
      want = Params(ptrs)[0];
      continue;
    }
    ExpectBitIdentical(ptrs, want);
  }
  ASSERT_EQ(want.size(), fp32.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(want[i]) - fp32[i]) * (double(want[i]) - fp32[i]);
    norm += double(fp32[i]) * fp32[i];
  }
  const double rel = std::sqrt(diff / norm);
  std::printf("bf16 vs the fp32 reference after 2 steps: %.3g relative\n", rel);
  EXPECT_GT(rel, 0) << "bf16 training gave the fp32 bits: the bf16 path did not run";
  EXPECT_LT(rel, 1e-2);
}

// The device model reports its gradient range by range during the backward pass (so the
// overlapped exchange starts before the pass ends on a GPU too): every parameter once, each range
// of grads() final when reported, and the same gradient as the unreported pass.
TEST_P(ElasticBf16Test, TheDeviceModelReportsItsGradientDuringTheBackwardPass) {
  spec_.seq_len = 8;
  spec_.microbatch_size = 1;
  absl::StatusOr<std::unique_ptr<Trainable>> t = SimtBf16Trainable(spec_);
  ASSERT_TRUE(t.ok()) << t.status();
  Trainable& model = **t;
  model.InitParams(3);
  const int64_t n = model.num_params();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::vector<float>> at_report;
  absl::StatusOr<double> loss = model.ComputeGradientReporting(0, 0, [&](int64_t b, int64_t e) {
    ranges.emplace_back(b, e);
    at_report.emplace_back(model.grads() + b, model.grads() + e);  // host memory here
  });
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(ranges.size(), 2u + model::GptConfig::Tiny(300).num_layers)
      << "ln_f, blocks, embeddings";
  int64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    covered += ranges[i].second - ranges[i].first;
    EXPECT_TRUE(
        std::equal(at_report[i].begin(), at_report[i].end(), model.grads() + ranges[i].first))
        << "range " << i << " changed after its report";
  }
  EXPECT_EQ(covered, n);
  const std::vector<float> reported(model.grads(), model.grads() + n);
  absl::StatusOr<double> again = model.ComputeGradient(0, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *loss);
  EXPECT_TRUE(std::equal(reported.begin(), reported.end(), model.grads()))
      << "the reporting pass's gradient differs from the plain pass's";
}

INSTANTIATE_TEST_SUITE_P(Simt, ElasticBf16Test, ::testing::Values(Mode::kOpaqueBf16),
                         [](const ::testing::TestParamInfo<Mode>&) { return "OpaqueBf16"; });
#endif

// Host memory, and the opaque device (the stages reach every buffer only through ArrayOps and
// the communicator). NCCL is not among them: NCCL matches point-to-point messages by order, not
// tag, and a stage's sends to the last stage interleave activations and tied gradients.
INSTANTIATE_TEST_SUITE_P(Memory, ElasticPipelineTest,
                         ::testing::Values(Mode::kHost, Mode::kOpaqueDevice),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param == Mode::kHost ? "Host" : "OpaqueDevice";
                         });

INSTANTIATE_TEST_SUITE_P(Memory, ElasticTest,
                         ::testing::Values(Mode::kHost, Mode::kOpaqueDevice, Mode::kNccl),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           switch (info.param) {
                             case Mode::kHost:
                               return "Host";
                             case Mode::kOpaqueDevice:
                               return "OpaqueDevice";
                             case Mode::kNccl:
                               return "NcclOverAFake";
                             case Mode::kOpaqueBf16:
                               return "OpaqueBf16";
                           }
                           return "";
                         });

}  // namespace
}  // namespace troupe::train
