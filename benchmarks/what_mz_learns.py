r"""What the matrix zonotope learns (Section 5.4 and Appendix D.1 / Figure 4 of the MZAttn paper).

MZ-Set Transformers (preset ``mz``: 2 ISAB + PMA + 1 SAB, six ``value='mz'`` attention layers)
with L matrix generators per layer are trained on the quadratic-TDOF target of TDOF 8 (d = 16)
and probed with :func:`torch_mz.analysis.probe` on held-out test sets: gate activity, cosine
similarity of the generators in operator space, generator norms and the soft effective rank of
the operator variation {M(mu_i) - mean M}. Each model is also probed at initialisation (same
seed, same probe sets) as a control for what training changed.

    python benchmarks/what_mz_learns.py --quick      # L in {4, 8, 16}, 1 seed, small budget
    python benchmarks/what_mz_learns.py              # L in {4, 8, 16, 32}, 3 seeds, paper budget

A run whose training diverges is recorded as diverged (its initialisation is still probed) and
left out of the trained figures, as the other studies leave such runs out of their means; an L
whose every seed diverged has no trained figures, and no verdict rests on it.

Every finished run (its probes at initialisation and after training, or its divergence) is
kept as one file in ``<out>/runs`` (:class:`~torch_mz.study.RunStore`): the same command with
``--resume`` trains only the runs an interrupted call had not finished; without ``--resume`` a
folder that holds runs is refused, and ``--overwrite`` removes them and trains every run again.
Ctrl-C ends a run with one line that gives the command to go on (status 130).
"""
import argparse
import math
import os
import sys
import time
import warnings

import numpy as np
import torch
from torch_geometric.loader import DataLoader

from torch_mz import analysis
from torch_mz.models import build_model
from torch_mz.study import (EXIT_INTERRUPTED, RunStore, environment, int_list, interruptible,
                            markdown_table, nonnegative_float, positive_int, pyplot,
                            replace_plot, write_report)
from torch_mz.study.plots import save_figure
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument,
                                   choose_budget, study_config)
from torch_mz.tasks import load_task
from torch_mz.train import TrainingDiverged, seed_everything, train
from torch_mz.study.report import check_out_folder

# Section 5.4 / Appendix D.1 of the paper (Figure 4): the one number it gives, and its claims.
PAPER_GATE_ACTIVITY_L8 = 0.786
PAPER_CLAIMS = ('near-orthogonal generators in operator space, comparably sized',
                'gates active on 78.6% of evaluations (L = 8, threshold not stated)',
                'soft effective rank of {M(mu_i) - mean M} saturates L when L <= TDOF and grows '
                'sublinearly above')
# Criteria this script uses to turn the measurements into the verdicts of the Markdown.
NEAR_ORTHOGONAL = 0.1  # mean |off-diagonal cosine| below this counts as near-orthogonal
SATURATED = 0.9  # effective rank / L at or above this counts as saturating the budget
STRONG_GATE = 0.5  # a second gate threshold, reported next to the main one
BEYOND_TDOF = 1.25  # effective rank above this many TDOF at L > TDOF counts as 'beyond the TDOF'
QUICK_L, FULL_L = [4, 8, 16], [4, 8, 16, 32]
QUICK = Budget(seeds=1, n_train=640, epochs=10, lr=1e-3)
FULL = Budget(seeds=3, n_train=5000, epochs=100, lr=1e-4)


@torch.no_grad()
def layer_record(attn, entry: dict, mu: torch.Tensor, threshold: float) -> dict:
    r"""Scalar summary of one layer's :func:`~torch_mz.analysis.probe` entry (plus the gates'
    magnitude on the same summaries :obj:`mu`)."""
    L = entry['num_matrix_generators']
    cos = torch.tensor(entry['generator_cosine'])
    off = cos[~torch.eye(L, dtype=torch.bool)].abs() if L > 1 else torch.zeros(1)
    norms = torch.tensor(entry['generator_norms'])
    gamma = analysis.gates(attn, mu).abs()  # (n, L)
    dim = attn.matrix_gens[:, 0].numel()  # H * dk^2: dimension of operator space
    return dict(
        L=L,
        gate_activity=entry['gate_activity'],
        gate_activity_strong=float((gamma > STRONG_GATE).double().mean()),
        mean_abs_gate=float(gamma.double().mean()),
        min_gate_activity_per_generator=float((gamma > threshold).double().mean(0).min()),
        # the threshold at which this layer's gate activity would equal the paper's 78.6%
        threshold_for_paper_activity=float(torch.quantile(gamma.double().flatten(),
                                                          1.0 - PAPER_GATE_ACTIVITY_L8)),
        mean_abs_offdiag_cos=float(off.mean()),
        max_abs_offdiag_cos=float(off.max()),
        chance_abs_cos=math.sqrt(2.0 / (math.pi * dim)),  # E|cos| of random directions
        mean_generator_norm=float(norms.mean()),
        generator_norm_spread=float(norms.max() / norms.min().clamp(min=1e-12)),
        generator_norm_over_center=float(norms.mean() / attn.weight.norm()),
        effective_rank=entry['operator_effective_rank'],
        effective_rank_over_L=entry['operator_effective_rank'] / L,
    )


def probe_model(model, loader, threshold: float) -> dict:
    r"""Per-layer summaries of :obj:`model` on the sets of :obj:`loader`."""
    model = model.cpu()
    probed = analysis.probe(model, loader, threshold=threshold)
    summaries = analysis.collect_summaries(model, loader)
    modules = dict(model.named_modules())
    return {name: dict(layer_record(modules[name], entry, summaries[name], threshold),
                       generator_cosine=entry['generator_cosine'],
                       generator_norms=entry['generator_norms'], num_sets=entry['num_sets'])
            for name, entry in probed.items()}


KEYS = ('gate_activity', 'gate_activity_strong', 'mean_abs_gate',
        'min_gate_activity_per_generator', 'threshold_for_paper_activity', 'mean_abs_offdiag_cos',
        'max_abs_offdiag_cos', 'mean_generator_norm', 'generator_norm_spread',
        'generator_norm_over_center', 'effective_rank', 'effective_rank_over_L')


def aggregate(runs, L: int, state: str) -> dict:
    r"""Mean over layers, then mean and std over seeds, of each quantity for (L, state); runs
    that diverged are left out (counted in ``diverged``; NaN figures where every seed did)."""
    every = [r for r in runs if r['L'] == L and r['state'] == state]
    picked = [r for r in every if 'diverged' not in r]
    row = dict(L=L, state=state, seeds=len(picked), diverged=len(every) - len(picked))
    r2 = [r['test_r2'] for r in picked if r['test_r2'] is not None]
    row['test r2'] = float(np.mean(r2)) if r2 else None
    row['test r2 std'] = float(np.std(r2)) if r2 else None
    for key in KEYS:
        per_seed = [np.mean([layer[key] for layer in r['layers'].values()]) for r in picked]
        row[key] = float(np.mean(per_seed)) if per_seed else math.nan
        row[key + ' std'] = float(np.std(per_seed)) if per_seed else math.nan
    probed = next(r for r in runs if r['L'] == L and 'diverged' not in r)  # (init: always)
    row['chance_abs_cos'] = next(iter(probed['layers'].values()))['chance_abs_cos']
    return row


def per_layer_rows(runs, L: int, state: str):
    r"""Mean over seeds of each quantity, one row per layer (none where every seed of
    :obj:`L` diverged)."""
    picked = [r for r in runs if r['L'] == L and r['state'] == state and 'diverged' not in r]
    if not picked:
        return []
    rows = []
    for name in picked[0]['layers']:
        row = dict(L=L, layer=name.replace('body.', '').replace('.attn', ''))
        for key in ('gate_activity', 'mean_abs_offdiag_cos', 'mean_generator_norm',
                    'effective_rank', 'effective_rank_over_L'):
            row[key] = float(np.mean([r['layers'][name][key] for r in picked]))
        rows.append(row)
    return rows


def _also_at_init(holds_trained: bool, holds_init: bool) -> str:
    if holds_trained and holds_init:
        return ('; **it holds equally at initialisation** (control), so it is not evidence of '
                'something training produced')
    if holds_trained:
        return '; it does not hold at initialisation, so training produced it'
    return ''


def verdicts(rows, tdof: int, threshold: float):
    r"""Plain statements of agreement with the paper's three claims, from the aggregated rows,
    each checked on the untrained control too (an L whose every seed diverged is left out)."""
    trained = {r['L']: r for r in rows if r['state'] == 'trained' and r['seeds']}
    # the control on the same Ls (an L left out above counted against 'holds at init')
    init = {r['L']: r for r in rows if r['state'] == 'init' and r['L'] in trained}
    if not trained:
        return ['No verdict: every run diverged.']
    out = []

    def ortho(side):
        return all(r['mean_abs_offdiag_cos'] < NEAR_ORTHOGONAL for r in side.values())
    changed = ', '.join(f"L={L}: {init[L]['mean_abs_offdiag_cos']:.3f} -> "
                        f"{r['mean_abs_offdiag_cos']:.3f}" for L, r in trained.items())
    out.append(f"**Near-orthogonal generators: {'agrees' if ortho(trained) else 'disagrees'}** "
               f"(criterion: mean |off-diagonal cosine| < {NEAR_ORTHOGONAL} for every L; init -> "
               f"trained, mean over layers: {changed}; two random directions in operator space "
               f"give about {rows[0]['chance_abs_cos']:.3f})"
               f"{_also_at_init(ortho(trained), ortho(init))}.")
    out.append('Comparably sized generators: max / min generator norm per layer (mean over '
               'layers), init -> trained: ' + ', '.join(
                   f"L={L}: {init[L]['generator_norm_spread']:.2f} -> "
                   f"{r['generator_norm_spread']:.2f}" for L, r in trained.items()) +
               '; mean generator norm, init -> trained: ' + ', '.join(
                   f"L={L}: {init[L]['mean_generator_norm']:.3f} -> "
                   f"{r['mean_generator_norm']:.3f}" for L, r in trained.items()) + '.')
    if 8 in trained:
        g, g0 = trained[8]['gate_activity'], init[8]['gate_activity']
        close = abs(g - PAPER_GATE_ACTIVITY_L8) <= 0.1
        out.append(f"**Gate activity at L=8: {'agrees' if close else 'disagrees'}** with the "
                   f"paper's {PAPER_GATE_ACTIVITY_L8:.1%} (criterion: within 10 points; measured "
                   f"{g:.1%} with |gamma| > {threshold} and "
                   f"{trained[8]['gate_activity_strong']:.1%} with |gamma| > {STRONG_GATE}; at "
                   f"initialisation {g0:.1%} and {init[8]['gate_activity_strong']:.1%}). The "
                   f"paper does not state its threshold: the measured activity equals "
                   f"{PAPER_GATE_ACTIVITY_L8:.1%} at a threshold of "
                   f"{trained[8]['threshold_for_paper_activity']:.2f} (mean over layers), so the "
                   f"comparison hinges on that choice. Dead generators: the least active "
                   f"generator of a layer is active on "
                   f"{trained[8]['min_gate_activity_per_generator']:.1%} of sets (mean over "
                   f"layers; |gamma| > {threshold}).")
    low = [L for L in trained if L <= tdof]
    high = sorted(L for L in trained if L > tdof)

    def saturates(side):
        return all(side[L]['effective_rank_over_L'] >= SATURATED for L in low)
    if low:
        out.append(f"**Effective rank saturates L for L <= TDOF: "
                   f"{'agrees' if saturates(trained) else 'disagrees'}** (criterion: rank / L >= "
                   f"{SATURATED}; trained " + ', '.join(
                       f"L={L}: {trained[L]['effective_rank']:.2f} = "
                       f"{trained[L]['effective_rank_over_L']:.2f} L (init "
                       f"{init[L]['effective_rank_over_L']:.2f} L)" for L in low) + ')' +
                   _also_at_init(saturates(trained), saturates(init)) + '.')

    def sublinear(side):
        ref = max(low)
        Ls = [ref] + high
        ranks = [side[L]['effective_rank'] for L in Ls]
        slopes = [(ranks[i + 1] - ranks[i]) / (Ls[i + 1] - Ls[i]) for i in range(len(high))]
        ok = all(0.0 < s < 1.0 for s in slopes) and all(
            side[L]['effective_rank_over_L'] < side[ref]['effective_rank_over_L'] for L in high)
        return ok, ', '.join(f'{Ls[i]}->{Ls[i + 1]}: {s:.2f}' for i, s in enumerate(slopes))
    if high and low:
        sub, slopes = sublinear(trained)
        sub0, slopes0 = sublinear(init)
        out.append(f"**Effective rank grows sublinearly for L > TDOF: "
                   f"{'agrees' if sub else 'disagrees'}** (criterion: it still grows, with slope "
                   f"d(rank)/dL in (0, 1), and rank / L falls below its value at L={max(low)}; "
                   f"trained slopes {slopes}, init slopes {slopes0}; trained " +
                   ', '.join(f"L={L}: {trained[L]['effective_rank']:.2f} (init "
                             f"{init[L]['effective_rank']:.2f})" for L in high) + ')' +
                   _also_at_init(sub, sub0) + '.')

        def within_tdof(side):
            return all(side[L]['effective_rank'] <= BEYOND_TDOF * tdof for L in high)
        out.append(f"**Variation 'up to but not beyond the intrinsic TDOF': "
                   f"{'agrees' if within_tdof(trained) else 'disagrees'}** (criterion: effective "
                   f"rank at every L > TDOF at most {BEYOND_TDOF} x TDOF = {BEYOND_TDOF * tdof:g};"
                   f" trained " + ', '.join(f"L={L}: {trained[L]['effective_rank']:.2f}"
                                            for L in high) + ')' +
                   _also_at_init(within_tdof(trained), within_tdof(init)) + '.')
    return out


def plot(rows, runs, tdof: int, path: str):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2),
                             gridspec_kw=dict(width_ratios=[1.2, 1, 1]))
    ax = axes[0]
    Ls = sorted({r['L'] for r in rows})
    for state, color, style in (('trained', 'tab:red', '-'), ('init', 'tab:gray', '--')):
        sel = [next(r for r in rows if r['L'] == L and r['state'] == state) for L in Ls]
        ax.errorbar(Ls, [r['effective_rank'] for r in sel],
                    yerr=[r['effective_rank std'] for r in sel], marker='o', color=color,
                    linestyle=style, capsize=3, label=f'{state} (mean over layers)')
        for L in Ls:  # individual layers of every seed
            vals = [layer['effective_rank'] for r in runs if r['L'] == L and r['state'] == state
                    for layer in r['layers'].values()]
            ax.scatter([L] * len(vals), vals, color=color, s=8, alpha=0.35)
    span = np.array([min(Ls) / 1.2, max(Ls) * 1.2])
    ax.plot(span, span, color='black', linewidth=0.8, label='budget y = L')
    ax.axhline(tdof, color='tab:blue', linestyle=':', label=f'target TDOF = {tdof}')
    ax.set_xscale('log', base=2)
    ax.set_xticks(Ls)
    ax.set_xticklabels([str(L) for L in Ls])
    ax.set_xlim(*span)
    ax.set_ylim(bottom=0)
    ax.set_xlabel('matrix generators L per layer')
    ax.set_ylabel('soft effective rank of {M(mu_i) - mean M}')
    ax.legend(fontsize=7)
    for ax, state in zip(axes[1:], ('trained', 'init')):
        run = next((r for r in runs if r['L'] == 8 and r['state'] == state
                    and 'diverged' not in r), None)
        if run is None:
            ax.axis('off')
            continue
        name = next(iter(run['layers']))
        cos = np.array(run['layers'][name]['generator_cosine'])
        im = ax.imshow(cos, vmin=-1, vmax=1, cmap='RdBu_r')
        ax.set_title(f"L=8 {state}, seed {run['seed']}: generator cosine\n"
                     f"({name.replace('body.', '').replace('.attn', '')})", fontsize=9)
        ax.set_xlabel('generator l')
        ax.set_ylabel("generator l'")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    add_budget_arguments(parser, quick_help='L in {4, 8, 16}, small budget')
    parser.add_argument('--L', type=int_list(low=1), default=None,
                        help='comma-separated distinct numbers of matrix generators (each >= 1)')
    parser.add_argument('--d', type=positive_int, default=16, help='dimension of the elements')
    parser.add_argument('--tdof', type=positive_int, default=8,
                        help='TDOF of the target (at most --d)')
    parser.add_argument('--n-probe', type=positive_int, default=1000,
                        help='test sets probed per model (at least 2)')
    parser.add_argument('--threshold', type=nonnegative_float, default=0.1,
                        help='a gate counts as active when |gamma| exceeds this (at most 1)')
    parser.add_argument('--out', default=os.path.join(os.path.dirname(__file__), 'results',
                                                      'what_mz_learns'))
    add_resume_argument(parser)
    args = parser.parse_args()
    problem = check_out_folder(args.out)  # (before anything runs: a folder it cannot write)
    if problem:
        parser.error(problem)
    budget = choose_budget(args, QUICK, FULL)
    Ls = args.L or (QUICK_L if args.quick else FULL_L)
    if args.n_probe < 2:
        parser.error(f'--n-probe {args.n_probe} is too few: at least 2 sets (the effective rank '
                     'is of the operators\' variation over them)')
    if args.threshold > 1:
        parser.error(f'--threshold {args.threshold} is above 1: no gate |gamma| = |tanh(.)| '
                     'exceeds it, every activity would read 0')
    seeds, n_train = budget.seeds, budget.n_train
    n_val, n_test = max(1, n_train // 4), max(n_train // 2, args.n_probe)
    start = time.time()
    try:  # the task checks its options (tdof <= d) before generating anything
        task = load_task('quadratic-tdof', seed=0, n_train=n_train, n_val=n_val, n_test=n_test,
                         d=args.d, tdof=args.tdof)
    except ValueError as e:
        parser.error(f'--d {args.d} --tdof {args.tdof}: {e}')
    n_probe = min(args.n_probe, len(task.test))
    loader = DataLoader(list(task.test[:n_probe]), batch_size=250, shuffle=False)
    try:  # the runs' folder, before the first run trains
        store = RunStore.for_study(args.out, args.resume, args.overwrite)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    data = dict(task='quadratic-tdof', seed=0, n_train=n_train, n_val=n_val, n_test=n_test,
                d=args.d, tdof=args.tdof)
    runs: list = []
    run_seconds = 0.0  # (the runs' own times, those read back included)
    with interruptible(__file__, sys.argv[1:], parser, store.folder) as stop:
        for L in Ls:
            for seed in range(seeds):
                record = train_run(store, data, L, seed, budget, args.device, task, loader,
                                   n_probe, args.threshold)
                run_seconds += record.get('wall_time_s', 0.0)
                runs.append(dict(L=L, seed=seed, state='init', test_r2=None,
                                 layers=record['init']))
                if 'diverged' in record:
                    e = record['diverged']
                    warnings.warn(f'L={L} seed {seed} diverged ({e}): recorded, left out of the '
                                  f'trained figures; the other runs go on')
                    runs.append(dict(L=L, seed=seed, state='trained', test_r2=None,
                                     diverged=e, layers={}))
                    print(f'L={L:2d} seed {seed}: diverged ({e})', flush=True)
                    continue
                layers = record['trained']
                runs.append(dict(L=L, seed=seed, state='trained', test_r2=record['test_r2'],
                                 best_epoch=record['best_epoch'], layers=layers))
                rank = np.mean([v['effective_rank'] for v in layers.values()])
                gate = np.mean([v['gate_activity'] for v in layers.values()])
                print(f"L={L:2d} seed {seed}: test r2 {record['test_r2']:.4f}, effective "
                      f"rank {rank:.2f} (mean over layers), gate activity {gate:.1%} "
                      f"[{record['wall_time_s']:.0f} s]", flush=True)
        stop.all_kept()  # (every run is kept: a Ctrl-C from here costs only the report)
        table, notes, note = report(args, runs, Ls, budget, n_val, n_test, n_probe, start,
                                    run_seconds)
    if stop.note:
        print(stop.note, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if note:
        print(note)
    print(table)
    print('\n'.join(notes))
    print(f"wrote {args.out}/what_mz_learns.json, .md{'' if note else ', .png'}")
    return None


def _nan_for_none(value):
    # a figure of a probe written as null (NaN, by write_json) read back as NaN, at any depth
    if isinstance(value, dict):
        return {k: _nan_for_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_for_none(v) for v in value]
    return math.nan if value is None else value


def train_run(store: RunStore, data: dict, L: int, seed: int, budget: Budget, device: str,
              task, loader, n_probe: int, threshold: float) -> dict:
    r"""The record of one run: read back from :obj:`store` where a call with the same data,
    L, probe, seed and training settings finished it, else trained (and kept there): ``init``
    (the probe at initialisation), and ``trained``, ``test_r2`` and ``best_epoch``, or
    ``diverged`` (the error's text); ``wall_time_s``, the time it took."""
    key = dict(study='what_mz_learns', data=data, model='mz',
               options=dict(num_matrix_generators=L, n_probe=n_probe, threshold=threshold),
               seed=seed)
    config = study_config(budget, device=device, seed=seed)
    record = store.get(key, config)
    if record is not None:
        return dict(record, **{k: _nan_for_none(record[k]) for k in ('init', 'trained')
                               if k in record})
    t0 = time.time()
    seed_everything(seed)
    model = build_model('mz', task.in_channels, task.out_channels, num_matrix_generators=L)
    record = dict(init=probe_model(model, loader, threshold))
    try:
        result = train(model, task.train, task.val, task.test, config=config,
                       task_type=task.task_type)
    except TrainingDiverged as e:  # (it ended the study with a traceback)
        record['diverged'] = str(e)
    else:
        record.update(trained=probe_model(model, loader, threshold),
                      test_r2=result.test_metrics['r2'], best_epoch=result.best_epoch)
    record['wall_time_s'] = time.time() - t0
    store.put(key, config, record)
    return record


def report(args, runs, Ls, budget, n_val, n_test, n_probe, start, run_seconds):
    r"""Writes the report; returns its table, its verdicts and the note of a plot not drawn
    (else :obj:`None`)."""
    seeds, n_train, epochs, lr = budget.seeds, budget.n_train, budget.epochs, budget.lr
    rows = [aggregate(runs, L, state) for L in Ls for state in ('init', 'trained')]
    layer_rows = [row for L in Ls for row in per_layer_rows(runs, L, 'trained')]
    notes = verdicts(rows, args.tdof, args.threshold)
    minutes = (time.time() - start) / 60
    env = environment()
    setup = dict(task='quadratic-tdof', d=args.d, tdof=args.tdof, model='mz', seeds=seeds,
                 n_train=n_train, n_val=n_val, n_test=n_test, n_probe=n_probe, epochs=epochs,
                 lr=lr, batch_size=64, gate_threshold=args.threshold,
                 strong_gate_threshold=STRONG_GATE)
    columns = ['L', 'state', 'test r2', 'gate_activity', 'gate_activity_strong',
               'mean_abs_offdiag_cos', 'max_abs_offdiag_cos', 'mean_generator_norm',
               'generator_norm_spread', 'generator_norm_over_center', 'effective_rank',
               'effective_rank std', 'effective_rank_over_L']
    table = markdown_table(rows, columns)
    layer_table = (markdown_table(layer_rows, list(layer_rows[0])) if layer_rows else
                   '(every run diverged)\n')
    seeds_note = (f'mean over the six MZ layers, then mean over {seeds} seeds (std over seeds)'
                  if seeds > 1 else 'mean over the six MZ layers, one seed (no std over seeds)')
    diverged = [f"L={r['L']} seed {r['seed']}" for r in runs if 'diverged' in r]
    if diverged:  # (left out of the trained rows; an L with none left has no verdict)
        seeds_note += f"; runs that diverged, left out of the trained rows: {', '.join(diverged)}"
    png = os.path.join(args.out, 'what_mz_learns.png')  # (first: the report links it if drawn)
    note = replace_plot(png, plot, rows, runs, args.tdof, png)
    body = (f"Model: preset `mz` (d = 64, H = 4, d_k = 16, n_g = 8, 2 ISAB + PMA + 1 SAB: six "
            f"`value='mz'` attention layers) with `num_matrix_generators=L`, trained on "
            f"`quadratic-tdof` with d = {args.d}, TDOF = {args.tdof}. Each model is probed with "
            f"{n_probe} test sets (`torch_mz.analysis.probe`) at initialisation (`init`, the "
            f"same seed's weights before training: the control) and after training "
            f"(`trained`, best validation epoch). Gate activity: fraction of (set, gate) "
            f"evaluations with |gamma| > {args.threshold} (`gate_activity`) and > {STRONG_GATE} "
            f"(`gate_activity_strong`). Cosines and norms: generators flattened over the four "
            f"heads (operator space of dimension H d_k^2 = 1024). `generator_norm_spread`: max / "
            f"min generator norm; `generator_norm_over_center`: mean generator norm / "
            f"||M_c||_F. Effective rank: soft effective rank (Roy and Vetterli) of "
            f"{{M(mu_i) - mean M}} over the {n_probe} sets; the paper's appendix uses 200 "
            f"operators. The probe sets are the first {n_probe} sets of the test split.\n\n"
            f"Note on the implementation: in `MZAttention` the gated term sum_l gamma_l M_l acts "
            f"on the attended centre and is written into the zonotope generators (through "
            f"W_mix); the centre path uses M_c alone. The matrix generators therefore reach the "
            f"prediction only through the generator path (LayerNorm Jacobian, generator FFN, "
            f"IHW readout). `torch_mz.analysis` measures the paper's operator M(mu) = M_c + "
            f"sum_l gamma_l(mu) M_l.\n\n"
            f"## Summary ({seeds_note})\n\n{table}\n"
            f"Mean |cosine| of two random directions in operator space: "
            f"{rows[0]['chance_abs_cos']:.3f}.\n\n"
            + ('' if note else
               "![effective rank vs L; generator cosine at L=8](what_mz_learns.png)\n\n") +
            f"## Agreement with the paper\n\nPaper: {'; '.join(PAPER_CLAIMS)}.\n\n" +
            ''.join(f'- {n}\n' for n in notes) +
            f"\nTest R² has no exact paper counterpart (Table 1 reports the one-layer `mz-1l` "
            f"at TDOF 8: 0.988; Table 8 uses TDOF 16 and 32).\n\n"
            f"## Trained models per layer (mean over seeds)\n\n{layer_table}")
    write_report(args.out, 'what_mz_learns',
                 'What the matrix zonotope learns (paper Section 5.4, Appendix D.1, Figure 4)',
                 env, setup, body.rstrip('\n'),
                 dict(paper=dict(gate_activity_L8=PAPER_GATE_ACTIVITY_L8, claims=PAPER_CLAIMS),
                      rows=rows, per_layer=layer_rows, verdicts=notes, runs=runs), minutes,
                 plot=False,
                 run_minutes=run_seconds / 60 if args.resume else None)
    return table, notes, note


if __name__ == '__main__':
    sys.exit(main())
