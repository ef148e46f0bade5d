import torch

# pytest-xdist runs one worker per core: one torch thread each avoids oversubscribing the machine.
torch.set_num_threads(1)
