r"""The former home of the measurement and report helpers, now in :mod:`torch_mz.study`
(:mod:`~torch_mz.study.measure`, :mod:`~torch_mz.study.report`); the names stay importable
from here for the scripts that use them."""
from torch_mz.study.measure import (count_flops, environment, matmul_peak_flops,
                                    peak_memory_bytes, skewed_sizes, time_call, uniform_sizes)
from torch_mz.study.report import markdown_table, write_json, write_report

__all__ = ['count_flops', 'environment', 'matmul_peak_flops', 'peak_memory_bytes',
           'skewed_sizes', 'time_call', 'uniform_sizes', 'markdown_table', 'write_json',
           'write_report']
