r"""Running a claim: the sweep, the runs it needs, the time limit, and the queue of claims."""
import json
import math
import os
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type

import numpy as np

from torch_mz.study import grid as _grid
from torch_mz.study.grid import run_grid
from torch_mz.study.specs import parse_model_spec
from torch_mz.train import (CheckpointError, TrainConfig, TrainingDiverged, TrainingStopped,
                            stop_by)
from torch_mz.reproduce.budgets import Budget, SWEEP_MAX_STEPS, TIME_MARGIN, sweep_extension
from torch_mz.reproduce.claims import Claim, Comparison, GEOMETRIC_TASKS, SWEEP_CELLS
from torch_mz.reproduce.store import RunStore, epochs_figures, run_key, stopped_early
from torch_mz._checks import check_optional_count
from torch_mz.study.statistics import mean_or_nan, std_or_nan
from torch_mz.reproduce.verdict import verdict


class RunsHeld(Exception):
    r"""A claim cannot go on now: the runs it needs next are being trained by another process
    (raised by :meth:`Reproduction.run` with ``wait=False``)."""


class TimeLimit(Exception):
    r"""A claim cannot go on before :class:`Reproduction`'s ``deadline``: the runs it needs
    next may not finish in the time left (raised by :meth:`Reproduction.run` after training
    every run of the claim that fits, and with ``carry`` stopping the run in progress at the
    deadline; those left are for a later invocation), or, with
    :attr:`never` set, one of them may not finish even in the whole time limit."""
    def __init__(self, message: str, never: bool = False):
        super().__init__(message)
        self.never = never

class Reproduction:
    r"""Runs claims at :obj:`budget`, keeping finished runs in :obj:`out`
    (``records/<budget>/``; checkpoints of unfinished runs in ``runs/<budget>/``).

    Args:
        budget (Budget): Set counts, seeds and protocol.
        out (str): The results folder.
        device (str, optional): Training device. (default: :obj:`'auto'`)
        seeds (int, optional): Seeds per (cell, model) instead of the budget's (study seeds
            for a claim with ensemble members, e.g. ``d3``: each has ``members`` runs).
            (default: :obj:`None`)
        load (callable, optional): :func:`~torch_mz.tasks.load_task` or a stand-in (tests).
        on_result (callable, optional): Called with every newly trained run's record (with its
            ``key``) as it finishes (for progress output).
        sweep_cells (dict, optional): Instead of :data:`SWEEP_CELLS`.
        on_wait (callable, optional): Called as ``on_wait(cell_label, spec, seed)`` before this
            process waits for a run that another process is training (for progress output).
        progress (bool, optional): Show the trainer's progress bar (epochs, with the latest
            metrics) for every run, and those of building each cell's data (generating a
            synthetic task, processing a real dataset: QM9's first load reads every molecule
            with RDKit); not part of what identifies a run. (default: :obj:`False`)
        deadline (float, optional): A time (:func:`time.time` seconds) by which this process
            should be done, e.g. a cluster job's end: a run is started or resumed only when
            :data:`TIME_MARGIN` times the longest time it may still need (:meth:`time_bound`)
            fits before it; runs that do not fit are left for a later invocation
            (:class:`TimeLimit`, raised when the claim's other runs that fit, on every task,
            are trained). A started run is not stopped, unless with :obj:`carry` (one that
            outlasts the deadline resumes from its last epoch's checkpoint when the process is
            killed and the command runs again), and a claim's evaluation after its last run is
            not part of the estimate.
            (default: :obj:`None`, no limit)
        carry (bool, optional): With a :obj:`deadline`, start any run while time is left and
            stop the run in progress after the epoch that ends past the deadline
            (:func:`torch_mz.train.stop_by`), its checkpoint written for the next invocation to
            resume from (exactly), instead of passing over the runs that may not finish: no
            time is left idle, and a run may be longer than one job when its checkpoint is
            carried to the next (committed, as this repository's results folder does).
            (default: :obj:`False`)
        clock (callable, optional): The clock :obj:`deadline` is read against (tests).
            (default: :func:`time.time`)

    Each stage (a task's sweep, a claim's runs on a task) first trains its missing runs one by
    one, skipping those another process holds and then waiting for them (see the module's
    docstring), and then reads the whole stage back from the store.
    """
    def __init__(self, budget: Budget, out: str, device: str = 'auto',
                 seeds: Optional[int] = None, load: Optional[Callable[..., Any]] = None,
                 on_result: Optional[Callable[[Dict[str, object]], None]] = None,
                 sweep_cells: Optional[Mapping[str, Mapping[str, Any]]] = None,
                 on_wait: Optional[Callable[[str, str, int], None]] = None,
                 progress: bool = False, deadline: Optional[float] = None,
                 clock: Callable[[], float] = time.time, carry: bool = False):
        self.budget = budget
        self.deadline = deadline
        self.carry = carry
        self.clock = clock
        self.started = clock()  # the whole limit is deadline - started
        self.progress = progress
        self.on_wait = on_wait
        self.out = out
        self.device = device
        self.seeds = check_optional_count('seeds', seeds)
        self.on_result = on_result
        self.sweep_cells = dict(SWEEP_CELLS if sweep_cells is None else sweep_cells)
        self.store = RunStore(os.path.join(out, 'records', budget.name),
                              os.path.join(out, 'runs', budget.name),
                              os.path.join(out, 'weights', budget.name))
        self._tasks: Dict[str, Any] = {}
        self._timed: Dict[Tuple[str, str], float] = {}  # timed_epoch, per (task, model)
        #: Why :meth:`timed_epoch` failed, per (task, model), in :meth:`status`.
        self.timing_errors: Dict[Tuple[str, str], str] = {}
        if load is None:
            from torch_mz.tasks import load_task
            load = load_task
        self._load_task = load
        self.choices: Dict[Tuple[str, str], Tuple[float, float]] = {}

    def _load(self, name: str, seed: int = 0, **kwargs):
        # one copy of each cell's data for the sweep and all claims
        key = json.dumps(dict(name=name, seed=seed, **kwargs), sort_keys=True, default=str)
        if key not in self._tasks:
            # (the data's bars follow progress: QM9's first processing took minutes unseen;
            # asked for only when shown, so that a stand-in need not take it)
            shown: Dict[str, Any] = {'progress': True} if self.progress else {}
            self._tasks[key] = self._load_task(name, seed=seed, **kwargs, **shown)
        return self._tasks[key]

    def sized(self, cell: Mapping[str, Any]) -> Dict[str, Any]:
        r""":obj:`cell` with the budget's set counts."""
        n = self.budget.qm9_sizes if cell['task'] == 'qm9' else (
            self.budget.n_train, self.budget.n_val, self.budget.n_test)
        return dict(cell, kwargs=dict(cell.get('kwargs', {}), n_train=n[0], n_val=n[1],
                                      n_test=n[2]))

    def base_config(self, task: str) -> TrainConfig:
        config = self.budget.config(device=self.device, progress=self.progress)
        if self.budget.paper_batch and task in GEOMETRIC_TASKS:
            config = replace(config, batch_size=256)
        return config

    def claim_config(self, claim: Claim, task: str, lr: float, wd: float) -> TrainConfig:
        r"""The training configuration of :obj:`claim`'s runs on :obj:`task` at ``(lr, wd)``:
        the budget's, and for a claim with a fixed :attr:`Claim.protocol` (the paper's) also the
        paper's batch size of 256 on geometric tasks (Appendix A.1), as the ``paper`` budget."""
        config = replace(self.base_config(task), lr=lr, weight_decay=wd)
        if claim.protocol is not None and task in GEOMETRIC_TASKS:
            config = replace(config, batch_size=256)
        return config

    def _grid(self, cells, models, seeds, config_of) -> Tuple[List[Dict], List[Dict]]:
        def on_result(record):
            saved = self.store.save(record)
            if saved is not None and self.on_result is not None:
                self.on_result(saved)
        return run_grid(
            cells, models, seeds, self.base_config(cells[0]['task']), load=self._load,
            on_result=on_result,
            config_for=lambda c, s, k: self.store.config_for(c, s, k, config_of(c, s)),
            cached=self.store.cached)

    def _train_one(self, cell: Mapping[str, Any], spec: str, seed: int,
                   config: TrainConfig, again: bool = False) -> None:
        run_config = self.store.config_for(cell, spec, seed, config)
        if again:  # its file is in the store, its weights are not: trained again, replaced
            self.store.expect(cell, spec, seed, run_config)
        elif self.store.cached(cell, spec, seed, run_config) is not None:
            return
        try:
            name, options = parse_model_spec(spec)
            task = self._load(cell['task'], seed=0, **dict(cell.get('kwargs', {})))
            # the code of this start or resume, in the run's folder (a CheckpointError below)
            self.store.log_start(cell, spec, seed, run_config)
            with stop_by(self.deadline if self.carry else None, self.clock):  # TrainingStopped
                trained = _grid.train_one(task, name, seed, run_config, **options)
        except TrainingDiverged as e:
            # finished, and failed: resuming would diverge again at the same epoch (resumption
            # is exact), in every process and session, and a sweep point with no record would
            # leave its model's sweep open for good. So the run is stored with no validation
            # loss (the sweep reads inf: the worst point) and no test figures (R² NaN: a claim
            # with such a run is inconclusive), for every model alike
            epochs = self.store.metrics(cell, spec, seed, run_config)
            trained = dict(model=name, seed=seed, params=None, best_epoch=None,
                           epochs_run=e.epoch + 1, stopped_early=False, diverged=str(e),
                           wall_time_s=sum(float(m.get('epoch_time', 0.0)) for m in epochs),
                           val={}, test={})
        except CheckpointError as e:  # a checkpoint this code cannot resume (another preset's
            # shapes, a damaged file): kept as it is, and the way out named, since every later
            # process would refuse it the same way
            self.store.forget(cell, spec, seed)
            if run_config.resume is None:
                raise
            raise CheckpointError(
                f'{e}. The run {spec} on {cell["label"]} seed {seed} cannot go on from it; to '
                f'train it from the start, remove {os.path.dirname(run_config.resume)!r} (its '
                f'epochs so far are lost)') from e
        except BaseException:  # not finished: its checkpoint stays, nothing is saved for it
            self.store.forget(cell, spec, seed)
            raise
        record = dict(trained, model=spec, cell=cell['label'])
        saved = self.store.save(record)
        if saved is not None and self.on_result is not None:
            self.on_result(saved)

    def time_needed(self, cell: Mapping[str, Any], spec: str, seed: int,
                    config: TrainConfig, again: bool = False) -> Optional[float]:
        r"""Expected training time (s) a run still needs (for :meth:`status`): the mean wall
        time of the finished runs of its model on its task, less the share of their mean epochs
        that it has already run (from its checkpoint); :obj:`None` for a model with no
        finished run on the task; 0 for a finished run unless it is to be trained
        :obj:`again`."""
        if not again and self.store.stored(cell, spec, seed, config):
            return 0.0
        mean = self.store.mean_time(cell['task'], spec)
        if mean is None:
            return None
        wall, mean_epochs = mean
        epochs = self.store.epochs_run(cell, spec, seed, config)
        return wall * max(0.0, 1.0 - epochs / max(mean_epochs, 1.0))

    def time_bound(self, cell: Mapping[str, Any], spec: str, seed: int,
                   config: TrainConfig, again: bool = False) -> Optional[float]:
        r"""The longest training time (s) a run may still need (for :meth:`fits`): every epoch
        it has left up to :obj:`config.epochs <TrainConfig.epochs>` (early stopping can only
        end it sooner) at the mean time per epoch of the finished runs of its model on its
        task (:meth:`RunStore.epoch_time`), or for a model with no finished run there the
        largest such mean in the store; :obj:`None` when no run is finished at all; 0 for a
        finished run unless it is to be trained :obj:`again`."""
        if not again and self.store.stored(cell, spec, seed, config):
            return 0.0
        per_epoch = self.store.epoch_time(cell['task'], spec)
        if per_epoch is None:
            per_epoch = self.store.epoch_time()
        if per_epoch is None:
            return None
        epochs = self.store.epochs_run(cell, spec, seed, config)
        return per_epoch * max(0, config.epochs - epochs)

    def timed_epoch(self, task: str, spec: str, steps: int = 3) -> float:
        r"""Seconds one epoch of :obj:`spec` on :obj:`task` takes on this machine now, timed
        (for :meth:`status` with ``calibrate``, where no finished run of the model on the task
        gives a time): a one-epoch fit on one batch first (untimed: it compiles what the model
        compiles and sets up the trainer), then :obj:`steps` training steps of the
        :class:`~torch_mz.train.Trainer` (forward, loss, backward, clipping, AdamW) on batches
        of the budget's size from the task's sweep cell, scaled to the training split's
        batches, plus the evaluation of one validation batch scaled to the validation split's.
        One thread, as the reproduction's processes run; the process's memory and kernel
        settings as they are (``reproduce.py`` sets those of training first). It runs under
        whatever else the machine runs (e.g. other reproduction processes): a figure for
        planning, not a benchmark. Cached per (task, model) for the object's life."""
        import torch

        from torch_mz.models import build_model
        from torch_mz.train import Trainer
        key = (task, spec)
        if key in self._timed:
            return self._timed[key]
        if steps < 1:
            raise ValueError(f"'steps' must be positive (got {steps})")
        cell = self.sized(self.sweep_cells[task])
        data = self._load(task, seed=0, **dict(cell['kwargs']))
        config = replace(self.base_config(task), epochs=1, warmup_epochs=0, patience=None,
                         out_dir=None, resume=None, progress=False)
        bs = config.batch_size
        eval_bs = config.eval_batch_size or bs
        train = [data.train[i] for i in range(min(len(data.train), steps * bs))]
        val = [data.val[i] for i in range(min(len(data.val), eval_bs))]
        name, options = parse_model_spec(spec)
        torch.manual_seed(0)
        model = build_model(name, data.in_channels, data.out_channels, pos_dim=data.pos_dim,
                            feature_columns=data.info.get('feature_columns'), **options)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as a reproduction process runs (OMP_NUM_THREADS=1)
        try:
            trainer = Trainer(model, config, task_type=data.task_type)
            trainer.fit(train[:bs], val)  # untimed: compiling, the optimiser, the normaliser
            loader, _ = trainer._train_loader(train)
            start = time.perf_counter()
            trainer._train_epoch(loader, 1)
            per_batch = (time.perf_counter() - start) / len(loader)
            start = time.perf_counter()
            trainer.evaluate(val)
            per_val_batch = time.perf_counter() - start
        finally:
            torch.set_num_threads(threads)
        n = cell['kwargs']
        seconds = (per_batch * math.ceil(n['n_train'] / bs)
                   + per_val_batch * math.ceil(n['n_val'] / eval_bs))
        self._timed[key] = seconds
        return seconds

    def fits(self, cell: Mapping[str, Any], spec: str, seed: int, config: TrainConfig,
             again: bool = False) -> bool:
        r"""Whether the run may start (or resume) before the :obj:`deadline`: always without
        one; with one, when :data:`TIME_MARGIN` x :meth:`time_bound` is at most the time left
        (a run with no estimate at all, or any run with :obj:`carry`: while any time is
        left)."""
        if self.deadline is None:
            return True
        left = self.deadline - self.clock()
        if self.carry:
            return left > 0
        needed = self.time_bound(cell, spec, seed, config, again)
        return left > 0 and (needed is None or TIME_MARGIN * needed <= left)

    def too_long(self, cell: Mapping[str, Any], spec: str, seed: int, config: TrainConfig,
                 again: bool = False) -> Optional[str]:
        r"""Why the run could not fit even in the whole time limit (``deadline`` less the
        time this object was made), or :obj:`None` (also without a deadline, and with
        :obj:`carry`, where a run may span invocations)."""
        if self.deadline is None or self.carry:
            return None
        needed = self.time_bound(cell, spec, seed, config, again)
        whole = self.deadline - self.started
        if needed is None or TIME_MARGIN * needed <= whole:
            return None
        return (f"{spec} on {cell['label']} seed {seed} may need up to "
                f'{TIME_MARGIN * needed / 3600:.2f} h (with the margin), more than the whole '
                f'time limit of {whole / 3600:.2f} h: give it a longer limit, or none')

    def _weights_lost(self, cell: Mapping[str, Any], spec: str, seed: int,
                      config: TrainConfig) -> bool:
        r"""Whether a finished run is trained again for a claim that scores its model
        (:meth:`_train_missing`): its record is in the store, its weights are not, and it did
        not diverge (a diverged run would diverge again; weights it has are of its epochs
        before the divergence, which no claim scores). :meth:`status` counts the same runs as
        ``again``."""
        record = self.store.read(cell, spec, seed, config)
        return (record is not None and 'diverged' not in record
                and self.store.weights(cell, spec, seed, config) is None)

    def _train_missing(self, jobs: Sequence[Tuple[Mapping[str, Any], str, int,
                                                  TrainConfig]], wait: bool = True,
                       need_weights: bool = False) -> None:
        r"""Trains the runs of :obj:`jobs` (``(cell, spec, seed, config)``) that are not in the
        store: first those no other process holds, in order, then, waiting for each, those
        that were held (a run whose holder died without finishing it is trained here). With
        :obj:`wait` false, raises :class:`RunsHeld` instead of waiting. With a
        :obj:`deadline`, the runs that do not :meth:`fit <fits>` are passed over (the others
        are trained; with :obj:`carry`, a run stopped at the deadline too) and then
        :class:`TimeLimit` is raised. With :obj:`need_weights`, a run
        in the store whose weights are not here (:meth:`RunStore.weights`) is trained again."""
        def done(job) -> bool:
            return self.store.stored(*job) and not (need_weights and self._weights_lost(*job))

        def train(job) -> bool:
            cell, spec, seed, config = job
            try:
                self._train_one(cell, spec, seed, config, again=self.store.stored(*job))
            except TrainingStopped:  # carry: its checkpoint is for the next invocation
                return False
            if need_weights:  # at once: a later TimeLimit must not leave them in runs/ only
                self.store.keep(*job)
            return True

        held, later, never = [], [], []
        for job in jobs:
            if done(job):
                continue
            with self.store.lock(*job, wait=False) as mine:
                if not mine:
                    held.append(job)
                elif not done(job):  # not finished while we looked
                    again = self.store.stored(*job)
                    if self.fits(*job, again=again):
                        if not train(job):
                            later.append(job)
                    else:
                        later.append(job)
                        why = self.too_long(*job, again=again)
                        if why is not None:
                            never.append(why)
        if never:
            raise TimeLimit(never[0], never=True)
        if later:
            first = f"first {later[0][1]} on {later[0][0]['label']} seed {later[0][2]}"
            if self.deadline is not None and self.clock() >= self.deadline:
                raise TimeLimit(f'the time limit is reached: {len(later)} run(s) it needs are '
                                f'left for the next invocation, {first}')
            raise TimeLimit(f'{len(later)} run(s) it needs would not finish before the time '
                            f'limit, {first}')
        held = [job for job in held if not done(job)]
        if held and not wait:
            raise RunsHeld(f'{len(held)} run(s) it needs are being trained by another process, '
                           f"first {held[0][1]} on {held[0][0]['label']} seed {held[0][2]}")
        for job in held:
            if done(job):
                continue
            # its holder may not finish it in time (or may have died)
            if not self.fits(*job, again=self.store.stored(*job)):
                raise TimeLimit(f'a run it needs is being trained by another process and may '
                                f"not finish before the time limit: {job[1]} on "
                                f"{job[0]['label']} seed {job[2]}")
            if self.on_wait is not None:
                self.on_wait(str(job[0]['label']), job[1], job[2])
            with self.store.lock(*job, wait=True):
                if not done(job):
                    if not self.fits(*job, again=self.store.stored(*job)):  # its holder died
                        raise TimeLimit(f'a run it waited for was left unfinished by another '
                                        f"process (stopped at its time limit, or died), too "
                                        f"late to resume: {job[1]} on {job[0]['label']} seed "
                                        f'{job[2]}')
                    if not train(job):
                        raise TimeLimit(f'time was up while training {job[1]} on '
                                        f"{job[0]['label']} seed {job[2]}, a run it waited "
                                        f'for: its checkpoint is kept')

    def sweep(self, task: str, models: Sequence[str],
              wait: bool = True) -> Dict[str, Tuple[float, float]]:
        r"""The ``(lr, weight_decay)`` of each model on :obj:`task`: every point of the budget's
        grid trained with seed 0 on the task's sweep cell, the lowest best validation loss
        chosen (the first point on a tie). With the budget's ``extend_sweep``, a model whose
        best point lies on the grid's edge also trains the points one step beyond it
        (:func:`sweep_extension` of the points it has tried), again while its best point is on
        the edge, up to :data:`SWEEP_MAX_STEPS` rounds, and the lowest of all is chosen. A
        one-point grid trains nothing. :obj:`wait`: see :meth:`run`."""
        chosen, held = self._sweep_some(task, models, wait)
        if held is not None:
            raise held
        return chosen

    def _sweep_some(self, task: str, models: Sequence[str],
                    wait: bool) -> Tuple[Dict[str, Tuple[float, float]], Optional[RunsHeld]]:
        r"""What :meth:`sweep` can do now: every run of the rounds that no other process holds
        is trained, and each model's point is returned where its sweep is finished, with the
        :class:`RunsHeld` that keeps the others open (:obj:`None` when none is; with
        :obj:`wait` it then waits for the held runs, so none is). A model's rounds read only
        its own runs, so a run another process holds stops that model's sweep alone: the other
        models go on to their next rounds meanwhile."""
        todo = [m for m in models if (task, m) not in self.choices]
        held: List[RunsHeld] = []
        if todo:
            def settle(jobs):  # train what is free; a held run stops only its own model
                try:
                    self._train_missing(jobs, wait=False)
                except RunsHeld as e:
                    held.append(e)
            chosen, _, _ = self._sweep_rounds(task, todo, settle)
            if held and wait:  # all that was free is trained: now wait for the held runs
                held.clear()
                chosen, _, _ = self._sweep_rounds(
                    task, todo, lambda jobs: self._train_missing(jobs, wait=True))
            for m in todo:
                if chosen[m] is not None:
                    self.choices[(task, m)] = chosen[m]
                else:  # every run trained (or RunsHeld raised): every model chosen
                    assert held, f'sweep of {m} on {task} left open'
        return ({m: self.choices[(task, m)] for m in models if (task, m) in self.choices},
                held[0] if held else None)

    def _best_point(self, cell: Mapping[str, Any], spec: str,
                    points: Sequence[Tuple[float, float]],
                    config: Callable[[float, float], TrainConfig]
                    ) -> Tuple[Tuple[float, float], bool]:
        r"""The point of :obj:`points` whose seed-0 run on :obj:`cell` has the lowest best
        validation loss (the first on a tie), read from the store, and whether any point has a
        finite one (a diverged run has none; a non-finite loss counts as the worst, where
        NumPy's ``argmin`` took a NaN for the lowest)."""
        losses = []
        for lr, wd in points:
            runs, _ = self._grid([cell], [spec], 1, lambda c, s, lr=lr, wd=wd: config(lr, wd))
            loss = float(runs[0]['val'].get('loss', math.inf))
            losses.append(loss if math.isfinite(loss) else math.inf)
        return points[int(np.argmin(losses))], math.isfinite(min(losses))

    def run(self, claim: Claim,
            wait: bool = True) -> Tuple[List[Dict[str, object]], List[Dict[str, object]]]:
        r"""Trains (or reads back) every run of :obj:`claim` and returns ``(records, runs)``:
        one summary record per comparison and the run records. With :obj:`wait` false, raises
        :class:`RunsHeld` when the claim cannot go on without a run another process is
        training (after training every run of that stage it could, and the runs of the
        claim's other tasks), so that the caller can work on another claim meanwhile; the runs
        trained so far stay in the store."""
        study_seeds = self.seeds or self.budget.seeds or claim.paper_seeds
        seeds = study_seeds * claim.members
        runs: List[Dict[str, object]] = []
        files: List[str] = []
        late: List[TimeLimit] = []  # tasks whose runs did not fit: the others go on meanwhile
        held: List[RunsHeld] = []  # tasks waiting for another process: the others go on too
        for task in dict.fromkeys(c['task'] for c in claim.cells):
            try:
                self._run_task(claim, task, seeds, runs, files, wait)
            except TimeLimit as e:
                late.append(e)
            except RunsHeld as e:
                held.append(e)
        never = next((e for e in late if e.never), None)
        if never is not None:
            raise never
        if held:  # retried with wait=True (RunsHeld never then): the late tasks raise again
            raise held[0]
        if late:
            raise late[0]
        sweep = {f'{m} on {t}': dict(lr=lr, weight_decay=wd)
                 for (t, m), (lr, wd) in self.choices.items() if m in claim.models
                 and t in {c['task'] for c in claim.cells}}
        if claim.protocol is not None:  # no sweep: the claim's fixed point for every model
            sweep = {f'{m} on {t}': dict(lr=claim.protocol[0], weight_decay=claim.protocol[1],
                                         fixed=True)
                     for t in {c['task'] for c in claim.cells} for m in claim.models}
        if claim.evaluate is not None:
            records = claim.evaluate(self, claim, runs, study_seeds, sweep)
        else:
            records = [self.record(comparison, claim, runs, seeds, sweep)
                       for comparison in claim.comparisons]
        for r in records:
            r['files'] = [os.path.relpath(f, self.out) for f in files]
        return records, runs

    def _run_task(self, claim: Claim, task: str, seeds: int, runs: List[Dict[str, object]],
                  files: List[str], wait: bool) -> None:
        r"""The part of :meth:`run` on one task: its sweep, its runs (added to :obj:`runs` and
        their files to :obj:`files`)."""
        cells = [self.sized(c) for c in claim.cells if c['task'] == task]
        held: Optional[RunsHeld] = None
        if claim.protocol is None:  # a model whose sweep another process holds up waits;
            chosen, held = self._sweep_some(task, claim.models, wait)  # the others train
        else:
            chosen = {m: claim.protocol for m in claim.models}

        def config_of(c, spec):
            lr, wd = chosen[spec]
            return self.claim_config(claim, task, lr, wd)
        jobs = [(c, m, k, config_of(c, m)) for c in cells for m in claim.models
                if m in chosen for k in range(seeds)]
        try:
            self._train_missing(jobs, wait=wait, need_weights=claim.keep_weights)
        except TimeLimit as e:  # the held sweep first, as when it held up every model's runs
            if held is None or e.never:
                raise
            raise held from e
        finally:
            if claim.keep_weights:  # with the claim's results (runs trained for another claim
                for job in jobs:  # first, e.g. Table 7's, have theirs in runs/ only)
                    self.store.keep(*job)
        if held is not None:
            raise held
        task_runs, _ = self._grid(cells, claim.models, seeds, config_of)
        runs += task_runs
        files += [self.store.files(*job) for job in jobs]

    def status(self, claim: Claim, calibrate: bool = False) -> List[Dict[str, Any]]:
        r"""Where :obj:`claim` stands, without training or waiting: one entry per stage (each
        task's sweep, then the claim's runs on that task), with the number of runs ``done``,
        ``training`` (held by another process), ``started`` (a checkpoint to resume) and
        ``pending`` (with ``again``, how many of those are finished runs to be trained again:
        a claim that scores its models and whose weights are not here), the epochs run by
        unfinished runs, and ``left_s``, an estimate of the
        training time still needed by the stage's known runs (each run not done counts the
        mean wall time of the finished runs of its model on its task, less the share of its
        epochs already run; :obj:`None` when a model has no finished run to go by). A sweep
        that may still step beyond its grid, and the runs of a claim whose sweep is not
        chosen yet, are ``unknown`` (counted, not estimated).

        The claim's runs of a model whose sweep has chosen are counted as they stand; those of
        a model whose sweep has not are ``unknown`` (note ``'after the sweep'``). ``runs``
        maps an id of every run not done to ``(seconds known, seconds estimated)`` (either
        :obj:`None`), so that runs two claims share (a sweep, Table 4's cells in
        ``table7-rot``) can be counted once across claims.

        With :obj:`calibrate`, a model with no finished run on its task is timed now
        (:meth:`timed_epoch`) and counted at that time per epoch for the store's mean epochs
        per finished run (:meth:`RunStore.mean_epochs`; the budget's maximum without any); the
        runs after a sweep not chosen yet are estimated the same way (each model's mean wall
        time where it has finished runs), in ``estimated_s``; ``timed`` lists the models
        timed (a model whose timing fails is left out, its error in :attr:`timing_errors`).
        Points a sweep may still add beyond its grid stay unestimated."""
        study_seeds = self.seeds or self.budget.seeds or claim.paper_seeds
        seeds = study_seeds * claim.members
        stages = []
        for task in dict.fromkeys(c['task'] for c in claim.cells):
            chosen, jobs, open_sweep = self._claim_points(claim, task)
            if jobs:
                stages.append(self._stage_status(
                    f"sweep on {task} ({self.sweep_cells[task]['label']})", task, jobs,
                    unknown=len(open_sweep), note=', '.join(open_sweep), calibrate=calibrate,
                    open_models=open_sweep))
            cells = [self.sized(c) for c in claim.cells if c['task'] == task]
            label = f"{claim.name} runs on {task}"
            ready = [m for m in claim.models if chosen[m] is not None]
            waiting = [m for m in claim.models if chosen[m] is None]

            def config_of(spec: str, task=task) -> TrainConfig:
                lr, wd = chosen[spec]
                return self.claim_config(claim, task, lr, wd)
            entry = self._stage_status(label, task, [
                (c, m, k, config_of(m)) for c in cells for m in ready
                for k in range(seeds)], need_weights=claim.keep_weights, calibrate=calibrate)
            if waiting:  # their runs' configuration is not known before their sweep chooses
                entry.update(unknown=len(cells) * len(waiting) * seeds, note='after the sweep')
                for m in waiting:
                    whole = self._run_seconds(task, m) if calibrate else None
                    if calibrate and whole is not None:
                        entry['estimated_s'] += whole * len(cells) * seeds
                        if self.store.mean_time(task, m) is None:
                            entry['timed'] = sorted(set(entry['timed']) | {m})
                    entry['runs'].update({json.dumps([c['label'], c['kwargs'], m, k],
                                                     sort_keys=True, default=str): (None, whole)
                                          for c in cells for k in range(seeds)})
            stages.append(entry)
        return stages

    def _expected_epochs(self) -> float:
        mean = self.store.mean_epochs()
        return float(self.budget.epochs) if mean is None else mean

    def _run_seconds(self, task: str, spec: str) -> Optional[float]:
        r"""A whole run's expected time (s): the mean wall time of the finished runs of
        :obj:`spec` on :obj:`task`, or :meth:`timed_epoch` x the store's mean epochs
        (:obj:`None` where timing fails)."""
        mean = self.store.mean_time(task, spec)
        if mean is not None:
            return mean[0]
        per_epoch = self._timed_or_none(task, spec)
        return None if per_epoch is None else per_epoch * self._expected_epochs()

    def finished_runs(self, claim: Claim) -> List[Dict[str, Any]]:
        r"""The claim's finished runs (cells x models x seeds at each model's chosen sweep
        point), one row each: cell, model, seed, the chosen ``lr`` and ``weight_decay``, test
        R², epochs run, best epoch, whether it stopped early, the paper's R² for the cell
        and model where the claim quotes one, the validation loss of every epoch
        (``val_loss_curve``), and the code that trained it as its record names it (``code``,
        the commit of the process that finished it, :obj:`None` where the record has none,
        and ``code_history``, that of its start and of every resume, where the record has it).
        Models whose sweep has not chosen yet have no
        rows. Trains nothing (the runs :meth:`status` counts as done, with their figures)."""
        seeds = (self.seeds or self.budget.seeds or claim.paper_seeds) * claim.members
        rows: List[Dict[str, Any]] = []
        for task in dict.fromkeys(c['task'] for c in claim.cells):
            chosen, _, _ = self._claim_points(claim, task)
            for cell in claim.cells:
                if cell['task'] != task:
                    continue
                sized = self.sized(cell)
                for spec in claim.models:
                    point = chosen[spec]
                    if point is None:
                        continue
                    config = self.claim_config(claim, task, point[0], point[1])
                    for seed in range(seeds):
                        record = self.store.read(sized, spec, seed, config)
                        if record is None:
                            continue
                        rows.append(dict(
                            claim=claim.name, cell=cell['label'], model=spec, seed=seed,
                            lr=point[0], weight_decay=point[1],
                            r2=float(record.get('test', {}).get('r2', math.nan)),
                            epochs_run=int(record.get('epochs_run', 0)),
                            best_epoch=record.get('best_epoch'),
                            stopped_early=stopped_early(record),
                            diverged='diverged' in record,
                            paper=claim.paper_r2.get((cell['label'], spec)),
                            val_loss_curve=list(record.get('val_loss_curve') or []),
                            code=record.get('code'),
                            **({'code_history': record['code_history']}
                               if 'code_history' in record else {})))
        return rows

    def sweep_landscape(self, task: str, models: Sequence[str]) -> List[Dict[str, Any]]:
        r"""Every sweep point of :obj:`models` on :obj:`task` reached so far (the grid and the
        steps beyond it, as :meth:`sweep` takes them), one row each: model, ``lr``,
        ``weight_decay``, whether its seed-0 run on the sweep cell is finished, its best
        validation loss (the sweep's criterion) and test R², epochs run, and whether it is the
        model's chosen point (:obj:`None` while the model's sweep is open). Shows whether each
        model's choice lies inside the points tried, so that every model was tuned to an
        optimum of the same search. Trains nothing."""
        chosen, jobs, _ = self._sweep_rounds(task, models, lambda jobs: None)
        rows: List[Dict[str, Any]] = []
        for cell, spec, seed, config in jobs:
            record = self.store.read(cell, spec, seed, config)
            point = (config.lr, config.weight_decay)
            rows.append(dict(
                task=task, cell=cell.get('label'), model=spec, lr=config.lr,
                weight_decay=config.weight_decay, done=record is not None,
                val_loss=(None if record is None
                          else float(record.get('val', {}).get('loss', math.inf))),
                r2=(None if record is None
                    else float(record.get('test', {}).get('r2', math.nan))),
                epochs_run=None if record is None else int(record.get('epochs_run', 0)),
                chosen=None if chosen[spec] is None else chosen[spec] == point))
        return rows

    def _claim_points(self, claim: Claim, task: str):
        r"""Each model's ``(lr, weight_decay)`` on :obj:`task` for :obj:`claim` as far as the
        store tells (:meth:`_sweep_rounds` without training), or the claim's fixed
        :attr:`Claim.protocol` (no sweep runs)."""
        if claim.protocol is not None:
            chosen: Dict[str, Optional[Tuple[float, float]]] = {
                m: claim.protocol for m in claim.models}
            return chosen, [], []
        return self._sweep_rounds(task, claim.models, lambda jobs: None)

    def _sweep_rounds(self, task: str, models: Sequence[str],
                      settle: Callable[[List[Tuple]], None]):
        r"""The rounds of :meth:`sweep`: the grid, then, with the budget's ``extend_sweep``, the
        points :func:`sweep_extension` adds while a model's best point lies on the edge of the
        points it has tried. :obj:`settle` is called with each round's runs (the sweep trains
        them; :meth:`status` does nothing); a model whose runs of a round are not all in the
        store after it stops there. Returns each model's chosen point (:obj:`None` while
        open), every run of the rounds reached, and the models that stopped before their last
        possible round (whose sweep may still add points)."""
        grid = self.budget.sweep
        if len(grid) == 1:
            return {m: grid[0] for m in models}, [], []
        cell = self.sized(self.sweep_cells[task])

        def config(lr: float, wd: float) -> TrainConfig:
            return replace(self.base_config(task), lr=lr, weight_decay=wd)
        chosen: Dict[str, Optional[Tuple[float, float]]] = {m: None for m in models}
        points = {m: list(grid) for m in models}
        todo = {m: list(grid) for m in models}
        active, stopped, every = list(models), [], []
        rounds = SWEEP_MAX_STEPS if self.budget.extend_sweep else 0
        for extension in range(rounds + 1):
            jobs = ([(cell, m, 0, config(lr, wd)) for lr, wd in grid for m in active]
                    if extension == 0 else  # the grid point by point, then model by model
                    [(cell, m, 0, config(lr, wd)) for m in active for lr, wd in todo[m]])
            every += jobs
            settle(jobs)
            ready = [m for m in active if all(self.store.stored(*job) for job in jobs
                                              if job[1] == m)]
            stopped += [m for m in active if m not in ready and extension < rounds]
            active = []
            for m in ready:
                best, learned = self._best_point(cell, m, points[m], config)
                # (where every point diverged, grid[0] is no best to step beyond: the rounds
                # beyond it trained up to three more runs that diverged as well)
                todo[m] = [p for p in sweep_extension(points[m], best)
                           if p not in points[m]] if learned else []
                if extension == rounds or not todo[m]:
                    chosen[m] = best
                else:
                    points[m] += todo[m]
                    active.append(m)
            if not active:
                break
        return chosen, every, stopped

    def _stage_status(self, label: str, task: str, jobs, unknown: int = 0,
                      note: str = '', need_weights: bool = False, calibrate: bool = False,
                      open_models: Sequence[str] = ()) -> Dict[str, Any]:
        counts = dict(done=0, training=0, started=0, pending=0)
        epochs, left, known, again = 0, 0.0, True, 0
        each: List[int] = []  # the epochs of every unfinished run begun
        estimated, timed = 0.0, set()
        runs: Dict[str, Tuple[Optional[float], Optional[float]]] = {}
        for cell, spec, seed, config in jobs:
            state, run_epochs = self.store.state(cell, spec, seed, config)
            redo = (state == 'done' and need_weights
                    and self._weights_lost(cell, spec, seed, config))
            if redo:  # to be trained again (see _train_missing)
                again += 1
                run_epochs = self.store.epochs_run(cell, spec, seed, config)
                with self.store.lock(cell, spec, seed, config, wait=False) as free:
                    state = ('started' if run_epochs else 'pending') if free else 'training'
            counts[state] += 1
            if state == 'done':
                continue
            epochs += run_epochs
            if state in ('training', 'started'):  # (begun: their epochs, 0 included)
                each.append(run_epochs)
            run = json.dumps(run_key(cell, spec, seed, config), sort_keys=True, default=str)
            mean = self.store.mean_time(task, spec)
            if mean is None:
                known = False
                guess = None
                if calibrate:
                    per_epoch = self._timed_or_none(task, spec)
                    if per_epoch is not None:
                        timed.add(spec)
                        guess = per_epoch * max(0.0, self._expected_epochs() - run_epochs)
                        estimated += guess
                runs[run] = (None, guess)
                continue
            needed = self.time_needed(cell, spec, seed, config, again=redo) or 0.0
            left += needed
            estimated += needed
            runs[run] = (needed, needed)
        entry: Dict[str, Any] = dict(
            stage=label, task=task, **counts, epochs=epochs, epochs_each=sorted(each),
            left_s=left if known else None,
            unknown=unknown, again=again, runs=runs, open=list(open_models),
            note=f'may step beyond the grid: {note}' if note else '')
        if calibrate:
            entry.update(estimated_s=estimated, timed=sorted(timed))
        return entry

    def _timed_or_none(self, task: str, spec: str) -> Optional[float]:
        r""":meth:`timed_epoch`, or :obj:`None` where timing fails (the error is kept in
        :attr:`timing_errors`: one model that cannot run here does not end the status)."""
        try:
            return self.timed_epoch(task, spec)
        except Exception as e:  # e.g. missing data or an optional package
            self.timing_errors[(task, spec)] = f'{type(e).__name__}: {e}'
            return None

    def record(self, comparison: Comparison, claim: Claim, runs: Sequence[Mapping[str, Any]],
               seeds: int, sweep: Mapping[str, Any]) -> Dict[str, object]:
        r"""The summary record of one comparison from the runs of its cell."""
        cell_runs = [r for r in runs if r['cell'] == comparison.cell]
        r2 = {m: {int(r['seed']): float(r['test'].get('r2', math.nan)) for r in cell_runs
                  if r['model'] == m} for m in claim.models}
        # each model's spread over its seeds: the sample standard deviation (ddof 1), as the
        # verdict's s of the differences below (NaN for one seed)
        figures = {m: dict(r2=mean_or_nan(list(v.values())),
                           r2_std=std_or_nan(list(v.values()), ddof=1), seeds=len(v))
                   for m, v in r2.items()}
        # a baseline with a diverged run (R² NaN) makes the comparison inconclusive, as a
        # diverged run of the model does: passing over it (as the weakest) compared the model
        # with the next baseline, which could only favour the model
        failed = [m for m in comparison.b if not math.isfinite(figures[m]['r2'])]
        b = failed[0] if failed else max(comparison.b, key=lambda m: figures[m]['r2'])
        common = sorted(set(r2[comparison.a]) & set(r2[b]))
        diffs = [r2[comparison.a][k] - r2[b][k] for k in common]
        mean, spread = mean_or_nan(diffs), std_or_nan(diffs, ddof=1)
        # rule 1: a missing run (a seed of A or of a model of B without one) is inconclusive,
        # however many seeds are left to compare
        missing = any(len(r2[m]) < seeds for m in (comparison.a, ) + tuple(comparison.b))
        cell = next(c for c in claim.cells if c['label'] == comparison.cell)
        return dict(
            claim=f'{comparison.claim} {comparison.cell}: R²({comparison.a}) - R²({b})',
            paper=dict(value=comparison.paper, source=comparison.source, text=comparison.text),
            ours=dict(mean=mean, std=spread, seeds=len(diffs), a=comparison.a, b=b,
                      models=figures),
            budget=self.budget.name, n_train=self.sized(cell)['kwargs']['n_train'],
            epochs_run=epochs_figures(cell_runs),
            seeds=seeds, sweep=dict(sweep),
            verdict=verdict(comparison.paper, mean, spread, len(diffs),
                            levels=(figures[comparison.a]['r2'], figures[b]['r2'],
                                    claim.paper_r2.get((comparison.cell, comparison.a),
                                                       math.nan)), complete=not missing),
            command=self.command(claim.name))

    def command(self, claim: str) -> str:
        r"""The command line that reproduces :obj:`claim`'s records: its budget, and
        ``--seeds`` wherever the run was given them (even at the budget's own number)."""
        return (f'python benchmarks/reproduce.py --budget {self.budget.name} --claims {claim}'
                + ('' if self.seeds is None else f' --seeds {self.seeds}'))


def run_claims(repro: 'Reproduction', claims: Sequence[Claim],
               on_start: Optional[Callable[[Claim], None]] = None,
               on_held: Optional[Callable[[Claim, 'RunsHeld'], None]] = None,
               errors: Tuple[Type[BaseException], ...] = ()):
    r"""Runs :obj:`claims` with :obj:`repro` and yields ``(claim, records, error)`` as each
    finishes (``error`` an exception of a type in :obj:`errors`, then ``records`` is
    :obj:`None`). A claim whose next runs another process is training (:class:`RunsHeld`) goes
    back to the end of the queue and the others are worked on meanwhile; it waits only when every
    claim left is waiting, so that copies of one reproduction keep both cores busy across claims.
    :obj:`on_start` is called with each claim as it is tried, :obj:`on_held` with a claim and the
    exception when it goes back to the queue. A claim that reaches :obj:`repro`'s time limit
    (:class:`TimeLimit`) is yielded with that exception as its ``error`` and not tried again;
    the claims after it are (their runs may be shorter)."""
    pending, deferred = list(claims), 0
    while pending:
        claim = pending.pop(0)
        if on_start is not None:
            on_start(claim)
        try:
            # wait for another process's runs only when every claim left has been tried
            records, _ = repro.run(claim, wait=deferred > len(pending))
        except RunsHeld as e:
            if on_held is not None:
                on_held(claim, e)
            pending.append(claim)
            deferred += 1
            continue
        except TimeLimit as e:
            yield claim, None, e
            continue
        except errors as e:
            deferred = 0
            yield claim, None, e
            continue
        deferred = 0
        yield claim, records, None
