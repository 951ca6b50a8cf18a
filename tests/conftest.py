"""Test-wide settings: the tensors here are tiny, so one intra-op thread is fastest and leaves
the rest of a shared machine alone."""

import torch

torch.set_num_threads(1)
