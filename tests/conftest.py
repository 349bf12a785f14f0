import os

import torch

# The tests use small tensors, for which extra intra-op threads cost more than they save
# (and CI machines are shared); one thread also keeps timings of the suite stable.
torch.set_num_threads(1)

# No test compiles kernels unless it asks to (compiling takes tens of seconds here): the auto
# mode of torch_mz.nn.fused is off for the suite and the processes it starts; the tests of that
# mode turn it on themselves.
os.environ['TORCH_MZ_FUSED_KERNELS'] = '0'
from torch_mz.nn import set_fused_kernels  # noqa: E402

set_fused_kernels(False)
