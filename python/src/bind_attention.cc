// smla._C.sparse_decode / sparse_prefill and their workspace queries.
//
// Every call runs in a Context of its backend and device (one per thread, made
// on first use); CUDA calls set the caller's stream and workspace on it (never
// allocating or synchronizing). A CUDA call whose workspace is too small
// runs nothing and returns the bytes it needs, so a caller that caches its
// workspace pays one C++ call per step and grows it only on the first one.
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "python/src/bindings.h"
#include "python/src/py_tensor.h"
#include "smla/attention.h"
#include "smla/context.h"

namespace smla::python {
namespace {

constexpr int kAutoBackend = -1;

// Makes the tensors' device current for one call (as torch's device guard does), so callers
// need not switch devices around every call.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) { status_ = switch_device(device, &previous_); }
  ~ScopedDevice() {
    if (previous_ >= 0) (void)switch_device(previous_, nullptr);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  Status status_;
  int previous_ = -1;
};

// "auto" follows the data: CUDA tensors run on cuda, host tensors on cpu.
Backend pick_backend(int requested, const TensorView& q) {
  if (requested != kAutoBackend) return static_cast<Backend>(requested);
  return q.device.kind == DeviceKind::kCuda ? Backend::kCuda : Backend::kCpu;
}

void check_device_matches(Backend backend, const TensorView& q) {
  const bool on_cuda = q.present() && q.device.kind == DeviceKind::kCuda;
  if (backend == Backend::kCuda && q.present() && !on_cuda) {
    throw SmlaError{"q: expected a cuda tensor for backend 'cuda', got a cpu tensor"};
  }
  if (backend != Backend::kCuda && on_cuda) {
    throw SmlaError{fmt::format("q: expected a cpu tensor for backend '{}', got a cuda tensor", backend_name(backend))};
  }
}

struct DecodeCall {
  PyTensorArgs tensors;
  SparseDecodeArgs args;
};

void fill_decode(DecodeCall& call, const py::handle& q, const py::handle& main_pages, int main_format,
                 float main_fp8_scale, const py::handle& main_indices, const py::handle& main_lengths,
                 const py::handle& extra_pages, int extra_format, float extra_fp8_scale,
                 const py::handle& extra_indices, const py::handle& extra_lengths, const py::handle& sink,
                 float softmax_scale, const py::handle& out, const py::handle& lse, std::int64_t queries_per_request,
                 const py::handle& token_order, bool token_order_ready) {
  PyTensorArgs& t = call.tensors;
  SparseDecodeArgs& a = call.args;
  a.q = t.view(q, "q");
  merge_leading_dims(a.q, "q", 3);
  a.main_cache = t.cache(main_pages, "main_cache", main_format, main_fp8_scale);
  a.main_indices = t.view(main_indices, "main_indices");
  merge_leading_dims(a.main_indices, "main_indices", 2);
  a.main_lengths = t.view(main_lengths, "main_lengths");
  if (!extra_pages.is_none()) a.extra_cache = t.cache(extra_pages, "extra_cache", extra_format, extra_fp8_scale);
  a.extra_indices = t.view(extra_indices, "extra_indices");
  merge_leading_dims(a.extra_indices, "extra_indices", 2);
  a.extra_lengths = t.view(extra_lengths, "extra_lengths");
  a.sink = t.view(sink, "sink");
  a.softmax_scale = softmax_scale;
  a.out = t.view(out, "out", Access::kWrite);
  merge_leading_dims(a.out, "out", 3);
  a.lse = t.view(lse, "lse", Access::kWrite);
  merge_leading_dims(a.lse, "lse", 2);
  a.queries_per_request = queries_per_request;
  // A call that is not ready writes the order; a ready one only reads it.
  a.token_order = t.view(token_order, "token_order", token_order_ready ? Access::kRead : Access::kWrite);
  a.token_order_ready = token_order_ready;
}

struct PrefillCall {
  PyTensorArgs tensors;
  SparsePrefillArgs args;
};

void fill_prefill(PrefillCall& call, const py::handle& q, const py::handle& kv, const py::handle& indices,
                  const py::handle& topk_length, const py::handle& sink, float softmax_scale, int d_v,
                  const py::handle& out, const py::handle& max_logits, const py::handle& lse) {
  PyTensorArgs& t = call.tensors;
  SparsePrefillArgs& a = call.args;
  a.q = t.view(q, "q");
  a.kv = t.view(kv, "kv");
  a.indices = t.view(indices, "indices");
  a.topk_length = t.view(topk_length, "topk_length");
  a.sink = t.view(sink, "sink");
  a.softmax_scale = softmax_scale;
  a.d_v = d_v;
  a.out = t.view(out, "out", Access::kWrite);
  a.max_logits = t.view(max_logits, "max_logits", Access::kWrite);
  a.lse = t.view(lse, "lse", Access::kWrite);
}

// Runs a call in the thread's context; returns the workspace bytes still needed (0 = it ran).
template <class Args, class RunFn, class SizeFn>
std::size_t run(const Args& args, int backend_code, std::uintptr_t workspace, std::size_t workspace_bytes,
                std::uintptr_t stream, RunFn run_fn, SizeFn size_fn) {
  const Backend backend = pick_backend(backend_code, args.q);
  check_device_matches(backend, args.q);
  Status status;
  std::size_t needed = 0;
  {
    py::gil_scoped_release release;
    std::optional<ScopedDevice> device;
    if (backend == Backend::kCuda) device.emplace(args.q.device.index);
    auto context = device && !device->status().ok() ? Expected<Context*>(device->status())
                                                    : thread_context(backend);
    if (!context) {
      status = context.status();
    } else {
      (*context)->set_stream(reinterpret_cast<void*>(stream));
      (*context)->set_workspace(reinterpret_cast<void*>(workspace), workspace_bytes);
      status = run_fn(**context, args);
      if (!status.ok() && backend == Backend::kCuda) {
        // A short workspace is the one failure the caller fixes by growing it and calling again.
        const Expected<std::size_t> size = size_fn(**context, args);
        if (size.ok() && *size > workspace_bytes) needed = *size;
      }
    }
  }
  if (needed > 0) return needed;
  throw_if_error(status);
  return 0;
}

template <class Args, class SizeFn>
std::size_t workspace_size(const Args& args, int backend_code, SizeFn size_fn) {
  const Backend backend = pick_backend(backend_code, args.q);
  check_device_matches(backend, args.q);
  if (backend != Backend::kCuda) return 0;
  const ScopedDevice device(args.q.device.index);
  throw_if_error(device.status());
  auto context = thread_context(backend);
  throw_if_error(context.status());
  const Expected<std::size_t> size = size_fn(**context, args);
  throw_if_error(size.status());
  return *size;
}

// Overload sets as callables.
constexpr auto kRunDecode = [](const Context& c, const SparseDecodeArgs& a) { return smla::sparse_decode(c, a); };
constexpr auto kRunPrefill = [](const Context& c, const SparsePrefillArgs& a) { return smla::sparse_prefill(c, a); };
constexpr auto kDecodeSize = [](const Context& c, const SparseDecodeArgs& a) {
  return smla::sparse_decode_workspace_size(c, a);
};
constexpr auto kPrefillSize = [](const Context& c, const SparsePrefillArgs& a) {
  return smla::sparse_prefill_workspace_size(c, a);
};

}  // namespace

// The decode entries' arguments, positional as smla._api and smla.torch pass them; the step token
// order (SparseDecodeArgs::token_order) comes last with defaults, so calls without it keep working.
#define DECODE_ARGS                                                                                                  \
  py::arg("q"), py::arg("main_pages"), py::arg("main_format"), py::arg("main_fp8_scale"), py::arg("main_indices"), \
      py::arg("main_lengths"), py::arg("extra_pages"), py::arg("extra_format"), py::arg("extra_fp8_scale"),         \
      py::arg("extra_indices"), py::arg("extra_lengths"), py::arg("sink"), py::arg("softmax_scale"), py::arg("out"), \
      py::arg("lse"), py::arg("queries_per_request")
#define TOKEN_ORDER_ARGS py::arg("token_order") = py::none(), py::arg("token_order_ready") = false

void bind_attention(py::module_& m) {
  m.def(
      "sparse_decode",
      [](py::handle q, py::handle main_pages, int main_format, float main_fp8_scale, py::handle main_indices,
         py::handle main_lengths, py::handle extra_pages, int extra_format, float extra_fp8_scale,
         py::handle extra_indices, py::handle extra_lengths, py::handle sink, float softmax_scale, py::handle out,
         py::handle lse, std::int64_t queries_per_request, int backend, std::uintptr_t workspace,
         std::size_t workspace_bytes, std::uintptr_t stream, py::handle token_order, bool token_order_ready) {
        DecodeCall call;
        fill_decode(call, q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages,
                    extra_format, extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse,
                    queries_per_request, token_order, token_order_ready);
        return run(call.args, backend, workspace, workspace_bytes, stream, kRunDecode, kDecodeSize);
      },
      DECODE_ARGS, py::arg("backend"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream"),
      TOKEN_ORDER_ARGS,
      "Low-level decode entry (use smla.sparse_decode). Returns 0, or the CUDA workspace bytes needed.");
  m.def(
      "sparse_decode_workspace_size",
      [](py::handle q, py::handle main_pages, int main_format, float main_fp8_scale, py::handle main_indices,
         py::handle main_lengths, py::handle extra_pages, int extra_format, float extra_fp8_scale,
         py::handle extra_indices, py::handle extra_lengths, py::handle sink, float softmax_scale, py::handle out,
         py::handle lse, std::int64_t queries_per_request, int backend, py::handle token_order,
         bool token_order_ready) {
        DecodeCall call;
        fill_decode(call, q, main_pages, main_format, main_fp8_scale, main_indices, main_lengths, extra_pages,
                    extra_format, extra_fp8_scale, extra_indices, extra_lengths, sink, softmax_scale, out, lse,
                    queries_per_request, token_order, token_order_ready);
        return workspace_size(call.args, backend, kDecodeSize);
      },
      DECODE_ARGS, py::arg("backend"), TOKEN_ORDER_ARGS);
  m.def(
      "sparse_prefill",
      [](py::handle q, py::handle kv, py::handle indices, py::handle topk_length, py::handle sink, float softmax_scale,
         int d_v, py::handle out, py::handle max_logits, py::handle lse, int backend, std::uintptr_t workspace,
         std::size_t workspace_bytes, std::uintptr_t stream) {
        PrefillCall call;
        fill_prefill(call, q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse);
        return run(call.args, backend, workspace, workspace_bytes, stream, kRunPrefill, kPrefillSize);
      },
      "Low-level prefill entry (use smla.sparse_prefill). Returns 0, or the CUDA workspace bytes needed.");
  m.def("sparse_prefill_workspace_size",
        [](py::handle q, py::handle kv, py::handle indices, py::handle topk_length, py::handle sink,
           float softmax_scale, int d_v, py::handle out, py::handle max_logits, py::handle lse, int backend) {
          PrefillCall call;
          fill_prefill(call, q, kv, indices, topk_length, sink, softmax_scale, d_v, out, max_logits, lse);
          return workspace_size(call.args, backend, kPrefillSize);
        });
}

#undef DECODE_ARGS
#undef TOKEN_ORDER_ARGS

}  // namespace smla::python
