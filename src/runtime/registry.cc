#include "smla/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "src/runtime/registry_internal.h"

namespace smla {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kSparseDecode: return "sparse_decode";
    case Op::kSparsePrefill: return "sparse_prefill";
    case Op::kApplyRope: return "apply_rope";
    case Op::kPrepareQuery: return "prepare_query";
    case Op::kPrepareKv: return "prepare_kv";
    case Op::kRunCompressor: return "run_compressor";
    case Op::kPrepareIndexerQuery: return "prepare_indexer_query";
    case Op::kIndexerTopk: return "indexer_topk";
    case Op::kProjectOutput: return "project_output";
    case Op::kStepMetadata: return "step_metadata";
  }
  return "unknown";
}

namespace runtime {

const std::vector<Entry>& entries() {
  static const std::vector<Entry> rows = [] {
    std::vector<Entry> all;
    add_attention_entries(all);
    add_layer_entries(all);
    add_metadata_entries(all);
#if defined(SMLA_HAS_CUDA)
    add_cuda_attention_entries(all);
    add_cuda_layer_entries(all);
    add_cuda_metadata_entries(all);
#endif
    std::stable_sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
      if (a.info.op != b.info.op) return a.info.op < b.info.op;
      return a.info.priority > b.info.priority;
    });
    return all;
  }();
  return rows;
}

Expected<const Entry*> select_entry(const Context& context, const Problem& problem) {
  const std::string& forced = context.tuning().implementation;
  for (const Entry& entry : entries()) {
    if (forced.empty() || entry.info.op != problem.op || entry.info.name != forced) continue;
    const std::string reason = unsupported_reason(entry.info, context, problem);
    if (!reason.empty()) {
      return unimplemented(fmt::format("{} '{}' (named by TuningOptions::implementation) cannot run this call: {}",
                                       op_name(problem.op), forced, reason));
    }
    return &entry;
  }
  std::string reasons;
  const Entry* fitting = nullptr;  // the highest priority fit, preferred or not
  for (const Entry& entry : entries()) {
    // Rows of other backends never run here: skip them before any reason is formatted.
    if (entry.info.op != problem.op || entry.info.backend != context.backend()) continue;
    const std::string reason = unsupported_reason(entry.info, context, problem);
    if (!reason.empty()) {
      reasons += fmt::format("; {}: {}", entry.info.name, reason);
      continue;
    }
    if (fitting == nullptr) fitting = &entry;
    if (entry.prefers == nullptr || entry.prefers(context, problem)) return &entry;
  }
  if (fitting != nullptr) return fitting;
  return unimplemented(fmt::format("{} has no implementation on backend '{}' for this call{}", op_name(problem.op),
                                   backend_name(context.backend()), reasons));
}

namespace {

Expected<DeviceProperties> host_device() {
  DeviceProperties host;
  host.name = "host";
  return host;
}

Expected<void*> host_allocate(std::size_t bytes) {
  void* data = ::operator new(bytes, std::align_val_t{256}, std::nothrow);
  if (data == nullptr) return internal_error(fmt::format("host workspace allocation of {} bytes failed", bytes));
  return data;
}

void host_release(void* data) { ::operator delete(data, std::align_val_t{256}); }

}  // namespace

const BackendRuntime& host_runtime() {
  static const BackendRuntime hooks{&host_device, &host_allocate, &host_release};
  return hooks;
}

const BackendRuntime* backend_runtime(Backend backend) {
  switch (backend) {
    case Backend::kReference:
    case Backend::kCpu: return &host_runtime();
    case Backend::kCuda:
#if defined(SMLA_HAS_CUDA)
      return cuda_runtime();
#else
      return nullptr;
#endif
    case Backend::kAuto: return backend_runtime(resolve_backend(backend));
  }
  return nullptr;
}

}  // namespace runtime

namespace {

std::string feature_names(unsigned features) {
  static constexpr std::pair<Feature, std::string_view> kNames[] = {
      {kFeatureSink, "sink"},
      {kFeatureLse, "lse"},
      {kFeatureMaxLogits, "max_logits"},
      {kFeatureExtraCache, "extra cache"},
      {kFeaturePackedTokens, "queries_per_request > 1"}};
  std::string names;
  for (const auto& [bit, name] : kNames) {
    if ((features & bit) == 0) continue;
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

template <class T>
bool listed(const std::vector<T>& allowed, T value) {
  return allowed.empty() || std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

}  // namespace

const std::vector<Implementation>& implementations() {
  static const std::vector<Implementation> table = [] {
    std::vector<Implementation> rows;
    for (const runtime::Entry& entry : runtime::entries()) rows.push_back(entry.info);
    return rows;
  }();
  return table;
}

std::string unsupported_reason(const Implementation& implementation, const Context& context, const Problem& problem) {
  const Capabilities& caps = implementation.capabilities;
  if (implementation.op != problem.op) return fmt::format("implements {}", op_name(implementation.op));
  if (implementation.backend != context.backend()) {
    return fmt::format("runs on backend '{}', the context's is '{}'", backend_name(implementation.backend),
                       backend_name(context.backend()));
  }
  const int sm = context.device().compute_capability;
  if (caps.min_compute_capability > 0 && sm < caps.min_compute_capability) {
    return fmt::format("needs sm_{} or newer, the device is sm_{}", caps.min_compute_capability, sm);
  }
  if (caps.max_compute_capability > 0 && sm > caps.max_compute_capability) {
    return fmt::format("runs on sm_{} at the newest, the device is sm_{}", caps.max_compute_capability, sm);
  }
  if (problem.format.has_value() && !listed(caps.formats, *problem.format)) {
    return fmt::format("does not read the {} format", kv_format_name(*problem.format));
  }
  if (problem.d_qk != 0 && !listed(caps.d_qk, problem.d_qk)) {
    return fmt::format("does not support d_qk {}", problem.d_qk);
  }
  if (problem.d_v != 0 && !listed(caps.d_v, problem.d_v)) {
    return fmt::format("does not support d_v {}", problem.d_v);
  }
  if (caps.max_heads > 0 && problem.heads > caps.max_heads) {
    return fmt::format("serves at most {} heads, the call has {}", caps.max_heads, problem.heads);
  }
  if (const unsigned missing = problem.features & ~caps.features; missing != 0) {
    return fmt::format("does not support {}", feature_names(missing));
  }
  return "";
}

Expected<const Implementation*> select(const Context& context, const Problem& problem) {
  auto entry = runtime::select_entry(context, problem);
  if (!entry) return entry.status();
  return &(*entry)->info;
}

}  // namespace smla
