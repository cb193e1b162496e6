"""Test-session settings shared by every module.

The models in the suite are tiny: one intra-op thread is as fast as two for them, and it keeps OpenMP teams
from spinning against each other when the machine is busy (a 2-core CI box runs pytest alone, but a developer's
may not).
"""

import torch

torch.set_num_threads(1)
