r"""Studies: what the scripts in ``benchmarks/`` and ``torch-mz compare`` share, in one place.

* :mod:`~torch_mz.study.measure`: timing (medians), peak memory, FLOP counts, set-size
  generators, measurements in a fresh process, the environment a measurement ran in;
* :mod:`~torch_mz.study.specs`: model specs (``'hypernet:rank=4'``);
* :mod:`~torch_mz.study.grid`: training models x seeds (x tasks) with identical budgets;
* :mod:`~torch_mz.study.partial`: the partial reports of the benchmarks that write theirs after
  every measurement (``--resume`` / ``--overwrite``, and the settings a resumed run must share);
* :mod:`~torch_mz.study.resume`: finished runs kept one file each, so a stopped study resumes,
  and Ctrl-C caught with the line that says how to go on;
* :mod:`~torch_mz.study.budget`: the quick / full budgets of the scripts and their overrides;
* :mod:`~torch_mz.study.arguments`: argument types of the scripts' options (checked lists, counts);
* :mod:`~torch_mz.study.report`: JSON and Markdown reports, summaries over seeds;
* :mod:`~torch_mz.study.plots`: the plots, with matplotlib optional;
* :mod:`~torch_mz.study.statistics`: gaps, standard errors and verdicts of the studies;
* :mod:`~torch_mz.study.workloads`: the graphs, aggregations, point-cloud batch and presets the
  speed benchmarks share.

Library code: nothing here prints or parses a command line.
"""
from torch_mz.study.arguments import (choice_list, float_list, int_list, nonnegative_float,
                                      nonnegative_int, positive_float, positive_int)
from torch_mz.study.budget import (Budget, add_budget_arguments, add_resume_argument, choose_budget,
                                  study_config)
from torch_mz.study.grid import (check_grid, check_models, run_grid, run_info_for, train_models,
                                 train_one)
from torch_mz.study.measure import (MeasurementFailed, allocator_peak_bytes, count_flops,
                                    environment,
                                    in_fresh_process, matmul_peak_flops, peak_memory_bytes,
                                    out_of_memory, process_peak_rss_bytes,
                                    skewed_sizes, time_call, time_interleaved,
                                    uniform_sizes)
from torch_mz.study.partial import (PartialUnit, StalePartial, Turn, add_partial_arguments,
                                    in_turn, overwriting, partial_problem, read_partial,
                                    remove_stale_partial, replace_problem, replaced_partial,
                                    resume_problem,
                                    same_settings_report, settings_differ, stale_partial_done,
                                    write_results_so_far)
from torch_mz.study.plots import (NO_MATPLOTLIB, plot_bars, plot_grid, plot_summary, pyplot,
                                  remove_earlier_plot, replace_plot, save_figure, try_plot)
from torch_mz.study.resume import (EXIT_INTERRUPTED, Interruption, RunStore, interruptible,
                                   interrupted_note)
from torch_mz.study.report import (METRICS, SPREAD_NOTE, check_out_folder, markdown_table,
                                   remove_results, summarize, summary_markdown, write_json,
                                   write_report, write_results)
from torch_mz.study.specs import parse_model_spec, split_model_specs
from torch_mz.study.statistics import (Lead, Ordering, lead_over_best, mean_std, paired_gap,
                                       resolved_ordering, winner)

__all__ = [
    'positive_int',
    'nonnegative_int',
    'positive_float',
    'nonnegative_float',
    'int_list',
    'float_list',
    'choice_list',
    'Budget',
    'add_budget_arguments',
    'add_resume_argument',
    'choose_budget',
    'study_config',
    'run_grid',
    'check_models',
    'check_grid',
    'RunStore',
    'EXIT_INTERRUPTED',
    'Interruption',
    'interruptible',
    'interrupted_note',
    'train_models',
    'train_one',
    'run_info_for',
    'MeasurementFailed',
    'out_of_memory',
    'process_peak_rss_bytes',
    'count_flops',
    'environment',
    'in_fresh_process',
    'matmul_peak_flops',
    'peak_memory_bytes',
    'allocator_peak_bytes',
    'skewed_sizes',
    'time_call',
    'time_interleaved',
    'uniform_sizes',
    'PartialUnit',
    'StalePartial',
    'Turn',
    'add_partial_arguments',
    'in_turn',
    'overwriting',
    'partial_problem',
    'read_partial',
    'remove_stale_partial',
    'replace_problem',
    'replaced_partial',
    'resume_problem',
    'same_settings_report',
    'settings_differ',
    'stale_partial_done',
    'write_results_so_far',
    'NO_MATPLOTLIB',
    'plot_bars',
    'plot_grid',
    'plot_summary',
    'pyplot',
    'try_plot',
    'replace_plot',
    'remove_earlier_plot',
    'save_figure',
    'METRICS',
    'SPREAD_NOTE',
    'markdown_table',
    'check_out_folder',
    'summarize',
    'summary_markdown',
    'write_json',
    'write_report',
    'write_results',
    'remove_results',
    'parse_model_spec',
    'split_model_specs',
    'Lead',
    'Ordering',
    'lead_over_best',
    'mean_std',
    'paired_gap',
    'resolved_ordering',
    'winner',
]
