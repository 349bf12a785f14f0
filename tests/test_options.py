import json

import numpy as np
import pytest

from torch_mz.options import check_options, parse_key_values


def test_parse_key_values():
    assert parse_key_values(['set-size=[10, 30]', 'name=a,b', 'flag=true']) == {
        'set_size': [10, 30], 'name': 'a,b', 'flag': True}
    with pytest.raises(ValueError, match="got 'tdof'"):
        parse_key_values(['tdof'])


def test_parse_key_values_reads_python_numbers_json_does_not():
    # '--model-arg dropout=.1' was the string '.1': "expects a number (got '.1')"
    numbers = ['.1', '5.', '-.5', '+1', '1_000', '2.5e-3', '1e1_0', '01.5', ' .25 ']
    assert parse_key_values([f'x{i}={v}' for i, v in enumerate(numbers)]) == {
        'x0': 0.1, 'x1': 5.0, 'x2': -0.5, 'x3': 1, 'x4': 1000, 'x5': 0.0025, 'x6': 1e10,
        'x7': 1.5, 'x8': 0.25}
    assert type(parse_key_values(['n=1_000'])['n']) is int
    assert type(parse_key_values(['n=5.'])['n']) is float
    # what JSON reads is read as before (its NaN and Infinity too); other text stays text,
    # the words nan and inf included, and an integer with a leading zero as Python has it
    parsed = parse_key_values(['a=1e-3', 'b=-2', 'c=NaN', 'd=-Infinity', 'e=[1, 2.5]'])
    assert parsed['a'] == 1e-3 and parsed['b'] == -2 and parsed['c'] != parsed['c']
    assert parsed['d'] == -float('inf') and parsed['e'] == [1, 2.5]
    for text in ('nan', 'inf', '-inf', '007', '1_', '_1', '1__0', '.', '1.5e', '0x10', '1j',
                 '1.2.3', '\u0661', 'abc'):
        assert parse_key_values([f'x={text}']) == {'x': text}, text


def test_check_options():
    defaults = {'d': 16, 'noise': 1.0, 'mode': 'a', 'flag': False, 'sizes': (1, 2), 'any': None}
    check_options({'d': 3, 'noise': 2, 'mode': 'b', 'flag': True, 'sizes': [3, 4], 'any': 'x'},
                  defaults, 'thing')
    for given, match in (({'d': 'abc'}, "thing: option 'd' expects an integer .got 'abc'."),
                         ({'d': 1.5}, 'integer'), ({'d': True}, 'integer'),
                         ({'noise': 'x'}, 'a number'), ({'flag': 1}, 'true or false'),
                         ({'mode': 3}, 'a string'), ({'sizes': 3}, 'a list'),
                         ({'d': None}, 'integer'),
                         ({'nosuch': 1}, "thing has no option 'nosuch' .options: any, d, ")):
        with pytest.raises(ValueError, match=match):
            check_options(given, defaults, 'thing')
    check_options({'nosuch': 1}, defaults, 'thing', complete=False)  # passed on, unknown here
    check_options({'d': None}, defaults, 'thing', nullable=['d'])


def test_check_options_takes_numpy_numbers_as_python_ones():
    # refused: "option 'd' expects an integer (got np.int64(4))", where TrainConfig and the
    # modules' checks take NumPy numbers
    defaults = {'d': 16, 'noise': 1.0, 'flag': False, 'mode': 'a', 'any': None}
    given = {'d': np.int64(4), 'noise': np.float32(0.5), 'flag': np.bool_(True), 'mode': 'b',
             'any': np.int64(3)}
    checked = check_options(given, defaults, 'thing')
    assert checked == {'d': 4, 'noise': 0.5, 'flag': True, 'mode': 'b', 'any': np.int64(3)}
    assert [type(checked[k]) for k in ('d', 'noise', 'flag')] == [int, float, bool]
    assert type(check_options({'noise': np.int64(2)}, defaults, 'thing')['noise']) is int
    assert type(check_options({'noise': np.float64(2)}, defaults, 'thing')['noise']) is float
    json.dumps({k: checked[k] for k in ('d', 'noise', 'flag')})
    assert check_options({'d': 3, 'noise': 2}, defaults, 'thing') == {'d': 3, 'noise': 2}
    for given, match in (({'d': np.float64(4.0)}, 'an integer'), ({'d': np.bool_(True)},
                         'an integer'), ({'noise': np.bool_(True)}, 'a number'),
                         ({'flag': np.int64(1)}, 'true or false')):
        with pytest.raises(ValueError, match=match):
            check_options(given, defaults, 'thing')


def test_a_string_option_written_true_or_false_is_that_text():
    # parse_key_values reads 'alignment=true' as JSON's true, and the string option refused it
    # ("expects a string (got True)"): the default of rotation matching could not be given
    given = parse_key_values(['alignment=true', 'mode=false', 'n=3'])
    assert given == {'alignment': True, 'mode': False, 'n': 3}
    checked = check_options(given, {'alignment': 'none', 'mode': 'x', 'n': 1}, 'thing')
    assert checked == {'alignment': 'true', 'mode': 'false', 'n': 3}
    with pytest.raises(ValueError, match="option 'n' expects an integer"):
        check_options({'n': True}, {'n': 1}, 'thing')  # (a bool is still no number)
    from torch_mz.tasks import load_task
    task = load_task('rotation-matching', n_train=2, n_val=2, n_test=2, d=3,
                     **parse_key_values(['alignment=true']))
    assert task.info['alignment'] == 'true'
