r"""The partial reports of the benchmark scripts that write theirs after every measurement:
``--resume`` / ``--overwrite``, the usage errors of a call, and a report read back (the scripts'
own tests run them end to end: ``tests/test_benchmarks_measure_args.py``,
``tests/test_benchmarks_launches.py``)."""
import argparse
import json

import pytest

import torch_mz.study
from torch_mz.study.partial import (PartialUnit, add_partial_arguments, in_turn, overwriting,
                                    partial_problem, read_partial, remove_stale_partial,
                                    replace_problem, resume_problem, same_settings_report,
                                    settings_differ, write_results_so_far)

SIZES = PartialUnit('sizes', 'size')
COUNTS = PartialUnit('counts', 'count', 'make')


def test_the_names_are_exported():
    for name in ('PartialUnit', 'StalePartial', 'Turn', 'add_partial_arguments', 'in_turn',
                 'overwriting', 'partial_problem', 'read_partial', 'remove_stale_partial',
                 'replace_problem', 'replaced_partial', 'resume_problem', 'same_settings_report',
                 'settings_differ', 'stale_partial_done', 'write_results_so_far'):
        assert name in torch_mz.study.__all__ and hasattr(torch_mz.study, name)


def test_add_partial_arguments_names_the_unit():
    parser = argparse.ArgumentParser()
    add_partial_arguments(parser, COUNTS, resume_note=' (not with --presets)',
                          overwrite_note=', and more')
    helps = {a.dest: a.help for a in parser._actions if a.dest in ('resume', 'overwrite')}
    assert helps == {
        'resume': 'keep the counts of the partial report an interrupted run with these settings '
                  'left in --out; make only the others (not with --presets)',
        'overwrite': 'make every count where --out holds the partial report of an interrupted '
                     'run, which this run replaces (without it, and without --resume, such a '
                     'folder is refused), and more'}
    assert vars(parser.parse_args([])) == dict(resume=False, overwrite=False)
    # both parse: partial_problem refuses them together, with the script's message
    assert vars(parser.parse_args(['--resume', '--overwrite'])) == dict(resume=True,
                                                                       overwrite=True)


def test_add_partial_arguments_takes_whole_help_texts():
    parser = argparse.ArgumentParser()
    add_partial_arguments(parser, SIZES, resume_help='R', overwrite_help='O')
    helps = [a.help for a in parser._actions if a.dest in ('resume', 'overwrite')]
    assert helps == ['R', 'O']


def test_partial_problem(tmp_path):
    partial = str(tmp_path / 'x.partial.json')
    both = ('argument --overwrite: not allowed with --resume (which keeps the sizes that '
            '--overwrite measures again)')
    assert partial_problem(True, True, partial, SIZES) == both
    assert partial_problem(True, True, None, SIZES) == both  # (refused with no partial report)
    assert COUNTS.verb == 'make' and 'the counts that --overwrite makes again' in partial_problem(
        True, True, None, COUNTS)
    # no partial report there: nothing to refuse
    for resume, overwrite in ((False, False), (True, False), (False, True)):
        assert partial_problem(resume, overwrite, partial, SIZES) is None
    open(partial, 'w').close()
    assert partial_problem(False, False, partial, SIZES) == (
        f"argument --out: {partial} holds the sizes of an interrupted run: pass --resume to "
        f"keep them, or --overwrite to measure every size again (this run's report replaces "
        f"them)")
    assert partial_problem(False, False, partial, COUNTS, held_note=' (or not)',
                           keeps='those that match') == (
        f"argument --out: {partial} holds the counts of an interrupted run (or not): pass "
        f"--resume to keep those that match, or --overwrite to make every count again (this "
        f"run's report replaces them)")
    assert partial_problem(True, False, partial, SIZES) is None
    assert partial_problem(False, True, partial, SIZES) is None
    assert partial_problem(False, False, None, SIZES) is None  # (a call that writes none)


def test_settings_differ():
    assert settings_differ({'a': 1, 'b': 'x'}, {'a': 1, 'b': 'x', 'c': 3}, ('a', 'b')) == []
    assert settings_differ({'a': 2}, {'a': 1, 'b': 'x'}, ('a', 'b')) == [
        "a 2 there, 1 here", "b None there, 'x' here"]
    # a list of this run's is the same as its comma-separated text there (as reports written
    # before the scripts parsed their lists keep it), not as other text or another list
    assert settings_differ({'m': 'pyg,rigid', 'n': '10,40'},
                           {'m': ['pyg', 'rigid'], 'n': [10, 40]}, ('m', 'n')) == []
    assert settings_differ({'m': 'pyg,mz', 'n': ['10', '40']},
                           {'m': ['pyg', 'rigid'], 'n': [10, 40]}, ('m', 'n')) == [
        "m 'pyg,mz' there, ['pyg', 'rigid'] here", "n ['10', '40'] there, [10, 40] here"]


def test_settings_differ_takes_a_list_in_another_order_as_the_same():
    # '--models rigid,pyg' was refused as another command (and its partial report to
    # --resume) where the report there had 'pyg,rigid': the same measurements, in another order
    here = {'m': ['pyg', 'rigid'], 'n': [10, 40]}
    for there in ({'m': ['rigid', 'pyg'], 'n': [40, 10]}, {'m': 'rigid,pyg', 'n': '40,10'},
                  {'m': 'rigid, pyg', 'n': '40, 10'}):
        assert settings_differ(there, here, ('m', 'n')) == [], there
    # not a list of other values, or of more or fewer
    for there, phrase in (({'m': ['pyg', 'mz']}, "m ['pyg', 'mz'] there"),
                          ({'m': ['pyg']}, "m ['pyg'] there"),
                          ({'m': 'pyg,rigid,mz'}, "m 'pyg,rigid,mz' there"),
                          ({'m': ['pyg', 'rigid', 'rigid']}, "m ['pyg', 'rigid', 'rigid'] there")):
        assert settings_differ(there, here, ('m', )) == [
            f"{phrase}, ['pyg', 'rigid'] here"]


def write(path, payload):
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return str(path)


def test_read_partial_returns_what_it_keeps(tmp_path):
    args = argparse.Namespace(sets=64, quick=False, resume=True)
    report = dict(config=dict(sets=64, quick=False, resume=False, extra=1), rows=[{'n': 3}],
                  environment=dict(torch='2.x', threads=1))
    path = write(tmp_path / 'p.json', report)
    assert read_partial(path, args, ('sets', 'quick'), SIZES) == report
    assert read_partial(path, args, ('sets', 'quick'), SIZES,
                        keep=lambda r: [row['n'] for row in r['rows']]) == [3]
    # the same environment; none compared without this run's
    assert read_partial(path, args, ('sets',), SIZES, env=dict(torch='2.x', threads=1),
                        environment=('torch', 'threads')) == report
    assert read_partial(path, args, ('sets',), SIZES, environment=('torch',)) == report


def test_read_partial_refuses_other_settings_and_environments(tmp_path):
    # the message named neither command, where replace_problem and resume_problem name both
    args = argparse.Namespace(sets=32, quick=False, resume=True)
    path = write(tmp_path / 'p.json', dict(
        config=dict(sets=64), rows=[],
        environment=dict(torch='2.x', command='python x.py --sets 64')))
    with pytest.raises(ValueError) as info:
        read_partial(path, args, ('sets', 'quick'), SIZES,
                     env=dict(torch='3.x', command='python x.py --sets 32'),
                     environment=('torch',))
    assert str(info.value) == (
        f"{path} is the partial report of another command (`python x.py --sets 64`), written "
        f"with other settings (sets 64 there, 32 here; quick None there, False here; torch "
        f"'2.x' there, '3.x' here), which this run (`python x.py --sets 32`) would replace: "
        f"pass --overwrite (in place of --resume) to replace it, or give another --out")
    # resume_problem's message, but for the option's name, which the scripts put before it
    with pytest.raises(ValueError) as info:
        read_partial(path, args, ('sets', ), SIZES, command='python x.py --sets 32')
    assert 'argument --resume: ' + str(info.value) == resume_problem(
        path, args, ('sets', ), 'python x.py --sets 32')
    # this run's command given (no env): named; the same command line as such; none known
    with pytest.raises(ValueError, match=r'which this run \(`python x.py`\) would replace'):
        read_partial(path, args, ('sets', ), SIZES, command='python x.py')
    path = write(tmp_path / 'q.json', dict(config=dict(sets=64), rows=[],
                                           environment=dict(command='python x.py')))
    with pytest.raises(ValueError) as info:
        read_partial(path, args, ('sets', ), SIZES, command='python x.py')
    assert ('the partial report of this same command line run by older code or elsewhere '
            '(`python x.py`)') in str(info.value)
    path = write(tmp_path / 'r.json', dict(config=dict(sets=64), rows=[]))
    with pytest.raises(ValueError) as info:
        read_partial(path, args, ('sets', ), SIZES)
    assert str(info.value).startswith(f'{path} is the partial report of another command (an '
                                      f'unknown one), written with other settings (sets 64 '
                                      f'there, 32 here), which this run would replace: ')


@pytest.mark.parametrize('payload, needle', [
    ('not json', 'Expecting value'),
    ({'rows': []}, "'config'"),  # no config
    ({'config': [], 'rows': []}, 'get'),  # a config that is no object
    ({'config': {}, 'rows': []}, "'environment'"),  # no environment, though compared
    ({'config': {}, 'environment': 3, 'rows': []}, 'int'),
    ({'config': {}, 'environment': {}, 'rows': [{}]}, "'n'"),  # what keep takes is missing
])
def test_read_partial_refuses_a_damaged_file(tmp_path, payload, needle):
    path = write(tmp_path / 'p.json', payload)
    with pytest.raises(ValueError) as info:
        read_partial(path, argparse.Namespace(sets=1), ('sets',), COUNTS,
                     keep=lambda r: [row['n'] for row in r['rows']], environment=('torch',))
    message = str(info.value)
    assert message.startswith(f'{path} cannot be read (') and needle in message, message
    assert message.endswith('): pass --overwrite to make every count again')
    assert info.value.__suppress_context__  # (the message says it all: no chained traceback)


def test_read_partial_of_no_file_says_it_cannot_be_read(tmp_path):
    path = str(tmp_path / 'missing.json')
    with pytest.raises(ValueError, match='cannot be read .*measure every size again'):
        read_partial(path, argparse.Namespace(), (), SIZES)


def test_write_results_so_far_replaces_the_partial_report_with_the_complete_one(tmp_path):
    out = str(tmp_path / 'out')
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'x.json').write_text('{"earlier": true}')
    write_results_so_far(out, 'x', dict(rows=[1]), '# partial\n', complete=False)
    # the earlier complete report is left alone while measurements remain
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == [
        'x.json', 'x.partial.json', 'x.partial.md']
    assert json.loads((tmp_path / 'out' / 'x.json').read_text()) == {'earlier': True}
    assert json.loads((tmp_path / 'out' / 'x.partial.json').read_text()) == dict(rows=[1])
    import hashlib
    replaced = hashlib.sha256((tmp_path / 'out' / 'x.partial.json').read_bytes()).hexdigest()
    write_results_so_far(out, 'x', dict(rows=[1, 2]), '# complete\n', complete=True)
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['x.json', 'x.md']
    # (it records the partial report it replaces, which a stopped swap leaves beside it)
    assert json.loads((tmp_path / 'out' / 'x.json').read_text()) == dict(
        rows=[1, 2], replaces_partial=replaced)
    assert (tmp_path / 'out' / 'x.md').read_text() == '# complete\n'


def test_remove_stale_partial_removes_the_partial_report_a_stopped_swap_left(tmp_path):
    # Ctrl-C between write_results_so_far's complete report and its removal of the partial one
    # left both: a call without options was refused, --resume made the missing rows again
    import os

    from torch_mz.study import partial as report_module
    out = str(tmp_path)
    names = ['x.json', 'x.md', 'x.partial.json', 'x.partial.md']

    def left(partial=None, complete=None, newer='complete'):
        # the files a run stopped between its complete report and its partial one's removal
        # leaves (newer='complete'), or a later run's partial report beside an earlier run's
        # complete one (newer='partial')
        for name in os.listdir(out):
            os.remove(os.path.join(out, name))
        partial = partial or dict(config=dict(sets=8, resume=False), rows=[1])
        complete = complete or dict(config=dict(sets=8, resume=True), rows=[1, 2])
        if newer == 'partial':
            write_results_so_far(out, 'x', dict(partial, rows=[0]), '# earlier\n', False)
            write_results_so_far(out, 'x', complete, '# complete\n', True)
            write_results_so_far(out, 'x', partial, '# partial\n', False)
        else:
            write_results_so_far(out, 'x', partial, '# partial\n', False)
            real = report_module.remove_results
            report_module.remove_results = lambda *args: None  # (stopped before it)
            try:
                write_results_so_far(out, 'x', complete, '# complete\n', True)
            finally:
                report_module.remove_results = real
        assert sorted(os.listdir(out)) == names

    resume = argparse.Namespace(sets=8, resume=True, overwrite=False)
    left()
    stale = remove_stale_partial(out, 'x', resume, ('sets', ))
    assert stale.finished and stale.note.startswith(
        f"nothing to resume: {os.path.join(out, 'x.json')} is the complete report")
    assert sorted(os.listdir(out)) == ['x.json', 'x.md']
    assert json.loads((tmp_path / 'x.json').read_text())['rows'] == [1, 2]
    assert remove_stale_partial(out, 'x', resume, ('sets', )) is None  # (none there now)
    # removed, but the call goes on: without --resume, with --overwrite too, of other settings
    for args in (argparse.Namespace(sets=8, resume=False, overwrite=False),
                 argparse.Namespace(sets=8, resume=True, overwrite=True),
                 argparse.Namespace(sets=4, resume=True, overwrite=False)):
        left()
        stale = remove_stale_partial(out, 'x', args, ('sets', ))
        assert not stale.finished and stale.note.startswith(
            f"removed {os.path.join(out, 'x.partial.json')}: ")
        assert sorted(os.listdir(out)) == ['x.json', 'x.md']
    # a setting the partial report predates, compared as its value then; under 'setup'
    left(partial=dict(config=dict(sets=8), rows=[1]),
         complete=dict(config=dict(sets=8, new=False), rows=[1, 2]))
    assert remove_stale_partial(out, 'x', argparse.Namespace(sets=8, new=False, resume=True),
                                ('sets', 'new'), predated=dict(new=False)).finished
    left(partial=dict(setup=dict(sets=8), rows=[1]), complete=dict(setup=dict(sets=8), rows=[]))
    assert remove_stale_partial(out, 'x', resume, ('sets', ), record='setup').finished
    # not stale, kept: written after the complete report (a later run's, stopped), of other
    # settings, listing measurements lost (a run that failed where the complete report made
    # them), or beside a complete report of none of these scripts
    for partial, complete, newer in (
            (None, None, 'partial'),
            (None, dict(config=dict(sets=4), rows=[1, 2]), 'complete'),
            (dict(config=dict(sets=8), rows=[1], lost=[2]), None, 'complete'),
            (None, dict(rows=[1, 2]), 'complete')):
        left(partial, complete, newer)
        assert remove_stale_partial(out, 'x', resume, ('sets', )) is None
        assert sorted(os.listdir(out)) == names
    # nor where the files' times say the complete report came after it: a later run's partial
    # report beside an earlier run's complete report, the folder copied without its times (the
    # partial report, its measurements, was removed: 'nothing to resume')
    left(newer='partial')
    for name in ('x.partial.json', 'x.json'):  # (copied in this order: the complete one newer)
        stamp = os.stat(os.path.join(out, name)).st_mtime_ns
        os.utime(os.path.join(out, name), ns=(stamp + 10**9, stamp + 10**9)
                 if name == 'x.json' else (stamp - 10**9, stamp - 10**9))
    assert remove_stale_partial(out, 'x', resume, ('sets', )) is None
    assert sorted(os.listdir(out)) == names
    assert json.loads((tmp_path / 'x.partial.json').read_text())['rows'] == [1]


def test_stale_partial_done_hands_its_note_to_the_script_and_prints_nothing(tmp_path,
                                                                            monkeypatch, capsys):
    # library code prints nothing (the module's docstring, the house style): the note of the
    # stale partial report removed goes to the script's say; whether the call is done comes back
    from torch_mz.study import partial as report_module
    from torch_mz.study.partial import stale_partial_done
    out = str(tmp_path)

    def left():  # (a run stopped between writing its complete report and removing the partial)
        write_results_so_far(out, 'x', dict(config=dict(sets=8), rows=[1]), '# partial\n', False)
        monkeypatch.setattr(report_module, 'remove_results', lambda *args: None)
        write_results_so_far(out, 'x', dict(config=dict(sets=8), rows=[1, 2]), '#\n', True)
        monkeypatch.undo()
        assert (tmp_path / 'x.partial.json').exists()

    for resume, done, note in ((True, True, 'nothing to resume: '), (False, False, 'removed ')):
        left()
        said = []
        args = argparse.Namespace(sets=8, resume=resume, overwrite=False)
        assert stale_partial_done(out, 'x', args, ('sets', ), say=said.append) is done
        assert len(said) == 1 and said[0].startswith(note)
        assert capsys.readouterr().out == '' and not (tmp_path / 'x.partial.json').exists()
        # none there now: nothing said, the call goes on
        assert stale_partial_done(out, 'x', args, ('sets', ), say=said.append) is False
        assert len(said) == 1


def test_replace_problem_refuses_the_complete_report_of_another_command(tmp_path):
    args = argparse.Namespace(sets=32, models=['a', 'b'], resume=False, overwrite=False)
    path = write(tmp_path / 'x.json', dict(
        config=dict(sets=64, models='a,b', quick=True),
        environment=dict(command='python x.py --sets 64'), rows=[]))
    assert replace_problem(path, args, ('sets', 'models'), 'python x.py', False, False) == (
        f"argument --out: {path} is the complete report of another command (`python x.py "
        f"--sets 64`), written with other settings (sets 64 there, 32 here), which this run "
        f"(`python x.py`) would replace: pass --overwrite to replace it, or give another --out")
    # --overwrite replaces it; a partial report resumed was begun by a call let replace it
    assert replace_problem(path, args, ('sets', ), 'python x.py', True, False) is None
    assert replace_problem(path, args, ('sets', ), 'python x.py', False, True) is None
    assert 'pass --overwrite (in place of --resume) to replace it' in replace_problem(
        path, argparse.Namespace(sets=32, resume=True), ('sets', ), 'c', False, False)
    assert same_settings_report(path, args, ('sets', )) is None
    # the same settings (a setting the report does not record, older than it, not compared):
    # a run of them measures again, and replaces it
    args.sets = 64
    assert replace_problem(path, args, ('sets', 'models', 'new'), 'c', False, False) is None
    assert same_settings_report(path, args, ('sets', 'models', 'new'))['rows'] == []
    # no complete report of these scripts there (none, not JSON, no config): nothing refused
    for payload in ('not json', [1], dict(rows=[]), dict(config=[1])):
        path = write(tmp_path / 'y.json', payload)
        assert replace_problem(path, args, ('sets', ), 'c', False, False) is None
        assert same_settings_report(path, args, ('sets', )) is None
    assert replace_problem(str(tmp_path / 'none.json'), args, ('sets', ), 'c', False,
                           False) is None
    path = write(tmp_path / 'z.json', dict(config=dict(sets=1)))  # (no command recorded)
    assert 'another command (an unknown one)' in replace_problem(path, args, ('sets', ), 'c',
                                                                 False, False)


def test_replace_problem_compares_a_setting_the_report_predates_as_its_value_then(tmp_path):
    # a report written before a switch existed (no 'inference' in its config) was replaced
    # unasked by a run with it on, as if the switch were not a setting
    args = argparse.Namespace(sets=64, inference=True, resume=False)
    path = write(tmp_path / 'x.json', dict(config=dict(sets=64),
                                           environment=dict(command='python x.py'), rows=[]))
    predated = dict(inference=False)
    assert 'inference False there, True here' in replace_problem(
        path, args, ('sets', 'inference'), 'python x.py --inference', False, False,
        predated=predated)
    assert same_settings_report(path, args, ('sets', 'inference'), predated) is None
    # the value then: the same run; a setting recorded is compared as recorded
    args.inference = False
    assert replace_problem(path, args, ('sets', 'inference'), 'c', False, False,
                           predated=predated) is None
    assert same_settings_report(path, args, ('sets', 'inference'), predated) is not None
    path = write(tmp_path / 'y.json', dict(config=dict(sets=64, inference=True)))
    assert replace_problem(path, args, ('sets', 'inference'), 'c', False, False,
                           predated=predated) is not None


def test_replace_problem_names_the_same_command_line_as_such(tmp_path):
    # "the complete report of another command (`python x.py`) ... this run (`python x.py`)":
    # the same command line, whose defaults older code (or another machine) resolved otherwise
    path = write(tmp_path / 'x.json', dict(config=dict(sets=32),
                                           environment=dict(command='python x.py')))
    message = replace_problem(path, argparse.Namespace(sets=64), ('sets', ), 'python x.py',
                              False, False)
    assert 'another command' not in message
    assert ('the complete report of this same command line run by older code or elsewhere '
            '(`python x.py`), written with other settings (sets 32 there, 64 here)') in message


def test_overwriting_reads_whether_a_partial_report_was_begun_by_overwrite(tmp_path):
    assert overwriting(write(tmp_path / 'a.json', dict(rows=[], overwrite=True))) is True
    for name, payload in (('b', dict(rows=[])), ('c', dict(overwrite='yes')), ('d', [1]),
                          ('e', 'not json')):
        assert overwriting(write(tmp_path / f'{name}.json', payload)) is False
    assert overwriting(str(tmp_path / 'none.json')) is False


def test_resume_problem_refuses_the_partial_report_of_another_command(tmp_path):
    # message_passing.py --resume of other graphs replaced the partial report of another
    # command (keeping the rows that matched): the rest of the interrupted run was lost
    args = argparse.Namespace(nodes=[10], inference=False, resume=True)
    path = write(tmp_path / 'x.partial.json', dict(
        config=dict(nodes=[10, 100]), environment=dict(command='python x.py --nodes 10,100'),
        rows=[]))
    assert resume_problem(path, args, ('nodes', 'inference'), 'python x.py --nodes 10',
                          predated=dict(inference=False)) == (
        f"argument --resume: {path} is the partial report of another command (`python x.py "
        f"--nodes 10,100`), written with other settings (nodes [10, 100] there, [10] here), "
        f"which this run (`python x.py --nodes 10`) would replace: pass --overwrite (in place "
        f"of --resume) to replace it, or give another --out")
    # its settings (a switch it predates as off), none there, or a file of no such report:
    # nothing refused
    args.nodes = [100, 10]
    assert resume_problem(path, args, ('nodes', 'inference'), 'c',
                          predated=dict(inference=False)) is None
    args.inference = True
    assert 'inference False there, True here' in resume_problem(
        path, args, ('nodes', 'inference'), 'c', predated=dict(inference=False))
    for payload in ('not json', dict(rows=[]), dict(config=3)):
        assert resume_problem(write(tmp_path / 'y.json', payload), args, ('nodes', ), 'c') is None
    assert resume_problem(str(tmp_path / 'none.json'), args, ('nodes', ), 'c') is None


def test_a_report_that_records_its_settings_as_setup_is_compared(tmp_path):
    # compile_graphs.py's reports (write_report's) record their options under 'setup', not
    # 'config': read as no report of these scripts, they were replaced unasked
    args = argparse.Namespace(nodes=[10], resume=False)
    path = write(tmp_path / 'x.json', dict(setup=dict(nodes=[20]), rows=[],
                                           environment=dict(command='python x.py', torch='2')))
    assert 'nodes [20] there, [10] here' in replace_problem(path, args, ('nodes', ), 'c', False,
                                                            False, record='setup')
    assert replace_problem(path, args, ('nodes', ), 'c', False, False) is None  # (no config)
    assert 'nodes [20] there' in resume_problem(path, args, ('nodes', ), 'c', record='setup')
    with pytest.raises(ValueError, match=r'nodes \[20\] there, \[10\] here'):
        read_partial(path, args, ('nodes', ), SIZES, record='setup')
    args.nodes = [20]
    assert same_settings_report(path, args, ('nodes', ), record='setup')['rows'] == []
    assert read_partial(path, args, ('nodes', ), SIZES, env=dict(torch='2'),
                        environment=('torch', ), record='setup')['rows'] == []


def test_in_turn_keeps_what_was_kept_and_says_when_to_write():
    made = []

    def make(key):
        made.append(key)
        return 10 * key
    turns = list(in_turn([1, 2, 3, 4], {2: 'k2', 4: 'k4'}, make))
    assert made == [1, 3]  # (the kept values are not made again)
    assert [(t.key, t.value, t.kept) for t in turns] == [
        (1, 10, False), (2, 'k2', True), (3, 30, False), (4, 'k4', True)]
    # what the report shows holds the kept values not reached yet (a report of the values
    # reached alone, were the run stopped then, lost them); nothing new to write at a kept one
    assert [(t.reached, t.pending, t.write) for t in turns] == [
        ([10, 'k2', 'k4'], 1, True), ([10, 'k2', 'k4'], 1, False),
        ([10, 'k2', 30, 'k4'], 0, True), ([10, 'k2', 30, 'k4'], 0, False)]
    # every value kept: the complete report written once, at the last; none kept: after each
    turns = list(in_turn(['a', 'b'], {'a': 1, 'b': 2}, make))
    assert [(t.write, t.pending, t.reached) for t in turns] == [(False, 0, [1, 2]),
                                                                  (True, 0, [1, 2])]
    made.clear()
    assert [(t.write, t.pending, t.reached) for t in in_turn([5, 6], {}, make)] == [
        (True, 1, [50]), (True, 0, [50, 60])]
    assert made == [5, 6]
