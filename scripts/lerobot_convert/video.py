"""Probe camera videos with ffprobe and align parquet rows to video frames.

Note [Row to frame alignment]
A parquet row t carries a timestamp ts[t] (seconds); the video's decoded
frames, in presentation order, carry pts[i] (seconds, pts * time_base). The
converter requires as many frames as rows and pairs row t with frame t, after
allowing one constant offset between the two clocks:

    offset   = median(ts[t] - pts[t])              (reported when >= 0.1 ms)
    residual = ts[t] - offset - pts[t]
    accept iff max |residual| < 1 / (2 * fps)      (half a frame period)

Within that tolerance the frame nearest in time to ts[t] - offset is frame t,
so the stored mapping (row t -> frame chosen by timestamp) is computed by
nearest-pts search and then checked to be the identity. A residual that
grows along the episode is a drift (different clock rates) and is rejected;
a constant offset (e.g. timestamps starting at 1/fps, or a video whose first
pts is not 0) is corrected and reported.
"""

import json
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from . import fail

kAcceptedCodecs = ("av1", "h264", "hevc", "mjpeg")
kOffsetReportS = 1e-4  # offsets smaller than this are clock noise, not reported
kFixCodec = ("re-encode the video to H.264, e.g. "
             "`ffmpeg -i IN.mp4 -c:v libx264 -pix_fmt yuv420p -g 2 OUT.mp4`, keeping its frame count and rate")


@dataclass
class VideoProbe:
    path: object
    codec: str
    width: int
    height: int
    pix_fmt: str
    time_base: str
    avg_frame_rate: str
    pts_s: np.ndarray  # (F,) float64 seconds, presentation order


def _ffprobe(args, where, path):
    cmd = ["ffprobe", "-v", "error", *args, "-of", "json", str(path)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        fail(where, "the `ffprobe` program was not found on PATH",
             "install FFmpeg's command-line tools (Debian: apt-get install ffmpeg)")
    if out.returncode != 0:
        fail(where, f"ffprobe could not read video {path}: {out.stderr.strip() or 'exit code %d' % out.returncode}",
             "check the file is a complete, playable video (re-copy or re-encode it)")
    return json.loads(out.stdout or "{}")


def probe_stream(path, where):
    """Codec and geometry of the first video stream (no decoding)."""
    info = _ffprobe(["-select_streams", "v:0", "-show_entries",
                     "stream=codec_name,width,height,pix_fmt,time_base,avg_frame_rate"], where, path)
    streams = info.get("streams") or []
    if not streams:
        fail(where, f"video {path} has no video stream", "re-encode or re-export the camera video")
    return streams[0]


def probe_video(path, where):
    """Stream info plus the pts of every decoded frame; checks the codec first."""
    stream = probe_stream(path, where)
    codec = stream.get("codec_name", "?")
    if codec not in kAcceptedCodecs:
        fail(where, f"video {path} uses codec '{codec}', which LoongForge does not decode "
             f"(accepted: {', '.join(kAcceptedCodecs)})", kFixCodec)
    tb = Fraction(stream.get("time_base", "0/1"))
    info = _ffprobe(["-select_streams", "v:0", "-show_entries", "frame=pts,best_effort_timestamp"], where, path)
    pts = []
    for i, fr in enumerate(info.get("frames", [])):
        p = fr.get("pts", fr.get("best_effort_timestamp"))
        if p is None or tb == 0:
            fail(where, f"video {path}: decoded frame {i} has no presentation timestamp",
                 "remux the video so every frame has a pts (e.g. `ffmpeg -i IN -c copy OUT.mp4`)")
        pts.append(int(p))
    pts = np.array(sorted(pts), dtype=np.int64)
    if len(pts) > 1 and np.any(np.diff(pts) <= 0):
        i = int(np.argmax(np.diff(pts) <= 0))
        fail(where, f"video {path}: frames {i} and {i + 1} have the same pts {pts[i]}",
             "re-encode the video with one timestamp per frame")
    pts_s = pts.astype(np.float64) * (tb.numerator / tb.denominator)
    return VideoProbe(path, codec, int(stream.get("width", 0)), int(stream.get("height", 0)),
                      stream.get("pix_fmt", "?"), str(tb), stream.get("avg_frame_rate", "?"), pts_s)


@dataclass
class Alignment:
    frame_of_row: np.ndarray  # (T,) int64
    offset_s: float  # median(ts - pts); subtract from ts to get video time
    max_residual_s: float
    offset_reported: bool


def align(ts, pts_s, fps, where, video_path, parquet_path):
    """Row -> frame mapping per Note [Row to frame alignment]."""
    rows, frames = len(ts), len(pts_s)
    if rows != frames:
        fail(where, f"parquet has {rows} rows but video {video_path} has {frames} frames",
             "re-export the episode so each parquet row has exactly one video frame "
             "(or trim the longer of the two)")
    tol = 1.0 / (2.0 * fps)
    r = ts - pts_s
    offset = float(np.median(r))
    residual = r - offset
    worst = int(np.argmax(np.abs(residual)))
    if abs(residual[worst]) >= tol:
        slope = float(np.polyfit(pts_s, r, 1)[0]) if rows > 1 else 0.0
        span = float(pts_s[-1] - pts_s[0]) if rows > 1 else 0.0
        detail = (f"after removing a constant offset of {offset:+.6f} s, row {worst} (timestamp {ts[worst]:.6f} s) "
                  f"is {residual[worst]:+.6f} s from frame {worst} (pts {pts_s[worst]:.6f} s); "
                  f"tolerance is 1/(2*fps) = {tol:.6f} s")
        if abs(slope) * span >= tol:
            fail(where, f"parquet timestamps drift against the frame times of video {video_path}: {detail}; "
                 f"the residual changes by {slope * 1e3:+.3f} ms per second of video from row 0 "
                 f"({residual[0]:+.6f} s) to row {rows - 1} ({residual[-1]:+.6f} s)",
                 f"the timestamps in {parquet_path} and the video were recorded on different clocks or rates; "
                 "re-export them so timestamp[t] = t / fps matches frame t")
        fail(where, f"parquet timestamps do not line up with the frame times of video {video_path} (no steady "
             f"drift, a jump): {detail}",
             f"fix the timestamps of {parquet_path} around row {worst} (expected about "
             f"{pts_s[worst] + offset:.6f} s), or re-export the episode")
    # nearest frame in time to each corrected timestamp
    t = ts - offset
    hi = np.clip(np.searchsorted(pts_s, t), 1, max(frames - 1, 1))
    lo = hi - 1
    nearest = np.where(np.abs(pts_s[lo] - t) <= np.abs(pts_s[hi] - t), lo, hi) if frames > 1 \
        else np.zeros(rows, dtype=np.int64)
    nearest = nearest.astype(np.int64)
    bad = np.nonzero(nearest != np.arange(rows))[0]
    if len(bad):
        b = int(bad[0])
        fail(where, f"row {b} (timestamp {ts[b]:.6f} s, offset-corrected {t[b]:.6f} s) is nearest to frame "
             f"{nearest[b]} of video {video_path}, not frame {b}: the video's frame times are irregular",
             "re-encode the video at a constant frame rate matching info.json fps")
    return Alignment(nearest, offset, float(abs(residual[worst])), abs(offset) >= kOffsetReportS)


# ---------------------------------------------------------------------------
# LeRobot v3.0: one episode's time range of a shared video, as its own file


@dataclass
class Packet:
    pts: int
    dts: int
    key: bool
    size: int
    digest: str  # ffprobe's MD5 of the packet data


_packets_lock = threading.Lock()
_packets_cache = {}  # source path -> (time_base Fraction, [Packet] in decode order)


def _packets(path, where):
    """Packets of the first video stream in decode order, with their data hashes (no decoding)."""
    stream = probe_stream(path, where)
    tb = Fraction(stream.get("time_base", "0/1"))
    info = _ffprobe(["-select_streams", "v:0", "-show_data_hash", "MD5", "-show_entries",
                     "packet=pts,dts,flags,size,data_hash"], where, path)
    out = []
    for i, p in enumerate(info.get("packets", [])):
        if p.get("pts") is None:
            fail(where, f"video {path}: packet {i} has no pts", "remux the video (e.g. `ffmpeg -i IN -c copy OUT.mp4`)")
        dts = p.get("dts")
        out.append(Packet(int(p["pts"]), int(dts) if dts is not None else int(p["pts"]), "K" in p.get("flags", ""),
                          int(p.get("size", 0)), p.get("data_hash", "")))
    return tb, out


def source_packets(path, where):
    """_packets(path), computed once per file (episodes of a v3.0 dataset share their video files)."""
    with _packets_lock:
        entry = _packets_cache.get(path)
        if entry is None:
            entry = _packets_cache[path] = {"lock": threading.Lock(), "value": None}
    with entry["lock"]:
        if entry["value"] is None:
            entry["value"] = _packets(path, where)
        return entry["value"]


def cut_episode(src, out, from_s, to_s, fps, where):
    """Copy the frames of src whose presentation time lies in [from_s, to_s) into out, without re-encoding
    (Note [LeRobot v3.0] in source.py), and check that out holds exactly those packets; -> probe_video(out).

    A frame belongs to the range when from_s - 1/(2 fps) <= pts < to_s - 1/(2 fps): LeRobot's
    from/to timestamps are frame times, so half a frame period absorbs their rounding. The range must
    start at a keyframe and be contiguous in decode order (each episode of a LeRobot v3.0 video is
    encoded on its own and appended, so it is); otherwise stream copy cannot cut it and the conversion
    stops rather than re-encode."""
    stream = probe_stream(src, where)
    codec = stream.get("codec_name", "?")
    if codec not in kAcceptedCodecs:
        fail(where, f"video {src} uses codec '{codec}', which LoongForge does not decode "
             f"(accepted: {', '.join(kAcceptedCodecs)})", kFixCodec)
    tb, packets = source_packets(src, where)
    if tb == 0 or not packets:
        fail(where, f"video {src} has no packets or no time base", "re-copy the video file")
    half = Fraction(1, 2) / Fraction(fps).limit_denominator(1 << 20)
    lo, hi = (Fraction(from_s).limit_denominator(1 << 30) - half) / tb, \
        (Fraction(to_s).limit_denominator(1 << 30) - half) / tb
    chosen = [i for i, p in enumerate(packets) if lo <= p.pts < hi]
    last_s = float(max(p.pts for p in packets) * tb)
    if not chosen or to_s - 1.0 / fps > last_s + 0.5 / fps:
        fail(where, f"the episode's time range [{from_s:.6f}, {to_s:.6f}) s lies outside video {src} "
             f"({len(packets)} frames, the last at {last_s:.6f} s)",
             "regenerate meta/episodes with LeRobot (videos/<key>/from_timestamp and to_timestamp), or restore "
             "the complete video file")
    first, last = chosen[0], chosen[-1]
    if last - first + 1 != len(chosen):
        fail(where, f"the frames of [{from_s:.6f}, {to_s:.6f}) s in video {src} are interleaved in decode order "
             "with frames outside the range, so the range cannot be cut without re-encoding",
             f"re-encode the video so each episode starts a closed GOP; {kFixCodec}")
    if not packets[first].key:
        fail(where, f"the episode's time range [{from_s:.6f}, {to_s:.6f}) s in video {src} does not start at a "
             f"keyframe (its first frame, pts {float(packets[first].pts * tb):.6f} s, is not one), so it "
             "cannot be cut without re-encoding",
             f"re-encode the video with a keyframe at every episode start; {kFixCodec}")
    start_s = packets[first].pts * tb
    cmd = ["ffmpeg", "-v", "error", "-nostdin", "-y", "-ss", f"{float(start_s):.9f}", "-i", str(src),
           "-map", "0:v:0", "-frames:v", str(len(chosen)), "-c", "copy", "-f", "mp4", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        fail(where, f"ffmpeg could not cut [{from_s:.6f}, {to_s:.6f}) s out of video {src}: "
             f"{r.stderr.strip() or 'exit code %d' % r.returncode}",
             "check the video plays (re-copy it); the command was: " + " ".join(cmd))
    out_tb, got = _packets(out, where)
    want = [packets[i] for i in chosen]
    same = len(got) == len(want) and out_tb == tb and all(
        (g.pts - got[0].pts, g.dts - got[0].dts, g.key, g.size, g.digest) ==
        (w.pts - want[0].pts, w.dts - want[0].dts, w.key, w.size, w.digest) for g, w in zip(got, want))
    if not same:
        fail(where, f"cutting [{from_s:.6f}, {to_s:.6f}) s out of video {src} with `{' '.join(cmd)}` gave "
             f"{len(got)} packets (time base {out_tb}) that are not the {len(want)} source packets "
             f"(time base {tb}) of the range", "report this converter bug with the video")
    return probe_video(out, where)
