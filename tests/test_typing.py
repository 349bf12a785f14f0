import os
import subprocess
import sys

import pytest

import torch_mz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_package_is_marked_typed():
    # PEP 561: the marker tells type checkers to use torch_mz's own annotations
    assert os.path.isfile(os.path.join(os.path.dirname(torch_mz.__file__), 'py.typed'))


def test_mypy_is_clean():
    pytest.importorskip('mypy')
    # setup.cfg's [mypy] sections configure it; its incremental cache (.mypy_cache) makes a rerun
    # take seconds instead of about 20
    proc = subprocess.run([sys.executable, '-m', 'mypy', 'torch_mz'], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
