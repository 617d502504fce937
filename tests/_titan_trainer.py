"""torchtitan 0.3.0's own trainer (``torchtitan.train``) on CPU gloo ranks, for the tests and benchmark.

Run under torchrun::

    torchrun --nproc-per-node 4 -m tests._titan_trainer --module tests._titan_trainer --config dsv3_cpu \\
        --parallelism.expert_parallel_degree 4 [--override.imports dtensor_rules.integrations.torchtitan.expert_parallel]

The CPU shims live here, never in the package: torchtitan picks "cuda" when no accelerator is found
(``device_type``), so the launcher makes it pick "cpu" with a CPU stand-in for ``torch.cuda``'s
device-module calls (peak memory = the process's peak RSS); ``torch.distributed.set_timeout``
(absent from torch 2.13) is the private ``_set_pg_timeout``; FlexAttention has no CPU backward, so
its forward is causal SDPA (the data carries no positions, so torchtitan's mask is the causal one);
gloo has no ``PREMUL_SUM``, so FSDP's collectives are forced to plain sums (torchtitan's gradient divide
factor is 1 already: it divides by the global token count itself).
``dsv3_cpu`` is torchtitan's
``deepseek_v3_debugmodel`` with SDPA instead of FlexAttention, random token data, a byte
tokenizer and short sequences (``dsv3_cpu_small``: three layers). Every rank records its (step, loss,
grad norm, peak RSS, step time) in ``RECORDED``, and writes them to ``$TITAN_RECORD.<rank>.json`` when
that variable is set; :func:`train` runs the trainer in-process, several times per launch.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch._utils
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` calls torchtitan makes on its device module."""

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    def current_device(self) -> int:
        return 0  # gloo's barrier takes device ids as ints

    def get_device_name(self, device=None) -> str:
        return "cpu"

    def get_device_properties(self, device=None):
        return types.SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def memory_stats(self, device=None) -> dict[str, int]:
        peak = _peak_rss_bytes()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak}

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def device_count(self) -> int:
        return 1


_CPU = _CpuDeviceModule("cpu_device_module")
_device_module = torch._utils._get_device_module
torch._utils._get_available_device_type = lambda: "cpu"
torch._utils._get_device_module = lambda t: _CPU if t == "cpu" else _device_module(t)
if not hasattr(dist, "set_timeout"):
    dist.set_timeout = c10d._set_pg_timeout

from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.utils.data import IterableDataset  # noqa: E402

import torchtitan.distributed.fsdp as titan_fsdp  # noqa: E402

from torchtitan.components.dataloader import ParallelAwareDataloader  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402
from torchtitan.models.deepseek_v3 import config_registry as dsv3  # noqa: E402
from torchtitan.models.deepseek_v3 import model_registry  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

VOCAB = 2048  # the debug model's vocabulary


def _causal_sdpa(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, score_mod=None, scale=None,
                 enable_gqa=False, out_transform=None, **_):
    if score_mod is not None or out_transform is not None:
        raise NotImplementedError("the CPU shim computes plain causal attention only")
    q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


FlexAttention.forward = _causal_sdpa


def _sum_reductions(model: torch.nn.Module) -> None:
    """torchtitan's own (gradient divide factor 1), with plain SUM collectives: gloo has no PREMUL_SUM."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


titan_fsdp.disable_fsdp_gradient_division = _sum_reductions


class ByteTokenizer(BaseTokenizer):
    """A tokenizer that needs no files (the data below is token ids already)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        pass

    def __init__(self, config: Config, tokenizer_path: str | None = None):
        super().__init__()
        self.eos_id = 0

    def encode(self, text: str, **_: object) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], **_: object) -> str:
        return bytes(i % 256 for i in ids).decode(errors="replace")

    def get_vocab_size(self) -> int:
        return VOCAB


class _RandomTokens(IterableDataset):
    """Sample i of data-parallel rank r: ``seq_len + 1`` ids from a generator seeded (r, i)."""

    def __init__(self, dp_rank: int, seq_len: int) -> None:
        self.dp_rank, self.seq_len, self.index = dp_rank, seq_len, 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            g = torch.Generator().manual_seed(1000 * self.dp_rank + self.index)
            self.index += 1
            ids = torch.randint(0, VOCAB, (self.seq_len + 1,), generator=g)
            yield {"input": ids[:-1]}, ids[1:]

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.index = state["index"]


class RandomTokenDataLoader(ParallelAwareDataloader):
    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        pass

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer,
                 seq_len: int, local_batch_size: int, snapshot_every_n_steps: int | None = None, **_: object):
        super().__init__(_RandomTokens(dp_rank, seq_len), dp_rank=dp_rank, dp_world_size=dp_world_size,
                         batch_size=local_batch_size)


def dsv3_cpu() -> Trainer.Config:
    """``deepseek_v3_debugmodel`` for CPU gloo ranks: SDPA, random tokens, 4 short steps."""
    config = dsv3.deepseek_v3_debugmodel()
    config.tokenizer = ByteTokenizer.Config()
    config.dataloader = RandomTokenDataLoader.Config()
    config.hf_assets_path = ""
    config.training.seq_len = 64
    config.training.local_batch_size = 2
    config.training.steps = 4
    config.checkpoint.enable = False
    config.training.disable_cuda_graphs = True
    config.parallelism.spmd_backend = "full_dtensor"
    config.debug.seed = 0
    return config


RECORDED: list[dict[str, float]] = []  # this process's (step, loss, grad norm, peak RSS, step time), in order


def _record(log):
    last = [time.perf_counter()]

    def record(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        now = time.perf_counter()
        RECORDED.append({"step": step, "loss": global_avg_loss, "grad_norm": grad_norm,
                         "peak_rss": _peak_rss_bytes(), "step_s": now - last[0]})
        last[0] = now
        path = os.environ.get("TITAN_RECORD")
        if path:
            with open(f"{path}.{dist.get_rank()}.json", "w") as f:
                json.dump(RECORDED, f)
        return log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)

    return record


MetricsProcessor.log = _record(MetricsProcessor.log)


def _count_bytes_on(step: int):
    """Wrap ``Trainer.train_step``: training step ``step`` runs under ``CommBytesMode`` and its row gets
    ``bytes`` (forward + backward bytes per collective on this rank, from dtensor_rules.testing.comm)."""
    train_step = Trainer.train_step

    def counted(self, *args, **kwargs):
        if self.step != step:
            return train_step(self, *args, **kwargs)
        from dtensor_rules.testing.comm import CommBytesMode

        with CommBytesMode() as comm:
            # no module tracking: torchtitan's chunked loss calls lm_head after the model's forward,
            # which CommDebugMode's module tracker cannot place (IndexError); totals need no phases
            comm.advanced_module_tracker.__exit__()
            out = train_step(self, *args, **kwargs)
        RECORDED[-1]["bytes"] = {k: comm.total_bytes(k) for k in sorted({n for ph in comm.bytes.values() for n in ph})}
        return out

    return counted


if os.environ.get("TITAN_COUNT_BYTES_STEP"):
    Trainer.train_step = _count_bytes_on(int(os.environ["TITAN_COUNT_BYTES_STEP"]))


def dsv3_cpu_small() -> Trainer.Config:
    """:func:`dsv3_cpu` with its first three layers (one dense, two MoE) and 32-token sequences."""
    config = dsv3_cpu()
    config.model_spec.model.layers = config.model_spec.model.layers[:3]
    config.training.seq_len = 32
    return config


# trainers already run, kept alive: a later trainer's meshes must not reuse a freed mesh's id
# (torchtitan's FSDP setup then finds a stale mesh and refuses the parameters' own)
_FINISHED: list[Trainer] = []


def train(args: list[str], config: str = "dsv3_cpu_small") -> list[dict[str, float]]:
    """Build torchtitan's trainer from command-line ``args`` (as ``torchtitan.train`` parses them), train,
    close; the rows it logged. The process group stays up, so one launch trains several times."""
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(["--module", "tests._titan_trainer", "--config", config, *args])
    start = len(RECORDED)
    trainer = cfg.build()
    _FINISHED.append(trainer)
    try:
        trainer.train()
    finally:
        trainer.close()
    return RECORDED[start:]


if __name__ == "__main__":
    import torchtitan.train

    torchtitan.train.main()
