// File: smla/context.h
//
// The context every op runs in: which backend, which device, which stream,
// where scratch memory comes from and how the kernels are tuned.
//
//   auto ctx = smla::Context::create(smla::Backend::kCuda);   // kAuto: cuda when a device is present, else cpu
//   ctx->set_stream(stream);                                  // a cudaStream_t; nullptr = the legacy stream
//   ctx->set_workspace(buffer, bytes);                        // optional: caller-owned scratch (graph capture)
//   smla::sparse_decode(*ctx, args);
//
// A context is a small value: copies share the owned workspace and nothing
// else. Use one context from one thread (and one stream) at a time; give each
// thread or stream its own copy with its own workspace.
//
// Scratch: an op that needs scratch takes it from the caller's workspace when
// one is set (an error names the size it needs when it is too small; sizes come
// from the *_workspace_size queries or a plan and depend on shapes only) and
// otherwise from a buffer the context owns and grows on demand. Growing
// allocates and synchronizes the device, so code that captures CUDA graphs sets
// a workspace of its own, sized once for the largest step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "smla/backend.h"
#include "smla/status.h"

namespace smla {

// Knobs that change how an op runs, never what it computes. The defaults are
// the measured best (docs/PERF.md); A/B runs and tests change them. Read once:
// from_environment() fills the fields from the variables named beside them.
struct TuningOptions {
  enum class Switch { kAuto, kOn, kOff };

  // Use the registered implementation of this name for every op that has one
  // (an error when it cannot run the problem); ops without one select as usual.
  // "" = select (smla/registry.h). SMLA_IMPLEMENTATION, e.g. "cuda.portable".
  std::string implementation;
  // Packed MTP tiles (SparseDecodeArgs::queries_per_request): -1 = the tuned
  // rule; 0, 16, 32, 64 = the plain rule within that many rows (0 = never pack).
  // SMLA_CUDA_PACK_MAX_ROWS.
  int pack_max_rows = -1;
  // sm90 kernel: L2 prefetch of rows a few tiles ahead (auto: launches of at
  // most four waves whose CTAs attend at most 256 keys each, i.e. split small
  // batches). SMLA_SM90_PREFETCH=on|off.
  Switch sm90_prefetch = Switch::kAuto;
  // sm90 kernel: the two head blocks of an h_q 65..128 token run as a CTA pair
  // sharing the K expansion (FP8 rows; bf16 rows are copied, never paired).
  // SMLA_SM90_PAIR=off turns it off.
  bool sm90_pair_head_blocks = true;
  // sm90 kernel: a token's head blocks start together (token-major block
  // order). SMLA_SM90_BLOCK_ORDER=grid keeps the launch order.
  bool sm90_token_major = true;
  // sm90 kernel of FP8 rows, CTAs not paired (h_q <= 64): query heads each
  // 64-row CTA attends (the rest of its tile is padding). 0 = the plan's choice:
  // 32 or 16 where a split launch then runs two or four times the CTAs with the
  // same splits, each writing that fraction of the f32 partials (small batches),
  // else 64. 16, 32 or 64 force it (also on CTAs that pairs would have run).
  // SMLA_SM90_HEAD_ROWS.
  int sm90_head_block_rows = 0;
  // sm90 kernel, V4 / V3.2 FP8 caches: expand the rows a call names once into
  // a bf16 staging buffer in the workspace and read them as the flat prefill
  // workspace is read (auto: prefill-sized grids, more than four waves of CTAs
  // and no key splits). SMLA_SM90_STAGE=on|off.
  Switch sm90_stage_rows = Switch::kAuto;
  // sm90 kernel of FP8 rows, decode grids of more than one wave whose calls pass
  // lengths: a prepass orders the tokens by their key tiles, most first, and the
  // grid runs them in that order, so the last wave holds the short ones (auto: on;
  // 15-28% faster on random lengths, docs/PERF.md, session 31). SMLA_SM90_LENGTH_ORDER=on|off.
  Switch sm90_length_order = Switch::kAuto;
  // Rows the staging buffer holds, at most (-1: 256 MiB of bf16 rows). A call
  // that may name more distinct rows runs the direct kernel instead: behind
  // staging that finds out on the device when staging is on or its requests
  // have more than 16 tokens (queries_per_request), else without staging.
  // SMLA_SM90_STAGING_ROWS (a positive integer).
  std::int64_t sm90_staging_rows = -1;
  // sm90 kernel of copied rows (bf16 caches, the flat prefill workspace, staged
  // rows): at most this many CTAs, each running (token, head block, split)
  // blocks one after another, so a CTA's next block starts loading while its
  // last finishes. -1: one per SM; 0: a CTA per block. SMLA_SM90_PERSISTENT_CTAS
  // (0 or a positive integer).
  int sm90_persistent_ctas = -1;
  // sm90 kernel of copied rows, d_v 512 rows and unsplit 16-byte-aligned outputs:
  // each warp writes its output rows by tensor stores from a slot of its own, so
  // the Q tile takes the next block's Q as soon as the last Q K^T is done (auto:
  // on, 4-9% faster on the d 512 prefill cases, docs/PERF.md, session 35; off: the
  // output staged through the Q tile). SMLA_SM90_TENSOR_STORES=on|off.
  Switch sm90_tensor_stores = Switch::kAuto;
  // Those tensor stores' boxes: 16 rows (each warp its own, no barrier between warps)
  // or 64 (each warpgroup's four warps stage a 64-row box, which its thread 0 stores:
  // 8 stores an item instead of 32, as FlashMLA writes its output; measured no
  // faster, docs/PERF.md, session 36). 0: 16. SMLA_SM90_OUTPUT_BOX_ROWS=16|64.
  int sm90_output_box_rows = 0;
  // sm90 kernel of FP8 rows, a split launch of unpaired blocks: on, the splits of a
  // head block run as one thread-block cluster of at most 16 CTAs that merges its
  // partials itself, so no combine kernel follows (where the grid's clusters are all
  // resident at once and each CTA merges at most 4 rows). Auto means on (0.89-1.005x
  // of the combine's time where it applies, docs/PERF.md, session 38); off launches
  // the combine kernel.
  // SMLA_SM90_FOLD_SPLITS=on|off.
  Switch sm90_fold_splits = Switch::kAuto;
  // cpu backend: threads an op runs on, the calling thread included; 0 = one
  // per CPU this process may run on. Results never depend on it.
  // SMLA_NUM_THREADS (a positive integer).
  int cpu_threads = 0;

  // The defaults, overridden by the environment variables above. An
  // unrecognised value is an error naming the variable.
  static Expected<TuningOptions> from_environment();
};

// What the context's device is (queried once, at create()).
struct DeviceProperties {
  int ordinal = -1;               // CUDA device ordinal; -1 for the host backends
  int compute_capability = 0;     // major * 10 + minor (90 = sm_90); 0 on the host
  int multiprocessors = 0;
  int shared_memory_per_block = 0;  // opt-in maximum, bytes
  std::string name;               // "NVIDIA H100 80GB HBM3", "host"
};

class Context {
 public:
  // Resolves kAuto, checks the backend is compiled in and usable (cuda: the
  // calling thread's current device) and reads the device's properties.
  // tuning defaults to TuningOptions::from_environment().
  static Expected<Context> create(Backend backend = Backend::kAuto);
  static Expected<Context> create(Backend backend, const TuningOptions& tuning);

  // A context for a device that need not be present (a machine without a GPU,
  // planning ahead for another card): ops check every argument against
  // `device`, select and plan for it and answer workspace queries, but run
  // nothing. A call whose arguments pass returns Unimplemented; no memory
  // is allocated (a caller workspace is still checked). The backend must be
  // compiled in; kAuto is refused. Limits of a kernel launch itself (grid
  // extents) are checked only when a call runs. Without the device, a plan
  // counts the CTAs an SM holds from shared memory alone, so its scratch size
  // is an upper bound of what that device needs.
  static Expected<Context> create_validating(Backend backend, const DeviceProperties& device,
                                             const TuningOptions& tuning = {});
  bool validates_only() const { return validates_only_; }

  Backend backend() const { return backend_; }
  const DeviceProperties& device() const { return device_; }
  const TuningOptions& tuning() const { return tuning_; }
  void set_tuning(const TuningOptions& tuning) { tuning_ = tuning; }

  void* stream() const { return stream_; }
  void set_stream(void* stream) { stream_ = stream; }

  // Caller-owned scratch in the backend's memory (256-byte aligned for cuda).
  // From then on an op never allocates: one that needs more than `bytes`
  // (even with bytes = 0) fails naming the size it needs.
  void set_workspace(void* data, std::size_t bytes) {
    workspace_ = data;
    workspace_bytes_ = bytes;
    caller_workspace_ = true;
  }
  // Back to the buffer the context owns and grows.
  void use_owned_workspace() {
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    caller_workspace_ = false;
  }
  bool has_caller_workspace() const { return caller_workspace_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // `bytes` of scratch for one op: the caller's workspace, or the owned buffer
  // grown to at least that (nullptr in a validating context, which allocates
  // nothing). Fails when the caller's is smaller or an allocation fails. Ops
  // call this; users normally do not.
  Expected<void*> scratch(std::size_t bytes) const;

  struct OwnedWorkspace;  // the grown buffer, shared by copies

 private:
  // What both create()s make: a concrete backend, its device, the tuning and a fresh owned workspace.
  Context(Backend backend, DeviceProperties device, const TuningOptions& tuning, bool validates_only);

  Backend backend_ = Backend::kCpu;
  DeviceProperties device_;
  TuningOptions tuning_;
  void* stream_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  bool caller_workspace_ = false;
  bool validates_only_ = false;
  std::shared_ptr<OwnedWorkspace> owned_;
};

// The calling thread's default context of a backend (kAuto resolved) on the
// current device, created on first use with the environment's tuning (a copy:
// copies share its owned scratch). The one-call entries without a Context
// (sparse_decode(args, backend), ...) run in it; each thread has its own.
Expected<Context> default_context(Backend backend = Backend::kAuto);

}  // namespace smla
