"""Not a test: the 4:3 dataset of the image-aspect tests (the ctest fixture aspect_dataset).

The bundled PickNPlace dataset's episode 0 with its 256x256 camera re-encoded by ffmpeg at 320x240
(4:3; libx264, no B-frames, every frame's timestamp kept, as test_lerobot_datasets.py makes its 4:3
camera), converted by scripts/convert_lerobot.py --episodes 0: 416 samples of one wide camera. Its
width, 320, pads to a 320 x 320 square that the box resize takes to 64 x 64 in exact 5 x 5 windows,
and its height, 240, to 48 such rows: what test/data/test_image_aspect.cpp and
test/e2e/test_image_aspect.py check data.image_aspect against.

    python test/data/make_aspect_dataset.py SOURCE WORK DST    # DST is replaced
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAMERA = "observation.images.ego_view"


def main(source: Path, work: Path, dst: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    for part in ("meta", "data"):
        shutil.copytree(source / part, work / part)
    video = f"videos/chunk-000/{CAMERA}/episode_000000.mp4"
    (work / video).parent.mkdir(parents=True)
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(source / video), "-vf", "scale=320:240",
                    "-fps_mode", "passthrough", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0",
                    "-pix_fmt", "yuv420p", str(work / video)], check=True)
    info = json.loads((work / "meta/info.json").read_text())
    info["features"][CAMERA]["shape"] = [240, 320, 3]
    (work / "meta/info.json").write_text(json.dumps(info, indent=2))
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(work), str(dst), "--episodes", "0",
                    "--quiet"], check=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: make_aspect_dataset.py SOURCE WORK DST")
    main(*(Path(a) for a in sys.argv[1:]))
