"""Local training (node/training.py): its written-out SGD step is torch.optim.SGD's, bit for bit,
training does not import torch._dynamo (150 MiB of every host process's memory), and freed
model-sized blocks stay in the heap."""
import subprocess
import sys

import numpy as np
import torch
from torch import nn

from conftest import REPO
from node.data import synthetic
from node.models import build_model, load_numpy_state, state_to_numpy
from node.training import LocalTraining, batches, on_device, train_local

DATA = synthetic(96, 10, (1, 28, 28), 10, seed=0)[0]


def reference_sgd(model, indices, cfg, rng):
    """The loop train_local replaced: torch.optim.SGD, no clipping."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for _ in range(cfg.epochs):
        for idx in batches(indices, cfg, rng, None):
            x, y = on_device(DATA.batch(torch.from_numpy(idx)), "cpu")
            opt.zero_grad(set_to_none=True)
            nn.CrossEntropyLoss()(model(x), y).backward()
            opt.step()


def test_sgd_step_is_torch_optim_sgd_bit_for_bit():
    model = build_model("mnist_cnn", (1, 28, 28), 10, seed=3)
    start = state_to_numpy(model)
    cfg = LocalTraining(2, 16, 0.1)
    indices = np.arange(40)
    train_local(model, DATA, indices, cfg, np.random.default_rng(5))
    ours = state_to_numpy(model)
    load_numpy_state(model, start)
    reference_sgd(model, indices, cfg, np.random.default_rng(5))
    theirs = state_to_numpy(model)
    moved = False
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
        moved |= not np.array_equal(theirs[name], start[name])
    assert moved


def test_training_does_not_import_dynamo():
    code = ("import sys, numpy as np\n"
            "from node.data import synthetic\n"
            "from node.models import build_model\n"
            "from node.training import LocalTraining, train_local\n"
            "data = synthetic(32, 4, (1, 28, 28), 10, seed=0)[0]\n"
            "cfg = LocalTraining(1, 8, 0.1, clip=1.0, estimate_lipschitz=True)\n"
            "train_local(build_model('mnist_cnn', (1, 28, 28), 10), data, np.arange(32), cfg, np.random.default_rng(0))\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'triton'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_freed_model_sized_blocks_stay_in_the_heap():
    """node.lifecycle.keep_freed_memory, which every emulator process calls: tensors the size of the
    CNN's parameters, allocated and freed again and again (a training step's gradients and
    temporaries), no longer cost page faults each time (glibc's default returns them to the kernel)."""
    code = ("import resource, sys, torch\n"
            "from node.lifecycle import keep_freed_memory\n"
            "if sys.argv[1] == 'keep': assert keep_freed_memory()\n"
            "def steps():\n"
            "    for _ in range(40):\n"
            "        a = torch.ones(1_663_370); b = a * 2; c = b + a; del a, b, c\n"
            "steps()\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "steps()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    faults = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", code, mode], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        faults[mode] = int(out.stdout.strip())
    assert faults["keep"] < 1000, faults  # 40 steps x 3 blocks of 1,625 pages each, if they went back every time
