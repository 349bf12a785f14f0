r"""What the tests of :mod:`torch_mz.reproduce` share: a tiny budget, claims on the sum and max
tasks, a counter of trained runs, and a child process that runs a reproduction while this one
holds a run's lock."""
from contextlib import contextmanager

import torch_mz.study.grid as grid
from torch_mz.reproduce import Budget, Claim, Comparison

TINY = Budget('tiny', 16, 8, 8, (16, 8, 8), 2, 1, None, 1, 8,
              ((1e-3, 1e-5), (3e-4, 1e-5), (1e-3, 1e-3)))
SUM = dict(label='sum d=2', task='sum', kwargs=dict(d=2, reduce='sum'))
CLAIM = Claim('tiny', 'tiny', (SUM, dict(label='sum d=3', task='sum',
                                         kwargs=dict(d=3, reduce='sum'))),
              ('deepsets:hidden_channels=8', 'mean-mlp:hidden_channels=8'),
              (Comparison('tiny', 'sum d=3', 'deepsets:hidden_channels=8',
                          ('mean-mlp:hidden_channels=8', ), 0.1, 'Table 0', 'made up'), ))


def _counting(monkeypatch):
    calls = []
    real = grid.train_one

    def counted(task, name, seed, config, **overrides):
        calls.append((task.name, task.in_channels, name, seed, config.lr, config.weight_decay))
        return real(task, name, seed, config, **overrides)
    monkeypatch.setattr(grid, 'train_one', counted)
    return calls


def _start_child(code, out):
    r"""``python -c code out`` in the repository root (so that it imports these tests), one
    thread, stdout and stderr together as text, without warnings (the tiny budget's runs are all
    warm-up, which the trainer warns of: the tests read the child's lines)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore',
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get('PYTHONPATH', '')]))
    return subprocess.Popen([sys.executable, '-c', code, out], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextmanager
def _child_while_held(repro, held, code, out):
    r"""Holds the lock of run :obj:`held` (as another worker training it would) and starts the
    child ``python -c code out`` under it; the child is killed if the block fails."""
    with repro.store.lock(*held) as mine:
        assert mine
        proc = _start_child(code, out)
        try:
            yield proc
        except BaseException:
            proc.kill()
            raise


MAX = dict(label='max d=2', task='max', kwargs=dict(d=2))
CLAIM2 = Claim('tiny2', 'tiny2', (MAX, ), CLAIM.models,
               (Comparison('tiny2', 'max d=2', 'deepsets:hidden_channels=8',
                           ('mean-mlp:hidden_channels=8', ), 0.1, 'Table 0', 'made up'), ))
