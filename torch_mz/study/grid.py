r"""Training several models on one task, or on a grid of tasks, with identical budgets: the engine
of ``torch-mz compare`` and of the studies in ``benchmarks/``. Library code: no printing."""
import json
import math
import numbers
import os
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from torch_mz._checks import check_count
from torch_mz.datasets.fingerprint import split_digest
from torch_mz.models import build_model, count_parameters
from torch_mz.models.registry import PRESETS, _knob
from torch_mz.options import check_options
from torch_mz.study.report import label_key
from torch_mz.study.resume import RunStore
from torch_mz.study.specs import parse_model_spec
from torch_mz.tasks import check_task, load_task
from torch_mz.train import TrainConfig, TrainingDiverged, seed_everything, train
from torch_mz.train.checkpoint import recorded_options

__all__ = ['train_one', 'train_models', 'run_grid', 'run_info_for', 'check_models',
           'check_grid']


def train_one(task, model_name: str, seed: int, config: TrainConfig,
              **model_overrides) -> Dict[str, Any]:
    r"""Builds preset :obj:`model_name` for :obj:`task` (a
    :class:`~torch_mz.datasets.TaskSplits`), trains it with :obj:`config` (seeded with
    :obj:`seed`: the model's initialisation and, as ``config.seed``, which it replaces, the
    training's shuffling and dropout) and returns a flat record: model, seed, parameter count,
    best epoch, epochs run, wall time, validation and test metrics. The checkpoints record the
    task (name and ``task.args``) and the model (preset name and overrides), so that resuming
    one with another task or model is refused, and so is resuming one with data drawn with
    another seed or other split sizes (``task.split``, recorded where
    :func:`~torch_mz.tasks.load_task` built the task)."""
    seed = check_count('seed', seed, low=0)  # (a NumPy integer failed in random.seed)
    config = replace(config, seed=seed)  # (a config of another seed trained every seed alike)
    seed_everything(seed)
    model = build_model(model_name, task.in_channels, task.out_channels, pos_dim=task.pos_dim,
                        feature_columns=task.info.get('feature_columns'), **model_overrides)
    run_info = run_info_for(task, model_name, model_overrides)
    result = train(model, task.train, task.val, task.test, config=config,
                   task_type=task.task_type, run_info=run_info)
    return dict(model=model_name, seed=seed, params=count_parameters(model),
                best_epoch=result.best_epoch, epochs_run=result.epochs_run,
                stopped_early=result.stopped_early, wall_time_s=result.wall_time,
                val=result.val_metrics, test=result.test_metrics or {})


def run_info_for(task, model_name: str, model_overrides: Mapping[str, Any]) -> Dict[str, Any]:
    r"""What :func:`train_one` records in its checkpoints about the run (``run_info``): the task
    (name, options and, where :func:`~torch_mz.tasks.load_task` built it, the data seed and
    split sizes) and the model (preset and options); a resume is refused where they differ."""
    run_info = {'task': {'name': task.name,
                         'args': recorded_options(getattr(task, 'args', {}))},
                'model': {'name': model_name, 'args': recorded_options(model_overrides)}}
    if getattr(task, 'split', None):  # seed and sizes (load_task): predict and resume check them
        run_info['task']['split'] = recorded_options(task.split)
    data = {name: split_digest(getattr(task, name, None)) for name in ('train', 'val', 'test')}
    if any(v is not None for v in data.values()):  # a real dataset: what the splits hold
        run_info['task']['data'] = data
    return run_info


def model_key(name: str, options: Mapping[str, Any]) -> str:
    r"""What makes two model specs one model: the preset :obj:`name` and its effective options,
    the preset's defaults (:data:`~torch_mz.models.registry.PRESETS`) under :obj:`options`,
    compared by value: ``0`` and ``0.0`` or ``0.1`` and ``0.10`` are one value (not ``True`` and
    ``1``), and an option given at the preset's default is the same model as the preset. A
    preset whose width is matched to another's parameter count (``match``, e.g. ``hypernet``)
    takes its listed width only where the width is given: the width it would match is not
    that value, so ``'hypernet'`` and ``'hypernet:dim=64'`` are two models."""
    effective = dict(PRESETS.get(name, {}), **options)
    if effective.get('match') is not None:
        knob = _knob(name)
        if knob in options:  # giving the width turns the match off (see build_model)
            effective['match'] = None
        else:  # matched: the width is the match's, not the listed one
            effective[knob] = '<matched>'
    return json.dumps([name, _value_key(effective)], sort_keys=True, default=str)


def _value_key(value: Any) -> Any:
    r""":obj:`value` as :func:`model_key` compares it: a whole number as an ``int``, a flag as a
    ``bool``, containers item by item."""
    if isinstance(value, Mapping):
        return {str(k): _value_key(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_value_key(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return int(number) if number.is_integer() else number  # (inf, NaN: as they are)
    return value


def check_models(models: Sequence[str], overrides: Optional[Mapping[str, Any]] = None,
                 task: Any = None) -> None:
    r"""Checks model specs before anything is trained: every preset is known, no spec is given
    twice (its runs would be read as more seeds of one model; two specs of one preset and equal
    options, :func:`model_key`, are one spec), and every option (the spec's,
    then :obj:`overrides` on top) is one the preset takes, with a value of the right type. Every
    model with options is also built, which checks the options a preset passes on to its blocks
    (a misspelt one, e.g. ``'mz:dimm=3'``): for :obj:`task` (splits, possibly without sets:
    :func:`~torch_mz.tasks.check_task`), or without one for a small stand-in shape (3 inputs, 1
    output), where only an option the blocks do not take is refused (whatever else the build
    finds may be the stand-in shape's, and is left to the build for the real task).
    Raises a :class:`ValueError` naming the spec."""
    seen: Dict[str, str] = {}
    built = []  # (the builds after every spec's own checks: a spec given twice is said first)
    for spec in models:
        name, options = parse_model_spec(spec)
        same = model_key(name, options)  # 'mz' == 'mz:' == 'mz:dropout=0.10' (its default)
        if same in seen:
            given = f"'{spec}'" if seen[same] == spec else f"'{seen[same]}' and '{spec}'"
            raise ValueError(f"model spec {given} {'is' if seen[same] == spec else 'are'} given "
                             "twice (the same model and options: each model once)")
        seen[same] = spec
        if name not in PRESETS:
            raise ValueError(f"unknown model '{name}' in spec '{spec}' (available: "
                             f"{', '.join(PRESETS)})")
        options = dict(options, **(overrides or {}))
        check_options(options, PRESETS[name], f"model spec '{spec}'", complete=False)
        if options:  # a preset without options builds for any task
            built.append((spec, name, options))
    for spec, name, options in built:
        if task is None:  # (it passed until the data was built and earlier models trained)
            problem = _unknown_option(name, options)
            if problem is not None:
                raise ValueError(f"model spec '{spec}': {problem}")
            continue
        try:
            build_model(name, task.in_channels, task.out_channels, pos_dim=task.pos_dim,
                        feature_columns=task.info.get('feature_columns'), **options)
        except TypeError as e:  # an option unknown to the blocks the preset builds
            raise ValueError(f"model spec '{spec}': {e}") from None


def _unknown_option(name: str, options: Mapping[str, Any]) -> Optional[str]:
    r"""What building preset :obj:`name` with :obj:`options` for a stand-in shape (3 inputs, 1
    output) says of an option its blocks do not take (a :class:`TypeError`), or :obj:`None`.
    Any other failure is left to the build for the real task: it may be the stand-in's."""
    try:
        with warnings.catch_warnings():  # (e.g. match_budget's on a width far from the budget)
            warnings.simplefilter('ignore')
            build_model(name, 3, 1, **options)
    except TypeError as e:
        return str(e)
    except Exception:  # (the shape's, perhaps: the real build says)
        return None
    return None


def _check_labels(cells: Sequence[Mapping[str, Any]]) -> None:
    r"""Every cell has a ``label`` and a ``task``, and no two labels read alike (``1`` and
    ``'1'``: the rows' tables and :func:`~torch_mz.study.plot_grid` key cells by the text) or
    are equal values (``1`` and ``1.0``, ``True`` and ``1``: :func:`summarize` keys them so)."""
    by_text: Dict[str, Any] = {}
    by_value: Dict[Hashable, Any] = {}  # (keyed as summarize keys cells)
    for cell in cells:
        for field in ('label', 'task'):
            if field not in cell:
                raise ValueError(f"a run_grid cell needs '{field}', got {dict(cell)}")
        label = cell['label']
        text, key = str(label), label_key(label)
        if text in by_text or key in by_value:
            first = by_text[text] if text in by_text else by_value[key]
            same = (repr(label) if type(first) is type(label) and first == label
                    else f'{first!r} and {label!r}')
            raise ValueError(f"two cells are labelled {same}: a table or plot of the grid "
                             f"shows one of them (give every cell a label of its own)")
        by_text[text] = by_value[key] = label


def check_grid(cells: Sequence[Mapping[str, Any]], models: Sequence[str],
               overrides: Optional[Mapping[str, Any]] = None) -> None:
    r"""Checks a grid for :func:`run_grid` before anything is trained or generated: every cell's
    task and options (:func:`~torch_mz.tasks.check_task`: a synthetic task's values too) and
    every model spec (:func:`check_models`, building each model for every input / output shape
    of a synthetic cell). Raises the first mistake's :class:`ValueError` (a script turns it
    into its usage error). Two cells whose labels read alike (``1`` and ``'1'``, or one label
    twice) are refused: the tables and plots key cells by the label's text."""
    _check_labels(cells)
    checked = set()
    for cell in cells:
        try:
            preview = check_task(cell['task'], seed=0, **dict(cell.get('kwargs', {})))
        except ValueError as e:
            raise ValueError(f"cell '{cell['label']}' (task '{cell['task']}'): {e}") from None
        shape = None if preview is None else (preview.in_channels, preview.out_channels,
                                              preview.pos_dim)
        if shape not in checked:  # models are built once per input / output shape
            check_models(models, overrides, task=preview)
            checked.add(shape)


def train_models(task: Any, models: Sequence[str], seeds: int,
                 config_for: Callable[[str, int], TrainConfig],
                 overrides: Optional[Mapping[str, Any]] = None,
                 on_result: Optional[Callable[[Dict[str, object]], None]] = None,
                 cached: Optional[Callable[[str, int, TrainConfig],
                                           Optional[Dict[str, object]]]] = None,
                 store: Optional[RunStore] = None,
                 data: Optional[Mapping[str, Any]] = None,
                 record_diverged: bool = False,
                 legacy_data: Optional[Mapping[str, Any]] = None,
                 **labels: Any) -> List[Dict[str, Any]]:
    r"""Trains every model of :obj:`models` (specs, see :func:`parse_model_spec`) with seeds
    ``0 .. seeds - 1`` on one task, model by model, and returns one record per run:
    :func:`train_one`'s, with ``model`` the spec as given and :obj:`labels` added (e.g.
    ``dataset='qm9'``).

    Args:
        task: A :class:`~torch_mz.datasets.TaskSplits`, or a function without arguments that
            builds it (called once, before the first run that is not cached).
        models (sequence of str): Model specs.
        seeds (int): Seeds per model.
        config_for (callable): ``config_for(spec, seed)``, the configuration of that run.
        overrides (dict, optional): Model options applied on top of every spec's own (as the
            CLI's ``--model-arg``). (default: :obj:`None`)
        on_result (callable, optional): Called with every record as it is ready, cached ones
            included (for progress output). (default: :obj:`None`)
        cached (callable, optional): ``cached(spec, seed, config)``, a finished run's record to
            use as it is instead of training (resumption), or :obj:`None`. (default: :obj:`None`)
        store (RunStore, optional): Where every finished run is kept, and read back instead of
            trained again when the same run (same :obj:`data`, :obj:`labels`, spec, options,
            seed and configuration) is asked for: an interrupted call resumes. Asked after
            :obj:`cached`. (default: :obj:`None`)
        data (dict, optional): What identifies the task's data in :obj:`store` (e.g. the task
            name, options and set counts); required with :obj:`store`. (default: :obj:`None`)
        record_diverged (bool, optional): A run whose training diverges
            (:class:`~torch_mz.train.TrainingDiverged`) is recorded, with a warning, as
            ``diverged`` with no validation or test figures (its R² NaN in a table), and the
            other runs go on; kept in :obj:`store` too, since training it again would diverge
            at the same epoch. Otherwise the error ends the call. (default: :obj:`False`)
        legacy_data (dict, optional): An earlier description of the same data (e.g. a data
            root as it was given, before :obj:`data` named it resolved): a run :obj:`store`
            kept under it, and not under :obj:`data`, is read back too, so that describing
            the data anew does not train the finished runs again, and is kept under
            :obj:`data` from then on (its file under the earlier description removed). Give it
            only where it names this very data. (default: :obj:`None`)
        **labels: Entries added to every trained run's record.

    The specs are checked first (:func:`check_models`), before any data is built: an unknown
    preset, an unknown option or a spec given twice raises a :class:`ValueError`, and so does
    :obj:`seeds` below 1.

    A run read back from :obj:`store` that diverged (kept by a call with
    :obj:`record_diverged`) raises :class:`~torch_mz.train.TrainingDiverged` in a call without
    it, as training it again would. (A record :obj:`cached` returns is used as it is.)
    """
    seeds = check_count('seeds', seeds, low=1)  # (0 or -3 returned no runs and no error)
    if store is not None and data is None:
        raise ValueError("train_models: a 'store' needs 'data', what identifies the task's data")
    built = None if callable(task) else task
    check_models(models, overrides, task=built)
    records: List[Dict[str, Any]] = []
    for spec in models:
        name, options = parse_model_spec(spec)
        options = dict(options, **(overrides or {}))
        for seed in range(seeds):
            config = config_for(spec, seed)
            record = None if cached is None else cached(spec, seed, config)
            key = dict(labels, data=data, model=spec, options=options, seed=seed)
            if record is None and store is not None:
                record = store.get(key, config)
                if record is None and legacy_data is not None:  # (kept by an earlier version)
                    earlier = dict(key, data=legacy_data)
                    record = store.get(earlier, config)
                    if record is not None and store._path(earlier) != store._path(key):
                        # kept under data from now on, the earlier file removed: read under the
                        # earlier description at every call, a run kept under a root that named
                        # its environment's folder (a script's default root, which
                        # $TORCH_MZ_DATA sets) was read as every later environment's data
                        store.put(key, config, record)
                        os.remove(store._path(earlier))
                if record is not None and 'diverged' in record and not record_diverged:
                    raise _stored_divergence(record, spec, seed)
            if record is None:
                if built is None:
                    built = task()
                start = time.perf_counter()
                try:
                    trained = train_one(built, name, seed, config, **options)
                except TrainingDiverged as e:
                    if not record_diverged:
                        raise
                    warnings.warn(f'{spec} seed {seed} diverged ({e}): recorded with no test '
                                  f'figures (R² NaN), the other runs go on', stacklevel=3)
                    keys = (('loss', 'accuracy') if built.task_type == 'classification'
                            else ('loss', 'mse', 'mae', 'r2'))  # (the trainer's metrics)
                    trained = dict(model=name, seed=seed, params=None, best_epoch=None,
                                   epochs_run=e.epoch + 1, stopped_early=False,
                                   diverged=str(e), wall_time_s=time.perf_counter() - start,
                                   val=dict.fromkeys(keys, math.nan),
                                   test=dict.fromkeys(keys, math.nan))
                record = dict(trained, model=spec, **labels)
                if store is not None:
                    store.put(key, config, record)
            records.append(record)
            if on_result is not None:
                on_result(record)
    return records


def _stored_divergence(record: Mapping[str, Any], spec: str, seed: int) -> TrainingDiverged:
    r"""The :class:`~torch_mz.train.TrainingDiverged` of a diverged run read back from a store,
    as training it again would raise it (at the same epoch: resumption is exact)."""
    text = str(record['diverged'])
    split = ('validation' if text.startswith('Validation') else
             'weights' if text.startswith('The weights') else 'training')
    epochs = record.get('epochs_run')
    error = TrainingDiverged(epochs - 1 if isinstance(epochs, int) and epochs > 0 else 0,
                             math.nan, split)
    error.args = (f"{text} ({spec} seed {seed}: a diverged run kept in the store by a call with "
                  f"record_diverged=True; pass record_diverged=True to record it and go on)",)
    return error


def run_grid(cells: Sequence[Mapping[str, Any]], models: Sequence[str], seeds: int,
             config: Optional[TrainConfig], load: Optional[Callable[..., Any]] = None,
             on_result: Optional[Callable[[Dict[str, object]], None]] = None,
             config_for: Optional[Callable[[Mapping[str, Any], str, int], TrainConfig]] = None,
             cached: Optional[Callable[[Mapping[str, Any], str, int, TrainConfig],
                                       Optional[Dict[str, object]]]] = None,
             overrides: Optional[Mapping[str, Any]] = None,
             store: Optional[RunStore] = None, check: bool = True,
             record_diverged: bool = False
             ) -> Tuple[List[Dict[str, object]], List[Dict[str, object]]]:
    r"""Trains every model of :obj:`models` (specs, see :func:`parse_model_spec`) with
    :obj:`seeds` seeds on every cell of :obj:`cells`, all with the same :obj:`config` (only the
    seed changes), and returns ``(runs, rows)``.

    A cell is a dict with ``label`` (a column of the table), ``task`` (a task name) and optional
    ``kwargs`` for :func:`~torch_mz.tasks.load_task` (sizes, task arguments); its data is built
    once, from seed 0, and shared by all models and seeds. ``runs`` holds one record per trained
    model (:func:`train_one`'s record plus ``cell``); ``rows`` one per cell (``'cell'``, its
    label) with, for every model, the mean over seeds of the test R² and its population standard
    deviation (``'<model> r2'``, ``'<model> r2 std'``), the mean test MSE (``'<model> mse'``)
    and its parameter count (``'<model> params'``). :obj:`on_result` is called with every run as
    it finishes (for progress output).

    :obj:`config_for`, if given, replaces the shared configuration: ``config_for(cell, spec,
    seed)`` is the configuration of that run (e.g. with a learning rate chosen per model).
    :obj:`cached`, if given, is asked first, as ``cached(cell, spec, seed, run_config)``, for a
    finished run's record to use instead of training (resumption); a cell whose runs are all
    cached never builds its data. :obj:`on_result` is called for cached runs too.
    :obj:`overrides`, if given, are model options applied on top of every spec's own (as the
    CLI's ``--model-arg``). :obj:`store`, if given, keeps every finished run and reads it back
    when the same run is asked for again (:class:`~torch_mz.study.RunStore`): a grid stopped
    midway resumes where it stopped.

    Before anything is trained, every cell's task and options are checked
    (:func:`~torch_mz.tasks.check_task`, with the default :obj:`load`; synthetic tasks also have
    their values checked and every model built for them) and so is every model spec
    (:func:`check_models`): a mistake in the last cell raises its :class:`ValueError` before
    the first cell trains. ``check=False`` skips that (a caller that ran
    :func:`check_grid` itself), but not the check that no two cells' labels read alike (``1``
    and ``'1'``), which raises a :class:`ValueError` whatever :obj:`load` is.

    With :obj:`record_diverged` (:func:`train_models`'), a run that diverges is recorded and
    the grid goes on: a row then counts a model's diverged runs (``'<model> diverged'``, 0
    where none) and takes its means and spreads over the other seeds (NaN where every seed
    diverged)."""
    check_count('seeds', seeds, low=1)  # (0 failed later with an IndexError)
    _check_labels(cells)  # (with check=False too: two cells labelled alike, one plotted)
    if not check:
        pass
    elif load is None:
        check_grid(cells, models, overrides)
    else:  # a loader of the caller's: its cells may not be load_task's
        check_models(models, overrides)
    load = load_task if load is None else load

    def run_config(cell: Mapping[str, Any], spec: str, seed: int) -> TrainConfig:
        if config_for is not None:
            return config_for(cell, spec, seed)
        if config is None:
            raise ValueError("run_grid needs 'config' or 'config_for' (got neither)")
        return replace(config, seed=seed)

    runs: List[Dict[str, object]] = []
    rows: List[Dict[str, object]] = []
    for cell in cells:
        records = train_models(
            lambda: load(cell['task'], seed=0, **dict(cell.get('kwargs', {}))), models, seeds,
            lambda spec, seed: run_config(cell, spec, seed),
            overrides=overrides, on_result=on_result,
            cached=None if cached is None else (
                lambda spec, seed, run_config: cached(cell, spec, seed, run_config)),
            store=store, data=dict(task=cell['task'], kwargs=dict(cell.get('kwargs', {}))),
            record_diverged=record_diverged, cell=cell['label'])
        runs += records
        row: Dict[str, object] = dict(cell=cell['label'])
        for i, spec in enumerate(models):
            results = records[i * seeds:(i + 1) * seeds]  # train_models' order: model by model
            kept = [r for r in results if 'diverged' not in r]  # (all, unless one diverged)
            r2 = [r['test'].get('r2', math.nan) for r in kept]
            row[f'{spec} r2'] = float(np.mean(r2)) if r2 else math.nan
            row[f'{spec} r2 std'] = float(np.std(r2)) if r2 else math.nan
            row[f'{spec} mse'] = (float(np.mean([r['test'].get('mse', math.nan) for r in kept]))
                                  if kept else math.nan)
            if record_diverged:
                row[f'{spec} diverged'] = len(results) - len(kept)
            row[f'{spec} params'] = next((r['params'] for r in results
                                          if r.get('params') is not None), None)
        rows.append(row)
    return runs, rows
