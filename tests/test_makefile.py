r"""The ``Makefile`` of the checkout (its entry points ``make demo`` and ``make test`` are run
by hand, not here)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


@pytest.mark.skipif(shutil.which('make') is None, reason='needs make')
def test_make_clean_removes_the_build_and_dist_folders(tmp_path):
    # setuptools reuses build/lib: a wheel built again from a checkout that `make clean` had
    # cleaned shipped the modules deleted since (build/ and dist/ were left)
    shutil.copy(os.path.join(ROOT, 'Makefile'), tmp_path / 'Makefile')
    made = ['build/lib/torch_mz/deleted_since.py', 'dist/torch_mz-0.1-py3-none-any.whl',
            '.venv/bin/python', 'torch_mz.egg-info/PKG-INFO', '.pytest_cache/README.md']
    for name in made:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('')
    (tmp_path / 'setup.cfg').write_text('')  # (kept: a file of the checkout)
    done = subprocess.run(['make', '-C', str(tmp_path), 'clean'], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path)) == ['Makefile', 'setup.cfg']
