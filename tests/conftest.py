import torch

# The tests use small tensors, for which extra intra-op threads cost more than they save
# (and CI machines are shared); one thread also keeps timings of the suite stable.
torch.set_num_threads(1)
