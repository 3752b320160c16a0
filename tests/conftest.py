"""Suite-wide settings: one intra-op thread per test process (2 cores are shared with the
subprocess workers some tests start; oversubscribed thread pools make CPU tests many times slower)."""

import torch

torch.set_num_threads(1)
