#include "smla/context.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "src/runtime/registry_internal.h"

namespace smla {

struct Context::OwnedWorkspace {
  const runtime::BackendRuntime* runtime = nullptr;
  std::mutex mutex;
  void* data = nullptr;
  std::size_t bytes = 0;

  ~OwnedWorkspace() {
    if (data != nullptr) runtime->release(data);
  }
};

namespace {

Status bad_variable(std::string_view name, std::string_view expected, std::string_view value) {
  return invalid_argument(fmt::format("environment variable {}", name), expected, fmt::format("'{}'", value));
}

// name=on|off (or the single `off_word` / `on_word` a variable documents) into a Switch.
Expected<TuningOptions::Switch> read_switch(const char* name, TuningOptions::Switch fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string_view text(value);
  if (text == "on") return TuningOptions::Switch::kOn;
  if (text == "off") return TuningOptions::Switch::kOff;
  if (text == "auto") return TuningOptions::Switch::kAuto;
  return bad_variable(name, "on, off or auto", text);
}

// "12" -> 12; anything but a positive decimal int (signs, spaces, overflow) -> nullopt.
std::optional<int> positive_int(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value <= 0) return std::nullopt;
  return value;
}

// The current device of a compiled-in backend, or why the backend cannot run here.
Expected<DeviceProperties> usable_device(Backend resolved) {
  const runtime::BackendRuntime* hooks = runtime::backend_runtime(resolved);
  if (hooks == nullptr) {
    return unimplemented(fmt::format("backend '{}' is not compiled into this build", backend_name(resolved)));
  }
  auto device = hooks->current_device();
  if (!device) return device.status().with_context(fmt::format("backend '{}': ", backend_name(resolved)));
  return device;
}

}  // namespace

Expected<TuningOptions> TuningOptions::from_environment() {
  TuningOptions options;
  if (const char* name = std::getenv("SMLA_IMPLEMENTATION")) options.implementation = name;
  if (const char* rows = std::getenv("SMLA_CUDA_PACK_MAX_ROWS"); rows != nullptr && *rows != '\0') {
    const std::string_view text(rows);
    if (text != "0" && text != "16" && text != "32" && text != "64") {
      return bad_variable("SMLA_CUDA_PACK_MAX_ROWS", "0, 16, 32 or 64", text);
    }
    options.pack_max_rows = std::atoi(rows);
  }
  auto prefetch = read_switch("SMLA_SM90_PREFETCH", Switch::kAuto);
  if (!prefetch) return prefetch.status();
  options.sm90_prefetch = *prefetch;
  auto pair = read_switch("SMLA_SM90_PAIR", Switch::kOn);
  if (!pair) return pair.status();
  options.sm90_pair_head_blocks = *pair != Switch::kOff;
  auto length_order = read_switch("SMLA_SM90_LENGTH_ORDER", Switch::kAuto);
  if (!length_order) return length_order.status();
  options.sm90_length_order = *length_order;
  auto tensor_stores = read_switch("SMLA_SM90_TENSOR_STORES", Switch::kAuto);
  if (!tensor_stores) return tensor_stores.status();
  options.sm90_tensor_stores = *tensor_stores;
  auto fold = read_switch("SMLA_SM90_FOLD_SPLITS", Switch::kAuto);
  if (!fold) return fold.status();
  options.sm90_fold_splits = *fold;
  auto stage = read_switch("SMLA_SM90_STAGE", Switch::kAuto);
  if (!stage) return stage.status();
  options.sm90_stage_rows = *stage;
  if (const char* rows = std::getenv("SMLA_SM90_STAGING_ROWS"); rows != nullptr && *rows != '\0') {
    auto count = positive_int(rows);
    if (!count) return bad_variable("SMLA_SM90_STAGING_ROWS", "a positive integer (rows of the staging buffer)", rows);
    options.sm90_staging_rows = *count;
  }
  if (const char* ctas = std::getenv("SMLA_SM90_PERSISTENT_CTAS"); ctas != nullptr && *ctas != '\0') {
    auto count = std::string_view(ctas) == "0" ? std::optional<int>(0) : positive_int(ctas);
    if (!count) return bad_variable("SMLA_SM90_PERSISTENT_CTAS", "0 or a positive integer (CTAs at most)", ctas);
    options.sm90_persistent_ctas = *count;
  }
  if (const char* rows = std::getenv("SMLA_SM90_HEAD_ROWS"); rows != nullptr && *rows != '\0') {
    const std::string_view text(rows);
    if (text != "16" && text != "32" && text != "64") return bad_variable("SMLA_SM90_HEAD_ROWS", "16, 32 or 64", text);
    options.sm90_head_block_rows = std::atoi(rows);
  }
  if (const char* rows = std::getenv("SMLA_SM90_OUTPUT_BOX_ROWS"); rows != nullptr && *rows != '\0') {
    const std::string_view text(rows);
    if (text != "16" && text != "64") return bad_variable("SMLA_SM90_OUTPUT_BOX_ROWS", "16 or 64", text);
    options.sm90_output_box_rows = std::atoi(rows);
  }
  if (const char* order = std::getenv("SMLA_SM90_BLOCK_ORDER"); order != nullptr && *order != '\0') {
    const std::string_view text(order);
    if (text != "grid" && text != "token") return bad_variable("SMLA_SM90_BLOCK_ORDER", "grid or token", text);
    options.sm90_token_major = text == "token";
  }
  if (const char* threads = std::getenv("SMLA_NUM_THREADS"); threads != nullptr && *threads != '\0') {
    auto count = positive_int(threads);
    if (!count) return bad_variable("SMLA_NUM_THREADS", "a positive integer (threads of the cpu backend)", threads);
    options.cpu_threads = *count;
  }
  return options;
}

Expected<Context> Context::create(Backend backend) {
  auto tuning = TuningOptions::from_environment();
  if (!tuning) return tuning.status();
  return create(backend, *tuning);
}

Context::Context(Backend backend, DeviceProperties device, const TuningOptions& tuning, bool validates_only)
    : backend_(backend),
      device_(std::move(device)),
      tuning_(tuning),
      validates_only_(validates_only),
      owned_(std::make_shared<OwnedWorkspace>()) {
  owned_->runtime = runtime::backend_runtime(backend);
}

Expected<Context> Context::create(Backend backend, const TuningOptions& tuning) {
  const Backend resolved = resolve_backend(backend);
  auto device = usable_device(resolved);
  if (!device) return device.status();
  return Context(resolved, std::move(*device), tuning, false);
}

Expected<Context> Context::create_validating(Backend backend, const DeviceProperties& device,
                                            const TuningOptions& tuning) {
  if (backend == Backend::kAuto) {
    return invalid_argument("backend", "a named backend (a validating context has no device to resolve kAuto on)",
                            backend_name(backend));
  }
  if (runtime::backend_runtime(backend) == nullptr) {
    return unimplemented(fmt::format("backend '{}' is not compiled into this build", backend_name(backend)));
  }
  if (backend == Backend::kCuda && (device.compute_capability <= 0 || device.multiprocessors <= 0 ||
                                    device.shared_memory_per_block <= 0 || device.ordinal < 0)) {
    return invalid_argument("device",
                            "a cuda device's properties (ordinal >= 0, compute capability, multiprocessors and shared "
                            "memory per block > 0)",
                            fmt::format("ordinal {}, compute capability {}, {} multiprocessors, {} B shared memory",
                                        device.ordinal, device.compute_capability, device.multiprocessors,
                                        device.shared_memory_per_block));
  }
  if (backend == Backend::kCuda) return Context(backend, device, tuning, true);
  auto host = runtime::host_runtime().current_device();  // host backends always have the host
  if (!host) return host.status();
  return Context(backend, std::move(*host), tuning, true);
}

Expected<void*> Context::scratch(std::size_t bytes) const {
  if (bytes == 0) return static_cast<void*>(nullptr);
  if (caller_workspace_) {
    if (workspace_bytes_ < bytes) {
      return invalid_argument("workspace", fmt::format("at least {} bytes (the op's workspace size)", bytes),
                              fmt::format("{} bytes", workspace_bytes_));
    }
    if (workspace_ == nullptr || reinterpret_cast<std::uintptr_t>(workspace_) % 256 != 0) {
      return invalid_argument("workspace", "a 256-byte aligned pointer", fmt::format("{}", workspace_));
    }
    return workspace_;
  }
  if (validates_only_) return static_cast<void*>(nullptr);
  OwnedWorkspace& owned = *owned_;
  std::lock_guard<std::mutex> lock(owned.mutex);
  if (owned.bytes < bytes) {
    if (owned.data != nullptr) owned.runtime->release(owned.data);
    owned.data = nullptr;
    owned.bytes = 0;
    auto data = owned.runtime->allocate(bytes);
    if (!data) return data.status();
    owned.data = *data;
    owned.bytes = bytes;
  }
  return owned.data;
}

namespace {

// The calling thread's context of a backend and device: each thread owns its
// scratch, so one-call entries on several threads neither share a buffer nor
// wait for each other, and a one-call entry may call another.
Expected<Context*> thread_default_context(Backend backend) {
  thread_local std::map<std::pair<Backend, int>, Context> contexts;
  const Backend resolved = resolve_backend(backend);
  auto device = usable_device(resolved);
  if (!device) return device.status();
  const auto key = std::make_pair(resolved, device->ordinal);
  if (auto found = contexts.find(key); found != contexts.end()) return &found->second;
  auto created = Context::create(resolved);
  if (!created) return created.status();
  return &contexts.emplace(key, std::move(*created)).first->second;
}

}  // namespace

Expected<Context> default_context(Backend backend) {
  auto context = thread_default_context(backend);
  if (!context) return context.status();
  return **context;
}

namespace runtime {

Status with_default_context(Backend backend, const std::function<Status(const Context&)>& call) {
  auto context = thread_default_context(backend);
  if (!context) return context.status();
  return call(**context);
}

Status check_runs(const Context& context) {
  if (!context.validates_only()) return Status::Ok();
  return unimplemented(fmt::format(
      "running in a validating context (Context::create_validating, {} on '{}'): the arguments passed every check, "
      "nothing ran",
      backend_name(context.backend()), context.device().name));
}

}  // namespace runtime
}  // namespace smla
