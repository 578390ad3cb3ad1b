"""GPU check for pin_memory and to_device: run it on a machine with CUDA.

    python benchmarks/gpu_check.py          # ~1 minute; exits 1 on a failed check

Checks: batches come out of ``pin_memory`` page-locked; ``to_device`` yields CUDA tensors
equal to the CPU batches; the copy of the next batch overlaps the trainer's compute (a
simulated step of matrix multiplies, timed with and without ``to_device``); a state taken
mid-epoch with ``to_device`` resumes to the same batches. On a machine without CUDA it says
so and exits 0 without checking anything.

Then the trainer-wait fraction: specs/imagenet.yaml (on the bundled sample, epoch after
epoch) feeds a step as costly as ResNet-50's forward and backward (~12.3 GFLOP per 224x224
image, done as bf16 matrix multiplies of the same FLOP count); it prints the share of the
wall time the trainer spent waiting for data (in ``next()`` and the host-to-device copy),
data time / (data time + step time).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from conveyor import load_graph

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
params: {root: "%s", batch_size: 64, workers: 4, to_gpu: true}
nodes:
  files:   {op: list_files, url: "${root}/*/*.JPEG", label: parent_dir, shuffle: true}
  shard:   {op: shard}
  shuffle: {op: shuffle_buffer, size: 1000}
  decode:  {op: map, fn: conveyor.image:train_transform, args: {size: 224}, workers: "${workers}"}
  batch:   {op: batch, size: "${batch_size}", drop_last: true}
  collate: {op: collate}
  pin:     {op: pin_memory}
  ahead:   {op: prefetch, depth: 4}
  gpu:     {op: to_device, device: cuda}
""" % (ROOT / "examples/data/imagenet-sample/train")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA here: nothing checked")
        return 0
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp, "gpu.yaml")
        spec.write_text(SPEC)
        cpu_spec = Path(tmp, "cpu.yaml")
        cpu_spec.write_text(SPEC.replace("device: cuda", "device: cpu"))
        with load_graph(spec) as gpu, load_graph(cpu_spec) as cpu:
            pinned = cpu.nodes["pin"].active
            got = [b["image"] for b in gpu]
            want = [b["image"] for b in cpu]
            if not pinned:
                failures.append("pin_memory is not active with CUDA present")
            if not all(g.is_cuda for g in got):
                failures.append("to_device yielded CPU tensors")
            if len(got) != len(want) or not all(torch.equal(g.cpu(), w) for g, w in zip(got, want)):
                failures.append("to_device batches differ from the CPU batches")
        # overlap: a step of compute per batch, with the copy done by the trainer vs by to_device
        weights = torch.randn(4096, 4096, device="cuda")

        def step(x: torch.Tensor) -> None:
            y = x.float().mean() * weights
            for _ in range(20):
                y = y @ weights
            torch.cuda.synchronize()

        timings = {}
        for name, path in (("copy in the trainer", cpu_spec), ("to_device (side stream)", spec)):
            with load_graph(path) as loader:
                for _ in loader:
                    pass
                t = time.perf_counter()
                for batch in loader:
                    x = batch["image"] if batch["image"].is_cuda else batch["image"].cuda()
                    step(x)
                timings[name] = time.perf_counter() - t
        # resume with to_device in the graph
        with load_graph(spec) as a:
            it = iter(a)
            next(it)
            state = a.state_dict()
            rest = [b["index"].tolist() for b in it]
        with load_graph(spec) as b:
            b.load_state_dict(state)
            again = [x["index"].tolist() for x in b]
        if rest != again:
            failures.append("resume with to_device differs")
        wait = trainer_wait()
    print("pin_memory active:", pinned)
    print(f"trainer-wait fraction, imagenet.yaml feeding a ResNet-50-sized step: {wait['fraction']:.3f} "
          f"(data {wait['data_s']:.2f} s, step {wait['step_s']:.2f} s over {wait['steps']} steps of "
          f"{wait['batch']} images)")
    for name, secs in timings.items():
        print(f"epoch with compute, {name}: {secs:.3f} s")
    print("FAILED: " + "; ".join(failures) if failures else "all GPU checks passed")
    return 1 if failures else 0


RESNET50_GFLOP = 3 * 4.1  # forward ~4.1 GFLOP per 224x224 image; backward ~2x forward


def trainer_wait(steps: int = 60, batch_size: int = 64) -> dict:
    """Share of the time a ResNet-50-sized trainer waits on specs/imagenet.yaml."""
    n = 8192
    flop_per_mm = 2 * n ** 3
    mms = max(1, round(RESNET50_GFLOP * 1e9 * batch_size / flop_per_mm))
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def step(x: torch.Tensor) -> None:
        y = w * x.float().mean().to(torch.bfloat16)
        for _ in range(mms):
            y = y @ w
        torch.cuda.synchronize()

    data_s = step_s = 0.0
    done = 0
    with load_graph(ROOT / "specs/imagenet.yaml", root=str(ROOT / "examples/data/imagenet-sample/train"),
                    batch_size=batch_size) as loader:
        while done < steps + 5:
            it = iter(loader)  # the next epoch
            while done < steps + 5:
                t0 = time.perf_counter()
                try:
                    batch = next(it)  # waiting for data...
                except StopIteration:
                    break
                x = batch["image"].cuda(non_blocking=True)
                torch.cuda.synchronize()  # ...and its copy to the GPU
                t1 = time.perf_counter()
                step(x)
                t2 = time.perf_counter()
                done += 1
                if done > 5:  # the first batches include start-up
                    data_s += t1 - t0
                    step_s += t2 - t1
    return {"fraction": data_s / (data_s + step_s) if data_s + step_s else 0.0, "data_s": data_s,
            "step_s": step_s, "steps": steps, "batch": batch_size}


if __name__ == "__main__":
    sys.exit(main())
