"""One decode step of a DeepSeek-V4 C4A layer, written for FlashMLA's API, run through smla.

What an engine author tries first: the caches are filled with smla's codecs, the step's window
indices come from smla's step metadata, the compressed indices from the C4A index transform,
and the attention call is FlashMLA's ``flash_mla_with_kvcache`` -- only the import differs:

    import smla.flash_mla as flash_mla     # instead of: import flash_mla

The result is compared with smla's float64 reference backend. Exit status 1 past tolerance.

    PYTHONPATH=build/release/python python3 examples/python/flash_mla_decode_step.py [--device cuda]
"""

import argparse
import sys

import numpy as np
import torch

import smla
import smla.flash_mla as flash_mla
from smla import metadata


def bf16(array, device):
    return torch.from_numpy(smla.to_bf16(array).astype(np.int16)).view(torch.bfloat16).to(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    # A batch of 4 decode requests (one token each) with contexts of 300..900 tokens.
    config = smla.StepConfig()
    config.window, config.index_topk, config.max_model_len = 128, 64, 4096
    seq_lens = rng.integers(300, 900, size=4).astype(np.int32)
    pages_per_request = (int(seq_lens.max()) + 63) // 64
    swa_table = rng.permutation(4 * pages_per_request).astype(np.int32).reshape(4, pages_per_request)
    c4_pages_per_request = (int(seq_lens.max()) // 4 + 63) // 64
    c4_table = rng.permutation(4 * c4_pages_per_request).astype(np.int32).reshape(4, c4_pages_per_request)
    batch = smla.Batch(query_lens=np.ones(4, np.int32), seq_lens=seq_lens, swa_block_table=swa_table,
                       c4_block_table=c4_table)
    md = metadata.make_step_metadata(batch, config)

    # The two V4 FP8 caches (584 bytes a token, pages padded to 576 bytes), every slot filled.
    swa = smla.new_cache("v4-fp8", swa_table.size, 64)
    c4 = smla.new_cache("v4-fp8", c4_table.size, 64)
    for cache in (swa, c4):
        slots = cache.pages.shape[0] * cache.pages.shape[1]
        smla.quantize_into_cache(cache, rng.standard_normal((slots, 512)).astype(np.float32),
                                 np.arange(slots, dtype=np.int64))

    # The lightning indexer's top-k (request-local compressed entries) -> global slots.
    compressed = seq_lens // 4
    local_topk = np.stack([rng.permutation(int(n))[:config.index_topk] for n in compressed]).astype(np.int32)
    c4_indices = np.empty_like(local_topk)
    c4_lens = np.empty(4, np.int32)
    metadata.c4a_global_topk_indices(local_topk, md["token_to_req"], md["is_valid_token"], c4_table, 64, c4_indices,
                                     c4_lens)

    device = args.device
    q = bf16(rng.standard_normal((4, 1, args.heads, 512)), device)
    sink = torch.from_numpy(rng.standard_normal(args.heads).astype(np.float32)).to(device)
    # [num_blocks, block_size, 1, 584] uint8 with the padded page stride, as FlashMLA takes it.
    as_flash_mla_cache = lambda cache: torch.from_numpy(cache.pages).to(device).unsqueeze(2)  # noqa: E731

    # -- the engine's FlashMLA code, unchanged --
    sched_meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, as_flash_mla_cache(swa), None, None, 512, sched_meta, None, 512 ** -0.5, False, True,
        indices=torch.from_numpy(md["swa_indices"]).to(device).view(4, 1, -1), attn_sink=sink,
        extra_k_cache=as_flash_mla_cache(c4),
        extra_indices_in_kvcache=torch.from_numpy(c4_indices).to(device).view(4, 1, -1),
        topk_length=torch.from_numpy(md["swa_lens"]).to(device),
        extra_topk_length=torch.from_numpy(c4_lens).to(device))

    # The float64 reference on the same inputs (host copies).
    ref_out, ref_lse = smla.sparse_decode(
        q.view(4, args.heads, 512).cpu(), swa, torch.from_numpy(md["swa_indices"]),
        main_lengths=torch.from_numpy(md["swa_lens"]), extra_cache=c4, extra_indices=torch.from_numpy(c4_indices),
        extra_lengths=torch.from_numpy(c4_lens), sink=sink.cpu(), softmax_scale=512 ** -0.5, backend="reference")
    out_error = ((out.view(4, args.heads, 512).float().cpu() - ref_out.float()).abs().max()
                 / ref_out.float().abs().max().clamp(min=1)).item()
    lse_error = (lse.transpose(1, 2).reshape(4, args.heads).cpu() - ref_lse).abs().max().item()
    ok = out_error < 1e-2 and lse_error < 1e-3
    print(f"smla {smla.__version__} via smla.flash_mla on {device}: b=4, h_q={args.heads}, "
          f"window {config.window} + C4A top-{config.index_topk}; max relative error out {out_error:.2e}, "
          f"lse {lse_error:.2e}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
