r"""Running the scripts of ``benchmarks/`` from the tests: loaded as modules, or run as
``__main__`` with an argument list (the scripts are not a package)."""
import importlib.util
import runpy
import shlex
import sys
from pathlib import Path
from typing import List

BENCHMARKS = Path(__file__).resolve().parents[1] / 'benchmarks'


def load_script(name: str):
    r"""``benchmarks/<name>.py`` as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(f'_benchmark_{name}', BENCHMARKS / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded_argv(command: str, name: str, out) -> List[str]:
    r"""The arguments of :obj:`command`, the command line a committed report of
    ``benchmarks/<name>.py`` records (a note after it, set off by two spaces and a bracket, left
    out), with :obj:`out` as its ``--out``: that command run again into another folder."""
    words = shlex.split(command.split('  (')[0])
    start = next(i for i, word in enumerate(words) if word.endswith(f'benchmarks/{name}.py'))
    argv = words[start + 1:]
    if '--out' in argv:
        del argv[argv.index('--out'):argv.index('--out') + 2]
    return argv + ['--out', str(out)]


def run_main(name: str, argv):
    r"""Runs ``benchmarks/<name>.py`` as ``__main__`` with :obj:`argv` (``sys.argv`` restored
    after); its ``SystemExit`` (but that of status 0 of ``sys.exit(main())``) and errors
    propagate."""
    path = str(BENCHMARKS / f'{name}.py')
    saved = sys.argv
    sys.argv = [path] + list(argv)
    try:
        runpy.run_path(path, run_name='__main__')
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv = saved


def run_script(name: str, argv, monkeypatch) -> int:
    r"""Runs ``benchmarks/<name>.py`` as ``__main__`` with :obj:`argv`; its exit status (0 when
    it returns, or exits with ``sys.exit(None)``)."""
    path = str(BENCHMARKS / f'{name}.py')
    monkeypatch.setattr(sys, 'argv', [path] + list(argv))
    try:
        runpy.run_path(path, run_name='__main__')
    except SystemExit as e:
        return 0 if e.code is None else e.code
    return 0


def usage_error(name: str, argv, monkeypatch, capsys, *needles) -> str:
    r"""Asserts that :obj:`argv` is a usage error of script :obj:`name` (argparse's exit status
    2 and usage line) whose message holds each of :obj:`needles`; returns the message."""
    code = run_script(name, argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2, err
    assert 'usage:' in err
    for needle in needles:
        assert needle in err, err
    return err


def without_matplotlib(monkeypatch) -> None:
    r"""Within the test, every import of matplotlib fails, as where it is not installed (the
    ``plot`` extra): a script's own ``import matplotlib`` and ``torch_mz``'s
    :func:`~torch_mz.study.pyplot` alike."""
    import builtins
    import importlib
    real_import, real_module = builtins.__import__, importlib.import_module

    def refuse(name):
        if name.split('.')[0] == 'matplotlib':
            raise ImportError(f"No module named '{name}'")

    def import_(name, *args, **kwargs):
        refuse(name)
        return real_import(name, *args, **kwargs)

    def import_module(name, package=None):
        refuse(name)
        return real_module(name, package)
    monkeypatch.setattr(builtins, '__import__', import_)
    monkeypatch.setattr(importlib, 'import_module', import_module)
