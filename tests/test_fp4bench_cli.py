"""The FP4 bandwidth bench's command line (kvx_conformance/bench/fp4bench.py): its selection
options are checked before any GPU work, so a bad name fails in one line on any machine."""
from __future__ import annotations

import pytest

from kvx_conformance.bench import fp4bench


def test_unknown_format_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        fp4bench.main(["lib.so", "--formats", "mxfp4_ocp,nvfp5"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "unknown format or dtype 'nvfp5'" in err, err


def test_unknown_io_dtype_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        fp4bench.main(["lib.so", "--io", "f16,int8"])
    assert e.value.code == 2
    assert "unknown format or dtype 'INT8'" in capsys.readouterr().err


def test_help_names_every_format(capsys):
    with pytest.raises(SystemExit) as e:
        fp4bench.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "nvfp4, mxfp4, mxfp4_ocp" in out and "--io LIST" in out, out


@pytest.mark.parametrize("tokens", ["3000", "0", "-2048"])
def test_token_count_that_cannot_fill_whole_blocks_is_a_usage_error(capsys, tokens):
    with pytest.raises(SystemExit) as e:
        fp4bench.main(["lib.so", "--tokens", tokens])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert f"--tokens {tokens}: must be a positive multiple of {fp4bench.TOKEN_QUANTUM}" in err, err
