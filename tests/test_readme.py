r"""Every Python example in README.md runs as written."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), '..', 'README.md')


def _blocks():
    text = open(README).read()
    return re.findall(r'```python\n(.*?)```', text, flags=re.S)


@pytest.mark.parametrize('index', range(len(_blocks())))
def test_readme_python_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _blocks()[index]
    exec(compile(code, f'README.md[python block {index}]', 'exec'), {'__name__': '__readme__'})
