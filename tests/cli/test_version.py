"""`gemmrl --version` prints the package's version and exits 0."""

import pytest

import gemmrl
from gemmrl.cli.main import main


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"gemmrl {gemmrl.__version__}"
