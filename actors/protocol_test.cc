// Every training message crosses a process: it must be registered and serialise exactly.
#include "protocol.h"

#include <gtest/gtest.h>

#include "caf/all.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

namespace troupe::actors {
namespace {

class ProtocolTest : public ::testing::Test {
 protected:
  ProtocolTest() : system_(Config()) {}
  static caf::actor_system_config& Config() {
    static caf::actor_system_config cfg;
    static bool once = [] {
      runtime::ActorRegistry registry;
      AddTrainingMessageTypes(registry);
      registry.ApplyMessageTypes(cfg);
      return true;
    }();
    (void)once;
    return cfg;
  }

  // Serialises `x` inside a message and reads it back; both renderings must be equal and name
  // the type.
  template <class T>
  void RoundTrip(T x, const std::string& type_name) {
    caf::message m = caf::make_message(std::move(x));
    std::vector<char> buf;
    caf::binary_serializer sink{system_, buf};
    ASSERT_FALSE(sink(m)) << type_name << ": cannot serialise (not registered?)";
    caf::message back;
    caf::binary_deserializer source{system_, buf};
    ASSERT_FALSE(source(back)) << type_name;
    EXPECT_EQ(caf::to_string(back), caf::to_string(m));
    EXPECT_NE(caf::to_string(back).find(type_name), std::string::npos) << caf::to_string(back);
    ++count_;
  }

  caf::actor_system system_;
  int count_ = 0;
};

TEST_F(ProtocolTest, EveryMessageRoundTrips) {
  train::GenerationPlan plan;
  plan.world = 3;
  plan.rank = 2;
  plan.buddy = 2;
  plan.committed_steps = 41;
  plan.source = train::RestoreSource::kMemory;
  plan.old_world = 4;
  plan.gone = {1};
  plan.old_buddy = 3;
  plan.checkpoint_step = 40;
  const WireStatus err = WireStatus::From(absl::UnavailableError("peer 2 gone"));
  const train::ShardFileInfo info{"shard-00002.bin", 131072, 196608, 786432, 0xdeadbeef};
  JobReport report;
  report.committed_steps = 60;
  report.losses = {3.25, 3.0000001};
  report.final_params_crc32c = 0x12345678;
  report.num_params = 262144;
  report.generations = 3;
  report.overlap = 0.625;
  report.update_seconds = 0.375;
  report.delta_share = 0.75;
  report.final_world = 4;
  report.recovery_seconds = 0.125;
  report.steps_lost = 1;
  report.tokens_per_second = 1539.5;

  RoundTrip(ConfigureRank{7, plan, {}}, "troupe.ConfigureRank");
  RoundTrip(RankConfigured{7, "n1/w0", err}, "troupe.RankConfigured");
  RoundTrip(KvKeys{{"job/g7/ucx/0", "job/g7/ucx/1"}}, "troupe.KvKeys");
  RoundTrip(KvValues{{"host\naddr", ""}, {1}}, "troupe.KvValues");
  RoundTrip(RunStep{7, 41}, "troupe.RunStep");
  StepDone done{7, 41, "n1/w0", WireStatus{}, {4, 5}, {3.141592653589793, 2.5e-9}, 0.75};
  done.exchange_seconds = 0.125;
  done.exposed_seconds = 0.03125;
  done.update_seconds = 0.0625;
  done.param_delta = true;
  RoundTrip(done, "troupe.StepDone");
  RoundTrip(CommitRank{7, 40}, "troupe.CommitRank");
  RoundTrip(AbortBelow{8}, "troupe.AbortBelow");
  RoundTrip(RankEpoch{8, 1795710704042661}, "troupe.RankEpoch");
  RoundTrip(ArmKill{41, 9, 2, 1}, "troupe.ArmKill");
  RoundTrip(AskFinal{7}, "troupe.AskFinal");
  RoundTrip(ShardWritten{7, 40, 2, info, err}, "troupe.ShardWritten");
  RoundTrip(FinalParams{7, 0x12345678, 262144, 60}, "troupe.FinalParams");
  RoundTrip(CoordinatorHello{}, "troupe.CoordinatorHello");
  RoundTrip(KnownRanks{4, {}}, "troupe.KnownRanks");
  RoundTrip(RankJoined{"n1/w0", "n1", "zone:a", "t.99.rank.n1.w0"}, "troupe.RankJoined");
  RoundTrip(ProgressLine{"step    1/60"}, "troupe.ProgressLine");
  RoundTrip(AddNode{"join20"}, "troupe.AddNode");
  RoundTrip(JobFailed{err}, "troupe.JobFailed");
  RoundTrip(report, "troupe.JobReport");
  EXPECT_EQ(count_, 20) << "one of each message in protocol.h";
}

TEST_F(ProtocolTest, LossesTravelAsExactDoubles) {
  StepDone d{1, 2, "w", WireStatus{}, {0}, {0.1 + 0.2}, 0};
  caf::message m = caf::make_message(d);
  std::vector<char> buf;
  caf::binary_serializer sink{system_, buf};
  ASSERT_FALSE(sink(m));
  caf::message back;
  caf::binary_deserializer source{system_, buf};
  ASSERT_FALSE(source(back));
  EXPECT_EQ(back.get_as<StepDone>(0).losses[0], 0.1 + 0.2) << "bit for bit, not 6 digits";
}

TEST_F(ProtocolTest, StatusKeepsItsCode) {
  const absl::Status s = absl::ResourceExhaustedError("disk full: ckpt/step-60");
  EXPECT_EQ(WireStatus::From(s).ToStatus(), s);
  EXPECT_TRUE(WireStatus::From(absl::OkStatus()).ToStatus().ok());
}

}  // namespace
}  // namespace troupe::actors
