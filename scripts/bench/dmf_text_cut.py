#!/usr/bin/env python3
"""DMF's text buckets at the model: forward + backward of an exported model with its
text slot whole against cut to the batch's longest text, interleaved in one process.

    python3 scripts/bench/dmf_text_cut.py --model build/test-models/n16-tiny.pt --config n16-tiny \
        [--batch 8] [--text 14] [--rounds 15] [--threads 2] [--device cpu]

The batch is model/batch.py's example batch with every sample's text `--text` tokens long
(the bundled dataset's task texts have 14). Prints the median and the fastest time of each
form (ms per forward + backward, `--rounds` rounds of 5 after 5 warm-up calls each) and the
ratio of the medians. Needs a model whose export says text_slot_cut (the n16 family).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model  # noqa: E402
from model.batch import example_batch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", required=True, help="the named config the model was exported from")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--text", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    m = torch.jit.load(a.model, map_location=dev)
    m.train()
    cfg = model.get_config(a.config)
    if not 1 <= a.text <= cfg.max_text_len:
        sys.exit(f"--text must be in [1, {cfg.max_text_len}]")
    whole = {k: v.to(dev) for k, v in example_batch(cfg, a.batch, seed=0).items()}
    whole["text_mask"][:] = False
    whole["text_mask"][:, :a.text] = True
    cut = dict(whole)
    cut["text_tokens"] = whole["text_tokens"][:, :a.text].contiguous()
    cut["text_mask"] = whole["text_mask"][:, :a.text].contiguous()

    def step(batch):
        m(batch)["loss"].backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    forms = {f"whole slot ({cfg.max_text_len})": whole, f"cut ({a.text})": cut}
    for batch in forms.values():
        for _ in range(5):
            step(batch)
    ms = {name: [] for name in forms}
    for _ in range(a.rounds):
        for name, batch in forms.items():
            t0 = time.perf_counter()
            for _ in range(5):
                step(batch)
            ms[name].append((time.perf_counter() - t0) / 5 * 1000)
    for name, xs in ms.items():
        print(f"{name:18s} median {statistics.median(xs):8.2f} ms   fastest {min(xs):8.2f} ms")
    a_, b_ = (statistics.median(xs) for xs in ms.values())
    print(f"ratio of the medians (whole / cut): {a_ / b_:.3f}")


if __name__ == "__main__":
    main()
