import argparse

import pytest

from torch_mz.study.arguments import float_list, int_list


def test_number_lists_refuse_one_value_given_twice_in_two_spellings():
    # '4,04' passed as two items (the strings differ) and gave two identical table rows
    assert int_list()('4,16,32') == [4, 16, 32]
    for parse, text in ((int_list(), '4,04'), (int_list(), '4,4'), (float_list(), '0.1,1e-1')):
        with pytest.raises(argparse.ArgumentTypeError, match='given twice'):
            parse(text)
