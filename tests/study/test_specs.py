import pytest

from torch_mz.study.specs import parse_model_spec, split_model_specs


def test_parse_model_spec():
    assert parse_model_spec('mz') == ('mz', {})
    assert parse_model_spec('hypernet:rank=64,dim=64') == ('hypernet', {'rank': 64, 'dim': 64})
    assert parse_model_spec('mz:dropout=0.2,summary=mean+std') == (
        'mz', {'dropout': 0.2, 'summary': 'mean+std'})
    with pytest.raises(ValueError, match='KEY=VALUE'):
        parse_model_spec('mz:rank')
    assert split_model_specs('mz, hypernet:rank=64,dim=64,rigid,film:dropout=0.2') == [
        'mz', 'hypernet:rank=64,dim=64', 'rigid', 'film:dropout=0.2']
