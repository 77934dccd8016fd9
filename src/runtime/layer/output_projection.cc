// Entry of the grouped output projection (spec 1.11) and the weight conversion.
#include <fmt/format.h>

#include "smla/layer.h"
#include "smla/numeric.h"
#include "src/core/argument_checks.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla {

using namespace layer_detail;

constexpr std::int64_t kHeadDim = V4Fp8Format::kHeadDim;

Expected<OutputShape> layer_detail::validate_output_projection(const OutputProjectionArgs& args, DeviceKind device) {
  const bool host = device == DeviceKind::kCpu;
  if (args.rope == nullptr) return invalid_argument("rope", "a RopeTable", "nullptr");
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.o, "o", {DType::kBF16, DType::kF32}, {kAnyExtent, kAnyExtent, kHeadDim}, device));
  OutputShape shape;
  shape.tokens = args.o.shape[0];
  shape.heads = args.num_heads == 0 ? args.o.shape[1] : args.num_heads;
  if (shape.heads < 1 || shape.heads > args.o.shape[1]) {
    return invalid_argument("num_heads", fmt::format("a value in [1, {}] (heads of o) or 0", args.o.shape[1]),
                            std::to_string(args.num_heads));
  }
  SMLA_RETURN_IF_ERROR(check_index_vector(args.positions, "positions", shape.tokens, device));
  // The host GEMMs take f32 weights; the device ones f32 or bf16 (tensor cores).
  SMLA_RETURN_IF_ERROR(
      host
          ? check_tensor(args.wo_a, "wo_a", {DType::kF32}, {kAnyExtent, kAnyExtent, kAnyExtent}, device)
          : check_tensor(args.wo_a, "wo_a", {DType::kF32, DType::kBF16}, {kAnyExtent, kAnyExtent, kAnyExtent}, device));
  shape.groups = args.wo_a.shape[0];
  shape.rank = args.wo_a.shape[1];
  if (shape.groups < 1 || shape.heads % shape.groups != 0) {
    return invalid_argument("wo_a", fmt::format("a group count dividing the {} heads", shape.heads),
                            args.wo_a.shape_string());
  }
  const std::int64_t group_width = shape.heads / shape.groups * kHeadDim;
  if (args.wo_a.shape[2] != group_width || shape.rank < 1 || !args.wo_a.is_contiguous()) {
    return invalid_argument("wo_a", fmt::format("contiguous [{}, rank, {}]", shape.groups, group_width),
                            args.wo_a.describe());
  }
  SMLA_RETURN_IF_ERROR(
      check_tensor(args.wo_b, "wo_b", {args.wo_a.dtype}, {kAnyExtent, shape.groups * shape.rank}, device));
  if (!args.wo_b.is_contiguous()) return invalid_argument("wo_b", "a contiguous tensor", args.wo_b.describe());
  shape.hidden = args.wo_b.shape[0];
  SMLA_RETURN_IF_ERROR(check_tensor(args.out, "out", {DType::kF32}, {shape.tokens, shape.hidden}, device));
  if (host) SMLA_RETURN_IF_ERROR(check_positions(args.positions, "positions", args.rope->max_positions()));
  return shape;
}

Problem layer_detail::layer_problem(const OutputProjectionArgs&, const OutputShape& shape) {
  return make_problem(Op::kProjectOutput, shape.tokens, shape.heads, 0, static_cast<int>(kHeadDim));
}

Status project_output(const Context& context, const OutputProjectionArgs& args) {
  return layer_entry(context, "project_output", args, &validate_output_projection);
}

Expected<std::size_t> project_output_workspace_size(const Context& context, const OutputProjectionArgs& args) {
  return layer_entry_workspace_size(context, "project_output", args, &validate_output_projection);
}

Status project_output(const OutputProjectionArgs& args, Backend backend) {
  return runtime::with_default_context(backend, [&](const Context& context) { return project_output(context, args); });
}

Status convert_bf16_to_f32(const TensorView& src, const TensorView& dst) {
  auto fail = [](const Status& s) { return s.with_context("convert_bf16_to_f32: "); };
  if (!src.present() || src.dtype != DType::kBF16 || !src.is_contiguous() || src.device.kind != DeviceKind::kCpu) {
    return fail(invalid_argument("src", "a contiguous cpu bf16 tensor", src.present() ? src.describe() : "absent"));
  }
  if (!dst.present() || dst.dtype != DType::kF32 || !dst.is_contiguous() || dst.device.kind != DeviceKind::kCpu ||
      dst.shape_string() != src.shape_string()) {
    return fail(invalid_argument("dst", fmt::format("a contiguous cpu f32 tensor {}", src.shape_string()),
                                 dst.present() ? dst.describe() : "absent"));
  }
  if (src.numel() > 0 && (src.data == nullptr || dst.data == nullptr)) {
    return fail(invalid_argument("src/dst", "non-null data", "nullptr"));
  }
  const auto* in = src.ptr<const std::uint16_t>();
  float* out = dst.ptr<float>();
  for (std::int64_t i = 0; i < src.numel(); ++i) out[i] = bf16_to_f32(in[i]);
  return Status::Ok();
}

}  // namespace smla
