// Entries of the query and KV preparation ops (spec 1.4, 1.5).
#include <fmt/format.h>

#include <cmath>

#include "smla/layer.h"
#include "src/core/argument_checks.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {

using namespace layer_detail;

namespace {

constexpr std::int64_t kHeadDim = V4Fp8Format::kHeadDim;

}  // namespace

Expected<QueryShape> layer_detail::validate_query(const QueryPrepArgs& args, DeviceKind device) {
  if (args.rope == nullptr) return invalid_argument("rope", "a RopeTable", "nullptr");
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.q, "q", {DType::kF32, DType::kBF16}, {kAnyExtent, kAnyExtent, kHeadDim}, device));
  QueryShape shape{args.q.shape[0], args.q.shape[1], 0};
  SMLA_RETURN_IF_ERROR(check_tensor(args.out, "out", {DType::kBF16}, {shape.tokens, kAnyExtent, kHeadDim}, device));
  shape.padded_heads = args.out.shape[1];
  if (shape.padded_heads < shape.heads) {
    return invalid_argument("out", fmt::format("at least {} heads (the heads of q)", shape.heads),
                            args.out.shape_string());
  }
  if (!(args.eps > 0.0f && std::isfinite(args.eps))) {
    return invalid_argument("eps", "a finite value > 0", fmt::format("{}", args.eps));
  }
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  if (device == DeviceKind::kCpu) {
    SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.rope->max_positions()));
  }
  return shape;
}

Expected<KvShape> layer_detail::validate_kv(const KvPrepArgs& args, DeviceKind device) {
  if (args.rope == nullptr) return invalid_argument("rope", "a RopeTable", "nullptr");
  SMLA_RETURN_IF_ERROR(check_tensor(args.kv, "kv", {DType::kF32, DType::kBF16}, {kAnyExtent, kHeadDim}, device));
  KvShape shape{args.kv.shape[0], 0};
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  const bool host = device == DeviceKind::kCpu;
  if (host) SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.rope->max_positions()));
  if (!args.slot_mapping.present() || args.slot_mapping.rank != 1 || args.slot_mapping.shape[0] > shape.tokens) {
    return invalid_argument("slot_mapping", fmt::format("an i32/i64 vector of at most {} slots", shape.tokens),
                            args.slot_mapping.present() ? args.slot_mapping.shape_string() : "absent");
  }
  shape.inserted = args.slot_mapping.shape[0];
  SMLA_RETURN_IF_ERROR(check_index_vector(args.slot_mapping, "slot_mapping", shape.inserted, device));
  SMLA_RETURN_IF_ERROR(validate_row_cache_512(args.cache, "cache", device));
  if (host) SMLA_RETURN_IF_ERROR(check_slots(args.slot_mapping, "slot_mapping", args.cache.num_slots()));
  if (args.rotated.present()) {
    SMLA_RETURN_IF_ERROR(check_tensor(args.rotated, "rotated", {DType::kBF16}, {shape.tokens, kHeadDim}, device));
  }
  return shape;
}

Problem layer_detail::layer_problem(const QueryPrepArgs&, const QueryShape& shape) {
  return make_problem(Op::kPrepareQuery, shape.tokens, shape.padded_heads, static_cast<int>(kHeadDim));
}

Problem layer_detail::layer_problem(const KvPrepArgs& args, const KvShape& shape) {
  Problem problem = make_problem(Op::kPrepareKv, shape.tokens, 1, static_cast<int>(kHeadDim));
  problem.format = args.cache.format;
  return problem;
}

Status prepare_query(const Context& context, const QueryPrepArgs& args) {
  return layer_entry(context, "prepare_query", args, &validate_query);
}

Status prepare_query(const QueryPrepArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return prepare_query(context, args); });
}

Status prepare_kv(const Context& context, const KvPrepArgs& args) {
  return layer_entry(context, "prepare_kv", args, &validate_kv);
}

Status prepare_kv(const KvPrepArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return prepare_kv(context, args); });
}

}  // namespace smla
