import builtins

import pytest

from torch_mz.study.plots import NO_MATPLOTLIB, plot_grid, plot_summary, pyplot, try_plot


def test_plots_are_written(tmp_path):
    pytest.importorskip('matplotlib')
    rows = [{'cell': 'a', 'm r2': 0.5, 'm r2 std': 0.1}, {'cell': 'b', 'm r2': 0.2, 'm r2 std': 0}]
    assert try_plot(plot_grid, rows, ['m'], str(tmp_path / 'grid.png'),
                    paper={('a', 'm'): 0.4}) is None
    assert (tmp_path / 'grid.png').stat().st_size > 0
    summary = [dict(model='m', accuracy=0.8, accuracy_std=0.05)]
    plot_summary(summary, 'classification', str(tmp_path / 'summary.png'), title='t')
    assert (tmp_path / 'summary.png').stat().st_size > 0
    assert pyplot().get_backend().lower() == 'agg'


def test_without_matplotlib_there_is_a_note_and_no_file(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split('.')[0] == 'matplotlib':
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, '__import__', no_matplotlib)
    monkeypatch.setattr('importlib.import_module', lambda name: no_matplotlib(name))
    with pytest.raises(ImportError, match=r"torch_mz\[plot\]"):
        pyplot()
    rows = [{'cell': 'a', 'm r2': 0.5, 'm r2 std': 0.1}]
    assert try_plot(plot_grid, rows, ['m'], str(tmp_path / 'grid.png')) == NO_MATPLOTLIB
    assert not (tmp_path / 'grid.png').exists()


def test_a_figure_is_saved_atomically(tmp_path):
    # an interrupted save leaves the earlier image (a report links to it), and no temporary file
    pytest.importorskip('matplotlib')
    from torch_mz.study.plots import save_figure
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = str(tmp_path / 'plot.png')
    save_figure(fig, path, dpi=50)
    before = open(path, 'rb').read()
    assert before.startswith(b'\x89PNG')

    class Interrupted(Exception):
        pass

    def stop(*args, **kwargs):
        args[0].write(b'\x89PNG half an image')
        raise Interrupted

    fig.savefig = stop
    with pytest.raises(Interrupted):
        save_figure(fig, path, dpi=50)
    assert open(path, 'rb').read() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['plot.png']
    del fig.savefig
    # a path without an extension gets matplotlib's format and its extension, as savefig does
    save_figure(fig, str(tmp_path / 'bare'), dpi=50)
    assert (tmp_path / 'bare.png').read_bytes().startswith(b'\x89PNG')
    plt.close(fig)


def test_plot_grid_refuses_two_cells_that_read_alike(tmp_path):
    # it keyed the rows by str(label): of the cells 1 and '1' one was silently not plotted
    rows = [{'cell': 1, 'm r2': 0.5, 'm r2 std': 0.1}, {'cell': '1', 'm r2': 0.9, 'm r2 std': 0.1}]
    with pytest.raises(ValueError, match="two rows' cells read '1'"):
        plot_grid(rows, ['m'], str(tmp_path / 'grid.png'))
    assert not (tmp_path / 'grid.png').exists()


def test_plot_summary_refuses_the_summary_of_a_grid(tmp_path):
    # a grid's summary (entries with a cell) drew its cells' bars over each other
    from torch_mz.study.plots import plot_summary
    summary = [dict(cell='a', model='mz', r2=0.5, r2_std=0.1),
               dict(cell='b', model='mz', r2=0.9, r2_std=0.1)]
    with pytest.raises(ValueError, match='plot it with plot_grid'):
        plot_summary(summary, 'regression', str(tmp_path / 's.png'))
    assert not (tmp_path / 's.png').exists()


def test_replace_plot_removes_an_earlier_figure_where_none_is_drawn(tmp_path, monkeypatch):
    # a report linked <name>.png where this run drew none (matplotlib missing): an earlier run's
    # figure, of other results, left beside them; and a plot that raised ended the script
    from torch_mz.study.plots import replace_plot
    path = tmp_path / 'p.png'

    def draws(where):
        with open(where, 'wb') as f:
            f.write(b'this run')

    def fails(where):
        raise ValueError('no figure')

    path.write_bytes(b'an earlier run')
    assert replace_plot(str(path), draws, str(path)) is None
    assert path.read_bytes() == b'this run'
    assert try_plot(fails, str(path)) == 'the plot failed (ValueError: no figure): no plot'
    assert path.exists()  # (try_plot alone removes nothing)
    assert replace_plot(str(path), fails, str(path)) == (
        f"the plot failed (ValueError: no figure): no plot; removed the figure an earlier run "
        f"drew, '{path}', which would not show these results: run this again once the plot "
        f"draws to redraw it")
    assert not path.exists()
    path.write_bytes(b'an earlier run')
    monkeypatch.setattr('torch_mz.study.plots.pyplot', lambda: (_ for _ in ()).throw(
        ImportError('no matplotlib')))
    rows = [{'cell': 'a', 'm r2': 0.5, 'm r2 std': 0.1}]
    # the note says which figure went, why and how to draw it again (it went without a word)
    assert replace_plot(str(path), plot_grid, rows, ['m'], str(path)) == (
        f"{NO_MATPLOTLIB}; removed the figure an earlier run drew, '{path}', which would not "
        f"show these results: install matplotlib and run this again to redraw it")
    assert not path.exists()
    assert replace_plot(str(path), plot_grid, rows, ['m'], str(path)) == NO_MATPLOTLIB  # (none)
