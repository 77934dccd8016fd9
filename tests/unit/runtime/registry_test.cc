// The registry and select(): every compiled-in implementation declares what it
// supports, select() picks by backend, capabilities and priority, and a name in
// TuningOptions forces one (or says why it cannot run the call).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "smla/context.h"
#include "smla/registry.h"
#include "tests/common/test_common.h"

namespace smla {
namespace {

using testing::FailsWith;
using testing::IsOk;

Context host_context(Backend backend, const TuningOptions& tuning = {}) {
  auto context = Context::create(backend, tuning);
  EXPECT_TRUE(IsOk(context.status()));
  return *context;
}

Problem v4_decode(std::int64_t heads = 64) {
  Problem problem;
  problem.op = Op::kSparseDecode;
  problem.format = KvFormat::kV4Fp8;
  problem.tokens = 8;
  problem.heads = heads;
  problem.d_qk = 512;
  problem.d_v = 512;
  problem.keys = 640;
  problem.features = kFeatureSink | kFeatureLse | kFeatureExtraCache;
  return problem;
}

TEST(Registry, EveryHostBackendServesBothAttentionOps) {
  std::set<std::pair<std::string, std::string>> rows;
  for (const Implementation& implementation : implementations()) {
    EXPECT_NE(op_name(implementation.op), "unknown");
    EXPECT_FALSE(implementation.summary.empty()) << implementation.name;
    const bool unique = rows.emplace(std::string(op_name(implementation.op)), std::string(implementation.name)).second;
    EXPECT_TRUE(unique) << "two rows named " << implementation.name << " for " << op_name(implementation.op);
  }
  for (const char* op : {"sparse_decode", "sparse_prefill"}) {
    EXPECT_TRUE(rows.count({op, "reference"})) << op;
    EXPECT_TRUE(rows.count({op, "cpu"})) << op;
  }
}

TEST(Registry, RowsAreOrderedByOpThenPriority) {
  const auto& table = implementations();
  for (std::size_t i = 1; i < table.size(); ++i) {
    const Implementation& a = table[i - 1];
    const Implementation& b = table[i];
    EXPECT_TRUE(a.op < b.op || (a.op == b.op && a.priority >= b.priority)) << a.name << " before " << b.name;
  }
}

TEST(Registry, SelectTakesTheContextsBackend) {
  for (Backend backend : {Backend::kReference, Backend::kCpu}) {
    auto chosen = select(host_context(backend), v4_decode());
    ASSERT_TRUE(IsOk(chosen.status()));
    EXPECT_EQ((*chosen)->backend, backend);
    EXPECT_EQ((*chosen)->name, backend_name(backend));
  }
}

TEST(Registry, NamedImplementationIsUsedOrExplained) {
  TuningOptions tuning;
  tuning.implementation = "reference";
  // The name exists for the op but on another backend: the call says why it cannot run.
  EXPECT_TRUE(FailsWith(select(host_context(Backend::kCpu, tuning), v4_decode()).status(),
                        StatusCode::kUnimplemented, {"reference", "backend 'reference'", "'cpu'"}));
  auto chosen = select(host_context(Backend::kReference, tuning), v4_decode());
  ASSERT_TRUE(IsOk(chosen.status()));
  EXPECT_EQ((*chosen)->name, "reference");
  // A name the op does not have (the layer ops' "cuda" rows) leaves the choice to select().
  tuning.implementation = "cuda";
  auto fallback = select(host_context(Backend::kCpu, tuning), v4_decode());
  ASSERT_TRUE(IsOk(fallback.status()));
  EXPECT_EQ((*fallback)->name, "cpu");
}

TEST(Registry, UnsupportedShapesNameTheCapability) {
  const Context cpu = host_context(Backend::kCpu);
  Problem problem = v4_decode();
  problem.d_v = 256;
  EXPECT_TRUE(FailsWith(select(cpu, problem).status(), StatusCode::kUnimplemented, {"sparse_decode", "cpu", "d_v 256"}));
  // The reference declares no limit on head dims: the reason is the backend only.
  const Implementation* reference = nullptr;
  for (const Implementation& implementation : implementations()) {
    if (implementation.op == Op::kSparseDecode && implementation.name == "reference") reference = &implementation;
  }
  ASSERT_NE(reference, nullptr);
  EXPECT_EQ(unsupported_reason(*reference, host_context(Backend::kReference), problem), "");
  EXPECT_NE(unsupported_reason(*reference, cpu, problem).find("backend"), std::string::npos);
}

TEST(Registry, CudaRowsDeclareTheirArchitectures) {
  for (const Implementation& implementation : implementations()) {
    if (implementation.backend != Backend::kCuda) continue;
    const Capabilities& caps = implementation.capabilities;
    EXPECT_GE(caps.min_compute_capability, 80) << implementation.name;
    if (caps.max_compute_capability != 0) {
      EXPECT_GE(caps.max_compute_capability, caps.min_compute_capability) << implementation.name;
    }
  }
}

}  // namespace
}  // namespace smla
