r"""Partial reports: what the benchmark scripts that write their report after every measurement
(``scaling.py``, ``message_passing.py``, ``training_step.py``, ``speed.py``, ``launches.py``,
``compile_graphs.py``, ``kernels.py``) share about ``--resume`` and ``--overwrite``.

Such a script writes ``<out>/<name>.partial.{json,md}`` while measurements remain, and the
complete report (which removes the partial one: :func:`~torch_mz.study.remove_results`) after
the last. A later call keeps the partial report's measurements with ``--resume`` (where it was
written with the same settings) or makes every one again with ``--overwrite``; without either, a
folder holding a partial report is refused, so that no interrupted run is lost unasked. Nor is a
measured report replaced unasked: without ``--overwrite`` a folder holding the complete report
of another command (other settings) is refused, and a run of the same settings whose
measurements fail where that report made them keeps it, its own report left partial (``lost``:
those measurements, which ``--resume`` makes again), unless it was begun with ``--overwrite``
(a call that resumes it after Ctrl-C replaces that report as the first was asked to).

* :class:`PartialUnit`: what a script's report holds, as its messages name it;
* :func:`add_partial_arguments`: the two options, with help texts naming the unit;
* :func:`partial_problem`: the usage error of a call that gives both, or neither where a partial
  report is held;
* :func:`read_partial`: a partial report read back for ``--resume``, refused (a
  :class:`ValueError` that says to pass ``--overwrite``) where it is damaged or was written with
  other settings, or in another environment (:func:`settings_differ`; the message names both
  commands, as :func:`resume_problem`'s);
* :func:`in_turn`: the measurements of a run in their order, those a partial report kept read
  back, and when to write the report (:class:`Turn`);
* :func:`write_results_so_far`: the partial report, or the complete one that replaces it
  (recording the partial one's SHA-256, :func:`replaced_partial`);
* :func:`replace_problem`: the usage error of a call that would replace, without
  ``--overwrite``, the complete report of another command (other settings) in ``--out``;
* :func:`resume_problem`: the usage error of a call given ``--resume`` where ``--out`` holds the
  partial report of another command (other settings), which it would replace;
* :func:`same_settings_report`: the complete report in ``--out`` where it was written with this
  run's settings: the measurements that, failing in this run, its report would lose (the
  scripts then keep that report and leave theirs partial, listing them as ``lost``).
* :func:`overwriting`: whether a partial report was begun by a call given ``--overwrite``,
  whose resumed run replaces the complete report whatever fails (its payload's ``overwrite``).
* :func:`remove_stale_partial`: removes the partial report that a run stopped between writing
  its complete report and removing the partial one left beside it (:class:`StalePartial`);
  :func:`stale_partial_done` calls it at a script's start.

A report records its settings under ``config`` (``setup`` in those that
:func:`~torch_mz.study.write_report` writes: the functions that read one take the key as
``record``).

Library code: nothing here prints or parses a command line (the scripts pass the problems found to
``parser.error``).
"""
import argparse
import hashlib
import json
import os
from typing import (Any, Callable, Dict, Hashable, Iterator, List, Mapping, NamedTuple, Optional,
                    Sequence)

from torch_mz.study.report import remove_results, write_results


class PartialUnit(NamedTuple):
    r"""What a script's partial report holds, as its options and messages name it: ``keeps
    the sizes``, ``measure every size again``.

    Args:
        what (str): the units as the report holds them, plural (``'sizes'``,
            ``'(block, batch) pairs'``).
        one (str): one unit, which ``'s'`` makes plural where the messages name them short
            (``'size'``, ``'pair'``).
        verb (str, optional): what a run does to make one, ``'measure'`` or ``'make'``
            (default: ``'measure'``).
    """
    what: str
    one: str
    verb: str = 'measure'


def add_partial_arguments(parser: argparse.ArgumentParser, unit: PartialUnit,
                          resume_note: str = '', overwrite_note: str = '',
                          resume_help: Optional[str] = None,
                          overwrite_help: Optional[str] = None) -> None:
    r"""Adds ``--resume`` and ``--overwrite`` (flags) to :obj:`parser`, with help texts naming
    :obj:`unit`: ``--resume`` keeps the units of the partial report an interrupted run left in
    ``--out``, ``--overwrite`` makes every one again (and replaces that report). Both may be
    given to the parser: :func:`partial_problem` refuses them together, with the message the
    script's users know.

    Args:
        parser (argparse.ArgumentParser): the script's parser.
        unit (PartialUnit): what the report holds.
        resume_note (str, optional): text appended to ``--resume``'s help (default: ``''``).
        overwrite_note (str, optional): text appended to ``--overwrite``'s help
            (default: ``''``).
        resume_help (str, optional): ``--resume``'s whole help, in place of the one built from
            :obj:`unit` (default: :obj:`None`).
        overwrite_help (str, optional): ``--overwrite``'s whole help, likewise
            (default: :obj:`None`).
    """
    if resume_help is None:
        resume_help = (f'keep the {unit.what} of the partial report an interrupted run with '
                       f'these settings left in --out; {unit.verb} only the others{resume_note}')
    if overwrite_help is None:
        overwrite_help = (f'{unit.verb} every {unit.one} where --out holds the partial report of '
                          f'an interrupted run, which this run replaces (without it, and '
                          f'without --resume, such a folder is refused){overwrite_note}')
    parser.add_argument('--resume', action='store_true', help=resume_help)
    parser.add_argument('--overwrite', action='store_true', help=overwrite_help)


def partial_problem(resume: bool, overwrite: bool, partial: Optional[str], unit: PartialUnit,
                    held_note: str = '', keeps: str = 'them') -> Optional[str]:
    r"""The usage error of a call given ``--resume`` and ``--overwrite`` together, or given
    neither where ``--out`` holds the partial report :obj:`partial` (a file there); else
    :obj:`None`. The message starts with the option it names (``argument --overwrite: ...``),
    as argparse's own do: the script passes it to ``parser.error``.

    Args:
        resume (bool): ``--resume`` was given.
        overwrite (bool): ``--overwrite`` was given.
        partial (str, optional): the path of the partial report in ``--out``; :obj:`None`
            where this call writes none (only the two options together are then refused).
        unit (PartialUnit): what the report holds.
        held_note (str, optional): text after ``holds the <units> of an interrupted run``
            (default: ``''``).
        keeps (str, optional): what ``--resume`` keeps of them (default: ``'them'``).
    """
    if resume and overwrite:
        return (f'argument --overwrite: not allowed with --resume (which keeps the {unit.one}s '
                f'that --overwrite {unit.verb}s again)')
    if partial is not None and os.path.exists(partial) and not (resume or overwrite):
        return (f'argument --out: {partial} holds the {unit.what} of an interrupted '
                f'run{held_note}: pass --resume to keep {keeps}, or --overwrite to {unit.verb} '
                f"every {unit.one} again (this run's report replaces them)")
    return None


def _same_setting(there: Any, here: Any) -> bool:
    # equal; a list of this run's (of distinct values, as the scripts' list options parse them)
    # is the same list in another order, or its comma-separated text, as reports written
    # before the scripts' list options were parsed into lists keep it ('pyg, rigid')
    if isinstance(here, (list, tuple)):
        if isinstance(there, str):
            there, here = [v.strip() for v in there.split(',')], [str(v) for v in here]
        if isinstance(there, (list, tuple)):
            return (len(there) == len(here) and all(v in here for v in there)
                    and all(v in there for v in here))
    return bool(there == here)


def settings_differ(there: Mapping[str, Any], here: Mapping[str, Any],
                    keys: Sequence[str]) -> List[str]:
    r"""One phrase per key of :obj:`keys` whose value in :obj:`there` (a report's, where a
    missing key reads as :obj:`None`) is not the one in :obj:`here` (this run's):
    ``"sets 64 there, 32 here"``; none where they all agree (a list of :obj:`here` agrees with
    the same values in another order, the same run's, and with its comma-separated text there,
    as older reports recorded it)."""
    return [f'{key} {there.get(key)!r} there, {here[key]!r} here'
            for key in keys if not _same_setting(there.get(key), here[key])]


def read_partial(path: str, args: argparse.Namespace, settings: Sequence[str],
                 unit: PartialUnit, keep: Optional[Callable[[Dict[str, Any]], Any]] = None,
                 env: Optional[Mapping[str, Any]] = None,
                 environment: Sequence[str] = (), record: str = 'config',
                 command: Optional[str] = None) -> Any:
    r"""The partial report :obj:`path` read back for ``--resume``: what :obj:`keep` takes from
    its JSON object (the object itself without :obj:`keep`).

    The report must hold a ``config`` (:obj:`record`) whose :obj:`settings` are this run's
    (:obj:`args`) and,
    where :obj:`environment` names keys, an ``environment`` whose values for them are those of
    :obj:`env` (this run's; not compared where :obj:`None`). A file that cannot be read (not
    JSON, a key missing, or :obj:`keep` failing on it) raises a :class:`ValueError`
    ``"<path> cannot be read (...): pass --overwrite to <make> every <unit> again"``; one written
    with other settings, or in another environment, a :class:`ValueError` that names both
    commands (the report's, and :obj:`command`, this run's), as :func:`resume_problem`'s
    message does, and every setting that differs (:func:`settings_differ`), and says to pass
    ``--overwrite``. The caller checks first that :obj:`path` exists.

    Args:
        path (str): the partial report (``<out>/<name>.partial.json``).
        args (argparse.Namespace): this run's options.
        settings (Sequence[str]): the options the report's ``config`` must share with
            :obj:`args`.
        unit (PartialUnit): what the report holds (for the message of a damaged file).
        keep (Callable, optional): takes from the report's JSON object what the run keeps
            (:obj:`None`: the object itself) (default: :obj:`None`).
        env (Mapping, optional): this run's environment (default: :obj:`None`).
        environment (Sequence[str], optional): the keys of :obj:`env` the report's
            ``environment`` must share (default: ``()``).
        record (str, optional): the key of the report's settings (default: ``'config'``).
        command (str, optional): this run's command line, which the message of a report of
            other settings names (default: :obj:`None`: the ``command`` of :obj:`env`, where
            it holds one).
    """
    try:
        with open(path) as f:
            report = json.load(f)
        config = report[record]
        there = {key: config.get(key) for key in settings}
        measured_in = ({key: dict(report['environment']).get(key) for key in environment}
                       if environment else {})
        kept = report if keep is None else keep(report)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f'{path} cannot be read ({e}): pass --overwrite to {unit.verb} every '
                         f'{unit.one} again') from None
    differ = settings_differ(there, vars(args), settings)
    if env is not None:  # (the measurements of other threads or versions: one table mixed them)
        differ += settings_differ(measured_in, env, environment)
    if differ:
        if command is None and env is not None and env.get('command') is not None:
            command = str(env['command'])
        raise ValueError(_other_command_text(path, 'partial', report, differ, args, command))
    return kept


class Turn(NamedTuple):
    r"""One measurement of a run, as :func:`in_turn` yields it.

    Attributes:
        key (Hashable): the measurement (its key in the run's plan).
        value (Any): what it gave: made now, or kept from the run resumed.
        kept (bool): whether :attr:`value` was kept (``--resume``), not made now.
        reached (list): the values of the keys reached so far and the kept values of those
            not reached yet, in the plan's order: what the report shows now (a report written
            with the keys reached alone lost the kept ones ahead, were the run stopped then).
        pending (int): the keys not reached yet that are not kept: the measurements left.
        write (bool): whether the report is to be written now: :obj:`False` for a kept value
            where nothing changed since the report last written (or, before any was written,
            where keys remain: a run that keeps them all writes its complete report once, at
            the last).
    """
    key: Hashable
    value: Any
    kept: bool
    reached: List[Any]
    pending: int
    write: bool


def in_turn(plan: Sequence[Hashable], kept: Mapping[Hashable, Any],
            make: Callable[[Hashable], Any]) -> Iterator[Turn]:
    r"""Goes through the measurements :obj:`plan` in order, each one's value taken from
    :obj:`kept` where it holds it (the partial report resumed, ``--resume``) or made by
    :obj:`make` (measured now), and yields a :class:`Turn` after each, which says what the
    report shows and whether to write it: a script that writes its report after every
    measurement, as the partial report while :attr:`Turn.pending` ones remain, loses none of
    them to a stop (Ctrl-C, a failure) and keeps those it resumed."""
    values: List[Any] = []
    wrote = False
    for done, key in enumerate(plan, 1):
        was_kept = key in kept
        values.append(kept[key] if was_kept else make(key))
        ahead = [kept[k] for k in plan[done:] if k in kept]
        write = not (was_kept and (wrote or done < len(plan)))
        wrote = wrote or write
        yield Turn(key, values[-1], was_kept, values + ahead, len(plan) - done - len(ahead),
                   write)


def write_results_so_far(out: str, name: str, payload: Dict[str, object], markdown: str,
                         complete: bool) -> None:
    r"""Writes a script's report as it stands (:func:`~torch_mz.study.write_results`): while
    measurements remain (not :obj:`complete`), the partial report
    ``<out>/<name>.partial.{json,md}``, which leaves an earlier run's complete report alone;
    else the complete report ``<out>/<name>.{json,md}``, which then removes the partial one.
    The complete report records the SHA-256 of the partial JSON it replaces
    (``replaces_partial``), so that a partial report left beside it by a run stopped between
    the two steps is known for that one (:func:`remove_stale_partial`), whatever the files'
    modification times say."""
    if complete:
        payload = dict(payload, **replaced_partial(out, name))
    write_results(out, name if complete else f'{name}.partial', payload, markdown)
    if complete:  # the complete report replaces the partial one
        remove_results(out, f'{name}.partial')


def replaced_partial(out: str, name: str) -> Dict[str, str]:
    r"""The entry a complete report ``<out>/<name>.json`` records of the partial report
    ``<out>/<name>.partial.json`` it replaces: ``{'replaces_partial': <its SHA-256>}``, or
    ``{}`` where there is none (:func:`write_results_so_far` adds it; a script that writes its
    complete report otherwise adds it to the payload itself)."""
    digest = _file_sha256(os.path.join(out, f'{name}.partial.json'))
    return {} if digest is None else {'replaces_partial': digest}


def _file_sha256(path: str) -> Optional[str]:
    # the SHA-256 of the file path's bytes, None where it cannot be read (none there)
    try:
        with open(path, 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _read_report(path: str, record: str = 'config') -> Optional[Dict[str, Any]]:
    # the JSON object of the report path, None where there is none, or it cannot be read or
    # holds no settings object under record (no report of these scripts: a run replaces it)
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get(record), dict):
        return None
    return report


def _recorded_differ(report: Mapping[str, Any], args: argparse.Namespace,
                     settings: Sequence[str], predated: Optional[Mapping[str, Any]] = None,
                     record: str = 'config') -> List[str]:
    # settings_differ on the settings the report records, and on those it predates where
    # predated names the value such a report was made with (other ones are not compared)
    config = dict(predated or {}, **report[record])
    return settings_differ(config, vars(args), [key for key in settings if key in config])


def same_settings_report(path: str, args: argparse.Namespace, settings: Sequence[str],
                         predated: Optional[Mapping[str, Any]] = None, record: str = 'config'
                         ) -> Optional[Dict[str, Any]]:
    r"""The complete report :obj:`path` (``<out>/<name>.json``) as its JSON object where it
    was written with this run's :obj:`settings` (:obj:`args`; a setting the report does not
    record under :obj:`record`, being older than it, is compared as the value :obj:`predated`
    names for it, a switch added later as off, and not compared where it names none), else
    :obj:`None` (none there, one that cannot be read, or one of other settings): the report
    whose measurements a run that replaces it loses where they fail in that run."""
    report = _read_report(path, record)
    if report is None or _recorded_differ(report, args, settings, predated, record):
        return None
    return report


def _other_command_problem(path: str, kind: str, args: argparse.Namespace,
                           settings: Sequence[str], command: str,
                           predated: Optional[Mapping[str, Any]], record: str) -> Optional[str]:
    # the usage error of a run that would replace the report path (kind: 'complete' or
    # 'partial'), written with other settings than args: it names both commands and the
    # settings that differ; None where there is no such report or it has these settings
    report = _read_report(path, record)
    if report is None:
        return None
    differ = _recorded_differ(report, args, settings, predated, record)
    if not differ:
        return None
    option = '--resume' if kind == 'partial' else '--out'
    return f'argument {option}: ' + _other_command_text(path, kind, report, differ, args, command)


def _other_command_text(path: str, kind: str, report: Mapping[str, Any], differ: Sequence[str],
                        args: argparse.Namespace, command: Optional[str]) -> str:
    # what a run that would replace the report path (kind: 'complete' or 'partial') of other
    # settings (differ) is told: both commands (the report's, and command, this run's; not
    # named where None), the settings that differ, and to pass --overwrite
    environment = report.get('environment')
    theirs = environment.get('command') if isinstance(environment, dict) else None
    whose = ('another command (an unknown one)' if theirs is None
             else f'this same command line run by older code or elsewhere (`{theirs}`)'
             if theirs == command else f'another command (`{theirs}`)')
    this_run = 'this run' if command is None else f'this run (`{command}`)'
    return (f"{path} is the {kind} report of {whose}, written with other settings "
            f"({'; '.join(differ)}), which {this_run} would replace: pass --overwrite"
            f"{' (in place of --resume)' if getattr(args, 'resume', False) else ''} to replace "
            f"it, or give another --out")


def replace_problem(path: str, args: argparse.Namespace, settings: Sequence[str],
                    command: str, overwrite: bool, resumed: bool,
                    predated: Optional[Mapping[str, Any]] = None,
                    record: str = 'config') -> Optional[str]:
    r"""The usage error of a call whose report would replace, at its end, the complete report
    :obj:`path` (``<out>/<name>.json``) of another command: one written with other
    :obj:`settings` than this run's (:obj:`args`; compared as :func:`same_settings_report`
    does, with :obj:`predated` and :obj:`record`), which is refused before anything is
    measured unless :obj:`overwrite` (``--overwrite``) is given, or :obj:`resumed`
    (``--resume`` keeps a partial report there: the call that began it was let replace that
    report). The message names both commands (the report's, :obj:`command` this run's; the
    same command line, where older code or another machine resolved its defaults otherwise, is
    named as such) and the settings that differ; :obj:`None` where nothing is refused (no
    complete report there, one that cannot be read, or one of these settings, which a run of
    them measures again)."""
    if overwrite or resumed:
        return None
    return _other_command_problem(path, 'complete', args, settings, command, predated, record)


def resume_problem(path: str, args: argparse.Namespace, settings: Sequence[str],
                   command: str, predated: Optional[Mapping[str, Any]] = None,
                   record: str = 'config') -> Optional[str]:
    r"""The usage error of a call given ``--resume`` where :obj:`path`
    (``<out>/<name>.partial.json``) is the partial report of another command: one written with
    other :obj:`settings` than this run's (:obj:`args`; compared as :func:`replace_problem`
    compares a complete report, with :obj:`predated` and :obj:`record`), whose measurements
    this run would not keep and whose report it would replace. The message, as
    :func:`replace_problem`'s, names both commands and the settings that differ, and says to
    pass ``--overwrite`` in place of ``--resume``; :obj:`None` where nothing is refused (no
    partial report there, one that cannot be read, or one of these settings)."""
    return _other_command_problem(path, 'partial', args, settings, command, predated, record)


class StalePartial(NamedTuple):
    r"""What :func:`remove_stale_partial` found and did.

    Attributes:
        note (str): the line for the script to print: the stale report removed, or (where
            :attr:`finished`) that nothing is left to resume.
        finished (bool): the call was given ``--resume`` (without ``--overwrite``) and the
            complete report is of its settings: the run it goes on with is complete, and the
            script stops there (nothing to measure, nothing to write).
    """
    note: str
    finished: bool


def _stale_partial(path: str, complete: str, settings: Sequence[str],
                   predated: Optional[Mapping[str, Any]], record: str) -> bool:
    # the partial report path is stale: the complete report beside it was written by the run
    # that wrote path, in place of it (it records path's SHA-256 as the partial report it
    # replaces: file times are not read, which a copy of the folder or a coarse file system
    # changes), records the same settings, and path lists no measurements lost. A partial
    # report of any other run (a later one, stopped; one resuming an --overwrite) is kept
    partial, report = _read_report(path, record), _read_report(complete, record)
    if partial is None or report is None or partial.get('lost'):
        return False
    digest = report.get('replaces_partial')
    if not isinstance(digest, str) or digest != _file_sha256(path):
        return False
    theirs = dict(predated or {}, **partial[record])
    ours = dict(predated or {}, **report[record])
    keys = [key for key in settings if key in theirs or key in ours]
    return not settings_differ(theirs, {key: ours.get(key) for key in keys}, keys)


def remove_stale_partial(out: str, name: str, args: argparse.Namespace,
                         settings: Sequence[str], predated: Optional[Mapping[str, Any]] = None,
                         record: str = 'config') -> Optional[StalePartial]:
    r"""Removes the partial report ``<out>/<name>.partial.{json,md}`` where it is stale: the
    complete report ``<out>/<name>.json`` beside it was written in its place by the run that
    wrote it (it records the partial report's SHA-256, :func:`write_results_so_far`), records
    the same :obj:`settings` (compared as :func:`same_settings_report` compares, with
    :obj:`predated` and :obj:`record`), and it lists no measurements lost. A run stopped
    (Ctrl-C) between writing its complete report and removing its partial one
    (:func:`write_results_so_far`) left both: a call given neither option was refused, and one
    given ``--resume`` made again the measurements of the complete report that the partial one
    lacked. The script calls this (:func:`stale_partial_done`) before :func:`partial_problem`.

    Returns :obj:`None` where no stale report was there; else a :class:`StalePartial` whose
    :attr:`~StalePartial.finished` says that the call (given ``--resume`` alone, with the
    settings of the complete report) has nothing left to do."""
    partial = os.path.join(out, f'{name}.partial.json')
    complete = os.path.join(out, f'{name}.json')
    if not _stale_partial(partial, complete, settings, predated, record):
        return None
    remove_results(out, f'{name}.partial')
    finished = (bool(getattr(args, 'resume', False)) and not getattr(args, 'overwrite', False)
                and same_settings_report(complete, args, settings, predated, record) is not None)
    left = ('the partial report beside it, left by a run stopped between writing the one and '
            'removing the other, is removed')
    if finished:
        return StalePartial(f'nothing to resume: {complete} is the complete report of these '
                            f'settings ({left})', True)
    return StalePartial(f'removed {partial}: {complete}, the complete report of the same '
                        f'settings, was written in its place (by a run stopped before it '
                        f'removed it)', False)


def stale_partial_done(out: str, name: str, args: argparse.Namespace, settings: Sequence[str],
                       predated: Optional[Mapping[str, Any]] = None, record: str = 'config', *,
                       say: Callable[[str], None]) -> bool:
    r""":func:`remove_stale_partial` as a script's start calls it: passes its note to
    :obj:`say` (the script's ``print``: nothing here prints) where it removed a stale partial
    report, and returns whether the call has nothing left to do (given ``--resume`` alone beside
    the complete report of its settings), where the script ends without measuring."""
    stale = remove_stale_partial(out, name, args, settings, predated, record)
    if stale is None:
        return False
    say(stale.note)
    return stale.finished


def overwriting(path: str) -> bool:
    r"""Whether the partial report :obj:`path` was written by a call given ``--overwrite`` (or
    by one that resumed such a report): its JSON object's ``overwrite`` is true. A call that
    resumes it replaces the complete report beside it at its end as that call was asked to,
    measurements failing here or not (Ctrl-C's line gives that call with ``--resume`` in place
    of ``--overwrite``); :obj:`False` where there is no such file or it cannot be read."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get('overwrite') is True
