"""Time to first token after a server restart: recompute vs SGLang's `file` backend vs
GalahadStorage, at several prompt lengths, alternating modes within each round.

For each storage mode: start a server on a fresh store, send one prompt per length (distinct
documents, so no prompt shares a prefix with another), wait for the write-through, stop it;
start a new server on the same store and send the same prompts again, timing the first streamed
token. Without storage the restarted server simply recomputes. Prints a table of TTFT and the
ratios to recompute, and saves a PNG plot.

Runs stock SGLang on a GPU when one is present, else the CPU test harness.
Usage: .venv/bin/python bench/bench_ttft.py [--lengths 1024 2048 4096 8192] [--rounds 1]
       [--plot docs/ttft.png]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import serving  # noqa: E402
from bench.bench_store import machine  # noqa: E402

PAGE_SIZE = 16
MODES = ("none", "file", "galahad")


def prompt_ids(length: int, seed: int, vocab: int) -> list[int]:
    import random

    rng = random.Random(seed * 1_000_003 + length)
    return [rng.randrange(10, vocab) for _ in range(length)]


def run_mode(mode, model, lengths, work: Path, vocab: int, round_index: int) -> dict:
    store = work / f"{mode}-store-{round_index}"
    args = serving.server_args(
        mode, store if mode != "none" else None, page_size=PAGE_SIZE, max_tokens=max(lengths) + 512
    )
    prompts = {length: prompt_ids(length, round_index, vocab) for length in lengths}
    if mode != "none":
        server = serving.start(model, args, work / f"{mode}-{round_index}-warm.log")
        try:
            for prompt in prompts.values():
                serving.stream_generate(server, prompt, 1)
            expected = sum((length - 1) // PAGE_SIZE for length in lengths) - 8
            pattern = "ns/*/*.rec" if mode == "galahad" else "*.bin"
            serving.wait_for_records(store, expected, pattern, timeout_s=600)
        finally:
            server.stop()
    server = serving.start(model, args, work / f"{mode}-{round_index}-timed.log")
    try:
        return {
            length: serving.stream_generate(server, prompt, 1) for length, prompt in prompts.items()
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--size", default="demo")
    parser.add_argument("--plot", default=None, help="PNG path for the plot")
    args = parser.parse_args()
    model = serving.e2e.ensure_model("llama", args.size)
    import json

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = Path(tempfile.mkdtemp(prefix="galahad-ttft-"))
    best: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    storage_tokens: dict[str, dict[int, int]] = {mode: {} for mode in MODES}
    device = "GPU (stock SGLang)" if serving.has_gpu() else "CPU (test harness)"
    print(f"# bench_ttft on {machine()}; {device}; model {Path(model).name}; page {PAGE_SIZE}")
    try:
        for round_index in range(args.rounds):
            for mode in MODES:
                results = run_mode(mode, model, args.lengths, work, vocab, round_index)
                for length, timed in results.items():
                    previous = best[mode].get(length, float("inf"))
                    best[mode][length] = min(previous, timed.ttft_s)
                    storage_tokens[mode][length] = timed.storage_tokens
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{'tokens':>7s} {'recompute':>10s} {'file':>10s} {'galahad':>10s} "
        f"{'file/rec':>9s} {'galahad/rec':>12s} {'galahad/file':>13s}  from storage (file, galahad)"
    )
    for length in args.lengths:
        none_s, file_s, galahad_s = (best[mode][length] for mode in MODES)
        print(
            f"{length:7d} {none_s:9.2f}s {file_s:9.2f}s {galahad_s:9.2f}s {file_s / none_s:9.0%} "
            f"{galahad_s / none_s:12.0%} {galahad_s / file_s:13.2f}  "
            f"({storage_tokens['file'][length]}, {storage_tokens['galahad'][length]})"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(7, 4))
        labels = {
            "none": "recompute (no storage)",
            "file": "SGLang file backend",
            "galahad": "GalahadStorage",
        }
        for mode in MODES:
            axes.plot(
                args.lengths, [best[mode][n] for n in args.lengths], marker="o", label=labels[mode]
            )
        axes.set_xlabel("prompt tokens")
        axes.set_ylabel("time to first token after restart (s)")
        axes.set_xscale("log", base=2)
        axes.set_title(f"TTFT after a server restart ({device})")
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=120)
        print(f"plot saved to {args.plot}")


if __name__ == "__main__":
    main()
