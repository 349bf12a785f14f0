import json
import os
import os.path as osp
import pathlib
import pickle
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import torch
from torch import Tensor
from torch_geometric.transforms import Compose, FixedPoints, KNNGraph, NormalizeScale

from tests.datasets.raw_formats import write_crafted_pickle, write_h5
from torch_mz.datasets import common
from torch_mz.datasets.common import (
    CorruptRawFileError,
    ProcessedFileError,
    SkipCounter,
    TrainTestSets,
    default_root,
    load_processed,
    load_stats,
    normalize_unit_sphere,
    read_h5,
    save_stats,
)
from torch_mz.datasets.scanobjectnn import ScanObjectNN


def test_default_root_in_a_checkout_is_the_repository_datasets_folder(monkeypatch):
    monkeypatch.delenv(common.ENV_DATA_ROOT, raising=False)
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    assert default_root('ModelNet40') == osp.join(repo, 'datasets', 'ModelNet40')


def test_default_root_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(common.ENV_DATA_ROOT, str(tmp_path))
    assert default_root('QM9') == osp.join(str(tmp_path), 'QM9')


def test_default_root_of_an_installed_package_is_under_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(common.ENV_DATA_ROOT, raising=False)
    site = tmp_path / 'site-packages'
    (site / 'datasets').mkdir(parents=True)  # e.g. another package called 'datasets'
    monkeypatch.setattr(common, '_REPO_DIR', str(site))
    monkeypatch.chdir(tmp_path)
    assert default_root('QM9') == osp.join(str(tmp_path), 'datasets', 'QM9')


@pytest.mark.parametrize('where', ['ModelNet40', 'ScanObjectNN', 'QM9', 'load_task'])
def test_docstrings_give_the_default_root_of_an_installed_package_too(where):
    # the default root is the repository's datasets/ only in a checkout: the documentation of
    # root names the other two places (an installed package reads $TORCH_MZ_DATA or ./datasets/)
    from torch_mz import datasets
    from torch_mz.tasks import load_task
    obj = load_task if where == 'load_task' else getattr(datasets, where)
    doc = ' '.join(obj.__doc__.split())
    assert 'of the repository' not in doc and "the repository's" not in doc
    assert '$TORCH_MZ_DATA' in doc and 'default_root' in doc


def test_normalize_unit_sphere():
    rng = np.random.default_rng(0)
    pos = rng.normal(size=(100, 3)) * 5 + 3
    out = normalize_unit_sphere(pos)
    assert out.dtype == np.float32
    assert np.allclose(out.mean(axis=0), 0, atol=1e-6)
    assert np.linalg.norm(out, axis=1).max() == pytest.approx(1.0, abs=1e-6)
    # same shape up to scale: ratios of distances are kept
    d_in = np.linalg.norm(pos[0] - pos[1]) / np.linalg.norm(pos[2] - pos[3])
    d_out = np.linalg.norm(out[0] - out[1]) / np.linalg.norm(out[2] - out[3])
    assert d_out == pytest.approx(d_in, rel=1e-5)
    assert np.array_equal(normalize_unit_sphere(np.ones((4, 3))), np.zeros((4, 3),
                                                                           dtype=np.float32))
    # finite coordinates whose squared norms overflow float64: the same set as at a sane scale
    # (it was every point at the origin)
    huge = normalize_unit_sphere(pos * 1e200)
    assert np.isfinite(huge).all()
    assert np.allclose(huge, out, atol=1e-6)
    assert np.linalg.norm(huge, axis=1).max() == pytest.approx(1.0, abs=1e-6)
    # ... and whose squares underflow (every point came out 0)
    assert np.allclose(normalize_unit_sphere(pos * 1e-170), out, atol=1e-6)


def test_corrupt_raw_file_error_names_the_file_and_pickles():
    err = CorruptRawFileError('/data/x.h5', 'truncated')
    assert '/data/x.h5' in str(err) and 'truncated' in str(err)
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert again.path == '/data/x.h5' and str(again) == str(err)


def test_skip_counter_reports_only_when_something_was_skipped():
    counter = SkipCounter(keep=2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        counter.report('nothing')  # no warning
    for i in range(3):
        counter.add('bad', i)
    counter.add('worse', 'a')
    assert counter.total == 4
    assert counter.as_dict() == {
        'counts': {
            'bad': 3,
            'worse': 1
        },
        'examples': {
            'bad': ['0', '1'],
            'worse': ['a']
        }
    }
    with pytest.warns(UserWarning, match='4 record'):
        counter.report('thing')


def test_skip_counter_counts_a_record_under_two_reasons_once():
    # the bug: the total summed the counts, a QM9 molecule whose bonds and then charges failed
    # was two records
    counter = SkipCounter()
    counter.add('bonds_failed', 2)
    counter.add('charges_failed_set_to_zero', 2)
    counter.add('charges_failed_set_to_zero', 5)
    assert counter.total == 2
    assert counter.counts == {'bonds_failed': 1, 'charges_failed_set_to_zero': 2}
    counter.add('bad', 'a')
    counter.add('bad', 'a')  # the same identifier twice under one reason: two records, as before
    assert counter.total == 4
    with pytest.warns(UserWarning, match='thing: 4 record'):
        counter.report('thing')


def test_read_h5_errors_name_the_file(tmp_path):
    from tests.datasets.raw_formats import write_h5
    path = write_h5(str(tmp_path / 'a.h5'), data=np.zeros((2, 3)))
    assert read_h5(path, ('data', ))['data'].shape == (2, 3)
    assert 'label' not in read_h5(path, ('data', ), optional=('label', ))
    with pytest.raises(CorruptRawFileError, match="a.h5.*'label'"):
        read_h5(path, ('data', 'label'))
    bad = tmp_path / 'b.h5'
    bad.write_bytes(b'this is not an HDF5 file')
    with pytest.raises(CorruptRawFileError, match='b.h5'):
        read_h5(str(bad), ('data', ))
    with pytest.raises(FileNotFoundError):
        read_h5(str(tmp_path / 'missing.h5'), ('data', ))


@pytest.mark.parametrize('kind', ['external_link', 'soft_link', 'virtual',
                                  'external_storage'])
def test_read_h5_never_reads_other_files_that_an_entry_names(tmp_path, kind):
    # the bug: an external link, a soft link through one, a virtual dataset or external storage
    # under 'data' was followed, and a crafted file had the loader read any file on disk
    from tests.datasets.raw_formats import write_h5, write_h5_leading_elsewhere
    other = write_h5(str(tmp_path / 'elsewhere' / 'other.h5'), data=np.arange(6.0).reshape(2, 3))
    path = write_h5_leading_elsewhere(str(tmp_path / 'a.h5'), kind, 'data', other,
                                      label=np.zeros(2))
    target = {'external_link': r"external link to '/data' in the file '.*other\.h5'",
              'soft_link': "soft link to '/elsewhere/data'",
              'virtual': r"virtual dataset that reads from the file\(s\) \['.*other\.h5'\]",
              'external_storage': (r"dataset whose data is stored in the external file\(s\) "
                                   r"\['.*other\.h5\.bin'\]")}[kind]
    with pytest.raises(CorruptRawFileError, match=f"a.h5': 'data' is an? {target}"):
        read_h5(path, ('data', 'label'))
    with pytest.raises(CorruptRawFileError, match=f"a.h5': 'data' is an? {target}"):
        read_h5(path, ('label', ), optional=('data', ))  # (an optional key too)
    assert read_h5(path, ('label', ))['label'].shape == (2, )  # (the other keys are read)


def test_read_h5_names_a_user_defined_link(tmp_path):
    # the bug: h5py's get(getlink=True) raises TypeError('Unknown link type') for a user-defined
    # link, which came out of read_h5 as it was, naming neither the file nor the key
    from tests.datasets.raw_formats import write_h5_user_defined_link
    path = write_h5_user_defined_link(str(tmp_path / 'a.h5'), 'data', label=np.zeros(2))
    for keys, optional in ((('data', 'label'), ()), (('label', ), ('data', ))):
        with pytest.raises(CorruptRawFileError, match="a.h5': 'data' is a user-defined link"):
            read_h5(path, keys, optional=optional)
    assert read_h5(path, ('label', ))['label'].shape == (2, )  # (the other keys are read)


@pytest.mark.parametrize('key, keys, optional', [
    ('label', ('data', 'label'), ()),  # (after a key that is read as it should be)
    ('data', ('data', 'label'), ()),
    ('mask', ('data', 'label'), ('mask', )),  # (an optional key too)
])
def test_read_h5_refuses_a_filter_that_is_not_built_in_before_reading_any_data(
        tmp_path, monkeypatch, key, keys, optional):
    # the bug: a dataset stored with a filter that HDF5 and h5py do not build in was read, and
    # reading it made HDF5 search its plugin path and load a library found there (the file
    # chose code to run); the error, when no library was found, named neither key nor filter
    h5py = pytest.importorskip('h5py')
    from tests.datasets.raw_formats import FOREIGN_FILTER, write_h5_foreign_filter
    arrays = {'data': np.zeros((2, 3)), 'label': np.zeros(2), 'mask': np.zeros(2)}
    crafted = arrays.pop(key)
    path = write_h5_foreign_filter(str(tmp_path / 'a.h5'), key, crafted.reshape(-1), **arrays)
    read = []
    original = h5py.Dataset.__getitem__

    def reading(self, args):
        read.append(self.name)
        return original(self, args)

    monkeypatch.setattr(h5py.Dataset, '__getitem__', reading)
    with pytest.raises(CorruptRawFileError, match=f"a.h5': dataset '{key}' is stored with the "
                       f"filter {FOREIGN_FILTER}, which neither HDF5 nor h5py builds in"):
        read_h5(path, keys, optional=optional)
    assert read == []  # refused before any data were read


def test_read_h5_loads_no_library_from_the_plugin_path(tmp_path, monkeypatch):
    # what the refusal above prevents: HDF5 loading a shared library from its plugin path (here
    # one whose constructor leaves a mark) as it reads a dataset of an unknown filter
    h5py = pytest.importorskip('h5py')
    from tests.datasets.raw_formats import write_h5_foreign_filter
    compiler = shutil.which('cc') or shutil.which('gcc')
    if compiler is None:
        pytest.skip('no C compiler to build a plugin library')
    plugins, mark = tmp_path / 'plugins', tmp_path / 'loaded'
    plugins.mkdir()
    source = tmp_path / 'plugin.c'
    source.write_text('#include <stdio.h>\n#include <stdlib.h>\n'
                      '__attribute__((constructor)) static void loaded(void) {\n'
                      '    const char *path = getenv("TORCH_MZ_TEST_PLUGIN_MARK");\n'
                      '    FILE *f = path ? fopen(path, "w") : NULL;\n'
                      '    if (f) fclose(f);\n}\n')
    built = subprocess.run([compiler, '-shared', '-fPIC', '-o', str(plugins / 'libmark.so'),
                            str(source)], capture_output=True, timeout=60)
    if built.returncode != 0:
        pytest.skip(f'the plugin library did not build: {built.stderr[-300:]!r}')
    path = write_h5_foreign_filter(str(tmp_path / 'a.h5'), 'data', np.zeros(6),
                                   label=np.zeros(2))
    monkeypatch.setenv('TORCH_MZ_TEST_PLUGIN_MARK', str(mark))
    h5py.h5pl.prepend(str(plugins).encode())
    try:
        with pytest.raises(CorruptRawFileError) as refused:
            read_h5(path, ('data', 'label'))
    finally:  # (the search path is the process's)
        where = [i for i in range(h5py.h5pl.size())
                 if h5py.h5pl.get(i) == str(plugins).encode()]
        for i in reversed(where):
            h5py.h5pl.remove(i)
    assert not mark.exists(), 'HDF5 loaded the library in its plugin path'
    assert "dataset 'data' is stored with the filter" in str(refused.value)


def test_read_h5_reads_datasets_of_the_built_in_filters_as_stored(tmp_path):
    # gzip (as PointNet's release is written), shuffle, fletcher32, lzf and scaleoffset: the
    # filters HDF5 and h5py build in, read exactly as written
    h5py = pytest.importorskip('h5py')
    rng = np.random.default_rng(0)
    values = {'gzip': rng.normal(size=(5, 64, 3)).astype(np.float32),
              'lzf': rng.normal(size=(5, 64)),
              'checked': rng.integers(-9, 9, size=(4, 16)).astype(np.int32),
              'scaled': rng.integers(0, 15, size=(40, )).astype(np.int64)}
    path = str(tmp_path / 'a.h5')
    with h5py.File(path, 'w') as f:
        f.create_dataset('gzip', data=values['gzip'], compression='gzip', compression_opts=4)
        f.create_dataset('lzf', data=values['lzf'], compression='lzf', shuffle=True)
        f.create_dataset('checked', data=values['checked'], fletcher32=True, shuffle=True,
                         compression='gzip')
        f.create_dataset('scaled', data=values['scaled'], scaleoffset=0)
    with h5py.File(path, 'r') as f:  # (each written with the filters asked for)
        assert [f[k].compression for k in values] == ['gzip', 'lzf', 'gzip', None]
        assert f['checked'].fletcher32 and f['lzf'].shuffle and f['scaled'].scaleoffset == 0
    arrays = read_h5(path, tuple(values))
    for key, value in values.items():
        assert arrays[key].dtype == value.dtype and np.array_equal(arrays[key], value), key


def test_read_h5_refuses_a_built_in_filter_this_library_lacks(tmp_path, monkeypatch):
    # an HDF5 built without one of its filters (szip is optional) would search its plugin path
    # for it as for any other
    h5py = pytest.importorskip('h5py')
    path = str(tmp_path / 'a.h5')
    with h5py.File(path, 'w') as f:
        f.create_dataset('data', data=np.zeros((4, 3)), compression='gzip')
    registered = common._h5_filter_registered  # (the library's own table, no plugin search)
    assert registered(h5py, 1) and registered(h5py, 32000) and not registered(h5py, 307)
    monkeypatch.setattr(common, '_h5_filter_registered', lambda h5py, id_: id_ != 1)  # (gzip)
    with pytest.raises(CorruptRawFileError, match=r"dataset 'data' is stored with the filter 1 "
                       r"\('deflate' as the file names it\), which this HDF5 library was built "
                       r"without"):
        read_h5(path, ('data', ))


def test_read_h5_refuses_data_that_the_file_does_not_hold(tmp_path):
    # the bug: a dataset created and never written (or with chunks missing) was read as its
    # fill value, zeros: points at the origin, every label class 0; a shape of 2**40 rows that
    # a file of a few kilobytes declares came out as a MemoryError naming neither file nor key
    h5py = pytest.importorskip('h5py')
    path = str(tmp_path / 'a.h5')
    with h5py.File(path, 'w') as f:
        f.create_dataset('label', data=np.arange(4))
        f.create_dataset('unwritten', shape=(4, 3), dtype=np.float32)
        f.create_dataset('huge', shape=(2**40, 3), dtype=np.float32, chunks=(1024, 3))
        part = f.create_dataset('part', shape=(4, 3), dtype=np.float32, chunks=(2, 3))
        part[:2] = 1.0  # (the first of its two chunks)
    with pytest.raises(CorruptRawFileError, match=r"a.h5': dataset 'unwritten' holds no data "
                       r"for its declared shape \(4, 3\): what it lacks would be read as its "
                       r"fill value"):
        read_h5(path, ('label', 'unwritten'))
    with pytest.raises(CorruptRawFileError, match=r"dataset 'huge' holds no data for its "
                       r"declared shape \(1099511627776, 3\)"):
        read_h5(path, ('label', 'huge'))
    with pytest.raises(CorruptRawFileError, match=r"dataset 'part' holds 1 of the 2 chunks of "
                       r"its declared shape \(4, 3\)"):
        read_h5(path, ('part', ))
    assert np.array_equal(read_h5(path, ('label', ))['label'], np.arange(4))


def test_read_h5_names_the_fill_value_that_missing_data_would_read_as(tmp_path):
    # the bug: the refusal said the missing data would read as zeros where the file sets
    # another fill value (-1 below: reading it gave -1 in the unwritten rows, not 0)
    h5py = pytest.importorskip('h5py')
    path = str(tmp_path / 'a.h5')
    with h5py.File(path, 'w') as f:
        part = f.create_dataset('part', shape=(4, 3), dtype=np.float64, chunks=(2, 3),
                                fillvalue=-1.0)
        part[:2] = 1.0  # (the first of its two chunks)
        f.create_dataset('unwritten', shape=(4, ), dtype=np.int32, fillvalue=7)
        f.create_dataset('plain', shape=(4, ), dtype=np.int32)
    with h5py.File(path, 'r') as f:  # (what HDF5 reads there: the fill value, not 0)
        assert f['part'][3].tolist() == [-1.0] * 3 and f['unwritten'][0] == 7
    for key, fill in (('part', r'-1\.0'), ('unwritten', '7')):
        with pytest.raises(CorruptRawFileError, match=rf"dataset '{key}' .*: what it lacks "
                           rf"would be read as its fill value \({fill}, as the file sets it\), "
                           rf"not as data") as refused:
            read_h5(path, (key, ))
        assert 'zeros' not in str(refused.value)
    with pytest.raises(CorruptRawFileError, match=r"dataset 'plain' .*: what it lacks would be "
                       r"read as its fill value \(zeros\), not as data"):
        read_h5(path, ('plain', ))


def test_read_h5_refuses_declared_sizes_beyond_the_memory(tmp_path, monkeypatch):
    # the bug: the shapes a file declares were allocated as they were (a compressed file of a
    # few megabytes may declare terabytes): a MemoryError, or the machine out of memory
    path = write_h5(str(tmp_path / 'a.h5'), data=np.zeros((50, 3)), label=np.zeros(50))
    monkeypatch.setattr(common, 'host_memory', lambda: 1500)  # (bytes: 1600 declared)
    with pytest.raises(CorruptRawFileError, match=r"a.h5': its datasets declare more bytes than "
                       r"this machine's .* of memory \('data' \(50, 3\) of float64: .*, 'label' "
                       r"\(50,\) of float64"):
        read_h5(path, ('data', 'label'))
    assert read_h5(path, ('data', ))['data'].shape == (50, 3)  # 1200 bytes alone
    monkeypatch.setattr(common, 'host_memory', lambda: None)  # (memory not known: read)
    assert len(read_h5(path, ('data', 'label'))) == 2


def test_read_h5_names_what_is_not_an_array_of_numbers(tmp_path):
    # the bug: an empty (null) dataspace came out as a 0-d object array holding h5py.Empty, and
    # a named datatype under a key was called a group
    h5py = pytest.importorskip('h5py')
    path = str(tmp_path / 'a.h5')
    with h5py.File(path, 'w') as f:
        f.create_dataset('empty', data=h5py.Empty(np.float32))
        f['type'] = np.dtype(np.float32)  # (a named datatype)
        f.create_dataset('vlen', shape=(2, ), dtype=h5py.vlen_dtype(np.float32))
        f.create_dataset('label', data=np.zeros(2))
    with pytest.raises(CorruptRawFileError, match=r"a.h5': dataset 'empty' is empty \(a null "
                       r"dataspace\): it holds no array"):
        read_h5(path, ('label', 'empty'))
    with pytest.raises(CorruptRawFileError, match="a.h5': 'type' is a named datatype, not a "
                       "dataset"):
        read_h5(path, ('type', ))
    with pytest.raises(CorruptRawFileError, match="a.h5': dataset 'vlen' holds object, not "
                       "numbers"):
        read_h5(path, ('vlen', ))


def test_read_h5_names_the_key_whose_stored_data_cannot_be_read(tmp_path):
    # the bug: a chunk whose checksum fails (a flipped byte) was 'not a readable HDF5 file',
    # without the key
    h5py = pytest.importorskip('h5py')
    values = np.arange(64, dtype=np.float64) + 0.5
    path = tmp_path / 'a.h5'
    with h5py.File(path, 'w') as f:
        f.create_dataset('data', data=values, fletcher32=True)
        f.create_dataset('label', data=np.zeros(2))
    raw = bytearray(path.read_bytes())
    at = raw.find(values.tobytes())
    assert at >= 0
    raw[at + 100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptRawFileError, match="a.h5': dataset 'data' cannot be read"):
        read_h5(str(path), ('label', 'data'))
    assert read_h5(str(path), ('label', ))['label'].shape == (2, )


@pytest.mark.parametrize('label, match', [
    (np.array([0, 1, 2, 3]).reshape(2, 2), r"'label' has shape \(2, 2\): expected one class "
     r"index per example of 'data', \(4,\) or \(4, 1\)"),
    (np.array([0, 1, 2]), r"'label' has shape \(3,\)"),
    (np.array([0.0, np.nan, 1.0, 2.0]), r"'label' holds labels that are not whole numbers "
     r"\(nan at index 1\)"),
    (np.array([0.0, 1.0, 2.5, 2.0]), r"'label' holds labels that are not whole numbers "
     r"\(2.5 at index 2\)"),
    (np.array([0, 1, -1, 2]), r"'label' holds labels outside \[0, 15\) \(-1 at index 2\)"),
    (np.array([[0], [15], [1], [2]]), r"'label' holds labels outside \[0, 15\) \(15 at index 1"),
    (np.array([0.0, np.inf, 1.0, 2.0]), r"'label' holds labels that are not whole numbers "
     r"\(inf at index 1\)"),
    (np.array([True, False, True, True]), "'label' holds booleans"),
])
def test_h5_class_labels_names_the_file_and_the_label(label, match):
    from torch_mz.datasets.common import h5_class_labels
    with pytest.raises(CorruptRawFileError, match=r"a.h5': dataset " + match):
        h5_class_labels('a.h5', label, 4, 15)


def test_h5_class_labels_reads_the_release_layouts():
    from torch_mz.datasets.common import h5_class_labels
    for label in (np.array([[0], [14], [3]], dtype=np.uint8), np.array([0.0, 14.0, 3.0]),
                  np.array([0, 14, 3], dtype='>i8')):
        labels = h5_class_labels('a.h5', label, 3, 15)
        assert labels.dtype == np.int64 and labels.tolist() == [0, 14, 3]


def test_processed_file_error_names_the_file_and_pickles():
    for unsafe in (False, True):
        err = ProcessedFileError('/data/processed/data.pt', 'is broken', unsafe=unsafe)
        assert "'/data/processed/data.pt' is broken" in str(err) and isinstance(err, ValueError)
        assert ('Delete it' in str(err)) == unsafe
        again = pickle.loads(pickle.dumps(err))
        assert (again.path, again.unsafe, str(again)) == (err.path, unsafe, str(err))


def test_load_processed_reads_weights_only_and_never_runs_code(tmp_path):
    from torch_geometric.data import Data, InMemoryDataset
    registered = Data in torch.serialization.get_safe_globals()  # (by PyG 2.6 and later)
    data, slices = InMemoryDataset.collate([Data(x=torch.ones(2, 1)), Data(x=torch.zeros(3, 1))])
    good = str(tmp_path / 'good.pt')
    torch.save((data.to_dict(), slices, Data), good)
    out = load_processed(good)
    assert out[2] is Data and torch.equal(out[0]['x'], data.x)
    crafted, marker = str(tmp_path / 'crafted.pt'), str(tmp_path / 'code-ran')
    write_crafted_pickle(crafted, marker)
    with pytest.raises(ProcessedFileError, match='crafted.pt. holds objects other') as info:
        load_processed(crafted)
    assert info.value.unsafe and not osp.exists(marker)
    for name, content in (('empty.pt', b''), ('half.pt', open(good, 'rb').read()[:100])):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ProcessedFileError, match=f'{name}. cannot be read') as info:
            load_processed(str(tmp_path / name))
        assert not info.value.unsafe
    # PyG's registration of Data survives (torch's safe_globals context would drop it)
    assert (Data in torch.serialization.get_safe_globals()) == registered


def test_processed_file_must_name_a_data_class(tmp_path):
    # the weights-only allow-list is process-wide (PyG registers dict, list, HeteroData, ...):
    # a file naming another class as its data class is refused with its name, not an
    # AttributeError from that class
    from torch_geometric.data import Data, InMemoryDataset
    from torch_mz.datasets.common import ProcessedDataset
    data, slices = InMemoryDataset.collate([Data(x=torch.ones(2, 1)), Data(x=torch.zeros(3, 1))])
    for i, cls in enumerate((dict, list)):
        path = str(tmp_path / f'odd{i}.pt')
        torch.save((data.to_dict(), slices, cls), path)
        dataset = ProcessedDataset.__new__(ProcessedDataset)
        # (PyG 2.5 registers neither dict nor list: refused as an object other than tensors)
        with pytest.raises(ProcessedFileError, match=f'odd{i}.pt. (names .* as its data class|'
                           f'holds objects other)'):
            dataset.load(path)
    good = str(tmp_path / 'good.pt')
    torch.save((data.to_dict(), slices, Data), good)
    dataset = ProcessedDataset.__new__(ProcessedDataset)
    dataset.load(good)
    assert torch.equal(dataset._data.x, data.x)


def test_integer_valued_labels():
    from torch_mz.datasets.common import integer_valued
    assert integer_valued(np.array([0, 3], dtype=np.uint8))
    assert integer_valued(np.array([0.0, 3.0])) and integer_valued(np.zeros(0))
    assert not integer_valued(np.array([0.0, 3.7]))
    assert not integer_valued(np.array([np.nan])) and not integer_valued(np.array(['a']))


def test_stats_are_written_atomically_with_the_data_sizes_and_read_back(tmp_path):
    data = tmp_path / 'data.pt'
    data.write_bytes(b'x' * 10)
    path = str(tmp_path / 'stats.json')
    save_stats({'num': 1}, path, [str(data)])
    assert load_stats(path) == {'num': 1, 'processed_files': {'data.pt': 10}}
    assert sorted(os.listdir(tmp_path)) == ['data.pt', 'stats.json']
    with open(path, 'w') as f:
        f.write('{"num": ')
    with pytest.raises(ProcessedFileError, match="stats.json' is truncated or not JSON"):
        load_stats(path)
    with open(path, 'wb') as f:
        f.write(b'{"num": "\xff"}')
    with pytest.raises(ProcessedFileError, match='stats.json'):
        load_stats(path)
    with open(path, 'w') as f:
        f.write('[1, 2]')
    with pytest.raises(ProcessedFileError, match='not hold a JSON object'):
        load_stats(path)


def _cache(root):
    folder = osp.join(root, 'processed', 'OBJ_BG_32_seed0_pos-only')
    return {name: osp.join(folder, name) for name in ('train.pt', 'test.pt', 'stats.json',
                                                       'pre_transform.pt', 'pre_filter.pt')}


@pytest.mark.parametrize('damage, match', [
    (lambda c: open(c['test.pt'], 'wb').close(), r"test.pt' has 0 bytes"),
    (lambda c: shutil.copy(c['train.pt'], c['test.pt']), r"test.pt' has \d+ bytes but"),
    (lambda c: open(c['pre_filter.pt'], 'wb').close(), "pre_filter.pt' cannot be read"),
])
def test_train_test_sets_rebuild_a_broken_cache(scanobjectnn_root, damage, match):
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    damage(_cache(root))
    with pytest.warns(UserWarning, match=f"Processed file '.*{match}.*rebuilding"):
        again = ScanObjectNN(root, train=False, num_points=32, log=False)
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ScanObjectNN(root, train=False, num_points=32, log=False)


def _drop_processing_version(cache, fixture):
    stats = json.load(open(cache['stats.json']))
    del stats['processing_version']
    json.dump(stats, open(cache['stats.json'], 'w'))


def _relabel_test_file(cache, fixture):
    rel = osp.join('h5_files', 'main_split', 'test_objectdataset.h5')
    path = osp.join(fixture['root'], 'raw', rel)
    arrays = fixture['files'][rel]
    write_h5(path, **dict(arrays, label=(arrays['label'] + 1) % 15))
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))


@pytest.mark.parametrize('damage, match', [
    (lambda c, f: open(c['test.pt'], 'wb').close(), r"test.pt' has 0 bytes.*rebuilding"),
    (lambda c, f: open(c['pre_filter.pt'], 'wb').close(), "pre_filter.pt' cannot be read"),
    (lambda c, f: os.remove(c['pre_filter.pt']), 'do not record the pre_filter'),
    (_drop_processing_version, 'recorded no processing version'),
    (_relabel_test_file, 'are not those they were built from'),
])
def test_the_rebuild_warnings_name_the_line_that_opened_the_dataset(scanobjectnn_root, damage,
                                                                    match):
    # they named a line of PyG's Dataset constructor or of torch_mz's cache checks (a fixed
    # stacklevel from inside them), not the caller's, as the parser-version warning did
    root = scanobjectnn_root['root']
    ScanObjectNN(root, train=False, num_points=32, log=False)
    damage(_cache(root), scanobjectnn_root)
    with pytest.warns(UserWarning, match=match) as caught:
        ScanObjectNN(root, train=False, num_points=32, log=False)
    assert {w.filename for w in caught if re.search(match, str(w.message))} == {__file__}


def test_a_dataset_warning_opened_by_the_command_line_names_its_line(tmp_path):
    # run as `torch-mz` or `python -m torch_mz`, no frame outside torch_mz and PyG opened the
    # dataset: the warning named the console script's line or '<frozen runpy>'; the command
    # line's own line is the one that opened it
    package = osp.dirname(osp.abspath(common.__file__))
    cli = osp.join(osp.dirname(package), 'cli', '_common.py')
    opener = compile('def open_dataset(warn):\n    warn()\n', cli, 'exec')
    inside = compile('def warn():\n    warnings.warn("stale", stacklevel=caller())\n',
                     osp.join(package, 'common.py'), 'exec')
    space = dict(warnings=warnings, caller=common._caller_stacklevel)
    exec(opener, space)
    exec(inside, space)
    with pytest.warns(UserWarning, match='stale') as caught:
        space['open_dataset'](space['warn'])
    assert [(w.filename, w.lineno) for w in caught] == [(cli, 2)]


def test_an_interrupted_rebuild_is_redone_not_read_as_a_mixed_cache(scanobjectnn_root,
                                                                   monkeypatch):
    # a rebuild writes train.pt, test.pt, then stats.json and the markers: stopped after
    # train.pt, the next start must not take the new train.pt and the old test.pt for one cache
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    cache = _cache(root)
    original = ScanObjectNN.save

    def save_then_stop(data_list, path, **kwargs):
        original(data_list, path, **kwargs)
        if path.endswith('train.pt'):
            raise KeyboardInterrupt  # the session ends here

    monkeypatch.setattr(ScanObjectNN, 'save', staticmethod(save_then_stop))
    with pytest.raises(KeyboardInterrupt):
        ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    monkeypatch.undo()
    assert osp.exists(cache['train.pt']) and osp.exists(cache['test.pt'])
    assert not osp.exists(cache['stats.json'])  # (written last: the cache is incomplete)
    calls = []
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: (calls.append(1),
                                                               original_process(self)))
    original_process = TrainTestSets.process
    again = ScanObjectNN(root, train=False, num_points=32, log=False)
    assert calls == [1]  # rebuilt
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))
    assert osp.exists(cache['stats.json'])


def test_train_test_sets_refuse_a_crafted_split_file(scanobjectnn_root, tmp_path):
    root = scanobjectnn_root['root']
    ScanObjectNN(root, num_points=32, log=False)
    cache = _cache(root)
    marker = str(tmp_path / 'code-ran')
    write_crafted_pickle(cache['train.pt'], marker)
    stats = json.load(open(cache['stats.json']))  # made to fit, as by one who swaps the file
    stats['processed_files']['train.pt'] = osp.getsize(cache['train.pt'])
    json.dump(stats, open(cache['stats.json'], 'w'))
    with pytest.raises(ProcessedFileError, match="train.pt' holds objects other"):
        ScanObjectNN(root, num_points=32, log=False)
    assert not osp.exists(marker)


def test_a_rebuild_writes_no_file_outside_a_copied_cache_through_its_links(scanobjectnn_root,
                                                                          tmp_path):
    # a processed folder copied from elsewhere may hold symbolic links to files outside it: a
    # rebuild wrote through them, creating the files a dangling link names and overwriting
    # those a link points at (here someone's checkpoint, with a stats.json that calls for the
    # rebuild); the links are replaced by the cache's own files now
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    cache = _cache(root)
    outside = tmp_path / 'outside'
    outside.mkdir()
    checkpoint = outside / 'best.pt'
    torch.save({'weights': torch.ones(3)}, checkpoint)
    kept = checkpoint.read_bytes()
    for name, path in cache.items():
        os.unlink(path)
        os.symlink(checkpoint if name == 'train.pt' else outside / f'new-{name}', path)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (the cache is rebuilt, with or without a warning)
        again = ScanObjectNN(root, train=False, num_points=32, log=False)
    assert checkpoint.read_bytes() == kept
    assert sorted(p.name for p in outside.iterdir()) == ['best.pt']
    assert not any(osp.islink(p) for p in cache.values())
    assert all(osp.isfile(p) for p in cache.values())
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))


def test_opening_a_copied_cache_creates_no_file_through_its_lock_links(scanobjectnn_root,
                                                                     tmp_path):
    # the rebuild's files were written without following links, but the locks were opened
    # through them: a copied processed/ whose lock files are dangling links created the files
    # they name, outside the cache, on every open (and on a download)
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    outside = tmp_path / 'outside'
    outside.mkdir()
    lock = first.processed_dir.rstrip(os.sep) + '.lock'
    download = osp.join(root, 'processed', '.download.lock')
    for name, path in (('build', lock), ('download', download)):
        if osp.lexists(path):
            os.unlink(path)
        os.symlink(outside / f'{name}.lock', path)
    again = ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    with common.download_lock(root):
        pass
    assert list(outside.iterdir()) == []
    assert len(again) == len(first)


def test_a_processed_folder_kept_as_a_link_is_still_written_through(scanobjectnn_root,
                                                                    tmp_path):
    # (links in the cache are replaced, not written through; processed/ itself as a link to
    # another disk is the user's choice, and the cache is built there)
    root = scanobjectnn_root['root']
    fast = tmp_path / 'fast' / 'processed'
    fast.mkdir(parents=True)
    os.symlink(fast, osp.join(root, 'processed'))
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    again = ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    assert osp.islink(osp.join(root, 'processed'))
    folder = fast / osp.basename(first.processed_dir)
    assert sorted(p.name for p in folder.iterdir()) == sorted(_cache(root))
    assert not any(p.is_symlink() for p in folder.iterdir())
    assert (fast / (folder.name + '.lock')).is_file()
    assert len(again) == len(first) and all(torch.equal(a.pos, b.pos) for a, b in zip(first, again))


class _MyData(__import__('torch_geometric.data', fromlist=['Data']).Data):
    pass


@pytest.mark.parametrize('make', ['subclass', 'numpy'])
def test_a_pre_transform_making_unloadable_files_is_named_not_rebuilt_forever(
        make, scanobjectnn_root):
    # what pre_transform returns is saved, then loaded weights-only: a Data subclass or a numpy
    # attribute is refused. Before, the message said "delete it to rebuild", which wrote the
    # same file again; now it says what to change, and the file is gone
    def pre_transform(data):
        if make == 'subclass':
            return _MyData(**data.to_dict())
        data.meta = np.zeros(2)
        return data

    root = scanobjectnn_root['root']
    with pytest.raises(ProcessedFileError, match='was just written from the raw files') as info:
        ScanObjectNN(root, num_points=16, pre_transform=pre_transform, log=False)
    message = str(info.value)
    assert 'add_safe_globals' in message and 'Delete it' not in message and info.value.unsafe
    assert not osp.exists(info.value.path)
    if make == 'subclass':  # allowed as the message says, the same dataset builds and loads
        with torch.serialization.safe_globals([_MyData]):
            ds = ScanObjectNN(root, num_points=16, pre_transform=pre_transform, log=False)
        assert len(ds) == 5 and type(ds[0]) is _MyData and ds[0].pos.shape == (16, 3)
    # without pre_transform: the default cache, no error
    assert len(ScanObjectNN(root, num_points=16, log=False, force_reload=True)) == 5


def test_a_build_removes_the_temporary_files_a_killed_build_left(scanobjectnn_root):
    # atomic_write's temporary files of a build killed mid-write (SIGKILL: no cleanup ran)
    # stayed in the processed folder for good, each the size of a cache file
    root = scanobjectnn_root['root']
    ds = ScanObjectNN(root, num_points=16, log=False)
    folder = ds.processed_dir
    left = [osp.join(folder, '.train.pt.0123456789ab.tmp'),
            osp.join(folder, '.pre_transform.pt.abcdef012345.tmp')]
    other = osp.join(folder, 'notes.tmp')  # not one of the dataset's files: kept
    recent = osp.join(folder, '.test.pt.0123456789ab.tmp')  # maybe a build in progress
    for path in left + [other, recent]:
        with open(path, 'wb') as f:
            f.write(b'partial')
        if path != recent:
            os.utime(path, (1e9, 1e9))  # untouched for long
    again = ScanObjectNN(root, num_points=16, log=False)
    assert len(again) == len(ds)
    assert not any(osp.exists(p) for p in left) and osp.exists(other) and osp.exists(recent)
    # a cache shared read-only opens as it is, its stale files left (it raised before)
    os.utime(recent, (1e9, 1e9))
    from unittest import mock
    with mock.patch('os.unlink', side_effect=PermissionError(13, 'Permission denied')):
        assert len(ScanObjectNN(root, num_points=16, log=False)) == len(ds)
    assert osp.exists(recent)


def test_a_rebuild_holds_the_cache_lock(scanobjectnn_root, monkeypatch):
    # two processes opening one dataset at once take turns: the one building holds
    # <processed_dir>.lock, which the other waits for before it checks the cache
    import fcntl
    root = scanobjectnn_root['root']
    first = ScanObjectNN(root, train=False, num_points=32, log=False)
    lock = first.processed_dir.rstrip(os.sep) + '.lock'
    held = []
    original = TrainTestSets.process

    def process(self):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        original(self)

    monkeypatch.setattr(ScanObjectNN, 'process', process)
    ScanObjectNN(root, train=False, num_points=32, log=False, force_reload=True)
    assert held == [True]
    assert not osp.exists(osp.join(first.processed_dir, osp.basename(lock)))  # beside, not in


def test_a_cache_rebuilt_by_another_process_before_the_read_is_not_read_as_ours(
        scanobjectnn_root, monkeypatch):
    # two jobs open one root at once with other pre_transforms: the second waits for the lock
    # while the first builds. The first released it between its check-and-build (PyG's
    # _process) and its read (open_cache), so the second took it, rebuilt the cache with its
    # own pre_transform, and the first read those data as its own (pos * 100, not pos * 2)
    root = scanobjectnn_root['root']
    plain = ScanObjectNN(root, num_points=32, log=False)
    original = common.ProcessedDataset.open_cache
    other = []

    def open_cache(self):
        if not other:  # the other job takes the lock here, before this one reads
            other.append(None)
            other[0] = ScanObjectNN(root, num_points=32, log=False, pre_transform=_Scale(100))
        original(self)

    monkeypatch.setattr(common.ProcessedDataset, 'open_cache', open_cache)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)  # (each rebuild names the other's markers)
        ours = ScanObjectNN(root, num_points=32, log=False, pre_transform=_Scale(2))
    assert len(ours) == len(plain) == len(other[0])
    for a, b, c in zip(plain, ours, other[0]):
        torch.testing.assert_close(b.pos, 2 * a.pos)
        torch.testing.assert_close(c.pos, 100 * a.pos)


# --------------------------------------------------------------------------------------------------
# the markers of pre_transform / pre_filter: class and parameters, not the repr alone


class _Scale:  # no __repr__: its repr names the class only (and an address)
    def __init__(self, s):
        self.s = s

    def __call__(self, data):
        data.pos = data.pos * self.s
        return data


def _same_text(data):
    return data


def _other_text(data):
    return data


_TELL_APART = [  # pairs of makers of transforms that the repr alone could not tell apart
    (lambda: FixedPoints(32), lambda: FixedPoints(32, allow_duplicates=True)),
    (lambda: KNNGraph(), lambda: KNNGraph(loop=True)),
    (lambda: _Scale(2.0), lambda: _Scale(100.0)),
    (lambda: Compose([NormalizeScale(), _Scale(2.0)]),
     lambda: Compose([NormalizeScale(), _Scale(3.0)])),
    (lambda: _Scale([1, (2, 3)]), lambda: _Scale([1, (2, 4)])),
    (lambda: _Scale({'a': 1}), lambda: _Scale({'a': 2})),
    (lambda: _Scale(torch.ones(3)), lambda: _Scale(torch.ones(3) * 2)),
    (lambda: _Scale(np.arange(3)), lambda: _Scale(np.arange(1, 4))),
    (lambda: _Scale(_same_text), lambda: _Scale(_other_text)),
]


def _old_text(transform):
    # what the markers of earlier releases held: the repr, addresses removed
    return re.sub('(<.*?)\\s.*(>)', r'\1\2', str(transform))


@pytest.mark.parametrize('make_a, make_b', _TELL_APART)
def test_describe_tells_transforms_apart_by_their_parameters(make_a, make_b):
    from torch_mz.datasets.fingerprint import _describe
    a, b = make_a(), make_b()
    if not isinstance(a.s if isinstance(a, _Scale) else None, (Tensor, np.ndarray)):
        assert _old_text(a) == _old_text(b)  # what the markers held before
    assert _describe(a) != _describe(b)
    assert _describe(make_a()) == _describe(a)  # an equal transform: the same description
    assert '0x' not in _describe(a) and '0x' not in _describe(b)


class _PrivateScale:  # a parameter kept in a private attribute, a repr without it
    def __init__(self, factor):
        self._factor = factor
        self._cache = None  # state a transform may fill as it runs: not described
        self._seen = 0  # a counter: not described (the splits share the instance)

    def __call__(self, data):
        self._seen += 1
        data.pos = data.pos * self._factor
        return data


FACTOR = 2.0


def _scale_by_global(data):
    data.pos = data.pos * FACTOR
    return data


class _MangledScale:  # a parameter kept under a mangled name
    def __init__(self, factor):
        self.__factor = factor

    def __call__(self, data):
        return data


class _KeywordScale:  # a constructor that does not name its parameters
    def __init__(self, **options):
        self._factor = options['factor']

    def __call__(self, data):
        return data


def _scale_by_attribute(data):
    data.pos = data.pos * data.FACTOR
    return data


def test_describe_sees_private_parameters_module_weights_and_read_globals(monkeypatch):
    # a dataset opened with Scale(3) loaded the cache built with Scale(2) when the factor was
    # private, two modules differing only in their weights were described alike, and so was a
    # function before and after the module-level setting it reads changed
    import sys
    from torch_mz.datasets.fingerprint import _describe
    assert _describe(_PrivateScale(2.0)) != _describe(_PrivateScale(3.0))
    assert _describe(_MangledScale(2.0)) != _describe(_MangledScale(3.0))
    assert _describe(_KeywordScale(factor=2.0)) != _describe(_KeywordScale(factor=3.0))
    used = _PrivateScale(2.0)
    used._cache = {'a': torch.ones(3)}
    from torch_geometric.data import Data
    used(Data(pos=torch.ones(2, 3)))  # (the counter moves)
    assert _describe(used) == _describe(_PrivateScale(2.0))
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 3)
    torch.manual_seed(1)
    b = torch.nn.Linear(3, 3)
    assert _describe(a) != _describe(b)
    assert _describe(a) == _describe(a)
    before = _describe(_scale_by_global)
    monkeypatch.setattr(sys.modules[__name__], 'FACTOR', 5.0)
    assert _describe(_scale_by_global) != before
    # an attribute of the same name as a global is no read of that global
    reads_attribute = _describe(_scale_by_attribute)
    monkeypatch.setattr(sys.modules[__name__], 'FACTOR', 7.0)
    assert _describe(_scale_by_attribute) == reads_attribute


def test_describe_names_class_and_parameters_and_stays_bounded():
    from torch_mz.datasets.fingerprint import _describe
    described = _describe(FixedPoints(32, allow_duplicates=True))
    assert described == ('torch_geometric.transforms.fixed_points.FixedPoints('
                         'allow_duplicates=True, num=32, replace=True; '
                         'repr FixedPoints(32, replace=True))')
    assert _describe(None) == 'None'
    deep: list = []
    node = deep
    for _ in range(100):
        node.append([])
        node = node[0]
    cyclic = _Scale(1.0)
    cyclic.s = cyclic
    for value in (deep, cyclic, list(range(100_000))):
        assert len(_describe(_Scale(value))) < 10_000
    assert _describe(_Scale({'b': 1, 'a': {2, 3}})) == _describe(_Scale({'a': {3, 2}, 'b': 1}))
    assert _describe(lambda d: d.num_nodes > 3) != _describe(lambda d: d.num_nodes > 5)


def test_describe_is_the_same_in_another_process():
    import subprocess
    import sys
    code = ('from torch_geometric import transforms as T;'
            'from torch_mz.datasets.fingerprint import _describe;'
            "print(_describe(T.Compose([T.FixedPoints(8), lambda d: d.y in {'a', 'b', 'c'}])))")
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    out = {subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=repo,
                          env=dict(os.environ, PYTHONHASHSEED=str(seed)), check=True).stdout
           for seed in (1, 2)}
    assert len(out) == 1 and 'FixedPoints(allow_duplicates=False, num=8' in out.pop()


@pytest.mark.parametrize('make', [
    lambda second: FixedPoints(24, replace=False, allow_duplicates=second),
    lambda second: _Scale(100.0 if second else 2.0),
], ids=['FixedPoints-allow_duplicates', 'no-repr'])
def test_a_transform_with_the_same_repr_but_other_parameters_rebuilds_the_cache(
        scanobjectnn_root, monkeypatch, make):
    # before, both shared one cache: the second got the data of the first
    root = scanobjectnn_root['root']
    direct = [make(True)(d) for d in ScanObjectNN(root, num_points=16, log=False)]
    first = make(False)
    with pytest.warns(UserWarning, match='made with pre_transform=None, not'):
        built = ScanObjectNN(root, num_points=16, pre_transform=first, log=False)
    with pytest.warns(UserWarning, match='were made with .*other parameters.*: rebuilding them'):
        other = ScanObjectNN(root, num_points=16, pre_transform=make(True), log=False)
    assert [(d.num_nodes, d.pos.abs().max()) for d in other] != [
        (d.num_nodes, d.pos.abs().max()) for d in built]
    calls = []
    original = TrainTestSets.process
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: (calls.append(1), original(self)))
    second = make(True)
    for transform in (second, second, make(True)):  # the same object twice, then an equal one
        with warnings.catch_warnings():
            warnings.simplefilter('error', UserWarning)
            again = ScanObjectNN(root, num_points=16, pre_transform=transform, log=False)
    assert calls == []  # reused: never rebuilt without need
    assert all(a.num_nodes == b.num_nodes and torch.allclose(a.pos.abs().max(),
                                                             b.pos.abs().max())
               for a, b in zip(again, direct))
    with pytest.warns(UserWarning, match='rebuilding'):
        ScanObjectNN(root, num_points=16, pre_transform=first, log=False)
    assert calls == [1]


def test_a_marker_of_an_earlier_release_is_not_trusted(scanobjectnn_root):
    # earlier releases recorded the repr text alone: which parameters made the cache is not
    # known, so it is rebuilt (a cache recorded as made without any transform is exact)
    root = scanobjectnn_root['root']
    transform = FixedPoints(24, replace=False, allow_duplicates=True)
    ScanObjectNN(root, num_points=16, pre_transform=transform, log=False)
    cache = _cache16(root)
    torch.save(_old_text(transform), cache['pre_transform.pt'])  # what an earlier one wrote
    with pytest.warns(UserWarning, match=r'made with pre_transform=FixedPoints\(24.* as an '
                      r'earlier release of torch_mz recorded it .*rebuilding'):
        again = ScanObjectNN(root, num_points=16, pre_transform=transform, log=False)
    assert all(d.num_nodes == 24 for d in again)
    assert isinstance(torch.load(cache['pre_transform.pt']), dict)
    # a missing marker beside a complete cache: what it was made with is not known either
    os.unlink(cache['pre_filter.pt'])
    with pytest.warns(UserWarning, match="do not record the pre_filter .*rebuilding"):
        ScanObjectNN(root, num_points=16, pre_transform=transform, log=False)
    assert osp.exists(cache['pre_filter.pt'])


def _cache16(root):
    folder = osp.join(root, 'processed', 'OBJ_BG_16_seed0_pos-only')
    return {name: osp.join(folder, name) for name in ('train.pt', 'test.pt', 'stats.json',
                                                       'pre_transform.pt', 'pre_filter.pt')}


# --------------------------------------------------------------------------------------------------
# the order of a rebuild's writes: stats.json, the mark of completion, last


@pytest.mark.parametrize('stop_at', ['train.pt', 'test.pt', 'pre_transform.pt', 'pre_filter.pt',
                                     'stats.json'])
def test_a_rebuild_stopped_at_any_write_never_leaves_a_cache_trusted_wrongly(
        scanobjectnn_root, monkeypatch, stop_at):
    root = scanobjectnn_root['root']
    plain = ScanObjectNN(root, num_points=16, log=False)
    scaled = [100 * d.pos for d in plain]
    original = common.atomic_write

    def stopping(path, *args, **kwargs):
        if osp.basename(path) == stop_at:
            raise KeyboardInterrupt  # the process is killed before this file is in place
        return original(path, *args, **kwargs)

    monkeypatch.setattr(common, 'atomic_write', stopping)
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match='rebuilding'):
        ScanObjectNN(root, num_points=16, pre_transform=_Scale(100.0), log=False)
    monkeypatch.undo()
    cache = _cache16(root)
    assert not osp.exists(cache['stats.json']) or stop_at == 'train.pt'
    # whichever transform is asked for next, the data are made with it
    for transform, expected in ((None, [d.pos for d in plain]), (_Scale(100.0), scaled)):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', UserWarning)
            ds = ScanObjectNN(root, num_points=16, pre_transform=transform, log=False)
        assert all(torch.allclose(d.pos, pos) for d, pos in zip(ds, expected)), (stop_at,
                                                                                transform)
    assert sorted(os.listdir(osp.dirname(cache['stats.json']))) == sorted(cache)


# --------------------------------------------------------------------------------------------------
# the raw files' fingerprint


def test_a_changed_raw_file_rebuilds_the_cache_and_names_it(scanobjectnn_root, monkeypatch):
    root, files = scanobjectnn_root['root'], scanobjectnn_root['files']
    rel = osp.join('h5_files', 'main_split', 'training_objectdataset.h5')
    first = ScanObjectNN(root, num_points=16, log=False)
    stats = load_stats(_cache16(root)['stats.json'])
    assert {k: v[:2] for k, v in stats['raw_files'].items()} == {
        p.replace(os.sep, '/'): [osp.getsize(osp.join(root, 'raw', p)),
                                 f"mtime_ns:{os.stat(osp.join(root, 'raw', p)).st_mtime_ns}"]
        for p in (rel, rel.replace('training', 'test'))}
    assert all(v[2].startswith('sha1:') for v in stats['raw_files'].values())
    # the same bytes with other times (a copy that did not keep them, a touch): the same data,
    # compared by their hashes, not rebuilt
    path = osp.join(root, 'raw', rel)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    import torch_mz.datasets.fingerprint as fingerprint
    hashed = []
    sha1_of = fingerprint._sha1_of
    monkeypatch.setattr(fingerprint, '_sha1_of', lambda p: hashed.append(p) or sha1_of(p))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        monkeypatch.setattr(ScanObjectNN, 'process', lambda self: pytest.fail('rebuilt'))
        assert len(ScanObjectNN(root, num_points=16, log=False)) == len(first)
        assert hashed == [path]  # the touched file alone
        assert len(ScanObjectNN(root, num_points=16, log=False)) == len(first)
        assert hashed == [path]  # its new time recorded: the next open hashes nothing
    monkeypatch.undo()
    changed = (r"raw files .* are not those they were built from \(changed in size, contents or "
               r"modification time: h5_files/main_split/training_objectdataset\.h5\): "
               r"rebuilding")
    # the same shapes with other labels: the same size (a cache keyed by sizes alone served the
    # old labels)
    size = osp.getsize(path)
    relabelled = dict(files[rel], label=(files[rel]['label'] + 1) % 15)
    write_h5(path, **relabelled)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    assert osp.getsize(path) == size
    with pytest.warns(UserWarning, match=changed):
        relabelled_set = ScanObjectNN(root, num_points=16, log=False)
    assert [int(d.y) for d in relabelled_set] == [(int(d.y) + 1) % 15 for d in first]
    arrays = {k: v[:4] for k, v in files[rel].items()}  # one object fewer
    write_h5(path, **arrays)
    with pytest.warns(UserWarning, match=changed):
        again = ScanObjectNN(root, num_points=16, log=False)
    assert len(again) == len(first) - 1
    # a cache that records no fingerprint (hand-edited; earlier releases are another version)
    stats = json.load(open(_cache16(root)['stats.json']))
    del stats['raw_files']
    json.dump(stats, open(_cache16(root)['stats.json'], 'w'))
    with pytest.warns(UserWarning, match='records no fingerprint of them.*rebuilding'):
        ScanObjectNN(root, num_points=16, log=False)
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: pytest.fail('must be reused'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        assert len(ScanObjectNN(root, num_points=16, log=False)) == len(again)


def test_fingerprint_files(tmp_path):
    from torch_mz.datasets.fingerprint import FINGERPRINT_HASH_LIMIT, fingerprint_files
    small = tmp_path / 'a' / 'small.csv'
    small.parent.mkdir()
    small.write_text('x,y\n1,2\n')
    big = tmp_path / 'big.bin'
    with open(big, 'wb') as f:
        f.truncate(FINGERPRINT_HASH_LIMIT + 1)
    paths = [str(small), str(big), str(tmp_path / 'missing')]
    assert fingerprint_files(paths, str(tmp_path)) == {
        'a/small.csv': [8, f'mtime_ns:{os.stat(small).st_mtime_ns}'],
        'big.bin': [FINGERPRINT_HASH_LIMIT + 1, f'mtime_ns:{os.stat(big).st_mtime_ns}']}
    content = fingerprint_files(paths, str(tmp_path), content=True)
    assert content['a/small.csv'][1].startswith('sha1:')
    assert content['big.bin'][1] == f'mtime_ns:{os.stat(big).st_mtime_ns}'
    small.write_text('x,y\n1,3\n')  # the same size
    assert fingerprint_files(paths, str(tmp_path), content=True) != content


def test_clear_staging_in_a_folder_with_glob_characters(tmp_path):
    from torch_mz.datasets.common import clear_staging
    folder = tmp_path / 'run[1]'
    (folder / '.download-x').mkdir(parents=True)
    (folder / '.extract-y').mkdir()
    (folder / 'keep').mkdir()
    clear_staging(str(folder))
    assert sorted(os.listdir(folder)) == ['keep']


def test_stats_take_numpy_numbers(tmp_path):
    path = str(tmp_path / 'stats.json')
    save_stats({'seed': np.int64(3), 'x': np.float32(0.5)}, path)
    assert load_stats(path) == {'seed': 3, 'x': 0.5, 'processed_files': {}}


class _Lazy:
    r"""A pre_transform that keeps state it makes on its first call (a lazy cache)."""
    def __init__(self):
        self._scale = None

    def __call__(self, data):
        if self._scale is None:
            self._scale = torch.tensor(2.0)
        data.pos = data.pos * self._scale
        return data


def test_a_transform_that_keeps_state_is_recorded_as_given(scanobjectnn_root, monkeypatch):
    # the marker was described after process() had run the transform: a fresh one never
    # matched it, and the cache was rebuilt in every new process
    root = scanobjectnn_root['root']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (a cache of another transform may be there)
        ScanObjectNN(root, num_points=16, pre_transform=_Lazy(), log=False)
    calls = []
    original = TrainTestSets.process
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: (calls.append(1), original(self)))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ScanObjectNN(root, num_points=16, pre_transform=_Lazy(), log=False)
    assert calls == []


def test_a_stateful_transform_shared_by_both_splits_is_processed_once(scanobjectnn_root,
                                                                    monkeypatch):
    # the usual PyG idiom (and load_task's): one instance for the train and the test dataset;
    # the second described it after the first had run it, and rebuilt the cache
    root = scanobjectnn_root['root']
    calls = []
    original = TrainTestSets.process
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: (calls.append(1), original(self)))
    shared = _Lazy()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (a cache of another transform may be there)
        ScanObjectNN(root, num_points=16, pre_transform=shared, train=True, log=False)
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ScanObjectNN(root, num_points=16, pre_transform=shared, train=False, log=False)
        ScanObjectNN(root, num_points=16, pre_transform=_Lazy(), train=True, log=False)
    assert len(calls) <= 1


def test_the_data_root_variable_names_itself(tmp_path, monkeypatch):
    # a file given as $TORCH_MZ_DATA failed later as "Not a directory: .../QM9"; blank was a
    # folder named ' '
    from torch_mz.datasets.common import ENV_DATA_ROOT, default_root
    afile = tmp_path / 'afile'
    afile.write_text('')
    monkeypatch.setenv(ENV_DATA_ROOT, str(afile))
    with pytest.raises(ValueError, match=r'\$TORCH_MZ_DATA .* is a file'):
        default_root('QM9')
    monkeypatch.delenv(ENV_DATA_ROOT)
    unset = default_root('QM9')
    monkeypatch.setenv(ENV_DATA_ROOT, '  ')
    assert default_root('QM9') == unset


def test_raw_files_differ_reads_times_and_hashes():
    from torch_mz.datasets.fingerprint import raw_files_differ
    calls = []

    def rehash(hashed):
        return lambda keys: calls.append(sorted(keys)) or hashed

    rec = {'a': [5, 'mtime_ns:1', 'sha1:aa'], 'b': [7, 'sha1:bb']}
    now = {'a': [5, 'mtime_ns:1'], 'b': [7, 'sha1:bb']}
    assert raw_files_differ(rec, now, rehash(None)) == '' and calls == []  # nothing read
    touched = {'a': [5, 'mtime_ns:2'], 'b': [7, 'sha1:bb']}
    assert raw_files_differ(rec, touched, rehash({'a': [5, 'mtime_ns:2', 'sha1:aa']})) == ''
    assert calls == [['a']]  # the times differ: that file's bytes hashed, and the same
    edited = raw_files_differ(rec, touched, rehash({'a': [5, 'mtime_ns:2', 'sha1:cc']}))
    assert edited == 'changed in size, contents or modification time: a'
    assert 'added: c' in raw_files_differ(rec, dict(now, c=[1, 'mtime_ns:3']), rehash(None))
    # a record without hashes (a large file read whole) and one of an earlier release
    assert raw_files_differ({'a': [5, 'mtime_ns:1']}, touched, rehash(None)) != ''
    assert 'sizes alone' in raw_files_differ({'a': 5}, {'a': [5, 'mtime_ns:1']}, rehash(None))
    assert 'no fingerprint' in raw_files_differ(None, now, rehash(None))


def test_split_digest_reads_the_selected_items_alone():
    # the digest covered the whole storage (a change to an item in no split read as changed
    # splits) and failed on a 0-dim attribute; it reads the stored rows of the items selected,
    # in their order, not what a transform makes of them
    from torch_geometric.data import Data, InMemoryDataset

    from torch_mz.datasets.fingerprint import split_digest

    class Memory(InMemoryDataset):
        def __init__(self, items, transform=None):
            super().__init__(None, transform, log=False)
            self.data, self.slices = self.collate(items)

    def items(third=3.0):
        return [Data(pos=torch.full((n, 2), float(v)), y=torch.tensor([[v]]))
                for n, v in ((2, 1.0), (3, 2.0), (1, third))]

    ds = Memory(items())
    digest = split_digest(ds.index_select([0, 1]))
    assert digest == split_digest(Memory(items(third=9.0)).index_select([0, 1]))  # not selected
    assert digest != split_digest(Memory(items(third=9.0)).index_select([0, 2]))
    assert digest != split_digest(ds.index_select([1, 0]))  # another order
    noisy = Memory(items(), transform=lambda d: Data(pos=torch.randn_like(d.pos), y=d.y))
    assert split_digest(noisy.index_select([0, 1])) == digest
    class Stacked(Data):  # an attribute stacked along a new dimension (cat dim None)
        def __cat_dim__(self, key, value, *args, **kwargs):
            return None if key == 'm' else super().__cat_dim__(key, value, *args, **kwargs)

    stacked = Memory([Stacked(pos=torch.zeros(1, 2), m=torch.full((2, 2), float(k)))
                      for k in range(3)])
    assert split_digest(stacked.index_select([0, 1])) != split_digest(
        stacked.index_select([0, 2]))
    one = Memory([Data(pos=torch.zeros(2, 2), t=torch.tensor(1.5))])  # stored uncollated
    assert split_digest(one) is not None and split_digest([Data(pos=torch.zeros(1, 2))]) is None


def test_split_digest_reads_non_tensor_attributes_of_the_selected_items():
    # a name per item (PyG collates it into a list) was left out: other items under the same
    # tensors read as the same split
    from torch_geometric.data import Data, InMemoryDataset

    from torch_mz.datasets.fingerprint import split_digest

    class Memory(InMemoryDataset):
        def __init__(self, items):
            super().__init__(None, None, log=False)
            self.data, self.slices = self.collate(items)

    def named(*names):
        return Memory([Data(pos=torch.zeros(2, 2), name=n) for n in names])

    digest = split_digest(named('a', 'b', 'c').index_select([0, 1]))
    assert digest != split_digest(named('a', 'x', 'c').index_select([0, 1]))
    assert digest == split_digest(named('a', 'b', 'x').index_select([0, 1]))  # not selected
    assert digest != split_digest(named('a', 'b', 'c').index_select([1, 0]))


@pytest.mark.parametrize('dataset, package', [('modelnet', 'trimesh'), ('qm9', 'rdkit')])
def test_a_missing_optional_package_is_named_before_anything_is_downloaded(dataset, package,
                                                                          tmp_path, monkeypatch):
    # trimesh (ModelNet40's meshes) and RDKit (QM9's SDF) were asked for only after the
    # download: for ModelNet40 the ~2 GB archive, downloaded and unpacked
    import importlib
    module = importlib.import_module(f'torch_mz.datasets.{dataset}')

    def absent(name):
        raise ImportError(f"'{name}' is required for this feature but could not be imported")

    def no_download(*args, **kwargs):
        raise AssertionError(f'downloaded before checking for {package}')

    monkeypatch.setattr(module, 'require', absent)
    monkeypatch.setattr(module, 'download_url', no_download)
    with pytest.raises(ImportError, match=f"'{package}' is required"):
        if dataset == 'modelnet':
            module.ModelNet40(str(tmp_path / 'ModelNet40'), num_points=16, log=False)
        else:
            module.QM9(str(tmp_path / 'QM9'), log=False)


def test_split_digest_leaves_out_entries_whose_text_is_no_plain_value():
    # an object's text may hold its address, other in every process: a digest of it would
    # refuse the same data in the next process
    from torch_geometric.data import Data, InMemoryDataset

    from torch_mz.datasets.fingerprint import split_digest

    class Memory(InMemoryDataset):
        def __init__(self, items):
            super().__init__(None, None, log=False)
            self.data, self.slices = self.collate(items)

    def tagged(tag):
        return Memory([Data(pos=torch.zeros(2, 2), tag=tag()) for _ in range(2)])

    assert split_digest(tagged(object)) == split_digest(tagged(object))
    assert split_digest(tagged(object)) == split_digest(Memory([Data(pos=torch.zeros(2, 2))
                                                               for _ in range(2)]))


def test_opening_an_unchanged_cache_writes_nothing(scanobjectnn_root):
    # a build records [size, mtime, sha1] and the check computes [size, mtime]: they never
    # compared equal, and every open rewrote stats.json with the same content
    root = scanobjectnn_root['root']
    ScanObjectNN(root, num_points=16, log=False)
    stats_path = _cache16(root)['stats.json']
    before = os.stat(stats_path)
    for _ in range(3):
        ScanObjectNN(root, num_points=16, log=False)
        after = os.stat(stats_path)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # a time that changed (the same bytes) is still recorded, once
    path = osp.join(root, 'raw', 'h5_files', 'main_split', 'training_objectdataset.h5')
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    ScanObjectNN(root, num_points=16, log=False)
    touched = os.stat(stats_path)
    assert touched.st_mtime_ns != before.st_mtime_ns or touched.st_ino != before.st_ino
    recorded = load_stats(stats_path)['raw_files']['h5_files/main_split/training_objectdataset.h5']
    assert recorded[1] == f'mtime_ns:{os.stat(path).st_mtime_ns}'
    ScanObjectNN(root, num_points=16, log=False)
    again = os.stat(stats_path)
    assert (again.st_ino, again.st_mtime_ns) == (touched.st_ino, touched.st_mtime_ns)


class _TensorScale:  # a parameter kept as a private tensor, a repr without it
    def __init__(self, factor):
        self._factor = torch.as_tensor(factor, dtype=torch.float)
        self._cache = None  # (state: not described)

    def __call__(self, data):
        data.pos = data.pos * self._factor
        return data


CONFIG = {'scale': 1.0}


def _scale_by_global_dict(data):
    data.pos = data.pos * CONFIG['scale']
    return data


WEIGHTS = torch.ones(3)


def _scale_by_global_tensor(data):
    data.pos = data.pos * WEIGHTS
    return data


def test_describe_sees_private_tensor_parameters_and_containers_read_as_globals(monkeypatch):
    # Scale([10, 10, 10]) was described as Scale([1, 1, 1]), and a function as before the
    # module-level dict (or tensor) it reads was changed: the old cache was reused
    import sys
    from torch_mz.datasets.fingerprint import _describe
    assert _describe(_TensorScale([1.0, 1.0, 1.0])) != _describe(_TensorScale([10.0, 10, 10]))
    assert _describe(_TensorScale([2.0, 1.0])) == _describe(_TensorScale([2.0, 1.0]))
    used = _TensorScale(2.0)
    used._cache = torch.ones(4)
    assert _describe(used) == _describe(_TensorScale(2.0))
    module = sys.modules[__name__]
    for name, function, value in (('CONFIG', _scale_by_global_dict, {'scale': 10.0}),
                                  ('WEIGHTS', _scale_by_global_tensor, torch.full((3, ), 2.0))):
        before = _describe(function)
        monkeypatch.setattr(module, name, value)
        assert _describe(function) != before, name
    monkeypatch.setattr(module, 'CONFIG', {'scale': 1.0})
    monkeypatch.setattr(module, 'WEIGHTS', torch.ones(3))
    assert _describe(_scale_by_global_dict) == _describe(_scale_by_global_dict)


class _PathTransform:
    def __init__(self, path):
        self._path = pathlib.Path(path)

    def __call__(self, data):
        data.source = str(self._path)  # (fills the path's cached text)
        return data


def test_describe_reads_a_path_by_its_text_before_and_after_use():
    # a private parameter holding a pathlib.Path was described by the path's private caches,
    # which fill as it is used: described differently after the first call, so the cache it made
    # was rebuilt on every run
    from torch_geometric.data import Data
    from torch_mz.datasets.fingerprint import _describe
    fresh = _describe(_PathTransform('/data/a'))
    used = _PathTransform('/data/a')
    used(Data())
    hash(used._path)
    assert _describe(used) == fresh
    assert _describe(_PathTransform('/data/b')) != fresh


def test_a_changed_private_tensor_or_global_dict_rebuilds_the_cache(scanobjectnn_root,
                                                                   monkeypatch):
    import sys
    root = scanobjectnn_root['root']
    for factor in (1.0, 10.0):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # (the second rebuilds, with a warning)
            ds = ScanObjectNN(root, num_points=16, log=False, pre_transform=_TensorScale(factor))
        assert float(ds[0].pos.norm(dim=1).max()) == pytest.approx(factor, rel=1e-5)
    module = sys.modules[__name__]
    for scale in (1.0, 10.0):
        monkeypatch.setattr(module, 'CONFIG', {'scale': scale})
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ds = ScanObjectNN(root, num_points=16, log=False, pre_transform=_scale_by_global_dict)
        assert float(ds[0].pos.norm(dim=1).max()) == pytest.approx(scale, rel=1e-5)
    # unchanged: reused, without a warning
    monkeypatch.setattr(ScanObjectNN, 'process', lambda self: pytest.fail('must be reused'))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        ScanObjectNN(root, num_points=16, log=False, pre_transform=_scale_by_global_dict)
