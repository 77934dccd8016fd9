// Internal: how implementations join the registry (smla/registry.h).
//
// Each op family lists its host rows (reference, cpu) in one function and its
// CUDA rows in another that only CUDA builds compile, so a backend that is not
// built has no rows. A row pairs the public description with the family's
// table of functions (src/runtime/op_tables.h), which the op's front end casts
// back.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "smla/context.h"
#include "smla/registry.h"
#include "smla/tensor.h"
#include "src/cpu/thread_pool.h"

namespace smla::runtime {

struct Entry {
  Implementation info;
  // A shape heuristic among implementations that all fit (nullptr = always):
  // select() passes over an entry that does not prefer the problem when a lower
  // priority one fits. Not consulted when the tuning names the entry.
  bool (*prefers)(const Context& context, const Problem& problem) = nullptr;
  const void* functions = nullptr;  // the op family's table (op_tables.h)
};

// The rows of each family: host rows, then CUDA rows (CUDA builds only).
void add_attention_entries(std::vector<Entry>& rows);       // src/runtime/attention.cc
void add_layer_entries(std::vector<Entry>& rows);           // src/runtime/layer
void add_metadata_entries(std::vector<Entry>& rows);        // src/core/metadata
void add_cuda_attention_entries(std::vector<Entry>& rows);  // src/cuda
void add_cuda_layer_entries(std::vector<Entry>& rows);      // src/cuda/layer
void add_cuda_metadata_entries(std::vector<Entry>& rows);   // src/cuda/metadata

// Where an op's tensors live in a context: on the device for cuda, the host
// otherwise (the front ends validate for it; host values are checked too).
inline DeviceKind tensor_device(const Context& context) {
  return context.backend() == Backend::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu;
}

// Every row, sorted by op then priority (highest first).
const std::vector<Entry>& entries();

// select() returning the row.
Expected<const Entry*> select_entry(const Context& context, const Problem& problem);

// The function table of a selected row, typed by its family.
template <class Table>
const Table& functions_of(const Entry& entry) {
  return *static_cast<const Table*>(entry.functions);
}

// What a backend supplies to Context: whether it runs here, its device and its
// scratch memory.
struct BackendRuntime {
  Expected<DeviceProperties> (*current_device)() = nullptr;  // an error when unusable here
  Expected<void*> (*allocate)(std::size_t bytes) = nullptr;
  void (*release)(void* data) = nullptr;                      // waits for work still using it
};
const BackendRuntime* backend_runtime(Backend backend);  // nullptr when not compiled in
const BackendRuntime& host_runtime();                    // reference and cpu
const BackendRuntime* cuda_runtime();                    // CUDA builds only; defined in src/cuda

// The last step of an op before it touches memory or a device: Ok, or, in a
// validating context (Context::create_validating), Unimplemented saying the
// arguments passed and nothing ran.
Status check_runs(const Context& context);

// The last steps of every op front end, after validation and select: scratch
// from the context (a caller workspace is checked even in a validating
// context), check_runs, then run(scratch) on at most the context's CPU threads.
template <class Run>
Status run_with_scratch(const Context& context, std::size_t scratch_bytes, Run&& run) {
  auto scratch = context.scratch(scratch_bytes);
  if (!scratch) return scratch.status();
  SMLA_RETURN_IF_ERROR(check_runs(context));
  const cpu::ScopedThreadLimit threads(context.tuning().cpu_threads);
  return run(*scratch);
}

// Runs call(context) in the calling thread's default_context(backend): the
// one-call entries without a Context.
Status with_default_context(Backend backend, const std::function<Status(const Context&)>& call);

}  // namespace smla::runtime
