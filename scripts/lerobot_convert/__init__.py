"""Helpers for scripts/convert_lerobot.py, split by the phase of a conversion.

  source.py   read and validate a LeRobot v2.x or v3.0 dataset (meta/, parquet)
  video.py    probe camera videos with ffprobe, align rows to frames, cut v3.0 episodes
  shard.py    write LoongForge binary shards (layout: docs/shard-format.md)

Every check raises ConvertError with a message that says what is wrong,
where (episode and file) and how to fix it.
"""


class ConvertError(Exception):
    """A dataset problem that stops the conversion; str() is the full message."""


def fail(where, what, fix):
    """Raise ConvertError as 'WHERE: WHAT\\n  fix: FIX'."""
    raise ConvertError(f"{where}: {what}\n  fix: {fix}")
