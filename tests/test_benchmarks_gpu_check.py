r"""``benchmarks/gpu_check.sh``, the one command of a GPU check: the test files it runs on CUDA
exist (a moved test file would leave the check running nothing), and they hold the tests its
comment names."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cuda_tests_it_runs_exist():
    script = (ROOT / 'benchmarks' / 'gpu_check.sh').read_text()
    paths = re.findall(r'(tests/[\w/]*(?:\.py|/))', script)
    assert len(paths) >= 5, paths
    for path in paths:
        assert (ROOT / path).exists(), path
    selected = "-k 'cuda or resolve_device'"
    assert selected in script
    text = ''.join((ROOT / p).read_text() if p.endswith('.py')
                   else ''.join(f.read_text() for f in sorted((ROOT / p).glob('test_*.py')))
                   for p in paths)
    # a training run resumed on CUDA, and the device resolution
    assert 'def test_resume_matches_uninterrupted_run' in text and "'cuda'" in text
    assert 'def test_resolve_device' in text


def test_its_default_folder_is_new_for_every_run():
    # the committed results of an earlier check (benchmarks/results/gpu, gpu_h100) must not be
    # written over, nor the check's benchmarks refused as writing over another command's report
    script = (ROOT / 'benchmarks' / 'gpu_check.sh').read_text()
    default = re.search(r'^OUT=\$\{OUT:-(.*)\}$', script, re.M)
    assert default, 'no default OUT'
    assert '$(date -u +%Y%m%d_%H%M%S)' in default.group(1)
    assert default.group(1).startswith('benchmarks/results/gpu_')
