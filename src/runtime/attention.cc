// The attention ops' front end: validate once -> select -> plan -> run
// (smla/attention.h), and the host implementations' registry rows.
#include "smla/attention.h"

#include <fmt/format.h>

#include <utility>

#include "src/core/attention_validate.h"
#include "src/cpu/cpu_attention.h"
#include "src/reference/reference_ops.h"
#include "src/runtime/op_tables.h"
#include "src/runtime/registry_internal.h"

namespace smla {

struct AttentionPlan::State {
  const runtime::Entry* entry = nullptr;
  int device = -1;  // the planning context's device ordinal
  runtime::PlanState plan;
};

struct AttentionPlanAccess {
  static AttentionPlan make(const runtime::Entry& entry, const Context& context, const Problem& problem,
                            runtime::PlanState plan) {
    AttentionPlan made;
    made.implementation_ = &entry.info;
    made.problem_ = problem;
    made.state_ = std::make_shared<const AttentionPlan::State>(
        AttentionPlan::State{&entry, context.device().ordinal, std::move(plan)});
    return made;
  }
  static const AttentionPlan::State* state(const AttentionPlan& plan) { return plan.state_.get(); }
};

std::size_t AttentionPlan::workspace_bytes() const { return state_ ? state_->plan.workspace_bytes : 0; }

std::string AttentionPlan::describe() const {
  if (!state_) return "an empty plan";
  if (state_->plan.describe == nullptr) return std::string(implementation_->name);
  return fmt::format("{}: {}", implementation_->name, state_->plan.describe(state_->plan));
}

namespace {

using DecodeFunctions = runtime::PlannedFunctions<SparseDecodeArgs, detail::DecodeShape>;
using PrefillFunctions = runtime::PlannedFunctions<SparsePrefillArgs, detail::PrefillShape>;

Problem problem_of(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  Problem problem;
  problem.op = Op::kSparseDecode;
  problem.format = args.main_cache.format;
  problem.tokens = shape.num_tokens;
  problem.heads = shape.num_heads;
  problem.d_qk = shape.d_qk;
  problem.d_v = shape.d_v;
  problem.keys = shape.main_topk + (shape.has_extra ? shape.extra_topk : 0);
  problem.queries_per_request = args.queries_per_request;
  problem.features = (shape.has_sink ? kFeatureSink : 0u) | (shape.has_lse ? kFeatureLse : 0u) |
                     (shape.has_extra ? kFeatureExtraCache : 0u) |
                     (args.queries_per_request > 1 ? kFeaturePackedTokens : 0u);
  return problem;
}

Problem problem_of(const SparsePrefillArgs& /*args*/, const detail::PrefillShape& shape) {
  Problem problem;
  problem.op = Op::kSparsePrefill;
  problem.tokens = shape.num_queries;
  problem.heads = shape.num_heads;
  problem.d_qk = shape.d_qk;
  problem.d_v = shape.d_v;
  problem.keys = shape.topk;
  problem.features = (shape.has_sink ? kFeatureSink : 0u) | (shape.has_lse ? kFeatureLse : 0u) |
                     (shape.has_max_logits ? kFeatureMaxLogits : 0u);
  return problem;
}

Expected<detail::DecodeShape> validate(const SparseDecodeArgs& args, DeviceKind device) {
  auto shape = detail::validate_sparse_decode(args, device);
  if (!shape) return shape.status().with_context("sparse_decode: ");
  return shape;
}

Expected<detail::PrefillShape> validate(const SparsePrefillArgs& args, DeviceKind device) {
  auto shape = detail::validate_sparse_prefill(args, device);
  if (!shape) return shape.status().with_context("sparse_prefill: ");
  return shape;
}

bool same_shapes(const Problem& a, const Problem& b) {
  return a.op == b.op && a.format == b.format && a.tokens == b.tokens && a.heads == b.heads && a.d_qk == b.d_qk &&
         a.d_v == b.d_v && a.keys == b.keys && a.queries_per_request == b.queries_per_request &&
         a.features == b.features;
}

std::string problem_string(const Problem& p) {
  return fmt::format("{} tokens, {} heads, d_qk {}, d_v {}, {} keys, queries_per_request {}, features {:#x}", p.tokens,
                     p.heads, p.d_qk, p.d_v, p.keys, p.queries_per_request, p.features);
}

// The selected row and its plan for a validated call.
struct Selected {
  const runtime::Entry* entry = nullptr;
  runtime::PlanState plan;
};

template <class Functions>
Expected<Selected> select_and_plan(const Context& context, const Problem& problem) {
  auto entry = runtime::select_entry(context, problem);
  if (!entry) return entry.status();
  Selected selected{*entry, {}};
  const Functions& functions = runtime::functions_of<Functions>(**entry);
  if (functions.plan != nullptr) {
    auto planned = functions.plan(context, problem);
    if (!planned) return planned.status();
    selected.plan = std::move(*planned);
  }
  return selected;
}

template <class Functions>
Expected<AttentionPlan> plan_problem(const Context& context, const Problem& problem) {
  auto selected = select_and_plan<Functions>(context, problem);
  if (!selected) return selected.status();
  return AttentionPlanAccess::make(*selected->entry, context, problem, std::move(selected->plan));
}

// Scratch from the context, then the row's run.
template <class Functions, class Args, class Shape>
Status execute(const Context& context, const runtime::Entry& entry, const runtime::PlanState& plan, const Args& args,
               const Shape& shape) {
  return runtime::run_with_scratch(context, plan.workspace_bytes, [&](void* scratch) {
    return runtime::functions_of<Functions>(entry).run(context, plan, args, shape, scratch);
  });
}

// Runs a caller's plan on a validated call whose problem is `problem`.
template <class Functions, class Args, class Shape>
Status run_plan(const Context& context, const AttentionPlan& plan, const Args& args, const Shape& shape,
                const Problem& problem) {
  const AttentionPlan::State* state = AttentionPlanAccess::state(plan);
  if (state == nullptr) return invalid_argument("plan", "a plan from plan_sparse_*", "an empty plan");
  if (plan.implementation().backend != context.backend() || state->device != context.device().ordinal) {
    return invalid_argument("plan", fmt::format("a plan made for this context's backend '{}' and device {}",
                                                backend_name(context.backend()), context.device().ordinal),
                            fmt::format("a plan for backend '{}', device {}",
                                        backend_name(plan.implementation().backend), state->device));
  }
  if (!same_shapes(plan.problem(), problem)) {
    return invalid_argument("args", fmt::format("the shapes of the plan ({})", problem_string(plan.problem())),
                            problem_string(problem));
  }
  return execute<Functions>(context, *state->entry, state->plan, args, shape);
}

template <class Functions, class Args>
Expected<AttentionPlan> plan_call(const Context& context, const Args& args) {
  auto shape = validate(args, runtime::tensor_device(context));
  if (!shape) return shape.status();
  return plan_problem<Functions>(context, problem_of(args, *shape));
}

template <class Functions, class Args>
Status run_call(const Context& context, const AttentionPlan& plan, const Args& args) {
  auto shape = validate(args, runtime::tensor_device(context));
  if (!shape) return shape.status();
  return run_plan<Functions>(context, plan, args, *shape, problem_of(args, *shape));
}

template <class Functions, class Args>
Status plan_and_run(const Context& context, const Args& args) {
  auto shape = validate(args, runtime::tensor_device(context));
  if (!shape) return shape.status();
  // A plan made for this very call needs none of run_plan's checks.
  auto selected = select_and_plan<Functions>(context, problem_of(args, *shape));
  if (!selected) return selected.status();
  return execute<Functions>(context, *selected->entry, selected->plan, args, *shape);
}

template <class Functions, class Args>
Expected<std::size_t> workspace_size(const Context& context, const Args& args) {
  auto plan = plan_call<Functions>(context, args);
  if (!plan) return plan.status();
  return plan->workspace_bytes();
}

}  // namespace

Expected<AttentionPlan> plan_sparse_decode(const Context& context, const SparseDecodeArgs& args) {
  return plan_call<DecodeFunctions>(context, args);
}
Expected<AttentionPlan> plan_sparse_prefill(const Context& context, const SparsePrefillArgs& args) {
  return plan_call<PrefillFunctions>(context, args);
}
Status sparse_decode(const Context& context, const AttentionPlan& plan, const SparseDecodeArgs& args) {
  return run_call<DecodeFunctions>(context, plan, args);
}
Status sparse_prefill(const Context& context, const AttentionPlan& plan, const SparsePrefillArgs& args) {
  return run_call<PrefillFunctions>(context, plan, args);
}
Status sparse_decode(const Context& context, const SparseDecodeArgs& args) {
  return plan_and_run<DecodeFunctions>(context, args);
}
Status sparse_prefill(const Context& context, const SparsePrefillArgs& args) {
  return plan_and_run<PrefillFunctions>(context, args);
}
Expected<std::size_t> sparse_decode_workspace_size(const Context& context, const SparseDecodeArgs& args) {
  return workspace_size<DecodeFunctions>(context, args);
}
Expected<std::size_t> sparse_prefill_workspace_size(const Context& context, const SparsePrefillArgs& args) {
  return workspace_size<PrefillFunctions>(context, args);
}
Status sparse_decode(const SparseDecodeArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return sparse_decode(context, args); });
}
Status sparse_prefill(const SparsePrefillArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return sparse_prefill(context, args); });
}

namespace runtime {
namespace {

// The host implementations plan nothing: they take validated args and the shape.
template <class Args, class Shape, Status (*kRun)(const Args&, const Shape&)>
constexpr PlannedFunctions<Args, Shape> host_functions() {
  return {nullptr, [](const Context&, const PlanState&, const Args& args, const Shape& shape, void*) {
            return kRun(args, shape);
          }};
}

constexpr DecodeFunctions kReferenceDecode =
    host_functions<SparseDecodeArgs, detail::DecodeShape, &reference::sparse_decode>();
constexpr PrefillFunctions kReferencePrefill =
    host_functions<SparsePrefillArgs, detail::PrefillShape, &reference::sparse_prefill>();
constexpr DecodeFunctions kCpuDecode = host_functions<SparseDecodeArgs, detail::DecodeShape, &cpu::sparse_decode>();
constexpr PrefillFunctions kCpuPrefill =
    host_functions<SparsePrefillArgs, detail::PrefillShape, &cpu::sparse_prefill>();

Capabilities cpu_capabilities() {
  Capabilities caps;
  caps.d_qk = {512, 576};  // the formats' head dims; the kernel's rows hold up to 1024
  caps.d_v = {512};
  return caps;
}

}  // namespace

void add_attention_entries(std::vector<Entry>& rows) {
  rows.push_back({{Op::kSparseDecode, "reference", Backend::kReference, 0, {},
                   "float64 accumulation, plain loops: the oracle"},
                  nullptr, &kReferenceDecode});
  rows.push_back({{Op::kSparsePrefill, "reference", Backend::kReference, 0, {},
                   "float64 accumulation, plain loops: the oracle"},
                  nullptr, &kReferencePrefill});
  rows.push_back({{Op::kSparseDecode, "cpu", Backend::kCpu, 0, cpu_capabilities(),
                   "multithreaded Highway SIMD, f32 accumulation, FP8 rows decoded in registers"},
                  nullptr, &kCpuDecode});
  rows.push_back({{Op::kSparsePrefill, "cpu", Backend::kCpu, 0, cpu_capabilities(),
                   "multithreaded Highway SIMD over the flat bf16 workspace"},
                  nullptr, &kCpuPrefill});
}

}  // namespace runtime
}  // namespace smla
