r"""The report: finished claims on disk and the tables of ``summary.md``."""
import json
import math
import os
from typing import Any, Dict, List, Mapping, Sequence

from torch_mz._files import atomic_write
from torch_mz.reproduce.claims import CLAIM_NAMES


def claim_path(out: str, claim: str, budget: str) -> str:
    r"""Where a finished claim's records are kept."""
    return os.path.join(out, 'claims', f'{claim}.{budget}.json')


def save_claim(out: str, claim: str, budget: str, records: Sequence[Mapping]) -> str:
    path = claim_path(out, claim, budget)
    text = json.dumps(list(records), indent=1) + '\n'
    atomic_write(path, lambda f: f.write(text), binary=False)
    return path


def load_claims(out: str) -> List[Dict[str, object]]:
    r"""Every claim record kept under :obj:`out`, in :data:`CLAIM_NAMES` order, then by
    budget."""
    folder = os.path.join(out, 'claims')
    if not os.path.isdir(folder):
        return []
    order = {n: i for i, n in enumerate(CLAIM_NAMES)}
    names = sorted(os.listdir(folder), key=lambda n: (order.get(n.split('.')[0], 99), n))
    records: List[Dict[str, object]] = []
    for name in names:
        if name.endswith('.json'):
            path = os.path.join(folder, name)
            try:
                with open(path) as f:
                    got = json.load(f)
            except ValueError as e:
                raise ValueError(f"claim file '{path}' is not valid JSON ({e}); restore it "
                                 f"(e.g. with git) or delete it to rebuild the claim") from e
            if not (isinstance(got, list) and all(isinstance(r, dict) for r in got)):
                raise ValueError(f"claim file '{path}' does not hold a list of claim records; "
                                 f"restore it (e.g. with git) or delete it to rebuild the claim")
            records += got
    return records


def summary_table(records: Sequence[Mapping[str, Any]]) -> str:
    r"""The summary as a Markdown table (one row per claim record)."""
    def num(v, signed=True):
        return 'n/a' if v is None or not math.isfinite(v) else (f'{v:+.3f}' if signed
                                                                   else f'{v:.3f}')
    lines = ['| claim | paper | ours (mean ± std) | verdict | budget | n_train | epochs run | '
             'seeds |', '|---|---|---|---|---|---|---|---|']
    for r in records:
        ours, ep = r['ours'], r.get('epochs_run')
        epochs = (f"{ep['min']}-{ep['max']} ({ep['stopped_early']}/{ep['runs']} stopped early"
                  + (f", {ep['diverged']} diverged" if ep.get('diverged') else '') + ')'
                  if ep else '')
        lines.append(f"| {r['claim']} | {num(r['paper']['value'])} ({r['paper']['source']}) | "
                     f"{num(ours['mean'])} ± {num(ours['std'], False)} | **{r['verdict']}** | "
                     f"{r['budget']} | {r.get('n_train') or ''} | {epochs} | "
                     f"{r.get('seeds') or ''} |")
    return '\n'.join(lines) + '\n'


def models_table(records: Sequence[Mapping[str, Any]]) -> str:
    r"""Test R² of every model in every cell behind the records (mean ± std over seeds), one
    line per cell (several claims read the same cell, e.g. the uncertainty comparisons of D.3)."""
    lines: List[str] = []
    for r in records:
        models = r['ours'].get('models')
        if not models:
            continue
        cells = ', '.join(f"{m} {v['r2']:.3f} ± {v['r2_std']:.3f}" for m, v in models.items())
        line = (f"- {r['claim'].split(':')[0]} ({r['budget']}): {cells}; paper: "
                f"{r['paper']['text']}")
        if line not in lines:
            lines.append(line)
    return '\n'.join(lines) + '\n'
