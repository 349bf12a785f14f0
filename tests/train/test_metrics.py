
import numpy as np
import pytest
import torch

from torch_mz.train import Trainer
from torch_mz.train.metrics import r2_from_sums

from tests.train._common import H, REG_TRAIN, REG_VAL, config, targets


def np_r2(p: np.ndarray, y: np.ndarray) -> float:
    r"""R² per column, averaged uniformly (scikit-learn's default), independently of torch_mz."""
    p, y = p.reshape(len(y), -1), y.reshape(len(y), -1)
    return float(np.mean(1 - ((y - p) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)))


def test_r2_from_sums():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(40, 3)) * [1.0, 10.0, 0.5]
    p = y + rng.normal(size=(40, 3))

    def r2(p, y):
        return r2_from_sums(torch.from_numpy(((y - p) ** 2).sum(0)),
                            torch.from_numpy(((y - y.mean(0)) ** 2).sum(0))).item()
    assert r2(p, y) == pytest.approx(np_r2(p, y))  # uniform average over columns
    assert r2(y, y) == 1.0  # perfect prediction
    assert r2(np.broadcast_to(y.mean(0), y.shape), y) == pytest.approx(0.0, abs=1e-12)
    const = np.full((5, 1), 2.0)  # a constant column: 1 if predicted exactly, else 0
    assert r2(const, const) == 1.0 and r2(const + 1, const) == 0.0


def test_evaluate_matches_metrics_on_predictions():
    trainer = Trainer(H.ToyDeepSets(3, 2), config(epochs=2, eval_batch_size=7))
    trainer.fit(REG_TRAIN, REG_VAL)
    metrics = trainer.evaluate(REG_VAL)
    pred, y = trainer.predict(REG_VAL), targets(REG_VAL)
    assert pred.shape == y.shape
    # metrics are in original units: compare with numpy on the de-normalised output
    p, t = pred.double().numpy(), y.double().numpy()
    assert metrics['mse'] == pytest.approx(np.mean((p - t) ** 2), rel=1e-6)
    assert metrics['mae'] == pytest.approx(np.mean(np.abs(p - t)), rel=1e-6)
    assert metrics['r2'] == pytest.approx(np_r2(p, t), rel=1e-6, abs=1e-9)
    # the loss is the MSE in normalised units
    z = trainer.normalizer.transform(y.double())
    zp = trainer.normalizer.transform(pred.double())
    assert metrics['loss'] == pytest.approx((zp - z).pow(2).mean().item(), rel=1e-5)
    assert metrics['mse'] > 10 * metrics['loss']  # targets have std ~ 10: units do differ
