"""The trainer's memory while it checkpoints in the background, in one process: `nice -n 19
.venv/bin/python benchmarks/checkpoint_memory.py [--config configs/smollm2.toml|tiny] [--updates N]`.

Builds the run's policy and Trainer as the trainer worker does (workers/builders.py), then:
`--updates` updates on synthetic samples of the recipe's shape (prompts_per_step x
group_size sequences of a chat prompt's length plus max_new_tokens completion tokens, every
other advantage +1 / -1, so every sample trains), a checkpoint written in the background by
the trainer worker's CheckpointWriter into a temporary lake (wired to the trainer as the
trainer worker wires it), then the same updates again while the write runs (the write meets
the next update's gradients, the trainer's peak in a run that checkpoints), then the wait for
the write, the same updates once more (no write beside them); then one more checkpoint
written alone. Each checkpoint's write time and the CPU seconds of its writing thread
(CHECKPOINT.json's write_s, write_cpu_s) are printed, and each update's wall seconds: the
updates beside the write against the median update without one (the first update, a
warm-up, left out when there are others) is what the write cost them (their slowdown from
sharing the CPU, and any wait for the write before an optimizer step). `--writer-idle` runs
the writing thread under SCHED_IDLE, to compare. A thread
polls the process's PSS (/proc/self/smaps_rollup) every 0.05 s and the script prints the
peak of each phase (and its seconds) against the state the trainer must hold (fp32 weights,
gradients, AdamW's two moments: 4 x 4 bytes per parameter). Run it on two checkouts to
compare designs (run OTHER_CHECKOUT/benchmarks/checkpoint_memory.py: the script puts its own
checkout first on sys.path).

What it does not: generate (no engine), read rows from a lake, or assert anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlpipe.core.config import load_config  # noqa: E402
from rlpipe.rl.batching import TrainSample  # noqa: E402
from rlpipe.rl.checkpoint import CheckpointMeta  # noqa: E402
from rlpipe.storage.checkpoint_retention import RetentionRule  # noqa: E402
from rlpipe.storage.lake import Lake  # noqa: E402
from rlpipe.workers.builders import build_policy, build_trainer  # noqa: E402
from rlpipe.workers.checkpoint_writer import CheckpointWriter  # noqa: E402

PROMPT_TOKENS = 60  # a SmolLM2 chat prompt of the recipe: system turn, the question, the assistant turn opened


def _pss_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


class PhasePeaks:
    """The process's peak PSS in each named phase, polled by a thread."""

    def __init__(self) -> None:
        self.phase = "build"
        self.peaks: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._entered = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            pss, phase = _pss_kib(), self.phase
            self.peaks[phase] = max(self.peaks.get(phase, 0), pss)
            time.sleep(0.05)

    def enter(self, phase: str) -> None:
        pss, now = _pss_kib(), time.perf_counter()
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), pss)
        self.seconds[self.phase] = now - self._entered
        self.phase, self._entered = phase, now

    def stop(self) -> None:
        self.enter("end")
        self._stop.set()
        self._thread.join()


def _samples(count: int, completion: int, vocab: int, seed: int) -> list[TrainSample]:
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for index in range(count):
        tokens = torch.randint(3, vocab, (PROMPT_TOKENS + completion,), generator=generator).tolist()
        samples.append(TrainSample(tuple(tokens[:PROMPT_TOKENS]), tuple(tokens[PROMPT_TOKENS:]), tuple([-2.0] * completion),
                                   1.0 if index % 2 == 0 else -1.0))
    return samples


def _timed_updates(trainer, samples: list[TrainSample], seeds: range) -> list[float]:
    """Wall seconds of each update."""
    seconds = []
    for seed in seeds:
        began = time.perf_counter()
        trainer.update(samples, shuffle_seed=seed)
        seconds.append(time.perf_counter() - began)
    return seconds


def _write_at_idle_priority() -> None:
    """Make CheckpointWriter's writing thread SCHED_IDLE (set from inside the thread)."""
    write = CheckpointWriter._write

    def idle_write(self, *args, **kwargs):
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        return write(self, *args, **kwargs)

    CheckpointWriter._write = idle_write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2.toml"), help="a run config, or 'tiny': the default small model")
    parser.add_argument("--updates", type=int, default=1, help="updates before the checkpoint, and again during its write")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--writer-idle", action="store_true", help="run the writing thread under SCHED_IDLE (Linux): "
                        "only on CPU that nothing else wants, to compare")
    args = parser.parse_args()
    if args.writer_idle:
        _write_at_idle_priority()
    peaks = PhasePeaks()
    started = time.perf_counter()
    config = load_config(None if args.config == "tiny" else args.config, args.overrides)
    torch.manual_seed(config.seed)
    policy, tokenizer = build_policy(config)
    trainer = build_trainer(config, policy)
    parameters = sum(parameter.numel() for parameter in policy.parameters())
    state_gb = 16 * parameters / 1e9
    samples = _samples(config.rollout.prompts_per_step * config.rollout.group_size, config.rollout.max_new_tokens,
                       policy.config.vocab_size, config.seed)
    with tempfile.TemporaryDirectory(prefix="rlpipe-ckpt-memory-") as folder:
        writer = CheckpointWriter(Lake.open(str(Path(folder) / "lake")), "memory", RetentionRule(2, 0, False))
        if hasattr(writer, "join"):  # as the trainer worker wires it (a checkout whose writer copies the state has none)
            trainer.before_state_change = writer.join
        peaks.enter("updates")
        alone = _timed_updates(trainer, samples, range(args.updates))
        peaks.enter("checkpoint + updates")
        began = time.perf_counter()
        writer.save(trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(args.updates, args.updates, "memory"))
        beside = _timed_updates(trainer, samples, range(args.updates, 2 * args.updates))
        waited = writer.take_waited_s() if hasattr(writer, "take_waited_s") else float("nan")
        writer.wait()
        beside_span = time.perf_counter() - began
        peaks.enter("updates after")
        after = _timed_updates(trainer, samples, range(2 * args.updates, 3 * args.updates))
        time.sleep(0.2)
        writer.save(trainer.model, tokenizer, trainer.state_dict(), CheckpointMeta(args.updates + 1, args.updates + 1, "memory"),
                    wait=True)  # alone: the writer's own work, nothing beside it
        writes = [writer.lake.checkpoints.info("memory", step) for step in (args.updates, args.updates + 1)]
    peaks.stop()
    print(f"{config.model.gguf or config.model.path or 'tiny model'}: {parameters:,} parameters; the trainer's state "
          f"(fp32 weights, gradients, 2 AdamW moments) {state_gb:.2f} GB; {len(samples)} samples of "
          f"{PROMPT_TOKENS}+{config.rollout.max_new_tokens} tokens; {time.perf_counter() - started:.0f} s")
    for phase, kib in peaks.peaks.items():
        if phase != "end":
            print(f"  peak PSS {phase:22s} {kib * 1024 / 1e9:5.2f} GB = {kib * 1024 / 1e9 / state_gb:.2f}x the state "
                  f"({peaks.seconds[phase]:.0f} s)")
    for info, when in zip(writes, ("beside the next updates", "alone")):
        if info is not None and info.write_cpu_s is not None:
            size = sum(file.size_bytes for file in info.files)
            print(f"  checkpoint {info.step} ({when}): {size / 1e9:.2f} GB written in {info.write_s:.1f} s, "
                  f"{info.write_cpu_s:.1f} CPU s of the writing thread (CHECKPOINT.json)")
    # the first update of the run warms up (allocations, kernels): the reference is the median
    # of the later ones without a write (before it, after it)
    reference = statistics.median(alone[1:] + after) if len(alone) > 1 else statistics.median(after)
    print(f"  updates: without a write {', '.join(f'{s:.2f}' for s in alone + after)} s; beside the write "
          f"{', '.join(f'{s:.2f}' for s in beside)} s (save to committed {beside_span:.2f} s, {waited:.2f} s of them waiting for the write); the updates beside it "
          f"{sum(beside) - reference * len(beside):+.2f} s against the median update without ({reference:.2f} s), "
          f"{100 * (sum(beside) / (reference * len(beside)) - 1):+.1f}%")


if __name__ == "__main__":
    main()
