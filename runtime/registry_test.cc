#include "troupe/runtime/registry.h"

#include <gtest/gtest.h>

#include "internal/test_support.h"

namespace troupe::runtime {
namespace {

TEST(RegistryTest, BindChecksArgumentTypesAndNamesThem) {
  ActorRegistry r;
  ASSERT_TRUE((r.Register<int32_t, std::string>("greeter", [](Actor*, int32_t, std::string) {
                return caf::behavior{};
              })).ok());
  EXPECT_TRUE(r.Bind("greeter", caf::make_message(int32_t{1}, std::string("hi"))).ok());

  auto bad = r.Bind("greeter", caf::make_message(std::string("hi")));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "actor type 'greeter' expects arguments (int32, string), got (string)");

  auto unknown = r.Bind("greeterz", caf::make_message());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(),
            "unknown actor type 'greeterz'; registered types: [greeter]");

  auto dup = r.Register<>("greeter", [](Actor*) { return caf::behavior{}; });
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Types(), std::vector<std::string>{"greeter"});
}

class RuntimeSpawnTest : public testing::DeterministicRuntime {};

TEST_F(RuntimeSpawnTest, SpawnByNameAndLookup) {
  auto a = rt_->SpawnNamed("alpha", "worker", caf::make_message(int32_t{7}));
  ASSERT_TRUE(a.ok()) << a.status();
  Run();
  auto found = rt_->Lookup("alpha");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->handle, a->handle);
  EXPECT_EQ(rt_->SpawnNamed("alpha", "worker", caf::make_message(int32_t{7})).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(rt_->Send(*found, testing::ping_atom::value).ok());
  Run();
  EXPECT_EQ(testing::Received().Take(), std::vector<std::string>{"alpha:g1:ping"});
  ASSERT_TRUE(rt_->faults().KillActor("alpha").ok());
  Run();
  EXPECT_EQ(rt_->Lookup("alpha").status().code(), absl::StatusCode::kNotFound)
      << "a dead actor leaves the directory";
  EXPECT_EQ(rt_->faults().KillActor("alpha").code(), absl::StatusCode::kNotFound);
}

TEST_F(RuntimeSpawnTest, BadSpawnsReturnStatusNotCrash) {
  auto s = rt_->Spawn("worker", caf::make_message(1.5));
  EXPECT_EQ(s.status().message(), "actor type 'worker' expects arguments (int32), got (double)");
  EXPECT_EQ(rt_->Spawn("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rt_->SpawnNamed("", "worker").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt_->Lookup("ghost").status().message(), "no actor named 'ghost'");
}

TEST(RuntimeOptionsTest, InvalidOptionValueIsRejectedWithItsName) {
  RuntimeOptions o;
  o.threads = 0;
  auto rt = Runtime::Create(ActorRegistry{}, o);
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rt.status().message().find("option 'threads'"), std::string::npos) << rt.status();
  EXPECT_NE(rt.status().message().find("expected a value in [1, 1024]"), std::string::npos);

  o = RuntimeOptions{};
  o.scheduler = "fifo";
  rt = Runtime::Create(ActorRegistry{}, o);
  EXPECT_NE(rt.status().message().find("expected one of stealing, sharing, testing"),
            std::string::npos)
      << rt.status();

  const char* argv[] = {"prog", "--threads=abc"};
  rt = Runtime::FromArgs(ActorRegistry{}, 2, argv);
  EXPECT_NE(rt.status().message().find("option 'threads' (int, from flag --threads)"),
            std::string::npos)
      << rt.status();
}

}  // namespace
}  // namespace troupe::runtime
