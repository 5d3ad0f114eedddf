"""Not a test: the mixture of the mixture tests (the ctest fixture mixture_dataset).

A second embodiment made from the bundled PickNPlace dataset, and a mixture file pairing it with the
suite's 64 x 64 copy of that dataset (make_small_dataset.py):
- one_arm.lf: episodes 1 and 3 (882 rows) as a one-armed robot: state and action cut to the right
  arm and hand (13 of the 44 values; modality.json, stats.json and info.json cut to match), its camera
  re-encoded by ffmpeg at 80 x 60 (4:3; libx264, no B-frames, every frame's timestamp kept), and
  longer task texts ("with the right arm only, ..."), converted by scripts/convert_lerobot.py;
- mixture.json: {"datasets": [{"path": SMALL, "embodiment_id": 0}, {"path": "one_arm.lf",
  "embodiment_id": 3}]}, the second path relative to the file.

    python test/data/make_mixture_dataset.py SOURCE SMALL WORK DST    # DST is replaced
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
CAMERA = "observation.images.ego_view"
EPISODES = (1, 3)
KEEP = ("right_arm", "right_hand")  # modality.json groups kept, in this order


def cut_groups(groups: dict) -> tuple:
    """The kept groups renumbered from 0, and the source indices they read."""
    out, index = {}, []
    for name in KEEP:
        g = groups[name]
        out[name] = {**g, "start": len(index), "end": len(index) + g["end"] - g["start"]}
        index += list(range(g["start"], g["end"]))
    return out, index


def main(source: Path, small: Path, work: Path, dst: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(source / "meta", work / "meta")
    modality = json.loads((work / "meta/modality.json").read_text())
    modality["state"], state_index = cut_groups(modality["state"])
    modality["action"], action_index = cut_groups(modality["action"])
    (work / "meta/modality.json").write_text(json.dumps(modality, indent=2))
    stats = json.loads((work / "meta/stats.json").read_text())
    for key, index in (("observation.state", state_index), ("action", action_index)):
        stats[key] = {k: [v[i] for i in index] for k, v in stats[key].items()}
    (work / "meta/stats.json").write_text(json.dumps(stats, indent=2))
    info = json.loads((work / "meta/info.json").read_text())
    for key, index in (("observation.state", state_index), ("action", action_index)):
        info["features"][key]["shape"] = [len(index)]
        info["features"][key]["names"] = [info["features"][key]["names"][i] for i in index]
    info["features"][CAMERA]["shape"] = [60, 80, 3]
    (work / "meta/info.json").write_text(json.dumps(info, indent=2))

    tasks = [json.loads(line) for line in (work / "meta/tasks.jsonl").read_text().splitlines() if line.strip()]
    longer = {t["task"]: f"with the right arm only, {t['task']}, then move the arm back to where it started"
              for t in tasks if t["task"] != "valid"}
    (work / "meta/tasks.jsonl").write_text(
        "".join(json.dumps({**t, "task": longer.get(t["task"], t["task"])}) + "\n" for t in tasks))
    episodes = [json.loads(line) for line in (work / "meta/episodes.jsonl").read_text().splitlines() if line.strip()]
    (work / "meta/episodes.jsonl").write_text(
        "".join(json.dumps({**e, "tasks": [longer.get(t, t) for t in e["tasks"]]}) + "\n" for e in episodes))

    for e in EPISODES:
        name = f"chunk-000/episode_{e:06d}.parquet"
        table = pq.read_table(source / "data" / name)
        for key, index in (("observation.state", state_index), ("action", action_index)):
            rows = [[r[i] for i in index] for r in table.column(key).to_pylist()]
            table = table.set_column(table.schema.get_field_index(key), key, pa.array(rows, pa.list_(pa.float64())))
        (work / "data/chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, work / "data" / name)
        video = f"videos/chunk-000/{CAMERA}/episode_{e:06d}.mp4"
        (work / video).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(source / video), "-vf", "scale=80:60",
                        "-fps_mode", "passthrough", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0",
                        "-pix_fmt", "yuv420p", str(work / video)], check=True)
    dst.mkdir(parents=True)
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(work), str(dst / "one_arm.lf"),
                    "--episodes", ",".join(str(e) for e in EPISODES), "--quiet"], check=True)
    (dst / "mixture.json").write_text(json.dumps({"datasets": [
        {"path": str(small.resolve()), "embodiment_id": 0},
        {"path": "one_arm.lf", "embodiment_id": 3}]}, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: make_mixture_dataset.py SOURCE SMALL WORK DST")
    main(*(Path(a) for a in sys.argv[1:]))
