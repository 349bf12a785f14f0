r"""Table 30's claim: parameter and time ratios read from the operator benchmarks."""
import json
import math
import os
from typing import Any, Dict, List, Optional

from torch_mz.paper import TABLE30
from torch_mz.study.statistics import std_or_nan
from torch_mz.reproduce.verdict import verdict


def _pairs(a: List[Any], b: List[Any], what: str, names: str) -> List[Any]:
    r"""The samples of two rows side by side; rows with different counts are an error (a zip
    would drop the longer row's last samples without a word)."""
    if len(a) != len(b):
        raise ValueError(f"the {names} rows have {len(a)} and {len(b)} '{what}' samples: the "
                         f"ratios need one of each per sample")
    return list(zip(a, b))


def overhead_records(path: str, budget: str) -> List[Dict[str, object]]:
    r"""Table 30's claims (parameter, training-step and inference ratios ``mz`` / ``rigid``)
    from the operator benchmark's JSON (``benchmarks/training_step.py``), compared with the
    paper's Small configuration (d = 64, n = 30; the benchmark's sets are larger, see its
    file). The rows with kept freed memory (``mz+keep`` / ``rigid+keep``, how ``torch-mz`` and
    this reproduction train) are used where the file has them, the plain rows otherwise. The
    ratio is of the medians; its spread is over the calls, paired in order, or, for a run in
    rounds (``training_step.py --rounds``), over the ratios within each round, the independent
    samples there. Each record's command is the one the file records (its
    ``environment.command``), then ``reproduce.py --claims table30``. A missing file gives
    inconclusive records that say how to make it."""
    small = TABLE30['Small (d=64, n=30)']
    wanted = (('params', small[0], 'params', None), ('training step', small[2], 'step_times_s',
                                                     'step_s'),
              ('inference', small[1], 'infer_times_s', 'infer_s'))
    rows: Dict[str, Dict[str, Any]] = {}
    # the command that wrote the file (its own record), else the benchmark's plain one
    made_by = 'python benchmarks/training_step.py'
    if os.path.exists(path):
        try:
            with open(path) as f:
                results = json.load(f)
        except ValueError as e:  # (json's JSONDecodeError, and UnicodeDecodeError)
            raise ValueError(f"the operator benchmark's results '{path}' are not valid JSON "
                             f"({e}): restore the file (e.g. with git) or write it again with "
                             f"{made_by}") from e
        if not (isinstance(results, dict) and isinstance(results.get('rows', []), list)
                and all(isinstance(r, dict) and isinstance(r.get('model'), str)
                        for r in results.get('rows', []))
                and isinstance(results.get('environment') or {}, dict)):
            raise ValueError(f"the operator benchmark's results '{path}' are not a JSON object "
                             f"with a list of 'rows' naming their 'model' (and an "
                             f"'environment' object): restore the file (e.g. with git) or "
                             f"write it again with {made_by}")
        rows = {r['model']: r for r in results.get('rows', [])}
        recorded = (results.get('environment') or {}).get('command')
        if isinstance(recorded, str) and recorded.strip():
            made_by = recorded.strip()
    out: List[Dict[str, object]] = []
    for what, paper, samples, median in wanted:
        n: Optional[int]
        mean, spread, n = math.nan, math.nan, 0
        suffix = '+keep' if 'mz+keep' in rows and 'rigid+keep' in rows else ''
        if 'mz' + suffix in rows and 'rigid' + suffix in rows:
            mz, rigid = rows['mz' + suffix], rows['rigid' + suffix]
            try:  # (a row without a figure, or not a number: named, not a KeyError)
                if median is None:
                    mean, spread, n = mz[samples] / rigid[samples], 0.0, None
                else:
                    rounds = median + '_rounds'  # a run in rounds: the rounds are the samples
                    names = f"'mz{suffix}' and 'rigid{suffix}'"
                    if rounds in mz and rounds in rigid:
                        ratios = [a / b for a, b in _pairs(mz[rounds], rigid[rounds], rounds,
                                                           names)
                                  if a is not None and b is not None]
                    else:
                        ratios = [a / b for a, b in _pairs(mz[samples], rigid[samples], samples,
                                                           names)]
                    mean, spread = mz[median] / rigid[median], std_or_nan(ratios, ddof=1)
                    n = len(ratios)
            except (KeyError, TypeError, ZeroDivisionError) as e:
                raise ValueError(
                    f"the operator benchmark's results '{path}' have no usable "
                    f"'{what}' figures in rows 'mz{suffix}' and 'rigid{suffix}' "
                    f"({type(e).__name__}: {e}): restore the file (e.g. with git) or "
                    f"write it again with {made_by}") from e
        out.append(dict(
            claim=f'table30 {what}: mz / rigid', budget=budget,
            paper=dict(value=paper, source='Table 30',
                       text='Small (d=64, n=30): params 1.9x, inference 2.4x, training 2.2x; '
                            'Medium/Large: training 3.8x/5.5x, inference 2.5x/2.7x (RTX 5090, '
                            'batch 64)'),
            ours=dict(mean=mean, std=spread, seeds=n, source=(
                f"{os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))}"
                f", rows mz{suffix} / rigid{suffix}" if rows else
                f'{path} missing: run python benchmarks/training_step.py')),
            n_train=None, epochs_run=None, seeds=n,
            verdict=verdict(paper - 1, mean - 1, spread, n) if rows else 'inconclusive',
            command=f'{made_by} && python benchmarks/reproduce.py '
                    f'--budget {budget} --claims table30'))
    return out
