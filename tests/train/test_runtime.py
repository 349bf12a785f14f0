import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_mz.train import Trainer, load_checkpoint, resolve_device, seed_everything

from tests.train._common import H, HERE, ROOT, config, params, strip_times, assert_same_params


@pytest.mark.skipif(not (torch.distributed.is_available()
                         and torch.distributed.is_gloo_available()), reason='needs gloo')
def test_ddp_two_processes_on_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get('PYTHONPATH'))
                                          if p))
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(key, None)
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           str(HERE / '_ddp_worker.py'), str(tmp_path)]
    # own session, so that on a timeout the launcher and both ranks are killed together
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=H.WORKER_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f'torchrun did not finish in time:\n{output[-6000:]}')
    assert proc.returncode == 0, output[-6000:]

    r0 = torch.load(tmp_path / 'rank0.pt', weights_only=True)
    r1 = torch.load(tmp_path / 'rank1.pt', weights_only=True)
    assert (r0['world_size'], r1['world_size'], r0['backend']) == (2, 2, 'gloo')
    assert_same_params(r0['params'], r1['params'])  # ranks agree bit for bit
    assert r0['metrics'] == r1['metrics']  # all-reduced: every rank reports the global value
    assert strip_times(r0['history']) == strip_times(r1['history'])

    # rank 0 wrote the logs and checkpoints; best.pt holds the final (restored) weights
    run = tmp_path / 'run'
    assert len((run / 'metrics.jsonl').read_text().splitlines()) == H.DDP_EPOCHS
    assert_same_params(load_checkpoint(run / 'best.pt')['model'], r0['params'])

    # the all-reduced metric over 2 shards equals the metric over the whole val set in 1 process
    train_ds, val_ds = H.ddp_data()
    single = Trainer(H.ToyDeepSets(3, 2), config())
    single.load_weights(run / 'best.pt')
    whole = single.evaluate(val_ds)
    assert whole == pytest.approx(r0['metrics'], rel=1e-5)

    # 2 ranks x batch b == 1 process x batch 2b: same samples per step, averaged gradients
    seed_everything(0)
    reference = Trainer(H.ToyDeepSets(3, 2),
                        config(epochs=H.DDP_EPOCHS, batch_size=2 * H.DDP_BATCH_PER_RANK))
    ref_result = reference.fit(train_ds, val_ds)
    for k, v in params(reference.model).items():
        assert torch.allclose(v, r0['params'][k], atol=1e-5), k
    assert [r['val_loss'] for r in ref_result.history] == pytest.approx(
        [r['val_loss'] for r in r0['history']], rel=1e-4)


def test_seed_everything_reproduces_all_generators():
    import random

    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    seed_everything(7)
    first = draw()
    seed_everything(7)
    assert draw() == first
    seed_everything(8)
    assert draw()[0] != first[0]


def test_resolve_device():
    expected = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert resolve_device('auto').type == expected
    assert resolve_device('cpu') == torch.device('cpu')
    with pytest.raises(ValueError, match='device'):
        resolve_device('not-a-device')
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match='CUDA is not available'):
            resolve_device('cuda')


def test_a_cuda_index_past_the_machines_devices_is_refused(monkeypatch):
    # cuda:1 on a machine with one GPU was accepted, and failed at the first move to it
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    assert resolve_device('cuda:1') == torch.device('cuda', 1)
    assert resolve_device('cuda') == torch.device('cuda')
    with pytest.raises(ValueError, match=r"Device 'cuda:2' was requested but this machine has 2 "
                                         r"CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device('cuda:2')
    with pytest.raises(ValueError, match="'cuda:2' was requested"):
        resolve_device(torch.device('cuda', 2))


def test_a_deterministic_run_leaves_the_settings_as_they_were(tmp_path):
    # deterministic=True turned PyTorch's deterministic algorithms on for the rest of the
    # process; now only while fit runs (and a user's own setting is kept)
    import torch

    from torch_mz.train import train
    from tests.train._common import H, REG_TRAIN, config
    seen = []
    model = H.ToyDeepSets(3, 2)
    model.register_forward_pre_hook(
        lambda *a: seen.append(torch.are_deterministic_algorithms_enabled()))
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    train(model, REG_TRAIN[:32], config=config(epochs=1, deterministic=True))
    assert seen and all(seen)  # on while training
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.backends.cudnn.benchmark) == before
    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own
    try:
        train(H.ToyDeepSets(3, 2), REG_TRAIN[:32], config=config(epochs=1, deterministic=True))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_seeds_out_of_range_get_streams_of_their_own_in_python_and_numpy():
    # Python's random.seed(-s) is random.seed(s), and NumPy's legacy seed kept 32 bits (s and
    # s + 2**32 shared a stream); seeds in [0, 2**32) seed as they did (and as
    # torch_geometric.seed_everything does)
    import random

    def draw():
        return random.random(), float(np.random.rand())

    seed_everything(5)
    five = draw()
    random.seed(5)
    np.random.seed(5)
    assert draw() == five  # unchanged in range
    seed_everything(-5)
    minus = draw()
    seed_everything(5 + 2 ** 32)
    wide = draw()
    assert minus[0] != five[0] and minus[1] != five[1]
    assert wide[1] != five[1] and wide[0] != five[0]
    seed_everything(-5)
    assert draw() == minus  # reproducible


def test_training_exceptions_survive_pickling():
    # a process pool sends a worker's exception back pickled: these two could not be rebuilt
    # (TypeError: missing 'loss'), so a run that diverged in a pool broke the pool or hung
    import pickle
    from torch_mz.train import TrainingDiverged, TrainingStopped
    for exc in (TrainingDiverged(3, float('nan'), 'validation'), TrainingDiverged(2, 1.5),
                TrainingStopped(4, '/tmp/run/checkpoint.pt')):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert {k: v for k, v in vars(back).items() if k != 'loss' and k != 'train_loss'} == \
            {k: v for k, v in vars(exc).items() if k != 'loss' and k != 'train_loss'}
