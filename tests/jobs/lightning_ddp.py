"""A tiny Lightning job for rank discovery: Trainer.fit with DDP on CPU, `--devices` ranks, one persistent
DataLoader worker each, a few ms of work per batch.  Lightning's subprocess launcher makes this process
rank 0 and starts ranks 1.. as its children running this same command with LOCAL_RANK set.  Each rank
writes ``<ready dir>/<pid>`` (its global rank) once it has taken a training step, then trains on."""

import argparse
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep(0.005)
        return torch.full((8,), float(index % 7))


class Tiny(L.LightningModule):
    def __init__(self, ready_dir: str):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.ready_dir = ready_dir
        self.announced = False

    def training_step(self, batch, batch_idx):
        if not self.announced:
            path = os.path.join(self.ready_dir, str(os.getpid()))
            with open(path + ".tmp", "w") as f:
                f.write(str(self.global_rank))
            os.replace(path + ".tmp", path)
            self.announced = True
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Numbers(), batch_size=4, num_workers=1, persistent_workers=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto", max_epochs=1000,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(args.ready_dir), loader)


if __name__ == "__main__":
    main()
