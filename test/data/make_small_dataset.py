"""Not a test: the 64 x 64 copy of the bundled dataset (the ctest fixture small_dataset).

The bundled PickNPlace dataset, every episode, its 256x256 camera re-encoded by ffmpeg at 64x64 (libx264,
no B-frames, every frame's timestamp kept, as make_aspect_dataset.py makes its camera), converted by
scripts/convert_lerobot.py: the same 5 episodes, 2096 samples, states, actions and task texts; frames at
n16-tiny's input size, so a trainer decodes a sixteenth of the pixels and resizes none. For the tests of
several ranks, faults, Slurm, the control plane and checkpoints (test/comm, test/engines/gcts, test/slurm,
test/control, test/checkpoint), whose runs compare with each other and not with the frames: a typical
run of theirs (n16-tiny, 24 steps of 6 samples) takes 3.3 CPU s on this copy against 5.0 on the 256x256
frames, and the suite's 2 cores are its bottleneck (docs/benchmarks.md, session 49).

    python test/data/make_small_dataset.py SOURCE WORK DST    # DST is replaced
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIDE = 64


def main(source: Path, work: Path, dst: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    for part in ("meta", "data"):
        shutil.copytree(source / part, work / part)
    info = json.loads((work / "meta/info.json").read_text())
    cameras = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    for video in sorted((source / "videos").rglob("*.mp4")):
        out = work / video.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(video), "-vf", f"scale={SIDE}:{SIDE}",
                        "-fps_mode", "passthrough", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0",
                        "-pix_fmt", "yuv420p", str(out)], check=True)
    for camera in cameras:
        info["features"][camera]["shape"] = [SIDE, SIDE, 3]
    (work / "meta/info.json").write_text(json.dumps(info, indent=2))
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(work), str(dst), "--quiet"],
                   check=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: make_small_dataset.py SOURCE WORK DST")
    main(*(Path(a) for a in sys.argv[1:]))
