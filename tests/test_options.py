import pytest

from torch_mz.options import check_options, parse_key_values


def test_parse_key_values():
    assert parse_key_values(['set-size=[10, 30]', 'name=a,b', 'flag=true']) == {
        'set_size': [10, 30], 'name': 'a,b', 'flag': True}
    with pytest.raises(ValueError, match="got 'tdof'"):
        parse_key_values(['tdof'])


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
