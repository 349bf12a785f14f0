r"""Forward + backward of one dropout (p = 0.1) on a (32768, 128) float32 CPU tensor, one thread:
eager :func:`F.dropout`, the library's eager :func:`torch_mz.nn.functional.dropout`, and both
under :func:`torch.compile` (inductor), where the library's takes its mask from the operator
``torch_mz::dropout_keep_mask`` and :func:`F.dropout` draws inductor's own random numbers (also
with ``torch._inductor.config.fallback_random = True``). Medians of ``--repeats`` calls after
three untimed ones (which compile). Times nothing else; run it on a quiet machine.

    python benchmarks/compiled_dropout.py --out benchmarks/results/compiled_dropout
"""
import argparse
import shlex
import statistics
import time

import torch
import torch.nn.functional as F

from torch_mz.nn.functional import dropout
from torch_mz.study import check_out_folder, positive_int, write_results


def _median_ms(fn, x, repeats: int) -> float:
    for _ in range(3):
        fn(x).backward()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3  # (the mean of the middle two of an even number)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n\n')[0] or None)
    parser.add_argument('--repeats', type=positive_int, default=15)
    parser.add_argument('--out', default='benchmarks/results/compiled_dropout')
    args = parser.parse_args()
    problem = check_out_folder(args.out)  # (found only once every dropout was timed)
    if problem:
        parser.error(problem)
    torch.set_num_threads(1)
    x = torch.randn(32768, 128, requires_grad=True)

    def plain(t):
        return F.dropout(t, 0.1, training=True).sum()

    def library(t):
        return dropout(t, 0.1).sum()

    import torch._inductor.config as inductor_config
    rows = {'F.dropout, eager': _median_ms(plain, x, args.repeats),
            'torch_mz dropout, eager': _median_ms(library, x, args.repeats)}
    torch._dynamo.reset()
    rows['F.dropout, compiled'] = _median_ms(torch.compile(plain), x, args.repeats)
    torch._dynamo.reset()
    rows['torch_mz dropout, compiled'] = _median_ms(torch.compile(library), x, args.repeats)
    torch._dynamo.reset()
    with inductor_config.patch(fallback_random=True):
        rows['F.dropout, compiled, fallback_random'] = _median_ms(torch.compile(plain), x,
                                                                  args.repeats)
    # (quoted: an --out with a space reads back as one argument)
    command = shlex.join(['python', 'benchmarks/compiled_dropout.py', '--repeats',
                          str(args.repeats), '--out', args.out])
    lines = ['# One dropout, forward + backward, (32768, 128) float32, one thread', '',
             f'Command: `{command}` (torch {torch.__version__}; medians of {args.repeats})', '',
             '| dropout | ms |', '|---|---|'] + [f'| {k} | {v:.1f} |' for k, v in rows.items()]
    # atomically (a temporary file moved into place): an interrupted write leaves the earlier
    # results whole
    write_results(args.out, 'compiled_dropout',
                  dict(command=command, torch=torch.__version__, median_ms=rows),
                  '\n'.join(lines) + '\n')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
