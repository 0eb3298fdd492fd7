"""Bandwidth of a provider's FP4 write and gather on DEVICE memory, against the copy roofline.

``python -m kvx_conformance.bench.fp4bench PROVIDER [--tokens N] [--json FILE]`` (needs torch
with CUDA). For each FP4 format and IO dtype it times ``kvx_write_kv`` (quantize N
tokens to shuffled slots) and ``kvx_gather_kv`` (dequantize N tokens through a shuffled
PACKED table) with CUDA events, median of the repeats after a warm-up, and counts the
bytes actually moved, K and V: IO elements read (write) or written (gather) plus packed
codes and scale bytes written (write) or read (gather), plus the slots / table. The
roofline is the bench's (:func:`kvx_conformance.bench.timing.device_copy_roofline`): the best
of several device-to-device copies of 1 GiB in the same run (``copy_``, ``cudaMemcpyAsync``, a
vectorized copy kernel), counting bytes read plus bytes written. After timing, each call's results
(the cache's codes and scales, the gather's outputs) are zeroed and the call is made once more,
then checked against the numpy oracle on a sample of tokens (all heads and dims): every timed call
repeats an earlier one, so a provider that answers a call it has seen without work leaves zeros
there, and the check fails it (docs/spec-readings.md, R-STATE).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..abi import header as abi
from ..abi.header import DType, Fp4Format, Layout, Memory, TableFormat
from ..abi.loader import load_provider
from ..cases import fp4 as fx


def _median_ms(torch, fn, reps: int = 5, inner: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return float(np.median(times))


def copy_roofline() -> dict:
    """The bench's roofline (:func:`.timing.device_copy_roofline`: the best of the device-to-device copies)."""
    from .timing import device_copy_roofline

    return device_copy_roofline()


def _tensor(t, dtype, layout, shape):
    return fx._tensor(dtype, layout, Memory.DEVICE, shape, fx._dense_strides(shape), t.data_ptr())


GATHER_SEQS = 128  # sequences of the gather's PACKED table
BLOCK = 16  # tokens per cache block
TOKEN_QUANTUM = GATHER_SEQS * BLOCK  # every sequence holds whole blocks


def run(provider_path: str, tokens: int, H: int = 8, D: int = 128, bs: int = BLOCK, seed: int = 0,
        formats=None, ios=None) -> dict:
    import torch

    prov = load_provider(provider_path)
    rng = np.random.default_rng(seed)
    roof = copy_roofline()
    out = {"device": torch.cuda.get_device_name(), "tokens": tokens, "kv_heads": H, "head_dim": D, "block_size": bs,
           "roofline_gbs": roof["bandwidth_Bps"] / 1e9, "roofline_method": roof.get("winner") or roof["method"],
           "roofline_methods_gbs": {m["id"]: (m["bandwidth_Bps"] or 0) / 1e9 for m in roof.get("methods") or []},
           "rows": []}
    nb = tokens // bs
    slots_np = rng.permutation(nb * bs).astype(np.int64)[:tokens]
    slots = torch.from_numpy(slots_np).cuda()
    S = GATHER_SEQS
    per = tokens // S
    table_np = rng.permutation(nb).astype(np.int32).reshape(S, per // bs)
    table = torch.from_numpy(table_np).cuda()
    lens = torch.full((S,), per, dtype=torch.int32, device="cuda")
    sample = np.sort(rng.choice(tokens, size=512, replace=False))
    x32 = torch.randn(2, tokens, H, D, device="cuda") * torch.exp(torch.randn(1, 1, H, D, device="cuda"))
    for fmt in formats or (Fp4Format.NVFP4, Fp4Format.MXFP4, Fp4Format.MXFP4_OCP):
        B = fx.block_values(fmt)
        for io in ios or (DType.F16, DType.BF16, DType.F32):
            tdt = {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.F32: torch.float32}[io]
            x = x32.to(tdt)
            esz = x.element_size()
            g = 0.01 if fmt == Fp4Format.NVFP4 else None
            codes = [torch.zeros(nb, bs, H, D // 2, dtype=torch.uint8, device="cuda") for _ in range(2)]
            scales = [torch.zeros(nb, bs, H, D // B, dtype=torch.uint8, device="cuda") for _ in range(2)]
            gt = torch.tensor([g or 1.0], dtype=torch.float32, device="cuda")
            c = abi.kvx_cache_desc_v1_2_t.new(num_blocks=nb, block_size=bs, num_kv_heads=H, head_dim=D)
            c.k = _tensor(codes[0], DType.F4_E2M1, Layout.BLOCK_NHD, (nb, bs, H, D))
            c.v = _tensor(codes[1], DType.F4_E2M1, Layout.BLOCK_NHD, (nb, bs, H, D))
            c.pool = abi.kvx_pool_desc_t.new()
            ext = abi.kvx_fp4_cache_ext_t.new(format=int(fmt))
            ext.k_scales = _tensor(scales[0], fx.scale_dtype(fmt), Layout.BLOCK_NHD, (nb, bs, H, D // B))
            ext.v_scales = _tensor(scales[1], fx.scale_dtype(fmt), Layout.BLOCK_NHD, (nb, bs, H, D // B))
            for side in ("k_global", "v_global"):
                sd = abi.kvx_scale_desc_t.new()
                if g is not None:
                    sd.dtype, sd.granularity, sd.data = int(DType.F32), int(abi.ScaleGranularity.PER_TENSOR), gt.data_ptr()
                setattr(ext, side, sd)
            c.fp4 = ext
            w = abi.kvx_write_desc_v1_2_t.new()
            w.io = fx._io(io, Memory.DEVICE, x[0].data_ptr(), x[1].data_ptr(), tokens, H, D)
            w.slots = abi.kvx_slot_mapping_t.new(dtype=int(DType.S64), token_count=tokens, invalid_slot=-1)
            w.slots.slots = slots.data_ptr()
            w.k_scale_desc, w.v_scale_desc = abi.kvx_scale_desc_t.new(), abi.kvx_scale_desc_t.new()
            st = prov.write_kv(c, w, None)
            assert st == 0, f"write status {st}"
            ms_w = _median_ms(torch, lambda: prov.write_kv(c, w, None))
            for t in (*codes, *scales):  # the results zeroed, the timed call made once more, then checked
                t.zero_()
            st = prov.write_kv(c, w, None)
            assert st == 0, f"write status {st} (the call made again after timing)"
            bytes_w = 2 * tokens * H * (D * esz + D // 2 + D // B) + tokens * 8
            # verify the write on a sample of tokens
            xs = x[:, sample].float().cpu().numpy()
            bad = 0
            for si, side in enumerate(("k", "v")):
                ec, es = fx.encode_rows(fmt, xs[si], np.float32(g) if g is not None else None)
                b_, t_ = slots_np[sample] // bs, slots_np[sample] % bs
                gc = codes[si][torch.from_numpy(b_).cuda(), torch.from_numpy(t_).cuda()].cpu().numpy()
                gs = scales[si][torch.from_numpy(b_).cuda(), torch.from_numpy(t_).cuda()].cpu().numpy()
                bad += int(np.count_nonzero(gc != ec) + np.count_nonzero(gs != es))
            # gather
            o = torch.empty(2, tokens, H, D, dtype=tdt, device="cuda")
            gd = abi.kvx_gather_desc_v1_2_t.new(max_seq_len=per)
            gd.io = fx._io(io, Memory.DEVICE, o[0].data_ptr(), o[1].data_ptr(), tokens, H, D)
            gd.block_table = abi.kvx_block_table_t.new(format=int(TableFormat.PACKED), index_dtype=int(DType.S32),
                                                        seq_count=S, beam_width=1, max_blocks_per_seq=per // bs,
                                                        indices_count=table.numel())
            gd.block_table.indices = table.data_ptr()
            gd.seq_lens = abi.kvx_seq_lens_t.new(dtype=int(DType.S32), seq_count=S)
            gd.seq_lens.lengths = lens.data_ptr()
            st = prov.gather_kv(c, gd, None)
            assert st == 0, f"gather status {st}"
            ms_g = _median_ms(torch, lambda: prov.gather_kv(c, gd, None))
            o.zero_()  # as for the write: zeroed, made once more, then checked
            st = prov.gather_kv(c, gd, None)
            assert st == 0, f"gather status {st} (the call made again after timing)"
            bytes_g = 2 * tokens * H * (D * esz + D // 2 + D // B) + table.numel() * 4
            # verify the gather on the same sample rows: decode of the cache's codes
            rows = torch.from_numpy(sample).cuda()
            for si in range(2):
                s_, t_ = sample // per, sample % per
                blk = table_np[s_, t_ // bs]
                cc = codes[si][torch.from_numpy(blk).cuda(), torch.from_numpy(t_ % bs).cuda()].cpu().numpy()
                cs = scales[si][torch.from_numpy(blk).cuda(), torch.from_numpy(t_ % bs).cuda()].cpu().numpy()
                with np.errstate(over="ignore", invalid="ignore"):
                    want = fx.decode_rows(fmt, cc, cs, np.float32(g) if g is not None else None, fx.IO_NP[io])
                got = o[si][rows].view(torch.int16 if esz == 2 else torch.int32).cpu().numpy()
                bad += int(np.count_nonzero(got != want.view(got.dtype)))
            row = {"format": fx.FORMAT_NAMES[fmt], "io": io.name, "write_ms": ms_w, "write_gbs": bytes_w / ms_w / 1e6,
                   "write_pct": 100 * bytes_w / ms_w / 1e6 / out["roofline_gbs"], "gather_ms": ms_g,
                   "gather_gbs": bytes_g / ms_g / 1e6, "gather_pct": 100 * bytes_g / ms_g / 1e6 / out["roofline_gbs"],
                   "bytes_write": bytes_w, "bytes_gather": bytes_g, "mismatches": bad,
                   "verified_after": "a repeat of the timed calls"}
            out["rows"].append(row)
            print(f"{row['format']:10s} {io.name:5s} write {ms_w:7.3f} ms {row['write_gbs']:7.1f} GB/s "
                  f"({row['write_pct']:5.1f}%)  gather {ms_g:7.3f} ms {row['gather_gbs']:7.1f} GB/s "
                  f"({row['gather_pct']:5.1f}%)  mismatches {bad}", flush=True)
            del codes, scales, o, x
            torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvx_conformance.bench.fp4bench", description=__doc__)
    ap.add_argument("provider")
    ap.add_argument("--tokens", type=int, default=262144,
                    help=f"tokens per call, a positive multiple of {TOKEN_QUANTUM} ({GATHER_SEQS} sequences of whole "
                         f"{BLOCK}-token blocks; default 262144)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--formats", metavar="LIST", help="comma-separated: " + ", ".join(fx.FORMATS) + " (default: all)")
    ap.add_argument("--io", metavar="LIST", help="comma-separated IO dtypes: f16, bf16, f32 (default: all)")
    a = ap.parse_args(argv)
    if a.tokens <= 0 or a.tokens % TOKEN_QUANTUM:
        ap.error(f"--tokens {a.tokens}: must be a positive multiple of {TOKEN_QUANTUM}")
    try:
        formats = [fx.FORMATS[f.strip().lower()] for f in a.formats.split(",")] if a.formats else None
        ios = [DType[d.strip().upper()] for d in a.io.split(",")] if a.io else None
    except KeyError as e:
        ap.error(f"unknown format or dtype {e}")
    res = run(a.provider, a.tokens, formats=formats, ios=ios)
    print(f"device {res['device']}; copy roofline {res['roofline_gbs']:.1f} GB/s ({res['roofline_method']}; "
          + ", ".join(f"{k} {v:.0f}" for k, v in res["roofline_methods_gbs"].items()) + ")")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if any(r["mismatches"] for r in res["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
