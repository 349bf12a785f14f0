r"""The former home of the training grid, model specs, summaries and plots, now in
:mod:`torch_mz.study` (:mod:`~torch_mz.study.grid`, :mod:`~torch_mz.study.specs`,
:mod:`~torch_mz.study.report`, :mod:`~torch_mz.study.plots`); the names stay importable from
here for the code that uses them."""
from torch_mz.options import parse_key_values
from torch_mz.study.grid import run_grid, train_one
from torch_mz.study.plots import plot_bars, plot_grid, plot_summary
from torch_mz.study.report import METRICS, summarize, summary_markdown
from torch_mz.study.specs import parse_model_spec, split_model_specs

__all__ = ['METRICS', 'train_one', 'run_grid', 'parse_key_values', 'parse_model_spec',
           'split_model_specs', 'summarize', 'summary_markdown', 'plot_bars', 'plot_grid',
           'plot_summary']
