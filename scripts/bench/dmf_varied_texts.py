#!/usr/bin/env python3
"""A converted LoongForge dataset whose episodes' task texts have other lengths: DMF's text buckets and
package buckets need micro-batches whose longest texts differ (the bundled texts all have 14 tokens).

    python3 scripts/bench/dmf_varied_texts.py --src build/test-data/robot_sim.PickNPlace.lf \
        --out /tmp/varied.lf [--lengths 6,6,6,6,14]

--out gets a copy of the source's loongforge_dataset.json beside symbolic links to its shards and videos.
The k-th task used by the episodes (sorted by task index; the annotation task "valid" left as it is) is cut
to the k-th length of --lengths, in tokens including BOS and EOS: its first length - 1 ids, then its EOS.
A length at or above the task's own token count keeps the task whole. The texts stay as they were (the
trainer reads the token ids), so the copy is a fixture for text-slot widths, not a dataset to learn from.
"""
import argparse
import json
from pathlib import Path


def varied_texts_dataset(src, out, lengths=(6, 6, 6, 6, 14)):
    src, out = Path(src), Path(out)
    out.mkdir(parents=True)
    doc = json.loads((src / "loongforge_dataset.json").read_text())
    valid = {t["task_index"] for t in doc["tasks"] if t["text"] == "valid"}
    episode_tasks = sorted({t for e in doc["episodes"] for t in e["task_indices"]} - valid)
    if len(episode_tasks) != len(lengths):
        raise SystemExit(f"{src}: its episodes use {len(episode_tasks)} task texts, --lengths gives "
                         f"{len(lengths)}: give one length per task")
    length_of = dict(zip(episode_tasks, lengths))
    for t in doc["tasks"]:
        n = length_of.get(t["task_index"])
        if n is not None and n < t["token_count"]:
            if n < 2:
                raise SystemExit(f"--lengths: {n} tokens cannot hold BOS and EOS")
            t["token_ids"] = t["token_ids"][:n - 1] + [t["token_ids"][-1]]
            t["token_count"] = n
    (out / "loongforge_dataset.json").write_text(json.dumps(doc))
    for entry in src.iterdir():
        if entry.name != "loongforge_dataset.json":
            (out / entry.name).symlink_to(entry.resolve())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="6,6,6,6,14")
    a = ap.parse_args()
    varied_texts_dataset(a.src, a.out, tuple(int(x) for x in a.lengths.split(",")))
    print(a.out)


if __name__ == "__main__":
    main()
