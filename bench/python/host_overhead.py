"""Host overhead of one decode call from Python, beside the kernel time (CUDA).

Measures, on a small DeepSeek-V4 decode (CONFIG1-shaped: h_q 64, 128 window + 512 compressed):
  * smla.torch.sparse_decode with every argument given and the workspace cached;
  * smla.flash_mla.flash_mla_with_kvcache (FlashMLA's API);
  * the kernel time of the same call (CUDA events over a graph replay);
  * a CUDA-graph replay of the call, whose host cost is the replay's alone (no Python runs).
Host time of a call = wall time from entry to return (the launch is asynchronous), median of
--iters calls issued in bursts short enough that the launch queue never fills. Prints a table and
writes JSON (--json). Targets (issue 14): <= 15 us through smla.torch, <= 25 us through flash_mla.
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

import smla
import smla.flash_mla as flash_mla
import smla.torch as smla_torch


def host_times(fn, iters, burst=20):
    times = []
    for start in range(0, iters, burst):
        torch.cuda.synchronize()
        for _ in range(min(burst, iters - start)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--b", type=int, default=1)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    b, h = args.b, args.heads
    dev = "cuda"
    rng = np.random.default_rng(0)

    def cache(pages):
        c = smla.new_cache("v4-fp8", pages, 64, device=dev)
        c.pages.view(torch.uint8).copy_(torch.from_numpy(rng.integers(0, 0x78, size=c.pages.shape, dtype=np.uint8)))
        return c

    swa, c4 = cache(64), cache(64)
    q = torch.randn(b, h, 512, device=dev).to(torch.bfloat16)
    swa_idx = torch.randint(0, 64 * 64, (b, 128), dtype=torch.int32, device=dev)
    c4_idx = torch.randint(0, 64 * 64, (b, 512), dtype=torch.int32, device=dev)
    swa_len = torch.full((b,), 128, dtype=torch.int32, device=dev)
    c4_len = torch.full((b,), 512, dtype=torch.int32, device=dev)
    sink = torch.randn(h, device=dev)
    out = torch.empty(b, h, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(b, h, dtype=torch.float32, device=dev)
    main_cache, extra_cache = smla.KvCache(swa.pages, "v4-fp8"), smla.KvCache(c4.pages, "v4-fp8")

    def smla_call():
        smla_torch.sparse_decode(q, main_cache, swa_idx, main_lengths=swa_len, extra_cache=extra_cache,
                                 extra_indices=c4_idx, extra_lengths=c4_len, sink=sink, softmax_scale=0.044,
                                 out=out, lse=lse)

    q4, swa4, c44 = q.view(b, 1, h, 512), swa.pages.unsqueeze(2), c4.pages.unsqueeze(2)
    swa_idx4, c4_idx4 = swa_idx.view(b, 1, 128), c4_idx.view(b, 1, 512)
    sched, _ = flash_mla.get_mla_metadata()
    out4 = out.view(b, 1, h, 512)

    def flash_mla_call():
        flash_mla.flash_mla_with_kvcache(q4, swa4, None, None, 512, sched, None, 0.044, False, True, indices=swa_idx4,
                                         attn_sink=sink, extra_k_cache=c44, extra_indices_in_kvcache=c4_idx4,
                                         topk_length=swa_len, extra_topk_length=c4_len, out=out4)

    # The breakdown: the extension alone (arguments prepared), and its conversion + validation +
    # plan without the launch (the workspace-size query).
    index = q.get_device()
    workspace = smla_torch._workspaces
    raw_args = (q, swa.pages, 0, 1.0, swa_idx, swa_len, c4.pages, 0, 1.0, c4_idx, c4_len, sink, 0.044, out, lse, 1, -1)

    def raw_call():
        _, address, size = workspace[index]
        smla._C.sparse_decode(*raw_args, address, size, smla_torch._raw_stream(index))

    def size_query():
        smla._C.sparse_decode_workspace_size(*raw_args)

    for fn in (smla_call, flash_mla_call):
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        smla_call()
    graph.replay()
    torch.cuda.synchronize()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel = []
    for _ in range(200):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        kernel.append(start.elapsed_time(end) * 1e-3)

    results = {
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torch_tensors_read_through": "DLPack C exchange API" if smla._C.torch_exchange_api() else "attributes",
        "case": f"V4 decode b={b} h_q={h} window 128 + compressed 512, sink, lengths",
        "smla_torch_host_us": statistics.median(host_times(smla_call, args.iters)) * 1e6,
        "flash_mla_host_us": statistics.median(host_times(flash_mla_call, args.iters)) * 1e6,
        "graph_replay_host_us": statistics.median(host_times(graph.replay, args.iters)) * 1e6,
        "extension_call_host_us": statistics.median(host_times(raw_call, args.iters)) * 1e6,
        "extension_checks_host_us": statistics.median(host_times(size_query, args.iters)) * 1e6,
        "kernel_us": statistics.median(kernel) * 1e6,
    }
    for key, value in results.items():
        print(f"{key:24s} {value:.2f}" if isinstance(value, float) else f"{key:24s} {value}")
    verdict = results["smla_torch_host_us"] <= 15 and results["flash_mla_host_us"] <= 25
    print(f"targets (smla.torch <= 15 us, flash_mla <= 25 us): {'met' if verdict else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
