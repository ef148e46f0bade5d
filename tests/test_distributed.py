"""Converted models train under DistributedDataParallel and FSDP2 (``fully_shard``): two processes on CPU (gloo), each
given half of every batch, end with the losses and parameters of one process trained on the whole batches.

One spawn (the two processes import torch once) runs every case under both wrappers and writes what it saw; the
tests compare that with single-process training here."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing
from torch.distributed.tensor import Shard

import onnx2torch_rnn
from onnx2torch_rnn.recurrent.module import Recurrent
from tests.recurrent_models import convert

ROOT = Path(__file__).resolve().parent.parent
WORLD, STEPS, BATCH = 2, 3, 4
WRAPPERS = ("ddp", "fsdp")
# model -> (x's batch axis, x's shape at batch 4); the loss reads each model's first two outputs. A 2-layer
# bidirectional LSTM from torch.onnx (one StackedRecurrent of fast-path layers); Keras's GRU(reset_after=False) as a
# Loop (an exact-path GRU, linear_before_reset=0, whose W the loop reads transposed); an exact-path bidirectional GRU
# node with sequence_lens (its second input, a row of each kind in each half of the batch).
CASES = {"tests/models/torch/ts_lstm_l2_bi_bf_op17.onnx": (0, (BATCH, 5, 6)),
         "tests/models/keras/keras3_gru_reset_before.onnx": (0, (BATCH, 7, 5)),
         "GRU linear_before_reset=0 with sequence_lens": (1, (6, BATCH, 3))}
LENGTHS = torch.tensor([6, 2, 0, 5], dtype=torch.int32)


def _model(case: str) -> torch.nn.Module:
    if case.endswith(".onnx"):
        return onnx2torch_rnn.convert(ROOT / case)
    return convert("GRU", "bidirectional", "exact", lens=True)


def _batches(case: str) -> list[tuple[torch.Tensor, ...]]:
    """STEPS whole batches."""
    generator = torch.Generator().manual_seed(0)
    lengths = () if case.endswith(".onnx") else (LENGTHS,)
    return [(torch.randn(CASES[case][1], generator=generator), *lengths) for _ in range(STEPS)]


def _shard(case: str, batch: tuple[torch.Tensor, ...], rank: int) -> tuple[torch.Tensor, ...]:
    """This process's half of every tensor of a batch."""
    return tuple(t.chunk(WORLD, CASES[case][0] if k == 0 else 0)[rank] for k, t in enumerate(batch))


def _train(model: torch.nn.Module, batches) -> list[float]:
    """Adam on a mean loss (so that averaging the processes' gradients gives the whole batch's); the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        outputs = model(*batch)
        outputs = outputs[:2] if isinstance(outputs, tuple) else (outputs,)
        loss = sum((o - 0.5 * k).square().mean() for k, o in enumerate(outputs))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _wrapped(model: torch.nn.Module, wrapper: str) -> torch.nn.Module:
    """The README's recipe: DDP around the model, or FSDP2 on each recurrent layer, then on the whole model."""
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for module in list(model.modules()):
        if isinstance(module, Recurrent):
            fully_shard(module)
    return fully_shard(model)


def _worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)  # two processes on the test's cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {}
    for case in CASES:
        batches = [_shard(case, batch, rank) for batch in _batches(case)]
        for wrapper in WRAPPERS:
            model = _wrapped(_model(case).train(), wrapper)
            losses = torch.stack(_train(model, batches))
            dist.all_reduce(losses)  # the mean of the two halves' mean losses: the whole batch's
            params, sharded = {}, []
            for name, p in model.named_parameters():
                if hasattr(p, "full_tensor"):  # FSDP2: a DTensor of which this process holds a shard
                    sharded.append(p.placements == (Shard(0),))
                    p = p.full_tensor()
                params[name.removeprefix("module.")] = p.detach().clone()
            results[case, wrapper] = {"losses": losses / WORLD, "params": params, "sharded": sharded}
    if rank == 0:
        torch.save(results, out)
    # both processes done with the group before either tears it down: a process destroying its gloo pairs while the
    # other still has them open aborted the latter now and then ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_and_fsdp2_match_one_process(tmp_path):
    """One test, one spawn (a module fixture would spawn once per xdist worker)."""
    torch.multiprocessing.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path / "results.pt")), nprocs=WORLD)
    distributed = torch.load(tmp_path / "results.pt")
    for case in CASES:
        torch.manual_seed(0)
        model = _model(case).train()
        initial = {name: p.detach().clone() for name, p in model.named_parameters()}
        expected_losses = torch.stack(_train(model, _batches(case)))
        for wrapper in WRAPPERS:
            got, where = distributed[case, wrapper], f"{case} under {wrapper}"
            torch.testing.assert_close(got["losses"], expected_losses, rtol=1e-5, atol=1e-7,
                                       msg=lambda m, where=where: f"{where}: {m}")
            assert got["params"].keys() == dict(model.named_parameters()).keys(), where
            for name, p in model.named_parameters():
                torch.testing.assert_close(got["params"][name], p.detach(), rtol=1e-5, atol=1e-6,
                                           msg=lambda m, where=where, name=name: f"{where}: {name}: {m}")
                assert not torch.equal(p, initial[name]), f"{name} did not train"
            if wrapper == "fsdp":  # FSDP2 holds every parameter sharded over dim 0
                assert got["sharded"] and all(got["sharded"]), where
