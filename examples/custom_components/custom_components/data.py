"""A data loader: called as loader(data_root, **task.dataset_options), it returns (train, test),
each a torch Dataset of (input tensor, int label). This one reads MNIST through torchvision from
the data root (torchvision's raw layout, nothing downloaded) and keeps the first samples."""
import torch
from torch.utils.data import Dataset
from torchvision.datasets import MNIST


class FirstSamples(Dataset):
    """The first `limit` images of an MNIST split as float tensors in [0, 1], with `.targets`."""

    def __init__(self, mnist: MNIST, limit: int):
        self.images = mnist.data[:limit].unsqueeze(1).float() / 255.0
        self.targets = mnist.targets[:limit].clone()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.targets[i])


def mnist_subset(root: str, train_samples: int = 3000, test_samples: int = 500) -> tuple[Dataset, Dataset]:
    return (FirstSamples(MNIST(root, train=True, download=False), train_samples),
            FirstSamples(MNIST(root, train=False, download=False), test_samples))
