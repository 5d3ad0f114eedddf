"""Writer for LoongForge binary shards (format version 1).

The byte layout is specified in docs/shard-format.md; this file is one
implementation of it and the spec wins where they disagree. In short:

    [header 128 B][column table][record 0][record 1]...[index]

Every integer is little-endian; every record and every array starts at a
multiple of 64 bytes; each record's CRC32 (zlib polynomial) sits in the
index, the header, column table and index carry their own CRC32.
"""

import struct
import zlib
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------------------
# Constants (docs/shard-format.md, "Constants")

kShardMagic = b"LFSHARD\0"
kRecordMagic = b"LFEPISOD"
kFormatVersion = 1
kAlign = 64
kHeaderBytes = 128
kColumnEntryBytes = 96
kRecordHeaderBytes = 64
kArrayEntryBytes = 32
kIndexEntryBytes = 32
kColumnNameBytes = 64  # NUL-padded, so names are at most 63 bytes
kNoCamera = 0xFFFFFFFF

# dtype codes of the column table
kDtypeFloat32 = 1
kDtypeFloat64 = 2
kDtypeInt64 = 3
kDtypeUint8 = 4
kDtypeInt32 = 5
kDtypeBool = 6  # only as a source dtype; stored as kDtypeUint8 (0 or 1)

kDtypeCodes = {"float32": kDtypeFloat32, "float64": kDtypeFloat64, "int64": kDtypeInt64,
               "uint8": kDtypeUint8, "int32": kDtypeInt32, "bool": kDtypeBool}
kNumpyDtypes = {kDtypeFloat32: np.dtype("<f4"), kDtypeFloat64: np.dtype("<f8"),
                kDtypeInt64: np.dtype("<i8"), kDtypeUint8: np.dtype("u1"),
                kDtypeInt32: np.dtype("<i4")}

# row kinds of the column table
kRowsPerParquetRow = 0
kRowsPerVideoFrame = 1

# column flags
kFlagSynthesized = 1  # not a parquet column: made by the converter
kFlagLossyFloat32 = 2  # float64 in the source, rounded to float32 here

# struct layouts (all little-endian, no implicit padding)
kHeaderStruct = struct.Struct("<8sIIIIII QQQQQQ II 36s")  # + u32 header_crc32 = 128 B
kColumnStruct = struct.Struct("<64sIIIIIIII")
kRecordHeaderStruct = struct.Struct("<8sqQQII24s")
kArrayEntryStruct = struct.Struct("<IIQQQ")
kIndexEntryStruct = struct.Struct("<qQQII")

assert kHeaderStruct.size + 4 == kHeaderBytes
assert kColumnStruct.size == kColumnEntryBytes
assert kRecordHeaderStruct.size == kRecordHeaderBytes
assert kArrayEntryStruct.size == kArrayEntryBytes
assert kIndexEntryStruct.size == kIndexEntryBytes


def align_up(n, a=kAlign):
    return (n + a - 1) // a * a


def crc32(data):
    """CRC-32/ISO-HDLC (zlib, PNG, Ethernet): reflected poly 0xEDB88320,
    init and final xor 0xFFFFFFFF; crc32(b"123456789") == 0xCBF43926."""
    return zlib.crc32(data) & 0xFFFFFFFF


# ---------------------------------------------------------------------------
# Column plan: the same for every record of every shard of a dataset


@dataclass
class Column:
    name: str  # parquet column name, or a synthesized name (see flags)
    dtype: int  # stored dtype code
    width: int  # values per row
    row_kind: int = kRowsPerParquetRow
    camera_id: int = kNoCamera
    source_dtype: int = 0
    flags: int = 0

    @property
    def numpy_dtype(self):
        return kNumpyDtypes[self.dtype]

    def pack(self):
        name = self.name.encode("utf-8")
        if len(name) >= kColumnNameBytes:
            raise ValueError(f"column name {self.name!r} is {len(name)} bytes; the shard "
                             f"format allows at most {kColumnNameBytes - 1}")
        return kColumnStruct.pack(name, self.dtype, self.numpy_dtype.itemsize, self.width,
                                  self.row_kind, self.camera_id, self.source_dtype, self.flags, 0)


# ---------------------------------------------------------------------------
# Records


def build_record(episode_index, row_count, columns, arrays):
    """Lay out one episode record; returns its bytes (a multiple of 64 long).

    arrays[i] holds columns[i]'s values, shape (rows, width) or (rows,), and is
    converted to the column's stored little-endian dtype here.
    """
    blobs = []
    for col, arr in zip(columns, arrays):
        a = np.ascontiguousarray(arr, dtype=col.numpy_dtype)
        rows = a.shape[0] if a.ndim else 1
        if a.size != rows * col.width:
            raise ValueError(f"column {col.name}: {a.size} values for {rows} rows x width {col.width}")
        if col.row_kind == kRowsPerParquetRow and rows != row_count:
            raise ValueError(f"column {col.name}: {rows} rows, record has {row_count}")
        blobs.append((rows, a.tobytes()))

    directory_end = kRecordHeaderBytes + kArrayEntryBytes * len(columns)
    offset = align_up(directory_end)
    entries = []
    for col_id, (rows, data) in enumerate(blobs):
        entries.append(kArrayEntryStruct.pack(col_id, 0, offset, rows, len(data)))
        offset = align_up(offset + len(data))
    record_bytes = offset

    buf = bytearray(record_bytes)  # zero padding everywhere
    buf[0:kRecordHeaderBytes] = kRecordHeaderStruct.pack(
        kRecordMagic, episode_index, row_count, record_bytes, len(columns), 0, bytes(24))
    pos = kRecordHeaderBytes
    for e in entries:
        buf[pos:pos + kArrayEntryBytes] = e
        pos += kArrayEntryBytes
    for e, (rows, data) in zip(entries, blobs):
        start = kArrayEntryStruct.unpack(e)[2]
        buf[start:start + len(data)] = data
    return bytes(buf)


# ---------------------------------------------------------------------------
# Shard file


@dataclass
class RecordLocation:
    shard_id: int
    file_name: str
    record_offset: int
    record_bytes: int
    record_crc32: int


class ShardWriter:
    """Streams records into one shard file; close() writes index and header.

    Usage:
        w = ShardWriter(path, shard_id, columns)
        loc = w.add(episode_index, row_count, record_bytes)
        w.close()
    """

    def __init__(self, path, shard_id, columns):
        self.path = path
        self.shard_id = shard_id
        self.columns = columns
        self.index = []  # (episode_index, offset, bytes, rows, crc)
        self.total_rows = 0
        self.column_table = b"".join(c.pack() for c in columns)
        self.f = open(path, "wb")
        self.f.write(bytes(kHeaderBytes))  # rewritten by close()
        self.f.write(self.column_table)
        self.pos = kHeaderBytes + len(self.column_table)
        self._pad_to(align_up(self.pos))

    def _pad_to(self, pos):
        self.f.write(bytes(pos - self.pos))
        self.pos = pos

    @property
    def bytes_written(self):
        return self.pos

    def add(self, episode_index, row_count, record):
        assert self.pos % kAlign == 0 and len(record) % kAlign == 0
        crc = crc32(record)
        offset = self.pos
        self.f.write(record)
        self.pos += len(record)
        self.index.append((episode_index, offset, len(record), row_count, crc))
        self.total_rows += row_count
        return RecordLocation(self.shard_id, self.path.name, offset, len(record), crc)

    def close(self):
        self._pad_to(align_up(self.pos))
        index_offset = self.pos
        index = b"".join(kIndexEntryStruct.pack(*e) for e in sorted(self.index))
        self.f.write(index)
        self.pos += len(index)
        file_bytes = self.pos
        header = kHeaderStruct.pack(
            kShardMagic, kFormatVersion, kHeaderBytes, kAlign, self.shard_id,
            len(self.columns), len(self.index),
            file_bytes, kHeaderBytes, len(self.column_table), index_offset, len(index),
            self.total_rows,
            crc32(self.column_table), crc32(index), bytes(36))
        header += struct.pack("<I", crc32(header))
        self.f.seek(0)
        self.f.write(header)
        self.f.close()
        return file_bytes
